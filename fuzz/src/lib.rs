//! The fuzz targets' entry points, shared with `tests/it/fuzz_regressions.rs` (which includes the
//! same file), so a saved input runs through exactly the code the fuzzer ran.

#[path = "../entry.rs"]
pub mod entry;
