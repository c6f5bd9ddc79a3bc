//! Session prep and the agent (`docs/design.md#session-prep-and-the-agent`): start OpenCode,
//! resolve the conversation's session, gather context and prior work into the prompt, run the
//! turn, write the run back.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::{ContextAuthors, ResponseMode, Settings};
use crate::confine::AgentUser;
use crate::egress::AgentReach;
use crate::github::{self, RunPlan};
use crate::memory::report::RestoreReport;
use crate::opencode::config::ProposalTools;
use crate::opencode::progress::ProgressSink;
use crate::opencode::{
    self, prep, Agent, AgentOptions, Isolation, TurnOptions, TurnOutcome, TurnReport,
};
use crate::phases::run_context::{Admitted, Mode, RunLedger};
use crate::runner::env;
use crate::runner::{log, Cancellation, Env};
use crate::trust::{SessionTrust, TrustView};

/// What the agent part of the run produced.
#[derive(Debug, Default)]
pub(crate) struct AgentRun {
    pub(crate) session_id: Option<String>,
    pub(crate) replaced: Option<String>,
    pub(crate) outcome: Option<TurnOutcome>,
    pub(crate) answer: Option<String>,
    pub(crate) tokens: Option<opencode::client::Tokens>,
    pub(crate) cost: f64,
    /// `provider/model` that answered, as OpenCode reports it.
    pub(crate) model: Option<String>,
    /// What OpenCode could call, as it listed it before the turn (`GET /config/providers`).
    pub(crate) providers: Option<opencode::preflight::Providers>,
    pub(crate) errors: Vec<String>,
    /// Session resolution, context and prior-work search, prompt building.
    pub(crate) prep_time: Duration,
    /// Who wrote this run's session, as trust goes: the least trusted of the requester and every
    /// author whose text the prompt quoted (docs/security.md#trust-follows-memory).
    pub(crate) trust: Option<crate::trust::SessionTrust>,
    /// The turn was handed to OpenCode: only then can the run have changed memory
    /// (`phases::run::memory_changed`).
    pub(crate) prompted: bool,
    /// What the repair of this run's own turn did (`phases::turn::cut`); `None`: it did not run.
    pub(crate) cut: Option<crate::memory::repair::RepairOutcome>,
    /// The tools the turn called, one name per call.
    pub(crate) tools: Vec<String>,
    /// What the delivery did with what the agent proposed.
    pub(crate) delivery: DeliveryDid,
}

/// What the delivery did with what the agent proposed, for the outcome and an empty answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct DeliveryDid {
    /// A commit, a review or an action was carried out.
    pub(crate) delivered: bool,
    /// What became of the agent's files, as the summary's Changes row says it.
    pub(crate) changes: Option<String>,
}

impl AgentRun {
    pub(crate) fn protect(&self) -> Vec<&str> {
        self.session_id.iter().map(String::as_str).collect()
    }

    /// This run's own sessions (`memory::guard::own_sessions`): its thread's, and one a context
    /// overflow replaced.
    pub(crate) fn own_sessions(&self) -> Vec<String> {
        crate::memory::guard::own_sessions(self.session_id.as_deref(), self.replaced.as_deref())
    }

    /// Whether what the agent proposed is carried out (through the usual checks and the threat
    /// check): after a completed turn, and after one the spend cap ended — what the agent did up
    /// to the cap is its own work, and the cap only stopped it from asking the model again
    /// (docs/design.md#spend-caps). A turn that timed out, was cancelled or failed proposes
    /// nothing.
    pub(crate) fn proposals_stand(&self) -> bool {
        match &self.outcome {
            Some(TurnOutcome::Completed | TurnOutcome::Capped { .. }) => true,
            Some(TurnOutcome::TimedOut | TurnOutcome::Cancelled | TurnOutcome::Failed(_))
            | None => false,
        }
    }

    pub(crate) fn outcome_text(&self) -> String {
        match &self.outcome {
            None => "not run".into(),
            Some(TurnOutcome::Completed) => "completed".into(),
            Some(TurnOutcome::TimedOut) => "timed out".into(),
            Some(TurnOutcome::Capped { line }) => line.clone(),
            Some(TurnOutcome::Cancelled) => "cancelled".into(),
            Some(TurnOutcome::Failed(f)) => format!("failed: {f}"),
        }
    }
}

