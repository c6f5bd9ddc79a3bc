//! Integration tests: runner.
