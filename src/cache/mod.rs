//! The GitHub Actions cache (service v2 on github.com, v1 on Enterprise Server, chosen as the
//! toolkit chooses in `select`), byte-compatible with `@actions/cache` 6.x, and a filesystem
//! backend with the same matching rules and archive format for `fro-bot local`.
//!
//! Save: archive the existing paths to a temp file (`archive`), reserve (`twirp` or `v1`), upload
//! (`blob`, or `v1`'s chunks), finalize. Restore: look up, download to a temp file, extract
//! confined to the requested paths (`extract`), which only then replaces what is on disk.

mod archive;
mod blob;
mod error;
mod extract;
mod fs_backend;
pub mod limits;
mod paths;
pub mod select;
mod tar_reader;
mod twirp;
mod v1;
mod version;

use std::path::{Path, PathBuf};

pub use archive::{write_archive, ArchiveSummary};
pub use blob::TransferOptions;
pub use error::CacheError;
pub use extract::{
    extract_confined, extract_confined_into, extract_tar, CachePath, ExtractReport, PathKind,
    RejectReason, Rejection, WINDOW_LOG_MAX,
};
pub use fs_backend::{FsBackend, FsEntry};
pub use limits::{Cap, Limits};
pub use select::Protocol;
#[cfg(feature = "fuzzing")]
pub(crate) use twirp::{create_reply, finalize_reply, judge, lookup_reply, Judged};
pub use twirp::{LookupHit, RetryPolicy, Rpc, TwirpClient};
pub use v1::{ChunkOptions, V1Client, V1Op};
pub use version::version;

use crate::runner::{env, failpoint, Cancellation, Env};

/// File name of the archive inside its temp dir (the toolkit's name).
const ARCHIVE_NAME: &str = "cache.tzst";
/// Key limits of the service: 512 UTF-16 code units, no commas, at most 10 keys per lookup.
const MAX_KEY_UNITS: usize = 512;
const MAX_KEYS: usize = 10;
/// Write buffer for archive and extracted files. Measured: 1 MiB writes made page-cache copies
/// ~7× slower than 64 KiB ones on the test VM (large-folio allocation), so keep writes small.
pub(crate) const WRITE_BUF: usize = 64 * 1024;

/// `ACTIONS_CACHE_MODE`: which directions the runner allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    ReadWrite,
    /// `read`: restore only.
    ReadOnly,
    /// `write-only`: save only.
    WriteOnly,
    /// `none`: neither.
    Disabled,
}

impl CacheMode {
    /// Unknown or empty values allow both directions, as the toolkit does.
    pub fn parse(value: Option<&str>) -> Self {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            Some("none") => CacheMode::Disabled,
            Some("read") => CacheMode::ReadOnly,
            Some("write-only") => CacheMode::WriteOnly,
            Some(_) | None => CacheMode::ReadWrite,
        }
    }

    pub fn can_restore(self) -> bool {
        matches!(self, CacheMode::ReadWrite | CacheMode::ReadOnly)
    }

    pub fn can_save(self) -> bool {
        matches!(self, CacheMode::ReadWrite | CacheMode::WriteOnly)
    }
}

pub struct RestoreRequest<'a> {
    pub key: &'a str,
    pub restore_keys: &'a [String],
    /// Path strings exactly as given (the version is computed from them), each with the kind
    /// the entry must hold there.
    pub paths: &'a [CachePath],
    /// Member names are relative to it.
    pub workspace: &'a Path,
    /// Write each path to `{into}/{its file name}` instead (`extract_confined_into`).
    pub into: Option<&'a Path>,
}

impl RestoreRequest<'_> {
    /// The cache version of the request's paths.
    pub fn version(&self) -> String {
        let strings: Vec<String> = self.paths.iter().map(|p| p.path.clone()).collect();
        version(&strings)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreOutcome {
    Hit {
        matched_key: String,
        /// Cache paths replaced by their archived version.
        restored: Vec<PathBuf>,
        /// Size of the downloaded archive.
        size_bytes: u64,
    },
    Miss,
    /// An entry matched but its archive cannot be restored (unreadable, truncated, hostile):
    /// nothing was moved into place. The restore phase falls back to older entries.
    Unrestorable {
        matched_key: String,
        reason: String,
    },
}

pub struct SaveRequest<'a> {
    pub key: &'a str,
    pub paths: &'a [String],
    pub workspace: &'a Path,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveReceipt {
    /// The service's entry id (absent from the filesystem backend and some service replies).
    pub entry_id: Option<i64>,
    /// Size of the archive written.
    pub size_bytes: u64,
}

