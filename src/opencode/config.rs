//! OpenCode's configuration, given through `OPENCODE_CONFIG_CONTENT` (never a file in the workspace):
//! baseline → session-tools MCP entry (with what the proposal tools are given, [`ProposalTools`])
//! → `model` → the user's `opencode-config` (deep merge, user wins) → the providers pointed at
//! the key proxy, then the headless permissions. Also `OPENCODE_AUTH_CONTENT`, and the
//! pre-seeded config dir that stops OpenCode from npm-installing its plugin package at every start.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::config::ModelRef;
use crate::runner::env::{
    FRO_BOT_OPENCODE_PASSWORD, FRO_BOT_OPENCODE_URL, FRO_BOT_OUTPUT_POLICY, FRO_BOT_PROPOSALS,
    FRO_BOT_REVIEW_VIEW, FRO_BOT_SESSION_TRUST, FRO_BOT_WORKSPACE,
};

/// Name of the MCP server entry that gives the agent `session_*` tools.
pub const SESSION_TOOLS_MCP: &str = "fro-bot-sessions";

/// Where the session-tools MCP server (a `fro-bot session-tools` child of OpenCode) finds the
/// server. The URL must be known before OpenCode starts, because the MCP entry is part of the
/// config OpenCode reads at start: the server is started on a port chosen beforehand (see
/// `server.rs`).
#[derive(Debug, Clone)]
pub struct SessionToolsEntry {
    pub fro_bot_exe: PathBuf,
    pub url: String,
    pub password: String,
    pub workspace: PathBuf,
    /// The trust view the tools apply (`tools::sessions::TrustSource`); `None`: all untrusted.
    pub trust_file: Option<PathBuf>,
    /// The proposal tools' files; `None`: the proposal tools are not offered.
    pub proposals: Option<ProposalTools>,
}

/// What the proposal tools are given (through the MCP entry's environment): where they append
/// proposals, the policy they check against, and fro-bot's view of the pull request when the run
/// can review one. The tools themselves are `tools::proposals` and `tools::review`.
#[derive(Debug, Clone)]
pub struct ProposalTools {
    pub file: PathBuf,
    pub policy: Option<PathBuf>,
    pub review_view: Option<PathBuf>,
}

#[derive(Debug, Clone, Default)]
pub struct ConfigInput<'a> {
    pub session_tools: Option<&'a SessionToolsEntry>,
    pub model: Option<&'a ModelRef>,
    pub user: Option<&'a Map<String, Value>>,
    /// Points providers at the key proxy (`crate::confine::key_proxy`); merged last, so it
    /// wins over the user's `baseURL`/`apiKey`.
    pub key_proxy: Option<&'a Value>,
    /// fro-bot's memory dir (`opencode.db`): OpenCode's tools are refused paths there.
    pub memory_dir: Option<&'a Path>,
}

/// The JSON for `OPENCODE_CONFIG_CONTENT`.
pub fn config_content(input: &ConfigInput<'_>) -> String {
    let mut cfg = json!({"autoupdate": false, "share": "disabled"});
    if let Some(tools) = input.session_tools {
        let mut environment = json!({
            FRO_BOT_OPENCODE_URL: tools.url,
            FRO_BOT_OPENCODE_PASSWORD: tools.password,
            FRO_BOT_WORKSPACE: tools.workspace.to_string_lossy(),
        });
        if let Some(file) = &tools.trust_file {
            environment[FRO_BOT_SESSION_TRUST] = json!(file.to_string_lossy());
        }
        if let Some(p) = &tools.proposals {
            environment[FRO_BOT_PROPOSALS] = json!(p.file.to_string_lossy());
            if let Some(policy) = &p.policy {
                environment[FRO_BOT_OUTPUT_POLICY] = json!(policy.to_string_lossy());
            }
            if let Some(view) = &p.review_view {
                environment[FRO_BOT_REVIEW_VIEW] = json!(view.to_string_lossy());
            }
        }
        let entry = json!({"mcp": {SESSION_TOOLS_MCP: {
            "type": "local",
            "command": [tools.fro_bot_exe.to_string_lossy(), "session-tools"],
            "environment": environment,
            "enabled": true,
        }}});
        deep_merge(&mut cfg, entry);
    }
    if let Some(m) = input.model {
        deep_merge(
            &mut cfg,
            json!({"model": format!("{}/{}", m.provider, m.model)}),
        );
    }
    if let Some(user) = input.user {
        deep_merge(&mut cfg, Value::Object(user.clone()));
    }
    if let Some(overrides) = input.key_proxy {
        deep_merge(&mut cfg, overrides.clone());
    }
    headless_permissions(&mut cfg, input.memory_dir);
    // OpenCode's snapshots (a git repository of the work tree inside the memory dir, for its
    // undo) are not fro-bot's to keep: fro-bot captures the change itself, the snapshots would
    // grow every saved memory, and their git would run with the memory group on files the agent
    // writes (docs/security.md#what-it-can-touch). Set after the user's config, like the
    // permissions.
    cfg["snapshot"] = json!(false);
    cfg.to_string()
}

