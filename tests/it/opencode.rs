//! Integration tests: opencode.
