//! The agent's turn: its network (`network`), what it leaves behind (`leftovers`, with the
//! `git_guard` and `home_guard`), the turn itself (`agent`), stopping it (`cleanup`) and repairing
//! what a stopped turn left in memory (`cut`).

pub mod agent;
pub mod cleanup;
pub mod cut;
pub mod git_guard;
pub mod home_guard;
pub mod leftovers;
pub mod network;
