//! The agent's network without OpenCode (docs/security.md#the-agents-network): fro-bot's egress
//! proxy served in-process and driven by curl, and the kernel's rules on plain processes spawned
//! the way OpenCode is (`AgentUser::confine_opencode`) and the way its shell wrapper runs the
//! agent's commands (`fro-bot --agent-shell=`). The whole runs, through OpenCode and from the
//! image, are `e2e::egress`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fro_bot::confine::network::NetworkPlan;
use fro_bot::confine::AgentUser;
use fro_bot::egress::runner_proxy::RunnerProxy;
use fro_bot::egress::{AgentNetwork, Allowlist, EgressProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// curl through `proxy` (`-p`: a CONNECT tunnel even for http://); stdout and stderr together.
async fn curl(proxy: &str, tunnel: bool, url: &str) -> String {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-x", proxy]);
    if tunnel {
        cmd.arg("-p");
    }
    let out = cmd
        .arg(url)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .await
        .expect("curl is installed (the suite's prerequisite)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn the_egress_proxy_carries_listed_hosts_and_refuses_the_rest_with_the_reason() {
    let port = crate::support::web::serve("hello-from-a-listed-host").await;
    let listed = Allowlist::parse(&format!("localhost:{port}")).unwrap();
    let proxy = EgressProxy::start(listed, RunnerProxy::default())
        .await
        .unwrap();
    let url = proxy.url();
    for tunnel in [false, true] {
        let out = curl(&url, tunnel, &format!("http://localhost:{port}/")).await;
        assert_eq!(out, "hello-from-a-listed-host", "tunnel {tunnel}");
    }
    // The same server under a name nobody listed, or its address: refused, with the reason.
    let out = curl(&url, false, &format!("http://127.0.0.1:{port}/")).await;
    assert!(
        out.contains("403 fro-bot: host not on allowed-domains: 127.0.0.1:"),
        "{out}"
    );
    let out = curl(&url, true, "https://unlisted.example/").await;
    assert!(out.contains("CONNECT tunnel failed, response 403"), "{out}");
    let out = curl(&url, false, "http://169.254.169.254/latest/meta-data/").await;
    assert!(out.contains("host not on allowed-domains"), "{out}");
    let counts = proxy.counts();
    assert_eq!(counts.allowed_total, 2, "{counts:?}");
    assert_eq!(counts.refused_total, 3, "{counts:?}");
    assert_eq!(counts.allowed[&format!("localhost:{port}")], 2);
    assert!(
        counts.refused.contains_key("unlisted.example:443"),
        "{counts:?}"
    );
}

#[tokio::test]
async fn each_request_of_a_kept_alive_connection_is_checked_on_its_own() {
    let port = crate::support::web::serve("first").await;
    let listed = Allowlist::parse(&format!("localhost:{port}")).unwrap();
    let proxy = EgressProxy::start(listed, RunnerProxy::default())
        .await
        .unwrap();
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port()))
        .await
        .unwrap();
    let ask = |host: String| {
        format!(
            "GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\nProxy-Connection: keep-alive\r\n\r\n"
        )
    };
    s.write_all(ask(format!("localhost:{port}")).as_bytes())
        .await
        .unwrap();
    let first = read_response(&mut s).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    s.write_all(ask("unlisted.example".into()).as_bytes())
        .await
        .unwrap();
    let second = read_response(&mut s).await;
    assert!(
        second.starts_with("HTTP/1.1 403 fro-bot: host not on allowed-domains"),
        "{second}"
    );
}

/// One response: the head, then as many body bytes as `Content-Length` says.
async fn read_response(s: &mut tokio::net::TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "closed early");
        got.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&got).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    head + &String::from_utf8_lossy(&body)
}

