//! The process OpenCode is started as, assembled from [`AgentOptions`] and what confining it
//! changed ([`Confined`]): the binary the agent's uid may run, its environment (the allowlist of
//! `crate::confine::env`, OpenCode's own directories, the agent's network), the config that
//! names the session tools (with the proposal tools' files and the trust view), the model and
//! the key proxy; and the notes the summary gives about the agent's reach. Nothing here
//! starts a process: `Agent::start` hands the result to `server::Server::start`.

use std::path::PathBuf;
use std::sync::Arc;

use super::confinement::{Confined, TrustFile};
use super::{config, server, AgentError, AgentOptions, Client};
use crate::confine::key_proxy::{KeyProxy, KeyProxyPlan};
use crate::confine::{memory_group, AgentUser, PrivateBinary};

/// The `fro-bot` the session tools start from, as the agent's uid can reach it; `None` (and a
/// note: the agent has no session tools) when there is none.
pub(super) fn session_tools_exe(opts: &AgentOptions, notes: &mut Vec<String>) -> Option<PathBuf> {
    let exe = opts.fro_bot_exe.as_ref()?;
    match opts.user {
        AgentUser::Current { .. } => Some(exe.clone()),
        AgentUser::Switched { .. } => match crate::confine::agent_reachable_exe(exe) {
            Ok(path) => Some(path),
            Err(e) => {
                let note = format!(
                    "no session tools for the agent: {} cannot be made reachable by its user: {e}",
                    exe.display()
                );
                tracing::warn!("{note}");
                notes.push(note);
                None
            }
        },
    }
}

/// A note when OpenCode could not start the session tools (the agent would be told, at its first
/// call, only that no such tool exists).
pub(super) async fn session_tools_missing(client: &Client) -> Option<String> {
    let why = match client.mcp_status().await {
        Ok(all) => match all.get(config::SESSION_TOOLS_MCP) {
            Some(s) if s.status == "connected" => return None,
            Some(s) => match &s.error {
                Some(e) => format!("{}: {e}", s.status),
                None => s.status.clone(),
            },
            None => "OpenCode does not list them".to_string(),
        },
        Err(e) => format!("their state could not be read: {e}"),
    };
    Some(format!("no session tools for the agent ({why})"))
}

/// What the summary says about the agent's commands: that they can read memory when fro-bot
/// could not be their shell's interpreter, and that they share OpenCode's wider network when
/// no fro-bot shell wrapper narrows it (`crate::confine::network`).
pub(super) fn commands_notes(opts: &AgentOptions, confined: &Confined) -> Vec<String> {
    let mut notes = Vec::new();
    let narrowed = confined
        .binary
        .as_ref()
        .is_some_and(|b| b.memory_group().is_some());
    if confined.binary.is_some() && !narrowed {
        notes.push(
            "the agent's commands can read memory in this run: fro-bot could not be its \
             shell's interpreter (docs/security.md#who-it-runs-as)"
                .into(),
        );
    }
    if opts.network.mode != crate::egress::AgentNetwork::Open && !narrowed {
        notes.push(
            "the agent's commands share OpenCode's network in this run (no fro-bot shell wrapper \
             narrows it): they can also reach fro-bot's key proxy"
                .to_string(),
        );
    }
    notes
}

/// What the summary says about the provider keys.
pub(super) fn provider_notes(plan: &KeyProxyPlan) -> Vec<String> {
    let mut notes = Vec::new();
    if !plan.routes.is_empty() {
        let ids: Vec<&str> = plan.routes.iter().map(|r| r.id.as_str()).collect();
        notes.push(format!(
            "provider keys stay with fro-bot (served through its key proxy): {}",
            ids.join(", ")
        ));
    }
    for (id, why) in &plan.visible {
        notes.push(format!(
            "provider `{id}`: its credentials are visible to the agent ({why})"
        ));
    }
    notes
}

pub(super) fn trust_file(opts: &AgentOptions) -> Result<TrustFile, AgentError> {
    let Some(view) = &opts.session_trust else {
        return Ok(None);
    };
    let file =
        crate::trust::write_view_file(view).map_err(|source| AgentError::TrustFile { source })?;
    Ok(Some((view.clone(), file)))
}

