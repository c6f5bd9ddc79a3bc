//! The pipeline, one file per phase, each a plain async function over what the run knows:
//! `run` (the main step's order: admission → restore → agent → finalize → cleanup + save →
//! release), `restore`, `agent` (session prep and the turn), `finalize` (response, records,
//! summary), `save`, and `post`, its own entry. Beside them: the state `paths` and marker,
//! `project_identity`, `dedup` sentinels, the `report` the summary is made of, and `inspect`.

pub mod admit;
pub mod delivery;
pub mod finalize;
pub mod inspect;
pub mod post;
pub mod run;
pub mod run_context;
pub mod sentinels;
pub mod thread_turn;
pub mod tracking_comment;
pub mod turn;
