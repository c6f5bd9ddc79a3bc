//! The one error type of the cache boundary. The save phase sorts these into `cache-rejected`
//! (the service refused, nothing is broken) and `cache-error` with [`CacheError::is_rejection`].

use std::path::PathBuf;

use super::Rejection;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// 409 `already_exists`: an entry with this key and version exists or is being written.
    #[error("a cache entry with key {key:?} already exists (another job may be creating it)")]
    AlreadyExists { key: String },
    /// `ok:false` on create (or on finalize): the service did not reserve/commit the entry.
    #[error("the cache service did not reserve the entry: {message}")]
    NotReserved { message: String },
    /// `ok:false` with a `cache write denied:` message: the token has no write scope.
    #[error("{message}")]
    WriteDenied { message: String },
    /// 403 on lookup (`cache read denied: ...`).
    #[error("cache read denied: {message}")]
    ReadDenied { message: String },
    /// 429; never retried. `Retry-After` is only reported.
    #[error("the cache service is rate limiting (retry after {})", retry_after.as_deref().unwrap_or("unspecified"))]
    RateLimited { retry_after: Option<String> },
    /// The repository's cache storage quota is used up ("insufficient usage").
    #[error("cache quota exhausted: {message}")]
    Quota { message: String },
    /// 5xx after all retries.
    #[error("the cache service failed with HTTP {status} after {attempts} attempts: {message}")]
    Server {
        status: u16,
        attempts: u32,
        message: String,
    },
    /// Any other unexpected HTTP status (400, 401, 404, ...) from the service or the blob store.
    #[error("{operation} failed with HTTP {status}: {message}")]
    Http {
        operation: &'static str,
        status: u16,
        message: String,
    },
    /// A body that is not the JSON we expect, after all retries, or a response missing a field.
    #[error("invalid response to {operation}: {detail}")]
    InvalidResponse {
        operation: &'static str,
        detail: String,
    },
    /// Connection-level failure (DNS, TLS, reset, timeout, body cut off), with what failed (a
    /// certificate the runner does not trust says so: docs/troubleshooting.md).
    #[error("{operation}: transport error{}", causes(source))]
    Transport {
        operation: &'static str,
        #[source]
        source: reqwest::Error,
    },
    /// The archive could not be written or read (tar or zstd level), including truncation and
    /// checksum failures.
    #[error("cache archive {}: {detail}", path.display())]
    Archive {
        path: PathBuf,
        detail: String,
        #[source]
        source: std::io::Error,
    },
    /// A restored entry refused as a whole: over a cap, holding a member that no clean entry for
    /// these paths holds, or not valid tar. Nothing was moved into place.
    #[error("cache entry refused: {rejection}")]
    Rejected { rejection: Rejection },
    /// The archive was readable but could not be put in place.
    #[error("cannot extract to {}: {detail}", path.display())]
    Extraction {
        path: PathBuf,
        detail: String,
        #[source]
        source: std::io::Error,
    },
    /// Local file-system failure outside the archive itself (temp files, the filesystem backend).
    #[error("{} {}", action, path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// None of the paths to save exists.
    #[error("none of the cache paths exists: {}", paths.join(", "))]
    NothingToSave { paths: Vec<String> },
    /// A key the service would refuse (too long, contains a comma, too many keys).
    #[error("invalid cache key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    /// The run was cancelled while the transfer was in progress.
    #[error("cancelled")]
    Cancelled,
    /// `ACTIONS_CACHE_MODE` forbids this direction.
    #[error("cache {reason}")]
    Disabled { reason: String },
    /// A background task died (panicked); carries what tokio reported.
    #[error("cache worker task failed")]
    Task {
        #[source]
        source: tokio::task::JoinError,
    },
}

/// `: cause: its cause…` under a transport error (`: client error (Connect): invalid peer
/// certificate: UnknownIssuer`), empty when there is none. reqwest's own message is left out: it
/// names the URL, signed for blob transfers.
fn causes(e: &reqwest::Error) -> String {
    let mut out = String::new();
    let mut next = std::error::Error::source(e);
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}

impl CacheError {
    /// The service refused the save but nothing is broken: `cache-rejected` rather than
    /// `cache-error`.
    pub fn is_rejection(&self) -> bool {
        match self {
            CacheError::AlreadyExists { .. }
            | CacheError::NotReserved { .. }
            | CacheError::WriteDenied { .. }
            | CacheError::RateLimited { .. }
            | CacheError::Quota { .. } => true,
            CacheError::ReadDenied { .. }
            | CacheError::Server { .. }
            | CacheError::Http { .. }
            | CacheError::InvalidResponse { .. }
            | CacheError::Transport { .. }
            | CacheError::Archive { .. }
            | CacheError::Rejected { .. }
            | CacheError::Extraction { .. }
            | CacheError::Io { .. }
            | CacheError::NothingToSave { .. }
            | CacheError::InvalidKey { .. }
            | CacheError::Cancelled
            | CacheError::Disabled { .. }
            | CacheError::Task { .. } => false,
        }
    }

    /// The entry itself was refused as hostile or broken by design ([`CacheError::Rejected`]):
    /// a restore should try an older entry and never let this one shadow good memory.
    pub fn is_hostile(&self) -> bool {
        matches!(self, CacheError::Rejected { .. })
    }

    /// The entry's archive itself is at fault (unreadable, truncated, hostile): no retry of the
    /// same entry can succeed, so restore falls back to an older one.
    pub fn is_entry_fault(&self) -> bool {
        match self {
            CacheError::Archive { .. } | CacheError::Rejected { .. } => true,
            // A member name no file system takes (a NUL byte, an over-long name) is the archive's
            // doing; every other extraction failure is the local disk's.
            CacheError::Extraction { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidFilename
            ),
            CacheError::AlreadyExists { .. }
            | CacheError::NotReserved { .. }
            | CacheError::WriteDenied { .. }
            | CacheError::ReadDenied { .. }
            | CacheError::RateLimited { .. }
            | CacheError::Quota { .. }
            | CacheError::Server { .. }
            | CacheError::Http { .. }
            | CacheError::InvalidResponse { .. }
            | CacheError::Transport { .. }
            | CacheError::Io { .. }
            | CacheError::NothingToSave { .. }
            | CacheError::InvalidKey { .. }
            | CacheError::Cancelled
            | CacheError::Disabled { .. }
            | CacheError::Task { .. } => false,
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        CacheError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
