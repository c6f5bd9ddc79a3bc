//! TODO(lease): filled in by its issue.
