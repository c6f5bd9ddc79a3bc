//! Scrubbed memory (docs/security.md): before the session database is checkpointed and saved,
//! every registered secret and token shape is replaced in every text and blob value of the rows
//! the scrub reads (schema-driven, so OpenCode's message and part JSON and any table a later
//! version adds are covered), and the tables that hold credentials are emptied. One transaction,
//! on the live WAL-mode database, after OpenCode stopped, with `secure_delete` on so what it
//! overwrites is zeroed.
//!
//! What it reads is the [`Scope`]: memory fro-bot scrubbed when it saved it needs only the rows
//! the run wrote since ([`Scope::Changed`]); memory of unknown provenance is read whole
//! ([`Scope::Whole`]), and only then are old copies in free space wiped, by a `VACUUM` when the
//! file still holds any.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rusqlite::functions::FunctionFlags;
use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};

/// What the save's scrub reads (docs/security.md#scrubbed-memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "kebab-case")]
pub enum Scope {
    /// Every row of every table, and free space: memory of unknown provenance (nothing restored,
    /// no marker naming it, a marker from before scrubbed memory was recorded) or a database the
    /// run did not rebuild from its restored copy.
    Whole,
    /// The rows of the session trees holding these sessions (children included), and every row of
    /// OpenCode's other tables (small: projects, permissions, accounts). For a database rebuilt
    /// from a restored copy fro-bot had scrubbed, with only this run's trees written into it
    /// (`memory::guard`): nothing else can hold a secret, in a row or in free space.
    Changed { sessions: BTreeSet<String> },
}

/// What the marker records when every row and the free space of the saved database were
/// scrubbed, this version of the redaction rules; another number (or none) means unknown
/// provenance to the next restore.
pub const SCRUB_VERSION: u32 = 1;

/// Tables whose rows are credentials (OpenCode's accounts, stored integration credentials, share
/// secrets) or point at them: emptied, not scrubbed.
pub const CREDENTIAL_TABLES: &[&str] = &[
    "account",
    "account_state",
    "control_account",
    "credential",
    "session_share",
];

