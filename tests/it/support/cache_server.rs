//! An in-process stand-in for the Actions cache service v2 (the three Twirp RPCs) and the Azure
//! block-blob subset behind its signed URLs, written to the measured protocol
//! (`docs/design.md#actions-cache-protocol`), with switches for every fault the client must tell
//! apart. Blobs live on disk in a temp dir (tests go beyond 128 MiB). The same server speaks the
//! v1 service (`cache_server_v1`) over the same entries: one repository's cache, whichever
//! protocol wrote it.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

pub const CREATE: &str = "CreateCacheEntry";
pub const FINALIZE: &str = "FinalizeCacheEntryUpload";
pub const LOOKUP: &str = "GetCacheEntryDownloadURL";
/// Blob operations, for faults and the call log.
pub const PUT_BLOB: &str = "PutBlob";
pub const PUT_BLOCK: &str = "PutBlock";
pub const PUT_BLOCK_LIST: &str = "PutBlockList";
pub const GET_BLOB: &str = "GetBlob";
pub const HEAD_BLOB: &str = "HeadBlob";

/// A canned response served instead of the real one.
#[derive(Debug, Clone)]
pub struct Fault {
    pub status: u16,
    pub body: String,
    pub retry_after: Option<String>,
}

impl Fault {
    /// A Twirp error with the given status.
    pub fn status(status: u16) -> Self {
        Fault {
            status,
            body: json!({"code": "internal", "msg": format!("injected {status}")}).to_string(),
            retry_after: None,
        }
    }
    /// 200 with an HTML body (a proxy error page).
    pub fn garbage() -> Self {
        Fault {
            status: 200,
            body: "<html><body>Bad gateway</body></html>".into(),
            retry_after: None,
        }
    }
    pub fn rate_limited(retry_after: &str) -> Self {
        Fault {
            status: 429,
            body: json!({"code": "resource_exhausted", "msg": "rate limited"}).to_string(),
            retry_after: Some(retry_after.into()),
        }
    }
    /// What the service answers when the repository's cache storage is used up.
    pub fn quota() -> Self {
        Fault {
            status: 200,
            body: json!({"ok": false, "message": "insufficient usage to create cache entry"})
                .to_string(),
            retry_after: None,
        }
    }
    pub fn body(status: u16, body: &str) -> Self {
        Fault {
            status,
            body: body.into(),
            retry_after: None,
        }
    }
}

/// How downloads are damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// Serve only the first `keep` bytes, with a matching Content-Length (a short blob).
    Honest { keep: u64 },
    /// Advertise the full length but stop after `keep` bytes (a dropped connection).
    Cut { keep: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: i64,
    pub key: String,
    pub version: String,
    pub blob: String,
    pub size: Option<u64>,
    pub finalized: bool,
    /// Creation order: "newest" for prefix matches.
    pub seq: u64,
}

#[derive(Debug, Clone)]
pub struct Call {
    /// RPC name or blob operation constant.
    pub op: String,
    pub status: u16,
    /// JSON body of an RPC.
    pub body: Option<Value>,
    pub content_length: Option<u64>,
    pub chunked: bool,
    /// `x-ms-range` or `Range`; a v1 chunk's `Content-Range`.
    pub range: Option<String>,
    /// A v1 call's base path segment (what `ACTIONS_CACHE_URL` named).
    pub base: Option<String>,
}

#[derive(Default)]
pub(super) struct Switches {
    pub(super) read_only: bool,
    pub(super) deny_read: bool,
    expire_urls: bool,
}

