//! A cache on the local file system for `fro-bot local`: the service's matching rules and the same
//! archive format, with atomic writes (temp + rename; the metadata file commits an entry).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    archive_blocking, extract_blocking, hit_or_unrestorable, validate_keys, version, CacheError,
    RestoreOutcome, RestoreRequest, SaveReceipt, SaveRequest,
};
use crate::runner::Cancellation;

/// One committed entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEntry {
    pub key: String,
    pub version: String,
    /// Creation time, nanoseconds since the epoch: "newest" for prefix matches.
    pub created_ns: u64,
    pub size_bytes: u64,
    /// Archive file name inside the backend's directory.
    pub archive: String,
}

#[derive(Debug, Clone)]
pub struct FsBackend {
    dir: PathBuf,
    pub cancel: Option<Cancellation>,
}

impl FsBackend {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            cancel: None,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Metadata file of key+version: one per pair, so its existence is the "already exists" test.
    fn meta_path(&self, key: &str, version: &str) -> PathBuf {
        let id = hex::encode(Sha256::digest(format!("{key}\0{version}").as_bytes()));
        self.dir.join(format!("{id}.json"))
    }

    /// Every committed entry (unreadable metadata files are skipped with a warning).
    pub fn entries(&self) -> Result<Vec<FsEntry>, CacheError> {
        let listing = match fs::read_dir(&self.dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CacheError::io("cannot list", &self.dir, e)),
        };
        let mut out = Vec::new();
        for item in listing {
            let path = item
                .map_err(|e| CacheError::io("cannot list", &self.dir, e))?
                .path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<FsEntry>(&b).ok())
            {
                Some(entry) => out.push(entry),
                None => tracing::warn!("ignoring unreadable cache entry {}", path.display()),
            }
        }
        Ok(out)
    }

    /// The service's rule: for each of [key, restore_keys...], an exact match, else the newest
    /// entry whose key starts with it; the version must be equal.
    pub fn find(
        &self,
        key: &str,
        restore_keys: &[String],
        version: &str,
    ) -> Result<Option<FsEntry>, CacheError> {
        let entries: Vec<FsEntry> = self
            .entries()?
            .into_iter()
            .filter(|e| e.version == version)
            .collect();
        for wanted in std::iter::once(key).chain(restore_keys.iter().map(String::as_str)) {
            if let Some(e) = entries.iter().find(|e| e.key == wanted) {
                return Ok(Some(e.clone()));
            }
            if let Some(e) = entries
                .iter()
                .filter(|e| e.key.starts_with(wanted))
                .max_by(|a, b| (a.created_ns, &a.key).cmp(&(b.created_ns, &b.key)))
            {
                return Ok(Some(e.clone()));
            }
        }
        Ok(None)
    }

    pub async fn restore(&self, req: &RestoreRequest<'_>) -> Result<RestoreOutcome, CacheError> {
        self.restore_matching(req, false).await
    }

    pub(crate) async fn restore_matching(
        &self,
        req: &RestoreRequest<'_>,
        exact: bool,
    ) -> Result<RestoreOutcome, CacheError> {
        let restore_keys: &[String] = if exact { &[] } else { req.restore_keys };
        validate_keys(req.key, restore_keys)?;
        let Some(entry) = self
            .find(req.key, restore_keys, &req.version())?
            .filter(|e| !exact || e.key == req.key)
        else {
            return Ok(RestoreOutcome::Miss);
        };
        let archive = self.dir.join(&entry.archive);
        let extracted = extract_blocking(archive, req.paths, req.workspace, req.into).await;
        hit_or_unrestorable(entry.key, extracted, entry.size_bytes)
    }

    /// Committed entries whose key starts with `prefix` and whose version is `version`, newest
    /// first (what the REST listing gives for the Actions cache).
    pub fn list(&self, prefix: &str, version: &str) -> Result<Vec<FsEntry>, CacheError> {
        let mut out: Vec<FsEntry> = self
            .entries()?
            .into_iter()
            .filter(|e| e.version == version && e.key.starts_with(prefix))
            .collect();
        out.sort_by(|a, b| (b.created_ns, &b.key).cmp(&(a.created_ns, &a.key)));
        Ok(out)
    }

    /// Deletes every entry with exactly `key` (metadata first: that uncommits it). `Ok(false)`
    /// when there was none.
    pub fn delete(&self, key: &str) -> Result<bool, CacheError> {
        let mut deleted = false;
        for entry in self.entries()?.into_iter().filter(|e| e.key == key) {
            let meta = self.meta_path(&entry.key, &entry.version);
            fs::remove_file(&meta).map_err(|e| CacheError::io("cannot delete", &meta, e))?;
            let _ = fs::remove_file(self.dir.join(&entry.archive));
            deleted = true;
        }
        Ok(deleted)
    }

    pub async fn save(&self, req: &SaveRequest<'_>) -> Result<SaveReceipt, CacheError> {
        validate_keys(req.key, &[])?;
        let version = version(req.paths);
        let meta_path = self.meta_path(req.key, &version);
        if meta_path.exists() {
            return Err(CacheError::AlreadyExists {
                key: req.key.to_string(),
            });
        }
        fs::create_dir_all(&self.dir).map_err(|e| CacheError::io("cannot create", &self.dir, e))?;
        let tmp = tempfile::Builder::new()
            .prefix(".fro-bot-save-")
            .tempdir_in(&self.dir)
            .map_err(|e| CacheError::io("cannot create a temp dir in", &self.dir, e))?;
        let staged = tmp.path().join("cache.tzst");
        let summary = archive_blocking(staged.clone(), req.paths, req.workspace).await?;
        let archive = format!("{}.tzst", hex::encode(rand::random::<[u8; 16]>()));
        fs::rename(&staged, self.dir.join(&archive))
            .map_err(|e| CacheError::io("cannot store archive", self.dir.join(&archive), e))?;
        let entry = FsEntry {
            key: req.key.to_string(),
            version,
            created_ns: now_ns(),
            size_bytes: summary.size_bytes,
            archive: archive.clone(),
        };
        let meta_tmp = tmp.path().join("meta.json");
        let json = serde_json::to_vec_pretty(&entry)
            .map_err(|e| CacheError::io("cannot encode", &meta_tmp, std::io::Error::other(e)))?;
        fs::write(&meta_tmp, json).map_err(|e| CacheError::io("cannot write", &meta_tmp, e))?;
        // hard_link fails if the metadata exists: a concurrent save of the same key loses cleanly.
        if let Err(e) = fs::hard_link(&meta_tmp, &meta_path) {
            let _ = fs::remove_file(self.dir.join(&archive));
            return Err(if e.kind() == std::io::ErrorKind::AlreadyExists {
                CacheError::AlreadyExists {
                    key: req.key.to_string(),
                }
            } else {
                CacheError::io("cannot commit", &meta_path, e)
            });
        }
        Ok(SaveReceipt {
            entry_id: None,
            size_bytes: summary.size_bytes,
        })
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
