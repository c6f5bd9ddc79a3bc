//! Moving content between the data dir and the store: the session database (conditional publish,
//! allowlisted restore) and per-run metadata and log artifacts. Nothing here is fatal to a run:
//! every failure comes back as a value.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::client::{
    Condition, DownloadOutcome, GetOutcome, ObjectKind, ObjectStore, Operation, PutOutcome,
    StoreError, TempDownload,
};
use super::keys::{StoreKeys, SESSION_DB_NAME};
use super::validate::confine_path;

#[derive(Debug)]
pub enum PublishOutcome {
    Published {
        etag: String,
    },
    /// Another run published newer memory since our restore: never overwritten.
    Conflict,
    Failed {
        error: StoreError,
    },
}

/// Uploads the session database, conditional on the ETag seen at restore (`If-Match`), or on
/// there being none (`If-None-Match: *`). The caller checks the lease gate first.
pub async fn publish_session_db(
    store: &ObjectStore,
    keys: &StoreKeys,
    db_path: &Path,
    expected_etag: Option<&str>,
) -> PublishOutcome {
    let cond = match expected_etag {
        Some(etag) => Condition::IfMatch(etag),
        None => Condition::IfAbsent,
    };
    match store
        .put_file(&keys.session_db(), db_path, cond, ObjectKind::SessionDb)
        .await
    {
        Ok(PutOutcome::Written { etag }) => PublishOutcome::Published { etag },
        Ok(PutOutcome::PreconditionFailed) => PublishOutcome::Conflict,
        Err(error) => PublishOutcome::Failed { error },
    }
}

#[derive(Debug)]
pub enum StoreRestore {
    /// `sha256`: hex SHA-256 of the database as downloaded (before any check touched it).
    Hit {
        etag: String,
        bytes: u64,
        sha256: String,
    },
    Miss,
    Failed {
        error: StoreError,
    },
}

/// Downloads `sessions/opencode.db` — and only that name — into `data_dir`: to a temp file first,
/// then deletes a stale `-wal`/`-shm` beside the target, then renames into place. On any failure
/// the existing database is untouched and no partial file remains.
pub async fn restore_session_db(
    store: &ObjectStore,
    keys: &StoreKeys,
    data_dir: &Path,
) -> StoreRestore {
    match restore_inner(store, keys, data_dir).await {
        Ok(Some((etag, bytes, sha256))) => StoreRestore::Hit {
            etag,
            bytes,
            sha256,
        },
        Ok(None) => StoreRestore::Miss,
        Err(error) => StoreRestore::Failed { error },
    }
}

async fn restore_inner(
    store: &ObjectStore,
    keys: &StoreKeys,
    data_dir: &Path,
) -> Result<Option<(String, u64, String)>, StoreError> {
    let key = keys.session_db();
    let op = Operation::GetObject;
    let target = confine_path(data_dir, SESSION_DB_NAME)
        .map_err(|source| StoreError::InvalidKey { source })?;
    tokio::fs::create_dir_all(data_dir)
        .await
        .map_err(|e| StoreError::local(op, &key, data_dir, e))?;
    let download = match store.download_to_temp(&key, data_dir).await? {
        DownloadOutcome::Downloaded(d) => d,
        DownloadOutcome::NotFound => return Ok(None),
    };
    let (etag, bytes, sha256) = (
        download.etag.clone(),
        download.bytes,
        download.sha256.clone(),
    );
    let tmp_path = download.path().to_path_buf();
    // One blocking task, which runs to its end even when the restore is cancelled: the old
    // database keeps its WAL, or the new one is complete, never the old one without its WAL.
    tokio::task::spawn_blocking({
        let target = target.clone();
        move || swap_in(download, &target)
    })
    .await
    .map_err(|e| StoreError::local(op, &key, &tmp_path, std::io::Error::other(e)))?
    .map_err(|(path, e)| StoreError::local(op, &key, &path, e))?;
    Ok(Some((etag, bytes, sha256)))
}

/// Puts the downloaded database in place of `target`. A WAL from an older database would be
/// replayed into the new one: it goes first.
fn swap_in(download: TempDownload, target: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    for suffix in ["-wal", "-shm"] {
        let side = sidecar(target, suffix);
        match std::fs::remove_file(&side) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err((side, e)),
        }
    }
    download
        .persist(target)
        .map_err(|e| (target.to_path_buf(), e))
}

/// The most a store marker may hold: a session map and trust records for tens of thousands of
/// sessions fit many times over; anything larger is refused unread.
pub const MAX_MARKER_BYTES: usize = 8 << 20;

/// Puts the marker of the database just published to `sessions/fro-bot.json`. Unconditional: the
/// caller holds the lease, and restore believes a marker only beside the database whose SHA-256
/// it names, so a marker that lost a race is never applied to another run's database.
pub async fn publish_marker(store: &ObjectStore, keys: &StoreKeys, marker: &Path) -> UploadOutcome {
    let key = keys.session_marker();
    match store
        .put_file(&key, marker, Condition::None, ObjectKind::SessionMarker)
        .await
    {
        Ok(PutOutcome::Written { etag }) => UploadOutcome::Uploaded { etag },
        Ok(PutOutcome::PreconditionFailed) => UploadOutcome::Failed {
            error: unexpected_precondition(key),
        },
        Err(error) => UploadOutcome::Failed { error },
    }
}

