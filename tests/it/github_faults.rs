//! GitHub's transient faults (docs/design.md#the-github-surface, `github::retry`): 5xx and
//! secondary rate limits are retried with backoff inside the run's budget; a write is sent again
//! only where that cannot double it. The fake fails the first calls of a kind, either before the
//! request takes effect or after (GitHub acted, the answer was lost). Nothing here sleeps: the
//! client's waits are recorded ([`recorded_pacing`]).

use std::time::Duration;

use axum::http::Method;
use fro_bot::config::Secret;
use fro_bot::github::api::PostedComment;
use fro_bot::github::event::TargetKind;
use fro_bot::github::repo::{CommitResult, FileOp, PullResult};
use fro_bot::github::route::Thread;
use fro_bot::github::GitHub;
use fro_bot::review::api;
use serde_json::json;

use crate::support::action::fresh_checkout;
use crate::support::fake_github::{recorded_pacing, FakeGitHub, Fault, Waits, TOKEN};

const REPO: &str = "octo/hello";

fn client_at(fake: &FakeGitHub, now: u64) -> (GitHub, Waits) {
    let (pacing, waits) = recorded_pacing(now);
    let gh = GitHub::new(&fake.url, &Secret::new(TOKEN), REPO)
        .unwrap()
        .with_pacing(pacing);
    (gh, waits)
}

fn issue(number: u64) -> Thread {
    Thread {
        kind: TargetKind::Issue,
        number,
        node_id: None,
    }
}

fn count(fake: &FakeGitHub, method: &str, path_end: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.method == method && r.path.ends_with(path_end))
        .count()
}

fn graphql_count(fake: &FakeGitHub, operation: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| {
            r.body["query"]
                .as_str()
                .is_some_and(|q| q.contains(operation))
        })
        .count()
}

#[tokio::test]
async fn reads_are_retried_waiting_what_github_asks_within_the_budget() {
    let fake = FakeGitHub::start().await;
    fake.seed_issue(42, "t", "b");
    let (gh, waits) = client_at(&fake, 1_000);
    // A 502, then a secondary rate limit with Retry-After, then a 429 until the limit resets.
    fake.fail(Some(Method::GET), "/pulls/42", 502, Some(1));
    fake.inject(
        Fault::new(Some(Method::GET), "/pulls/42", 403, Some(1)).header("retry-after", "7"),
    );
    fake.inject(
        Fault::new(Some(Method::GET), "/pulls/42", 429, Some(1))
            .header("x-ratelimit-remaining", "0")
            .header("x-ratelimit-reset", "1030"),
    );
    fake.seed_pull(42, Some(REPO), REPO, false);
    gh.pull_request_flags(42).await.unwrap();
    assert_eq!(
        *waits.lock().unwrap(),
        [1, 7, 30].map(Duration::from_secs),
        "backoff, Retry-After, x-ratelimit-reset"
    );
    assert_eq!(gh.retries(), (3, Duration::from_secs(38)));

    // A primary limit resetting in an hour is beyond one wait: an error at once.
    fake.inject(
        Fault::new(Some(Method::GET), "/pulls/42", 403, Some(1))
            .header("x-ratelimit-remaining", "0")
            .header("x-ratelimit-reset", "4600"),
    );
    let err = gh.pull_request_flags(42).await.unwrap_err();
    assert_eq!(err.status(), Some(403));
    assert_eq!(waits.lock().unwrap().len(), 3, "no wait for it");

    // 5xx every time: 4 tries, 1 s, 2 s, 4 s apart, then the error.
    fake.fail(Some(Method::GET), "/pulls/42", 503, None);
    let err = gh.pull_request_flags(42).await.unwrap_err();
    assert_eq!(err.status(), Some(503));
    assert_eq!(
        waits.lock().unwrap()[3..],
        [1, 2, 4].map(Duration::from_secs)
    );
}

