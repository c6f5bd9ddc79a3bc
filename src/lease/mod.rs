//! The coordination lease (docs/design.md#the-coordination-lease): at most one run at a time may
//! publish a repository's shared session database. Acquired with a create-only put, taken over only
//! after expiry or release with a compare-and-swap on the ETag (generation + 1: a fencing token that
//! never restarts), renewed in the background, released by a conditional write of the record
//! expired at once.

pub mod clock;
pub mod record;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use clock::{Clock, ManualClock, SystemClock};
pub use record::{Holder, LeaseRecord};

use crate::object_store::{
    Condition, DeleteOutcome, GetOutcome, ObjectBody, ObjectKind, ObjectStore, PutOutcome,
    StoreError,
};

pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
/// Post releases a lease main left behind within this deadline.
pub const POST_RELEASE_DEADLINE: Duration = Duration::from_secs(10);
/// Acquire rereads at most this many times when the record changes under it.
const ACQUIRE_ATTEMPTS: usize = 3;
/// How far a holder's clock may run ahead of the store's before its record is bounded by
/// `LastModified` (see [`LeaseRecord::effective_expiry`]).
const CLOCK_SKEW_MS: u64 = 30_000;
/// The longest pause between two asks of [`Lease::acquire_waiting`].
const MAX_WAIT_PAUSE: Duration = Duration::from_secs(4);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    pub ttl: Duration,
    pub renew_interval: Duration,
    /// Each S3 call (acquire, renew, release) is abandoned after this long.
    pub call_timeout: Duration,
}

impl LeaseConfig {
    /// Renewal every `ttl/4`.
    pub fn with_ttl(ttl: Duration) -> Self {
        LeaseConfig {
            ttl,
            renew_interval: ttl / 4,
            call_timeout: Duration::from_secs(15),
        }
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self::with_ttl(DEFAULT_TTL)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("lease {operation}: {source}")]
    Store {
        operation: &'static str,
        #[source]
        source: StoreError,
    },
    #[error("lease {operation} timed out after {after:?}")]
    TimedOut {
        operation: &'static str,
        after: Duration,
    },
}

async fn timed<T>(
    operation: &'static str,
    after: Duration,
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, LeaseError> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(LeaseError::Store { operation, source }),
        Err(_) => Err(LeaseError::TimedOut { operation, after }),
    }
}

/// `record` written under `condition`: its ETag, or `None` when someone else wrote first.
async fn put_record(
    store: &ObjectStore,
    key: &str,
    record: &LeaseRecord,
    condition: Condition<'_>,
) -> Result<Option<String>, StoreError> {
    let put = store.put_bytes(key, record.to_bytes(), condition, ObjectKind::LeaseRecord);
    Ok(match put.await? {
        PutOutcome::Written { etag } => Some(etag),
        PutOutcome::PreconditionFailed => None,
    })
}

/// The record [`Lease::acquire`] found in its way: who holds it, until when (as this run judges
/// it), and its generation.
struct Found {
    holder_id: String,
    expires_at: u64,
    generation: u64,
}

impl Found {
    /// An unreadable record counts as held until the default TTL after it was written; a re-run's
    /// own earlier attempt never keeps it waiting.
    fn read(body: &ObjectBody, holder: &Holder, now: u64, max_ttl_ms: u64) -> Found {
        match LeaseRecord::parse(&body.bytes) {
            Some(existing) if existing.is_earlier_attempt_of(holder) => Found {
                holder_id: existing.holder_id.clone(),
                expires_at: 0,
                generation: existing.generation,
            },
            Some(existing) => Found {
                expires_at: existing.effective_expiry(body.last_modified_ms, max_ttl_ms),
                holder_id: existing.holder_id,
                generation: existing.generation,
            },
            None => Found {
                holder_id: "(unreadable lease record)".to_string(),
                expires_at: body
                    .last_modified_ms
                    .unwrap_or(now)
                    .saturating_add(LeaseConfig::default().ttl_ms()),
                generation: 0,
            },
        }
    }
}

