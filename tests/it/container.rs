//! The action's image, run the way the GitHub runner runs a container action (docs/container.md):
//! the e2e scenarios through `docker run` instead of the bare binary, and what the image itself
//! must carry. Needs the image `scripts/test` builds; without Docker or the image these fail.

crate::e2e::launched_scenarios!(crate::support::container::Launch::container());
// From the image only: the binary runs the same code, and the runner's seccomp profile is the
// container's (docs/security.md#the-agents-network); the threat check's own model request leaves
// the container through its key proxy (docs/security.md#the-threat-check).
crate::e2e::launched_scenarios!(crate::support::container::Launch::container();
    egress::the_agent_reaches_the_listed_host_and_nothing_else,
    threat::the_model_check_holds_what_it_flags_or_cannot_read_and_warn_delivers_it_with_the_warning,
    egress::under_none_the_model_answers_and_the_agents_commands_have_no_network,
    egress::a_kernel_without_landlock_tcp_rules_fails_the_run_before_the_agent_starts,
    isolation::the_agents_commands_reach_no_address_but_the_egress_proxy,
    isolation::the_agents_container_ends_with_a_sigterm_and_post_removes_what_a_killed_main_left,
);
// From the image only: the link rewrite, the log's writer and the review are fro-bot's own code,
// the same in the binary.
crate::e2e::launched_scenarios!(crate::support::container::Launch::container();
    links::every_text_the_agent_writes_leaves_with_its_foreign_links_inert,
    links::split_tags_and_rendered_fences_leave_with_nothing_live,
    log::the_agent_cannot_write_a_workflow_command_into_the_log,
    review::a_review_is_one_post_pinned_to_the_head_and_a_push_gets_only_its_new_finding,
);

/// From the image only (the binary runs the same code): three mentions on one new issue with the
/// Actions cache alone, the default set-up (docs/persistence.md#concurrent-runs-and-the-merge).
#[tokio::test]
async fn three_mentions_on_one_thread_with_the_cache_alone_are_all_answered_and_remembered() {
    crate::e2e::concurrent::three_mentions_on_one_thread_are_all_answered_and_remembered(
        crate::support::container::Launch::container(),
        None,
    )
    .await;
}

mod image {
    use std::process::{Command, Stdio};

    use crate::support::container::Launch;

    fn sh(script: &str) -> String {
        let Launch::Container { image } = Launch::container() else {
            unreachable!("Launch::container returns a container")
        };
        let out = Command::new("docker")
            .args([
                "run",
                "--rm",
                "--network",
                "host",
                "--entrypoint",
                "sh",
                &image,
                "-c",
            ])
            .arg(script)
            .stdin(Stdio::null())
            .output()
            .expect("docker runs");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn the_image_has_the_tools_for_repository_work() {
        let out = sh("gh --version | head -n1; curl --version | head -n1; jq --version; rg --version | head -n1");
        for tool in ["gh version", "curl ", "jq-", "ripgrep "] {
            assert!(out.contains(tool), "{tool} missing: {out}");
        }
    }

    #[test]
    fn the_image_ships_the_opencode_version_the_action_declares() {
        let action =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/action.yaml")).unwrap();
        let declared = action
            .split("\n  opencode-version:")
            .nth(1)
            .and_then(|rest| {
                rest.lines()
                    .find(|l| l.trim_start().starts_with("default:"))
            })
            .map(|l| l.split('"').nth(1).unwrap_or_default().to_string())
            .expect("action.yaml declares opencode-version's default");
        let shipped = sh("opencode --version && echo \"$FRO_BOT_OPENCODE_VERSION\"");
        assert_eq!(shipped, format!("{declared}\n{declared}"));
    }

    #[test]
    fn both_entrypoints_are_links_to_the_one_binary() {
        let links = sh(
            "readlink /usr/local/bin/fro-bot-run /usr/local/bin/fro-bot-post \
                        && test -x /usr/local/bin/fro-bot && echo ok",
        );
        assert_eq!(links, "fro-bot\nfro-bot\nok");
    }
}

#[test]
fn only_paths_under_the_job_root_are_mapped_to_the_runners_mounts() {
    use crate::support::container::in_container;
    let root = std::path::Path::new("/tmp/job");
    assert_eq!(in_container(root, "/tmp/job/home"), "/github/home");
    assert_eq!(
        in_container(root, "/tmp/job/workflow/event.json"),
        "/github/workflow/event.json"
    );
    assert_eq!(in_container(root, "/tmp/jobs/x"), "/tmp/jobs/x");
    assert_eq!(in_container(root, "octo/hello"), "octo/hello");
}
