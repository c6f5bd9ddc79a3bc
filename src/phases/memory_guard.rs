//! Only the run's own conversation may change (docs/security.md#what-it-leaves-behind, the second
//! wall). The agent owns the data dir for its turn and could rewrite another thread's rows in
//! `opencode.db`. Before the turn fro-bot keeps a root-only copy of the database; after it, with
//! OpenCode stopped, the database is rebuilt as that copy plus this run's own session trees
//! (`merge::merge_only`), so every other conversation is exactly as restored. When that cannot be
//! done, the copy is put back whole: this run's exchange is then not kept, but no other thread's
//! memory is rewritten.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::merge::{self, Snapshot};
use crate::phases::context::RunContext;
use crate::runner::env::state;
use crate::runner::log;

/// The database as restored, kept out of the agent's reach for the turn.
pub(crate) struct MemoryGuard {
    _dir: tempfile::TempDir,
    copy: PathBuf,
    snapshot: Snapshot,
}

/// Copies the restored database before the turn (`None`: nothing restored, or it cannot be read;
/// with nothing restored there is no other conversation to protect).
pub(crate) fn take(ctx: &RunContext) -> Option<MemoryGuard> {
    let db = ctx.paths.db();
    if !db.is_file() {
        return None;
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
            ctx.set_state(state::MEMORY_GUARD, "pending");
            Some(g)
        }
        Err(e) => {
            log::warning(&format!(
                "cannot keep a copy of the restored memory, so other threads' conversations are not guarded this run: {e}"
            ));
            None
        }
    }
}

/// The database and its WAL, as SQLite would read them.
fn copy_db(db: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::copy(db, to)?;
    let wal = crate::checkpoint::sibling(db, "-wal");
    if wal.is_file() {
        std::fs::copy(&wal, crate::checkpoint::sibling(to, "-wal"))?;
    }
    Ok(())
}

/// After the turn: the database becomes the copy plus `own` session trees. Says in the summary
/// how many other conversations the agent had changed.
pub(crate) fn put_back(ctx: &mut RunContext, guard: Option<MemoryGuard>, own: &[&str]) {
    let Some(guard) = guard else { return };
    let db = ctx.paths.db();
    let own: BTreeSet<String> = own.iter().map(|s| s.to_string()).collect();
    let out = crate::checkpoint::sibling(&db, ".fro-bot-guard");
    let note = match merge::merge_only(&guard.copy, &db, &guard.snapshot, &out, &own) {
        Ok(report) => match replace(&out, &db) {
            Ok(()) => reverted_note(&report.refused),
            Err(e) => fall_back(
                &guard,
                &db,
                &format!("cannot put the rebuilt database in place: {e}"),
            ),
        },
        Err(e) => fall_back(&guard, &db, &e.to_string()),
    };
    if let Some(note) = note {
        log::warning(&note);
        ctx.report.confinement.push(note);
    }
    ctx.set_state(state::MEMORY_GUARD, "");
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
fn fall_back(guard: &MemoryGuard, db: &Path, why: &str) -> Option<String> {
    let back = copy_db(
        &guard.copy,
        &crate::checkpoint::sibling(db, ".fro-bot-guard"),
    )
    .and_then(|()| replace(&crate::checkpoint::sibling(db, ".fro-bot-guard"), db));
    Some(match back {
        Ok(()) => format!(
            "memory could not be limited to this run's conversation ({why}); the restored memory was put back, so this run's exchange is not kept"
        ),
        Err(e) => format!(
            "memory could not be limited to this run's conversation ({why}), nor put back ({e})"
        ),
    })
}

/// Renames `from` (and its WAL) over `db`, after removing `db`'s own sidecars.
fn replace(from: &Path, db: &Path) -> std::io::Result<()> {
    crate::checkpoint::remove_stale_sidecars(db)?;
    let wal = crate::checkpoint::sibling(from, "-wal");
    if wal.is_file() {
        std::fs::rename(&wal, crate::checkpoint::sibling(db, "-wal"))?;
    }
    let _ = std::fs::remove_file(crate::checkpoint::sibling(from, "-shm"));
    std::fs::rename(from, db)
}