/// How this run judges earlier sessions: at its requester's level; runs that hold a token leave
/// lower ones out (docs/security.md#trust-follows-memory).
pub(crate) fn trust_view(plan: &RunPlan, restored: &RestoreReport) -> TrustView {
    TrustView::new(
        plan.requester.level,
        plan.acts_unattended,
        restored.trust.clone(),
    )
}

/// Starts OpenCode for the turn: the agent's network first, then the server in its confinement;
/// what the start confined goes into the summary.
pub(crate) async fn start_agent(
    ctx: &Admitted,
    run: &mut RunLedger,
    view: &TrustView,
    (proposals, private_home): (Option<ProposalTools>, Option<&Path>),
) -> Result<Agent, String> {
    let t = Instant::now();
    // First: a kernel that cannot enforce the agent's network fails the run before anything starts.
    let network = crate::phases::turn::agent_network::prepare(ctx).await?;
    run.egress = Some(network.clone());
    let options = agent_options(ctx, view, (proposals, private_home), network).await?;
    let user = options.user;
    let agent = Agent::start(options)
        .await
        .map_err(|e| crate::opencode::client::error_chain(&e))?;
    let report = &mut run.ledger.report;
    report.confinement.push(user.describe());
    report
        .confinement
        .extend(agent.confinement_notes().iter().cloned());
    report.record_phase("opencode-start", t.elapsed());
    // Everything is taken for the turn here: a kill now leaves it all to post.
    crate::runner::failpoint::hit("agent:started");
    Ok(agent)
}

/// How OpenCode is started: the binary (located or installed), the agent's directories and user,
/// what it is handed and what it is kept from.
async fn agent_options(
    ctx: &Admitted,
    view: &TrustView,
    (proposals, private_home): (Option<ProposalTools>, Option<&Path>),
    network: AgentReach,
) -> Result<AgentOptions, String> {
    let Admitted {
        env,
        settings,
        mode,
        workspace,
        paths,
        files,
        ..
    } = ctx;
    let home = PathBuf::from(env.get(env::HOME).unwrap_or("/github/home"));
    let cache_dir = match mode {
        Mode::Local { state_dir, .. } => state_dir.join("opencode-install"),
        Mode::Action => home.join(".cache/fro-bot"),
    };
    let located = opencode::locate::locate(env, &settings.opencode_version, &cache_dir)
        .await
        .map_err(|e| e.to_string())?;
    let dirs = isolation(env, &paths.data_dir, &home, private_home);
    let user = agent_user(mode, workspace);
    let extra_env = match mode {
        Mode::Action => safe_directory_env(workspace),
        Mode::Local { .. } => Vec::new(),
    };
    let log_dir = run_log_dir(env)?;
    Ok(AgentOptions {
        opencode: located.path().to_path_buf(),
        opencode_version: settings.opencode_version.clone(),
        workspace: workspace.to_path_buf(),
        dirs,
        base_env: env.clone(),
        opt_in_env: settings.agent_env.clone(),
        user,
        state: Some(files.clone()),
        file_commands: file_commands(env),
        // No run mode gives the agent a GitHub credential: what it wants done goes through
        // its proposal tools (docs/security.md#the-agent-proposes-fro-bot-disposes).
        hide_git_credentials: true,
        runner_home: private_home.map(|_| home.clone()),
        extra_env,
        fro_bot_exe: std::env::current_exe().ok(),
        session_trust: Some(view.clone()),
        proposals,
        model: settings.model.clone(),
        user_config: settings.opencode_config.clone(),
        auth: settings.auth.clone(),
        log_file: log_dir.join("opencode-server.log"),
        startup_deadline: Duration::from_secs(60),
        now_ms: opencode::system_now_ms,
        cancel: ctx.cancel.clone(),
        network,
        spend: Some(ctx.spend.clone()),
    })
}

/// Who the agent runs as, said in the log.
fn agent_user(mode: &Mode, workspace: &Path) -> AgentUser {
    let user = match mode {
        Mode::Action => AgentUser::choose(workspace),
        Mode::Local { .. } => AgentUser::choose_local(workspace),
    };
    // Running unprivileged (a laptop's `fro-bot local`) is the normal case, not a warning; only
    // a dedicated uid that cannot write the workspace needs attention.
    match user {
        AgentUser::Switched {
            why: crate::confine::UidChoice::Dedicated,
            ..
        } => log::warning(&user.describe()),
        AgentUser::Switched { .. } | AgentUser::Current { .. } => {
            tracing::info!("{}", user.describe())
        }
    }
    user
}

