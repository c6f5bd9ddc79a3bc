//! `fro-bot run` (and `fro-bot local`): the main step in its documented order —
//! config → routing → dedup → lease → acknowledge → restore → session prep → agent → finalize →
//! cleanup + save (always) → release.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache;
use crate::config::{AuthRequirement, ResponseMode, Settings};
use crate::github::{self, dedup, keys, route::RouteSettings, CacheKeys, Event, Route, RunPlan};
use crate::lease::{self, AcquireOutcome, Holder, Lease, LeaseConfig, LeaseHandle};
use crate::object_store::{self as store, ObjectStore, StoreKeys, StoreSettings};
use crate::opencode::{self, prep, Agent, AgentOptions, Isolation, TurnOptions, TurnOutcome};
use crate::phases::dedup::CacheSentinels;
use crate::phases::paths::StatePaths;
use crate::phases::project_identity::{self, IdentityOutcome};
use crate::phases::report::{LeaseReport, PersistenceReport, RestoreReport};
use crate::phases::restore::{restore, RestoreInputs, StoreAttempt};
use crate::phases::save::{save, SaveInputs};
use crate::runner::env::{self, output, state};
use crate::runner::{failpoint, log, now_ms, Cancellation, Env, FileCommands};
use crate::save_result::{GateInputs, StateValue, StorePublish};

/// The lease must have at least this long left when the session database is published.
const PUBLISH_MIN_REMAINING: Duration = Duration::from_secs(30);
/// Bounded wait for OpenCode to exit and its port to close.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub enum Mode {
    /// The container action's main step.
    Action,
    /// `fro-bot local`: a developer machine; `env` already carries the synthesized run.
    Local { thread: String, state_dir: PathBuf },
}

/// What `run` hands back to `main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunExit {
    pub code: u8,
    /// The agent's final answer, when there is one (printed by `fro-bot local`).
    pub answer: Option<String>,
}

impl RunExit {
    fn code(code: u8) -> Self {
        Self { code, answer: None }
    }
}

/// The store side of a run: client and key layout, plus the lease when held.
struct StoreContext {
    store: ObjectStore,
    keys: StoreKeys,
}

