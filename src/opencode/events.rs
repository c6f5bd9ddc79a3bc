//! Reader for OpenCode's `/event` server-sent events: `data: {"id","type","properties"}` frames.
//! Tolerant: comments, `event:`/`id:`/`retry:` fields, heartbeats, unknown types and unparseable
//! frames are skipped or passed through; reconnecting is the caller's decision (see `turn.rs`).

use bytes::BytesMut;
use serde::Deserialize;
use serde_json::Value;

use super::error::{ApiError, NamedError};

/// One event of OpenCode's bus, parsed into what fro-bot acts on; everything else is `Other`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The first frame of every subscription.
    ServerConnected,
    SessionIdle {
        session_id: String,
    },
    /// A session's turn failed; `error` is absent when OpenCode sent one we cannot read.
    SessionError {
        session_id: Option<String>,
        error: Option<NamedError>,
    },
    SessionStatus {
        session_id: String,
        status: SessionStatus,
    },
    /// A message was created or changed; its role tells the user's prompt from the agent's answer.
    MessageUpdated {
        session_id: String,
        message_id: String,
        role: String,
    },
    /// A part of a message was created or changed (text, a tool call, a step boundary).
    PartUpdated {
        session_id: String,
        message_id: String,
        part: Part,
    },
    /// The session's todo list, whole, after the agent changed it.
    TodoUpdated {
        session_id: String,
        todos: Vec<Todo>,
    },
    /// Any other type, kept by name (and session, when it names one) for logging and new uses.
    Other {
        kind: String,
        session_id: Option<String>,
    },
}

/// `session.status`'s `status`.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionStatus {
    Idle,
    Busy,
    /// OpenCode is waiting to retry a failed model call; `message` says why (quota, rate limit...),
    /// `attempt` counts the failed calls so far (1 for the first retry).
    Retry {
        message: String,
        attempt: u64,
    },
    Other {
        kind: String,
    },
}

/// One part of a message, as far as progress reporting reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text {
        id: String,
        text: String,
        /// OpenCode stamps `time.end` when the text is complete.
        done: bool,
    },
    Tool {
        call_id: String,
        tool: String,
        status: ToolStatus,
        /// What the tool call does, in OpenCode's words (`state.title`, else the input's
        /// `description`).
        title: Option<String>,
    },
    StepStart,
    StepFinish,
    Other {
        kind: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolStatus {
    Pending,
    Running,
    Completed,
    Error { message: String },
    Other { kind: String },
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Todo {
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub status: String,
}

/// The wire form: `{"type": ..., "properties": {...}}`.
#[derive(Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    properties: Value,
}

impl Event {
    /// The `sessionID` the event is about, when it names one.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Event::ServerConnected => None,
            Event::SessionIdle { session_id }
            | Event::SessionStatus { session_id, .. }
            | Event::MessageUpdated { session_id, .. }
            | Event::PartUpdated { session_id, .. }
            | Event::TodoUpdated { session_id, .. } => Some(session_id),
            Event::SessionError { session_id, .. } | Event::Other { session_id, .. } => {
                session_id.as_deref()
            }
        }
    }

    fn from_raw(raw: RawEvent) -> Self {
        let p = &raw.properties;
        let session_id = p["sessionID"]
            .as_str()
            .or_else(|| p["info"]["sessionID"].as_str())
            .map(str::to_string);
        match (raw.kind.as_str(), session_id) {
            ("server.connected", _) => Event::ServerConnected,
            ("session.idle", Some(session_id)) => Event::SessionIdle { session_id },
            ("session.error", session_id) => Event::SessionError {
                session_id,
                error: serde_json::from_value(p["error"].clone()).ok(),
            },
            ("session.status", Some(session_id)) => Event::SessionStatus {
                session_id,
                status: SessionStatus::from_value(&p["status"]),
            },
            ("message.updated", Some(session_id)) => Event::MessageUpdated {
                session_id,
                message_id: str_at(&p["info"]["id"]),
                role: str_at(&p["info"]["role"]),
            },
            ("message.part.updated", Some(session_id)) => Event::PartUpdated {
                session_id,
                message_id: str_at(&p["part"]["messageID"]),
                part: Part::from_value(&p["part"]),
            },
            ("todo.updated", Some(session_id)) => Event::TodoUpdated {
                session_id,
                todos: serde_json::from_value(p["todos"].clone()).unwrap_or_default(),
            },
            (_, session_id) => Event::Other {
                kind: raw.kind,
                session_id,
            },
        }
    }
}

