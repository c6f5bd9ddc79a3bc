//! The kernel's side of the agent's network (docs/security.md#the-agents-network): which TCP ports
//! the agent's processes may connect to and bind ([`super::landlock`]) and which sockets they may
//! open ([`super::seccomp`]), set up before OpenCode executes and inherited by everything it
//! starts, so no later process can lift it.
//!
//! Two domains, the second inside the first:
//! - **OpenCode** (and what it starts itself: the session tools, ripgrep): the key proxy, the
//!   egress proxy (`allowlist`), its own server's port (the session tools call it) and
//!   `agent-ports`; it binds only its server's port and `agent-ports`.
//! - **The agent's commands** (narrowed by the shell wrapper, [`narrow_commands`]): only the
//!   egress proxy (`allowlist`) and `agent-ports`; under `none` without `agent-ports`, no IP
//!   socket at all.

use std::os::fd::{AsRawFd, OwnedFd};

use super::landlock::{self, NetRules};
use super::seccomp::{Filter, FilterError};

/// `agent-network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentNetwork {
    /// The agent reaches the model, fro-bot's tools and the hosts on `allowed-domains` (through
    /// the egress proxy), nothing else.
    #[default]
    Allowlist,
    /// The model and fro-bot's tools only: the agent's commands get no IP socket at all.
    None,
    /// Nothing is enforced: today's behaviour, at the workflow's own risk.
    Open,
}

impl AgentNetwork {
    pub const CHOICES: [(&'static str, AgentNetwork); 3] = [
        ("allowlist", AgentNetwork::Allowlist),
        ("none", AgentNetwork::None),
        ("open", AgentNetwork::Open),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentNetwork::Allowlist => "allowlist",
            AgentNetwork::None => "none",
            AgentNetwork::Open => "open",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("cannot make the agent's Landlock ruleset")]
    Ruleset {
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error("the agent's network setting {value:?} is not one fro-bot wrote")]
    Spec { value: String },
}

/// What is enforced for one run, decided before OpenCode starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPlan {
    pub mode: AgentNetwork,
    /// The kernel's Landlock ABI (at least [`landlock::MIN_ABI`] unless `mode` is open).
    pub abi: i64,
    pub key_proxy_port: Option<u16>,
    pub egress_port: Option<u16>,
    pub agent_ports: Vec<u16>,
}

/// The Landlock domain and filter OpenCode starts in: made before `fork`, applied by
/// [`Enforcement::apply`] between `fork` and `exec`.
#[derive(Debug)]
pub struct Enforcement {
    ruleset: OwnedFd,
    filter: Filter,
}

impl Enforcement {
    /// Async-signal-safe: two system calls. `no_new_privs` must be set.
    pub fn apply(&self) -> std::io::Result<()> {
        landlock::restrict(self.ruleset.as_raw_fd())?;
        self.filter.install()
    }
}

impl NetworkPlan {
    /// Whether anything is enforced.
    pub fn enforced(&self) -> bool {
        self.mode != AgentNetwork::Open
    }

    fn opencode_rules(&self, server_port: u16) -> NetRules {
        let mut connect: Vec<u16> = [self.key_proxy_port, self.egress_port, Some(server_port)]
            .into_iter()
            .flatten()
            .collect();
        connect.extend(&self.agent_ports);
        let mut bind = vec![server_port];
        bind.extend(&self.agent_ports);
        NetRules { connect, bind }
    }

    /// OpenCode's enforcement, for its server on `server_port`; `None` when the network is open.
    pub fn for_server(&self, server_port: u16) -> Result<Option<Enforcement>, NetworkError> {
        if !self.enforced() {
            return Ok(None);
        }
        let ruleset = self
            .opencode_rules(server_port)
            .create(self.abi)
            .map_err(|source| NetworkError::Ruleset { source })?;
        Ok(Some(Enforcement {
            ruleset,
            filter: Filter::agent()?,
        }))
    }

    /// The value of [`crate::runner::env::FRO_BOT_AGENT_NETWORK`] for the shell wrapper; `None`
    /// when the network is open.
    pub fn commands_spec(&self) -> Option<String> {
        if !self.enforced() {
            return None;
        }
        let join = |ports: &[u16]| {
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut connect: Vec<u16> = self.egress_port.into_iter().collect();
        connect.extend(&self.agent_ports);
        let ip = if self.mode == AgentNetwork::None && self.agent_ports.is_empty() {
            "none"
        } else {
            "tcp"
        };
        Some(format!(
            "abi={};connect={};bind={};ip={ip}",
            self.abi,
            join(&connect),
            join(&self.agent_ports)
        ))
    }
}

/// The commands' domain, as the wrapper reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CommandsSpec {
    abi: i64,
    rules: NetRules,
    no_ip: bool,
}

