//! The pipeline, one file per phase, each a plain async function over what the run knows:
//! `run` (the main step's order: admission → restore → agent → finalize → cleanup + save →
//! release), `restore`, `agent` (session prep and the turn), `finalize` (response, records,
//! summary), `save`, and `post`, its own entry. Beside them: the state `paths` and marker,
//! `project_identity`, `dedup` sentinels, the `report` the summary is made of, and `inspect`.

pub mod admit;
pub mod agent;
pub mod cache_merge;
pub mod cleanup;
pub mod context;
pub mod dedup;
pub mod deliver;
pub mod egress;
pub mod fallback;
pub mod finalize;
pub mod git_guard;
pub mod home_guard;
pub mod inspect;
pub mod leftovers;
pub mod memory_guard;
pub mod paths;
pub mod post;
pub mod prepare_outputs;
pub mod project_identity;
pub mod publish;
pub mod report;
pub mod restore;
pub mod review;
pub mod run;
pub mod sanitize;
pub mod save;
pub mod session_map;
pub mod thread_turn;
pub mod threat_check;
pub mod tracking;
