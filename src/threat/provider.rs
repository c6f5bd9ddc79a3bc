//! Asking the model for the threat check (docs/security.md#the-threat-check): one plain request —
//! no tools, no streaming — in the provider's own API, sent by fro-bot's own process to the key
//! proxy (`confine::key_proxy`), which adds the key as it does for OpenCode. The proxy knows three
//! ways a provider takes its key, and each is one API: `x-api-key` is Anthropic's Messages API,
//! `Authorization: Bearer` the OpenAI chat-completions API (OpenAI and every OpenAI-compatible
//! provider), `x-goog-api-key` Google's `generateContent`.

use serde_json::{json, Value};

use crate::confine::key_proxy::AuthStyle;

/// The most the judge may answer (tokens): the verdict is a few lines.
const MAX_ANSWER_TOKENS: u64 = 1024;
/// How much of an error body is shown.
const MAX_ERROR_CHARS: usize = 300;

/// The API a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Anthropic,
    OpenAiChat,
    Gemini,
}

impl Wire {
    /// The API of a provider the key proxy serves, by how it takes its key.
    pub fn of(style: AuthStyle) -> Wire {
        match style {
            AuthStyle::XApiKey => Wire::Anthropic,
            AuthStyle::Bearer => Wire::OpenAiChat,
            AuthStyle::Google => Wire::Gemini,
        }
    }
}

/// The model, as OpenCode listed it before the turn.
#[derive(Debug, Clone, PartialEq)]
pub struct JudgeModel {
    /// The id the provider's API knows it by.
    pub api_id: String,
    /// USD per million input and output tokens, when the listing gives them.
    pub cost_per_million: Option<(f64, f64)>,
    /// Whether it takes a temperature (reasoning models refuse one).
    pub temperature: bool,
    /// Its context window in tokens, when known.
    pub context: Option<u64>,
}

impl JudgeModel {
    /// From OpenCode's listing of the model (`GET /config/providers`), or from its id alone.
    pub fn from_listing(id: &str, entry: Option<&Value>) -> JudgeModel {
        let entry = entry.unwrap_or(&Value::Null);
        let cost = &entry["cost"];
        JudgeModel {
            api_id: entry["api"]["id"].as_str().unwrap_or(id).to_string(),
            cost_per_million: cost["input"].as_f64().zip(cost["output"].as_f64()),
            temperature: entry["capabilities"]["temperature"]
                .as_bool()
                .unwrap_or(false),
            context: entry["limit"]["context"].as_u64().filter(|c| *c > 0),
        }
    }

    /// What `usage` cost, when the rates are known.
    pub fn cost(&self, usage: Usage) -> Option<f64> {
        self.cost_per_million
            .map(|(i, o)| (usage.input as f64 * i + usage.output as f64 * o) / 1e6)
    }
}

/// Tokens one answer took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
}

impl Usage {
    pub fn add(&mut self, o: Usage) {
        self.input += o.input;
        self.output += o.output;
    }
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub text: String,
    pub usage: Usage,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("the request did not reach the provider")]
    Transport {
        #[source]
        source: reqwest::Error,
    },
    #[error("the provider answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the provider's answer could not be read")]
    Body {
        #[source]
        source: reqwest::Error,
    },
    #[error("the provider's answer holds no text ({what})")]
    Shape { what: String },
}

