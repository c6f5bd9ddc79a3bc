//! The cache service v2 client: Twirp JSON RPCs with the toolkit's retry rules, and lenient
//! parsing of proto3 JSON (snake or camel case, int64 as number or string).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::CacheError;
use crate::runner::log;

const SERVICE_PATH: &str = "/twirp/github.actions.results.api.v1.CacheService/";

/// How failed calls are retried. The toolkit: 5 attempts, 3 s × 1.5^n with jitter; tests shrink
/// `base_delay` to milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts for 500/502/503/504 and unparseable bodies.
    pub attempts: u32,
    pub base_delay: Duration,
    /// Extra attempts after a connection-level error (the toolkit makes none).
    pub connect_retries: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            base_delay: Duration::from_secs(3),
            connect_retries: 2,
        }
    }
}

impl RetryPolicy {
    /// Delay before retry number `n` (0-based): random in [base·1.5^n, base·1.5^(n+1)).
    pub(crate) fn delay(&self, n: u32) -> Duration {
        let low = self.base_delay.as_secs_f64() * 1.5f64.powi(n as i32);
        let jitter: f64 = rand::random::<f64>() * low * 0.5;
        Duration::from_secs_f64(low + jitter)
    }
}

/// The three RPCs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    CreateCacheEntry,
    FinalizeCacheEntryUpload,
    GetCacheEntryDownloadUrl,
}

impl Rpc {
    pub fn name(self) -> &'static str {
        match self {
            Rpc::CreateCacheEntry => "CreateCacheEntry",
            Rpc::FinalizeCacheEntryUpload => "FinalizeCacheEntryUpload",
            Rpc::GetCacheEntryDownloadUrl => "GetCacheEntryDownloadURL",
        }
    }
}

/// A lookup hit: where to download and which key matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupHit {
    pub matched_key: String,
    pub download_url: String,
}

/// Registers the signature of a signed URL as a secret: it grants access to the blob. Azure's
/// `sig`, and for the v1 service's storage (GHES may keep it on S3 or GCS) the signing
/// parameters of those too.
pub(crate) fn mask_signed_url(url: &str) {
    if let Ok(parsed) = url::Url::parse(url) {
        for (k, v) in parsed.query_pairs() {
            let k = k.to_ascii_lowercase();
            if k == "sig"
                || k.contains("signature")
                || k.contains("credential")
                || k.contains("security-token")
            {
                log::add_mask(&v);
            }
        }
    }
}

/// The Twirp half of the client (the blob half is in `blob`).
#[derive(Debug, Clone)]
pub struct TwirpClient {
    http: reqwest::Client,
    service: url::Url,
    token: String,
    pub retry: RetryPolicy,
}

impl TwirpClient {
    /// `results_url` is `ACTIONS_RESULTS_URL`; only its origin is used. The token is masked here.
    pub fn new(http: reqwest::Client, results_url: &str, token: &str) -> Result<Self, CacheError> {
        log::add_mask(token);
        let parsed = url::Url::parse(results_url).map_err(|e| CacheError::InvalidResponse {
            operation: crate::runner::env::ACTIONS_RESULTS_URL,
            detail: format!("not a URL: {e}"),
        })?;
        let service = parsed
            .join(SERVICE_PATH)
            .map_err(|e| CacheError::InvalidResponse {
                operation: crate::runner::env::ACTIONS_RESULTS_URL,
                detail: format!("cannot build the service URL: {e}"),
            })?;
        Ok(Self {
            http,
            service,
            token: token.to_string(),
            retry: RetryPolicy::default(),
        })
    }

    /// `GetCacheEntryDownloadURL`: `None` on a miss (`{"ok":false}` or `{}`).
    pub async fn lookup(
        &self,
        key: &str,
        restore_keys: &[String],
        version: &str,
    ) -> Result<Option<LookupHit>, CacheError> {
        let mut body = json!({ "key": key, "version": version });
        if !restore_keys.is_empty() {
            body["restore_keys"] = json!(restore_keys);
        }
        let v = self.call(Rpc::GetCacheEntryDownloadUrl, &body).await?;
        let hit = lookup_reply(&v, key)?;
        if let Some(hit) = &hit {
            mask_signed_url(&hit.download_url);
        }
        Ok(hit)
    }

    /// `CreateCacheEntry`: the signed upload URL.
    pub async fn create(&self, key: &str, version: &str) -> Result<String, CacheError> {
        let v = self
            .call(
                Rpc::CreateCacheEntry,
                &json!({ "key": key, "version": version }),
            )
            .await?;
        let url = create_reply(&v)?;
        mask_signed_url(&url);
        Ok(url)
    }

