//! fro-bot: run the OpenCode agent on repository events and keep its memory across workflow runs.
//!
//! The rooms, in layers, bottom first (a room imports only its own layer and those below;
//! docs/architecture.md draws them, tests/it/structure.rs holds the code to them):
//! - **protocols**: `runner` (the Actions runtime: inputs, outputs, state, summary, log commands,
//!   cancellation), `redact` (secrets out of everything that leaves), `untrusted` (others' text
//!   fenced as data), `net` (HTTP clients through the runner proxy and private CAs; bytes moved between sockets
//!   by the kernel, `net::splice`);
//! - **confinement**: `confine` (who the agent runs as and what it may touch, the key proxy),
//!   `egress` (the agent's network: the allowlist and the egress proxy), `trust` (who wrote each
//!   session, and how a run judges it);
//! - **settings**: `config` (every input parsed once into typed settings);
//! - **services**: `cache` (the Actions cache and its archives), `object_store` (the S3 store),
//!   `lease` (its coordination lease), `github` (events, routing, keys, API calls), `outbound`
//!   (which links stay live in what is posted);
//! - **agent**: `opencode` (the OpenCode server, its HTTP API, sessions and the turn);
//! - **memory**: `memory` (OpenCode's session database across runs: restore, guard, merge, save);
//! - **outputs**: `safe_outputs` (what the agent proposes, checked and carried out by fro-bot),
//!   `review` (pull request review), `threat` (the threat check of a change), `tools` (the
//!   agent's MCP server);
//! - **pipeline**: `phases` (the main step's order, the turn, the delivery, the post step) and
//!   `fuzzing` (entry points for the fuzz targets).
//!
//! A newcomer starts at `phases::run` (the main step, in order) and follows its calls.

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
