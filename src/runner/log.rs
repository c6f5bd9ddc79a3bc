//! Workflow log commands (`::add-mask::`, `::group::`, `::warning::`, `::error::`), the process-wide
//! secret list, and the tracing output that turns WARN/ERROR events into annotations.

use std::fmt;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::{format::Writer, FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Secrets shorter than this are not registered: masking "a" or "api" would blank ordinary words
/// everywhere in the log and protect nothing.
const MIN_SECRET_LEN: usize = 4;

/// Whether `::add-mask::` lines are printed: only a runner reads them; anywhere else they would
/// print the very secret they name. Set once by [`init_tracing`]; on by default.
static EMIT_MASKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

fn secrets() -> &'static Mutex<Vec<String>> {
    static SECRETS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    SECRETS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Registers a secret: tells the runner to mask it (before anything could print it) and remembers
/// it so [`redact`] removes it from our own messages, also where no runner masks them (local runs).
/// Each line of a multi-line secret is masked on its own too, as the runner masks per line.
pub fn add_mask(secret: &str) {
    let mut parts: Vec<&str> = vec![secret];
    if secret.contains(['\n', '\r']) {
        parts.extend(secret.lines());
    }
    let mut list = secrets().lock().unwrap_or_else(|e| e.into_inner());
    for part in parts {
        let part = part.trim();
        if part.len() < MIN_SECRET_LEN || list.iter().any(|s| s == part) {
            continue;
        }
        list.push(part.to_string());
        // Longest first, so a secret that contains another is replaced whole.
        list.sort_by_key(|s| std::cmp::Reverse(s.len()));
        if EMIT_MASKS.load(std::sync::atomic::Ordering::Relaxed) {
            emit(&format!("::add-mask::{}", escape_data(part)));
        }
    }
}

/// Replaces every registered secret in `text` with `***`.
pub fn redact(text: &str) -> String {
    let list = secrets().lock().unwrap_or_else(|e| e.into_inner());
    let mut out = text.to_string();
    for secret in list.iter() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

/// Starts a collapsible log group. Pair with [`end_group`] (or use [`Group`]).
pub fn start_group(title: &str) {
    emit(&format!("::group::{}", escape_data(&redact(title))));
}

pub fn end_group() {
    emit("::endgroup::");
}

/// A log group that ends when dropped, also on early return.
pub struct Group(());

impl Group {
    pub fn new(title: &str) -> Self {
        start_group(title);
        Group(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        end_group();
    }
}

/// Where an annotation points, when known.
#[derive(Debug, Default, Clone)]
pub struct Location<'a> {
    pub file: Option<&'a str>,
    pub line: Option<u32>,
    pub title: Option<&'a str>,
}

pub fn warning(message: &str) {
    annotation("warning", message, &Location::default());
}

pub fn error(message: &str) {
    annotation("error", message, &Location::default());
}

pub fn annotation(kind: &str, message: &str, at: &Location<'_>) {
    emit(&format_annotation(kind, &redact(message), at));
}

pub fn format_annotation(kind: &str, message: &str, at: &Location<'_>) -> String {
    let mut props = Vec::new();
    if let Some(title) = at.title {
        props.push(format!("title={}", escape_property(title)));
    }
    if let Some(file) = at.file {
        props.push(format!("file={}", escape_property(file)));
    }
    if let Some(line) = at.line {
        props.push(format!("line={line}"));
    }
    let props = if props.is_empty() {
        String::new()
    } else {
        format!(" {}", props.join(","))
    };
    format!("::{kind}{props}::{}", escape_data(message))
}

/// Escaping of a command's message, as the toolkit does it.
pub fn escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Escaping of a command property value.
pub fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// Log commands go to stdout in one write, so they never interleave with other output mid-line.
fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("{line}\n").as_bytes());
    let _ = out.flush();
}

/// Formats tracing events for the workflow log: WARN and ERROR become annotations (with the source
/// file and line when `annotate_source` is set), everything else a plain line. All text is redacted.
pub struct ActionsFormat {
    pub github_actions: bool,
}

impl<S, N> FormatEvent<S, N> for ActionsFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut message = String::new();
        ctx.format_fields(Writer::new(&mut message), event)?;
        let message = redact(&message);
        let level = *event.metadata().level();
        if self.github_actions {
            match level {
                Level::ERROR => writeln!(
                    writer,
                    "{}",
                    format_annotation("error", &message, &Location::default())
                ),
                Level::WARN => writeln!(
                    writer,
                    "{}",
                    format_annotation("warning", &message, &Location::default())
                ),
                Level::DEBUG | Level::TRACE => {
                    writeln!(writer, "::debug::{}", escape_data(&message))
                }
                Level::INFO => writeln!(writer, "{message}"),
            }
        } else {
            match level {
                Level::INFO => writeln!(writer, "{message}"),
                other => writeln!(writer, "{}: {message}", other.as_str().to_lowercase()),
            }
        }
    }
}

/// Installs the global tracing subscriber: log commands on a runner, plain lines locally.
/// `FRO_BOT_LOG` (an `EnvFilter`-free level name) raises verbosity; default is INFO.
pub fn init_tracing(github_actions: bool) {
    EMIT_MASKS.store(github_actions, std::sync::atomic::Ordering::Relaxed);
    let level = std::env::var(super::env::FRO_BOT_LOG)
        .ok()
        .and_then(|v| v.parse::<Level>().ok())
        .unwrap_or(Level::INFO);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stdout)
        .event_format(ActionsFormat { github_actions })
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_escape_like_the_toolkit() {
        assert_eq!(
            format_annotation("warning", "50% done\nnext", &Location::default()),
            "::warning::50%25 done%0Anext"
        );
        let at = Location {
            file: Some("src/a,b.rs"),
            line: Some(7),
            title: Some("t: x"),
        };
        assert_eq!(
            format_annotation("error", "boom", &at),
            "::error title=t%3A x,file=src/a%2Cb.rs,line=7::boom"
        );
    }

    #[test]
    fn redaction_removes_registered_secrets_and_their_lines() {
        add_mask("sk-test-secret-value-1");
        add_mask("line-one-secret\nline-two-secret");
        add_mask("api"); // too short to register
        let text = redact("key sk-test-secret-value-1 then line-two-secret via api");
        assert_eq!(text, "key *** then *** via api");
    }
}
