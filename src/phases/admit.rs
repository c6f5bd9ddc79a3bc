//! Admission: configuration → routing → the self-trigger and pull request checks → dedup, and the
//! store's client (the lease waits for the publish). Either a run is admitted (what admission
//! fixed, `Admitted`, and memory's `Ledger` as it starts), or it is skipped with a reason, or the
//! setup is invalid (`SetupError`, exit 1 before anything is touched). See `docs/design.md` for the
//! routing rules.

use std::path::PathBuf;

use crate::cache;
use crate::config::{AuthRequirement, ConfigError, Settings};
use crate::github::{self, dedup, keys, route::RouteSettings, CacheKeys, Event, Route, RunPlan};
use crate::lease::Holder;
use crate::memory::ledger::{CacheSaved, Ledger, StoreContext};
use crate::memory::save_result::StorePublish;
use crate::memory::state_paths::{PathsError, StatePaths};
use crate::object_store::{ObjectStore, StoreKeys, StoreSettings, ValidationError};
use crate::phases::run_context::{Admitted, Mode};
use crate::runner::env;
use crate::runner::{log, now_ms, Cancellation, Env, FileCommands};

/// Why a run could not even be set up: each names what is wrong.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    #[error("invalid configuration: {source}")]
    Config {
        #[source]
        source: ConfigError,
    },
    #[error("invalid configuration: {source}")]
    Store {
        #[source]
        source: ValidationError,
    },
    #[error(
        "{var} is not set; the action must run inside a GitHub Actions workflow",
        var = env::GITHUB_WORKSPACE
    )]
    NoWorkspace,
    #[error("{source}")]
    Paths {
        #[source]
        source: PathsError,
    },
    #[error("{source}")]
    Event {
        #[source]
        source: github::event::EventError,
    },
    #[error("{source}")]
    Keys {
        #[source]
        source: keys::KeyError,
    },
}

pub(crate) enum Admission {
    /// What admission fixed, and memory's ledger as it starts.
    Run(Box<(Admitted, Ledger)>),
    Skip {
        reason: String,
    },
}

/// What the environment and inputs say, before anything is asked of GitHub or a store.
struct Setup {
    settings: Settings,
    store: Option<(StoreSettings, StoreKeys)>,
    workspace: PathBuf,
    paths: StatePaths,
    event: Event,
    repository: String,
    run_id: String,
    identity: Option<String>,
}

pub(crate) async fn admit(
    env: Env,
    mode: Mode,
    (files, cache_saved): (FileCommands, CacheSaved),
    cancel: Cancellation,
) -> Result<Admission, SetupError> {
    let started = std::time::Instant::now();
    let setup = configure(&env, &mode)?;
    let plan = match route_event(&setup, &mode) {
        Route::Run(plan) => plan,
        Route::Skip(reason) => return Ok(skip(reason.describe())),
    };
    let gh = github_client(&env, &setup.settings, &mode);
    if let Some(reason) = check_self_trigger(gh.as_ref(), &plan).await {
        return Ok(skip(reason));
    }
    if let Some(reason) = check_pull_request(gh.as_ref(), &plan).await {
        return Ok(skip(reason));
    }
    if let Some(reason) = check_unverified(gh.as_ref(), &plan).await {
        return Ok(skip(reason));
    }
    let fork = setup
        .event
        .target()
        .is_some_and(|t| t.fork == github::event::Flag::Yes);
    let store_settings = match setup.store {
        Some(_) if fork => {
            log::warning("the object store is disabled for pull requests from forks");
            None
        }
        other => other,
    };
    let keys = CacheKeys::from_env(&env, setup.identity.as_deref())
        .map_err(|source| SetupError::Keys { source })?;
    // Deliberately not cancelled by a signal: saving memory is what the cancel budget is for.
    let cache = match &mode {
        Mode::Action => cache::Backend::from_env(&env),
        Mode::Local { state_dir, .. } => Some(cache::Backend::Filesystem(cache::FsBackend::new(
            state_dir.join("cache"),
        ))),
    };
    let lease_holder = lease_holder(&env, &setup.repository, &setup.run_id, setup.identity);
    let spend = crate::confine::spend::Meter::new(setup.settings.spend_cap);
    let mut ctx = Admitted {
        spend,
        env,
        mode,
        settings: setup.settings,
        files,
        cancel,
        started,
        workspace: setup.workspace,
        paths: setup.paths,
        repository: setup.repository,
        run_id: setup.run_id,
        event: setup.event,
        plan,
        keys,
        gh,
        cache,
        store: None,
        lease_holder,
    };
    let mut ledger = Ledger::new(cache_saved);
    if let Some(reason) = check_dedup(&ctx).await {
        return Ok(skip(reason));
    }
    if let Some((settings, keys)) = store_settings {
        // No lease yet: it guards only the publish section, so runs never skip each other.
        ctx.store = Some(StoreContext {
            store: ObjectStore::connect(&settings).await,
            keys,
        });
        ledger.report.store_publish = StorePublish::NotAttempted;
    }
    Ok(Admission::Run(Box::new((ctx, ledger))))
}

fn skip(reason: String) -> Admission {
    Admission::Skip { reason }
}

