//! The save (docs/design.md#the-save-order): the safety gate and shadow guard, credentials off the
//! saved paths, the scrub, the checkpoint, entries saved meanwhile merged in (`cache_merge`), the
//! marker, the object-store publish (first; `publish`), then the Actions cache and entries
//! committed meanwhile merged and saved again. Each step's failure is reported in the result,
//! never raised.

use std::future::Future;
use std::path::{Path, PathBuf};

use crate::cache::{self, CacheError};
use crate::memory::cache_merge::{
    merge_newer_entries, merge_saved_meanwhile, CacheMergeInputs, CacheMergeReport, MAX_RESAVES,
};
use crate::memory::checkpoint::{self, CheckpointOutcome};
use crate::memory::ledger::RestoredCopy;
use crate::memory::publish::PublishReport;
use crate::memory::save_result::{
    safety_gate, CacheSaveResult, GateInputs, SaveOutcome, StorePublish,
};
use crate::memory::scrub::ScrubOutcome;
use crate::memory::session_map::Map;
use crate::memory::state_paths::{write_marker, FileDigest, Scrubbed, StatePaths};
use crate::runner::{env, failpoint};

pub struct SaveInputs<'a> {
    pub paths: &'a StatePaths,
    pub workspace: &'a Path,
    pub skip_cache: bool,
    pub gate: GateInputs,
    pub cache: Option<&'a cache::Backend>,
    pub save_key: &'a str,
    pub run_id: &'a str,
    pub now_ms: u64,
    /// From the restore: a new entry would hide older memory, so nothing is saved.
    pub shadow_guard: Option<&'a str>,
    /// The session map to record in the marker; `None` keeps the one on disk.
    pub sessions: Option<&'a Map>,
    /// The trust records to record in the marker (docs/security.md#trust-follows-memory);
    /// `None` keeps the ones on disk.
    pub trust: Option<&'a crate::trust::TrustMap>,
    /// The database as restored: when the one to save is identical, nothing is uploaded.
    pub restored: Option<&'a RestoredCopy>,
    /// Merge what other runs saved to the cache meanwhile (`None`: post, which cannot).
    pub cache_merge: Option<CacheMergeInputs<'a>>,
    /// What the scrub reads (docs/security.md#scrubbed-memory).
    pub scrub_scope: &'a crate::memory::scrub::Scope,
}

#[derive(Debug, Clone)]
pub struct SaveReport {
    pub result: CacheSaveResult,
    pub checkpoint: Option<CheckpointOutcome>,
    /// What scrubbing secrets out of the database did (`None`: it did not get that far).
    pub scrub: Option<ScrubOutcome>,
    pub publish: PublishReport,
    pub cache_merge: CacheMergeReport,
    /// The cache answered that the key is already taken (an entry exists or is being written).
    pub key_taken: bool,
}

impl SaveReport {
    /// No save: the run was cancelled before the agent's turn, so memory is what the cache and
    /// the store already hold (`phases::run::memory_changed`).
    pub(crate) fn cancelled_before_turn() -> Self {
        let detail = "the run was cancelled before the agent's turn, so it changed no memory; \
                      the cache and the store keep what they held";
        SaveReport {
            result: CacheSaveResult::new(SaveOutcome::CancelledBeforeTurn, false, detail),
            checkpoint: None,
            scrub: None,
            publish: PublishReport::from(StorePublish::NotAttempted),
            cache_merge: CacheMergeReport::default(),
            key_taken: false,
        }
    }
}

