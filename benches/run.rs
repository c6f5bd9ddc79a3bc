//! Benchmark: run (written by its issue).
fn main() {}
