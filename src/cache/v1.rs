//! The cache service v1 client (`ACTIONS_CACHE_URL`: what GitHub Enterprise Server runners offer),
//! speaking the REST `_apis/artifactcache` protocol as `@actions/cache` 6.3.0 does
//! (`internal/cacheHttpClient.ts`): look up by keys and version, reserve, PATCH the archive in
//! ranged chunks, commit with its size. The archive, keys and version are the v2 path's.

use std::path::Path;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::blob::file_body;
use super::twirp::{error_message, excerpt, mask_signed_url, LookupHit, RetryPolicy};
use super::CacheError;
use crate::runner::log;

/// The API version every toolkit request names (`createAcceptHeader`).
const ACCEPT_V1: &str = "application/json;api-version=6.0-preview.1";
const MIB: u64 = 1024 * 1024;

/// The four calls, as errors and the test server name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V1Op {
    GetCacheEntry,
    ReserveCache,
    UploadChunk,
    CommitCache,
}

impl V1Op {
    pub fn name(self) -> &'static str {
        match self {
            V1Op::GetCacheEntry => "GetCacheEntry",
            V1Op::ReserveCache => "ReserveCache",
            V1Op::UploadChunk => "UploadChunk",
            V1Op::CommitCache => "CommitCache",
        }
    }
}

/// How the archive is cut for upload: the toolkit's `getUploadOptions` defaults (32 MiB chunks,
/// four in flight). Tests shrink the chunk to force several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkOptions {
    pub chunk_size: u64,
    pub concurrency: usize,
}

impl Default for ChunkOptions {
    fn default() -> Self {
        Self {
            chunk_size: 32 * MIB,
            concurrency: 4,
        }
    }
}

impl RetryPolicy {
    /// The toolkit's v1 rules (`requestUtils.retry`): two attempts, 5 s apart (here 5–7.5 s with
    /// jitter); fro-bot adds the v2 path's two extra attempts after a failed connection.
    pub fn v1() -> Self {
        Self {
            attempts: 2,
            base_delay: Duration::from_secs(5),
            connect_retries: 2,
        }
    }
}

/// A reply the caller reads: its status and, when asked for, its JSON object body.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    body: Option<Value>,
}

/// What one HTTP reply means under the v1 retry rules.
#[derive(Debug)]
enum Judged {
    Done(Reply),
    Retry,
    Fail(CacheError),
}

#[derive(Debug, Clone)]
pub struct V1Client {
    http: reqwest::Client,
    /// `ACTIONS_CACHE_URL` with a trailing slash: resources are appended to its path, as the
    /// toolkit's `getCacheApiUrl` does.
    base: url::Url,
    token: String,
    pub retry: RetryPolicy,
    pub chunks: ChunkOptions,
}

