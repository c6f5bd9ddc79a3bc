//! fro-bot's review client (`review::api`) against the fake GitHub and a real repository: the
//! diff pinned to a commit, the range since the last review and a force-push, GitHub's 422 read
//! out of its answer, threads listed and resolved. No OpenCode: the e2e scenario is
//! `e2e::review`.

use fro_bot::github::GitHub;
use fro_bot::review::api::{self, PostError};
use fro_bot::review::view::Since;
use serde_json::json;

use crate::support::action::fresh_checkout;
use crate::support::fake_github::FakeGitHub;

const PR: u64 = 8;

async fn world() -> (FakeGitHub, GitHub, tempfile::TempDir, String) {
    let fake = FakeGitHub::start().await;
    let checkout = tempfile::tempdir().unwrap();
    fresh_checkout(checkout.path(), "hello\n");
    fake.seed_git_repo(checkout.path());
    let head = fake.add_commit_on_branch("feature", "a.txt", "one\ntwo\n");
    fake.seed_pull_on_branch(PR, "feature", false);
    let gh = crate::support::fake_github::client(&fake.url, "octo/hello");
    (fake, gh, checkout, head)
}

#[tokio::test]
async fn the_range_since_the_last_review_is_its_commits_and_after_a_force_push_the_whole() {
    let (fake, gh, _checkout, first) = world().await;
    let pull = api::pull(&gh, PR).await.unwrap();
    assert_eq!(pull.head_sha, first);
    let whole = api::diff(&gh, &pull.base_sha, &first).await.unwrap();
    assert!(whole.contains("+one\n+two\n"), "{whole}");
    assert_eq!(api::since(&gh, None, &first).await, Since::FirstReview);
    assert_eq!(
        api::since(&gh, Some(first.clone()), &first).await,
        Since::Unchanged
    );

    let second = fake.add_commit_on_branch("feature", "a.txt", "one\ntwo\nthree\n");
    match api::since(&gh, Some(first.clone()), &second).await {
        Since::Range { from, diff } => {
            assert_eq!(from, first);
            assert!(diff.contains("+three") && !diff.contains("+one"), "{diff}");
        }
        other => panic!("{other:?}"),
    }
    // A force-push: the branch starts again from main, without the reviewed commit.
    fake.delete_branch("feature");
    let rewritten = fake.add_commit_on_branch("feature", "a.txt", "uno\n");
    assert_eq!(
        api::since(&gh, Some(second.clone()), &rewritten).await,
        Since::Rewritten { from: second }
    );
}

#[tokio::test]
async fn githubs_422_is_read_out_and_a_resolved_thread_is_listed_as_resolved() {
    let (_fake, gh, _checkout, head) = world().await;
    let bad = json!({"commit_id": head, "event": "COMMENT", "body": "b",
        "comments": [{"path": "a.txt", "line": 30, "side": "RIGHT", "body": "far"}]});
    match api::post_review(&gh, PR, &bad).await {
        Err(PostError::Rejected { errors }) => {
            assert!(errors.contains("must be part of the diff"), "{errors}")
        }
        other => panic!("{other:?}"),
    }
    let good = json!({"commit_id": head, "event": "COMMENT", "body": "b",
        "comments": [{"path": "a.txt", "line": 2, "side": "RIGHT", "body": "two?"}]});
    let posted = api::post_review(&gh, PR, &good).await.unwrap();
    assert!(posted.url.contains("#pullrequestreview-"), "{}", posted.url);
    let threads = api::threads(&gh, PR).await.unwrap();
    assert_eq!(threads.len(), 1);
    assert_eq!(threads[0].line, Some(2));
    assert_eq!(threads[0].comments[0].1, "github-actions");
    // The REST id, past 2³¹ as on github.com: GraphQL's `fullDatabaseId`, not `databaseId`.
    assert!(threads[0].comments[0].0 > i32::MAX as u64);
    api::resolve(&gh, &threads[0].id).await.unwrap();
    api::reply(&gh, PR, threads[0].comments[0].0, "thanks")
        .await
        .unwrap();
    let threads = api::threads(&gh, PR).await.unwrap();
    assert!(threads[0].resolved);
    assert_eq!(threads[0].comments.len(), 2);
    assert!(api::resolve(&gh, "PRRT_nope").await.is_err());
}
