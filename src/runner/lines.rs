//! Lines as the runner reads them, and text made into lines the runner can never read as a
//! workflow command (docs/security.md "What fro-bot prints").
//!
//! The runner reads a step's output with .NET's `ReadLine` — a line ends at `\n`, a bare `\r` or
//! `\r\n` — and carries out a line as a command when, after leading whitespace, it starts
//! `::name::` (v2), or when it holds `##[name]` anywhere (v1). Its comparisons are culture
//! sensitive, so invisible characters between those marks may not count. [`inert`] makes every
//! line of a text safe against all of that, whoever wrote the text.

/// The lines of `content` as the runner reads them (`StreamReader.ReadLine`): a line ends at
/// `\n`, a bare `\r` or `\r\n`; no empty line after a final terminator.
pub fn split(content: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut rest = content;
    while let Some(at) = rest.find(['\r', '\n']) {
        lines.push(&rest[..at]);
        let width = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
        rest = &rest[at + width..];
    }
    if !rest.is_empty() {
        lines.push(rest);
    }
    lines
}

/// `text` redacted, as the lines the runner will see, each made inert: controls shown escaped, no
/// line can start a v2 command and none holds a v1 mark. An empty text is one empty line.
pub fn inert(text: &str) -> Vec<String> {
    let redacted = crate::redact::redact(text);
    let lines: Vec<String> = split(&redacted).into_iter().map(inert_line).collect();
    match lines.is_empty() {
        true => vec![String::new()],
        false => lines,
    }
}

/// One line (no terminator in it) made inert.
fn inert_line(line: &str) -> String {
    guard_start(&break_v1_marks(&show_controls(line)))
}

/// Controls (but the tab) and the characters that reorder or break a line on screen become
/// visible escapes, `\u{1b}`: a terminal or the log viewer then shows what the text holds.
fn show_controls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        match c != '\t' && (c.is_control() || reorders(c)) {
            true => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            false => out.push(c),
        }
    }
    out
}

/// Bidirectional controls and the line/paragraph separators.
fn reorders(c: char) -> bool {
    matches!(c as u32, 0x061C | 0x200E | 0x200F | 0x2028..=0x202E | 0x2066..=0x2069)
}

/// Characters a culture-sensitive comparison might pass over, or that are not plain ASCII
/// marks: anything outside ASCII that is not a letter or digit. Treating them all as invisible
/// over-protects (a `#→[` gains a space too) and never under-protects.
fn faint(c: char) -> bool {
    !c.is_ascii() && !c.is_alphanumeric()
}

/// A `[` whose nearest visible character before it is `#` gets a space before it, so no
/// `##[name]` can form — also not across invisible characters.
fn break_v1_marks(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut last_visible = None;
    for c in line.chars() {
        if c == '[' && last_visible == Some('#') {
            out.push(' ');
        }
        out.push(c);
        if !faint(c) {
            last_visible = Some(c);
        }
    }
    out
}

/// A line whose first visible character (after whitespace and faint characters) is `:` has
/// that colon followed by a space: `::name::` becomes `: :name::`, which no runner reads.
fn guard_start(line: &str) -> String {
    let first = line
        .char_indices()
        .find(|(_, c)| !c.is_whitespace() && !faint(*c));
    match first {
        Some((at, ':')) => format!("{}: {}", &line[..at], &line[at + 1..]),
        _ => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_where_the_runner_splits() {
        assert_eq!(split("a\rb\r\nc\nd"), ["a", "b", "c", "d"]);
        assert_eq!(split("a\n"), ["a"]);
        assert_eq!(split("\n\n"), ["", ""]);
        assert!(split("").is_empty());
    }

    #[test]
    fn every_line_a_bare_return_starts_is_guarded() {
        let text = "ok\r::set-output name=pr-url::https://evil/\r  ::add-mask::widgets";
        assert_eq!(
            inert(text),
            [
                "ok",
                ": :set-output name=pr-url::https://evil/",
                "  : :add-mask::widgets"
            ]
        );
    }

    #[test]
    fn v1_marks_are_broken_also_across_invisible_characters() {
        assert_eq!(inert("say ##[add-mask]x"), ["say ## [add-mask]x"]);
        assert_eq!(inert("#\u{200b}#[x]"), ["#\u{200b}# [x]"]);
        assert_eq!(inert("##\u{200b}[x]"), ["##\u{200b} [x]"]);
        assert_eq!(inert("a [link] #tag"), ["a [link] #tag"]);
    }

    #[test]
    fn a_colon_behind_invisible_characters_is_guarded() {
        assert_eq!(inert("\u{200b}::x::y"), ["\u{200b}: :x::y"]);
        assert_eq!(inert("\u{3000}::x::y"), ["\u{3000}: :x::y"]);
        assert_eq!(inert("a::b::c"), ["a::b::c"]);
    }

    #[test]
    fn controls_and_reordering_characters_are_shown_escaped() {
        assert_eq!(
            inert("a\u{1b}[2Jb\tc\u{202e}d\u{85}e"),
            ["a\\u{1b}[2Jb\tc\\u{202e}d\\u{85}e"]
        );
    }
}
