//! The cache service v1 (`ACTIONS_CACHE_URL`, what GitHub Enterprise Server runners offer), served
//! by [`CacheServer`](super::cache_server::CacheServer) beside v2 over the same entries: the REST
//! `_apis/artifactcache` calls as `@actions/cache` 6.3.0 makes them (`cacheHttpClient.ts`) and as
//! the service answers (Azure DevOps error bodies, 204 for a miss and after a chunk or commit).
//!
//! - `GET {base}/_apis/artifactcache/cache?keys=k1,k2&version=v`: 200 with `cacheKey`,
//!   `archiveLocation` (a signed blob URL, fetched without the token) …, or 204.
//! - `POST {base}/_apis/artifactcache/caches` `{key, version, cacheSize}`: 201 `{cacheId}`; 409
//!   when an entry with that key and version exists or is being written.
//! - `PATCH {base}/_apis/artifactcache/caches/{id}` with `Content-Range: bytes a-b/*`: 204.
//! - `POST {base}/_apis/artifactcache/caches/{id}` `{size}`: 204 once the chunks cover exactly
//!   `size` bytes; the entry is then visible.
//!
//! Every call needs the runtime token and `api-version=6.0-preview.1` in `Accept`, and the JSON
//! ones `Content-Type: application/json` (a chunk `application/octet-stream`). Faults, stalls
//! and the read-only / deny-read switches are the v2 server's, keyed by the op names below.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tokio::io::AsyncSeekExt;

use super::cache_server::{copy_body, fault_response, int_field, str_field, Call, Entry, Shared};

pub const V1_LOOKUP: &str = "GetCacheEntry";
pub const V1_RESERVE: &str = "ReserveCache";
pub const V1_UPLOAD: &str = "UploadChunk";
pub const V1_COMMIT: &str = "CommitCache";

/// The scope every entry is in (one branch is enough for the tests).
const SCOPE: &str = "refs/heads/main";

pub(super) fn routes() -> Router<Arc<Shared>> {
    use axum::routing::{get, patch, post};
    Router::new()
        .route("/{base}/_apis/artifactcache/cache", get(lookup))
        .route("/{base}/_apis/artifactcache/caches", post(reserve))
        .route(
            "/{base}/_apis/artifactcache/caches/{id}",
            patch(upload).post(commit),
        )
}

/// The service's error body (an Azure DevOps `WrappedException`); the toolkit reads `message`.
fn service_error(status: StatusCode, type_key: &str, message: &str) -> Response {
    let body = json!({
        "$id": "1",
        "innerException": null,
        "message": message,
        "typeName": format!(
            "Microsoft.Azure.DevOps.PipelineCache.WebApi.{type_key}, \
             Microsoft.Azure.DevOps.PipelineCache.WebApi"
        ),
        "typeKey": type_key,
        "errorCode": 0,
        "eventId": 3000,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        body.to_string(),
    )
        .into_response()
}

fn json_reply(status: StatusCode, v: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        v.to_string(),
    )
        .into_response()
}

/// The token, the API version and the injected faults, as every call meets them.
fn admit(s: &Shared, op: &str, headers: &HeaderMap) -> Option<Response> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if text(header::AUTHORIZATION) != Some(format!("Bearer {}", s.token).as_str()) {
        return Some(service_error(
            StatusCode::UNAUTHORIZED,
            "UnauthorizedRequestException",
            "bad token",
        ));
    }
    if !text(header::ACCEPT).is_some_and(|a| a.contains("api-version=6.0-preview.1")) {
        return Some(service_error(
            StatusCode::BAD_REQUEST,
            "VssInvalidPreviewVersionException",
            "the API version 6.0-preview.1 must be named in Accept",
        ));
    }
    // The JSON calls (reserve, commit) must say so, as an ASP.NET service requires.
    let json_call = matches!(op, V1_RESERVE | V1_COMMIT);
    if json_call && !text(header::CONTENT_TYPE).is_some_and(|t| t.starts_with("application/json")) {
        return Some(service_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaTypeException",
            "application/json expected",
        ));
    }
    s.take_fault(op).map(fault_response)
}

