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
pub mod mentions;
pub mod preflight;
pub mod prep;
pub mod progress;
pub mod prune;
pub mod server;
pub mod session;
pub mod turn;
pub mod writeback;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use client::error_chain;
pub use client::{ApiError, Client, Session};
pub use server::{Quiescence, Server, ServerError};
pub use session::{Resolution, ResolvedSession};
pub use turn::{TurnFailure, TurnOptions, TurnOutcome, TurnReport};

use crate::config::ModelRef;
use crate::confine::gitcreds::{self, HiddenCredentials};
use crate::confine::handover::{Handover, Take, TakenOver};
use crate::confine::proxy::{Proxy, ProxyPlan};
use crate::confine::{memory_group, strays, AgentUser, PrivateBinary};
use crate::runner::env;
use crate::runner::{Cancellation, Env, FileCommands};

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
    #[error("cannot start the provider proxy")]
    Proxy {
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
    pub proposals: Option<crate::tools::proposals::ProposalTools>,
    pub model: Option<ModelRef>,
    pub user_config: Option<Map<String, Value>>,
    /// `auth-json` (provider id → auth entry): API keys are served through the proxy; only
    /// what it cannot carry is passed as `OPENCODE_AUTH_CONTENT`.
    pub auth: Map<String, Value>,
    pub log_file: PathBuf,
    pub startup_deadline: Duration,
    pub now_ms: fn() -> i64,
    /// The run's: a signal while OpenCode starts stops the start (`ServerError::Cancelled`).
    pub cancel: Cancellation,
    /// What the agent may reach on the network (`crate::egress`, `crate::confine::network`).
    pub network: crate::egress::AgentReach,
}

/// A running OpenCode server and a client for this workspace.
#[derive(Debug)]
pub struct Agent {
    server: Server,
    client: Client,
    /// OpenCode's database: the prior-work search reads which sessions mention its terms there.
    database: PathBuf,
    now_ms: fn() -> i64,
    /// Where [`record_taken`] wrote; cleared once everything is given back.
    state: Option<FileCommands>,
    confinement: Confinement,
}

/// What confining the agent changed for the turn, undone by [`Agent::release`].
#[derive(Debug)]
struct Confinement {
    user: AgentUser,
    handover: Handover,
    git_credentials: Option<HiddenCredentials>,
    /// What the summary says about the agent's reach.
    notes: Vec<String>,
    /// Serves the provider APIs while the agent runs.
    _proxy: Proxy,
    /// Kept until the server is gone.
    _binary: Option<PrivateBinary>,
    /// The session tools' trust view, read by them at each call while the agent runs.
    trust: Option<(crate::trust::TrustView, tempfile::NamedTempFile)>,
    /// OpenCode and the session-tools server, as run by the agent's uid.
    own_programs: Vec<PathBuf>,
    /// The checkout and the memory group, when OpenCode held it: what OpenCode made there gets
    /// the agent's gid back.
    regroup: Option<(PathBuf, u32)>,
}

/// What [`Agent::release`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// No process of the agent is left and its directories are fro-bot's again.
    Clean { strays_killed: Vec<String> },
    /// Processes of the agent survived SIGKILL: its directories stay handed over (taking them
    /// back while something writes them would race), and the checkpoint must not run.
    StraysRemain { pids: Vec<i32> },
    /// No stray, but something could not be taken back.
    NotTakenBack { message: String },
}

/// The `fro-bot` the session tools start from, as the agent's uid can reach it; `None` (and a
/// note: the agent has no session tools) when there is none.
fn session_tools_exe(opts: &AgentOptions, notes: &mut Vec<String>) -> Option<PathBuf> {
    let exe = opts.fro_bot_exe.as_ref()?;
    match opts.user {
        AgentUser::Current { .. } => Some(exe.clone()),
        AgentUser::Switched { .. } => match crate::confine::agent_reachable_exe(exe) {
            Ok(path) => Some(path),
            Err(e) => {
                let note = format!(
                    "no session tools for the agent: {} cannot be made reachable by its user: {e}",
                    exe.display()
                );
                tracing::warn!("{note}");
                notes.push(note);
                None
            }
        },
    }
}

