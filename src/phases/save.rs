//! Save phase (REQUIREMENTS §11): safety gate, checkpoint, marker, object-store publish (first),
//! then the Actions cache. Each step's failure is reported in the result, never raised.

use std::future::Future;
use std::path::Path;

use crate::cache::{self, CacheError};
use crate::checkpoint::{self, CheckpointOutcome};
use crate::phases::paths::{write_marker, StatePaths};
use crate::runner::failpoint;
use crate::save_result::{safety_gate, CacheSaveResult, GateInputs, SaveOutcome, StorePublish};
use crate::scrub::ScrubOutcome;

pub struct SaveInputs<'a> {
    pub paths: &'a StatePaths,
    pub workspace: &'a Path,
    pub skip_cache: bool,
    pub gate: GateInputs,
    pub cache: Option<&'a cache::Backend>,
    pub save_key: &'a str,
    pub run_id: &'a str,
    pub now_ms: u64,
}

#[derive(Debug, Clone)]
pub struct SaveReport {
    pub result: CacheSaveResult,
    pub checkpoint: Option<CheckpointOutcome>,
    /// What scrubbing secrets out of the database did (`None`: it did not get that far).
    pub scrub: Option<ScrubOutcome>,
    pub store_publish: StorePublish,
    /// The cache answered that the key is already taken (an entry exists or is being written).
    pub key_taken: bool,
}

/// Runs the save. `publish` is called once, after the checkpoint and marker and before the cache
/// write, only when there is something to save; it returns `StorePublish::Disabled` when the store
/// is off and does its own lease check.
pub async fn save<F, Fut>(inputs: SaveInputs<'_>, publish: F) -> SaveReport
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = StorePublish>,
{
    let not_attempted = |result, checkpoint| SaveReport {
        result,
        checkpoint,
        scrub: None,
        store_publish: StorePublish::NotAttempted,
        key_taken: false,
    };
    if let Some(refusal) = safety_gate(inputs.gate) {
        let result =
            CacheSaveResult::new(SaveOutcome::OwnershipDeclined, false, refusal.describe());
        return not_attempted(result, None);
    }
    if inputs.skip_cache {
        let result = CacheSaveResult::new(
            SaveOutcome::SkippedByConfiguration,
            false,
            "skip-cache is set",
        );
        return not_attempted(result, None);
    }
    // Credentials never reach a saved path.
    if let Err(e) = inputs.paths.remove_auth_file() {
        let result = CacheSaveResult::new(
            SaveOutcome::CheckpointDeclined,
            false,
            format!("cannot remove auth.json before saving: {e}"),
        );
        return not_attempted(result, None);
    }
    let db = inputs.paths.db();
    // Secrets out before the checkpoint folds everything into the file that is saved. A failure
    // is reported after the checkpoint and the corruption probe, so a corrupt database still
    // reads as corrupt.
    let scrub_started = std::time::Instant::now();
    let scrubbed = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || crate::scrub::scrub(&db).map_err(|e| e.to_string()))
            .await
            .unwrap_or_else(|e| Err(format!("scrub task failed: {e}")))
    };
    tracing::debug!("scrub took {} ms", scrub_started.elapsed().as_millis());
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
        let result = CacheSaveResult::new(
            SaveOutcome::CheckpointDeclined,
            false,
            format!("the WAL could not be folded into the database: {message}"),
        );
        return not_attempted(result, Some(cp));
    }
    let size = match std::fs::metadata(&db) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        // Unreadable is not empty: declining keeps the state not-persisted, so post retries.
        Err(e) => {
            let result = CacheSaveResult::new(
                SaveOutcome::CheckpointDeclined,
                false,
                format!("cannot read the session database: {e}"),
            );
            return not_attempted(result, Some(cp));
        }
    };
    if size == 0 {
        let result = CacheSaveResult::new(
            SaveOutcome::SkippedEmpty,
            false,
            "no session database to save",
        );
        return not_attempted(result, Some(cp));
    }
    if cp == CheckpointOutcome::NothingToCheckpoint {
        // Nothing opened the file yet: a corrupt database must not become the newest entry,
        // which restore would then discard in favour of nothing.
        let probe = {
            let db = db.clone();
            tokio::task::spawn_blocking(move || checkpoint::probe(&db)).await
        };
        if let Ok(checkpoint::ProbeOutcome::Failed {
            structural: true,
            message,
        }) = probe
        {
            let result = CacheSaveResult::new(
                SaveOutcome::CheckpointDeclined,
                false,
                format!(
                    "the session database is corrupt; not saving it over good memory: {message}"
                ),
            );
            return not_attempted(result, Some(cp));
        }
    }
    let scrub = match scrubbed {
        Ok(outcome) => outcome,
        Err(message) => {
            // Saving would put whatever the agent printed into the cache and the store.
            let result = CacheSaveResult::new(
                SaveOutcome::CheckpointDeclined,
                false,
                format!("secrets could not be scrubbed from the session database: {message}"),
            );
            return not_attempted(result, Some(cp));
        }
    };
    if let Err(e) = write_marker(inputs.paths, inputs.run_id, inputs.now_ms) {
        // The marker is advisory (a missing one reads as compatible): save without it.
        tracing::warn!("cannot write the memory marker: {e}");
        let _ = std::fs::remove_file(inputs.paths.marker());
    }

    failpoint::hit("save:after-marker");
    let store_publish = publish().await;
    let store_persisted = store_publish == StorePublish::Published;

    let mut key_taken = false;
    let result = match inputs.cache {
        None => CacheSaveResult::new(
            SaveOutcome::CacheError,
            store_persisted,
            "no cache service available (ACTIONS_RESULTS_URL/ACTIONS_RUNTIME_TOKEN not set)",
        ),
        Some(cache) if !cache.can_save() => CacheSaveResult::new(
            SaveOutcome::CacheRejected,
            store_persisted,
            "the runner's cache mode does not allow saving (ACTIONS_CACHE_MODE)",
        ),
        Some(cache) => {
            let request = cache::SaveRequest {
                key: inputs.save_key,
                paths: inputs.paths.cache_paths(),
                workspace: inputs.workspace,
            };
            match cache.save(&request).await {
                Ok(receipt) => CacheSaveResult::new(
                    SaveOutcome::Persisted,
                    store_persisted,
                    format!(
                        "saved as `{}` ({} bytes)",
                        inputs.save_key, receipt.size_bytes
                    ),
                ),
                Err(e) => {
                    key_taken = matches!(e, CacheError::AlreadyExists { .. });
                    classify(e, store_persisted)
                }
            }
        }
    };
    SaveReport {
        result,
        checkpoint: Some(cp),
        scrub: Some(scrub),
        store_publish,
        key_taken,
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
