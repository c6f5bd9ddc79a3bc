//! The one redactor (docs/security.md): every registered secret, in every form a tool or encoder
//! may have turned it into, and every well-known token shape become `***` — in the posted comment,
//! the step summary, the log, the run records and the session database.
//!
//! One process-wide registry: [`register`] (through `runner::log::add_mask`, which also tells the
//! runner) adds a secret; [`redact`] and friends read it.

use std::sync::{OnceLock, RwLock};

use serde_json::Value;

/// What a secret or token becomes.
pub const REDACTED: &str = "***";

/// Secrets shorter than this are not registered: masking "a" or "api" would blank ordinary words
/// everywhere and protect nothing.
pub const MIN_SECRET_LEN: usize = 4;

/// Encoded fragments (base64 at an offset) shorter than this are not registered: a few base64
/// characters occur by chance in ordinary text.
const MIN_ENCODED_LEN: usize = 8;

#[derive(Default)]
struct Registry {
    /// Every form of every secret, with its searcher built once (the database scrub calls the
    /// redactor for every value).
    needles: Vec<(String, memchr::memmem::Finder<'static>)>,
}

fn registry() -> &'static RwLock<Registry> {
    static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(Registry::default()))
}

/// Registers a secret (and each line of a multi-line one, as the runner masks per line) in all
/// its forms. Returns the forms that were new, for the runner's `::add-mask::`.
pub fn register(secret: &str) -> Vec<String> {
    let mut parts: Vec<&str> = vec![secret];
    if secret.contains(['\n', '\r']) {
        parts.extend(secret.lines());
    }
    let mut reg = registry().write().unwrap_or_else(|e| e.into_inner());
    let mut added = Vec::new();
    for part in parts {
        let part = part.trim();
        if part.len() < MIN_SECRET_LEN {
            continue;
        }
        for form in forms(part) {
            if !reg.needles.iter().any(|(n, _)| *n == form) {
                let finder = memchr::memmem::Finder::new(form.as_bytes()).into_owned();
                reg.needles.push((form.clone(), finder));
                added.push(form);
            }
        }
    }
    added
}

/// Whether any secret is registered (tests and diagnostics).
pub fn registered_forms() -> usize {
    registry().read().map_or(0, |r| r.needles.len())
}

/// The forms a secret takes on the way out: plain, JSON-escaped (once and twice, with `\/` too),
/// URL-encoded (form and RFC 3986, either hex case) and base64 (standard and URL-safe alphabets,
/// at each of the three byte alignments it can start at inside a longer encoded stream).
pub fn forms(secret: &str) -> Vec<String> {
    let mut out: Vec<String> = vec![secret.to_string()];
    let mut push = |s: String, min: usize| {
        if s.len() >= min && !out.contains(&s) {
            out.push(s);
        }
    };
    let json_once = json_escape(secret);
    push(json_once.replace('/', "\\/"), MIN_SECRET_LEN);
    push(json_escape(&json_once), MIN_SECRET_LEN);
    push(json_once, MIN_SECRET_LEN);
    let form: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
    push(form, MIN_SECRET_LEN);
    let pct = percent_encode(secret);
    push(pct.to_ascii_lowercase_hex(), MIN_SECRET_LEN);
    push(pct, MIN_SECRET_LEN);
    for engine in [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::URL_SAFE,
    ] {
        for offset in 0..3 {
            push(
                base64_core(engine, secret.as_bytes(), offset),
                MIN_ENCODED_LEN,
            );
        }
    }
    out
}

fn json_escape(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or(&quoted)
        .to_string()
}

/// Percent-encoding of everything but RFC 3986's unreserved characters, upper-case hex.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

trait LowerHex {
    fn to_ascii_lowercase_hex(&self) -> String;
}

impl LowerHex for String {
    /// `%2F` → `%2f`, leaving the other characters as they are.
    fn to_ascii_lowercase_hex(&self) -> String {
        let mut out = String::with_capacity(self.len());
        let mut chars = self.chars();
        while let Some(c) = chars.next() {
            out.push(c);
            if c == '%' {
                out.extend(chars.by_ref().take(2).map(|h| h.to_ascii_lowercase()));
            }
        }
        out
    }
}

/// The base64 characters determined by `bytes` alone when they start `offset` bytes into a
/// 3-byte group: what appears inside any longer stream that contains them at that alignment.
fn base64_core(engine: &impl base64::Engine, bytes: &[u8], offset: usize) -> String {
    let mut padded = vec![0u8; offset];
    padded.extend_from_slice(bytes);
    let encoded = engine.encode(&padded);
    let start = (8 * offset).div_ceil(6);
    let end = (8 * (offset + bytes.len())) / 6;
    encoded.get(start..end).unwrap_or("").to_string()
}

