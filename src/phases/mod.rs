//! The pipeline: restore → session prep → agent → cleanup → save, each a plain async function over
//! a shared run context; `post` is its own entry.

pub mod dedup;
pub mod inspect;
pub mod paths;
pub mod post;
pub mod project_identity;
pub mod report;
pub mod restore;
pub mod run;
pub mod save;
