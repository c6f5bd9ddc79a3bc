//! `.git` is put back after the turn (docs/security.md#what-it-leaves-behind). The agent owns the
//! checkout for its turn, and a hook, `core.fsmonitor`, an `include.path` or an alias it writes into
//! `.git` would run in a later step of the job, as the runner's user, with that step's secrets.
//! Before the turn fro-bot snapshots, outside the agent's reach, the config, hooks, info and
//! `commondir` of the checkout's git dir and of its worktrees and submodules (`snapshot`); after
//! the turn they are restored exactly, files the agent added there removed (`restore`). A snapshot written to disk
//! for the post step is believed only when its SHA-256 matches the one main put in its state.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The most a snapshot may hold (hooks are small scripts; a checkout with more is not guarded).
const MAX_SNAPSHOT_BYTES: u64 = 16 << 20;

/// One path under `.git`, as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Node {
    File {
        #[serde(with = "b64")]
        content: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Symlink {
        target: String,
    },
    /// Something else (a FIFO, a socket): not restored, only removed.
    Other,
}

mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// The guarded paths of a checkout, relative to the workspace: root → every node under it (the
/// root itself at ""); a root that did not exist maps to nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitSnapshot {
    pub roots: BTreeMap<String, BTreeMap<String, Node>>,
}

#[derive(Debug, thiserror::Error)]
pub enum GitGuardError {
    #[error("cannot read {} for the .git snapshot", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the .git snapshot would hold over {MAX_SNAPSHOT_BYTES} bytes")]
    TooLarge,
    #[error("cannot put {} back", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the .git snapshot file {} is not the one the main step wrote", path.display())]
    Forged { path: PathBuf },
}

/// Git dirs of the checkout: `.git`, its worktrees and its submodules (nested too).
fn git_dirs(workspace: &Path) -> Vec<String> {
    let mut dirs = vec![".git".to_string()];
    let mut stack = vec![".git/modules".to_string(), ".git/worktrees".to_string()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(workspace.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if !ft.is_dir() {
                continue;
            }
            let child = format!("{rel}/{}", e.file_name().to_string_lossy());
            if workspace.join(&child).join("HEAD").is_file() {
                dirs.push(child.clone());
                stack.push(format!("{child}/modules"));
            } else if rel.ends_with("/modules") || rel.contains("/modules/") {
                // A submodule path with slashes nests plain dirs: look deeper.
                stack.push(child);
            }
        }
    }
    dirs
}

/// The roots guarded in each git dir. `commondir` (and a worktree's `gitdir`) are there because git
/// reads the config and hooks of the directory `commondir` names: one written by the agent would
/// hand a later step's git a config of the agent's, with its `core.fsmonitor`.
const GUARDED: &[&str] = &[
    "config",
    "config.worktree",
    "hooks",
    "info",
    "commondir",
    "gitdir",
];

/// Records the guarded paths, before the turn.
pub fn snapshot(workspace: &Path) -> Result<GitSnapshot, GitGuardError> {
    let mut snap = GitSnapshot::default();
    let mut total = 0u64;
    for dir in git_dirs(workspace) {
        for name in GUARDED {
            let rel = format!("{dir}/{name}");
            let mut nodes = BTreeMap::new();
            walk(&workspace.join(&rel), "", &mut nodes, &mut total)?;
            snap.roots.insert(rel, nodes);
        }
    }
    Ok(snap)
}

fn walk(
    path: &Path,
    rel: &str,
    out: &mut BTreeMap<String, Node>,
    total: &mut u64,
) -> Result<(), GitGuardError> {
    let read_err = |source| GitGuardError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(read_err(e)),
    };
    let ft = meta.file_type();
    let node = if ft.is_symlink() {
        let target = std::fs::read_link(path).map_err(read_err)?;
        Node::Symlink {
            target: target.to_string_lossy().into_owned(),
        }
    } else if ft.is_file() {
        *total += meta.len();
        if *total > MAX_SNAPSHOT_BYTES {
            return Err(GitGuardError::TooLarge);
        }
        Node::File {
            content: std::fs::read(path).map_err(read_err)?,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        }
    } else if ft.is_dir() {
        Node::Dir {
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        }
    } else {
        Node::Other
    };
    let is_dir = matches!(node, Node::Dir { .. });
    out.insert(rel.to_string(), node);
    if is_dir {
        let mut names: Vec<_> = std::fs::read_dir(path)
            .map_err(read_err)?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for n in names {
            let child = if rel.is_empty() {
                n.clone()
            } else {
                format!("{rel}/{n}")
            };
            walk(&path.join(&n), &child, out, total)?;
        }
    }
    Ok(())
}

