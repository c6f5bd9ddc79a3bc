//! Safe outputs (docs/security.md#the-agent-proposes-fro-bot-disposes): the real OpenCode, driven by
//! the scripted model, changes files and calls its proposal tools; fro-bot — never the agent —
//! commits through the fake GitHub's `createCommitOnBranch` onto a real bare repository, opens the
//! pull request, and carries out labels, comments and issues within the run's policy.

use serde_json::json;

use super::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain, fresh_checkout, Job, Launch, StepResult};
use crate::support::fake_github::TOKEN;
use crate::support::fake_llm::{request_text, Reply};

pub(crate) const RUNNER_UID: u32 = 1001;

/// A tool of fro-bot's MCP server, as OpenCode names it for the model.
pub(crate) fn tool(name: &str) -> String {
    format!("fro-bot-sessions_{name}")
}

pub(crate) fn bash(command: &str) -> Reply {
    Reply::tool("bash", json!({"command": command, "description": "work"}))
}

/// A job whose checkout belongs to the runner's user and whose repository the fake GitHub serves.
pub(crate) fn job(world: &World, run_id: u64) -> Job {
    let mut job = world.job(run_id);
    job.set("GITHUB_SERVER_URL", world.github.url.clone());
    job.owned_by_runner_user(RUNNER_UID);
    job
}

/// A new job's checkout: the repository's `main` again, as `actions/checkout` leaves it.
pub(crate) fn fresh_workspace(job: &mut Job) {
    fresh_checkout(&job.workspace(), "hello\n");
    crate::support::action::chown_r(&job.workspace(), RUNNER_UID);
}

pub(crate) fn answer(world: &World) -> String {
    world
        .github
        .comment_versions()
        .last()
        .cloned()
        .unwrap_or_default()
}