/// OpenCode's permissions for a turn nobody watches (docs/security.md#what-it-can-touch): nothing
/// can answer "ask", so every ask of the user's config is a deny; OpenCode's own defaults that ask
/// are decided here — paths outside the checkout allowed (its shell tool is held to the same rule,
/// and the agent's uid reaches them anyway), but not fro-bot's memory dir, which only OpenCode and
/// the session tools are to read; `.env` files and a repeated tool call denied. Set last: OpenCode
/// takes the last rule that matches.
fn headless_permissions(cfg: &mut Value, memory_dir: Option<&Path>) {
    let mut permission = match cfg.get("permission") {
        Some(Value::String(all)) => json!({ "*": all }),
        Some(Value::Object(o)) => Value::Object(o.clone()),
        _ => json!({}),
    };
    ask_is_deny(&mut permission);
    // A user's `"read": "deny"` stays whole: the `.env` rules come after it, not instead.
    for key in ["read", "external_directory"] {
        if let Some(Value::String(all)) = permission.get(key).cloned() {
            permission[key] = json!({ "*": all });
        }
    }
    // serde_json keeps keys sorted, so `*` comes first and longer path patterns after it.
    let mut external = match permission.get("external_directory") {
        Some(Value::Object(user)) => Value::Object(user.clone()),
        _ => json!({}),
    };
    if external.get("*").is_none() {
        external["*"] = json!("allow");
    }
    if let Some(dir) = memory_dir {
        let dir = dir.to_string_lossy();
        external[dir.as_ref()] = json!("deny");
        external[format!("{dir}/*")] = json!("deny");
    }
    permission["external_directory"] = external;
    deep_merge(
        &mut permission,
        json!({
            "doom_loop": "deny",
            "read": {"*.env": "deny", "*.env.*": "deny", "*.env.example": "allow"},
        }),
    );
    cfg["permission"] = permission;
}

fn ask_is_deny(v: &mut Value) {
    match v {
        Value::String(s) if s == "ask" => *s = "deny".into(),
        Value::Object(o) => o.values_mut().for_each(ask_is_deny),
        _ => {}
    }
}