/// What `restore` put back, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reverted {
    /// One line per changed root, e.g. ".git/config: core.fsmonitor, include.path".
    pub changes: Vec<String>,
}

impl Reverted {
    pub fn describe(&self) -> Option<String> {
        (!self.changes.is_empty())
            .then(|| format!("the agent changed {} — reverted", self.changes.join("; ")))
    }
}

/// Puts every guarded root back as `snap` recorded it. Never writes through a symlink: a git dir
/// that is no longer a real directory is removed instead (later git commands then find no
/// repository, and run nothing of the agent's).
pub fn restore(workspace: &Path, snap: &GitSnapshot) -> Result<Reverted, GitGuardError> {
    let mut reverted = Reverted::default();
    let mut total = 0u64;
    let dot_git = workspace.join(".git");
    if snap.roots.keys().any(|k| k.starts_with(".git/")) && !real_dir_chain(workspace, ".git") {
        remove_any(&dot_git)?;
        reverted
            .changes
            .push(".git itself (no longer a directory: removed)".into());
        return Ok(reverted);
    }
    for (rel, was) in &snap.roots {
        let parent = Path::new(rel)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        if !real_dir_chain(workspace, &parent.to_string_lossy()) {
            reverted.changes.push(format!(
                "{} (its directory was replaced: removed)",
                parent.display()
            ));
            remove_any(&workspace.join(&parent))?;
            continue;
        }
        let path = workspace.join(rel);
        let mut now = BTreeMap::new();
        // An unreadable or oversized root is treated as changed and rebuilt.
        let read = walk(&path, "", &mut now, &mut total);
        if read.is_ok() && now == *was {
            continue;
        }
        reverted.changes.push(describe_change(rel, was, &now));
        remove_any(&path)?;
        for (sub, node) in was {
            let target = if sub.is_empty() {
                path.clone()
            } else {
                path.join(sub)
            };
            put(&target, node)?;
        }
    }
    Ok(reverted)
}

/// Whether every component of `rel` under `workspace` is a real directory (no symlink).
fn real_dir_chain(workspace: &Path, rel: &str) -> bool {
    let mut at = workspace.to_path_buf();
    for c in Path::new(rel).components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_dir() => {}
            _ => return false,
        }
    }
    true
}

fn remove_any(path: &Path) -> Result<(), GitGuardError> {
    let err = |source| GitGuardError::Write {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(err(e)),
        // remove_dir_all never follows a symlink inside the tree.
        Ok(m) if m.file_type().is_dir() => std::fs::remove_dir_all(path).map_err(err),
        Ok(_) => std::fs::remove_file(path).map_err(err),
    }
}

fn put(path: &Path, node: &Node) -> Result<(), GitGuardError> {
    let err = |source| GitGuardError::Write {
        path: path.to_path_buf(),
        source,
    };
    match node {
        Node::File {
            content,
            mode,
            uid,
            gid,
        } => {
            std::fs::write(path, content).map_err(err)?;
            std::os::unix::fs::lchown(path, Some(*uid), Some(*gid)).map_err(err)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode)).map_err(err)
        }
        Node::Dir { mode, uid, gid } => {
            std::fs::create_dir(path).map_err(err)?;
            std::os::unix::fs::lchown(path, Some(*uid), Some(*gid)).map_err(err)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode)).map_err(err)
        }
        Node::Symlink { target } => std::os::unix::fs::symlink(target, path).map_err(err),
        Node::Other => Ok(()),
    }
}

