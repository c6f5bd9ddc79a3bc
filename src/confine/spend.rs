//! The spend meter (docs/design.md#spend-caps): what the model requests of one run cost, counted by
//! the key proxy (`confine::key_proxy`) from what each response reports, and the run's caps
//! (`max-cost`, `max-tokens`). Every model request of the agent goes through the proxy, so the
//! agent cannot spend past a cap: once one is reached the proxy refuses its further requests (the
//! threat check's own are counted, never refused).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

/// The run's caps; `None`: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpendCap {
    /// USD.
    pub max_cost: Option<f64>,
    /// Input and output tokens together.
    pub max_tokens: Option<u64>,
}

impl SpendCap {
    pub fn is_set(&self) -> bool {
        self.max_cost.is_some() || self.max_tokens.is_some()
    }
}

/// What was spent so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spent {
    pub input: u64,
    pub output: u64,
    /// USD, over the models with a known price.
    pub cost: f64,
    /// Models (`provider/model`) that answered with no known price: counted by tokens only.
    pub unpriced: Vec<String>,
    /// Requests forwarded to a provider.
    pub requests: u64,
    /// Requests refused at the cap.
    pub refused: u64,
}

impl Spent {
    pub fn tokens(&self) -> u64 {
        self.input + self.output
    }
}

#[derive(Debug, Default)]
struct State {
    /// `provider/model` → (input, output) tokens.
    usage: BTreeMap<String, (u64, u64)>,
    /// `provider/model` → USD per million (input, output) tokens.
    prices: BTreeMap<String, (f64, f64)>,
    requests: u64,
    refused: u64,
}

/// One run's meter, shared by the key proxies of the turn and of the threat check.
#[derive(Debug)]
pub struct Meter {
    cap: SpendCap,
    /// What the run may spend of the repository's daily budget (`max-daily-cost`), set once the
    /// budget across runs has judged the run (`Meter::hold`): a cost cap like `max-cost`.
    hold: std::sync::OnceLock<f64>,
    state: Mutex<State>,
    /// Set once a request was refused at the cap: the turn ends then.
    refusal: tokio::sync::watch::Sender<bool>,
}

impl Meter {
    pub fn new(cap: SpendCap) -> Arc<Meter> {
        Arc::new(Meter {
            cap,
            hold: std::sync::OnceLock::new(),
            state: Mutex::new(State::default()),
            refusal: tokio::sync::watch::channel(false).0,
        })
    }

    /// The caps: `max-cost` and `max-tokens`, the cost cap lowered to the daily budget's hold.
    pub fn cap(&self) -> SpendCap {
        let mut cap = self.cap;
        if let Some(hold) = self.hold.get() {
            cap.max_cost = Some(cap.max_cost.map_or(*hold, |max| max.min(*hold)));
        }
        cap
    }

