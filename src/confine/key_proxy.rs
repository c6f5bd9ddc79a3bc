//! The key proxy: the agent holds no LLM key. fro-bot serves each provider's API on
//! 127.0.0.1 and adds the real credential to every request; OpenCode's config points the
//! provider's `baseURL` at `http://127.0.0.1:<port>/p/<provider>` and carries a placeholder key.
//! Requests are forwarded only to that provider's configured upstream (a path cannot change the
//! host: the target is the upstream URL with the path appended, checked after parsing), with
//! the agent's own auth headers dropped; responses (SSE streams included) pass through as they
//! arrive. Auth kinds the proxy cannot carry (OAuth, cloud-signed requests) are passed through
//! and named, as visible to the agent.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Map, Value};
use url::Url;

use crate::confine::spend::{Meter, ResponseTally};
use crate::runner::Env;

/// The key OpenCode is given instead of the real one.
pub const PLACEHOLDER_KEY: &str = "fro-bot-proxy-placeholder";

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;

/// How a provider takes its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStyle {
    /// `x-api-key: <key>` (Anthropic).
    XApiKey,
    /// `Authorization: Bearer <key>` (OpenAI and the OpenAI-compatible APIs).
    Bearer,
    /// `x-goog-api-key: <key>` (Google's Generative Language API; a `key` query parameter is
    /// dropped).
    Google,
}

/// Providers people use with API keys: id, default upstream, auth, key variables.
const KNOWN: &[(&str, &str, AuthStyle, &[&str])] = &[
    (
        "anthropic",
        "https://api.anthropic.com/v1",
        AuthStyle::XApiKey,
        &["ANTHROPIC_API_KEY"],
    ),
    (
        "openai",
        "https://api.openai.com/v1",
        AuthStyle::Bearer,
        &["OPENAI_API_KEY"],
    ),
    (
        "google",
        "https://generativelanguage.googleapis.com/v1beta",
        AuthStyle::Google,
        &["GOOGLE_GENERATIVE_AI_API_KEY", "GEMINI_API_KEY"],
    ),
    (
        "openrouter",
        "https://openrouter.ai/api/v1",
        AuthStyle::Bearer,
        &["OPENROUTER_API_KEY"],
    ),
    (
        "groq",
        "https://api.groq.com/openai/v1",
        AuthStyle::Bearer,
        &["GROQ_API_KEY"],
    ),
    (
        "mistral",
        "https://api.mistral.ai/v1",
        AuthStyle::Bearer,
        &["MISTRAL_API_KEY"],
    ),
    (
        "deepseek",
        "https://api.deepseek.com/v1",
        AuthStyle::Bearer,
        &["DEEPSEEK_API_KEY"],
    ),
    (
        "xai",
        "https://api.x.ai/v1",
        AuthStyle::Bearer,
        &["XAI_API_KEY"],
    ),
];

/// Providers whose requests are signed with cloud credentials: nothing the proxy can add.
const CLOUD_SIGNED: &[&str] = &["amazon-bedrock", "google-vertex", "google-vertex-anthropic"];

/// One provider served through the proxy.
#[derive(Clone)]
pub struct Route {
    pub id: String,
    pub upstream: Url,
    pub style: AuthStyle,
    key: String,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("id", &self.id)
            .field("upstream", &self.upstream.as_str())
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}

/// Which providers go through the proxy and which cannot.
#[derive(Debug, Default)]
pub struct KeyProxyPlan {
    pub routes: Vec<Route>,
    /// `auth-json` entries the proxy cannot carry: still given to OpenCode.
    pub auth_passthrough: Map<String, Value>,
    /// Provider id → why its credentials stay visible to the agent.
    pub visible: Vec<(String, String)>,
}

fn str_at<'a>(v: Option<&'a Value>, path: &[&str]) -> Option<&'a str> {
    let mut cur = v?;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

/// `{env:NAME}` resolved from fro-bot's environment (OpenCode's own substitution would find
/// nothing: the name is not in the agent's environment).
fn resolve_key(raw: &str, env: &Env) -> Option<String> {
    match raw.strip_prefix("{env:").and_then(|r| r.strip_suffix('}')) {
        Some(name) => env.get(name).map(str::to_string),
        None => Some(raw.to_string()),
    }
}

