//! The agent's proposed change: the work tree at the end of its turn against the commit fro-bot
//! recorded before it (`Base`). Commits the agent made count through the files they leave.
//!
//! Read with git in a private git dir of fro-bot's (`safe_outputs::git`): its own config, no
//! hooks, an index built from the base tree, and the workspace's objects borrowed read-only as an
//! alternate. Nothing in the workspace's `.git` (config, hooks, index, attributes' filter
//! programs) is read or run. `.gitignore` files in the work tree are honoured, as `git add -A`
//! would, so build output the agent left is not part of the change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::git::{is_oid, private_home, Git, GitError};

/// A file mode as git records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    File,
    Executable,
    Symlink,
    /// A submodule's commit (gitlink).
    Gitlink,
    Other(u32),
}

impl Mode {
    fn parse(octal: &str) -> Mode {
        match octal {
            "100644" => Mode::File,
            "100755" => Mode::Executable,
            "120000" => Mode::Symlink,
            "160000" => Mode::Gitlink,
            other => Mode::Other(u32::from_str_radix(other, 8).unwrap_or(0)),
        }
    }

    pub fn octal(self) -> String {
        match self {
            Mode::File => "100644".into(),
            Mode::Executable => "100755".into(),
            Mode::Symlink => "120000".into(),
            Mode::Gitlink => "160000".into(),
            Mode::Other(m) => format!("{m:06o}"),
        }
    }
}

/// One side of a changed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    pub mode: Mode,
    pub oid: String,
}

/// One changed path. `path` is the raw bytes git reports (checked for UTF-8 by the checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    pub path: Vec<u8>,
    /// `None`: added.
    pub old: Option<Side>,
    /// `None`: deleted.
    pub new: Option<Side>,
    /// The new content (for a symlink, its target); empty for a deletion or a gitlink.
    pub content: Vec<u8>,
    /// The old content of a modified file (the secret gate looks only at lines the change adds).
    pub old_content: Vec<u8>,
}

impl FileChange {
    pub fn path_lossy(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }
}

/// What the agent proposes to commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeSet {
    /// The commit the change is taken against.
    pub base: String,
    pub files: Vec<FileChange>,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Bytes of changed content (what `max-change-bytes` counts).
    pub fn content_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.content.len() as u64).sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot prepare fro-bot's private git dir")]
    Scratch {
        #[source]
        source: std::io::Error,
    },
    #[error("the workspace is not a git checkout fro-bot can read")]
    NotACheckout {
        #[source]
        source: GitError,
    },
    #[error("reading the change failed")]
    Git {
        #[source]
        source: GitError,
    },
    #[error("git reported a change fro-bot cannot parse: {what}")]
    Parse { what: String },
}

/// The commit the agent starts from and where its objects live, recorded before the turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    pub commit: String,
    /// The checkout's object store (`git rev-parse --git-common-dir` + `/objects`), absolute.
    pub objects: PathBuf,
}