/// A note when OpenCode could not start the session tools (the agent would be told, at its first
/// call, only that no such tool exists).
async fn session_tools_missing(client: &Client) -> Option<String> {
    let why = match client.mcp_status().await {
        Ok(all) => match all.get(config::SESSION_TOOLS_MCP) {
            Some(s) if s.status == "connected" => return None,
            Some(s) => match &s.error {
                Some(e) => format!("{}: {e}", s.status),
                None => s.status.clone(),
            },
            None => "OpenCode does not list them".to_string(),
        },
        Err(e) => format!("their state could not be read: {e}"),
    };
    Some(format!("no session tools for the agent ({why})"))
}

/// What [`confine`] changed before OpenCode starts.
struct Confined {
    handover: Handover,
    git_credentials: Option<HiddenCredentials>,
    binary: Option<PrivateBinary>,
}

/// Hands OpenCode's directories to the agent's uid, takes the file commands and hides the
/// checkout's credentials (a local run's agent is the user: nothing to do).
fn confine(opts: &AgentOptions, fro_bot: Option<&Path>) -> Result<Confined, AgentError> {
    let mut handover = Handover::new();
    let AgentUser::Switched { uid, gid, .. } = opts.user else {
        return Ok(Confined {
            handover,
            git_credentials: None,
            binary: None,
        });
    };
    let confine_err = |source| AgentError::Confine { source };
    // The wrapper comes first: whether OpenCode gets the memory group decides how its data dir
    // is handed over.
    let binary = PrivateBinary::prepare(
        &opts.opencode,
        opts.base_env.get(env::PATH),
        fro_bot.filter(|_| gid != memory_group::MEMORY_GID),
    )
    .map_err(|source| AgentError::Binary {
        path: opts.opencode.clone(),
        source,
    })?;
    let data_dir = opts.dirs.data_dir();
    for dir in opts.dirs.opencode_dirs() {
        match binary.memory_group() {
            Some(group) if dir == data_dir => handover.give_dir_to_group(&dir, uid, group),
            _ => handover.give_dir(&dir, uid, gid),
        }
        .map_err(confine_err)?;
    }
    for file in &opts.file_commands {
        handover
            .take_file(file, uid, Take::ReadOnly)
            .map_err(confine_err)?;
    }
    let git_credentials = if opts.hide_git_credentials {
        Some(hide_git_credentials(opts, uid)?)
    } else {
        None
    };
    Ok(Confined {
        handover,
        git_credentials,
        binary: Some(binary),
    })
}

fn hide_git_credentials(opts: &AgentOptions, uid: u32) -> Result<HiddenCredentials, AgentError> {
    let mut stores = vec![
        opts.dirs.home.join(".git-credentials"),
        opts.dirs.config_home.join("git/credentials"),
    ];
    if let Some(home) = &opts.runner_home {
        stores.push(home.join(".git-credentials"));
        stores.push(home.join(".config/git/credentials"));
    }
    let config = gitcreds::repo_config(&opts.workspace);
    let hidden = HiddenCredentials::hide(config.as_deref(), &stores, uid)
        .map_err(|source| AgentError::GitCredentials { source })?;
    if hidden.count() > 0 {
        tracing::info!(
            "hid {} checkout credential(s) from the agent for the turn",
            hidden.count()
        );
    }
    Ok(hidden)
}

impl Confined {
    /// Everything taken from the runner's user for the turn, for main's state: post gives it
    /// back when main is killed before [`Agent::release`] could.
    fn taken(&self) -> TakenOver {
        let mut all = self.handover.taken().clone();
        if let Some(c) = &self.git_credentials {
            all.taken.extend(c.taken().taken.iter().cloned());
        }
        all
    }
}

/// When the agent's commands keep OpenCode's wider network (no fro-bot shell wrapper to narrow
/// it, `crate::confine::network`): they can also reach fro-bot's provider proxy.
fn commands_reach_note(opts: &AgentOptions, confined: &Confined) -> Option<String> {
    let narrowed = confined
        .binary
        .as_ref()
        .is_some_and(|b| b.memory_group().is_some());
    (opts.network.mode != crate::egress::AgentNetwork::Open && !narrowed).then(|| {
        "the agent's commands share OpenCode's network in this run (no fro-bot shell wrapper \
         narrows it): they can also reach fro-bot's provider proxy"
            .to_string()
    })
}

