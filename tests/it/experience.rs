//! What users see and wait for: live progress in the log, outputs, no uploads of unchanged memory.

use serde_json::json;

use crate::e2e::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain};
use crate::support::cache_server::{CREATE, PUT_BLOB, PUT_BLOCK};
use crate::support::fake_llm::Reply;

#[tokio::test]
async fn the_log_shows_each_tool_call_and_the_agents_text_inside_the_agent_group_as_they_happen() {
    let world = World::start().await;
    world.github.seed_issue(8, "Count the files", "How many?");
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": "echo first-call", "description": "First look"}),
    ));
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": "echo second-call", "description": "Second look"}),
    ));
    world
        .llm
        .push(Reply::text("Both looks agree: three files."));
    let mut job = world.job(800);
    job.event(
        "issue_comment",
        &comment_event(8, 801, "@fro-bot count them"),
    );
    let (_job, run) = main_step(job).await;
    assert_eq!(run.code, 0, "{}", explain(&run));

    let lines: Vec<&str> = run.stdout.lines().collect();
    let group = |title: &str| lines.iter().position(|l| l.trim_end() == title);
    let start = group("::group::Agent").expect("an Agent group");
    let end = start
        + lines[start..]
            .iter()
            .position(|l| l.starts_with("::endgroup::"))
            .unwrap();
    let agent = &lines[start..end];
    let find = |needle: &str| {
        agent
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| {
                panic!(
                    "no line with {needle:?} in the Agent group:\n{}",
                    agent.join("\n")
                )
            })
    };
    // Each call starts, then finishes, in order; the answer comes after both.
    let first_started = find("▶ bash — First look");
    let first_done = find("✓ bash — echo first-call");
    let second_started = find("▶ bash — Second look");
    let second_done = find("✓ bash — echo second-call");
    let said = find("agent:");
    assert!(first_started < first_done && first_done < second_started);
    assert!(second_started < second_done && second_done < said);
    assert!(agent[said + 1].contains("Both looks agree: three files."));
    // Stamped with the time since the turn started.
    assert!(
        agent[first_started].contains("[0:"),
        "{}",
        agent[first_started]
    );

    // What later steps and the summary get: tokens, cost, the comment, the model.
    let tokens: serde_json::Value = serde_json::from_str(run.output("tokens")).unwrap();
    assert!(tokens["input"].as_u64().unwrap() > 0, "{tokens}");
    assert!(tokens["output"].as_u64().unwrap() > 0, "{tokens}");
    assert!(
        run.output("cost").parse::<f64>().is_ok(),
        "{}",
        run.output("cost")
    );
    assert!(
        run.output("comment-url")
            .contains("/issues/8#issuecomment-"),
        "{}",
        run.output("comment-url")
    );
    assert!(
        run.summary.contains("| Model | fake/fake-model |"),
        "{}",
        run.summary
    );
}

#[tokio::test]
async fn a_run_that_changed_nothing_uploads_nothing_and_says_which_entry_holds_its_memory() {
    let world = World::start().await;
    world.github.seed_issue(9, "Keep me", "Remember this.");
    world.llm.push(Reply::text("Remembered: the walrus plan."));
    let mut job = world.job(900);
    job.event("issue_comment", &comment_event(9, 901, "@fro-bot remember"));
    let (mut job, first) = main_step(job).await;
    assert_eq!(
        first.output("cache-save-result"),
        "durable",
        "{}",
        explain(&first)
    );
    let entries = world.cache.entries();
    assert_eq!(entries.len(), 1);
    let uploads = |w: &World| {
        [CREATE, PUT_BLOB, PUT_BLOCK]
            .iter()
            .map(|op| w.cache.calls_of(op).len())
            .sum::<usize>()
    };
    let before = uploads(&world);

    // The next run restores that memory, but OpenCode cannot start: the database is untouched.
    job.next_run(902);
    job.set("OPENCODE_PATH", "/bin/false");
    job.event("issue_comment", &comment_event(9, 903, "@fro-bot again"));
    let (_job, second) = main_step(job).await;
    assert_eq!(second.output("cache-status"), "hit", "{}", explain(&second));
    assert_eq!(
        second.code,
        1,
        "the agent did not run: {}",
        explain(&second)
    );
    assert_eq!(
        second.output("cache-save-result"),
        "durable",
        "{}",
        explain(&second)
    );
    assert_eq!(uploads(&world), before, "not one byte uploaded again");
    assert_eq!(world.cache.entries().len(), 1);
    assert!(
        second.summary.contains("unchanged since restore")
            && second.summary.contains(&entries[0].key),
        "the summary names the entry that holds it: {}",
        second.summary
    );
}