#[tokio::test]
async fn a_pattern_never_leads_to_a_private_address_and_an_exact_name_may() {
    let port = crate::support::web::serve("internal").await;
    // Every name resolves to this machine, as a rebinding or a hostile DNS answer would make it.
    let resolve: fro_bot::egress::proxy::Resolver = Arc::new(|_, port| {
        Box::pin(async move {
            Ok(vec![
                SocketAddr::from(([169, 254, 169, 254], port)),
                SocketAddr::from(([127, 0, 0, 1], port)),
            ])
        })
    });
    let listed = Allowlist::parse(&format!("*.example.test:{port} api.corp.test:{port}")).unwrap();
    let proxy = EgressProxy::start_with(listed, RunnerProxy::default(), resolve)
        .await
        .unwrap();
    let out = curl(
        &proxy.url(),
        false,
        &format!("http://a.example.test:{port}/"),
    )
    .await;
    assert!(
        out.contains("403 fro-bot: address not allowed: a.example.test:")
            && out.contains("169.254.169.254, a link-local (cloud metadata) address"),
        "{out}"
    );
    let out = curl(&proxy.url(), true, &format!("http://api.corp.test:{port}/")).await;
    assert_eq!(
        out, "internal",
        "listed exactly: its loopback address is allowed"
    );
}

#[tokio::test]
async fn allowed_traffic_goes_on_through_the_runner_proxy() {
    let runner_proxy = crate::support::fake_runner_proxy::FakeRunnerProxy::start().await;
    let port = crate::support::web::serve("behind-the-corporate-proxy").await;
    let listed = Allowlist::parse(&format!("web.test:{port}")).unwrap();
    let env = fro_bot::runner::Env::from_pairs([
        ("HTTPS_PROXY", runner_proxy.url()),
        ("http_proxy", runner_proxy.url()),
    ]);
    let proxy = EgressProxy::start(listed, RunnerProxy::from_env(&env))
        .await
        .unwrap();
    // Only the runner proxy can resolve `web.test`.
    for tunnel in [true, false] {
        let out = curl(&proxy.url(), tunnel, &format!("http://web.test:{port}/")).await;
        assert_eq!(out, "behind-the-corporate-proxy", "tunnel {tunnel}");
    }
    let out = curl(&proxy.url(), true, "https://unlisted.test/").await;
    assert!(out.contains("response 403"), "{out}");
    assert_eq!(
        runner_proxy.count("web.test"),
        2,
        "{:?}",
        runner_proxy.summary()
    );
    assert_eq!(
        runner_proxy.count("unlisted.test"),
        0,
        "a refusal never leaves"
    );
}

/// What a process confined as OpenCode is (and, with `commands`, as the agent's commands are
/// under the shell wrapper) prints for `script`.
async fn confined(
    plan: Option<&NetworkPlan>,
    server_port: u16,
    commands: bool,
    script: &str,
) -> String {
    let enforcement = plan.map(|p| p.for_server(server_port).unwrap().expect("enforced"));
    let mut cmd = if commands {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_fro-bot"));
        // As the kernel runs the wrapper script: interpreter argument, script path, then `-c`.
        c.args(["--agent-shell=/bin/bash", "/wrapper", "-c", script]);
        if let Some(spec) = plan.and_then(NetworkPlan::commands_spec) {
            c.env(fro_bot::runner::env::FRO_BOT_AGENT_NETWORK, spec);
        }
        c
    } else {
        let mut c = tokio::process::Command::new("/bin/bash");
        c.args(["-c", script]);
        c
    };
    // SAFETY: geteuid cannot fail.
    let user = AgentUser::Current {
        uid: unsafe { libc::geteuid() },
    };
    user.confine_opencode(&mut cmd, None, enforcement);
    let out = cmd.output().await.unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn abi() -> i64 {
    match fro_bot::confine::landlock::support(None) {
        fro_bot::confine::landlock::Support::Abi(v) if v >= 4 => v,
        other => panic!(
            "the suite needs Landlock ABI 4 or later: {}",
            other.describe()
        ),
    }
}

/// Connects to each port with bash's `/dev/tcp`, then sends a UDP datagram: one line each.
fn probe(ports: &[u16], udp: u16) -> String {
    let mut s = String::new();
    for p in ports {
        s.push_str(&format!(
            "if (exec 3<>/dev/tcp/127.0.0.1/{p}) 2>/tmp/e.$$; then echo \"tcp {p} ok\"; \
             else echo \"tcp {p} $(sed 's/.*: //' /tmp/e.$$ | head -n1)\"; fi\n"
        ));
    }
    s.push_str(&format!(
        "if (echo leak >/dev/udp/127.0.0.1/{udp}) 2>/tmp/e.$$; then echo 'udp ok'; \
         else echo \"udp $(sed 's/.*: //' /tmp/e.$$ | head -n1)\"; fi; rm -f /tmp/e.$$\n"
    ));
    s
}

async fn listener() -> (tokio::net::TcpListener, u16) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let p = l.local_addr().unwrap().port();
    (l, p)
}