pub async fn run(env: Env, mode: Mode, cancel: Cancellation) -> RunExit {
    let started = Instant::now();
    let files = FileCommands::from_env(&env);
    // First thing: a run rejected by configuration, routing, dedup or a held lease makes post idle.
    set_state(&files, state::CACHE_SAVED, StateValue::Skipped.as_str());

    let auth = match mode {
        Mode::Action => AuthRequirement::Required,
        Mode::Local { .. } => AuthRequirement::Optional,
    };
    let settings = match Settings::from_env(&env, auth) {
        Ok(s) => s,
        Err(e) => {
            log::error(&format!("invalid configuration: {e}"));
            return RunExit::code(1);
        }
    };
    let store_settings = match settings
        .s3
        .as_ref()
        .map(|s3| StoreSettings::from_input(s3, &env))
        .transpose()
    {
        Ok(s) => s,
        Err(e) => {
            log::error(&format!("invalid configuration: {e}"));
            return RunExit::code(1);
        }
    };
    let Some(workspace) = env.get(env::GITHUB_WORKSPACE).map(PathBuf::from) else {
        log::error(
            "GITHUB_WORKSPACE is not set; the action must run inside a GitHub Actions workflow",
        );
        return RunExit::code(1);
    };
    let paths = match StatePaths::from_env(&env) {
        Ok(p) => p,
        Err(e) => {
            log::error(&e.to_string());
            return RunExit::code(1);
        }
    };

    // Routing.
    let event = match &mode {
        Mode::Action => match Event::from_env(&env) {
            Ok(e) => e,
            Err(e) => {
                log::error(&e.to_string());
                return RunExit::code(1);
            }
        },
        Mode::Local { .. } => Event::WorkflowDispatch { sender: None },
    };
    let identity = keys::invocation_identity(&env, settings.matrix_context.as_deref());
    let run_id = env.get(env::GITHUB_RUN_ID).unwrap_or("0").to_string();
    let route = github::route(
        &event,
        &RouteSettings {
            mention: &settings.mention,
            prompt_given: settings.prompt.is_some(),
            run_id: &run_id,
            identity: identity.as_deref(),
        },
    );
    let mut plan = match route {
        Route::Run(plan) => plan,
        Route::Skip(reason) => return skipped(&files, &reason.describe()),
    };
    if let Mode::Local { thread, .. } = &mode {
        plan.logical_key = keys::LogicalKey::local(thread);
    }
    let gh = github_client(&env, &settings, &mode);
    if plan.pull_request_unchecked {
        if let Some(gh) = &gh {
            match gh.check_pull_request(&plan).await {
                Ok(Some(reason)) => return skipped(&files, &reason.describe()),
                Ok(None) => {}
                Err(e) => tracing::warn!("cannot check the pull request (proceeding): {e}"),
            }
        }
    }
    let fork = event
        .target()
        .is_some_and(|t| t.fork == github::event::Flag::Yes);
    let store_settings = match store_settings {
        Some(_) if fork => {
            log::warning("the object store is disabled for pull requests from forks");
            None
        }
        other => other,
    };

    let keys = match CacheKeys::from_env(&env, identity.as_deref()) {
        Ok(k) => k,
        Err(e) => {
            log::error(&e.to_string());
            return RunExit::code(1);
        }
    };
    // Deliberately not cancelled by a signal: saving memory is what the cancel budget is for.
    let backend = match &mode {
        Mode::Action => cache::Backend::from_env(&env),
        Mode::Local { state_dir, .. } => Some(cache::Backend::Filesystem(cache::FsBackend::new(
            state_dir.join("cache"),
        ))),
    };
    let repository = env.get(env::GITHUB_REPOSITORY).unwrap_or("").to_string();

    // Dedup.
    let sentinels = backend.as_ref().map(|b| CacheSentinels {
        backend: b,
        file: paths
            .data_dir
            .parent()
            .unwrap_or(&paths.data_dir)
            .join("fro-bot-dedup/sentinel.json"),
        workspace: workspace.clone(),
    });
    if let (Some(s), Some(_)) = (&sentinels, plan.dedup) {
        match dedup::check(
            s,
            &event,
            &repository,
            &run_id,
            now_ms(),
            settings.dedup_window,
        )
        .await
        {
            Ok(dedup::DedupDecision::Skip { ran_at_ms, .. }) => {
                return skipped(
                    &files,
                    &format!(
                        "a run for this {} already succeeded {} s ago (dedup-window)",
                        plan.logical_key.as_str(),
                        now_ms().saturating_sub(ran_at_ms) / 1000
                    ),
                )
            }
            Ok(dedup::DedupDecision::Proceed(_)) => {}
            Err(e) => tracing::warn!("dedup check failed (proceeding): {e}"),
        }
    }

    // Lease.
    let mut report = PersistenceReport::default();
    let store_ctx = match &store_settings {
        Some(s) => match StoreKeys::for_repository(&s.prefix, &repository) {
            Ok(keys) => Some(StoreContext {
                store: ObjectStore::connect(s).await,
                keys,
            }),
            Err(e) => {
                log::error(&format!("invalid configuration: {e}"));
                return RunExit::code(1);
            }
        },
        None => None,
    };
    let mut lease_handle: Option<LeaseHandle> = None;
    if let Some(ctx) = &store_ctx {
        let holder = Holder {
            repo: repository.clone(),
            run_id: run_id.parse().unwrap_or(0),
            run_attempt: env
                .get(env::GITHUB_RUN_ATTEMPT)
                .and_then(|a| a.parse().ok())
                .unwrap_or(1),
            identity: identity.clone(),
        };
        match Lease::acquire(
            &ctx.store,
            ctx.keys.lease(),
            &holder,
            LeaseConfig::default(),
            Arc::new(lease::SystemClock),
        )
        .await
        {
            AcquireOutcome::Acquired(handle) => {
                report.lease = LeaseReport::Acquired {
                    generation: handle.generation(),
                };
                save_lease_state(&files, &handle);
                lease_handle = Some(handle);
            }
            AcquireOutcome::HeldByOther {
                holder_id,
                expires_at,
            } => {
                return skipped(
                    &files,
                    &format!(
                        "the repository's memory lease is held by {holder_id} (it expires in {} s unless renewed); another run is working on this repository's memory",
                        expires_at.saturating_sub(now_ms()) / 1000
                    ),
                );
            }
            AcquireOutcome::Error { error } => {
                log::warning(&format!(
                    "cannot acquire the memory lease ({error}); running without it: memory will not be published to the object store"
                ));
                report.lease = LeaseReport::Error {
                    message: error.to_string(),
                };
            }
        }
        report.store_publish = StorePublish::NotAttempted;
    }

    // Admitted: from here on, a main step killed anywhere makes post retry the save.
    set_state(
        &files,
        state::CACHE_SAVED,
        StateValue::NotPersisted.as_str(),
    );
    failpoint::hit("run:admitted");

    if let Some(gh) = &gh {
        if let Err(e) = gh.acknowledge(&plan).await {
            tracing::warn!("cannot add the 👀 reaction: {e}");
        }
    }

    // Restore.
    let t = Instant::now();
    let restore_keys = keys.restore_prefixes().to_vec();
    let restored = {
        let _g = log::Group::new("Restore memory");
        restore(
            RestoreInputs {
                paths: &paths,
                workspace: &workspace,
                skip_cache: settings.skip_cache,
                cache: backend.as_ref(),
                key: &keys.primary,
                restore_keys: &restore_keys,
            },
            store_attempt(store_ctx.as_ref(), &paths),
        )
        .await
    };
    tracing::info!(
        "memory: {} (source: {})",
        restored.status.as_str(),
        restored.source.as_str()
    );
    set_output(&files, output::CACHE_STATUS, restored.status.as_str());
    set_output(&files, output::LOGICAL_KEY, plan.logical_key.as_str());
    report.restore = Some(restored.clone());
    report.record_phase("restore", t.elapsed());
    match project_identity::align(&workspace, &paths.db()) {
        IdentityOutcome::Failed { message } => tracing::warn!("project identity: {message}"),
        IdentityOutcome::Written { id } => tracing::info!("project identity set to {id}"),
        IdentityOutcome::AlreadySet { .. }
        | IdentityOutcome::NoRestoredProject
        | IdentityOutcome::NotAGitCheckout => {}
    }

    // Session prep and the agent.
    let mut agent_run = AgentRun::default();
    let agent = start_agent(
        &env,
        &settings,
        &mode,
        &plan,
        &workspace,
        &paths,
        &mut report,
    )
    .await;
    let mut agent = match agent {
        Ok(a) => Some(a),
        Err(message) => {
            log::error(&format!("OpenCode could not start: {message}"));
            agent_run.errors.push(message);
            None
        }
    };
    if let Some(a) = &agent {
        let _g = log::Group::new("Agent");
        let t = Instant::now();
        let inputs = AgentInputs {
            settings: &settings,
            env: &env,
            plan: &plan,
            restored: &restored,
            gh: gh.as_ref(),
            cancel: &cancel,
            started,
        };
        drive_agent(a, &inputs, &mut agent_run).await;
        let prep = agent_run.prep_time;
        report.record_phase("session-prep", prep);
        report.record_phase("agent", t.elapsed().saturating_sub(prep));
    }
    if let Some(id) = &agent_run.session_id {
        set_output(&files, output::SESSION_ID, id);
    }

    // Finalize: the answer goes out before cleanup so a slow save never delays it.
    let succeeded = agent_run.outcome == Some(TurnOutcome::Completed);
    if !cancel.is_cancelled() {
        if let Some(gh) = &gh {
            finalize_github(gh, &settings, &env, &plan, &agent_run, &restored, started).await;
        }
    }

    // Cleanup (always; each step isolated). Under a signal the niceties wait until memory is safe.
    let t = Instant::now();
    let _g = log::Group::new("Save memory");
    let mut agent_still_running = false;
    let mut quiescent = true;
    if let Some(a) = &mut agent {
        if !cancel.is_cancelled() {
            if let Err(e) = a
                .prune(settings.session_retention as usize, &agent_run.protect())
                .await
            {
                tracing::warn!("pruning old sessions failed: {e}");
            }
        }
        agent_still_running = match a.is_busy(agent_run.session_id.as_deref()).await {
            Ok(busy) => busy,
            Err(e) => {
                tracing::debug!("session status unknown before shutdown: {e}");
                false
            }
        };
        let budget = cancel
            .remaining()
            .map(|r| (r / 3).min(SHUTDOWN_BUDGET))
            .unwrap_or(SHUTDOWN_BUDGET);
        match a.shutdown(budget).await {
            opencode::Quiescence::Confirmed => {}
            opencode::Quiescence::Unconfirmed { reason } => {
                log::warning(&format!("OpenCode did not confirm it stopped: {reason}"));
                quiescent = false;
            }
        }
    }
    drop(agent);
    failpoint::hit("run:after-shutdown");
    let lease_lost = lease_handle.as_ref().is_some_and(|h| h.lost().is_some());
    if let Some(handle) = &lease_handle {
        // Renewals changed the ETag since acquisition: post needs the current one to release.
        save_lease_state(&files, handle);
    }
    let save_key = keys.save_key();
    let save_report = within_budget(
        &cancel,
        save(
            SaveInputs {
                paths: &paths,
                workspace: &workspace,
                skip_cache: settings.skip_cache,
                gate: GateInputs {
                    agent_still_running,
                    server_quiescent: quiescent,
                    lease_lost,
                },
                cache: backend.as_ref(),
                save_key: &save_key,
                run_id: &run_id,
                now_ms: now_ms(),
            },
            || {
                publish(
                    store_ctx.as_ref(),
                    lease_handle.as_ref(),
                    &paths,
                    restored.store_etag.as_deref(),
                )
            },
        ),
    )
    .await;
    let Some(save_report) = save_report else {
        // Out of time: the state still says not-persisted, so the post step retries.
        log::warning("memory: not saved before the cancel deadline; the post step retries");
        return RunExit::code(1);
    };
    failpoint::hit("run:after-save");
    let state_value = save_report.result.state_value();
    set_state(&files, state::CACHE_SAVED, state_value.as_str());
    set_output(&files, output::CACHE_SAVE_RESULT, state_value.as_str());
    match state_value {
        StateValue::Durable | StateValue::Skipped => {
            tracing::info!("memory: {state_value} — {}", save_report.result.detail)
        }
        StateValue::StoreOnly | StateValue::DeclinedForSafety | StateValue::NotPersisted => {
            log::warning(&format!(
                "memory: {state_value} ({}): {}",
                save_report.result.outcome, save_report.result.detail
            ))
        }
    }
    report.store_publish = match (&store_ctx, save_report.store_publish) {
        (None, _) => StorePublish::Disabled,
        (Some(_), p) => p,
    };
    report.checkpoint = save_report.checkpoint;
    report.save = Some(save_report.result);
    report.record_phase("save", t.elapsed());
    drop(_g);

    // Niceties: run records, the lease, the dedup sentinel.
    if let Some(ctx) = &store_ctx {
        upload_run_records(ctx, &keys, &paths, &plan, &report, &agent_run).await;
    }
    if let Some(handle) = lease_handle {
        match handle.release().await {
            lease::ReleaseOutcome::Released => {
                set_state(&files, state::LEASE_KEY, "");
                set_state(&files, state::LEASE_ETAG, "");
            }
            lease::ReleaseOutcome::NotHeld => {}
            lease::ReleaseOutcome::Failed { error } => {
                tracing::warn!("cannot release the memory lease: {error}")
            }
        }
    }
    if succeeded {
        if let (Some(s), Some(_)) = (&sentinels, plan.dedup) {
            let attempt = env.get(env::GITHUB_RUN_ATTEMPT).unwrap_or("1");
            if let Err(e) = dedup::record(
                s,
                &event,
                &repository,
                &run_id,
                attempt,
                Some(plan.logical_key.as_str()),
                now_ms(),
            )
            .await
            {
                tracing::warn!("cannot record the dedup sentinel: {e}");
            }
        }
    }

    let duration = started.elapsed();
    set_output(&files, output::DURATION, &duration.as_secs().to_string());
    write_summary(&files, &plan, &agent_run, &report, duration);
    RunExit {
        code: if succeeded { 0 } else { 1 },
        answer: agent_run.answer,
    }
}