/// What the summary says about the provider keys.
fn provider_notes(plan: &ProxyPlan) -> Vec<String> {
    let mut notes = Vec::new();
    if !plan.routes.is_empty() {
        let ids: Vec<&str> = plan.routes.iter().map(|r| r.id.as_str()).collect();
        notes.push(format!(
            "provider keys stay with fro-bot (served through its local proxy): {}",
            ids.join(", ")
        ));
    }
    for (id, why) in &plan.visible {
        notes.push(format!(
            "provider `{id}`: its credentials are visible to the agent ({why})"
        ));
    }
    notes
}

/// The session tools' trust view, written for them to read at each call.
type TrustFile = Option<(crate::trust::TrustView, tempfile::NamedTempFile)>;

fn trust_file(opts: &AgentOptions) -> Result<TrustFile, AgentError> {
    let Some(view) = &opts.session_trust else {
        return Ok(None);
    };
    let file =
        crate::trust::write_view_file(view).map_err(|source| AgentError::TrustFile { source })?;
    Ok(Some((view.clone(), file)))
}

/// How OpenCode is started: the binary the agent may run, its environment, and the config
/// naming the session tools, the model and the proxy.
fn server_options(
    opts: &AgentOptions,
    confined: &Confined,
    plan: &ProxyPlan,
    proxy: &Proxy,
    exe: Option<PathBuf>,
    trust_path: Option<PathBuf>,
) -> server::ServerOptions {
    let network = opts.network.plan(proxy.port());
    let network_env = opts.network.env(&opts.base_env, &network);
    let mut extra = opts.dirs.vars();
    if let Some(shell) = confined.binary.as_ref().and_then(|b| b.shell()) {
        extra.push(("SHELL".into(), shell.to_string_lossy().into_owned()));
    }
    let memory_group = confined
        .binary
        .as_ref()
        .and_then(PrivateBinary::memory_group);
    if memory_group.is_some() {
        extra.extend(memory_group::opencode_git_env());
    }
    extra.extend(opts.extra_env.iter().cloned());
    let overrides = plan.config_overrides(proxy);
    let workspace = opts.workspace.clone();
    let proposals = opts.proposals.clone();
    let model = opts.model.clone();
    let user = opts.user_config.clone();
    let memory_dir = opts.dirs.data_dir();
    let make_config: server::ConfigFn = Arc::new(move |url: &str, password: &str| {
        let tools = exe.as_ref().map(|exe| config::SessionToolsEntry {
            fro_bot_exe: exe.clone(),
            url: url.to_string(),
            password: password.to_string(),
            workspace: workspace.clone(),
            trust_file: trust_path.clone(),
            proposals: proposals.clone(),
        });
        config::config_content(&config::ConfigInput {
            session_tools: tools.as_ref(),
            model: model.as_ref(),
            user: user.as_ref(),
            proxy: Some(&overrides),
            memory_dir: Some(&memory_dir),
        })
    });
    server::ServerOptions {
        bin: confined
            .binary
            .as_ref()
            .map_or_else(|| opts.opencode.clone(), |b| b.path().to_path_buf()),
        cwd: opts.workspace.clone(),
        env: crate::confine::env::agent_env(&opts.base_env, &opts.opt_in_env, &extra, &network_env),
        config: make_config,
        auth_content: config::auth_content(&plan.auth_passthrough),
        log_file: opts.log_file.clone(),
        startup_deadline: opts.startup_deadline,
        user: opts.user,
        memory_group,
        cancel: opts.cancel.clone(),
        watchdog: opts.fro_bot_exe.clone(),
        network: network.enforced().then_some(network),
    }
}

