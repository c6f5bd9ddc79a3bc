//! OpenCode integration: locating and configuring it, the `opencode serve` child, its v1 HTTP API,
//! session resolution, session prep, the agent turn, writeback, pruning, and the `session-tools`
//! MCP server.
//!
//! [`Agent`] strings the steps together for the phases; each step is also callable on its own
//! (cleanup runs prune → shutdown → ... in a fixed order, each isolated).

pub mod client;
pub mod config;
pub mod error;
pub mod events;
pub mod locate;
pub mod preflight;
pub mod prep;
pub mod progress;
pub mod prune;
pub mod server;
pub mod session;
pub mod session_tools;
pub mod turn;
pub mod writeback;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

pub use client::{ApiError, Client, Session};
pub use server::{Quiescence, Server, ServerError};
pub use session::{Resolution, ResolvedSession};
pub use turn::{TurnFailure, TurnOptions, TurnOutcome, TurnReport};

use crate::config::ModelRef;
use crate::runner::env;
use crate::runner::{Cancellation, Env};

/// Milliseconds since the Unix epoch, from the system clock.
pub fn system_now_ms() -> i64 {
    i64::try_from(crate::runner::now_ms()).unwrap_or(i64::MAX)
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot prepare OpenCode's config dir {}", path.display())]
    Seed {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the OpenCode server did not start")]
    Server {
        #[source]
        source: ServerError,
    },
    #[error("cannot talk to the OpenCode server")]
    Client {
        #[source]
        source: ApiError,
    },
}

/// The directories that isolate OpenCode (what `HOME` and `XDG_*` are set to for the child).
#[derive(Debug, Clone)]
pub struct Isolation {
    pub home: PathBuf,
    pub data_home: PathBuf,
    pub config_home: PathBuf,
    pub cache_home: PathBuf,
    pub state_home: PathBuf,
}

impl Isolation {
    /// Everything under one directory (tests, local runs).
    pub fn under(root: &std::path::Path) -> Self {
        Self {
            home: root.to_path_buf(),
            data_home: root.join(".local/share"),
            config_home: root.join(".config"),
            cache_home: root.join(".cache"),
            state_home: root.join(".local/state"),
        }
    }

    /// OpenCode's data dir (where `opencode.db` lives).
    pub fn data_dir(&self) -> PathBuf {
        self.data_home.join("opencode")
    }

    fn vars(&self) -> Vec<(String, String)> {
        [
            (env::HOME, &self.home),
            (env::XDG_DATA_HOME, &self.data_home),
            (env::XDG_CONFIG_HOME, &self.config_home),
            (env::XDG_CACHE_HOME, &self.cache_home),
            (env::XDG_STATE_HOME, &self.state_home),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string_lossy().into_owned()))
        .collect()
    }
}

#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The located `opencode` binary.
    pub opencode: PathBuf,
    /// Its version (the plugin dir is seeded for it).
    pub opencode_version: String,
    pub workspace: PathBuf,
    pub dirs: Isolation,
    /// The environment the child inherits (filtered: no inputs, state, runtime or GitHub tokens).
    pub base_env: Env,
    /// Added on top, e.g. `GH_TOKEN` when the agent is meant to act on the repository.
    pub extra_env: Vec<(String, String)>,
    /// `fro-bot` itself, started by OpenCode as the session-tools MCP server; `None` = no tools.
    pub fro_bot_exe: Option<PathBuf>,
    pub model: Option<ModelRef>,
    pub user_config: Option<Map<String, Value>>,
    /// `auth-json` (provider id → auth entry), passed as `OPENCODE_AUTH_CONTENT`.
    pub auth: Map<String, Value>,
    pub log_file: PathBuf,
    pub startup_deadline: Duration,
    pub now_ms: fn() -> i64,
}

/// A running OpenCode server and a client for this workspace.
#[derive(Debug)]
pub struct Agent {
    server: Server,
    client: Client,
    now_ms: fn() -> i64,
}

