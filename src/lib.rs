//! fro-bot: run the OpenCode agent on repository events and keep its memory across workflow runs.
//!
//! The modules mirror the pipeline: `config` → `github` (routing, keys) → `lease` → `phases`
//! (restore → session prep → agent → cleanup → save) with `cache`, `object_store`, `checkpoint`,
//! `save_result` and `opencode` as the parts the phases drive. `runner` speaks the Actions runtime
//! protocol (inputs, outputs, state, summary, log commands).

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