/// The protocol half of an Actions cache client.
#[derive(Debug, Clone)]
pub enum Service {
    /// Twirp RPCs; the archive goes to Azure through signed URLs (`blob`).
    V2(TwirpClient),
    /// REST calls; the archive goes to the service itself in chunks.
    V1(V1Client),
}

/// The Actions cache client: the service's calls plus blob transfer.
#[derive(Debug, Clone)]
pub struct ActionsCacheClient {
    pub service: Service,
    blob: blob::BlobClient,
    pub mode: CacheMode,
    /// Where archives are staged (`RUNNER_TEMP` when usable, else the system temp dir).
    pub scratch: Option<PathBuf>,
    pub cancel: Option<Cancellation>,
}

impl ActionsCacheClient {
    /// The v2 client; `results_url` = `ACTIONS_RESULTS_URL`; the token is masked here.
    pub fn new(results_url: &str, token: &str, mode: CacheMode) -> Result<Self, CacheError> {
        let http = http_client()?;
        let service = Service::V2(TwirpClient::new(http.clone(), results_url, token)?);
        Ok(Self::around(service, http, RetryPolicy::default(), mode))
    }

    /// The v1 client; `cache_url` = `ACTIONS_CACHE_URL`; the token is masked here.
    pub fn v1(cache_url: &str, token: &str, mode: CacheMode) -> Result<Self, CacheError> {
        let http = http_client()?;
        let service = Service::V1(V1Client::new(http.clone(), cache_url, token)?);
        Ok(Self::around(service, http, RetryPolicy::v1(), mode))
    }

    fn around(
        service: Service,
        http: reqwest::Client,
        retry: RetryPolicy,
        mode: CacheMode,
    ) -> Self {
        Self {
            service,
            blob: blob::BlobClient {
                http,
                transfer: TransferOptions::default(),
                retry,
            },
            mode,
            scratch: None,
            cancel: None,
        }
    }

    pub fn protocol(&self) -> Protocol {
        match self.service {
            Service::V2(_) => Protocol::V2,
            Service::V1(_) => Protocol::V1,
        }
    }

    /// Same policy for the service's calls and blob transfers (tests use millisecond delays).
    pub fn set_retry(&mut self, retry: RetryPolicy) {
        match &mut self.service {
            Service::V2(t) => t.retry = retry,
            Service::V1(c) => c.retry = retry,
        }
        self.blob.retry = retry;
    }

    pub fn set_transfer(&mut self, transfer: TransferOptions) {
        self.blob.transfer = transfer;
    }

    /// How v1 cuts uploads (v2 has no chunks of its own).
    pub fn set_chunks(&mut self, chunks: ChunkOptions) {
        if let Service::V1(c) = &mut self.service {
            c.chunks = chunks;
        }
    }

    /// The entry the service would restore for these keys, without downloading it.
    pub async fn lookup(
        &self,
        key: &str,
        restore_keys: &[String],
        version: &str,
    ) -> Result<Option<LookupHit>, CacheError> {
        match &self.service {
            Service::V2(t) => t.lookup(key, restore_keys, version).await,
            Service::V1(c) => c.lookup(key, restore_keys, version).await,
        }
    }

    /// Reserves `key` and uploads nothing: what a job that died mid-save leaves (tests).
    pub async fn reserve(&self, key: &str, version: &str) -> Result<(), CacheError> {
        match &self.service {
            Service::V2(t) => t.create(key, version).await.map(|_| ()),
            Service::V1(c) => c.reserve(key, version, 0).await.map(|_| ()),
        }
    }

    async fn download(&self, url: &str, dest: &Path) -> Result<u64, CacheError> {
        match &self.service {
            Service::V1(_) if !v1::is_azure_blob(url) => {
                self.blob.download_generic(url, dest).await
            }
            Service::V1(_) | Service::V2(_) => self.blob.download(url, dest).await,
        }
    }

