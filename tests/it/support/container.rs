//! Starting a step from the action's image the way the GitHub runner starts a container action
//! (docs/container.md): `docker run --rm --network host --workdir /github/workspace --entrypoint
//! <entrypoint>`, `-e NAME` for each variable, the job's directories mounted at `/github/*` and
//! the Docker socket. `scripts/test` builds the image and names it in `FRO_BOT_TEST_IMAGE`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub const IMAGE_VAR: &str = "FRO_BOT_TEST_IMAGE";
/// Set by `scripts/test` instead of the image when Docker or the build failed.
pub const IMAGE_ERROR_VAR: &str = "FRO_BOT_TEST_IMAGE_ERROR";
pub const WORKSPACE: &str = "/github/workspace";

/// The job directories under `Job::root` and where the runner mounts them.
const MOUNTS: &[(&str, &str)] = &[
    ("home", "/github/home"),
    ("workspace", WORKSPACE),
    ("workflow", "/github/workflow"),
    ("file_commands", "/github/file_commands"),
    ("runner_temp", "/github/runner_temp"),
];

/// `rel` (a path under `Job::root`) where the step sees it: under its directory's mount.
pub fn mounted(rel: &Path) -> PathBuf {
    let mut parts = rel.components();
    let first = parts
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let (_, mount) = MOUNTS
        .iter()
        .find(|(dir, _)| Some(*dir) == first.as_deref())
        .unwrap_or_else(|| panic!("{} is not under a mounted job directory", rel.display()));
    Path::new(mount).join(parts.as_path())
}

/// The uid:gid of the `runner` user on GitHub-hosted runners, who owns the checkout.
const RUNNER_USER: &str = "1001:1001";

/// How a test starts a step.
#[derive(Clone, Debug)]
pub enum Launch {
    /// The built binary, started directly.
    Binary,
    /// The action's image, started with `docker run` like the runner does.
    Container { image: String },
}

impl Launch {
    /// The image `scripts/test` built. Fails the test, saying why, when Docker does not answer or
    /// the image is missing: the container suite never passes without having run.
    pub fn container() -> Launch {
        static IMAGE: OnceLock<Result<String, String>> = OnceLock::new();
        match IMAGE.get_or_init(find_image) {
            Ok(image) => Launch::Container {
                image: image.clone(),
            },
            Err(why) => panic!("{why}"),
        }
    }
}

fn find_image() -> Result<String, String> {
    let how = "run the suite with scripts/test, which starts Docker and builds the image \
               (or build it with scripts/container-image and set FRO_BOT_TEST_IMAGE=fro-bot:test)";
    if let Ok(error) = std::env::var(IMAGE_ERROR_VAR) {
        return Err(format!("the container suite has no image: {error}"));
    }
    let image = std::env::var(IMAGE_VAR).map_err(|_| {
        format!("{IMAGE_VAR} is not set, so the container suite has no image: {how}")
    })?;
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", &image])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!("docker cannot be started ({e}): the container suite needs it: {how}")
        })?;
    if !out.status.success() {
        return Err(format!(
            "the Docker engine does not answer or image {image} is missing: {}\n{how}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(image)
}

/// A started container, removed when dropped if the step was not waited for (a failed test).
pub struct Container {
    pub name: String,
    waited: bool,
}

impl Container {
    /// `docker kill --signal`, as the runner cancels a container step. A container that already
    /// exited cannot be signalled; that race is the caller's to observe through the exit.
    pub fn signal(&self, signal: i32) {
        let out = Command::new("docker")
            .args(["kill", "--signal", &signal.to_string(), &self.name])
            .stdin(Stdio::null())
            .output()
            .expect("docker runs");
        if !out.status.success() {
            eprintln!(
                "docker kill --signal {signal} {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }

    pub fn waited(&mut self) {
        self.waited = true;
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if !self.waited {
            let _ = Command::new("docker")
                .args(["rm", "--force", &self.name])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The runner's view of a step's variable: a path under the job root becomes the path under
/// `/github` where that directory is mounted.
pub fn in_container(root: &Path, value: &str) -> String {
    let root = root.to_string_lossy();
    match value.strip_prefix(root.as_ref()) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/github{rest}"),
        _ => value.to_string(),
    }
}

/// The `docker run` command for step `args[0]` of the job at `root` with environment `env`.
/// `run` and `post` use the action's entrypoints with no arguments (`runs.entrypoint` and
/// `runs.post-entrypoint` in action.yaml); anything else runs `fro-bot <args>`.
pub fn command(
    image: &str,
    root: &Path,
    args: &[&str],
    env: &BTreeMap<String, String>,
    runner_uid: Option<u32>,
) -> (Command, Container) {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "fro-bot-test-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    own_like_a_runner(
        root,
        runner_uid.map_or(RUNNER_USER.to_string(), |u| format!("{u}:{u}")),
    );
    let (entrypoint, rest): (&str, &[&str]) = match args {
        ["run"] => ("/usr/local/bin/fro-bot-run", &[]),
        ["post"] => ("/usr/local/bin/fro-bot-post", &[]),
        _ => ("/usr/local/bin/fro-bot", args),
    };
    let mut c = Command::new("docker");
    c.args(["run", "--rm", "--name", &name, "--network", "host"]);
    c.args(["--workdir", WORKSPACE, "--entrypoint", entrypoint]);
    for (k, v) in env {
        // The host's PATH and OpenCode binary mean nothing in the image, which has its own.
        if k == "PATH" || k == "OPENCODE_PATH" {
            continue;
        }
        // `-e NAME` with the value in docker's environment, as the runner passes them (no
        // values on a command line).
        c.arg("-e").arg(k).env(k, in_container(root, v));
    }
    for (dir, target) in MOUNTS {
        c.arg("-v")
            .arg(format!("{}:{target}", root.join(dir).display()));
    }
    c.args(["-v", "/var/run/docker.sock:/var/run/docker.sock"]);
    c.arg(image).args(rest);
    (
        c,
        Container {
            name,
            waited: false,
        },
    )
}

/// On a runner the checkout and the runner's directories belong to the runner's user (`owner`,
/// `uid:gid`; `runner` on a hosted runner); the container runs as root.
fn own_like_a_runner(root: &Path, owner: String) {
    let status = Command::new("chown")
        .args(["-R", &owner])
        .arg(root.join("workspace"))
        .status()
        .expect("chown runs");
    assert!(status.success(), "chown the workspace");
    for (dir, _) in MOUNTS {
        let status = Command::new("chown")
            .arg(&owner)
            .arg(root.join(dir))
            .status()
            .expect("chown runs");
        assert!(status.success(), "chown {dir}");
    }
}