/// The runner's file-command files, which the agent must not write.
fn file_commands(env: &Env) -> Vec<PathBuf> {
    [
        env::GITHUB_OUTPUT,
        env::GITHUB_STATE,
        env::GITHUB_ENV,
        env::GITHUB_PATH,
        env::GITHUB_STEP_SUMMARY,
    ]
    .iter()
    .filter_map(|name| env.get(name).map(PathBuf::from))
    .collect()
}

/// The agent's directories: memory where fro-bot keeps it; everything else under the run's private
/// home when there is one (nothing the agent writes there reaches a later step,
/// docs/security.md#what-it-leaves-behind), else where the environment says.
fn isolation(env: &Env, data_dir: &Path, home: &Path, private_home: Option<&Path>) -> Isolation {
    let data_home = data_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.join(".local/share"));
    if let Some(private) = private_home {
        return Isolation {
            data_home,
            ..Isolation::under(private)
        };
    }
    let xdg = |name: &str, default: &str| {
        env.get(name)
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(default))
    };
    Isolation {
        home: home.to_path_buf(),
        data_home,
        config_home: xdg(env::XDG_CONFIG_HOME, ".config"),
        cache_home: xdg(env::XDG_CACHE_HOME, ".cache"),
        state_home: xdg(env::XDG_STATE_HOME, ".local/state"),
    }
}

/// The workspace may belong to another user than the agent's (root's checkout, a dedicated uid):
/// git would refuse the repository ("dubious ownership"), and OpenCode's project detection and
/// snapshots with it. Only the child's git sees this setting, and only for the workspace.
fn safe_directory_env(workspace: &Path) -> Vec<(String, String)> {
    vec![
        (env::GIT_CONFIG_COUNT.to_string(), "1".to_string()),
        (
            env::GIT_CONFIG_KEY_0.to_string(),
            "safe.directory".to_string(),
        ),
        (
            env::GIT_CONFIG_VALUE_0.to_string(),
            workspace.to_string_lossy().into_owned(),
        ),
    ]
}

/// A directory of this run's own for OpenCode's log (0700, a fresh name, never a path another user
/// could have planted a link at), kept after the run so the log can be read.
fn run_log_dir(env: &Env) -> Result<PathBuf, String> {
    let temp = env.runner_temp().unwrap_or_else(std::env::temp_dir);
    tempfile::Builder::new()
        .prefix("fro-bot-run-")
        .tempdir_in(&temp)
        .map(tempfile::TempDir::keep)
        .map_err(|e| {
            format!(
                "cannot make a directory for this run's logs in {}: {e}",
                temp.display()
            )
        })
}

/// What the agent part of the run reads.
pub(crate) struct AgentInputs<'a> {
    pub(crate) settings: &'a Settings,
    pub(crate) env: &'a Env,
    pub(crate) plan: &'a RunPlan,
    pub(crate) restored: &'a RestoreReport,
    pub(crate) gh: Option<&'a github::GitHub>,
    pub(crate) cancel: &'a Cancellation,
    pub(crate) started: Instant,
    /// Where the turn's progress goes: the log, and the tracking comment's watcher.
    pub(crate) progress: ProgressSink,
    /// Whether the files the agent changes are delivered (the prompt says so).
    pub(crate) changes_delivered: bool,
    /// What the prompt says of the review (`ReviewPrep::brief`), and an automatic review's task.
    pub(crate) review: Option<(String, Option<String>)>,
    /// Memory (OpenCode's database), where the thread's turns cut short are read.
    pub(crate) memory: PathBuf,
    /// Records what the run knows of its own sessions for post (main's state), before the prompt
    /// is sent and again when the turn returns: a main step killed in between leaves post what
    /// it needs to finish the turn (`phases::post_memory`).
    pub(crate) record: &'a (dyn Fn(&AgentRun) + Sync),
    /// The run's spend meter: priced from OpenCode's model list once it is read.
    pub(crate) spend: &'a std::sync::Arc<crate::confine::spend::Meter>,
}

