//! `fro-bot run` (and `fro-bot local`): the main step in its documented order —
//! config → routing → dedup → lease → acknowledge → restore → session prep → agent → finalize →
//! cleanup + save (always) → release.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache;
use crate::config::{AuthRequirement, Settings};
use crate::github::{self, dedup, keys, route::RouteSettings, CacheKeys, Event, Route};
use crate::lease::{self, AcquireOutcome, Holder, Lease, LeaseConfig, LeaseHandle};
use crate::object_store::{self as store, ObjectStore, StoreKeys, StoreSettings};
use crate::opencode::{self, TurnOutcome};
use crate::phases::agent::{drive_agent, start_agent, AgentInputs, AgentRun};
use crate::phases::dedup::CacheSentinels;
use crate::phases::finalize::{finalize_github, upload_run_records, write_summary};
use crate::phases::paths::StatePaths;
use crate::phases::project_identity::{self, IdentityOutcome};
use crate::phases::report::{LeaseReport, PersistenceReport};
use crate::phases::restore::{restore, RestoreInputs, StoreAttempt};
use crate::phases::save::{save, SaveInputs};
use crate::runner::env::{self, output, state};
use crate::runner::{failpoint, log, now_ms, Cancellation, Env, FileCommands};
use crate::save_result::{GateInputs, StateValue, StorePublish};

