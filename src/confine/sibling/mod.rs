//! The agent's commands in a container with no network (docs/security.md#the-agents-network):
//! a sibling of fro-bot's own container, started through the Docker socket the runner mounts,
//! from the same image, with `--network none`. OpenCode stays beside fro-bot; only what the agent
//! runs moves there: its shell wrapper hands each command to the sibling's exec relay
//! ([`shell`], [`wire`], [`relay`]), and the egress proxy is the only way out, over a Unix
//! socket. [`Sibling`] is fro-bot's handle: started before OpenCode, removed when the turn ends;
//! its lifeline connection ends the sibling if fro-bot dies; post removes one a killed main left.

pub mod docker;
pub mod reaper;
pub mod relay;
pub mod shell;
pub mod spec;
pub mod wire;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use docker::{Docker, DockerError};
use relay::RelayConfig;

use crate::confine::memory_group::MEMORY_GID;
use crate::confine::DOCKER_SOCKET;

/// The relay's exec socket, in the sibling's directory.
pub const EXEC_SOCKET: &str = "exec.sock";
/// fro-bot's lifeline to the relay.
pub const CTL_SOCKET: &str = "ctl.sock";
/// The egress proxy's Unix socket, which the relay forwards the sibling's loopback port to.
pub const EGRESS_SOCKET: &str = "egress.sock";

/// How long the relay gets to listen after its container started.
const READY_WAIT: Duration = Duration::from_secs(15);

/// `agent-isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentIsolation {
    /// The sibling container where the Docker socket works, else the process rules.
    #[default]
    Auto,
    /// The sibling container, or the run fails before the agent starts.
    Container,
    /// The process rules only (Landlock and seccomp in fro-bot's container): port-based.
    Process,
}

impl AgentIsolation {
    pub const CHOICES: [(&'static str, AgentIsolation); 3] = [
        ("auto", AgentIsolation::Auto),
        ("container", AgentIsolation::Container),
        ("process", AgentIsolation::Process),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentIsolation::Auto => "auto",
            AgentIsolation::Container => "container",
            AgentIsolation::Process => "process",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SiblingError {
    #[error("no Docker socket at {DOCKER_SOCKET}")]
    NoSocket,
    #[error(
        "fro-bot is not running in a container the engine knows (no container id in its mounts)"
    )]
    NotInContainer,
    #[error("{why}")]
    Unsupported { why: String },
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Spec(#[from] spec::SpecError),
    #[error("cannot make the sibling's socket directory")]
    Dir {
        #[source]
        source: std::io::Error,
    },
    #[error("the sibling's relay did not listen within {}s", READY_WAIT.as_secs())]
    NotReady,
}

/// What the sibling runs the agent's commands as, and their network.
#[derive(Debug, Clone)]
pub struct SiblingPlan {
    pub uid: u32,
    pub gid: u32,
    /// `NetworkPlan::commands_spec`.
    pub spec: String,
    pub proxy_port: Option<u16>,
    /// fro-bot's own binary in the image: the relay.
    pub exe: PathBuf,
}

/// A running sibling. Dropped, its lifeline closes and the relay ends it; [`Sibling::remove`]
/// also waits until the engine removed it.
#[derive(Debug)]
pub struct Sibling {
    id: String,
    docker: Docker,
    dir: tempfile::TempDir,
    lifeline: Mutex<Option<UnixStream>>,
    /// How long its start took (the turn's added cost).
    pub started_in: Duration,
}

impl Sibling {
    /// Makes the socket directory and starts the sibling of container `own_id` (from
    /// [`own_container`]); `on_created` gets its id before it starts (main records it for post).
    pub async fn start(
        own_id: &str,
        plan: &SiblingPlan,
        on_created: impl FnOnce(&str),
    ) -> Result<Sibling, SiblingError> {
        let began = Instant::now();
        let docker = Docker::new(Path::new(DOCKER_SOCKET));
        let own = docker.inspect(own_id).await?;
        let dir = socket_dir()?;
        let relay = RelayConfig {
            dir: dir.path().to_path_buf(),
            uid: plan.uid,
            gid: plan.gid,
            proxy_port: plan.proxy_port,
            spec: plan.spec.clone(),
        };
        let body = spec::create_body(&own, &plan.exe.to_string_lossy(), &relay)?;
        let name = format!(
            "fro-bot-agent-{}-{:08x}",
            &own_id[..12],
            rand::random::<u32>()
        );
        let id = docker.create(&name, &body).await?;
        on_created(&id);
        let mut sibling = Sibling {
            id,
            docker,
            dir,
            lifeline: Mutex::new(None),
            started_in: Duration::ZERO,
        };
        if let Err(e) = sibling.docker.start(&sibling.id).await {
            let _ = sibling.remove().await;
            return Err(e.into());
        }
        let lifeline = match wait_ready(&sibling.dir.path().join(CTL_SOCKET)).await {
            Ok(l) => l,
            Err(e) => {
                let _ = sibling.remove().await;
                return Err(e);
            }
        };
        sibling.lifeline = Mutex::new(Some(lifeline));
        sibling.started_in = began.elapsed();
        Ok(sibling)
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where the shell wrapper hands commands.
    pub fn exec_socket(&self) -> PathBuf {
        self.dir.path().join(EXEC_SOCKET)
    }

    /// Where the egress proxy listens for the sibling.
    pub fn egress_socket(&self) -> PathBuf {
        self.dir.path().join(EGRESS_SOCKET)
    }

    /// Ends every process of the sibling and waits until the engine removed it. Whether it was
    /// still there.
    pub async fn remove(&self) -> Result<bool, DockerError> {
        self.cut_lifeline();
        self.docker.remove(&self.id).await
    }

    fn cut_lifeline(&self) {
        let mut held = self.lifeline.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = held.take() {
            let _ = l.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Sibling {
    fn drop(&mut self) {
        self.cut_lifeline();
    }
}

/// fro-bot's own container's id, when a sibling could be started beside it: the Docker socket is
/// there and fro-bot runs in a container the engine made.
pub fn own_container() -> Result<String, SiblingError> {
    if !Path::new(DOCKER_SOCKET).exists() {
        return Err(SiblingError::NoSocket);
    }
    docker::own_container_id().ok_or(SiblingError::NotInContainer)
}

/// Post: removes the sibling a killed main recorded. Whether one was still there.
pub async fn remove_recorded(id: &str) -> Result<bool, DockerError> {
    Docker::new(Path::new(DOCKER_SOCKET)).remove(id).await
}

/// The directory both containers see (under fro-bot's `/tmp`, which the sibling mounts), setgid
/// to the memory group and only that group's to enter: the sockets made in it are the group's.
fn socket_dir() -> Result<tempfile::TempDir, SiblingError> {
    let dir = tempfile::Builder::new()
        .prefix("fro-bot-sibling-")
        .tempdir_in("/tmp")
        .map_err(|source| SiblingError::Dir { source })?;
    std::os::unix::fs::chown(dir.path(), Some(0), Some(MEMORY_GID))
        .and_then(|()| {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o2710))
        })
        .map_err(|source| SiblingError::Dir { source })?;
    Ok(dir)
}

async fn wait_ready(ctl: &Path) -> Result<UnixStream, SiblingError> {
    let deadline = Instant::now() + READY_WAIT;
    loop {
        if let Ok(s) = UnixStream::connect(ctl) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            return Err(SiblingError::NotReady);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
