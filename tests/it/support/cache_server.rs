//! Test service: cache_server.
