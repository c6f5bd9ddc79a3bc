//! Persistence: real SQLite files in WAL mode written by a real writer process that is killed with
//! SIGKILL, so the newest rows exist only in the WAL.

use std::path::Path;
use std::process::Command;

use fro_bot::checkpoint::{self, CheckpointOutcome};

/// Writes `rows` rows in WAL mode from a separate Python process (its own SQLite), with automatic
/// checkpoints off, then SIGKILLs itself: nothing gets folded into the main file on exit.
pub fn killed_writer(db: &Path, rows: usize) {
    let script = r#"
import os, signal, sqlite3, sys
db, rows = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db, isolation_level=None)
c.execute("PRAGMA journal_mode=WAL")
c.execute("PRAGMA wal_autocheckpoint=0")
c.execute("CREATE TABLE IF NOT EXISTS memory(id INTEGER PRIMARY KEY, body TEXT)")
for i in range(rows):
    c.execute("INSERT INTO memory(body) VALUES (?)", ("turn %d " % i + "x" * 200,))
os.kill(os.getpid(), signal.SIGKILL)
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(db)
        .arg(rows.to_string())
        .status()
        .expect("python3 runs");
    assert!(!status.success(), "the writer must die by SIGKILL");
}

fn count_rows_in_main_file_alone(db: &Path) -> i64 {
    // A copy without its WAL is what a naive save would have uploaded.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.db");
    std::fs::copy(db, &copy).unwrap();
    let conn = rusqlite::Connection::open(&copy).unwrap();
    conn.query_row("SELECT count(*) FROM memory", [], |r| r.get(0))
        .unwrap_or(0)
}

#[test]
fn wal_only_rows_are_folded_into_the_main_file_by_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("opencode.db");
    killed_writer(&db, 500);
    let wal = dir.path().join("opencode.db-wal");
    assert!(wal.metadata().unwrap().len() > 0, "the rows must sit in the WAL");
    assert_eq!(
        count_rows_in_main_file_alone(&db),
        0,
        "the main file alone must miss them (else this test proves nothing)"
    );
    assert_eq!(checkpoint::checkpoint(&db), CheckpointOutcome::Checkpointed);
    assert_eq!(wal.metadata().map(|m| m.len()).unwrap_or(0), 0);
    assert_eq!(count_rows_in_main_file_alone(&db), 500);
}