/// Runs `fut` to completion, unless the run is cancelled and the runner's kill deadline passes
/// first (then `None`): a signal must not abort the save, but the save must not outlive the kill.
async fn within_budget<T>(
    cancel: &Cancellation,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    let deadline = async {
        cancel.cancelled().await;
        match cancel.deadline() {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        out = fut => Some(out),
        () = deadline => None,
    }
}

/// What the agent part of the run produced.
#[derive(Debug, Default)]
struct AgentRun {
    session_id: Option<String>,
    replaced: Option<String>,
    outcome: Option<TurnOutcome>,
    answer: Option<String>,
    tokens: Option<opencode::client::Tokens>,
    cost: f64,
    errors: Vec<String>,
    /// Session resolution, context and prior-work search, prompt building.
    prep_time: Duration,
}

impl AgentRun {
    fn protect(&self) -> Vec<&str> {
        self.session_id.iter().map(String::as_str).collect()
    }

    fn outcome_text(&self) -> String {
        match &self.outcome {
            None => "not run".into(),
            Some(TurnOutcome::Completed) => "completed".into(),
            Some(TurnOutcome::TimedOut) => "timed out".into(),
            Some(TurnOutcome::Cancelled) => "cancelled".into(),
            Some(TurnOutcome::Failed(f)) => format!("failed: {f}"),
        }
    }
}

fn github_client(env: &Env, settings: &Settings, mode: &Mode) -> Option<github::GitHub> {
    let token = settings.github_token.as_ref()?;
    if matches!(mode, Mode::Local { .. }) && env.get(env::GITHUB_API_URL).is_none() {
        // Local runs make no GitHub calls unless pointed at an API on purpose.
        return None;
    }
    match github::GitHub::from_env(env, token) {
        Ok(gh) => Some(gh),
        Err(e) => {
            tracing::warn!("GitHub API unavailable: {e}");
            None
        }
    }
}

async fn store_attempt(ctx: Option<&StoreContext>, paths: &StatePaths) -> StoreAttempt {
    let Some(ctx) = ctx else {
        return StoreAttempt::Disabled;
    };
    if let Err(e) = std::fs::create_dir_all(&paths.data_dir) {
        return StoreAttempt::Failed {
            message: format!("cannot create {}: {e}", paths.data_dir.display()),
        };
    }
    match store::sync::restore_session_db(&ctx.store, &ctx.keys, &paths.data_dir).await {
        store::StoreRestore::Hit { etag, .. } => StoreAttempt::Hit { etag },
        store::StoreRestore::Miss => StoreAttempt::Miss,
        store::StoreRestore::Failed { error } => StoreAttempt::Failed {
            message: error.to_string(),
        },
    }
}

/// Publishes the session database if this run may: store enabled, lease held and not lost with
/// time to spare; conditional on the ETag seen at restore.
async fn publish(
    ctx: Option<&StoreContext>,
    lease: Option<&LeaseHandle>,
    paths: &StatePaths,
    expected_etag: Option<&str>,
) -> StorePublish {
    let Some(ctx) = ctx else {
        return StorePublish::Disabled;
    };
    let Some(lease) = lease else {
        return StorePublish::WithheldNoLease;
    };
    match lease.publish_gate(PUBLISH_MIN_REMAINING) {
        lease::PublishGate::Open { .. } => {}
        other => {
            return StorePublish::Failed {
                message: format!("lease does not allow publishing: {other:?}"),
            }
        }
    }
    failpoint::hit("save:before-publish");
    match store::sync::publish_session_db(&ctx.store, &ctx.keys, &paths.db(), expected_etag).await {
        store::PublishOutcome::Published { .. } => StorePublish::Published,
        store::PublishOutcome::Conflict => {
            log::warning(
                "another run published newer memory to the object store; not overwriting it",
            );
            StorePublish::Conflict
        }
        store::PublishOutcome::Failed { error } => {
            log::warning(&format!(
                "publishing memory to the object store failed: {error}"
            ));
            StorePublish::Failed {
                message: error.to_string(),
            }
        }
    }
}

async fn start_agent(
    env: &Env,
    settings: &Settings,
    mode: &Mode,
    plan: &RunPlan,
    workspace: &Path,
    paths: &StatePaths,
    report: &mut PersistenceReport,
) -> Result<Agent, String> {
    let t = Instant::now();
    let home = PathBuf::from(env.get(env::HOME).unwrap_or("/github/home"));
    let cache_dir = match mode {
        Mode::Local { state_dir, .. } => state_dir.join("opencode-install"),
        Mode::Action => home.join(".cache/fro-bot"),
    };
    let located = opencode::locate::locate(env, &settings.opencode_version, &cache_dir)
        .await
        .map_err(|e| e.to_string())?;
    let data_home = paths
        .data_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.join(".local/share"));
    let dirs = Isolation {
        home: home.clone(),
        data_home,
        config_home: env
            .get(env::XDG_CONFIG_HOME)
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".config")),
        cache_home: env
            .get(env::XDG_CACHE_HOME)
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".cache")),
        state_home: env
            .get(env::XDG_STATE_HOME)
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".local/state")),
    };
    let mut extra_env = Vec::new();
    if plan.agent_gets_token {
        if let Some(token) = &settings.github_token {
            extra_env.push(("GH_TOKEN".to_string(), token.expose().to_string()));
        }
    }
    let log_dir = env
        .get(env::RUNNER_TEMP)
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let agent = Agent::start(AgentOptions {
        opencode: located.path().to_path_buf(),
        opencode_version: settings.opencode_version.clone(),
        workspace: workspace.to_path_buf(),
        dirs,
        base_env: env.clone(),
        extra_env,
        fro_bot_exe: std::env::current_exe().ok(),
        model: settings.model.clone(),
        user_config: settings.opencode_config.clone(),
        auth: settings.auth.clone(),
        log_file: log_dir.join("fro-bot-opencode-server.log"),
        startup_deadline: Duration::from_secs(60),
        now_ms: opencode::system_now_ms,
    })
    .await
    .map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        text
    })?;
    report.record_phase("opencode-start", t.elapsed());
    Ok(agent)
}

