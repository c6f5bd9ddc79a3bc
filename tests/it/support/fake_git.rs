//! Test service: the git side of the fake GitHub ([`super::fake_github`] routes here). A real
//! bare repository, cloned from a test's checkout, stands behind the branch, commit, compare and
//! pull-request routes, GraphQL `createCommitOnBranch` (built with git plumbing, as GitHub builds
//! a signed commit from the file changes it is sent) and git smart HTTP for fetching (`git
//! http-backend` as CGI, Basic auth with the fake's token; pushes are refused and counted).
//!
//! Git runs with a clean environment: no system or global configuration, a fixed identity,
//! `safe.directory=*` (tests run as root on checkouts the runner's user may own).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};

use super::fake_github::{error, ok, Data, FakeGitHub, Site, TOKEN};

/// The repository seeded pull requests belong to (requests name theirs in the path).
pub const REPO: &str = "octo/hello";
/// The head repository of a seeded fork pull request.
pub const FORK: &str = "forker/hello";
pub const BOT_NAME: &str = "github-actions[bot]";
pub const BOT_EMAIL: &str = "41898282+github-actions[bot]@users.noreply.github.com";
/// Who commits made "by a person" (`add_commit_on_branch`, merges) are by.
pub const PERSON: (&str, &str) = ("Mona Lisa Octocat", "mona@example.com");
const MERGED_AT: &str = "2026-11-29T10:00:00Z";
const CREATED_AT: &str = "2026-11-29T09:00:00Z";
const FIRST_PULL: u64 = 900;

/// The fake's git state, kept in its [`Data`].
#[derive(Debug, Default)]
pub(super) struct GitState {
    /// Holds `repo.git`; lives as long as the fake.
    dir: Option<tempfile::TempDir>,
    /// Numbers of the pull requests created through `POST /pulls`, in order.
    created_pulls: Vec<u64>,
    next_pull: Option<u64>,
    forbid_pulls: bool,
    /// Node ids of the pull requests `convertPullRequestToDraft` made drafts, in order.
    drafted: Vec<String>,
    /// `git-receive-pack` requests (push attempts), all refused.
    pushes: usize,
    /// Concurrent writers: (branch, path, contents) committed just before the next
    /// `createCommitOnBranch` on that branch.
    movers: Vec<(String, String, Vec<u8>)>,
    /// Commits `createCommitOnBranch` made (GitHub signs those).
    signed: BTreeSet<String>,
}

impl GitState {
    pub(super) fn repo(&self) -> Option<Repo> {
        self.dir.as_ref().map(|d| Repo {
            path: d.path().join("repo.git"),
        })
    }
}

