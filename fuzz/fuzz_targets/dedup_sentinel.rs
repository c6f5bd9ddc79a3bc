//! The dedup sentinel parser on arbitrary restored bytes; what parses survives a round trip.
#![no_main]

use fro_bot::github::dedup::Sentinel;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Sentinel::from_json(data) {
        assert_eq!(Sentinel::from_json(&s.to_json()).unwrap(), s);
    }
});