/// Records `HEAD` of the checkout at `workspace`, before the agent runs (the checkout's `.git` is
/// still the one `actions/checkout` wrote).
pub fn record_base(workspace: &Path) -> Result<Base, CaptureError> {
    let scratch = tempfile::tempdir().map_err(|source| CaptureError::Scratch { source })?;
    let home = private_home(scratch.path()).map_err(|source| CaptureError::Scratch { source })?;
    let not_checkout = |source| CaptureError::NotACheckout { source };
    let commit = Git::new(workspace, &home)
        .args(["rev-parse", "--verify", "HEAD^{commit}"])
        .line()
        .map_err(not_checkout)?;
    let common = Git::new(workspace, &home)
        .args(["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .line()
        .map_err(not_checkout)?;
    if !is_oid(&commit) {
        return Err(CaptureError::Parse {
            what: format!("HEAD is {commit:?}"),
        });
    }
    Ok(Base {
        commit,
        objects: PathBuf::from(common).join("objects"),
    })
}

/// fro-bot's private git dir over the workspace: alive as long as this value.
pub struct Capture {
    scratch: tempfile::TempDir,
    git_dir: PathBuf,
    home: PathBuf,
    workspace: PathBuf,
    pub change: ChangeSet,
}

impl Capture {
    fn git(&self) -> Git {
        Git::new(&self.workspace, &self.home)
            .env("GIT_DIR", &self.git_dir)
            .env("GIT_WORK_TREE", &self.workspace)
            .env("GIT_INDEX_FILE", self.git_dir.join("index"))
    }

    /// The change as a patch (`git diff --binary` against the base), for a thread fro-bot cannot
    /// push to.
    pub fn patch(&self) -> Result<String, CaptureError> {
        self.diff(&["--binary"])
    }

    /// The change as a reader reviews it: a diff whose binary files are named, not carried (the
    /// threat check's model reads this).
    pub fn review_diff(&self) -> Result<String, CaptureError> {
        self.diff(&[])
    }

    fn diff(&self, extra: &[&str]) -> Result<String, CaptureError> {
        let out = self
            .git()
            .args(["diff", "--cached", "--no-color", "--no-ext-diff"])
            .args(extra)
            .args(["--no-textconv", "--no-renames", &self.change.base])
            .output()
            .map_err(|source| CaptureError::Git { source })?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Where the private git dir lives (tests).
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }
}

/// Reads the work tree's change against `base`.
pub fn capture(workspace: &Path, base: &Base) -> Result<Capture, CaptureError> {
    let scratch_err = |source| CaptureError::Scratch { source };
    let scratch = tempfile::tempdir().map_err(scratch_err)?;
    let home = private_home(scratch.path()).map_err(scratch_err)?;
    let repo = scratch.path().join("git");
    let git_err = |source| CaptureError::Git { source };
    Git::new(scratch.path(), &home)
        .args(["init", "-q", "--template="])
        .arg_path(&repo)
        .output()
        .map_err(git_err)?;
    let git_dir = repo.join(".git");
    let info = git_dir.join("objects/info");
    std::fs::create_dir_all(&info).map_err(scratch_err)?;
    std::fs::write(
        info.join("alternates"),
        format!("{}\n", base.objects.display()),
    )
    .map_err(scratch_err)?;
    let mut capture = Capture {
        scratch,
        git_dir,
        home,
        workspace: workspace.to_path_buf(),
        change: ChangeSet {
            base: base.commit.clone(),
            files: Vec::new(),
        },
    };
    capture
        .git()
        .args(["read-tree", &base.commit])
        .output()
        .map_err(git_err)?;
    capture
        .git()
        .args(["add", "-A", "--", "."])
        .output()
        .map_err(git_err)?;
    let raw = capture
        .git()
        .args(["diff-index", "--cached", "--raw", "-z", "--no-renames"])
        .args(["--no-abbrev", "--ignore-submodules=none", &base.commit])
        .output()
        .map_err(git_err)?;
    let mut files = parse_raw(&raw)?;
    fill_contents(&capture, &mut files)?;
    capture.change.files = files;
    Ok(capture)
}

impl Git {
    fn arg_path(self, p: &Path) -> Git {
        self.args([p.as_os_str()])
    }
}

const ZERO_OID: &str = "0000000000000000000000000000000000000000";

/// `:old-mode new-mode old-oid new-oid status\0path\0` records.
fn parse_raw(raw: &[u8]) -> Result<Vec<FileChange>, CaptureError> {
    let mut out = Vec::new();
    let mut fields = raw.split(|b| *b == 0).filter(|f| !f.is_empty());
    while let Some(meta) = fields.next() {
        let meta = String::from_utf8_lossy(meta);
        let path = fields.next().ok_or_else(|| CaptureError::Parse {
            what: format!("no path after {meta:?}"),
        })?;
        let parts: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        let [old_mode, new_mode, old_oid, new_oid, _status] = parts[..] else {
            return Err(CaptureError::Parse {
                what: meta.into_owned(),
            });
        };
        let side = |mode: &str, oid: &str| {
            (mode != "000000" && oid != ZERO_OID).then(|| Side {
                mode: Mode::parse(mode),
                oid: oid.to_string(),
            })
        };
        out.push(FileChange {
            path: path.to_vec(),
            old: side(old_mode, old_oid),
            new: side(new_mode, new_oid),
            content: Vec::new(),
            old_content: Vec::new(),
        });
    }
    Ok(out)
}

/// Reads every new blob, and the old blob of each modified file, in one `cat-file --batch`.
fn fill_contents(capture: &Capture, files: &mut [FileChange]) -> Result<(), CaptureError> {
    let blob = |s: &Option<Side>| match s {
        Some(s) if s.mode != Mode::Gitlink => Some(s.oid.clone()),
        _ => None,
    };
    let mut wanted: Vec<String> = Vec::new();
    for f in files.iter() {
        if let Some(new) = blob(&f.new) {
            wanted.push(new);
            wanted.extend(blob(&f.old));
        }
    }
    if wanted.is_empty() {
        return Ok(());
    }
    let input: String = wanted.iter().map(|oid| format!("{oid}\n")).collect();
    let out = capture
        .git()
        .args(["cat-file", "--batch"])
        .output_with(Some(input.as_bytes()))
        .map_err(|source| CaptureError::Git { source })?;
    let blobs = parse_batch(&out)?;
    let get = |oid: &str| {
        blobs.get(oid).cloned().ok_or_else(|| CaptureError::Parse {
            what: format!("blob {oid} missing from cat-file"),
        })
    };
    for f in files.iter_mut() {
        if let Some(new) = blob(&f.new) {
            f.content = get(&new)?;
            if let Some(old) = blob(&f.old) {
                f.old_content = get(&old)?;
            }
        }
    }
    Ok(())
}

/// `<oid> <type> <size>\n<bytes>\n` records.
fn parse_batch(mut out: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, CaptureError> {
    let mut blobs = BTreeMap::new();
    while !out.is_empty() {
        let nl = out
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| CaptureError::Parse {
                what: "cat-file header without a newline".into(),
            })?;
        let header = String::from_utf8_lossy(&out[..nl]).into_owned();
        let parts: Vec<&str> = header.split(' ').collect();
        let [oid, _kind, size] = parts[..] else {
            return Err(CaptureError::Parse { what: header });
        };
        let size: usize = size.parse().map_err(|_| CaptureError::Parse {
            what: header.clone(),
        })?;
        let start = nl + 1;
        let end = start + size;
        let body = out.get(start..end).ok_or_else(|| CaptureError::Parse {
            what: format!("cat-file body of {oid} cut short"),
        })?;
        blobs.insert(oid.to_string(), body.to_vec());
        out = out.get(end + 1..).unwrap_or(&[]);
    }
    Ok(blobs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@e",
                "-c",
                "safe.directory=*",
            ])
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(ok.status.success(), "git {args:?}: {:?}", ok);
    }

    fn repo() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        git(d.path(), &["init", "-q", "-b", "main"]);
        std::fs::write(d.path().join("README.md"), "hello\n").unwrap();
        std::fs::write(d.path().join("old.txt"), "old\n").unwrap();
        std::fs::create_dir(d.path().join("src")).unwrap();
        std::fs::write(d.path().join("src/lib.rs"), "fn a() {}\n").unwrap();
        std::fs::write(d.path().join(".gitignore"), "target/\n").unwrap();
        git(d.path(), &["add", "."]);
        git(d.path(), &["commit", "-q", "-m", "init"]);
        d
    }

    fn paths(c: &ChangeSet) -> Vec<String> {
        c.files.iter().map(FileChange::path_lossy).collect()
    }

    #[test]
    fn edits_additions_deletions_and_the_agents_own_commits_are_the_change() {
        let d = repo();
        let ws = d.path();
        let base = record_base(ws).unwrap();
        std::fs::write(ws.join("README.md"), "hello\nworld\n").unwrap();
        std::fs::remove_file(ws.join("old.txt")).unwrap();
        std::fs::write(ws.join("new.txt"), "new\n").unwrap();
        std::fs::create_dir_all(ws.join("target")).unwrap();
        std::fs::write(ws.join("target/out.bin"), "ignored").unwrap();
        // The agent commits part of its work itself: it counts through the files it leaves.
        std::fs::write(ws.join("src/lib.rs"), "fn b() {}\n").unwrap();
        git(ws, &["commit", "-q", "-am", "agent"]);
        let c = capture(ws, &base).unwrap();
        assert_eq!(c.change.base, base.commit);
        assert_eq!(
            paths(&c.change),
            ["README.md", "new.txt", "old.txt", "src/lib.rs"]
        );
        let readme = &c.change.files[0];
        assert_eq!(readme.content, b"hello\nworld\n");
        assert_eq!(readme.old_content, b"hello\n");
        assert!(c.change.files[2].new.is_none(), "old.txt deleted");
        assert!(c.patch().unwrap().contains("+world"));
    }

    #[test]
    fn nothing_the_agent_plants_in_git_runs_while_the_change_is_read() {
        let d = repo();
        let ws = d.path();
        let base = record_base(ws).unwrap();
        let ran = tempfile::tempdir().unwrap();
        let mark = |name: &str| format!("#!/bin/sh\ntouch {}/{name}\n", ran.path().display());
        let hooks = ws.join(".git/hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        for hook in [
            "pre-commit",
            "post-checkout",
            "post-index-change",
            "fsmonitor-watchman",
            "reference-transaction",
        ] {
            std::fs::write(hooks.join(hook), mark(hook)).unwrap();
            Command::new("chmod")
                .arg("755")
                .arg(hooks.join(hook))
                .status()
                .unwrap();
        }
        let prog = ws.join(".git/prog.sh");
        std::fs::write(&prog, mark("program")).unwrap();
        Command::new("chmod")
            .arg("755")
            .arg(&prog)
            .status()
            .unwrap();
        let inc = ws.join(".git/extra.cfg");
        std::fs::write(&inc, format!("[core]\n\tfsmonitor = {}\n", prog.display())).unwrap();
        let mut cfg = std::fs::read_to_string(ws.join(".git/config")).unwrap();
        cfg.push_str(&format!(
            "[core]\n\tfsmonitor = {p}\n\thooksPath = .git/hooks\n\tpager = {p}\n[include]\n\tpath = {i}\n\
             [filter \"evil\"]\n\tclean = {p}\n\tsmudge = {p}\n\tprocess = {p}\n[diff \"evil\"]\n\ttextconv = {p}\n\
             [alias]\n\tadd = !{p}\n",
            p = prog.display(),
            i = inc.display()
        ));
        std::fs::write(ws.join(".git/config"), cfg).unwrap();
        std::fs::write(ws.join(".gitattributes"), "* filter=evil diff=evil\n").unwrap();
        std::fs::write(ws.join("README.md"), "changed\n").unwrap();
        let c = capture(ws, &base).unwrap();
        c.patch().unwrap();
        assert_eq!(paths(&c.change), [".gitattributes", "README.md"]);
        assert_eq!(
            c.change.files[1].content, b"changed\n",
            "no clean filter ran"
        );
        let ran: Vec<_> = std::fs::read_dir(ran.path()).unwrap().collect();
        assert!(ran.is_empty(), "planted programs ran: {ran:?}");
    }

    #[test]
    fn symlinks_modes_and_nested_repositories_are_reported_as_they_are() {
        let d = repo();
        let ws = d.path();
        let base = record_base(ws).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.join("link")).unwrap();
        std::fs::write(ws.join("run.sh"), "#!/bin/sh\n").unwrap();
        Command::new("chmod")
            .arg("755")
            .arg(ws.join("run.sh"))
            .status()
            .unwrap();
        let nested = ws.join("vendor/sub");
        std::fs::create_dir_all(&nested).unwrap();
        git(&nested, &["init", "-q"]);
        std::fs::write(nested.join("x"), "x").unwrap();
        git(&nested, &["add", "."]);
        git(&nested, &["commit", "-q", "-m", "x"]);
        let c = capture(ws, &base).unwrap();
        let by = |p: &str| c.change.files.iter().find(|f| f.path_lossy() == p).unwrap();
        assert_eq!(by("link").new.as_ref().unwrap().mode, Mode::Symlink);
        assert_eq!(
            by("link").content,
            b"/etc/passwd",
            "the link is read, never followed"
        );
        assert_eq!(by("run.sh").new.as_ref().unwrap().mode, Mode::Executable);
        assert_eq!(by("vendor/sub").new.as_ref().unwrap().mode, Mode::Gitlink);
    }
}