/// Runs `git` with the clean environment; stdout, or stderr as the error.
fn run(mut cmd: Command, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, String> {
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("git {args:?}: {e}"))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(input)
            .map_err(|e| format!("git {args:?} stdin: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("git {args:?}: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `git` with no configuration but the command line's, a fixed identity and UTC dates.
fn git_command(cwd: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", cwd)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", PERSON.0)
        .env("GIT_AUTHOR_EMAIL", PERSON.1)
        .env("GIT_COMMITTER_NAME", PERSON.0)
        .env("GIT_COMMITTER_EMAIL", PERSON.1)
        .args(["-c", "safe.directory=*"]);
    cmd
}

/// The bare repository.
#[derive(Debug, Clone)]
pub(super) struct Repo {
    path: PathBuf,
}

/// A commit as GitHub's REST API describes it.
struct CommitInfo {
    tree: String,
    parents: Vec<String>,
    /// (name, email, date) of the author and the committer.
    author: (String, String, String),
    committer: (String, String, String),
    /// Without the trailing newline, as GitHub shows it.
    message: String,
}

impl Repo {
    pub(super) fn git_with(
        &self,
        args: &[&str],
        stdin: Option<&[u8]>,
        env: &[(&str, &OsStr)],
    ) -> Result<Vec<u8>, String> {
        let mut cmd = git_command(&self.path);
        cmd.env("GIT_DIR", &self.path);
        for (k, v) in env {
            cmd.env(k, v);
        }
        run(cmd, args, stdin)
    }

    /// Stdout as trimmed text.
    pub(super) fn git(&self, args: &[&str]) -> Result<String, String> {
        self.git_with(args, None, &[])
            .map(|out| String::from_utf8_lossy(&out).trim().to_string())
    }

    /// The commit `rev` names (a sha, branch or `refs/...`), if any.
    pub(super) fn resolve(&self, rev: &str) -> Option<String> {
        if rev.is_empty() || rev.starts_with('-') {
            return None;
        }
        let spec = format!("{rev}^{{commit}}");
        self.git(&["rev-parse", "--verify", "-q", "--end-of-options", &spec])
            .ok()
    }

    fn branch(&self, name: &str) -> Option<String> {
        self.resolve(&format!("refs/heads/{name}"))
    }

    fn default_branch(&self) -> String {
        self.git(&["symbolic-ref", "--short", "HEAD"])
            .unwrap_or_else(|_| "main".into())
    }

    fn object_exists(&self, sha: &str) -> bool {
        !sha.starts_with('-') && self.git(&["cat-file", "-e", sha]).is_ok()
    }

    pub(super) fn is_ancestor(&self, a: &str, b: &str) -> bool {
        self.git(&["merge-base", "--is-ancestor", a, b]).is_ok()
    }

    /// Moves (or creates, `old` empty) a ref, failing when it no longer points at `old`.
    fn update_ref(&self, name: &str, new: &str, old: &str) -> Result<(), String> {
        self.git(&["update-ref", name, new, old]).map(drop)
    }

    fn count(&self, range: &str) -> u64 {
        self.git(&["rev-list", "--count", range])
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    fn commit_info(&self, sha: &str) -> Option<CommitInfo> {
        let fmt = "%T%n%P%n%an%n%ae%n%ad%n%cn%n%ce%n%cd";
        let out = self
            .git(&[
                "show",
                "-s",
                "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
                &format!("--format={fmt}"),
                sha,
            ])
            .ok()?;
        let l: Vec<&str> = out.lines().collect();
        let raw = self
            .git_with(&["cat-file", "commit", sha], None, &[])
            .ok()?;
        let raw = String::from_utf8_lossy(&raw);
        let message = raw.split_once("\n\n").map_or("", |(_, m)| m);
        let person = |i: usize| (l[i].to_string(), l[i + 1].to_string(), l[i + 2].to_string());
        Some(CommitInfo {
            tree: l.first()?.to_string(),
            parents: l.get(1)?.split_whitespace().map(str::to_string).collect(),
            author: person(2),
            committer: person(5),
            message: message.trim_end_matches('\n').to_string(),
        })
    }

    /// `git diff --name-status` from `from` (the empty tree when `None`) to `to`, in GitHub's
    /// words for the status.
    fn changed_files(&self, from: Option<&str>, to: &str) -> Vec<Value> {
        let empty;
        let from = match from {
            Some(f) => f,
            None => {
                empty = self
                    .git_with(&["hash-object", "-t", "tree", "--stdin"], Some(b""), &[])
                    .map(|o| String::from_utf8_lossy(&o).trim().to_string())
                    .unwrap_or_default();
                &empty
            }
        };
        // `--raw`: `:mode mode blob blob status`, then the path; the new blob is GitHub's `sha`.
        let out = self
            .git_with(
                &[
                    "diff",
                    "--raw",
                    "-z",
                    "--no-abbrev",
                    "--no-renames",
                    from,
                    to,
                ],
                None,
                &[],
            )
            .unwrap_or_default();
        let fields: Vec<String> = out
            .split(|b| *b == 0)
            .filter(|f| !f.is_empty())
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .collect();
        fields
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| {
                let raw: Vec<&str> = c[0].split_whitespace().collect();
                let status = match raw.get(4).copied() {
                    Some("A") => "added",
                    Some("D") => "removed",
                    Some("T") => "changed",
                    _ => "modified",
                };
                let blob = raw.get(3).copied().unwrap_or("");
                json!({"filename": c[1], "status": status, "sha": blob})
            })
            .collect()
    }

    /// Every file of `rev`'s tree with its contents.
    fn files(&self, rev: &str) -> BTreeMap<String, Vec<u8>> {
        let Ok(list) = self.git_with(&["ls-tree", "-r", "-z", rev], None, &[]) else {
            return BTreeMap::new();
        };
        list.split(|b| *b == 0)
            .filter(|e| !e.is_empty())
            .filter_map(|entry| {
                let entry = String::from_utf8_lossy(entry);
                let (meta, path) = entry.split_once('\t')?;
                let sha = meta.split_whitespace().nth(2)?;
                let blob = self.git_with(&["cat-file", "blob", sha], None, &[]).ok()?;
                Some((path.to_string(), blob))
            })
            .collect()
    }

    /// A commit on `head` applying `deletions`, then `additions` (an addition keeps the mode of
    /// the file it replaces; new files are 100644). Writes no ref. The error is GitHub's
    /// `UNPROCESSABLE` message.
    fn write_commit(
        &self,
        head: &str,
        message: &str,
        changes: &FileChanges,
        identity: (&str, &str),
    ) -> Result<String, String> {
        let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
        let index = tmp.path().join("index");
        // `update-index --force-remove` wants a work tree, though it never looks at it.
        let empty = tmp.path().join("worktree");
        std::fs::create_dir(&empty).map_err(|e| e.to_string())?;
        let env: [(&str, &OsStr); 6] = [
            ("GIT_INDEX_FILE", index.as_os_str()),
            ("GIT_WORK_TREE", empty.as_os_str()),
            ("GIT_AUTHOR_NAME", OsStr::new(identity.0)),
            ("GIT_AUTHOR_EMAIL", OsStr::new(identity.1)),
            ("GIT_COMMITTER_NAME", OsStr::new(identity.0)),
            ("GIT_COMMITTER_EMAIL", OsStr::new(identity.1)),
        ];
        let git = |args: &[&str], stdin: Option<&[u8]>| -> Result<String, String> {
            self.git_with(args, stdin, &env)
                .map(|o| String::from_utf8_lossy(&o).trim().to_string())
        };
        git(&["read-tree", head], None)?;
        let listing = self
            .git_with(&["ls-files", "-s", "-z"], None, &env)
            .unwrap_or_default();
        let modes: BTreeMap<String, String> = listing
            .split(|b| *b == 0)
            .filter_map(|e| {
                let e = String::from_utf8_lossy(e);
                let (meta, path) = e.split_once('\t')?;
                Some((path.to_string(), meta.split(' ').next()?.to_string()))
            })
            .collect();
        for path in &changes.deletions {
            if !modes.contains_key(path) {
                return Err(format!(
                    "A path was requested for deletion which does not exist as of commit oid `{head}`"
                ));
            }
            git(&["update-index", "--force-remove", "--", path], None)?;
        }
        for (path, contents) in &changes.additions {
            let blob = git(&["hash-object", "-w", "--stdin"], Some(contents))?;
            let mode = modes.get(path).map_or("100644", String::as_str);
            let info = format!("{mode},{blob},{path}");
            git(&["update-index", "--add", "--cacheinfo", &info], None)?;
        }
        let tree = git(&["write-tree"], None)?;
        git(
            &["commit-tree", &tree, "-p", head, "-F", "-"],
            Some(message.as_bytes()),
        )
    }

    /// Commits `path` = `contents` on `branch` as a person; creates the branch from the default
    /// branch when absent.
    fn commit_as_person(&self, branch: &str, path: &str, contents: &[u8]) -> String {
        self.commit_on(branch, path, contents, &format!("Update {path}"), PERSON)
    }

    /// A commit of `path` = `contents` with `message` by `identity` on `branch` (made from the
    /// default branch when absent).
    fn commit_on(
        &self,
        branch: &str,
        path: &str,
        contents: &[u8],
        message: &str,
        identity: (&str, &str),
    ) -> String {
        let name = format!("refs/heads/{branch}");
        let (head, old) = match self.branch(branch) {
            Some(h) => (h.clone(), h),
            None => (
                self.branch(&self.default_branch())
                    .expect("the default branch"),
                String::new(),
            ),
        };
        let changes = FileChanges {
            additions: vec![(path.to_string(), contents.to_vec())],
            deletions: vec![],
        };
        let sha = self
            .write_commit(&head, message, &changes, identity)
            .expect("a commit");
        self.update_ref(&name, &sha, &old)
            .expect("the branch moves");
        sha
    }

    /// A merge of `head` into `base` (`git merge-tree`), as the merge button makes it.
    fn merge_commit(&self, base: &str, head: &str, message: &str) -> String {
        let out = self
            .git(&["merge-tree", "--write-tree", base, head])
            .expect("a clean merge");
        let tree = out.lines().next().expect("a tree").to_string();
        let sha = self
            .git_with(
                &["commit-tree", &tree, "-p", base, "-p", head, "-F", "-"],
                Some(message.as_bytes()),
                &[],
            )
            .expect("a merge commit");
        String::from_utf8_lossy(&sha).trim().to_string()
    }
}

/// `createCommitOnBranch`'s `fileChanges`.
struct FileChanges {
    additions: Vec<(String, Vec<u8>)>,
    deletions: Vec<String>,
}

impl FileChanges {
    fn parse(v: &Value) -> Result<FileChanges, String> {
        let list = |k: &str| v[k].as_array().cloned().unwrap_or_default();
        let mut additions = Vec::new();
        for a in list("additions") {
            let path = a["path"].as_str().ok_or("an addition without a path")?;
            let contents = base64::engine::general_purpose::STANDARD
                .decode(
                    a["contents"]
                        .as_str()
                        .ok_or("an addition without contents")?,
                )
                .map_err(|_| format!("The contents of {path} are not valid Base64"))?;
            additions.push((path.to_string(), contents));
        }
        let deletions = list("deletions")
            .iter()
            .map(|d| d["path"].as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or("a deletion without a path")?;
        Ok(FileChanges {
            additions,
            deletions,
        })
    }
}

/// Percent-decodes a path part (`%2F` in a branch name).
pub(super) fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "Not Found")
}

fn unprocessable(message: &str) -> Response {
    error(StatusCode::UNPROCESSABLE_ENTITY, message)
}

/// REST routes backed by the repository (and pull requests); `None` for any other route.
pub(super) fn route(
    d: &mut Data,
    method: &Method,
    segments: &[&str],
    query: &BTreeMap<String, String>,
    body: &Value,
) -> Option<Response> {
    let ["repos", o, r, rest @ ..] = segments else {
        return None;
    };
    let full = format!("{o}/{r}");
    let repo = d.git.repo();
    let site = d.site.clone();
    let joined = |parts: &[&str]| decode(&parts.join("/"));
    let response = match (method.clone(), rest) {
        (Method::GET, []) => repository(&site, repo.as_ref(), o, r),
        (Method::GET, ["git", "ref", "heads", branch @ ..]) if !branch.is_empty() => {
            let Some(repo) = repo else {
                return Some(not_found());
            };
            let name = format!("refs/heads/{}", joined(branch));
            match repo.resolve(&name) {
                Some(sha) => ok(StatusCode::OK, ref_json(&site, &full, &name, &sha)),
                None => not_found(),
            }
        }
        (Method::POST, ["git", "refs"]) => create_ref(d, &full, body),
        (Method::GET, ["commits", rev @ ..]) if !rev.is_empty() => match repo {
            Some(repo) => commit(d, &repo, &full, &joined(rev)),
            None => not_found(),
        },
        (Method::GET, ["compare", spec @ ..]) if !spec.is_empty() => match repo {
            Some(repo) => compare(&site, &repo, &full, &joined(spec)),
            None => not_found(),
        },
        (Method::GET, ["pulls"]) => list_pulls(d, query),
        (Method::POST, ["pulls"]) => create_pull(d, o, r, body),
        (Method::GET, ["pulls", n]) => match n.parse().ok().and_then(|n| d.pulls.get(&n)) {
            Some(pr) => ok(StatusCode::OK, pr.clone()),
            None => not_found(),
        },
        _ => return None,
    };
    Some(response)
}

fn repository(site: &Site, repo: Option<&Repo>, o: &str, r: &str) -> Response {
    let default_branch = repo.map_or_else(|| "main".into(), Repo::default_branch);
    ok(
        StatusCode::OK,
        json!({"id": 1_296_269, "node_id": "R_kgDOAAAAAQ", "name": r, "full_name": format!("{o}/{r}"),
               "private": false, "fork": false, "default_branch": default_branch,
               "owner": {"login": o, "type": "Organization"},
               "html_url": format!("{}/{o}/{r}", site.web)}),
    )
}

fn ref_json(site: &Site, full: &str, name: &str, sha: &str) -> Value {
    let api = &site.api;
    json!({"ref": name, "node_id": format!("REF_{sha}"),
           "url": format!("{api}/repos/{full}/git/{name}"),
           "object": {"sha": sha, "type": "commit",
                      "url": format!("{api}/repos/{full}/git/commits/{sha}")}})
}

fn create_ref(d: &mut Data, full: &str, body: &Value) -> Response {
    let Some(repo) = d.git.repo() else {
        return not_found();
    };
    let (Some(name), Some(sha)) = (body["ref"].as_str(), body["sha"].as_str()) else {
        return unprocessable("Invalid request.");
    };
    let valid = name.starts_with("refs/")
        && name.matches('/').count() >= 2
        && repo.git(&["check-ref-format", name]).is_ok();
    if !valid {
        return unprocessable("Reference name is invalid");
    }
    if !repo.object_exists(sha) {
        return unprocessable("Object does not exist");
    }
    if repo.resolve(name).is_some() {
        return unprocessable("Reference already exists");
    }
    let Some(sha) = repo.resolve(sha) else {
        return unprocessable("Object does not exist");
    };
    if repo.update_ref(name, &sha, "").is_err() {
        return unprocessable("Reference already exists");
    }
    sync_pulls(d);
    ok(StatusCode::CREATED, ref_json(&d.site, full, name, &sha))
}

fn commit(d: &Data, repo: &Repo, full: &str, rev: &str) -> Response {
    let Some(sha) = repo.resolve(rev) else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("No commit found for SHA: {rev}"),
        );
    };
    let Some(c) = repo.commit_info(&sha) else {
        return not_found();
    };
    let signed = d.git.signed.contains(&sha);
    let (web, api) = (&d.site.web, &d.site.api);
    let person = |p: &(String, String, String)| json!({"name": p.0, "email": p.1, "date": p.2});
    let parents: Vec<Value> = c
        .parents
        .iter()
        .map(|p| json!({"sha": p, "html_url": format!("{web}/{full}/commit/{p}")}))
        .collect();
    let files = repo.changed_files(c.parents.first().map(String::as_str), &sha);
    ok(
        StatusCode::OK,
        json!({"sha": sha, "node_id": format!("C_{sha}"),
               "html_url": format!("{web}/{full}/commit/{sha}"),
               "url": format!("{api}/repos/{full}/commits/{sha}"),
               "commit": {"message": c.message, "author": person(&c.author),
                          "committer": person(&c.committer), "tree": {"sha": c.tree},
                          "verification": {"verified": signed,
                                           "reason": if signed { "valid" } else { "unsigned" },
                                           "signature": null, "payload": null}},
               "author": null, "committer": null, "parents": parents, "files": files}),
    )
}