fn files(world: &World, branch: &str) -> Vec<(String, String)> {
    world
        .github
        .branch_files(branch)
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

fn assert_delivered(r: &StepResult, branch: &str) {
    assert_eq!(r.code, 0, "{}", explain(r));
    assert_eq!(r.output("changes"), "delivered", "{}", explain(r));
    assert_eq!(r.output("branch"), branch);
}

pub(crate) async fn an_issue_gets_a_branch_and_a_draft_pull_request_and_a_follow_up_adds_to_it(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    world
        .github
        .seed_issue(5, "Typo in README", "It says hello.");
    let mut job = job(&world, 3000);
    world.github.seed_git_repo(&job.workspace());
    let main_head = world.github.branch_head("main").unwrap();
    world.llm.push(bash(
        "printf 'hello world\\n' > README.md && mkdir -p docs && printf 'new page\\n' > docs/new.md",
    ));
    world.llm.push(Reply::tool(
        tool("describe_change"),
        json!({"title": "Fix the README greeting", "body": "Greets the world. @someone please look"}),
    ));
    world.llm.push(Reply::text("Fixed the greeting."));
    job.event(
        "issue_comment",
        &comment_event(5, 501, "@fro-bot fix the typo"),
    );
    let (mut job, first) = main_step(job).await;
    assert_delivered(&first, "fro-bot/issue-5");
    let sha = first.output("commit-sha").to_string();
    assert_eq!(
        world.github.branch_head("fro-bot/issue-5").as_deref(),
        Some(sha.as_str())
    );
    assert_eq!(
        world.github.commit_parent(&sha).as_deref(),
        Some(main_head.as_str())
    );
    assert_eq!(
        files(&world, "fro-bot/issue-5"),
        [
            ("README.md".to_string(), "hello world\n".to_string()),
            ("docs/new.md".to_string(), "new page\n".to_string())
        ],
        "the branch holds what the agent wrote, byte for byte"
    );
    let message = world.github.commit_message(&sha);
    assert!(
        message.starts_with("Fix the README greeting\n"),
        "{message}"
    );
    // At the server's own no-reply domain (the fake's host here; github.com's on github.com).
    let host = url::Url::parse(&world.github.url).unwrap();
    let host = host.host_str().unwrap();
    assert!(
        message.contains(&format!("Co-authored-by: mona <mona@users.noreply.{host}>")),
        "{message}"
    );
    let run = format!(
        "Fro-Bot-Run: {}/octo/hello/actions/runs/3000",
        world.github.url
    );
    assert!(message.ends_with(&run), "{message}");
    assert!(
        message.contains("`@someone`"),
        "mentions are inert: {message}"
    );
    let pulls = world.github.created_pulls();
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    let pr = &pulls[0];
    assert_eq!(pr["draft"], true);
    assert_eq!(pr["head"]["ref"], "fro-bot/issue-5");
    assert_eq!(pr["base"]["ref"], "main");
    assert_eq!(pr["title"], "Fix the README greeting");
    let body = pr["body"].as_str().unwrap();
    assert!(body.contains("Closes #5"), "{body}");
    assert!(body.contains("`@someone`"), "mentions are inert: {body}");
    assert_eq!(first.output("pr-url"), pr["html_url"].as_str().unwrap());
    let text = answer(&world);
    assert!(text.contains("Fixed the greeting."), "{text}");
    assert!(text.contains(pr["html_url"].as_str().unwrap()), "{text}");
    assert!(first.summary.contains("| Changes |"), "{}", first.summary);
    assert_eq!(world.github.git_pushes(), 0, "fro-bot never pushes");

    // A follow-up on the thread, on a fresh runner: the agent starts on the branch.
    job.next_run(3001);
    fresh_workspace(&mut job);
    world.llm.push(bash("printf 'more\\n' >> README.md"));
    world.llm.push(Reply::text("Added a line."));
    job.event(
        "issue_comment",
        &comment_event(5, 502, "@fro-bot also add a line"),
    );
    let (mut job, second) = main_step(job).await;
    assert_delivered(&second, "fro-bot/issue-5");
    let sha2 = second.output("commit-sha").to_string();
    assert_ne!(sha2, sha);
    assert_eq!(
        world.github.commit_parent(&sha2).as_deref(),
        Some(sha.as_str())
    );
    assert_eq!(
        files(&world, "fro-bot/issue-5")[0].1,
        "hello world\nmore\n",
        "built on the first commit"
    );
    assert_eq!(
        world.github.created_pulls().len(),
        1,
        "never a second pull request"
    );
    assert!(
        answer(&world).contains("Added to pull request"),
        "{}",
        answer(&world)
    );
    assert!(
        world
            .github
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/git-upload-pack") && r.auth.is_some()),
        "the branch was fetched with the token"
    );
    let config = std::fs::read_to_string(job.workspace().join(".git/config")).unwrap();
    assert!(
        !config.contains("AUTHORIZATION"),
        "no credential written: {config}"
    );

    // Attempt 2 of the same run: its commit is at the branch head already.
    let mutations = world.github.commit_mutations();
    fresh_workspace(&mut job);
    job.set("GITHUB_RUN_ATTEMPT", "2");
    world.llm.push(bash("printf 'more\\n' >> README.md"));
    world.llm.push(Reply::text("Added a line."));
    let (_job, again) = main_step(job).await;
    assert_delivered(&again, "fro-bot/issue-5");
    assert_eq!(again.output("commit-sha"), sha2, "the same commit");
    assert_eq!(
        world.github.commit_mutations(),
        mutations,
        "no second commit"
    );
}

/// One run on issue `n` whose agent runs `command` (then proposes `extra`, if any); what it ended
/// with.
pub(crate) async fn issue_run(
    world: &World,
    n: u64,
    command: &str,
    inputs: &[(&str, &str)],
    extra: Option<Reply>,
) -> StepResult {
    issue_run_job(world, n, command, inputs, extra).await.1
}

/// [`issue_run`], with the job for a follow-up run.
pub(crate) async fn issue_run_job(
    world: &World,
    n: u64,
    command: &str,
    inputs: &[(&str, &str)],
    extra: Option<Reply>,
) -> (Job, StepResult) {
    world.github.seed_issue(n, "Change things", "Please.");
    let mut job = job(world, 3100 + n);
    for (k, v) in inputs {
        job.input(k, *v);
    }
    world.github.seed_git_repo(&job.workspace());
    world.llm.push(bash(command));
    if let Some(reply) = extra {
        world.llm.push(reply);
    }
    world.llm.push(Reply::text("Done."));
    job.event(
        "issue_comment",
        &comment_event(n, 600 + n, "@fro-bot change things"),
    );
    main_step(job).await
}

#[tokio::test]
async fn protected_over_limit_and_secret_changes_are_refused_and_nothing_is_written() {
    let world = World::start().await;
    let secret = format!("ghp_{}", "Zq9Xw8Ev7Rt6".repeat(3));
    // (issue, the agent's command, inputs, what the answer must say)
    type Case<'a> = (u64, String, Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            11,
            "mkdir -p .github/workflows && echo 'on: push' > .github/workflows/x.yml && echo x > ok.txt".into(),
            vec![],
            vec!["`.github/workflows/x.yml`", "`protected-paths`"],
        ),
        (
            12,
            "echo a > a.txt && echo b > b.txt && echo c > c.txt".into(),
            vec![("max-change-files", "2")],
            vec!["3 files, 1 over `max-change-files` (2)"],
        ),
        (
            13,
            format!("printf 'fine\\ntoken = {secret}\\n' > config.ini"),
            vec![],
            vec!["`config.ini` line 2 holds what looks like a secret"],
        ),
        (
            14,
            "head -c 3000 /dev/zero > big.bin".into(),
            vec![("max-change-bytes", "1000")],
            vec!["3000 bytes of changed content, 2000 over `max-change-bytes` (1000)"],
        ),
    ];
    for (n, command, inputs, said) in cases {
        let r = issue_run(&world, n, &command, &inputs, None).await;
        assert_eq!(r.code, 0, "{}", explain(&r));
        assert_eq!(r.output("changes"), "refused", "#{n}: {}", explain(&r));
        let text = answer(&world);
        for s in said {
            assert!(text.contains(s), "#{n}: {s:?} not in the answer:\n{text}");
        }
        assert!(
            text.contains("nothing was written to the repository"),
            "{text}"
        );
        assert!(!text.contains(&secret), "the secret never leaves: {text}");
        assert!(!r.summary.contains(&secret));
        assert!(world
            .github
            .branch_head(&format!("fro-bot/issue-{n}"))
            .is_none());
    }
    assert_eq!(world.github.commit_mutations(), 0);
    assert!(world.github.created_pulls().is_empty());
}

