//! Nothing the agent leaves behind outlives its turn (docs/security.md#what-it-leaves-behind): an
//! injected agent plants hooks and config in `.git`; afterwards a later step's git commands, run as
//! the runner's user, run none of it — also when the main step was killed and post put `.git` back.

use std::process::Command;

use serde_json::json;

use super::scenarios::{main_step, post_step, World};
use crate::support::action::{comment_event, explain, Job, Launch};
use crate::support::fake_llm::Reply;

const RUNNER_UID: u32 = 1001;

/// Plants every kind of hook and config a later `git` would run, each marking `.git/ran/<name>`,
/// last a `commondir` naming a git dir of the agent's whose config has a `core.fsmonitor`.
/// Paths are relative to the checkout, so what runs is the same wherever the checkout is seen
/// (the container sees it at `/github/workspace`, a later step on the host at the job's path).
const PLANT: &str = "set -e; mkdir -p .git/ran; chmod 777 .git/ran
mark='#!/bin/sh
touch .git/ran/$(basename $0)
'
for h in pre-commit post-commit post-checkout post-index-change reference-transaction; do
  printf '%s' \"$mark\" > .git/hooks/$h; chmod +x .git/hooks/$h; done
printf '%s' \"$mark\" > .git/fsmon.sh; chmod +x .git/fsmon.sh
printf '%s' \"$mark\" > .git/alias.sh; chmod +x .git/alias.sh
printf '[core]\\n\\tfsmonitor = .git/fsmon.sh\\n' > .git/extra.cfg
git config include.path extra.cfg
git config alias.st '!.git/alias.sh'
git config core.hooksPath .git/hooks
mkdir -p .git/c/refs .git/c/objects; cp -r .git/refs/. .git/c/refs/; cp -r .git/objects/. .git/c/objects/
printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = .git/fsmon.sh\\n' > .git/c/config
echo c > .git/commondir
echo changed > README.md";

fn job(world: &World, run_id: u64) -> Job {
    let mut job = world.job(run_id);
    job.owned_by_runner_user(RUNNER_UID);
    job.input("changes", "off");
    job
}

