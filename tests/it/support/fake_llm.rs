//! Test service: a scripted OpenAI-compatible LLM (`POST /v1/chat/completions`, streaming SSE).
//!
//! OpenCode talks to it through its bundled `@ai-sdk/openai-compatible` provider. Replies come from
//! a queue (text, streamed tool calls, delays, stalls, and the error responses OpenAI sends); when
//! the queue is empty the default reply answers. Every request body is recorded so tests can check
//! what the agent sent (e.g. that a resumed session carries the earlier exchange).
//!
//! Error bodies and status codes are OpenAI's, so OpenCode classifies them as in production:
//! 429 `rate_limit_exceeded` (with `retry-after-ms`, which OpenCode honours, so its own five
//! internal retries take milliseconds), 429 `insufficient_quota`, 401 `invalid_api_key`,
//! 400 `context_length_exceeded`, 500 `server_error`.
//!
//! OpenCode's title-generator requests (sessions created without a title) are answered separately
//! and never consume the queue. So are the threat check's (fro-bot's own request, not OpenCode's:
//! `stream: false`, answered as one JSON completion): from their own queue ([`FakeLlm::push_verdict`]),
//! a clear verdict by default, recorded apart ([`FakeLlm::judge_requests`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Response, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

/// One scripted answer to one chat-completions request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Streamed assistant text, finish reason `stop`.
    Text(String),
    /// One streamed tool call (arguments split over several deltas), finish reason `tool_calls`.
    ToolCall { name: String, arguments: Value },
    /// An error response as OpenAI sends it.
    Error(LlmError),
    /// Waits, then answers with the inner reply.
    Delayed(Duration, Box<Reply>),
    /// Starts streaming, then never finishes (until the client hangs up, or 10 minutes).
    Stall,
    /// [`Reply::Stall`] whose first chunk reports the usage (as Anthropic's `message_start` reports
    /// the prompt's tokens first): spend only the key proxy sees, as OpenCode never completes it.
    StallReporting,
    /// Streamed text naming the first word of the request (in the newest user message, after its
    /// first `## Task` or `### Triggering comment`) that contains `containing`: "Noted {word}."
    /// Concurrent runs pop replies in the order they reach the model, so a reply that must answer
    /// its own question is made from the question.
    Echo { containing: String },
    /// Streamed text, then the tool call `call` (a [`Reply::ToolCall`]) in the same answer: an
    /// agent that says something on its way.
    Narrated { text: String, call: Box<Reply> },
    /// `first` for a turn's first step (the newest message is the user's), `then` for each later
    /// one (after a tool result): concurrent runs each get their own steps, whatever order their
    /// requests come in.
    Stepwise { first: Box<Reply>, then: Box<Reply> },
}

impl Reply {
    pub fn text(s: impl Into<String>) -> Self {
        Reply::Text(s.into())
    }

