//! Integration tests: lease.
