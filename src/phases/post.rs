//! The post step (docs/design.md#the-post-decision): decide from main's `cacheSaved` state; retry
//! only a save that did not persist, Actions cache only, with the same keys and path list as main,
//! after finishing the memory guard of a main step killed mid-turn (`phases::post_memory`); release
//! a lease main left behind. Time-boxed; never fails the job.

use std::future::Future;
use std::time::Duration;

use crate::cache;
use crate::config;
use crate::config::inputs as input;
use crate::github::keys::{invocation_identity, CacheKeys};
use crate::lease;
use crate::memory::save::{save, SaveInputs};
use crate::memory::save_result::{
    post_decision, GateInputs, PostDecision, StateValue, StorePublish,
};
use crate::memory::state_paths::StatePaths;
use crate::object_store::{ObjectStore, StoreSettings};
use crate::phases::post_memory::GuardEnd;
use crate::runner::env::state;
use crate::runner::{log, Env, FileCommands};

/// The whole post step gets this long: the job's own timeout is not ours to spend.
pub const POST_TIME_BOX: Duration = Duration::from_secs(240);

/// What post did, for its summary and the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostOutcome {
    NothingToDo {
        why: &'static str,
    },
    Declined,
    Retried {
        state: StateValue,
        detail: String,
        /// What scrubbing the database did (`None`: the save did not get that far).
        scrubbed: Option<String>,
        /// What post did to finish a killed main's memory guard first (`phases::post_memory`).
        finished: Option<String>,
    },
    CouldNotRetry {
        why: String,
    },
    /// Main was killed before it limited memory to its own conversation, and post could not do
    /// it either: nothing is saved.
    GuardNotFinished {
        why: String,
    },
    TimedOut,
}

/// Runs post. `release_lease` releases a lease main left behind (it gets its own 10 s deadline
/// inside); it runs whatever the decision.
pub async fn post<R>(env: &Env, release_lease: R) -> PostOutcome
where
    R: Future<Output = ()>,
{
    let files = FileCommands::from_env(env);
    // First: the agent's container a killed main left, so nothing of the agent's runs on.
    let sibling = crate::phases::turn::agent_sibling::post_remove(env).await;
    // Then: what a killed main left in .git must not outlive this step.
    let git = env
        .get(crate::runner::env::GITHUB_WORKSPACE)
        .and_then(|w| crate::phases::turn::guards::post_put_back_git(env, std::path::Path::new(w)));
    let turn = crate::phases::turn::leftovers::post_give_back_turn(env);
    let home = crate::phases::turn::guards::post_give_back_home(env);
    for text in [&sibling, &git, &turn, &home].into_iter().flatten() {
        if let Err(e) = files.append_summary(&format!("### fro-bot (post)\n\n{text}\n\n")) {
            tracing::warn!("{e}");
        }
    }
    let outcome = match tokio::time::timeout(POST_TIME_BOX, async {
        release_lease.await;
        decide_and_retry(env).await
    })
    .await
    {
        Ok(outcome) => outcome,
        Err(_) => PostOutcome::TimedOut,
    };
    // Whatever was decided: the memory guard's copy must not outlive this step.
    crate::phases::post_memory::discard(env);
    if let Err(e) = files.append_summary(&summary(&outcome)) {
        tracing::warn!("{e}");
    }
    outcome
}

/// Post's summary section, with the same said in the log.
fn summary(outcome: &PostOutcome) -> String {
    match outcome {
        PostOutcome::NothingToDo { why } => {
            tracing::info!("post: nothing to do: {why}");
            format!("### Session Persistence (post)\n\nNothing to do: {why}.\n\n")
        }
        PostOutcome::Declined => {
            let text = "the main step declined to save for safety (see its Session Persistence \
                        section); saving now could store a half-written database or overwrite \
                        newer memory, so the post step does not save either";
            tracing::warn!("post: {text}");
            format!("### Session Persistence (post)\n\nNot saved: {text}.\n\n")
        }
        PostOutcome::Retried {
            state,
            detail,
            scrubbed,
            finished,
        } => {
            if let Some(text) = finished {
                tracing::info!("post: {text}");
            }
            match state {
                StateValue::Durable => tracing::info!("post: memory saved on retry: {detail}"),
                _ => log::warning(&format!(
                    "post: memory not saved on retry ({state}): {detail}"
                )),
            }
            let finished = finished
                .as_ref()
                .map_or_else(String::new, |t| format!("{t}\n\n"));
            let scrubbed = scrubbed
                .as_ref()
                .map_or_else(String::new, |s| format!("Secrets scrubbed: {s}.\n\n"));
            format!("### Session Persistence (post)\n\n{finished}Retried the Actions cache save: **{state}** — {detail}.\n\n{scrubbed}")
        }
        PostOutcome::CouldNotRetry { why } => {
            log::warning(&format!("post: cannot retry the save: {why}"));
            format!("### Session Persistence (post)\n\nCould not retry the save: {why}.\n\n")
        }
        PostOutcome::GuardNotFinished { why } => {
            let text = format!(
                "the main step was killed before it limited the agent's changes to memory to its \
                 own conversation, and post could not do it: {why}; what the agent left is not saved"
            );
            log::warning(&format!("post: {text}"));
            format!("### Session Persistence (post)\n\nNot saved: {text}.\n\n")
        }
        PostOutcome::TimedOut => {
            log::warning("post: gave up after its 4-minute time box");
            "### Session Persistence (post)\n\nGave up after the 4-minute time box.\n\n".into()
        }
    }
}

