//! The agent's network (docs/security.md#the-agents-network): what it may reach (`allowlist`,
//! special addresses in `address`), the egress proxy that carries it (`proxy`, with `splice` and
//! the summary's counts in `tally`), and the runner proxy it sends that on through
//! (`runner_proxy`). The kernel side — which ports the agent's processes may connect to at all, and
//! which sockets they may open — is [`crate::confine::network`].

pub mod address;
pub mod allowlist;
pub mod proxy;
pub mod runner_proxy;
pub mod splice;
pub mod tally;

pub use crate::confine::network::AgentNetwork;
pub use allowlist::{Allowlist, AllowlistError};
pub use proxy::EgressProxy;

/// The network inputs of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkSettings {
    pub mode: AgentNetwork,
    /// `allowed-domains`.
    pub allowed: Allowlist,
    /// `agent-ports`: TCP ports the agent may bind and connect to (on any host: the kernel's
    /// rules know ports, not addresses).
    pub agent_ports: Vec<u16>,
    /// `agent-isolation`: where the agent's commands run.
    pub isolation: crate::confine::sibling::AgentIsolation,
}

/// The agent's network for one turn, as `opencode::Agent` sets it up: the mode, the kernel's
/// Landlock ABI (checked before the agent starts, `phases::turn::agent_network`), and the egress proxy.
#[derive(Debug, Clone)]
pub struct AgentReach {
    pub mode: AgentNetwork,
    pub abi: i64,
    pub proxy: Option<std::sync::Arc<EgressProxy>>,
    pub agent_ports: Vec<u16>,
    /// Where the agent's commands run.
    pub commands: Commands,
}

/// Where the agent's commands run this turn (`agent-isolation`).
#[derive(Debug, Clone)]
pub enum Commands {
    /// In the sibling container with no network (`crate::confine::sibling`).
    Sibling(std::sync::Arc<crate::confine::sibling::Sibling>),
    /// In fro-bot's container under the kernel's port rules; `why`, when the container was
    /// wanted (`auto`) but could not be had.
    Process { why: Option<String> },
}

impl AgentReach {
    /// Nothing enforced (tools and tests that run OpenCode outside a run).
    pub fn open() -> AgentReach {
        AgentReach {
            mode: AgentNetwork::Open,
            abi: 0,
            proxy: None,
            agent_ports: Vec::new(),
            commands: Commands::Process { why: None },
        }
    }

    /// The sibling the agent's commands run in, if any.
    pub fn sibling(&self) -> Option<&std::sync::Arc<crate::confine::sibling::Sibling>> {
        match &self.commands {
            Commands::Sibling(s) => Some(s),
            Commands::Process { .. } => None,
        }
    }

    /// What the kernel enforces, once the key proxy listens on `key_proxy_port` (`None`: the
    /// agent's commands' side only, which never reaches the key proxy).
    pub fn plan(&self, key_proxy_port: Option<u16>) -> crate::confine::network::NetworkPlan {
        crate::confine::network::NetworkPlan {
            mode: self.mode,
            abi: self.abi,
            key_proxy_port,
            egress_port: self.proxy.as_ref().map(|p| p.port()),
            agent_ports: self.agent_ports.clone(),
        }
    }

    /// The agent's network variables: the job's own when open, else the egress proxy's
    /// (`crate::net::agent_vars_behind`) and the commands' domain for the shell wrapper.
    pub fn env(
        &self,
        job: &crate::runner::Env,
        plan: &crate::confine::network::NetworkPlan,
    ) -> Vec<(String, String)> {
        match self.mode {
            AgentNetwork::Open => crate::net::agent_vars(job),
            AgentNetwork::Allowlist | AgentNetwork::None => {
                let url = self.proxy.as_ref().map(|p| p.url());
                let mut vars = crate::net::agent_vars_behind(job, url.as_deref());
                if let Some(spec) = plan.commands_spec() {
                    vars.push((crate::runner::env::FRO_BOT_AGENT_NETWORK.into(), spec));
                }
                if let Some(sibling) = self.sibling() {
                    let socket = sibling.exec_socket().to_string_lossy().into_owned();
                    vars.push((crate::runner::env::FRO_BOT_AGENT_SIBLING.into(), socket));
                }
                vars
            }
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{word}' is not a TCP port (1-65535)")]
pub struct PortError {
    pub word: String,
}

/// `agent-ports`: comma-, space- or newline-separated port numbers.
pub fn parse_ports(raw: &str) -> Result<Vec<u16>, PortError> {
    let mut ports = Vec::new();
    for word in raw
        .split([',', '\n', ' ', '\t'])
        .map(str::trim)
        .filter(|w| !w.is_empty())
    {
        let port = word
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0 && word.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| PortError {
                word: word.to_string(),
            })?;
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_plain_numbers_in_range() {
        assert_eq!(parse_ports("3000, 5432\n3000").unwrap(), [3000, 5432]);
        for bad in ["0", "65536", "+80", "http", "-1"] {
            assert_eq!(
                parse_ports(bad).unwrap_err().to_string(),
                format!("'{bad}' is not a TCP port (1-65535)")
            );
        }
    }
}