fn record(s: &Shared, op: &str, base: String, response: &Response, body: Option<Value>) {
    s.log(Call {
        op: op.into(),
        status: response.status().as_u16(),
        body,
        content_length: None,
        chunked: false,
        range: None,
        base: Some(base),
    });
}

async fn lookup(
    State(s): State<Arc<Shared>>,
    UrlPath(base): UrlPath<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    s.maybe_stall(V1_LOOKUP).await;
    let response = lookup_inner(&s, &q, &headers);
    record(&s, V1_LOOKUP, base, &response, Some(json!(q)));
    response
}

fn lookup_inner(s: &Shared, q: &HashMap<String, String>, headers: &HeaderMap) -> Response {
    if let Some(r) = admit(s, V1_LOOKUP, headers) {
        return r;
    }
    if s.lock().switches.deny_read {
        return service_error(
            StatusCode::FORBIDDEN,
            "ArtifactCacheReadDeniedException",
            "cache read denied: the token does not have read access",
        );
    }
    let (Some(keys), Some(version)) = (q.get("keys"), q.get("version")) else {
        return service_error(
            StatusCode::BAD_REQUEST,
            "ArgumentException",
            "keys and version are required",
        );
    };
    let wanted: Vec<String> = keys.split(',').map(str::to_string).collect();
    if wanted.len() > 10 || wanted.iter().any(String::is_empty) {
        return service_error(StatusCode::BAD_REQUEST, "ArgumentException", "keys");
    }
    match s.find(&wanted, version) {
        Some((key, blob)) => json_reply(
            StatusCode::OK,
            json!({
                "scope": SCOPE,
                "cacheKey": key,
                "cacheVersion": version,
                "creationTime": "2026-01-01T00:00:00Z",
                "archiveLocation": s.signed_url(&blob, "r"),
            }),
        ),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

async fn reserve(
    State(s): State<Arc<Shared>>,
    UrlPath(base): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.maybe_stall(V1_RESERVE).await;
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let response = reserve_inner(&s, &headers, parsed.as_ref());
    record(&s, V1_RESERVE, base, &response, parsed);
    response
}

fn reserve_inner(s: &Shared, headers: &HeaderMap, body: Option<&Value>) -> Response {
    if let Some(r) = admit(s, V1_RESERVE, headers) {
        return r;
    }
    let Some(body) = body else {
        return service_error(StatusCode::BAD_REQUEST, "ArgumentException", "not JSON");
    };
    let (Some(key), Some(version)) = (str_field(body, "key"), str_field(body, "version")) else {
        return service_error(
            StatusCode::BAD_REQUEST,
            "ArgumentException",
            "key and version",
        );
    };
    if s.lock().switches.read_only {
        return service_error(
            StatusCode::FORBIDDEN,
            "ArtifactCacheWriteDeniedException",
            "cache write denied: the token does not have write access",
        );
    }
    let mut st = s.lock();
    if st
        .entries
        .iter()
        .any(|e| e.key == key && e.version == version)
    {
        let message =
            format!("Cache already exists. Scope: {SCOPE}, Key: {key}, Version: {version}");
        return service_error(
            StatusCode::CONFLICT,
            "ArtifactCacheAlreadyExistsException",
            &message,
        );
    }
    st.next_id += 1;
    st.seq += 1;
    let entry = Entry {
        id: st.next_id,
        key,
        version,
        blob: hex::encode(rand::random::<[u8; 12]>()),
        size: None,
        finalized: false,
        seq: st.seq,
    };
    let id = entry.id;
    st.entries.push(entry);
    json_reply(StatusCode::CREATED, json!({ "cacheId": id }))
}

/// The pending entry `id`: its blob name, or the service's refusal.
fn pending(s: &Shared, id: &str) -> Result<(i64, String), Box<Response>> {
    let st = s.lock();
    let entry = id
        .parse::<i64>()
        .ok()
        .and_then(|id| st.entries.iter().find(|e| e.id == id));
    match entry {
        Some(e) if !e.finalized => Ok((e.id, e.blob.clone())),
        Some(_) => Err(Box::new(service_error(
            StatusCode::BAD_REQUEST,
            "ArtifactCacheAlreadyCommittedException",
            "the cache is already committed",
        ))),
        None => Err(Box::new(service_error(
            StatusCode::NOT_FOUND,
            "ArtifactCacheNotFoundException",
            &format!("no reserved cache {id}"),
        ))),
    }
}

/// `bytes a-b/*` (the toolkit never knows the total).
fn content_range(headers: &HeaderMap) -> Option<(u64, u64)> {
    let v = headers.get(header::CONTENT_RANGE)?.to_str().ok()?;
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    if total != "*" && total.parse::<u64>().is_err() {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
    (a <= b).then_some((a, b))
}

async fn upload(
    State(s): State<Arc<Shared>>,
    UrlPath((base, id)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    s.maybe_stall(V1_UPLOAD).await;
    let range = headers
        .get(header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let response = upload_inner(&s, &id, &headers, body).await;
    s.log(Call {
        op: V1_UPLOAD.into(),
        status: response.status().as_u16(),
        body: None,
        content_length: headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok()),
        chunked: headers.contains_key(header::TRANSFER_ENCODING),
        range,
        base: Some(base),
    });
    response
}

async fn upload_inner(s: &Shared, id: &str, headers: &HeaderMap, body: Body) -> Response {
    if let Some(r) = admit(s, V1_UPLOAD, headers) {
        return r;
    }
    if headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        != Some("application/octet-stream")
    {
        return service_error(StatusCode::BAD_REQUEST, "ArgumentException", "content-type");
    }
    let Some((a, b)) = content_range(headers) else {
        return service_error(
            StatusCode::BAD_REQUEST,
            "ArgumentException",
            "Content-Range must be `bytes start-end/*`",
        );
    };
    let (id, blob) = match pending(s, id) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    // Chunks arrive in parallel, each written at its own offset (a body may be chunked-encoded:
    // the toolkit streams without a length).
    match write_at(&s.blob_path(&blob), a, body).await {
        Ok(n) if n == b - a + 1 => {
            s.lock().chunks.entry(id).or_default().push((a, b));
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(n) => service_error(
            StatusCode::BAD_REQUEST,
            "ArgumentException",
            &format!("received {n} bytes for the range {a}-{b}"),
        ),
        Err(_) => service_error(StatusCode::BAD_REQUEST, "IOException", "body"),
    }
}

async fn write_at(path: &std::path::Path, offset: u64, body: Body) -> std::io::Result<u64> {
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .await?;
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    copy_body(body, &mut file).await
}

async fn commit(
    State(s): State<Arc<Shared>>,
    UrlPath((base, id)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.maybe_stall(V1_COMMIT).await;
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let response = commit_inner(&s, &id, &headers, parsed.as_ref()).await;
    record(&s, V1_COMMIT, base, &response, parsed);
    response
}

async fn commit_inner(s: &Shared, id: &str, headers: &HeaderMap, body: Option<&Value>) -> Response {
    if let Some(r) = admit(s, V1_COMMIT, headers) {
        return r;
    }
    let Some(size) = body.and_then(|b| int_field(b, "size")) else {
        return service_error(StatusCode::BAD_REQUEST, "ArgumentException", "size");
    };
    let (id, blob) = match pending(s, id) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let path = s.blob_path(&blob);
    // An empty archive has no chunks: its blob is empty.
    if size == 0 && !path.exists() && tokio::fs::File::create(&path).await.is_err() {
        return service_error(StatusCode::INTERNAL_SERVER_ERROR, "IOException", "blob");
    }
    let on_disk = tokio::fs::metadata(&path)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    let covered = covers(
        s.lock().chunks.get(&id).map(Vec::as_slice).unwrap_or(&[]),
        size,
    );
    if !covered || on_disk != size {
        return service_error(
            StatusCode::BAD_REQUEST,
            "ArtifactCacheSizeMismatchException",
            &format!("the uploaded chunks do not make {size} bytes"),
        );
    }
    let mut st = s.lock();
    st.chunks.remove(&id);
    if let Some(e) = st.entries.iter_mut().find(|e| e.id == id) {
        e.size = Some(size);
        e.finalized = true;
    }
    StatusCode::NO_CONTENT.into_response()
}

/// Whether the ranges tile `[0, size)` without gaps or overlaps.
fn covers(ranges: &[(u64, u64)], size: u64) -> bool {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut next = 0;
    for (a, b) in sorted {
        if a != next {
            return false;
        }
        next = b + 1;
    }
    next == size
}