    /// Reserve, upload, commit; the entry id when the service gives one.
    async fn upload(
        &self,
        key: &str,
        version: &str,
        archive: &Path,
        size: u64,
    ) -> Result<Option<i64>, CacheError> {
        match &self.service {
            Service::V2(twirp) => {
                let upload_url = twirp.create(key, version).await?;
                failpoint::hit("cache:after-create");
                self.blob.upload(&upload_url, archive, size).await?;
                failpoint::hit("cache:after-upload");
                twirp.finalize(key, version, size).await
            }
            Service::V1(c) => {
                let id = c.reserve(key, version, size).await?;
                failpoint::hit("cache:after-create");
                c.upload(id, archive, size).await?;
                failpoint::hit("cache:after-upload");
                c.commit(id, size).await?;
                Ok(Some(id))
            }
        }
    }

    pub async fn restore(&self, req: &RestoreRequest<'_>) -> Result<RestoreOutcome, CacheError> {
        self.restore_matching(req, false).await
    }

    /// With `exact`, only an entry whose key is exactly `req.key` is downloaded (the service
    /// would otherwise answer a missing key with the newest entry it prefixes).
    async fn restore_matching(
        &self,
        req: &RestoreRequest<'_>,
        exact: bool,
    ) -> Result<RestoreOutcome, CacheError> {
        if !self.mode.can_restore() {
            return Err(CacheError::Disabled {
                reason: format!(
                    "restore is disabled by {} ({:?})",
                    env::ACTIONS_CACHE_MODE,
                    self.mode
                ),
            });
        }
        validate_keys(req.key, req.restore_keys)?;
        let version = req.version();
        let restore_keys: &[String] = if exact { &[] } else { req.restore_keys };
        let Some(hit) = self
            .lookup(req.key, restore_keys, &version)
            .await?
            .filter(|hit| !exact || hit.matched_key == req.key)
        else {
            return Ok(RestoreOutcome::Miss);
        };
        let tmp = scratch_dir(self.scratch.as_deref())?;
        let archive = tmp.path().join(ARCHIVE_NAME);
        let size_bytes = self.download(&hit.download_url, &archive).await?;
        let extracted = extract_blocking(archive, req.paths, req.workspace, req.into).await;
        hit_or_unrestorable(hit.matched_key, extracted, size_bytes)
    }

    pub async fn save(&self, req: &SaveRequest<'_>) -> Result<SaveReceipt, CacheError> {
        if !self.mode.can_save() {
            return Err(CacheError::Disabled {
                reason: format!(
                    "save is disabled by {} ({:?})",
                    env::ACTIONS_CACHE_MODE,
                    self.mode
                ),
            });
        }
        validate_keys(req.key, &[])?;
        let version = version(req.paths);
        let tmp = scratch_dir(self.scratch.as_deref())?;
        let archive = tmp.path().join(ARCHIVE_NAME);
        // Archive first: with nothing to save the service is never asked to reserve a key.
        let summary = archive_blocking(archive.clone(), req.paths, req.workspace).await?;
        failpoint::hit("cache:after-archive");
        let entry_id = self
            .upload(req.key, &version, &archive, summary.size_bytes)
            .await?;
        failpoint::hit("cache:after-finalize");
        Ok(SaveReceipt {
            entry_id,
            size_bytes: summary.size_bytes,
        })
    }
}

/// Where the phases restore from and save to.
// One Backend exists per run; boxing the client would only add an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Backend {
    Actions(ActionsCacheClient),
    Filesystem(FsBackend),
}

impl Backend {
    /// The runner's cache service, v1 or v2 as `select` chooses (honouring ACTIONS_CACHE_MODE);
    /// None when there is none.
    pub fn from_env(env: &Env) -> Option<Backend> {
        let chosen = select::service(env)?;
        let mode = CacheMode::parse(env.get(env::ACTIONS_CACHE_MODE));
        let client = match chosen.protocol {
            Protocol::V2 => ActionsCacheClient::new(chosen.url, chosen.token, mode),
            Protocol::V1 => ActionsCacheClient::v1(chosen.url, chosen.token, mode),
        };
        match client {
            Ok(mut client) => {
                client.scratch = env.runner_temp();
                Some(Backend::Actions(client))
            }
            Err(e) => {
                tracing::warn!("Actions cache unavailable: {e}");
                None
            }
        }
    }