#[derive(Default)]
pub(super) struct StateInner {
    pub(super) entries: Vec<Entry>,
    pub(super) next_id: i64,
    pub(super) seq: u64,
    faults: HashMap<String, VecDeque<Fault>>,
    truncations: VecDeque<Truncation>,
    pub(super) switches: Switches,
    calls: Vec<Call>,
    /// When each of `calls` was answered.
    call_times: Vec<std::time::Instant>,
    /// v1 chunks received per reserved entry: inclusive byte ranges.
    pub(super) chunks: HashMap<i64, Vec<(u64, u64)>>,
    /// How many of the next calls of an op never get an answer, and those that got none so far.
    stalls: HashMap<String, usize>,
    stalled: Vec<String>,
    /// Staged (uncommitted) blocks: blob → block id → file.
    blocks: HashMap<String, HashMap<String, PathBuf>>,
    /// Where clients reach the server, when not at its own address (a name or a TLS front).
    origin: Option<String>,
    /// Calls held until a condition is met ([`CacheServer::hold_while`]).
    holds: Vec<Hold>,
}

/// When a held call waits: before the service acts on it, or after (its effect is there, its
/// answer is not yet sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Before,
    After,
}

/// Whether a call (`op`, its JSON body) must still wait, given every entry now.
type HoldFn = Arc<dyn Fn(&Value, &[Entry]) -> bool + Send + Sync>;

#[derive(Clone)]
struct Hold {
    op: String,
    when: Held,
    wait: HoldFn,
}

/// The longest a call is held: a condition that never comes (a run that failed) does not hang
/// the others; the test then fails on what the condition was for.
const HOLD_LIMIT: std::time::Duration = std::time::Duration::from_secs(90);

