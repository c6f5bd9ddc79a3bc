//! Typed client for OpenCode's v1 HTTP API (never the separate `/api/...` v2 engine, whose messages
//! v1 cannot see). Every request carries `?directory=<workspace>` and HTTP Basic auth.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use super::error::{ApiError, NamedError};
use super::events::EventStream;
use crate::runner::log;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct SessionTime {
    pub created: i64,
    pub updated: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compacting: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archived: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Session {
    pub id: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub directory: String,
    #[serde(rename = "projectID", default)]
    pub project_id: String,
    #[serde(rename = "parentID", default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    pub time: SessionTime,
}

impl Session {
    pub fn is_root(&self) -> bool {
        self.parent_id.is_none()
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct CacheTokens {
    #[serde(default)]
    pub read: u64,
    #[serde(default)]
    pub write: u64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Tokens {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    #[serde(default)]
    pub reasoning: u64,
    #[serde(default)]
    pub cache: CacheTokens,
}

impl Tokens {
    pub fn add(&mut self, o: &Tokens) {
        self.input += o.input;
        self.output += o.output;
        self.reasoning += o.reasoning;
        self.cache.read += o.cache.read;
        self.cache.write += o.cache.write;
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct MessageTime {
    #[serde(default)]
    pub created: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct MessageInfo {
    pub id: String,
    pub role: String,
    #[serde(rename = "sessionID", default)]
    pub session_id: String,
    #[serde(default)]
    pub time: MessageTime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<NamedError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Tokens>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// Which model answered (assistant messages).
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    #[serde(rename = "modelID", default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Message {
    pub info: MessageInfo,
    #[serde(default)]
    pub parts: Vec<Part>,
}

impl Message {
    /// The message's visible text: text parts, plus tool names and their output.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p.kind.as_str() {
                "text" => {
                    if let Some(t) = &p.text {
                        push_line(&mut out, t);
                    }
                }
                "tool" => {
                    let name = p.tool.as_deref().unwrap_or("tool");
                    let output = p
                        .state
                        .as_ref()
                        .and_then(|s| s["output"].as_str())
                        .unwrap_or("");
                    push_line(&mut out, &format!("[tool {name}] {output}"));
                }
                _ => {}
            }
        }
        out
    }

    /// Only the assistant's (or user's) own words: text parts.
    pub fn plain_text(&self) -> String {
        let mut out = String::new();
        for p in self.parts.iter().filter(|p| p.kind == "text") {
            if let Some(t) = &p.text {
                push_line(&mut out, t);
            }
        }
        out
    }
}

fn push_line(out: &mut String, s: &str) {
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(s);
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelSpec {
    #[serde(rename = "providerID")]
    pub provider_id: String,
    #[serde(rename = "modelID")]
    pub model_id: String,
}

impl From<&crate::config::ModelRef> for ModelSpec {
    fn from(m: &crate::config::ModelRef) -> Self {
        Self {
            provider_id: m.provider.clone(),
            model_id: m.model.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PromptBody {
    pub parts: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    #[serde(rename = "noReply", skip_serializing_if = "Option::is_none")]
    pub no_reply: Option<bool>,
}

impl PromptBody {
    pub fn text(text: &str) -> Self {
        Self {
            parts: vec![json!({"type": "text", "text": text})],
            agent: None,
            model: None,
            no_reply: None,
        }
    }
}

/// `GET /session/status` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SessionStatus {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub message: Option<String>,
}

/// `GET /mcp` entry: `connected`, `failed` (with `error`), `disabled`, ….
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct McpStatus {
    pub status: String,
    #[serde(default)]
    pub error: Option<String>,
}

/// Sessions one listing asks OpenCode for at most: about 6 MB of JSON and a second or two of
/// OpenCode's time, so a restored database holding millions of sessions cannot hang a run.
pub const LISTING_CAP: usize = 20_000;

/// A listing of this workspace's sessions, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    pub sessions: Vec<Session>,
    pub extent: Extent,
}

/// Whether a listing holds every session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// Every session of the project.
    Complete,
    /// Memory holds more than `cap` sessions: only the newest `cap` are listed.
    Capped { cap: usize },
}

impl Extent {
    /// What a log line says when the listing was cut, naming what used it.
    pub fn note(self, what: &str) -> Option<String> {
        match self {
            Extent::Complete => None,
            Extent::Capped { cap } => Some(format!(
                "memory holds more than {cap} sessions: {what} considered the newest {cap} only"
            )),
        }
    }
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: url::Url,
    password: Option<String>,
    directory: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .field("directory", &self.directory)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// `password` = the server's `OPENCODE_SERVER_PASSWORD` (None for an unsecured server).
    pub fn new(base: &str, password: Option<&str>, directory: &str) -> Result<Self, ApiError> {
        let base = url::Url::parse(base).map_err(|_| ApiError::Url { url: base.into() })?;
        if base.cannot_be_a_base() {
            return Err(ApiError::Url {
                url: base.to_string(),
            });
        }
        let http = crate::net::loopback()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|source| ApiError::Transport {
                method: "BUILD",
                route: String::new(),
                detail: source.to_string(),
                source,
            })?;
        // No masking here: the session-tools MCP server uses this client, and its stdout is the
        // protocol channel. The server module masks the password when it creates it.
        Ok(Self {
            http,
            base,
            password: password.map(str::to_string),
            directory: directory.to_string(),
        })
    }

    pub fn directory(&self) -> &str {
        &self.directory
    }

    fn url(&self, route: &str, query: &[(&str, String)]) -> url::Url {
        let mut u = self.base.clone();
        u.set_path(route);
        {
            let mut q = u.query_pairs_mut();
            q.append_pair("directory", &self.directory);
            for (k, v) in query {
                q.append_pair(k, v);
            }
        }
        u
    }

    async fn send(
        &self,
        method: &'static str,
        route: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, ApiError> {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
        let mut req = self.http.request(m, self.url(route, query));
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        if let Some(p) = &self.password {
            req = req.basic_auth("opencode", Some(p));
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|source| ApiError::Transport {
            method,
            route: route.to_string(),
            detail: log::redact(&error_chain(&source)),
            source,
        })?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(ApiError::Status {
                method,
                route: route.to_string(),
                status: status.as_u16(),
                body: log::redact(&truncate(&body, 500)),
            });
        }
        Ok(resp)
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: &'static str,
        route: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<T, ApiError> {
        let resp = self
            .send(method, route, query, body, Some(REQUEST_TIMEOUT))
            .await?;
        resp.json::<T>().await.map_err(|source| ApiError::Decode {
            method,
            route: route.to_string(),
            source,
        })
    }

    /// `GET /global/health` with a short timeout.
    pub async fn healthy(&self) -> bool {
        match self
            .send(
                "GET",
                "/global/health",
                &[],
                None,
                Some(Duration::from_millis(500)),
            )
            .await
        {
            Ok(r) => r
                .json::<Value>()
                .await
                .map(|v| v["healthy"] == true)
                .unwrap_or(false),
            Err(_) => false,
        }
    }

    /// Every session of this workspace's project, newest first (archived and child sessions
    /// included), up to [`LISTING_CAP`]: see [`list_sessions_upto`](Self::list_sessions_upto).
    pub async fn list_sessions(&self) -> Result<Listing, ApiError> {
        self.list_sessions_upto(LISTING_CAP).await
    }

    /// The newest `cap` sessions of this workspace's project, saying whether that is all of them.
    /// OpenCode 1.18.33's `GET /session` answers only the 100 most recently updated unless given
    /// `limit`, and has no cursor (`start` is a lower bound on `time.updated`, newest first), so
    /// one request asks for one more than `cap`: an answer that long means memory holds more
    /// (docs/persistence.md#every-thread-resumes).
    pub async fn list_sessions_upto(&self, cap: usize) -> Result<Listing, ApiError> {
        // `limit=0` answers nothing at all: ask for one at least.
        let cap = cap.max(1);
        let limit = [("limit", (cap + 1).to_string())];
        let mut sessions: Vec<Session> = self.json("GET", "/session", &limit, None).await?;
        let extent = if sessions.len() > cap {
            sessions.truncate(cap);
            Extent::Capped { cap }
        } else {
            Extent::Complete
        };
        Ok(Listing { sessions, extent })
    }

    pub async fn get_session(&self, id: &str) -> Result<Session, ApiError> {
        self.json("GET", &format!("/session/{}", seg(id)), &[], None)
            .await
    }

    pub async fn create_session(&self, title: &str) -> Result<Session, ApiError> {
        self.json("POST", "/session", &[], Some(&json!({"title": title})))
            .await
    }

    /// Archives a session (irreversible through the API).
    pub async fn archive_session(&self, id: &str, now_ms: i64) -> Result<Session, ApiError> {
        self.json(
            "PATCH",
            &format!("/session/{}", seg(id)),
            &[],
            Some(&json!({"time": {"archived": now_ms}})),
        )
        .await
    }

    pub async fn delete_session(&self, id: &str) -> Result<(), ApiError> {
        self.send(
            "DELETE",
            &format!("/session/{}", seg(id)),
            &[],
            None,
            Some(REQUEST_TIMEOUT),
        )
        .await
        .map(|_| ())
    }

    pub async fn children(&self, id: &str) -> Result<Vec<Session>, ApiError> {
        self.json("GET", &format!("/session/{}/children", seg(id)), &[], None)
            .await
    }

    /// Messages of a session, oldest first; `limit` = the newest N.
    pub async fn messages(&self, id: &str, limit: Option<usize>) -> Result<Vec<Message>, ApiError> {
        let q: Vec<(&str, String)> = limit
            .map(|l| ("limit", l.to_string()))
            .into_iter()
            .collect();
        self.json("GET", &format!("/session/{}/message", seg(id)), &q, None)
            .await
    }

    /// Starts a turn without waiting for it (204).
    pub async fn prompt_async(&self, id: &str, body: &PromptBody) -> Result<(), ApiError> {
        let body = serde_json::to_value(body).unwrap_or(Value::Null);
        self.send(
            "POST",
            &format!("/session/{}/prompt_async", seg(id)),
            &[],
            Some(&body),
            Some(REQUEST_TIMEOUT),
        )
        .await
        .map(|_| ())
    }

    /// Appends a user message without starting a turn (`noReply: true`).
    pub async fn append_message(&self, id: &str, text: &str) -> Result<Message, ApiError> {
        let mut body = PromptBody::text(text);
        body.no_reply = Some(true);
        let body = serde_json::to_value(&body).unwrap_or(Value::Null);
        self.json(
            "POST",
            &format!("/session/{}/message", seg(id)),
            &[],
            Some(&body),
        )
        .await
    }

    pub async fn abort(&self, id: &str) -> Result<(), ApiError> {
        self.send(
            "POST",
            &format!("/session/{}/abort", seg(id)),
            &[],
            None,
            Some(Duration::from_secs(5)),
        )
        .await
        .map(|_| ())
    }

    /// Sessions that are not idle (idle ones are absent).
    pub async fn status(&self) -> Result<BTreeMap<String, SessionStatus>, ApiError> {
        self.json("GET", "/session/status", &[], None).await
    }

    /// Each MCP server's state (`GET /mcp`); OpenCode connects them for the request if it has not.
    pub async fn mcp_status(&self) -> Result<BTreeMap<String, McpStatus>, ApiError> {
        self.json("GET", "/mcp", &[], None).await
    }

    /// The providers OpenCode can call, each with its models (`GET /config/providers`).
    pub async fn config_providers(&self) -> Result<super::preflight::Providers, ApiError> {
        self.json("GET", "/config/providers", &[], None).await
    }

    /// Subscribes to `/event` (SSE). No overall timeout: the stream lives as long as the turn.
    pub async fn events(&self) -> Result<EventStream, ApiError> {
        let resp = self.send("GET", "/event", &[], None, None).await?;
        Ok(EventStream::new(resp))
    }
}

/// The error and its causes on one line ("error sending request: ... Connection refused").
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

/// A path segment: session ids are `ses_...`, but never let one inject a path.
fn seg(id: &str) -> String {
    url::form_urlencoded::byte_serialize(id.as_bytes()).collect()
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}