#[derive(Debug)]
pub enum AcquireOutcome {
    Acquired(LeaseHandle),
    HeldByOther { holder_id: String, expires_at: u64 },
    Error { error: LeaseError },
}

/// The lease line of the run summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStatus {
    Acquired { generation: u64 },
    HeldByOther { holder_id: String, expires_at: u64 },
    Disabled,
    Error { message: String },
}

impl LeaseStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            LeaseStatus::Acquired { .. } => "acquired",
            LeaseStatus::HeldByOther { .. } => "held-by-other",
            LeaseStatus::Disabled => "disabled",
            LeaseStatus::Error { .. } => "error",
        }
    }
}

impl std::fmt::Display for LeaseStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseStatus::Acquired { generation } => write!(f, "acquired (generation {generation})"),
            LeaseStatus::HeldByOther {
                holder_id,
                expires_at,
            } => write!(f, "held-by-other ({holder_id} until {expires_at} ms)"),
            LeaseStatus::Disabled => f.write_str("disabled"),
            LeaseStatus::Error { message } => write!(f, "error ({message})"),
        }
    }
}

impl AcquireOutcome {
    pub fn status(&self) -> LeaseStatus {
        match self {
            AcquireOutcome::Acquired(h) => LeaseStatus::Acquired {
                generation: h.generation(),
            },
            AcquireOutcome::HeldByOther {
                holder_id,
                expires_at,
            } => LeaseStatus::HeldByOther {
                holder_id: holder_id.clone(),
                expires_at: *expires_at,
            },
            AcquireOutcome::Error { error } => LeaseStatus::Error {
                message: error.to_string(),
            },
        }
    }
}

/// Why a held lease is no longer ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostReason {
    /// A tick found the lease already past `expires_at`.
    Expired,
    /// The ETag changed: someone took it over (or deleted it).
    Superseded,
    /// A renewal request failed or timed out; we cannot know whether we still hold it.
    RenewalFailed(String),
}

