//! Enterprise networks (docs/security.md#runner-proxy-and-private-ca): comment-triggered runs where
//! every service is reachable only through the runner proxy. fro-bot's clients (GitHub's API, its
//! git, the Actions cache, S3, the key proxy's upstream) and OpenCode's own requests go through
//! it; nothing meant for 127.0.0.1 (fro-bot's key proxy, OpenCode's server) does. With a private
//! CA, the same run over HTTPS (through the runner proxy's `CONNECT`), the services'
//! certificate signed by a test CA the job trusts in one of the ways runners do.

use serde_json::{json, Value};

use crate::e2e::scenarios::{main_step, with_s3, World};
use crate::support::action::{
    chown_r, comment_event, explain, fresh_checkout, Job, Launch, StepResult,
};
use crate::support::fake_llm::{request_text, Reply};
use crate::support::fake_runner_proxy::{named, FakeRunnerProxy};
use crate::support::tls::{TestCa, TlsFront};

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

/// How a test's services are reached: under `.test` names that only the runner proxy resolves, over
/// HTTP, or over HTTPS through fronts holding the test CA's certificate.
struct Reach<'a> {
    ca: Option<&'a TestCa>,
    fronts: Vec<TlsFront>,
}

impl<'a> Reach<'a> {
    fn http() -> Self {
        Reach {
            ca: None,
            fronts: Vec::new(),
        }
    }

    fn https(ca: &'a TestCa) -> Self {
        Reach {
            ca: Some(ca),
            fronts: Vec::new(),
        }
    }

    /// `local` (`http://127.0.0.1:<port>[/path]`) under `name`.
    async fn url(&mut self, local: &str, name: &str) -> String {
        let Some(ca) = self.ca else {
            return named(local, name);
        };
        let rest = local.strip_prefix("http://127.0.0.1:").unwrap();
        let (port, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let front = TlsFront::start(ca, ([127, 0, 0, 1], port.parse().unwrap()).into()).await;
        let url = format!("https://{name}:{}{path}", front.port);
        self.fronts.push(front);
        url
    }
}

/// `allowed-domains` for the page at `url`: the agent's fetch goes through fro-bot's egress proxy,
/// which sends it on through the runner's (the only one that resolves `web.test`).
fn allow_page(job: &mut Job, url: &str) {
    let authority = url.split("://").nth(1).unwrap().split('/').next().unwrap();
    job.input("allowed-domains", authority.to_string());
}

/// A job of `world` whose every service (GitHub's API and git, the cache, S3, the provider) is
/// reached as `reach` says, with S3 backup on under `prefix`.
async fn job_behind(world: &World, reach: &mut Reach<'_>, run_id: u64, prefix: &str) -> Job {
    let cache = reach.url(&world.cache.local_origin(), "cache.test").await;
    world.cache.set_origin(&cache);
    let mut job = world.job(run_id);
    let github = reach.url(&world.github.url, "github.test").await;
    job.set("GITHUB_API_URL", github.clone())
        .set("GITHUB_GRAPHQL_URL", format!("{github}/graphql"))
        .set("GITHUB_SERVER_URL", github);
    let llm = reach.url(&world.llm.base_url(), "llm.test").await;
    job.input("opencode-config", llm_config_at(world, &llm).to_string());
    with_s3(&mut job, prefix);
    let s3 = reach
        .url(&crate::support::services::s3().endpoint, "s3.test")
        .await;
    job.input("s3-endpoint", s3);
    job
}

#[tokio::test]
async fn behind_a_runner_proxy_everything_external_goes_through_it_and_nothing_loopback_does() {
    let world = World::start().await;
    let runner_proxy = FakeRunnerProxy::start().await;
    let mut reach = Reach::http();
    let page = reach
        .url(&web_page("page-through-the-proxy").await, "web.test")
        .await;
    world
        .github
        .seed_issue(5, "Read the page", "What does it say?");
    let prefix = crate::support::s3::unique_prefix("egress");
    let mut job = job_behind(&world, &mut reach, 3100, &prefix).await;
    allow_page(&mut job, &page);
    // The checkout is the runner user's, as on a hosted runner, so the agent can change it.
    job.owned_by_runner_user(RUNNER_UID);
    world.github.seed_git_repo(&job.workspace());
    // What runners set, in either case; NO_PROXY without the loopback, which fro-bot must keep
    // away from the runner proxy all the same.
    job.set("http_proxy", runner_proxy.url())
        .set("HTTPS_PROXY", runner_proxy.url())
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
    assert_eq!(
        first.code,
        0,
        "{}\n{:?}",
        explain(&first),
        runner_proxy.summary()
    );
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
        "OpenCode fetched the page through the runner proxy: {fetched}"
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
        runner_proxy.summary()
    );
    assert_eq!(second.output("cache-status"), "hit");
    fetched_the_branch(&world, &second);

