//! The restore (docs/design.md#the-restore-order): object store first when enabled, else the
//! Actions cache; then validation and sanitization (restored memory is untrusted input,
//! docs/persistence.md). It never fails the run: every failure degrades to an empty state with a
//! warning.
//!
//! When the newest cache entry cannot be restored, older ones are tried by exact key, newest
//! first (`memory::fallback`); entries whose content is broken are deleted when the token may.
//! When an entry existed but nothing could be restored, and older memory may exist that a new
//! save would hide, the report carries a shadow guard and the save is declined.

use std::path::Path;

use crate::cache::{self, CacheError, RestoreOutcome};
use crate::memory::checkpoint::{self, CheckpointOutcome, ProbeOutcome};
use crate::memory::fallback::{Catalog, Deletion, Listing, MAX_FALLBACK};
use crate::memory::ledger::StoreContext;
use crate::memory::report::{CacheStatus, RestoreReport, RestoreSource};
use crate::memory::sanitize::{self, SanitizeOutcome};
use crate::memory::session_map::SessionMap;
use crate::memory::state_paths::{check_marker, MarkerCheck, StatePaths};
use crate::object_store as store;

/// The object-store side of a restore, as the phase needs it (filled by the caller, which owns the
/// store client and key layout).
pub enum StoreAttempt {
    /// The store is off (not configured, or a fork pull request).
    Disabled,
    /// `sessions/opencode.db` was downloaded into the data dir.
    Hit {
        etag: String,
        marker: StoreMarker,
    },
    Miss,
    Failed {
        message: String,
    },
}

/// What the store's marker (`sessions/fro-bot.json`) said about the database downloaded beside
/// it (docs/design.md#object-store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreMarker {
    /// It names exactly this database (its SHA-256): written beside it as the run's marker.
    Matching,
    /// The store has none (memory published before fro-bot published markers).
    Absent,
    /// Not believed: it names another database, is unreadable or too large, has another storage
    /// version, or could not be fetched.
    Unusable { reason: String },
}

pub struct RestoreInputs<'a> {
    pub paths: &'a StatePaths,
    pub workspace: &'a Path,
    pub skip_cache: bool,
    pub cache: Option<&'a cache::Backend>,
    /// Lookup key (the primary key: never written, so it only ever prefix-matches).
    pub key: &'a str,
    pub restore_keys: &'a [String],
    /// Lists and deletes cache entries, for the fallback past an unrestorable entry.
    pub catalog: Catalog<'a>,
    /// Epoch milliseconds: restored timestamps after it are clamped to it.
    pub now_ms: i64,
}

/// Why restored memory must be discarded, and whether the entry itself is at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The content is broken (corrupt, hostile, hollow): no run can use it, so it is deleted.
    Broken,
    /// Not ours to read (another storage version) or not checkable here: the entry is kept.
    Kept,
}

/// How a restored data dir checked out.
enum Validation {
    /// With the digest of the database as restored (`None`: it could not be read).
    Valid {
        sha256: Option<[u8; 32]>,
    },
    Discard {
        reason: String,
        fault: Fault,
    },
}

/// What trying one cache entry gave.
enum Attempt {
    Restored {
        key: String,
        sha256: Option<[u8; 32]>,
    },
    /// An entry matched and was found unusable (already discarded from disk).
    Unusable {
        key: String,
        fault: Fault,
    },
    Miss,
    /// The cache could not be asked (transport, permissions, cancellation): stop trying.
    Failed,
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
        StoreAttempt::Hit { etag, marker } => {
            match validate(&inputs, RestoreSource::Storage, &mut report.notes).await {
                Validation::Valid { sha256 } => {
                    report.restored_sha256 = sha256;
                    report.status = CacheStatus::Hit;
                    report.source = RestoreSource::Storage;
                    report.store_etag = Some(etag);
                    report.sessions = store_sessions(&mut report, inputs.paths, marker);
                    return report;
                }
                Validation::Discard { reason, .. } => {
                    discard(inputs.paths, &reason, &mut report.notes);
                    discarded = true;
                    // The ETag still names what the store holds: publishing over it is a
                    // deliberate replacement of corrupt memory, not a lost update.
                    report.store_etag = Some(etag);
                }
            }
        }
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
        into: None,
    };
    let first = cache.restore(&request).await;
    let (key, fault) = match attempt(&inputs, first, &mut report.notes).await {
        Attempt::Restored { key, sha256 } => {
            report.restored_sha256 = sha256;
            return restored(report, inputs.paths, key);
        }
        Attempt::Unusable { key, fault } => (key, fault),
        Attempt::Miss => {
            report.notes.push("Actions cache: no entry".into());
            return finish(report, discarded);
        }
        Attempt::Failed => return finish(report, discarded),
    };
    fall_back(&inputs, cache, report, vec![(key, fault)]).await
}