impl V1Client {
    /// `cache_url` is `ACTIONS_CACHE_URL` (path kept); the token is masked here.
    pub fn new(http: reqwest::Client, cache_url: &str, token: &str) -> Result<Self, CacheError> {
        log::add_mask(token);
        let mut base = url::Url::parse(cache_url).map_err(|e| CacheError::InvalidResponse {
            operation: crate::runner::env::ACTIONS_CACHE_URL,
            detail: format!("not a URL: {e}"),
        })?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(CacheError::InvalidResponse {
                operation: crate::runner::env::ACTIONS_CACHE_URL,
                detail: "not an http(s) URL".into(),
            });
        }
        // Runners end it with a slash; without one the toolkit would build a broken URL.
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        base.set_query(None);
        base.set_fragment(None);
        Ok(Self {
            http,
            base,
            token: token.to_string(),
            retry: RetryPolicy::v1(),
            chunks: ChunkOptions::default(),
        })
    }

    fn resource(&self, resource: &str) -> Result<url::Url, CacheError> {
        self.base
            .join(&format!("_apis/artifactcache/{resource}"))
            .map_err(|e| CacheError::InvalidResponse {
                operation: crate::runner::env::ACTIONS_CACHE_URL,
                detail: format!("cannot build the service URL: {e}"),
            })
    }

    /// `GET cache?keys=…&version=…`: `None` on 204 (a miss).
    pub async fn lookup(
        &self,
        key: &str,
        restore_keys: &[String],
        version: &str,
    ) -> Result<Option<LookupHit>, CacheError> {
        let keys: Vec<&str> = std::iter::once(key)
            .chain(restore_keys.iter().map(String::as_str))
            .collect();
        let url = self.resource(&format!(
            "cache?keys={}&version={}",
            encode_uri_component(&keys.join(",")),
            encode_uri_component(version)
        ))?;
        let op = V1Op::GetCacheEntry;
        let reply = self
            .call(op, true, || async { Ok(self.http.get(url.clone())) })
            .await?;
        match reply.body {
            _ if reply.status == StatusCode::NO_CONTENT => Ok(None),
            Some(v) => lookup_reply(&v).map(Some),
            None => Err(CacheError::InvalidResponse {
                operation: op.name(),
                detail: format!("HTTP {} without a body", reply.status.as_u16()),
            }),
        }
    }

    /// `POST caches` with the archive's size: the reserved entry's id.
    pub async fn reserve(&self, key: &str, version: &str, size: u64) -> Result<i64, CacheError> {
        let url = self.resource("caches")?;
        let body = json!({ "key": key, "version": version, "cacheSize": size });
        let reply = self
            .call(V1Op::ReserveCache, true, || async {
                Ok(self.http.post(url.clone()).json(&body))
            })
            .await?;
        reserve_reply(reply.body.as_ref())
    }

    /// `PATCH caches/{id}` per chunk, `Content-Range: bytes a-b/*`, several in flight.
    pub async fn upload(&self, id: i64, file: &Path, size: u64) -> Result<(), CacheError> {
        let url = self.resource(&format!("caches/{id}"))?;
        futures_util::stream::iter(chunk_ranges(size, self.chunks.chunk_size))
            .map(|(a, b)| self.upload_chunk(&url, file, a, b))
            .buffer_unordered(self.chunks.concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn upload_chunk(
        &self,
        url: &url::Url,
        file: &Path,
        a: u64,
        b: u64,
    ) -> Result<(), CacheError> {
        let len = b - a + 1;
        self.call(V1Op::UploadChunk, false, || async move {
            let body = file_body(file, a, len).await?;
            Ok(self
                .http
                .patch(url.clone())
                .header(CONTENT_TYPE, "application/octet-stream")
                .header("Content-Range", format!("bytes {a}-{b}/*"))
                .header(CONTENT_LENGTH, len)
                .body(body))
        })
        .await
        .map(|_| ())
    }

    /// `POST caches/{id}` with the archive's size: the entry becomes visible to lookups.
    pub async fn commit(&self, id: i64, size: u64) -> Result<(), CacheError> {
        let url = self.resource(&format!("caches/{id}"))?;
        let body = json!({ "size": size });
        self.call(V1Op::CommitCache, false, || async {
            Ok(self.http.post(url.clone()).json(&body))
        })
        .await
        .map(|_| ())
    }

    /// One call with the v1 retry rules; `json` asks for the body of a 2xx other than 204.
    async fn call<F, Fut>(&self, op: V1Op, json: bool, build: F) -> Result<Reply, CacheError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<reqwest::RequestBuilder, CacheError>>,
    {
        let mut attempt = 0;
        let mut connect_failures = 0;
        loop {
            attempt += 1;
            let more = attempt < self.retry.attempts;
            let request = build()
                .await?
                .bearer_auth(&self.token)
                .header(ACCEPT, ACCEPT_V1);
            let received = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let retry_after = response
                        .headers()
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    response
                        .text()
                        .await
                        .map(|text| (status, retry_after, text))
                }
                Err(e) => Err(e),
            };
            let judged = match received {
                Ok((status, retry_after, text)) => {
                    judge(op, status, retry_after, &text, json, more, attempt)
                }
                Err(source) if source.is_connect() || source.is_timeout() => {
                    if connect_failures < self.retry.connect_retries {
                        connect_failures += 1;
                        attempt -= 1;
                        Judged::Retry
                    } else if more {
                        Judged::Retry
                    } else {
                        Judged::Fail(CacheError::Transport {
                            operation: op.name(),
                            source,
                        })
                    }
                }
                // The toolkit retries every thrown error (a reset, a body cut off).
                Err(_) if more => Judged::Retry,
                Err(source) => Judged::Fail(CacheError::Transport {
                    operation: op.name(),
                    source,
                }),
            };
            match judged {
                Judged::Done(reply) => return Ok(reply),
                Judged::Fail(e) => return Err(e),
                Judged::Retry => {
                    tracing::debug!("{} failed; retrying", op.name());
                    tokio::time::sleep(self.retry.delay(attempt.saturating_sub(1))).await;
                }
            }
        }
    }
}

