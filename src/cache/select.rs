//! Which cache service the runner offers: decided as `@actions/cache` 6.3.0 decides it
//! (`getCacheServiceVersion`, `getCacheServiceURL`, `isGhes` in `internal/config.ts`), so fro-bot
//! and `actions/cache` on the same runner read and write the same entries.
//!
//! - GitHub Enterprise Server (`GITHUB_SERVER_URL` not github.com, `*.ghe.com` or `*.localhost`):
//!   v1 at `ACTIONS_CACHE_URL`, else at `ACTIONS_RESULTS_URL`.
//! - Elsewhere with `ACTIONS_CACHE_SERVICE_V2` set: v2 at `ACTIONS_RESULTS_URL`.
//! - Elsewhere without it the toolkit picks v1, but the runner never hands that flag to a
//!   container action (docs/design.md), and github.com's v1 service is retired: with
//!   `ACTIONS_RESULTS_URL` fro-bot takes v2, which JavaScript actions on the same runner get;
//!   with only `ACTIONS_CACHE_URL`, v1 (the toolkit's choice too).

use crate::runner::{env, Env};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// The REST `_apis/artifactcache` service (`v1`).
    V1,
    /// The Twirp service plus Azure blobs (`v2`).
    V2,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::V1 => "v1",
            Protocol::V2 => "v2",
        }
    }
}

/// The service chosen from the runner's environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceEnv<'a> {
    pub protocol: Protocol,
    pub url: &'a str,
    pub token: &'a str,
}

/// The toolkit's `isGhes`: any host but github.com, `*.ghe.com` and `*.localhost`. Unset (or not
/// a URL) is github.com.
pub fn is_ghes(server_url: Option<&str>) -> bool {
    let Some(host) = server_url
        .and_then(|u| url::Url::parse(u).ok())
        .and_then(|u| u.host_str().map(|h| h.trim_end().to_ascii_uppercase()))
    else {
        return false;
    };
    host != "GITHUB.COM" && !host.ends_with(".GHE.COM") && !host.ends_with(".LOCALHOST")
}

/// The service to use, or `None` when the runner offers none (no token, or no URL for the
/// protocol chosen).
pub fn service(env: &Env) -> Option<ServiceEnv<'_>> {
    let token = env.get(env::ACTIONS_RUNTIME_TOKEN)?;
    let cache_url = env.get(env::ACTIONS_CACHE_URL);
    let results_url = env.get(env::ACTIONS_RESULTS_URL);
    let (protocol, url) = if is_ghes(env.get(env::GITHUB_SERVER_URL)) {
        (Protocol::V1, cache_url.or(results_url)?)
    } else if env.get(env::ACTIONS_CACHE_SERVICE_V2).is_some() {
        (Protocol::V2, results_url?)
    } else if let Some(url) = results_url {
        (Protocol::V2, url)
    } else {
        (Protocol::V1, cache_url?)
    };
    Some(ServiceEnv {
        protocol,
        url,
        token,
    })
}

/// What a summary says when [`service`] finds none.
pub fn missing() -> String {
    format!(
        "{} or {}, with {}, not set",
        env::ACTIONS_CACHE_URL,
        env::ACTIONS_RESULTS_URL,
        env::ACTIONS_RUNTIME_TOKEN
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(pairs: &[(&str, &str)]) -> Option<(Protocol, String)> {
        let e = Env::from_pairs(pairs.iter().copied());
        service(&e).map(|s| (s.protocol, s.url.to_string()))
    }

    #[test]
    fn ghes_is_any_host_but_githubs() {
        assert!(!is_ghes(None));
        assert!(!is_ghes(Some("https://github.com")));
        assert!(!is_ghes(Some("https://GitHub.com/")));
        assert!(!is_ghes(Some("https://octo.ghe.com")));
        assert!(!is_ghes(Some("http://api.localhost:8080")));
        assert!(is_ghes(Some("https://ghes.example")));
        assert!(is_ghes(Some("http://127.0.0.1:3000")));
    }

    #[test]
    fn the_service_is_chosen_like_the_toolkit() {
        let tok = (env::ACTIONS_RUNTIME_TOKEN, "runtime-token-xyz");
        let v1 = (env::ACTIONS_CACHE_URL, "https://c.example/abc/");
        let v2 = (env::ACTIONS_RESULTS_URL, "https://r.example/");
        let ghes = (env::GITHUB_SERVER_URL, "https://ghes.example");
        let flag = (env::ACTIONS_CACHE_SERVICE_V2, "true");
        let c = |p: Protocol, u: &str| Some((p, u.to_string()));
        // Enterprise Server: always v1, at the cache URL or else the results URL.
        assert_eq!(chosen(&[tok, v1, ghes]), c(Protocol::V1, v1.1));
        assert_eq!(chosen(&[tok, v1, v2, ghes, flag]), c(Protocol::V1, v1.1));
        assert_eq!(chosen(&[tok, v2, ghes]), c(Protocol::V1, v2.1));
        // github.com: v2 with the results URL; v1 only when nothing else is offered.
        assert_eq!(chosen(&[tok, v1, v2]), c(Protocol::V2, v2.1));
        assert_eq!(chosen(&[tok, v1, v2, flag]), c(Protocol::V2, v2.1));
        assert_eq!(chosen(&[tok, v1]), c(Protocol::V1, v1.1));
        assert_eq!(chosen(&[tok, v1, flag]), None);
        assert_eq!(chosen(&[v1, v2, ghes]), None);
        assert_eq!(chosen(&[tok, ghes]), None);
    }
}