/// What the agent part of the run reads.
struct AgentInputs<'a> {
    settings: &'a Settings,
    env: &'a Env,
    plan: &'a RunPlan,
    restored: &'a RestoreReport,
    gh: Option<&'a github::GitHub>,
    cancel: &'a Cancellation,
    started: Instant,
}

/// Resolves the session, prepares the prompt (context, prior work), runs the turn and writes the
/// run summary back into the session.
async fn drive_agent(agent: &Agent, inputs: &AgentInputs<'_>, out: &mut AgentRun) {
    let AgentInputs {
        settings,
        env,
        plan,
        restored,
        gh,
        cancel,
        started,
    } = *inputs;
    let started_prep = Instant::now();
    let resolved = match agent.resolve_session(plan.logical_key.as_str()).await {
        Ok(r) => r,
        Err(e) => {
            out.errors.push(format!("cannot resolve the session: {e}"));
            log::error(&format!("cannot resolve the session: {e}"));
            out.outcome = Some(TurnOutcome::Failed(opencode::TurnFailure::Api {
                message: e.to_string(),
            }));
            return;
        }
    };
    tracing::info!(
        "session {} ({:?}) for {}",
        resolved.session.id,
        resolved.resolution,
        plan.logical_key.as_str()
    );
    out.session_id = Some(resolved.session.id.clone());

    // Context from GitHub (bounded), then prior work from other sessions.
    let context = match (gh, &plan.thread) {
        (Some(gh), Some(thread)) => match gh
            .fetch_context(thread, github::context::ContextLimits::default())
            .await
        {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!("cannot fetch the issue/PR context: {e}");
                None
            }
        },
        _ => None,
    };
    let title = context.as_ref().map(|c| c.title.clone());
    let terms = prep::search_terms(plan.logical_key.as_str(), title.as_deref());
    let prior = match agent
        .prior_work(&terms, &[resolved.session.id.as_str()])
        .await
    {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("prior-work search failed: {e}");
            Vec::new()
        }
    };
    let entity = context.map(|c| prep::EntityContext {
        kind: c.kind.as_str().replace('_', " "),
        number: c.number,
        title: c.title,
        body: c.body,
        author: String::new(),
        comments: c
            .comments
            .into_iter()
            .map(|cm| prep::CommentContext {
                author: cm.author,
                body: cm.body,
            })
            .collect(),
        trigger: None,
    });
    let schedule_like = plan.thread.is_none();
    let rules = match (
        settings.response_mode,
        plan.thread.is_some(),
        plan.agent_gets_token,
    ) {
        (ResponseMode::None, _, _) => prep::ResponseRules::NoPosting,
        (ResponseMode::Github, true, _) => prep::ResponseRules::HarnessPosts,
        (ResponseMode::Github, false, true) => prep::ResponseRules::AgentActs,
        (ResponseMode::Github, false, false) => prep::ResponseRules::NoPosting,
    };
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
        prior_work: prior,
        directive: plan.directive.clone(),
        prompt: settings.prompt.clone(),
        prompt_replaces_directive: schedule_like,
        rules,
        budget: 0,
    });

    out.prep_time = started_prep.elapsed();
    let opts = TurnOptions {
        timeout: settings.timeout,
        agent: settings.agent.clone(),
        model: settings.model.as_ref().map(Into::into),
        ..TurnOptions::default()
    };
    let report = agent
        .run_turn(resolved.session, &prompt, &opts, cancel)
        .await;
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
    match &report.outcome {
        TurnOutcome::Completed => {
            tracing::info!("the agent finished ({} attempt(s))", report.attempts)
        }
        TurnOutcome::TimedOut => log::error("the agent's turn timed out and was aborted"),
        TurnOutcome::Cancelled => log::warning("the agent's turn was cancelled"),
        TurnOutcome::Failed(f) => log::error(&format!("the agent's turn failed: {f}")),
    }
    out.outcome = Some(report.outcome);

    // Writeback: the run recorded in the session itself, so later runs find it by search.
    let summary = opencode::writeback::RunSummary {
        event: plan.trigger_summary.clone(),
        repo: env.get(env::GITHUB_REPOSITORY).unwrap_or("").to_string(),
        git_ref: env.get(env::GITHUB_REF_NAME).unwrap_or("").to_string(),
        run_id: env.get(env::GITHUB_RUN_ID).unwrap_or("").to_string(),
        cache_status: restored.status.as_str().to_string(),
        session_id: report.session.id.clone(),
        logical_key: plan.logical_key.as_str().to_string(),
        duration: started.elapsed(),
        tokens: report.tokens,
        cost: report.cost,
        errors: out.errors.clone(),
    };
    if !cancel.is_cancelled() {
        if let Err(e) = agent.writeback(&summary).await {
            tracing::warn!("cannot write the run summary into the session: {e}");
        }
    }
}

