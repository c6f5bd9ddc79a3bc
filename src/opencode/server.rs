//! The `opencode serve` child process: start, readiness, and a shutdown that reports whether the
//! server demonstrably stopped writing (process exited and its port refuses connections).
//!
//! The port is chosen before the spawn (bind 127.0.0.1:0, release, pass `--port N`) instead of
//! `--port 0`: the session-tools MCP entry in the config must carry the server's URL, and the config
//! is fixed when the process starts. (OpenCode starts MCP servers lazily, at the first prompt, but
//! reads the config from its environment at start.) If another process takes the port in between,
//! OpenCode exits at once ("explicit busy port exits 1") and the start is retried on a new port.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::confine::watchdog::Watchdog;
use crate::confine::AgentUser;
use crate::runner::env;
use crate::runner::log;
use crate::runner::{failpoint, Cancellation};

const READY_LINE: &str = "opencode server listening on http://";
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(60);
pub const SHUTDOWN_BUDGET: Duration = Duration::from_secs(5);
const PORT_ATTEMPTS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot start {}", bin.display())]
    Spawn {
        bin: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the OpenCode log file {}", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no free local port for the OpenCode server")]
    Port {
        #[source]
        source: std::io::Error,
    },
    #[error("OpenCode exited before it was ready ({status}); see {}", log.display())]
    ExitedEarly { status: String, log: PathBuf },
    #[error("OpenCode was not ready within {}s; see {}", deadline.as_secs(), log.display())]
    NotReady { deadline: Duration, log: PathBuf },
    /// The run was cancelled while OpenCode started: it was killed before it was ready.
    #[error("the run was cancelled while OpenCode started; it was stopped")]
    Cancelled,
    #[error("cannot enforce the agent's network")]
    Network {
        #[source]
        source: crate::confine::network::NetworkError,
    },
}

/// Everything the server process gets. `env` is the complete environment apart from what the server
/// module adds itself (password, config, auth): build it with [`crate::confine::env::agent_env`].
#[derive(Clone)]
pub struct ServerOptions {
    pub bin: PathBuf,
    /// The server's working directory (the workspace).
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    /// Builds `OPENCODE_CONFIG_CONTENT` once the URL and password are known.
    pub config: ConfigFn,
    pub auth_content: Option<String>,
    /// stdout and stderr of the child are appended here.
    pub log_file: PathBuf,
    pub startup_deadline: Duration,
    /// Who the process runs as (`crate::confine`).
    pub user: AgentUser,
    /// Its effective gid, when the memory dir is held by the memory group for the turn
    /// (`crate::confine::memory_group`).
    pub memory_group: Option<u32>,
    /// A signal during the start stops it: the run has no turn left to take.
    pub cancel: Cancellation,
    /// fro-bot's own binary, to run as the server's watchdog (`crate::confine::watchdog`); `None`
    /// leaves only `kill_on_drop` and the parent-death signal.
    pub watchdog: Option<PathBuf>,
    /// The agent's network (`crate::confine::network`): its Landlock domain names the server's
    /// port, so it is made for each port tried. `None`: nothing enforced.
    pub network: Option<crate::confine::network::NetworkPlan>,
}

/// Makes the config for a server at `url` with `password`.
pub type ConfigFn = std::sync::Arc<dyn Fn(&str, &str) -> String + Send + Sync>;

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the env: it may hold provider keys.
        f.debug_struct("ServerOptions")
            .field("bin", &self.bin)
            .field("cwd", &self.cwd)
            .field("log_file", &self.log_file)
            .finish_non_exhaustive()
    }
}

/// Whether the server demonstrably stopped writing the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quiescence {
    Confirmed,
    Unconfirmed { reason: String },
}

pub struct Server {
    child: Option<Child>,
    watchdog: Option<Watchdog>,
    url: String,
    port: u16,
    password: String,
    log_file: PathBuf,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("url", &self.url)
            .field("pid", &self.pid())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Starts `opencode serve` and waits until it answers `/global/health`.
    pub async fn start(opts: &ServerOptions) -> Result<Server, ServerError> {
        let password = random_password();
        log::add_mask(&password);
        let started = Instant::now();
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            if opts.cancel.is_cancelled() {
                return Err(ServerError::Cancelled);
            }
            let port = free_port().map_err(|source| ServerError::Port { source })?;
            match Self::start_on(opts, port, &password, started).await {
                Ok(server) => return Ok(server),
                // A lost race for the port: try another one.
                Err(e @ ServerError::ExitedEarly { .. }) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or(ServerError::NotReady {
            deadline: opts.startup_deadline,
            log: opts.log_file.clone(),
        }))
    }

