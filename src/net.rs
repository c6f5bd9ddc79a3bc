//! Every HTTP client fro-bot makes is built here, so each one follows the runner's network
//! (docs/security.md#egress-proxy-and-private-ca).
//!
//! The egress proxy is `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`, in either case,
//! which reqwest reads itself for every client built by [`external`]. fro-bot's own servers on
//! 127.0.0.1 (the provider proxy, OpenCode's server) are reached by [`loopback`] clients, which
//! never use a proxy whatever `NO_PROXY` says: a proxy elsewhere cannot reach this machine's
//! loopback. OpenCode gets the same settings, with the loopback added to its `NO_PROXY`
//! ([`agent_vars`]), and fro-bot's own `git` gets them too ([`git_vars`]).

use crate::runner::env as names;
use crate::runner::Env;

/// Names OpenCode's `NO_PROXY` always holds: its provider proxy and fro-bot's client are here.
const LOOPBACK: &[&str] = &["127.0.0.1", "localhost", "::1"];

/// A client for anything outside the runner: GitHub, the Actions cache, S3, LLM providers.
pub fn external() -> reqwest::ClientBuilder {
    // reqwest takes the proxy from the environment unless a proxy is set on the builder.
    reqwest::Client::builder()
}

/// A client for a server on this machine's loopback: never through a proxy.
pub fn loopback() -> reqwest::ClientBuilder {
    reqwest::Client::builder().no_proxy()
}

/// The proxy settings set in `env`, as they are (each case is read by some tool).
fn proxy_settings(env: &Env) -> Vec<(String, String)> {
    names::PROXY
        .iter()
        .chain(names::NO_PROXY)
        .filter_map(|&name| Some((name.to_string(), env.get(name)?.to_string())))
        .collect()
}

/// `NO_PROXY` with the loopback names added (those missing), for a child that must reach
/// fro-bot's servers directly.
fn no_proxy_with_loopback(env: &Env) -> String {
    let mut entries: Vec<String> = names::NO_PROXY
        .iter()
        .filter_map(|&name| env.get(name))
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    for name in LOOPBACK {
        if !entries.iter().any(|e| e == name) {
            entries.push(name.to_string());
        }
    }
    entries.dedup();
    entries.join(",")
}

/// The agent's network settings from the job's `env`: the proxy variables as set, and, when a
/// proxy is set, `NO_PROXY`/`no_proxy` naming the loopback (OpenCode reaches its provider through
/// fro-bot's proxy on 127.0.0.1). A password in a proxy URL is masked: the agent can print it.
pub fn agent_vars(env: &Env) -> Vec<(String, String)> {
    let mut out = proxy_settings(env);
    let proxied: Vec<&str> = names::PROXY.iter().filter_map(|&n| env.get(n)).collect();
    for value in &proxied {
        // As written in the URL, which is what the agent's environment holds.
        if let Some(password) = url::Url::parse(value)
            .ok()
            .and_then(|u| u.password().map(str::to_string))
        {
            crate::runner::log::add_mask(&password);
        }
    }
    if !proxied.is_empty() {
        let no_proxy = no_proxy_with_loopback(env);
        out.retain(|(k, _)| !names::NO_PROXY.contains(&k.as_str()));
        out.extend(
            names::NO_PROXY
                .iter()
                .map(|&n| (n.to_string(), no_proxy.clone())),
        );
    }
    out
}

/// What fro-bot's own `git` (which runs with a cleared environment) needs to reach GitHub: the
/// proxy settings of this process.
pub fn git_vars() -> Vec<(String, String)> {
    proxy_settings(&Env::from_process())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
        vars.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_agent_gets_the_proxy_in_either_case_and_never_proxies_the_loopback() {
        let env = Env::from_pairs([
            ("https_proxy", "http://proxy.corp:3128"),
            ("HTTP_PROXY", "http://proxy.corp:3128"),
            ("no_proxy", "corp.example, localhost"),
            ("NO_PROXY", ".internal"),
        ]);
        let vars = agent_vars(&env);
        assert_eq!(get(&vars, "https_proxy"), Some("http://proxy.corp:3128"));
        assert_eq!(get(&vars, "HTTP_PROXY"), Some("http://proxy.corp:3128"));
        assert_eq!(get(&vars, "HTTPS_PROXY"), None, "only what the job set");
        let want = ".internal,corp.example,localhost,127.0.0.1,::1";
        assert_eq!(get(&vars, "NO_PROXY"), Some(want));
        assert_eq!(get(&vars, "no_proxy"), Some(want));
        assert_eq!(vars.iter().filter(|(k, _)| k == "NO_PROXY").count(), 1);

        let env = Env::from_pairs([("ALL_PROXY", "http://u:proxy-pass%40word@proxy.corp:3128")]);
        let vars = agent_vars(&env);
        assert_eq!(get(&vars, "NO_PROXY"), Some("127.0.0.1,localhost,::1"));
        assert_eq!(
            crate::redact::redact("proxy-pass%40word"),
            "***",
            "the password is masked"
        );

        let env = Env::from_pairs([("no_proxy", "corp.example")]);
        assert_eq!(
            agent_vars(&env),
            [("no_proxy".to_string(), "corp.example".to_string())],
            "no proxy: NO_PROXY as it is"
        );
    }
}
