//! Only the run's own conversation may change (docs/security.md#what-it-leaves-behind, the second
//! wall). The agent owns the data dir for its turn and could rewrite another thread's rows in
//! `opencode.db`. Before the turn fro-bot keeps a root-only copy of the database; after it, with
//! OpenCode stopped, the database is rebuilt as that copy plus this run's own session trees
//! (`merge::merge_only`), so every other conversation is exactly as restored. When that cannot be
//! done, the copy is put back whole: this run's exchange is then not kept, but no other thread's
//! memory is rewritten.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::memory::ledger::{Ledger, OwnRows, Provenance};
use crate::memory::merge::{self, Snapshot};
use crate::memory::scrub::Scope;
use crate::memory::state_paths::StatePaths;
use crate::runner::env::state;
use crate::runner::{log, FileCommands};

/// The database as restored, kept out of the agent's reach for the turn.
pub(crate) struct MemoryGuard {
    _dir: tempfile::TempDir,
    copy: PathBuf,
    snapshot: Snapshot,
}

/// Memory as it was before the turn.
pub(crate) enum Before {
    /// Nothing was restored: no other conversation to protect, and every message the database
    /// holds after the turn is this run's.
    Nothing,
    /// A copy, out of the agent's reach.
    Kept(MemoryGuard),
    /// The copy could not be made: other conversations are not guarded, and which messages are
    /// this run's is not known.
    Unknown,
}

