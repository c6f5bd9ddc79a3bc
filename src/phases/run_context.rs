//! The run's context, in two parts: what admission fixed (`Admitted`, read-only and shared) and
//! what the phases append to (`RunLedger`: memory's `Ledger` and the turn's network record); how
//! the run runs (`Mode`), and how the main step ends (`ExitStatus`, `RunExit`).

use std::path::PathBuf;
use std::time::Instant;

use crate::cache;
use crate::config::Settings;
use crate::egress::AgentReach;
use crate::github::{self, CacheKeys, Event, RunPlan};
use crate::lease::Holder;
use crate::memory::ledger::{Ledger, StoreContext};
use crate::memory::state_paths::StatePaths;
use crate::phases::sentinels::CacheSentinels;
use crate::runner::{Cancellation, Env, FileCommands};

#[derive(Debug, Clone)]
pub enum Mode {
    /// The container action's main step.
    Action,
    /// `fro-bot local`: a developer machine; `env` already carries the synthesized run.
    Local { thread: String, state_dir: PathBuf },
}

/// How the main step ends. A skipped run is a success for the workflow (exit 0), but it is its own
/// outcome so callers and tests can tell the two apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// The agent's turn completed.
    Success,
    /// Routing, dedup or a held lease said this run has nothing to do.
    Skipped,
    /// Invalid configuration, or the agent did not complete its turn (memory is still saved).
    Failed,
}

impl ExitStatus {
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Success | ExitStatus::Skipped => 0,
            ExitStatus::Failed => 1,
        }
    }
}

/// How the run ended, for later steps to branch on without parsing text (the `outcome` output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    /// The turn completed with a written answer, and delivered nothing.
    Answered,
    /// The turn completed and fro-bot carried out what it proposed (a commit, a review, an action).
    Delivered,
    /// The turn completed with no written answer and nothing delivered.
    Empty,
    /// The spend cap (`max-cost`, `max-tokens`) ended the turn.
    Capped,
    TimedOut,
    Cancelled,
    /// Invalid configuration, or a turn that failed (or never started).
    Failed,
    /// Routing, dedup or another run's thread turn said this run has nothing to do.
    Skipped,
    /// The budget across runs (`max-daily-cost`, `max-runs-per-user-per-hour`) is spent: the
    /// thread was told, and the agent did not start (`phases::budget`).
    OverBudget,
}

impl RunOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Answered => "answered",
            RunOutcome::Delivered => "delivered",
            RunOutcome::Empty => "empty",
            RunOutcome::Capped => "capped",
            RunOutcome::TimedOut => "timed-out",
            RunOutcome::Cancelled => "cancelled",
            RunOutcome::Failed => "failed",
            RunOutcome::Skipped => "skipped",
            RunOutcome::OverBudget => "over-budget",
        }
    }

    /// Into the `outcome` output.
    pub(crate) fn report(self, files: &FileCommands) {
        files.set_output_or_warn(crate::runner::env::output::OUTCOME, self.as_str());
    }
}

/// What `run` hands back to `main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunExit {
    pub status: ExitStatus,
    /// The agent's final answer, when there is one (printed by `fro-bot local`).
    pub answer: Option<String>,
}

impl RunExit {
    pub(crate) fn status(status: ExitStatus) -> Self {
        Self {
            status,
            answer: None,
        }
    }
}

/// What admission fixed (`phases::admit`): read-only for the rest of the run and shared by every
/// phase, which borrows it whole.
pub(crate) struct Admitted {
    pub(crate) env: Env,
    pub(crate) mode: Mode,
    pub(crate) settings: Settings,
    pub(crate) files: FileCommands,
    pub(crate) cancel: Cancellation,
    pub(crate) started: Instant,
    pub(crate) workspace: PathBuf,
    pub(crate) paths: StatePaths,
    pub(crate) repository: String,
    pub(crate) run_id: String,
    pub(crate) event: Event,
    pub(crate) plan: RunPlan,
    pub(crate) keys: CacheKeys,
    pub(crate) gh: Option<github::GitHub>,
    /// The Actions cache (or the local filesystem cache); `None` outside a runner.
    pub(crate) cache: Option<cache::Backend>,
    pub(crate) store: Option<StoreContext>,
    /// Who asks for the repository lease at publish.
    pub(crate) lease_holder: Holder,
    /// What the run's model requests spend, against `max-cost` and `max-tokens`
    /// (`confine::spend`): counted by the key proxies of the turn and of the threat check.
    pub(crate) spend: std::sync::Arc<crate::confine::spend::Meter>,
}

impl Admitted {
    /// The dedup sentinels, kept in the same cache as memory.
    pub(crate) fn sentinels(&self) -> Option<CacheSentinels<'_>> {
        self.cache.as_ref().map(|backend| CacheSentinels {
            backend,
            file: sentinel_file(&self.paths),
            workspace: self.workspace.clone(),
        })
    }
}

/// The run's mutable part, owned by the main step (`phases::run`), which lends a phase the piece
/// it appends to: memory's ledger (with the summary's report), and the agent's network for the
/// turn (`phases::turn::agent_network`) until its summary row is written.
pub(crate) struct RunLedger {
    pub(crate) ledger: Ledger,
    pub(crate) egress: Option<AgentReach>,
}

impl RunLedger {
    pub(crate) fn new(ledger: Ledger) -> Self {
        RunLedger {
            ledger,
            egress: None,
        }
    }
}

/// The sentinel lives at one fixed path beside OpenCode's data dir (see `phases::sentinels`).
pub(crate) fn sentinel_file(paths: &StatePaths) -> PathBuf {
    paths
        .data_dir
        .parent()
        .unwrap_or(&paths.data_dir)
        .join("fro-bot-dedup/sentinel.json")
}
