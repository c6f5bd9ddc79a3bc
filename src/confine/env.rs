//! The agent's environment is an allowlist: the job's context that is not secret, plus what the
//! caller adds (HOME, XDG_*, OpenCode's switches, `GH_TOKEN` where the agent is meant to act) and
//! the names the user opts into with `agent-env`, and the runner's network settings. Some names
//! are never passed, opted in or not.

use crate::runner::env as names;
use crate::runner::Env;

/// Passed through when set.
const ALLOWED: &[&str] = &[
    names::PATH,
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "CI",
    names::GITHUB_ACTIONS,
    names::GITHUB_REPOSITORY,
    "GITHUB_REPOSITORY_OWNER",
    "GITHUB_REPOSITORY_ID",
    "GITHUB_REF",
    names::GITHUB_REF_NAME,
    "GITHUB_REF_TYPE",
    "GITHUB_SHA",
    "GITHUB_HEAD_REF",
    "GITHUB_BASE_REF",
    names::GITHUB_RUN_ID,
    "GITHUB_RUN_NUMBER",
    names::GITHUB_RUN_ATTEMPT,
    names::GITHUB_SERVER_URL,
    names::GITHUB_API_URL,
    names::GITHUB_GRAPHQL_URL,
    names::GITHUB_WORKSPACE,
    names::GITHUB_EVENT_NAME,
    names::GITHUB_ACTOR,
    "GITHUB_TRIGGERING_ACTOR",
    names::GITHUB_JOB,
    "GITHUB_WORKFLOW",
    "GITHUB_WORKFLOW_REF",
    names::RUNNER_OS,
    "RUNNER_ARCH",
];

/// Prefixes passed through (locale).
const ALLOWED_PREFIXES: &[&str] = &["LC_"];

/// Never passed, even when named in `agent-env`: inputs (the GitHub token, auth-json), saved
/// state, the Actions runtime and OIDC request tokens, cloud credentials, the GitHub token, the
/// file-command paths, and OpenCode's secrets (the server sets those itself).
const NEVER_PREFIXES: &[&str] = &[names::INPUT_PREFIX, names::STATE_PREFIX, "ACTIONS_", "AWS_"];
const NEVER: &[&str] = &[
    "GITHUB_TOKEN",
    "GH_TOKEN",
    names::GITHUB_ENV,
    "GITHUB_PATH",
    names::GITHUB_STATE,
    names::GITHUB_OUTPUT,
    names::GITHUB_STEP_SUMMARY,
    names::OPENCODE_SERVER_PASSWORD,
    names::OPENCODE_AUTH_CONTENT,
    names::OPENCODE_CONFIG_CONTENT,
];

/// Whether `name` may never reach the agent.
pub fn is_forbidden(name: &str) -> bool {
    NEVER.contains(&name) || NEVER_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// `agent-env`: names separated by commas or newlines. Returns the usable names and those refused.
pub fn parse_opt_in(raw: &str) -> (Vec<String>, Vec<String>) {
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for name in raw
        .split([',', '\n'])
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        if is_forbidden(name) {
            refused.push(name.to_string());
        } else if !ok.iter().any(|n| n == name) {
            ok.push(name.to_string());
        }
    }
    (ok, refused)
}

