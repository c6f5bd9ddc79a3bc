//! Runs a step the way the runner runs the container action: a HOME laid out like `/github/home`,
//! a git checkout as the workspace, an event payload file, `GITHUB_*`/`RUNNER_*`/`INPUT_*`
//! variables, and file-command files read back through the runner's own parser. A step is either
//! the built `fro-bot` binary started directly ([`Launch::Binary`]) or the action's image started
//! with `docker run` exactly as the runner starts it ([`Launch::Container`], docs/container.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use fro_bot::runner::file_command;

pub use super::container::Launch;
use super::container::{self, Container};

pub const BIN: &str = env!("CARGO_BIN_EXE_fro-bot");

/// One job's filesystem: shared by its main and post steps (as `/github/home` is). Under `root`:
/// `home`, `workspace`, `workflow/event.json`, `file_commands` and `runner_temp`, the directories
/// the runner mounts at `/github/*` for a container action.
pub struct Job {
    pub root: tempfile::TempDir,
    pub env: BTreeMap<String, String>,
    /// As on a hosted runner: the checkout, HOME and the file-command files belong to this uid
    /// (the runner's user), not to root.
    pub runner_uid: Option<u32>,
    pub launch: Launch,
    /// Binary steps see the job's directories at [`FIXED_ROOT`] (see [`Job::at_fixed_root`]).
    pub fixed_root: bool,
    /// The fro-bot binary steps run ([`BIN`] unless [`Job::binary_at`]).
    pub bin: PathBuf,
    /// Binary steps see this file as the system trust store ([`Job::system_trust_store`]).
    pub trust_store: Option<PathBuf>,
}

/// Where [`Job::at_fixed_root`] jobs see their directories, as every container job sees its own
/// at `/github/*`: the cache version and member names come from these paths, so jobs that run at
/// the same time on one machine share memory only if they see the same ones.
pub const FIXED_ROOT: &str = "/tmp/fro-bot-e2e-job";

/// A step that was started and not yet waited for.
pub struct Running {
    child: Child,
    container: Option<Container>,
}

impl Running {
    /// Sends `signal` the way the runner does: to the process, or `docker kill --signal` to the
    /// container (whose PID 1 is fro-bot).
    pub fn signal(&self, signal: i32) {
        match &self.container {
            Some(c) => c.signal(signal),
            // SAFETY: kill(2) on the child we spawned.
            None => unsafe {
                libc::kill(self.child.id() as i32, signal);
            },
        }
    }

    /// The step's container's name (a container launch).
    pub fn container_name(&self) -> Option<&str> {
        self.container.as_ref().map(|c| c.name.as_str())
    }

    /// The launched process: fro-bot itself for a binary launch (`docker run` for a container).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The step's stdout, for a test that reads it as it comes (then not in the `StepResult`).
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// Whether the step has exited (without reaping it).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

pub struct StepResult {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub outputs: BTreeMap<String, String>,
    pub state: BTreeMap<String, String>,
    pub summary: String,
}

/// A new comment on an issue by its (trusted) author, as GitHub sends `issue_comment`.
pub fn comment_event(issue: u64, comment_id: u64, body: &str) -> serde_json::Value {
    serde_json::json!({
        "action": "created",
        "issue": {"number": issue, "title": "Flaky build", "body": "It fails sometimes.",
                  "state": "open", "locked": false, "node_id": format!("I_{issue}"),
                  "user": {"login": "mona", "type": "User"}, "author_association": "OWNER"},
        "comment": {"id": comment_id, "body": body, "node_id": format!("IC_{comment_id}"),
                    "user": {"login": "mona", "type": "User"}, "author_association": "OWNER"},
        "repository": {"full_name": "octo/hello", "name": "hello", "owner": {"login": "octo"}},
        "sender": {"login": "mona", "type": "User"}
    })
}

/// Everything a step printed and wrote, for a failing assertion's message.
pub fn explain(r: &StepResult) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}\nsummary:\n{}",
        r.code, r.stdout, r.stderr, r.summary
    )
}

impl StepResult {
    pub fn output(&self, name: &str) -> &str {
        self.outputs
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| {
                panic!(
                    "no output {name:?}; outputs {:?}\nstdout:\n{}\nstderr:\n{}",
                    self.outputs, self.stdout, self.stderr
                )
            })
    }
}

pub fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        // Fixed dates: the same content makes the same commit in every job, as one repository's
        // checkouts on separate runners do (OpenCode's project id is the root commit).
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .stdout(Stdio::null())
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?} failed");
}

/// A fresh single-commit repository at `dir` (what `fetch-depth: 1` leaves: a different root
/// commit for different content).
pub fn fresh_checkout(dir: &Path, content: &str) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), content).unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", "init"]);
}

