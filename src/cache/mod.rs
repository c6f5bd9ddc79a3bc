//! TODO(cache): filled in by its issue.