/// Every input, the store's settings and key layout, the workspace, the state paths and the event:
/// all checked before anything runs.
fn configure(env: &Env, mode: &Mode) -> Result<Setup, SetupError> {
    let auth = match mode {
        Mode::Action => AuthRequirement::Required,
        Mode::Local { .. } => AuthRequirement::Optional,
    };
    let settings = Settings::from_env(env, auth).map_err(|source| SetupError::Config { source })?;
    let repository = env.get(env::GITHUB_REPOSITORY).unwrap_or("").to_string();
    let store = settings
        .s3
        .as_ref()
        .map(|s3| {
            let validated = StoreSettings::from_input(s3, env)?;
            let keys = StoreKeys::for_repository(&validated.prefix, &repository)?;
            Ok((validated, keys))
        })
        .transpose()
        .map_err(|source| SetupError::Store { source })?;
    let workspace = env
        .get(env::GITHUB_WORKSPACE)
        .map(PathBuf::from)
        .ok_or(SetupError::NoWorkspace)?;
    let paths = StatePaths::from_env(env).map_err(|source| SetupError::Paths { source })?;
    let event = match mode {
        Mode::Action => Event::from_env(env).map_err(|source| SetupError::Event { source })?,
        Mode::Local { .. } => Event::WorkflowDispatch { sender: None },
    };
    let identity = keys::invocation_identity(env, settings.matrix_context.as_deref());
    Ok(Setup {
        run_id: env.get(env::GITHUB_RUN_ID).unwrap_or("0").to_string(),
        settings,
        store,
        workspace,
        paths,
        event,
        repository,
        identity,
    })
}

fn route_event(setup: &Setup, mode: &Mode) -> Route {
    let route = github::route(
        &setup.event,
        &RouteSettings {
            mention: &setup.settings.mention,
            prompt_given: setup.settings.prompt.is_some(),
            run_id: &setup.run_id,
            identity: setup.identity.as_deref(),
            trigger_label: setup.settings.trigger_label.as_deref(),
        },
    );
    match (route, mode) {
        (Route::Run(mut plan), Mode::Local { thread, .. }) => {
            plan.logical_key = keys::LogicalKey::local(thread);
            Route::Run(plan)
        }
        (route, _) => route,
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

/// A comment by the token's own identity (a personal token's user): fro-bot does not answer
/// itself (docs/security.md). A failed lookup proceeds: the response marker still stops
/// fro-bot's own comments in routing.
async fn check_self_trigger(gh: Option<&github::GitHub>, plan: &RunPlan) -> Option<String> {
    match gh?.check_self_trigger(plan).await {
        Ok(reason) => reason.map(|r| r.describe()),
        Err(e) => {
            tracing::warn!("cannot look up the token's identity (proceeding): {e}");
            None
        }
    }
}

/// A comment on a pull request: the payload does not say whether it is a fork or a draft. What
/// the API cannot settle (no token, an error) is not run: unknown provenance fails closed.
async fn check_pull_request(gh: Option<&github::GitHub>, plan: &RunPlan) -> Option<String> {
    if !plan.pull_request_unchecked {
        return None;
    }
    let number = plan.thread.as_ref().map_or(0, |t| t.number);
    let unverified =
        |why: String| Some(github::SkipReason::UnverifiedPullRequest { number, why }.describe());
    let Some(gh) = gh else {
        return unverified("no GitHub token to look it up".into());
    };
    match gh.check_pull_request(plan).await {
        Ok(reason) => reason.map(|r| r.describe()),
        Err(e) => unverified(e.to_string()),
    }
}

/// What the payload left out that a gate decides on (`locked`, an actor's `type`), settled through
/// the API; without a token it cannot be, and the run does not start (fails closed).
async fn check_unverified(gh: Option<&github::GitHub>, plan: &RunPlan) -> Option<String> {
    let unverified = &plan.unverified;
    if unverified.is_empty() {
        return None;
    }
    let reason = match gh {
        Some(gh) => gh.check_unverified(plan).await?,
        None => match (unverified.locked, unverified.actors.first()) {
            (Some((kind, number)), _) => github::SkipReason::UnverifiedLock {
                kind,
                number,
                why: "no GitHub token to look it up".into(),
            },
            (None, Some(login)) => github::SkipReason::UnverifiedActor {
                login: login.clone(),
                why: "no GitHub token to look it up".into(),
            },
            (None, None) => return None,
        },
    };
    Some(reason.describe())
}

/// A skip reason when a run for the same entity already succeeded within the window.
async fn check_dedup(ctx: &Admitted) -> Option<String> {
    ctx.plan.dedup?;
    let sentinels = ctx.sentinels()?;
    let decision = dedup::check(
        &sentinels,
        &ctx.event,
        &ctx.repository,
        &ctx.run_id,
        now_ms(),
        ctx.settings.dedup_window,
    )
    .await;
    match decision {
        Ok(dedup::DedupDecision::Skip { ran_at_ms, .. }) => Some(format!(
            "a run for this {} already succeeded {} s ago (dedup-window)",
            ctx.plan.logical_key.as_str(),
            now_ms().saturating_sub(ran_at_ms) / 1000
        )),
        Ok(dedup::DedupDecision::Proceed(_)) => None,
        Err(e) => {
            tracing::warn!("dedup check failed (proceeding): {e}");
            None
        }
    }
}

/// Who asks for the repository lease when this run publishes (`memory::publish`).
fn lease_holder(env: &Env, repository: &str, run_id: &str, identity: Option<String>) -> Holder {
    Holder {
        repo: repository.to_string(),
        run_id: run_id.parse().unwrap_or(0),
        run_attempt: env
            .get(env::GITHUB_RUN_ATTEMPT)
            .and_then(|a| a.parse().ok())
            .unwrap_or(1),
        identity,
    }
}
