//! The event payload parser: first byte picks the event name, the rest is the JSON payload.
#![no_main]

use fro_bot::github::event::Event;
use libfuzzer_sys::fuzz_target;

const NAMES: &[&str] = &[
    "issue_comment",
    "discussion_comment",
    "pull_request_review_comment",
    "issues",
    "pull_request",
    "pull_request_target",
    "discussion",
    "workflow_dispatch",
    "schedule",
    "push",
];

fuzz_target!(|data: &[u8]| {
    let [pick, payload @ ..] = data else { return };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
        return;
    };
    let name = NAMES[usize::from(*pick) % NAMES.len()];
    let event = Event::parse(name, &value);
    let _ = (event.name(), event.target());
    let _ = format!("{event:?}");
});
