//! Restore phase (docs/design.md#the-restore-order): object store first when enabled, else the
//! Actions cache; then validation. It never fails the run: every failure degrades to an empty state
//! with a warning.

use std::path::Path;

use crate::cache::{self, CacheError, RestoreOutcome};
use crate::checkpoint::{self, CheckpointOutcome, ProbeOutcome};
use crate::object_store as store;
use crate::phases::context::StoreContext;
use crate::phases::paths::{check_marker, MarkerCheck, StatePaths};
use crate::phases::report::{CacheStatus, RestoreReport, RestoreSource};

/// The object-store side of a restore, as the phase needs it (filled by the caller, which owns the
/// store client and key layout).
pub enum StoreAttempt {
    /// The store is off (not configured, or a fork pull request).
    Disabled,
    /// `sessions/opencode.db` was downloaded into the data dir.
    Hit {
        etag: String,
    },
    Miss,
    Failed {
        message: String,
    },
}

pub struct RestoreInputs<'a> {
    pub paths: &'a StatePaths,
    pub workspace: &'a Path,
    pub skip_cache: bool,
    pub cache: Option<&'a cache::Backend>,
    /// Lookup key (the primary key: never written, so it only ever prefix-matches).
    pub key: &'a str,
    pub restore_keys: &'a [String],
}

/// How a restored data dir checked out.
enum Validation {
    Valid,
    /// Positive corruption or an incompatible storage version: memory must be discarded.
    Discard {
        reason: String,
    },
}

/// Runs the restore. `store` is awaited first (only when not skipping) so a store hit avoids the
/// cache download entirely.
pub async fn restore(
    inputs: RestoreInputs<'_>,
    store: impl std::future::Future<Output = StoreAttempt>,
) -> RestoreReport {
    let mut report = RestoreReport::miss();
    if inputs.skip_cache {
        report
            .notes
            .push("skip-cache is set: starting without memory".into());
        return report;
    }
    let mut discarded = false;

    match store.await {
        StoreAttempt::Disabled => {}
        StoreAttempt::Hit { etag } => match validate(inputs.paths, &mut report.notes).await {
            Validation::Valid => {
                report.status = CacheStatus::Hit;
                report.source = RestoreSource::Storage;
                report.store_etag = Some(etag);
                return report;
            }
            Validation::Discard { reason } => {
                discard(inputs.paths, &reason, &mut report.notes);
                discarded = true;
                // The ETag still names what the store holds: publishing over it is a deliberate
                // replacement of corrupt memory, not a lost update.
                report.store_etag = Some(etag);
            }
        },
        StoreAttempt::Miss => report
            .notes
            .push("object store: no session database yet".into()),
        StoreAttempt::Failed { message } => {
            warn(
                &mut report.notes,
                format!("object store restore failed: {message}"),
            );
        }
    }

    let Some(cache) = inputs.cache else {
        report.notes.push("no cache service available".into());
        return finish(report, discarded);
    };
    if !cache.can_restore() {
        report
            .notes
            .push("the runner's cache mode does not allow restoring".into());
        return finish(report, discarded);
    }
    let request = cache::RestoreRequest {
        key: inputs.key,
        restore_keys: inputs.restore_keys,
        paths: inputs.paths.restore_targets(),
        workspace: inputs.workspace,
    };
    match cache.restore(&request).await {
        Ok(RestoreOutcome::Hit { matched_key, .. }) => {
            // The entry's database is complete on its own; a WAL left beside it from an older
            // database would be replayed into the new one and corrupt it.
            if let Err(e) = checkpoint::remove_stale_sidecars(&inputs.paths.db()) {
                warn(
                    &mut report.notes,
                    format!("cannot remove a stale WAL/SHM: {e}"),
                );
            }
            match validate(inputs.paths, &mut report.notes).await {
                Validation::Valid => {
                    report.status = CacheStatus::Hit;
                    report.source = RestoreSource::Cache;
                    report.matched_key = Some(matched_key);
                    return report;
                }
                Validation::Discard { reason } => {
                    discard(inputs.paths, &reason, &mut report.notes);
                    discarded = true;
                }
            }
        }
        Ok(RestoreOutcome::Miss) => report.notes.push("Actions cache: no entry".into()),
        Err(CacheError::Cancelled) => warn(&mut report.notes, "restore cancelled".into()),
        Err(e) => warn(
            &mut report.notes,
            format!("Actions cache restore failed: {e}"),
        ),
    }
    finish(report, discarded)
}