/// One line naming what changed under a root: config keys, or the entries added, changed or
/// removed.
fn describe_change(
    rel: &str,
    was: &BTreeMap<String, Node>,
    now: &BTreeMap<String, Node>,
) -> String {
    let file = |m: &BTreeMap<String, Node>| match m.get("") {
        Some(Node::File { content, .. }) => Some(String::from_utf8_lossy(content).into_owned()),
        _ => None,
    };
    if rel.ends_with("/config") || rel.ends_with("/config.worktree") {
        let keys = config_diff(
            &file(was).unwrap_or_default(),
            &file(now).unwrap_or_default(),
        );
        if !keys.is_empty() {
            return format!("{rel}: {}", keys.join(", "));
        }
    }
    let mut parts = Vec::new();
    for (k, n) in now {
        match was.get(k) {
            None => parts.push(format!("added {}", shown(k))),
            Some(w) if w != n => parts.push(format!("changed {}", shown(k))),
            Some(_) => {}
        }
    }
    for k in was.keys().filter(|k| !now.contains_key(*k)) {
        parts.push(format!("removed {}", shown(k)));
    }
    match parts.is_empty() {
        true => rel.to_string(),
        false => format!("{rel}: {}", parts.join(", ")),
    }
}

fn shown(k: &str) -> String {
    match k {
        "" => "it".into(),
        k => k.chars().filter(|c| !c.is_control()).take(100).collect(),
    }
}

