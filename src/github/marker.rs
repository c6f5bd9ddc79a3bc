//! fro-bot's mark on its own comments: routing skips a comment that carries it, so fro-bot never
//! answers itself (docs/security.md).

/// Ends every response comment, on a line of its own (and lets a later run find them).
pub const MARKER: &str = "<!-- fro-bot:response -->";

/// Whether `body` is one of fro-bot's responses: the marker on a line of its own (a quote of a
/// response, `> <!-- … -->`, is a person's comment and does not count).
pub fn carries_marker(body: &str) -> bool {
    body.lines().any(|l| l.trim() == MARKER)
}