pub(super) struct Shared {
    inner: Mutex<StateInner>,
    dir: PathBuf,
    pub(super) token: String,
    secret: String,
    addr: SocketAddr,
    /// The v1 service's base path segment in `ACTIONS_CACHE_URL`.
    tenant: String,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, StateInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(super) fn blob_path(&self, blob: &str) -> PathBuf {
        self.dir.join("blobs").join(blob)
    }
    fn sign(&self, blob: &str, expiry: u64, perm: &str) -> String {
        hex::encode(Sha256::digest(
            format!("{}|{blob}|{expiry}|{perm}", self.secret).as_bytes(),
        ))
    }
    pub(super) fn signed_url(&self, blob: &str, perm: &str) -> String {
        let now = unix_now();
        let expiry = if self.lock().switches.expire_urls {
            now - 60
        } else {
            now + 3600
        };
        let sig = self.sign(blob, expiry, perm);
        format!(
            "{}/blob/{blob}?sv=2025-01-05&sp={perm}&se={expiry}&sig={sig}",
            self.origin()
        )
    }
    fn origin(&self) -> String {
        let origin = self.lock().origin.clone();
        origin.unwrap_or_else(|| format!("http://{}", self.addr))
    }
    pub(super) fn log(&self, call: Call) {
        let mut st = self.lock();
        st.calls.push(call);
        st.call_times.push(std::time::Instant::now());
    }
    pub(super) fn take_fault(&self, op: &str) -> Option<Fault> {
        self.lock().faults.get_mut(op).and_then(VecDeque::pop_front)
    }
    /// The service's match for a lookup: for each key in order, the entry with exactly that key,
    /// else the newest whose key it prefixes; committed entries of `version` only. Returns the
    /// matched key and blob.
    pub(super) fn find(&self, wanted: &[String], version: &str) -> Option<(String, String)> {
        let st = self.lock();
        let candidates: Vec<&Entry> = st
            .entries
            .iter()
            .filter(|e| e.finalized && e.version == version)
            .collect();
        wanted.iter().find_map(|w| {
            candidates
                .iter()
                .find(|e| &e.key == w)
                .or_else(|| {
                    candidates
                        .iter()
                        .filter(|e| e.key.starts_with(w.as_str()))
                        .max_by_key(|e| e.seq)
                })
                .map(|e| (e.key.clone(), e.blob.clone()))
        })
    }
    /// Waits while a hold of `op` at `when` says so for this call (checked every 50 ms).
    pub(super) async fn hold(&self, op: &str, when: Held, body: Option<&Value>) {
        let body = body.cloned().unwrap_or(Value::Null);
        let deadline = std::time::Instant::now() + HOLD_LIMIT;
        loop {
            let waiting = {
                let st = self.lock();
                st.holds
                    .iter()
                    .any(|h| h.op == op && h.when == when && (h.wait)(&body, &st.entries))
            };
            if !waiting || std::time::Instant::now() > deadline {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Never answers, if this call of `op` is to stall (a transfer hung in the network).
    pub(super) async fn maybe_stall(&self, op: &str) {
        {
            let mut st = self.lock();
            match st.stalls.get_mut(op) {
                Some(n) if *n > 0 => *n -= 1,
                _ => return,
            }
            st.stalled.push(op.to_string());
        }
        std::future::pending::<()>().await;
    }
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The running server; stops when dropped.
pub struct CacheServer {
    shared: Arc<Shared>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CacheServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CacheServer {
    pub async fn start() -> CacheServer {
        let dir = tempfile::tempdir().expect("temp dir for the cache server");
        std::fs::create_dir_all(dir.path().join("blobs")).expect("blob dir");
        std::fs::create_dir_all(dir.path().join("blocks")).expect("block dir");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            inner: Mutex::new(StateInner {
                next_id: 1000,
                ..Default::default()
            }),
            dir: dir.path().to_path_buf(),
            token: format!("runtime-token-{}", hex::encode(rand::random::<[u8; 8]>())),
            secret: hex::encode(rand::random::<[u8; 16]>()),
            addr,
            tenant: format!("artifactcache-{}", hex::encode(rand::random::<[u8; 6]>())),
        });
        let app = Router::new()
            .route(
                "/twirp/github.actions.results.api.v1.CacheService/{rpc}",
                axum::routing::post(twirp),
            )
            .route("/blob/{name}", axum::routing::any(blob))
            .merge(super::cache_server_v1::routes())
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        CacheServer {
            shared,
            _dir: dir,
            task,
        }
    }

    /// For `ACTIONS_RESULTS_URL`: carries a path, which the client must drop.
    pub fn url(&self) -> String {
        format!("{}/results-receiver/", self.shared.origin())
    }
    /// The server's own `http://127.0.0.1:<port>`.
    pub fn local_origin(&self) -> String {
        format!("http://{}", self.shared.addr)
    }
    /// Clients reach the server at `origin` (`http(s)://host:port`): its URL and the signed blob
    /// URLs it hands out name it.
    pub fn set_origin(&self, origin: &str) {
        self.shared.lock().origin = Some(origin.to_string());
    }
    pub fn token(&self) -> String {
        self.shared.token.clone()
    }
    /// The env a runner would hand a container action for this service.
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        vec![
            ("ACTIONS_RESULTS_URL".into(), self.url()),
            ("ACTIONS_RUNTIME_TOKEN".into(), self.token()),
        ]
    }
    /// For `ACTIONS_CACHE_URL`: the v1 service under its own path segment, with a trailing slash
    /// as runners give it.
    pub fn v1_url(&self) -> String {
        format!("{}/{}/", self.shared.origin(), self.shared.tenant)
    }
    /// The v1 base segment [`v1_url`](Self::v1_url) names (what [`Call::base`] records).
    pub fn v1_tenant(&self) -> String {
        self.shared.tenant.clone()
    }
    /// The env an Enterprise Server runner hands a container action: only the v1 service.
    pub fn env_pairs_v1(&self) -> Vec<(String, String)> {
        vec![
            ("ACTIONS_CACHE_URL".into(), self.v1_url()),
            ("ACTIONS_RUNTIME_TOKEN".into(), self.token()),
        ]
    }

    /// The token has no write scope: create answers `ok:false`, `cache write denied: ...`.
    pub fn set_read_only(&self, on: bool) {
        self.shared.lock().switches.read_only = on;
    }
    /// Lookups answer 403 `cache read denied: ...`.
    pub fn set_deny_read(&self, on: bool) {
        self.shared.lock().switches.deny_read = on;
    }
    /// Signed URLs are issued already expired.
    pub fn set_expire_urls(&self, on: bool) {
        self.shared.lock().switches.expire_urls = on;
    }
    /// The next calls of `op` (an RPC name or a blob op) get these faults, in order.
    pub fn inject(&self, op: &str, faults: impl IntoIterator<Item = Fault>) {
        self.shared
            .lock()
            .faults
            .entry(op.to_string())
            .or_default()
            .extend(faults);
    }
    /// From now on each call of the RPC `op` waits, `when` (before the service acts on it or
    /// after), while `wait(its JSON body, every entry)` holds: checked every 50 ms, for at most
    /// 90 s. A test orders runs' saves by what the cache holds instead of by sleeps.
    pub fn hold_while(
        &self,
        op: &str,
        when: Held,
        wait: impl Fn(&Value, &[Entry]) -> bool + Send + Sync + 'static,
    ) {
        self.shared.lock().holds.push(Hold {
            op: op.to_string(),
            when,
            wait: Arc::new(wait),
        });
    }

    /// The next `n` calls of `op` (an RPC name or a blob op) never get an answer.
    pub fn stall(&self, op: &str, n: usize) {
        *self.shared.lock().stalls.entry(op.to_string()).or_default() += n;
    }
    /// How many calls of `op` stalled so far (a stalled call is in [`calls`](Self::calls) never).
    pub fn stalled(&self, op: &str) -> usize {
        self.shared
            .lock()
            .stalled
            .iter()
            .filter(|o| *o == op)
            .count()
    }
    /// The next `n` blob downloads (GET) are damaged this way.
    pub fn truncate_downloads(&self, n: usize, how: Truncation) {
        self.shared
            .lock()
            .truncations
            .extend(std::iter::repeat_n(how, n));
    }

    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }
    /// Every call with when it was answered (for the order of calls beside other services').
    pub fn timed_calls(&self) -> Vec<(std::time::Instant, Call)> {
        let st = self.shared.lock();
        st.call_times
            .iter()
            .copied()
            .zip(st.calls.clone())
            .collect()
    }
    pub fn calls_of(&self, op: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.op == op).collect()
    }
    pub fn entries(&self) -> Vec<Entry> {
        self.shared.lock().entries.clone()
    }
    /// Where a committed entry's archive lies.
    pub fn blob_path(&self, entry: &Entry) -> PathBuf {
        self.shared.blob_path(&entry.blob)
    }
    /// Plants a finalized entry whose blob is a copy of `archive` (e.g. made by GNU tar).
    pub fn plant(&self, key: &str, version: &str, archive: &Path) -> Entry {
        let blob = hex::encode(rand::random::<[u8; 12]>());
        let size = std::fs::copy(archive, self.shared.blob_path(&blob)).expect("copy planted blob");
        let mut st = self.shared.lock();
        st.next_id += 1;
        st.seq += 1;
        let entry = Entry {
            id: st.next_id,
            key: key.into(),
            version: version.into(),
            blob,
            size: Some(size),
            finalized: true,
            seq: st.seq,
        };
        st.entries.push(entry.clone());
        entry
    }
}