    for host in [
        "github.test",
        "cache.test",
        "s3.test",
        "llm.test",
        "web.test",
    ] {
        assert!(
            runner_proxy.count(host) > 0,
            "nothing for {host}: {:?}",
            runner_proxy.summary()
        );
    }
    assert_eq!(
        runner_proxy.elsewhere(),
        [],
        "loopback traffic never goes to the runner proxy"
    );
}

/// A follow-up's git fetched the thread's branch and checked it out.
fn fetched_the_branch(world: &World, r: &StepResult) {
    assert!(!r.stdout.contains("cannot check out"), "{}", explain(r));
    assert!(
        world
            .github
            .requests()
            .iter()
            .any(|q| q.path.ends_with("/git-upload-pack")),
        "git fetched the branch: {}",
        explain(r)
    );
}

/// Where the job trusts the test CA.
enum Trust {
    NodeExtraCaCerts,
    SslCertFile,
    SystemStore,
}

/// A comment-triggered run in which every service (OpenCode's page included) is HTTPS with a
/// certificate of a private CA the job trusts as `trust` says: everything connects, answers, saves,
/// publishes and delivers the change, through the runner proxy; and a follow-up whose git fetch of the
/// thread's branch trusts the CA too.
async fn a_run_over_https_with_a_private_ca(trust: Trust, launch: Launch) {
    let ca = TestCa::new();
    let world = World::start_with(launch).await;
    let runner_proxy = FakeRunnerProxy::start().await;
    let mut reach = Reach::https(&ca);
    let page = reach
        .url(&web_page("page-behind-the-private-ca").await, "web.test")
        .await;
    world
        .github
        .seed_issue(5, "Read the page", "What does it say?");
    let prefix = crate::support::s3::unique_prefix("private-ca");
    let mut job = job_behind(&world, &mut reach, 3200, &prefix).await;
    allow_page(&mut job, &page);
    job.set("https_proxy", runner_proxy.url());
    job.owned_by_runner_user(RUNNER_UID);
    world.github.seed_git_repo(&job.workspace());
    trust_ca(&mut job, &ca, &trust);
    world.llm.push(Reply::tool(
        "webfetch",
        json!({"url": page, "format": "text"}),
    ));
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": "printf 'page\\n' >> README.md", "description": "note it"}),
    ));
    world.llm.push(Reply::text("The page says hello."));
    job.event(
        "issue_comment",
        &comment_event(5, 501, "@fro-bot what does the page say?"),
    );
    let (mut job, r) = main_step(job).await;

    assert_eq!(r.code, 0, "{}\n{:?}", explain(&r), runner_proxy.summary());
    assert_eq!(r.output("changes"), "delivered", "{}", explain(&r));
    let comments = world.github.created_comments();
    assert!(
        comments
            .iter()
            .any(|(_, body)| body.contains("page says hello")),
        "{comments:?}\n{}",
        explain(&r)
    );
    assert_eq!(r.output("cache-save-result"), "durable", "{}", explain(&r));
    assert!(
        r.summary.contains("| Object-store publish | published |"),
        "{}",
        r.summary
    );
    let fetched = request_text(&world.llm.requests()[1]);
    assert!(
        fetched.contains("page-behind-the-private-ca"),
        "OpenCode trusted the page's certificate: {fetched}"
    );
    for host in [
        "github.test",
        "cache.test",
        "s3.test",
        "llm.test",
        "web.test",
    ] {
        let tunnels = runner_proxy
            .seen()
            .iter()
            .filter(|s| s.host == host && s.method == "CONNECT")
            .count();
        assert!(
            tunnels > 0,
            "no tunnel to {host}: {:?}",
            runner_proxy.summary()
        );
    }
    assert_eq!(
        runner_proxy.elsewhere(),
        [],
        "loopback traffic never goes to the runner proxy"
    );

    // A follow-up: fro-bot's own git fetches the thread's branch over HTTPS, trusting the CA as
    // fro-bot's clients do (git on its own reads only the system store).
    job.next_run(3201);
    trust_ca(&mut job, &ca, &trust);
    fresh_checkout(&job.workspace(), "hello\n");
    chown_r(&job.workspace(), RUNNER_UID);
    world.llm.push(Reply::text("Still hello."));
    job.event("issue_comment", &comment_event(5, 502, "@fro-bot again"));
    let (_job, second) = main_step(job).await;
    assert_eq!(second.code, 0, "{}", explain(&second));
    fetched_the_branch(&world, &second);
}

