//! Benchmark: merging this run's changed sessions (one continued, one new) into a large base
//! database, beside what a save costs on the same file in the same run: a plain file copy, and
//! fro-bot's cache archive (tar + zstd, the local part of a cache save).
//!
//! The base is built from OpenCode 1.18.33's real schema and migration list: sessions of turns
//! (messages, parts with ~1.5 KB of text each, events, todos), to `FRO_BOT_BENCH_MB` (default 200).
//! Best of `FRO_BOT_BENCH_REPS` (default 3). Run with `cargo bench --profile dev --bench merge`
//! (see docs/benchmarks.md).

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection};

use fro_bot::merge::{self, MergeOptions, Snapshot, Verify};

const SCHEMA: &str = include_str!("../tests/it/fixtures/opencode-1.18.33-schema.sql");
const MIGRATIONS: &str = include_str!("../tests/it/fixtures/opencode-1.18.33-migrations.txt");
const PROJECT: &str = "cadca77b89a5b7a8d5075e6730ad6b4f59d91881";
const MB: u64 = 1_000_000;
const TURNS_PER_SESSION: usize = 40;

fn main() {
    let mb: u64 = env_or("FRO_BOT_BENCH_MB", 200);
    let reps: usize = env_or("FRO_BOT_BENCH_REPS", 3).max(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let t = Instant::now();
    let base = dir.path().join("base/opencode.db");
    std::fs::create_dir_all(base.parent().expect("parent")).expect("base dir");
    let sessions = generate(&base, mb * MB);
    let size = std::fs::metadata(&base).expect("base").len();
    println!(
        "base: {:.0} MB, {sessions} sessions of {TURNS_PER_SESSION} turns (generated in {:.1} s)",
        size as f64 / MB as f64,
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let snap = Snapshot::capture(&base).expect("snapshot");
    let capture = t.elapsed();
    // This run continued session 0 (5 turns) and answered a new thread (10 turns).
    let ours = dir.path().join("ours.db");
    std::fs::copy(&base, &ours).expect("ours");
    {
        let c = Connection::open(&ours).expect("ours");
        let tx = c.unchecked_transaction().expect("tx");
        for t in 0..5 {
            turn(&tx, "ses_00000", TURNS_PER_SESSION + t, 9_000_000);
        }
        session(&tx, "ses_new", 10, 9_000_001);
        tx.commit().expect("commit");
    }

    let best = |v: Vec<Duration>| v.into_iter().min().unwrap_or_default().as_secs_f64();
    let copies = best(
        (0..reps)
            .map(|r| {
                sync();
                let to = dir.path().join(format!("copy-{r}.db"));
                let t = Instant::now();
                std::fs::copy(&base, &to).expect("copy");
                let e = t.elapsed();
                std::fs::remove_file(&to).expect("rm copy");
                e
            })
            .collect(),
    );
    let synced_copies = best(
        (0..reps)
            .map(|r| {
                sync();
                let to = dir.path().join(format!("synced-{r}.db"));
                let t = Instant::now();
                std::fs::copy(&base, &to).expect("copy");
                std::fs::File::open(&to)
                    .and_then(|f| f.sync_all())
                    .expect("fsync");
                let e = t.elapsed();
                std::fs::remove_file(&to).expect("rm copy");
                e
            })
            .collect(),
    );
    let archives = best(
        (0..reps)
            .map(|r| {
                sync();
                let to = dir.path().join(format!("archive-{r}.tzst"));
                let paths = [base.to_string_lossy().into_owned()];
                let t = Instant::now();
                fro_bot::cache::write_archive(&paths, dir.path(), &to).expect("archive");
                let e = t.elapsed();
                std::fs::remove_file(&to).expect("rm archive");
                e
            })
            .collect(),
    );
    let mut rows = Vec::new();
    for verify in [Verify::Written, Verify::Full] {
        let mut runs = Vec::new();
        for r in 0..reps {
            sync();
            let out = dir.path().join(format!("merged-{r}.db"));
            let t = Instant::now();
            let report = merge::merge_with(&base, &ours, &snap, &out, MergeOptions { verify })
                .expect("merge");
            runs.push((t.elapsed(), report));
            std::fs::remove_file(&out).expect("rm merged");
        }
        runs.sort_by_key(|(d, _)| *d);
        let (total, report) = runs.swap_remove(0);
        assert_eq!(report.taken.len(), 2, "{report:?}");
        rows.push((verify, total, report));
    }
    println!(
        "best of {reps}; snapshot capture at restore: {:.3} s",
        capture.as_secs_f64()
    );
    println!("| step | time | vs file copy + fsync | vs cache archive |");
    println!("|---|---|---|---|");
    let line = |name: &str, t: f64| {
        println!(
            "| {name} | {t:.3} s | {:.2}× | {:.2}× |",
            t / synced_copies,
            t / archives
        )
    };
    line("file copy of the base (baseline)", copies);
    line("file copy + fsync (baseline)", synced_copies);
    line("cache archive of the base, tar+zstd (baseline)", archives);
    for (verify, total, report) in rows {
        line(
            &format!(
                "merge, verify {verify:?} (copy {:.3} s, merge {:.3} s, fsync {:.3} s; {} rows in, {} out)",
                report.copy_time.as_secs_f64(),
                report.merge_time.as_secs_f64(),
                report.sync_time.as_secs_f64(),
                report.rows_inserted,
                report.rows_deleted,
            ),
            total.as_secs_f64(),
        );
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn sync() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Sessions until the file reaches `bytes`; returns how many.
fn generate(path: &Path, bytes: u64) -> usize {
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

fn session(c: &Connection, id: &str, turns: usize, at: i64) {
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

fn turn(c: &Connection, id: &str, t: usize, at: i64) {
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
