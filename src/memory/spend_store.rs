//! The spend ledger (`memory::spend_ledger`) in the object store (`{repo}/budget/spend.json`), read and written only under
//! the repository lease, so the budget is exact across concurrent runs: a run's hold is in the
//! store before the lease is released (`reserve`), and another run judged after it counts it;
//! at the end the hold becomes what the run spent (`settle`).

use std::sync::Arc;
use std::time::Duration;

use crate::lease::{self, AcquireOutcome, Holder, Lease, LeaseConfig, LeaseHandle};
use crate::memory::ledger::{PostLease, StoreContext};
use crate::memory::spend_ledger::{Entry, SpendLedger, Verdict};
use crate::object_store::{Condition, GetOutcome, ObjectKind, PutOutcome, StoreError};
use crate::runner::{Cancellation, FileCommands};

/// The store's copy is read only up to this size; a larger one is not believed.
pub const MAX_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreLedgerError {
    #[error("the lease stayed with {holder} for {waited_secs} s")]
    LeaseHeld { holder: String, waited_secs: u64 },
    #[error("cannot ask for the lease: {message}")]
    Lease { message: String },
    #[error("the store's spend ledger: {source}")]
    Store { source: StoreError },
    #[error("the store's spend ledger was written by another run while this one held the lease")]
    Conflict { key: String },
}

/// What a section under the lease needs.
pub struct Section<'a> {
    pub store: &'a StoreContext,
    pub holder: &'a Holder,
    pub files: &'a FileCommands,
    pub cancel: &'a Cancellation,
    pub wait: Duration,
    pub now_ms: u64,
}

/// Under the lease: the store's ledger (its lines over `local`'s), judged by `judge`; when the run
/// passes, `line` (its hold) is put before the lease is released. Returns the verdict, the ledger
/// as judged, and what the store's copy held that cannot be believed.
pub async fn reserve(
    section: &Section<'_>,
    local: SpendLedger,
    judge: impl FnOnce(&SpendLedger) -> Verdict,
    line: impl FnOnce(&Verdict) -> Option<Entry>,
) -> Result<(Verdict, SpendLedger, Vec<String>), StoreLedgerError> {
    let handle = take(section).await?;
    let watch = PostLease::REPO.keep_for_post(section.files, &handle);
    let result = async {
        let (mut ledger, base, notes) = fetch(section).await?;
        ledger.add_missing(local);
        ledger.prune(section.now_ms);
        let verdict = judge(&ledger);
        if let Some(entry) = line(&verdict) {
            ledger.record(entry);
            put(section, &ledger, &base).await?;
        }
        Ok((verdict, ledger, notes))
    }
    .await;
    watch.abort();
    give_back(section.files, handle).await;
    result
}

/// Under the lease: this run's line replaced by `entry` (what it spent), the rest as the store
/// holds it, pruned.
pub async fn settle(section: &Section<'_>, entry: Entry) -> Result<(), StoreLedgerError> {
    let handle = take(section).await?;
    let watch = PostLease::REPO.keep_for_post(section.files, &handle);
    let result = async {
        let (mut ledger, base, _) = fetch(section).await?;
        ledger.record(entry);
        ledger.prune(section.now_ms);
        put(section, &ledger, &base).await
    }
    .await;
    watch.abort();
    give_back(section.files, handle).await;
    result
}

async fn take(section: &Section<'_>) -> Result<LeaseHandle, StoreLedgerError> {
    let clock: Arc<dyn lease::Clock> = Arc::new(lease::SystemClock);
    let (outcome, _) = Lease::acquire_waiting(
        &section.store.store,
        section.store.keys.lease(),
        section.holder,
        LeaseConfig::default(),
        clock,
        section.wait,
        section.cancel.token(),
    )
    .await;
    match outcome {
        AcquireOutcome::Acquired(handle) => Ok(handle),
        AcquireOutcome::HeldByOther { holder_id, .. } => Err(StoreLedgerError::LeaseHeld {
            holder: holder_id,
            waited_secs: section.wait.as_secs(),
        }),
        AcquireOutcome::Error { error } => Err(StoreLedgerError::Lease {
            message: error.to_string(),
        }),
    }
}

async fn give_back(files: &FileCommands, handle: LeaseHandle) {
    match handle.release().await {
        lease::ReleaseOutcome::Released => PostLease::REPO.clear(files),
        lease::ReleaseOutcome::NotHeld => {}
        lease::ReleaseOutcome::Failed { error } => {
            tracing::warn!("cannot release the memory lease after the spend ledger: {error}")
        }
    }
}

/// What the put replaces.
enum Base {
    /// Nothing yet: create only.
    Absent,
    /// The version read (its ETag).
    At(String),
    /// A copy too large to read: replaced whatever it is (the lease is held).
    Replace,
}

/// The store's ledger and what a put replaces. A copy too large or unreadable is read as empty,
/// and said: the put that follows replaces it.
async fn fetch(
    section: &Section<'_>,
) -> Result<(SpendLedger, Base, Vec<String>), StoreLedgerError> {
    let key = section.store.keys.spend_ledger();
    let store = &section.store.store;
    let body = match store.get_bytes_capped(&key, MAX_BYTES).await {
        Ok(GetOutcome::Found(body)) => body,
        Ok(GetOutcome::NotFound) => return Ok((SpendLedger::default(), Base::Absent, Vec::new())),
        Err(StoreError::Integrity { .. }) => {
            let note = format!("the store's spend ledger is larger than {MAX_BYTES} bytes: it was counted from zero (today's earlier spend is unknown) and is replaced");
            return Ok((SpendLedger::default(), Base::Replace, vec![note]));
        }
        Err(source) => return Err(StoreLedgerError::Store { source }),
    };
    match serde_json::from_slice::<serde_json::Value>(&body.bytes) {
        Ok(value) => {
            let (ledger, notes) = SpendLedger::read(&value, section.now_ms);
            let notes = notes
                .into_iter()
                .map(|n| n.replace("in memory", "in the store"));
            Ok((ledger, Base::At(body.etag), notes.collect()))
        }
        Err(e) => {
            let note = format!("the store's spend ledger is unreadable ({e}): it was counted from zero (today's earlier spend is unknown) and is replaced");
            Ok((SpendLedger::default(), Base::At(body.etag), vec![note]))
        }
    }
}

/// Puts the ledger on the ETag it was read at (or only if still absent): the lease is held, so a
/// failed condition means a writer that does not take it.
async fn put(
    section: &Section<'_>,
    ledger: &SpendLedger,
    base: &Base,
) -> Result<(), StoreLedgerError> {
    let key = section.store.keys.spend_ledger();
    let body = bytes::Bytes::from(ledger.to_value().to_string());
    let cond = match base {
        Base::At(etag) => Condition::IfMatch(etag),
        Base::Absent => Condition::IfAbsent,
        Base::Replace => Condition::None,
    };
    let put = section
        .store
        .store
        .put_bytes(&key, body, cond, ObjectKind::SpendLedger);
    match put.await {
        Ok(PutOutcome::Written { .. }) => Ok(()),
        Ok(PutOutcome::PreconditionFailed) => Err(StoreLedgerError::Conflict { key }),
        Err(source) => Err(StoreLedgerError::Store { source }),
    }
}