async fn decide_and_retry(env: &Env) -> PostOutcome {
    match post_decision(StateValue::parse(env.state(state::CACHE_SAVED))) {
        PostDecision::NothingToDo { why } => PostOutcome::NothingToDo { why },
        PostDecision::Declined => PostOutcome::Declined,
        PostDecision::RetryCacheSave => retry(env).await,
    }
}

async fn retry(env: &Env) -> PostOutcome {
    // The save scrubs the database of every registered secret: register them in this process too.
    config::register_secrets(env);
    // Only the inputs the retry needs; a bad value elsewhere was main's to report.
    if config::parse_bool(env, &input::SKIP_CACHE).unwrap_or(false) {
        return PostOutcome::NothingToDo {
            why: "skip-cache is set",
        };
    }
    let paths = match StatePaths::from_env(env) {
        Ok(p) => p,
        Err(e) => return PostOutcome::CouldNotRetry { why: e.to_string() },
    };
    let identity = invocation_identity(env, env.input(input::MATRIX_CONTEXT.name));
    let keys = match CacheKeys::from_env(env, identity.as_deref()) {
        Ok(k) => k,
        Err(e) => return PostOutcome::CouldNotRetry { why: e.to_string() },
    };
    let Some(workspace) = env.get(crate::runner::env::GITHUB_WORKSPACE) else {
        return PostOutcome::CouldNotRetry {
            why: format!("{} is not set", crate::runner::env::GITHUB_WORKSPACE),
        };
    };
    let backend = cache::Backend::from_env(env);
    let save_key = keys.save_key();
    if let Some(saved) = already_saved(backend.as_ref(), &save_key, &paths).await {
        return saved;
    }
    // A main step killed mid-turn: memory is limited to its own conversation first, or not saved.
    let (scope, finished) =
        match crate::phases::post_memory::finish(env, &paths).await {
            GuardEnd::NotPending => (None, None),
            GuardEnd::Finished { scope, text } => (Some(scope), Some(text)),
            GuardEnd::BeforeTheTurn => return PostOutcome::NothingToDo {
                why: "the main step was killed before the agent's turn was sent, so memory is as \
                      restored and the cache and the store keep it",
            },
            GuardEnd::NotSaved { why } => return PostOutcome::GuardNotFinished { why },
        };
    let at = (&paths, workspace, backend.as_ref());
    let mut report = save_with_key(env, at, &save_key, scope.as_ref()).await;
    if report.key_taken {
        // Main reserved this key and died before committing it: the reservation blocks the key,
        // so the retry goes under a key of its own (still matched by the restore prefixes).
        // Same derivation, one suffix; still within the service's 512-unit key limit.
        let post_key = format!("{}-post", crate::github::keys::shorten(&save_key, 512 - 5));
        report = save_with_key(env, at, &post_key, scope.as_ref()).await;
    }
    PostOutcome::Retried {
        state: report.result.state_value(),
        detail: report.result.detail,
        scrubbed: report.scrub.as_ref().map(|s| s.describe()),
        finished,
    }
}

/// Main may have committed its entry and died right after: then there is nothing to retry.
async fn already_saved(
    backend: Option<&cache::Backend>,
    save_key: &str,
    paths: &StatePaths,
) -> Option<PostOutcome> {
    match backend?.has_entry(save_key, paths.cache_paths()).await {
        Ok(true) => Some(PostOutcome::Retried {
            state: StateValue::Durable,
            detail: format!("the main step's entry `{save_key}` is already in the cache"),
            scrubbed: None,
            finished: None,
        }),
        Ok(false) => None,
        Err(e) => {
            tracing::debug!("cannot look up main's entry: {e}");
            None
        }
    }
}