    /// `FinalizeCacheEntryUpload`: the entry id when the service sends one.
    pub async fn finalize(
        &self,
        key: &str,
        version: &str,
        size_bytes: u64,
    ) -> Result<Option<i64>, CacheError> {
        let body = json!({ "key": key, "size_bytes": size_bytes.to_string(), "version": version });
        let v = self.call(Rpc::FinalizeCacheEntryUpload, &body).await?;
        finalize_reply(&v)
    }

    /// One RPC with the retry rules; returns the parsed JSON body of a 2xx.
    async fn call(&self, rpc: Rpc, body: &Value) -> Result<Value, CacheError> {
        let url = format!("{}{}", self.service, rpc.name());
        let mut connect_failures = 0;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent = self
                .http
                .post(&url)
                .bearer_auth(&self.token)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .json(body)
                .send()
                .await;
            let response = match sent {
                Ok(r) => r,
                Err(source) => {
                    if (source.is_connect() || source.is_timeout())
                        && connect_failures < self.retry.connect_retries
                    {
                        connect_failures += 1;
                        attempt -= 1;
                        tokio::time::sleep(self.retry.delay(connect_failures - 1)).await;
                        continue;
                    }
                    return Err(CacheError::Transport {
                        operation: rpc.name(),
                        source,
                    });
                }
            };
            let status = response.status();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let text = response
                .text()
                .await
                .map_err(|source| CacheError::Transport {
                    operation: rpc.name(),
                    source,
                })?;
            let more = attempt < self.retry.attempts;
            match judge(rpc, status, retry_after, &text, more, attempt) {
                Judged::Body(v) => return Ok(v),
                Judged::Fail(e) => return Err(e),
                Judged::Retry => {}
            }
            tracing::debug!("{} returned {status}; retrying", rpc.name());
            tokio::time::sleep(self.retry.delay(attempt - 1)).await;
        }
    }
}

/// What one HTTP reply to an RPC means.
#[derive(Debug)]
pub(crate) enum Judged {
    /// A 2xx with a JSON object body.
    Body(Value),
    /// Worth another attempt (5xx, an unparseable 2xx body) while attempts remain.
    Retry,
    Fail(CacheError),
}

/// The retry rules applied to one reply: `more` says whether another attempt remains.
pub(crate) fn judge(
    rpc: Rpc,
    status: StatusCode,
    retry_after: Option<String>,
    text: &str,
    more: bool,
    attempt: u32,
) -> Judged {
    if status.is_success() {
        match serde_json::from_str::<Value>(text) {
            Ok(v) if v.is_object() => Judged::Body(v),
            _ if more => Judged::Retry,
            _ => Judged::Fail(CacheError::InvalidResponse {
                operation: rpc.name(),
                detail: format!("not a JSON object: {}", excerpt(text)),
            }),
        }
    } else if status == StatusCode::TOO_MANY_REQUESTS {
        Judged::Fail(CacheError::RateLimited { retry_after })
    } else if matches!(status.as_u16(), 500 | 502 | 503 | 504) {
        if more {
            Judged::Retry
        } else {
            Judged::Fail(CacheError::Server {
                status: status.as_u16(),
                attempts: attempt,
                message: error_message(text),
            })
        }
    } else {
        Judged::Fail(classify_failure(rpc, status, text))
    }
}

/// `GetCacheEntryDownloadURL`'s body: `None` on a miss (`{"ok":false}` or `{}`).
pub(crate) fn lookup_reply(v: &Value, key: &str) -> Result<Option<LookupHit>, CacheError> {
    if !is_ok(v) {
        return Ok(None);
    }
    match string_field(v, "signed_download_url", "signedDownloadUrl") {
        Some(download_url) if !download_url.is_empty() => Ok(Some(LookupHit {
            matched_key: string_field(v, "matched_key", "matchedKey")
                .unwrap_or_else(|| key.to_string()),
            download_url,
        })),
        _ => Err(CacheError::InvalidResponse {
            operation: Rpc::GetCacheEntryDownloadUrl.name(),
            detail: "ok without a signed_download_url".into(),
        }),
    }
}

/// `CreateCacheEntry`'s body: the signed upload URL.
pub(crate) fn create_reply(v: &Value) -> Result<String, CacheError> {
    if !is_ok(v) {
        return Err(not_ok(v));
    }
    string_field(v, "signed_upload_url", "signedUploadUrl")
        .filter(|u| !u.is_empty())
        .ok_or_else(|| CacheError::InvalidResponse {
            operation: Rpc::CreateCacheEntry.name(),
            detail: "ok without a signed_upload_url".into(),
        })
}