/// `chown -R uid:uid dir`.
pub fn chown_r(dir: &Path, uid: u32) {
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{uid}"))
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "chown {}", dir.display());
}

impl Job {
    /// A job of run `run_id` in repository `owner/repo` on `main`, its steps run as the binary.
    pub fn new(run_id: u64) -> Self {
        Self::launched(run_id, Launch::Binary)
    }

    /// A job whose steps are started by `launch`.
    pub fn launched(run_id: u64, launch: Launch) -> Self {
        let root = tempfile::tempdir().unwrap();
        // As on a runner, the job's directories are reachable by the agent's unprivileged uid.
        std::fs::set_permissions(
            root.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let home = root.path().join("home");
        let workspace = root.path().join("workspace");
        let files = root.path().join("file_commands");
        let temp = root.path().join("runner_temp");
        for d in [&home, &files, &temp, &root.path().join("workflow")] {
            std::fs::create_dir_all(d).unwrap();
        }
        fresh_checkout(&workspace, "hello\n");
        let mut env = BTreeMap::new();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        for (k, v) in [
            ("HOME", s(&home)),
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("GITHUB_ACTIONS", "true".into()),
            ("CI", "true".into()),
            ("GITHUB_WORKSPACE", s(&workspace)),
            ("GITHUB_REPOSITORY", "octo/hello".into()),
            ("GITHUB_REPOSITORY_OWNER", "octo".into()),
            ("GITHUB_REF_NAME", "main".into()),
            ("GITHUB_REF", "refs/heads/main".into()),
            ("GITHUB_RUN_ID", run_id.to_string()),
            ("GITHUB_RUN_ATTEMPT", "1".into()),
            ("GITHUB_JOB", "agent".into()),
            ("GITHUB_ACTOR", "alice".into()),
            ("GITHUB_SERVER_URL", "https://github.com".into()),
            ("RUNNER_OS", "Linux".into()),
            ("RUNNER_TEMP", s(&temp)),
            ("GITHUB_OUTPUT", s(&files.join("output"))),
            ("GITHUB_STATE", s(&files.join("state"))),
            ("GITHUB_ENV", s(&files.join("env"))),
            ("GITHUB_PATH", s(&files.join("path"))),
            ("GITHUB_STEP_SUMMARY", s(&files.join("summary"))),
            (
                "GITHUB_EVENT_PATH",
                s(&root.path().join("workflow/event.json")),
            ),
            ("INPUT_AUTH-JSON", "{}".into()),
            ("INPUT_MATRIX-CONTEXT", "null".into()),
            // A GitHub call that meets a transient fault is tried again after 5 ms, 10 ms, 20 ms
            // (1 s, 2 s, 4 s on a runner).
            ("FRO_BOT_GITHUB_BACKOFF_MS", "5".into()),
        ] {
            env.insert(k.to_string(), v);
        }
        Job {
            root,
            env,
            launch,
            runner_uid: None,
            fixed_root: false,
            bin: PathBuf::from(BIN),
            trust_store: None,
        }
    }

    /// The next job on a fresh runner: same absolute paths (as `/github/home` always is), an
    /// empty home, new file-command files, and the given run id.
    pub fn next_run(&mut self, run_id: u64) {
        let _ = std::fs::remove_dir_all(self.home());
        std::fs::create_dir_all(self.home()).unwrap();
        let _ = std::fs::remove_dir_all(self.root.path().join("runner_temp"));
        std::fs::create_dir_all(self.root.path().join("runner_temp")).unwrap();
        self.set("GITHUB_RUN_ID", run_id.to_string());
    }

    pub fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    pub fn workspace(&self) -> PathBuf {
        self.root.path().join("workspace")
    }

    /// The workspace's path as the step sees it (`/github/workspace` in the container).
    pub fn step_workspace(&self) -> PathBuf {
        match self.launch {
            Launch::Binary if self.fixed_root => PathBuf::from(FIXED_ROOT).join("workspace"),
            Launch::Binary => self.workspace(),
            Launch::Container { .. } => container::WORKSPACE.into(),
        }
    }

    /// `path` (under the job's root) as the step sees it.
    pub fn step_path(&self, path: &Path) -> PathBuf {
        let rel = path
            .strip_prefix(self.root.path())
            .expect("a path under the job's root");
        match self.launch {
            Launch::Binary if self.fixed_root => PathBuf::from(FIXED_ROOT).join(rel),
            Launch::Binary => path.to_path_buf(),
            Launch::Container { .. } => container::mounted(rel),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.home().join(".local/share/opencode")
    }

    pub fn set(&mut self, k: &str, v: impl Into<String>) -> &mut Self {
        self.env.insert(k.to_string(), v.into());
        self
    }

    pub fn input(&mut self, name: &str, v: impl Into<String>) -> &mut Self {
        self.set(&fro_bot::runner::input_var(name), v)
    }

    pub fn event(&mut self, name: &str, payload: &serde_json::Value) -> &mut Self {
        std::fs::write(
            self.root.path().join("workflow/event.json"),
            serde_json::to_vec(payload).unwrap(),
        )
        .unwrap();
        self.set("GITHUB_EVENT_NAME", name)
    }

    /// Makes the checkout, HOME and the file-command files (made anew for every step) belong to
    /// `uid`, as the runner's user owns them on a hosted runner.
    pub fn owned_by_runner_user(&mut self, uid: u32) -> &mut Self {
        for dir in [self.workspace(), self.home(), self.files()] {
            chown_r(&dir, uid);
        }
        self.runner_uid = Some(uid);
        self
    }

    pub fn files(&self) -> PathBuf {
        self.root.path().join("file_commands")
    }

    /// Runs one step. File-command files start empty for each step, as the runner makes new ones;
    /// `extra` adds step-specific variables (e.g. `STATE_*` for post).
    pub fn step(&self, args: &[&str], extra: &[(String, String)]) -> StepResult {
        let child = self.spawn(args, extra);
        self.finish(child)
    }

    /// Starts a step without waiting for it (to signal or kill it). `args[0]` names the step
    /// (`run`, `post`, ...): the binary gets the args, the container the matching entrypoint.
    pub fn spawn(&self, args: &[&str], extra: &[(String, String)]) -> Running {
        if let Some(uid) = self.runner_uid {
            // The runner makes each step's files anew under new names, as the runner's user: the
            // directory must still be its to write after any step, a killed one included.
            let probe = self.files().join(format!("new-{}", std::process::id()));
            let made = as_runner(uid, "touch \"$1\" && rm \"$1\"", &probe);
            assert!(
                made.status.success(),
                "the runner (uid {uid}) cannot make the next step's file-command files in {}: {}",
                self.files().display(),
                String::from_utf8_lossy(&made.stderr)
            );
        }
        for f in ["output", "state", "env", "path", "summary"] {
            let path = self.files().join(f);
            let _ = std::fs::remove_file(&path);
            if let Some(uid) = self.runner_uid {
                std::fs::write(&path, "").unwrap();
                std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
            }
        }
        let mut env = self.env.clone();
        env.extend(extra.iter().cloned());
        let (mut command, container) = match &self.launch {
            Launch::Binary if self.fixed_root => (self.fixed_root_command(args, &env), None),
            Launch::Binary => {
                let mut c = Command::new(&self.bin);
                c.args(args)
                    .env_clear()
                    .envs(&env)
                    .current_dir(self.workspace());
                (c, None)
            }
            Launch::Container { image } => {
                let (c, name) =
                    container::command(image, self.root.path(), args, &env, self.runner_uid);
                (c, Some(name))
            }
        };
        if let Some(bundle) = &self.trust_store {
            assert!(matches!(self.launch, Launch::Binary), "binary steps only");
            bind_over(&mut command, bundle, super::tls::SYSTEM_BUNDLE, None);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the step starts");
        Running { child, container }
    }

    /// Steps of this job run in a mount namespace of their own, with the job's root bound at
    /// [`FIXED_ROOT`] and every path in the environment pointing there, so several jobs can run
    /// at once with the same paths, as on separate runners.
    pub fn at_fixed_root(&mut self) -> &mut Self {
        self.fixed_root = true;
        self
    }

    /// Binary steps run in a mount namespace of their own where `bundle` is the system trust store,
    /// as if the runner's administrator had added a certificate to it.
    pub fn system_trust_store(&mut self, bundle: PathBuf) -> &mut Self {
        self.trust_store = Some(bundle);
        self
    }

    /// Binary steps run `bin` instead of [`BIN`] (a build in another place).
    pub fn binary_at(&mut self, bin: PathBuf) -> &mut Self {
        self.bin = bin;
        self
    }

    fn fixed_root_command(&self, args: &[&str], env: &BTreeMap<String, String>) -> Command {
        std::fs::create_dir_all(FIXED_ROOT).unwrap();
        let root = self.root.path().to_string_lossy().into_owned();
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.clone(), v.replace(&root, FIXED_ROOT)))
            .collect();
        let mut c = Command::new(&self.bin);
        c.args(args).env_clear().envs(&env);
        // No shell in between: it would drop the `INPUT_*` names that hold a dash.
        let workspace = format!("{FIXED_ROOT}/workspace");
        bind_over(&mut c, self.root.path(), FIXED_ROOT, Some(&workspace));
        c
    }

    /// Waits for a step and reads what it wrote.
    pub fn finish(&self, running: Running) -> StepResult {
        use std::os::unix::process::ExitStatusExt;
        let Running {
            child,
            mut container,
        } = running;
        let out = child.wait_with_output().expect("the step runs");
        if let Some(c) = container.as_mut() {
            c.waited();
            // 125: docker itself failed (bad mount, no image); the step never ran.
            assert_ne!(
                out.status.code(),
                Some(125),
                "docker run {} failed: {}",
                c.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let read = |f: &str| self.read_file_command(f);
        let parse = |f: &str| -> BTreeMap<String, String> {
            file_command::parse(&read(f))
                .unwrap_or_else(|e| panic!("{f} file does not parse like the runner: {e}"))
                .into_iter()
                .collect()
        };
        StepResult {
            code: out
                .status
                .code()
                .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0)),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            outputs: parse("output"),
            state: parse("state"),
            summary: read("summary"),
        }
    }

    /// A file command's content, read as the runner reads it after the step: as the runner's
    /// user when the job has one (a file it cannot read is a failed step on a real runner).
    fn read_file_command(&self, f: &str) -> String {
        let path = self.files().join(f);
        let Some(uid) = self.runner_uid else {
            return std::fs::read_to_string(&path).unwrap_or_default();
        };
        if !path.exists() {
            return String::new();
        }
        let out = as_runner(uid, "cat \"$1\"", &path);
        assert!(
            out.status.success(),
            "the runner (uid {uid}) cannot read the step's {f} file: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn main_step(&self) -> StepResult {
        self.step(&["run"], &[])
    }

    /// The post step, with main's saved state handed over as `STATE_*` the way the runner does.
    pub fn post_step(&self, main: &StepResult) -> StepResult {
        let state: Vec<(String, String)> = main
            .state
            .iter()
            .map(|(k, v)| (format!("STATE_{k}"), v.clone()))
            .collect();
        self.step(&["post"], &state)
    }
}

/// `script` run by `sh` as the runner's user, with `arg` as `$1`.
fn as_runner(uid: u32, script: &str, arg: &Path) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(arg)
        .uid(uid)
        .gid(uid)
        .output()
        .expect("sh runs")
}

/// `command` runs in a mount namespace of its own where `source` is bound over `target`, from
/// `cwd` when given.
fn bind_over(command: &mut Command, source: &Path, target: &str, cwd: Option<&str>) {
    let cstr = |p: &std::ffi::OsStr| std::ffi::CString::new(p.as_encoded_bytes()).unwrap();
    let (src, dst) = (cstr(source.as_os_str()), cstr(target.as_ref()));
    let cwd = cwd.map(|d| cstr(d.as_ref()));
    let in_namespace = move || -> std::io::Result<()> {
        let check = |rc: libc::c_int| match rc {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        };
        let none = std::ptr::null();
        // SAFETY: plain syscalls on NUL-terminated strings owned by the closure, in the child
        // between fork and exec.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            let private = libc::MS_REC | libc::MS_PRIVATE;
            check(libc::mount(
                none,
                c"/".as_ptr(),
                none,
                private,
                none as *const _,
            ))?;
            check(libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                none,
                libc::MS_BIND,
                none as *const _,
            ))?;
            match &cwd {
                Some(dir) => check(libc::chdir(dir.as_ptr())),
                None => Ok(()),
            }
        }
    };
    // SAFETY: the closure only makes syscalls (async-signal-safe).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, in_namespace);
    }
}

