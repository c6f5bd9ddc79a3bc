//! `fro-bot inspect`: what main and post derive from this environment, for troubleshooting a
//! restore that misses or a key that does not match.

use std::fmt::Write as _;

use crate::cache;
use crate::config::inputs as input;
use crate::config::{AuthRequirement, Settings};
use crate::github::keys::{invocation_identity, CacheKeys};
use crate::memory::state_paths::StatePaths;
use crate::object_store::StoreKeys;
use crate::runner::env;
use crate::runner::Env;

pub fn describe(env: &Env) -> Result<String, String> {
    let paths = StatePaths::from_env(env).map_err(|e| e.to_string())?;
    let identity = invocation_identity(env, env.input(input::MATRIX_CONTEXT.name));
    let keys = CacheKeys::from_env(env, identity.as_deref()).map_err(|e| e.to_string())?;
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(out, "data dir:        {}", paths.data_dir.display());
    let _ = writeln!(out, "cache paths:");
    for p in paths.cache_paths() {
        let _ = writeln!(out, "  {p}");
    }
    let _ = writeln!(
        out,
        "cache version:   {}",
        cache::version(paths.cache_paths())
    );
    let _ = writeln!(
        out,
        "identity:        {}",
        identity.as_deref().unwrap_or("(none)")
    );
    let _ = writeln!(out, "primary key:     {}", keys.primary);
    let [branch, repo] = keys.restore_prefixes();
    let _ = writeln!(out, "restore order:   {branch} then {repo}");
    let _ = writeln!(out, "save key:        {}", keys.save_key());
    let _ = writeln!(out, "lease holder:    {}", keys.holder_id());
    let mode = cache::CacheMode::parse(env.get(env::ACTIONS_CACHE_MODE));
    let service = match cache::select::service(env) {
        Some(s) => format!("Actions cache {} ({mode:?})", s.protocol.name()),
        None => format!("none ({})", cache::select::missing()),
    };
    let _ = writeln!(out, "cache service:   {service}");
    match Settings::from_env(env, AuthRequirement::Optional) {
        Ok(settings) => match settings.s3 {
            Some(s3) => {
                let repository = env.get(env::GITHUB_REPOSITORY).unwrap_or("");
                match StoreKeys::for_repository(&s3.prefix, repository) {
                    Ok(k) => {
                        let _ = writeln!(
                            out,
                            "object store:    s3://{}/{}",
                            s3.bucket,
                            k.session_db()
                        );
                        let _ = writeln!(out, "lease key:       s3://{}/{}", s3.bucket, k.lease());
                    }
                    Err(e) => {
                        let _ = writeln!(out, "object store:    invalid: {e}");
                    }
                }
            }
            None => {
                let _ = writeln!(out, "object store:    disabled");
            }
        },
        Err(e) => {
            let _ = writeln!(out, "configuration:   invalid: {e}");
        }
    }
    Ok(out)
}