/// The thread's context for the prompt. With `context-authors: trusted` comments of authors without
/// write access are left out (counted); fro-bot's own answers stay. Title and body always stay:
/// they are what the run is about, and are fenced like everything else.
fn entity_context(
    c: github::context::Context,
    authors: ContextAuthors,
    own_login: Option<&str>,
) -> prep::EntityContext {
    let total = c.comments.len();
    let comments: Vec<prep::CommentContext> = c
        .comments
        .into_iter()
        .filter(|cm| match authors {
            ContextAuthors::All => true,
            ContextAuthors::Trusted => {
                github::event::Association::parse(Some(&cm.association)).is_trusted()
                    || own_login.is_some_and(|me| me.eq_ignore_ascii_case(&cm.author))
                    || cm.author == github::api::APP_BOT_LOGIN
            }
        })
        .map(|cm| prep::CommentContext {
            author: cm.author,
            association: cm.association,
            body: cm.body,
        })
        .collect();
    prep::EntityContext {
        kind: c.kind.as_str().replace('_', " "),
        number: c.number,
        title: c.title,
        body: c.body,
        author: c.author,
        author_association: c.author_association,
        omitted_untrusted: total - comments.len(),
        comments,
        trigger: None,
    }
}

/// Resolves the session, prepares the prompt (context, prior work), runs the turn and writes the
/// run summary back into the session.
pub(crate) async fn drive_agent(agent: &mut Agent, inputs: &AgentInputs<'_>, out: &mut AgentRun) {
    let started_prep = Instant::now();
    // A signal during session prep ends it there: no prompt, so memory stays as restored.
    let cancel = inputs.cancel;
    let prepared = tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        prepared = prepare_turn(agent, inputs, out) => Some(prepared),
    };
    out.prep_time = started_prep.elapsed();
    let prepared = match prepared {
        Some(_) if cancel.is_cancelled() => None,
        other => other,
    };
    let Some(prepared) = prepared else {
        out.errors
            .push("the run was cancelled before the agent's turn".into());
        out.outcome = Some(TurnOutcome::Cancelled);
        return;
    };
    // The prep failed; the outcome says why.
    let Some((session, prompt)) = prepared else {
        return;
    };
    let settings = inputs.settings;
    let opts = TurnOptions {
        timeout: settings.timeout,
        agent: settings.agent.clone(),
        model: settings.model.as_ref().map(Into::into),
        progress: Some(inputs.progress.clone()),
        spend: Some(inputs.spend.clone()),
        ..TurnOptions::default()
    };
    (inputs.record)(out);
    out.prompted = true;
    let report = agent.run_turn(session, &prompt, &opts, cancel).await;
    record_turn(&report, out);
    (inputs.record)(out);
    if !cancel.is_cancelled() {
        writeback(agent, inputs, report, &out.errors).await;
    }
}

/// Session prep: a usable model, the session, the prompt. `None` when the turn cannot be run (the
/// outcome says why).
async fn prepare_turn(
    agent: &mut Agent,
    inputs: &AgentInputs<'_>,
    out: &mut AgentRun,
) -> Option<(opencode::Session, String)> {
    let plan = inputs.plan;
    // GitHub's side of the prompt does not wait for OpenCode's side, nor the reverse.
    let (session, from_github) =
        tokio::join!(usable_session(agent, inputs, out), github_context(inputs));
    let resolved = session?;
    tracing::info!(
        "session {} ({:?}) for {}",
        resolved.session.id,
        resolved.resolution,
        plan.logical_key.as_str()
    );
    out.session_id = Some(resolved.session.id.clone());
    let (prompt, trust) = prepare_prompt(agent, inputs, from_github, &resolved.session.id).await;
    if let Err(e) = agent.record_own_session(&resolved.session.id, &trust) {
        tracing::warn!("the session tools will not find this run's own session: {e}");
    }
    out.trust = Some(trust);
    Some((resolved.session, prompt))
}

/// The session this run continues or starts, once OpenCode has a usable model; `None` (with the
/// failure in `out`) when it has none or the session cannot be resolved.
async fn usable_session(
    agent: &Agent,
    inputs: &AgentInputs<'_>,
    out: &mut AgentRun,
) -> Option<opencode::ResolvedSession> {
    let preflight = preflight(agent, inputs.settings, out).await;
    if let Some(providers) = &out.providers {
        price_models(inputs.spend, providers);
    }
    if let Err(message) = preflight {
        log::error(&format!("no usable model: {message}"));
        out.errors.push(message.clone());
        out.outcome = Some(TurnOutcome::Failed(opencode::TurnFailure::NoUsableModel {
            message,
        }));
        return None;
    }
    crate::runner::failpoint::pause("agent:prep", inputs.cancel).await;
    let key = inputs.plan.logical_key.as_str();
    match agent
        .resolve_owned_session(key, inputs.restored.sessions.ownership(key))
        .await
    {
        Ok(r) => Some(r),
        Err(e) => {
            out.errors.push(format!("cannot resolve the session: {e}"));
            log::error(&format!("cannot resolve the session: {e}"));
            out.outcome = Some(TurnOutcome::Failed(opencode::TurnFailure::Api {
                message: e.to_string(),
            }));
            None
        }
    }
}