/// What the REST API of the same repository sees of this cache: listing and deleting committed
/// entries (the fake GitHub serves `/actions/caches` from it).
#[derive(Clone)]
pub struct CacheHandle(Arc<Shared>);

impl std::fmt::Debug for CacheHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheHandle")
    }
}

impl CacheServer {
    pub fn handle(&self) -> CacheHandle {
        CacheHandle(self.shared.clone())
    }
}

impl CacheHandle {
    /// Committed entries whose key starts with `prefix`, newest first.
    pub fn list(&self, prefix: &str) -> Vec<Entry> {
        let mut out: Vec<Entry> = self
            .0
            .lock()
            .entries
            .iter()
            .filter(|e| e.finalized && e.key.starts_with(prefix))
            .cloned()
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse(e.seq));
        out
    }

    /// Removes every entry with exactly `key`; returns what was removed.
    pub fn delete(&self, key: &str) -> Vec<Entry> {
        let mut st = self.0.lock();
        let (gone, kept): (Vec<Entry>, Vec<Entry>) =
            st.entries.drain(..).partition(|e| e.key == key);
        st.entries = kept;
        gone
    }
}

fn twirp_error(status: StatusCode, code: &str, msg: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"code": code, "msg": msg}).to_string(),
    )
        .into_response()
}