/// Copies the restored database before the turn (and says so in main's state, for post).
pub(crate) fn take(paths: &StatePaths, files: &FileCommands) -> Before {
    let db = paths.db();
    if !db.is_file() {
        return Before::Nothing;
    }
    let kept = (|| -> Result<MemoryGuard, String> {
        let dir = tempfile::Builder::new()
            .prefix("fro-bot-memory-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let copy = dir.path().join("opencode.db");
        copy_db(&db, &copy).map_err(|e| e.to_string())?;
        let snapshot = Snapshot::capture(&copy).map_err(|e| e.to_string())?;
        Ok(MemoryGuard {
            _dir: dir,
            copy,
            snapshot,
        })
    })();
    match kept {
        Ok(g) => {
            // Until `put_back`, post must not save what the agent leaves.
            files.save_state_or_warn(state::MEMORY_GUARD, "pending");
            Before::Kept(g)
        }
        Err(e) => {
            log::warning(&format!(
                "cannot keep a copy of the restored memory, so other threads' conversations are not guarded this run: {e}"
            ));
            Before::Unknown
        }
    }
}

/// The database and its WAL, as SQLite would read them.
fn copy_db(db: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::copy(db, to)?;
    let wal = crate::memory::checkpoint::sibling(db, "-wal");
    if wal.is_file() {
        std::fs::copy(&wal, crate::memory::checkpoint::sibling(to, "-wal"))?;
    }
    Ok(())
}

/// After the turn: the database becomes the copy plus `own` session trees. Says in the summary
/// how many other conversations the agent had changed. When the copy was memory fro-bot had
/// scrubbed, `own` trees are scrubbed before they are written into it, so nothing in the rebuilt
/// file ever held a secret and the save scrubs only those trees (`Provenance`).
/// Also records the messages the turn wrote and its thread's session (`Ledger::own_rows`),
/// which only this run's database holds. The trees cleanup `pruned` stay deleted when the copy
/// too says they are past the window ([`pruned_in_copy`]).
pub(crate) fn put_back(
    ledger: &mut Ledger,
    (paths, files): (&StatePaths, &FileCommands),
    before: Before,
    own: &[&str],
    thread: Option<(String, String)>,
    (pruned, retention): (&[String], usize),
) {
    let scrubbed_base = ledger.provenance == Provenance::Scrubbed;
    // Anything but a rebuild from scrubbed memory leaves the save to scrub the whole database.
    ledger.provenance = Provenance::Unknown;
    let db = paths.db();
    let guard = match before {
        Before::Kept(guard) => guard,
        Before::Nothing => {
            ledger.own_rows = own_rows(&db, None, thread);
            return;
        }
        Before::Unknown => return,
    };
    let own: BTreeSet<String> = own.iter().map(|s| s.to_string()).collect();
    let prescrubbed = scrubbed_base && prescrub(&db, &own);
    let mut taken = own.clone();
    taken.extend(pruned_in_copy(&guard.copy, pruned, retention, &own));
    let (note, rebuilt) = rebuild(&guard, &db, &taken);
    if let Some(note) = note {
        log::warning(&note);
        ledger.report.confinement.push(note);
    }
    if prescrubbed && rebuilt {
        ledger.provenance = Provenance::RebuiltFromScrubbed;
    }
    ledger.own_rows = own_rows(&db, Some(&guard.copy), thread);
    files.save_state_or_warn(state::MEMORY_GUARD, "");
}

/// The sessions cleanup pruned that the restored copy, too, plans to prune: the rebuild takes their
/// deletion. Planned on the copy, which the agent could not touch, so a conversation the agent
/// made look old in the database is put back, not lost (docs/persistence.md#every-thread-resumes).
fn pruned_in_copy(
    copy: &Path,
    pruned: &[String],
    retention: usize,
    protect: &BTreeSet<String>,
) -> Vec<String> {
    if pruned.is_empty() {
        return Vec::new();
    }
    let protect: Vec<&str> = protect.iter().map(String::as_str).collect();
    let now = crate::opencode::system_now_ms();
    match crate::opencode::prune::plan_in(copy, now, retention, &protect) {
        Ok(plan) => {
            let planned: BTreeSet<&String> = plan.delete.iter().collect();
            pruned
                .iter()
                .filter(|id| planned.contains(id))
                .cloned()
                .collect()
        }
        Err(e) => {
            tracing::warn!(
                "this run's pruning is not kept: the restored memory cannot be read: {e}"
            );
            Vec::new()
        }
    }
}

/// The messages `db` holds now and did not before the turn (`before`: its copy; `None`: there was
/// none), and the thread's session. Unreadable: no messages (nothing of this run's then moves in a
/// merge). Before anything of the turn is saved, each of its answers takes its question's creation
/// time, so its exchanges never interleave with another run's (`merge::keep_together`).
fn own_rows(db: &Path, before: Option<&Path>, thread: Option<(String, String)>) -> OwnRows {
    let messages = match db.is_file().then(|| merge::messages_added(before, db)) {
        Some(Ok(ids)) => ids,
        Some(Err(e)) => {
            tracing::debug!("this run's messages are not known: {e}");
            Default::default()
        }
        None => Default::default(),
    };
    if let Err(e) = merge::keep_together(db, &messages) {
        tracing::warn!("this turn's answers keep their own times (a merge may move them): {e}");
    }
    OwnRows::new(messages, thread)
}

/// Scrubs the rows of `own` trees (and OpenCode's other tables) in the agent's database, the ones
/// the rebuild copies; its free space is left behind with the file. Whether that succeeded.
fn prescrub(db: &Path, own: &BTreeSet<String>) -> bool {
    let scope = Scope::Changed {
        sessions: own.clone(),
    };
    match crate::memory::scrub::scrub(db, &scope) {
        Ok(outcome) => {
            tracing::debug!("this run's trees scrubbed: {}", outcome.describe());
            true
        }
        Err(e) => {
            tracing::warn!("cannot scrub this run's trees before the rebuild (the save scrubs the whole database): {e}");
            false
        }
    }
}

/// The copy plus `own` trees into `db`, or the copy whole when that fails: the note for the
/// summary, and whether `db` is now one of the two.
fn rebuild(guard: &MemoryGuard, db: &Path, own: &BTreeSet<String>) -> (Option<String>, bool) {
    let out = crate::memory::checkpoint::sibling(db, ".fro-bot-guard");
    match merge::merge_only(&guard.copy, db, &guard.snapshot, &out, own) {
        Ok(report) => match replace(&out, db) {
            Ok(()) => (reverted_note(&report.refused), true),
            Err(e) => fall_back(
                guard,
                db,
                &format!("cannot put the rebuilt database in place: {e}"),
            ),
        },
        Err(e) => fall_back(guard, db, &e.to_string()),
    }
}

fn reverted_note(refused: &[(String, Option<String>)]) -> Option<String> {
    (!refused.is_empty()).then(|| {
        let ids: Vec<String> = refused
            .iter()
            .map(|(root, _)| format!("`{root}`"))
            .collect();
        format!(
            "the agent changed {} conversation(s) other than this run's ({}): put back as restored",
            refused.len(),
            ids.join(", ")
        )
    })
}

/// The merge failed: the restored copy goes back whole, and this run's exchange is not kept.
/// Whether it went back.
fn fall_back(guard: &MemoryGuard, db: &Path, why: &str) -> (Option<String>, bool) {
    let back = copy_db(
        &guard.copy,
        &crate::memory::checkpoint::sibling(db, ".fro-bot-guard"),
    )
    .and_then(|()| {
        replace(
            &crate::memory::checkpoint::sibling(db, ".fro-bot-guard"),
            db,
        )
    });
    match back {
        Ok(()) => (Some(format!(
            "memory could not be limited to this run's conversation ({why}); the restored memory was put back, so this run's exchange is not kept"
        )), true),
        Err(e) => (Some(format!(
            "memory could not be limited to this run's conversation ({why}), nor put back ({e})"
        )), false),
    }
}

/// Renames `from` (and its WAL) over `db`, after removing `db`'s own sidecars.
fn replace(from: &Path, db: &Path) -> std::io::Result<()> {
    crate::memory::checkpoint::remove_stale_sidecars(db)?;
    let wal = crate::memory::checkpoint::sibling(from, "-wal");
    if wal.is_file() {
        std::fs::rename(&wal, crate::memory::checkpoint::sibling(db, "-wal"))?;
    }
    let _ = std::fs::remove_file(crate::memory::checkpoint::sibling(from, "-shm"));
    std::fs::rename(from, db)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    const SECRET: &str = "guard-rebuild-secret-8086";

    fn session(c: &Connection, id: &str, text: &str) {
        c.execute(
            "INSERT INTO session (id, project_id, slug, directory, title, version, time_created, \
             time_updated) VALUES (?1, ?2, 's', '/ws', 't', '1', 1, 1)",
            [id, &"a".repeat(40)],
        )
        .unwrap();
        c.execute(
            "INSERT INTO message (id, session_id, time_created, time_updated, data) \
             VALUES (?1, ?2, 1, 1, '{}')",
            [format!("msg_{id}"), id.to_string()],
        )
        .unwrap();
        c.execute(
            "INSERT INTO part (id, message_id, session_id, time_created, time_updated, data) \
             VALUES (?1, ?2, ?3, 1, 1, ?4)",
            [
                format!("prt_{id}"),
                format!("msg_{id}"),
                id.to_string(),
                text.to_string(),
            ],
        )
        .unwrap();
    }

    /// Memory a fro-bot saved (scrubbed whole), then a turn as OpenCode writes it: this run's
    /// session streamed with the secret in every version (old copies in free pages), and another
    /// thread's session rewritten to hold it.
    fn restored_then_turn(dir: &Path) -> (MemoryGuard, PathBuf) {
        let db = dir.join("opencode.db");
        {
            let c = Connection::open(&db).unwrap();
            c.execute_batch(include_str!(
                "../../tests/it/fixtures/opencode-1.18.33-schema.sql"
            ))
            .unwrap();
            c.execute_batch(
                "PRAGMA journal_mode=WAL; INSERT INTO project (id, worktree, time_created, \
                 time_updated, sandboxes) VALUES ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', \
                 '/ws', 1, 1, '[]');",
            )
            .unwrap();
            for i in 0..50 {
                session(&c, &format!("ses_old{i}"), &"earlier turn ".repeat(100));
            }
        }
        crate::memory::scrub::scrub(&db, &Scope::Whole).unwrap();
        let kept = tempfile::tempdir().unwrap();
        let copy = kept.path().join("opencode.db");
        copy_db(&db, &copy).unwrap();
        let guard = MemoryGuard {
            snapshot: Snapshot::capture(&copy).unwrap(),
            _dir: kept,
            copy,
        };
        let c = Connection::open(&db).unwrap();
        session(&c, "ses_new", "{}");
        for i in 0..30 {
            let text = format!("{{\"text\":\"{SECRET} {i} {}\"}}", "streamed ".repeat(300));
            c.execute("UPDATE part SET data = ?1 WHERE id = 'prt_ses_new'", [text])
                .unwrap();
        }
        c.execute(
            "UPDATE part SET data = ?1 WHERE id = 'prt_ses_new'",
            [format!("{{\"text\":\"the answer: {SECRET}\"}}")],
        )
        .unwrap();
        c.execute(
            "UPDATE part SET data = ?1 WHERE id = 'prt_ses_old3'",
            [format!("{{\"text\":\"planted {SECRET}\"}}")],
        )
        .unwrap();
        c.execute(
            "UPDATE session SET time_updated = 2 WHERE id IN ('ses_new', 'ses_old3')",
            [],
        )
        .unwrap();
        (guard, db)
    }

    #[test]
    fn a_rebuild_from_scrubbed_memory_leaves_no_secret_for_a_scrub_of_this_runs_trees() {
        crate::redact::register(SECRET);
        let dir = tempfile::tempdir().unwrap();
        let (guard, db) = restored_then_turn(dir.path());
        let own = BTreeSet::from(["ses_new".to_string()]);
        assert!(prescrub(&db, &own));
        let (note, rebuilt) = rebuild(&guard, &db, &own);
        assert!(rebuilt, "{note:?}");
        assert!(
            note.is_some_and(|n| n.contains("ses_old3")),
            "put back as restored"
        );
        // What the save then does for a run whose memory was rebuilt from scrubbed memory.
        let scope = Scope::Changed { sessions: own };
        let outcome = crate::memory::scrub::scrub(&db, &scope).unwrap();
        assert!(matches!(
            crate::memory::checkpoint::checkpoint(&db),
            crate::memory::checkpoint::CheckpointOutcome::Checkpointed
                | crate::memory::checkpoint::CheckpointOutcome::NothingToCheckpoint
        ));
        let bytes = std::fs::read(&db).unwrap();
        assert!(
            memchr::memmem::find(&bytes, SECRET.as_bytes()).is_none(),
            "no copy in any saved byte, free pages included ({})",
            outcome.describe()
        );
        let answer: String = Connection::open(&db)
            .unwrap()
            .query_row("SELECT data FROM part WHERE id = 'prt_ses_new'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(
            answer, "{\"text\":\"the answer: ***\"}",
            "this run's turn is kept"
        );
    }

    /// Cleanup pruned two old trees and a recent conversation the agent had made look old in the
    /// database: the rebuild keeps the old trees deleted and puts the recent one back.
    #[test]
    fn only_pruning_the_restored_copy_agrees_with_stays() {
        const DAY: i64 = 86_400_000;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("opencode.db");
        let now = crate::opencode::system_now_ms();
        {
            let c = Connection::open(&db).unwrap();
            c.execute_batch(include_str!(
                "../../tests/it/fixtures/opencode-1.18.33-schema.sql"
            ))
            .unwrap();
            c.execute_batch(
                "INSERT INTO project (id, worktree, time_created, time_updated, sandboxes) \
                 VALUES ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', '/ws', 1, 1, '[]');",
            )
            .unwrap();
            for (id, age) in [
                ("ses_old", 40),
                ("ses_child", 1),
                ("ses_recent", 1),
                ("ses_mine", 90),
            ] {
                session(&c, id, "{}");
                c.execute(
                    "UPDATE session SET time_updated = ?1 WHERE id = ?2",
                    rusqlite::params![now - age * DAY, id],
                )
                .unwrap();
            }
            c.execute(
                "UPDATE session SET parent_id = 'ses_old' WHERE id = 'ses_child'",
                [],
            )
            .unwrap();
        }
        let kept = tempfile::tempdir().unwrap();
        let copy = kept.path().join("opencode.db");
        copy_db(&db, &copy).unwrap();
        let guard = MemoryGuard {
            snapshot: Snapshot::capture(&copy).unwrap(),
            _dir: kept,
            copy,
        };
        // What OpenCode's deletions left: the agent had dated `ses_recent` 1970, so it went too.
        let c = Connection::open(&db).unwrap();
        for table in ["part", "message", "session"] {
            let key = if table == "session" {
                "id"
            } else {
                "session_id"
            };
            c.execute(
                &format!(
                    "DELETE FROM {table} WHERE {key} IN ('ses_child', 'ses_old', 'ses_recent')"
                ),
                [],
            )
            .unwrap();
        }
        drop(c);
        let pruned: Vec<String> = ["ses_child", "ses_old", "ses_recent"]
            .map(String::from)
            .to_vec();
        let own: BTreeSet<String> = ["ses_mine".to_string()].into();
        let taken = pruned_in_copy(&guard.copy, &pruned, 0, &own);
        assert_eq!(taken, ["ses_child", "ses_old"]);
        let mut all = own.clone();
        all.extend(taken);
        let (note, rebuilt) = rebuild(&guard, &db, &all);
        assert!(rebuilt, "{note:?}");
        assert!(note.is_some_and(|n| n.contains("ses_recent")), "put back");
        let left: Vec<String> = Connection::open(&db)
            .unwrap()
            .prepare("SELECT id FROM session ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(left, ["ses_mine", "ses_recent"]);
        assert!(pruned_in_copy(&guard.copy, &[], 0, &own).is_empty());
    }
}
