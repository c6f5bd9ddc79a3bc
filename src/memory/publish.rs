//! The object-store publish (docs/design.md#the-store-publish): read-merge-write under the
//! repository lease. The lease is taken here, for this short section only, so runs never skip
//! each other; the put is conditional on the ETag last seen, and when another run published in
//! between, its copy is downloaded, this run's sessions are merged into it (`crate::memory::merge`), and
//! the put is retried — a bounded number of times.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::lease::{self, AcquireOutcome, Holder, Lease, LeaseConfig, LeaseHandle};
use crate::memory::ledger::{OwnRows, PostLease, StoreContext};
use crate::memory::merge::{self, MergeReport, Snapshot};
use crate::memory::report::LeaseReport;
use crate::memory::save_result::StorePublish;
use crate::memory::session_map;
use crate::memory::state_paths::{check_marker, write_marker, MarkerCheck, Scrubbed, StatePaths};
use crate::object_store as store;
use crate::runner::{failpoint, log, Cancellation, FileCommands};

/// The lease must have at least this long left when the session database is put.
const PUBLISH_MIN_REMAINING: Duration = Duration::from_secs(30);
/// Puts tried before giving up: the first, then one per newer copy merged. Under the lease other
/// runs cannot publish, so a second put normally succeeds; more are for runs that could not ask
/// for the lease.
const MAX_PUTS: u32 = 4;
/// How long a run waits for another run's publish section to end. Each section is one merge and
/// one upload, so this is many of them.
pub const LEASE_WAIT: Duration = Duration::from_secs(180);

pub struct PublishInputs<'a> {
    pub store: &'a StoreContext,
    /// A signal ends the wait for the lease: the cache save after the publish still fits the
    /// cancel budget, a wait for another run's section may not.
    pub cancel: &'a Cancellation,
    pub holder: Holder,
    pub files: &'a FileCommands,
    pub paths: &'a StatePaths,
    pub workspace: &'a Path,
    /// The store's ETag when this run restored (`None`: there was no copy).
    pub expected_etag: Option<String>,
    /// The sessions the store's copy had when this run restored it (the store's copies descend
    /// from one another, so a session a newer one lacks was deleted there); an empty snapshot
    /// when the run did not restore from the store. `None`: unknown, so a newer copy is not
    /// merged, nor overwritten.
    pub restored: Option<&'a Snapshot>,
    /// What only this run's database holds, which a merge may move or fold (and then renames).
    pub own_rows: &'a OwnRows,
    /// For the marker rewritten after a merge.
    pub run_id: &'a str,
    pub now_ms: u64,
    pub lease_config: LeaseConfig,
    pub lease_wait: Duration,
}

/// What the publish did, for the summary.
#[derive(Debug, Clone)]
pub struct PublishReport {
    pub outcome: StorePublish,
    /// `None` when the lease was never asked for (store off, nothing to publish).
    pub lease: Option<LeaseReport>,
    /// Puts sent (1 when nobody published in between).
    pub puts: u32,
    /// Times this run waited for another run's publish section.
    pub lease_waits: u32,
    /// Newer copies merged, and what each merge reported (conflicts included).
    pub merges: Vec<MergeReport>,
    /// Why the marker did not follow the published database (`None`: it did, or nothing was
    /// published). The next restore then finds threads by title, with no trust records.
    pub marker_failure: Option<String>,
}

impl From<StorePublish> for PublishReport {
    fn from(outcome: StorePublish) -> Self {
        PublishReport {
            outcome,
            lease: None,
            puts: 0,
            lease_waits: 0,
            merges: Vec::new(),
            marker_failure: None,
        }
    }
}

