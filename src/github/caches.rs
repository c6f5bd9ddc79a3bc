//! The repository's Actions cache entries through the REST API: listing under a key prefix
//! (`actions: read`) and deleting by exact key (`actions: write`). The restore phase uses them to
//! fall back past an entry it cannot restore and to delete that entry (docs/persistence.md).

use serde::Deserialize;
use serde_json::Value;

use super::api::{ApiError, GitHub};
use super::retry::Resend;

/// The REST API returns at most 100 entries per page.
const MAX_PER_PAGE: usize = 100;

/// One cache entry as the REST API lists it (only what the fallback reads).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CacheEntryInfo {
    pub key: String,
    pub version: String,
    #[serde(default)]
    pub created_at: Option<String>,
}

/// A page of the listing, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheListing {
    pub entries: Vec<CacheEntryInfo>,
    /// Entries under the prefix on the server, all versions (may exceed `entries.len()`).
    pub total_count: u64,
}

#[derive(Deserialize)]
struct ListBody {
    #[serde(default)]
    total_count: u64,
    #[serde(default)]
    actions_caches: Vec<Value>,
}

impl GitHub {
    /// `GET /repos/{o}/{r}/actions/caches?key={prefix}&sort=created_at&direction=desc`: the newest
    /// `limit` entries whose key starts with `prefix`. Entries that do not parse are skipped.
    pub async fn list_caches(&self, prefix: &str, limit: usize) -> Result<CacheListing, ApiError> {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("key", prefix)
            .append_pair("sort", "created_at")
            .append_pair("direction", "desc")
            .append_pair("per_page", &limit.clamp(1, MAX_PER_PAGE).to_string())
            .finish();
        let body: ListBody = self
            .get(format!("{}/actions/caches?{query}", self.repo_path()))
            .await
            .map_err(|e| ApiError::from_octocrab("list cache entries", e))?;
        let entries = body
            .actions_caches
            .into_iter()
            .filter_map(|v| serde_json::from_value::<CacheEntryInfo>(v).ok())
            .collect();
        Ok(CacheListing {
            entries,
            total_count: body.total_count,
        })
    }

    /// `DELETE /repos/{o}/{r}/actions/caches?key={key}`: deletes every entry with exactly this key.
    /// GitHub documents one answer, 200 with the entries it deleted (`actions-cache-list`):
    /// `Ok(true)` when it names one, `Ok(false)` when it names none. A 404 is not in that
    /// description and could mean the route or the repository as well as the key: `Ok(false)` only
    /// when the listing (the documented `GET`) then shows no entry with this key, else the error.
    pub async fn delete_cache(&self, key: &str) -> Result<bool, ApiError> {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("key", key)
            .finish();
        let path = format!("{}/actions/caches?{query}", self.repo_path());
        let result: Result<ListBody, _> = self
            .call(Resend::Free, || self.client.delete(&path, None::<&()>))
            .await;
        match result.map_err(|e| ApiError::from_octocrab("delete cache entry", e)) {
            Ok(body) => Ok(body.total_count > 0 || !body.actions_caches.is_empty()),
            Err(e) if e.status() == Some(404) => match self.list_caches(key, MAX_PER_PAGE).await {
                Ok(listing) if listing.entries.iter().all(|c| c.key != key) => Ok(false),
                _ => Err(e),
            },
            Err(e) => Err(e),
        }
    }
}