fn json_ok(v: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

pub(super) fn fault_response(f: Fault) -> Response {
    let mut r = (
        StatusCode::from_u16(f.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        f.body,
    )
        .into_response();
    if let Some(ra) = f.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, ra.parse().expect("retry-after value"));
    }
    r
}

pub(super) fn str_field(v: &Value, name: &str) -> Option<String> {
    v.get(name).and_then(Value::as_str).map(str::to_string)
}

/// proto3 JSON int64: a string, or (leniently) a number.
pub(super) fn int_field(v: &Value, name: &str) -> Option<u64> {
    match v.get(name)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

async fn twirp(
    State(s): State<Arc<Shared>>,
    UrlPath(rpc): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.maybe_stall(&rpc).await;
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    s.hold(&rpc, Held::Before, parsed.as_ref()).await;
    let response = twirp_inner(&s, &rpc, &headers, parsed.as_ref());
    s.hold(&rpc, Held::After, parsed.as_ref()).await;
    s.log(Call {
        op: rpc,
        status: response.status().as_u16(),
        body: parsed,
        content_length: None,
        chunked: false,
        range: None,
        base: None,
    });
    response
}

fn twirp_inner(s: &Shared, rpc: &str, headers: &HeaderMap, body: Option<&Value>) -> Response {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if auth != Some(format!("Bearer {}", s.token).as_str()) {
        return twirp_error(StatusCode::UNAUTHORIZED, "unauthenticated", "bad token");
    }
    if headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        != Some("application/json")
    {
        return twirp_error(StatusCode::BAD_REQUEST, "malformed", "content-type");
    }
    if let Some(f) = s.take_fault(rpc) {
        return fault_response(f);
    }
    let Some(body) = body else {
        return twirp_error(StatusCode::BAD_REQUEST, "malformed", "body is not JSON");
    };
    let (Some(key), Some(version)) = (str_field(body, "key"), str_field(body, "version")) else {
        return twirp_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "key and version",
        );
    };
    match rpc {
        CREATE => {
            if s.lock().switches.read_only {
                return json_ok(json!({"ok": false,
                    "message": "cache write denied: the token does not have write access"}));
            }
            let blob = hex::encode(rand::random::<[u8; 12]>());
            {
                let mut st = s.lock();
                if st
                    .entries
                    .iter()
                    .any(|e| e.key == key && e.version == version)
                {
                    return twirp_error(
                        StatusCode::CONFLICT,
                        "already_exists",
                        "cache entry with the same key, version, and scope already exists",
                    );
                }
                st.next_id += 1;
                st.seq += 1;
                let entry = Entry {
                    id: st.next_id,
                    key,
                    version,
                    blob: blob.clone(),
                    size: None,
                    finalized: false,
                    seq: st.seq,
                };
                st.entries.push(entry);
            }
            json_ok(json!({"ok": true, "signed_upload_url": s.signed_url(&blob, "w")}))
        }
        FINALIZE => {
            let Some(size) = int_field(body, "size_bytes") else {
                return twirp_error(StatusCode::BAD_REQUEST, "invalid_argument", "size_bytes");
            };
            let mut st = s.lock();
            let Some(entry) = st
                .entries
                .iter_mut()
                .find(|e| e.key == key && e.version == version && !e.finalized)
            else {
                return json_ok(json!({"ok": false, "message": "no pending cache entry"}));
            };
            let actual = std::fs::metadata(s.blob_path(&entry.blob)).map(|m| m.len());
            match actual {
                Ok(n) if n == size => {
                    entry.size = Some(size);
                    entry.finalized = true;
                    // int64 as a JSON string, as proto3 JSON does.
                    json_ok(json!({"ok": true, "entry_id": entry.id.to_string()}))
                }
                Ok(n) => json_ok(
                    json!({"ok": false, "message": format!("blob is {n} bytes, declared {size}")}),
                ),
                Err(_) => json_ok(json!({"ok": false, "message": "blob was not uploaded"})),
            }
        }
        LOOKUP => {
            if s.lock().switches.deny_read {
                return twirp_error(
                    StatusCode::FORBIDDEN,
                    "permission_denied",
                    "cache read denied: the token does not have read access",
                );
            }
            let mut wanted = vec![key];
            if let Some(Value::Array(keys)) = body.get("restore_keys") {
                wanted.extend(keys.iter().filter_map(|k| k.as_str().map(str::to_string)));
            }
            let found = s.find(&wanted, &version);
            match found {
                Some((matched, blob)) => json_ok(json!({"ok": true,
                    "signed_download_url": s.signed_url(&blob, "r"), "matched_key": matched})),
                None => json_ok(json!({"ok": false})),
            }
        }
        _ => twirp_error(StatusCode::NOT_FOUND, "bad_route", "no such method"),
    }
}