impl PublishReport {
    /// Summary lines beyond the outcome: retries, waits, merges and every conflict.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.lease_waits > 0 {
            notes.push(format!(
                "waited {} time(s) for another run's publish",
                self.lease_waits
            ));
        }
        if self.puts > 1 {
            notes.push(format!(
                "{} puts: newer memory was published during this run and merged",
                self.puts
            ));
        }
        for m in &self.merges {
            notes.push(format!(
                "merged into newer memory: {} of this run's thread(s) written, {} unchanged on both sides",
                m.taken.len(),
                m.identical
            ));
            notes.extend(m.kept_both.iter().map(session_map::kept_both_note));
            notes.extend(
                m.conflicts
                    .iter()
                    .filter(|c| c.lost_a_turn())
                    .map(|c| c.describe()),
            );
        }
        if let Some(why) = &self.marker_failure {
            notes.push(format!(
                "the marker was not published beside the database ({why}): the next run from the store finds threads by title, with no trust records"
            ));
        }
        notes
    }
}

/// Takes the lease (waiting for another run's section), publishes with read-merge-write, and
/// releases the lease. Never fails the run: every outcome is a value.
pub async fn publish(inputs: PublishInputs<'_>) -> PublishReport {
    let (acquired, lease_waits) = take_lease(&inputs).await;
    let handle = match acquired {
        AcquireOutcome::Acquired(handle) => handle,
        AcquireOutcome::HeldByOther { holder_id, .. } if inputs.cancel.is_cancelled() => {
            let reason = format!(
                "the run was cancelled while {holder_id} held the lease; this run's memory is in the Actions cache only, and the next run merges it"
            );
            return withheld(
                reason,
                LeaseReport::HeldByOther { holder: holder_id },
                lease_waits,
            );
        }
        AcquireOutcome::HeldByOther { holder_id, .. } => {
            let reason = format!(
                "the lease stayed with {holder_id} for {} s; this run's memory is in the Actions cache only, and the next run merges it",
                inputs.lease_wait.as_secs()
            );
            return withheld(
                reason,
                LeaseReport::HeldByOther { holder: holder_id },
                lease_waits,
            );
        }
        AcquireOutcome::Error { error } => {
            let message = error.to_string();
            let reason = format!("cannot ask for the lease: {message}");
            return withheld(reason, LeaseReport::Error { message }, lease_waits);
        }
    };
    let watch = PostLease::REPO.keep_for_post(inputs.files, &handle);
    let lease_report = LeaseReport::Acquired {
        generation: handle.generation(),
    };
    let mut report = put_merging(&inputs, &handle).await;
    report.lease = Some(lease_report);
    report.lease_waits = lease_waits;
    watch.abort();
    match handle.release().await {
        lease::ReleaseOutcome::Released => PostLease::REPO.clear(inputs.files),
        lease::ReleaseOutcome::NotHeld => {}
        // Post releases it from the state saved above, or it expires by itself.
        lease::ReleaseOutcome::Failed { error } => {
            tracing::warn!("cannot release the memory lease: {error}")
        }
    }
    report
}

/// The lease: one ask, then (held by another run, and not cancelled) the wait for its section to
/// end, said in the log.
async fn take_lease(inputs: &PublishInputs<'_>) -> (AcquireOutcome, u32) {
    let (store, key) = (&inputs.store.store, inputs.store.keys.lease());
    let clock: Arc<dyn lease::Clock> = Arc::new(lease::SystemClock);
    let first = Lease::acquire(
        store,
        key,
        &inputs.holder,
        inputs.lease_config,
        clock.clone(),
    )
    .await;
    let AcquireOutcome::HeldByOther { holder_id, .. } = &first else {
        return (first, 0);
    };
    if inputs.cancel.is_cancelled() {
        return (first, 0);
    }
    tracing::info!(
        "{WAITING_FOR_LEASE} {holder_id} (at most {} s)",
        inputs.lease_wait.as_secs()
    );
    let (outcome, waits) = Lease::acquire_waiting(
        store,
        key,
        &inputs.holder,
        inputs.lease_config,
        clock,
        inputs.lease_wait,
        inputs.cancel.token(),
    )
    .await;
    (outcome, waits)
}