    async fn start_on(
        opts: &ServerOptions,
        port: u16,
        password: &str,
        started: Instant,
    ) -> Result<Server, ServerError> {
        let url = format!("http://127.0.0.1:{port}");
        let log_file = open_log(opts).await?;
        let mut watchdog = start_watchdog(opts);
        let mut child = spawn(opts, port, &url, password)?;
        if let (Some(dog), Some(pid)) = (&mut watchdog, child.id()) {
            if let Err(e) = dog.guard(pid) {
                tracing::warn!("the OpenCode watchdog is gone ({e}): a kill of fro-bot may leave OpenCode running");
            }
        }
        let mut stdout_lines = copy_output(&mut child, log_file);
        let deadline = started + opts.startup_deadline;
        failpoint::pause("opencode:starting", &opts.cancel).await;
        let ready = async {
            wait_for_ready_line(opts, &mut child, &mut stdout_lines, deadline).await?;
            wait_for_health(opts, &mut child, &url, password, deadline).await
        };
        let cancelled = tokio::select! {
            // A signal that came first wins over a ready line already read.
            biased;
            () = opts.cancel.cancelled() => true,
            ready = ready => {
                ready?;
                false
            }
        };
        if cancelled {
            if let (true, Some(dog)) = (stop_unready(&mut child).await, watchdog) {
                dog.release().await;
            }
            return Err(ServerError::Cancelled);
        }
        Ok(Server {
            child: Some(child),
            watchdog,
            url,
            port,
            password: password.to_string(),
            log_file: opts.log_file.clone(),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The random HTTP Basic password (user `opencode`); masked in logs.
    pub fn password(&self) -> &str {
        &self.password
    }

    pub fn log_file(&self) -> &std::path::Path {
        &self.log_file
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// SIGTERM, then wait for the exit and for the port to refuse connections, within `budget`
    /// (at most 5 s is sensible). SIGKILL when the budget runs out; quiescence is then unconfirmed.
    pub async fn shutdown(&mut self, budget: Duration) -> Quiescence {
        let Some(mut child) = self.child.take() else {
            return Quiescence::Confirmed;
        };
        let deadline = Instant::now() + budget;
        if let Err(unconfirmed) = terminate(&mut child, budget, deadline).await {
            return unconfirmed;
        }
        // Reaped: the watchdog has nothing left to kill should fro-bot die now.
        if let Some(dog) = self.watchdog.take() {
            dog.release().await;
        }
        port_refused(self.port, deadline).await
    }
}

/// SIGTERM to the server, then its exit awaited until `deadline`, else SIGKILL. Killed and
/// reaped, a process writes nothing more (and SQLite's WAL is crash-safe); only one we cannot see
/// exit leaves quiescence unconfirmed.
async fn terminate(
    child: &mut Child,
    budget: Duration,
    deadline: Instant,
) -> Result<(), Quiescence> {
    // `None` = already reaped: nothing to signal.
    if let Some(pid) = child.id() {
        // SAFETY: a plain syscall. The pid is our direct child's and not yet reaped
        // (`id()` returned Some), so it cannot have been reused by another process.
        let rc = unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        if rc != 0 {
            let _ = child.start_kill();
        }
    }
    let exited = tokio::time::timeout(
        deadline.saturating_duration_since(Instant::now()),
        child.wait(),
    )
    .await;
    let waited = match exited {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => {
            let _ = child.start_kill();
            return Err(Quiescence::Unconfirmed {
                reason: format!("cannot wait for the OpenCode process: {e}"),
            });
        }
        Err(_) => {
            let _ = child.start_kill();
            tokio::time::timeout(Duration::from_secs(2), child.wait()).await
        }
    };
    match waited {
        Ok(Ok(_)) => {
            tracing::warn!(
                "OpenCode did not exit within {} ms of SIGTERM; killed it",
                budget.as_millis()
            );
            Ok(())
        }
        _ => Err(Quiescence::Unconfirmed {
            reason: format!(
                "OpenCode did not exit within {} ms of SIGTERM, nor after SIGKILL",
                budget.as_millis()
            ),
        }),
    }
}

/// After the exit: confirmed once the server's `port` refuses connections, unconfirmed if it
/// still accepts them at `deadline`.
async fn port_refused(port: u16, deadline: Instant) -> Quiescence {
    loop {
        let refused = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(("127.0.0.1", port)),
        )
        .await;
        if matches!(refused, Ok(Err(_))) {
            return Quiescence::Confirmed;
        }
        if Instant::now() >= deadline {
            return Quiescence::Unconfirmed {
                reason: format!(
                    "the OpenCode process exited but port {port} still accepts connections"
                ),
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server that is not ready holds nothing worth a graceful stop: killed and reaped, so nothing
/// of it writes the database after the start returns. Whether it was reaped.
async fn stop_unready(child: &mut Child) -> bool {
    let _ = child.start_kill();
    if tokio::time::timeout(Duration::from_secs(2), child.wait())
        .await
        .is_err()
    {
        tracing::warn!("OpenCode did not exit within 2 s of SIGKILL");
        return false;
    }
    true
}

/// The server's watchdog, started before the server. Without one (no binary given, or it cannot
/// start) the run goes on: only a SIGKILL of fro-bot would then leave OpenCode behind.
fn start_watchdog(opts: &ServerOptions) -> Option<Watchdog> {
    let exe = opts.watchdog.as_ref()?;
    Watchdog::start(exe)
        .inspect_err(|e| {
            tracing::warn!(
                "cannot start the OpenCode watchdog {} {}: {e}; a kill of fro-bot may leave OpenCode running",
                exe.display(),
                crate::confine::watchdog::SUBCOMMAND
            )
        })
        .ok()
}

fn not_ready(opts: &ServerOptions) -> ServerError {
    ServerError::NotReady {
        deadline: opts.startup_deadline,
        log: opts.log_file.clone(),
    }
}

/// Opens the server's log file for appending, creating its directory.
async fn open_log(opts: &ServerOptions) -> Result<tokio::fs::File, ServerError> {
    if let Some(dir) = opts.log_file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&opts.log_file)
        .await
        .map_err(|source| ServerError::Log {
            path: opts.log_file.clone(),
            source,
        })
}

/// Spawns `opencode serve` on `port`, stdout and stderr piped.
fn spawn(opts: &ServerOptions, port: u16, url: &str, password: &str) -> Result<Child, ServerError> {
    let mut cmd = Command::new(&opts.bin);
    cmd.args([
        "serve",
        "--hostname",
        "127.0.0.1",
        "--port",
        &port.to_string(),
    ])
    .current_dir(&opts.cwd)
    .env_clear()
    .envs(opts.env.iter().map(|(k, v)| (k, v)))
    .env(env::OPENCODE_SERVER_PASSWORD, password)
    .env(env::OPENCODE_CONFIG_CONTENT, (opts.config)(url, password))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    // The child must never outlive fro-bot: killed when the handle drops.
    .kill_on_drop(true);
    // ...and not even when fro-bot is killed outright (SIGKILL skips destructors): its watchdog
    // kills the child's group then (`crate::confine::watchdog`). Without the memory group the
    // parent-death signal, set by `confine` after the uid switch, does so as well.
    let network = match &opts.network {
        Some(plan) => plan
            .for_server(port)
            .map_err(|source| ServerError::Network { source })?,
        None => None,
    };
    opts.user
        .confine_opencode(&mut cmd, opts.memory_group, network);
    if let Some(auth) = &opts.auth_content {
        cmd.env(env::OPENCODE_AUTH_CONTENT, auth);
    }
    cmd.spawn().map_err(|source| ServerError::Spawn {
        bin: opts.bin.clone(),
        source,
    })
}

/// Copies the child's stdout and stderr (redacted) to `log_file`, in background tasks. Returns
/// the stdout lines, to watch for the ready line.
fn copy_output(
    child: &mut Child,
    mut log_file: tokio::fs::File,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (line_tx, line_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (log_tx, mut log_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    if let Some(out) = child.stdout.take() {
        let (line_tx, log_tx) = (line_tx.clone(), log_tx.clone());
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                let _ = line_tx.send(l.clone());
                let _ = log_tx.send(l);
            }
        });
    }
    drop(line_tx);
    if let Some(err) = child.stderr.take() {
        let log_tx = log_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                let _ = log_tx.send(l);
            }
        });
    }
    drop(log_tx);
    tokio::spawn(async move {
        while let Some(l) = log_rx.recv().await {
            let l = log::redact(&l);
            if log_file
                .write_all(format!("{l}\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
        let _ = log_file.flush().await;
    });
    line_rx
}

/// Readiness, step 1: waits for OpenCode's "listening" line on stdout.
async fn wait_for_ready_line(
    opts: &ServerOptions,
    child: &mut Child,
    stdout_lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    deadline: Instant,
) -> Result<(), ServerError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(not_ready(opts));
        }
        tokio::select! {
            line = stdout_lines.recv() => match line {
                Some(l) if l.contains(READY_LINE) => return Ok(()),
                Some(_) => continue,
                None => {
                    // stdout closed: the process is gone (or going).
                    let status = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
                    return Err(ServerError::ExitedEarly {
                        status: match status {
                            Ok(Ok(s)) => s.to_string(),
                            _ => "stdout closed".into(),
                        },
                        log: opts.log_file.clone(),
                    });
                }
            },
            status = child.wait() => {
                return Err(ServerError::ExitedEarly {
                    status: status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()),
                    log: opts.log_file.clone(),
                });
            }
            _ = tokio::time::sleep(left) => return Err(not_ready(opts)),
        }
    }
}

/// Readiness, step 2: polls `/global/health` until it reports healthy. Short per-request
/// timeouts: requests sent just after the port opens can hang forever, so each attempt is
/// abandoned after 0.5 s and retried.
async fn wait_for_health(
    opts: &ServerOptions,
    child: &mut Child,
    url: &str,
    password: &str,
    deadline: Instant,
) -> Result<(), ServerError> {
    let http = crate::net::loopback()
        .timeout(Duration::from_millis(500))
        .build()
        .map_err(|_| not_ready(opts))?;
    loop {
        if Instant::now() >= deadline {
            return Err(not_ready(opts));
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(ServerError::ExitedEarly {
                status: status.to_string(),
                log: opts.log_file.clone(),
            });
        }
        let ok = http
            .get(format!("{url}/global/health"))
            .basic_auth("opencode", Some(password))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success());
        if let Some(resp) = ok {
            if let Ok(v) = resp.json::<serde_json::Value>().await {
                if v["healthy"] == true {
                    return Ok(());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn random_password() -> String {
    let mut rng = rand::rng();
    (0..32)
        .map(|_| {
            let i = rng.random_range(0..62u8);
            (match i {
                0..=9 => b'0' + i,
                10..=35 => b'a' + i - 10,
                _ => b'A' + i - 36,
            }) as char
        })
        .collect()
}

fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script_options(dir: &std::path::Path, body: &str, deadline: Duration) -> ServerOptions {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join("opencode");
        std::fs::write(&bin, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        ServerOptions {
            bin,
            cwd: dir.to_path_buf(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            config: std::sync::Arc::new(|_, _| "{}".to_string()),
            auth_content: None,
            log_file: dir.join("log/opencode.log"),
            startup_deadline: deadline,
            user: AgentUser::Current { uid: 0 },
            memory_group: None,
            cancel: Cancellation::new(),
            watchdog: None,
            network: None,
        }
    }

    #[tokio::test]
    async fn a_server_that_dies_or_never_gets_ready_is_an_error_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let opts = script_options(
            dir.path(),
            "echo \"port $5 in use\" >&2; exit 1",
            Duration::from_secs(20),
        );
        let err = Server::start(&opts).await.unwrap_err();
        assert!(matches!(err, ServerError::ExitedEarly { .. }), "{err:?}");
        let log = std::fs::read_to_string(&opts.log_file).unwrap();
        // Retried on fresh ports (the last attempt's log copy may still be in flight).
        assert!(log.matches("in use").count() >= 2, "{log}");

        let opts = script_options(
            dir.path(),
            "echo starting; exec sleep 30",
            Duration::from_millis(700),
        );
        let t0 = Instant::now();
        let err = Server::start(&opts).await.unwrap_err();
        assert!(matches!(err, ServerError::NotReady { .. }), "{err:?}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_signal_while_the_server_starts_stops_it_at_once_and_reaps_it() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // Never ready: only the signal can end the start before its 60 s deadline.
        let mut opts = script_options(
            dir.path(),
            &format!("echo $$ > {}; exec sleep 60", pid_file.display()),
            Duration::from_secs(60),
        );
        let cancel = Cancellation::new();
        opts.cancel = cancel.clone();
        let signal = async {
            while !pid_file.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            cancel.cancel_with(crate::runner::cancel::Signal::Terminate, Instant::now());
        };
        let (started, ()) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(30), Server::start(&opts)),
            signal
        );
        let err = started
            .expect("the start ended long before its deadline")
            .unwrap_err();
        assert!(matches!(err, ServerError::Cancelled), "{err:?}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Reaped, not a zombie: no process has that pid any more.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn passwords_are_random_and_long() {
        let a = random_password();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, random_password());
    }
}
