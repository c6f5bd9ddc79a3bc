//! Only the run's own conversation may change (docs/security.md#what-it-leaves-behind, the second
//! wall). The agent owns the data dir for its turn and could rewrite another thread's rows in
//! `opencode.db`. Before the turn fro-bot keeps a root-only copy of the database; after it, with
//! OpenCode stopped, the database is rebuilt as that copy plus this run's own session trees
//! (`merge::merge_only`), so every other conversation is exactly as restored. When that cannot be
//! done, the copy is put back whole: this run's exchange is then not kept, but no other thread's
//! memory is rewritten. The copy is kept where the post step can reach it and the agent cannot
//! (`handoff`), so a post step that finds main killed in between finishes the rebuild
//! (`from_handoff`, `limit`) exactly as main's `put_back` would have
//! (docs/persistence.md#a-turn-cut-short).

mod handoff;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub use handoff::{Handoff, HandoffError};

use crate::memory::ledger::{Ledger, OwnRows, Provenance};
use crate::memory::merge::{self, Snapshot};
use crate::memory::scrub::Scope;
use crate::memory::state_paths::StatePaths;
use crate::runner::env::state;
use crate::runner::{log, FileCommands};

/// The database as restored, kept out of the agent's reach for the turn.
pub struct MemoryGuard {
    /// Main's copy goes with the guard; one post took over is removed by post
    /// (`Handoff::discard`).
    _dir: Option<tempfile::TempDir>,
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

/// The sessions whose trees are this run's own conversation: the thread's session (resumed or
/// started) and one a context overflow replaced; their sub-agent sessions come with their trees.
/// Main's put-back, its repair and post's finish all read this one list
/// (docs/persistence.md#a-turn-cut-short).
pub fn own_sessions(thread: Option<&str>, replaced: Option<&str>) -> Vec<String> {
    [thread, replaced]
        .into_iter()
        .flatten()
        .map(str::to_string)
        .collect()
}

/// Main's state learns this run's own sessions (`own_sessions`) as soon as main does: before
/// the prompt is sent and again when the turn returns. Post reads them back (`recorded_own`).
pub(crate) fn record_own(files: &FileCommands, own: &[String]) {
    match serde_json::to_string(own) {
        Ok(json) => files.save_state_or_warn(state::MEMORY_OWN, &json),
        Err(e) => tracing::warn!("post could not learn this run's sessions: {e}"),
    }
}

/// Post: the own sessions main recorded; `None` when it recorded none (no prompt was sent).
pub fn recorded_own(value: Option<&str>) -> Option<Vec<String>> {
    let own: Vec<String> = serde_json::from_str(value.filter(|v| !v.is_empty())?).ok()?;
    Some(own)
}

/// Copies the restored database before the turn, into a root-only directory under `runner_temp`
/// when there is one (post's reach: `Handoff`, with the copy's SHA-256 in main's state), else the
/// system temp dir; says so in main's state.
pub(crate) fn take(
    paths: &StatePaths,
    files: &FileCommands,
    (runner_temp, provenance): (Option<&Path>, Provenance),
) -> Before {
    let db = paths.db();
    if !db.is_file() {
        return Before::Nothing;
    }
    let scrubbed = provenance == Provenance::Scrubbed;
    match keep_copy(&db, runner_temp, scrubbed) {
        Ok((guard, handoff)) => {
            // Until `put_back`, post must not save what the agent leaves unless it finishes it.
            files.save_state_or_warn(state::MEMORY_GUARD, "pending");
            match handoff {
                Some(h) => files.save_state_or_warn(state::MEMORY_HANDOFF, &h.to_state()),
                None => files.save_state_or_warn(state::MEMORY_HANDOFF, ""),
            }
            Before::Kept(guard)
        }
        Err(e) => {
            log::warning(&format!(
                "cannot keep a copy of the restored memory, so other threads' conversations are not guarded this run: {e}"
            ));
            Before::Unknown
        }
    }
}

/// The copy, one file (its WAL folded in), and its record for post when it is in `runner_temp`.
fn keep_copy(
    db: &Path,
    runner_temp: Option<&Path>,
    scrubbed: bool,
) -> Result<(MemoryGuard, Option<Handoff>), String> {
    let in_reach = runner_temp.and_then(|t| match handoff::make_dir(t) {
        Ok(dir) => Some(dir),
        Err(e) => {
            tracing::warn!("the memory guard's copy stays out of the post step's reach: {e}");
            None
        }
    });
    let handed = in_reach.is_some();
    let dir = match in_reach {
        Some(dir) => dir,
        None => handoff::make_dir(&std::env::temp_dir()).map_err(|e| e.to_string())?,
    };
    let copy = dir.path().join(handoff::COPY);
    copy_db(db, &copy).map_err(|e| e.to_string())?;
    handoff::single_file(&copy).map_err(|e| e.to_string())?;
    let snapshot = Snapshot::capture(&copy).map_err(|e| e.to_string())?;
    let handoff = match handed {
        true => Some(Handoff::of(dir.path(), &copy, scrubbed).map_err(|e| e.to_string())?),
        false => None,
    };
    let guard = MemoryGuard {
        _dir: Some(dir),
        copy,
        snapshot,
    };
    Ok((guard, handoff))
}

/// Post: the guard main kept, once `handoff` is what main recorded (`Handoff::verify`).
pub fn from_handoff(handoff: &Handoff) -> Result<MemoryGuard, HandoffError> {
    let copy = handoff.verify()?;
    let snapshot = Snapshot::capture(&copy).map_err(|e| HandoffError::Snapshot {
        message: e.to_string(),
    })?;
    Ok(MemoryGuard {
        _dir: None,
        copy,
        snapshot,
    })
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

/// What a rebuild left in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuilt {
    /// The copy plus this run's own trees.
    OwnTrees,
    /// The rebuild failed and the copy went back whole: this run's exchange is not kept.
    RestoredWhole,
    /// Neither: the database is what the agent left.
    Neither,
}

/// What limiting memory to this run's conversation did.
#[derive(Debug)]
pub struct Limited {
    /// For the summary: the conversations put back, or why the rebuild failed.
    pub note: Option<String>,
    /// Where the database now comes from (`Provenance::RebuiltFromScrubbed` only when the copy
    /// was scrubbed memory and `own` trees were scrubbed before being written into it).
    pub provenance: Provenance,
    pub rebuilt: Rebuilt,
}

/// The database becomes the copy plus `own` trees (and the trees cleanup `pruned` that the copy
/// too says are past the window, [`pruned_in_copy`]). When the copy was memory fro-bot had
/// scrubbed (`scrubbed_base`), `own` trees are scrubbed before they are written into it, so
/// nothing in the rebuilt file ever held a secret and the save scrubs only those trees. Main's
/// `put_back` and post's finish both call this.
pub fn limit(
    guard: &MemoryGuard,
    db: &Path,
    own: &[String],
    (pruned, retention): (&[String], usize),
    scrubbed_base: bool,
) -> Limited {
    let own: BTreeSet<String> = own.iter().cloned().collect();
    let prescrubbed = scrubbed_base && prescrub(db, &own);
    let mut taken = own.clone();
    taken.extend(pruned_in_copy(&guard.copy, pruned, retention, &own));
    let (note, rebuilt) = rebuild(guard, db, &taken);
    let provenance = match (prescrubbed, rebuilt) {
        (true, Rebuilt::OwnTrees | Rebuilt::RestoredWhole) => Provenance::RebuiltFromScrubbed,
        (_, Rebuilt::Neither) | (false, _) => Provenance::Unknown,
    };
    Limited {
        note,
        provenance,
        rebuilt,
    }
}

/// After the turn: the database becomes the copy plus `own` session trees (`limit`). Says in the
/// summary how many other conversations the agent had changed. Also records the messages the
/// turn wrote and its thread's session (`Ledger::own_rows`), which only this run's database
/// holds. The copy is removed with the guard, and main's state no longer names it.
pub(crate) fn put_back(
    ledger: &mut Ledger,
    (paths, files): (&StatePaths, &FileCommands),
    before: Before,
    own: &[String],
    thread: Option<(String, String)>,
    pruning: (&[String], usize),
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
    let limited = limit(&guard, &db, own, pruning, scrubbed_base);
    if let Some(note) = limited.note {
        log::warning(&note);
        ledger.report.confinement.push(note);
    }
    ledger.provenance = limited.provenance;
    ledger.own_rows = own_rows(&db, Some(&guard.copy), thread);
    files.save_state_or_warn(state::MEMORY_GUARD, "");
    files.save_state_or_warn(state::MEMORY_HANDOFF, "");
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
/// summary, and what `db` is now.
fn rebuild(guard: &MemoryGuard, db: &Path, own: &BTreeSet<String>) -> (Option<String>, Rebuilt) {
    let out = crate::memory::checkpoint::sibling(db, ".fro-bot-guard");
    match merge::merge_only(&guard.copy, db, &guard.snapshot, &out, own) {
        Ok(report) => match replace(&out, db) {
            Ok(()) => (reverted_note(&report.refused), Rebuilt::OwnTrees),
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
/// What `db` is now.
fn fall_back(guard: &MemoryGuard, db: &Path, why: &str) -> (Option<String>, Rebuilt) {
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
        )), Rebuilt::RestoredWhole),
        Err(e) => (Some(format!(
            "memory could not be limited to this run's conversation ({why}), nor put back ({e})"
        )), Rebuilt::Neither),
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

    /// OpenCode 1.18.33's schema at `db` with one project, after `pragma` (e.g. WAL mode).
    fn memory_db(db: &Path, pragma: &str) -> Connection {
        let c = Connection::open(db).unwrap();
        c.execute_batch(include_str!(
            "../../../tests/it/fixtures/opencode-1.18.33-schema.sql"
        ))
        .unwrap();
        c.execute_batch(&format!(
            "{pragma} INSERT INTO project (id, worktree, time_created, time_updated, sandboxes) \
             VALUES ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', '/ws', 1, 1, '[]');"
        ))
        .unwrap();
        c
    }

    /// The guard's copy of `db`, as `take` keeps it.
    fn kept_copy(db: &Path) -> MemoryGuard {
        let kept = tempfile::tempdir().unwrap();
        let copy = kept.path().join("opencode.db");
        copy_db(db, &copy).unwrap();
        MemoryGuard {
            snapshot: Snapshot::capture(&copy).unwrap(),
            _dir: Some(kept),
            copy,
        }
    }

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

    #[test]
    fn own_sessions_are_the_threads_and_the_one_it_replaced_and_post_reads_main_s_record() {
        assert_eq!(own_sessions(Some("ses_a"), None), ["ses_a"]);
        assert_eq!(
            own_sessions(Some("ses_b"), Some("ses_a")),
            ["ses_b", "ses_a"]
        );
        assert!(own_sessions(None, None).is_empty());
        let own = own_sessions(Some("ses_b"), Some("ses_a"));
        let json = serde_json::to_string(&own).unwrap();
        assert_eq!(recorded_own(Some(&json)), Some(own));
        assert_eq!(recorded_own(None), None, "no prompt was sent");
        assert_eq!(recorded_own(Some("")), None);
        assert_eq!(recorded_own(Some("{\"not\": \"a list\"}")), None);
    }

    /// Every row of the three tables, for comparing two databases.
    fn dump(db: &Path) -> Vec<String> {
        let c = Connection::open(db).unwrap();
        let mut out = Vec::new();
        for table in ["session", "message", "part"] {
            let mut stmt = c
                .prepare(&format!("SELECT * FROM {table} ORDER BY id"))
                .unwrap();
            let n = stmt.column_count();
            let rows = stmt
                .query_map([], |r| {
                    let v: Vec<rusqlite::types::Value> =
                        (0..n).map(|i| r.get(i)).collect::<Result<_, _>>()?;
                    Ok(format!("{table} {v:?}"))
                })
                .unwrap();
            out.extend(rows.map(Result::unwrap));
        }
        out
    }

    /// Main's put-back and post's finish are one rule: from the copy main handed over (under the
    /// runner's temp dir), post rebuilds the very rows main would have. A session the agent made,
    /// titled as this thread's, is not this run's; another thread's rewrite is put back.
    #[test]
    fn post_rebuilds_from_the_handed_over_copy_what_main_would_have() {
        let dir = tempfile::tempdir().unwrap();
        let runner_temp = tempfile::tempdir().unwrap();
        let db = dir.path().join("opencode.db");
        {
            let c = memory_db(&db, "PRAGMA journal_mode=WAL;");
            for id in ["ses_mine", "ses_other"] {
                session(&c, id, "{\"text\":\"as restored\"}");
            }
        }
        let (guard, handoff) = keep_copy(&db, Some(runner_temp.path()), false).unwrap();
        let handoff = handoff.expect("handed over");
        assert!(handoff.dir.starts_with(runner_temp.path()));
        // The turn: this run's session goes on; the agent forges a session and rewrites another.
        let c = Connection::open(&db).unwrap();
        c.execute(
            "UPDATE part SET data = '{\"text\":\"this run\"}' WHERE id = 'prt_ses_mine'",
            [],
        )
        .unwrap();
        session(&c, "ses_forged", "{\"text\":\"forged\"}");
        c.execute_batch(
            "UPDATE session SET title = 'fro-bot: issue-5' WHERE id = 'ses_forged'; \
             UPDATE part SET data = '{\"text\":\"EVIL\"}' WHERE id = 'prt_ses_other'; \
             UPDATE session SET time_updated = 2 WHERE id IN ('ses_mine', 'ses_other');",
        )
        .unwrap();
        drop(c);
        crate::memory::checkpoint::checkpoint(&db);
        let post_db = dir.path().join("post.db");
        std::fs::copy(&db, &post_db).unwrap();
        let own = own_sessions(Some("ses_mine"), None);
        let none: &[String] = &[];
        let handed = from_handoff(&handoff).unwrap();
        let by_post = limit(&handed, &post_db, &own, (none, 0), handoff.scrubbed);
        let by_main = limit(&guard, &db, &own, (none, 0), false);
        assert_eq!(by_post.rebuilt, Rebuilt::OwnTrees, "{:?}", by_post.note);
        assert_eq!(by_post.note, by_main.note);
        assert!(
            by_post
                .note
                .as_deref()
                .is_some_and(|n| n.contains("`ses_other`")),
            "{:?}",
            by_post.note
        );
        let rows = dump(&post_db);
        assert_eq!(rows, dump(&db), "the same rows as main's put-back");
        let text = rows.join("\n");
        assert!(text.contains("this run") && text.contains("as restored"));
        assert!(
            !text.contains("EVIL") && !text.contains("ses_forged"),
            "{text}"
        );
        drop(guard);
        assert!(!handoff.dir.exists(), "main's guard takes its copy with it");
    }

    /// Memory a fro-bot saved (scrubbed whole), then a turn as OpenCode writes it: this run's
    /// session streamed with the secret in every version (old copies in free pages), and another
    /// thread's session rewritten to hold it.
    fn restored_then_turn(dir: &Path) -> (MemoryGuard, PathBuf) {
        let db = dir.join("opencode.db");
        {
            let c = memory_db(&db, "PRAGMA journal_mode=WAL;");
            for i in 0..50 {
                session(&c, &format!("ses_old{i}"), &"earlier turn ".repeat(100));
            }
        }
        crate::memory::scrub::scrub(&db, &Scope::Whole).unwrap();
        let guard = kept_copy(&db);
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
        assert_eq!(rebuilt, Rebuilt::OwnTrees, "{note:?}");
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
            let c = memory_db(&db, "");
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
        let guard = kept_copy(&db);
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
        assert_eq!(rebuilt, Rebuilt::OwnTrees, "{note:?}");
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
