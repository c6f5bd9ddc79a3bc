//! Reader for OpenCode's `/event` server-sent events: `data: {"id","type","properties"}` frames.
//! Tolerant: comments, `event:`/`id:`/`retry:` fields, heartbeats, unknown types and unparseable
//! frames are skipped or passed through; reconnecting is the caller's decision (see `turn.rs`).

use bytes::BytesMut;
use serde::Deserialize;
use serde_json::Value;

use super::client::ApiError;

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub properties: Value,
}

impl Event {
    /// The `sessionID` the event is about, when it names one.
    pub fn session_id(&self) -> Option<&str> {
        self.properties["sessionID"]
            .as_str()
            .or_else(|| self.properties["info"]["sessionID"].as_str())
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
    serde_json::from_str(data).ok()
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
        let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["server.connected", "session.idle", "brand.new"]);
        assert_eq!(evs[1].session_id(), Some("ses_1"));
    }
}
