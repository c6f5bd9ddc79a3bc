//! Dedup sentinels kept in the Actions cache (docs/design.md#the-github-surface): a tiny entry per
//! successful issue/PR run, found again by key prefix.

use std::path::PathBuf;

use crate::cache::{self, CacheError, RestoreOutcome};
use crate::github::dedup::{Sentinel, SentinelStore};

/// The sentinel lives at one fixed path (its string is part of the cache version, so it must be
/// the same in every run): beside OpenCode's data dir, never inside a memory path.
pub struct CacheSentinels<'a> {
    pub backend: &'a cache::Backend,
    pub file: PathBuf,
    pub workspace: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum SentinelError {
    #[error("dedup sentinel cache: {source}")]
    Cache {
        #[source]
        source: CacheError,
    },
    #[error("dedup sentinel file {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl CacheSentinels<'_> {
    fn paths(&self) -> Vec<String> {
        vec![self.file.to_string_lossy().into_owned()]
    }

    fn targets(&self) -> Vec<cache::CachePath> {
        vec![cache::CachePath::file(self.file.to_string_lossy())]
    }

    fn io(&self, source: std::io::Error) -> SentinelError {
        SentinelError::Io {
            path: self.file.clone(),
            source,
        }
    }
}

impl SentinelStore for CacheSentinels<'_> {
    type Error = SentinelError;

    async fn find(&self, prefix: &str) -> Result<Option<Sentinel>, SentinelError> {
        match std::fs::remove_file(&self.file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(self.io(e)),
        }
        let targets = self.targets();
        let request = cache::RestoreRequest {
            key: prefix,
            restore_keys: &[],
            paths: &targets,
            workspace: &self.workspace,
            into: None,
        };
        match self.backend.restore(&request).await {
            // An unreadable sentinel is no sentinel: the run proceeds.
            Ok(RestoreOutcome::Miss | RestoreOutcome::Unrestorable { .. }) => Ok(None),
            Ok(RestoreOutcome::Hit { .. }) => match std::fs::read(&self.file) {
                // An unreadable sentinel is as good as none: never block a run on it.
                Ok(raw) => Ok(Sentinel::from_json(&raw).ok()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(self.io(e)),
            },
            Err(source) => Err(SentinelError::Cache { source }),
        }
    }

    async fn save(&self, key: &str, sentinel: &Sentinel) -> Result<(), SentinelError> {
        if let Some(dir) = self.file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.io(e))?;
        }
        std::fs::write(&self.file, sentinel.to_json()).map_err(|e| self.io(e))?;
        let paths = self.paths();
        let request = cache::SaveRequest {
            key,
            paths: &paths,
            workspace: &self.workspace,
        };
        self.backend
            .save(&request)
            .await
            .map(|_| ())
            .map_err(|source| SentinelError::Cache { source })
    }
}