/// The request: the path under the provider's base URL, the JSON body, extra headers.
pub fn request(
    wire: Wire,
    model: &JudgeModel,
    system: &str,
    user: &str,
) -> (String, Value, Vec<(&'static str, &'static str)>) {
    // Deterministic where the model allows it.
    let temperature = model.temperature.then_some(0);
    match wire {
        Wire::Anthropic => {
            let mut body = json!({"model": model.api_id, "max_tokens": MAX_ANSWER_TOKENS,
                "system": system, "messages": [{"role": "user", "content": user}]});
            if let Some(t) = temperature {
                body["temperature"] = json!(t);
            }
            let headers = vec![("anthropic-version", "2023-06-01")];
            ("/messages".into(), body, headers)
        }
        Wire::OpenAiChat => {
            let mut body = json!({"model": model.api_id, "stream": false, "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": user}]});
            if let Some(t) = temperature {
                body["temperature"] = json!(t);
            }
            ("/chat/completions".into(), body, Vec::new())
        }
        Wire::Gemini => {
            let mut config = json!({"responseMimeType": "application/json",
                "maxOutputTokens": MAX_ANSWER_TOKENS});
            if let Some(t) = temperature {
                config["temperature"] = json!(t);
            }
            let body = json!({"systemInstruction": {"parts": [{"text": system}]},
                "contents": [{"role": "user", "parts": [{"text": user}]}],
                "generationConfig": config});
            let path = format!("/models/{}:generateContent", model.api_id);
            (path, body, Vec::new())
        }
    }
}

/// The text and usage of an answer.
pub fn read_answer(wire: Wire, body: &Value) -> Result<Answer, ProviderError> {
    let shape = |what: &str| ProviderError::Shape { what: what.into() };
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let (text, usage) = match wire {
        Wire::Anthropic => {
            let parts = body["content"]
                .as_array()
                .ok_or_else(|| shape("no content"))?;
            let text: String = parts
                .iter()
                .filter(|p| p["type"] == "text")
                .filter_map(|p| p["text"].as_str())
                .collect();
            let u = &body["usage"];
            (text, (n(&u["input_tokens"]), n(&u["output_tokens"])))
        }
        Wire::OpenAiChat => {
            let text = body["choices"][0]["message"]["content"]
                .as_str()
                .ok_or_else(|| shape("no choices[0].message.content"))?;
            let u = &body["usage"];
            (
                text.to_string(),
                (n(&u["prompt_tokens"]), n(&u["completion_tokens"])),
            )
        }
        Wire::Gemini => {
            let parts = body["candidates"][0]["content"]["parts"]
                .as_array()
                .ok_or_else(|| shape("no candidates[0].content.parts"))?;
            let text: String = parts.iter().filter_map(|p| p["text"].as_str()).collect();
            let u = &body["usageMetadata"];
            (
                text,
                (n(&u["promptTokenCount"]), n(&u["candidatesTokenCount"])),
            )
        }
    };
    Ok(Answer {
        text,
        usage: Usage {
            input: usage.0,
            output: usage.1,
        },
    })
}

/// One request to the provider at `base` (the key proxy's URL for it).
pub async fn ask(
    http: &reqwest::Client,
    base: &str,
    wire: Wire,
    model: &JudgeModel,
    (system, user): (&str, &str),
) -> Result<Answer, ProviderError> {
    let (path, body, headers) = request(wire, model, system, user);
    let mut req = http.post(format!("{base}{path}")).json(&body);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let resp = req
        .send()
        .await
        .map_err(|source| ProviderError::Transport { source })?;
    let status = resp.status();
    let text = resp
        .text()
        .await
        .map_err(|source| ProviderError::Body { source })?;
    if !status.is_success() {
        return Err(ProviderError::Status {
            status: status.as_u16(),
            body: shown(&text),
        });
    }
    let value: Value = serde_json::from_str(&text).map_err(|_| ProviderError::Shape {
        what: format!("not JSON: {}", shown(&text)),
    })?;
    read_answer(wire, &value)
}