/// The thread's issue or PR (bounded) and, when only trusted authors are quoted, fro-bot's own
/// login (its earlier answers stay in).
struct GithubContext {
    context: Option<github::context::Context>,
    own_login: Option<String>,
}

async fn github_context(inputs: &AgentInputs<'_>) -> GithubContext {
    let (Some(gh), Some(thread)) = (inputs.gh, &inputs.plan.thread) else {
        return GithubContext {
            context: None,
            own_login: None,
        };
    };
    let limits = github::context::ContextLimits::default();
    let context = match gh.fetch_context(thread, limits).await {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!("cannot fetch the issue/PR context: {e}");
            None
        }
    };
    let own_login = match (&context, inputs.settings.context_authors) {
        (Some(_), ContextAuthors::Trusted) => gh.own_login().await.ok(),
        _ => None,
    };
    GithubContext { context, own_login }
}

/// The meter's prices, from OpenCode's model list (USD per million tokens, as the `cost` output
/// has always been priced): by the id the provider's API knows a model by, and by its own.
fn price_models(meter: &crate::confine::spend::Meter, providers: &opencode::preflight::Providers) {
    for p in &providers.providers {
        for (id, entry) in &p.models {
            let cost = &entry["cost"];
            let Some(rates) = cost["input"].as_f64().zip(cost["output"].as_f64()) else {
                continue;
            };
            if let Some(api) = entry["api"]["id"].as_str() {
                meter.set_price(format!("{}/{api}", p.id), rates);
            }
            meter.set_price(format!("{}/{id}", p.id), rates);
        }
    }
}

/// With no usable model OpenCode retries for minutes: fail at once and say what to fix. The
/// listing is kept: the threat check asks the same model after the turn (`phases::delivery::threat_check`).
async fn preflight(agent: &Agent, settings: &Settings, out: &mut AgentRun) -> Result<(), String> {
    match agent.client().config_providers().await {
        Ok(providers) => {
            let checked = opencode::preflight::check(&providers, settings.model.as_ref())
                .map_err(|e| e.to_string());
            out.providers = Some(providers);
            checked
        }
        Err(e) => {
            tracing::warn!("cannot list OpenCode's providers (going on without the check): {e}");
            Ok(())
        }
    }
}

/// The prompt: GitHub context (bounded), prior work from other sessions, the directive and rules;
/// and the trust of the session that reads it.
async fn prepare_prompt(
    agent: &Agent,
    inputs: &AgentInputs<'_>,
    from_github: GithubContext,
    session_id: &str,
) -> (String, SessionTrust) {
    let AgentInputs {
        settings,
        env,
        plan,
        restored,
        ..
    } = *inputs;
    let GithubContext { context, own_login } = from_github;
    let schedule_like = plan.thread.is_none();
    // Without a thread, the prompt input says what the run is about.
    let topic = match (&context, schedule_like) {
        (Some(c), _) => Some(c.title.clone()),
        (None, true) => settings.prompt.clone(),
        (None, false) => None,
    };
    let terms = prep::search_terms(plan.logical_key.as_str(), topic.as_deref());
    let view = trust_view(plan, restored);
    let prior = match agent.prior_work(&terms, &[session_id], &view).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("prior-work search failed: {e}");
            prep::PriorWork::default()
        }
    };
    let found = crate::memory::repair::on_thread(inputs.memory.clone(), session_id.into()).await;
    let entity = context.map(|c| entity_context(c, settings.context_authors, own_login.as_deref()));
    let trust = session_trust(plan, entity.as_ref(), &prior, own_login.as_deref());
    let prompt = prep::build_prompt(&prep::PromptInput {
        repo: env.get(env::GITHUB_REPOSITORY).unwrap_or("").to_string(),
        event: plan.trigger_summary.clone(),
        actor: plan
            .author
            .clone()
            .or_else(|| env.get(env::GITHUB_ACTOR).map(str::to_string)),
        git_ref: env.get(env::GITHUB_REF_NAME).map(str::to_string),
        run_url: github::response::run_url(env),
        context: entity,
        prior_work: prior.excerpts,
        withheld_prior: prior.withheld,
        directive: match &inputs.review {
            Some((_, Some(task))) => Some(task.clone()),
            _ => plan.directive.clone(),
        },
        review: inputs.review.as_ref().map(|(brief, _)| brief.clone()),
        cut_short: crate::phases::turn::cut_notice::notice(found),
        prompt: settings.prompt.clone(),
        prompt_replaces_directive: schedule_like,
        rules: response_rules(settings.response_mode, plan),
        changes_delivered: inputs.changes_delivered,
        budget: 0,
        fence: crate::untrusted::Fence::default(),
    });
    (prompt, trust)
}

