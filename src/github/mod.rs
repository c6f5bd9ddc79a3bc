//! The GitHub surface (docs/design.md#the-github-surface): the triggering event normalized once
//! (`event`), routing and gating (`route`), every key derived from the environment (`keys`),
//! deduplication of issue/PR runs (`dedup`), and the API calls the harness makes (`api`: reactions
//! and pull-request flags, `context`: the conversation for the prompt, `response`: the one reply, `tracking`: that reply posted early and edited in place).

pub mod api;
pub mod caches;
pub mod context;
pub mod dedup;
pub mod event;
pub mod keys;
pub mod marker;
pub mod response;
pub mod route;
pub mod tracking;

pub use api::{ApiError, GitHub, Reaction};
pub use event::Event;
pub use keys::{CacheKeys, LogicalKey};
pub use route::{route, Route, RouteSettings, RunPlan, SkipReason};

/// Whether the agent process gets the GitHub token (as `GH_TOKEN`): only for schedule and
/// dispatch runs, which act on the repository. For comment-triggered runs the harness posts the
/// answer itself, so text from untrusted threads never steers a token-holding agent.
pub fn agent_gets_token(event: &Event) -> bool {
    match event {
        Event::Schedule { .. } | Event::WorkflowDispatch { .. } => true,
        Event::Comment { .. }
        | Event::Issues { .. }
        | Event::PullRequest { .. }
        | Event::Labeled { .. }
        | Event::Unsupported { .. }
        | Event::Malformed { .. } => false,
    }
}
