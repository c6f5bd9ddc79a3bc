//! Confined extraction: only regular files and directories that land inside one of the requested
//! cache paths are written, first into a staging directory next to each target (same file system),
//! and moved into place only after the whole archive was read and its zstd checksum verified.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use tar::EntryType;

use super::paths;
use super::CacheError;

/// Why a member was not extracted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    /// `/tmp/x`: the toolkit's `-P` would write it anywhere.
    AbsolutePath,
    /// Resolves outside every requested cache path (`../../x`, another directory).
    OutsideCachePaths,
    /// Symlinks are never restored: one could redirect later members.
    Symlink,
    /// A hard link whose target is not a file restored from this archive inside the cache paths.
    HardLinkOutside { target: String },
    /// Devices, fifos and other special members.
    Special { kind: String },
    /// A name that is not UTF-8 or is empty.
    InvalidName,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedMember {
    pub name: String,
    pub reason: RejectReason,
}

/// What an extraction restored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtractReport {
    /// Cache paths replaced by their archived version.
    pub restored: Vec<PathBuf>,
    /// Members left out, each with the reason.
    pub rejected: Vec<RejectedMember>,
    pub files: u64,
    pub bytes: u64,
}

/// One requested cache path and, once a member for it appears, its staging directory.
struct Target {
    path: PathBuf,
    staging: Option<tempfile::TempDir>,
}

impl Target {
    /// Where the counterpart of `resolved` (inside this target) is staged.
    fn staged(&mut self, resolved: &Path) -> Result<PathBuf, CacheError> {
        let root = match &self.staging {
            Some(dir) => dir.path().join("item"),
            None => {
                let parent = self.path.parent().unwrap_or(Path::new("/"));
                fs::create_dir_all(parent)
                    .map_err(|e| extraction(parent, "cannot create the parent directory", e))?;
                let dir = tempfile::Builder::new()
                    .prefix(".fro-bot-restore-")
                    .tempdir_in(parent)
                    .map_err(|e| extraction(parent, "cannot create a staging directory", e))?;
                let root = dir.path().join("item");
                self.staging = Some(dir);
                root
            }
        };
        // `resolved` starts with `self.path` (checked by the caller); both are normalized.
        let rel = resolved.strip_prefix(&self.path).unwrap_or(Path::new(""));
        Ok(if rel.as_os_str().is_empty() {
            root
        } else {
            root.join(rel)
        })
    }
}

fn extraction(path: &Path, detail: &str, source: io::Error) -> CacheError {
    CacheError::Extraction {
        path: path.to_path_buf(),
        detail: detail.to_string(),
        source,
    }
}

/// Extracts `archive` (tar + zstd) confined to `paths` (resolved against `workspace`, as are the
/// member names). On any error nothing has been moved into place.
pub fn extract_confined(
    archive: &Path,
    paths: &[String],
    workspace: &Path,
) -> Result<ExtractReport, CacheError> {
    let workspace = paths::normalize(workspace);
    let mut targets: Vec<Target> = paths
        .iter()
        .map(|p| Target {
            path: paths::resolve(&workspace, p),
            staging: None,
        })
        .collect();
    let archive_err = |detail: &str, source: io::Error| CacheError::Archive {
        path: archive.to_path_buf(),
        detail: detail.to_string(),
        source,
    };
    let file = File::open(archive).map_err(|e| archive_err("cannot open", e))?;
    let mut tar = tar::Archive::new(Pipelined::spawn(file));
    let mut report = ExtractReport::default();
    // Staged regular files by resolved path, for hard links inside the archive.
    let mut staged_files: Vec<(PathBuf, PathBuf)> = Vec::new();

    let entries = tar
        .entries()
        .map_err(|e| archive_err("cannot read tar", e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| archive_err("corrupt or truncated archive", e))?;
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) {
            continue;
        }
        let raw = entry.path_bytes().into_owned();
        let Ok(name) = String::from_utf8(raw.clone()) else {
            report.rejected.push(RejectedMember {
                name: String::from_utf8_lossy(&raw).into_owned(),
                reason: RejectReason::InvalidName,
            });
            continue;
        };
        let reject = |reason| RejectedMember {
            name: name.clone(),
            reason,
        };
        let (resolved, target) = match locate(&name, &workspace, &targets) {
            Ok(found) => found,
            Err(reason) => {
                report.rejected.push(reject(reason));
                continue;
            }
        };
        match kind {
            EntryType::Directory => {
                let dest = targets[target].staged(&resolved)?;
                fs::create_dir_all(&dest)
                    .map_err(|e| extraction(&resolved, "cannot create directory", e))?;
            }
            EntryType::Regular | EntryType::Continuous => {
                let dest = targets[target].staged(&resolved)?;
                write_file(&mut entry, &dest, &resolved)?;
                report.files += 1;
                report.bytes += entry.header().size().unwrap_or(0);
                staged_files.push((resolved, dest));
            }
            EntryType::Link => {
                let link = entry
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                // Hard-link targets are workspace-relative names too; only a file this archive
                // already restored inside the cache paths may be linked (copied).
                let source = locate(&link, &workspace, &targets)
                    .ok()
                    .and_then(|(r, _)| staged_files.iter().find(|(p, _)| *p == r).cloned());
                match source {
                    Some((_, staged_source)) => {
                        let dest = targets[target].staged(&resolved)?;
                        if let Some(parent) = dest.parent() {
                            fs::create_dir_all(parent)
                                .map_err(|e| extraction(&resolved, "cannot create directory", e))?;
                        }
                        fs::copy(&staged_source, &dest)
                            .map_err(|e| extraction(&resolved, "cannot copy hard link", e))?;
                        report.files += 1;
                        staged_files.push((resolved, dest));
                    }
                    None => report
                        .rejected
                        .push(reject(RejectReason::HardLinkOutside { target: link })),
                }
            }
            EntryType::Symlink => report.rejected.push(reject(RejectReason::Symlink)),
            other => report.rejected.push(reject(RejectReason::Special {
                kind: format!("{other:?}"),
            })),
        }
    }
    // Read to the end of the zstd frame: this is where truncation and checksum errors surface.
    let mut decoder = tar.into_inner();
    io::copy(&mut decoder, &mut io::sink())
        .map_err(|e| archive_err("corrupt or truncated archive", e))?;

    for rejected in &report.rejected {
        tracing::warn!(
            "cache restore: rejected archive member {:?} ({:?})",
            rejected.name,
            rejected.reason
        );
    }
    // Outer paths first, so a nested target lands inside its (already moved) parent.
    targets.sort_by_key(|t| t.path.components().count());
    for target in targets {
        let Some(staging) = target.staging else {
            continue;
        };
        let item = staging.path().join("item");
        if fs::symlink_metadata(&item).is_err() {
            continue;
        }
        // Existing content at the target is replaced: moved aside into the staging dir (removed
        // with it), then the new tree renamed into place.
        if fs::symlink_metadata(&target.path).is_ok() {
            fs::rename(&target.path, staging.path().join("old"))
                .map_err(|e| extraction(&target.path, "cannot move the existing path aside", e))?;
        }
        fs::rename(&item, &target.path)
            .map_err(|e| extraction(&target.path, "cannot move the restored path into place", e))?;
        report.restored.push(target.path);
    }
    Ok(report)
}