/// The newest entry could not be used: tries older ones, deletes broken ones, and decides whether
/// this run's save could hide memory.
async fn fall_back(
    inputs: &RestoreInputs<'_>,
    cache: &cache::Backend,
    mut report: RestoreReport,
    mut tried: Vec<(String, Fault)>,
) -> RestoreReport {
    let version = cache::version(inputs.paths.cache_paths());
    let skip: Vec<String> = tried.iter().map(|(k, _)| k.clone()).collect();
    let listing = inputs
        .catalog
        .list(inputs.restore_keys, &version, &skip)
        .await;
    let mut untried = match &listing {
        Listing::Keys { keys, .. } => keys.clone(),
        Listing::Failed { message } => {
            warn(
                &mut report.notes,
                format!("cannot list older cache entries to fall back to: {message}"),
            );
            Vec::new()
        }
    };
    let mut restored_key = None;
    let mut stopped = false;
    let mut attempts = 0;
    while !untried.is_empty() && attempts < MAX_FALLBACK {
        attempts += 1;
        let key = untried.remove(0);
        let request = cache::RestoreRequest {
            key: &key,
            restore_keys: &[],
            paths: inputs.paths.restore_targets(),
            workspace: inputs.workspace,
            into: None,
        };
        let outcome = cache.restore_exact(&request).await;
        match attempt(inputs, outcome, &mut report.notes).await {
            Attempt::Restored { key, sha256 } => {
                report.restored_sha256 = sha256;
                restored_key = Some(key);
                break;
            }
            Attempt::Unusable { key, fault } => tried.push((key, fault)),
            // Listed, but not visible from this branch (the service scopes entries by branch):
            // then no run of this branch sees it either, so no save of ours can hide it.
            Attempt::Miss => {}
            Attempt::Failed => {
                stopped = true;
                break;
            }
        }
    }
    delete_broken(inputs, &tried, &mut report.notes).await;
    if let Some(key) = restored_key {
        report.notes.push(format!(
            "fell back past {} unusable newer entr{}",
            tried.len(),
            if tried.len() == 1 { "y" } else { "ies" }
        ));
        return restored(report, inputs.paths, key);
    }
    report.shadow_guard = shadow_guard(&listing, &tried, 1 + attempts, untried.len(), stopped);
    if let Some(reason) = &report.shadow_guard {
        warn(
            &mut report.notes,
            format!("this run's memory will not be saved: {reason}"),
        );
    }
    finish(report, true)
}

/// Why saving could hide older memory, if it could. Saving is safe only when the listing was
/// complete and every entry in it was tried and found broken: then there is nothing to hide.
fn shadow_guard(
    listing: &Listing,
    tried: &[(String, Fault)],
    attempts: usize,
    untried: usize,
    stopped: bool,
) -> Option<String> {
    match listing {
        Listing::Failed { .. } => Some(
            "the newest cache entry cannot be restored and older entries could not be listed; a new entry would hide them".into(),
        ),
        Listing::Keys { .. } if stopped || untried > 0 => Some(format!(
            "no restorable entry among the {attempts} newest; older ones remain, which a new entry would hide"
        )),
        Listing::Keys { complete: false, .. } => Some(
            "the cache listing was cut short; older entries may remain, which a new entry would hide".into(),
        ),
        Listing::Keys { .. } => tried
            .iter()
            .any(|(_, fault)| *fault == Fault::Kept)
            .then(|| {
                "an entry that could not be used here is kept (another storage version, or not checkable); a new entry would hide it".into()
            }),
    }
}