/// `base...head`: like GitHub's three-dot compare, the files changed since the merge base.
fn compare(site: &Site, repo: &Repo, full: &str, spec: &str) -> Response {
    let Some((base, head)) = spec.split_once("...") else {
        return not_found();
    };
    // `owner:branch` names a branch of a repository in the network; there is only this one.
    let strip = |s: &str| {
        s.split_once(':')
            .map_or(s.to_string(), |(_, b)| b.to_string())
    };
    let (base, head) = (strip(base), strip(head));
    let (Some(b), Some(h)) = (repo.resolve(&base), repo.resolve(&head)) else {
        return not_found();
    };
    let Ok(merge_base) = repo.git(&["merge-base", &b, &h]) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("No common ancestor between {base} and {head}."),
        );
    };
    let ahead = repo.count(&format!("{b}..{h}"));
    let behind = repo.count(&format!("{h}..{b}"));
    let status = match (ahead, behind) {
        (0, 0) => "identical",
        (_, 0) => "ahead",
        (0, _) => "behind",
        _ => "diverged",
    };
    let commits: Vec<Value> = repo
        .git(&["rev-list", "--reverse", &format!("{b}..{h}")])
        .unwrap_or_default()
        .lines()
        .map(|sha| {
            let message = repo.commit_info(sha).map(|c| c.message).unwrap_or_default();
            json!({"sha": sha, "commit": {"message": message}})
        })
        .collect();
    ok(
        StatusCode::OK,
        json!({"url": format!("{}/repos/{full}/compare/{spec}", site.api),
               "html_url": format!("{}/{full}/compare/{spec}", site.web),
               "status": status, "ahead_by": ahead, "behind_by": behind,
               "total_commits": ahead, "base_commit": {"sha": b},
               "merge_base_commit": {"sha": merge_base}, "commits": commits,
               "files": repo.changed_files(Some(&merge_base), &h)}),
    )
}

/// `owner:branch` of a pull request's head.
fn head_label(pr: &Value) -> String {
    let full = pr["head"]["repo"]["full_name"].as_str().unwrap_or("");
    let owner = full.split('/').next().unwrap_or("");
    format!("{owner}:{}", pr["head"]["ref"].as_str().unwrap_or(""))
}

fn list_pulls(d: &Data, query: &BTreeMap<String, String>) -> Response {
    let state = query.get("state").map_or("open", String::as_str);
    let head = query.get("head");
    let base = query.get("base");
    let list: Vec<Value> = d
        .pulls
        .values()
        .rev()
        .filter(|pr| state == "all" || pr["state"] == state)
        .filter(|pr| {
            head.is_none_or(|h| match h.split_once(':') {
                Some(_) => head_label(pr) == *h,
                None => pr["head"]["ref"] == h.as_str(),
            })
        })
        .filter(|pr| base.is_none_or(|b| pr["base"]["ref"] == b.as_str()))
        .cloned()
        .collect();
    ok(StatusCode::OK, Value::Array(list))
}

/// A pull request in GitHub's REST shape.
fn pull_json(
    site: &Site,
    number: u64,
    full: &str,
    head: Value,
    base: Value,
    title: &str,
    body: &str,
) -> Value {
    let (web, api) = (&site.web, &site.api);
    json!({"id": 1_000_000 + number, "node_id": format!("PR_{number}"), "number": number,
           "state": "open", "locked": false, "draft": false, "merged": false, "merged_at": null,
           "merge_commit_sha": null, "title": title, "body": body,
           "html_url": format!("{web}/{full}/pull/{number}"),
           "url": format!("{api}/repos/{full}/pulls/{number}"),
           "user": {"login": BOT_NAME, "type": "Bot"},
           "created_at": CREATED_AT, "updated_at": CREATED_AT,
           "head": head, "base": base})
}

/// One side (`head` or `base`) of a pull request.
fn side(full: &str, branch: &str, sha: Option<&str>) -> Value {
    let (owner, name) = full.split_once('/').unwrap_or((full, ""));
    json!({"label": format!("{owner}:{branch}"), "ref": branch, "sha": sha,
           "repo": {"full_name": full, "name": name, "owner": {"login": owner}}})
}

