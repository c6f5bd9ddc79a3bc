//! `fro-bot session-tools`: an MCP server over stdio (JSON-RPC 2.0, one message per line) that
//! OpenCode starts for the agent, giving it `session_list`, `session_read`, `session_search` and
//! `session_info` over the running OpenCode server's HTTP API. Every tool failure is a
//! `session store unavailable: ...` text result with `isError: true`, never a crash.
//!
//! Trust follows memory (docs/security.md#trust-follows-memory): results from a session below the
//! run's trust are fenced and labelled as untrusted quotes, or, in runs that hold a token, left
//! out as if the session did not exist.

use std::path::PathBuf;

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use super::client::{truncate, Client, Session};
use super::prep::find_excerpts;
use crate::runner::env::{
    FRO_BOT_OPENCODE_PASSWORD, FRO_BOT_OPENCODE_URL, FRO_BOT_OUTPUT_POLICY, FRO_BOT_PROPOSALS,
    FRO_BOT_SESSION_TRUST, FRO_BOT_WORKSPACE,
};
use crate::runner::Env;
use crate::safe_outputs::tools::{self as proposal_tools, ProposalTools};
use crate::trust::{PriorUse, SessionTrust, TrustView};
use crate::untrusted::{Fence, Label};

pub const TRANSCRIPT_CAP: usize = 48_000;
const PROTOCOL_VERSION: &str = "2024-11-05";

#[derive(Debug, thiserror::Error)]
pub enum SessionToolsError {
    #[error("cannot read MCP requests from stdin")]
    Read {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write MCP responses to stdout")]
    Write {
        #[source]
        source: std::io::Error,
    },
}

/// Where the tools find the server.
#[derive(Debug, Clone)]
pub struct ToolsConfig {
    pub url: Option<String>,
    pub password: Option<String>,
    pub workspace: PathBuf,
    /// How earlier sessions are judged.
    pub trust: TrustSource,
    /// The proposal tools (`crate::safe_outputs::tools`); `None`: not offered.
    pub proposals: Option<ProposalTools>,
}

/// Where the tools' trust view comes from.
#[derive(Debug, Clone)]
pub enum TrustSource {
    /// This view, always.
    Fixed(TrustView),
    /// The file fro-bot keeps current (`FRO_BOT_SESSION_TRUST`), read at every call: OpenCode may
    /// start the tools before the run's own session exists, and the file gains it after.
    File(PathBuf),
}

impl TrustSource {
    /// The view for one call; a file that cannot be read leaves every session out (fail closed).
    fn view(&self) -> TrustView {
        match self {
            TrustSource::Fixed(view) => view.clone(),
            TrustSource::File(path) => {
                match std::fs::read(path).map(|b| serde_json::from_slice::<TrustView>(&b)) {
                    Ok(Ok(view)) => view,
                    Ok(Err(_)) | Err(_) => TrustView::closed(),
                }
            }
        }
    }
}

/// Writes `view` where the session tools read it: a root-owned (fro-bot's) file the agent's uid
/// can read but not change. It lives as long as the returned handle.
pub fn write_trust_file(view: &TrustView) -> std::io::Result<tempfile::NamedTempFile> {
    crate::confine::agent_readable_json("fro-bot-trust-", view)
}

/// The trust view named by `FRO_BOT_SESSION_TRUST`: unset, every session is an untrusted quote;
/// set but unreadable, every session is left out (fail closed).
fn trust_from_env(env: &Env) -> TrustSource {
    match env.get(FRO_BOT_SESSION_TRUST) {
        Some(path) => TrustSource::File(PathBuf::from(path)),
        None => TrustSource::Fixed(TrustView::unknown()),
    }
}

impl ToolsConfig {
    pub fn from_env(env: &Env) -> Self {
        Self {
            trust: trust_from_env(env),
            proposals: env.get(FRO_BOT_PROPOSALS).map(|file| ProposalTools {
                file: PathBuf::from(file),
                policy: env.get(FRO_BOT_OUTPUT_POLICY).map(PathBuf::from),
            }),
            url: env.get(FRO_BOT_OPENCODE_URL).map(str::to_string),
            password: env.get(FRO_BOT_OPENCODE_PASSWORD).map(str::to_string),
            workspace: env
                .get(FRO_BOT_WORKSPACE)
                .map(PathBuf::from)
                .or_else(|| std::env::current_dir().ok())
                .unwrap_or_else(|| PathBuf::from(".")),
        }
    }

