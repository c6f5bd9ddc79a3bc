//! Deduplication of issues/pull_request runs (docs/design.md#the-github-surface): a sentinel in the
//! Actions cache records when the agent last ran for an entity; a new event within the window is
//! skipped.
//!
//! The store is a trait the caller implements over its cache backend; the decision is a pure
//! function of the event, the last sentinel, the injected clock and the window.

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::event::{Event, PullRequestAction};
use super::keys::DedupEntity;

/// A sentinel from a clock up to this far ahead of ours still counts as "just ran".
pub const CLOCK_SKEW_TOLERANCE: Duration = Duration::from_secs(60);
pub const SENTINEL_VERSION: u32 = 1;

/// What a successful run leaves behind. Stored as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sentinel {
    #[serde(default = "one")]
    pub version: u32,
    pub run_id: String,
    pub run_attempt: String,
    /// Unix milliseconds when the run finished.
    pub ran_at_ms: u64,
    /// `issue-{n}` / `pr-{n}`.
    pub entity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_key: Option<String>,
}

fn one() -> u32 {
    SENTINEL_VERSION
}

impl Sentinel {
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing a struct of strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_json(raw: &[u8]) -> Result<Sentinel, serde_json::Error> {
        serde_json::from_slice(raw)
    }
}

/// The cache operations dedup needs. Implemented by the caller over the Actions cache.
pub trait SentinelStore {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The newest sentinel whose key starts with `prefix`, if any.
    fn find(&self, prefix: &str) -> impl Future<Output = Result<Option<Sentinel>, Self::Error>>;