#[tokio::test]
async fn opencode_reaches_only_its_ports_and_the_agents_commands_fewer_with_no_udp() {
    let (_key, key) = listener().await;
    let (_egress, egress) = listener().await;
    let (_server, server) = listener().await;
    let (_other, other) = listener().await;
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let plan = NetworkPlan {
        mode: AgentNetwork::Allowlist,
        abi: abi(),
        key_proxy_port: Some(key),
        egress_port: Some(egress),
        agent_ports: vec![],
    };
    let script = probe(&[key, egress, server, other], udp_port);

    // Control: unconfined, everything connects and the datagram arrives.
    let open = confined(None, server, false, &script).await;
    assert_eq!(open.matches(" ok").count(), 5, "{open}");
    let mut buf = [0u8; 16];
    assert_eq!(
        udp.recv(&mut buf).ok(),
        Some(5),
        "the control's datagram arrived"
    );

    let opencode = confined(Some(&plan), server, false, &script).await;
    let expect = format!(
        "tcp {key} ok\ntcp {egress} ok\ntcp {server} ok\ntcp {other} Permission denied\nudp Operation not permitted\n"
    );
    assert_eq!(opencode, expect);
    let commands = confined(Some(&plan), server, true, &script).await;
    let expect = format!(
        "tcp {key} Permission denied\ntcp {egress} ok\ntcp {server} Permission denied\ntcp {other} Permission denied\nudp Operation not permitted\n"
    );
    assert_eq!(commands, expect);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        udp.recv(&mut buf).is_err(),
        "no datagram left a confined process"
    );
}

#[tokio::test]
async fn under_none_the_agents_commands_get_no_ip_socket_and_agent_ports_are_reachable() {
    let (_key, key) = listener().await;
    let (_server, server) = listener().await;
    let (_dev, dev) = listener().await;
    let none = NetworkPlan {
        mode: AgentNetwork::None,
        abi: abi(),
        key_proxy_port: Some(key),
        egress_port: None,
        agent_ports: vec![],
    };
    let script = probe(&[key], 9);
    assert_eq!(
        confined(Some(&none), server, false, &script).await,
        format!("tcp {key} ok\nudp Operation not permitted\n"),
        "OpenCode still reaches the model"
    );
    assert_eq!(
        confined(Some(&none), server, true, &script).await,
        format!("tcp {key} Operation not permitted\nudp Operation not permitted\n"),
        "the commands cannot even open a socket"
    );
    let with_port = NetworkPlan {
        agent_ports: vec![dev],
        ..none
    };
    assert_eq!(
        confined(Some(&with_port), server, true, &probe(&[dev, key], 9)).await,
        format!("tcp {dev} ok\ntcp {key} Permission denied\nudp Operation not permitted\n"),
    );
}