/// What the log says while the publish waits for another run's section.
pub const WAITING_FOR_LEASE: &str = "waiting for the memory lease, held by";

fn withheld(reason: String, lease: LeaseReport, lease_waits: u32) -> PublishReport {
    PublishReport {
        lease: Some(lease),
        lease_waits,
        ..PublishReport::from(withheld_outcome(reason))
    }
}

fn withheld_outcome(reason: String) -> StorePublish {
    log::warning(&format!(
        "memory not published to the object store: {reason}"
    ));
    StorePublish::Withheld { reason }
}

/// The put loop under a held lease: conditional put; on a precondition failure, merge this run's
/// sessions into the newer copy and put that, on the newer ETag.
async fn put_merging(inputs: &PublishInputs<'_>, handle: &LeaseHandle) -> PublishReport {
    let mut report = PublishReport::from(StorePublish::NotAttempted);
    let mut expected = inputs.expected_etag.clone();
    // The merged file, once there is one; this run's own database is never modified until a put
    // of the merged result succeeds.
    let mut merged: Option<Newer> = None;
    loop {
        if let Some(reason) = gate(handle).await {
            report.outcome = withheld_outcome(reason);
            return report;
        }
        failpoint::hit("save:before-publish");
        let candidate = merged
            .as_ref()
            .map_or(inputs.paths.db(), |newer| newer.merged.clone());
        report.puts += 1;
        let put = store::sync::publish_session_db(
            &inputs.store.store,
            &inputs.store.keys,
            &candidate,
            expected.as_deref(),
        )
        .await;
        match put {
            store::PublishOutcome::Published { .. } => {
                report.outcome = match merged {
                    Some(newer) => adopt_merged(inputs, &newer),
                    None => StorePublish::Published,
                };
                report.marker_failure = publish_marker(inputs).await;
                return report;
            }
            store::PublishOutcome::Failed { error } => {
                log::warning(&format!(
                    "publishing memory to the object store failed: {error}"
                ));
                report.outcome = StorePublish::Failed {
                    message: error.to_string(),
                };
                return report;
            }
            store::PublishOutcome::Conflict if report.puts >= MAX_PUTS => {
                log::warning(&format!(
                    "the object store's memory changed under each of {MAX_PUTS} puts; not overwriting it"
                ));
                report.outcome = StorePublish::Conflict;
                return report;
            }
            store::PublishOutcome::Conflict => {}
        }
        match merge_newer(inputs).await {
            Ok(newer) => {
                report.merges.push(newer.report.clone());
                expected = Some(newer.etag.clone());
                merged = Some(newer);
            }
            Err(reason) => {
                log::warning(&format!(
                    "another run published newer memory to the object store, and it cannot be merged ({reason}); not overwriting it"
                ));
                report.outcome = StorePublish::Conflict;
                return report;
            }
        }
        // Only runs without the lease can still race us: spread the retries out.
        if report.puts > 1 {
            let pause = Duration::from_millis(100).mul_f64(0.5 + rand::random::<f64>());
            tokio::time::sleep(pause * report.puts).await;
        }
    }
}

/// Puts the marker beside the database just published, still under the lease; why it did not
/// go, if it did not. A marker that names another database (a merged copy this run could not
/// adopt) is put all the same: restore believes a marker only beside the database it names.
async fn publish_marker(inputs: &PublishInputs<'_>) -> Option<String> {
    let marker = inputs.paths.marker();
    if !marker.is_file() {
        return Some("this run has no marker; the save could not write it".into());
    }
    match store::sync::publish_marker(&inputs.store.store, &inputs.store.keys, &marker).await {
        store::UploadOutcome::Uploaded { .. } => None,
        store::UploadOutcome::Failed { error } => {
            log::warning(&format!(
                "the memory marker was not published to the object store: {error}"
            ));
            Some(error.to_string())
        }
    }
}