/// The `section.key` names whose values differ between two git config texts.
pub fn config_diff(was: &str, now: &str) -> Vec<String> {
    let a = config_entries(was);
    let b = config_entries(now);
    let mut names: Vec<String> = a
        .iter()
        .filter(|e| !b.contains(e))
        .chain(b.iter().filter(|e| !a.contains(e)))
        .map(|(k, _)| k.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

fn config_entries(text: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let header = rest.split(']').next().unwrap_or("");
            section = match header.split_once(char::is_whitespace) {
                Some((s, sub)) => format!("{}.{}", s.to_lowercase(), sub.trim().trim_matches('"')),
                None => header.to_lowercase(),
            };
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or((line, "true"));
        let name: String = format!("{section}.{}", key.trim().to_lowercase())
            .chars()
            .filter(|c| !c.is_control())
            .take(100)
            .collect();
        out.push((name, value.trim().to_string()));
    }
    out
}

/// Writes the snapshot for the post step into a fresh root-only file under `dir`; the path and
/// the SHA-256 go into main's state, which the agent cannot write.
pub fn persist(snap: &GitSnapshot, dir: &Path) -> std::io::Result<(PathBuf, String)> {
    use std::io::Write;
    let bytes = serde_json::to_vec(snap).map_err(std::io::Error::other)?;
    let mut file = tempfile::Builder::new()
        .prefix("fro-bot-git-snapshot-")
        .suffix(".json")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    file.write_all(&bytes)?;
    let (_, path) = file.keep().map_err(|e| e.error)?;
    Ok((path, hex::encode(Sha256::digest(&bytes))))
}

/// Reads a persisted snapshot, believed only when its digest is `sha256`.
pub fn load(path: &Path, sha256: &str) -> Result<GitSnapshot, GitGuardError> {
    let forged = || GitGuardError::Forged {
        path: path.to_path_buf(),
    };
    let meta = std::fs::symlink_metadata(path).map_err(|source| GitGuardError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.file_type().is_file() || meta.len() > MAX_SNAPSHOT_BYTES * 2 {
        return Err(forged());
    }
    let bytes = std::fs::read(path).map_err(|source| GitGuardError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if hex::encode(Sha256::digest(&bytes)) != sha256 {
        return Err(forged());
    }
    serde_json::from_slice(&bytes).map_err(|_| forged())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn repo() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let ok = Command::new("git")
            .args(["init", "-q"])
            .current_dir(d.path())
            .status()
            .unwrap();
        assert!(ok.success());
        d
    }

    #[test]
    fn hooks_config_and_info_the_agent_plants_are_put_back_exactly_and_named() {
        let d = repo();
        let ws = d.path();
        let before = snapshot(ws).unwrap();
        let cfg = ws.join(".git/config");
        let mut text = std::fs::read_to_string(&cfg).unwrap();
        text.push_str("[core]\n\tfsmonitor = /tmp/x.sh\n[include]\n\tpath = /tmp/inc\n[alias]\n\tst = !evil\n");
        std::fs::write(&cfg, text).unwrap();
        std::fs::write(ws.join(".git/hooks/post-checkout"), "#!/bin/sh\nevil\n").unwrap();
        std::fs::write(ws.join(".git/info/attributes"), "* filter=evil\n").unwrap();
        let reverted = restore(ws, &before).unwrap();
        assert_eq!(snapshot(ws).unwrap(), before, "exactly as it was");
        let text = reverted.describe().unwrap();
        assert!(
            text.contains(".git/config: alias.st, core.fsmonitor, include.path"),
            "{text}"
        );
        assert!(text.contains(".git/hooks: added post-checkout"), "{text}");
        assert!(text.contains(".git/info: added attributes"), "{text}");
        assert_eq!(
            restore(ws, &before).unwrap(),
            Reverted::default(),
            "idempotent"
        );
    }

    /// git of `ws` as a later step runs it, with the marker file its fsmonitor would make.
    fn later_status_runs_fsmonitor(ws: &Path) -> bool {
        let mark = ws.join("fsmonitor-ran");
        let _ = std::fs::remove_file(&mark);
        let out = Command::new("git")
            .args(["status", "--porcelain"])
            .current_dir(ws)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        mark.exists()
    }

    #[test]
    fn a_commondir_the_agent_writes_is_removed_so_no_config_of_its_own_is_read() {
        let d = repo();
        let ws = d.path();
        let before = snapshot(ws).unwrap();
        // A common dir of the agent's: the repository's refs and objects, its own config and hook.
        let git = ws.join(".git");
        let evil = git.join("evil");
        std::fs::create_dir_all(evil.join("refs/heads")).unwrap();
        std::fs::create_dir_all(evil.join("objects")).unwrap();
        let monitor = git.join("fsmon.sh");
        std::fs::write(
            &monitor,
            "#!/bin/sh\ntouch \"$(dirname \"$0\")/../fsmonitor-ran\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&monitor, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(
            evil.join("config"),
            format!(
                "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = {}\n",
                monitor.display()
            ),
        )
        .unwrap();
        std::fs::write(git.join("commondir"), "evil\n").unwrap();
        assert!(
            later_status_runs_fsmonitor(ws),
            "the plant works: git reads the config of the common dir"
        );
        let reverted = restore(ws, &before).unwrap();
        assert!(
            reverted.describe().unwrap().contains(".git/commondir"),
            "{reverted:?}"
        );
        assert!(!git.join("commondir").exists());
        assert!(
            !later_status_runs_fsmonitor(ws),
            "the agent's config is not read"
        );
    }

    #[test]
    fn a_replaced_hooks_dir_or_git_dir_is_never_written_through() {
        let d = repo();
        let ws = d.path();
        let before = snapshot(ws).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::remove_dir_all(ws.join(".git/hooks")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), ws.join(".git/hooks")).unwrap();
        restore(ws, &before).unwrap();
        assert!(std::fs::symlink_metadata(ws.join(".git/hooks"))
            .unwrap()
            .is_dir());
        assert_eq!(
            std::fs::read_dir(elsewhere.path()).unwrap().count(),
            0,
            "nothing written there"
        );

        // .git itself swapped for a link to a repository the agent made: removed, not followed.
        let evil = repo();
        std::fs::rename(ws.join(".git"), ws.join("old-git")).unwrap();
        std::os::unix::fs::symlink(evil.path().join(".git"), ws.join(".git")).unwrap();
        let evil_config = std::fs::read(evil.path().join(".git/config")).unwrap();
        let r = restore(ws, &before).unwrap();
        assert!(r.describe().unwrap().contains(".git itself"), "{r:?}");
        assert!(!ws.join(".git").exists());
        assert_eq!(
            std::fs::read(evil.path().join(".git/config")).unwrap(),
            evil_config
        );
    }

    #[test]
    fn a_persisted_snapshot_is_believed_only_with_its_digest() {
        let d = repo();
        let snap = snapshot(d.path()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (path, sha) = persist(&snap, dir.path()).unwrap();
        assert_eq!(load(&path, &sha).unwrap(), snap);
        let mut forged = snap.clone();
        forged.roots.insert(".git/hooks".into(), BTreeMap::new());
        std::fs::write(&path, serde_json::to_vec(&forged).unwrap()).unwrap();
        assert!(matches!(
            load(&path, &sha),
            Err(GitGuardError::Forged { .. })
        ));
    }
}