/// Replaces every registered secret and token shape in `text` with `***`.
pub fn redact(text: &str) -> String {
    redact_counted(text).0
}

/// [`redact`], also saying how many spans were replaced.
pub fn redact_counted(text: &str) -> (String, usize) {
    let (bytes, n) = redact_bytes(text.as_bytes());
    if n == 0 {
        return (text.to_string(), 0);
    }
    // Every replaced span starts and ends on a character boundary (needles are whole UTF-8
    // strings, shapes are ASCII), so this is valid UTF-8; lossy only as a guard.
    match String::from_utf8(bytes) {
        Ok(s) => (s, n),
        Err(e) => (String::from_utf8_lossy(e.as_bytes()).into_owned(), n),
    }
}

/// Where registered secrets and token shapes stand in `hay` (byte ranges, sorted by start; they
/// may overlap). The secret gate of a proposed change names the line of each, never the secret.
pub fn secret_spans(hay: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = shape_spans(hay);
    {
        let reg = registry().read().unwrap_or_else(|e| e.into_inner());
        for (needle, finder) in &reg.needles {
            spans.extend(finder.find_iter(hay).map(|at| (at, at + needle.len())));
        }
    }
    spans.sort_unstable();
    spans
}

/// Byte-level redaction, for values that may not be UTF-8 (database blobs).
pub fn redact_bytes(hay: &[u8]) -> (Vec<u8>, usize) {
    let spans = secret_spans(hay);
    if spans.is_empty() {
        return (hay.to_vec(), 0);
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut at = 0;
    let mut count = 0;
    let mut i = 0;
    while i < spans.len() {
        let (start, mut end) = spans[i];
        i += 1;
        while i < spans.len() && spans[i].0 < end {
            end = end.max(spans[i].1);
            i += 1;
        }
        out.extend_from_slice(&hay[at..start]);
        out.extend_from_slice(REDACTED.as_bytes());
        at = end;
        count += 1;
    }
    out.extend_from_slice(&hay[at..]);
    (out, count)
}

/// Redacts every string (keys included) of a JSON value; the result is always valid JSON.
pub fn redact_json(value: &Value) -> (Value, usize) {
    match value {
        Value::String(s) => {
            let (s, n) = redact_counted(s);
            (Value::String(s), n)
        }
        Value::Array(items) => {
            let mut n = 0;
            let items = items
                .iter()
                .map(|v| {
                    let (v, k) = redact_json(v);
                    n += k;
                    v
                })
                .collect();
            (Value::Array(items), n)
        }
        Value::Object(map) => {
            let mut n = 0;
            let map = map
                .iter()
                .map(|(k, v)| {
                    let (k, a) = redact_counted(k);
                    let (v, b) = redact_json(v);
                    n += a + b;
                    (k, v)
                })
                .collect();
            (Value::Object(map), n)
        }
        other => (other.clone(), 0),
    }
}

/// A well-known credential shape: a literal prefix and a run of body characters.
struct Shape {
    prefix: &'static str,
    body: fn(u8) -> bool,
    min: usize,
    /// The body is exactly `min` long and must not run on (AWS access key ids).
    exact: bool,
    /// Requires a digit in the body (cuts `sk-` slugs that are ordinary words).
    needs_digit: bool,
}

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}
fn alnum_underscore(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}
fn alnum_dash_underscore(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}
fn alnum_dash(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}
fn upper_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

const fn shape(prefix: &'static str, body: fn(u8) -> bool, min: usize) -> Shape {
    Shape {
        prefix,
        body,
        min,
        exact: false,
        needs_digit: false,
    }
}

/// GitHub tokens (`gh[pousr]_`, `github_pat_`), OpenAI/Anthropic keys (`sk-`, `sk-ant-`), AWS
/// access key ids (`AKIA`/`ASIA`), Slack tokens (`xox[abpors]-`). PEM blocks are found apart.
const SHAPES: &[Shape] = &[
    shape("ghp_", alnum, 20),
    shape("gho_", alnum, 20),
    shape("ghu_", alnum, 20),
    shape("ghs_", alnum, 20),
    shape("ghr_", alnum, 20),
    shape("github_pat_", alnum_underscore, 22),
    Shape {
        needs_digit: true,
        ..shape("sk-", alnum_dash_underscore, 20)
    },
    Shape {
        exact: true,
        ..shape("AKIA", upper_digit, 16)
    },
    Shape {
        exact: true,
        ..shape("ASIA", upper_digit, 16)
    },
    shape("xoxa-", alnum_dash, 10),
    shape("xoxb-", alnum_dash, 10),
    shape("xoxp-", alnum_dash, 10),
    shape("xoxo-", alnum_dash, 10),
    shape("xoxr-", alnum_dash, 10),
    shape("xoxs-", alnum_dash, 10),
];

