//! Benchmark: what the agent's network costs (docs/benchmarks.md#the-agents-network).
//!
//! 1. A download through the egress proxy's `CONNECT` tunnel against the same download straight
//!    from the server, both with curl on loopback, alternating (`FRO_BOT_BENCH_MB`, default 100;
//!    `FRO_BOT_BENCH_RUNS`, default 5). Target: the tunnel at ≥ 0.9× the direct rate.
//! 2. The enforcement's cost at a process start: a confined `/bin/true` (the Landlock ruleset and
//!    the filter built, then entered between fork and exec, as OpenCode's start does) against the
//!    same spawn unconfined; and a command run through the shell wrapper with and without the
//!    commands' spec (`FRO_BOT_BENCH_SPAWNS`, default 200). Target: at most 20 ms at the agent's
//!    start, nothing measurable per command.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use fro_bot::confine::network::NetworkPlan;
use fro_bot::confine::AgentUser;
use fro_bot::egress::runner_proxy::RunnerProxy;
use fro_bot::egress::{AgentNetwork, Allowlist, EgressProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Serves `mb` MiB of zeros to every request.
async fn server(mb: usize) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let len = mb * 1024 * 1024;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![0u8; 256 * 1024];
                let mut left = len;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    port
}

/// One curl download; its wall time.
async fn download(url: &str, proxy: Option<&str>) -> Duration {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "-o", "/dev/null", "--noproxy", ""]);
    if let Some(p) = proxy {
        cmd.args(["-p", "-x", p]);
    }
    let t = Instant::now();
    let st = cmd.arg(url).status().await.expect("curl runs");
    assert!(st.success(), "curl failed");
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn tunnel_bench() {
    let mb = env_num("FRO_BOT_BENCH_MB", 100);
    let runs = env_num("FRO_BOT_BENCH_RUNS", 5);
    let port = server(mb).await;
    let list = Allowlist::parse(&format!("localhost:{port}")).expect("list");
    let proxy = EgressProxy::start(list, RunnerProxy::default())
        .await
        .expect("proxy");
    let url = format!("http://localhost:{port}/");
    // A reference where installed: socat, a plain TCP forwarder (no HTTP, no checks), shows what
    // one more hop costs on this machine.
    let forwarder = socat(port);
    // The agent's container's way to the same proxy: its relay's loopback port forwarded to the
    // proxy's Unix socket (`confine::sibling::relay`), where this runs as root.
    let relay = sibling_relay(&proxy);
    let (mut direct, mut tunnel, mut forwarded) = (Vec::new(), Vec::new(), Vec::new());
    let mut relayed = Vec::new();
    for _ in 0..runs {
        direct.push(download(&url, None).await);
        tunnel.push(download(&url, Some(&proxy.url())).await);
        if let Some((_, p)) = &forwarder {
            forwarded.push(download(&format!("http://localhost:{p}/"), None).await);
        }
        if let Some((_, port)) = &relay {
            relayed.push(download(&url, Some(&format!("http://127.0.0.1:{port}"))).await);
        }
    }
    let rate = |d: Duration| mb as f64 / d.as_secs_f64();
    let (d, t) = (median(direct), median(tunnel));
    println!("download of {mb} MiB over loopback, median of {runs} (alternating)");
    println!("| path | median | MiB/s |");
    println!("|---|---|---|");
    println!(
        "| curl direct (baseline) | {:.3} s | {:.0} |",
        d.as_secs_f64(),
        rate(d)
    );
    println!(
        "| curl through the CONNECT tunnel | {:.3} s | {:.0} |",
        t.as_secs_f64(),
        rate(t)
    );
    if !forwarded.is_empty() {
        let f = median(forwarded);
        println!(
            "| curl through socat, a plain TCP forwarder (reference) | {:.3} s | {:.0} |",
            f.as_secs_f64(),
            rate(f)
        );
        println!("ratio socat/direct rate: {:.2}", rate(f) / rate(d));
    }
    if !relayed.is_empty() {
        let r = median(relayed);
        println!(
            "| curl through the agent's container's relay and the CONNECT tunnel | {:.3} s | {:.0} |",
            r.as_secs_f64(),
            rate(r)
        );
        println!("ratio relayed tunnel/direct rate: {:.2}", rate(r) / rate(d));
    }
    drop(relay);
    if let Some((mut child, _)) = forwarder {
        let _ = child.kill();
        let _ = child.wait();
    }
    println!(
        "ratio tunnel/direct rate: {:.2} (target ≥ 0.90)",
        rate(t) / rate(d)
    );
}

