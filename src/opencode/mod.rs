//! TODO(opencode): filled in by its issue.
