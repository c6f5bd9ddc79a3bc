//! The agent's network for the run (docs/security.md#the-agents-network): before the agent starts,
//! check that the kernel can enforce `agent-network` and start the egress proxy; after the turn,
//! the step summary's "Network" row.

use std::sync::Arc;

use crate::confine::landlock;
use crate::egress::runner_proxy::RunnerProxy;
use crate::egress::{AgentNetwork, AgentReach, Commands, EgressProxy, NetworkSettings};
use crate::phases::run_context::{Admitted, RunLedger};
use crate::runner::env;

/// What the agent may reach this turn. `Err`: the one line that fails the run before the agent
/// starts (the kernel cannot enforce the setting, or the proxy cannot listen).
pub(crate) async fn prepare(ctx: &Admitted) -> Result<AgentReach, String> {
    let settings = &ctx.settings.network;
    if settings.mode == AgentNetwork::Open {
        return Ok(AgentReach::open());
    }
    let lowered = ctx
        .env
        .get(env::FRO_BOT_LANDLOCK_ABI)
        .and_then(|v| v.parse().ok());
    let support = landlock::support(lowered);
    let abi = match support {
        landlock::Support::Abi(v) if support.enforces_tcp() => v,
        landlock::Support::Abi(_) | landlock::Support::Missing { .. } => {
            return Err(format!(
                "agent-network: {} cannot be enforced: {}, and its TCP rules need ABI {} \
                 (Linux 6.7 or later). Run on a newer kernel, or set `agent-network: open` to run \
                 the agent without network enforcement, at the workflow's own risk",
                settings.mode.as_str(),
                support.describe(),
                landlock::MIN_ABI
            ))
        }
    };
    let proxy = match settings.mode {
        AgentNetwork::Allowlist => Some(Arc::new(
            EgressProxy::start(settings.allowed.clone(), RunnerProxy::from_env(&ctx.env))
                .await
                .map_err(|e| format!("cannot start the agent's egress proxy: {e}"))?,
        )),
        AgentNetwork::None | AgentNetwork::Open => None,
    };
    let mut reach = AgentReach {
        mode: settings.mode,
        abi,
        proxy,
        agent_ports: settings.agent_ports.clone(),
        commands: Commands::Process { why: None },
    };
    reach.commands = super::agent_sibling::commands(ctx, &reach).await?;
    Ok(reach)
}

/// After the turn: the "Network" row, from the proxy's counts. The proxy stops once the agent's
/// handle on it is gone too.
pub(crate) fn record(settings: &NetworkSettings, run: &mut RunLedger) {
    let Some(reach) = run.egress.take() else {
        return;
    };
    let reach_of_ports = match reach.commands {
        Commands::Sibling(_) => "inside the agent's container only",
        Commands::Process { .. } => "on any host",
    };
    let ports = match reach.agent_ports.as_slice() {
        [] => String::new(),
        ports => format!(
            "; agent-ports {} ({reach_of_ports})",
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let row = match (reach.mode, &reach.proxy) {
        (AgentNetwork::Allowlist, Some(proxy)) => {
            let listed = settings.allowed.written();
            let listed = match listed {
                [] => "nothing listed".to_string(),
                l => format!("`{}`", l.join("`, `")),
            };
            format!("allowlist ({listed}{ports}): {}", proxy.counts().describe())
        }
        (AgentNetwork::None, _) | (AgentNetwork::Allowlist, None) => format!(
            "none: the model and fro-bot's tools only; the agent's commands had no network{ports}"
        ),
        (AgentNetwork::Open, _) => {
            "open (`agent-network: open`): nothing was enforced or counted".to_string()
        }
    };
    let row = match reach.mode {
        AgentNetwork::Open => row,
        AgentNetwork::Allowlist | AgentNetwork::None => {
            format!("{row}. {}", enforcement(&reach.commands))
        }
    };
    run.ledger.report.network = Some(row);
}

/// Which enforcement ran (`agent-isolation`), for the Network row.
fn enforcement(commands: &Commands) -> String {
    match commands {
        Commands::Sibling(_) => "The agent's commands ran in a container with no network \
                                 (`agent-isolation`): the egress proxy was their only way out"
            .to_string(),
        Commands::Process { why } => {
            let why = why
                .as_deref()
                .map_or("`agent-isolation: process`".to_string(), |w| {
                    format!("no container: {w}")
                });
            format!(
                "The agent's commands ran in fro-bot's container under the kernel's port rules \
                 ({why}): port-based, any address on an allowed port was reachable"
            )
        }
    }
}
