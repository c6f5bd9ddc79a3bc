//! Fenced blocks GitHub renders itself rather than shows as code: a Mermaid diagram (its image
//! nodes and HTML labels fetch their URLs as the page renders), a GeoJSON or TopoJSON map, an
//! ASCII STL model, and math (nothing in it is fetched as far as we know, but it is rendered, so
//! it gets the same rule). [`rendered`] finds their openers however the Markdown around them
//! parses — in block quotes, list items and footnotes too, the info string read as GitHub's
//! parser reads it (escapes and character references undone, the first word, any case) — and
//! each one's body up to where it surely ends ([`closes`]); the caller judges the URLs in the
//! body ([`urls`]).

use std::ops::Range;

use super::{bare, html};

/// The languages GitHub renders; an info string whose first word starts with one counts.
pub const RENDERED: &[&str] = &["mermaid", "geojson", "topojson", "stl", "math"];

/// One fence GitHub may render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Where its info string starts.
    pub info: usize,
    /// Its lines after the opener, to the closing fence or the end of the text.
    pub body: Range<usize>,
}

/// A fence's opening line, read past its container markers.
struct Opener {
    /// `` ` `` or `~`, and how many.
    mark: u8,
    len: usize,
    /// Where the fence starts in its line, and how many `>` come before it.
    column: usize,
    quotes: usize,
    /// Where its info string starts in the line, and the string.
    info: usize,
}

/// Every fence in `text` whose info string names a language GitHub renders.
pub fn rendered(text: &str) -> Vec<Fence> {
    let lines: Vec<(usize, &str)> = text
        .split_inclusive('\n')
        .scan(0, |at, line| {
            let start = *at;
            *at += line.len();
            Some((start, line))
        })
        .collect();
    let mut out = Vec::new();
    for (n, (start, line)) in lines.iter().enumerate() {
        let Some(o) = opener(line) else { continue };
        if !renders(&line[o.info..]) {
            continue;
        }
        let from = start + line.len();
        let end = lines[n + 1..]
            .iter()
            .find(|(_, l)| closes(&o, l))
            .map_or(text.len(), |(s, _)| *s);
        out.push(Fence {
            info: start + o.info,
            body: from..end.max(from),
        });
    }
    out
}

/// The line as a fence's opener: past spaces, tabs, `>`, list markers and a footnote's label, a
/// run of three or more backticks or tildes.
fn opener(line: &str) -> Option<Opener> {
    let b = line.as_bytes();
    let (mut i, mut quotes) = (0, 0);
    loop {
        let before = i;
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'>') {
            quotes += usize::from(b[i] == b'>');
            i += 1;
        }
        i = past_list_marker(b, i);
        if b[i..].starts_with(b"[^") {
            i = b[i..]
                .windows(2)
                .position(|w| w == b"]:")
                .map_or(i, |p| i + p + 2);
        }
        if i == before {
            break;
        }
    }
    let mark = *b.get(i).filter(|c| matches!(c, b'`' | b'~'))?;
    let len = b[i..].iter().take_while(|c| **c == mark).count();
    if len < 3 {
        return None;
    }
    let mut info = i + len;
    while info < b.len() && matches!(b[info], b' ' | b'\t') {
        info += 1;
    }
    Some(Opener {
        mark,
        len,
        column: i,
        quotes,
        info,
    })
}

/// Past a bullet (`-`, `*`, `+`) or an ordered list's marker (`1.`, `1)`) followed by a space.
fn past_list_marker(b: &[u8], i: usize) -> usize {
    let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    let end = match b.get(i) {
        Some(b'-' | b'*' | b'+') => i + 1,
        _ if (1..10).contains(&digits) && matches!(b.get(i + digits), Some(b'.' | b')')) => {
            i + digits + 1
        }
        _ => return i,
    };
    match b.get(end) {
        Some(b' ' | b'\t') => end + 1,
        _ => i,
    }
}

/// Whether the info string's first word names a language GitHub renders, read as GitHub's
/// parser reads it: backslash escapes and character references undone, any case.
fn renders(info: &str) -> bool {
    let mut unescaped = String::with_capacity(info.len());
    let mut chars = info.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('\\', Some(n)) if n.is_ascii_punctuation() => {}
            _ => unescaped.push(c),
        }
    }
    let decoded = html::decode_known(&unescaped);
    let word = decoded.split_whitespace().next().unwrap_or("");
    let word = word.to_lowercase();
    RENDERED.iter().any(|l| word.starts_with(l))
}

