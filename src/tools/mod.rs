//! `fro-bot session-tools`: the MCP server (JSON-RPC 2.0 over stdio, one message per line) that
//! OpenCode starts for the agent. Each family of tools is a file of its own — `sessions` (earlier
//! conversations, through the OpenCode server's API), `proposals` (what fro-bot carries out
//! after the turn) and `review` (a pull request's review) — giving its `NAMES`, its
//! `definitions()` and a `call`; this file serves them.
//! A tool's failure is a result with `isError: true`, never a crash.

mod args;
pub mod proposals;
pub mod review;
pub mod sessions;

use std::path::PathBuf;

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::opencode::config::ProposalTools;
use crate::runner::env::{FRO_BOT_OUTPUT_POLICY, FRO_BOT_PROPOSALS, FRO_BOT_REVIEW_VIEW};
use crate::runner::Env;
use review::ReviewTools;
use sessions::SessionTools;

const PROTOCOL_VERSION: &str = "2024-11-05";

#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    #[error("cannot read MCP requests from stdin")]
    Read {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write MCP responses to stdout")]
    Write {
        #[source]
        source: std::io::Error,
    },
}

/// The families served.
#[derive(Debug, Clone)]
pub struct ToolsConfig {
    pub sessions: SessionTools,
    /// `None`: the proposal tools are not offered.
    pub proposals: Option<ProposalTools>,
    /// `None`: no pull request to review (or no proposal tools).
    pub review: Option<ReviewTools>,
}

impl ToolsConfig {
    pub fn from_env(env: &Env) -> Self {
        let proposals = env.get(FRO_BOT_PROPOSALS).map(|file| ProposalTools {
            file: PathBuf::from(file),
            policy: env.get(FRO_BOT_OUTPUT_POLICY).map(PathBuf::from),
            review_view: env.get(FRO_BOT_REVIEW_VIEW).map(PathBuf::from),
        });
        let review = proposals.as_ref().and_then(|p| {
            Some(ReviewTools {
                view: p.review_view.clone()?,
                proposals: p.clone(),
            })
        });
        Self {
            sessions: SessionTools::from_env(env),
            proposals,
            review,
        }
    }

    fn definitions(&self) -> Vec<Value> {
        let mut tools = sessions::definitions();
        if self.proposals.is_some() {
            tools.extend(proposals::definitions());
        }
        if self.review.is_some() {
            tools.extend(review::definitions());
        }
        tools
    }

    async fn call(&self, name: &str, args: &Value) -> Value {
        let result = match (&self.proposals, &self.review) {
            (Some(tools), _) if proposals::NAMES.contains(&name) => tools.call(name, args),
            (_, Some(tools)) if review::NAMES.contains(&name) => tools.call(name, args),
            _ => return self.sessions.call(name, args).await,
        };
        match result {
            Ok(text) => answered(&text),
            Err(e) => failed(&e),
        }
    }
}

/// A tool's answer.
fn answered(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": false})
}

/// A tool's failure, told to the agent.
fn failed(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// Serves stdin/stdout of this process until stdin closes.
pub async fn serve_stdio(config: ToolsConfig) -> Result<(), ToolsError> {
    // tokio's `io-std` feature is not enabled: async files over duplicates of fds 0 and 1.
    use std::os::fd::AsFd;
    let dup = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(|owned| tokio::fs::File::from_std(std::fs::File::from(owned)))
    };
    let stdin = dup(std::io::stdin().as_fd()).map_err(|source| ToolsError::Read { source })?;
    let stdout = dup(std::io::stdout().as_fd()).map_err(|source| ToolsError::Write { source })?;
    serve(config, tokio::io::BufReader::new(stdin), stdout).await
}

pub async fn serve<R, W>(config: ToolsConfig, input: R, mut output: W) -> Result<(), ToolsError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = input.lines();
    while let Some(line) = lines
        .next_line()
        .await
        .map_err(|source| ToolsError::Read { source })?
    {
        if line.trim().is_empty() {
            continue;
        }
        let Some(reply) = handle_line(&config, &line).await else {
            continue;
        };
        let mut bytes = reply.to_string().into_bytes();
        bytes.push(b'\n');
        output
            .write_all(&bytes)
            .await
            .map_err(|source| ToolsError::Write { source })?;
        output
            .flush()
            .await
            .map_err(|source| ToolsError::Write { source })?;
    }
    Ok(())
}

/// One JSON-RPC message in, at most one out (notifications get none).
pub async fn handle_line(config: &ToolsConfig, line: &str) -> Option<Value> {
    let msg: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return Some(rpc_error(Value::Null, -32700, &format!("parse error: {e}"))),
    };
    let id = msg.get("id").cloned();
    let method = msg["method"].as_str().unwrap_or("");
    let Some(id) = id else {
        return None; // notification (notifications/initialized, cancelled, ...)
    };
    let result = match method {
        "initialize" => json!({
            "protocolVersion": msg["params"]["protocolVersion"].as_str().unwrap_or(PROTOCOL_VERSION),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fro-bot-sessions", "version": env!("CARGO_PKG_VERSION")}
        }),
        "ping" => json!({}),
        "tools/list" => json!({ "tools": config.definitions() }),
        "tools/call" => {
            let name = msg["params"]["name"].as_str().unwrap_or("");
            let args = msg["params"]["arguments"].clone();
            config.call(name, &args).await
        }
        _ => {
            return Some(rpc_error(
                id,
                -32601,
                &format!("method not found: {method}"),
            ))
        }
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trust::TrustView;
    use sessions::TrustSource;

    fn unreachable_config() -> ToolsConfig {
        ToolsConfig {
            sessions: SessionTools {
                // Port 9 on loopback: nothing listens, connections are refused at once.
                url: Some("http://127.0.0.1:9".into()),
                password: None,
                workspace: "/ws".into(),
                trust: TrustSource::Fixed(TrustView::unknown()),
            },
            proposals: None,
            review: None,
        }
    }

    #[tokio::test]
    async fn protocol_round_trip_and_failures_are_tool_results() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"session_search","arguments":{"query":"x"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#,
            "\n",
            "not json\n",
            r#"{"jsonrpc":"2.0","id":5,"method":"nope"}"#,
            "\n",
        );
        let mut out = Vec::new();
        serve(unreachable_config(), input.as_bytes(), &mut out)
            .await
            .unwrap();
        let replies: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(replies.len(), 6, "the notification gets no reply");
        assert_eq!(replies[0]["result"]["protocolVersion"], "2025-06-18");
        assert!(replies[0]["result"]["capabilities"]["tools"].is_object());
        let names: Vec<&str> = replies[1]["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "session_list",
                "session_read",
                "session_search",
                "session_info"
            ]
        );
        assert_eq!(replies[2]["id"], 3);
        assert_eq!(replies[2]["result"]["isError"], true);
        assert!(replies[2]["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("session store unavailable: "));
        assert_eq!(replies[3]["result"], json!({}));
        assert_eq!(replies[4]["error"]["code"], -32700);
        assert_eq!(replies[5]["error"]["code"], -32601);
    }

    #[tokio::test]
    async fn missing_url_and_arguments_are_reported_not_crashed() {
        let cfg = ToolsConfig {
            sessions: SessionTools {
                url: None,
                password: None,
                workspace: "/ws".into(),
                trust: TrustSource::Fixed(TrustView::unknown()),
            },
            proposals: None,
            review: None,
        };
        let r = cfg.call("session_list", &json!({})).await;
        assert_eq!(r["isError"], true);
        assert!(r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("FRO_BOT_OPENCODE_URL"));
    }
}
