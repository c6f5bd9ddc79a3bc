//! OpenCode, the agent fro-bot runs: finding it (`locate`); the process it runs as, confined
//! (`confinement`), launched with its environment and config (`launch`, `config`), started and
//! stopped (`server`); its v1 HTTP API (`client`, `error`) and event stream (`events`); and what a
//! run does through it: whether a model is usable (`preflight`), which session continues
//! (`session`), the prompt and prior work (`prep`), the turn (`turn`, its live lines in
//! `progress`), the run recorded in the session (`writeback`), old sessions pruned (`prune`).
//! [`Agent`] holds the running server and its confinement from [`Agent::start`] to
//! [`Agent::release`]; the phases call its steps in their order. The session tools OpenCode
//! starts for the agent are `crate::tools`.

pub mod client;
pub mod config;
mod confinement;
pub mod error;
pub mod events;
mod launch;
pub mod locate;
pub mod mentions;
pub mod preflight;
pub mod prep;
pub mod progress;
pub mod prune;
pub mod server;
pub mod session;
pub mod turn;
pub mod writeback;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

pub use client::{ApiError, Client, Session};
pub use confinement::Released;
pub use server::{Quiescence, Server, ServerError};
pub use session::{Resolution, ResolvedSession};
pub use turn::{TurnFailure, TurnOptions, TurnOutcome, TurnReport};

