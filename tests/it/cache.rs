//! Integration tests: cache.
