//! A pull request's diff (the unified diff GitHub serves for `application/vnd.github.diff`), read
//! into files and hunks, and the check every review comment passes before it is posted: its file
//! is in the diff, and its line — and a multi-line comment's first line — lie in one hunk on the
//! side it names. A comment that fails is told the nearest hunk, so the agent can fix it within
//! its turn (docs/design.md#pull-request-review).

use std::collections::BTreeMap;

use crate::safe_outputs::proposals::Side;

/// One line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Context { old: u32, new: u32, text: String },
    Added { new: u32, text: String },
    Removed { old: u32, text: String },
}

impl Line {
    /// This line's number on `side`, if it has one there.
    pub fn number(&self, side: Side) -> Option<u32> {
        match (self, side) {
            (Line::Context { old, .. }, Side::Left) | (Line::Removed { old, .. }, Side::Left) => {
                Some(*old)
            }
            (Line::Context { new, .. }, Side::Right) | (Line::Added { new, .. }, Side::Right) => {
                Some(*new)
            }
            (Line::Added { .. }, Side::Left) | (Line::Removed { .. }, Side::Right) => None,
        }
    }

    pub fn text(&self) -> &str {
        match self {
            Line::Context { text, .. } | Line::Added { text, .. } | Line::Removed { text, .. } => {
                text
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    pub lines: Vec<Line>,
}

impl Hunk {
    /// The first and last line number the hunk covers on `side`.
    pub fn span(&self, side: Side) -> Option<(u32, u32)> {
        let mut numbers = self.lines.iter().filter_map(|l| l.number(side));
        let first = numbers.next()?;
        Some((first, numbers.next_back().unwrap_or(first)))
    }

    fn has(&self, side: Side, n: u32) -> bool {
        self.lines.iter().any(|l| l.number(side) == Some(n))
    }
}

/// The pull request's diff: path (its head name) → hunks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullDiff {
    pub files: BTreeMap<String, Vec<Hunk>>,
}

/// Why a comment cannot be anchored; each names what the agent can fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unanchored {
    NotInDiff {
        path: String,
    },
    NotInHunk {
        path: String,
        line: u32,
        side: Side,
        /// The nearest hunk's span on that side.
        nearest: Option<(u32, u32)>,
    },
    /// `start_line` not before `line`, or the two in different hunks.
    BadRange {
        path: String,
        start_line: u32,
        line: u32,
    },
}

impl Unanchored {
    pub fn describe(&self) -> String {
        match self {
            Unanchored::NotInDiff { path } => format!("{path} is not changed by this pull request"),
            Unanchored::NotInHunk {
                path,
                line,
                side,
                nearest,
            } => {
                let near = match nearest {
                    Some((a, b)) => format!("; the nearest hunk there covers lines {a}-{b}"),
                    None => format!("; the diff has no {} lines in it", side.as_str()),
                };
                format!(
                    "{path} line {line} ({}) is not in the diff{near}",
                    side.as_str()
                )
            }
            Unanchored::BadRange {
                path,
                start_line,
                line,
            } => format!(
                "{path} lines {start_line}-{line}: start_line must be before line, in the same hunk"
            ),
        }
    }
}

impl PullDiff {
    /// Reads a unified diff. Lines it does not know (`index`, mode lines, `Binary files …`) are
    /// skipped; a binary or renamed-only file has no hunks, so nothing anchors in it.
    pub fn parse(text: &str) -> PullDiff {
        let mut diff = PullDiff::default();
        let mut path: Option<String> = None;
        let mut hunk: Option<(Hunk, u32, u32)> = None;
        fn flush(diff: &mut PullDiff, path: &Option<String>, hunk: &mut Option<(Hunk, u32, u32)>) {
            if let (Some(p), Some((h, _, _))) = (path, hunk.take()) {
                diff.files.entry(p.clone()).or_default().push(h);
            }
        }
        for line in text.lines() {
            if line.starts_with("diff --git ") {
                flush(&mut diff, &path, &mut hunk);
                path = None;
            } else if let Some(p) = line.strip_prefix("+++ ") {
                flush(&mut diff, &path, &mut hunk);
                path = p.strip_prefix("b/").map(str::to_string);
            } else if let Some(header) = line.strip_prefix("@@ ") {
                flush(&mut diff, &path, &mut hunk);
                hunk = hunk_start(header).map(|(old, new)| (Hunk { lines: Vec::new() }, old, new));
            } else if let Some((h, old, new)) = hunk.as_mut() {
                let (kind, rest) = line.split_at(line.len().min(1));
                let text = rest.to_string();
                match kind {
                    " " | "" => {
                        h.lines.push(Line::Context {
                            old: *old,
                            new: *new,
                            text,
                        });
                        *old = old.saturating_add(1);
                        *new = new.saturating_add(1);
                    }
                    "+" => {
                        h.lines.push(Line::Added { new: *new, text });
                        *new = new.saturating_add(1);
                    }
                    "-" => {
                        h.lines.push(Line::Removed { old: *old, text });
                        *old = old.saturating_add(1);
                    }
                    // `\ No newline at end of file` and anything else: not a line of either side.
                    _ => {}
                }
            }
        }
        flush(&mut diff, &path, &mut hunk);
        diff
    }

