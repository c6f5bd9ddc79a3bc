//! The session tools: `session_list`, `session_read`, `session_search` and `session_info` over
//! the running OpenCode server's HTTP API. Every failure is a `session store unavailable: ...`
//! result, never a crash. They reach every session, not OpenCode's first 100
//! (docs/persistence.md#every-thread-resumes): a listing asks for all of them, and a search says
//! when its bounds left older sessions unread and how to reach them.
//!
//! Trust follows memory (docs/security.md#trust-follows-memory): results from a session below the
//! run's trust are fenced and labelled as untrusted quotes, or, in runs that hold a token, left
//! out as if the session did not exist.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::args::{arg_str, arg_usize, required};
use super::{answered, failed};
use crate::opencode::client::{truncate, Client, Extent, Session};
use crate::opencode::prep::find_excerpts;
use crate::runner::env::{
    FRO_BOT_OPENCODE_PASSWORD, FRO_BOT_OPENCODE_URL, FRO_BOT_SESSION_TRUST, FRO_BOT_WORKSPACE,
};
use crate::runner::Env;
use crate::trust::{PriorUse, SessionTrust, TrustView};
use crate::untrusted::{Fence, Label};

pub const TRANSCRIPT_CAP: usize = 48_000;
/// Sessions one `session_search` reads at most, newest first.
const SEARCHED_SESSIONS: usize = 200;
/// How long one `session_search` reads sessions.
const SEARCH_TIME: Duration = Duration::from_secs(20);

/// The tools' names, for the dispatcher.
pub const NAMES: &[&str] = &[
    "session_list",
    "session_read",
    "session_search",
    "session_info",
];

