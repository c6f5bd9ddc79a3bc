//! Pull request review (docs/design.md#pull-request-review) through the real OpenCode, from the
//! action's image: the scripted agent reviews with its tools and fro-bot posts one review per run
//! to the fake GitHub, which checks every comment against the real diff and refuses as GitHub
//! does (an all-or-nothing 422 that names no comment).

use serde_json::{json, Value};

use super::changes::{answer, pull_comment, tool};
use super::scenarios::{main_step, World};
use crate::support::action::{explain, Job, Launch};
use crate::support::fake_llm::{request_text, Reply};

const FIRST: &str = "fn a() {\n    let x = y.unwrap();\n    z(x);\n    z(x);\n    z(x)\n}\n";
const PUSHED: &str =
    "fn a() {\n    let x = y?;\n    z(x);\n    z(x);\n    z(x)\n    std::process::exit(1);\n}\n";

fn review_tool(name: &str, args: Value) -> Reply {
    Reply::tool(tool(name), args)
}

fn comment(line: u32, start: Option<u32>, body: &str) -> Value {
    let mut c = json!({"path": "src/lib.rs", "line": line, "body": body});
    if let Some(s) = start {
        c["start_line"] = json!(s);
    }
    c
}

/// A `pull_request` event on pull request 8 naming `head`, as GitHub sends it.
fn pull_event(action: &str, head: &str) -> Value {
    json!({"action": action,
        "pull_request": {"number": 8, "title": "Add a", "body": "Adds a.", "state": "open",
            "node_id": "PR_8", "draft": false, "locked": false,
            "user": {"login": "mona", "type": "User"}, "author_association": "MEMBER",
            "head": {"sha": head, "ref": "feature", "repo": {"full_name": "octo/hello"}},
            "base": {"ref": "main", "repo": {"full_name": "octo/hello"}}},
        "repository": {"full_name": "octo/hello", "name": "hello", "owner": {"login": "octo"}},
        "sender": {"login": "mona", "type": "User"}})
}

/// What the model was sent after its `n`-th reply (the tool's answer to it among it).
fn seen_after(world: &World, n: usize) -> String {
    world
        .llm
        .requests()
        .get(n)
        .map(request_text)
        .unwrap_or_default()
}

/// fro-bot's reviews of pull request 8 (a seeded thread and a reply have reviews of their own).
fn bot_reviews(world: &World) -> Vec<Value> {
    world
        .github
        .reviews(8)
        .into_iter()
        .filter(|r| {
            r["body"]
                .as_str()
                .unwrap_or("")
                .contains("<!-- fro-bot:review head=")
        })
        .collect()
}

fn job(world: &World, run_id: u64) -> Job {
    let mut job = world.job(run_id);
    job.set("GITHUB_SERVER_URL", world.github.url.clone());
    job.owned_by_runner_user(1001);
    job
}