/// Why the lease does not allow a put now; a renewal may buy the time, never revive a lost lease.
async fn gate(handle: &LeaseHandle) -> Option<String> {
    let mut gate = handle.publish_gate(PUBLISH_MIN_REMAINING);
    if let lease::PublishGate::TooLittleTime { .. } = gate {
        handle.renew_now().await;
        gate = handle.publish_gate(PUBLISH_MIN_REMAINING);
    }
    match gate {
        lease::PublishGate::Open { .. } => None,
        lease::PublishGate::Lost(why) => Some(format!("the lease was lost: {why:?}")),
        lease::PublishGate::Released => Some("the lease was already released".to_string()),
        lease::PublishGate::TooLittleTime { remaining_ms } => Some(format!(
            "the lease has only {remaining_ms} ms left, too little to upload"
        )),
    }
}

/// A newer copy of the store's, with this run's sessions merged into it.
struct Newer {
    /// Holds the download and the merge until the put is done.
    _dir: tempfile::TempDir,
    merged: PathBuf,
    /// The copy's ETag, for the next put.
    etag: String,
    report: MergeReport,
    /// The copy's sessions as it was published, and its marker when one names it: the records
    /// and map of the run that published it.
    theirs: Option<Snapshot>,
    their_marker: Option<crate::memory::state_paths::Marker>,
}

/// Downloads the store's current copy and merges this run's sessions into it, in a temp dir of
/// its own; reads the copy's marker too, believed only if it names that copy.
async fn merge_newer(inputs: &PublishInputs<'_>) -> Result<Newer, String> {
    let Some(restored) = inputs.restored.cloned() else {
        return Err("what this run restored is unknown".into());
    };
    let dir = tempfile::Builder::new()
        .prefix(".fro-bot-merge")
        .tempdir_in(&inputs.paths.data_dir)
        .map_err(|e| format!("cannot make a scratch dir: {e}"))?;
    let (store, keys) = (&inputs.store.store, &inputs.store.keys);
    let (etag, sha256) = match store::sync::restore_session_db(store, keys, dir.path()).await {
        store::StoreRestore::Hit { etag, sha256, .. } => (etag, sha256),
        // Deleted since the put failed: the next put (on no ETag) decides.
        store::StoreRestore::Miss => return Err("the newer copy disappeared".into()),
        store::StoreRestore::Failed { error } => {
            return Err(format!("cannot download it: {error}"))
        }
    };
    let their_marker = match crate::memory::restore::fetch_store_marker(inputs.store, &sha256).await
    {
        Ok(found) => found.map(|(_, marker)| marker),
        Err(why) => {
            tracing::info!("the newer copy's marker is not used: {why}");
            None
        }
    };
    let base = dir.path().join(store::keys::SESSION_DB_NAME);
    let out = dir.path().join("merged.db");
    let ours = inputs.paths.db();
    let own = inputs.own_rows.messages();
    // The copy's session of this run's thread, when another run started it too.
    let same_thread = inputs.own_rows.thread().and_then(|(key, mine)| {
        let theirs = their_marker.as_ref()?.sessions.as_ref()?.get(&key)?;
        (*theirs != mine).then(|| (mine, theirs.clone()))
    });
    let (merged, theirs) = {
        let out = out.clone();
        tokio::task::spawn_blocking(move || {
            let theirs = Snapshot::capture(&base).ok();
            let options = merge::MergeOptions {
                own_messages: Some(&own),
                same_thread: same_thread.as_ref().map(|(m, t)| (m.as_str(), t.as_str())),
                ..Default::default()
            };
            (
                merge::merge_with(&base, &ours, &restored, &out, options),
                theirs,
            )
        })
        .await
        .map_err(|e| format!("merge task failed: {e}"))?
    };
    let report = merged.map_err(|e| e.to_string())?;
    tracing::info!(
        "merged this run's sessions into newer memory in {} ms",
        (report.copy_time + report.merge_time + report.sync_time).as_millis()
    );
    Ok(Newer {
        _dir: dir,
        merged: out,
        etag,
        report,
        theirs,
        their_marker,
    })
}