async fn finalize_github(
    gh: &github::GitHub,
    settings: &Settings,
    env: &Env,
    plan: &RunPlan,
    agent_run: &AgentRun,
    restored: &RestoreReport,
    started: Instant,
) {
    let succeeded = agent_run.outcome == Some(TurnOutcome::Completed);
    // A failed run still answers once, so the person who asked is not left waiting in silence.
    let failure = (!succeeded && agent_run.answer.is_none()).then(|| {
        format!(
            "I could not finish this one: the agent {}. The run log has the details; mention me again to retry.",
            agent_run.outcome_text()
        )
    });
    if let Some(answer) = agent_run.answer.as_ref().or(failure.as_ref()) {
        let footer = github::response::RunFooter {
            run_url: github::response::run_url(env),
            session_id: agent_run.session_id.clone(),
            cache_status: Some(restored.status.as_str().to_string()),
            logical_key: Some(plan.logical_key.as_str().to_string()),
            duration_secs: Some(started.elapsed().as_secs()),
        };
        if let Err(e) = gh
            .respond(
                settings.response_mode,
                plan.thread.as_ref(),
                answer,
                &footer,
            )
            .await
        {
            log::warning(&format!("cannot post the response comment: {e}"));
        }
    }
    if let Err(e) = gh.conclude(plan, succeeded).await {
        tracing::warn!("cannot add the completion reaction: {e}");
    }
}