/// What a later step of the job does with the checkout, as the runner's user. Each command must
/// run (a git that refused to start, on ownership or an unreadable config, would run no hook
/// either and pass as "nothing ran"), and what they make is there; the agent's alias is gone with
/// its config.
fn later_step(job: &Job) {
    let ws = job.workspace();
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&ws)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", job.home())
            .uid(RUNNER_UID)
            .gid(RUNNER_UID)
            .output()
            .unwrap()
    };
    let st = git(&["st"]);
    assert!(
        !st.status.success()
            && String::from_utf8_lossy(&st.stderr).contains("'st' is not a git command"),
        "the agent's alias is gone: {}{}",
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr)
    );
    for args in [
        &["status"][..],
        &[
            "-c",
            "user.name=ci",
            "-c",
            "user.email=ci@e",
            "commit",
            "-qam",
            "ci",
        ],
        &["checkout", "-q", "-b", "later"],
    ] {
        let out = git(args);
        assert!(
            out.status.success(),
            "a later step's git {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let made = git(&["log", "-1", "--format=%s", "refs/heads/later"]);
    assert_eq!(
        String::from_utf8_lossy(&made.stdout).trim(),
        "ci",
        "the later step's commit, on its branch: {}",
        String::from_utf8_lossy(&made.stderr)
    );
}

use std::os::unix::process::CommandExt;

/// The marks planted programs left. The directory is the agent's plant's own first step (and
/// outside what is put back): without it the plant never ran, and "nothing ran" would mean nothing.
fn ran(job: &Job) -> Vec<String> {
    let marks = job.workspace().join(".git/ran");
    std::fs::read_dir(&marks)
        .unwrap_or_else(|e| panic!("{}: {e}: the agent's plant never ran", marks.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// A run on issue `n` whose agent plants [`PLANT`]; the checkout's `.git/config` before it.
fn planting_job(world: &World, n: u64, run_id: u64) -> (Job, Vec<u8>) {
    world.github.seed_issue(n, "Edit", "Edit.");
    let mut job = job(world, run_id);
    let config = std::fs::read(job.workspace().join(".git/config")).unwrap();
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": PLANT, "description": "plant"}),
    ));
    world.llm.push(Reply::text("Done."));
    job.event("issue_comment", &comment_event(n, 1, "@fro-bot edit"));
    (job, config)
}

pub(crate) async fn what_the_agent_plants_in_git_is_put_back_and_a_later_steps_git_runs_none_of_it(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    let (job, config) = planting_job(&world, 5, 5100);
    let (job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert!(
        r.summary
            .contains(".git/config: alias.st, core.hookspath, include.path"),
        "{}",
        r.summary
    );
    assert!(r.summary.contains("added post-checkout"), "{}", r.summary);
    assert!(
        r.summary
            .contains("the agent changed .git/commondir: added it"),
        "{}",
        r.summary
    );
    assert_eq!(
        std::fs::read(job.workspace().join(".git/config")).unwrap(),
        config
    );
    assert!(
        std::fs::read_to_string(job.workspace().join("README.md")).unwrap() == "changed\n",
        "the work tree is the agent's proposed change and stays"
    );
    later_step(&job);
    assert_eq!(
        ran(&job),
        Vec::<String>::new(),
        "a later step ran what the agent planted"
    );
}

pub(crate) async fn after_a_sigkill_of_main_post_puts_git_back(launch: Launch) {
    let world = World::start_with(launch).await;
    let (mut job, config) = planting_job(&world, 6, 5200);
    // Killed after the agent stopped, before main could put .git back.
    job.set("FRO_BOT_FAILPOINT", "run:after-shutdown");
    let (mut job, main) = main_step(job).await;
    job.env.remove("FRO_BOT_FAILPOINT");
    assert_eq!(main.code, 128 + libc::SIGKILL, "{}", explain(&main));
    assert!(
        job.workspace().join(".git/hooks/post-checkout").exists(),
        "planted, not yet put back"
    );
    let (job, post) = post_step(job, main).await;
    assert_eq!(post.code, 0, "{}", explain(&post));
    assert!(
        post.summary
            .contains("The main step stopped before putting .git back"),
        "{}",
        post.summary
    );
    assert_eq!(
        std::fs::read(job.workspace().join(".git/config")).unwrap(),
        config
    );
    later_step(&job);
    assert_eq!(ran(&job), Vec::<String>::new());
}

/// Every message and part row of `session` (the scrub at save rewrites only secrets, which this
/// conversation has none of).
fn rows(db: &std::path::Path, session: &str) -> Vec<(String, String)> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let mut out = Vec::new();
    for table in ["message", "part"] {
        let mut stmt = c
            .prepare(&format!(
                "SELECT id, data FROM {table} WHERE session_id = ?1 ORDER BY id"
            ))
            .unwrap();
        let found = stmt
            .query_map([session], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        out.extend(found.map(Result::unwrap));
    }
    out
}

/// From the agent's shell (plain `sh`: the image has no Python): list the memory dir, read and
/// append to the database, open it through OpenCode's `/proc/<pid>/fd` (OpenCode, which holds it
/// open, is the ancestor running `opencode serve`), and plant a link to it in the checkout for
/// OpenCode's own tools. Each prints `SHELL-<WHAT>-DENIED` or `SHELL-<WHAT>` + `-OK` (split, so the
/// command's own text never holds it), `PROC` only once tried: the fd table refused, or each of
/// the database's descriptors refused (no OpenCode found, or none holding it, says so instead).
const REWRITE: &str = r#"d="$XDG_DATA_HOME/opencode"; db="$d/opencode.db"
ok() { echo "SHELL-$1""-OK"; }; no() { echo "SHELL-$1-DENIED"; }
ls "$d" >/dev/null 2>&1 && ok LIST || no LIST
head -c 16 "$db" >/dev/null 2>&1 && ok READ || no READ
(printf EVIL >> "$db") 2>/dev/null && ok WRITE || no WRITE
oc=$PPID
while [ "$oc" -gt 1 ] && ! tr '\0' ' ' < /proc/$oc/cmdline 2>/dev/null | grep -q ' serve --hostname'; do
  oc=$(awk '/^PPid:/{print $2}' /proc/$oc/status 2>/dev/null); oc=${oc:-1}
done
if [ "$oc" -le 1 ]; then echo "SHELL-PROC-NO-OPENCODE"
elif ! ls "/proc/$oc/fd" >/dev/null 2>&1; then no PROC
else found=; for f in /proc/$oc/fd/*; do
    case "$(readlink "$f" 2>/dev/null)" in "$db"*) found=1; if head -c 16 "$f" >/dev/null 2>&1; then ok PROC; else no PROC; fi;; esac
  done; [ -n "$found" ] || echo "SHELL-PROC-NOT-HELD"
fi
echo "groups $(id -G)"
ln -s "$db" memory.txt"#;

/// The agent's shell can neither read nor write memory (only OpenCode, holding the memory group,
/// enters the memory dir); what OpenCode's own tools write into another thread through a link the
/// shell planted is put back by the second wall, byte for byte (docs/security.md#what-it-can-touch).
pub(crate) async fn the_agent_cannot_read_or_rewrite_another_threads_memory(launch: Launch) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(5, "Flaky build", "It fails.");
    world.github.seed_issue(6, "Other", "Other.");
    let mut job = job(&world, 5300);
    world
        .llm
        .push(Reply::text("The flake comes from the zebra-cache timeout."));
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot why?"));
    let (mut job, first) = main_step(job).await;
    assert_eq!(first.code, 0, "{}", explain(&first));
    let thread5 = first.output("session-id").to_string();
    let db = job.data_dir().join("opencode.db");
    let before = rows(&db, &thread5);
    assert!(
        before.iter().any(|(_, d)| d.contains("zebra")),
        "{before:?}"
    );

    job.next_run(5301);
    let link = job.step_workspace().join("memory.txt");
    for reply in [
        Reply::tool(
            "bash",
            json!({"command": REWRITE, "description": "rewrite"}),
        ),
        Reply::tool("read", json!({"filePath": link.to_string_lossy()})),
        Reply::tool(
            "write",
            json!({"filePath": link.to_string_lossy(), "content": "EVIL"}),
        ),
        Reply::text("Done."),
    ] {
        world.llm.push(reply);
    }
    job.event("issue_comment", &comment_event(6, 2, "@fro-bot go"));
    let (mut job, second) = main_step(job).await;
    assert_eq!(second.code, 0, "{}", explain(&second));
    let seen =
        crate::support::fake_llm::request_text(&world.llm.requests().last().cloned().unwrap());
    for what in ["LIST", "READ", "WRITE", "PROC"] {
        // From the image the shell runs in the agent's own container, where OpenCode is not
        // even in sight.
        let out_of_sight = what == "PROC"
            && matches!(job.launch, Launch::Container { .. })
            && seen.contains("SHELL-PROC-NO-OPENCODE");
        assert!(
            (seen.contains(&format!("SHELL-{what}-DENIED")) || out_of_sight)
                && !seen.contains(&format!("SHELL-{what}-OK")),
            "the shell's {what} was refused: {seen}"
        );
    }
    assert!(
        seen.contains("groups 1001\n"),
        "no group but its own: {seen}"
    );
    assert!(!seen.contains("SQLite format"), "{seen}");
    assert!(
        !second.summary.contains("can read memory in this run"),
        "{}",
        second.summary
    );
    // OpenCode's write tool followed the link and overwrote the database it had open; the second
    // wall put the restored memory back (this run's own exchange is the one lost).
    assert!(
        second
            .summary
            .contains("the restored memory was put back, so this run's exchange is not kept"),
        "{}",
        second.summary
    );
    assert_eq!(
        rows(&db, &thread5),
        before,
        "issue 5's conversation, byte for byte"
    );

    // The next run on issue 5 resumes the conversation a maintainer had.
    job.next_run(5302);
    world.llm.push(Reply::text("Yes."));
    job.event("issue_comment", &comment_event(5, 3, "@fro-bot sure?"));
    let (_job, third) = main_step(job).await;
    assert_eq!(third.output("session-id"), thread5);
    let last =
        crate::support::fake_llm::request_text(&world.llm.requests().last().cloned().unwrap());
    // (The rewrite script itself, with its 'EVIL', may be quoted as issue 6's prior work.)
    assert!(
        last.contains("The flake comes from the zebra-cache timeout.")
            && !last.contains("EVIL-cache")
            && !last.contains("EVIL Flaky"),
        "{last}"
    );
}

pub(crate) async fn the_agents_home_is_private_and_the_runners_home_and_payload_are_not_its_to_write(
    launch: Launch,
) {
    use std::os::unix::fs::MetadataExt;
    let world = World::start_with(launch).await;
    world.github.seed_issue(7, "Home", "Home.");
    let mut job = job(&world, 5400);
    job.event("issue_comment", &comment_event(7, 1, "@fro-bot home"));
    let home = job.home();
    let payload = job.root.path().join("workflow/event.json");
    crate::support::action::chown_r(&job.root.path().join("workflow"), RUNNER_UID);
    let event_before = std::fs::read(&payload).unwrap();
    // The paths as the step sees them (`/github/home` in the container).
    let seen_as = |p: &std::path::Path| match &job.launch {
        Launch::Binary => p.display().to_string(),
        Launch::Container { .. } => {
            crate::support::container::in_container(job.root.path(), &p.to_string_lossy())
        }
    };
    let (step_home, step_payload) = (seen_as(&home), seen_as(&payload));
    let script = format!(
        "echo \"home=$HOME\"; echo 'alias ls=evil' >> ~/.bashrc; git config --global core.hooksPath /tmp/evil; \
         for f in {h}/.bashrc {h}/.gitconfig {h}/.npmrc; do echo evil >> $f && echo \"WROTE:$f\"; done; \
         mkdir -p {h}/.ssh && echo \"WROTE:/$(echo ssh)\"; echo '{{}}' > {p} && echo \"WROTE:/$(echo payload)\"; true",
        h = step_home,
        p = step_payload
    );
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": script, "description": "home"}),
    ));
    world.llm.push(Reply::text("Done."));
    let (job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    let seen: String = world
        .llm
        .requests()
        .iter()
        .map(crate::support::fake_llm::request_text)
        .collect();
    assert!(seen.contains("home=/"), "{seen}");
    assert!(
        !seen.contains(&format!("home={step_home}\n")),
        "a private HOME: {seen}"
    );
    let written = [
        format!("WROTE:{step_home}/.bashrc"),
        format!("WROTE:{step_home}/.gitconfig"),
        format!("WROTE:{step_home}/.npmrc"),
        "WROTE:/ssh".to_string(),
        "WROTE:/payload".to_string(),
    ];
    for w in written {
        assert!(!seen.contains(&w), "{w}: {seen}");
    }
    for name in [".bashrc", ".gitconfig", ".npmrc", ".ssh"] {
        assert!(!home.join(name).exists(), "{name} in the runner's home");
    }
    assert_eq!(std::fs::read(&payload).unwrap(), event_before);
    assert_eq!(
        std::fs::metadata(&home).unwrap().uid(),
        RUNNER_UID,
        "given back"
    );
    assert_eq!(
        std::fs::metadata(&payload).unwrap().uid(),
        RUNNER_UID,
        "given back"
    );
    drop(job);
}

/// Main is killed with everything taken for the turn (the file commands, the checkout's
/// credentials, the runner's home). The runner, as its own user, still reads main's state and
/// makes post's files; post gives every path back, and a later step's git finds the credentials.
pub(crate) async fn after_a_sigkill_mid_turn_post_gives_back_what_main_took(launch: Launch) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let world = World::start_with(launch).await;
    world.github.seed_issue(8, "Kill", "Kill.");
    let mut job = job(&world, 5500);
    let ws = job.workspace();
    // Where actions/checkout keeps the token: the config itself, and a file it includes.
    let creds = ws.join(".git/credentials.config");
    std::fs::write(
        &creds,
        "[http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic aW5jbHVkZWQ=\n",
    )
    .unwrap();
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    for (k, v) in [
        ("include.path", "credentials.config"),
        (
            "http.https://example.com/.extraheader",
            "AUTHORIZATION: basic Y29uZmln",
        ),
    ] {
        crate::support::action::git(&ws, &["config", "--file", ".git/config", k, v]);
    }
    crate::support::action::chown_r(&ws, RUNNER_UID);
    let config = std::fs::read(ws.join(".git/config")).unwrap();
    let files_mode = std::fs::metadata(job.files()).unwrap().mode() & 0o7777;
    job.event("issue_comment", &comment_event(8, 1, "@fro-bot edit"));
    job.set("FRO_BOT_FAILPOINT", "agent:started");
    // The harness reads main's files as the runner's user, as the runner does.
    let (mut job, main) = main_step(job).await;
    job.env.remove("FRO_BOT_FAILPOINT");
    assert_eq!(main.code, 128 + libc::SIGKILL, "{}", explain(&main));
    // OpenCode dies with fro-bot: its watchdog, or the container's end.
    let left = crate::support::action::until_nothing_runs_in(&ws).await;
    assert!(left.is_empty(), "left running after the SIGKILL: {left:?}");
    let owner = |p: &std::path::Path| std::fs::metadata(p).unwrap().uid();
    assert_eq!(owner(&creds), 0, "hidden for the turn");
    assert_eq!(owner(&job.files()), 0, "the file commands' directory taken");
    assert_eq!(owner(&job.home()), 0, "the runner's home taken");
    assert!(
        main.state.get("turnTaken").is_some_and(|s| !s.is_empty()),
        "{:?}",
        main.state
    );
    let (job, post) = post_step(job, main).await;
    assert_eq!(post.code, 0, "{}", explain(&post));
    assert!(post.summary.contains("post gave back"), "{}", post.summary);
    let m = std::fs::metadata(&creds).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (RUNNER_UID, 0o600));
    let m = std::fs::metadata(job.files()).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (RUNNER_UID, files_mode));
    assert_eq!(owner(&job.home()), RUNNER_UID);
    assert_eq!(std::fs::read(ws.join(".git/config")).unwrap(), config);
    let out = Command::new("git")
        .args(["config", "--show-origin", "--get-regexp", "extraheader"])
        .current_dir(&ws)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .uid(RUNNER_UID)
        .gid(RUNNER_UID)
        .output()
        .unwrap();
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        seen.contains("aW5jbHVkZWQ=") && seen.contains("Y29uZmln"),
        "a later step's git reads both credentials again: {seen} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// OpenCode's own tools: nothing in fro-bot's memory dir (only OpenCode and the session tools read
/// it), no `.env` of the checkout, and nothing left waiting for an answer nobody can give
/// (OpenCode's default for these is to ask); paths elsewhere outside the checkout stay usable.
pub(crate) async fn opencodes_tools_never_reach_memory_or_env_files_and_never_wait_for_an_answer(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(9, "Files", "Files.");
    let mut job = job(&world, 5600);
    job.input("timeout", "60000");
    let outside = job.root.path().join("runner_temp/outside.txt");
    std::fs::write(&outside, "OUTSIDE-CONTENT\n").unwrap();
    let ws = job.workspace();
    std::fs::write(ws.join(".env"), "DOTENV-CONTENT=1\n").unwrap();
    crate::support::action::chown_r(&job.root.path().join("runner_temp"), RUNNER_UID);
    crate::support::action::chown_r(&ws, RUNNER_UID);
    let planted = job.data_dir().join("planted.txt");
    // Paths as OpenCode sees them (under /github in the container).
    let at = |p: &std::path::Path| job.step_path(p).to_string_lossy().into_owned();
    for reply in [
        Reply::tool(
            "read",
            json!({"filePath": at(&job.data_dir().join("opencode.db"))}),
        ),
        Reply::tool("read", json!({"filePath": at(&ws.join(".env"))})),
        Reply::tool("write", json!({"filePath": at(&planted), "content": "x"})),
        Reply::tool(
            "bash",
            json!({"command": format!("cat {}", at(&outside)), "description": "outside"}),
        ),
        Reply::text("Done."),
    ] {
        world.llm.push(reply);
    }
    job.event("issue_comment", &comment_event(9, 1, "@fro-bot look"));
    let (_job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert_eq!(world.llm.requests().len(), 5, "every tool answered at once");
    let last =
        crate::support::fake_llm::request_text(&world.llm.requests().last().cloned().unwrap());
    assert!(!last.contains("DOTENV-CONTENT"), "{last}");
    assert!(!last.contains("SQLite format"), "{last}");
    assert!(!planted.exists(), "written into memory");
    assert_eq!(
        last.matches("prevents you from using this specific tool call")
            .count(),
        3,
        "each memory and .env call refused by a rule: {last}"
    );
    assert!(
        last.contains("OUTSIDE-CONTENT"),
        "the shell still reaches paths outside the checkout: {last}"
    );
}
