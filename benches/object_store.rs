//! Benchmark: object_store (written by its issue).
fn main() {}