/// How OpenCode is started: the binary the agent may run, its environment, and the config
/// naming the session tools, the model and the key proxy.
pub(super) fn server_options(
    opts: &AgentOptions,
    confined: &Confined,
    plan: &KeyProxyPlan,
    key_proxy: &KeyProxy,
    exe: Option<PathBuf>,
    trust_path: Option<PathBuf>,
) -> server::ServerOptions {
    let network = opts.network.plan(Some(key_proxy.port()));
    let network_env = opts.network.env(&opts.base_env, &network);
    let memory_group = confined
        .binary
        .as_ref()
        .and_then(PrivateBinary::memory_group);
    let extra = extra_env(opts, confined.binary.as_ref());
    server::ServerOptions {
        bin: confined
            .binary
            .as_ref()
            .map_or_else(|| opts.opencode.clone(), |b| b.path().to_path_buf()),
        cwd: opts.workspace.clone(),
        env: crate::confine::env::agent_env(&opts.base_env, &opts.opt_in_env, &extra, &network_env),
        config: config_fn(opts, plan.config_overrides(key_proxy), exe, trust_path),
        auth_content: config::auth_content(&plan.auth_passthrough),
        log_file: opts.log_file.clone(),
        startup_deadline: opts.startup_deadline,
        user: opts.user,
        memory_group,
        cancel: opts.cancel.clone(),
        watchdog: opts.fro_bot_exe.clone(),
        network: network.enforced().then_some(network),
    }
}

/// What the agent's environment gets on top of the allowlist: OpenCode's own directories, the
/// wrapper shell, the memory group's git settings when OpenCode holds that group, and the
/// caller's extras (which win).
fn extra_env(opts: &AgentOptions, binary: Option<&PrivateBinary>) -> Vec<(String, String)> {
    let mut extra = opts.dirs.vars();
    if let Some(shell) = binary.and_then(PrivateBinary::shell) {
        extra.push(("SHELL".into(), shell.to_string_lossy().into_owned()));
    }
    if binary.and_then(PrivateBinary::memory_group).is_some() {
        extra.extend(memory_group::opencode_git_env());
    }
    extra.extend(opts.extra_env.iter().cloned());
    extra
}