/// The child's whole environment: allowed names and `opt_in` from `base`, the network settings
/// (`network`: `crate::net::agent_vars` or `agent_vars_behind`, which replace whatever `base`
/// sets of them), then `extra` (which wins), then OpenCode's offline switches.
pub fn agent_env(
    base: &Env,
    opt_in: &[String],
    extra: &[(String, String)],
    network: &[(String, String)],
) -> Vec<(String, String)> {
    let allowed = |k: &str| {
        !is_forbidden(k)
            && (ALLOWED.contains(&k)
                || ALLOWED_PREFIXES.iter().any(|p| k.starts_with(p))
                || opt_in.iter().any(|n| n == k))
    };
    // Every proxy variable is the network's to set: under enforcement the job's own are not the
    // agent's.
    let given = |k: &str| {
        extra.iter().chain(network).any(|(e, _)| e == k)
            || names::PROXY.contains(&k)
            || names::NO_PROXY.contains(&k)
    };
    let mut out: Vec<(String, String)> = base
        .iter()
        .filter(|(k, _)| allowed(k) && !given(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    out.extend(
        network
            .iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .cloned(),
    );
    out.extend(extra.iter().cloned());
    out.push((names::OPENCODE_DISABLE_AUTOUPDATE.into(), "1".into()));
    out.push((names::OPENCODE_DISABLE_MODELS_FETCH.into(), "1".into()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_allowlist_the_opt_ins_and_the_extras_pass() {
        let base = Env::from_pairs([
            ("PATH", "/usr/bin"),
            ("LC_ALL", "C.UTF-8"),
            ("INPUT_GITHUB-TOKEN", "ghs_x"),
            ("INPUT_AUTH-JSON", "{}"),
            ("STATE_cacheSaved", "durable"),
            ("ACTIONS_RUNTIME_TOKEN", "rt"),
            ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "oidc"),
            ("ACTIONS_ID_TOKEN_REQUEST_URL", "https://oidc"),
            ("AWS_SECRET_ACCESS_KEY", "aws"),
            ("AWS_ACCESS_KEY_ID", "AKIA"),
            ("GITHUB_TOKEN", "ghs_y"),
            ("GH_TOKEN", "ghs_z"),
            ("GITHUB_ENV", "/github/file_commands/env"),
            ("GITHUB_PATH", "/github/file_commands/path"),
            ("GITHUB_OUTPUT", "/github/file_commands/out"),
            ("HOME", "/root"),
            ("ANTHROPIC_API_KEY", "provider-key"),
            ("MY_TOOL_HOME", "/opt/tool"),
            ("GITHUB_REPOSITORY", "o/r"),
            ("GITHUB_SHA", "abc"),
            ("https_proxy", "http://proxy.corp:3128"),
            ("NO_PROXY", "corp.example"),
        ]);
        let (opt_in, refused) = parse_opt_in("MY_TOOL_HOME,\n AWS_SECRET_ACCESS_KEY, ,INPUT_X");
        assert_eq!(opt_in, ["MY_TOOL_HOME"]);
        assert_eq!(refused, ["AWS_SECRET_ACCESS_KEY", "INPUT_X"]);
        let env = agent_env(
            &base,
            &opt_in,
            &[
                ("HOME".into(), "/github/home".into()),
                ("GH_TOKEN".into(), "given".into()),
            ],
            &crate::net::agent_vars(&base),
        );
        let get = |k: &str| -> Vec<&str> {
            env.iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(get("PATH"), ["/usr/bin"]);
        assert_eq!(get("LC_ALL"), ["C.UTF-8"]);
        assert_eq!(get("HOME"), ["/github/home"]);
        assert_eq!(get("GH_TOKEN"), ["given"], "only when the caller passes it");
        assert_eq!(get("MY_TOOL_HOME"), ["/opt/tool"]);
        assert_eq!(get("GITHUB_REPOSITORY"), ["o/r"]);
        assert_eq!(get("GITHUB_SHA"), ["abc"]);
        assert_eq!(get("https_proxy"), ["http://proxy.corp:3128"]);
        assert_eq!(get("NO_PROXY"), ["corp.example,127.0.0.1,localhost,::1"]);
        for hidden in [
            "INPUT_GITHUB-TOKEN",
            "INPUT_AUTH-JSON",
            "STATE_cacheSaved",
            "ACTIONS_RUNTIME_TOKEN",
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
            "ACTIONS_ID_TOKEN_REQUEST_URL",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
            "GITHUB_TOKEN",
            "GITHUB_ENV",
            "GITHUB_PATH",
            "GITHUB_OUTPUT",
            "ANTHROPIC_API_KEY",
        ] {
            assert!(get(hidden).is_empty(), "{hidden} leaked");
        }
        assert_eq!(get("OPENCODE_DISABLE_AUTOUPDATE"), ["1"]);
    }
}