    fn save(&self, key: &str, sentinel: &Sentinel)
        -> impl Future<Output = Result<(), Self::Error>>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupDecision {
    Proceed(ProceedReason),
    /// The agent ran for this entity `age` ago (zero when the sentinel is slightly in our future).
    Skip {
        ran_at_ms: u64,
        age: Duration,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProceedReason {
    /// `dedup-window: 0`.
    Disabled,
    /// Not an issues/pull_request event.
    NotApplicable,
    /// `synchronize`/`reopened`: new commits or a reopened entity always deserve a run.
    Bypassed,
    NoPriorRun,
    /// The last run is older than the window.
    WindowElapsed,
    /// The sentinel is further in the future than skew explains: not trusted.
    SentinelFromTheFuture,
    /// The sentinel belongs to another entity (defensive; keys are per entity).
    OtherEntity,
    /// A re-run of the run that wrote the sentinel: the user asked for it again.
    SameRun,
}

/// The entity an event is deduplicated on, or why it is not.
pub fn dedup_entity(event: &Event) -> Result<DedupEntity, ProceedReason> {
    match event {
        Event::Issues { target, .. } => Ok(DedupEntity::Issue(target.number)),
        Event::PullRequest { action, target, .. } => match action {
            PullRequestAction::Synchronize | PullRequestAction::Reopened => {
                Err(ProceedReason::Bypassed)
            }
            PullRequestAction::Opened
            | PullRequestAction::ReadyForReview
            | PullRequestAction::ReviewRequested => Ok(DedupEntity::PullRequest(target.number)),
        },
        // Labelling is a person asking for a run on purpose, like a comment.
        Event::Comment { .. }
        | Event::Labeled { .. }
        | Event::Schedule { .. }
        | Event::WorkflowDispatch { .. }
        | Event::Unsupported { .. }
        | Event::Malformed { .. } => Err(ProceedReason::NotApplicable),
    }
}

/// Skip iff the last run for the entity finished in `[now - window, now + skew]`, exclusive of the
/// window's far edge (a run exactly `window` ago no longer blocks).
pub fn decide(
    event: &Event,
    run_id: &str,
    last: Option<&Sentinel>,
    now_ms: u64,
    window: Option<Duration>,
) -> DedupDecision {
    let Some(window) = window.filter(|w| !w.is_zero()) else {
        return DedupDecision::Proceed(ProceedReason::Disabled);
    };
    let entity = match dedup_entity(event) {
        Ok(entity) => entity,
        Err(reason) => return DedupDecision::Proceed(reason),
    };
    let Some(last) = last else {
        return DedupDecision::Proceed(ProceedReason::NoPriorRun);
    };
    if last.entity != entity.label() {
        return DedupDecision::Proceed(ProceedReason::OtherEntity);
    }
    if last.run_id == run_id {
        return DedupDecision::Proceed(ProceedReason::SameRun);
    }
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    let skew_ms = CLOCK_SKEW_TOLERANCE.as_millis() as u64;
    if last.ran_at_ms > now_ms {
        return if last.ran_at_ms - now_ms <= skew_ms {
            DedupDecision::Skip {
                ran_at_ms: last.ran_at_ms,
                age: Duration::ZERO,
            }
        } else {
            DedupDecision::Proceed(ProceedReason::SentinelFromTheFuture)
        };
    }
    let age_ms = now_ms - last.ran_at_ms;
    if age_ms < window_ms {
        DedupDecision::Skip {
            ran_at_ms: last.ran_at_ms,
            age: Duration::from_millis(age_ms),
        }
    } else {
        DedupDecision::Proceed(ProceedReason::WindowElapsed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DedupError<E: std::error::Error + Send + Sync + 'static> {
    #[error("cannot look up the dedup sentinel {prefix}*")]
    Find {
        prefix: String,
        #[source]
        source: E,
    },
    #[error("cannot save the dedup sentinel {key}")]
    Save {
        key: String,
        #[source]
        source: E,
    },
}

/// Looks up the last sentinel and decides. A lookup failure is an error the caller logs as a
/// warning before proceeding: dedup is an optimization, never a reason to drop a run.
pub async fn check<S: SentinelStore>(
    store: &S,
    event: &Event,
    repository: &str,
    run_id: &str,
    now_ms: u64,
    window: Option<Duration>,
) -> Result<DedupDecision, DedupError<S::Error>> {
    // Decide without the store first: most events never need the lookup.
    let Ok(entity) = dedup_entity(event) else {
        return Ok(decide(event, run_id, None, now_ms, window));
    };
    if window.is_none_or(|w| w.is_zero()) {
        return Ok(DedupDecision::Proceed(ProceedReason::Disabled));
    }
    let prefix = entity.sentinel_prefix(repository);
    let last = store
        .find(&prefix)
        .await
        .map_err(|source| DedupError::Find {
            prefix: prefix.clone(),
            source,
        })?;
    Ok(decide(event, run_id, last.as_ref(), now_ms, window))
}

/// Records a successful run. Call only after the agent succeeded; a no-op (`Ok(None)`) for events
/// that are not deduplicated. Returns the key written.
pub async fn record<S: SentinelStore>(
    store: &S,
    event: &Event,
    repository: &str,
    run_id: &str,
    run_attempt: &str,
    logical_key: Option<&str>,
    now_ms: u64,
) -> Result<Option<String>, DedupError<S::Error>> {
    let Ok(entity) = dedup_entity(event) else {
        return Ok(None);
    };
    let key = entity.sentinel_key(repository, run_id);
    let sentinel = Sentinel {
        version: SENTINEL_VERSION,
        run_id: run_id.to_string(),
        run_attempt: run_attempt.to_string(),
        ran_at_ms: now_ms,
        entity: entity.label(),
        logical_key: logical_key.map(str::to_string),
    };
    store
        .save(&key, &sentinel)
        .await
        .map_err(|source| DedupError::Save {
            key: key.clone(),
            source,
        })?;
    Ok(Some(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::event::{Association, Flag, IssuesAction, Target, TargetKind};

    const WINDOW: Option<Duration> = Some(Duration::from_secs(600));
    const NOW: u64 = 1_700_000_000_000;

    fn target(kind: TargetKind, number: u64) -> Target {
        Target {
            kind,
            number,
            node_id: None,
            title: String::new(),
            body: String::new(),
            author: None,
            association: Association::Owner,
            locked: crate::github::event::Flag::No,
            draft: Flag::No,
            fork: Flag::No,
            head_sha: None,
        }
    }

    fn issue_opened(n: u64) -> Event {
        Event::Issues {
            action: IssuesAction::Opened,
            target: target(TargetKind::Issue, n),
            sender: None,
        }
    }

    fn pr(action: PullRequestAction, n: u64) -> Event {
        Event::PullRequest {
            action,
            target: target(TargetKind::PullRequest, n),
            sender: None,
        }
    }

    fn sentinel(entity: &str, ran_at_ms: u64) -> Sentinel {
        Sentinel {
            version: 1,
            run_id: "100".into(),
            run_attempt: "1".into(),
            ran_at_ms,
            entity: entity.into(),
            logical_key: None,
        }
    }

    fn d(event: &Event, last: Option<&Sentinel>, window: Option<Duration>) -> DedupDecision {
        decide(event, "200", last, NOW, window)
    }

    #[test]
    fn window_edges() {
        let e = issue_opened(5);
        let w = 600_000;
        let at = |ran| d(&e, Some(&sentinel("issue-5", ran)), WINDOW);
        assert!(matches!(at(NOW - w + 1), DedupDecision::Skip { .. }));
        assert_eq!(
            at(NOW - w),
            DedupDecision::Proceed(ProceedReason::WindowElapsed)
        );
        assert_eq!(
            at(NOW - w - 1),
            DedupDecision::Proceed(ProceedReason::WindowElapsed)
        );
        assert_eq!(
            at(NOW - 1000),
            DedupDecision::Skip {
                ran_at_ms: NOW - 1000,
                age: Duration::from_secs(1)
            }
        );
        assert!(matches!(at(NOW), DedupDecision::Skip { .. }));
    }

    #[test]
    fn clock_skew() {
        let e = pr(PullRequestAction::Opened, 9);
        let at = |ran| d(&e, Some(&sentinel("pr-9", ran)), WINDOW);
        assert_eq!(
            at(NOW + 60_000),
            DedupDecision::Skip {
                ran_at_ms: NOW + 60_000,
                age: Duration::ZERO
            }
        );
        assert_eq!(
            at(NOW + 60_001),
            DedupDecision::Proceed(ProceedReason::SentinelFromTheFuture)
        );
    }

    #[test]
    fn bypasses_and_non_applicable_events() {
        let recent = sentinel("pr-9", NOW - 1);
        for action in [PullRequestAction::Synchronize, PullRequestAction::Reopened] {
            assert_eq!(
                d(&pr(action, 9), Some(&recent), WINDOW),
                DedupDecision::Proceed(ProceedReason::Bypassed)
            );
        }
        for action in [
            PullRequestAction::Opened,
            PullRequestAction::ReadyForReview,
            PullRequestAction::ReviewRequested,
        ] {
            assert!(matches!(
                d(&pr(action, 9), Some(&recent), WINDOW),
                DedupDecision::Skip { .. }
            ));
        }
        assert_eq!(
            d(&Event::Schedule { cron: "x".into() }, Some(&recent), WINDOW),
            DedupDecision::Proceed(ProceedReason::NotApplicable)
        );
        assert_eq!(
            d(&pr(PullRequestAction::Opened, 9), Some(&recent), None),
            DedupDecision::Proceed(ProceedReason::Disabled)
        );
        assert_eq!(
            d(
                &pr(PullRequestAction::Opened, 9),
                Some(&recent),
                Some(Duration::ZERO)
            ),
            DedupDecision::Proceed(ProceedReason::Disabled)
        );
        assert_eq!(
            d(&pr(PullRequestAction::Opened, 9), None, WINDOW),
            DedupDecision::Proceed(ProceedReason::NoPriorRun)
        );
        assert_eq!(
            d(&pr(PullRequestAction::Opened, 8), Some(&recent), WINDOW),
            DedupDecision::Proceed(ProceedReason::OtherEntity)
        );
        // A re-run of the run that wrote the sentinel.
        assert_eq!(
            decide(
                &pr(PullRequestAction::Opened, 9),
                "100",
                Some(&recent),
                NOW,
                WINDOW
            ),
            DedupDecision::Proceed(ProceedReason::SameRun)
        );
    }

    #[test]
    fn sentinel_json_round_trip_and_old_shape() {
        let s = sentinel("issue-1", 5);
        assert_eq!(Sentinel::from_json(&s.to_json()).unwrap(), s);
        let minimal = br#"{"run_id":"1","run_attempt":"1","ran_at_ms":5,"entity":"issue-1"}"#;
        assert_eq!(Sentinel::from_json(minimal).unwrap().version, 1);
    }
}
