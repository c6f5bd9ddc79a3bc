//! Cleanup before the save: prune old sessions, stop what this run's session is still doing, shut
//! OpenCode down and confirm it stopped. What it finds is the safety gate's input
//! (`docs/design.md`, the save order and the safety gate).

use std::time::{Duration, Instant};

use crate::confine::sibling::Sibling;
use crate::opencode::{self, Agent};
use crate::phases::turn::agent::AgentRun;
use crate::phases::turn::agent_sibling;
use crate::runner::{failpoint, log, Cancellation, FileCommands};

/// Bounded wait for OpenCode to exit and its port to close.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(5);
/// Even under a signal, OpenCode gets this long to exit before it is killed.
const SHUTDOWN_FLOOR: Duration = Duration::from_millis(1500);
/// How long the agent's leftover processes get to die after SIGKILL.
const STRAY_BUDGET: Duration = Duration::from_secs(2);
/// How long the work this run started gets to stop after an abort, before the gate looks.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// What cleanup saw, for the safety gate; and what it pruned, for the memory guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// This run's session was still busy after an abort and a grace period.
    pub(crate) agent_still_running: bool,
    /// OpenCode confirmed it exited (or there was no OpenCode to stop).
    pub(crate) quiescent: bool,
    /// Processes of the agent's user survived the kill: something may still write the database.
    pub(crate) strays_remained: bool,
    /// The sessions pruning deleted (`memory::guard::put_back` keeps their deletion).
    pub(crate) pruned: Vec<String>,
}

/// Stops the agent, whatever state it is in. Under a signal pruning is skipped: it is a nicety.
pub(crate) async fn stop_agent(
    agent: Option<Agent>,
    agent_run: &AgentRun,
    retention: usize,
    cancel: &Cancellation,
    sibling: Option<(&Sibling, &FileCommands)>,
) -> Stopped {
    let mut stopped = Stopped {
        agent_still_running: false,
        quiescent: true,
        strays_remained: false,
        pruned: Vec::new(),
    };
    let had_agent = agent.is_some();
    if let Some(mut a) = agent {
        if !cancel.is_cancelled() {
            match a.prune(retention, &agent_run.protect()).await {
                // A bound that stopped it short is said (docs/persistence.md#every-thread-resumes).
                Ok(report) => {
                    report.notes().iter().for_each(|n| log::warning(n));
                    stopped.pruned = report.deleted;
                }
                Err(e) => tracing::warn!("pruning old sessions failed: {e}"),
            }
        }
        stopped.agent_still_running = stop_agent_work(&a, agent_run.session_id.as_deref()).await;
        let budget = cancel
            .remaining()
            .map(|r| (r / 3).clamp(SHUTDOWN_FLOOR, SHUTDOWN_BUDGET))
            .unwrap_or(SHUTDOWN_BUDGET);
        match a.shutdown(budget).await {
            opencode::Quiescence::Confirmed => {}
            opencode::Quiescence::Unconfirmed { reason } => {
                log::warning(&format!("OpenCode did not confirm it stopped: {reason}"));
                stopped.quiescent = false;
            }
        }
        // The sibling's processes end before the agent's directories are taken back.
        if let Some((sibling, files)) = sibling {
            agent_sibling::remove(sibling, files).await;
        }
        match a.release(STRAY_BUDGET).await {
            opencode::Released::Clean { strays_killed } if strays_killed.is_empty() => {}
            opencode::Released::Clean { strays_killed } => log::warning(&format!(
                "killed {} process(es) the agent left running: {}",
                strays_killed.len(),
                strays_killed.join(", ")
            )),
            opencode::Released::StraysRemain { pids } => {
                log::warning(&format!(
                    "processes the agent left running survived SIGKILL ({pids:?}); memory is not \
                     saved"
                ));
                stopped.strays_remained = true;
            }
            opencode::Released::NotTakenBack { message } => log::warning(&message),
        }
    }
    if let (false, Some((sibling, files))) = (had_agent, sibling) {
        agent_sibling::remove(sibling, files).await;
    }
    failpoint::hit("run:after-shutdown");
    stopped
}

/// Stops whatever this run's session is still doing (a turn that ended on an API error can leave it
/// busy), then reports whether it is *still* busy: the safety gate's first question.
async fn stop_agent_work(agent: &Agent, session: Option<&str>) -> bool {
    if !is_busy(agent, session).await {
        return false;
    }
    if let Some(id) = session {
        if let Err(e) = agent.client().abort(id).await {
            tracing::warn!("cannot abort the agent's session: {e}");
        }
    }
    let until = Instant::now() + ABORT_GRACE;
    loop {
        if !is_busy(agent, session).await {
            return false;
        }
        if Instant::now() >= until {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Busy or not, asked with a short deadline (an unanswered question counts as not busy: the
/// shutdown that follows is what confirms nothing writes any more).
async fn is_busy(agent: &Agent, session: Option<&str>) -> bool {
    match tokio::time::timeout(Duration::from_secs(2), agent.is_busy(session)).await {
        Ok(Ok(busy)) => busy,
        Ok(Err(e)) => {
            tracing::debug!("session status unknown: {e}");
            false
        }
        Err(_) => {
            tracing::debug!("session status did not answer in 2 s");
            false
        }
    }
}