/// Every provider that may hold a key, once each: those in `auth-json`, those the user's config
/// names, and the known ones whose key variable is set.
fn provider_ids(
    auth: &Map<String, Value>,
    providers: Option<&Map<String, Value>>,
    env: &Env,
) -> Vec<String> {
    let mut ids: Vec<String> = auth.keys().cloned().collect();
    ids.extend(providers.into_iter().flat_map(|p| p.keys().cloned()));
    for (id, _, _, vars) in KNOWN {
        if vars.iter().any(|v| env.get(v).is_some()) {
            ids.push(id.to_string());
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(id.clone()));
    ids
}

/// A provider's API key: its `auth-json` entry's, else `options.apiKey` in the user's config, else
/// a known provider's key variable; never an empty one.
fn api_key(
    entry: Option<&Value>,
    cfg: Option<&Value>,
    known: Option<&(&str, &str, AuthStyle, &[&str])>,
    env: &Env,
) -> Option<String> {
    str_at(entry, &["key"])
        .map(str::to_string)
        .or_else(|| str_at(cfg, &["options", "apiKey"]).and_then(|k| resolve_key(k, env)))
        .or_else(|| known.and_then(|k| k.3.iter().find_map(|v| env.get(v).map(str::to_string))))
        .filter(|k| !k.is_empty())
}

impl KeyProxyPlan {
    /// From `auth-json`, the user's `opencode-config` and the provider key variables.
    pub fn new(auth: &Map<String, Value>, user: Option<&Map<String, Value>>, env: &Env) -> Self {
        let providers = user
            .and_then(|u| u.get("provider"))
            .and_then(Value::as_object);
        let mut plan = KeyProxyPlan::default();
        for id in provider_ids(auth, providers, env) {
            let cfg = providers.and_then(|p| p.get(&id));
            let entry = auth.get(&id);
            plan.add(id, entry, cfg, env);
        }
        plan
    }

    /// Provider `id` (its `auth-json` entry, its `opencode-config` entry): routed through the
    /// proxy when it has an API key and a known API address, else passed to OpenCode as it is and
    /// named as visible; a provider with no key at all is left to OpenCode.
    fn add(&mut self, id: String, entry: Option<&Value>, cfg: Option<&Value>, env: &Env) {
        let entry_type = str_at(entry, &["type"]);
        if CLOUD_SIGNED.contains(&id.as_str()) {
            let why = "cloud-signed requests: the proxy cannot add their credentials";
            return self.pass_through(id, entry, why.into());
        }
        if entry.is_some() && entry_type != Some("api") {
            let kind = entry_type.unwrap_or("untyped");
            let why = format!("{kind} credentials: passed to OpenCode as they are");
            return self.pass_through(id, entry, why);
        }
        let known = KNOWN.iter().find(|k| k.0 == id);
        let Some(key) = api_key(entry, cfg, known, env) else {
            return;
        };
        let upstream = str_at(cfg, &["options", "baseURL"])
            .or(known.map(|k| k.1))
            .and_then(|u| Url::parse(u.trim_end_matches('/')).ok())
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        let Some(upstream) = upstream else {
            let why = "no known API address to proxy (set options.baseURL in opencode-config)";
            return self.pass_through(id, entry, why.into());
        };
        let style = match (known, str_at(cfg, &["npm"]).unwrap_or("")) {
            (Some(k), _) => k.2,
            (None, "@ai-sdk/anthropic") => AuthStyle::XApiKey,
            (None, "@ai-sdk/google") => AuthStyle::Google,
            (None, _) => AuthStyle::Bearer,
        };
        crate::runner::log::add_mask(&key);
        self.routes.push(Route {
            id,
            upstream,
            style,
            key,
        });
    }

    /// A provider the proxy cannot carry: its `auth-json` entry still goes to OpenCode, and the
    /// summary names it as visible to the agent, saying `why`.
    fn pass_through(&mut self, id: String, entry: Option<&Value>, why: String) {
        if let Some(e) = entry {
            self.auth_passthrough.insert(id.clone(), e.clone());
        }
        self.visible.push((id, why));
    }

    /// The config layer that points the routed providers at the proxy (merged last: it wins).
    pub fn config_overrides(&self, proxy: &KeyProxy) -> Value {
        let mut providers = Map::new();
        for r in &self.routes {
            providers.insert(
                r.id.clone(),
                json!({"options": {"baseURL": proxy.base_url(&r.id), "apiKey": PLACEHOLDER_KEY}}),
            );
        }
        json!({ "provider": providers })
    }
}

/// The body of the proxy's 502 when the provider cannot be reached: OpenCode repeats it in its
/// retries and errors, where the turn recognizes it (`opencode::turn::is_unreachable_text`).
pub const UNREACHABLE: &str = "the provider is unreachable";

/// The running proxy; stops when dropped.
#[derive(Debug)]
pub struct KeyProxy {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KeyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct State {
    routes: Vec<Route>,
    http: reqwest::Client,
    metering: Option<Metering>,
}

/// How a proxy counts what its requests spend (`confine::spend`).
#[derive(Debug, Clone)]
pub struct Metering {
    pub meter: Arc<Meter>,
    /// Refuse requests once a cap is reached (the agent's); the threat check's are only counted.
    pub refuse: bool,
}

impl KeyProxy {
    pub async fn start(routes: Vec<Route>) -> std::io::Result<KeyProxy> {
        Self::start_metered(routes, None).await
    }

    /// A proxy whose requests the meter counts (and, when it refuses, caps).
    pub async fn start_metered(
        routes: Vec<Route>,
        metering: Option<Metering>,
    ) -> std::io::Result<KeyProxy> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let http = crate::net::external()
            // A redirect must not carry the key anywhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(std::io::Error::other)?;
        let state = Arc::new(State {
            routes,
            http,
            metering,
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(handle(&state, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(KeyProxy { addr, task })
    }

    /// Its port: the agent's Landlock domain lets OpenCode connect to it (`crate::confine::network`).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The `baseURL` OpenCode gets for `provider`.
    pub fn base_url(&self, provider: &str) -> String {
        format!("http://{}/p/{provider}", self.addr)
    }
}

fn plain(status: StatusCode, text: &str) -> Response<ProxyBody> {
    let mut r = Response::new(
        Full::new(Bytes::from(text.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

/// The upstream URL for `rest` (path and query after `/p/<id>`), or `None` when it would leave
/// the provider's upstream.
pub fn target(upstream: &Url, rest: &str, style: AuthStyle) -> Option<Url> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let lowered = path.to_ascii_lowercase();
    if !(path.is_empty() || path.starts_with('/'))
        || path.contains("//")
        || path.contains('\\')
        || lowered.contains("%2e")
        || lowered.contains("%2f")
        || lowered.contains("%5c")
        || path.split('/').any(|seg| seg == ".." || seg == ".")
    {
        return None;
    }
    let mut url = Url::parse(&format!(
        "{}{path}",
        upstream.as_str().trim_end_matches('/')
    ))
    .ok()?;
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| !(style == AuthStyle::Google && k == "key"))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.set_query(None);
    if !pairs.is_empty() {
        url.query_pairs_mut().extend_pairs(pairs);
    }
    let same_origin = url.scheme() == upstream.scheme()
        && url.host_str() == upstream.host_str()
        && url.port_or_known_default() == upstream.port_or_known_default()
        && url
            .path()
            .starts_with(upstream.path().trim_end_matches('/'));
    same_origin.then_some(url)
}

/// Headers never forwarded: hop-by-hop ones, the host, and any credential the agent sends.
fn dropped(name: &str) -> bool {
    matches!(
        name,
        "host"
            | "connection"
            | "keep-alive"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "authorization"
            | "x-api-key"
            | "x-goog-api-key"
            | "api-key"
            | "cookie"
    )
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<ProxyBody> {
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let Some(after) = path_and_query.strip_prefix("/p/") else {
        return plain(StatusCode::NOT_FOUND, "unknown route");
    };
    let split = after.find(['/', '?']).unwrap_or(after.len());
    let (id, rest) = after.split_at(split);
    let Some(route) = state.routes.iter().find(|r| r.id == id) else {
        return plain(StatusCode::NOT_FOUND, "unknown provider");
    };
    let Some(url) = target(&route.upstream, rest, route.style) else {
        return plain(StatusCode::BAD_REQUEST, "path leaves the provider's API");
    };
    let method = req.method().clone();
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in req.headers() {
        if !dropped(name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return plain(StatusCode::BAD_REQUEST, "cannot read the request body"),
    };
    let tally = match &state.metering {
        None => None,
        Some(m) => match m.refuse.then(|| m.meter.reached()).flatten() {
            Some(line) => {
                m.meter.refuse();
                return capped(&line);
            }
            None => Some((m.meter.clone(), model_of(&route.id, rest, &body))),
        },
    };
    let mut upstream = state.http.request(method, url).headers(headers).body(body);
    upstream = match route.style {
        AuthStyle::XApiKey => upstream.header("x-api-key", &route.key),
        AuthStyle::Bearer => upstream.bearer_auth(&route.key),
        AuthStyle::Google => upstream.header("x-goog-api-key", &route.key),
    };
    let resp = match upstream.send().await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("key proxy: {} unreachable: {e}", route.id);
            return plain(StatusCode::BAD_GATEWAY, UNREACHABLE);
        }
    };
    if let Some((meter, _)) = &tally {
        meter.forwarded();
    }
    let sse = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("text/event-stream"));
    let tally = tally.map(|(meter, model)| {
        Arc::new(std::sync::Mutex::new(ResponseTally::new(meter, model, sse)))
    });
    let mut out = Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if !dropped(name.as_str()) || name.as_str() == "content-length" {
            out = out.header(name, value);
        }
    }
    // Passed on chunk by chunk as they arrive: SSE streams are never buffered.
    // Each chunk is read for the usage it reports as it passes (`spend::ResponseTally`); the
    // tally counts what is left when the stream ends or is dropped.
    let stream = resp.bytes_stream().map(move |chunk| {
        if let (Some(t), Ok(bytes)) = (&tally, &chunk) {
            t.lock().unwrap_or_else(|e| e.into_inner()).feed(bytes);
        }
        chunk.map(Frame::data).map_err(|e| Box::new(e) as BoxError)
    });
    out.body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap_or_else(|_| plain(StatusCode::BAD_GATEWAY, "bad upstream response"))
}

/// The words of the proxy's refusal at the cap: OpenCode shows them as the provider's error, and
/// the turn recognizes them (`opencode::turn::classify`).
pub const CAPPED: &str = "fro-bot spend cap";

/// The refusal of a request at the cap: a client error no provider SDK retries (402), in a body
/// every API shape reads an error message from.
fn capped(line: &str) -> Response<ProxyBody> {
    let message = format!("{CAPPED}: {line}");
    let body = json!({"type": "error",
        "error": {"type": "spend_cap_reached", "code": "spend_cap_reached", "message": message}});
    let mut r = plain(StatusCode::PAYMENT_REQUIRED, &body.to_string());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// `provider/model` of a request: the body's `model` (OpenAI, Anthropic), else the model in a
/// Google path (`/models/{model}:generateContent`).
fn model_of(provider: &str, rest: &str, body: &[u8]) -> String {
    let from_body = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["model"].as_str().map(str::to_string));
    let from_path = || {
        let path = rest.split('?').next().unwrap_or("");
        let after = path.split_once("/models/")?.1;
        Some(after.split(':').next().unwrap_or(after).to_string())
    };
    let model = from_body
        .or_else(from_path)
        .unwrap_or_else(|| "unknown".into());
    format!("{provider}/{model}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_cannot_leave_the_upstream() {
        let up = Url::parse("https://api.anthropic.com/v1").unwrap();
        let ok = target(&up, "/messages?beta=true", AuthStyle::XApiKey).unwrap();
        assert_eq!(
            ok.as_str(),
            "https://api.anthropic.com/v1/messages?beta=true"
        );
        for evil in [
            "@evil.example/x",
            "/../../x",
            "/%2e%2e/x",
            "//evil.example/x",
            "/..%2fx",
            "\\\\evil.example",
            "/./x",
        ] {
            assert!(target(&up, evil, AuthStyle::XApiKey).is_none(), "{evil}");
        }
        let g = Url::parse("https://generativelanguage.googleapis.com/v1beta").unwrap();
        let url = target(
            &g,
            "/models/x:streamGenerateContent?alt=sse&key=LEAK",
            AuthStyle::Google,
        )
        .unwrap();
        assert_eq!(url.query(), Some("alt=sse"));
    }

    #[test]
    fn keys_are_routed_and_what_cannot_be_carried_is_named() {
        let auth: Map<String, Value> = serde_json::from_value(json!({
            "anthropic": {"type": "api", "key": "sk-ant"},
            "github-copilot": {"type": "oauth", "refresh": "r", "access": "a", "expires": 0},
        }))
        .unwrap();
        let user: Map<String, Value> = serde_json::from_value(json!({"provider": {
            "mine": {"npm": "@ai-sdk/openai-compatible",
                     "options": {"baseURL": "http://127.0.0.1:9/v1", "apiKey": "{env:MY_KEY}"}},
            "amazon-bedrock": {}
        }}))
        .unwrap();
        let env = Env::from_pairs([("MY_KEY", "sk-mine"), ("GROQ_API_KEY", "gsk")]);
        let plan = KeyProxyPlan::new(&auth, Some(&user), &env);
        let routes: Vec<(&str, &str, AuthStyle, &str)> = plan
            .routes
            .iter()
            .map(|r| (r.id.as_str(), r.upstream.as_str(), r.style, r.key.as_str()))
            .collect();
        assert_eq!(
            routes,
            [
                (
                    "anthropic",
                    "https://api.anthropic.com/v1",
                    AuthStyle::XApiKey,
                    "sk-ant"
                ),
                (
                    "mine",
                    "http://127.0.0.1:9/v1",
                    AuthStyle::Bearer,
                    "sk-mine"
                ),
                (
                    "groq",
                    "https://api.groq.com/openai/v1",
                    AuthStyle::Bearer,
                    "gsk"
                ),
            ]
        );
        assert!(plan.auth_passthrough.contains_key("github-copilot"));
        assert!(!plan.auth_passthrough.contains_key("anthropic"));
        let visible: Vec<&str> = plan.visible.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(visible, ["github-copilot", "amazon-bedrock"]);
    }
}