fn azure_error(status: StatusCode, code: &str) -> Response {
    (
        status,
        [("x-ms-error-code", code)],
        format!("<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{code}</Code></Error>"),
    )
        .into_response()
}

async fn blob(
    State(s): State<Arc<Shared>>,
    UrlPath(name): UrlPath<String>,
    method: Method,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let op = match (&method, q.get("comp").map(String::as_str)) {
        (&Method::PUT, None) => PUT_BLOB,
        (&Method::PUT, Some("block")) => PUT_BLOCK,
        (&Method::PUT, Some("blocklist")) => PUT_BLOCK_LIST,
        (&Method::GET, _) => GET_BLOB,
        (&Method::HEAD, _) => HEAD_BLOB,
        _ => "Unsupported",
    };
    s.maybe_stall(op).await;
    let content_length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let chunked = headers.contains_key(header::TRANSFER_ENCODING);
    let range = headers
        .get("x-ms-range")
        .or_else(|| headers.get(header::RANGE))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let response = blob_inner(
        &s,
        &name,
        op,
        &q,
        &headers,
        content_length,
        chunked,
        range.as_deref(),
        body,
    )
    .await;
    s.log(Call {
        op: op.to_string(),
        status: response.status().as_u16(),
        body: None,
        content_length,
        chunked,
        range,
        base: None,
    });
    response
}