fn parse_spec(value: &str) -> Option<CommandsSpec> {
    let mut fields = value.split(';');
    let mut field = |name: &str| fields.next()?.strip_prefix(name)?.strip_prefix('=');
    let ports = |s: &str| -> Option<Vec<u16>> {
        s.split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.parse().ok())
            .collect()
    };
    let abi = field("abi")?.parse().ok()?;
    let connect = ports(field("connect")?)?;
    let bind = ports(field("bind")?)?;
    let no_ip = match field("ip")? {
        "none" => true,
        "tcp" => false,
        _ => return None,
    };
    Some(CommandsSpec {
        abi,
        rules: NetRules { connect, bind },
        no_ip,
    })
}

/// In the shell wrapper, before the real shell: the agent's commands get the narrower domain
/// `spec` describes. Fails closed: a spec fro-bot did not write runs nothing.
pub fn narrow_commands(spec: &str) -> Result<(), NetworkError> {
    let parsed = parse(spec)?;
    set_no_new_privs().map_err(|source| NetworkError::Ruleset { source })?;
    let ruleset = parsed
        .rules
        .create(parsed.abi)
        .map_err(|source| NetworkError::Ruleset { source })?;
    landlock::restrict(ruleset.as_raw_fd()).map_err(|source| NetworkError::Ruleset { source })?;
    if parsed.no_ip {
        Filter::no_ip()?
            .install()
            .map_err(|source| NetworkError::Ruleset { source })?;
    }
    Ok(())
}

fn parse(spec: &str) -> Result<CommandsSpec, NetworkError> {
    parse_spec(spec).ok_or_else(|| NetworkError::Spec {
        value: spec.chars().take(200).collect(),
    })
}

fn set_no_new_privs() -> std::io::Result<()> {
    // SAFETY: a plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The agent's commands' whole domain where nothing is inherited from OpenCode (the sibling
/// container's exec relay, `super::sibling::relay`): OpenCode's filter and the commands'
/// narrower rules, made before `fork` and entered by [`CommandsEnforcement::apply`].
#[derive(Debug)]
pub struct CommandsEnforcement {
    ruleset: OwnedFd,
    agent: Filter,
    no_ip: Option<Filter>,
}

impl CommandsEnforcement {
    pub fn from_spec(spec: &str) -> Result<CommandsEnforcement, NetworkError> {
        let parsed = parse(spec)?;
        let ruleset = parsed
            .rules
            .create(parsed.abi)
            .map_err(|source| NetworkError::Ruleset { source })?;
        Ok(CommandsEnforcement {
            ruleset,
            agent: Filter::agent()?,
            no_ip: if parsed.no_ip {
                Some(Filter::no_ip()?)
            } else {
                None
            },
        })
    }

    /// Between `fork` and `exec`, as the agent's uid; async-signal-safe (system calls only).
    pub fn apply(&self) -> std::io::Result<()> {
        set_no_new_privs()?;
        landlock::restrict(self.ruleset.as_raw_fd())?;
        self.agent.install()?;
        match &self.no_ip {
            Some(f) => f.install(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(mode: AgentNetwork, agent_ports: Vec<u16>) -> NetworkPlan {
        NetworkPlan {
            mode,
            abi: 7,
            key_proxy_port: Some(1001),
            egress_port: (mode == AgentNetwork::Allowlist).then_some(1002),
            agent_ports,
        }
    }

    #[test]
    fn opencode_reaches_its_proxies_and_server_and_commands_only_the_egress_proxy() {
        let p = plan(AgentNetwork::Allowlist, vec![3000]);
        assert_eq!(
            p.opencode_rules(4096),
            NetRules {
                connect: vec![1001, 1002, 4096, 3000],
                bind: vec![4096, 3000]
            }
        );
        let spec = p.commands_spec().unwrap();
        assert_eq!(spec, "abi=7;connect=1002,3000;bind=3000;ip=tcp");
        assert_eq!(
            parse_spec(&spec),
            Some(CommandsSpec {
                abi: 7,
                rules: NetRules {
                    connect: vec![1002, 3000],
                    bind: vec![3000]
                },
                no_ip: false
            })
        );
    }

    #[test]
    fn none_gives_commands_no_ip_socket_and_open_enforces_nothing() {
        let none = plan(AgentNetwork::None, vec![]);
        assert_eq!(
            none.commands_spec().as_deref(),
            Some("abi=7;connect=;bind=;ip=none")
        );
        assert_eq!(none.opencode_rules(4096).connect, vec![1001, 4096]);
        let open = plan(AgentNetwork::Open, vec![]);
        assert_eq!(open.commands_spec(), None);
        assert!(open.for_server(4096).unwrap().is_none());
    }

    #[test]
    fn a_spec_fro_bot_did_not_write_is_refused() {
        for bad in [
            "",
            "abi=7",
            "abi=x;connect=;bind=;ip=none",
            "abi=7;connect=1;bind=;ip=udp",
            "abi=7;connect=99999;bind=;ip=tcp",
        ] {
            assert_eq!(parse_spec(bad), None, "{bad}");
        }
    }
}