/// The v1 retry rules for one reply (the toolkit's `retry` and `isRetryableStatusCode`): 502, 503
/// and 504 are retried while attempts remain; 429 is not (as on v2: `RateLimited`, keeping
/// Retry-After); 500 and every 4xx fail at once; a 2xx whose JSON cannot be read is retried.
fn judge(
    op: V1Op,
    status: StatusCode,
    retry_after: Option<String>,
    text: &str,
    json: bool,
    more: bool,
    attempt: u32,
) -> Judged {
    if status.is_success() {
        if !json || status == StatusCode::NO_CONTENT {
            return Judged::Done(Reply { status, body: None });
        }
        return match serde_json::from_str::<Value>(text) {
            Ok(v) if v.is_object() => Judged::Done(Reply {
                status,
                body: Some(v),
            }),
            _ if more => Judged::Retry,
            _ => Judged::Fail(CacheError::InvalidResponse {
                operation: op.name(),
                detail: format!("not a JSON object: {}", excerpt(text)),
            }),
        };
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Judged::Fail(CacheError::RateLimited { retry_after });
    }
    if matches!(status.as_u16(), 502..=504) && more {
        return Judged::Retry;
    }
    Judged::Fail(classify_failure(op, status, text, attempt))
}

/// A failed call, sorted into the outcomes the v2 path gives the same refusal.
fn classify_failure(op: V1Op, status: StatusCode, text: &str, attempt: u32) -> CacheError {
    let message = error_message(text);
    if status.is_server_error() {
        return CacheError::Server {
            status: status.as_u16(),
            attempts: attempt,
            message,
        };
    }
    if status == StatusCode::CONFLICT {
        return CacheError::AlreadyExists { key: message };
    }
    if message.contains("insufficient usage") {
        return CacheError::Quota { message };
    }
    // The toolkit reads a 400 on reserve as the entry being over the service's size cap.
    if status == StatusCode::BAD_REQUEST && op == V1Op::ReserveCache {
        return CacheError::Quota { message };
    }
    if status == StatusCode::FORBIDDEN {
        return match op {
            V1Op::GetCacheEntry => CacheError::ReadDenied { message },
            V1Op::ReserveCache | V1Op::UploadChunk | V1Op::CommitCache => {
                CacheError::WriteDenied { message }
            }
        };
    }
    CacheError::Http {
        operation: op.name(),
        status: status.as_u16(),
        message,
    }
}

/// A lookup hit's body: `archiveLocation` must be an http(s) URL (it is fetched without the
/// runtime token) and `cacheKey` names the entry that matched.
fn lookup_reply(v: &Value) -> Result<LookupHit, CacheError> {
    let op = V1Op::GetCacheEntry.name();
    let location = v
        .get("archiveLocation")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| CacheError::InvalidResponse {
            operation: op,
            detail: "a hit without an archiveLocation".into(),
        })?;
    // Signed like v2's URL (the toolkit masks the whole of it): a secret before anything prints it.
    mask_signed_url(location);
    log::add_mask(location);
    let parsed = url::Url::parse(location).ok();
    if !parsed.is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host()) {
        return Err(CacheError::InvalidResponse {
            operation: op,
            detail: "archiveLocation is not an http(s) URL".into(),
        });
    }
    let matched_key = v
        .get("cacheKey")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| CacheError::InvalidResponse {
            operation: op,
            detail: "a hit without a cacheKey".into(),
        })?;
    Ok(LookupHit {
        matched_key: matched_key.to_string(),
        download_url: location.to_string(),
    })
}

/// A reservation's body: a non-zero `cacheId` (a number; a string from lenient servers).
fn reserve_reply(v: Option<&Value>) -> Result<i64, CacheError> {
    let id = match v.and_then(|v| v.get("cacheId")) {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    };
    match id {
        Some(id) if id != 0 => Ok(id),
        _ => Err(CacheError::NotReserved {
            message: "the reservation carries no cacheId".into(),
        }),
    }
}