/// What the decompression thread sends.
enum Chunk {
    Data(Vec<u8>),
    /// The zstd frame ended cleanly (checksum verified).
    End,
    Failed(io::Error),
}

/// zstd decompression on its own thread, so it overlaps with tar parsing and file writes (as
/// `zstd -d | tar -x` do). Ends only on an explicit [`Chunk::End`]: a vanished thread is an error,
/// never a silently short archive.
struct Pipelined {
    rx: std::sync::mpsc::Receiver<Chunk>,
    buf: Vec<u8>,
    pos: usize,
    ended: bool,
}

impl Pipelined {
    const CHUNK: usize = 64 * 1024;

    fn spawn(file: File) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        std::thread::spawn(move || {
            let mut decoder = match zstd::stream::read::Decoder::new(file) {
                Ok(d) => d,
                Err(e) => {
                    let _ = tx.send(Chunk::Failed(e));
                    return;
                }
            };
            loop {
                let mut chunk = vec![0u8; Self::CHUNK];
                let msg = match io::Read::read(&mut decoder, &mut chunk) {
                    Ok(0) => Chunk::End,
                    Ok(n) => {
                        chunk.truncate(n);
                        Chunk::Data(chunk)
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => Chunk::Failed(e),
                };
                let last = !matches!(msg, Chunk::Data(_));
                // A send error means the reader gave up (extraction failed): just stop.
                if tx.send(msg).is_err() || last {
                    return;
                }
            }
        });
        Self {
            rx,
            buf: Vec::new(),
            pos: 0,
            ended: false,
        }
    }
}

impl io::Read for Pipelined {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Chunk::Data(data)) => {
                    self.buf = data;
                    self.pos = 0;
                }
                Ok(Chunk::End) => self.ended = true,
                Ok(Chunk::Failed(e)) => return Err(e),
                Err(_) => return Err(io::Error::other("the decompression thread stopped early")),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Resolves a member name to an absolute path and the index of the innermost target holding it.
fn locate(
    name: &str,
    workspace: &Path,
    targets: &[Target],
) -> Result<(PathBuf, usize), RejectReason> {
    let trimmed = name.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(RejectReason::InvalidName);
    }
    if name.starts_with('/') {
        return Err(RejectReason::AbsolutePath);
    }
    let resolved = paths::normalize(&workspace.join(trimmed));
    targets
        .iter()
        .enumerate()
        .filter(|(_, t)| resolved.starts_with(&t.path))
        .max_by_key(|(_, t)| t.path.components().count())
        .map(|(i, _)| (resolved, i))
        .ok_or(RejectReason::OutsideCachePaths)
}

fn write_file<R: io::Read>(
    entry: &mut tar::Entry<'_, R>,
    dest: &Path,
    resolved: &Path,
) -> Result<(), CacheError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| extraction(resolved, "cannot create directory", e))?;
    }
    // A directory staged earlier under the same name (duplicate member) gives way to the file.
    if fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(dest)
            .map_err(|e| extraction(resolved, "cannot replace directory", e))?;
    }
    let out = File::create(dest).map_err(|e| extraction(resolved, "cannot create file", e))?;
    let mut out = io::BufWriter::with_capacity(super::WRITE_BUF, out);
    io::copy(entry, &mut out).map_err(|e| CacheError::Archive {
        path: resolved.to_path_buf(),
        detail: "corrupt or truncated archive".to_string(),
        source: e,
    })?;
    let out = out
        .into_inner()
        .map_err(|e| extraction(resolved, "cannot write file", e.into_error()))?;
    // Permission bits only: never setuid/setgid/sticky from an archive.
    if let Ok(mode) = entry.header().mode() {
        out.set_permissions(fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| extraction(resolved, "cannot set permissions", e))?;
    }
    if let Ok(mtime) = entry.header().mtime() {
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
        // Best effort: a wrong mtime does not make the restore wrong.
        let _ = out.set_modified(when);
    }
    Ok(())
}