/// Runs the save. `publish` is called once, after the checkpoint and marker and before the cache
/// write, only when there is something to save; it reports `StorePublish::Disabled` when the store
/// is off, and takes the lease itself (`memory::publish`). A merged result it published replaces
/// the database, so the cache entry holds the same.
pub async fn save<F, Fut>(inputs: SaveInputs<'_>, publish: F) -> SaveReport
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = PublishReport>,
{
    let not_saved = |result, checkpoint| SaveReport {
        result,
        checkpoint,
        scrub: None,
        publish: PublishReport::from(StorePublish::NotAttempted),
        cache_merge: CacheMergeReport::default(),
        key_taken: false,
    };
    let (cp, scrub) = match prepare(&inputs).await {
        Ok(prepared) => prepared,
        Err((result, checkpoint)) => return not_saved(result, checkpoint),
    };
    let not_saved = |result, checkpoint| SaveReport {
        scrub: Some(scrub.clone()),
        ..not_saved(result, checkpoint)
    };
    let digest = match changed_since_restore(&inputs) {
        Ok(digest) => digest,
        Err(unchanged) => return not_saved(unchanged, Some(cp)),
    };
    // The restore's merges are in this run's map and records already (`run::restore_memory`, so
    // a session this run wrote keeps its own lowered record): only the save's are joined here.
    let (earlier, cache_merge) = match &inputs.cache_merge {
        Some(merge) => (
            merge.earlier.cloned().unwrap_or_default(),
            merge_newer_entries(merge).await,
        ),
        None => Default::default(),
    };
    mark(&inputs, &cache_merge, digest);
    failpoint::hit("save:after-marker");
    let publish = publish().await;
    let store_persisted = publish.outcome == StorePublish::Published;
    let mut cache_merge = cache_merge;
    let (result, key_taken) = cache_and_resave(&inputs, &mut cache_merge, store_persisted).await;
    SaveReport {
        result,
        checkpoint: Some(cp),
        scrub: Some(scrub),
        publish,
        cache_merge: earlier.then(cache_merge),
        key_taken,
    }
}

/// The database as the scrub and checkpoint left it, read once, for the marker (unless a merge
/// replaces it); `Err`: the result when it is the restored database unchanged.
fn changed_since_restore(inputs: &SaveInputs<'_>) -> Result<Option<FileDigest>, CacheSaveResult> {
    let Some(copy) = inputs.restored else {
        return Ok(None);
    };
    match FileDigest::of(&inputs.paths.db()) {
        Ok(digest) if digest.sha256 == copy.sha256 => {
            let detail = format!(
                "unchanged since restore: {} already holds it; nothing uploaded",
                copy.holder()
            );
            Err(CacheSaveResult::unchanged(copy.cache_key.is_some(), detail))
        }
        Ok(digest) => Ok(Some(digest)),
        Err(_) => Ok(None),
    }
}

/// The marker beside the database: its maps after the cache merge, and what fro-bot vouches for.
/// A merged entry replaced the database (`cache_merge::merge_one`, by rename): its digest is taken
/// again, and other runs' memory is not this save's to vouch for.
fn mark(inputs: &SaveInputs<'_>, cache_merge: &CacheMergeReport, digest: Option<FileDigest>) {
    let (sessions, trust) = marker_maps(inputs, cache_merge);
    let (scrubbed, digest) = match cache_merge.merged.is_empty() {
        true => (Scrubbed::Whole, digest),
        false => (Scrubbed::NotVouched, None),
    };
    let marker = write_marker(
        inputs.paths,
        inputs.run_id,
        inputs.now_ms,
        sessions.as_ref(),
        trust.as_ref(),
        scrubbed,
        digest,
    );
    if let Err(e) = marker {
        // The marker is advisory (a missing one reads as compatible): save without it.
        tracing::warn!("cannot write the memory marker: {e}");
        let _ = std::fs::remove_file(inputs.paths.marker());
    }
}

/// The Actions cache entry, then the merge of entries committed meanwhile saved again
/// (`resave_merged`); the result and whether the key was taken.
async fn cache_and_resave(
    inputs: &SaveInputs<'_>,
    cache_merge: &mut CacheMergeReport,
    store_persisted: bool,
) -> (CacheSaveResult, bool) {
    let (mut result, key_taken) = save_to_cache(inputs, inputs.save_key, store_persisted).await;
    if result.outcome == SaveOutcome::Persisted {
        if let Some(merge) = &inputs.cache_merge {
            if let Some(again) = resave_merged(inputs, merge, cache_merge, store_persisted).await {
                result = again;
            }
        }
    }
    (result, key_taken)
}

/// The marker's session map and trust records after merging cache entries: theirs, with this
/// run's over them; a session whose merged version is another run's takes that run's record, and
/// the lower one where both hold it (docs/security.md#trust-follows-memory).
fn marker_maps(
    inputs: &SaveInputs<'_>,
    merged: &CacheMergeReport,
) -> (Option<Map>, Option<crate::trust::TrustMap>) {
    let sessions = inputs.sessions.map(|ours| {
        let mut map = ours.clone();
        merged.join_sessions_into(&mut map);
        map
    });
    let trust = inputs.trust.map(|ours| {
        let mut trust = ours.clone();
        merged.join_trust_into(&mut trust);
        trust
    });
    (sessions, trust)
}

/// Entries other runs committed while this one saved may lack its sessions; the newest of them is
/// what the next run restores. When one did, the merge of them is saved again under
/// `{save key}-{n}` (docs/design.md#concurrent-runs); the first entry stands if that fails.
async fn resave_merged(
    inputs: &SaveInputs<'_>,
    merge: &CacheMergeInputs<'_>,
    report: &mut CacheMergeReport,
    store_persisted: bool,
) -> Option<CacheSaveResult> {
    let mut own = vec![inputs.save_key.to_string()];
    let mut last = None;
    for round in 1..=MAX_RESAVES {
        if !merge_saved_meanwhile(merge, report, &own).await {
            break;
        }
        let (sessions, trust) = marker_maps(inputs, report);
        if let Err(e) = write_marker(
            inputs.paths,
            inputs.run_id,
            inputs.now_ms,
            sessions.as_ref(),
            trust.as_ref(),
            Scrubbed::NotVouched,
            None,
        ) {
            tracing::warn!("cannot rewrite the memory marker: {e}");
        }
        let key = format!("{}-{}", inputs.save_key, round + 1);
        let (result, _) = save_to_cache(inputs, &key, store_persisted).await;
        if result.outcome != SaveOutcome::Persisted {
            report.skipped.push(format!(
                "saving the merge again as `{key}` failed: {}",
                result.detail
            ));
            break;
        }
        own.push(key);
        last = Some(result);
    }
    last
}

/// Why nothing is saved: the result, and the checkpoint when it ran.
type NotSaved = (CacheSaveResult, Option<CheckpointOutcome>);

/// Everything before anything is written: the safety gate, `skip-cache`, credentials off the saved
/// paths, secrets out of the database, the WAL checkpoint, and a database worth saving (not
/// empty, not corrupt).
async fn prepare(inputs: &SaveInputs<'_>) -> Result<(CheckpointOutcome, ScrubOutcome), NotSaved> {
    if let Some(result) = refused(inputs) {
        return Err((result, None));
    }
    clear_saved_paths(inputs.paths).map_err(|result| (result, None))?;
    let db = inputs.paths.db();
    // Secrets out before the checkpoint folds everything into the file that is saved. A failure
    // is reported after the checkpoint and the corruption probe, so a corrupt database still
    // reads as corrupt.
    let scrubbed = scrub(db.clone(), inputs.scrub_scope.clone()).await;
    failpoint::hit("save:after-scrub");
    let cp = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || checkpoint::checkpoint(&db))
            .await
            .unwrap_or_else(|e| CheckpointOutcome::Failed {
                structural: false,
                message: format!("checkpoint task failed: {e}"),
            })
    };
    failpoint::hit("save:after-checkpoint");
    if let CheckpointOutcome::Failed { message, .. } = &cp {
        let detail = format!("the WAL could not be folded into the database: {message}");
        return Err((declined(detail), Some(cp)));
    }
    if let Err(result) = worth_saving(db, &cp).await {
        return Err((result, Some(cp)));
    }
    match scrubbed {
        Ok(scrub) => Ok((cp, scrub)),
        // Saving would put whatever the agent printed into the cache and the store.
        Err(message) => Err((
            declined(format!(
                "secrets could not be scrubbed from the session database: {message}"
            )),
            Some(cp),
        )),
    }
}