fn str_at(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

impl Part {
    fn from_value(v: &Value) -> Self {
        match v["type"].as_str().unwrap_or("") {
            "text" => Part::Text {
                id: str_at(&v["id"]),
                text: str_at(&v["text"]),
                done: !v["time"]["end"].is_null(),
            },
            "tool" => {
                let state = &v["state"];
                let title = state["title"]
                    .as_str()
                    .or_else(|| state["input"]["description"].as_str())
                    .filter(|t| !t.is_empty())
                    .map(str::to_string);
                Part::Tool {
                    call_id: str_at(&v["callID"]),
                    tool: str_at(&v["tool"]),
                    status: ToolStatus::from_value(state),
                    title,
                }
            }
            "step-start" => Part::StepStart,
            "step-finish" => Part::StepFinish,
            other => Part::Other {
                kind: other.to_string(),
            },
        }
    }
}

impl ToolStatus {
    fn from_value(state: &Value) -> Self {
        match state["status"].as_str().unwrap_or("") {
            "pending" => ToolStatus::Pending,
            "running" => ToolStatus::Running,
            "completed" => ToolStatus::Completed,
            "error" => ToolStatus::Error {
                message: str_at(&state["error"]),
            },
            other => ToolStatus::Other {
                kind: other.to_string(),
            },
        }
    }
}

impl SessionStatus {
    fn from_value(v: &Value) -> Self {
        match v["type"].as_str().unwrap_or("") {
            "idle" => SessionStatus::Idle,
            "busy" => SessionStatus::Busy,
            "retry" => SessionStatus::Retry {
                message: v["message"].as_str().unwrap_or("").to_string(),
                attempt: v["attempt"].as_u64().unwrap_or(1),
            },
            other => SessionStatus::Other {
                kind: other.to_string(),
            },
        }
    }
}

pub struct EventStream {
    resp: reqwest::Response,
    parser: SseParser,
}

impl EventStream {
    pub(crate) fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            parser: SseParser::default(),
        }
    }

    /// The next event; `Ok(None)` when the server closed the stream.
    pub async fn next(&mut self) -> Result<Option<Event>, ApiError> {
        loop {
            if let Some(ev) = self.parser.next_event() {
                return Ok(Some(ev));
            }
            match self.resp.chunk().await {
                Ok(Some(bytes)) => self.parser.push(&bytes),
                Ok(None) => return Ok(None),
                Err(source) => {
                    return Err(ApiError::Transport {
                        method: "GET",
                        route: "/event".into(),
                        detail: source.to_string(),
                        source,
                    })
                }
            }
        }
    }
}

/// The SSE grammar over a byte buffer that may end mid-line or mid-frame.
#[derive(Debug, Default)]
struct SseParser {
    buf: BytesMut,
    data: String,
}

impl SseParser {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn next_event(&mut self) -> Option<Event> {
        while let Some(line) = take_line(&mut self.buf) {
            if let Some(ev) = self.feed_line(&line) {
                return Some(ev);
            }
        }
        None
    }

    /// One line; a blank line dispatches the accumulated `data`.
    fn feed_line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            let data = std::mem::take(&mut self.data);
            return parse_frame(&data);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            if !self.data.is_empty() {
                self.data.push('\n');
            }
            self.data.push_str(value);
        }
        None
    }
}

fn parse_frame(data: &str) -> Option<Event> {
    if data.trim().is_empty() {
        return None;
    }
    serde_json::from_str::<RawEvent>(data)
        .ok()
        .map(Event::from_raw)
}