/// Deletes the entries whose content is broken, so the next run does not trip over them.
async fn delete_broken(
    inputs: &RestoreInputs<'_>,
    tried: &[(String, Fault)],
    notes: &mut Vec<String>,
) {
    for (raw, _) in tried.iter().filter(|(_, f)| *f == Fault::Broken) {
        let key = shown(raw);
        match inputs.catalog.delete(raw).await {
            Deletion::Deleted => warn(notes, format!("deleted the broken cache entry `{key}`")),
            Deletion::Absent => {}
            Deletion::Forbidden { message } => warn(
                notes,
                format!(
                    "cannot delete the broken cache entry `{key}` ({message}): grant `permissions: actions: write`, or run `gh cache delete {key}`"
                ),
            ),
            Deletion::Failed { message } => warn(
                notes,
                format!("cannot delete the broken cache entry `{key}`: {message}"),
            ),
        }
    }
}

/// Checks one cache restore's outcome; an unusable entry is discarded from disk.
async fn attempt(
    inputs: &RestoreInputs<'_>,
    outcome: Result<RestoreOutcome, CacheError>,
    notes: &mut Vec<String>,
) -> Attempt {
    match outcome {
        Ok(RestoreOutcome::Hit {
            matched_key,
            restored,
            ..
        }) => {
            // The entry's database is complete on its own; a WAL left beside it from an older
            // database would be replayed into the new one and corrupt it.
            if let Err(e) = checkpoint::remove_stale_sidecars(&inputs.paths.db()) {
                warn(notes, format!("cannot remove a stale WAL/SHM: {e}"));
            }
            drop_restored_storage(inputs.paths, &restored, notes);
            match validate(inputs, RestoreSource::Cache, notes).await {
                Validation::Valid { sha256 } => Attempt::Restored {
                    key: matched_key,
                    sha256,
                },
                Validation::Discard { reason, fault } => {
                    discard(
                        inputs.paths,
                        &format!("entry `{}`: {reason}", shown(&matched_key)),
                        notes,
                    );
                    Attempt::Unusable {
                        key: matched_key,
                        fault,
                    }
                }
            }
        }
        Ok(RestoreOutcome::Unrestorable {
            matched_key,
            reason,
        }) => {
            warn(
                notes,
                format!(
                    "the cache entry `{}` cannot be restored: {reason}",
                    shown(&matched_key)
                ),
            );
            Attempt::Unusable {
                key: matched_key,
                fault: Fault::Broken,
            }
        }
        Ok(RestoreOutcome::Miss) => Attempt::Miss,
        Err(CacheError::Cancelled) => {
            warn(notes, "restore cancelled".into());
            Attempt::Failed
        }
        Err(e) => {
            warn(notes, format!("Actions cache restore failed: {e}"));
            Attempt::Failed
        }
    }
}

/// OpenCode 1.18 reads nothing under `storage/`, so nothing restored there is kept: the path
/// stays in the cache path list only because the cache version is computed over it.
fn drop_restored_storage(
    paths: &StatePaths,
    restored: &[std::path::PathBuf],
    notes: &mut Vec<String>,
) {
    let storage = paths.data_dir.join(checkpoint::LEGACY_STORAGE_DIR);
    if !restored.contains(&storage) {
        return;
    }
    match std::fs::remove_dir_all(&storage).or_else(|_| std::fs::remove_file(&storage)) {
        Ok(()) => notes.push("dropped a restored storage/ (OpenCode 1.18 does not read it)".into()),
        Err(e) => warn(notes, format!("cannot remove a restored storage/: {e}")),
    }
}

/// A cache key as the log and summary show it: keys under our prefixes can be written by anyone
/// with cache write access, so control characters (a newline starting a workflow command) and
/// backticks are replaced.
pub(crate) fn shown(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_control() || c == '`' { '?' } else { c })
        .collect()
}

