//! Integration tests: persistence.
