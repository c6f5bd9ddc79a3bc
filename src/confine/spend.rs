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
        self.input.saturating_add(self.output)
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
    /// input and output tokens. A price that is negative or not a finite number is no price: the
    /// model is counted by tokens only (and named), never at a price that lowers the spend. So is
    /// a price of 0 for both (what OpenCode lists for a model it has no price for): `max-cost`
    /// cannot stop that model, and the summary says so.
    pub fn set_price(&self, model: String, per_million: (f64, f64)) {
        let usable = |p: f64| p.is_finite() && p >= 0.0;
        let free = per_million.0 == 0.0 && per_million.1 == 0.0;
        if usable(per_million.0) && usable(per_million.1) && !free {
            self.state().prices.insert(model, per_million);
        }
    }

    /// A request forwarded to the provider.
    pub fn forwarded(&self) {
        self.state().requests += 1;
    }

    /// Tokens a response reported for `model` (saturating: a count past `u64` stays the most
    /// there is, which reaches every cap).
    pub fn add(&self, model: &str, input: u64, output: u64) {
        let mut s = self.state();
        let e = s.usage.entry(model.to_string()).or_default();
        e.0 = e.0.saturating_add(input);
        e.1 = e.1.saturating_add(output);
    }

    pub fn spent(&self) -> Spent {
        let s = self.state();
        let mut spent = Spent {
            requests: s.requests,
            refused: s.refused,
            ..Spent::default()
        };
        for (model, (i, o)) in &s.usage {
            spent.input = spent.input.saturating_add(*i);
            spent.output = spent.output.saturating_add(*o);
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
            // The daily budget's hold binds when it is below the run's own cap (or there is none).
            let held = self
                .hold
                .get()
                .is_some_and(|h| self.cap.max_cost.is_none_or(|own| *h < own));
            let what = if held {
                "what the daily budget left this run"
            } else {
                "the spend cap"
            };
            return Some(format!(
                "stopped at {what}: ${:.2} of ${max:.2}",
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
/// messages, Google's `generateContent`. Where several shapes hold a usage the largest counts of
/// each (an empty one hides nothing); each figure is read by [`figure`], and the fields add up
/// saturating.
pub fn usage_of(v: &Value) -> Option<(u64, u64)> {
    let found = [
        &v["usage"],
        &v["message"]["usage"],
        &v["response"]["usage"],
        &v["usageMetadata"],
    ]
    .into_iter()
    .filter(|u| u.is_object())
    .map(usage_fields);
    found.reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)))
}

/// One usage object's input and output tokens.
fn usage_fields(u: &Value) -> (u64, u64) {
    let sum = |keys: &[&str]| {
        keys.iter()
            .fold(0u64, |total, k| total.saturating_add(figure(&u[*k])))
    };
    let input = sum(&[
        "prompt_tokens",
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "promptTokenCount",
    ]);
    let output = sum(&[
        "completion_tokens",
        "output_tokens",
        "candidatesTokenCount",
        "thoughtsTokenCount",
    ]);
    (input, output)
}

/// A usage figure as a count, read so that no figure lowers the spend or overflows it: a whole
/// number as it is; a fraction as the next whole token; a number past `u64` (or an infinity) as
/// `u64::MAX`; a number written as a string as that number; anything else — negative, not a
/// number, missing — as 0.
fn figure(v: &Value) -> u64 {
    let float = match v {
        Value::Number(n) => match n.as_u64() {
            Some(whole) => return whole,
            None => n.as_f64(),
        },
        Value::String(s) => s.trim().parse::<f64>().ok(),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    };
    match float {
        Some(f) if f.is_nan() || f <= 0.0 => 0,
        // A float-to-int cast saturates: past `u64::MAX` (an infinity too) it is `u64::MAX`.
        Some(f) => f.ceil() as u64,
        None => 0,
    }
}

/// What one response reported so far: a stream's events repeat or grow their counts (Anthropic's
/// `message_start` then `message_delta`, Google's every chunk), so the most seen of each counts.
/// A body (not SSE) or an SSE line longer than [`MAX_BODY`] is not kept to be read: its bytes are
/// counted as output tokens instead, one per [`BYTES_PER_TOKEN`], so that a response too long to
/// read cannot pass a cap uncounted.
#[derive(Debug)]
pub struct ResponseTally {
    meter: Arc<Meter>,
    model: String,
    seen: (u64, u64),
    sse: bool,
    /// An unfinished SSE line, or (not SSE) the whole body so far.
    pending: Vec<u8>,
    /// The bytes past the limit: `pending` is skipped (not SSE: the rest of the body; SSE: up to
    /// the line's end).
    skipping: bool,
    /// The bytes skipped, counted at the end.
    unread: u64,
}

/// The most of a body (or of one SSE line) that is read for its usage.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// How a response too long to read is counted: a token per this many bytes (text runs about four
/// bytes a token; JSON's quoting only adds bytes).
pub const BYTES_PER_TOKEN: u64 = 4;

impl ResponseTally {
    pub fn new(meter: Arc<Meter>, model: String, sse: bool) -> Self {
        ResponseTally {
            meter,
            model,
            seen: (0, 0),
            sse,
            pending: Vec::new(),
            skipping: false,
            unread: 0,
        }
    }

    /// Bytes of the response as they pass.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if !self.skipping && self.pending.len() + chunk.len() > MAX_BODY {
                self.skip();
            }
            match self.skipping {
                true => self.unread = self.unread.saturating_add(chunk.len() as u64),
                false => self.pending.extend_from_slice(chunk),
            }
            return;
        }
        let mut rest = chunk;
        while self.skipping && !rest.is_empty() {
            let end = rest.iter().position(|b| *b == b'\n');
            let (skipped, after) = rest.split_at(end.map_or(rest.len(), |at| at + 1));
            self.unread = self.unread.saturating_add(skipped.len() as u64);
            self.skipping = end.is_none();
            rest = after;
        }
        self.pending.extend_from_slice(rest);
        while let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=at).collect();
            self.line(&line);
        }
        if self.pending.len() > MAX_BODY {
            self.skip();
        }
    }

    /// What is kept so far is past the limit: counted by its size, and skipped from here.
    fn skip(&mut self) {
        self.unread = self.unread.saturating_add(self.pending.len() as u64);
        self.pending = Vec::new();
        self.skipping = true;
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
    /// The end of the response (or of what arrived of it): what is left is read, what was too
    /// long to read counted by its size.
    fn drop(&mut self) {
        let rest = std::mem::take(&mut self.pending);
        match self.sse {
            true => self.line(&rest),
            false => self.json(&String::from_utf8_lossy(&rest)),
        }
        if self.unread > 0 {
            let tokens = self.unread.div_ceil(BYTES_PER_TOKEN);
            self.meter.add(&self.model, 0, tokens);
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

    #[test]
    fn a_run_stopped_by_the_daily_budgets_hold_says_so_not_that_its_own_cap_was_reached() {
        for (own, hold, said) in [
            (
                Some(0.50),
                0.20,
                "stopped at what the daily budget left this run: $1.00 of $0.20",
            ),
            (
                None,
                0.20,
                "stopped at what the daily budget left this run: $1.00 of $0.20",
            ),
            (Some(0.50), 0.80, "stopped at the spend cap: $1.00 of $0.50"),
        ] {
            let meter = Meter::new(SpendCap {
                max_cost: own,
                max_tokens: None,
            });
            meter.hold(hold);
            meter.set_price("a/m".into(), (1_000_000.0, 0.0));
            ResponseTally::new(meter.clone(), "a/m".into(), false)
                .feed(br#"{"usage": {"prompt_tokens": 1, "completion_tokens": 0}}"#);
            assert_eq!(meter.reached().as_deref(), Some(said));
        }
    }

    /// What one non-streamed response's body counts on a fresh meter.
    fn counted(body: &str) -> (u64, u64) {
        let meter = Meter::new(SpendCap::default());
        ResponseTally::new(meter.clone(), "a/m".into(), false).feed(body.as_bytes());
        let s = meter.spent();
        (s.input, s.output)
    }

    #[test]
    fn hostile_usage_figures_neither_panic_nor_lower_nor_overflow_the_count() {
        let max = u64::MAX;
        let cases = [
            // Negative: counts nothing, never less than nothing.
            (
                r#"{"usage": {"prompt_tokens": -5000, "completion_tokens": 10}}"#,
                (0, 10),
            ),
            // Strings: a number written as one counts; anything else counts nothing.
            (
                r#"{"usage": {"prompt_tokens": "1200", "completion_tokens": "NaN"}}"#,
                (1200, 0),
            ),
            (
                r#"{"usage": {"prompt_tokens": "lots", "completion_tokens": "-3"}}"#,
                (0, 0),
            ),
            (
                r#"{"usage": {"prompt_tokens": "Infinity", "completion_tokens": 1}}"#,
                (max, 1),
            ),
            // A fraction counts as the next whole token; past u64, the most there is.
            (
                r#"{"usage": {"prompt_tokens": 10.2, "completion_tokens": 1e30}}"#,
                (11, max),
            ),
            (
                r#"{"usage": {"prompt_tokens": 99999999999999999999999999, "completion_tokens": 0}}"#,
                (max, 0),
            ),
            // Fields that add up past u64.
            (
                r#"{"usage": {"input_tokens": 18446744073709551615, "cache_read_input_tokens": 18446744073709551615, "output_tokens": 18446744073709551615, "thoughtsTokenCount": 5}}"#,
                (max, max),
            ),
            // Missing fields, or no usage at all.
            (r#"{"usage": {}}"#, (0, 0)),
            (r#"{"usage": null, "choices": []}"#, (0, 0)),
            (r#"{"usage": "a lot"}"#, (0, 0)),
            // An empty usage does not hide another shape's.
            (
                r#"{"usage": {}, "message": {"usage": {"input_tokens": 500}}}"#,
                (500, 0),
            ),
            (
                r#"{"usage": {"prompt_tokens": 1}, "usageMetadata": {"promptTokenCount": 700}}"#,
                (700, 0),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(counted(body), want, "{body}");
        }
    }

    #[test]
    fn the_meter_saturates_and_a_saturated_count_reaches_every_cap() {
        let meter = Meter::new(SpendCap {
            max_cost: Some(1e300),
            max_tokens: Some(u64::MAX),
        });
        meter.set_price("a/m".into(), (1.0, 1.0));
        for _ in 0..3 {
            meter.add("a/m", u64::MAX, u64::MAX);
            meter.add("b/m", u64::MAX, 1);
        }
        let spent = meter.spent();
        assert_eq!(
            (spent.input, spent.output, spent.tokens()),
            (u64::MAX, u64::MAX, u64::MAX)
        );
        assert!(spent.cost.is_finite() && spent.cost > 0.0, "{}", spent.cost);
        assert!(meter.reached().is_some());
    }

    #[test]
    fn a_price_that_is_negative_not_a_number_or_zero_counts_the_model_as_unpriced() {
        let meter = Meter::new(SpendCap {
            max_cost: Some(0.5),
            max_tokens: None,
        });
        meter.set_price("a/good".into(), (1e6, 0.0));
        meter.set_price("a/negative".into(), (-1e9, -1e9));
        meter.set_price("a/nan".into(), (f64::NAN, 1.0));
        meter.set_price("a/inf".into(), (f64::INFINITY, 1.0));
        meter.set_price("a/zero".into(), (0.0, 0.0));
        meter.set_price("a/half".into(), (0.0, 1e6));
        for m in ["a/good", "a/negative", "a/nan", "a/inf", "a/zero", "a/half"] {
            meter.add(m, 1, 1);
        }
        let spent = meter.spent();
        assert_eq!(spent.cost, 2.0, "a negative price does not lower the spend");
        assert_eq!(spent.unpriced, ["a/inf", "a/nan", "a/negative", "a/zero"]);
        assert!(meter.reached().is_some());
    }

    #[test]
    fn usage_repeated_in_every_chunk_of_a_stream_counts_once_and_a_smaller_one_lowers_nothing() {
        let meter = Meter::new(SpendCap::default());
        {
            let mut t = ResponseTally::new(meter.clone(), "a/m".into(), true);
            for _ in 0..500 {
                t.feed(
                    b"data: {\"usage\": {\"prompt_tokens\": 1000, \"completion_tokens\": 10}}\n\n",
                );
            }
            t.feed(b"data: {\"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": -9}}\n\n");
            t.feed(b"data: {\"usage\": {\"prompt_tokens\": 1000, \"completion_tokens\": 12}}\n\n");
        }
        let spent = meter.spent();
        assert_eq!((spent.input, spent.output), (1000, 12));
    }

    #[test]
    fn a_body_or_an_event_too_long_to_read_is_counted_by_its_size() {
        let meter = Meter::new(SpendCap::default());
        let mib = vec![b' '; 1 << 20];
        {
            let mut t = ResponseTally::new(meter.clone(), "a/m".into(), false);
            t.feed(br#"{"usage": {"prompt_tokens": 1}, "padding": ""#);
            for _ in 0..17 {
                t.feed(&mib);
            }
            t.feed(br#""}"#);
        }
        let spent = meter.spent();
        assert!(spent.output >= 17 * (1 << 20) / 4, "{spent:?}");
        let meter = Meter::new(SpendCap::default());
        {
            let mut t = ResponseTally::new(meter.clone(), "a/m".into(), true);
            t.feed(b"data: {\"padding\": \"");
            for _ in 0..17 {
                t.feed(&mib);
            }
            t.feed(b"\"}\n\ndata: {\"usage\": {\"prompt_tokens\": 5}}\n\n");
        }
        let spent = meter.spent();
        assert_eq!(spent.input, 5, "the stream is read on past the long event");
        assert!(spent.output >= 17 * (1 << 20) / 4, "{spent:?}");
    }

    /// A usage figure as a hostile provider might write it.
    fn figure() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        prop_oneof![
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[0-9a-zA-Z.+-]{0,24}".prop_map(Value::from),
            Just(Value::Null),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

        /// However a stream's usage figures read and wherever its chunks split, the count never
        /// falls, never panics, and is at least the largest plain count any event reported.
        #[test]
        fn a_stream_of_hostile_usage_counts_at_least_its_largest_plain_figure(
            events in proptest::collection::vec((figure(), figure()), 1..12),
            cuts in proptest::collection::vec(0usize..4096, 0..8),
        ) {
            let mut text = String::new();
            let mut most = (0u64, 0u64);
            for (i, o) in &events {
                let ev = json!({"usage": {"prompt_tokens": i, "completion_tokens": o}});
                text.push_str(&format!("data: {ev}\n\n"));
                most = (most.0.max(i.as_u64().unwrap_or(0)), most.1.max(o.as_u64().unwrap_or(0)));
            }
            let meter = Meter::new(SpendCap { max_cost: None, max_tokens: Some(1) });
            let bytes = text.as_bytes();
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            at.sort_unstable();
            {
                let mut t = ResponseTally::new(meter.clone(), "a/m".into(), true);
                let (mut from, mut before) = (0, 0);
                for cut in at.into_iter().chain([bytes.len()]) {
                    t.feed(&bytes[from..cut]);
                    from = cut;
                    let now = meter.spent().tokens();
                    proptest::prop_assert!(now >= before);
                    before = now;
                }
            }
            let spent = meter.spent();
            proptest::prop_assert!(spent.input >= most.0 && spent.output >= most.1, "{spent:?} {most:?}");
            proptest::prop_assert_eq!(meter.reached().is_some(), spent.tokens() >= 1);
        }
    }
}