fn restored(mut report: RestoreReport, paths: &StatePaths, key: String) -> RestoreReport {
    report.status = CacheStatus::Hit;
    report.source = RestoreSource::Cache;
    report.matched_key = Some(key);
    report.sessions = maps_from_marker(&mut report, paths).unwrap_or_else(|| {
        // Without a readable marker there is no record of fro-bot's sessions: none is resumed.
        report
            .notes
            .push("the entry has no session map: conversations start new sessions".into());
        SessionMap::default()
    });
    report
}

/// The session map after a store restore, and the trust records into `report`. Without a marker
/// naming this database (memory published before markers were, or one not believed) threads are
/// found by title, and every session counts as the lowest.
fn store_sessions(
    report: &mut RestoreReport,
    paths: &StatePaths,
    marker: StoreMarker,
) -> SessionMap {
    let why = match marker {
        StoreMarker::Matching => match maps_from_marker(report, paths) {
            Some(map) => return map,
            None => "it could not be read back".to_string(),
        },
        StoreMarker::Absent => {
            report.notes.push(
                "the object store's copy has no marker (published before markers were): threads are found by title, and no session has a trust record"
                    .into(),
            );
            return SessionMap::Legacy;
        }
        StoreMarker::Unusable { reason } => reason,
    };
    warn(
        &mut report.notes,
        format!(
            "the object store's marker is not used ({why}): threads are found by title, and no session has a trust record"
        ),
    );
    SessionMap::Legacy
}

/// The session map and trust records of the marker beside the restored database (`None`: no
/// usable marker; `report.trust` is then left empty).
fn maps_from_marker(report: &mut RestoreReport, paths: &StatePaths) -> Option<SessionMap> {
    match check_marker(&paths.marker()) {
        MarkerCheck::Compatible(marker) => {
            // No records (an older marker): every session counts as the lowest.
            report.trust = marker.trust.unwrap_or_default();
            Some(match marker.sessions {
                Some(map) => SessionMap::Owned(map),
                None => SessionMap::Legacy,
            })
        }
        MarkerCheck::Missing
        | MarkerCheck::Unreadable { .. }
        | MarkerCheck::VersionMismatch { .. } => None,
    }
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

/// Why one validation stage rejected restored memory: becomes `Validation::Discard`.
struct Rejection {
    reason: String,
    fault: Fault,
}

/// What SQLite made of the restored database, off the async runtime.
struct Examination {
    checkpoint: CheckpointOutcome,
    /// `Some` only when there was no WAL to fold in and a database to probe.
    probe: Option<ProbeOutcome>,
    /// `None` when the database could not be read, so was not sanitized.
    sanitized: Option<SanitizeOutcome>,
    /// The database's digest as restored (`None`: unreadable).
    sha256: Option<[u8; 32]>,
}

/// Checks what was just restored: a readable data dir, our storage version, a database that SQLite
/// can read (checkpointing a restored WAL, or probing when there is none), then sanitizes it.
/// Removes `auth.json`.
async fn validate(
    inputs: &RestoreInputs<'_>,
    source: RestoreSource,
    notes: &mut Vec<String>,
) -> Validation {
    remove_restored_auth(inputs.paths, notes);
    match check_restored(inputs, source, notes).await {
        Ok(sha256) => Validation::Valid { sha256 },
        Err(Rejection { reason, fault }) => Validation::Discard { reason, fault },
    }
}

/// The validation stages, in order; the first to reject decides.
async fn check_restored(
    inputs: &RestoreInputs<'_>,
    source: RestoreSource,
    notes: &mut Vec<String>,
) -> Result<Option<[u8; 32]>, Rejection> {
    let paths = inputs.paths;
    check_data_dir(paths)?;
    check_storage_version(paths, notes)?;
    let db = paths.db();
    if source == RestoreSource::Cache && !db.is_file() {
        // fro-bot never saves an entry without a database: a hollow one would only hide memory.
        return Err(Rejection {
            reason: "the entry holds no session database".into(),
            fault: Fault::Broken,
        });
    }
    let examination = examine_database(db, inputs.now_ms).await?;
    check_readable(examination.checkpoint, examination.probe, notes)?;
    check_sanitized(examination.sanitized, notes)?;
    Ok(examination.sha256)
}

/// Credentials never come from memory: a restored `auth.json` is removed.
fn remove_restored_auth(paths: &StatePaths, notes: &mut Vec<String>) {
    match paths.remove_auth_file() {
        Ok(true) => warn(
            notes,
            "removed an auth.json that came with restored memory".into(),
        ),
        Ok(false) => {}
        Err(e) => warn(notes, format!("cannot remove a restored auth.json: {e}")),
    }
}

/// A data dir that exists must be readable; an absent one is an empty restore.
fn check_data_dir(paths: &StatePaths) -> Result<(), Rejection> {
    if let Err(e) = std::fs::read_dir(&paths.data_dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(Rejection {
                reason: format!("data dir unreadable: {e}"),
                fault: Fault::Kept,
            });
        }
    }
    Ok(())
}

