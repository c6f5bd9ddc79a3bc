//! SQLite handling of OpenCode's session database: fold the WAL into the main file, probe it, and
//! tell real corruption apart from everything else.
//!
//! OpenCode does not checkpoint on exit: after SIGTERM the newest data sits in `opencode.db-wal`,
//! and copying `opencode.db` alone would lose it. Nothing here deletes anything unless SQLite itself
//! says the file is not a database or is malformed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags};

pub const DB_FILE: &str = "opencode.db";
pub const WAL_FILE: &str = "opencode.db-wal";
pub const SHM_FILE: &str = "opencode.db-shm";
/// OpenCode ≤ 1.x kept JSON files here; removed on a clean slate.
pub const LEGACY_STORAGE_DIR: &str = "storage";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointOutcome {
    /// The WAL was folded in; the main file alone now holds everything.
    Checkpointed,
    /// No database, an empty one, or no WAL content: the main file is already complete.
    NothingToCheckpoint,
    Failed {
        structural: bool,
        message: String,
    },
}

impl CheckpointOutcome {
    pub fn describe(&self) -> String {
        match self {
            CheckpointOutcome::Checkpointed => "checkpointed".into(),
            CheckpointOutcome::NothingToCheckpoint => "nothing to checkpoint".into(),
            CheckpointOutcome::Failed {
                structural: true,
                message,
            } => {
                format!("failed (corrupt database): {message}")
            }
            CheckpointOutcome::Failed {
                structural: false,
                message,
            } => format!("failed: {message}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    Readable,
    Failed { structural: bool, message: String },
}

/// Retry bounds for a checkpoint that finds the database busy or locked.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub delay: Duration,
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            delay: Duration::from_millis(200),
            deadline: Duration::from_secs(5),
        }
    }
}

pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join(DB_FILE)
}

fn wal_path(db: &Path) -> PathBuf {
    sibling(db, "-wal")
}

pub(crate) fn sibling(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

fn file_len(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// Only SQLite's "file is not a database" and "database disk image is malformed" count as
/// corruption. Permission, disk-full, I/O and read-only errors never do.
pub fn is_structural(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt)
    )
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

pub fn checkpoint(db: &Path) -> CheckpointOutcome {
    checkpoint_with(db, RetryPolicy::default())
}

/// `PRAGMA wal_checkpoint(TRUNCATE)`, retried while busy. Success is judged on disk: the WAL is
/// absent or empty afterwards (the pragma's counters are not trusted).
pub fn checkpoint_with(db: &Path, policy: RetryPolicy) -> CheckpointOutcome {
    if file_len(db).unwrap_or(0) == 0 || file_len(&wal_path(db)).unwrap_or(0) == 0 {
        return CheckpointOutcome::NothingToCheckpoint;
    }
    let started = Instant::now();
    let mut last = String::new();
    for attempt in 1..=policy.attempts.max(1) {
        match checkpoint_once(db) {
            Ok(()) if file_len(&wal_path(db)).unwrap_or(0) == 0 => {
                return CheckpointOutcome::Checkpointed;
            }
            Ok(()) => last = "the WAL was not emptied (a reader or writer still holds it)".into(),
            Err(e) if is_structural(&e) => {
                return CheckpointOutcome::Failed {
                    structural: true,
                    message: e.to_string(),
                }
            }
            Err(e) if is_busy(&e) => last = e.to_string(),
            Err(e) => {
                return CheckpointOutcome::Failed {
                    structural: false,
                    message: e.to_string(),
                }
            }
        }
        if attempt == policy.attempts || started.elapsed() + policy.delay > policy.deadline {
            break;
        }
        std::thread::sleep(policy.delay);
    }
    CheckpointOutcome::Failed {
        structural: false,
        message: format!("database busy: {last}"),
    }
}

fn checkpoint_once(db: &Path) -> rusqlite::Result<()> {
    // No CREATE: a database that vanished must not come back as an empty file.
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    // SQLite's own busy handler waits too; keep it short so our bounded retry governs.
    conn.busy_timeout(Duration::from_millis(100))?;
    // Reading the schema first surfaces NOTADB/CORRUPT before the pragma.
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })?;
    let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
    conn.close().map_err(|(_, e)| e)?;
    if busy != 0 {
        // Not trusted either way; the caller checks the WAL's size on disk.
        tracing::debug!("wal_checkpoint reported busy");
    }
    Ok(())
}

/// Opens the database and reads its schema. Used only when a checkpoint had nothing to do.
pub fn probe(db: &Path) -> ProbeOutcome {
    let result = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|conn| {
        conn.busy_timeout(Duration::from_secs(2))?;
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })
    });
    match result {
        Ok(_) => ProbeOutcome::Readable,
        Err(e) => ProbeOutcome::Failed {
            structural: is_structural(&e),
            message: e.to_string(),
        },
    }
}

