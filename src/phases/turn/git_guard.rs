//! `.git` put back after the turn (`confine::git_guard`; docs/security.md#what-it-leaves-behind):
//! the snapshot before the turn (also on disk for the post step, its digest in main's state), the
//! restore after the agent's processes are gone, and post's restore when main was killed first.

use std::path::{Path, PathBuf};

use crate::confine::git_guard::{self, GitSnapshot};
use crate::phases::context::RunContext;
use crate::runner::env::state;
use crate::runner::{log, Env};

/// The snapshot of this run's checkout.
pub(crate) struct GitGuard {
    snapshot: GitSnapshot,
    /// The copy for post, removed once main has restored.
    persisted: Option<PathBuf>,
}

/// Where the copy for post goes: the job's temp dir (it outlives the main step's container).
fn persist_dir(env: &Env) -> PathBuf {
    env.runner_temp().unwrap_or_else(std::env::temp_dir)
}

/// Snapshots `.git` before the turn. `None` (with a warning) when the checkout cannot be read.
pub(crate) fn take(ctx: &RunContext) -> Option<GitGuard> {
    if !ctx.workspace.join(".git").exists() {
        return None;
    }
    let snapshot = match git_guard::snapshot(&ctx.workspace) {
        Ok(s) => s,
        Err(e) => {
            log::warning(&format!(
                "cannot snapshot .git, so what the agent writes there is not put back: {e}"
            ));
            return None;
        }
    };
    let persisted = match git_guard::persist(&snapshot, &persist_dir(&ctx.env)) {
        Ok((path, sha)) => {
            ctx.set_state(state::GIT_SNAPSHOT, &format!("{}\t{sha}", path.display()));
            Some(path)
        }
        Err(e) => {
            tracing::warn!("cannot keep the .git snapshot for the post step: {e}");
            None
        }
    };
    Some(GitGuard {
        snapshot,
        persisted,
    })
}

/// Puts `.git` back after the turn; what was reverted goes into the summary.
pub(crate) fn put_back(ctx: &mut RunContext, guard: Option<GitGuard>) {
    let Some(guard) = guard else { return };
    match git_guard::restore(&ctx.workspace, &guard.snapshot) {
        Ok(reverted) => {
            if let Some(text) = reverted.describe() {
                log::warning(&text);
                ctx.report.confinement.push(text);
            }
            if let Some(p) = &guard.persisted {
                let _ = std::fs::remove_file(p);
            }
            ctx.set_state(state::GIT_SNAPSHOT, "");
        }
        Err(e) => log::error(&format!(
            "could not put .git back after the agent's turn (later steps may run what it planted there): {e}"
        )),
    }
}

/// Post: restores `.git` from main's snapshot when main was killed before it could. The text for
/// post's summary, if there was anything to say.
pub(crate) fn post_restore(env: &Env, workspace: &Path) -> Option<String> {
    let recorded = env.state(state::GIT_SNAPSHOT).filter(|s| !s.is_empty())?;
    let (path, sha) = recorded.split_once('\t')?;
    let path = Path::new(path);
    let result = git_guard::load(path, sha).and_then(|s| git_guard::restore(workspace, &s));
    // Gone whatever happened: it may hold the checkout's `.git/config` with its credentials, and
    // post is the last step that could use it.
    let _ = std::fs::remove_file(path);
    let text = match result {
        Ok(reverted) => match reverted.describe() {
            Some(t) => format!("The main step stopped before putting .git back: {t}."),
            None => {
                "The main step stopped before putting .git back; nothing there had changed.".into()
            }
        },
        Err(e) => {
            log::error(&format!("post could not put .git back: {e}"));
            format!("Could not put .git back: {e}.")
        }
    };
    Some(text)
}
