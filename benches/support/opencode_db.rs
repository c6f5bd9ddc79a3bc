//! An OpenCode-like session database for the benches: OpenCode 1.18.33's real schema and
//! migration list, sessions of turns (messages, parts with ~1.5 KB of text each, events, todos).

use std::path::Path;

use rusqlite::{params, Connection};

pub const SCHEMA: &str = include_str!("../../tests/it/fixtures/opencode-1.18.33-schema.sql");
pub const MIGRATIONS: &str =
    include_str!("../../tests/it/fixtures/opencode-1.18.33-migrations.txt");
pub const PROJECT: &str = "cadca77b89a5b7a8d5075e6730ad6b4f59d91881";
pub const TURNS_PER_SESSION: usize = 40;

/// Sessions until the file reaches `bytes`; returns how many.
pub fn generate(path: &Path, bytes: u64) -> usize {
    let c = Connection::open(path).expect("db");
    c.pragma_update(None, "journal_mode", "WAL").expect("wal");
    c.pragma_update(None, "synchronous", "OFF").expect("sync");
    c.execute_batch(SCHEMA).expect("schema");
    for id in MIGRATIONS.lines().filter(|l| !l.is_empty()) {
        c.execute("INSERT INTO migration VALUES (?1, 1)", [id])
            .expect("migration");
    }
    c.execute(
        "INSERT INTO project (id, worktree, vcs, time_created, time_updated, sandboxes) \
         VALUES (?1, '/github/workspace', 'git', 1, 1, '[]')",
        [PROJECT],
    )
    .expect("project");
    let mut n = 0;
    loop {
        let tx = c.unchecked_transaction().expect("tx");
        for _ in 0..20 {
            session(
                &tx,
                &format!("ses_{n:05}"),
                TURNS_PER_SESSION,
                n as i64 * 1000,
            );
            n += 1;
        }
        tx.commit().expect("commit");
        let pages: i64 = c
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .expect("pages");
        if pages as u64 * 4096 >= bytes {
            break;
        }
    }
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    n
}

pub fn session(c: &Connection, id: &str, turns: usize, at: i64) {
    c.execute(
        "INSERT INTO session (id, project_id, slug, directory, title, version, time_created, \
         time_updated) VALUES (?1, ?2, 'slug', '/github/workspace', ?3, '1.18.33', ?4, ?4)",
        params![id, PROJECT, format!("fro-bot: issue-{id}"), at],
    )
    .expect("session");
    c.execute(
        "INSERT INTO event_sequence (aggregate_id, seq) VALUES (?1, -1)",
        [id],
    )
    .expect("sequence");
    for t in 0..turns {
        turn(c, id, t, at + t as i64);
    }
}

pub fn turn(c: &Connection, id: &str, t: usize, at: i64) {
    let filler: String =
        format!("The agent read src/lib.rs in session {id} turn {t} and proposed a change. ")
            .repeat(20);
    for role in ["user", "assistant"] {
        let m = format!("msg_{id}_{t:04}_{role}");
        c.execute(
            "INSERT INTO message VALUES (?1, ?2, ?3, ?3, ?4)",
            params![
                m,
                id,
                at,
                format!("{{\"role\":\"{role}\",\"time\":{{\"created\":{at}}}}}")
            ],
        )
        .expect("message");
        c.execute(
            "INSERT INTO part VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
            params![
                format!("prt_{m}"),
                m,
                id,
                at,
                format!("{{\"type\":\"text\",\"text\":\"{filler}\"}}")
            ],
        )
        .expect("part");
        let seq: i64 = c
            .query_row(
                "UPDATE event_sequence SET seq = seq + 1 WHERE aggregate_id = ?1 RETURNING seq",
                [id],
                |r| r.get(0),
            )
            .expect("seq");
        c.execute(
            "INSERT INTO event VALUES (?1, ?2, ?3, 'message.updated.1', ?4)",
            params![
                format!("evt_{id}_{seq}"),
                id,
                seq,
                format!("{{\"sessionID\":\"{id}\",\"info\":{{\"id\":\"{m}\"}}}}")
            ],
        )
        .expect("event");
    }
    c.execute(
        "INSERT OR REPLACE INTO todo VALUES (?1, 'do it', 'pending', 'high', 0, ?2, ?2)",
        params![id, at],
    )
    .expect("todo");
    c.execute(
        "UPDATE session SET time_updated = ?2 WHERE id = ?1",
        params![id, at],
    )
    .expect("touch");
}