    /// Whether a comment on `path` at `line` (and from `start_line`) on `side` can be posted.
    pub fn anchor(
        &self,
        path: &str,
        line: u32,
        start_line: Option<u32>,
        side: Side,
    ) -> Result<&Hunk, Unanchored> {
        let hunks = self.files.get(path).ok_or_else(|| Unanchored::NotInDiff {
            path: path.to_string(),
        })?;
        let Some(hunk) = hunks.iter().find(|h| h.has(side, line)) else {
            return Err(Unanchored::NotInHunk {
                path: path.to_string(),
                line,
                side,
                nearest: nearest(hunks, side, line),
            });
        };
        match start_line {
            Some(start) if start >= line || !hunk.has(side, start) => Err(Unanchored::BadRange {
                path: path.to_string(),
                start_line: start,
                line,
            }),
            _ => Ok(hunk),
        }
    }

    /// The text of lines `from..=to` on `side` of `path` (for fingerprints and suggestions).
    pub fn lines(&self, path: &str, side: Side, from: u32, to: u32) -> Vec<&str> {
        self.files
            .get(path)
            .into_iter()
            .flatten()
            .flat_map(|h| h.lines.iter())
            .filter(|l| l.number(side).is_some_and(|n| (from..=to).contains(&n)))
            .map(Line::text)
            .collect()
    }
}

/// `-a,b +c,d @@ …` → the first old and new line numbers.
fn hunk_start(header: &str) -> Option<(u32, u32)> {
    let mut parts = header.split_whitespace();
    let number = |p: Option<&str>, sign: char| -> Option<u32> {
        p?.strip_prefix(sign)?.split(',').next()?.parse().ok()
    };
    let old = number(parts.next(), '-')?;
    let new = number(parts.next(), '+')?;
    // A hunk at line 0 (a new or emptied file) starts its lines at 1.
    Some((old.max(1), new.max(1)))
}

fn nearest(hunks: &[Hunk], side: Side, line: u32) -> Option<(u32, u32)> {
    hunks
        .iter()
        .filter_map(|h| h.span(side))
        .min_by_key(|(a, b)| {
            if line < *a {
                a - line
            } else {
                line.saturating_sub(*b)
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIFF: &str = "\
diff --git a/src/lib.rs b/src/lib.rs
index 1111111..2222222 100644
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -1,4 +1,5 @@
 fn a() {
-    old();
+    new();
+    more();
 }
 
@@ -20,3 +21,3 @@ fn b() {
 x
-y
+z
 w
diff --git a/docs/new.md b/docs/new.md
new file mode 100644
--- /dev/null
+++ b/docs/new.md
@@ -0,0 +1,2 @@
+# New
+page
\\ No newline at end of file
diff --git a/logo.png b/logo.png
Binary files a/logo.png and b/logo.png differ
";

    #[test]
    fn hunks_number_both_sides() {
        let d = PullDiff::parse(DIFF);
        assert_eq!(
            d.files.keys().collect::<Vec<_>>(),
            ["docs/new.md", "src/lib.rs"]
        );
        let h = &d.files["src/lib.rs"];
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].span(Side::Right), Some((1, 5)));
        assert_eq!(h[0].span(Side::Left), Some((1, 4)));
        assert_eq!(h[1].span(Side::Right), Some((21, 23)));
        assert_eq!(
            d.lines("src/lib.rs", Side::Right, 2, 3),
            ["    new();", "    more();"]
        );
        assert_eq!(d.lines("docs/new.md", Side::Right, 1, 2), ["# New", "page"]);
    }

    #[test]
    fn a_comment_anchors_only_inside_one_hunk_on_its_side() {
        let d = PullDiff::parse(DIFF);
        assert!(d.anchor("src/lib.rs", 3, Some(2), Side::Right).is_ok());
        assert!(
            d.anchor("src/lib.rs", 2, None, Side::Left).is_ok(),
            "the removed line"
        );
        assert!(d.anchor("docs/new.md", 2, Some(1), Side::Right).is_ok());
        assert_eq!(
            d.anchor("src/lib.rs", 18, None, Side::Right),
            Err(Unanchored::NotInHunk {
                path: "src/lib.rs".into(),
                line: 18,
                side: Side::Right,
                nearest: Some((21, 23)),
            })
        );
        assert!(matches!(
            d.anchor("src/lib.rs", 22, Some(3), Side::Right),
            Err(Unanchored::BadRange { .. })
        ));
        assert!(matches!(
            d.anchor("src/lib.rs", 3, Some(3), Side::Right),
            Err(Unanchored::BadRange { .. })
        ));
        assert!(matches!(
            d.anchor("README.md", 1, None, Side::Right),
            Err(Unanchored::NotInDiff { .. })
        ));
        assert!(matches!(
            d.anchor("logo.png", 1, None, Side::Right),
            Err(Unanchored::NotInDiff { .. })
        ));
        assert!(d
            .anchor("src/lib.rs", 18, None, Side::Right)
            .unwrap_err()
            .describe()
            .contains("nearest hunk there covers lines 21-23"));
    }

    #[test]
    fn hostile_headers_are_skipped_not_trusted() {
        let d =
            PullDiff::parse("+++ b/x\n@@ -a,b +c,d @@\n+y\n@@ -4294967295 +4294967295 @@\n+z\n");
        assert_eq!(d.files.get("x").map(Vec::len), Some(1));
        assert!(d.anchor("x", 4294967295, None, Side::Right).is_ok());
    }
}
