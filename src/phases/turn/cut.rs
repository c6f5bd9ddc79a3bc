//! A turn cut short. One fro-bot itself stopped (its timeout, a signal) is repaired in the
//! database once OpenCode has stopped, before the memory guard limits memory to this run's
//! conversation and before the save (docs/persistence.md#a-turn-cut-short): the answer is
//! completed with an error naming why, each call it cut is an error whose outcome is unknown.
//! Only this run's own session trees. The next run on the thread is told of it
//! (`phases::turn::cut_notice`).

use crate::memory::repair::{self, Interruption, RunRef};
use crate::memory::report::PersistenceReport;
use crate::opencode::TurnOutcome;
use crate::phases::run_context::Admitted;
use crate::phases::turn::agent::AgentRun;
use crate::phases::turn::cleanup::Stopped;

/// Under a signal, the repair runs only while this much of the budget is left: the save comes
/// first, and what is saved unrepaired the next run's restore repairs (as an earlier run's).
const SAVE_RESERVE: std::time::Duration = std::time::Duration::from_millis(1500);

/// Repairs what the turn left, when OpenCode is known to have stopped writing, recording this run
/// beside each repaired answer (the next run's notice names it); the outcome goes to the summary
/// and to the turn's record (`AgentRun::cut`, what the tracking comment says was kept).
pub(crate) async fn repair(
    ctx: &Admitted,
    report: &mut PersistenceReport,
    agent_run: &mut AgentRun,
    stopped: &Stopped,
) {
    if !agent_run.prompted {
        return;
    }
    if !stopped.quiescent || stopped.strays_remained {
        // Something may still write the database: the safety gate keeps it from being saved, and
        // the next run's restore repairs whatever was kept.
        tracing::debug!("the turn is not repaired: OpenCode was not confirmed stopped");
        return;
    }
    let sessions = agent_run.own_sessions();
    if sessions.is_empty() {
        return;
    }
    if ctx
        .cancel
        .remaining()
        .is_some_and(|left| left < SAVE_RESERVE)
    {
        tracing::info!(
            "the turn cut short is left for the next run to repair: the save comes first"
        );
        return;
    }
    let reason = reason(agent_run.outcome.as_ref());
    let attempt = ctx.env.get(crate::runner::env::GITHUB_RUN_ATTEMPT);
    let run = RunRef::new(&ctx.run_id, attempt);
    let outcome = repair::after_turn(ctx.paths.db(), sessions, reason, run).await;
    agent_run.cut = Some(outcome.clone());
    report.cut_turns.push(outcome);
}

/// Why the turn stopped, as the outcome tells: fro-bot's timeout or a signal; anything else that
/// left a turn open means OpenCode went away under it.
fn reason(outcome: Option<&TurnOutcome>) -> Interruption {
    match outcome {
        Some(TurnOutcome::TimedOut) => Interruption::TimedOut,
        Some(TurnOutcome::Cancelled) => Interruption::Cancelled,
        Some(TurnOutcome::Capped { .. }) => Interruption::Capped,
        Some(TurnOutcome::Completed | TurnOutcome::Failed(_)) | None => Interruption::Stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_what_fro_bot_knows_of_the_stop() {
        assert_eq!(reason(Some(&TurnOutcome::TimedOut)), Interruption::TimedOut);
        assert_eq!(
            reason(Some(&TurnOutcome::Cancelled)),
            Interruption::Cancelled
        );
        let gone = TurnOutcome::Failed(crate::opencode::TurnFailure::Api {
            message: "connection refused".into(),
        });
        assert_eq!(reason(Some(&gone)), Interruption::Stopped);
    }
}