/// Whether `line` surely closes the fence `o` opened, whatever the containers: the same number
/// of `>` before it, no tab, no deeper than the opener, the same mark at least as many times and
/// nothing after it. A line that closes it only for some reading does not, so the body is never
/// shorter than GitHub's.
fn closes(o: &Opener, line: &str) -> bool {
    let b = line.as_bytes();
    let mut i = 0;
    let mut quotes = 0;
    while i < b.len() && matches!(b[i], b' ' | b'>') {
        quotes += usize::from(b[i] == b'>');
        i += 1;
    }
    let run = b[i..].iter().take_while(|c| **c == o.mark).count();
    quotes == o.quotes && i <= o.column && run >= o.len && line[i + run..].trim().is_empty()
}

/// Every URL a fence's body may hold: written plainly or with character references, and every
/// `//host` (as a browser would read one in an attribute or a label).
pub fn urls(body: &str) -> Vec<String> {
    let decoded = html::decode_known(body);
    let mut out = Vec::new();
    for text in [body, decoded.as_str()] {
        out.extend(bare::find(text).into_iter().map(|f| f.url));
        out.extend(loose(text));
        out.extend(html::urls(text).into_iter().filter_map(|u| match u {
            html::Url::Written(u) => Some(u),
            html::Url::Unreadable => None,
        }));
    }
    out.sort();
    out.dedup();
    out
}

const MAX_TOKEN: usize = 2048;

/// Each `//` and each `www.` (inside a word too) with the token after it, as a URL: a renderer
/// reading a label or a property may not ask for the word boundary GitHub's autolinks do.
fn loose(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let b = text.as_bytes();
    let mut out = Vec::new();
    for (mark, prefix) in [("//", ""), ("www.", "http://")] {
        let mut i = 0;
        while let Some(p) = lower[i..].find(mark) {
            let start = i + p;
            let from = start + mark.len();
            // Every `//` on its own (one token can hide another after an allowed host), each
            // token cut to `MAX_TOKEN` bytes (its host comes first).
            let end = b[from..]
                .iter()
                .take(MAX_TOKEN)
                .position(|c| c.is_ascii_whitespace() || b"\"'<>".contains(c))
                .map_or((from + MAX_TOKEN).min(b.len()), |e| from + e);
            if end > from && text.is_char_boundary(end) {
                out.push(format!("{prefix}{}", &text[start..end]));
            }
            i = from;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infos(text: &str) -> Vec<(&str, &str)> {
        rendered(text)
            .into_iter()
            .map(|f| {
                (
                    &text[f.info..f.info + 7.min(text.len() - f.info)],
                    &text[f.body],
                )
            })
            .collect()
    }

    #[test]
    fn rendered_fences_are_found_in_every_container_with_the_body_they_surely_have() {
        assert_eq!(infos("```mermaid\na\n```\nb"), vec![("mermaid", "a\n")]);
        assert_eq!(
            infos("> - ~~~~ GeoJSON x\n>   a\n>   ~~~~\n"),
            vec![("GeoJSON", ">   a\n")]
        );
        assert_eq!(infos("```&#109;ermaid\na"), vec![("&#109;e", "a")]);
        assert_eq!(infos("```math\\-x\na"), vec![("math\\-x", "a")]);
        assert!(infos("```\\math\na").is_empty());
        // Not surely closed: deeper, in another quote, or not a closing fence.
        assert_eq!(
            infos("```stl\na\n    ```\n> ```\n```x\n- ```\nz"),
            vec![("stl\na\n ", "a\n    ```\n> ```\n```x\n- ```\nz")]
        );
        assert!(infos("```text mermaid\na\n```").is_empty());
        assert!(infos("``mermaid\na").is_empty());
    }

    #[test]
    fn a_body_s_urls_are_read_plain_referenced_and_protocol_relative() {
        let u = urls("A[<img src='https&#58;//a.example/p'>] --> B\nclick B \"//b.example\"");
        assert!(u.contains(&"https://a.example/p".to_string()), "{u:?}");
        assert!(u.contains(&"//b.example".to_string()), "{u:?}");
        assert!(urls("graph TD\nA-->B").is_empty());
        assert_eq!(urls("xwww.c.example"), vec!["http://www.c.example"]);
        assert!(urls("https://github.com/o)//d.example/x").contains(&"//d.example/x".to_string()));
    }
}
