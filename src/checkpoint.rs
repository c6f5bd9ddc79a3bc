//! TODO(checkpoint): filled in by its issue.