impl Agent {
    pub async fn start(opts: AgentOptions) -> Result<Agent, AgentError> {
        let config_dir = opts.dirs.config_home.join("opencode");
        config::seed_plugin_dir(&config_dir, &opts.opencode_version).map_err(|source| {
            AgentError::Seed {
                path: config_dir.clone(),
                source,
            }
        })?;
        let mut extra = opts.dirs.vars();
        extra.extend(opts.extra_env.iter().cloned());
        let workspace = opts.workspace.clone();
        let exe = opts.fro_bot_exe.clone();
        let model = opts.model.clone();
        let user = opts.user_config.clone();
        let make_config: server::ConfigFn = Arc::new(move |url: &str, password: &str| {
            let tools = exe.as_ref().map(|exe| config::SessionToolsEntry {
                fro_bot_exe: exe.clone(),
                url: url.to_string(),
                password: password.to_string(),
                workspace: workspace.clone(),
            });
            config::config_content(&config::ConfigInput {
                session_tools: tools.as_ref(),
                model: model.as_ref(),
                user: user.as_ref(),
            })
        });
        let server_opts = server::ServerOptions {
            bin: opts.opencode.clone(),
            cwd: opts.workspace.clone(),
            env: server::child_env(&opts.base_env, &extra),
            config: make_config,
            auth_content: config::auth_content(&opts.auth),
            log_file: opts.log_file.clone(),
            startup_deadline: opts.startup_deadline,
        };
        let server = Server::start(&server_opts)
            .await
            .map_err(|source| AgentError::Server { source })?;
        let client = Client::new(
            server.url(),
            Some(server.password()),
            &opts.workspace.to_string_lossy(),
        )
        .map_err(|source| AgentError::Client { source })?;
        Ok(Agent {
            server,
            client,
            now_ms: opts.now_ms,
        })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Resolution by title alone (legacy memory; tests).
    pub async fn resolve_session(&self, logical_key: &str) -> Result<ResolvedSession, ApiError> {
        session::resolve(&self.client, logical_key, session::Ownership::ByTitle).await
    }

    /// Resolution as fro-bot's session map allows (`phases::session_map`).
    pub async fn resolve_owned_session(
        &self,
        logical_key: &str,
        ownership: session::Ownership<'_>,
    ) -> Result<ResolvedSession, ApiError> {
        session::resolve(&self.client, logical_key, ownership).await
    }

    /// Excerpts from other sessions (`exclude`: the current one and any it replaced).
    pub async fn prior_work(
        &self,
        terms: &[String],
        exclude: &[&str],
    ) -> Result<Vec<prep::Excerpt>, ApiError> {
        prep::prior_work(&self.client, terms, exclude).await
    }

    pub async fn run_turn(
        &self,
        session: Session,
        prompt: &str,
        opts: &TurnOptions,
        cancel: &Cancellation,
    ) -> TurnReport {
        turn::run_turn(&self.client, session, prompt, opts, cancel).await
    }

    pub async fn writeback(&self, summary: &writeback::RunSummary) -> Result<(), ApiError> {
        writeback::write_summary(&self.client, summary).await
    }

    pub async fn prune(
        &self,
        retention: usize,
        protect: &[&str],
    ) -> Result<prune::PruneReport, ApiError> {
        prune::prune(&self.client, (self.now_ms)(), retention, protect).await
    }

    /// Whether the session (or any session) is still working; ask after requesting shutdown of the
    /// turn, before stopping the server.
    pub async fn is_busy(&self, session_id: Option<&str>) -> Result<bool, ApiError> {
        turn::is_busy(&self.client, session_id).await
    }

    /// Stops the server (SIGTERM; bounded wait for exit and a refused port).
    pub async fn shutdown(&mut self, budget: Duration) -> Quiescence {
        self.server.shutdown(budget).await
    }
}