    /// Cancels transfers in flight when the run is cancelled.
    pub fn with_cancellation(mut self, cancel: Cancellation) -> Self {
        match &mut self {
            Backend::Actions(c) => c.cancel = Some(cancel),
            Backend::Filesystem(f) => f.cancel = Some(cancel),
        }
        self
    }

    pub fn can_restore(&self) -> bool {
        match self {
            Backend::Actions(c) => c.mode.can_restore(),
            Backend::Filesystem(_) => true,
        }
    }

    pub fn can_save(&self) -> bool {
        match self {
            Backend::Actions(c) => c.mode.can_save(),
            Backend::Filesystem(_) => true,
        }
    }

    pub async fn restore(&self, req: &RestoreRequest<'_>) -> Result<RestoreOutcome, CacheError> {
        match self {
            Backend::Actions(c) => cancellable(c.cancel.as_ref(), c.restore(req)).await,
            Backend::Filesystem(f) => cancellable(f.cancel.as_ref(), f.restore(req)).await,
        }
    }

    /// Restores the entry with exactly `req.key` (restore keys ignored): a miss when there is
    /// none, never another entry.
    pub async fn restore_exact(
        &self,
        req: &RestoreRequest<'_>,
    ) -> Result<RestoreOutcome, CacheError> {
        match self {
            Backend::Actions(c) => {
                cancellable(c.cancel.as_ref(), c.restore_matching(req, true)).await
            }
            Backend::Filesystem(f) => {
                cancellable(f.cancel.as_ref(), f.restore_matching(req, true)).await
            }
        }
    }

    /// Whether a committed entry exists under exactly `key` for these paths (no download). The
    /// post step asks this before retrying: main may have finished its save just before it died.
    pub async fn has_entry(&self, key: &str, paths: &[String]) -> Result<bool, CacheError> {
        let version = version(paths);
        match self {
            Backend::Actions(c) => Ok(c
                .lookup(key, &[], &version)
                .await?
                .is_some_and(|hit| hit.matched_key == key)),
            Backend::Filesystem(f) => Ok(f
                .find(key, &[], &version)?
                .is_some_and(|entry| entry.key == key)),
        }
    }

    pub async fn save(&self, req: &SaveRequest<'_>) -> Result<SaveReceipt, CacheError> {
        match self {
            Backend::Actions(c) => cancellable(c.cancel.as_ref(), c.save(req)).await,
            Backend::Filesystem(f) => cancellable(f.cancel.as_ref(), f.save(req)).await,
        }
    }
}

/// Drops the operation (closing its connections; temp files clean up on drop) on cancellation.
/// Extraction already running in a blocking thread finishes its own move-into-place step.
async fn cancellable<T>(
    cancel: Option<&Cancellation>,
    op: impl std::future::Future<Output = Result<T, CacheError>>,
) -> Result<T, CacheError> {
    match cancel {
        Some(c) => tokio::select! {
            biased;
            _ = c.cancelled() => Err(CacheError::Cancelled),
            r = op => r,
        },
        None => op.await,
    }
}

fn http_client() -> Result<reqwest::Client, CacheError> {
    crate::net::external()
        .user_agent(concat!("fro-bot/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|source| CacheError::Transport {
            operation: "building the HTTP client",
            source,
        })
}

fn validate_keys(key: &str, restore_keys: &[String]) -> Result<(), CacheError> {
    if 1 + restore_keys.len() > MAX_KEYS {
        return Err(CacheError::InvalidKey {
            key: key.to_string(),
            reason: "more than 10 keys (key + restore keys)",
        });
    }
    for k in std::iter::once(key).chain(restore_keys.iter().map(String::as_str)) {
        if k.is_empty() {
            return Err(CacheError::InvalidKey {
                key: k.to_string(),
                reason: "empty",
            });
        }
        if k.encode_utf16().count() > MAX_KEY_UNITS {
            return Err(CacheError::InvalidKey {
                key: k.to_string(),
                reason: "longer than 512 characters",
            });
        }
        if k.contains(',') {
            return Err(CacheError::InvalidKey {
                key: k.to_string(),
                reason: "contains a comma",
            });
        }
    }
    Ok(())
}