    pub fn tool(name: impl Into<String>, arguments: Value) -> Self {
        Reply::ToolCall {
            name: name.into(),
            arguments,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmError {
    RateLimit,
    Quota,
    Auth,
    ContextOverflow,
    Server,
}

impl LlmError {
    fn status_and_body(self) -> (StatusCode, Value) {
        match self {
            LlmError::RateLimit => (
                StatusCode::TOO_MANY_REQUESTS,
                json!({"error": {"message": "Rate limit reached for gpt-4o in organization org-fake on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20ms.",
                    "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
            ),
            LlmError::Quota => (
                StatusCode::TOO_MANY_REQUESTS,
                json!({"error": {"message": "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
                    "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}),
            ),
            LlmError::Auth => (
                StatusCode::UNAUTHORIZED,
                json!({"error": {"message": "Incorrect API key provided: sk-fake. You can find your API key at https://platform.openai.com/account/api-keys.",
                    "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
            ),
            LlmError::ContextOverflow => (
                StatusCode::BAD_REQUEST,
                json!({"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 131072 tokens. Please reduce the length of the messages.",
                    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
            ),
            LlmError::Server => (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"message": "The server had an error while processing your request. Sorry about that!",
                    "type": "server_error", "param": null, "code": null}}),
            ),
        }
    }
}

struct Script {
    queue: VecDeque<Reply>,
    default: Reply,
    requests: Vec<Value>,
    /// The `Authorization` header of each recorded request.
    auth_headers: Vec<Option<String>>,
    title_requests: usize,
    /// The threat check's answers, and what it asked.
    verdicts: VecDeque<Reply>,
    judge_requests: Vec<Value>,
    judge_auth: Vec<Option<String>>,
    /// When each recorded request arrived (for benchmarks' phase breakdowns).
    request_times: Vec<Instant>,
    /// While set, an answer waits as long as this says so ([`FakeLlm::hold_while`]).
    hold: Option<Hold>,
    /// The prompt and completion tokens each answer reports ([`FakeLlm::set_usage`]); `None`:
    /// 120 and 8 for a streamed answer, 300 and 20 for the threat check's.
    usage: Option<(u64, u64)>,
    /// The usage the threat check's answers report instead ([`FakeLlm::set_judge_usage`]).
    judge_usage: Option<(u64, u64)>,
}

/// Whether the answer to a request (the first argument) must still wait, given every request so
/// far (that one included).
type Hold = Arc<dyn Fn(&Value, &[Value]) -> bool + Send + Sync>;

/// The longest an answer is held: a condition that never comes (a run that failed) does not hang
/// the others; the test then fails on what the condition was for.
const HOLD_LIMIT: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct FakeLlm {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    _server: Arc<tokio::task::JoinHandle<()>>,
}

impl FakeLlm {
    /// Starts on a random 127.0.0.1 port (inside the test's tokio runtime).
    pub async fn start() -> Self {
        let script = Arc::new(Mutex::new(Script {
            queue: VecDeque::new(),
            default: Reply::text("Done."),
            requests: Vec::new(),
            auth_headers: Vec::new(),
            title_requests: 0,
            verdicts: VecDeque::new(),
            judge_requests: Vec::new(),
            judge_auth: Vec::new(),
            request_times: Vec::new(),
            hold: None,
            usage: None,
            judge_usage: None,
        }));
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            addr,
            script,
            _server: Arc::new(server),
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn push(&self, reply: Reply) {
        self.script.lock().unwrap().queue.push_back(reply);
    }

    pub fn push_n(&self, n: usize, reply: Reply) {
        for _ in 0..n {
            self.push(reply.clone());
        }
    }

    pub fn set_default(&self, reply: Reply) {
        self.script.lock().unwrap().default = reply;
    }

    /// From now on each answer (title requests' excepted) waits while `wait(request, requests so
    /// far)` holds, checked every 50 ms for at most a minute: a test orders runs by what the model
    /// has been asked (a run held in its turn until another has reached its own) instead of by
    /// sleeps. [`FakeLlm::release_holds`] ends it.
    pub fn hold_while(&self, wait: impl Fn(&Value, &[Value]) -> bool + Send + Sync + 'static) {
        self.script.lock().unwrap().hold = Some(Arc::new(wait));
    }

    /// From now on every answer (the agent's, titles', the threat check's) reports this usage
    /// (prompt, completion tokens).
    pub fn set_usage(&self, prompt: u64, completion: u64) {
        self.script.lock().unwrap().usage = Some((prompt, completion));
    }

    /// From now on the threat check's answers report this usage (prompt, completion tokens),
    /// whatever [`FakeLlm::set_usage`] says: its spend told apart from the agent's.
    pub fn set_judge_usage(&self, prompt: u64, completion: u64) {
        self.script.lock().unwrap().judge_usage = Some((prompt, completion));
    }

    pub fn release_holds(&self) {
        self.script.lock().unwrap().hold = None;
    }

    /// Every chat request body received so far (title-generator requests excluded), in order.
    pub fn requests(&self) -> Vec<Value> {
        self.script.lock().unwrap().requests.clone()
    }

    /// The `Authorization` header of each request in [`requests`](Self::requests).
    pub fn auth_headers(&self) -> Vec<Option<String>> {
        self.script.lock().unwrap().auth_headers.clone()
    }

    /// When each request in [`requests`](Self::requests) arrived.
    pub fn request_times(&self) -> Vec<Instant> {
        self.script.lock().unwrap().request_times.clone()
    }

    /// The next answer to the threat check (else a clear verdict).
    pub fn push_verdict(&self, reply: Reply) {
        self.script.lock().unwrap().verdicts.push_back(reply);
    }

    /// Every threat-check request body received so far, in order.
    pub fn judge_requests(&self) -> Vec<Value> {
        self.script.lock().unwrap().judge_requests.clone()
    }

    /// The `Authorization` header of each request in [`judge_requests`](Self::judge_requests).
    pub fn judge_auth_headers(&self) -> Vec<Option<String>> {
        self.script.lock().unwrap().judge_auth.clone()
    }

    pub fn title_requests(&self) -> usize {
        self.script.lock().unwrap().title_requests
    }

    /// The `opencode-config` fragment that points OpenCode at this server as provider `fake`.
    pub fn opencode_config(&self) -> Value {
        json!({
            "model": "fake/fake-model",
            "small_model": "fake/fake-model",
            "enabled_providers": ["fake"],
            "provider": {"fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": self.base_url(), "apiKey": "sk-fake"},
                "models": {"fake-model": {"name": "Fake", "tool_call": true,
                    "limit": {"context": 128000, "output": 4096}}}
            }},
            "permission": "allow"
        })
    }
}

/// All text of a request's messages, flattened (content may be a string or an array of parts).
pub fn request_text(body: &Value) -> String {
    let mut out = String::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        collect_text(&m["content"], &mut out);
        for call in m["tool_calls"].as_array().into_iter().flatten() {
            out.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            out.push('\n');
        }
    }
    out
}

fn collect_text(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|i| collect_text(i, out)),
        Value::Object(o) => {
            if let Some(t) = o.get("text") {
                collect_text(t, out);
            }
        }
        _ => {}
    }
}

/// A clear verdict, as the threat check asks for it.
pub const CLEAR_VERDICT: &str =
    r#"{"prompt_injection": false, "secret_leak": false, "malicious_patch": false, "reasons": []}"#;

/// The system prompt fro-bot's threat check starts with (`threat::judge::MARKER`).
fn is_judge_request(body: &Value) -> bool {
    body["messages"][0]["role"] == "system"
        && body["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with(fro_bot::threat::judge::MARKER))
}

fn is_title_request(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .and_then(|m| m.first())
        .map(|first| {
            first["role"] == "system" && {
                let mut s = String::new();
                collect_text(&first["content"], &mut s);
                s.contains("title generator")
            }
        })
        .unwrap_or(false)
}

async fn chat(
    State(script): State<Arc<Mutex<Script>>>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Response<Body> {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if is_judge_request(&body) {
        let reply = {
            let mut s = script.lock().unwrap();
            s.judge_requests.push(body.clone());
            s.judge_auth.push(auth);
            s.verdicts
                .pop_front()
                .unwrap_or_else(|| Reply::text(CLEAR_VERDICT))
        };
        let usage = {
            let s = script.lock().unwrap();
            s.judge_usage.or(s.usage).unwrap_or((300, 20))
        };
        return respond(reply, false, usage).await;
    }
    let reply = {
        let mut s = script.lock().unwrap();
        if is_title_request(&body) {
            s.title_requests += 1;
            None
        } else {
            s.requests.push(body.clone());
            s.request_times.push(Instant::now());
            s.auth_headers.push(auth);
            Some(s.queue.pop_front().unwrap_or_else(|| s.default.clone()))
        }
    };
    if reply.is_some() {
        let since = Instant::now();
        while since.elapsed() < HOLD_LIMIT {
            let held = {
                let s = script.lock().unwrap();
                s.hold.as_ref().is_some_and(|wait| wait(&body, &s.requests))
            };
            if !held {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let reply = match reply {
        Some(Reply::Stepwise { first, then }) => {
            Some(*if first_step(&body) { first } else { then })
        }
        other => other,
    };
    let reply = match reply {
        Some(Reply::Echo { containing }) => Reply::Text(echo(&body, &containing)),
        Some(reply) => reply,
        None => Reply::text("Fake session title"),
    };
    let usage = script.lock().unwrap().usage.unwrap_or((120, 8));
    respond(reply, true, usage).await
}

/// Whether `body` asks for a turn's first step: its newest message is the user's.
fn first_step(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| m["role"] == "user")
}

/// The answer of [`Reply::Echo`] to `body`.
fn echo(body: &Value, containing: &str) -> String {
    let last_user = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"));
    let mut text = String::new();
    if let Some(m) = last_user {
        collect_text(&m["content"], &mut text);
    }
    // The request is the task (a trusted commenter's words) or the triggering comment; the first
    // of them: prior work quoted later may hold earlier prompts.
    let trigger = ["## Task", "### Triggering comment"]
        .iter()
        .find_map(|h| text.find(h))
        .map_or(text.as_str(), |at| &text[at..]);
    let word = trigger
        .split_whitespace()
        .find(|w| w.contains(containing))
        .unwrap_or("nothing");
    format!("Noted {word}.")
}

/// `reply` as an SSE stream, or (`stream: false`, the threat check's requests) as one chat
/// completion.
async fn respond(mut reply: Reply, stream: bool, usage: (u64, u64)) -> Response<Body> {
    loop {
        match reply {
            Reply::Delayed(d, inner) => {
                tokio::time::sleep(d).await;
                reply = *inner;
            }
            Reply::Error(e) => {
                let (status, body) = e.status_and_body();
                let mut resp = Response::builder()
                    .status(status)
                    .header(header::CONTENT_TYPE, "application/json");
                if e == LlmError::RateLimit {
                    resp = resp.header("retry-after-ms", "20");
                }
                return resp.body(Body::from(body.to_string())).unwrap();
            }
            Reply::Text(text) if !stream => return whole(&text, usage),
            Reply::Text(text) => {
                let mut chunks = text_chunks(&text);
                chunks.push(chunk(json!({}), Some("stop"), usage));
                return sse(chunks, false);
            }
            Reply::ToolCall { name, arguments } => {
                let mut chunks = call_chunks(&name, &arguments);
                chunks.push(chunk(json!({}), Some("tool_calls"), usage));
                return sse(chunks, false);
            }
            Reply::Narrated { text, call } => {
                let Reply::ToolCall { name, arguments } = *call else {
                    panic!("Reply::Narrated takes a Reply::ToolCall");
                };
                let mut chunks = text_chunks(&text);
                chunks.extend(call_chunks(&name, &arguments));
                chunks.push(chunk(json!({}), Some("tool_calls"), usage));
                return sse(chunks, false);
            }
            // Resolved from the request in `chat`.
            Reply::Echo { .. } => return sse(vec![chunk(json!({}), Some("stop"), usage)], false),
            Reply::Stepwise { first, .. } => reply = *first,
            Reply::Stall => {
                let chunks = vec![chunk(
                    json!({"role": "assistant", "content": "Thinking"}),
                    None,
                    usage,
                )];
                return sse(chunks, true);
            }
            Reply::StallReporting => {
                let mut c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                    "created": 1, "model": "fake-model",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Thinking"},
                        "finish_reason": null}]});
                c["usage"] = json!({"prompt_tokens": usage.0, "completion_tokens": usage.1,
                    "total_tokens": usage.0 + usage.1});
                return sse(vec![format!("data: {c}\n\n")], true);
            }
        }
    }
}

/// The deltas of streamed assistant text: several, as a real model streams.
fn text_chunks(text: &str) -> Vec<String> {
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        None,
        (0, 0),
    )];
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(16);
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        chunks.push(chunk(json!({"content": &rest[..cut]}), None, (0, 0)));
        rest = &rest[cut..];
    }
    chunks
}

/// The deltas of one streamed tool call, its arguments split in two.
fn call_chunks(name: &str, arguments: &Value) -> Vec<String> {
    let args = arguments.to_string();
    let id = format!("call_{}", rand::random::<u32>());
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": id,
            "type": "function", "function": {"name": name, "arguments": ""}}]}),
        None,
        (0, 0),
    )];
    let mid = args.len() / 2;
    let split = (mid..=args.len())
        .find(|i| args.is_char_boundary(*i))
        .unwrap_or(args.len());
    for piece in [&args[..split], &args[split..]] {
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            None,
            (0, 0),
        ));
    }
    chunks
}

/// One chat completion holding `text`.
fn whole(text: &str, (prompt, completion): (u64, u64)) -> Response<Body> {
    let body = json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
        "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
            "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}});
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn chunk(delta: Value, finish: Option<&str>, (prompt, completion): (u64, u64)) -> String {
    let mut c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    if finish.is_some() {
        c["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion});
    }
    format!("data: {c}\n\n")
}

fn sse(chunks: Vec<String>, stall: bool) -> Response<Body> {
    let mut items: Vec<String> = chunks;
    if !stall {
        items.push("data: [DONE]\n\n".into());
    }
    let stream =
        futures_util::stream::unfold((items.into_iter(), stall), |(mut it, stall)| async move {
            match it.next() {
                Some(s) => Some((Ok::<_, std::io::Error>(s), (it, stall))),
                None if stall => {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    None
                }
                None => None,
            }
        });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap()
}
