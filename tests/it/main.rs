//! One integration-test binary (one link of the heavy dependency tree); one module per area.

mod support;

mod agent_network;
mod cache;
mod container;
mod e2e;
mod experience;
mod fake_review;
mod github;
mod github_faults;
mod github_schema;
mod inputs;
mod interrupted;
mod key_proxy;
mod lease;
mod log;
mod merge;
mod network;
mod object_store;
mod opencode;
mod outbound;
mod persistence;
mod publish;
mod review;
mod sibling;
mod structure;
mod tracking;
mod watchdog;
