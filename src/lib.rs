//! fro-bot: run the OpenCode agent on repository events and keep its memory across workflow runs.
//! The modules, in layers from the bottom (each uses only its own layer and those below; the
//! order is drawn in docs/architecture.md and held by tests/it/structure.rs):
//!
//! - protocols: `runner` (the Actions runtime: env, inputs, outputs, state, summary, log
//!   commands, cancellation), `redact` (the one redactor), `untrusted` (untrusted text fenced for
//!   the prompt), `net` (every HTTP client, behind the runner proxy);
//! - confinement: `confine` (who the agent runs as and what it can touch, the key proxy),
//!   `egress` (the agent's network: the allowlist and the egress proxy), `trust` (who wrote a
//!   session and how later runs judge it);
//! - settings: `config` (every input parsed once);
//! - services: `cache` (the Actions cache), `object_store` (S3), `lease` (one publisher at a
//!   time), `github` (events, routing, keys, API calls), `outbound` (what leaves in the agent's
//!   words);
//! - agent: `opencode` (the OpenCode server, its API and the turn);
//! - memory: `memory` (restore, save, publish and merge of the session database);
//! - outputs: `safe_outputs` (the agent proposes, fro-bot disposes), `review` (pull request
//!   review), `threat` (the threat check of a change), `tools` (the agent's MCP server);
//! - pipeline: `phases` (the main and post steps in order), `fuzzing` (fuzz entry points).

pub mod cache;
pub mod config;
pub mod confine;
pub mod egress;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod github;
pub mod lease;
pub mod memory;
pub mod net;
pub mod object_store;
pub mod opencode;
pub mod outbound;
pub mod phases;
pub mod redact;
pub mod review;
pub mod runner;
pub mod safe_outputs;
pub mod threat;
pub mod tools;
pub mod trust;
pub mod untrusted;