/// Where the tools find the server, and how they judge earlier sessions.
#[derive(Debug, Clone)]
pub struct SessionTools {
    pub url: Option<String>,
    pub password: Option<String>,
    pub workspace: PathBuf,
    /// How earlier sessions are judged.
    pub trust: TrustSource,
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

/// The trust view named by `FRO_BOT_SESSION_TRUST`: unset, every session is an untrusted quote;
/// set but unreadable, every session is left out (fail closed).
fn trust_from_env(env: &Env) -> TrustSource {
    match env.get(FRO_BOT_SESSION_TRUST) {
        Some(path) => TrustSource::File(PathBuf::from(path)),
        None => TrustSource::Fixed(TrustView::unknown()),
    }
}

impl SessionTools {
    pub fn from_env(env: &Env) -> Self {
        Self {
            trust: trust_from_env(env),
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

pub fn definitions() -> Vec<Value> {
    vec![
        json!({"name": "session_list",
         "description": "List earlier OpenCode sessions of this repository (newest first), with id, title and times.",
         "inputSchema": {"type": "object", "properties": {
             "limit": {"type": "integer", "description": "Maximum sessions (default 20)"},
             "from_date": {"type": "string", "description": "Only sessions updated on/after this date (YYYY-MM-DD or RFC 3339)"},
             "to_date": {"type": "string", "description": "Only sessions updated on/before this date (YYYY-MM-DD or RFC 3339)"}}}}),
        json!({"name": "session_read",
         "description": "Read a session's transcript (capped at 48,000 characters; newest messages kept).",
         "inputSchema": {"type": "object", "required": ["session_id"], "properties": {
             "session_id": {"type": "string"},
             "limit": {"type": "integer", "description": "Only the newest N messages"}}}}),
        json!({"name": "session_search",
         "description": "Search earlier sessions' messages for text (newest sessions first); returns excerpts naming the session id.",
         "inputSchema": {"type": "object", "required": ["query"], "properties": {
             "query": {"type": "string"},
             "session_id": {"type": "string", "description": "Search only this session"},
             "from_date": {"type": "string", "description": "Only sessions updated on/after this date (YYYY-MM-DD or RFC 3339)"},
             "to_date": {"type": "string", "description": "Only sessions updated on/before this date (YYYY-MM-DD or RFC 3339)"},
             "case_sensitive": {"type": "boolean"},
             "limit": {"type": "integer", "description": "Maximum excerpts (default 10)"}}}}),
        json!({"name": "session_info",
         "description": "Metadata of one session: title, directory, times, parent, message count, tokens and cost.",
         "inputSchema": {"type": "object", "required": ["session_id"], "properties": {
             "session_id": {"type": "string"}}}}),
    ]
}

impl SessionTools {
    /// One session tool's result, as the MCP `tools/call` answer.
    pub async fn call(&self, name: &str, args: &Value) -> Value {
        let trust = self.trust.view();
        let result = match self.client() {
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
            Ok(text) => answered(&text),
            Err(e) => failed(&format!(
                "session store unavailable: {}",
                crate::runner::log::redact(&e)
            )),
        }
    }
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

pub use crate::runner::format_ms;

/// The `from_date` / `to_date` arguments: the range of `time.updated` (epoch ms) asked for.
#[derive(Debug, Clone, Copy)]
struct Dates {
    from: Option<i64>,
    to: Option<i64>,
}

impl Dates {
    fn of(args: &Value) -> Result<Self, String> {
        let from = match arg_str(args, "from_date") {
            Some(s) => Some(parse_date_ms(s, false).ok_or_else(|| format!("bad from_date {s:?}"))?),
            None => None,
        };
        let to = match arg_str(args, "to_date") {
            Some(s) => Some(parse_date_ms(s, true).ok_or_else(|| format!("bad to_date {s:?}"))?),
            None => None,
        };
        Ok(Self { from, to })
    }

    fn hold(&self, s: &Session) -> bool {
        self.from.is_none_or(|f| s.time.updated >= f) && self.to.is_none_or(|t| s.time.updated <= t)
    }
}

/// Every session listed in `dates` that `trust` lets the agent see, newest first; and whether
/// memory held more than a listing gives.
async fn visible_sessions(
    client: &Client,
    trust: &TrustView,
    dates: Dates,
) -> Result<(Vec<Session>, Extent), String> {
    let listing = client.list_sessions().await.map_err(|e| e.to_string())?;
    let mut sessions = listing.sessions;
    sessions.retain(|s| dates.hold(s) && trust.judge(&s.id) != PriorUse::Withheld);
    sessions.sort_by_key(|s| std::cmp::Reverse(s.time.updated));
    Ok((sessions, listing.extent))
}

async fn session_list(client: &Client, trust: &TrustView, args: &Value) -> Result<String, String> {
    let limit = arg_usize(args, "limit").unwrap_or(20).clamp(1, 200);
    let (sessions, extent) = visible_sessions(client, trust, Dates::of(args)?).await?;
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
    if let Extent::Capped { cap } = extent {
        out.push(format!(
            "(memory holds more than {cap} sessions: only the newest {cap} can be listed)"
        ));
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
    let (sessions, extent) = match arg_str(args, "session_id") {
        Some(id) => {
            visible(trust, id)?;
            let one = client.get_session(id).await.map_err(|e| e.to_string())?;
            (vec![one], Extent::Complete)
        }
        None => visible_sessions(client, trust, Dates::of(args)?).await?,
    };
    let search = Search {
        query,
        limit,
        case_sensitive,
    };
    let (hits, read) = search.run(client, trust, &sessions).await;
    let mut out = match hits.is_empty() {
        true => format!("No matches for {query:?}."),
        false => hits.join("\n"),
    };
    if hits.len() < limit && read < sessions.len() {
        out.push_str(&format!(
            "\n(searched the newest {read} of {} sessions; give from_date/to_date or session_id \
             to search older ones)",
            sessions.len()
        ));
    }
    if let Extent::Capped { cap } = extent {
        out.push_str(&format!(
            "\n(memory holds more than {cap} sessions: only the newest {cap} can be searched \
             without session_id)"
        ));
    }
    Ok(out)
}

/// One `session_search`: what to look for and how many excerpts to return.
struct Search<'a> {
    query: &'a str,
    limit: usize,
    case_sensitive: bool,
}

impl Search<'_> {
    /// Excerpts from `sessions` in order, until the limit, [`SEARCHED_SESSIONS`] or
    /// [`SEARCH_TIME`]; and how many sessions were read.
    async fn run(
        &self,
        client: &Client,
        trust: &TrustView,
        sessions: &[Session],
    ) -> (Vec<String>, usize) {
        let deadline = Instant::now() + SEARCH_TIME;
        let mut hits = Vec::new();
        let mut read = 0;
        for s in sessions.iter().take(SEARCHED_SESSIONS) {
            if hits.len() >= self.limit || Instant::now() >= deadline {
                break;
            }
            read += 1;
            let judged = trust.judge(&s.id);
            let Ok(msgs) = client.messages(&s.id, None).await else {
                continue;
            };
            let text = msgs.iter().map(|m| m.text()).collect::<Vec<_>>().join("\n");
            let excerpts = if self.case_sensitive {
                find_exact(&text, self.query, self.limit - hits.len())
            } else {
                find_excerpts(&text, &[self.query.to_string()], self.limit - hits.len())
            };
            for e in excerpts {
                hits.push(match &judged {
                    PriorUse::Untrusted(_) => {
                        quote(&judged, &format!("excerpt of session {}", s.id), &e)
                    }
                    PriorUse::Trusted(_) | PriorUse::Withheld => {
                        format!("{} ({}): {e}", s.id, s.title)
                    }
                });
            }
        }
        (hits, read)
    }
}

fn find_exact(text: &str, query: &str, max: usize) -> Vec<String> {
    text.match_indices(query)
        .take(max)
        .map(|(i, m)| {
            let mut a = i.saturating_sub(crate::opencode::prep::EXCERPT_CONTEXT);
            while !text.is_char_boundary(a) {
                a -= 1;
            }
            let mut b = (i + m.len() + crate::opencode::prep::EXCERPT_CONTEXT).min(text.len());
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
    let mut tokens = crate::opencode::client::Tokens::default();
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