#[derive(Debug, thiserror::Error)]
pub enum ScrubError {
    #[error("cannot open the session database: {source}")]
    Open {
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot scrub {what}: {source}")]
    Sql {
        what: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot read the session database to check it: {source}")]
    Read {
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScrubOutcome {
    /// No database (nothing was ever written).
    NoDatabase,
    Scrubbed(ScrubReport),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Secrets and token shapes replaced.
    pub replacements: usize,
    /// Values rewritten.
    pub values: usize,
    /// Rows deleted from credential tables.
    pub credential_rows: usize,
    /// Whether stale copies in free pages made a `VACUUM` necessary.
    pub vacuumed: bool,
    /// Session trees read (`None`: the whole database was).
    pub trees_of: Option<usize>,
}

impl ScrubOutcome {
    pub fn describe(&self) -> String {
        match self {
            ScrubOutcome::NoDatabase => "no database".into(),
            ScrubOutcome::Scrubbed(r) => {
                let mut s = format!(
                    "{} secret(s) replaced in {} value(s), {} credential row(s) removed",
                    r.replacements, r.values, r.credential_rows
                );
                if let Some(n) = r.trees_of {
                    // Memory fro-bot saved was scrubbed then: only what this run wrote was read.
                    s.push_str(&format!(
                        " (read: the {n} session(s) of this run's trees and OpenCode's other tables)"
                    ));
                }
                if r.vacuumed {
                    s.push_str("; free pages wiped");
                }
                s
            }
        }
    }

    pub fn replacements(&self) -> usize {
        match self {
            ScrubOutcome::NoDatabase => 0,
            ScrubOutcome::Scrubbed(r) => r.replacements,
        }
    }
}

/// Scrubs `db` (see the module docs). Run only when nothing else has the database open.
pub fn scrub(db: &Path, scope: &Scope) -> Result<ScrubOutcome, ScrubError> {
    match std::fs::metadata(db) {
        Ok(m) if m.len() > 0 => {}
        Ok(_) => return Ok(ScrubOutcome::NoDatabase),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ScrubOutcome::NoDatabase),
        Err(source) => return Err(ScrubError::Read { source }),
    }
    let mut conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| ScrubError::Open { source })?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(sql("the busy timeout"))?;
    // Overwritten and deleted content is zeroed, not left in free space.
    conn.pragma_update(None, "secure_delete", "ON")
        .map_err(sql("secure_delete"))?;
    let counter = Arc::new(AtomicUsize::new(0));
    register_functions(&conn, counter.clone()).map_err(sql("function registration"))?;

    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sql("a transaction"))?;
    let trees = match scope {
        Scope::Whole => None,
        Scope::Changed { sessions } => changed_trees(&tx, sessions)?,
    };
    let mut report = scrub_rows(&tx, trees.as_ref())?;
    tx.commit().map_err(sql("the commit"))?;
    report.replacements = counter.load(Ordering::Relaxed);
    report.trees_of = trees.as_ref().map(|t| t.sessions);
    if trees.is_some() {
        // A database rebuilt from scrubbed memory plus scrubbed rows: no free space of it ever
        // held a secret, and what this scrub overwrote was zeroed (`secure_delete`).
        return Ok(ScrubOutcome::Scrubbed(report));
    }
    // Rows OpenCode rewrote or deleted before (a streamed part is updated many times) may have
    // left copies in free pages, which no column shows: a file that still holds any is rebuilt.
    if file_holds_secrets(db)? || file_holds_secrets(&wal_of(db))? {
        conn.execute_batch("VACUUM").map_err(sql("VACUUM"))?;
        report.vacuumed = true;
    }
    Ok(ScrubOutcome::Scrubbed(report))
}

fn sql(what: &str) -> impl FnOnce(rusqlite::Error) -> ScrubError {
    let what = what.to_string();
    move |source| ScrubError::Sql { what, source }
}

/// The session trees a [`Scope::Changed`] scrub reads, listed in `temp.fro_bot_scrub_ids`.
struct Trees {
    rows: crate::memory::merge::TreeRows,
    /// Sessions in those trees.
    sessions: usize,
}

/// Lists the trees holding `sessions` (`None`: the schema is not one the merge can read, so the
/// whole database is scrubbed instead).
fn changed_trees(
    conn: &Connection,
    sessions: &BTreeSet<String>,
) -> Result<Option<Trees>, ScrubError> {
    let rows = match crate::memory::merge::TreeRows::read(conn) {
        Ok(rows) => rows,
        Err(e) => {
            tracing::debug!("session trees unknown ({e}): scrubbing the whole database");
            return Ok(None);
        }
    };
    conn.execute_batch(
        "CREATE TEMP TABLE fro_bot_scrub_seeds(id PRIMARY KEY);
         CREATE TEMP TABLE fro_bot_scrub_ids(id PRIMARY KEY);",
    )
    .map_err(sql("the session list"))?;
    {
        let mut insert = conn
            .prepare("INSERT OR IGNORE INTO temp.fro_bot_scrub_seeds VALUES (?1)")
            .map_err(sql("the session list"))?;
        for id in sessions {
            insert.execute([id]).map_err(sql("the session list"))?;
        }
    }
    let n = conn
        .execute(
            &rows.expand_trees_sql("fro_bot_scrub_seeds", "fro_bot_scrub_ids"),
            [],
        )
        .map_err(sql("the session trees"))?;
    Ok(Some(Trees { rows, sessions: n }))
}

/// Empties the credential tables and redacts every text and blob value of the rows in scope.
fn scrub_rows(conn: &Connection, trees: Option<&Trees>) -> Result<ScrubReport, ScrubError> {
    let mut report = ScrubReport::default();
    for table in tables(conn).map_err(sql("the schema"))? {
        let quoted = quote(&table);
        if CREDENTIAL_TABLES.contains(&table.as_str()) {
            report.credential_rows += conn
                .execute(&format!("DELETE FROM {quoted}"), [])
                .map_err(sql(&format!("table {table}")))?;
            continue;
        }
        // Rows of the trees in scope; every row of a table not tied to sessions.
        let rows = trees
            .and_then(|t| t.rows.predicate(&table, "fro_bot_scrub_ids"))
            .unwrap_or_else(|| "1".to_string());
        for column in columns(conn, &table).map_err(sql(&format!("table {table}")))? {
            let col = quote(&column);
            report.values += conn
                .execute(
                    &format!(
                        "UPDATE {quoted} SET {col} = fro_bot_redact({col}) \
                         WHERE ({rows}) AND typeof({col}) IN ('text', 'blob') \
                         AND fro_bot_has_secret({col})"
                    ),
                    [],
                )
                .map_err(sql(&format!("{table}.{column}")))?;
        }
    }
    Ok(report)
}

fn register_functions(conn: &Connection, counter: Arc<AtomicUsize>) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8;
    conn.create_scalar_function("fro_bot_has_secret", 1, flags, |ctx| {
        let hit = match ctx.get_raw(0) {
            ValueRef::Text(b) | ValueRef::Blob(b) => crate::redact::redact_bytes(b).1 > 0,
            _ => false,
        };
        Ok(hit)
    })?;
    conn.create_scalar_function("fro_bot_redact", 1, flags, move |ctx| {
        let (value, n) = match ctx.get_raw(0) {
            ValueRef::Text(b) => {
                let (text, n) = redact_text(b);
                (Value::Text(text), n)
            }
            ValueRef::Blob(b) => {
                let (bytes, n) = crate::redact::redact_bytes(b);
                (Value::Blob(bytes), n)
            }
            other => (Value::from(other), 0),
        };
        counter.fetch_add(n, Ordering::Relaxed);
        Ok(value)
    })
}