#[allow(clippy::too_many_arguments)]
async fn blob_inner(
    s: &Shared,
    name: &str,
    op: &str,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    content_length: Option<u64>,
    chunked: bool,
    range: Option<&str>,
    body: Body,
) -> Response {
    // SAS check: signature over blob, expiry and permission; the permission must fit the method.
    let expiry: u64 = q.get("se").and_then(|v| v.parse().ok()).unwrap_or(0);
    let perm = q.get("sp").map(String::as_str).unwrap_or("");
    let sig_ok = q.get("sig").map(String::as_str) == Some(s.sign(name, expiry, perm).as_str());
    let perm_ok = match op {
        GET_BLOB | HEAD_BLOB => perm == "r",
        _ => perm == "w",
    };
    if !sig_ok || !perm_ok {
        return azure_error(StatusCode::FORBIDDEN, "AuthenticationFailed");
    }
    if expiry <= unix_now() {
        return azure_error(StatusCode::FORBIDDEN, "AuthenticationFailed");
    }
    if let Some(f) = s.take_fault(op) {
        return fault_response(f);
    }
    match op {
        PUT_BLOB | PUT_BLOCK => {
            // Azure rejects chunked uploads: Content-Length is mandatory.
            let Some(len) = content_length.filter(|_| !chunked) else {
                return azure_error(StatusCode::LENGTH_REQUIRED, "MissingContentLengthHeader");
            };
            let dest = if op == PUT_BLOB {
                if headers.get("x-ms-blob-type").and_then(|v| v.to_str().ok()) != Some("BlockBlob")
                {
                    return azure_error(StatusCode::BAD_REQUEST, "MissingRequiredHeader");
                }
                s.blob_path(name)
            } else {
                let Some(id) = q.get("blockid") else {
                    return azure_error(StatusCode::BAD_REQUEST, "InvalidQueryParameterValue");
                };
                {
                    let st = s.lock();
                    if let Some(existing) = st.blocks.get(name).and_then(|b| b.keys().next()) {
                        if existing.len() != id.len() {
                            return azure_error(StatusCode::BAD_REQUEST, "InvalidBlobOrBlock");
                        }
                    }
                }
                let dir = s.dir.join("blocks").join(name);
                let _ = tokio::fs::create_dir_all(&dir).await;
                dir.join(hex::encode(id.as_bytes()))
            };
            let tmp =
                dest.with_extension(format!("part{}", hex::encode(rand::random::<[u8; 4]>())));
            let written = match save_body(body, &tmp).await {
                Ok(n) => n,
                Err(_) => return azure_error(StatusCode::BAD_REQUEST, "InvalidInput"),
            };
            if written != len {
                let _ = tokio::fs::remove_file(&tmp).await;
                return azure_error(StatusCode::BAD_REQUEST, "InvalidInput");
            }
            if tokio::fs::rename(&tmp, &dest).await.is_err() {
                return azure_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError");
            }
            if op == PUT_BLOCK {
                if let Some(id) = q.get("blockid") {
                    s.lock()
                        .blocks
                        .entry(name.to_string())
                        .or_default()
                        .insert(id.clone(), dest);
                }
            }
            StatusCode::CREATED.into_response()
        }
        PUT_BLOCK_LIST => {
            let bytes = match axum::body::to_bytes(body, 1 << 20).await {
                Ok(b) => b,
                Err(_) => return azure_error(StatusCode::BAD_REQUEST, "InvalidXmlDocument"),
            };
            let xml = String::from_utf8_lossy(&bytes);
            let ids = block_list_ids(&xml);
            let files: Option<Vec<PathBuf>> = {
                let st = s.lock();
                let staged = st.blocks.get(name);
                ids.iter()
                    .map(|id| staged.and_then(|b| b.get(id)).cloned())
                    .collect()
            };
            let Some(files) = files.filter(|f| !f.is_empty()) else {
                return azure_error(StatusCode::BAD_REQUEST, "InvalidBlockList");
            };
            let dest = s.blob_path(name);
            // Committing is the store's own work: std::io::copy (copy_file_range) on a blocking
            // thread keeps it from dominating the client's measured upload time.
            let committed = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let mut out = std::fs::File::create(&dest)?;
                for f in &files {
                    std::io::copy(&mut std::fs::File::open(f)?, &mut out)?;
                }
                Ok(())
            })
            .await;
            if !matches!(committed, Ok(Ok(()))) {
                return azure_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError");
            }
            s.lock().blocks.remove(name);
            let _ = tokio::fs::remove_dir_all(s.dir.join("blocks").join(name)).await;
            StatusCode::CREATED.into_response()
        }
        HEAD_BLOB => match tokio::fs::metadata(s.blob_path(name)).await {
            Ok(m) => (
                StatusCode::OK,
                [(header::CONTENT_LENGTH, m.len().to_string())],
            )
                .into_response(),
            Err(_) => StatusCode::NOT_FOUND.into_response(),
        },
        GET_BLOB => {
            let path = s.blob_path(name);
            let Ok(meta) = tokio::fs::metadata(&path).await else {
                return azure_error(StatusCode::NOT_FOUND, "BlobNotFound");
            };
            let total = meta.len();
            let (start, end, status) = match range.and_then(|r| parse_range(r, total)) {
                Some((a, b)) => (a, b, StatusCode::PARTIAL_CONTENT),
                None if range.is_some() => {
                    return azure_error(StatusCode::RANGE_NOT_SATISFIABLE, "InvalidRange")
                }
                None => (0, total.saturating_sub(1), StatusCode::OK),
            };
            let mut len = if total == 0 { 0 } else { end - start + 1 };
            let truncation = s.lock().truncations.pop_front();
            let mut cut_after = None;
            match truncation {
                Some(Truncation::Honest { keep }) => len = len.min(keep),
                Some(Truncation::Cut { keep }) => cut_after = Some(keep.min(len)),
                None => {}
            }
            let Ok(mut file) = tokio::fs::File::open(&path).await else {
                return azure_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError");
            };
            if file.seek(std::io::SeekFrom::Start(start)).await.is_err() {
                return azure_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError");
            }
            let send = cut_after.unwrap_or(len);
            // Large reads: every tokio file read is a trip to the blocking pool.
            let stream = tokio_util::io::ReaderStream::with_capacity(file.take(send), 256 * 1024);
            let body = match cut_after {
                // After the kept bytes the body fails: hyper drops the connection mid-response.
                Some(_) => Body::from_stream(stream.chain(futures_util::stream::once(async {
                    Err(std::io::Error::other("injected connection drop"))
                }))),
                None => Body::from_stream(stream),
            };
            let mut r = Response::new(body);
            *r.status_mut() = status;
            r.headers_mut().insert(
                header::CONTENT_LENGTH,
                len.to_string().parse().expect("number"),
            );
            if status == StatusCode::PARTIAL_CONTENT {
                r.headers_mut().insert(
                    header::CONTENT_RANGE,
                    format!("bytes {start}-{end}/{total}")
                        .parse()
                        .expect("range"),
                );
            }
            r
        }
        _ => azure_error(StatusCode::METHOD_NOT_ALLOWED, "UnsupportedHttpVerb"),
    }
}