/// Removes and returns one line (without its `\n` / `\r\n`) from the buffer, when complete.
fn take_line(buf: &mut BytesMut) -> Option<String> {
    let pos = buf.iter().position(|&b| b == b'\n')?;
    let mut line = buf.split_to(pos + 1);
    line.truncate(pos);
    if line.last() == Some(&b'\r') {
        line.truncate(pos - 1);
    }
    Some(String::from_utf8_lossy(&line).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(input: &str) -> Vec<Event> {
        let mut p = SseParser::default();
        let mut out = vec![];
        // Byte by byte: frames split anywhere must still parse.
        for b in input.as_bytes() {
            p.push(&[*b]);
            while let Some(e) = p.next_event() {
                out.push(e);
            }
        }
        out
    }

    #[test]
    fn parts_and_messages_as_opencode_sends_them() {
        // Frames as OpenCode 1.18.33 sent them during a bash tool call, trimmed.
        let evs = feed(concat!(
            r#"data: {"type":"message.updated","properties":{"sessionID":"ses_1","info":{"id":"msg_1","role":"assistant"}}}"#,
            "\n\n",
            r#"data: {"type":"message.part.updated","properties":{"sessionID":"ses_1","part":{"type":"tool","tool":"bash","callID":"call_1","state":{"status":"running","input":{"command":"ls","description":"List files"}},"id":"prt_1","messageID":"msg_1"}}}"#,
            "\n\n",
            r#"data: {"type":"message.part.updated","properties":{"sessionID":"ses_1","part":{"type":"tool","tool":"bash","callID":"call_1","state":{"status":"completed","title":"ls","output":"a"},"id":"prt_1","messageID":"msg_1"}}}"#,
            "\n\n",
            r#"data: {"type":"message.part.updated","properties":{"sessionID":"ses_1","part":{"type":"text","text":"Done","time":{"start":1,"end":2},"id":"prt_2","messageID":"msg_1"}}}"#,
            "\n\n",
            r#"data: {"type":"todo.updated","properties":{"sessionID":"ses_1","todos":[{"content":"Read","status":"completed","id":"1"}]}}"#,
            "\n\n",
        ));
        let part = |part| Event::PartUpdated {
            session_id: "ses_1".into(),
            message_id: "msg_1".into(),
            part,
        };
        assert_eq!(
            evs,
            [
                Event::MessageUpdated {
                    session_id: "ses_1".into(),
                    message_id: "msg_1".into(),
                    role: "assistant".into()
                },
                part(Part::Tool {
                    call_id: "call_1".into(),
                    tool: "bash".into(),
                    status: ToolStatus::Running,
                    title: Some("List files".into()),
                }),
                part(Part::Tool {
                    call_id: "call_1".into(),
                    tool: "bash".into(),
                    status: ToolStatus::Completed,
                    title: Some("ls".into()),
                }),
                part(Part::Text {
                    id: "prt_2".into(),
                    text: "Done".into(),
                    done: true
                }),
                Event::TodoUpdated {
                    session_id: "ses_1".into(),
                    todos: vec![Todo {
                        content: "Read".into(),
                        status: "completed".into()
                    }]
                },
            ]
        );
    }

    #[test]
    fn frames_comments_crlf_and_garbage() {
        let evs = feed(concat!(
            ": keepalive\n\n",
            "data: {\"type\":\"server.connected\",\"properties\":{}}\n\n",
            "event: message\r\nid: 7\r\ndata: {\"type\":\"session.idle\",\r\n",
            "data: \"properties\":{\"sessionID\":\"ses_1\"}}\r\n\r\n",
            "data: not json\n\n",
            "data: {\"type\":\"brand.new\",\"properties\":{\"x\":1}}\n\n",
            "data: {\"type\":\"partial\"",
        ));
        assert_eq!(
            evs,
            [
                Event::ServerConnected,
                Event::SessionIdle {
                    session_id: "ses_1".into()
                },
                Event::Other {
                    kind: "brand.new".into(),
                    session_id: None
                },
            ]
        );
        assert_eq!(evs[1].session_id(), Some("ses_1"));
    }
}