fn finish(mut report: RestoreReport, discarded: bool) -> RestoreReport {
    if discarded {
        report.status = CacheStatus::Corrupted;
    }
    report
}

fn warn(notes: &mut Vec<String>, message: String) {
    tracing::warn!("{message}");
    notes.push(message);
}

fn discard(paths: &StatePaths, reason: &str, notes: &mut Vec<String>) {
    match checkpoint::clean_storage(&paths.data_dir) {
        Ok(_) => warn(
            notes,
            format!("restored memory discarded ({reason}); starting clean"),
        ),
        Err(e) => warn(
            notes,
            format!("restored memory is unusable ({reason}) and could not be removed: {e}"),
        ),
    }
    let _ = std::fs::remove_file(paths.marker());
}

/// Checks what was just restored: a readable data dir, our storage version, a database that SQLite
/// can read (checkpointing a restored WAL, or probing when there is none). Removes `auth.json`.
async fn validate(paths: &StatePaths, notes: &mut Vec<String>) -> Validation {
    match paths.remove_auth_file() {
        Ok(true) => warn(
            notes,
            "removed an auth.json that came with restored memory".into(),
        ),
        Ok(false) => {}
        Err(e) => warn(notes, format!("cannot remove a restored auth.json: {e}")),
    }
    if let Err(e) = std::fs::read_dir(&paths.data_dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Validation::Discard {
                reason: format!("data dir unreadable: {e}"),
            };
        }
    }
    match check_marker(&paths.marker()) {
        MarkerCheck::VersionMismatch { found } => {
            return Validation::Discard {
                reason: format!(
                    "storage version {found}, this fro-bot reads version {}",
                    crate::phases::paths::STORAGE_VERSION
                ),
            }
        }
        MarkerCheck::Unreadable { message } => warn(
            notes,
            format!("marker file unreadable ({message}); treating as compatible"),
        ),
        MarkerCheck::Missing | MarkerCheck::Compatible(_) => {}
    }
    let db = paths.db();
    let outcome = tokio::task::spawn_blocking(move || {
        let cp = checkpoint::checkpoint(&db);
        let probe = match cp {
            CheckpointOutcome::NothingToCheckpoint if db.is_file() => Some(checkpoint::probe(&db)),
            _ => None,
        };
        (cp, probe)
    })
    .await;
    let (cp, probe) = match outcome {
        Ok(pair) => pair,
        Err(e) => {
            warn(notes, format!("validation task failed: {e}"));
            return Validation::Valid;
        }
    };
    match (cp, probe) {
        (
            CheckpointOutcome::Failed {
                structural: true,
                message,
            },
            _,
        )
        | (
            _,
            Some(ProbeOutcome::Failed {
                structural: true,
                message,
            }),
        ) => Validation::Discard {
            reason: format!("corrupt database: {message}"),
        },
        (
            CheckpointOutcome::Failed {
                structural: false,
                message,
            },
            _,
        )
        | (
            _,
            Some(ProbeOutcome::Failed {
                structural: false,
                message,
            }),
        ) => {
            // Not corruption (permissions, I/O, busy): keep everything, report it.
            warn(
                notes,
                format!("restored database could not be checked: {message}"),
            );
            Validation::Valid
        }
        (CheckpointOutcome::Checkpointed, _) => {
            notes.push("folded a restored WAL into the database".into());
            Validation::Valid
        }
        (CheckpointOutcome::NothingToCheckpoint, _) => Validation::Valid,
    }
}

/// The store side of the restore: `sessions/opencode.db` into the data dir.
pub(crate) async fn store_attempt(ctx: Option<&StoreContext>, paths: &StatePaths) -> StoreAttempt {
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