#[tokio::test]
async fn the_tracking_comment_and_the_answers_edit_survive_a_fault_and_are_not_doubled() {
    let fake = FakeGitHub::start().await;
    fake.seed_issue(42, "t", "b");
    let (gh, _) = client_at(&fake, 0);
    // GitHub posted the comment, the answer was lost: found by its body, not posted again.
    fake.inject(Fault::new(Some(Method::POST), "/issues/42/comments", 502, Some(1)).after_effect());
    let posted = gh
        .post_comment(&issue(42), "⏳ working\n\n<!-- fro-bot:response -->\n")
        .await
        .unwrap();
    assert_eq!(fake.created_comments().len(), 1, "one comment");
    assert_eq!(
        count(&fake, "POST", "/issues/42/comments"),
        1,
        "posted once"
    );
    assert_eq!(
        Some(posted.id.parse::<u64>().unwrap()),
        fake.comment_id_starting("⏳ working")
    );

    // Refused before it landed: looked for, not there, posted again.
    fake.fail(Some(Method::POST), "/issues/42/comments", 502, Some(1));
    gh.post_comment(&issue(42), "second").await.unwrap();
    assert_eq!(fake.created_comments().len(), 2);
    assert_eq!(count(&fake, "POST", "/issues/42/comments"), 3);

    // The answer's edit: a PATCH sets the body, sent again.
    fake.fail(Some(Method::PATCH), "/issues/comments/", 502, Some(1));
    let edited = gh
        .edit_comment(TargetKind::Issue, &posted, "the answer")
        .await
        .unwrap();
    assert_eq!(edited.id, posted.id);
    assert_eq!(
        fake.edits(),
        [(posted.id.clone(), "the answer".to_string())]
    );
    assert_eq!(
        fake.created_comments().len(),
        2,
        "no second comment for the answer"
    );
}

#[tokio::test]
async fn a_discussion_comment_whose_answer_was_lost_is_not_posted_again() {
    let fake = FakeGitHub::start().await;
    fake.seed_discussion(7, "D_x", "t", "b", 0);
    let (gh, _) = client_at(&fake, 0);
    fake.inject(Fault::graphql("addDiscussionComment", 502, Some(1)).after_effect());
    let thread = Thread {
        kind: TargetKind::Discussion,
        number: 7,
        node_id: Some("D_x".into()),
    };
    let posted: PostedComment = gh.post_comment(&thread, "hello there").await.unwrap();
    assert!(posted.id.starts_with("DC_"), "{posted:?}");
    assert_eq!(fake.created_comments().len(), 1);
    assert_eq!(graphql_count(&fake, "addDiscussionComment"), 1);
}

#[tokio::test]
async fn a_write_not_safe_to_repeat_is_not_sent_again_blind() {
    let fake = FakeGitHub::start().await;
    fake.seed_issue(42, "t", "b");
    let (gh, _) = client_at(&fake, 0);
    // An issue whose answer was lost: reported, not opened a second time.
    fake.inject(Fault::new(Some(Method::POST), "/issues", 502, Some(1)).after_effect());
    let err = gh
        .create_issue("Found a bug", "details", &[])
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(502));
    assert_eq!(fake.created_issues().len(), 1);
    assert_eq!(count(&fake, "POST", "/repos/octo/hello/issues"), 1);

    // A comment whose look-up fails too: the post is not repeated on a guess.
    fake.inject(Fault::new(Some(Method::POST), "/issues/42/comments", 502, Some(1)).after_effect());
    fake.fail(Some(Method::GET), "/issues/42/comments", 500, None);
    let err = gh.post_comment(&issue(42), "once").await.unwrap_err();
    assert_eq!(err.status(), Some(502));
    assert_eq!(fake.created_comments().len(), 1);
    assert_eq!(count(&fake, "POST", "/issues/42/comments"), 1);

    // A rate limit is a refusal: GitHub did not act, so even an issue is sent again.
    fake.inject(Fault::new(Some(Method::POST), "/issues", 429, Some(1)).header("retry-after", "2"));
    gh.create_issue("Second", "details", &[]).await.unwrap();
    assert_eq!(fake.created_issues().len(), 2);
}

/// A repository with branch `feature` one commit ahead of `main`, and pull request #8 from it.
async fn git_world() -> (FakeGitHub, GitHub, tempfile::TempDir, String) {
    let fake = FakeGitHub::start().await;
    let checkout = tempfile::tempdir().unwrap();
    fresh_checkout(checkout.path(), "hello\n");
    fake.seed_git_repo(checkout.path());
    let head = fake.add_commit_on_branch("feature", "a.txt", "one\ntwo\n");
    let (gh, _) = client_at(&fake, 0);
    (fake, gh, checkout, head)
}

