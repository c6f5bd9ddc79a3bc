//! The one writer of the job log: fro-bot's own workflow commands (`::add-mask::`, `::group::`,
//! `::warning::`, `::error::`, `::debug::`), every other line through [`print`] made inert
//! (`runner::lines`), secret registration (with the one redactor, `crate::redact`), and the
//! tracing output that turns WARN/ERROR events into annotations. Nothing else in fro-bot writes
//! to stdout or stderr (docs/security.md "What fro-bot prints").

use std::fmt;
use std::io::Write;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::{format::Writer, FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether workflow commands are printed: only a runner reads them. In a terminal `::add-mask::`
/// would print the very secret it names, and the rest is noise, so groups and annotations become
/// plain lines there. Set once by [`init_tracing`]; on by default.
static ON_RUNNER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

fn on_runner() -> bool {
    ON_RUNNER.load(std::sync::atomic::Ordering::Relaxed)
}

/// Registers a secret with the one redactor ([`crate::redact`]), then tells the runner to mask
/// each new form of it, before anything could print it.
pub fn add_mask(secret: &str) {
    for form in crate::redact::register(secret) {
        if on_runner() {
            command_line(&format!("::add-mask::{}", escape_data(&form)));
        }
    }
}

/// The one redactor's text form: registered secrets and token shapes become `***`.
pub use crate::redact::redact;

/// Starts a collapsible log group. Pair with [`end_group`] (or use [`Group`]).
pub fn start_group(title: &str) {
    match on_runner() {
        true => command_line(&format!("::group::{}", escape_data(&redact(title)))),
        false => print(&format!("── {title} ──")),
    }
}

pub fn end_group() {
    if on_runner() {
        command_line("::endgroup::");
    }
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
    match on_runner() {
        true => command_line(&format_annotation(kind, &redact(message), at)),
        false => print(&format!("{kind}: {message}")),
    }
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

/// Prints any text — the agent's, GitHub's, fro-bot's own — as inert lines (`runner::lines`):
/// redacted, and no line of it can be read as a workflow command.
pub fn print(text: &str) {
    write_lines(&mut std::io::stdout().lock(), text);
}

/// [`print`] to stderr, for the few messages printed before the log is set up or by a panic.
pub fn print_err(text: &str) {
    write_lines(&mut std::io::stderr().lock(), text);
}

fn write_lines(out: &mut dyn Write, text: &str) {
    let mut block = String::new();
    for line in super::lines::inert(text) {
        block.push_str(&line);
        block.push('\n');
    }
    let _ = out.write_all(block.as_bytes());
    let _ = out.flush();
}

/// One of fro-bot's own workflow commands, built by this module with its data escaped: the only
/// way a line starting `::` reaches stdout. One write, so it never interleaves mid-line.
fn command_line(line: &str) {
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
        let level = *event.metadata().level();
        let text = match (self.github_actions, level) {
            (true, Level::ERROR) => {
                format_annotation("error", &redact(&message), &Location::default())
            }
            (true, Level::WARN) => {
                format_annotation("warning", &redact(&message), &Location::default())
            }
            (true, Level::DEBUG | Level::TRACE) => {
                format!("::debug::{}", escape_data(&redact(&message)))
            }
            (_, Level::INFO) => return plain(&mut writer, &message),
            (false, other) => {
                let line = format!("{}: {message}", other.as_str().to_lowercase());
                return plain(&mut writer, &line);
            }
        };
        writeln!(writer, "{text}")
    }
}

/// An event's text as inert lines (`runner::lines`).
fn plain(writer: &mut Writer<'_>, text: &str) -> fmt::Result {
    for line in super::lines::inert(text) {
        writeln!(writer, "{line}")?;
    }
    Ok(())
}

/// Installs the global tracing subscriber (log commands on a runner, plain lines locally) and a
/// panic message that goes through the same writer.
/// `FRO_BOT_LOG` (an `EnvFilter`-free level name) raises verbosity; default is INFO.
pub fn init_tracing(github_actions: bool) {
    ON_RUNNER.store(github_actions, std::sync::atomic::Ordering::Relaxed);
    let level = std::env::var(super::env::FRO_BOT_LOG)
        .ok()
        .and_then(|v| v.parse::<Level>().ok())
        .unwrap_or(Level::INFO);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stdout)
        .event_format(ActionsFormat { github_actions })
        .try_init();
    // A panic's message can quote any text: it is printed inert like every other line.
    std::panic::set_hook(Box::new(|info| print_err(&format!("fro-bot {info}"))));
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
}