/// Inclusive byte ranges of `chunk` bytes covering `size` (none for an empty file).
fn chunk_ranges(size: u64, chunk: u64) -> Vec<(u64, u64)> {
    let chunk = chunk.max(1);
    (0..size.div_ceil(chunk))
        .map(|i| (i * chunk, ((i + 1) * chunk).min(size) - 1))
        .collect()
}

/// JavaScript's `encodeURIComponent`, which the toolkit applies to the joined keys.
fn encode_uri_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether an archive location is Azure blob storage (the toolkit then downloads in parallel
/// ranges; anywhere else with one plain GET).
pub(crate) fn is_azure_blob(location: &str) -> bool {
    url::Url::parse(location)
        .ok()
        .and_then(|u| u.host_str().map(|h| h.ends_with(".blob.core.windows.net")))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_file_exactly() {
        assert_eq!(chunk_ranges(0, 4), vec![]);
        assert_eq!(chunk_ranges(4, 4), vec![(0, 3)]);
        assert_eq!(chunk_ranges(9, 4), vec![(0, 3), (4, 7), (8, 8)]);
    }

    #[test]
    fn keys_are_encoded_like_encode_uri_component() {
        assert_eq!(encode_uri_component("a-b_c.d!~*'()"), "a-b_c.d!~*'()");
        assert_eq!(encode_uri_component("k1,k 2/é"), "k1%2Ck%202%2F%C3%A9");
    }

    #[test]
    fn the_service_url_keeps_its_path() {
        let c = V1Client::new(
            reqwest::Client::new(),
            "https://ghes.example/_services/artifactcache/abc",
            "tok-123456",
        )
        .unwrap();
        assert_eq!(
            c.resource("caches/7").unwrap().as_str(),
            "https://ghes.example/_services/artifactcache/abc/_apis/artifactcache/caches/7"
        );
        assert!(V1Client::new(reqwest::Client::new(), "file:///x/", "tok-123456").is_err());
    }

    #[test]
    fn replies_are_judged_like_the_toolkit() {
        let j = |status: u16, text: &str, more: bool| {
            judge(
                V1Op::ReserveCache,
                StatusCode::from_u16(status).unwrap(),
                Some("7".into()),
                text,
                true,
                more,
                1,
            )
        };
        assert!(matches!(j(503, "", true), Judged::Retry));
        assert!(matches!(j(502, "", true), Judged::Retry));
        assert!(matches!(
            j(503, "", false),
            Judged::Fail(CacheError::Server { status: 503, .. })
        ));
        assert!(matches!(
            j(500, "", true),
            Judged::Fail(CacheError::Server { status: 500, .. })
        ));
        assert!(matches!(
            j(429, "", true),
            Judged::Fail(CacheError::RateLimited {
                retry_after: Some(_)
            })
        ));
        assert!(matches!(
            j(409, r#"{"message":"Cache already exists."}"#, true),
            Judged::Fail(CacheError::AlreadyExists { .. })
        ));
        assert!(matches!(
            j(400, r#"{"message":"over the limit"}"#, true),
            Judged::Fail(CacheError::Quota { .. })
        ));
        assert!(matches!(
            j(403, r#"{"message":"cache write denied: read-only"}"#, true),
            Judged::Fail(CacheError::WriteDenied { .. })
        ));
        assert!(matches!(j(200, "<html>", true), Judged::Retry));
        assert!(matches!(
            j(200, "<html>", false),
            Judged::Fail(CacheError::InvalidResponse { .. })
        ));
    }

    #[test]
    fn a_hit_must_name_an_http_location_and_its_key() {
        let ok = json!({"cacheKey": "k", "archiveLocation": "https://s.example/a?sig=abcdefgh"});
        assert_eq!(lookup_reply(&ok).unwrap().matched_key, "k");
        for bad in [
            json!({"cacheKey": "k"}),
            json!({"cacheKey": "k", "archiveLocation": "file:///etc/passwd"}),
            json!({"cacheKey": "k", "archiveLocation": "/relative/path"}),
            json!({"archiveLocation": "https://s.example/a"}),
        ] {
            assert!(
                matches!(lookup_reply(&bad), Err(CacheError::InvalidResponse { .. })),
                "{bad}"
            );
        }
        assert_eq!(reserve_reply(Some(&json!({"cacheId": 12}))).unwrap(), 12);
        assert!(reserve_reply(Some(&json!({"cacheId": 0}))).is_err());
        assert!(reserve_reply(None).is_err());
    }
}
