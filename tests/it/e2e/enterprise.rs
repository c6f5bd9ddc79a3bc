//! GitHub Enterprise Server (README "GitHub Enterprise Server and self-hosted runners"): the fake
//! GitHub laid out as GHES at its own URL — REST only under `/api/v3`, GraphQL only at
//! `/api/graphql`, git beside them, every other path the web UI's 404 page — a self-hosted
//! runner's checkout owned by uid 1000, and only the v1 cache service (`ACTIONS_CACHE_URL`). Whole
//! runs go through every kind of call fro-bot makes, every link it writes names that server, and
//! memory is kept through the v1 cache.

use serde_json::json;

use super::changes::{answer, bash, tool};
use super::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain, fresh_checkout, Job, Launch, StepResult};
use crate::support::cache_server::{CREATE, FINALIZE, LOOKUP, PUT_BLOB, PUT_BLOCK};
use crate::support::cache_server_v1::{V1_COMMIT, V1_LOOKUP, V1_RESERVE, V1_UPLOAD};
use crate::support::fake_github::Recorded;
use crate::support::fake_llm::Reply;
use fro_bot::memory::state_paths::StatePaths;

/// A self-hosted runner's first user, not the hosted runners' 1001.
const RUNNER_UID: u32 = 1000;
const REPO: &str = "/repos/octo/hello";

fn job(world: &World, run_id: u64) -> Job {
    let mut job = world.job(run_id);
    job.owned_by_runner_user(RUNNER_UID);
    job
}

fn delivered(r: &StepResult, branch: &str) {
    assert_eq!(r.code, 0, "{}", explain(r));
    assert_eq!(r.output("changes"), "delivered", "{}", explain(r));
    assert_eq!(r.output("branch"), branch);
}

/// Where a request went: under the API's prefixes, or to git beside them.
fn on_enterprise_routes(r: &Recorded) -> bool {
    r.raw_path.starts_with("/api/v3/")
        || r.raw_path == "/api/graphql"
        || r.raw_path.starts_with("/octo/hello.git/")
}

/// Run 1: a comment on a same-repository pull request (its fork/draft flags and the requester's
/// permission looked up, its branch fetched with git, the commit added to it).
async fn pull_request_run(world: &World) -> (Job, StepResult) {
    let server = world.github.server_url();
    let mut job = job(world, 4100);
    world.github.seed_git_repo(&job.workspace());
    world
        .github
        .add_commit_on_branch("feature", "feature.txt", "from the pr\n");
    world.github.seed_pull_on_branch(8, "feature", false);
    world
        .github
        .seed_issue(8, "Changes from feature", "A feature.");
    world.llm.push(bash("cat feature.txt > copy.txt"));
    world.llm.push(Reply::text("Copied."));
    let mut event = comment_event(8, 801, "@fro-bot copy it");
    event["issue"]["pull_request"] =
        json!({"url": format!("{}{REPO}/pulls/8", world.github.api_url())});
    event["issue"]["html_url"] = json!(format!("{server}/octo/hello/pull/8"));
    job.event("issue_comment", &event);
    main_step(job).await
}

/// Run 2: a comment on an issue, on a repository that does not let Actions open pull requests
/// (the compare link), with a broken newer cache entry (listed and deleted through the API) and
/// a label and an issue the agent proposes.
async fn issue_run(world: &World, mut job: Job) -> StepResult {
    job.next_run(4101);
    fresh_checkout(&job.workspace(), "hello\n");
    crate::support::action::chown_r(&job.workspace(), RUNNER_UID);
    let version =
        fro_bot::cache::version(StatePaths::new(job.step_path(&job.data_dir())).cache_paths());
    let garbage = job.home().join("garbage.tzst");
    std::fs::write(&garbage, b"\x28\xb5\x2f\xfd not really zstd").unwrap();
    let broken = "opencode-storage-octo-hello-main-Linux-4199-1-agent";
    world.cache.plant(broken, &version, &garbage);
    world
        .github
        .seed_issue(5, "Typo in README", "It says hello.");
    world.github.seed_labels(&["docs"]);
    world.github.forbid_pull_request_creation();
    world.llm.push(bash("printf 'hello world\\n' > README.md"));
    world.llm.push(Reply::tool(
        tool("add_labels"),
        json!({"number": 5, "labels": ["docs"]}),
    ));
    world.llm.push(Reply::tool(
        tool("create_issue"),
        json!({"title": "Check the other greetings", "body": "Found while fixing #5."}),
    ));
    world.llm.push(Reply::text("Fixed the greeting."));
    job.event(
        "issue_comment",
        &comment_event(5, 501, "@fro-bot fix the typo"),
    );
    let (_job, r) = main_step(job).await;
    assert!(
        r.summary
            .contains(&format!("deleted the broken cache entry `{broken}`")),
        "{}",
        r.summary
    );
    r
}