/// The job trusts `ca` as `trust` says. A certificate file is put where the runner puts what a
/// workflow writes for later steps, `RUNNER_TEMP` (emptied by `Job::next_run`), and named as the
/// step sees it (`/github/runner_temp/…` in the container, where the host's store is not visible).
fn trust_ca(job: &mut Job, ca: &TestCa, trust: &Trust) {
    let name = match trust {
        Trust::NodeExtraCaCerts => "NODE_EXTRA_CA_CERTS",
        Trust::SslCertFile => "SSL_CERT_FILE",
        Trust::SystemStore => {
            job.system_trust_store(ca.system_bundle());
            return;
        }
    };
    let file = job.root.path().join("runner_temp/private-ca.pem");
    std::fs::copy(ca.pem(), &file).unwrap();
    let seen = job.step_path(&file).to_string_lossy().into_owned();
    job.set(name, seen);
}

/// Also from the action's image (`container::`), as a self-hosted runner behind a private CA runs it.
pub(crate) async fn a_private_ca_in_node_extra_ca_certs_is_trusted_by_fro_bot_and_opencode(
    launch: Launch,
) {
    a_run_over_https_with_a_private_ca(Trust::NodeExtraCaCerts, launch).await;
}

#[tokio::test]
async fn a_private_ca_as_ssl_cert_file_is_trusted_by_fro_bot_and_opencode() {
    a_run_over_https_with_a_private_ca(Trust::SslCertFile, Launch::Binary).await;
}

#[tokio::test]
async fn a_private_ca_in_the_system_trust_store_is_trusted_by_fro_bot_and_opencode() {
    a_run_over_https_with_a_private_ca(Trust::SystemStore, Launch::Binary).await;
}

