//! URLs in raw HTML the agent writes (`<img src>`, `<a href>`, `<picture><source srcset>`,
//! `<video poster>`, …). Attribute values are read as a browser reads them: quoted or not, after
//! character references (`&#104;ttps`, `&colon;`) are undone. A reference this module does not
//! know makes the value [`Url::Unreadable`], which the caller treats as not allowed.

/// Attributes whose value is fetched or followed as a URL.
const URL_ATTRIBUTES: &[&str] = &[
    "src",
    "href",
    "srcset",
    "poster",
    "data",
    "action",
    "formaction",
    "background",
    "cite",
    "longdesc",
    "lowsrc",
    "dynsrc",
    "ping",
    "manifest",
    "codebase",
    "icon",
    "xlink:href",
    "xmlns",
    "usemap",
];

/// A URL an attribute holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Url {
    Written(String),
    /// A character reference not decoded here: not to be believed.
    Unreadable,
}

/// Every URL in `html`: each URL attribute's value (each candidate of a `srcset`), anything that
/// looks like a URL anywhere in it, and — as unreadable — an attribute value starting `//` or
/// holding a CSS `url(`.
pub fn urls(html: &str) -> Vec<Url> {
    let mut out: Vec<Url> = super::bare::find(html)
        .into_iter()
        .map(|f| Url::Written(f.url))
        .collect();
    // A fragment that starts inside a tag (the rest of one begun on an earlier line) is read as
    // attributes from its start.
    let tagged = match html.trim_start().starts_with('<') {
        true => html.to_string(),
        false => format!("<x {html}"),
    };
    let mut attribute_urls = Vec::new();
    for (name, value) in attributes(&tagged) {
        let Some(value) = decode(&value) else {
            attribute_urls.push(Url::Unreadable);
            continue;
        };
        let name = name.to_ascii_lowercase();
        if name == "srcset" {
            attribute_urls.extend(
                value
                    .split(',')
                    .filter_map(|c| c.split_whitespace().next())
                    .map(|c| Url::Written(c.to_string())),
            );
        } else if URL_ATTRIBUTES.contains(&name.as_str()) {
            attribute_urls.push(Url::Written(value));
        } else {
            let lower = value.to_ascii_lowercase();
            if lower.contains("url(") || lower.trim_start().starts_with("//") {
                attribute_urls.push(Url::Unreadable);
            }
            attribute_urls.extend(
                super::bare::find(&value)
                    .into_iter()
                    .map(|f| Url::Written(f.url)),
            );
        }
    }
    for u in attribute_urls {
        if !out.contains(&u) {
            out.push(u);
        }
    }
    out
}

/// `(name, raw value)` of every attribute of every tag in `html`.
fn attributes(html: &str) -> Vec<(String, String)> {
    let b = html.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'<' || !b.get(i + 1).is_some_and(u8::is_ascii_alphabetic) {
            i += 1;
            continue;
        }
        // The tag name, then attributes up to `>`.
        i += 1;
        while i < b.len() && !is_space_or_end(b[i]) {
            i += 1;
        }
        while i < b.len() && b[i] != b'>' {
            if is_space_or_end(b[i]) && b[i] != b'>' {
                i += 1;
                continue;
            }
            let name_start = i;
            while i < b.len() && !is_space_or_end(b[i]) && b[i] != b'=' {
                i += 1;
            }
            let name = html[name_start..i].to_string();
            let mut j = skip_space(b, i);
            if b.get(j) != Some(&b'=') {
                out.push((name, String::new()));
                i = j.max(i + usize::from(i == name_start));
                continue;
            }
            j = skip_space(b, j + 1);
            let (value, next) = value_at(html, j);
            out.push((name, value));
            i = next;
        }
    }
    out
}

