//! The marker (`fro-bot.json`) parser on arbitrary restored text.
#![no_main]

use fro_bot::memory::state_paths::{parse_marker, MarkerCheck, STORAGE_VERSION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match parse_marker(&text) {
        MarkerCheck::Compatible(m) => assert_eq!(m.storage_version, STORAGE_VERSION),
        MarkerCheck::VersionMismatch { found } => assert_ne!(found, STORAGE_VERSION),
        MarkerCheck::Missing | MarkerCheck::Unreadable { .. } => {}
    }
});
