//! What fro-bot prints (docs/security.md#what-fro-bot-prints), through the real OpenCode: an
//! injected agent writes workflow commands — behind bare carriage returns, after whitespace and
//! invisible characters, in the v1 `##[…]` form mid-line, and a `stop-commands` to pause fro-bot's
//! own — into every text the log shows: a tool's title, a tool's error, its own text, the threat
//! check's reasons and its answer. The step's stdout and stderr, read by a reimplementation of the
//! runner's parser, hold no command fro-bot did not write.

use serde_json::json;

use super::changes::answer;
use super::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain, Launch, StepResult};
use crate::support::fake_llm::Reply;
use crate::support::runner_commands::{commands, Command, Reading};

/// Each line a command the runner would carry out, behind a bare `\r`, then the v1 form mid-line
/// and a zero-width space before `::`.
const ATTACK: &str = "ok\r::set-output name=pr-url::https://evil.example/pull/1\r::save-state name=memoryOwn::forged\r::add-mask::widgets\r::stop-commands::tok\r say ##[set-output name=changes;]delivered\r\u{200b}::add-mask::hello\r";

/// The commands fro-bot itself writes to the log.
const OWN: &[&str] = &["add-mask", "group", "endgroup", "warning", "error", "debug"];

/// The commands in `log` that fro-bot did not write: any name it never uses, and any of its own
/// names whose data the attack chose.
fn foreign(log: &str, reading: Reading) -> Vec<Command> {
    commands(log, reading)
        .into_iter()
        .filter(|c| {
            !OWN.contains(&c.name.as_str())
                || ["widgets", "hello", "evil.example", "forged"]
                    .iter()
                    .any(|a| c.data.contains(a))
        })
        .collect()
}

fn assert_no_foreign_command(r: &StepResult) {
    for (stream, log) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        for reading in [Reading::Ordinal, Reading::SkippingInvisibles] {
            let found = foreign(log, reading);
            assert!(
                found.is_empty(),
                "{stream} ({reading:?}) carries commands fro-bot did not write: {found:#?}\n{}",
                explain(r)
            );
        }
    }
}

const FLAGGED_PREFIX: &str =
    r#"{"prompt_injection": true, "secret_leak": false, "malicious_patch": false, "reasons": "#;

pub(crate) async fn the_agent_cannot_write_a_workflow_command_into_the_log(launch: Launch) {
    let world = World::start_with(launch).await;
    let reasons = serde_json::to_string(&[ATTACK]).unwrap();
    world
        .llm
        .push_verdict(Reply::text(format!("{FLAGGED_PREFIX}{reasons}}}")));
    // The change's command carries the attack as its title; then a read that fails names it in
    // its error; then the agent says it.
    let read = Reply::tool(
        "read",
        json!({"filePath": format!("/nonexistent/{ATTACK}")}),
    );
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": "printf 'x\\n' > notes.md", "description": ATTACK}),
    ));
    world.llm.push(read);
    world.llm.push(Reply::text(ATTACK));
    let r = issue_run_titled(&world).await;
    assert_eq!(r.output("changes"), "held", "{}", explain(&r));
    assert!(!r.outputs.contains_key("pr-url"), "{:?}", r.outputs);
    assert!(
        r.stdout.contains("set-output name=pr-url"),
        "the attack is shown, inert: {}",
        explain(&r)
    );
    assert!(answer(&world).contains("widgets"), "{}", answer(&world));
    assert_no_foreign_command(&r);
    // fro-bot's own commands still work after the agent's `stop-commands`: its masks are read.
    let masks = commands(&r.stdout, Reading::Ordinal)
        .into_iter()
        .filter(|c| c.name == "add-mask")
        .count();
    assert!(masks > 0, "fro-bot's own masks: {}", explain(&r));
}

/// One issue run whose agent's replies are already queued.
async fn issue_run_titled(world: &World) -> StepResult {
    world.github.seed_issue(71, "Change things", "Please.");
    let mut job = super::changes::job(world, 3171);
    world.github.seed_git_repo(&job.workspace());
    job.event(
        "issue_comment",
        &comment_event(71, 671, "@fro-bot change things"),
    );
    main_step(job).await.1
}