fn shape_spans(hay: &[u8]) -> Vec<(usize, usize)> {
    static FINDERS: OnceLock<Vec<memchr::memmem::Finder<'static>>> = OnceLock::new();
    let finders = FINDERS.get_or_init(|| {
        SHAPES
            .iter()
            .map(|s| memchr::memmem::Finder::new(s.prefix.as_bytes()))
            .collect()
    });
    let mut spans = Vec::new();
    for (s, finder) in SHAPES.iter().zip(finders) {
        for at in finder.find_iter(hay) {
            // A token starts a word: `task-…` holds no `sk-` key, `xghp_…` no GitHub token.
            if at > 0 && alnum_dash_underscore(hay[at - 1]) {
                continue;
            }
            let body_start = at + s.prefix.len();
            let body_len = hay[body_start..]
                .iter()
                .take_while(|b| (s.body)(**b))
                .count();
            let ok = if s.exact {
                body_len == s.min
            } else {
                body_len >= s.min
            };
            let body = &hay[body_start..body_start + body_len];
            if ok && (!s.needs_digit || body.iter().any(u8::is_ascii_digit)) {
                spans.push((at, body_start + body_len));
            }
        }
    }
    spans.extend(pem_spans(hay));
    spans
}

/// `-----BEGIN … PRIVATE KEY-----` through its `-----END … -----` line; an unterminated block
/// goes to the end of its base64 body.
fn pem_spans(hay: &[u8]) -> Vec<(usize, usize)> {
    const BEGIN: &[u8] = b"-----BEGIN ";
    const END: &[u8] = b"-----END ";
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(pos) = memchr::memmem::find(&hay[from..], BEGIN) {
        let start = from + pos;
        let label_start = start + BEGIN.len();
        let Some(label_len) = memchr::memmem::find(&hay[label_start..], b"-----") else {
            break;
        };
        let label = &hay[label_start..label_start + label_len];
        let header_end = label_start + label_len + 5;
        from = header_end;
        let is_key = label.len() <= 40
            && memchr::memmem::find(label, b"PRIVATE KEY").is_some()
            && label
                .iter()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b' ');
        if !is_key {
            continue;
        }
        let end = match memchr::memmem::find(&hay[header_end..], END) {
            Some(e) => {
                let tail = header_end + e + END.len();
                match memchr::memmem::find(&hay[tail..], b"-----") {
                    Some(t) if t <= 40 => tail + t + 5,
                    _ => tail,
                }
            }
            None => header_end + unterminated_body_len(&hay[header_end..]),
        };
        spans.push((start, end));
        from = end;
    }
    spans
}

/// The base64 lines after an unterminated PEM header, up to a blank line or other text.
fn unterminated_body_len(rest: &[u8]) -> usize {
    // The header's own line break.
    let mut len = match rest {
        [b'\r', b'\n', ..] => 2,
        [b'\n', ..] => 1,
        _ => 0,
    };
    for line in rest[len..].split_inclusive(|b| *b == b'\n') {
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let body = body.strip_suffix(b"\r").unwrap_or(body);
        let ok = !body.is_empty()
            && body
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'\\'));
        if !ok {
            break;
        }
        len += line.len();
    }
    len
}

/// Makes `@handle` mentions inert (`` `@handle` ``) so an answer cannot ping people or trigger
/// bots, except `keep` (the person who asked). Code spans and fenced blocks are left alone: GitHub
/// does not notify from them, and their text may be copied.
pub fn neutralize_mentions(text: &str, keep: Option<&str>) -> String {
    let keep = keep.map(|k| k.trim_start_matches('@').to_ascii_lowercase());
    let mut out = String::with_capacity(text.len() + 16);
    let mut fence: Option<&str> = None;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (Some(open), Some(m)) if m == open => {
                fence = None;
                out.push_str(line);
                continue;
            }
            (Some(_), _) => {
                out.push_str(line);
                continue;
            }
            (None, Some(m)) => {
                fence = Some(m);
                out.push_str(line);
                continue;
            }
            (None, None) => {}
        }
        neutralize_line(line, keep.as_deref(), &mut out);
    }
    out
}

