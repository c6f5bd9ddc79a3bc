//! Pull request review (docs/design.md#pull-request-review): the pull request's diff and where a
//! comment may be anchored in it (`diff`), what makes a finding the same on a later run
//! (`fingerprint`), what the agent's tools know (`view`), GitHub's review calls (`api`), the one
//! review a run posts (`compose`) and what became of it (`outcome`).

pub mod api;
pub mod compose;
pub mod diff;
pub mod fingerprint;
pub mod outcome;
pub mod view;