/// Also from the action's image (`container::`).
pub(crate) async fn on_enterprise_server_every_call_goes_under_the_api_prefixes_and_every_link_to_the_server(
    launch: Launch,
) {
    let world = World::start_enterprise(launch).await;
    let server = world.github.server_url();
    assert!(!server.contains("github.com"), "{server}");
    let repo_url = format!("{server}/octo/hello");

    let (job, first) = pull_request_run(&world).await;
    delivered(&first, "feature");
    // Memory went through the v1 service: reserved, uploaded in chunks, committed.
    assert_eq!(first.output("cache-status"), "miss", "{}", explain(&first));
    assert_eq!(
        first.output("cache-save-result"),
        "durable",
        "{}",
        explain(&first)
    );
    let committed = world.cache.calls_of(V1_COMMIT);
    assert!(
        !committed.is_empty() && committed.iter().all(|c| c.status == 204),
        "{committed:?}"
    );
    let sha = first.output("commit-sha").to_string();
    assert_eq!(first.output("pr-url"), format!("{repo_url}/pull/8"));
    // The requester is credited at the instance's own no-reply domain.
    let host = url::Url::parse(&server)
        .unwrap()
        .host_str()
        .unwrap()
        .to_string();
    let message = world.github.commit_message(&sha);
    assert!(
        message.contains(&format!("Co-authored-by: mona <mona@users.noreply.{host}>")),
        "{message}"
    );
    assert!(
        first
            .output("comment-url")
            .starts_with(&format!("{repo_url}/issues/8#issuecomment-")),
        "{:?}",
        first.outputs
    );
    let text = answer(&world);
    for link in [
        format!("[#8]({repo_url}/pull/8)"),
        format!("({repo_url}/commit/{sha})"),
        format!("- Run: {repo_url}/actions/runs/4100"),
    ] {
        assert!(text.contains(&link), "{link} not in the answer:\n{text}");
    }
    let message = world.github.commit_message(&sha);
    assert!(
        message.ends_with(&format!("Fro-Bot-Run: {repo_url}/actions/runs/4100")),
        "{message}"
    );

    let second = issue_run(&world, job).await;
    delivered(&second, "fro-bot/issue-5");
    // Past the broken newer entry, the first run's memory restored through v1.
    assert_eq!(second.output("cache-status"), "hit", "{}", explain(&second));
    assert_eq!(
        second.output("cache-save-result"),
        "durable",
        "{}",
        explain(&second)
    );
    let tenant = world.cache.v1_tenant();
    for op in [V1_LOOKUP, V1_RESERVE, V1_UPLOAD, V1_COMMIT] {
        let calls = world.cache.calls_of(op);
        assert!(!calls.is_empty(), "no {op}");
        assert!(calls
            .iter()
            .all(|c| c.base.as_deref() == Some(tenant.as_str())));
    }
    for op in [CREATE, FINALIZE, LOOKUP, PUT_BLOB, PUT_BLOCK] {
        assert!(world.cache.calls_of(op).is_empty(), "a v2 call: {op}");
    }
    let text = answer(&world);
    let compare = format!("[open it here]({repo_url}/compare/main...fro-bot/issue-5?expand=1)");
    assert!(text.contains(&compare), "{compare} not in:\n{text}");
    assert!(text.contains(&format!("- Run: {repo_url}/actions/runs/4101")));
    assert_eq!(world.github.issue_labels(5), ["docs"]);
    assert_eq!(world.github.created_issues().len(), 1);

    let versions = world.github.comment_versions();
    assert!(
        versions[0].contains(&format!("Follow the run: {repo_url}/actions/runs/4100")),
        "the tracking comment: {}",
        versions[0]
    );
    for body in &versions {
        assert!(
            !body.contains("github.com"),
            "a link off the server: {body}"
        );
    }

    let requests = world.github.requests();
    let off: Vec<String> = requests
        .iter()
        .filter(|r| !on_enterprise_routes(r))
        .map(|r| format!("{} {}", r.method, r.raw_path))
        .collect();
    assert!(off.is_empty(), "requests off the API's prefixes: {off:?}");
    let hit = |method: &str, path: &str| {
        requests
            .iter()
            .any(|r| r.method == method && r.raw_path == path)
    };
    let graphql = |operation: &str| {
        requests.iter().any(|r| {
            r.raw_path == "/api/graphql"
                && r.body["query"]
                    .as_str()
                    .is_some_and(|q| q.contains(operation))
        })
    };
    let api = |path: &str| format!("/api/v3{REPO}{path}");
    let expected = [
        ("POST", api("/issues/comments/801/reactions")),
        ("GET", "/api/v3/user".to_string()),
        ("GET", api("/pulls/8")),
        ("GET", api("/collaborators/mona/permission")),
        ("GET", api("/issues/8")),
        ("GET", api("/issues/8/comments")),
        ("POST", api("/issues/8/comments")),
        ("GET", api("/git/ref/heads/feature")),
        ("GET", api("")),
        ("GET", api("/git/ref/heads/main")),
        ("POST", api("/git/refs")),
        ("POST", api("/pulls")),
        ("GET", api("/labels")),
        ("POST", api("/issues/5/labels")),
        ("POST", api("/issues")),
        ("GET", api("/actions/caches")),
        ("DELETE", api("/actions/caches")),
        ("POST", "/octo/hello.git/git-upload-pack".to_string()),
    ];
    for (method, path) in &expected {
        assert!(hit(method, path), "no {method} {path}");
    }
    assert!(
        requests
            .iter()
            .any(|r| r.method == "PATCH" && r.raw_path.starts_with(&api("/issues/comments/"))),
        "the tracking comment was edited in place"
    );
    assert!(graphql("createCommitOnBranch"));
    let pulls = requests
        .iter()
        .find(|r| r.method == "POST" && r.raw_path == api("/pulls"))
        .unwrap();
    let body = pulls.body["body"].as_str().unwrap_or("");
    assert!(
        body.contains(&format!("({repo_url}/actions/runs/4101)")),
        "{body}"
    );
}