async fn upload_run_records(
    ctx: &StoreContext,
    keys: &CacheKeys,
    paths: &StatePaths,
    plan: &RunPlan,
    report: &PersistenceReport,
    agent_run: &AgentRun,
) {
    let run_key = keys.run_key();
    let metadata = serde_json::json!({
        "run_key": run_key,
        "logical_key": plan.logical_key.as_str(),
        "session_id": agent_run.session_id,
        "outcome": agent_run.outcome_text(),
        "cache_status": report.restore.as_ref().map(|r| r.status.as_str()),
        "save_result": report.save.as_ref().map(|s| s.state_value().as_str()),
        "save_outcome": report.save.as_ref().map(|s| s.outcome.as_str()),
        "store_publish": report.store_publish.describe(),
        "lease": report.lease.describe(),
        "at_ms": now_ms(),
    });
    if let store::UploadOutcome::Failed { error } =
        store::sync::upload_run_metadata(&ctx.store, &ctx.keys, &run_key, &metadata).await
    {
        tracing::warn!("cannot upload the run record: {error}");
    }
    // OpenCode's own logs may quote configuration or provider errors: only redacted copies leave
    // the machine.
    let redacted = match redacted_copy(&paths.data_dir.join("log")) {
        Ok(Some(dir)) => dir,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("cannot prepare OpenCode's logs for upload: {e}");
            return;
        }
    };
    if let store::ArtifactsOutcome::Failed { .. } =
        store::sync::upload_run_artifacts(&ctx.store, &ctx.keys, &run_key, redacted.path()).await
    {
        tracing::warn!("some OpenCode logs could not be uploaded");
    }
}