fn neutralize_line(line: &str, keep: Option<&str>, out: &mut String) {
    let bytes = line.as_bytes();
    let mut i = 0;
    let mut in_code: Option<usize> = None;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'`' {
            let run = bytes[i..].iter().take_while(|c| **c == b'`').count();
            in_code = match in_code {
                None => Some(run),
                Some(open) if open == run => None,
                other => other,
            };
            out.push_str(&line[i..i + run]);
            i += run;
            continue;
        }
        let mention_start =
            b == b'@' && in_code.is_none() && (i == 0 || !is_mention_prefix_char(bytes[i - 1]));
        if mention_start {
            let handle_len = mention_len(&bytes[i + 1..]);
            if handle_len > 0 {
                let handle = &line[i + 1..i + 1 + handle_len];
                let login = handle.split('/').next().unwrap_or(handle);
                if keep.is_some_and(|k| k.eq_ignore_ascii_case(login)) {
                    out.push_str(&line[i..i + 1 + handle_len]);
                } else {
                    out.push('`');
                    out.push_str(&line[i..i + 1 + handle_len]);
                    out.push('`');
                }
                i += 1 + handle_len;
                continue;
            }
        }
        // Copy one character (not byte).
        let ch_len = line[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&line[i..i + ch_len]);
        i += ch_len;
    }
}