#[tokio::test]
async fn a_commit_whose_answer_was_lost_is_the_first_attempts_success() {
    let (fake, gh, _checkout, head) = git_world().await;
    fake.inject(Fault::graphql("createCommitOnBranch", 502, Some(1)).after_effect());
    let files = [FileOp::Put {
        path: "b.txt",
        contents: b"bee\n",
    }];
    let message = (
        "Add b",
        "Fro-Bot-Run: https://github.com/octo/hello/actions/runs/1",
    );
    let result = gh
        .create_commit_on_branch("feature", &head, message, &files)
        .await
        .unwrap();
    let now = fake.branch_head("feature").unwrap();
    assert_eq!(
        result,
        CommitResult::Created {
            oid: now.clone(),
            url: Some(format!("https://github.com/octo/hello/commit/{now}"))
        }
    );
    assert_eq!(
        fake.commit_parent(&now),
        Some(head.clone()),
        "one commit, not two"
    );
    assert_eq!(fake.commit_mutations(), 1);

    // Lost before it landed: the branch is still at the head, so the mutation is sent again.
    fake.inject(Fault::graphql("createCommitOnBranch", 502, Some(1)));
    let files = [FileOp::Delete { path: "b.txt" }];
    let result = gh
        .create_commit_on_branch("feature", &now, ("Drop b", ""), &files)
        .await
        .unwrap();
    let CommitResult::Created { oid, .. } = result else {
        panic!("{result:?}")
    };
    assert_eq!(fake.commit_parent(&oid), Some(now));
    assert_eq!(fake.commit_mutations(), 3, "the refused one and its retry");

    // Someone else moved the branch meanwhile: not mistaken for ours.
    fake.inject(Fault::graphql("createCommitOnBranch", 502, Some(1)));
    let theirs = fake.add_commit_on_branch("feature", "c.txt", "theirs\n");
    let files = [FileOp::Put {
        path: "d.txt",
        contents: b"d\n",
    }];
    let result = gh
        .create_commit_on_branch("feature", &oid, ("Add d", ""), &files)
        .await
        .unwrap();
    assert_eq!(result, CommitResult::HeadMoved);
    assert_eq!(fake.branch_head("feature"), Some(theirs));
}

#[tokio::test]
async fn a_pull_request_whose_answer_was_lost_is_found_not_opened_again() {
    let (fake, gh, _checkout, _head) = git_world().await;
    fake.inject(Fault::new(Some(Method::POST), "/pulls", 502, Some(1)).after_effect());
    let result = gh
        .create_pull("Add a", "body", "feature", "main", false)
        .await
        .unwrap();
    let PullResult::Opened(pull) = result else {
        panic!("{result:?}")
    };
    assert_eq!(pull.head_ref, "feature");
    assert_eq!(fake.created_pulls().len(), 1, "one pull request");
    assert_eq!(count(&fake, "POST", "/pulls"), 1);
}

#[tokio::test]
async fn a_review_whose_answer_was_lost_is_found_not_posted_again() {
    let (fake, gh, _checkout, head) = git_world().await;
    fake.seed_pull_on_branch(8, "feature", false);
    fake.inject(Fault::new(Some(Method::POST), "/pulls/8/reviews", 502, Some(1)).after_effect());
    let request = json!({"commit_id": head, "event": "COMMENT", "body": "looks fine",
        "comments": [{"path": "a.txt", "line": 2, "side": "RIGHT", "body": "two?"}]});
    let posted = api::post_review(&gh, 8, &request).await.unwrap();
    assert!(posted.url.contains("#pullrequestreview-"), "{}", posted.url);
    assert_eq!(fake.reviews(8).len(), 1, "one review");
    assert_eq!(count(&fake, "POST", "/pulls/8/reviews"), 1);

    // Refused before it landed: posted again, still one more review.
    fake.fail(Some(Method::POST), "/pulls/8/reviews", 503, Some(1));
    let again = json!({"commit_id": head, "event": "COMMENT", "body": "second look"});
    api::post_review(&gh, 8, &again).await.unwrap();
    assert_eq!(fake.reviews(8).len(), 2);
}
