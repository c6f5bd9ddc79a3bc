//! What a run knows once it is admitted (`RunContext`), how it runs (`Mode`), and how the main
//! step ends (`ExitStatus`, `RunExit`).

use std::path::PathBuf;
use std::time::Instant;

use crate::cache;
use crate::config::Settings;
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

/// Everything an admitted run works with, built once by `admit`.
pub(crate) struct RunContext {
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
    /// What memory's phases record as the run goes.
    pub(crate) ledger: Ledger,
    /// The agent's network for the turn (`phases::turn::agent_network`), until its summary row is written.
    pub(crate) egress: Option<crate::egress::AgentReach>,
}

impl RunContext {
    /// The dedup sentinels, kept in the same cache as memory.
    pub(crate) fn sentinels(&self) -> Option<CacheSentinels<'_>> {
        self.cache.as_ref().map(|backend| CacheSentinels {
            backend,
            file: sentinel_file(&self.paths),
            workspace: self.workspace.clone(),
        })
    }

    pub(crate) fn set_state(&self, name: &str, value: &str) {
        self.files.save_state_or_warn(name, value);
    }

    pub(crate) fn set_output(&self, name: &str, value: &str) {
        self.files.set_output_or_warn(name, value);
    }

    /// `fut`, unless the run is cancelled and the runner's kill deadline passes first (`None`).
    pub(crate) async fn within_budget<T>(
        &self,
        fut: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        self.cancel.within_budget(fut).await
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