/// Redacts a text value; JSON stays valid JSON (OpenCode parses its `data` columns).
fn redact_text(raw: &[u8]) -> (String, usize) {
    let text = String::from_utf8_lossy(raw);
    let (out, n) = crate::redact::redact_counted(&text);
    if n == 0 {
        return (out, 0);
    }
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(before) if serde_json::from_str::<serde_json::Value>(&out).is_err() => {
            // A match cut through an escape sequence: redact the parsed strings instead.
            let (value, n) = crate::redact::redact_json(&before);
            (value.to_string(), n)
        }
        _ => (out, n),
    }
}

/// Ordinary tables (not SQLite's own, not virtual ones, whose shadow tables are scrubbed).
fn tables(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         AND upper(coalesce(sql, '')) NOT LIKE 'CREATE VIRTUAL%' ORDER BY name",
    )?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    rows.collect()
}

/// Every column: SQLite stores text in a column of any declared type.
fn columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info(?1)")?;
    let rows = stmt.query_map([table], |r| r.get::<_, String>(0))?;
    rows.collect()
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

fn wal_of(db: &Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    name.into()
}

/// Whether the file's bytes hold a registered secret or token shape anywhere (read in chunks
/// that overlap, so a match across a chunk boundary is seen).
pub fn file_holds_secrets(path: &Path) -> Result<bool, ScrubError> {
    const CHUNK: usize = 8 << 20;
    const OVERLAP: usize = 64 << 10;
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(ScrubError::Read { source }),
    };
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + OVERLAP);
    loop {
        let keep = buf.len().saturating_sub(OVERLAP);
        buf.drain(..keep);
        let before = buf.len();
        (&mut file)
            .take(CHUNK as u64)
            .read_to_end(&mut buf)
            .map_err(|source| ScrubError::Read { source })?;
        if crate::redact::redact_bytes(&buf).1 > 0 {
            return Ok(true);
        }
        if buf.len() == before {
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db_with(dir: &Path, secret: &str) -> std::path::PathBuf {
        let db = dir.join("opencode.db");
        let c = Connection::open(&db).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE part (id TEXT PRIMARY KEY, data TEXT NOT NULL, raw BLOB, n INTEGER);
             CREATE TABLE account (id TEXT PRIMARY KEY, access_token TEXT NOT NULL);
             CREATE TABLE session_share (session_id TEXT PRIMARY KEY, secret TEXT NOT NULL);
             CREATE TABLE odd (\"we\"\"ird\" TEXT);",
        )
        .unwrap();
        let data = serde_json::json!({"type": "text", "text": format!("token is {secret}")});
        c.execute(
            "INSERT INTO part VALUES ('p1', ?1, ?2, 7)",
            rusqlite::params![data.to_string(), format!("raw {secret}").into_bytes()],
        )
        .unwrap();
        // Streamed updates leave older versions of the row in free space.
        for i in 0..20 {
            c.execute(
                "UPDATE part SET data = ?1 WHERE id = 'p1'",
                [format!(
                    "{{\"text\":\"{secret} {i} {}\"}}",
                    "pad".repeat(400)
                )],
            )
            .unwrap();
        }
        c.execute(
            "UPDATE part SET data = ?1 WHERE id = 'p1'",
            [data.to_string()],
        )
        .unwrap();
        c.execute("INSERT INTO part VALUES ('p2', 'clean', NULL, 1)", [])
            .unwrap();
        c.execute("INSERT INTO account VALUES ('a', 'oauth-access')", [])
            .unwrap();
        c.execute("INSERT INTO session_share VALUES ('s', 'share-secret')", [])
            .unwrap();
        c.execute(
            "INSERT INTO odd VALUES (?1)",
            [format!("{secret}\\n in json-ish")],
        )
        .unwrap();
        db
    }

    #[test]
    fn every_text_and_blob_value_is_scrubbed_and_credential_tables_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let secret = "scrub-test-secret-4711";
        crate::redact::register(secret);
        let db = db_with(dir.path(), secret);
        let ScrubOutcome::Scrubbed(report) = scrub(&db, &Scope::Whole).unwrap() else {
            panic!("database exists")
        };
        assert_eq!(report.replacements, 3, "{report:?}");
        assert_eq!(report.values, 3);
        assert_eq!(report.credential_rows, 2);
        assert!(report.vacuumed, "stale copies were in free pages");

        let c = Connection::open(&db).unwrap();
        let data: String = c
            .query_row("SELECT data FROM part WHERE id = 'p1'", [], |r| r.get(0))
            .unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&data).expect("still JSON");
        assert_eq!(parsed["text"], "token is ***");
        let raw: Vec<u8> = c
            .query_row("SELECT raw FROM part WHERE id = 'p1'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(raw, b"raw ***");
        let clean: String = c
            .query_row("SELECT data FROM part WHERE id = 'p2'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(clean, "clean");
        let accounts: i64 = c
            .query_row("SELECT count(*) FROM account", [], |r| r.get(0))
            .unwrap();
        assert_eq!(accounts, 0);
        drop(c);
        // Checkpointed (closing the last connection may have done it already), the file holds no
        // copy anywhere, free pages included.
        assert!(matches!(
            crate::memory::checkpoint::checkpoint(&db),
            crate::memory::checkpoint::CheckpointOutcome::Checkpointed
                | crate::memory::checkpoint::CheckpointOutcome::NothingToCheckpoint
        ));
        let bytes = std::fs::read(&db).unwrap();
        assert!(memchr::memmem::find(&bytes, secret.as_bytes()).is_none());
        assert!(memchr::memmem::find(&bytes, b"share-secret").is_none());
        assert!(memchr::memmem::find(&bytes, b"oauth-access").is_none());
        // A second pass finds nothing more.
        assert_eq!(scrub(&db, &Scope::Whole).unwrap().replacements(), 0);
    }

    /// OpenCode's real schema: `ses_old` (restored, not this run's), `ses_new` and its subagent's
    /// `ses_child`, each with a part holding `secret`, and a project whose commands hold it.
    fn opencode_db(dir: &Path, secret: &str) -> std::path::PathBuf {
        let db = dir.join("opencode.db");
        let c = Connection::open(&db).unwrap();
        c.execute_batch(include_str!(
            "../../tests/it/fixtures/opencode-1.18.33-schema.sql"
        ))
        .unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL;").unwrap();
        let h = "a".repeat(40);
        c.execute(
            "INSERT INTO project (id, worktree, time_created, time_updated, sandboxes, commands) \
             VALUES (?1, '/ws', 1, 1, '[]', ?2)",
            [h.clone(), format!("{{\"start\":\"{secret}\"}}")],
        )
        .unwrap();
        for (id, parent) in [
            ("ses_old", None),
            ("ses_new", None),
            ("ses_child", Some("ses_new")),
        ] {
            c.execute(
                "INSERT INTO session (id, project_id, parent_id, slug, directory, title, version, \
                 time_created, time_updated) VALUES (?1, ?2, ?3, 's', '/ws', 't', '1', 1, 1)",
                rusqlite::params![id, h, parent],
            )
            .unwrap();
            c.execute(
                "INSERT INTO message (id, session_id, time_created, time_updated, data) \
                 VALUES (?1, ?2, 1, 1, '{}')",
                [format!("msg_{id}"), id.to_string()],
            )
            .unwrap();
            let data = serde_json::json!({"type": "text", "text": format!("{id} says {secret}")});
            c.execute(
                "INSERT INTO part (id, message_id, session_id, time_created, time_updated, data) \
                 VALUES (?1, ?2, ?3, 1, 1, ?4)",
                [
                    format!("prt_{id}"),
                    format!("msg_{id}"),
                    id.to_string(),
                    data.to_string(),
                ],
            )
            .unwrap();
        }
        db
    }

    fn part_of(db: &Path, session: &str) -> String {
        Connection::open(db)
            .unwrap()
            .query_row(
                "SELECT data FROM part WHERE session_id = ?1",
                [session],
                |r| r.get(0),
            )
            .unwrap()
    }

    #[test]
    fn a_changed_scope_reads_this_runs_trees_with_their_children_and_the_other_tables() {
        let dir = tempfile::tempdir().unwrap();
        let secret = "scrub-scope-secret-5150";
        crate::redact::register(secret);
        let db = opencode_db(dir.path(), secret);
        let scope = Scope::Changed {
            sessions: BTreeSet::from(["ses_new".to_string()]),
        };
        let ScrubOutcome::Scrubbed(report) = scrub(&db, &scope).unwrap() else {
            panic!("database exists")
        };
        assert_eq!(
            report.trees_of,
            Some(2),
            "ses_new and its subagent's session"
        );
        assert!(!report.vacuumed, "a changed scope never rebuilds the file");
        assert!(part_of(&db, "ses_new").contains("says ***"));
        assert!(
            part_of(&db, "ses_child").contains("says ***"),
            "a child is in the tree"
        );
        // Memory fro-bot saved was scrubbed then: not read again.
        assert!(part_of(&db, "ses_old").contains(secret));
        let commands: String = Connection::open(&db)
            .unwrap()
            .query_row("SELECT commands FROM project", [], |r| r.get(0))
            .unwrap();
        assert!(
            !commands.contains(secret),
            "OpenCode's other tables are read whole"
        );
        assert_eq!(report.replacements, 3);
        // The whole scope reads the rest.
        assert_eq!(scrub(&db, &Scope::Whole).unwrap().replacements(), 1);
        assert!(!part_of(&db, "ses_old").contains(secret));
    }

    #[test]
    fn a_changed_scope_on_a_database_the_merge_cannot_read_is_a_whole_scrub() {
        let dir = tempfile::tempdir().unwrap();
        let secret = "scrub-test-secret-4711";
        crate::redact::register(secret);
        // No `session` table: which rows are whose is unknown.
        let db = db_with(dir.path(), secret);
        let scope = Scope::Changed {
            sessions: BTreeSet::new(),
        };
        let ScrubOutcome::Scrubbed(report) = scrub(&db, &scope).unwrap() else {
            panic!("database exists")
        };
        assert_eq!(report.trees_of, None);
        assert_eq!(report.replacements, 3);
        assert!(report.vacuumed);
    }

    #[test]
    fn a_missing_database_is_nothing_to_scrub() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            scrub(&dir.path().join("opencode.db"), &Scope::Whole).unwrap(),
            ScrubOutcome::NoDatabase
        );
    }

    #[test]
    fn json_stays_valid_when_a_match_cuts_an_escape() {
        // A secret ending in a backslash matches the first half of an escape in JSON text.
        crate::redact::register("ends-with-backslash\\");
        let json = serde_json::json!({"t": "ends-with-backslash\\\"quoted\""}).to_string();
        let (out, n) = redact_text(json.as_bytes());
        assert!(n >= 1);
        serde_json::from_str::<serde_json::Value>(&out).expect("valid JSON");
        assert!(!out.contains("ends-with-backslash"), "{out}");
    }
}