fn validation_failed(errors: Value) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        axum::Json(json!({"message": "Validation Failed", "errors": errors,
                          "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request",
                          "status": "422"})),
    )
        .into_response()
}

fn create_pull(d: &mut Data, o: &str, r: &str, body: &Value) -> Response {
    if d.git.forbid_pulls {
        return error(
            StatusCode::FORBIDDEN,
            "GitHub Actions is not permitted to create or approve pull requests.",
        );
    }
    let Some(repo) = d.git.repo() else {
        return not_found();
    };
    let full = format!("{o}/{r}");
    let text = |k: &str| body[k].as_str().unwrap_or("").to_string();
    let (title, head, base) = (text("title"), text("head"), text("base"));
    for (field, value) in [("title", &title), ("head", &head), ("base", &base)] {
        if value.is_empty() {
            return validation_failed(
                json!([{"resource": "PullRequest", "field": field, "code": "missing_field"}]),
            );
        }
    }
    let branch = head.split_once(':').map_or(head.as_str(), |(_, b)| b);
    let label = format!("{o}:{branch}");
    let (Some(head_sha), Some(base_sha)) = (repo.branch(branch), repo.branch(&base)) else {
        let field = if repo.branch(branch).is_none() {
            "head"
        } else {
            "base"
        };
        return validation_failed(
            json!([{"resource": "PullRequest", "field": field, "code": "invalid"}]),
        );
    };
    if d.pulls
        .values()
        .any(|pr| pr["state"] == "open" && head_label(pr) == label)
    {
        return validation_failed(json!([{"resource": "PullRequest", "code": "custom",
            "message": format!("A pull request already exists for {label}.")}]));
    }
    if repo.count(&format!("{base_sha}..{head_sha}")) == 0 {
        return validation_failed(json!([{"resource": "PullRequest", "code": "custom",
            "message": format!("No commits between {base} and {branch}")}]));
    }
    let mut number = d.git.next_pull.unwrap_or(FIRST_PULL);
    while d.pulls.contains_key(&number) || d.issues.contains_key(&number) {
        number += 1;
    }
    d.git.next_pull = Some(number + 1);
    let mut pr = pull_json(
        &d.site,
        number,
        &full,
        side(&full, branch, Some(&head_sha)),
        side(&full, &base, Some(&base_sha)),
        &title,
        &text("body"),
    );
    pr["draft"] = json!(body["draft"].as_bool().unwrap_or(false));
    let _ = repo.git(&["update-ref", &format!("refs/pull/{number}/head"), &head_sha]);
    d.pulls.insert(number, pr.clone());
    // On GitHub a pull request is also an issue: its conversation takes comments and labels.
    d.issues.insert(
        number,
        json!({"number": number, "title": title, "body": text("body"), "state": "open",
               "locked": false, "node_id": format!("PR_{number}"), "html_url": pr["html_url"],
               "user": pr["user"], "author_association": "NONE",
               "pull_request": {"url": pr["url"]}}),
    );
    d.git.created_pulls.push(number);
    ok(StatusCode::CREATED, pr)
}

/// Open pull requests follow their branches: `head.sha` (same-repository heads) and
/// `refs/pull/N/head`, `base.sha`.
fn sync_pulls(d: &mut Data) {
    let Some(repo) = d.git.repo() else {
        return;
    };
    for (n, pr) in d.pulls.iter_mut().filter(|(_, pr)| pr["state"] == "open") {
        if let Some(sha) = pr["base"]["ref"].as_str().and_then(|b| repo.branch(b)) {
            pr["base"]["sha"] = json!(sha);
        }
        if pr["head"]["repo"]["full_name"] != pr["base"]["repo"]["full_name"] {
            continue;
        }
        if let Some(sha) = pr["head"]["ref"].as_str().and_then(|b| repo.branch(b)) {
            pr["head"]["sha"] = json!(sha);
            let _ = repo.git(&["update-ref", &format!("refs/pull/{n}/head"), &sha]);
        }
    }
}

/// GraphQL `convertPullRequestToDraft` (`variables.id`, the pull request's node id): an open pull
/// request becomes a draft; an unknown id is GitHub's NOT_FOUND.
pub(super) fn convert_to_draft(d: &mut Data, vars: &Value) -> Response {
    let id = vars["id"].as_str().unwrap_or("");
    match d
        .pulls
        .values_mut()
        .find(|pr| pr["node_id"] == id && pr["state"] == "open")
    {
        Some(pr) => {
            pr["draft"] = json!(true);
            d.git.drafted.push(id.to_string());
            ok(
                StatusCode::OK,
                json!({"data": {"convertPullRequestToDraft": {"pullRequest": {"isDraft": true}}}}),
            )
        }
        None => ok(
            StatusCode::OK,
            json!({"data": {"convertPullRequestToDraft": null},
                   "errors": [{"type": "NOT_FOUND", "path": ["convertPullRequestToDraft"],
                               "message": format!("Could not resolve to a node with the global id of '{id}'")}]}),
        ),
    }
}

/// A `createCommitOnBranch` error in GitHub's shape (HTTP 200, `data.createCommitOnBranch` null).
fn mutation_error(kind: &str, message: &str) -> Response {
    ok(
        StatusCode::OK,
        json!({"data": {"createCommitOnBranch": null},
               "errors": [{"type": kind, "path": ["createCommitOnBranch"],
                           "locations": [{"line": 2, "column": 3}], "message": message}]}),
    )
}

/// GraphQL `createCommitOnBranch` (`variables.input`), applied to the bare repository.
pub(super) fn create_commit_on_branch(d: &mut Data, vars: &Value) -> Response {
    let input = &vars["input"];
    let text = |p: &str| input.pointer(p).and_then(Value::as_str).unwrap_or("");
    let full = text("/branch/repositoryNameWithOwner").to_string();
    let branch = text("/branch/branchName");
    let branch = branch
        .strip_prefix("refs/heads/")
        .unwrap_or(branch)
        .to_string();
    let (expected, headline, body) = (
        text("/expectedHeadOid"),
        text("/message/headline"),
        text("/message/body"),
    );
    let Some(repo) = d.git.repo() else {
        return mutation_error(
            "NOT_FOUND",
            &format!("Could not resolve to a Repository with the name '{full}'."),
        );
    };
    if let Some(i) = d.git.movers.iter().position(|m| m.0 == branch) {
        let (_, path, contents) = d.git.movers.remove(i);
        repo.commit_as_person(&branch, &path, &contents);
        sync_pulls(d);
    }
    let Some(head) = repo.branch(&branch) else {
        return mutation_error(
            "NOT_FOUND",
            &format!("A ref named \"refs/heads/{branch}\" does not exist."),
        );
    };
    if head != expected {
        return mutation_error(
            "STALE_DATA",
            &format!(
                "Expected branch to point to \"{expected}\" but it did not. Pull and try again."
            ),
        );
    }
    if headline.is_empty() {
        return mutation_error("UNPROCESSABLE", "A commit message headline is required");
    }
    let changes = match FileChanges::parse(&input["fileChanges"]) {
        Ok(c) if c.additions.is_empty() && c.deletions.is_empty() => {
            return mutation_error("UNPROCESSABLE", "No changes were specified")
        }
        Ok(c) => c,
        Err(m) => return mutation_error("UNPROCESSABLE", &m),
    };
    let message = if body.is_empty() {
        headline.to_string()
    } else {
        format!("{headline}\n\n{body}")
    };
    let sha = match repo.write_commit(&head, &message, &changes, (BOT_NAME, BOT_EMAIL)) {
        Ok(sha) => sha,
        Err(m) => return mutation_error("UNPROCESSABLE", &m),
    };
    if repo
        .update_ref(&format!("refs/heads/{branch}"), &sha, &head)
        .is_err()
    {
        return mutation_error(
            "STALE_DATA",
            &format!(
                "Expected branch to point to \"{expected}\" but it did not. Pull and try again."
            ),
        );
    }
    d.git.signed.insert(sha.clone());
    sync_pulls(d);
    let url = format!("{}/{full}/commit/{sha}", d.site.web);
    ok(
        StatusCode::OK,
        json!({"data": {"createCommitOnBranch": {"commit": {"oid": sha, "url": url}}}}),
    )
}

