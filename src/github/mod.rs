//! TODO(github): filled in by its issue.