/// The merged database is what the store now holds: it replaces this run's database, with a
/// marker naming both runs' threads, so the Actions cache entry saved next holds the same.
fn adopt_merged(inputs: &PublishInputs<'_>, newer: &Newer) -> StorePublish {
    let db = inputs.paths.db();
    // What this run wrote, to tell which merged sessions keep their trust records.
    let ours = merge::Snapshot::capture(&db).ok();
    let adopted = crate::memory::checkpoint::remove_stale_sidecars(&db)
        .and_then(|()| std::fs::rename(&newer.merged, &db));
    if let Err(e) = adopted {
        // The store holds the merged copy; the cache entry then holds this run's own, which the
        // next run's restore prefers less (docs/design.md#the-store-publish).
        log::warning(&format!(
            "the merged memory was published but cannot replace this run's database: {e}"
        ));
        return StorePublish::Published;
    }
    // The result is this run's database now.
    inputs.own_rows.adopted(&newer.report);
    // The marker the save wrote just before the publish holds this run's map and trust records
    // (docs/security.md#trust-follows-memory).
    let (mut ours_map, mut ours_trust) = match check_marker(&inputs.paths.marker()) {
        MarkerCheck::Compatible(marker) => (marker.sessions, marker.trust.unwrap_or_default()),
        MarkerCheck::Missing
        | MarkerCheck::Unreadable { .. }
        | MarkerCheck::VersionMismatch { .. } => (None, Default::default()),
    };
    // This run's thread session folded into the other run's continues as that one.
    for (from, into) in &newer.report.folded {
        for session in ours_map.iter_mut().flat_map(|m| m.values_mut()) {
            if session == from {
                *session = into.clone();
            }
        }
        if let Some(record) = ours_trust.remove(from) {
            ours_trust.insert(into.clone(), record);
        }
    }
    let (their_map, their_trust) = match &newer.their_marker {
        Some(m) => (m.sessions.clone(), m.trust.clone().unwrap_or_default()),
        None => (None, Default::default()),
    };
    let map = ours_map.map(|ours| match their_map {
        Some(mut theirs) => {
            theirs.extend(ours);
            theirs
        }
        // No marker of theirs: their threads are found as a store restore without one finds them.
        None => session_map::after_merge(&db, inputs.workspace, &ours),
    });
    let trust = match (&ours, inputs.restored, merge::Snapshot::capture(&db)) {
        (Some(ours), Some(restored), Ok(merged)) => {
            let mut trust = session_map::trust_after_merge(&ours_trust, ours, restored, &merged);
            // Theirs hold for the sessions whose merged version is theirs; the lower one where
            // both runs' records hold.
            if let Some(theirs) = &newer.theirs {
                let kept = session_map::trust_after_merge(&their_trust, theirs, theirs, &merged);
                crate::trust::join_lowering(&mut trust, kept);
            }
            let joined = newer.report.kept_both.iter().flat_map(|k| &k.sessions);
            session_map::trust_of_joined(&mut trust, &ours_trust, &their_trust, joined);
            trust
        }
        // Without the versions nothing tells whose a session is: no records (the lowest).
        _ => crate::trust::TrustMap::new(),
    };
    if let Err(e) = write_marker(
        inputs.paths,
        inputs.run_id,
        inputs.now_ms,
        map.as_ref(),
        Some(&trust),
        // The store's newer copy went in after this run's scrub.
        Scrubbed::NotVouched,
        None,
    ) {
        tracing::warn!("cannot rewrite the memory marker after the merge: {e}");
        let _ = std::fs::remove_file(inputs.paths.marker());
    }
    StorePublish::Published
}
