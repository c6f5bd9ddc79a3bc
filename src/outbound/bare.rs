//! URLs written as plain text. GitHub links `https://…` and `www.…` in text by itself; other
//! schemes (`ws://`, `smb://`, `ftp://`) are found too, so no scheme is a way around the check. The
//! scan errs on the side of a longer match: a token runs to whitespace, `<`, a quote or a backtick.

use std::ops::Range;

/// One URL-like token: where it is, and the URL it stands for (`www.x` is `http://www.x`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub at: Range<usize>,
    pub url: String,
}

/// Every URL-like token in `text`, in order, not overlapping.
pub fn find(text: &str) -> Vec<Found> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let start = if bytes[i..].starts_with(b"://") {
            scheme_start(bytes, i)
        } else if starts_www(bytes, i) {
            Some(i)
        } else {
            None
        };
        let Some(start) = start else {
            i += 1;
            continue;
        };
        let end = token_end(bytes, i);
        let token = &text[start..end];
        let url = match token.get(..4) {
            Some(w) if w.eq_ignore_ascii_case("www.") => format!("http://{token}"),
            _ => token.to_string(),
        };
        out.push(Found {
            at: start..end,
            url,
        });
        i = end.max(i + 1);
    }
    out
}

/// The start of the scheme before `://` at `colon`: a letter, then letters, digits, `+ - .`.
/// A bare `://host` (no scheme) counts too, from the colon.
fn scheme_start(bytes: &[u8], colon: usize) -> Option<usize> {
    let mut s = colon;
    while s > 0 && (bytes[s - 1].is_ascii_alphanumeric() || b"+-.".contains(&bytes[s - 1])) {
        s -= 1;
    }
    // Back to the first letter: a scheme cannot start with a digit or `+ - .`.
    while s < colon && !bytes[s].is_ascii_alphabetic() {
        s += 1;
    }
    let has_host = bytes.get(colon + 3).is_some_and(|b| !ends_token(*b));
    has_host.then_some(s)
}

fn starts_www(bytes: &[u8], i: usize) -> bool {
    let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'.');
    boundary
        && bytes.len() > i + 4
        && bytes[i..i + 4].eq_ignore_ascii_case(b"www.")
        && !ends_token(bytes[i + 4])
}

fn ends_token(b: u8) -> bool {
    b.is_ascii_whitespace() || matches!(b, b'<' | b'>' | b'"' | b'\'' | b'`')
}

/// Past the token starting at or before `from`, with trailing punctuation a sentence would put
/// there left out.
fn token_end(bytes: &[u8], from: usize) -> usize {
    let mut end = from;
    while end < bytes.len() && !ends_token(bytes[end]) {
        end += 1;
    }
    while end > from + 1 && b".,;:!?*_~".contains(&bytes[end - 1]) {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(text: &str) -> Vec<String> {
        find(text).into_iter().map(|f| f.url).collect()
    }

    #[test]
    fn every_scheme_and_www_is_found_with_its_whole_path() {
        assert_eq!(
            urls("see https://a.example/p?d=1, ws://b.example/x and www.c.example/y."),
            vec![
                "https://a.example/p?d=1",
                "ws://b.example/x",
                "http://www.c.example/y"
            ]
        );
        assert_eq!(urls("smb://d.example/share"), vec!["smb://d.example/share"]);
        assert_eq!(
            urls("x1-git+ssh://e.example/r"),
            vec!["x1-git+ssh://e.example/r"]
        );
        assert_eq!(urls("(://f.example/z)"), vec!["://f.example/z)"]);
        assert_eq!(
            urls("https://g.example/_a_*b*"),
            vec!["https://g.example/_a_*b"]
        );
    }

    #[test]
    fn words_that_only_look_like_it_are_not() {
        assert!(urls("Note: it works. awww.x, a://").is_empty());
        assert!(urls("ratio 3:1 and path a/b").is_empty());
    }
}