/// Provider text for a message: redacted, one line, short.
fn shown(text: &str) -> String {
    crate::redact::redact(text)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_ERROR_CHARS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> JudgeModel {
        JudgeModel::from_listing(
            "claude-x",
            Some(
                &json!({"api": {"id": "claude-x-2025"}, "cost": {"input": 3, "output": 15},
                "capabilities": {"temperature": true}, "limit": {"context": 200000}}),
            ),
        )
    }

    #[test]
    fn the_listing_gives_the_api_id_the_rates_and_the_window() {
        let m = model();
        assert_eq!(m.api_id, "claude-x-2025");
        assert_eq!(m.context, Some(200_000));
        let cost = m.cost(Usage {
            input: 1_000_000,
            output: 100_000,
        });
        assert_eq!(cost, Some(4.5));
        let bare = JudgeModel::from_listing("m", None);
        assert_eq!((bare.api_id.as_str(), bare.cost_per_million), ("m", None));
    }

    #[test]
    fn each_api_is_asked_in_its_own_shape_without_tools() {
        for wire in [Wire::Anthropic, Wire::OpenAiChat, Wire::Gemini] {
            let (path, body, _) = request(wire, &model(), "SYS", "USER");
            let text = body.to_string();
            assert!(text.contains("SYS") && text.contains("USER"), "{text}");
            assert!(
                !text.contains("tools") && !text.contains("\"stream\":true"),
                "{text}"
            );
            assert!(path.starts_with('/'), "{path}");
        }
        let (path, body, headers) = request(Wire::Anthropic, &model(), "s", "u");
        assert_eq!(path, "/messages");
        assert_eq!(body["model"], "claude-x-2025");
        assert_eq!(headers, [("anthropic-version", "2023-06-01")]);
        let (path, _, _) = request(Wire::Gemini, &model(), "s", "u");
        assert_eq!(path, "/models/claude-x-2025:generateContent");
        let no_temp = JudgeModel {
            temperature: false,
            ..model()
        };
        let (_, body, _) = request(Wire::OpenAiChat, &no_temp, "s", "u");
        assert!(body.get("temperature").is_none());
    }

    /// A one-shot HTTP server answering `status` with `body`; its URL.
    async fn server(status: u16, body: &'static str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            let _ = s.read(&mut buf).await;
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(reply.as_bytes()).await.unwrap();
        });
        url
    }

    #[tokio::test]
    async fn a_failing_provider_is_an_error_that_names_the_status_and_never_a_verdict() {
        let http = reqwest::Client::new();
        let base = server(
            500,
            "{\"error\":{\"message\":\"boom ghp_abcdefghijklmnopqrstuvwxyz0123456789\"}}",
        )
        .await;
        let e = ask(&http, &base, Wire::OpenAiChat, &model(), ("s", "u"))
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("the provider answered 500: "), "{text}");
        assert!(!text.contains("ghp_abc"), "redacted: {text}");
        let base = server(200, "not json").await;
        let e = ask(&http, &base, Wire::OpenAiChat, &model(), ("s", "u"))
            .await
            .unwrap_err();
        assert!(matches!(e, ProviderError::Shape { .. }), "{e}");
        let e = ask(
            &http,
            "http://127.0.0.1:1",
            Wire::Anthropic,
            &model(),
            ("s", "u"),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, ProviderError::Transport { .. }), "{e}");
    }

    #[test]
    fn answers_are_read_with_their_usage() {
        let a = read_answer(
            Wire::Anthropic,
            &json!({"content": [{"type": "text", "text": "{}"}],
                "usage": {"input_tokens": 10, "output_tokens": 2}}),
        )
        .unwrap();
        assert_eq!(
            (a.text.as_str(), a.usage.input, a.usage.output),
            ("{}", 10, 2)
        );
        let o = read_answer(
            Wire::OpenAiChat,
            &json!({"choices": [{"message": {"content": "ok"}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1}}),
        )
        .unwrap();
        assert_eq!((o.text.as_str(), o.usage.input), ("ok", 5));
        let g = read_answer(
            Wire::Gemini,
            &json!({"candidates": [{"content": {"parts": [{"text": "a"}, {"text": "b"}]}}],
                "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 3}}),
        )
        .unwrap();
        assert_eq!((g.text.as_str(), g.usage.output), ("ab", 3));
        assert!(read_answer(Wire::OpenAiChat, &json!({"error": "x"})).is_err());
    }
}