/// A relay of the agent's container, run here (root only): its loopback port forwards to the
/// proxy's Unix socket. With the port it forwards.
fn sibling_relay(proxy: &EgressProxy) -> Option<(support::relay::Relay, u16)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .ok()?
        .port();
    let relay = support::relay::Relay::start(65534, Some(port))?;
    proxy.listen_unix(&relay.egress()).ok()?;
    Some((relay, port))
}

/// `socat` forwarding a free port to `port`, when installed.
fn socat(port: u16) -> Option<(std::process::Child, u16)> {
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = std::process::Command::new("socat")
        .arg(format!("TCP-LISTEN:{free},bind=127.0.0.1,reuseaddr,fork"))
        .arg(format!("TCP:127.0.0.1:{port}"))
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(300));
    Some((child, free))
}

async fn spawn_once(
    plan: Option<&NetworkPlan>,
    program: &str,
    args: &[&str],
    spec: Option<&str>,
) -> Duration {
    let t = Instant::now();
    let enforcement = plan.map(|p| p.for_server(4096).expect("ruleset").expect("enforced"));
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args);
    if let Some(s) = spec {
        cmd.env(fro_bot::runner::env::FRO_BOT_AGENT_NETWORK, s);
    }
    // SAFETY: geteuid cannot fail.
    let user = AgentUser::Current {
        uid: unsafe { libc::geteuid() },
    };
    user.confine_opencode(&mut cmd, None, enforcement);
    let st = cmd.status().await.expect("spawn");
    assert!(st.success());
    t.elapsed()
}

async fn start_bench() {
    let spawns = env_num("FRO_BOT_BENCH_SPAWNS", 200);
    let abi = match fro_bot::confine::landlock::support(None) {
        fro_bot::confine::landlock::Support::Abi(v) => v,
        other => panic!("no Landlock: {}", other.describe()),
    };
    let plan = NetworkPlan {
        mode: AgentNetwork::Allowlist,
        abi,
        key_proxy_port: Some(40001),
        egress_port: Some(40002),
        agent_ports: vec![],
    };
    let spec = plan.commands_spec().expect("spec");
    let exe = env!("CARGO_BIN_EXE_fro-bot");
    let wrapper = ["--agent-shell=/bin/true", "/wrapper"];
    let (mut bare, mut confined, mut cmd_bare, mut cmd_narrowed) = (vec![], vec![], vec![], vec![]);
    for _ in 0..spawns {
        bare.push(spawn_once(None, "/bin/true", &[], None).await);
        confined.push(spawn_once(Some(&plan), "/bin/true", &[], None).await);
        cmd_bare.push(spawn_once(Some(&plan), exe, &wrapper, None).await);
        cmd_narrowed.push(spawn_once(Some(&plan), exe, &wrapper, Some(&spec)).await);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (b, c, wb, wn) = (
        median(bare),
        median(confined),
        median(cmd_bare),
        median(cmd_narrowed),
    );
    println!("\nprocess starts, median of {spawns} (alternating)");
    println!("| start | median |");
    println!("|---|---|");
    println!("| /bin/true, unconfined (baseline) | {:.2} ms |", ms(b));
    println!(
        "| /bin/true, in the agent's Landlock domain and filter (OpenCode's start) | {:.2} ms |",
        ms(c)
    );
    println!(
        "| a command through the shell wrapper, no spec (baseline) | {:.2} ms |",
        ms(wb)
    );
    println!(
        "| a command through the shell wrapper, narrowed (each agent command) | {:.2} ms |",
        ms(wn)
    );
    println!(
        "added at the agent's start: {:.2} ms (target ≤ 20); per command: {:.2} ms",
        ms(c) - ms(b),
        ms(wn) - ms(wb)
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        tunnel_bench().await;
        start_bench().await;
    });
}