/// A git smart-HTTP request to hand to `git http-backend`.
pub(super) struct GitHttp {
    root: PathBuf,
    path_info: String,
    query: String,
    method: String,
    headers: HeaderMap,
    body: Bytes,
}

fn plain(status: StatusCode, text: &str) -> Response {
    (status, text.to_string()).into_response()
}

/// Whether `auth` is `Basic base64("x-access-token:" + TOKEN)`.
fn basic_auth_ok(auth: Option<&str>) -> bool {
    let Some((scheme, creds)) = auth.and_then(|a| a.trim().split_once(' ')) else {
        return false;
    };
    let decoded = base64::engine::general_purpose::STANDARD.decode(creds.trim());
    scheme.eq_ignore_ascii_case("basic")
        && decoded.is_ok_and(|d| d == format!("x-access-token:{TOKEN}").as_bytes())
}

/// Git smart HTTP at `/{owner}/{repo}.git/...`: `None` for any other path; else the CGI
/// request, or the answer GitHub gives without running it (401, refused push, 404).
/// Whether `path` is a repository's git smart HTTP path (`/{owner}/{name}.git/…`), which the web
/// host serves rather than the API.
pub(super) fn is_smart_http(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    matches!(segments.as_slice(), [owner, name, _, ..] if *owner != "repos" && name.ends_with(".git"))
}

pub(super) fn smart_http(
    d: &mut Data,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Result<GitHttp, Response>> {
    if !is_smart_http(path) {
        return None;
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let [owner, name, rest @ ..] = segments.as_slice() else {
        return None;
    };
    let rest = rest.join("/");
    let service = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "service")
        .map(|(_, v)| v.into_owned());
    if rest == "git-receive-pack" || service.as_deref() == Some("git-receive-pack") {
        d.git.pushes += 1;
        let repo = name.trim_end_matches(".git");
        return Some(Err(plain(
            StatusCode::FORBIDDEN,
            &format!("Permission to {owner}/{repo}.git denied to {BOT_NAME}.\n"),
        )));
    }
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
    if !basic_auth_ok(auth) {
        let mut r = plain(StatusCode::UNAUTHORIZED, "Invalid username or token.\n");
        r.headers_mut().insert(
            "www-authenticate",
            HeaderValue::from_static("Basic realm=\"GitHub\""),
        );
        return Some(Err(r));
    }
    let fetch = (*method == Method::GET
        && rest == "info/refs"
        && service.as_deref() == Some("git-upload-pack"))
        || (*method == Method::POST && rest == "git-upload-pack");
    let Some(dir) = d.git.dir.as_ref().filter(|_| fetch) else {
        return Some(Err(plain(StatusCode::NOT_FOUND, "Repository not found.\n")));
    };
    Some(Ok(GitHttp {
        root: dir.path().to_path_buf(),
        path_info: format!("/repo.git/{rest}"),
        query: query.unwrap_or("").to_string(),
        method: method.to_string(),
        headers: headers.clone(),
        body: body.clone(),
    }))
}

/// Runs `git http-backend` on one request and turns its CGI output into the response.
pub(super) async fn run_http_backend(req: GitHttp) -> Response {
    use tokio::io::AsyncWriteExt;
    let header = |name: &str| {
        req.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let mut cmd = tokio::process::Command::new("git");
    cmd.args(["-c", "safe.directory=*", "http-backend"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", &req.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", &req.path_info)
        .env("QUERY_STRING", &req.query)
        .env("REQUEST_METHOD", &req.method)
        .env("CONTENT_LENGTH", req.body.len().to_string())
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (var, name) in [
        ("CONTENT_TYPE", "content-type"),
        ("HTTP_GIT_PROTOCOL", "git-protocol"),
        ("HTTP_CONTENT_ENCODING", "content-encoding"),
    ] {
        if let Some(v) = header(name) {
            cmd.env(var, v);
        }
    }
    let mut child = cmd.spawn().expect("git http-backend starts");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let body = req.body.clone();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let out = child
        .wait_with_output()
        .await
        .expect("git http-backend runs");
    let _ = writer.await;
    cgi_response(&out.stdout)
}

/// Parses CGI output: headers (`Status:` among them), a blank line, the body.
fn cgi_response(out: &[u8]) -> Response {
    let crlf = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    let lf = out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let Some((end, sep)) = [crlf, lf].into_iter().flatten().min_by_key(|(i, _)| *i) else {
        return plain(StatusCode::BAD_GATEWAY, "git http-backend: no CGI headers");
    };
    let mut response = Response::new(Body::from(out[end + sep..].to_vec()));
    for line in String::from_utf8_lossy(&out[..end]).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split(' ').next().and_then(|c| c.parse().ok());
            if let Some(status) = code.and_then(|c| StatusCode::from_u16(c).ok()) {
                *response.status_mut() = status;
            }
        } else if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(n, v);
        }
    }
    response
}

/// Test-facing setup and accessors of the git side.
impl FakeGitHub {
    fn repo(&self) -> Repo {
        self.lock().git.repo().expect("seed_git_repo was called")
    }