/// Merges `over` into `base`: objects merge key by key, anything else in `over` replaces.
pub fn deep_merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => deep_merge(existing, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// `OPENCODE_AUTH_CONTENT`: the `auth-json` object as OpenCode 1.18 reads it from the environment
/// (it then never reads or writes `auth.json`, so credentials never land in the cached data dir).
pub fn auth_content(auth: &Map<String, Value>) -> Option<String> {
    (!auth.is_empty()).then(|| Value::Object(auth.clone()).to_string())
}

/// `auth.json` in a data dir. fro-bot never writes it (credentials go through the environment),
/// but one restored or left by a user's tooling must be deleted before any save.
pub fn auth_file(data_dir: &Path) -> PathBuf {
    data_dir.join("auth.json")
}

/// OpenCode npm-installs `@opencode-ai/plugin` into its config dir at every start unless
/// `package.json`, a `package-lock.json` declaring the same version, and `node_modules/` are there.
/// Seeds them when absent (an existing real install is left alone). Nothing in the agent needs the
/// plugin package unless the user adds plugins, which then install as usual.
pub fn seed_plugin_dir(config_dir: &Path, version: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(config_dir.join("node_modules"))?;
    let pkg = config_dir.join("package.json");
    if !pkg.exists() {
        std::fs::write(
            &pkg,
            json!({"dependencies": {"@opencode-ai/plugin": version}}).to_string(),
        )?;
    }
    let lock = config_dir.join("package-lock.json");
    if !lock.exists() {
        std::fs::write(
            &lock,
            json!({"name": "opencode", "lockfileVersion": 3, "requires": true, "packages": {
                "": {"dependencies": {"@opencode-ai/plugin": version}},
                "node_modules/@opencode-ai/plugin": {"version": version}
            }})
            .to_string(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_asks_and_no_tool_reaches_memory_whatever_the_user_configured() {
        let user = json!({"permission": {"bash": {"rm *": "ask", "*": "allow"}, "read": "deny",
            "edit": "ask", "external_directory": {"/mem/*": "allow", "/srv/*": "ask"}}});
        let Value::Object(user) = user else {
            unreachable!()
        };
        let content = |user| {
            serde_json::from_str::<Value>(&config_content(&ConfigInput {
                user: Some(user),
                memory_dir: Some(Path::new("/mem/opencode")),
                ..ConfigInput::default()
            }))
            .unwrap()
        };
        let cfg = content(&user);
        let p = &cfg["permission"];
        assert_eq!(p["bash"], json!({"rm *": "deny", "*": "allow"}));
        assert_eq!(p["edit"], "deny");
        assert_eq!(p["doom_loop"], "deny");
        assert_eq!(
            p["read"],
            json!({"*": "deny", "*.env": "deny", "*.env.*": "deny", "*.env.example": "allow"})
        );
        // In the order OpenCode reads them (the last match wins): memory after the user's allow.
        let external: Vec<(String, String)> = p["external_directory"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            external,
            vec![
                pair("*", "allow"),
                pair("/mem/*", "allow"),
                pair("/mem/opencode", "deny"),
                pair("/mem/opencode/*", "deny"),
                pair("/srv/*", "deny"),
            ]
        );
        assert!(!cfg.to_string().contains("\"ask\""), "{cfg}");
        let Value::Object(all) = json!({"permission": "allow"}) else {
            unreachable!()
        };
        let cfg = content(&all);
        assert_eq!(cfg["permission"]["*"], "allow");
        assert_eq!(
            cfg["permission"]["external_directory"]["/mem/opencode/*"],
            "deny"
        );
    }

    #[test]
    fn layers_apply_in_order_and_the_user_wins() {
        let tools = SessionToolsEntry {
            fro_bot_exe: "/usr/bin/fro-bot".into(),
            url: "http://127.0.0.1:5000".into(),
            password: "pw-secret".into(),
            workspace: "/ws".into(),
            trust_file: Some("/tmp/trust.json".into()),
            proposals: None,
        };
        let model = ModelRef {
            provider: "anthropic".into(),
            model: "claude".into(),
        };
        let user: Map<String, Value> = serde_json::from_value(json!({
            "share": "manual",
            "model": "openai/gpt",
            "mcp": {"other": {"type": "remote", "url": "https://x"},
                    SESSION_TOOLS_MCP: {"enabled": false}}
        }))
        .unwrap();
        let cfg: Value = serde_json::from_str(&config_content(&ConfigInput {
            session_tools: Some(&tools),
            model: Some(&model),
            user: Some(&user),
            key_proxy: None,
            memory_dir: None,
        }))
        .unwrap();
        assert_eq!(cfg["autoupdate"], false);
        assert_eq!(cfg["share"], "manual");
        assert_eq!(cfg["model"], "openai/gpt");
        let entry = &cfg["mcp"][SESSION_TOOLS_MCP];
        assert_eq!(
            entry["command"],
            json!(["/usr/bin/fro-bot", "session-tools"])
        );
        assert_eq!(
            entry["environment"][FRO_BOT_OPENCODE_URL],
            "http://127.0.0.1:5000"
        );
        assert_eq!(entry["environment"][FRO_BOT_WORKSPACE], "/ws");
        assert_eq!(
            entry["environment"][FRO_BOT_SESSION_TRUST],
            "/tmp/trust.json"
        );
        // Deep merge: the user's partial override keeps the rest of our entry.
        assert_eq!(entry["enabled"], false);
        assert_eq!(entry["type"], "local");
        assert_eq!(cfg["mcp"]["other"]["url"], "https://x");

        let bare: Value = serde_json::from_str(&config_content(&ConfigInput::default())).unwrap();
        assert_eq!(bare["autoupdate"], false);
        assert_eq!(bare["share"], "disabled");
        assert_eq!(bare["permission"]["external_directory"]["*"], "allow");
    }

    #[test]
    fn seeding_keeps_an_existing_install() {
        let dir = tempfile::tempdir().unwrap();
        seed_plugin_dir(dir.path(), "1.2.3").unwrap();
        let lock: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("package-lock.json")).unwrap())
                .unwrap();
        assert_eq!(
            lock["packages"][""]["dependencies"]["@opencode-ai/plugin"],
            "1.2.3"
        );
        assert!(dir.path().join("node_modules").is_dir());
        std::fs::write(dir.path().join("package.json"), "{\"mine\":1}").unwrap();
        seed_plugin_dir(dir.path(), "1.2.3").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("package.json")).unwrap(),
            "{\"mine\":1}"
        );
    }

    #[test]
    fn empty_auth_is_not_passed() {
        assert_eq!(auth_content(&Map::new()), None);
        let m: Map<String, Value> =
            serde_json::from_value(json!({"openai": {"type": "api", "key": "k"}})).unwrap();
        assert_eq!(
            auth_content(&m).unwrap(),
            r#"{"openai":{"key":"k","type":"api"}}"#
        );
    }
}
