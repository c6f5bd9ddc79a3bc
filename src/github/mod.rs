//! The GitHub surface (docs/design.md#the-github-surface): the triggering event normalized once
//! (`event`), routing and gating (`route`), every key derived from the environment (`keys`),
//! deduplication of issue/PR runs (`dedup`), fro-bot's mark on its own comments (`marker`), where
//! the API and the server are (`endpoints`), and the API calls: the client, reactions and
//! pull-request flags (`api`), the conversation for the prompt (`context`), the one reply
//! (`response`) posted early and edited in place (`tracking`), the repository calls that deliver a
//! change (`repo`) and the Actions cache entries (`caches`); every call waits out GitHub's
//! transient faults without doubling a write (`retry`).

pub mod api;
pub mod caches;
pub mod context;
pub mod dedup;
pub mod endpoints;
pub mod event;
pub mod keys;
pub mod marker;
pub mod repo;
pub mod response;
pub mod retry;
pub mod route;
pub mod tracking;

pub use api::{ApiError, GitHub, Reaction};
pub use endpoints::{noreply_domain, server_url, Endpoints};
pub use event::Event;
pub use keys::{CacheKeys, LogicalKey};
pub use route::{route, Route, RouteSettings, RunPlan, SkipReason};

/// Whether the run acts on the repository with no person reading along: schedule and dispatch
/// runs, whose agent's proposals (labels, issues, comments) fro-bot carries out unasked. No run
/// gives the agent a token; these runs still leave lower-trust memory out of the prompt, so text
/// from untrusted threads never steers what they propose (docs/security.md#trust-follows-memory).
pub fn acts_unattended(event: &Event) -> bool {
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
