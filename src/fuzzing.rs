//! Entry points for the cargo-fuzz targets in `fuzz/` that reach parsing the public API does not
//! expose on its own (feature `fuzzing`, used by `scripts/fuzz` only).

use reqwest::StatusCode;

use crate::cache::{self, Judged, Rpc};

/// One reply of the cache service to `rpc` through the client's retry judgement and the RPC's
/// body parsing, for both "attempts remain" and "last attempt". Returns the messages of the errors
/// it produced (formatting is part of what is fuzzed: it redacts and excerpts the body).
pub fn cache_service_reply(rpc: Rpc, status: u16, body: &str) -> Vec<String> {
    let Ok(status) = StatusCode::from_u16(status) else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    for more in [true, false] {
        match cache::judge(rpc, status, Some(body.to_string()), body, more, 1) {
            Judged::Body(v) => {
                let parsed = match rpc {
                    Rpc::GetCacheEntryDownloadUrl => cache::lookup_reply(&v, "key").map(|_| ()),
                    Rpc::CreateCacheEntry => cache::create_reply(&v).map(|_| ()),
                    Rpc::FinalizeCacheEntryUpload => cache::finalize_reply(&v).map(|_| ()),
                };
                if let Err(e) = parsed {
                    errors.push(e.to_string());
                }
            }
            Judged::Retry => {}
            Judged::Fail(e) => errors.push(e.to_string()),
        }
    }
    errors
}