/// Removes the legacy `storage/` dir and the database with its WAL and SHM. Only for positive
/// corruption, a storage-version mismatch or an unreadable data dir. Returns what was removed.
pub fn clean_storage(data_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let storage = data_dir.join(LEGACY_STORAGE_DIR);
    match std::fs::remove_dir_all(&storage) {
        Ok(()) => removed.push(storage),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    for name in [DB_FILE, WAL_FILE, SHM_FILE] {
        let path = data_dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// Removes a stale `-wal`/`-shm` beside a database that was just replaced as a whole file: an old
/// WAL applied to a new main file would corrupt it.
pub fn remove_stale_sidecars(db: &Path) -> std::io::Result<()> {
    for suffix in ["-wal", "-shm"] {
        match std::fs::remove_file(sibling(db, suffix)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wal_db(dir: &Path) -> (PathBuf, Connection) {
        let db = dir.join(DB_FILE);
        let conn = Connection::open(&db).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        // Keep everything in the WAL: no automatic checkpoint.
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1),(2),(3);")
            .unwrap();
        (db, conn)
    }

    #[test]
    fn nothing_to_checkpoint_without_db_or_wal() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(DB_FILE);
        assert_eq!(checkpoint(&db), CheckpointOutcome::NothingToCheckpoint);
        assert!(!db.exists(), "a missing database must not be created");
        std::fs::write(&db, b"").unwrap();
        std::fs::write(wal_path(&db), b"garbage").unwrap();
        assert_eq!(checkpoint(&db), CheckpointOutcome::NothingToCheckpoint);
        // Garbage main file but no WAL: not opened, so not judged here (probe's job).
        std::fs::write(&db, b"not a database at all, just text........").unwrap();
        std::fs::remove_file(wal_path(&db)).unwrap();
        assert_eq!(checkpoint(&db), CheckpointOutcome::NothingToCheckpoint);
    }

    #[test]
    fn checkpoint_folds_the_wal_and_empties_it() {
        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = wal_db(dir.path());
        // Leak the connection's file handles as a killed writer would leave them.
        std::mem::forget(conn);
        assert!(file_len(&wal_path(&db)).unwrap() > 0);
        assert_eq!(checkpoint(&db), CheckpointOutcome::Checkpointed);
        assert_eq!(file_len(&wal_path(&db)).unwrap_or(0), 0);
        // The main file alone now holds the rows.
        let copy = dir.path().join("copy.db");
        std::fs::copy(&db, &copy).unwrap();
        let n: i64 = Connection::open(&copy)
            .unwrap()
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3);
    }

    #[test]
    fn a_reader_holding_the_wal_makes_it_retry_then_fail_softly() {
        let dir = tempfile::tempdir().unwrap();
        let (db, writer) = wal_db(dir.path());
        let reader = Connection::open(&db).unwrap();
        reader
            .execute_batch("BEGIN; SELECT count(*) FROM t;")
            .unwrap();
        writer.execute("INSERT INTO t VALUES (4)", []).unwrap();
        let policy = RetryPolicy {
            attempts: 3,
            delay: Duration::from_millis(20),
            deadline: Duration::from_secs(1),
        };
        match checkpoint_with(&db, policy) {
            CheckpointOutcome::Failed {
                structural: false, ..
            } => {}
            other => panic!("expected a soft failure, got {other:?}"),
        }
        assert!(db.exists());
        reader.execute_batch("COMMIT").unwrap();
        drop(reader);
        drop(writer);
    }

    #[test]
    fn garbage_is_structural_and_permission_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(DB_FILE);
        std::fs::write(&db, vec![0x42u8; 8192]).unwrap();
        match probe(&db) {
            ProbeOutcome::Failed {
                structural: true, ..
            } => {}
            other => panic!("garbage must be structural: {other:?}"),
        }
        std::fs::write(wal_path(&db), vec![0x13u8; 4096]).unwrap();
        match checkpoint(&db) {
            CheckpointOutcome::Failed {
                structural: true, ..
            } => {}
            other => panic!("garbage must be structural: {other:?}"),
        }
    }

    #[test]
    fn only_notadb_and_corrupt_are_structural() {
        use rusqlite::ffi;
        let err = |code| rusqlite::Error::SqliteFailure(ffi::Error::new(code), None);
        assert!(is_structural(&err(ffi::SQLITE_NOTADB)));
        assert!(is_structural(&err(ffi::SQLITE_CORRUPT)));
        for code in [
            ffi::SQLITE_PERM,
            ffi::SQLITE_READONLY,
            ffi::SQLITE_IOERR,
            ffi::SQLITE_FULL,
            ffi::SQLITE_CANTOPEN,
            ffi::SQLITE_BUSY,
            ffi::SQLITE_LOCKED,
            ffi::SQLITE_AUTH,
        ] {
            assert!(
                !is_structural(&err(code)),
                "code {code} must not count as corruption"
            );
        }
    }

    #[test]
    fn truncated_database_is_structural() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(DB_FILE);
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE t(x); WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i<5000) INSERT INTO t SELECT randomblob(200) FROM c;",
        )
        .unwrap();
        drop(conn);
        let bytes = std::fs::read(&db).unwrap();
        std::fs::write(&db, &bytes[..bytes.len() / 3]).unwrap();
        let conn = Connection::open(&db).unwrap();
        let err = conn
            .query_row("SELECT count(*), sum(length(x)) FROM t", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap_err();
        assert!(is_structural(&err), "{err}");
    }

    #[test]
    fn clean_storage_removes_exactly_the_database_files() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        std::fs::create_dir_all(data.join("storage/session")).unwrap();
        for f in [DB_FILE, WAL_FILE, SHM_FILE, "auth.json", "fro-bot.json"] {
            std::fs::write(data.join(f), b"x").unwrap();
        }
        std::fs::create_dir_all(data.join("log")).unwrap();
        let removed = clean_storage(data).unwrap();
        assert_eq!(removed.len(), 4);
        assert!(!data.join(DB_FILE).exists() && !data.join("storage").exists());
        assert!(data.join("log").exists() && data.join("auth.json").exists());
    }
}
