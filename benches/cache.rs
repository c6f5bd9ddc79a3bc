//! Benchmark: cache (written by its issue).
fn main() {}
