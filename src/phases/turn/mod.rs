//! The agent's turn: its network (`agent_network`), what it leaves behind (`leftovers`, with the
//! `.git` and home `guards`), the turn itself (`agent`) and stopping it (`cleanup`).

pub mod agent;
pub mod agent_network;
pub mod cleanup;
pub mod guards;
pub mod leftovers;
