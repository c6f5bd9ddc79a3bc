//! The agent's turn: its network (`agent_network`) and where its commands run (`agent_sibling`), what it leaves behind (`leftovers`, with the
//! `.git` and home `guards`), the turn itself (`agent`), stopping it (`cleanup`), repairing
//! what a stopped turn left in memory (`cut`) and telling the next run of it (`cut_notice`).

pub mod agent;
pub mod agent_network;
pub mod agent_sibling;
pub mod cleanup;
pub mod cut;
pub mod cut_notice;
pub mod guards;
pub mod leftovers;