/// Memory of another storage version is not ours to read.
fn check_storage_version(paths: &StatePaths, notes: &mut Vec<String>) -> Result<(), Rejection> {
    match check_marker(&paths.marker()) {
        MarkerCheck::VersionMismatch { found } => {
            return Err(Rejection {
                reason: format!(
                    "storage version {found}, this fro-bot reads version {}",
                    crate::memory::state_paths::STORAGE_VERSION
                ),
                fault: Fault::Kept,
            })
        }
        MarkerCheck::Unreadable { message } => warn(
            notes,
            format!("marker file unreadable ({message}); treating as compatible"),
        ),
        MarkerCheck::Missing | MarkerCheck::Compatible(_) => {}
    }
    Ok(())
}

/// Checkpoints a restored WAL (or probes when there is none) and, when SQLite could read the
/// database, sanitizes it. SQLite blocks, so this runs on a blocking thread.
async fn examine_database(db: std::path::PathBuf, now_ms: i64) -> Result<Examination, Rejection> {
    // The digest (`RestoredCopy`, and what the marker must name) is taken on the second core
    // beside the checks, which read the same file: at 200 MB each is ~0.1-0.2 s. Only a sanitizer
    // that has to change the file writes while it reads; a digest of a half-written file then
    // names nothing, which costs a whole scrub and an upload, never a skipped one.
    let hashing = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || crate::memory::ledger::sha256_file(&db).ok())
    };
    let outcome = tokio::task::spawn_blocking(move || {
        let cp = checkpoint::checkpoint(&db);
        let probe = match cp {
            CheckpointOutcome::NothingToCheckpoint if db.is_file() => Some(checkpoint::probe(&db)),
            _ => None,
        };
        let sanitized = match (&cp, &probe) {
            (CheckpointOutcome::Failed { .. }, _) | (_, Some(ProbeOutcome::Failed { .. })) => None,
            _ => Some(sanitize::sanitize(&db, now_ms)),
        };
        (cp, probe, sanitized)
    })
    .await;
    let sha256 = hashing.await.ok().flatten();
    outcome
        .map(|(checkpoint, probe, sanitized)| Examination {
            checkpoint,
            probe,
            sanitized,
            sha256,
        })
        .map_err(|e| Rejection {
            reason: format!("validation task failed: {e}"),
            fault: Fault::Kept,
        })
}

/// Whether SQLite could read the database: corruption breaks the entry, other failures only
/// leave it unchecked.
fn check_readable(
    cp: CheckpointOutcome,
    probe: Option<ProbeOutcome>,
    notes: &mut Vec<String>,
) -> Result<(), Rejection> {
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
        ) => Err(Rejection {
            reason: format!("corrupt database: {message}"),
            fault: Fault::Broken,
        }),
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
            // Not corruption (permissions, I/O, busy) — but unchecked content must not reach
            // OpenCode. The entry is kept for a run that can read it.
            Err(Rejection {
                reason: format!("restored database could not be checked: {message}"),
                fault: Fault::Kept,
            })
        }
        (CheckpointOutcome::Checkpointed, _) => {
            notes.push("folded a restored WAL into the database".into());
            Ok(())
        }
        (CheckpointOutcome::NothingToCheckpoint, _) => Ok(()),
    }
}