fn scratch_dir(base: Option<&Path>) -> Result<tempfile::TempDir, CacheError> {
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix("fro-bot-cache-");
        b
    };
    match base {
        Some(dir) => builder
            .tempdir_in(dir)
            .map_err(|e| CacheError::io("cannot create a temp dir in", dir, e)),
        None => builder
            .tempdir()
            .map_err(|e| CacheError::io("cannot create a temp dir in", std::env::temp_dir(), e)),
    }
}

/// An extraction that failed because of the archive itself makes the entry unrestorable; any
/// other failure (local disk, cancellation) stays an error.
pub(crate) fn hit_or_unrestorable(
    matched_key: String,
    extracted: Result<ExtractReport, CacheError>,
    size_bytes: u64,
) -> Result<RestoreOutcome, CacheError> {
    match extracted {
        Ok(report) => Ok(RestoreOutcome::Hit {
            matched_key,
            restored: report.restored,
            size_bytes,
        }),
        Err(e) if e.is_entry_fault() => Ok(RestoreOutcome::Unrestorable {
            matched_key,
            reason: e.to_string(),
        }),
        Err(e) => Err(e),
    }
}

pub(crate) async fn archive_blocking(
    dest: PathBuf,
    paths: &[String],
    workspace: &Path,
) -> Result<ArchiveSummary, CacheError> {
    let paths = paths.to_vec();
    let workspace = workspace.to_path_buf();
    tokio::task::spawn_blocking(move || write_archive(&paths, &workspace, &dest))
        .await
        .map_err(|source| CacheError::Task { source })?
}

pub(crate) async fn extract_blocking(
    archive: PathBuf,
    paths: &[CachePath],
    workspace: &Path,
    into: Option<&Path>,
) -> Result<ExtractReport, CacheError> {
    let paths = paths.to_vec();
    let workspace = workspace.to_path_buf();
    let into = into.map(Path::to_path_buf);
    tokio::task::spawn_blocking(move || match into {
        Some(dir) => extract_confined_into(&archive, &paths, &workspace, &dir),
        None => extract_confined(&archive, &paths, &workspace),
    })
    .await
    .map_err(|source| CacheError::Task { source })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_mode_follows_the_toolkit() {
        let m = |v| CacheMode::parse(v);
        assert!(m(None).can_restore() && m(None).can_save());
        assert!(m(Some("")).can_restore() && m(Some("weird")).can_save());
        assert!(m(Some("read")).can_restore() && !m(Some("read")).can_save());
        assert!(!m(Some("write-only")).can_restore() && m(Some("write-only")).can_save());
        assert!(m(Some("write")).can_restore() && m(Some("write")).can_save());
        assert!(!m(Some("none")).can_restore() && !m(Some("none")).can_save());
    }

    #[test]
    fn from_env_needs_url_and_token() {
        let base = [
            (env::ACTIONS_RESULTS_URL, "https://results.example.com/"),
            (env::ACTIONS_RUNTIME_TOKEN, "runtime-token-xyz"),
        ];
        assert!(Backend::from_env(&Env::from_pairs(base)).is_some());
        assert!(Backend::from_env(&Env::from_pairs([base[0]])).is_none());
        assert!(Backend::from_env(&Env::from_pairs([base[1]])).is_none());
        let mut e = Env::from_pairs(base);
        e.set(env::ACTIONS_CACHE_MODE, "read");
        let b = Backend::from_env(&e).unwrap();
        assert!(b.can_restore() && !b.can_save());
    }

    #[test]
    fn keys_are_validated_like_the_service() {
        assert!(validate_keys("a", &[]).is_ok());
        assert!(matches!(
            validate_keys("a,b", &[]),
            Err(CacheError::InvalidKey { .. })
        ));
        assert!(validate_keys(&"x".repeat(513), &[]).is_err());
        let many: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        assert!(validate_keys("a", &many).is_err());
    }
}
