//! TODO(object_store): filled in by its issue.
