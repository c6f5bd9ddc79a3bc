//! Pull request review (docs/design.md#pull-request-review): the pull request's diff and where a
//! comment may be anchored in it (`diff`), and what makes a finding the same on a later run
//! (`fingerprint`).

pub mod diff;
pub mod fingerprint;