    /// Caps the run's cost at `usd`, what it may spend of the daily budget (set once, before the
    /// turn).
    pub fn hold(&self, usd: f64) {
        let _ = self.hold.set(usd);
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The price of `model` (`provider/model`, as the provider's API names it), USD per million
    /// input and output tokens.
    pub fn set_price(&self, model: String, per_million: (f64, f64)) {
        self.state().prices.insert(model, per_million);
    }

    /// A request forwarded to the provider.
    pub fn forwarded(&self) {
        self.state().requests += 1;
    }

    /// Tokens a response reported for `model`.
    pub fn add(&self, model: &str, input: u64, output: u64) {
        let mut s = self.state();
        let e = s.usage.entry(model.to_string()).or_default();
        e.0 += input;
        e.1 += output;
    }

    pub fn spent(&self) -> Spent {
        let s = self.state();
        let mut spent = Spent {
            requests: s.requests,
            refused: s.refused,
            ..Spent::default()
        };
        for (model, (i, o)) in &s.usage {
            spent.input += i;
            spent.output += o;
            match s.prices.get(model) {
                Some((pi, po)) => spent.cost += (*i as f64 * pi + *o as f64 * po) / 1e6,
                None => spent.unpriced.push(model.clone()),
            }
        }
        spent
    }

    /// The line that says a cap is reached ("stopped at the spend cap: $0.52 of $0.50"); `None`
    /// while neither is.
    pub fn reached(&self) -> Option<String> {
        let spent = self.spent();
        if let Some(max) = self.cap().max_cost.filter(|m| spent.cost >= *m) {
            return Some(format!(
                "stopped at the spend cap: ${:.2} of ${max:.2}",
                spent.cost
            ));
        }
        let max = self.cap().max_tokens.filter(|m| spent.tokens() >= *m)?;
        Some(format!(
            "stopped at the token cap: {} of {max} tokens",
            spent.tokens()
        ))
    }

    /// A request refused at the cap: counted, and the turn told.
    pub fn refuse(&self) {
        self.state().refused += 1;
        self.refusal.send_replace(true);
    }

    /// Returns once a request has been refused at the cap.
    pub async fn refused(&self) {
        let mut rx = self.refusal.subscribe();
        // The sender lives as long as the meter: `wait_for` fails only if it is dropped.
        if rx.wait_for(|r| *r).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The summary's row: spent against the caps, and the models counted by tokens only.
    pub fn summary(&self) -> String {
        let spent = self.spent();
        let mut parts = Vec::new();
        if let Some(max) = self.cap().max_cost {
            parts.push(format!("${:.4} of ${max:.2}", spent.cost));
        }
        if let Some(max) = self.cap().max_tokens {
            parts.push(format!("{} of {max} tokens", spent.tokens()));
        }
        let mut row = parts.join(", ");
        match self.reached() {
            Some(_) => row.push_str(&format!(" — reached; {} request(s) refused", spent.refused)),
            None => row.push_str(" — not reached"),
        }
        if !spent.unpriced.is_empty() && self.cap().max_cost.is_some() {
            row.push_str(&format!(
                "; no price known for {} (counted by tokens only)",
                spent.unpriced.join(", ")
            ));
        }
        row
    }
}

/// The input and output tokens a provider's response (or one event of its stream) reports, in
/// any of the APIs the key proxy speaks: OpenAI chat completions and responses, Anthropic
/// messages, Google's `generateContent`.
pub fn usage_of(v: &Value) -> Option<(u64, u64)> {
    let u = [
        &v["usage"],
        &v["message"]["usage"],
        &v["response"]["usage"],
        &v["usageMetadata"],
    ]
    .into_iter()
    .find(|u| u.is_object())?;
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    let input = n("prompt_tokens")
        + n("input_tokens")
        + n("cache_creation_input_tokens")
        + n("cache_read_input_tokens")
        + n("promptTokenCount");
    let output = n("completion_tokens")
        + n("output_tokens")
        + n("candidatesTokenCount")
        + n("thoughtsTokenCount");
    Some((input, output))
}

/// What one response reported so far: a stream's events repeat or grow their counts (Anthropic's
/// `message_start` then `message_delta`, Google's every chunk), so the most seen of each counts.
#[derive(Debug)]
pub struct ResponseTally {
    meter: Arc<Meter>,
    model: String,
    seen: (u64, u64),
    sse: bool,
    /// An unfinished SSE line, or (not SSE) the whole body so far.
    pending: Vec<u8>,
}

/// The most of a body that is read for its usage (not SSE).
const MAX_BODY: usize = 16 * 1024 * 1024;

impl ResponseTally {
    pub fn new(meter: Arc<Meter>, model: String, sse: bool) -> Self {
        ResponseTally {
            meter,
            model,
            seen: (0, 0),
            sse,
            pending: Vec::new(),
        }
    }

    /// Bytes of the response as they pass.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.pending.len() + chunk.len() <= MAX_BODY {
                self.pending.extend_from_slice(chunk);
            }
            return;
        }
        self.pending.extend_from_slice(chunk);
        while let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=at).collect();
            self.line(&line);
        }
    }

    fn line(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        if let Some(data) = text.trim().strip_prefix("data:") {
            self.json(data.trim());
        }
    }

    fn json(&mut self, text: &str) {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let Some((i, o)) = usage_of(&v) else { return };
        let (si, so) = self.seen;
        let now = (si.max(i), so.max(o));
        self.meter.add(&self.model, now.0 - si, now.1 - so);
        self.seen = now;
    }
}

impl Drop for ResponseTally {
    /// The end of the response (or of what arrived of it): what is left is read.
    fn drop(&mut self) {
        let rest = std::mem::take(&mut self.pending);
        match self.sse {
            true => self.line(&rest),
            false => self.json(&String::from_utf8_lossy(&rest)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_is_read_from_every_api_shape_and_a_stream_counts_its_most() {
        let cases = [
            (
                json!({"usage": {"prompt_tokens": 10, "completion_tokens": 2}}),
                (10, 2),
            ),
            (
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 7,
                    "cache_read_input_tokens": 3, "output_tokens": 1}}}),
                (10, 1),
            ),
            (
                json!({"type": "response.completed", "response": {"usage": {"input_tokens": 5, "output_tokens": 4}}}),
                (5, 4),
            ),
            (
                json!({"usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 6}}),
                (8, 6),
            ),
        ];
        for (v, want) in cases {
            assert_eq!(usage_of(&v), Some(want), "{v}");
        }
        let meter = Meter::new(SpendCap {
            max_cost: Some(0.5),
            max_tokens: None,
        });
        meter.set_price("a/m".into(), (1e6, 0.0));
        {
            let mut t = ResponseTally::new(meter.clone(), "a/m".into(), true);
            t.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":0");
            t.feed(b",\"output_tokens\":1}}}\n\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n");
        }
        let spent = meter.spent();
        assert_eq!((spent.input, spent.output), (0, 9));
        assert_eq!(meter.reached(), None);
        ResponseTally::new(meter.clone(), "a/m".into(), false)
            .feed(br#"{"usage": {"prompt_tokens": 1, "completion_tokens": 0}}"#);
        assert_eq!(
            meter.reached().as_deref(),
            Some("stopped at the spend cap: $1.00 of $0.50")
        );
    }
}