/// The trust of a session that reads this prompt: the requester's, lowered by every author whose
/// text it quotes (title, body, comments; fro-bot's own answers are its earlier runs of this
/// thread, recorded on the session already) and every prior-work session it quotes. What the
/// budget later cuts still counts: lower is the safe side.
fn session_trust(
    plan: &RunPlan,
    entity: Option<&prep::EntityContext>,
    prior: &prep::PriorWork,
    own_login: Option<&str>,
) -> SessionTrust {
    let own = |login: &str| {
        login == github::api::APP_BOT_LOGIN
            || own_login.is_some_and(|me| me.eq_ignore_ascii_case(login))
    };
    let mut trust = plan.requester.clone();
    if let Some(c) = entity {
        let authors = std::iter::once((&c.author, &c.author_association))
            .chain(c.comments.iter().map(|cm| (&cm.author, &cm.association)));
        for (author, association) in authors.filter(|(a, _)| !own(a)) {
            let bot = author.ends_with("[bot]");
            trust = trust.lowered_by(&SessionTrust::new(author, association, false, bot));
        }
    }
    for e in &prior.excerpts {
        trust = trust.lowered_by(&e.trust);
    }
    trust
}

/// Who posts the answer: the harness for a thread, the agent itself on token-holding runs.
fn response_rules(mode: ResponseMode, plan: &RunPlan) -> prep::ResponseRules {
    match (mode, plan.thread.is_some(), plan.acts_unattended) {
        (ResponseMode::None, _, _) => prep::ResponseRules::NoPosting,
        (ResponseMode::Github, true, _) => prep::ResponseRules::HarnessPosts,
        (ResponseMode::Github, false, true) => prep::ResponseRules::AgentActs,
        (ResponseMode::Github, false, false) => prep::ResponseRules::NoPosting,
    }
}

/// The turn's report into what the run produced, with the outcome in the log.
fn record_turn(report: &TurnReport, out: &mut AgentRun) {
    out.session_id = Some(report.session.id.clone());
    out.replaced = report.replaced.clone();
    out.errors.extend(report.errors.iter().cloned());
    out.answer = report
        .reply
        .as_ref()
        .map(|r| r.text.clone())
        .filter(|t| !t.trim().is_empty());
    out.tokens = Some(report.tokens.clone());
    out.cost = report.cost;
    out.tools = report.tools.clone();
    out.model = report.reply.as_ref().and_then(|r| r.model.clone());
    match &report.outcome {
        TurnOutcome::Completed => {
            tracing::info!("the agent finished ({} attempt(s))", report.attempts)
        }
        TurnOutcome::TimedOut => log::error("the agent's turn timed out and was aborted"),
        TurnOutcome::Capped { line } => log::error(&format!("the agent's turn {line}")),
        TurnOutcome::Cancelled => log::warning("the agent's turn was cancelled"),
        TurnOutcome::Failed(f) => log::error(&format!("the agent's turn failed: {f}")),
    }
    out.outcome = Some(report.outcome.clone());
}

/// The run recorded in the session itself, so later runs find it by search.
async fn writeback(agent: &Agent, inputs: &AgentInputs<'_>, report: TurnReport, errors: &[String]) {
    let env = inputs.env;
    let summary = opencode::writeback::RunSummary {
        event: inputs.plan.trigger_summary.clone(),
        repo: env.get(env::GITHUB_REPOSITORY).unwrap_or("").to_string(),
        git_ref: env.get(env::GITHUB_REF_NAME).unwrap_or("").to_string(),
        run_id: env.get(env::GITHUB_RUN_ID).unwrap_or("").to_string(),
        cache_status: inputs.restored.status.as_str().to_string(),
        session_id: report.session.id.clone(),
        logical_key: inputs.plan.logical_key.as_str().to_string(),
        duration: inputs.started.elapsed(),
        tokens: report.tokens,
        cost: report.cost,
        errors: errors.to_vec(),
    };
    if let Err(e) = agent.writeback(&summary).await {
        tracing::warn!("cannot write the run summary into the session: {e}");
    }
}