/// `FinalizeCacheEntryUpload`'s body: the entry id when the service sends one.
pub(crate) fn finalize_reply(v: &Value) -> Result<Option<i64>, CacheError> {
    if !is_ok(v) {
        return Err(not_ok(v));
    }
    Ok(int64_field(v, "entry_id", "entryId"))
}

/// A non-retried error status, sorted the way the toolkit tells them apart.
fn classify_failure(rpc: Rpc, status: StatusCode, text: &str) -> CacheError {
    let code = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_string));
    let message = error_message(text);
    if code.as_deref() == Some("already_exists") || status == StatusCode::CONFLICT {
        return CacheError::AlreadyExists { key: message };
    }
    if message.contains("insufficient usage") {
        return CacheError::Quota { message };
    }
    if status == StatusCode::FORBIDDEN {
        return match rpc {
            Rpc::GetCacheEntryDownloadUrl => CacheError::ReadDenied { message },
            Rpc::CreateCacheEntry | Rpc::FinalizeCacheEntryUpload => {
                CacheError::WriteDenied { message }
            }
        };
    }
    CacheError::Http {
        operation: rpc.name(),
        status: status.as_u16(),
        message,
    }
}

/// `ok:false` on create or finalize.
fn not_ok(v: &Value) -> CacheError {
    let message = string_field(v, "message", "message").unwrap_or_default();
    if message.starts_with("cache write denied") {
        CacheError::WriteDenied { message }
    } else if message.contains("insufficient usage") {
        CacheError::Quota { message }
    } else {
        CacheError::NotReserved { message }
    }
}

/// Only the JSON boolean `true` is true (`"ok":"true"` is not).
fn is_ok(v: &Value) -> bool {
    v.get("ok") == Some(&Value::Bool(true))
}

fn field<'a>(v: &'a Value, snake: &str, camel: &str) -> Option<&'a Value> {
    v.get(snake).or_else(|| v.get(camel))
}

fn string_field(v: &Value, snake: &str, camel: &str) -> Option<String> {
    field(v, snake, camel)
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// proto3 int64: a JSON string normally, a number from lenient servers.
fn int64_field(v: &Value, snake: &str, camel: &str) -> Option<i64> {
    match field(v, snake, camel)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The Twirp error `msg` when present, else a sanitized excerpt of the body.
pub(crate) fn error_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            v.get("msg")
                .or_else(|| v.get("message"))
                .and_then(Value::as_str)
                .map(log::redact)
        })
        .unwrap_or_else(|| excerpt(text))
}

pub(crate) fn excerpt(text: &str) -> String {
    let cut: String = text.chars().take(200).collect();
    log::redact(cut.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_is_lenient_but_ok_must_be_a_boolean() {
        let v: Value = serde_json::from_str(r#"{"ok":"true","entryId":7,"x":1}"#).unwrap();
        assert!(!is_ok(&v));
        assert_eq!(int64_field(&v, "entry_id", "entryId"), Some(7));
        let v: Value = serde_json::from_str(r#"{"ok":true,"entry_id":"1000"}"#).unwrap();
        assert!(is_ok(&v));
        assert_eq!(int64_field(&v, "entry_id", "entryId"), Some(1000));
        let v: Value =
            serde_json::from_str(r#"{"signedDownloadUrl":"u","matched_key":"k"}"#).unwrap();
        assert_eq!(
            string_field(&v, "signed_download_url", "signedDownloadUrl").as_deref(),
            Some("u")
        );
    }

    #[test]
    fn not_ok_messages_are_told_apart() {
        let m = |s: &str| not_ok(&json!({ "ok": false, "message": s }));
        assert!(matches!(
            m("cache write denied: read-only token"),
            CacheError::WriteDenied { .. }
        ));
        assert!(matches!(
            m("insufficient usage to create entry"),
            CacheError::Quota { .. }
        ));
        assert!(matches!(m(""), CacheError::NotReserved { .. }));
    }

    #[test]
    fn backoff_grows_from_the_base() {
        let p = RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_secs(3),
            connect_retries: 0,
        };
        for n in 0..4 {
            let d = p.delay(n).as_secs_f64();
            let low = 3.0 * 1.5f64.powi(n as i32);
            assert!(d >= low && d < low * 1.5, "n={n} d={d}");
        }
    }

    #[test]
    fn the_service_url_uses_only_the_origin() {
        let c = TwirpClient::new(
            reqwest::Client::new(),
            "https://results.example.com/some/path/?q=1",
            "tok-123456",
        )
        .unwrap();
        assert_eq!(
            c.service.as_str(),
            "https://results.example.com/twirp/github.actions.results.api.v1.CacheService/"
        );
    }
}