/// What sanitizing found: what it changed is logged; a database it could not finish is rejected.
fn check_sanitized(
    sanitized: Option<SanitizeOutcome>,
    notes: &mut Vec<String>,
) -> Result<(), Rejection> {
    match sanitized {
        None => Ok(()),
        Some(SanitizeOutcome::Clean { notes: changes }) => {
            for change in changes {
                warn(notes, format!("restored memory: {change}"));
            }
            Ok(())
        }
        Some(SanitizeOutcome::Corrupt { message }) => Err(Rejection {
            reason: format!("corrupt database: {message}"),
            fault: Fault::Broken,
        }),
        Some(SanitizeOutcome::Failed { message }) => Err(Rejection {
            reason: format!("restored database could not be sanitized: {message}"),
            fault: Fault::Kept,
        }),
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
        store::StoreRestore::Hit { etag, sha256, .. } => StoreAttempt::Hit {
            etag,
            marker: store_marker(ctx, paths, &sha256).await,
        },
        store::StoreRestore::Miss => StoreAttempt::Miss,
        store::StoreRestore::Failed { error } => StoreAttempt::Failed {
            message: error.to_string(),
        },
    }
}

/// The store's marker, if it names the database whose SHA-256 is `db_sha256`: its bytes and what
/// they say (`Ok(None)`: the store has none; `Err`: why it is not believed).
pub(crate) async fn fetch_store_marker(
    ctx: &StoreContext,
    db_sha256: &str,
) -> Result<Option<(bytes::Bytes, crate::memory::state_paths::Marker)>, String> {
    let bytes = match store::sync::fetch_marker(&ctx.store, &ctx.keys).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("cannot fetch it: {e}")),
    };
    let marker = crate::memory::state_paths::marker_naming(&bytes, db_sha256)?;
    Ok(Some((bytes, marker)))
}

/// Fetches the store's marker and, when it names the database just downloaded, writes it beside
/// it. A marker already in the data dir describes some other database and is removed either way.
async fn store_marker(ctx: &StoreContext, paths: &StatePaths, sha256: &str) -> StoreMarker {
    let marker = paths.marker();
    if let Err(e) = std::fs::remove_file(&marker) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return StoreMarker::Unusable {
                reason: format!("cannot remove the marker already in the data dir: {e}"),
            };
        }
    }
    let bytes = match fetch_store_marker(ctx, sha256).await {
        Ok(Some((bytes, _))) => bytes,
        Ok(None) => return StoreMarker::Absent,
        Err(reason) => return StoreMarker::Unusable { reason },
    };
    let tmp = paths.data_dir.join(".fro-bot-store-marker.tmp");
    match std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &marker)) {
        Ok(()) => StoreMarker::Matching,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            StoreMarker::Unusable {
                reason: format!("cannot write it beside the database: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(keys: &[&str], complete: bool) -> Listing {
        Listing::Keys {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            complete,
        }
    }

    #[test]
    fn saving_is_allowed_only_when_nothing_older_could_be_hidden() {
        let broken = vec![
            ("k2".to_string(), Fault::Broken),
            ("k1".into(), Fault::Broken),
        ];
        // Complete listing, everything tried and broken: nothing to hide.
        assert_eq!(
            shadow_guard(&keys(&["k1"], true), &broken, 2, 0, false),
            None
        );
        // The listing failed, was cut short, or untried entries remain: older memory may exist.
        let failed = Listing::Failed {
            message: "403".into(),
        };
        assert!(shadow_guard(&failed, &broken, 1, 0, false).is_some());
        assert!(shadow_guard(&keys(&["k1"], false), &broken, 2, 0, false).is_some());
        assert!(shadow_guard(&keys(&["k1", "k0"], true), &broken, 6, 1, false).is_some());
        assert!(shadow_guard(&keys(&["k1"], true), &broken, 2, 0, true).is_some());
        // An entry that is kept (another storage version, not checkable) would be hidden.
        let kept = vec![("k2".to_string(), Fault::Kept)];
        assert!(shadow_guard(&keys(&[], true), &kept, 1, 0, false).is_some());
    }

    #[test]
    fn listed_keys_cannot_start_a_workflow_command() {
        assert_eq!(shown("k-1\n::error::x`y"), "k-1?::error::x?y");
    }
}
