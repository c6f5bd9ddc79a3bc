//! TODO(save_result): filled in by its issue.
