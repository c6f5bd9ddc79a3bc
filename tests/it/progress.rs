//! Live progress: what a person watching the Actions log sees while the agent works.

use serde_json::json;

use crate::e2e::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain};
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
}