use crate::config::ModelRef;
use crate::confine::key_proxy::{KeyProxy, KeyProxyPlan, Metering};
use crate::confine::AgentUser;
use crate::runner::env;
use crate::runner::{Cancellation, Env, FileCommands};
use confinement::Confinement;

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
    #[error("cannot confine the agent")]
    Confine {
        #[source]
        source: crate::confine::handover::HandoverError,
    },
    #[error("cannot hide the checkout's credentials from the agent")]
    GitCredentials {
        #[source]
        source: crate::confine::gitcreds::GitCredsError,
    },
    #[error("cannot start the key proxy")]
    KeyProxy {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make the agent's private copy of {}", path.display())]
    Binary {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the session tools' trust view")]
    TrustFile {
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

    /// OpenCode's session database (read while it runs only by the prior-work search).
    pub fn database(&self) -> PathBuf {
        self.data_dir().join("opencode.db")
    }

    /// The directories OpenCode writes: handed to the agent's uid for the turn.
    pub fn opencode_dirs(&self) -> Vec<PathBuf> {
        vec![
            self.data_dir(),
            self.config_home.join("opencode"),
            self.cache_home.join("opencode"),
            self.state_home.join("opencode"),
        ]
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
    /// The job's environment; the child gets only its allowlisted part (`crate::confine::env`).
    pub base_env: Env,
    /// Names from `base_env` the user passes to the agent (`agent-env`).
    pub opt_in_env: Vec<String>,
    /// Who the agent runs as.
    pub user: AgentUser,
    /// Main's state file: what the turn takes from the runner's user is recorded there, so post
    /// can give it back when main is killed (`state::TURN_TAKEN`). `None` in tests and tools.
    pub state: Option<FileCommands>,
    /// The job's file-command files, kept from the agent for the turn.
    pub file_commands: Vec<PathBuf>,
    /// Hide the checkout's credentials for the turn (runs where the agent must not hold the
    /// token).
    pub hide_git_credentials: bool,
    /// The runner's own home when the agent's `HOME` is a private one: its credential stores are
    /// hidden too.
    pub runner_home: Option<PathBuf>,
    /// Added on top, e.g. `GH_TOKEN` when the agent is meant to act on the repository.
    pub extra_env: Vec<(String, String)>,
    /// `fro-bot` itself, started by OpenCode as the session-tools MCP server; `None` = no tools.
    pub fro_bot_exe: Option<PathBuf>,
    /// How the session tools judge earlier sessions (docs/security.md#trust-follows-memory);
    /// `None`: every session is quoted as untrusted.
    pub session_trust: Option<crate::trust::TrustView>,
    /// Where the proposal tools write and what they check against (`crate::safe_outputs`);
    /// `None`: the agent gets no proposal tools.
    pub proposals: Option<config::ProposalTools>,
    pub model: Option<ModelRef>,
    pub user_config: Option<Map<String, Value>>,
    /// `auth-json` (provider id → auth entry): API keys are served through the key proxy; only
    /// what it cannot carry is passed as `OPENCODE_AUTH_CONTENT`.
    pub auth: Map<String, Value>,
    pub log_file: PathBuf,
    pub startup_deadline: Duration,
    pub now_ms: fn() -> i64,
    /// The run's: a signal while OpenCode starts stops the start (`ServerError::Cancelled`).
    pub cancel: Cancellation,
    /// What the agent may reach on the network (`crate::egress`, `crate::confine::network`).
    pub network: crate::egress::AgentReach,
    /// The run's spend meter: the key proxy counts the agent's model requests on it and refuses
    /// them past its caps (`confine::spend`); `None`: not counted.
    pub spend: Option<std::sync::Arc<crate::confine::spend::Meter>>,
}

#[cfg(test)]
impl AgentOptions {
    /// A local run's options under `root` (the agent is the current user, its network open,
    /// no session tools), the job's environment `base_env`.
    pub(crate) fn local(root: &std::path::Path, base_env: Env) -> AgentOptions {
        AgentOptions {
            opencode: root.join("bin/opencode"),
            opencode_version: crate::config::DEFAULT_OPENCODE_VERSION.into(),
            workspace: root.join("workspace"),
            dirs: Isolation::under(&root.join("home")),
            base_env,
            opt_in_env: vec![],
            // SAFETY: geteuid cannot fail.
            user: AgentUser::Current {
                uid: unsafe { libc::geteuid() },
            },
            state: None,
            file_commands: vec![],
            hide_git_credentials: false,
            runner_home: None,
            extra_env: vec![],
            fro_bot_exe: None,
            session_trust: None,
            proposals: None,
            model: None,
            user_config: None,
            auth: Map::new(),
            log_file: root.join("opencode.log"),
            startup_deadline: Duration::from_secs(1),
            now_ms: system_now_ms,
            cancel: Cancellation::new(),
            network: crate::egress::AgentReach::open(),
            spend: None,
        }
    }
}

/// A running OpenCode server, a client for this workspace, and the agent's confinement.
#[derive(Debug)]
pub struct Agent {
    server: Server,
    client: Client,
    /// OpenCode's database: the prior-work search reads which sessions mention its terms there.
    database: PathBuf,
    now_ms: fn() -> i64,
    /// Where `confinement::record_taken` wrote; cleared once everything is given back.
    state: Option<FileCommands>,
    confinement: Confinement,
}

impl Agent {
    /// Confines the agent (`confinement`), starts the key proxy and OpenCode as the agent's
    /// process (`launch`), and connects to it. The summary's notes on the agent's reach are
    /// gathered on the way ([`confinement_notes`](Self::confinement_notes)).
    pub async fn start(opts: AgentOptions) -> Result<Agent, AgentError> {
        seed_config_dir(&opts)?;
        let mut notes = Vec::new();
        let exe = launch::session_tools_exe(&opts, &mut notes);
        let confined = confinement::confine(&opts, exe.as_deref())?;
        notes.extend(launch::commands_notes(&opts, &confined));
        if let Some(files) = &opts.state {
            confinement::record_taken(files, &confined.taken());
        }
        let plan = KeyProxyPlan::new(&opts.auth, opts.user_config.as_ref(), &opts.base_env);
        let metering = opts.spend.clone().map(|meter| Metering {
            meter,
            refuse: true,
        });
        let key_proxy = KeyProxy::start_metered(plan.routes.clone(), metering)
            .await
            .map_err(|source| AgentError::KeyProxy { source })?;
        notes.extend(launch::provider_notes(&plan));
        let capped = opts.spend.as_ref().is_some_and(|m| m.cap().is_set());
        for (id, _) in plan.visible.iter().filter(|_| capped) {
            crate::runner::log::warning(&format!(
                "max-cost/max-tokens: provider `{id}`'s requests do not go through fro-bot's key proxy, so they are neither counted nor capped"
            ));
        }
        let trust = launch::trust_file(&opts)?;
        let trust_path = trust.as_ref().map(|(_, f)| f.path().to_path_buf());
        let with_tools = exe.is_some();
        let server_opts =
            launch::server_options(&opts, &confined, &plan, &key_proxy, exe.clone(), trust_path);
        // fro-bot's own programs the agent's uid runs: not the agent's when the sweep finds them.
        let own_programs = [exe, Some(server_opts.bin.clone())]
            .into_iter()
            .flatten()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect();
        let (server, client) = connect(&opts, &server_opts).await?;
        if with_tools {
            if let Some(note) = launch::session_tools_missing(&client).await {
                tracing::warn!("{note}");
                notes.push(note);
            }
        }
        Ok(Agent {
            server,
            client,
            database: opts.dirs.database(),
            now_ms: opts.now_ms,
            state: opts.state.clone(),
            confinement: Confinement {
                user: opts.user,
                handover: confined.handover,
                git_credentials: confined.git_credentials,
                notes,
                _key_proxy: key_proxy,
                _binary: confined.binary,
                trust,
                own_programs,
                regroup: server_opts
                    .memory_group
                    .map(|g| (opts.workspace.clone(), g)),
            },
        })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Adds this run's own session to the session tools' view, so the agent can read it back.
    pub fn record_own_session(
        &mut self,
        id: &str,
        trust: &crate::trust::SessionTrust,
    ) -> std::io::Result<()> {
        let Some((view, file)) = self.confinement.trust.as_mut() else {
            return Ok(());
        };
        view.sessions.insert(id.to_string(), trust.clone());
        // Replaced whole (a rename), so a tool reading meanwhile sees the old view or the new.
        let fresh = crate::trust::write_view_file(view)?;
        fresh.persist(file.path()).map(drop).map_err(|e| e.error)
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Resolution by title alone (legacy memory; tests).
    pub async fn resolve_session(&self, logical_key: &str) -> Result<ResolvedSession, ApiError> {
        session::resolve(&self.client, logical_key, session::Ownership::ByTitle).await
    }

    /// Resolution as fro-bot's session map allows (`memory::session_map`).
    pub async fn resolve_owned_session(
        &self,
        logical_key: &str,
        ownership: session::Ownership<'_>,
    ) -> Result<ResolvedSession, ApiError> {
        session::resolve(&self.client, logical_key, ownership).await
    }

    /// Excerpts from other sessions (`exclude`: the current one and any it replaced), judged
    /// by `view` (docs/security.md#trust-follows-memory).
    pub async fn prior_work(
        &self,
        terms: &[String],
        exclude: &[&str],
        view: &crate::trust::TrustView,
    ) -> Result<prep::PriorWork, ApiError> {
        prep::prior_work(&self.client, Some(&self.database), terms, exclude, view).await
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
        let bounds = prune::Bounds::default();
        prune::prune(&self.client, (self.now_ms)(), retention, protect, bounds).await
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

    /// What the summary should say about the agent's reach (proxied providers, visible ones).
    pub fn confinement_notes(&self) -> &[String] {
        &self.confinement.notes
    }

    /// Who the agent ran as.
    pub fn user(&self) -> AgentUser {
        self.confinement.user
    }

    /// After [`shutdown`](Self::shutdown): kills and reaps every process the agent left, then
    /// takes its directories back and gives the file-command files back.
    pub async fn release(&mut self, budget: Duration) -> Released {
        self.confinement.release(budget, self.state.as_ref()).await
    }
}

/// Seeds OpenCode's config dir, so it does not npm-install its plugin package at start.
fn seed_config_dir(opts: &AgentOptions) -> Result<(), AgentError> {
    let config_dir = opts.dirs.config_home.join("opencode");
    config::seed_plugin_dir(&config_dir, &opts.opencode_version).map_err(|source| {
        AgentError::Seed {
            path: config_dir.clone(),
            source,
        }
    })
}

/// Starts the server and makes a client for the workspace.
async fn connect(
    opts: &AgentOptions,
    server_opts: &server::ServerOptions,
) -> Result<(Server, Client), AgentError> {
    let server = Server::start(server_opts)
        .await
        .map_err(|source| AgentError::Server { source })?;
    let client = Client::new(
        server.url(),
        Some(server.password()),
        &opts.workspace.to_string_lossy(),
    )
    .map_err(|source| AgentError::Client { source })?;
    Ok((server, client))
}