/// Characters that make an `@` part of a word, an address or a path rather than a mention.
fn is_mention_prefix_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@' | b'/' | b'`')
}

/// Length of a GitHub handle (`login` or `org/team`) at the start of `rest`.
fn mention_len(rest: &[u8]) -> usize {
    let handle = |s: &[u8]| {
        s.iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'-' || **b == b'_')
            .count()
    };
    let first = handle(rest);
    if first == 0 || !rest[0].is_ascii_alphanumeric() {
        return 0;
    }
    if rest.get(first) == Some(&b'/') {
        let team = handle(&rest[first + 1..]);
        if team > 0 {
            return first + 1 + team;
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    // The registry is process-wide: every test registers secrets of its own.

    #[test]
    fn every_form_of_a_registered_secret_is_redacted() {
        let secret = "s3cr3t/Value+with \"quote\"&amp";
        register(secret);
        let json = serde_json::to_string(secret).unwrap();
        let json_text = &json[1..json.len() - 1];
        let double = serde_json::to_string(&json).unwrap();
        let form: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
        let cases = [
            secret.to_string(),
            json_text.to_string(),
            json_text.replace('/', "\\/"),
            double,
            form,
            percent_encode(secret),
            percent_encode(secret).to_ascii_lowercase_hex(),
        ];
        for case in cases {
            let text = format!("before {case} after");
            let out = redact(&text);
            assert!(!out.contains("s3cr3t"), "{case:?} → {out:?}");
            assert!(!out.contains(&case), "{case:?} survived in {out:?}");
            assert!(
                out.starts_with("before ") && out.ends_with(" after"),
                "{out}"
            );
        }
    }

    #[test]
    fn base64_at_every_alignment_and_alphabet_is_redacted() {
        let secret = "b64-secret-~~~???-value";
        register(secret);
        for engine in [
            &base64::engine::general_purpose::STANDARD,
            &base64::engine::general_purpose::URL_SAFE,
            &base64::engine::general_purpose::STANDARD_NO_PAD,
        ] {
            for prefix in ["", "x", "xy", "user:"] {
                let encoded = engine.encode(format!("{prefix}{secret} and more"));
                let out = redact(&format!("Authorization: Basic {encoded}"));
                assert!(out.contains(REDACTED), "{prefix:?}: {encoded} → {out}");
                // What is left cannot be decoded back into the secret.
                let left = out.trim_start_matches("Authorization: Basic ");
                for part in left.split(REDACTED) {
                    let decoded = engine
                        .decode(part.trim_end_matches('='))
                        .unwrap_or_default();
                    assert!(
                        !String::from_utf8_lossy(&decoded).contains("secret-~~~"),
                        "{part}"
                    );
                }
            }
        }
    }

    #[test]
    fn multi_line_secrets_are_redacted_whole_and_per_line() {
        register("line-one-secret\nline-two-secret");
        register("api"); // too short to register
        let text = redact("key line-two-secret via api");
        assert_eq!(text, "key *** via api");
        assert_eq!(redact("a line-one-secret\nline-two-secret b"), "a *** b");
    }

    #[test]
    fn well_known_token_shapes_are_redacted_without_registration() {
        let gh = format!("ghp_{}", "A1b2C3d4".repeat(5));
        let shapes = [
            gh.clone(),
            format!("gho_{}", "z9".repeat(18)),
            format!("ghu_{}", "Q".repeat(36)),
            format!("ghs_{}", "k7".repeat(18)),
            format!("ghr_{}", "r0".repeat(18)),
            format!("github_pat_11ABCDEFG0{}", "x_Y1".repeat(15)),
            "sk-proj-AbCdEf0123456789GhIjKl".to_string(),
            "sk-ant-api03-AbC_dEf-0123456789abcdefXYZ".to_string(),
            "sk-0123456789abcdefABCDEF".to_string(),
            "AKIAIOSFODNN7EXAMPLE".to_string(),
            "ASIA0123456789ABCDEF".to_string(),
            "xoxb-1234567890-abcdefghij".to_string(),
            "xoxp-1234-5678-abcdefgh".to_string(),
        ];
        for token in &shapes {
            for wrap in ["{t}", "token={t}&x=1", "\"{t}\"", "(`{t}`)", "x\n{t}\ny"] {
                let text = wrap.replace("{t}", token);
                let (out, n) = redact_counted(&text);
                assert_eq!(n, 1, "{text:?} → {out:?}");
                assert_eq!(out, wrap.replace("{t}", REDACTED), "{text:?}");
            }
        }
    }

    #[test]
    fn pem_private_key_blocks_are_redacted_whole() {
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy\n0AHB7MhgHcTz6sE2I2yPB\n-----END RSA PRIVATE KEY-----";
        let out = redact(&format!("key:\n{pem}\ndone"));
        assert_eq!(out, "key:\n***\ndone");
        // JSON-escaped, as inside a tool result.
        let escaped = json_escape(pem);
        assert_eq!(redact(&format!("\"{escaped}\"")), "\"***\"");
        // Unterminated (cut by a truncation): the body still goes.
        let cut = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nAAAA";
        assert_eq!(redact(&format!("{cut}\n\nafter: ok")), "***\nafter: ok");
        // Public material is not a secret.
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";
        assert_eq!(redact(cert), cert);
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        for text in [
            "the task-force met; risk-assessment-2024-report is due",
            "ask-me-anything-about-version-2 of the sk-learn port",
            "sk-this-is-just-a-long-slug-name-here",
            "ghp_short and ghs_ alone",
            "AKIAIOSFODNN7EXAMPLEMORE is too long, AKIA123 too short",
            "xoxb- nothing, xox-1234567890ab",
            "base64 like SGVsbG8gd29ybGQ= stays",
            "mail me@example.com, see https://x.y/@user",
            "",
        ] {
            assert_eq!(redact(text), text);
        }
    }

    #[test]
    fn overlapping_matches_become_one_redaction_and_counts_are_spans() {
        register("overlap-secret-aaaa");
        register("secret-aaaa-tail");
        let (out, n) = redact_counted("x overlap-secret-aaaa-tail y overlap-secret-aaaa");
        assert_eq!(out, "x *** y ***");
        assert_eq!(n, 2);
    }

    #[test]
    fn bytes_and_json_are_redacted_too() {
        register("blob-secret-1234");
        let mut blob = vec![0xff, 0x00];
        blob.extend_from_slice(b"blob-secret-1234");
        blob.push(0xfe);
        let (out, n) = redact_bytes(&blob);
        assert_eq!(n, 1);
        assert_eq!(out, [&[0xff, 0x00][..], b"***", &[0xfe]].concat());

        let v = serde_json::json!({"a": ["x blob-secret-1234"], "blob-secret-1234": 1, "n": 2});
        let (v, n) = redact_json(&v);
        assert_eq!(n, 2);
        assert_eq!(v, serde_json::json!({"a": ["x ***"], "***": 1, "n": 2}));
    }

    #[test]
    fn mentions_are_neutralized_except_the_requesters_and_code() {
        let text = "Thanks @mona! cc @fro-bot and @octo/team.\nmail a@b.io\n`@inline` \
                    again @Mona, @x_";
        let out = neutralize_mentions(text, Some("mona"));
        assert_eq!(
            out,
            "Thanks @mona! cc `@fro-bot` and `@octo/team`.\nmail a@b.io\n`@inline` \
             again @Mona, `@x_`"
        );
        // A fenced block on its own lines is left alone.
        let fenced = "before @a\n```sh\nnpm i @scope/pkg\n```\nafter @b\n";
        assert_eq!(
            neutralize_mentions(fenced, None),
            "before `@a`\n```sh\nnpm i @scope/pkg\n```\nafter `@b`\n"
        );
        assert_eq!(neutralize_mentions("@ alone, @-x", None), "@ alone, @-x");
    }
}
