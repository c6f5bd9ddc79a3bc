//! Integration tests: object_store.
