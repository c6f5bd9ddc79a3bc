//! The agent's home is its own (`confine::home_guard`; docs/security.md#what-it-leaves-behind): a
//! private per-run `HOME`, and for the turn the runner's home (but for fro-bot's memory dirs) and
//! the event payload's directory taken from the agent's uid and given back afterwards — also by
//! post when main was killed first.

use std::path::{Path, PathBuf};

use crate::confine::home_guard::{self, TakenOver};
use crate::confine::AgentUser;
use crate::phases::context::{Mode, RunContext};
use crate::runner::env::{self, state};
use crate::runner::{log, Env};

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
fn roots(env: &Env) -> Vec<PathBuf> {
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
pub(crate) fn take(ctx: &RunContext) -> Option<HomeGuard> {
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
    let roots = roots(&ctx.env);
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
            Ok(json) => ctx.set_state(state::HOME_TAKEN, &json),
            Err(e) => tracing::warn!("post could not give the home back: {e}"),
        }
    }
    Some(HomeGuard {
        private_home,
        taken,
    })
}

/// After the turn: the runner's home and the payload's directory given back.
pub(crate) fn give_back(ctx: &mut RunContext, guard: Option<&HomeGuard>) {
    let Some(guard) = guard else { return };
    match home_guard::give_back(&guard.taken) {
        Ok(()) => ctx.set_state(state::HOME_TAKEN, ""),
        Err(e) => log::error(&format!("could not give the runner's home back: {e}")),
    }
}

/// Post: gives back what a killed main had taken. The state is main's (the agent cannot write it);
/// only paths under the runner's home and the payload's directory are touched.
pub(crate) fn post_give_back(env: &Env) -> Option<String> {
    let json = env.state(state::HOME_TAKEN).filter(|s| !s.is_empty())?;
    let mut taken: TakenOver = serde_json::from_str(json).ok()?;
    let roots = roots(env);
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