/// The config OpenCode reads at start, made once the server's URL and password are known: the
/// session tools (with the proposal tools' files and the trust view), the model, the user's
/// config, then `overrides` (the providers pointed at the key proxy), and the memory dir refused.
fn config_fn(
    opts: &AgentOptions,
    overrides: serde_json::Value,
    exe: Option<PathBuf>,
    trust_path: Option<PathBuf>,
) -> server::ConfigFn {
    let workspace = opts.workspace.clone();
    let proposals = opts.proposals.clone();
    let model = opts.model.clone();
    let user = opts.user_config.clone();
    let memory_dir = opts.dirs.data_dir();
    Arc::new(move |url: &str, password: &str| {
        let tools = exe.as_ref().map(|exe| config::SessionToolsEntry {
            fro_bot_exe: exe.clone(),
            url: url.to_string(),
            password: password.to_string(),
            workspace: workspace.clone(),
            trust_file: trust_path.clone(),
            proposals: proposals.clone(),
        });
        config::config_content(&config::ConfigInput {
            session_tools: tools.as_ref(),
            model: model.as_ref(),
            user: user.as_ref(),
            key_proxy: Some(&overrides),
            memory_dir: Some(&memory_dir),
        })
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{json, Value};

    use super::*;
    use crate::confine::key_proxy::PLACEHOLDER_KEY;
    use crate::egress::{AgentNetwork, AgentReach};
    use crate::opencode::config::ProposalTools;
    use crate::runner::env::{
        FRO_BOT_AGENT_NETWORK, FRO_BOT_OPENCODE_PASSWORD, FRO_BOT_OPENCODE_URL, FRO_BOT_PROPOSALS,
        FRO_BOT_REVIEW_VIEW, FRO_BOT_SESSION_TRUST,
    };
    use crate::runner::Env;

    const KEY: &str = "sk-ant-fro-bot-test-secret";

    /// The server's options for `opts`, with the key proxy the run would start, and that proxy.
    async fn launched(
        opts: &AgentOptions,
        exe: Option<PathBuf>,
        trust: Option<PathBuf>,
    ) -> (server::ServerOptions, KeyProxy) {
        let confined = super::super::confinement::confine(opts, exe.as_deref()).unwrap();
        let plan = KeyProxyPlan::new(&opts.auth, opts.user_config.as_ref(), &opts.base_env);
        let key_proxy = KeyProxy::start(plan.routes.clone()).await.unwrap();
        let options = server_options(opts, &confined, &plan, &key_proxy, exe, trust);
        (options, key_proxy)
    }

    fn env_of(options: &server::ServerOptions) -> BTreeMap<String, String> {
        options.env.iter().cloned().collect()
    }

    fn config_of(options: &server::ServerOptions) -> Value {
        serde_json::from_str(&(options.config)("http://127.0.0.1:4096", "pw")).unwrap()
    }

    #[tokio::test]
    async fn the_agents_env_is_the_allowlist_its_own_dirs_and_the_extras_and_never_a_key() {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = AgentOptions::local(
            tmp.path(),
            Env::from_pairs([
                ("PATH", "/usr/bin"),
                ("HOME", "/home/runner"),
                ("XDG_CONFIG_HOME", "/home/runner/.config"),
                ("GITHUB_TOKEN", "ghs_job"),
                ("ANTHROPIC_API_KEY", KEY),
                ("TOOL_HOME", "/opt/tool"),
                ("UNLISTED", "x"),
            ]),
        );
        opts.opt_in_env = vec!["TOOL_HOME".into()];
        opts.extra_env = vec![("GH_TOKEN".into(), "ghs_acting".into())];
        let (options, key_proxy) = launched(&opts, None, None).await;

        let env = env_of(&options);
        let home = opts.dirs.home.to_string_lossy();
        let config_home = opts.dirs.config_home.to_string_lossy();
        assert_eq!(env["HOME"], home, "OpenCode's own home, not the runner's");
        assert_eq!(env["XDG_CONFIG_HOME"], config_home);
        assert_eq!(env["PATH"], "/usr/bin");
        assert_eq!(env["TOOL_HOME"], "/opt/tool", "opted in");
        assert_eq!(env["GH_TOKEN"], "ghs_acting", "the caller's extra");
        for name in ["GITHUB_TOKEN", "ANTHROPIC_API_KEY", "UNLISTED", "SHELL"] {
            assert!(!env.contains_key(name), "{name} reached the agent: {env:?}");
        }
        assert!(!env.values().any(|v| v.contains(KEY)));

        // The key stays with fro-bot: OpenCode is pointed at the key proxy with a placeholder.
        let config = config_of(&options);
        let anthropic = &config["provider"]["anthropic"]["options"];
        assert_eq!(anthropic["baseURL"], json!(key_proxy.base_url("anthropic")));
        assert_eq!(anthropic["apiKey"], json!(PLACEHOLDER_KEY));
        assert!(!config.to_string().contains(KEY));
        assert_eq!(options.auth_content, None);
        assert!(
            config.get("mcp").is_none(),
            "no session tools without fro-bot's binary"
        );

        // A local run: OpenCode itself, in the checkout, as the user, nothing enforced.
        assert_eq!(options.bin, opts.opencode);
        assert_eq!(options.cwd, opts.workspace);
        assert_eq!(options.memory_group, None);
        assert!(options.network.is_none());
    }

    #[tokio::test]
    async fn the_session_tools_get_the_servers_address_the_proposal_files_and_the_trust_view() {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = AgentOptions::local(tmp.path(), Env::from_pairs([("PATH", "/usr/bin")]));
        let exe = tmp.path().join("fro-bot");
        opts.fro_bot_exe = Some(exe.clone());
        opts.proposals = Some(ProposalTools {
            file: tmp.path().join("proposals.jsonl"),
            policy: Some(tmp.path().join("policy.json")),
            review_view: None,
        });
        let mut notes = Vec::new();
        let tools_exe = session_tools_exe(&opts, &mut notes);
        assert_eq!(tools_exe.as_ref(), Some(&exe), "the user's own binary");
        assert!(notes.is_empty());
        let trust = tmp.path().join("trust.json");
        let (options, _key_proxy) = launched(&opts, tools_exe, Some(trust.clone())).await;

        let config = config_of(&options);
        let entry = &config["mcp"][config::SESSION_TOOLS_MCP];
        assert_eq!(entry["command"], json!([exe, "session-tools"]));
        let environment = &entry["environment"];
        assert_eq!(environment[FRO_BOT_OPENCODE_URL], "http://127.0.0.1:4096");
        assert_eq!(environment[FRO_BOT_OPENCODE_PASSWORD], "pw");
        assert_eq!(
            environment[FRO_BOT_PROPOSALS],
            json!(tmp.path().join("proposals.jsonl"))
        );
        assert_eq!(environment[FRO_BOT_SESSION_TRUST], json!(trust));
        assert!(environment.get(FRO_BOT_REVIEW_VIEW).is_none(), "no review");
        assert_eq!(options.watchdog, Some(exe), "fro-bot watches the server");

        opts.fro_bot_exe = None;
        assert_eq!(session_tools_exe(&opts, &mut notes), None);
    }

    #[tokio::test]
    async fn an_enforced_network_keeps_the_runner_proxy_from_the_agent() {
        let tmp = tempfile::tempdir().unwrap();
        let runner_proxy = "http://user:pw@runner-proxy.internal:3128";
        let base = Env::from_pairs([("PATH", "/usr/bin"), ("HTTPS_PROXY", runner_proxy)]);
        let mut opts = AgentOptions::local(tmp.path(), base);

        // Open: the agent uses the runner proxy as the job does, loopback exempt.
        let (options, _key_proxy) = launched(&opts, None, None).await;
        let env = env_of(&options);
        assert_eq!(env["HTTPS_PROXY"], runner_proxy);
        assert!(env["NO_PROXY"].contains("127.0.0.1"), "{env:?}");
        assert!(!env.contains_key(FRO_BOT_AGENT_NETWORK));

        // No network: the kernel holds OpenCode to the key proxy, and the runner proxy is not the
        // agent's.
        opts.network = AgentReach {
            mode: AgentNetwork::None,
            ..AgentReach::open()
        };
        let (options, key_proxy) = launched(&opts, None, None).await;
        let env = env_of(&options);
        assert!(!env.values().any(|v| v.contains("runner-proxy")), "{env:?}");
        assert!(env.contains_key(FRO_BOT_AGENT_NETWORK));
        let network = options.network.expect("enforced");
        assert_eq!(network.key_proxy_port, Some(key_proxy.port()));
        assert_eq!(network.egress_port, None);
    }

    #[tokio::test]
    async fn the_notes_name_the_keys_kept_the_credentials_visible_and_the_commands_reach() {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = AgentOptions::local(
            tmp.path(),
            Env::from_pairs([("PATH", "/usr/bin"), ("ANTHROPIC_API_KEY", KEY)]),
        );
        let bedrock = json!({"type": "api", "key": "bedrock-key"});
        opts.auth.insert("amazon-bedrock".into(), bedrock.clone());
        let plan = KeyProxyPlan::new(&opts.auth, None, &opts.base_env);
        let notes = provider_notes(&plan);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("provider keys stay with fro-bot"));
        assert!(notes[0].ends_with(": anthropic"));
        assert!(notes[1].starts_with("provider `amazon-bedrock`: its credentials are visible"));
        // What the key proxy cannot carry is still OpenCode's to use.
        let (options, _key_proxy) = launched(&opts, None, None).await;
        let auth: Value = serde_json::from_str(options.auth_content.as_deref().unwrap()).unwrap();
        assert_eq!(auth, json!({"amazon-bedrock": bedrock}));

        let confined = super::super::confinement::confine(&opts, None).unwrap();
        assert!(commands_notes(&opts, &confined).is_empty(), "open, local");
        opts.network.mode = AgentNetwork::Allowlist;
        let notes = commands_notes(&opts, &confined);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("can also reach fro-bot's key proxy"));
    }
}