/// Processes whose working directory is `dir` or under it (OpenCode runs in the workspace), as
/// `pid cmdline` lines. Directories are compared by device and inode, walking up from each
/// process's working directory, so a process in a container, which sees the workspace at
/// `/github/workspace` (its path in another mount namespace), is found too.
pub fn processes_in(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(target) = std::fs::metadata(dir) else {
        return Vec::new();
    };
    let target = (target.dev(), target.ino());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| works_under(pid, target))
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            format!("{pid} {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
        })
        .collect()
}

/// Whether `pid`'s working directory is the directory `target` (device, inode) or under it: its
/// cwd and each parent up to the process's own root, through `/proc/<pid>/cwd` (which the kernel
/// resolves in the process's mount namespace).
fn works_under(pid: u32, target: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let root = id(Path::new(&format!("/proc/{pid}/root")));
    let mut at = PathBuf::from(format!("/proc/{pid}/cwd"));
    for _ in 0..64 {
        let Some(here) = id(&at) else {
            return false;
        };
        if here == target {
            return true;
        }
        if Some(here) == root {
            return false;
        }
        at.push("..");
    }
    false
}

/// Waits up to 10 s for no process to run in `dir`; the ones left when it gives up.
pub async fn until_nothing_runs_in(dir: &Path) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = processes_in(dir);
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