/// Programs git would run from the checkout's `.git`, planted before the run so that putting `.git`
/// back after the turn restores them (the agent's own plants are gone by the time the change is
/// read): hooks, `core.fsmonitor`, `core.hooksPath`, a clean/smudge filter that would rewrite
/// every file, and a `textconv`, through `info/attributes`. Each marks `.git/ran/<name>-<uid>` at
/// `ws`, the checkout's path as the step sees it.
fn plant_in_checkout(job: &Job) {
    let git = job.workspace().join(".git");
    let ws = job.step_workspace();
    let ws = ws.display();
    let ran = format!("{ws}/.git/ran");
    let mark = |name: &str| format!("#!/bin/sh\ntouch \"{ran}/{name}-$(id -u)\"\n");
    let mut programs = vec![
        ("fsmon.sh".to_string(), mark("fsmonitor")),
        (
            "textconv.sh".to_string(),
            format!("{}cat \"$1\"\n", mark("textconv")),
        ),
        (
            "filter.sh".to_string(),
            format!("{}sed 's/^/FILTERED /'\n", mark("filter")),
        ),
    ];
    for hook in [
        "pre-commit",
        "post-checkout",
        "post-index-change",
        "reference-transaction",
        "fsmonitor-watchman",
    ] {
        programs.push((format!("hooks/{hook}"), mark(hook)));
    }
    std::fs::create_dir_all(git.join("ran")).unwrap();
    std::fs::create_dir_all(git.join("hooks")).unwrap();
    for (name, body) in programs {
        std::fs::write(git.join(&name), body).unwrap();
        std::fs::set_permissions(
            git.join(&name),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
    let mut config = std::fs::read_to_string(git.join("config")).unwrap();
    config.push_str(&format!(
        "[core]\n\tfsmonitor = {ws}/.git/fsmon.sh\n\thooksPath = {ws}/.git/hooks\n\
         [filter \"evil\"]\n\tclean = {ws}/.git/filter.sh\n\tsmudge = {ws}/.git/filter.sh\n\
         [diff \"evil\"]\n\ttextconv = {ws}/.git/textconv.sh\n"
    ));
    std::fs::write(git.join("config"), config).unwrap();
    std::fs::create_dir_all(git.join("info")).unwrap();
    std::fs::write(git.join("info/attributes"), "* filter=evil diff=evil\n").unwrap();
    crate::support::action::chown_r(&git, RUNNER_UID);
    std::fs::set_permissions(
        git.join("ran"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
}

/// The change is read with fro-bot's own git dir, never the workspace's: neither what the agent
/// plants in `.git` during the turn (put back before the change is read) nor what `.git` holds
/// when it is read ([`plant_in_checkout`]) runs as fro-bot. The agent's own git may run the
/// checkout's programs; those marks carry the agent's uid.
pub(crate) async fn hooks_and_config_the_agent_plants_in_git_never_run_while_fro_bot_reads_the_change(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(21, "Edit", "Edit a file.");
    let job = job(&world, 3200);
    world.github.seed_git_repo(&job.workspace());
    plant_in_checkout(&job);
    let ran_dir = job.workspace().join(".git/ran");
    let script = "set -e; ran=\"$PWD/.git/ran\"; mark=\"#!/bin/sh\ntouch $ran/\\$(basename \\$0)-\\$(id -u)\n\"
for h in pre-commit post-checkout post-index-change reference-transaction fsmonitor-watchman; do
  printf \"$mark\" > .git/hooks/$h; chmod +x .git/hooks/$h; done
printf \"$mark\" > .git/fsmon.sh; chmod +x .git/fsmon.sh
printf '[core]\\n\\tfsmonitor = %s/.git/fsmon.sh\\n' \"$PWD\" > .git/extra.cfg
git config core.fsmonitor \"$PWD/.git/fsmon.sh\"
git config include.path \"$PWD/.git/extra.cfg\"
git config filter.evil.clean \"$PWD/.git/fsmon.sh\"
echo '* filter=evil' > .git/info/attributes
echo changed > README.md";
    world.llm.push(bash(script));
    world.llm.push(Reply::text("Edited."));
    let mut job = job;
    job.event("issue_comment", &comment_event(21, 701, "@fro-bot edit"));
    let (_job, r) = main_step(job).await;
    assert_delivered(&r, "fro-bot/issue-21");
    assert!(
        r.summary.contains("the agent changed .git/config"),
        "the agent's plants were there to put back: {}",
        r.summary
    );
    assert_eq!(
        files(&world, "fro-bot/issue-21")[0].1,
        "changed\n",
        "no clean filter ran"
    );
    let agent = format!("-{RUNNER_UID}");
    let ran: Vec<String> = std::fs::read_dir(&ran_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(&agent))
        .collect();
    assert!(
        ran.is_empty(),
        "planted programs ran as fro-bot while it read the change: {ran:?}"
    );
}

#[tokio::test]
async fn a_schedule_run_labels_through_its_tools_within_the_allowlist_and_holds_no_credential() {
    let world = World::start().await;
    world.github.seed_issue(7, "Crash on start", "It crashes.");
    world.github.seed_labels(&["bug", "triage"]);
    let mut job = job(&world, 3300);
    world.github.seed_git_repo(&job.workspace());
    job.input("prompt", "Triage the open issues and label them.");
    job.input("max-comments", "1");
    job.event(
        "schedule",
        &json!({"schedule": "0 6 * * 1", "repository": {"full_name": "octo/hello"}}),
    );
    // What the agent can see of credentials, then the tools, then a forged proposals file.
    world.llm.push(bash(
        "env; git config --list --show-origin 2>/dev/null | grep -i -e extraheader -e credential || true",
    ));
    world.llm.push(Reply::tool(
        tool("add_labels"),
        json!({"number": 7, "labels": ["bug"]}),
    ));
    world.llm.push(Reply::tool(
        tool("add_labels"),
        json!({"number": 7, "labels": ["wontfix-custom"]}),
    ));
    world.llm.push(bash(
        "for d in /tmp/fro-bot-proposals-*/; do printf '%s\\n' \
        '{\"tool\":\"add_labels\",\"number\":7,\"labels\":[\"forged\"]}' \
        '{\"tool\":\"comment\",\"number\":7,\"body\":\"one\"}' \
        '{\"tool\":\"comment\",\"number\":7,\"body\":\"two @octocat\"}' \
        'not json' >> \"$d/proposals.jsonl\"; done; ls /tmp/fro-bot-proposals-*/",
    ));
    world.llm.push(Reply::text("Labelled #7 as a bug."));
    let (_job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert_eq!(
        world.github.issue_labels(7),
        ["bug"],
        "only the allowed label"
    );
    let requests = world.llm.requests();
    let seen: String = requests.iter().map(request_text).collect();
    assert!(seen.contains("PATH="), "the env dump reached the model");
    assert!(!seen.contains("GH_TOKEN"), "no GH_TOKEN for the agent");
    assert!(
        !seen.contains(TOKEN),
        "no token anywhere the agent could read"
    );
    assert!(
        seen.contains("is not allowed"),
        "the tool told the agent at once"
    );
    let comments = world.github.created_comments();
    let on7: Vec<_> = comments.iter().filter(|(k, _)| k == "issue-7").collect();
    assert_eq!(on7.len(), 1, "max-comments 1: {comments:?}");
    assert!(on7[0].1.starts_with("one"), "{on7:?}");
    assert!(on7[0].1.contains("<!-- fro-bot:response -->"));
    assert!(
        r.summary.contains("over `max-comments` (1)") && r.summary.contains("`forged`"),
        "{}",
        r.summary
    );
    assert!(
        r.summary.contains("1 malformed proposal line(s) ignored"),
        "{}",
        r.summary
    );
    assert_eq!(r.output("changes"), "none");
}

/// A comment on pull request `n` by mona, as GitHub sends it (no fork/draft flags: fro-bot asks).
pub(crate) fn pull_comment(n: u64, id: u64, body: &str) -> serde_json::Value {
    let mut event = comment_event(n, id, body);
    event["issue"]["pull_request"] =
        json!({"url": format!("https://api.github.com/repos/octo/hello/pulls/{n}")});
    event
}

#[tokio::test]
async fn a_pull_request_gets_the_commit_on_its_own_branch_unless_the_requester_cannot_write() {
    let world = World::start().await;
    let mut job = job(&world, 3400);
    world.github.seed_git_repo(&job.workspace());
    let feature = world
        .github
        .add_commit_on_branch("feature", "feature.txt", "from the pr\n");
    world.github.seed_pull_on_branch(8, "feature", false);
    world.llm.push(bash("cat feature.txt > copy.txt"));
    world.llm.push(Reply::text("Copied."));
    job.event("issue_comment", &pull_comment(8, 801, "@fro-bot copy it"));
    let (mut job, r) = main_step(job).await;
    assert_delivered(&r, "feature");
    let sha = r.output("commit-sha").to_string();
    assert_eq!(
        world.github.commit_parent(&sha).as_deref(),
        Some(feature.as_str())
    );
    let on_feature = files(&world, "feature");
    assert!(
        on_feature.contains(&("copy.txt".into(), "from the pr\n".into())),
        "the agent started on the pull request's head: {on_feature:?}"
    );
    assert!(
        world.github.created_pulls().is_empty(),
        "no second pull request"
    );
    assert!(
        answer(&world).contains("Pushed to this pull request"),
        "{}",
        answer(&world)
    );

    // Someone who may only read: fro-bot's own branch for the pull request, proposed into it.
    world.github.set_permission("mona", "read");
    job.next_run(3401);
    fresh_workspace(&mut job);
    world.llm.push(bash("echo more > more.txt"));
    world.llm.push(Reply::text("More."));
    job.event("issue_comment", &pull_comment(8, 802, "@fro-bot more"));
    let (_job, r) = main_step(job).await;
    assert_delivered(&r, "fro-bot/pr-8");
    let pulls = world.github.created_pulls();
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    assert_eq!(pulls[0]["base"]["ref"], "feature");
    assert_eq!(
        world.github.branch_head("feature").as_deref(),
        Some(sha.as_str())
    );
}

#[tokio::test]
async fn a_repository_that_forbids_actions_pull_requests_gets_the_link_and_the_setting() {
    let world = World::start().await;
    world.github.seed_issue(31, "Docs", "Add docs.");
    world.github.forbid_pull_request_creation();
    let mut job = job(&world, 3500);
    world.github.seed_git_repo(&job.workspace());
    world.llm.push(bash("echo docs > DOCS.md"));
    world.llm.push(Reply::text("Added docs."));
    job.event("issue_comment", &comment_event(31, 901, "@fro-bot docs"));
    let (_job, r) = main_step(job).await;
    assert_delivered(&r, "fro-bot/issue-31");
    assert!(!r.outputs.contains_key("pr-url"), "{:?}", r.outputs);
    let message = world.github.commit_message(r.output("commit-sha"));
    assert!(
        message.starts_with("Flaky build (#31)\n"),
        "without describe_change, the thread's title: {message}"
    );
    let text = answer(&world);
    assert!(
        text.contains("compare/main...fro-bot/issue-31?expand=1"),
        "{text}"
    );
    assert!(
        text.contains("Allow GitHub Actions to create and approve pull requests"),
        "{text}"
    );
}

#[tokio::test]
async fn a_branch_that_moves_during_the_commit_is_read_again_and_same_file_edits_are_not_overwritten(
) {
    let world = World::start().await;
    world.github.seed_issue(41, "Two things", "Do both.");
    let mut job = job(&world, 3600);
    world.github.seed_git_repo(&job.workspace());
    world.llm.push(bash("echo one > one.txt"));
    world.llm.push(Reply::text("One."));
    job.event("issue_comment", &comment_event(41, 1001, "@fro-bot one"));
    let (mut job, first) = main_step(job).await;
    assert_delivered(&first, "fro-bot/issue-41");

    // A person pushes to the branch while the second run commits: other files, so it retries.
    job.next_run(3601);
    fresh_workspace(&mut job);
    let person = "fro-bot/issue-41";
    world
        .github
        .move_branch_before_next_commit(person, "theirs.txt", "person\n");
    world.llm.push(bash("echo two > two.txt"));
    world.llm.push(Reply::text("Two."));
    job.event("issue_comment", &comment_event(41, 1002, "@fro-bot two"));
    let (mut job, second) = main_step(job).await;
    assert_delivered(&second, person);
    let sha = second.output("commit-sha").to_string();
    let parent = world.github.commit_parent(&sha).unwrap();
    assert_ne!(
        parent,
        first.output("commit-sha"),
        "built on the person's commit"
    );
    let names: Vec<String> = files(&world, person).into_iter().map(|(k, _)| k).collect();
    assert!(
        names.contains(&"theirs.txt".into()) && names.contains(&"two.txt".into()),
        "{names:?}"
    );

    // The same file: never overwritten.
    job.next_run(3602);
    fresh_workspace(&mut job);
    world
        .github
        .move_branch_before_next_commit(person, "two.txt", "person's two\n");
    world.llm.push(bash("echo three > two.txt"));
    world.llm.push(Reply::text("Three."));
    job.event("issue_comment", &comment_event(41, 1003, "@fro-bot three"));
    let (_job, third) = main_step(job).await;
    assert_eq!(third.output("changes"), "failed", "{}", explain(&third));
    assert!(
        answer(&world).contains("touch the same files (two.txt)"),
        "{}",
        answer(&world)
    );
    let two = files(&world, person)
        .into_iter()
        .find(|(k, _)| k == "two.txt")
        .unwrap();
    assert_eq!(two.1, "person's two\n");
}
