//! TODO(phases): filled in by its issue.