pub(super) async fn save_body(body: Body, dest: &Path) -> std::io::Result<u64> {
    let file = tokio::fs::File::create(dest).await?;
    copy_body(
        body,
        &mut tokio::io::BufWriter::with_capacity(64 * 1024, file),
    )
    .await
}

/// Streams `body` into `out` and flushes it; the bytes written.
pub(super) async fn copy_body(
    body: Body,
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
) -> std::io::Result<u64> {
    let mut stream = body.into_data_stream();
    let mut n = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(std::io::Error::other)?;
        out.write_all(&chunk).await?;
        n += chunk.len() as u64;
    }
    out.flush().await?;
    Ok(n)
}

/// `bytes=a-b` (or `bytes=a-`) within `total`.
fn parse_range(spec: &str, total: u64) -> Option<(u64, u64)> {
    let (a, b) = spec.strip_prefix("bytes=")?.split_once('-')?;
    let a: u64 = a.trim().parse().ok()?;
    let b: u64 = if b.trim().is_empty() {
        total.checked_sub(1)?
    } else {
        b.trim().parse().ok()?
    };
    (a <= b && b < total).then_some((a, b))
}

/// The ids of `<Latest>`, `<Committed>` and `<Uncommitted>` elements, in order.
fn block_list_ids(xml: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut rest = xml;
    while let Some(open) = rest.find('<') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('>') else { break };
        let tag = &after[..close];
        rest = &after[close + 1..];
        if matches!(tag, "Latest" | "Committed" | "Uncommitted") {
            if let Some(end) = rest.find(&format!("</{tag}>")) {
                ids.push(rest[..end].trim().to_string());
                rest = &rest[end..];
            }
        }
    }
    ids
}
