//! The cache service's replies: first byte picks the RPC, the next two the HTTP status, the rest is
//! the body.
#![no_main]

use fro_bot::cache::Rpc;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [op, hi, lo, body @ ..] = data else { return };
    let rpc = match op % 3 {
        0 => Rpc::GetCacheEntryDownloadUrl,
        1 => Rpc::CreateCacheEntry,
        _ => Rpc::FinalizeCacheEntryUpload,
    };
    // Mostly plausible statuses (100-599), sometimes anything.
    let raw = u16::from_be_bytes([*hi, *lo]);
    let status = if op & 0x80 == 0 { 100 + raw % 500 } else { raw };
    let body = String::from_utf8_lossy(body);
    for message in fro_bot::fuzzing::cache_service_reply(rpc, status, &body) {
        assert!(message.chars().count() < 2000, "unbounded error message");
    }
});