fn is_space_or_end(b: u8) -> bool {
    b.is_ascii_whitespace() || b == b'/' || b == b'>'
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The attribute value at `i` (quoted or not) and the index past it.
fn value_at(html: &str, i: usize) -> (String, usize) {
    let b = html.as_bytes();
    match b.get(i) {
        Some(&q @ (b'"' | b'\'')) => {
            let end = b[i + 1..]
                .iter()
                .position(|c| *c == q)
                .map_or(b.len(), |p| i + 1 + p);
            (html[i + 1..end].to_string(), (end + 1).min(b.len()))
        }
        _ => {
            let mut end = i;
            while end < b.len() && !b[end].is_ascii_whitespace() && b[end] != b'>' {
                end += 1;
            }
            (html[i..end].to_string(), end)
        }
    }
}

/// Named references that can spell a URL; any other named one makes the value unreadable.
const NAMED: &[(&str, char)] = &[
    ("amp", '&'),
    ("lt", '<'),
    ("gt", '>'),
    ("quot", '"'),
    ("apos", '\''),
    ("colon", ':'),
    ("sol", '/'),
    ("bsol", '\\'),
    ("period", '.'),
    ("commat", '@'),
    ("quest", '?'),
    ("equals", '='),
    ("num", '#'),
    ("percnt", '%'),
    ("comma", ','),
    ("lpar", '('),
    ("rpar", ')'),
    ("excl", '!'),
    ("plus", '+'),
    ("lowbar", '_'),
    ("hyphen", '-'),
    ("dash", '-'),
    ("Tab", '\t'),
    ("NewLine", '\n'),
    ("nbsp", '\u{a0}'),
];

/// `value` with character references undone; `None` when one is not known here.
fn decode(value: &str) -> Option<String> {
    decode_with(value, false)
}

/// `text` with the character references known here undone, the rest left as written.
pub fn decode_known(text: &str) -> String {
    decode_with(text, true).unwrap_or_default()
}

fn decode_with(value: &str, keep_unknown: bool) -> Option<String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        let len = rest
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'#')
            .count();
        let (name, after) = rest.split_at(len);
        // Browsers accept a missing `;` for many references.
        let after = after.strip_prefix(';').unwrap_or(after);
        let ch = if let Some(num) = name.strip_prefix('#') {
            let n = match num.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok(),
                None => num.parse().ok(),
            };
            Some(n.and_then(char::from_u32).unwrap_or('\u{fffd}'))
        } else if name.is_empty() {
            out.push('&');
            rest = after;
            continue;
        } else {
            NAMED.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
        };
        match ch {
            Some(c) => out.push(c),
            None if keep_unknown => {
                out.push('&');
                continue;
            }
            None => return None,
        }
        rest = after;
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(html: &str) -> Vec<String> {
        urls(html)
            .into_iter()
            .map(|u| match u {
                Url::Written(s) => s,
                Url::Unreadable => "?".into(),
            })
            .collect()
    }

    #[test]
    fn every_url_attribute_quoted_or_not_and_every_srcset_candidate() {
        assert_eq!(
            written(r#"<img alt="x" src="https://a.example/p.png?d=1">"#),
            vec!["https://a.example/p.png?d=1"]
        );
        assert_eq!(written("<IMG SRC=//b.example/p>"), vec!["//b.example/p"]);
        assert_eq!(written("<img/src='c.png'/>"), vec!["c.png"]);
        assert_eq!(
            written(
                r#"<picture><source srcset="https://d.example/1.png 1x, https://e.example/2.png 2x"></picture>"#
            ),
            vec!["https://d.example/1.png", "https://e.example/2.png"]
        );
        assert_eq!(
            written(r#"<a title="see https://f.example/x" href="/octo">"#),
            vec!["https://f.example/x", "/octo"]
        );
        assert_eq!(written(r#"<div style="background:url(x)">"#), vec!["?"]);
    }

    #[test]
    fn character_references_are_undone_and_unknown_ones_are_not_believed() {
        assert_eq!(
            written(r#"<img src="&#104;ttps&colon;&sol;&#x2F;a.example/p">"#),
            vec!["https://a.example/p"]
        );
        assert_eq!(
            written(r#"<img src="https&#58//a.example/p">"#),
            vec!["https://a.example/p"]
        );
        assert_eq!(
            written(r#"<img src="https&unknownref;a.example">"#),
            vec!["?"]
        );
        assert_eq!(
            written("<details><summary>x</summary>"),
            Vec::<String>::new()
        );
    }
}