/// Largest log file copied for upload; OpenCode's logs are small, a runaway one is cut.
const MAX_LOG_BYTES: u64 = 8 * 1024 * 1024;

/// A temp copy of the regular files in `dir` with every registered secret replaced by `***`.
fn redacted_copy(dir: &Path) -> std::io::Result<Option<tempfile::TempDir>> {
    use std::io::Read as _;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let out = tempfile::tempdir()?;
    for entry in entries {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let mut text = Vec::new();
        std::fs::File::open(entry.path())?
            .take(MAX_LOG_BYTES)
            .read_to_end(&mut text)?;
        let clean = log::redact(&String::from_utf8_lossy(&text));
        std::fs::write(out.path().join(entry.file_name()), clean)?;
    }
    Ok(Some(out))
}

fn save_lease_state(files: &FileCommands, handle: &LeaseHandle) {
    let (key, etag) = handle.state_for_post();
    set_state(files, state::LEASE_KEY, &key);
    set_state(files, state::LEASE_ETAG, &etag);
}

fn set_state(files: &FileCommands, name: &str, value: &str) {
    if let Err(e) = files.save_state(name, value) {
        tracing::warn!("{e}");
    }
}

fn set_output(files: &FileCommands, name: &str, value: &str) {
    if let Err(e) = files.set_output(name, value) {
        tracing::warn!("{e}");
    }
}