/// `sessions/fro-bot.json`, at most [`MAX_MARKER_BYTES`] (`None`: there is none).
pub async fn fetch_marker(
    store: &ObjectStore,
    keys: &StoreKeys,
) -> Result<Option<Bytes>, StoreError> {
    match store
        .get_bytes_capped(&keys.session_marker(), MAX_MARKER_BYTES)
        .await?
    {
        GetOutcome::Found(body) => Ok(Some(body.bytes)),
        GetOutcome::NotFound => Ok(None),
    }
}

fn unexpected_precondition(key: String) -> StoreError {
    StoreError::Integrity {
        operation: Operation::PutObject,
        key,
        message: "unexpected precondition failure".into(),
    }
}

fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[derive(Debug)]
pub enum UploadOutcome {
    Uploaded { etag: String },
    Failed { error: StoreError },
}

/// Writes `metadata/{runKey}.json`.
pub async fn upload_run_metadata(
    store: &ObjectStore,
    keys: &StoreKeys,
    run_key: &str,
    metadata: &serde_json::Value,
) -> UploadOutcome {
    let key = match keys.run_metadata(run_key) {
        Ok(key) => key,
        Err(source) => {
            return UploadOutcome::Failed {
                error: StoreError::InvalidKey { source },
            }
        }
    };
    // Serializing a `Value` cannot fail (no non-string map keys, no custom serializers).
    let body = Bytes::from(serde_json::to_vec_pretty(metadata).unwrap_or_default());
    match store
        .put_bytes(&key, body, Condition::None, ObjectKind::RunRecord)
        .await
    {
        Ok(PutOutcome::Written { etag }) => UploadOutcome::Uploaded { etag },
        // Unconditional puts have no precondition; kept for exhaustiveness.
        Ok(PutOutcome::PreconditionFailed) => UploadOutcome::Failed {
            error: unexpected_precondition(key),
        },
        Err(error) => UploadOutcome::Failed { error },
    }
}

/// Bounds on what `upload_run_artifacts` sends (logs can grow without limit).
#[derive(Debug, Clone, Copy)]
pub struct ArtifactLimits {
    pub max_files: usize,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

impl Default for ArtifactLimits {
    fn default() -> Self {
        ArtifactLimits {
            max_files: 200,
            max_file_bytes: 20 << 20,
            max_total_bytes: 100 << 20,
        }
    }
}

#[derive(Debug)]
pub enum ArtifactsOutcome {
    /// `dir` does not exist.
    NothingToUpload,
    Uploaded {
        files: usize,
        bytes: u64,
        skipped: usize,
    },
    /// Some uploads failed (the rest were still attempted).
    Failed {
        files: usize,
        failures: usize,
        first_error: StoreError,
    },
}

/// Uploads the regular files under `dir` (recursively, symlinks not followed) to
/// `artifacts/{runKey}/{relpath}`, within the default [`ArtifactLimits`].
pub async fn upload_run_artifacts(
    store: &ObjectStore,
    keys: &StoreKeys,
    run_key: &str,
    dir: &Path,
) -> ArtifactsOutcome {
    upload_run_artifacts_with(store, keys, run_key, dir, ArtifactLimits::default()).await
}

pub async fn upload_run_artifacts_with(
    store: &ObjectStore,
    keys: &StoreKeys,
    run_key: &str,
    dir: &Path,
    limits: ArtifactLimits,
) -> ArtifactsOutcome {
    if !dir.is_dir() {
        return ArtifactsOutcome::NothingToUpload;
    }
    let (files, mut skipped) = collect_files(dir, limits);
    let (mut uploaded, mut bytes, mut failures) = (0usize, 0u64, 0usize);
    let mut first_error = None;
    for (path, rel, size) in files {
        if bytes + size > limits.max_total_bytes {
            skipped += 1;
            continue;
        }
        let result = match keys.run_artifact(run_key, &rel) {
            Ok(key) => store
                .put_file(&key, &path, Condition::None, ObjectKind::Artifact)
                .await
                .map(drop),
            Err(source) => Err(StoreError::InvalidKey { source }),
        };
        match result {
            Ok(()) => {
                uploaded += 1;
                bytes += size;
            }
            Err(error) => {
                failures += 1;
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        None => ArtifactsOutcome::Uploaded {
            files: uploaded,
            bytes,
            skipped,
        },
        Some(first_error) => ArtifactsOutcome::Failed {
            files: uploaded,
            failures,
            first_error,
        },
    }
}

/// Regular files under `dir` as (path, relative path with `/`, size), sorted, within the limits;
/// also the number skipped.
fn collect_files(dir: &Path, limits: ArtifactLimits) -> (Vec<(PathBuf, String, u64)>, usize) {
    let mut out = Vec::new();
    let mut skipped = 0usize;
    let mut stack = vec![(dir.to_path_buf(), String::new(), 0usize)];
    while let Some((path, rel, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            let child_rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if meta.is_dir() && depth < 8 {
                stack.push((entry.path(), child_rel, depth + 1));
            } else if meta.is_file() {
                if meta.len() > limits.max_file_bytes || out.len() >= limits.max_files {
                    skipped += 1;
                } else {
                    out.push((entry.path(), child_rel, meta.len()));
                }
            }
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    (out, skipped)
}