/// The same network with the private CA trusted nowhere: each certificate it signed is refused,
/// by fro-bot's own client (`net::external`, here the Actions cache's save), its git fetch of the
/// thread's branch (`net::git_trust`), and OpenCode's fetch, each failing as
/// docs/troubleshooting.md ("A private CA") says: a client that stopped checking certificates
/// fails this. The handshakes fail: the runner proxy tunnelled to each, and nothing reached the services
/// behind the certificate. GitHub's API and the provider stay on HTTP (through the runner proxy), so the
/// run gets to each of them in one run; S3 stays on HTTP too (its SDK's retries of the refused
/// handshake would take some 20 s more), its client trusting what `net::external`'s does.
#[tokio::test]
async fn without_the_private_ca_fro_bot_and_opencode_refuse_its_certificates() {
    let ca = TestCa::new();
    let world = World::start().await;
    let runner_proxy = FakeRunnerProxy::start().await;
    let mut reach = Reach::https(&ca);
    let page = reach
        .url(&web_page("page-behind-an-untrusted-ca").await, "web.test")
        .await;
    world
        .github
        .seed_issue(5, "Read the page", "What does it say?");
    let cache = reach.url(&world.cache.local_origin(), "cache.test").await;
    world.cache.set_origin(&cache);
    let mut job = world.job(3300);
    allow_page(&mut job, &page);
    let api = named(&world.github.url, "github.test");
    let git = reach.url(&world.github.url, "github.test").await;
    job.set("GITHUB_API_URL", api.clone())
        .set("GITHUB_GRAPHQL_URL", format!("{api}/graphql"))
        .set("GITHUB_SERVER_URL", git);
    let llm = named(&world.llm.base_url(), "llm.test");
    job.input("opencode-config", llm_config_at(&world, &llm).to_string());
    job.set("HTTPS_PROXY", runner_proxy.url())
        .set("HTTP_PROXY", runner_proxy.url())
        // The save's request is enough: each refused one is retried for some 9 s.
        .set("ACTIONS_CACHE_MODE", "write-only");
    job.owned_by_runner_user(RUNNER_UID);
    world.github.seed_git_repo(&job.workspace());
    // The thread has fro-bot's branch already: its git fetches it before the turn.
    world
        .github
        .add_fro_bot_commit_on_branch("fro-bot/issue-5", "page.md", "old\n");
    world.llm.push(Reply::tool(
        "webfetch",
        json!({"url": page, "format": "text"}),
    ));
    world.llm.push(Reply::text("The page could not be read."));
    job.event(
        "issue_comment",
        &comment_event(5, 501, "@fro-bot what does the page say?"),
    );
    let (_job, r) = main_step(job).await;

    // fro-bot's client: the cache's save.
    let refused = "memory: not-persisted (cache-error): ReserveCache: transport error: client error (Connect): invalid peer certificate: UnknownIssuer";
    assert!(r.stdout.contains(refused), "{refused}\n{}", explain(&r));
    assert_eq!(r.output("cache-save-result"), "not-persisted");
    // fro-bot's git.
    assert!(
        r.stdout
            .contains("cannot check out fro-bot/issue-5: git fetch")
            && r.stdout.contains("server certificate verification failed"),
        "{}",
        explain(&r)
    );
    // OpenCode's fetch: the tool's error reached the model, the page never did.
    let fetched = request_text(&world.llm.requests()[1]);
    assert!(
        fetched.contains(&format!("Transport error (GET {page})"))
            && !fetched.contains("page-behind-an-untrusted-ca"),
        "OpenCode refused the page's certificate: {fetched}"
    );
    // Each got as far as the handshake: tunnelled, and nothing arrived behind it.
    for host in ["cache.test", "github.test", "web.test"] {
        let tunnels = runner_proxy
            .seen()
            .iter()
            .filter(|s| s.host == host && s.method == "CONNECT")
            .count();
        assert!(
            tunnels > 0,
            "no tunnel to {host}: {:?}",
            runner_proxy.summary()
        );
    }
    assert!(world.cache.calls().is_empty(), "{:?}", world.cache.calls());
    assert!(
        !world
            .github
            .requests()
            .iter()
            .any(|q| q.path.contains("/git-upload-pack") || q.path.ends_with("/info/refs")),
        "git got past the handshake"
    );
    let comments = world.github.created_comments();
    assert!(
        comments
            .iter()
            .any(|(_, body)| body.contains("The page could not be read.")),
        "{comments:?}"
    );
}