/// Main's record of what is taken for the turn (`state::TURN_TAKEN`); empty when nothing is.
fn record_taken(files: &FileCommands, taken: &TakenOver) {
    let value = if taken.taken.is_empty() {
        String::new()
    } else {
        match serde_json::to_string(taken) {
            Ok(json) => json,
            Err(e) => {
                tracing::warn!("post could not give back what the turn takes: {e}");
                return;
            }
        }
    };
    if let Err(e) = files.save_state(env::state::TURN_TAKEN, &value) {
        tracing::warn!("{e}");
    }
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
        let mut notes = Vec::new();
        let exe = session_tools_exe(&opts, &mut notes);
        let confined = confine(&opts, exe.as_deref())?;
        if confined
            .binary
            .as_ref()
            .is_some_and(|b| b.memory_group().is_none())
        {
            notes.push(
                "the agent's commands can read memory in this run: fro-bot could not be its \
                 shell's interpreter (docs/security.md#who-it-runs-as)"
                    .into(),
            );
        }
        if let Some(note) = commands_reach_note(&opts, &confined) {
            notes.push(note);
        }
        if let Some(files) = &opts.state {
            record_taken(files, &confined.taken());
        }
        let plan = ProxyPlan::new(&opts.auth, opts.user_config.as_ref(), &opts.base_env);
        let proxy = Proxy::start(plan.routes.clone())
            .await
            .map_err(|source| AgentError::Proxy { source })?;
        notes.extend(provider_notes(&plan));
        let trust = trust_file(&opts)?;
        let trust_path = trust.as_ref().map(|(_, f)| f.path().to_path_buf());
        let with_tools = exe.is_some();
        let server_opts = server_options(&opts, &confined, &plan, &proxy, exe.clone(), trust_path);
        // fro-bot's own programs the agent's uid runs: not the agent's when the sweep finds them.
        let own_programs = [exe, Some(server_opts.bin.clone())]
            .into_iter()
            .flatten()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect();
        let memory_group = server_opts.memory_group;
        let server = Server::start(&server_opts)
            .await
            .map_err(|source| AgentError::Server { source })?;
        let client = Client::new(
            server.url(),
            Some(server.password()),
            &opts.workspace.to_string_lossy(),
        )
        .map_err(|source| AgentError::Client { source })?;
        if with_tools {
            if let Some(note) = session_tools_missing(&client).await {
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
                _proxy: proxy,
                _binary: confined.binary,
                trust,
                own_programs,
                regroup: memory_group.map(|g| (opts.workspace.clone(), g)),
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

    /// Gives what OpenCode made in the checkout the agent's gid (best effort: a stray group
    /// gives no one access to anything).
    fn regroup(&self) {
        let (Some((workspace, group)), AgentUser::Switched { gid, .. }) =
            (&self.confinement.regroup, self.confinement.user)
        else {
            return;
        };
        match memory_group::regroup(workspace, *group, gid) {
            Ok(0) => {}
            Ok(n) => tracing::debug!("{n} file(s) OpenCode made in the checkout get gid {gid}"),
            Err(e) => tracing::warn!("cannot give OpenCode's files in the checkout gid {gid}: {e}"),
        }
    }

    /// After [`shutdown`](Self::shutdown): kills and reaps every process the agent left, then
    /// takes its directories back and gives the file-command files back.
    pub async fn release(&mut self, budget: Duration) -> Released {
        let uid = self.confinement.user.uid();
        let ours = self.confinement.own_programs.clone();
        let sweep = tokio::task::spawn_blocking(move || strays::sweep(uid, budget, &ours)).await;
        let killed = match sweep {
            Ok(strays::Sweep::Clean) => Vec::new(),
            Ok(strays::Sweep::Killed { agents, .. }) => agents,
            Ok(strays::Sweep::Remaining { pids }) => return Released::StraysRemain { pids },
            Err(e) => {
                tracing::warn!("the stray sweep failed: {e}");
                return Released::StraysRemain { pids: vec![] };
            }
        };
        self.regroup();
        let creds = self
            .confinement
            .git_credentials
            .as_mut()
            .map(|c| c.restore());
        if let Some(Err(e)) = creds {
            return Released::NotTakenBack {
                message: error_chain(&e),
            };
        }
        match self.confinement.handover.restore() {
            Ok(()) => {
                if let Some(files) = &self.state {
                    record_taken(files, &TakenOver::default());
                }
                Released::Clean {
                    strays_killed: killed,
                }
            }
            Err(e) => Released::NotTakenBack {
                message: error_chain(&e),
            },
        }
    }
}
