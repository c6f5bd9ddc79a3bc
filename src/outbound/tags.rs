//! Raw HTML as GitHub's parser (cmark-gfm) and then the browser read it, in whatever container it
//! sits: a tag may run over lines inside a block quote, a list item or an HTML block that
//! pulldown-cmark does not see, and GitHub's parser takes out each line's container markers
//! before the browser reads the tag. So every `<` and letter in the source is read here as the
//! start of a tag, however the Markdown around it parses, and its reach is measured as the browser
//! would measure it once the markers are gone ([`reach`]); the caller judges what lies in it.

use std::ops::Range;

/// A tag reaching further than this is not read: the caller treats it as holding a URL it may
/// not keep (no tag with only allowed URLs needs this much; a kept URL's parts are cut to 256
/// bytes).
pub const MAX_REACH: usize = 4096;

/// Every place a tag may start in `text`: `<` and an ASCII letter (the only start the browser's
/// tokenizer reads as a tag with attributes).
pub fn starts(text: &str) -> impl Iterator<Item = usize> + '_ {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(1)).filter(move |&i| b[i] == b'<' && b[i + 1].is_ascii_alphabetic())
}

/// The tag starting at `lt`, to its end as the browser's tokenizer reads it: the tag's name,
/// then attributes (a name, and after `=` a value, quoted or not) up to a `>` outside a value,
/// where each line's leading spaces, tabs and `>` (a block quote's markers, taken out before the
/// browser sees the tag) are passed over as space; to the end of the text when nothing closes it
/// (the browser's tag then runs into whatever GitHub renders next).
pub fn reach(text: &str, lt: usize) -> Range<usize> {
    let b = text.as_bytes();
    let name_end = |mut i: usize, stop: &[u8]| {
        while i < b.len() && !b[i].is_ascii_whitespace() && !stop.contains(&b[i]) {
            i += 1;
        }
        i
    };
    let mut i = name_end(lt + 1, b"/>");
    loop {
        i = space(b, i, true);
        match b.get(i) {
            None => return lt..b.len(),
            Some(b'>') => return lt..i + 1,
            // An attribute's name; a leading `=` is part of it.
            Some(_) => i = name_end(i + 1, b"/>="),
        }
        i = space(b, i, false);
        if b.get(i) != Some(&b'=') {
            continue;
        }
        i = space(b, i + 1, false);
        i = match b.get(i) {
            Some(&q @ (b'"' | b'\'')) => b[i + 1..]
                .iter()
                .position(|c| *c == q)
                .map_or(b.len(), |p| i + 2 + p),
            _ => name_end(i, b">"),
        };
    }
}

/// Past white space (and `/` between attributes, when `slash`), a line's leading `>` included.
fn space(b: &[u8], mut i: usize, slash: bool) -> usize {
    while let Some(&c) = b.get(i) {
        match c {
            b'\n' => i = past_markers(b, i + 1),
            b'/' if slash => i += 1,
            c if c.is_ascii_whitespace() => i += 1,
            _ => break,
        }
    }
    i
}

/// Past a line's leading spaces, tabs and `>`.
fn past_markers(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'>') {
        i += 1;
    }
    i
}

/// `fragment` with each later line's leading spaces, tabs and `>` taken out, as the browser sees
/// a tag GitHub's parser read inside a block quote.
pub fn unmarked(fragment: &str) -> String {
    let mut out = String::with_capacity(fragment.len());
    for (n, line) in fragment.split_inclusive('\n').enumerate() {
        match n {
            0 => out.push_str(line),
            _ => out.push_str(line.trim_start_matches([' ', '\t', '>'])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reached(text: &str) -> &str {
        let lt = starts(text).next().unwrap();
        &text[reach(text, lt)]
    }

    #[test]
    fn a_tag_reaches_past_quote_markers_and_quoted_closers_to_its_own_end() {
        assert_eq!(reached("a <b> c"), "<b>");
        assert_eq!(
            reached("> x <img\n> src=\"https://a.example/p\"> y"),
            "<img\n> src=\"https://a.example/p\">"
        );
        assert_eq!(
            reached("<img alt=\"a>b\" src=x> z"),
            "<img alt=\"a>b\" src=x>"
        );
        assert_eq!(reached("<div\nsrc=x"), "<div\nsrc=x");
        // A quote opens a value only after `=`.
        assert_eq!(
            reached("<img a\"b title=\"x>\" src=y> z"),
            "<img a\"b title=\"x>\" src=y>"
        );
        assert_eq!(reached("<img src = 'a>b' >"), "<img src = 'a>b' >");
        assert_eq!(
            unmarked("<img\n> > src=x\n>\tsrc=y>"),
            "<img\nsrc=x\nsrc=y>"
        );
        assert_eq!(starts("a < b <c <1").collect::<Vec<_>>(), vec![6]);
    }
}