fn declined(detail: String) -> CacheSaveResult {
    CacheSaveResult::new(SaveOutcome::CheckpointDeclined, false, detail)
}

/// Why nothing may be saved, before anything is touched: the safety gate, the shadow guard,
/// `skip-cache`.
fn refused(inputs: &SaveInputs<'_>) -> Option<CacheSaveResult> {
    if let Some(refusal) = safety_gate(inputs.gate) {
        let result =
            CacheSaveResult::new(SaveOutcome::OwnershipDeclined, false, refusal.describe());
        return Some(result);
    }
    if let Some(reason) = inputs.shadow_guard {
        let result = CacheSaveResult::new(SaveOutcome::ShadowingDeclined, false, reason);
        return Some(result);
    }
    inputs.skip_cache.then(|| {
        CacheSaveResult::new(
            SaveOutcome::SkippedByConfiguration,
            false,
            "skip-cache is set",
        )
    })
}

/// What must never reach a saved path: credentials, and the legacy JSON storage, which the scrub
/// does not read (OpenCode 1.18 reads nothing there; the restore drops it too).
fn clear_saved_paths(paths: &StatePaths) -> Result<(), CacheSaveResult> {
    paths
        .remove_auth_file()
        .map_err(|e| declined(format!("cannot remove auth.json before saving: {e}")))?;
    paths
        .remove_legacy_storage()
        .map_err(|e| declined(format!("cannot remove storage/ before saving: {e}")))?;
    Ok(())
}