    fn client(&self) -> Result<Client, String> {
        let url = self
            .url
            .as_deref()
            .ok_or_else(|| format!("{FRO_BOT_OPENCODE_URL} is not set"))?;
        Client::new(
            url,
            self.password.as_deref(),
            &self.workspace.to_string_lossy(),
        )
        .map_err(|e| e.to_string())
    }
}

/// Serves stdin/stdout of this process until stdin closes.
pub async fn serve_stdio(config: ToolsConfig) -> Result<(), SessionToolsError> {
    // tokio's `io-std` feature is not enabled: async files over duplicates of fds 0 and 1.
    use std::os::fd::AsFd;
    let dup = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(|owned| tokio::fs::File::from_std(std::fs::File::from(owned)))
    };
    let stdin =
        dup(std::io::stdin().as_fd()).map_err(|source| SessionToolsError::Read { source })?;
    let stdout =
        dup(std::io::stdout().as_fd()).map_err(|source| SessionToolsError::Write { source })?;
    serve(config, tokio::io::BufReader::new(stdin), stdout).await
}

pub async fn serve<R, W>(
    config: ToolsConfig,
    input: R,
    mut output: W,
) -> Result<(), SessionToolsError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = input.lines();
    while let Some(line) = lines
        .next_line()
        .await
        .map_err(|source| SessionToolsError::Read { source })?
    {
        if line.trim().is_empty() {
            continue;
        }
        let Some(reply) = handle_line(&config, &line).await else {
            continue;
        };
        let mut bytes = reply.to_string().into_bytes();
        bytes.push(b'\n');
        output
            .write_all(&bytes)
            .await
            .map_err(|source| SessionToolsError::Write { source })?;
        output
            .flush()
            .await
            .map_err(|source| SessionToolsError::Write { source })?;
    }
    Ok(())
}

/// One JSON-RPC message in, at most one out (notifications get none).
pub async fn handle_line(config: &ToolsConfig, line: &str) -> Option<Value> {
    let msg: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return Some(rpc_error(Value::Null, -32700, &format!("parse error: {e}"))),
    };
    let id = msg.get("id").cloned();
    let method = msg["method"].as_str().unwrap_or("");
    let Some(id) = id else {
        return None; // notification (notifications/initialized, cancelled, ...)
    };
    let result = match method {
        "initialize" => json!({
            "protocolVersion": msg["params"]["protocolVersion"].as_str().unwrap_or(PROTOCOL_VERSION),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fro-bot-sessions", "version": env!("CARGO_PKG_VERSION")}
        }),
        "ping" => json!({}),
        "tools/list" => {
            let mut tools = tool_definitions();
            if config.proposals.is_some() {
                if let Value::Array(list) = &mut tools {
                    list.extend(proposal_tools::definitions());
                }
            }
            json!({ "tools": tools })
        }
        "tools/call" => {
            let name = msg["params"]["name"].as_str().unwrap_or("");
            let args = msg["params"]["arguments"].clone();
            call_tool(config, name, &args).await
        }
        _ => {
            return Some(rpc_error(
                id,
                -32601,
                &format!("method not found: {method}"),
            ))
        }
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn tool_definitions() -> Value {
    json!([
        {"name": "session_list",
         "description": "List earlier OpenCode sessions of this repository (newest first), with id, title and times.",
         "inputSchema": {"type": "object", "properties": {
             "limit": {"type": "integer", "description": "Maximum sessions (default 20)"},
             "from_date": {"type": "string", "description": "Only sessions updated on/after this date (YYYY-MM-DD or RFC 3339)"},
             "to_date": {"type": "string", "description": "Only sessions updated on/before this date (YYYY-MM-DD or RFC 3339)"}}}},
        {"name": "session_read",
         "description": "Read a session's transcript (capped at 48,000 characters; newest messages kept).",
         "inputSchema": {"type": "object", "required": ["session_id"], "properties": {
             "session_id": {"type": "string"},
             "limit": {"type": "integer", "description": "Only the newest N messages"}}}},
        {"name": "session_search",
         "description": "Search earlier sessions' messages for text; returns excerpts naming the session id.",
         "inputSchema": {"type": "object", "required": ["query"], "properties": {
             "query": {"type": "string"},
             "session_id": {"type": "string", "description": "Search only this session"},
             "case_sensitive": {"type": "boolean"},
             "limit": {"type": "integer", "description": "Maximum excerpts (default 10)"}}}},
        {"name": "session_info",
         "description": "Metadata of one session: title, directory, times, parent, message count, tokens and cost.",
         "inputSchema": {"type": "object", "required": ["session_id"], "properties": {
             "session_id": {"type": "string"}}}}
    ])
}

async fn call_tool(config: &ToolsConfig, name: &str, args: &Value) -> Value {
    if let Some(tools) = config
        .proposals
        .as_ref()
        .filter(|_| proposal_tools::NAMES.contains(&name))
    {
        return match tools.call(name, args) {
            Ok(text) => json!({"content": [{"type": "text", "text": text}], "isError": false}),
            Err(e) => json!({"content": [{"type": "text", "text": e}], "isError": true}),
        };
    }
    let trust = config.trust.view();
    let result = match config.client() {
        Err(e) => Err(e),
        Ok(client) => match name {
            "session_list" => session_list(&client, &trust, args).await,
            "session_read" => session_read(&client, &trust, args).await,
            "session_search" => session_search(&client, &trust, args).await,
            "session_info" => session_info(&client, &trust, args).await,
            other => Err(format!("unknown tool {other:?}")),
        },
    };
    match result {
        Ok(text) => json!({"content": [{"type": "text", "text": text}], "isError": false}),
        Err(e) => json!({"content": [{"type": "text",
            "text": format!("session store unavailable: {}", crate::runner::log::redact(&e))}],
            "isError": true}),
    }
}

fn arg_usize(args: &Value, name: &str) -> Option<usize> {
    match &args[name] {
        Value::Number(n) => n.as_u64().map(|n| n as usize),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn arg_str<'a>(args: &'a Value, name: &str) -> Option<&'a str> {
    args[name].as_str().map(str::trim).filter(|s| !s.is_empty())
}

fn required<'a>(args: &'a Value, name: &str) -> Result<&'a str, String> {
    arg_str(args, name).ok_or_else(|| format!("missing required argument {name:?}"))
}

