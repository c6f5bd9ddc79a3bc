//! Integration tests: e2e.
