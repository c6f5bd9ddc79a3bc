//! Enterprise networks (docs/security.md#egress-proxy-and-private-ca): comment-triggered runs where
//! every service is reachable only through the runner's egress proxy. fro-bot's clients (GitHub's
//! API, its git, the Actions cache, S3, the provider proxy's upstream) and OpenCode's own requests
//! go through it; nothing meant for 127.0.0.1 (fro-bot's provider proxy, OpenCode's server) does.

use serde_json::{json, Value};

use crate::e2e::scenarios::{main_step, with_s3, World};
use crate::support::action::{chown_r, comment_event, explain, fresh_checkout, Job};
use crate::support::egress::{named, EgressProxy};
use crate::support::fake_llm::{request_text, Reply};

const RUNNER_UID: u32 = 1001;

/// A page for OpenCode's `webfetch` to fetch, on 127.0.0.1; its URL.
async fn web_page(text: &'static str) -> String {
    let app = axum::Router::new().route("/page", axum::routing::get(move || async move { text }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/page")
}

/// The fake provider's `opencode-config` with its API at `base_url`.
fn llm_config_at(world: &World, base_url: &str) -> Value {
    let mut config = world.llm.opencode_config();
    config["provider"]["fake"]["options"]["baseURL"] = json!(base_url);
    config
}

/// A job of `world` whose every service (GitHub's API and git, the cache, S3, the provider) is
/// named so that only the proxy reaches it, with S3 backup on under `prefix`. The checkout is the
/// runner user's, as on a hosted runner, so the agent can change it.
fn job_behind(world: &World, run_id: u64, prefix: &str) -> Job {
    world
        .cache
        .set_origin(&named(&world.cache.local_origin(), "cache.test"));
    let mut job = world.job(run_id);
    let github = named(&world.github.url, "github.test");
    job.set("GITHUB_API_URL", github.clone())
        .set("GITHUB_SERVER_URL", github);
    let llm = named(&world.llm.base_url(), "llm.test");
    job.input("opencode-config", llm_config_at(world, &llm).to_string());
    with_s3(&mut job, prefix);
    let s3 = crate::support::services::s3();
    job.input("s3-endpoint", named(&s3.endpoint, "s3.test"));
    job.owned_by_runner_user(RUNNER_UID);
    job
}

#[tokio::test]
async fn behind_an_egress_proxy_everything_external_goes_through_it_and_nothing_loopback_does() {
    let world = World::start().await;
    let proxy = EgressProxy::start().await;
    let page = named(&web_page("page-through-the-proxy").await, "web.test");
    world
        .github
        .seed_issue(5, "Read the page", "What does it say?");
    let prefix = crate::support::s3::unique_prefix("egress");
    let mut job = job_behind(&world, 3100, &prefix);
    world.github.seed_git_repo(&job.workspace());
    // What runners set, in either case; NO_PROXY without the loopback, which fro-bot must keep
    // away from the proxy all the same.
    job.set("http_proxy", proxy.url())
        .set("HTTPS_PROXY", proxy.url())
        .set("no_proxy", "intranet.example");

    // Run 1: OpenCode fetches a page and changes a file; fro-bot commits it through the API.
    world.llm.push(Reply::tool(
        "webfetch",
        json!({"url": page, "format": "text"}),
    ));
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": "printf 'page\\n' >> README.md", "description": "note it"}),
    ));
    world.llm.push(Reply::tool(
        "fro-bot-sessions_describe_change",
        json!({"title": "Note the page", "body": "From the page."}),
    ));
    world.llm.push(Reply::text("The page says hello."));
    job.event(
        "issue_comment",
        &comment_event(5, 501, "@fro-bot what does the page say?"),
    );
    let (mut job, first) = main_step(job).await;
    assert_eq!(first.code, 0, "{}\n{:?}", explain(&first), proxy.summary());
    assert_eq!(first.output("changes"), "delivered", "{}", explain(&first));
    assert_eq!(first.output("cache-save-result"), "durable");
    assert!(
        first
            .summary
            .contains("| Object-store publish | published |"),
        "{}",
        first.summary
    );
    let fetched = request_text(&world.llm.requests()[1]);
    assert!(
        fetched.contains("page-through-the-proxy"),
        "OpenCode fetched the page through the proxy: {fetched}"
    );
    let comments = world.github.created_comments();
    assert!(
        comments
            .iter()
            .any(|(_, body)| body.contains("page says hello")),
        "{comments:?}"
    );

    // Run 2, a follow-up: memory comes back from the cache and git fetches the branch.
    job.next_run(3101);
    fresh_checkout(&job.workspace(), "hello\n");
    chown_r(&job.workspace(), RUNNER_UID);
    world.llm.push(Reply::text("Still hello."));
    job.event("issue_comment", &comment_event(5, 502, "@fro-bot again"));
    let (_job, second) = main_step(job).await;
    assert_eq!(
        second.code,
        0,
        "{}\n{:?}",
        explain(&second),
        proxy.summary()
    );
    assert_eq!(second.output("cache-status"), "hit");
    assert!(
        !second.stdout.contains("cannot check out"),
        "{}",
        explain(&second)
    );
    assert!(
        world
            .github
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/git-upload-pack")),
        "git fetched the branch"
    );

    for host in [
        "github.test",
        "cache.test",
        "s3.test",
        "llm.test",
        "web.test",
    ] {
        assert!(
            proxy.count(host) > 0,
            "nothing for {host}: {:?}",
            proxy.summary()
        );
    }
    assert_eq!(
        proxy.elsewhere(),
        [],
        "loopback traffic never goes to the proxy"
    );
}