fn skipped(files: &FileCommands, reason: &str) -> RunExit {
    tracing::info!("skipped: {reason}");
    let text = format!("### fro-bot\n\nSkipped: {}\n\n", reason.replace('\n', " "));
    if let Err(e) = files.append_summary(&text) {
        tracing::warn!("{e}");
    }
    set_output(
        files,
        output::CACHE_SAVE_RESULT,
        StateValue::Skipped.as_str(),
    );
    RunExit::code(0)
}

fn write_summary(
    files: &FileCommands,
    plan: &RunPlan,
    agent_run: &AgentRun,
    report: &PersistenceReport,
    duration: Duration,
) {
    let rows = vec![
        vec!["Trigger".to_string(), plan.trigger_summary.clone()],
        vec![
            "Conversation".into(),
            format!("`{}`", plan.logical_key.as_str()),
        ],
        vec![
            "Session".into(),
            agent_run
                .session_id
                .clone()
                .unwrap_or_else(|| "none".into()),
        ],
        vec!["Agent".into(), agent_run.outcome_text()],
        vec![
            "Tokens / cost".into(),
            match &agent_run.tokens {
                Some(t) => format!("{} in, {} out / ${:.4}", t.input, t.output, agent_run.cost),
                None => "n/a".into(),
            },
        ],
        vec!["Duration".into(), format!("{:.1}s", duration.as_secs_f64())],
    ];
    let mut md = format!(
        "### fro-bot run\n\n{}\n",
        crate::runner::summary::table(&["", ""], &rows)
    );
    md.push_str(&report.to_markdown("Session Persistence"));
    if let Err(e) = files.append_summary(&md) {
        tracing::warn!("{e}");
    }
    if files.summary.is_none() {
        // Local runs: the summary goes to the terminal.
        println!("\n{md}");
    }
}
