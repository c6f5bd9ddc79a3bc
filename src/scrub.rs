//! Scrubbed memory (docs/security.md): before the session database is checkpointed and saved,
//! every registered secret and token shape is replaced in every text and blob value of every table
//! (schema-driven, so OpenCode's message and part JSON and any table a later version adds are
//! covered), and the tables that hold credentials are emptied. One transaction, on the live
//! WAL-mode database, after OpenCode stopped. Old copies in free pages are wiped by a `VACUUM`
//! when the file still holds any.

use std::io::Read as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rusqlite::functions::FunctionFlags;
use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags};

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
pub fn scrub(db: &Path) -> Result<ScrubOutcome, ScrubError> {
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
    let sql = |what: &str| {
        let what = what.to_string();
        move |source| ScrubError::Sql { what, source }
    };
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(sql("the busy timeout"))?;
    // Overwritten and deleted content is zeroed, not left in free space.
    conn.pragma_update(None, "secure_delete", "ON")
        .map_err(sql("secure_delete"))?;
    let counter = Arc::new(AtomicUsize::new(0));
    register_functions(&conn, counter.clone()).map_err(sql("function registration"))?;

    let mut report = ScrubReport::default();
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sql("a transaction"))?;
    for table in tables(&tx).map_err(sql("the schema"))? {
        let quoted = quote(&table);
        if CREDENTIAL_TABLES.contains(&table.as_str()) {
            report.credential_rows += tx
                .execute(&format!("DELETE FROM {quoted}"), [])
                .map_err(sql(&format!("table {table}")))?;
            continue;
        }
        for column in columns(&tx, &table).map_err(sql(&format!("table {table}")))? {
            let col = quote(&column);
            report.values += tx
                .execute(
                    &format!(
                        "UPDATE {quoted} SET {col} = fro_bot_redact({col}) \
                         WHERE typeof({col}) IN ('text', 'blob') AND fro_bot_has_secret({col})"
                    ),
                    [],
                )
                .map_err(sql(&format!("{table}.{column}")))?;
        }
    }
    tx.commit().map_err(sql("the commit"))?;
    report.replacements = counter.load(Ordering::Relaxed);

    // Rows OpenCode rewrote or deleted before (a streamed part is updated many times) may have
    // left copies in free pages, which no column shows: a file that still holds any is rebuilt.
    if file_holds_secrets(db)? || file_holds_secrets(&wal_of(db))? {
        conn.execute_batch("VACUUM").map_err(sql("VACUUM"))?;
        report.vacuumed = true;
    }
    Ok(ScrubOutcome::Scrubbed(report))
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
        let ScrubOutcome::Scrubbed(report) = scrub(&db).unwrap() else {
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
            crate::checkpoint::checkpoint(&db),
            crate::checkpoint::CheckpointOutcome::Checkpointed
                | crate::checkpoint::CheckpointOutcome::NothingToCheckpoint
        ));
        let bytes = std::fs::read(&db).unwrap();
        assert!(memchr::memmem::find(&bytes, secret.as_bytes()).is_none());
        assert!(memchr::memmem::find(&bytes, b"share-secret").is_none());
        assert!(memchr::memmem::find(&bytes, b"oauth-access").is_none());
        // A second pass finds nothing more.
        assert_eq!(scrub(&db).unwrap().replacements(), 0);
    }

    #[test]
    fn a_missing_database_is_nothing_to_scrub() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            scrub(&dir.path().join("opencode.db")).unwrap(),
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