/// The first review: three inline comments (one on two lines, one with a suggestion) in one
/// review pinned to the head recorded at the start, a comment off the diff in its body, an
/// approval the workflow does not allow refused at once.
async fn first_review(world: &World, mut job: Job, head: &str) -> Job {
    world.llm.push(review_tool(
        "review_comment",
        comment(2, None, "Unwrap can panic here."),
    ));
    world.llm.push(review_tool(
        "review_comment",
        comment(4, Some(3), "These two calls repeat."),
    ));
    let mut suggestion = comment(5, None, "Propagate the error.");
    suggestion["suggestion"] = json!("    z(x)?;");
    world.llm.push(review_tool("review_comment", suggestion));
    world.llm.push(review_tool(
        "review_comment",
        comment(40, None, "The module has no docs."),
    ));
    world.llm.push(review_tool(
        "submit_review",
        json!({"body": "Fine.", "event": "APPROVE"}),
    ));
    world.llm.push(review_tool(
        "submit_review",
        json!({"body": "Two risks and a nit."}),
    ));
    world
        .llm
        .push(Reply::text("Reviewed: two risks and a nit."));
    job.event(
        "issue_comment",
        &pull_comment(8, 801, "@fro-bot review this"),
    );
    let (job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert!(seen_after(world, 4).contains("nearest hunk there covers lines 1-6"));
    assert!(
        seen_after(world, 5).contains("review-events"),
        "APPROVE refused at once"
    );
    let reviews = bot_reviews(world);
    assert_eq!(reviews.len(), 1, "{reviews:?}");
    assert_eq!(reviews[0]["commit_id"], head);
    assert_eq!(reviews[0]["state"], "COMMENTED");
    let body = reviews[0]["body"].as_str().unwrap();
    assert!(body.starts_with("Two risks and a nit."), "{body}");
    assert!(body.contains("`src/lib.rs:40`") && body.contains("The module has no docs."));
    let threads = world.github.review_threads(8);
    assert_eq!(threads.len(), 3, "{threads:?}");
    let text = threads.iter().map(Value::to_string).collect::<String>();
    assert!(text.contains(r"```suggestion\n    z(x)?;\n```"), "{text}");
    assert!(
        threads
            .iter()
            .any(|t| t.to_string().contains("\"start_line\":3")),
        "{text}"
    );
    let url = reviews[0]["html_url"].as_str().unwrap();
    assert_eq!(r.output("review-url"), url);
    assert!(answer(world).contains(url), "{}", answer(world));
    assert!(
        r.summary
            .contains("posted (COMMENT): 3 comments, 1 moved to the body, 0 skipped"),
        "{}",
        r.summary
    );
    job
}

/// The thread of fro-bot's whose first comment says `what`: (node id, first comment id).
fn thread_saying(world: &World, what: &str) -> (String, u64) {
    let t = world
        .github
        .review_threads(8)
        .into_iter()
        .find(|t| t.to_string().contains(what))
        .unwrap_or_else(|| panic!("no thread says {what:?}"));
    let id = t["id"]
        .as_str()
        .or(t["node_id"].as_str())
        .unwrap()
        .to_string();
    let first = t["comments"][0]["id"].as_u64().unwrap();
    (id, first)
}

pub(crate) async fn a_review_is_one_post_pinned_to_the_head_and_a_push_gets_only_its_new_finding(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    let job = job(&world, 5000);
    world.github.seed_git_repo(&job.workspace());
    let head = world
        .github
        .add_commit_on_branch("feature", "src/lib.rs", FIRST);
    world.github.seed_pull_on_branch(8, "feature", false);
    let mut job = first_review(&world, job, &head).await;

    // A push that fixes the unwrap and adds a new problem, reviewed automatically. GitHub refuses
    // the first try (its 422 names no comment): the comment goes into the body, posted once more.
    let pushed = world
        .github
        .add_commit_on_branch("feature", "src/lib.rs", PUSHED);
    let (unwrap_thread, unwrap_comment) = thread_saying(&world, "Unwrap can panic");
    let (human, _) = world.github.seed_review_thread(
        8,
        "src/lib.rs",
        3,
        "RIGHT",
        "mona",
        "Why three times?",
        false,
    );
    world.github.reject_review_comments_on("src/lib.rs");
    let before = world.llm.requests().len();
    world
        .llm
        .push(review_tool("list_review_threads", json!({})));
    world.llm.push(review_tool("review_diff", json!({})));
    world.llm.push(review_tool(
        "review_comment",
        comment(4, Some(3), "These two calls repeat."),
    ));
    world.llm.push(review_tool(
        "review_comment",
        comment(6, None, "Exiting here skips cleanup."),
    ));
    world.llm.push(review_tool(
        "resolve_review_thread",
        json!({"thread": unwrap_thread}),
    ));
    world.llm.push(review_tool(
        "resolve_review_thread",
        json!({"thread": human}),
    ));
    world.llm.push(review_tool(
        "reply_to_review_thread",
        json!({"thread": unwrap_thread, "body": "Fixed by the push, thanks."}),
    ));
    world.llm.push(Reply::text("Reviewed the push."));
    job.next_run(5001);
    job.input("review", "auto");
    job.event("pull_request", &pull_event("synchronize", &pushed));
    let (mut job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    let task = seen_after(&world, before);
    assert!(
        task.contains(&format!("You last reviewed it at {head}")),
        "{task}"
    );
    let listed = seen_after(&world, before + 1);
    assert!(
        listed.contains(&unwrap_thread) && !listed.contains(&human),
        "{listed}"
    );
    let range = seen_after(&world, before + 2);
    assert!(range.contains("+    std::process::exit(1);"), "{range}");
    assert!(
        !range.contains("+    z(x);"),
        "only the range since the last review: {range}"
    );
    assert!(seen_after(&world, before + 3).contains("already raised this in your open thread"));
    assert!(seen_after(&world, before + 6).contains("not a thread you started"));
    let reviews = bot_reviews(&world);
    assert_eq!(reviews.len(), 2, "{reviews:?}");
    assert_eq!(reviews[1]["commit_id"], pushed);
    let body = reviews[1]["body"].as_str().unwrap();
    assert!(body.contains("Exiting here skips cleanup.") && body.contains("GitHub refused it"));
    assert!(!body.contains("These two calls repeat."), "{body}");
    assert_eq!(
        world.github.review_posts().len(),
        3,
        "one refused, posted again once"
    );
    assert_eq!(world.github.resolved_threads(), [unwrap_thread]);
    let replies = world.github.review_replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].0, unwrap_comment);
    assert!(
        r.summary.contains("1 skipped as already said")
            && r.summary.contains("posted again after GitHub refused")
            && r.summary.contains("1 replied, 1 resolved"),
        "{}",
        r.summary
    );

    // A burst: this run's event names a head another push has already replaced; it posts nothing.
    world
        .github
        .add_commit_on_branch("feature", "NOTES.md", "later\n");
    world.llm.push(review_tool(
        "review_comment",
        comment(6, None, "Still exits."),
    ));
    world.llm.push(Reply::text("Reviewed."));
    job.next_run(5002);
    job.event("pull_request", &pull_event("synchronize", &pushed));
    let (_job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert_eq!(
        bot_reviews(&world).len(),
        2,
        "nothing posted for the older head"
    );
    assert!(r.summary.contains("the head moved"), "{}", r.summary);
}
