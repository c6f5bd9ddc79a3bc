//! One integration-test binary (one link of the heavy dependency tree); one module per area.

mod support;

mod cache;
mod e2e;
mod github;
mod inputs;
mod lease;
mod object_store;
mod opencode;
mod persistence;
mod progress;
mod structure;