/// The lease must have at least this long left when the session database is published.
const PUBLISH_MIN_REMAINING: Duration = Duration::from_secs(30);
/// Bounded wait for OpenCode to exit and its port to close.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(5);
/// Even under a signal, OpenCode gets this long to exit before it is killed.
const SHUTDOWN_FLOOR: Duration = Duration::from_millis(1500);
/// How long the work this run started gets to stop after an abort, before the gate looks.
const ABORT_GRACE: Duration = Duration::from_secs(2);

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
pub(crate) struct StoreContext {
    pub(crate) store: ObjectStore,
    pub(crate) keys: StoreKeys,
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
    let repository = env.get(env::GITHUB_REPOSITORY).unwrap_or("").to_string();
    // The store's settings and key layout are configuration too: checked before anything runs.
    let store_settings = match settings
        .s3
        .as_ref()
        .map(|s3| {
            let validated = StoreSettings::from_input(s3, &env)?;
            let keys = StoreKeys::for_repository(&validated.prefix, &repository)?;
            Ok::<_, crate::object_store::ValidationError>((validated, keys))
        })
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
    if let Some(gh) = &gh {
        match gh.check_self_trigger(&plan).await {
            Ok(Some(reason)) => return skipped(&files, &reason.describe()),
            Ok(None) => {}
            // The response marker still stops fro-bot's own comments.
            Err(e) => tracing::warn!("cannot look up the token's identity (proceeding): {e}"),
        }
    }
    if let Some(reason) = unverified_pull_request(gh.as_ref(), &plan).await {
        return skipped(&files, &reason.describe());
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
    let store_ctx = match store_settings {
        Some((settings, keys)) => Some(StoreContext {
            store: ObjectStore::connect(&settings).await,
            keys,
        }),
        None => None,
    };
    let mut lease_handle: Option<LeaseHandle> = None;
    let mut etag_watch: Option<tokio::task::JoinHandle<()>> = None;
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
                etag_watch = Some(watch_lease_etag(files.clone(), handle.etag_source()));
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
    // Under a signal there is no agent to start: go straight to saving what was restored.
    let agent = if cancel.is_cancelled() {
        Err("cancelled before the agent started".to_string())
    } else {
        start_agent(
            &env,
            &settings,
            &mode,
            &plan,
            &workspace,
            &paths,
            &mut report,
        )
        .await
    };
    let mut agent = match agent {
        Ok(a) => Some(a),
        Err(message) => {
            match cancel.is_cancelled() {
                true => log::warning(&format!("the agent did not run: {message}")),
                false => log::error(&format!("OpenCode could not start: {message}")),
            }
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
        agent_still_running = stop_agent_work(a, agent_run.session_id.as_deref()).await;
        let budget = cancel
            .remaining()
            .map(|r| (r / 3).clamp(SHUTDOWN_FLOOR, SHUTDOWN_BUDGET))
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
        let text = "memory: not saved before the cancel deadline; the post step retries";
        log::warning(text);
        set_output(
            &files,
            output::DURATION,
            &started.elapsed().as_secs().to_string(),
        );
        if let Err(e) = files.append_summary(&format!("### Session Persistence\n\n{text}.\n\n")) {
            tracing::warn!("{e}");
        }
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
    report.scrub = save_report.scrub;
    report.save = Some(save_report.result);
    report.record_phase("save", t.elapsed());
    drop(_g);

    // What the user reads comes next; the niceties after it, each within what is left of a cancel
    // budget (a lease left behind is post's to release).
    let duration = started.elapsed();
    set_output(&files, output::DURATION, &duration.as_secs().to_string());
    write_summary(&files, &plan, &agent_run, &report, duration);

    if let Some(ctx) = &store_ctx {
        let upload = upload_run_records(ctx, &keys, &paths, &plan, &report, &agent_run);
        if within_budget(&cancel, upload).await.is_none() {
            tracing::warn!("run records not uploaded before the cancel deadline");
        }
    }
    if let Some(watch) = etag_watch {
        watch.abort();
    }
    if let Some(handle) = lease_handle {
        match within_budget(&cancel, handle.release()).await {
            Some(lease::ReleaseOutcome::Released) => {
                set_state(&files, state::LEASE_KEY, "");
                set_state(&files, state::LEASE_ETAG, "");
            }
            Some(lease::ReleaseOutcome::NotHeld) => {}
            Some(lease::ReleaseOutcome::Failed { error }) => {
                tracing::warn!("cannot release the memory lease: {error}")
            }
            None => tracing::warn!("the memory lease was not released before the cancel deadline"),
        }
    }
    if succeeded {
        if let (Some(s), Some(_)) = (&sentinels, plan.dedup) {
            let attempt = env.get(env::GITHUB_RUN_ATTEMPT).unwrap_or("1");
            let record = dedup::record(
                s,
                &event,
                &repository,
                &run_id,
                attempt,
                Some(plan.logical_key.as_str()),
                now_ms(),
            );
            match within_budget(&cancel, record).await {
                Some(Ok(_)) | None => {}
                Some(Err(e)) => tracing::warn!("cannot record the dedup sentinel: {e}"),
            }
        }
    }

    RunExit {
        code: if succeeded { 0 } else { 1 },
        answer: agent_run.answer,
    }
}

/// A pull request whose fork/draft state the payload left open and the API cannot settle (no
/// token, an error) is not run: unknown provenance fails closed.
async fn unverified_pull_request(
    gh: Option<&github::GitHub>,
    plan: &github::RunPlan,
) -> Option<github::route::SkipReason> {
    let number = plan.thread.as_ref().map_or(0, |t| t.number);
    if !plan.pull_request_unchecked {
        return None;
    }
    let Some(gh) = gh else {
        return Some(github::route::SkipReason::UnverifiedPullRequest {
            number,
            why: "no GitHub token to look it up".into(),
        });
    };
    match gh.check_pull_request(plan).await {
        Ok(reason) => reason,
        Err(e) => Some(github::route::SkipReason::UnverifiedPullRequest {
            number,
            why: e.to_string(),
        }),
    }
}

/// Stops whatever this run's session is still doing (a turn that ended on an API error can leave it
/// busy), then reports whether it is *still* busy: the safety gate's first question.
async fn stop_agent_work(agent: &opencode::Agent, session: Option<&str>) -> bool {
    if !is_busy(agent, session).await {
        return false;
    }
    if let Some(id) = session {
        if let Err(e) = agent.client().abort(id).await {
            tracing::warn!("cannot abort the agent's session: {e}");
        }
    }
    let until = std::time::Instant::now() + ABORT_GRACE;
    loop {
        if !is_busy(agent, session).await {
            return false;
        }
        if std::time::Instant::now() >= until {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Busy or not, asked with a short deadline (an unanswered question counts as not busy: the
/// shutdown that follows is what confirms nothing writes any more).
async fn is_busy(agent: &opencode::Agent, session: Option<&str>) -> bool {
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

/// Keeps post's copy of the lease ETag current: renewals replace it, and a main step killed
/// mid-run must leave post the ETag that releases the lease.
fn watch_lease_etag(files: FileCommands, source: lease::EtagSource) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut seen = source.current();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = source.current();
            if now != seen {
                set_state(&files, state::LEASE_ETAG, &now);
                seen = now;
            }
        }
    })
}

/// Runs `fut` to completion, unless the run is cancelled and the runner's kill deadline passes
/// first (then `None`): a signal must not abort the save, but the save must not outlive the kill.
async fn within_budget<T>(
    cancel: &Cancellation,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    let deadline = async {
        cancel.cancelled().await;
        // Re-read every 100 ms: a SIGTERM after the SIGINT shortens what is left.
        while let Some(d) = cancel.deadline() {
            if std::time::Instant::now() >= d {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        out = fut => Some(out),
        () = deadline => None,
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
    let mut gate = lease.publish_gate(PUBLISH_MIN_REMAINING);
    if let lease::PublishGate::TooLittleTime { .. } = gate {
        // A renewal may buy the time; it never revives a lease that already expired.
        lease.renew_now().await;
        gate = lease.publish_gate(PUBLISH_MIN_REMAINING);
    }
    let reason = match gate {
        lease::PublishGate::Open { .. } => None,
        lease::PublishGate::Lost(why) => Some(format!("the lease was lost: {why:?}")),
        lease::PublishGate::Released => Some("the lease was already released".to_string()),
        lease::PublishGate::TooLittleTime { remaining_ms } => Some(format!(
            "the lease has only {remaining_ms} ms left, too little to upload"
        )),
    };
    if let Some(reason) = reason {
        log::warning(&format!(
            "memory not published to the object store: {reason}"
        ));
        return StorePublish::Withheld { reason };
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