/// A database worth saving after the checkpoint `cp`: there is one, and it is not corrupt.
async fn worth_saving(db: PathBuf, cp: &CheckpointOutcome) -> Result<(), CacheSaveResult> {
    let size = match std::fs::metadata(&db) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        // Unreadable is not empty: declining keeps the state not-persisted, so post retries.
        Err(e) => return Err(declined(format!("cannot read the session database: {e}"))),
    };
    if size == 0 {
        let result = CacheSaveResult::new(
            SaveOutcome::SkippedEmpty,
            false,
            "no session database to save",
        );
        return Err(result);
    }
    if *cp == CheckpointOutcome::NothingToCheckpoint {
        // Nothing opened the file yet: a corrupt database must not become the newest entry,
        // which restore would then discard in favour of nothing.
        let probe = tokio::task::spawn_blocking(move || checkpoint::probe(&db)).await;
        if let Ok(checkpoint::ProbeOutcome::Failed {
            structural: true,
            message,
        }) = probe
        {
            let detail = format!(
                "the session database is corrupt; not saving it over good memory: {message}"
            );
            return Err(declined(detail));
        }
    }
    Ok(())
}

/// Secrets out of the database (docs/security.md), off the async threads.
async fn scrub(
    db: std::path::PathBuf,
    scope: crate::memory::scrub::Scope,
) -> Result<ScrubOutcome, String> {
    let started = std::time::Instant::now();
    let outcome = tokio::task::spawn_blocking(move || crate::memory::scrub::scrub(&db, &scope))
        .await
        .map_err(|e| format!("scrub task failed: {e}"))?
        .map_err(|e| e.to_string());
    tracing::debug!("scrub took {} ms", started.elapsed().as_millis());
    outcome
}

/// The Actions cache write; also whether the key was already taken (post's fallback key).
async fn save_to_cache(
    inputs: &SaveInputs<'_>,
    key: &str,
    store_persisted: bool,
) -> (CacheSaveResult, bool) {
    let cache = match inputs.cache {
        None => {
            let detail = format!("no cache service available ({})", cache::select::missing());
            return (
                CacheSaveResult::new(SaveOutcome::CacheError, store_persisted, detail),
                false,
            );
        }
        Some(cache) if !cache.can_save() => {
            let detail = format!(
                "the runner's cache mode does not allow saving ({})",
                env::ACTIONS_CACHE_MODE
            );
            return (
                CacheSaveResult::new(SaveOutcome::CacheRejected, store_persisted, detail),
                false,
            );
        }
        Some(cache) => cache,
    };
    let request = cache::SaveRequest {
        key,
        paths: inputs.paths.cache_paths(),
        workspace: inputs.workspace,
    };
    match cache.save(&request).await {
        Ok(receipt) => {
            let detail = format!("saved as `{key}` ({} bytes)", receipt.size_bytes);
            let result = CacheSaveResult::new(SaveOutcome::Persisted, store_persisted, detail);
            (result, false)
        }
        Err(e) => {
            let key_taken = matches!(e, CacheError::AlreadyExists { .. });
            (classify(e, store_persisted), key_taken)
        }
    }
}

fn classify(error: CacheError, store_persisted: bool) -> CacheSaveResult {
    let outcome = if error.is_rejection() {
        SaveOutcome::CacheRejected
    } else {
        SaveOutcome::CacheError
    };
    CacheSaveResult::new(outcome, store_persisted, error.to_string())
}