    /// Serves a bare clone of `checkout` (its current branch is the default branch).
    pub fn seed_git_repo(&self, checkout: &Path) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let bare = dir.path().join("repo.git");
        let args = ["clone", "--bare", "-q", "--no-hardlinks"];
        // git drops `-c` settings (GIT_CONFIG_PARAMETERS) for the upload-pack it runs in the
        // checkout: a global file that trusts every directory reaches it.
        let config = dir.path().join("gitconfig");
        std::fs::write(&config, "[safe]\n\tdirectory = *\n").expect("a git config");
        let mut cmd = git_command(dir.path());
        cmd.env("GIT_CONFIG_GLOBAL", &config);
        cmd.args(args).arg(checkout).arg(&bare);
        run(cmd, &[], None).expect("git clone --bare");
        self.lock().git.dir = Some(dir);
    }

    pub fn bare_repo_path(&self) -> PathBuf {
        self.repo().path
    }

    pub fn branch_head(&self, branch: &str) -> Option<String> {
        self.repo().branch(branch)
    }

    /// The whole tree of `branch`: path → contents (empty when the branch is absent).
    pub fn branch_files(&self, branch: &str) -> BTreeMap<String, Vec<u8>> {
        let repo = self.repo();
        match repo.branch(branch) {
            Some(sha) => repo.files(&sha),
            None => BTreeMap::new(),
        }
    }

    /// The full message (headline, blank line, body), without a trailing newline.
    pub fn commit_message(&self, sha: &str) -> String {
        self.repo()
            .commit_info(sha)
            .expect("a known commit")
            .message
    }

    /// The first parent.
    pub fn commit_parent(&self, sha: &str) -> Option<String> {
        self.repo()
            .commit_info(sha)
            .expect("a known commit")
            .parents
            .first()
            .cloned()
    }

    /// (name, email) of the commit's author.
    pub fn commit_author(&self, sha: &str) -> (String, String) {
        let c = self.repo().commit_info(sha).expect("a known commit");
        (c.author.0, c.author.1)
    }

    /// Commits reachable from `head` and not from `base`, oldest first.
    pub fn commits_between(&self, base: &str, head: &str) -> Vec<String> {
        self.repo()
            .git(&["rev-list", "--reverse", &format!("{base}..{head}")])
            .expect("known revisions")
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The pull requests created through `POST /pulls`, as they are now, in order.
    pub fn created_pulls(&self) -> Vec<Value> {
        let d = self.lock();
        d.git
            .created_pulls
            .iter()
            .filter_map(|n| d.pulls.get(n).cloned())
            .collect()
    }

    /// `createCommitOnBranch` requests received (scripted failures included).
    pub fn commit_mutations(&self) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|r| {
                r.path == "/graphql"
                    && r.body["query"]
                        .as_str()
                        .is_some_and(|q| q.contains("createCommitOnBranch"))
            })
            .count()
    }

    /// Push attempts (`git-receive-pack` requests), all refused.
    pub fn git_pushes(&self) -> usize {
        self.lock().git.pushes
    }

    /// Commits `path` = `contents` on `branch` as a person would; creates the branch from the
    /// default branch when absent. Returns the new commit.
    pub fn add_commit_on_branch(
        &self,
        branch: &str,
        path: &str,
        contents: impl AsRef<[u8]>,
    ) -> String {
        let mut d = self.lock();
        let repo = d.git.repo().expect("seed_git_repo was called");
        let sha = repo.commit_as_person(branch, path, contents.as_ref());
        sync_pulls(&mut d);
        sha
    }

    /// A commit of fro-bot's on `branch` (made from the default branch when absent), as an earlier
    /// run on the thread left it: by the bot, with the run trailer. Returns the new commit.
    pub fn add_fro_bot_commit_on_branch(
        &self,
        branch: &str,
        path: &str,
        contents: impl AsRef<[u8]>,
    ) -> String {
        let mut d = self.lock();
        let repo = d.git.repo().expect("seed_git_repo was called");
        let message = format!(
            "Update {path}\n\n{} https://github.com/octo/hello/actions/runs/1",
            fro_bot::safe_outputs::branch::RUN_TRAILER
        );
        let sha = repo.commit_on(
            branch,
            path,
            contents.as_ref(),
            &message,
            (BOT_NAME, BOT_EMAIL),
        );
        sync_pulls(&mut d);
        sha
    }

    pub fn delete_branch(&self, branch: &str) {
        self.repo()
            .git(&["update-ref", "-d", &format!("refs/heads/{branch}")])
            .expect("the branch is deleted");
    }

    /// A concurrent writer: just before the next `createCommitOnBranch` on `branch`, the fake
    /// commits `path` = `contents` there, so the request's `expectedHeadOid` is stale.
    pub fn move_branch_before_next_commit(
        &self,
        branch: &str,
        path: &str,
        contents: impl AsRef<[u8]>,
    ) {
        self.lock().git.movers.push((
            branch.to_string(),
            path.to_string(),
            contents.as_ref().to_vec(),
        ));
    }

    /// Someone marks pull request `number` ready for review (or a draft again).
    pub fn set_pull_draft(&self, number: u64, draft: bool) {
        self.lock()
            .pulls
            .get_mut(&number)
            .expect("a known pull request")["draft"] = json!(draft);
    }

    /// The pull requests `convertPullRequestToDraft` made drafts (node ids), in order.
    pub fn drafted_pulls(&self) -> Vec<String> {
        self.lock().git.drafted.clone()
    }

    /// `POST /pulls` answers 403 as when Actions may not create pull requests.
    pub fn forbid_pull_request_creation(&self) {
        self.lock().git.forbid_pulls = true;
    }

    /// An open, non-draft pull request from `head_ref` (a branch of the repository) into main;
    /// from the fork `forker/hello` when `fork` (its head commit still in this repository, as
    /// `refs/pull/N/head` keeps it).
    pub fn seed_pull_on_branch(&self, number: u64, head_ref: &str, fork: bool) {
        let mut d = self.lock();
        let repo = d.git.repo().expect("seed_git_repo was called");
        let sha = repo.branch(head_ref).expect("the head branch exists");
        let base = repo.default_branch();
        let base_sha = repo.branch(&base);
        let head_repo = if fork { FORK } else { REPO };
        let mut pr = pull_json(
            &d.site,
            number,
            REPO,
            side(head_repo, head_ref, Some(&sha)),
            side(REPO, &base, base_sha.as_deref()),
            &format!("Changes from {head_ref}"),
            "",
        );
        pr["user"] = json!({"login": if fork { "forker" } else { "mona" }, "type": "User"});
        let _ = repo.git(&["update-ref", &format!("refs/pull/{number}/head"), &sha]);
        d.pulls.insert(number, pr);
    }

    /// Merges a pull request: fast-forwards its base to the head when possible, else a merge
    /// commit; the pull request is closed with `merged_at` set.
    pub fn merge_pull(&self, number: u64) {
        let mut d = self.lock();
        let repo = d.git.repo().expect("seed_git_repo was called");
        let pr = d.pulls.get(&number).expect("a known pull request").clone();
        let head = pr["head"]["sha"].as_str().expect("a head sha").to_string();
        let base_ref = pr["base"]["ref"].as_str().expect("a base ref").to_string();
        let base = repo.branch(&base_ref).expect("the base branch exists");
        let merged = if repo.is_ancestor(&base, &head) {
            head
        } else {
            let message = format!(
                "Merge pull request #{number} from {}\n\n{}",
                head_label(&pr).replace(':', "/"),
                pr["title"].as_str().unwrap_or("")
            );
            repo.merge_commit(&base, &head, &message)
        };
        repo.update_ref(&format!("refs/heads/{base_ref}"), &merged, &base)
            .expect("the base moves");
        let pr = d.pulls.get_mut(&number).expect("a known pull request");
        pr["state"] = json!("closed");
        pr["merged"] = json!(true);
        pr["merged_at"] = json!(MERGED_AT);
        pr["closed_at"] = json!(MERGED_AT);
        pr["merge_commit_sha"] = json!(merged);
        sync_pulls(&mut d);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use base64::Engine;
    use serde_json::{json, Value};

    use crate::support::action::{chown_r, fresh_checkout, git};
    use crate::support::fake_github::{FakeGitHub, TOKEN};

    const BRANCH: &str = "fro-bot/issue-5";
    const MUTATION: &str = "mutation($input: CreateCommitOnBranchInput!) { \
        createCommitOnBranch(input: $input) { commit { oid url } } }";

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// `-c` value that authenticates git the way actions/checkout does.
    fn auth_header() -> String {
        let creds = b64(format!("x-access-token:{TOKEN}").as_bytes());
        format!("http.extraHeader=Authorization: Basic {creds}")
    }

    /// A client-side git: async, so the fake on the same runtime can answer it.
    async fn client_git(dir: &Path, args: &[&str]) -> std::process::Output {
        tokio::process::Command::new("git")
            .current_dir(dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .output()
            .await
            .expect("git runs")
    }

    async fn client_git_ok(dir: &Path, args: &[&str]) -> Vec<u8> {
        let out = client_git(dir, args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "git {args:?}: {stderr}");
        out.stdout
    }

    /// A fake serving a checkout with README.md, old.txt and an executable bin/run.sh, owned by
    /// the runner's uid as on a hosted runner.
    async fn seeded(tmp: &Path) -> FakeGitHub {
        use std::os::unix::fs::PermissionsExt;
        let checkout = tmp.join("checkout");
        fresh_checkout(&checkout, "hello\n");
        std::fs::write(checkout.join("old.txt"), "old\n").unwrap();
        std::fs::create_dir(checkout.join("bin")).unwrap();
        let script = checkout.join("bin/run.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        git(&checkout, &["add", "."]);
        git(&checkout, &["commit", "-q", "-m", "more"]);
        chown_r(&checkout, 1001);
        let fake = FakeGitHub::start().await;
        fake.seed_git_repo(&checkout);
        fake
    }

    struct Api {
        http: reqwest::Client,
        url: String,
    }

    impl Api {
        fn new(fake: &FakeGitHub) -> Api {
            Api {
                http: reqwest::Client::new(),
                url: fake.url.clone(),
            }
        }

        async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
            let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let url = format!("{}/api/v3/repos/octo/hello{path}", self.url);
            let mut req = self.http.request(method, url).bearer_auth(TOKEN);
            if let Some(body) = body {
                req = req.json(&body);
            }
            let response = req.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        }

        async fn get(&self, path: &str) -> (u16, Value) {
            self.send("GET", path, None).await
        }

        async fn post(&self, path: &str, body: Value) -> (u16, Value) {
            self.send("POST", path, Some(body)).await
        }

        async fn commit(
            &self,
            branch: &str,
            head: &str,
            additions: &[(&str, &[u8])],
            deletions: &[&str],
        ) -> Value {
            let additions: Vec<Value> = additions
                .iter()
                .map(|(p, c)| json!({"path": p, "contents": b64(c)}))
                .collect();
            let deletions: Vec<Value> = deletions.iter().map(|p| json!({"path": p})).collect();
            let input = json!({
                "branch": {"repositoryNameWithOwner": "octo/hello", "branchName": branch},
                "message": {"headline": "Apply changes", "body": "For #5"},
                "expectedHeadOid": head,
                "fileChanges": {"additions": additions, "deletions": deletions},
            });
            let body = json!({"query": MUTATION, "variables": {"input": input}});
            let response = self
                .http
                .post(format!("{}/api/graphql", self.url))
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 200);
            response.json().await.unwrap()
        }
    }

    /// Fetches `BRANCH` over smart HTTP into a new repository at `dir` and finds commit `oid`
    /// with the fake's tree, byte for byte and with the executable bit.
    async fn assert_fetched(fake: &FakeGitHub, dir: &Path, oid: &str, options: &[&str]) {
        std::fs::create_dir(dir).unwrap();
        client_git_ok(dir, &["init", "-q"]).await;
        let remote = format!("{}/octo/hello.git", fake.url);
        let auth = auth_header();
        let refspec = format!("refs/heads/{BRANCH}");
        let mut args = vec!["-c", &auth, "fetch", "-q"];
        args.extend_from_slice(options);
        args.extend([remote.as_str(), refspec.as_str()]);
        client_git_ok(dir, &args).await;
        let fetched = client_git_ok(dir, &["rev-parse", "FETCH_HEAD"]).await;
        assert_eq!(String::from_utf8_lossy(&fetched).trim(), oid);
        for (path, bytes) in &fake.branch_files(BRANCH) {
            let spec = format!("FETCH_HEAD:{path}");
            let blob = client_git_ok(dir, &["cat-file", "blob", &spec]).await;
            assert_eq!(&blob, bytes, "{path}");
        }
        let mode = client_git_ok(dir, &["ls-tree", "FETCH_HEAD", "bin/run.sh"]).await;
        assert!(mode.starts_with(b"100755"), "the executable bit stays");
    }

    #[tokio::test]
    async fn a_commit_made_through_graphql_is_fetched_byte_for_byte_over_smart_http() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = seeded(tmp.path()).await;
        let api = Api::new(&fake);
        let (_, repo) = api.get("").await;
        assert_eq!(repo["default_branch"], "main");
        assert_eq!(repo["full_name"], "octo/hello");
        let (status, main) = api.get("/git/ref/heads/main").await;
        assert_eq!(status, 200);
        let base = main["object"]["sha"].as_str().unwrap().to_string();
        let create = json!({"ref": format!("refs/heads/{BRANCH}"), "sha": base});
        let (status, created) = api.post("/git/refs", create.clone()).await;
        assert_eq!((status, &created["object"]["sha"]), (201, &json!(base)));
        let (status, again) = api.post("/git/refs", create).await;
        assert_eq!(
            (status, &again["message"]),
            (422, &json!("Reference already exists"))
        );
        let unknown = json!({"ref": "refs/heads/x", "sha": "1".repeat(40)});
        let (status, bad) = api.post("/git/refs", unknown).await;
        assert_eq!(
            (status, &bad["message"]),
            (422, &json!("Object does not exist"))
        );
        assert_eq!(api.get("/git/ref/heads/fro-bot%2Fissue-5").await.0, 200);
        assert_eq!(api.get("/git/ref/heads/absent").await.0, 404);

        let binary: Vec<u8> = (0..=255u8).rev().collect();
        let adds: [(&str, &[u8]); 3] = [
            ("a/b.txt", b"new\n"),
            ("bin/data.bin", &binary),
            ("bin/run.sh", b"#!/bin/sh\necho hi\n"),
        ];
        let answer = api.commit(BRANCH, &base, &adds, &["old.txt"]).await;
        let commit = &answer["data"]["createCommitOnBranch"]["commit"];
        let Some(oid) = commit["oid"].as_str().map(str::to_string) else {
            panic!("no commit: {answer}");
        };
        let url = format!("https://github.com/octo/hello/commit/{oid}");
        assert_eq!(commit["url"], url.as_str());
        assert_eq!(fake.branch_head(BRANCH).as_deref(), Some(oid.as_str()));
        assert_eq!(fake.commit_parent(&oid).as_deref(), Some(base.as_str()));
        assert_eq!(fake.commit_message(&oid), "Apply changes\n\nFor #5");
        assert_eq!(
            fake.commit_author(&oid),
            (super::BOT_NAME.into(), super::BOT_EMAIL.into())
        );

        let (_, rest) = api.get(&format!("/commits/{oid}")).await;
        assert_eq!(rest["commit"]["author"]["name"], super::BOT_NAME);
        assert_eq!(rest["commit"]["message"], "Apply changes\n\nFor #5");
        assert_eq!(rest["parents"][0]["sha"], base.as_str());
        assert_eq!(rest["commit"]["verification"]["verified"], true);
        let (_, cmp) = api.get(&format!("/compare/main...{BRANCH}")).await;
        assert_eq!(cmp["status"], "ahead");
        assert_eq!(
            (&cmp["ahead_by"], &cmp["behind_by"]),
            (&json!(1), &json!(0))
        );
        assert_eq!(cmp["merge_base_commit"]["sha"], base.as_str());
        let files: Vec<(String, String)> = cmp["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["filename"].to_string(), f["status"].to_string()))
            .collect();
        let want = [
            ("a/b.txt", "added"),
            ("bin/data.bin", "added"),
            ("bin/run.sh", "modified"),
            ("old.txt", "removed"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(f, s)| (json!(f).to_string(), json!(s).to_string()))
            .collect();
        assert_eq!(files, want);

        let tree = fake.branch_files(BRANCH);
        let names: Vec<&str> = tree.keys().map(String::as_str).collect();
        let want = ["README.md", "a/b.txt", "bin/data.bin", "bin/run.sh"];
        assert_eq!(names, want);
        assert_eq!(tree["bin/data.bin"], binary);
        assert_fetched(&fake, &tmp.path().join("full"), &oid, &[]).await;
        assert_fetched(&fake, &tmp.path().join("shallow"), &oid, &["--depth=1"]).await;

        let requests = fake.requests();
        let upload = requests
            .iter()
            .find(|r| r.method == "POST" && r.path == "/octo/hello.git/git-upload-pack")
            .expect("the fetch was recorded");
        assert!(upload.auth.as_deref().unwrap().starts_with("Basic "));
        assert_eq!((fake.commit_mutations(), fake.git_pushes()), (1, 0));
    }

    #[tokio::test]
    async fn a_stale_or_invalid_commit_request_gets_githubs_error_and_writes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = seeded(tmp.path()).await;
        let api = Api::new(&fake);
        let main = fake.branch_head("main").unwrap();
        let head = fake.add_commit_on_branch(BRANCH, "notes.txt", "mine\n");
        assert_eq!(fake.commit_parent(&head), Some(main.clone()));
        fake.move_branch_before_next_commit(BRANCH, "race.txt", "theirs\n");

        let answer = api
            .commit(BRANCH, &head, &[("client.txt", b"x")], &[])
            .await;
        assert!(answer["data"]["createCommitOnBranch"].is_null(), "{answer}");
        assert_eq!(answer["errors"][0]["type"], "STALE_DATA");
        let stale =
            format!("Expected branch to point to \"{head}\" but it did not. Pull and try again.");
        assert_eq!(answer["errors"][0]["message"], stale.as_str());
        assert_eq!(answer["errors"][0]["path"], json!(["createCommitOnBranch"]));
        let moved = fake.branch_head(BRANCH).unwrap();
        assert_eq!(fake.commit_parent(&moved), Some(head.clone()));
        assert_eq!(fake.commits_between("main", BRANCH), [head, moved.clone()]);
        let files = fake.branch_files(BRANCH);
        assert_eq!(files["race.txt"], b"theirs\n");
        assert!(!files.contains_key("client.txt"));

        let answer = api.commit("nope", &main, &[("x", b"x")], &[]).await;
        assert_eq!(answer["errors"][0]["type"], "NOT_FOUND");
        let missing = "A ref named \"refs/heads/nope\" does not exist.";
        assert_eq!(answer["errors"][0]["message"], missing);
        let answer = api.commit(BRANCH, &moved, &[], &["ghost.txt"]).await;
        assert_eq!(answer["errors"][0]["type"], "UNPROCESSABLE");
        let ghost = format!(
            "A path was requested for deletion which does not exist as of commit oid `{moved}`"
        );
        assert_eq!(answer["errors"][0]["message"], ghost.as_str());
        let answer = api.commit(BRANCH, &moved, &[], &[]).await;
        assert_eq!(answer["errors"][0]["message"], "No changes were specified");
        fake.fail_graphql("createCommitOnBranch", Some(1));
        let answer = api.commit(BRANCH, &moved, &[("y", b"y")], &[]).await;
        assert!(answer["errors"][0]["message"].is_string(), "{answer}");
        assert_eq!(fake.branch_head(BRANCH), Some(moved.clone()));
        assert_eq!(fake.branch_head("nope"), None);

        let answer = api.commit(BRANCH, &moved, &[("y", b"y")], &[]).await;
        let oid = answer["data"]["createCommitOnBranch"]["commit"]["oid"].clone();
        assert_eq!(fake.branch_head(BRANCH).map(Value::from), Some(oid));
        assert_eq!(fake.commit_mutations(), 6);
    }

    #[tokio::test]
    async fn fetching_needs_the_token_and_pushing_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = seeded(tmp.path()).await;
        let remote = format!("{}/octo/hello.git", fake.url);
        let http = reqwest::Client::new();
        let refs = format!("{remote}/info/refs?service=git-upload-pack");
        let anonymous = http.get(&refs).send().await.unwrap();
        assert_eq!(anonymous.status().as_u16(), 401);
        let challenge = anonymous.headers()["www-authenticate"].to_str().unwrap();
        assert_eq!(challenge, "Basic realm=\"GitHub\"");
        let wrong = http.get(&refs).basic_auth("x-access-token", Some("nope"));
        assert_eq!(wrong.send().await.unwrap().status().as_u16(), 401);
        let right = http.get(&refs).basic_auth("x-access-token", Some(TOKEN));
        let right = right.send().await.unwrap();
        assert_eq!(right.status().as_u16(), 200);
        let kind = right.headers()["content-type"].to_str().unwrap();
        assert_eq!(kind, "application/x-git-upload-pack-advertisement");

        let out = client_git(tmp.path(), &["ls-remote", &remote]).await;
        assert!(!out.status.success(), "no credentials, no refs");

        let auth = auth_header();
        let clone = tmp.path().join("clone");
        let clone_arg = clone.to_str().unwrap();
        client_git_ok(
            tmp.path(),
            &["-c", &auth, "clone", "-q", &remote, clone_arg],
        )
        .await;
        std::fs::write(clone.join("evil.txt"), "pushed\n").unwrap();
        client_git_ok(&clone, &["add", "."]).await;
        client_git_ok(&clone, &["commit", "-q", "-m", "evil"]).await;
        let args = ["-c", &auth, "push", "origin", "HEAD:refs/heads/evil"];
        let push = client_git(&clone, &args).await;
        assert!(!push.status.success());
        assert!(String::from_utf8_lossy(&push.stderr).contains("403"));
        assert!(fake.git_pushes() >= 1);
        assert_eq!(fake.branch_head("evil"), None);
    }

    #[tokio::test]
    async fn pull_requests_labels_and_issues_follow_githubs_rules() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = seeded(tmp.path()).await;
        let api = Api::new(&fake);
        fake.seed_issue(5, "Bug", "It breaks");
        fake.seed_labels(&["bug", "enhancement"]);
        let head = fake.add_commit_on_branch(BRANCH, "x.txt", "x\n");
        let list = format!("/pulls?head=octo:{BRANCH}&state=all");
        assert_eq!(api.get(&list).await.1, json!([]));
        let open = json!({"title": "Fix", "body": "Closes #5", "head": BRANCH,
                          "base": "main", "draft": true});
        let (status, pr) = api.post("/pulls", open.clone()).await;
        assert_eq!(
            (status, &pr["number"], &pr["draft"]),
            (201, &json!(900), &json!(true))
        );
        assert_eq!(pr["html_url"], "https://github.com/octo/hello/pull/900");
        assert_eq!(pr["head"]["sha"], head.as_str());
        let (status, dup) = api.post("/pulls", open).await;
        let exists = "A pull request already exists for octo:fro-bot/issue-5.";
        assert_eq!(
            (status, &dup["errors"][0]["message"]),
            (422, &json!(exists))
        );
        assert_eq!(api.get(&list).await.1[0]["number"], 900);
        let newer = fake.add_commit_on_branch(BRANCH, "y.txt", "y\n");
        assert_eq!(api.get("/pulls/900").await.1["head"]["sha"], newer.as_str());
        fake.merge_pull(900);
        assert_eq!(fake.branch_head("main"), Some(newer));
        let open_list = format!("/pulls?head=octo:{BRANCH}&state=open");
        assert_eq!(api.get(&open_list).await.1, json!([]));
        assert!(api.get(&list).await.1[0]["merged_at"].is_string());
        assert_eq!(fake.created_pulls().len(), 1);
        fake.forbid_pull_request_creation();
        let again = json!({"title": "t", "head": BRANCH, "base": "main"});
        let (status, refused) = api.post("/pulls", again).await;
        let forbidden = "GitHub Actions is not permitted to create or approve pull requests.";
        assert_eq!((status, &refused["message"]), (403, &json!(forbidden)));
        fake.seed_pull_on_branch(7, BRANCH, true);
        let (_, fork) = api.get("/pulls/7").await;
        assert_eq!(fork["head"]["repo"]["full_name"], "forker/hello");
        assert_eq!(
            fork["head"]["sha"],
            fake.branch_head(BRANCH).unwrap().as_str()
        );

        let (_, labels) = api.get("/labels?per_page=100&page=1").await;
        let names: Vec<&str> = labels
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["bug", "enhancement"]);
        assert_eq!(api.get("/labels?per_page=100&page=2").await.1, json!([]));
        let add = json!({"labels": ["Bug", "triage"]});
        let (status, now) = api.post("/issues/5/labels", add).await;
        assert_eq!((status, now.as_array().unwrap().len()), (200, 2));
        assert_eq!(fake.issue_labels(5), ["bug", "triage"]);
        assert!(fake.labels().contains(&"triage".to_string()));
        let (status, _) = api.send("DELETE", "/issues/5/labels/bug", None).await;
        assert_eq!(
            (status, fake.issue_labels(5)),
            (200, vec!["triage".to_string()])
        );
        assert_eq!(
            api.send("DELETE", "/issues/5/labels/bug", None).await.0,
            404
        );
        let issue = json!({"title": "Follow-up", "body": "Later", "labels": ["enhancement"]});
        let (status, created) = api.post("/issues", issue.clone()).await;
        assert_eq!((status, &created["number"]), (201, &json!(901)));
        assert_eq!(
            created["html_url"],
            "https://github.com/octo/hello/issues/901"
        );
        assert_eq!(fake.created_issues(), [issue]);
        assert_eq!(fake.issue_labels(901), ["enhancement"]);
    }
}
