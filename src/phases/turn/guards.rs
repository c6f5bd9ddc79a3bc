//! What fro-bot guards over the agent's turn besides memory (docs/security.md#what-it-leaves-behind),
//! the phase's side of `confine::git_guard` and `confine::home_guard`: `.git` snapshotted before
//! the turn (also on disk for the post step, its digest in main's state) and put back once the
//! agent's processes are gone; a private per-run `HOME`, and for the turn the runner's home (but
//! for fro-bot's memory dirs) and the event payload's directory taken from the agent's uid and
//! given back afterwards. Post does both when main was killed first.

use std::path::{Path, PathBuf};

use crate::confine::git_guard::{self, GitSnapshot};
use crate::confine::home_guard::{self, TakenOver};
use crate::confine::AgentUser;
use crate::memory::report::PersistenceReport;
use crate::phases::run_context::{Admitted, Mode};
use crate::runner::env::{self, state};
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
pub(crate) fn take_git(ctx: &Admitted) -> Option<GitGuard> {
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
            ctx.files
                .save_state_or_warn(state::GIT_SNAPSHOT, &format!("{}\t{sha}", path.display()));
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
pub(crate) fn put_back_git(
    ctx: &Admitted,
    report: &mut PersistenceReport,
    guard: Option<GitGuard>,
) {
    let Some(guard) = guard else { return };
    match git_guard::restore(&ctx.workspace, &guard.snapshot) {
        Ok(reverted) => {
            if let Some(text) = reverted.describe() {
                log::warning(&text);
                report.confinement.push(text);
            }
            if let Some(p) = &guard.persisted {
                let _ = std::fs::remove_file(p);
            }
            ctx.files.save_state_or_warn(state::GIT_SNAPSHOT, "");
        }
        Err(e) => log::error(&format!(
            "could not put .git back after the agent's turn (later steps may run what it planted there): {e}"
        )),
    }
}

/// Post: restores `.git` from main's snapshot when main was killed before it could. The text for
/// post's summary, if there was anything to say.
pub(crate) fn post_put_back_git(env: &Env, workspace: &Path) -> Option<String> {
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

/// The agent's private home and what was taken from it for the turn.
pub(crate) struct HomeGuard {
    pub(crate) private_home: tempfile::TempDir,
    taken: TakenOver,
}

impl HomeGuard {
    pub(crate) fn home(&self) -> &Path {
        self.private_home.path()
    }
}

/// The runner's home and the event payload's directory.
fn home_roots(env: &Env) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = env.get(env::HOME).map(PathBuf::from).into_iter().collect();
    if let Some(dir) = env
        .get(env::GITHUB_EVENT_PATH)
        .and_then(|p| Path::new(p).parent())
    {
        roots.push(dir.to_path_buf());
    }
    roots
}

/// Before the turn, in the action and only when fro-bot switches the agent to another uid (a
/// local run's agent is the user).
pub(crate) fn take_home(ctx: &Admitted) -> Option<HomeGuard> {
    let Mode::Action = ctx.mode else { return None };
    let AgentUser::Switched { uid, gid, .. } = AgentUser::choose(&ctx.workspace) else {
        return None;
    };
    let private_home = match home_guard::private_home(uid, gid) {
        Ok(h) => h,
        Err(e) => {
            log::warning(&format!(
                "the agent keeps the runner's HOME: cannot make it a private one: {e}"
            ));
            return None;
        }
    };
    // fro-bot's memory dir is handed to the agent on its own; everything else is taken.
    let keep = vec![ctx.paths.data_dir.clone()];
    let roots = home_roots(&ctx.env);
    let taken = match home_guard::take(&roots, &keep, uid) {
        Ok(t) => t,
        Err(e) => {
            log::warning(&format!(
                "the runner's home stays writable by the agent: {e}"
            ));
            TakenOver::default()
        }
    };
    if !taken.taken.is_empty() {
        match serde_json::to_string(&taken) {
            Ok(json) => ctx.files.save_state_or_warn(state::HOME_TAKEN, &json),
            Err(e) => tracing::warn!("post could not give the home back: {e}"),
        }
    }
    Some(HomeGuard {
        private_home,
        taken,
    })
}

/// After the turn: the runner's home and the payload's directory given back.
pub(crate) fn give_back_home(ctx: &Admitted, guard: Option<&HomeGuard>) {
    let Some(guard) = guard else { return };
    match home_guard::give_back(&guard.taken) {
        Ok(()) => ctx.files.save_state_or_warn(state::HOME_TAKEN, ""),
        Err(e) => log::error(&format!("could not give the runner's home back: {e}")),
    }
}

/// Post: gives back what a killed main had taken. The state is main's (the agent cannot write it);
/// only paths under the runner's home and the payload's directory are touched.
pub(crate) fn post_give_back_home(env: &Env) -> Option<String> {
    let json = env.state(state::HOME_TAKEN).filter(|s| !s.is_empty())?;
    let mut taken: TakenOver = serde_json::from_str(json).ok()?;
    let roots = home_roots(env);
    taken
        .taken
        .retain(|t| roots.iter().any(|r| t.path.starts_with(r)));
    Some(match home_guard::give_back(&taken) {
        Ok(()) => {
            "The main step stopped before giving the runner's home back; post gave it back.".into()
        }
        Err(e) => format!("Could not give the runner's home back: {e}."),
    })
}