/// `YYYY-MM-DD` or an RFC 3339 timestamp → epoch ms. `end_of_day` for an inclusive upper bound.
pub fn parse_date_ms(s: &str, end_of_day: bool) -> Option<i64> {
    let s = s.trim();
    let date = s.get(..10)?;
    let mut it = date.split('-');
    let (y, m, d): (i64, i64, i64) = (
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let mut ms = days * 86_400_000;
    let rest = &s[10..];
    if rest.len() >= 9 && (rest.starts_with('T') || rest.starts_with(' ')) {
        let hh: i64 = rest.get(1..3)?.parse().ok()?;
        let mm: i64 = rest.get(4..6)?.parse().ok()?;
        let ss: i64 = rest.get(7..9)?.parse().ok()?;
        ms += ((hh * 60 + mm) * 60 + ss) * 1000;
    } else if end_of_day {
        ms += 86_400_000 - 1;
    }
    Some(ms)
}

fn session_line(s: &Session, untrusted: Option<&SessionTrust>) -> String {
    let title = match untrusted {
        // A title is text like any other: one line, no hidden characters, labelled.
        Some(t) => format!(
            "untrusted (written after reading @{} {}): {}",
            t.author,
            t.association_label(),
            one_line(&s.title)
        ),
        None => s.title.clone(),
    };
    let mut line = format!(
        "{} | {} | updated {} | created {}",
        s.id,
        title,
        format_ms(s.time.updated),
        format_ms(s.time.created)
    );
    if s.time.archived.is_some() {
        line.push_str(" | archived");
    }
    if let Some(p) = &s.parent_id {
        line.push_str(&format!(" | child of {p}"));
    }
    line
}

/// Epoch ms → `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

async fn session_list(client: &Client, trust: &TrustView, args: &Value) -> Result<String, String> {
    let limit = arg_usize(args, "limit").unwrap_or(20).clamp(1, 200);
    let from = match arg_str(args, "from_date") {
        Some(s) => Some(parse_date_ms(s, false).ok_or_else(|| format!("bad from_date {s:?}"))?),
        None => None,
    };
    let to = match arg_str(args, "to_date") {
        Some(s) => Some(parse_date_ms(s, true).ok_or_else(|| format!("bad to_date {s:?}"))?),
        None => None,
    };
    let mut sessions = client.list_sessions().await.map_err(|e| e.to_string())?;
    sessions.retain(|s| {
        from.is_none_or(|f| s.time.updated >= f)
            && to.is_none_or(|t| s.time.updated <= t)
            && trust.judge(&s.id) != PriorUse::Withheld
    });
    sessions.sort_by_key(|s| std::cmp::Reverse(s.time.updated));
    if sessions.is_empty() {
        return Ok("No sessions found.".into());
    }
    let total = sessions.len();
    let mut out: Vec<String> = sessions
        .iter()
        .take(limit)
        .map(|s| match trust.judge(&s.id) {
            PriorUse::Untrusted(t) => session_line(s, Some(&t)),
            PriorUse::Trusted(_) | PriorUse::Withheld => session_line(s, None),
        })
        .collect();
    if total > limit {
        out.push(format!("({} more not shown)", total - limit));
    }
    Ok(out.join("\n"))
}

async fn session_read(client: &Client, trust: &TrustView, args: &Value) -> Result<String, String> {
    let id = required(args, "session_id")?;
    let judged = visible(trust, id)?;
    let limit = arg_usize(args, "limit");
    let msgs = client
        .messages(id, limit)
        .await
        .map_err(|e| e.to_string())?;
    let mut blocks: Vec<String> = msgs
        .iter()
        .map(|m| {
            format!(
                "[{} {}]\n{}",
                m.info.role,
                format_ms(m.info.time.created),
                m.text()
            )
        })
        .collect();
    // Over the cap: keep the newest messages, say what was left out.
    let mut total: usize = blocks.iter().map(|b| b.len() + 2).sum();
    let mut dropped = 0;
    while total > TRANSCRIPT_CAP && blocks.len() > 1 {
        total -= blocks[0].len() + 2;
        blocks.remove(0);
        dropped += 1;
    }
    let mut text = blocks.join("\n\n");
    if dropped > 0 {
        text = format!("({dropped} older messages omitted)\n\n{text}");
    }
    if text.len() > TRANSCRIPT_CAP {
        text = truncate(&text, TRANSCRIPT_CAP - 3);
    }
    if text.is_empty() {
        text = "The session has no messages.".into();
    }
    Ok(quote(
        &judged,
        &format!("transcript of session {id}"),
        &text,
    ))
}

/// A session's judgement, or the error a withheld one gets (the same as a session that does
/// not exist would, so the result does not confirm it).
fn visible(trust: &TrustView, id: &str) -> Result<PriorUse, String> {
    match trust.judge(id) {
        PriorUse::Withheld => Err(format!("session {id} not found")),
        judged => Ok(judged),
    }
}

/// `text` as the agent gets it: as it is from a trusted session, else inside a fresh fence,
/// labelled with who lowered the session's trust.
fn quote(judged: &PriorUse, item: &str, text: &str) -> String {
    match judged {
        PriorUse::Untrusted(t) => {
            let fence = Fence::default();
            format!(
                "{}{}",
                fence.preamble(),
                fence.wrap(
                    &Label {
                        item: &format!("untrusted {item}"),
                        author: &t.author,
                        association: t.association_label(),
                    },
                    text,
                )
            )
        }
        PriorUse::Trusted(_) | PriorUse::Withheld => text.to_string(),
    }
}

fn one_line(s: &str) -> String {
    crate::untrusted::strip_hidden(s)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect()
}

async fn session_search(
    client: &Client,
    trust: &TrustView,
    args: &Value,
) -> Result<String, String> {
    let query = required(args, "query")?;
    let limit = arg_usize(args, "limit").unwrap_or(10).clamp(1, 100);
    let case_sensitive = args["case_sensitive"].as_bool().unwrap_or(false);
    let sessions: Vec<Session> = match arg_str(args, "session_id") {
        Some(id) => {
            visible(trust, id)?;
            vec![client.get_session(id).await.map_err(|e| e.to_string())?]
        }
        None => {
            let mut all = client.list_sessions().await.map_err(|e| e.to_string())?;
            all.retain(|s| trust.judge(&s.id) != PriorUse::Withheld);
            all.sort_by_key(|s| std::cmp::Reverse(s.time.updated));
            all
        }
    };
    let mut hits = Vec::new();
    for s in sessions.iter().take(200) {
        if hits.len() >= limit {
            break;
        }
        let judged = trust.judge(&s.id);
        let Ok(msgs) = client.messages(&s.id, None).await else {
            continue;
        };
        let text = msgs.iter().map(|m| m.text()).collect::<Vec<_>>().join("\n");
        let excerpts = if case_sensitive {
            find_exact(&text, query, limit - hits.len())
        } else {
            find_excerpts(&text, &[query.to_string()], limit - hits.len())
        };
        for e in excerpts {
            hits.push(match &judged {
                PriorUse::Untrusted(_) => {
                    quote(&judged, &format!("excerpt of session {}", s.id), &e)
                }
                PriorUse::Trusted(_) | PriorUse::Withheld => format!("{} ({}): {e}", s.id, s.title),
            });
        }
    }
    if hits.is_empty() {
        return Ok(format!("No matches for {query:?}."));
    }
    Ok(hits.join("\n"))
}

fn find_exact(text: &str, query: &str, max: usize) -> Vec<String> {
    text.match_indices(query)
        .take(max)
        .map(|(i, m)| {
            let mut a = i.saturating_sub(super::prep::EXCERPT_CONTEXT);
            while !text.is_char_boundary(a) {
                a -= 1;
            }
            let mut b = (i + m.len() + super::prep::EXCERPT_CONTEXT).min(text.len());
            while !text.is_char_boundary(b) {
                b += 1;
            }
            text[a..b].split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .collect()
}

async fn session_info(client: &Client, trust: &TrustView, args: &Value) -> Result<String, String> {
    let id = required(args, "session_id")?;
    let judged = visible(trust, id)?;
    let s = client.get_session(id).await.map_err(|e| e.to_string())?;
    let msgs = client.messages(id, None).await.map_err(|e| e.to_string())?;
    let mut tokens = super::client::Tokens::default();
    let mut cost = 0.0;
    for m in &msgs {
        if let Some(t) = &m.info.tokens {
            tokens.add(t);
        }
        cost += m.info.cost.unwrap_or(0.0);
    }
    Ok(json!({
        "id": s.id,
        "title": s.title,
        "directory": s.directory,
        "parent_id": s.parent_id,
        "created": format_ms(s.time.created),
        "updated": format_ms(s.time.updated),
        "archived": s.time.archived.map(format_ms),
        "messages": msgs.len(),
        "tokens": tokens,
        "cost": cost,
        "trust": match &judged {
            PriorUse::Trusted(t) => json!({"trusted": true, "author": t.author,
                "association": t.association_label()}),
            PriorUse::Untrusted(t) => json!({"trusted": false, "author": t.author,
                "association": t.association_label()}),
            PriorUse::Withheld => Value::Null,
        },
    })
    .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable_config() -> ToolsConfig {
        ToolsConfig {
            // Port 9 on loopback: nothing listens, connections are refused at once.
            url: Some("http://127.0.0.1:9".into()),
            password: None,
            workspace: "/ws".into(),
            trust: TrustSource::Fixed(TrustView::unknown()),
            proposals: None,
        }
    }

    #[tokio::test]
    async fn protocol_round_trip_and_failures_are_tool_results() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"session_search","arguments":{"query":"x"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#,
            "\n",
            "not json\n",
            r#"{"jsonrpc":"2.0","id":5,"method":"nope"}"#,
            "\n",
        );
        let mut out = Vec::new();
        serve(unreachable_config(), input.as_bytes(), &mut out)
            .await
            .unwrap();
        let replies: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(replies.len(), 6, "the notification gets no reply");
        assert_eq!(replies[0]["result"]["protocolVersion"], "2025-06-18");
        assert!(replies[0]["result"]["capabilities"]["tools"].is_object());
        let names: Vec<&str> = replies[1]["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "session_list",
                "session_read",
                "session_search",
                "session_info"
            ]
        );
        assert_eq!(replies[2]["id"], 3);
        assert_eq!(replies[2]["result"]["isError"], true);
        assert!(replies[2]["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("session store unavailable: "));
        assert_eq!(replies[3]["result"], json!({}));
        assert_eq!(replies[4]["error"]["code"], -32700);
        assert_eq!(replies[5]["error"]["code"], -32601);
    }

    #[tokio::test]
    async fn missing_url_and_arguments_are_reported_not_crashed() {
        let cfg = ToolsConfig {
            url: None,
            password: None,
            workspace: "/ws".into(),
            trust: TrustSource::Fixed(TrustView::unknown()),
            proposals: None,
        };
        let r = call_tool(&cfg, "session_list", &json!({})).await;
        assert_eq!(r["isError"], true);
        assert!(r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("FRO_BOT_OPENCODE_URL"));
    }

    #[test]
    fn dates_round_trip() {
        let ms = parse_date_ms("2026-11-29", false).unwrap();
        assert_eq!(format_ms(ms), "2026-11-29T00:00:00Z");
        assert_eq!(
            format_ms(parse_date_ms("2026-11-29", true).unwrap()),
            "2026-11-29T23:59:59Z"
        );
        assert_eq!(
            format_ms(parse_date_ms("2024-02-29T13:14:15Z", false).unwrap()),
            "2024-02-29T13:14:15Z"
        );
        assert_eq!(format_ms(0), "1970-01-01T00:00:00Z");
        assert!(parse_date_ms("yesterday", false).is_none());
        assert!(parse_date_ms("2026-13-01", false).is_none());
    }
}