#[tokio::test]
async fn sockets_landlock_cannot_judge_are_refused() {
    let (_server, server) = listener().await;
    let (_open, open_port) = listener().await;
    let plan = NetworkPlan {
        mode: AgentNetwork::Allowlist,
        abi: abi(),
        key_proxy_port: None,
        egress_port: None,
        agent_ports: vec![],
    };
    // SCTP behind SOCK_STREAM, raw and packet sockets, TCP Fast Open's implicit connect, and a
    // socketpair of another family.
    let script = format!(
        r#"python3 - <<'EOF'
import socket
def tryit(name, f):
    try:
        f(); print(name, "ok")
    except OSError as e:
        print(name, e.errno)
tryit("sctp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))
tryit("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
tryit("dgram6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC))
tryit("packet", lambda: socket.socket(17, socket.SOCK_DGRAM))
def tfo():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.sendto(b"x", 0x20000000, ("127.0.0.1", {open_port}))
tryit("fastopen", tfo)
tryit("tcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK).close())
EOF"#
    );
    let out = confined(Some(&plan), server, false, &script).await;
    let eperm = libc::EPERM;
    assert_eq!(
        out,
        format!(
            "sctp {eperm}\nraw {eperm}\ndgram6 {eperm}\npacket {eperm}\nfastopen {eperm}\ntcp ok\n"
        )
    );
}

/// The agent's tools read the proxy variables the agent's environment holds
/// (`egress::AgentReach::env`): each one's request reaches the egress proxy, which refuses it.
#[tokio::test]
async fn git_npm_pip_and_cargo_go_through_the_egress_proxy() {
    let proxy = EgressProxy::start(Allowlist::default(), RunnerProxy::default())
        .await
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_string_lossy().into_owned();
    let tools: [(&str, &[&str]); 4] = [
        ("git", &["ls-remote", "http://unlisted.example/x.git"]),
        (
            "npm",
            &[
                "view",
                "left-pad",
                "--registry",
                "http://unlisted.example/",
                "--fetch-retries=0",
            ],
        ),
        (
            "python3",
            &[
                "-m",
                "pip",
                "download",
                "--no-deps",
                // With no retry pip does not print why the index failed.
                "--retries",
                "1",
                "--index-url",
                "https://unlisted.example/simple",
                "-d",
                &dir,
                "left-pad",
            ],
        ),
        (
            "cargo",
            &[
                "install",
                "--index",
                "sparse+http://unlisted.example/",
                "--root",
                &dir,
                "left-pad",
            ],
        ),
    ];
    for (tool, args) in tools {
        let mut cmd = tokio::process::Command::new(tool);
        cmd.args(args)
            .current_dir(&dir)
            .env("HOME", &dir)
            .env("CARGO_HOME", format!("{dir}/cargo"))
            .env("npm_config_cache", format!("{dir}/npm"))
            .env_remove("PIP_INDEX_URL")
            .env_remove("npm_config_registry");
        for (k, v) in fro_bot::net::agent_vars_behind(
            &fro_bot::runner::Env::from_pairs::<&str, &str>([]),
            Some(&proxy.url()),
        ) {
            cmd.env(k, v);
        }
        let before = proxy.counts().refused_total;
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .unwrap_or_else(|_| panic!("{tool} hung"))
            .unwrap_or_else(|e| panic!("{tool} is a prerequisite of the suite: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{tool}: {text}");
        assert!(text.contains("403"), "{tool} shows the refusal: {text}");
        assert!(
            proxy.counts().refused_total > before,
            "{tool} asked the proxy: {text}"
        );
    }
}

/// A flood of tunnels cannot take every blocking thread fro-bot has: past the cap one more is
/// refused, and a closed one frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_past_the_cap_are_refused_and_a_closed_one_frees_its_slot() {
    // A server that holds each connection until its client's side ends.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    let listed = Allowlist::parse(&format!("localhost:{port}")).unwrap();
    let proxy = EgressProxy::start(listed, RunnerProxy::default())
        .await
        .unwrap();
    let open = |()| {
        let proxy_port = proxy.port();
        async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", proxy_port))
                .await
                .unwrap();
            let target = format!("localhost:{port}");
            s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let answer = read_response(&mut s).await;
            (s, answer)
        }
    };
    let mut tunnels = Vec::new();
    for _ in 0..64 {
        let (s, answer) = open(()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        tunnels.push(s);
    }
    let (_, refused) = open(()).await;
    assert!(
        refused.starts_with("HTTP/1.1 502") && refused.contains("64 tunnels are open already"),
        "{refused}"
    );
    drop(tunnels.pop());
    // The tunnel ends once both sides have (a half-close alone keeps it, as TCP does), and its
    // slot comes back.
    let mut answer = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (s, a) = open(()).await;
        answer = a;
        if answer.starts_with("HTTP/1.1 200") {
            tunnels.push(s);
            break;
        }
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