/// The save under `save_key`; `scope`: what post's finish of main's memory guard says the scrub
/// reads (else main's state, else the whole database).
async fn save_with_key(
    env: &Env,
    (paths, workspace, backend): (&StatePaths, &str, Option<&cache::Backend>),
    save_key: &str,
    scope: Option<&crate::memory::scrub::Scope>,
) -> crate::memory::save::SaveReport {
    let run_id = env
        .get(crate::runner::env::GITHUB_RUN_ID)
        .unwrap_or("unknown");
    // Main hands its session map over in the state; without it the marker on disk keeps its own.
    let sessions: Option<crate::memory::session_map::Map> = env
        .state(state::SESSION_MAP)
        .and_then(|json| serde_json::from_str(json).ok());
    // Without main's records none are kept: the marker on disk is where the agent could write
    // during its turn, and a missing record is the safe side (docs/security.md).
    let trust: crate::trust::TrustMap = env
        .state(state::SESSION_TRUST)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    // Main's scope holds only once it limited memory to its own conversation; without it, whole.
    let scrub_scope: crate::memory::scrub::Scope = scope.cloned().unwrap_or_else(|| {
        env.state(state::SCRUB_SCOPE)
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or(crate::memory::scrub::Scope::Whole)
    });
    save(
        SaveInputs {
            paths,
            workspace: std::path::Path::new(workspace),
            skip_cache: false,
            // Main is gone: nothing of this run can still be writing.
            gate: GateInputs {
                agent_still_running: false,
                server_quiescent: true,
                strays_remained: false,
            },
            cache: backend,
            save_key,
            run_id,
            now_ms: crate::runner::now_ms(),
            // A shadow guard makes main record declined-for-safety at once: post never gets here.
            shadow_guard: None,
            sessions: sessions.as_ref(),
            trust: Some(&trust),
            // Post does not know what main restored: a retry always uploads.
            restored: None,
            // Post does not know what main restored, so it cannot tell what to merge.
            cache_merge: None,
            scrub_scope: &scrub_scope,
        },
        // Never the object store from post: the lease is gone.
        || async { StorePublish::NotAttempted.into() },
    )
    .await
}

/// The post step as the binary runs it: releases a lease main left behind (from main's state and
/// the same `s3-*` inputs), then decides and retries.
pub async fn run_post(env: &Env) -> PostOutcome {
    crate::phases::tracking_comment::finish_left_behind(env).await;
    post(env, release_left_behind(env)).await
}

/// Releases each lease main left behind (the thread's turn, the publish's repository lease).
async fn release_left_behind(env: &Env) {
    use crate::memory::ledger::PostLease;
    let left: Vec<(&str, &str)> = PostLease::ALL
        .iter()
        .filter_map(|lease| lease.left_behind(env))
        .collect();
    if left.is_empty() {
        return;
    }
    let settings = config::Settings::from_env(env, config::AuthRequirement::Optional)
        .ok()
        .and_then(|s| s.s3)
        .and_then(|s3| StoreSettings::from_input(&s3, env).ok());
    let Some(settings) = settings else {
        log::warning("main left a memory lease behind, but the s3 inputs no longer validate; it expires by itself");
        return;
    };
    // The connect is bounded too: the whole release gets the 10 s deadline.
    let release = async {
        let store = ObjectStore::connect(&settings).await;
        for (key, etag) in left {
            report_release(
                lease::release_left_behind(&store, key, etag, lease::POST_RELEASE_DEADLINE).await,
            );
        }
    };
    if tokio::time::timeout(lease::POST_RELEASE_DEADLINE, release)
        .await
        .is_err()
    {
        log::warning("post: releasing a memory lease timed out; it expires by itself");
    }
}

fn report_release(outcome: lease::ReleaseOutcome) {
    match outcome {
        lease::ReleaseOutcome::Released => {
            tracing::info!("post: released a memory lease main left behind")
        }
        lease::ReleaseOutcome::NotHeld => {
            tracing::info!("post: a lease main held was already gone or taken over")
        }
        lease::ReleaseOutcome::Failed { error } => {
            log::warning(&format!("post: cannot release a memory lease: {error}"))
        }
    }
}
