//! Test service: fake_github.