/// Whether the session database may be published now (the publish gate of
/// docs/design.md#the-coordination-lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishGate {
    Open {
        generation: u64,
    },
    Lost(LostReason),
    Released,
    /// Held, but it could expire before the upload finishes.
    TooLittleTime {
        remaining_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewOutcome {
    Renewed { expires_at: u64 },
    Lost(LostReason),
    Released,
}

#[derive(Debug)]
pub enum ReleaseOutcome {
    Released,
    /// The lease was lost or already replaced/deleted: nothing of ours to delete.
    NotHeld,
    Failed {
        error: LeaseError,
    },
}

pub struct Lease;

impl Lease {
    /// `PutObject If-None-Match: *`; when it exists, read it and take it over only if expired
    /// (or malformed and older than the default TTL), with `If-Match` on its ETag.
    pub async fn acquire(
        store: &ObjectStore,
        key: &str,
        holder: &Holder,
        config: LeaseConfig,
        clock: Arc<dyn Clock>,
    ) -> AcquireOutcome {
        let ttl_ms = config.ttl_ms();
        // No live record is older than its holder's TTL (renewals rewrite it every ttl/4).
        let max_ttl_ms = ttl_ms
            .max(LeaseConfig::default().ttl_ms())
            .saturating_add(CLOCK_SKEW_MS);
        let mut last_seen = None;
        for _ in 0..ACQUIRE_ATTEMPTS {
            let record = LeaseRecord::new(holder, 1, clock.now_ms(), ttl_ms);
            let put = put_record(store, key, &record, Condition::IfAbsent);
            match timed("acquire", config.call_timeout, put).await {
                Ok(Some(etag)) => {
                    return AcquireOutcome::Acquired(LeaseHandle::start(
                        store, key, record, etag, config, clock,
                    ))
                }
                Ok(None) => {}
                Err(error) => return AcquireOutcome::Error { error },
            }
            let body = match timed("read", config.call_timeout, store.get_bytes(key)).await {
                Ok(GetOutcome::Found(body)) => body,
                // Deleted between our put and our read (an older fro-bot releases by deleting).
                Ok(GetOutcome::NotFound) => continue,
                Err(error) => return AcquireOutcome::Error { error },
            };
            let now = clock.now_ms();
            let found = Found::read(&body, holder, now, max_ttl_ms);
            if found.expires_at > now {
                return AcquireOutcome::HeldByOther {
                    holder_id: found.holder_id,
                    expires_at: found.expires_at,
                };
            }
            // Released or expired: the next generation, so a stale holder's token is lower.
            let record = LeaseRecord::new(holder, found.generation.saturating_add(1), now, ttl_ms);
            let put = put_record(store, key, &record, Condition::IfMatch(&body.etag));
            match timed("takeover", config.call_timeout, put).await {
                Ok(Some(etag)) => {
                    let (holder_id, generation) = (&found.holder_id, found.generation);
                    tracing::debug!("took the lease after {holder_id} (generation {generation})");
                    return AcquireOutcome::Acquired(LeaseHandle::start(
                        store, key, record, etag, config, clock,
                    ));
                }
                // Someone else took it over first; the next pass reports who.
                Ok(None) => last_seen = Some((found.holder_id, found.expires_at)),
                Err(error) => return AcquireOutcome::Error { error },
            }
        }
        let (holder_id, expires_at) =
            last_seen.unwrap_or_else(|| ("(unknown: contended)".into(), 0));
        AcquireOutcome::HeldByOther {
            holder_id,
            expires_at,
        }
    }

    /// [`Lease::acquire`], asking again with jittered, growing pauses while another run holds the
    /// lease, for at most `wait`, and no longer once `stop` fires (a signal: the holder is then
    /// reported). Also how many times it waited (the summary reports it). A `stop` ends a pause,
    /// never an ask: an ask dropped half way could take the lease and leave it held until it
    /// expires, with nobody to release it.
    pub async fn acquire_waiting(
        store: &ObjectStore,
        key: &str,
        holder: &Holder,
        config: LeaseConfig,
        clock: Arc<dyn Clock>,
        wait: Duration,
        stop: &CancellationToken,
    ) -> (AcquireOutcome, u32) {
        let deadline = tokio::time::Instant::now() + wait;
        let mut pause = Duration::from_millis(200);
        let mut waits = 0;
        loop {
            let outcome = Self::acquire(store, key, holder, config, clock.clone()).await;
            let AcquireOutcome::HeldByOther { .. } = outcome else {
                return (outcome, waits);
            };
            // Between half and one and a half times the pause: contenders spread out.
            let jittered = pause.mul_f64(0.5 + rand::random::<f64>());
            if tokio::time::Instant::now() + jittered >= deadline || stop.is_cancelled() {
                return (outcome, waits);
            }
            tokio::select! {
                () = tokio::time::sleep(jittered) => {}
                () = stop.cancelled() => return (outcome, waits),
            }
            waits += 1;
            pause = (pause * 2).min(MAX_WAIT_PAUSE);
        }
    }
}

/// What sync readers (the publish gate, post state) see.
#[derive(Debug, Clone)]
struct Snapshot {
    etag: String,
    expires_at: u64,
    generation: u64,
    lost: Option<LostReason>,
    released: bool,
}

struct TickState {
    record: LeaseRecord,
    etag: String,
}

struct Shared {
    store: ObjectStore,
    key: String,
    config: LeaseConfig,
    clock: Arc<dyn Clock>,
    /// Held for the whole of a renewal or release: ticks never overlap.
    tick: tokio::sync::Mutex<TickState>,
    snapshot: Mutex<Snapshot>,
}

impl Shared {
    fn snapshot(&self) -> Snapshot {
        // A poisoned lock only means a panic elsewhere; the data is still the last written.
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        f(&mut self.snapshot.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn lose(&self, reason: LostReason) -> RenewOutcome {
        tracing::warn!("coordination lease lost: {reason:?}");
        self.update(|s| {
            s.lost.get_or_insert(reason.clone());
        });
        RenewOutcome::Lost(reason)
    }

    async fn renew(&self) -> RenewOutcome {
        let mut st = self.tick.lock().await;
        let snap = self.snapshot();
        if snap.released {
            return RenewOutcome::Released;
        }
        if let Some(reason) = snap.lost {
            return RenewOutcome::Lost(reason);
        }
        let now = self.clock.now_ms();
        // Renewing a lease that already expired could overwrite a takeover in flight.
        if now >= st.record.expires_at {
            return self.lose(LostReason::Expired);
        }
        let next = st.record.renewed(now, self.config.ttl_ms());
        let put = self.store.put_bytes(
            &self.key,
            next.to_bytes(),
            Condition::IfMatch(&st.etag),
            ObjectKind::LeaseRecord,
        );
        // Never let a renewal land after the lease it renews has expired.
        let remaining = Duration::from_millis(st.record.expires_at - now);
        match timed("renew", self.config.call_timeout.min(remaining), put).await {
            Ok(PutOutcome::Written { etag }) => {
                let expires_at = next.expires_at;
                self.update(|s| {
                    s.etag = etag.clone();
                    s.expires_at = expires_at;
                });
                st.record = next;
                st.etag = etag;
                RenewOutcome::Renewed { expires_at }
            }
            Ok(PutOutcome::PreconditionFailed) => self.lose(LostReason::Superseded),
            Err(error) => self.lose(LostReason::RenewalFailed(error.to_string())),
        }
    }
}

/// A held lease. Renews itself in the background until released or lost; dropping it stops the
/// renewal (the record then expires on its own).
/// See [`LeaseHandle::etag_source`].
#[derive(Clone)]
pub struct EtagSource(Arc<Shared>);

impl EtagSource {
    pub fn current(&self) -> String {
        self.0.snapshot().etag
    }
}

pub struct LeaseHandle {
    shared: Arc<Shared>,
    stop: CancellationToken,
    renewal: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("key", &self.shared.key)
            .field("snapshot", &self.shared.snapshot())
            .finish()
    }
}

impl LeaseHandle {
    fn start(
        store: &ObjectStore,
        key: &str,
        record: LeaseRecord,
        etag: String,
        config: LeaseConfig,
        clock: Arc<dyn Clock>,
    ) -> LeaseHandle {
        let snapshot = Snapshot {
            etag: etag.clone(),
            expires_at: record.expires_at,
            generation: record.generation,
            lost: None,
            released: false,
        };
        let shared = Arc::new(Shared {
            store: store.clone(),
            key: key.to_string(),
            config,
            clock,
            tick: tokio::sync::Mutex::new(TickState { record, etag }),
            snapshot: Mutex::new(snapshot),
        });
        let stop = CancellationToken::new();
        let renewal = tokio::spawn({
            let shared = shared.clone();
            let stop = stop.clone();
            async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(shared.config.renew_interval) => {}
                    }
                    // The tick runs to completion (bounded by the call timeout) before the next
                    // sleep starts, so ticks never overlap.
                    match shared.renew().await {
                        RenewOutcome::Renewed { .. } => {}
                        RenewOutcome::Lost(_) | RenewOutcome::Released => break,
                    }
                }
            }
        });
        LeaseHandle {
            shared,
            stop,
            renewal: Some(renewal),
        }
    }

    pub fn key(&self) -> &str {
        &self.shared.key
    }

    pub fn generation(&self) -> u64 {
        self.shared.snapshot().generation
    }

    pub fn etag(&self) -> String {
        self.shared.snapshot().etag
    }

    /// A cheap handle that reads the current ETag from another task (renewals change it; the
    /// main step keeps post's copy current with it).
    pub fn etag_source(&self) -> EtagSource {
        EtagSource(self.shared.clone())
    }

    pub fn expires_at(&self) -> u64 {
        self.shared.snapshot().expires_at
    }

    pub fn lost(&self) -> Option<LostReason> {
        self.shared.snapshot().lost
    }

    /// The publish gate: held, not lost, not released, and at least `min_remaining` left.
    pub fn can_publish(&self, min_remaining: Duration) -> bool {
        matches!(self.publish_gate(min_remaining), PublishGate::Open { .. })
    }

    /// [`Self::can_publish`] with the reason, for the summary.
    pub fn publish_gate(&self, min_remaining: Duration) -> PublishGate {
        let s = self.shared.snapshot();
        let min_ms = u64::try_from(min_remaining.as_millis()).unwrap_or(u64::MAX);
        let now = self.shared.clock.now_ms();
        match (s.lost, s.released) {
            (Some(reason), _) => PublishGate::Lost(reason),
            (None, true) => PublishGate::Released,
            (None, false) if now.saturating_add(min_ms) >= s.expires_at => {
                PublishGate::TooLittleTime {
                    remaining_ms: s.expires_at.saturating_sub(now),
                }
            }
            (None, false) => PublishGate::Open {
                generation: s.generation,
            },
        }
    }

    /// What main saves in state so post can release a lease left behind: (key, current ETag).
    pub fn state_for_post(&self) -> (String, String) {
        (self.shared.key.clone(), self.etag())
    }

    /// One renewal now (serialized with the background ticks).
    pub async fn renew_now(&self) -> RenewOutcome {
        self.shared.renew().await
    }

    /// Stops renewal, then deletes the record if it is still ours (`If-Match` current ETag).
    pub async fn release(mut self) -> ReleaseOutcome {
        self.stop.cancel();
        if let Some(task) = self.renewal.take() {
            // The task only ends by itself or on `stop`; a join error means it panicked, which
            // leaves nothing to clean up here.
            let _ = task.await;
        }
        let st = self.shared.tick.lock().await;
        let snap = self.shared.snapshot();
        self.shared.update(|s| s.released = true);
        if snap.lost.is_some() || snap.released {
            return ReleaseOutcome::NotHeld;
        }
        // The record stays, released: the next holder's generation follows this one's.
        let released = st.record.released(self.shared.clock.now_ms());
        let put = self.shared.store.put_bytes(
            &self.shared.key,
            released.to_bytes(),
            Condition::IfMatch(&st.etag),
            ObjectKind::LeaseRecord,
        );
        match timed("release", self.shared.config.call_timeout, put).await {
            Ok(PutOutcome::Written { .. }) => ReleaseOutcome::Released,
            Ok(PutOutcome::PreconditionFailed) => ReleaseOutcome::NotHeld,
            Err(error) => ReleaseOutcome::Failed { error },
        }
    }
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// For `fro-bot post`: releases the lease main left behind, if it still has main's ETag (the
/// record is kept, released, like [`LeaseHandle::release`] does; an unreadable one is deleted).
/// Every request is abandoned when `deadline` expires.
pub async fn release_left_behind(
    store: &ObjectStore,
    key: &str,
    etag: &str,
    deadline: Duration,
) -> ReleaseOutcome {
    let release = async {
        let body = match store.get_bytes(key).await? {
            GetOutcome::Found(body) if body.etag == etag => body,
            GetOutcome::Found(_) | GetOutcome::NotFound => return Ok(ReleaseOutcome::NotHeld),
        };
        let released = match LeaseRecord::parse(&body.bytes) {
            Some(record) => record.released(SystemClock.now_ms()),
            None => {
                return Ok(match store.delete(key, Condition::IfMatch(etag)).await? {
                    DeleteOutcome::Deleted => ReleaseOutcome::Released,
                    DeleteOutcome::PreconditionFailed => ReleaseOutcome::NotHeld,
                })
            }
        };
        let put = store.put_bytes(
            key,
            released.to_bytes(),
            Condition::IfMatch(etag),
            ObjectKind::LeaseRecord,
        );
        Ok(match put.await? {
            PutOutcome::Written { .. } => ReleaseOutcome::Released,
            PutOutcome::PreconditionFailed => ReleaseOutcome::NotHeld,
        })
    };
    match timed("release", deadline, release).await {
        Ok(outcome) => outcome,
        Err(error) => ReleaseOutcome::Failed { error },
    }
}
