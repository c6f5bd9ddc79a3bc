//! What the agent leaves behind, recorded before the turn and put back after it
//! (docs/security.md#what-it-leaves-behind): `.git` and the runner's home, with a private one for
//! the agent (`guards`), and the other conversations in memory (`memory::guard`).

use std::path::Path;

use crate::confine::handover::{self, TakenOver};
use crate::memory::guard::{self as memory_guard, Before};
use crate::memory::ledger::{Ledger, Provenance};
use crate::phases::run_context::Admitted;
use crate::phases::turn::agent::AgentRun;
use crate::phases::turn::guards::{self, GitGuard, HomeGuard};
use crate::runner::env::state;
use crate::runner::Env;

/// The three guards of one turn.
pub(crate) struct Leftovers {
    git: Option<GitGuard>,
    home: Option<HomeGuard>,
    memory: Before,
}

impl Leftovers {
    /// The agent's private `HOME`, when it has one.
    pub(crate) fn private_home(&self) -> Option<&Path> {
        self.home.as_ref().map(HomeGuard::home)
    }
}

/// Before the turn. The memory guard's copy goes where post can reach it (`RUNNER_TEMP`), with
/// where restored memory came from (`provenance`), so post can finish it as main would.
pub(crate) fn take(ctx: &Admitted, provenance: Provenance) -> Leftovers {
    let runner_temp = ctx.env.runner_temp();
    Leftovers {
        git: guards::take_git(ctx),
        home: guards::take_home(ctx),
        memory: memory_guard::take(&ctx.paths, &ctx.files, (runner_temp.as_deref(), provenance)),
    }
}

/// After the turn, once the agent's processes are gone: `.git` put back, the home given back, and
/// memory limited to this run's own conversation and what cleanup `pruned`.
pub(crate) fn put_back(
    ctx: &Admitted,
    ledger: &mut Ledger,
    held: Leftovers,
    (agent_run, pruned): (&AgentRun, &[String]),
) {
    guards::put_back_git(ctx, &mut ledger.report, held.git);
    guards::give_back_home(ctx, held.home.as_ref());
    let own = agent_run.own_sessions();
    let thread = agent_run
        .session_id
        .clone()
        .map(|id| (ctx.plan.logical_key.as_str().to_string(), id));
    let at = (&ctx.paths, &ctx.files);
    let pruning = (pruned, ctx.settings.session_retention as usize);
    memory_guard::put_back(ledger, at, held.memory, &own, thread, pruning);
}

/// Post: gives back what a killed main took from the runner's user for the turn besides its home
/// (the file-command directory, the checkout's credential files; `opencode::Agent::start`). The
/// record is main's state, which the agent cannot write. Before the home's, as main does it.
pub(crate) fn post_give_back_turn(env: &Env) -> Option<String> {
    let json = env.state(state::TURN_TAKEN).filter(|s| !s.is_empty())?;
    let taken: TakenOver = match serde_json::from_str(json) {
        Ok(t) => t,
        Err(e) => {
            return Some(format!(
                "Could not read what the main step took for the turn: {e}."
            ))
        }
    };
    Some(match handover::give_back(&taken) {
        Ok(()) => format!(
            "The main step stopped before giving back what it took for the turn; post gave back {} path(s) \
             (the file commands' directory, the checkout's credential files).",
            taken.taken.len()
        ),
        Err(e) => format!("Could not give back what the main step took for the turn: {e}."),
    })
}