#[test]
fn local_without_credentials_fails_at_once_naming_the_fix_and_prints_no_workflow_commands() {
    use crate::support::action::{fresh_checkout, BIN};
    use crate::support::services::opencode_bin;
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    fresh_checkout(&repo, "local\n");
    let started = std::time::Instant::now();
    let out = std::process::Command::new(BIN)
        .args(["local", "--prompt", "hello"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", repo.join("user-home"))
        .env("OPENCODE_PATH", opencode_bin())
        .current_dir(&repo)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("no model provider has credentials") && stdout.contains("--auth-json"),
        "the message names the fix: {stdout}"
    );
    assert!(
        !stdout.lines().any(|l| l.trim_start().starts_with("::")),
        "a terminal gets no workflow commands: {stdout}"
    );
    // OpenCode alone would retry for minutes (150 s were seen); the check answers in seconds.
    eprintln!("local without credentials failed after {took:?}");
    assert!(took < std::time::Duration::from_secs(60), "{took:?}");
}

/// `fro-bot local` by `uid` on its own checkout: the agent edits it, memory is kept, a second run
/// resumes, and the output says who the agent runs as, with no warning and no process killed (the
/// agent left none running). Returns what both runs printed.
async fn local_run_edits_and_resumes(uid: u32) -> String {
    use crate::support::action::{chown_r, fresh_checkout, BIN};
    use crate::support::fake_llm::FakeLlm;
    use crate::support::services::opencode_bin;
    use std::os::unix::process::CommandExt;
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let repo = dir.path().join("repo");
    fresh_checkout(&repo, "local\n");
    let home = dir.path().join("user-home");
    std::fs::create_dir(&home).unwrap();
    chown_r(&repo, uid);
    chown_r(&home, uid);
    // The user runs binaries it can reach (the build's are under root's 0700 home).
    let (mut bin, mut opencode) = (std::path::PathBuf::from(BIN), opencode_bin());
    if uid != 0 {
        let bins = dir.path().join("bin");
        std::fs::create_dir(&bins).unwrap();
        for b in [&mut bin, &mut opencode] {
            let copy = bins.join(b.file_name().unwrap());
            std::fs::copy(&*b, &copy).unwrap();
            *b = copy;
        }
    }
    let (config, cwd) = (llm.opencode_config().to_string(), repo.clone());
    let run = move |prompt: &str| {
        std::process::Command::new(&bin)
            .args(["local", "--prompt", prompt])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("OPENCODE_PATH", &opencode)
            .env("INPUT_OPENCODE-CONFIG", &config)
            .current_dir(&cwd)
            .uid(uid)
            .gid(uid)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    // The agent's network is enforced locally too (`agent-network: allowlist`, nothing listed).
    llm.push(Reply::tool(
        "bash",
        json!({"command": "echo edited > README.md; curl -sS --max-time 5 http://unlisted.example/ 2>&1; \
            (echo x >/dev/udp/127.0.0.1/9) 2>&1 | head -n1", "description": "edit"}),
    ));
    llm.push(Reply::text("Edited the readme."));
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let first = tokio::task::spawn_blocking({
        let run = run.clone();
        move || run("edit the readme")
    })
    .await
    .unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).unwrap(),
        "edited\n"
    );
    let tool = crate::support::fake_llm::request_text(&llm.requests()[1]);
    for refused in [
        "403 fro-bot: host not on allowed-domains: unlisted.example:80",
        "socket: Operation not permitted",
    ] {
        assert!(tool.contains(refused), "{refused}: {}", text(&first));
    }
    assert!(
        text(&first).contains("| Network | allowlist (nothing listed): allowed no request; refused 1: `unlisted.example:80`. The agent's commands ran in fro-bot's container under the kernel's port rules (no container: "),
        "{}",
        text(&first)
    );
    llm.push(Reply::text("Still here."));
    let second = tokio::task::spawn_blocking(move || run("again"))
        .await
        .unwrap();
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    let last = crate::support::fake_llm::request_text(&llm.requests().last().cloned().unwrap());
    assert!(
        last.contains("Edited the readme."),
        "the second run resumed the first: {last}"
    );
    let printed = text(&first) + &text(&second);
    // Running as oneself is not a warning, and an agent that left nothing running kills nothing.
    for unwanted in ["not root", "left running"] {
        assert!(
            !printed.to_lowercase().contains(unwanted),
            "{unwanted}: {printed}"
        );
    }
    printed
}

/// As root on a root-owned checkout (a dev container, `docker run` of the image).
#[tokio::test]
async fn local_as_root_on_a_root_owned_checkout_edits_it_and_resumes() {
    let printed = local_run_edits_and_resumes(0).await;
    assert!(
        printed.contains("the agent runs as root (uid 0)"),
        "{printed}"
    );
}

/// As a normal user on a laptop.
#[tokio::test]
async fn local_as_a_normal_user_edits_and_resumes_without_a_warning() {
    let printed = local_run_edits_and_resumes(1001).await;
    assert!(
        printed.contains("the agent runs as the current user (uid 1001)"),
        "{printed}"
    );
}

/// An OpenCode that cannot start fails the run, in `local` and in the action, with one line that
/// says where to look.
#[tokio::test]
async fn an_opencode_that_cannot_start_fails_local_and_the_action_naming_its_log() {
    use crate::support::action::{fresh_checkout, BIN};
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("opencode");
    std::fs::write(&broken, "#!/bin/sh\necho 'cannot bind' >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let repo = dir.path().join("repo");
    fresh_checkout(&repo, "local\n");
    let local = std::process::Command::new(BIN)
        .args(["local", "--prompt", "hello"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", repo.join("user-home"))
        .env("OPENCODE_PATH", &broken)
        .env(
            "INPUT_OPENCODE-CONFIG",
            world.llm.opencode_config().to_string(),
        )
        .current_dir(&repo)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&local.stdout).into_owned()
        + &String::from_utf8_lossy(&local.stderr);
    assert_eq!(local.status.code(), Some(1), "{printed}");
    let line = printed
        .lines()
        .find(|l| l.contains("OpenCode could not start"))
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(
        line.contains("exited before it was ready (exit status: 3)")
            && line.contains("opencode-server.log"),
        "{line}"
    );

    let mut job = world.job(8100);
    job.set("OPENCODE_PATH", broken.to_string_lossy().into_owned());
    world.github.seed_issue(3, "Broken", "Broken.");
    job.event("issue_comment", &comment_event(3, 1, "@fro-bot hi"));
    let (_job, r) = main_step(job).await;
    assert_eq!(r.code, 1, "{}", explain(&r));
    assert!(
        r.stdout.contains("OpenCode could not start"),
        "{}",
        explain(&r)
    );
}
