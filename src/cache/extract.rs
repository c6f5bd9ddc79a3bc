//! Confined extraction of an untrusted entry: every member must be exactly what our writer (or the
//! toolkit's `tar`) puts there for the requested cache paths, and the whole entry stays within the
//! caps of [`super::limits`]. Anything else refuses the entry as a whole ([`Rejection`]): members
//! are staged in a directory next to each target (same file system) and moved into place only
//! after the whole archive was read and its zstd checksum verified.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use tar::EntryType;

use super::limits::{self, Cap, Limits};
use super::paths;
use super::tar_reader::{MemberHeader, ReadError, TarReader};
use super::CacheError;

/// The zstd window (log2) the decoder accepts. Ours is 2^21 and so is the toolkit's `zstdmt`;
/// levels up to 19 stay within 2^23. A larger window is refused, because the decoder's buffer
/// grows to the window and a zero-filled stream fills it.
pub const WINDOW_LOG_MAX: u32 = 24;

/// What a cache path must be in an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// A regular file exactly at the path; nothing below it.
    File,
    /// A directory at the path, with directories, regular files and hard links to them below.
    Directory,
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathKind::File => "file",
            PathKind::Directory => "directory",
        })
    }
}

/// One cache path as restore needs it: the string (part of the cache version) and its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePath {
    pub path: String,
    pub kind: PathKind,
}

impl CachePath {
    pub fn file(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind: PathKind::File,
        }
    }

    pub fn directory(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind: PathKind::Directory,
        }
    }
}

/// What makes a member unacceptable (and with it the entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    /// `/tmp/x`: the toolkit's `-P` would write it anywhere.
    AbsolutePath,
    /// Not below any requested cache path (`../../x`, another directory).
    OutsideCachePaths,
    /// Below a cache path but with an empty, `.` or `..` component (`storage/../opencode.db`).
    NotCanonical,
    /// Symlinks are never restored: one could redirect later members.
    Symlink,
    /// A hard link whose target is not a regular file restored earlier from this entry.
    HardLinkOutside { target: String },
    /// Devices, fifos, sparse files and other special members.
    Special { kind: String },
    /// Empty, not UTF-8, or holding a NUL byte.
    InvalidName,
    /// The member's type is not what its cache path is (a directory at `opencode.db`).
    WrongKind { expected: PathKind, found: String },
    /// Inside a cache path that is a file (`opencode.db/x`), or below a file of this entry.
    BelowAFile,
    /// A second member with the same name.
    Duplicate,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::AbsolutePath => write!(f, "is an absolute path"),
            RejectReason::OutsideCachePaths => write!(f, "is outside the cache paths"),
            RejectReason::NotCanonical => write!(f, "has an empty, '.' or '..' component"),
            RejectReason::Symlink => write!(f, "is a symlink"),
            RejectReason::HardLinkOutside { target } => write!(
                f,
                "is a hard link to {:?}, not to a file restored earlier from this entry",
                excerpt(target)
            ),
            RejectReason::Special { kind } => {
                write!(f, "is a {kind} (only files and directories are restored)")
            }
            RejectReason::InvalidName => {
                write!(f, "has a name that is empty, not UTF-8 or holds a NUL byte")
            }
            RejectReason::WrongKind { expected, found } => {
                write!(f, "is a {found} where the cache path is a {expected}")
            }
            RejectReason::BelowAFile => write!(f, "lies below a file"),
            RejectReason::Duplicate => write!(f, "appears twice"),
        }
    }
}

/// Why an entry was refused as a whole. Carried by [`CacheError::Rejected`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// A cap of [`super::limits`] was exceeded; `limit` is its value, for the message.
    OverCap { cap: Cap, limit: String },
    /// A member no clean entry for these paths holds.
    Member { name: String, reason: RejectReason },
    /// Not a valid tar stream (header checksum, size field, pax record).
    Malformed { detail: String },
}

impl Rejection {
    /// The cap exceeded, if that is the reason.
    pub fn cap(&self) -> Option<Cap> {
        match self {
            Rejection::OverCap { cap, .. } => Some(*cap),
            Rejection::Member { .. } | Rejection::Malformed { .. } => None,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::OverCap { cap, limit } => write!(f, "it exceeds the {cap} cap ({limit})"),
            Rejection::Member { name, reason } => {
                write!(f, "member {:?} {reason}", excerpt(name))
            }
            Rejection::Malformed { detail } => write!(f, "it is not a valid tar archive: {detail}"),
        }
    }
}

/// Names in messages: at most 200 characters (a name may be 4 KiB of anything).
fn excerpt(name: &str) -> String {
    if name.chars().count() <= 200 {
        name.to_string()
    } else {
        let cut: String = name.chars().take(200).collect();
        format!("{cut}…")
    }
}

/// What an extraction restored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtractReport {
    /// Cache paths replaced by their archived version.
    pub restored: Vec<PathBuf>,
    pub files: u64,
    pub bytes: u64,
}

/// One requested cache path and, once a member for it appears, its staging directory.
struct Target {
    path: PathBuf,
    kind: PathKind,
    /// The member name of `path` (workspace-relative, `/`-separated).
    member: String,
    staging: Option<tempfile::TempDir>,
}

impl Target {
    /// Where the member `rel` (components below this target) is staged.
    fn staged(&mut self, rel: &[&str]) -> Result<PathBuf, CacheError> {
        let mut dest = match &self.staging {
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
        dest.extend(rel);
        Ok(dest)
    }
}

fn extraction(path: &Path, detail: &str, source: io::Error) -> CacheError {
    CacheError::Extraction {
        path: path.to_path_buf(),
        detail: detail.to_string(),
        source,
    }
}

fn rejected(rejection: Rejection) -> CacheError {
    CacheError::Rejected { rejection }
}

fn member_rejected(name: &str, reason: RejectReason) -> CacheError {
    rejected(Rejection::Member {
        name: name.to_string(),
        reason,
    })
}

/// Extracts `archive` (tar + zstd) confined to `targets` (resolved against `workspace`, as are the
/// member names), under [`Limits::for_entry`] for its size and the free disk. On any error nothing
/// has been moved into place.
pub fn extract_confined(
    archive: &Path,
    targets: &[CachePath],
    workspace: &Path,
) -> Result<ExtractReport, CacheError> {
    extract_archive(archive, targets, workspace, None)
}

/// [`extract_confined`], but each target is written to `into/{its file name}` instead of its own
/// path (member names still come from the targets): an entry read beside the live memory, for a
/// merge, without touching it.
pub fn extract_confined_into(
    archive: &Path,
    targets: &[CachePath],
    workspace: &Path,
    into: &Path,
) -> Result<ExtractReport, CacheError> {
    extract_archive(archive, targets, workspace, Some(into))
}

fn extract_archive(
    archive: &Path,
    targets: &[CachePath],
    workspace: &Path,
    into: Option<&Path>,
) -> Result<ExtractReport, CacheError> {
    let archive_err = |detail: &str, source: io::Error| CacheError::Archive {
        path: archive.to_path_buf(),
        detail: detail.to_string(),
        source,
    };
    let file = File::open(archive).map_err(|e| archive_err("cannot open", e))?;
    let size = file
        .metadata()
        .map_err(|e| archive_err("cannot stat", e))?
        .len();
    let workspace_n = paths::normalize(workspace);
    let free = match into {
        Some(dir) => limits::free_bytes(dir).unwrap_or(u64::MAX),
        None => targets
            .iter()
            .filter_map(|t| limits::free_bytes(&paths::resolve(&workspace_n, &t.path)))
            .min()
            .unwrap_or(u64::MAX),
    };
    let limits = Limits::for_entry(size, free);
    extract_stream(
        Pipelined::spawn(file),
        targets,
        workspace,
        limits,
        archive,
        into,
    )
}

/// Extracts an uncompressed tar stream confined to `targets` under `limits` (the fuzz targets and
/// tests drive this; restores go through [`extract_confined`]).
pub fn extract_tar(
    tar: impl Read,
    targets: &[CachePath],
    workspace: &Path,
    limits: Limits,
) -> Result<ExtractReport, CacheError> {
    extract_stream(
        tar,
        targets,
        workspace,
        limits,
        Path::new("<tar stream>"),
        None,
    )
}

fn extract_stream(
    stream: impl Read,
    targets: &[CachePath],
    workspace: &Path,
    limits: Limits,
    archive: &Path,
    into: Option<&Path>,
) -> Result<ExtractReport, CacheError> {
    let workspace = paths::normalize(workspace);
    let mut targets: Vec<Target> = targets
        .iter()
        .map(|t| {
            let path = paths::resolve(&workspace, &t.path);
            let member = paths::member_name(&workspace, &path);
            let path = match (into, path.file_name()) {
                (Some(dir), Some(name)) => dir.join(name),
                _ => path,
            };
            Target {
                member,
                path,
                kind: t.kind,
                staging: None,
            }
        })
        .collect();
    let read_err = |e: ReadError, limits: &Limits| match e {
        ReadError::Cap(cap) => rejected(Rejection::OverCap {
            cap,
            limit: limits.limit_of(cap),
        }),
        ReadError::Malformed(detail) => rejected(Rejection::Malformed { detail }),
        ReadError::Stream(source) => CacheError::Archive {
            path: archive.to_path_buf(),
            detail: "corrupt or truncated archive".to_string(),
            source,
        },
        ReadError::Write(source) => extraction(archive, "cannot write a restored file", source),
    };
    let mut reader = TarReader::new(stream, limits);
    let mut report = ExtractReport::default();
    loop {
        let member = match reader.next_member() {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => return Err(read_err(e, &limits)),
        };
        extract_member(&mut reader, &member, &mut targets, &mut report).map_err(|e| match e {
            MemberError::Read(e) => read_err(e, &limits),
            MemberError::Cache(e) => e,
        })?;
    }
    reader.finish().map_err(|e| read_err(e, &limits))?;
    move_into_place(targets, &mut report)?;
    Ok(report)
}

enum MemberError {
    Read(ReadError),
    Cache(CacheError),
}

impl From<CacheError> for MemberError {
    fn from(e: CacheError) -> Self {
        MemberError::Cache(e)
    }
}

impl From<ReadError> for MemberError {
    fn from(e: ReadError) -> Self {
        MemberError::Read(e)
    }
}

/// A member name as UTF-8 without NUL bytes.
fn member_name(raw: &[u8]) -> Result<&str, CacheError> {
    match std::str::from_utf8(raw) {
        Ok(name) if !name.is_empty() && !name.contains('\0') => Ok(name),
        _ => Err(member_rejected(
            &String::from_utf8_lossy(raw),
            RejectReason::InvalidName,
        )),
    }
}

fn extract_member<R: Read>(
    reader: &mut TarReader<R>,
    member: &MemberHeader,
    targets: &mut [Target],
    report: &mut ExtractReport,
) -> Result<(), MemberError> {
    let name = member_name(&member.name)?;
    let reject = |reason| MemberError::Cache(member_rejected(name, reason));
    let is_dir = member.kind == EntryType::Directory && !member.sparse;
    let (index, rel) =
        locate(name, is_dir, targets).map_err(|e| e.into_error(name, reader.limits()))?;
    let target = &mut targets[index];
    let expected = target.kind;
    let wrong = |found: &str| {
        reject(RejectReason::WrongKind {
            expected,
            found: found.to_string(),
        })
    };
    if member.sparse {
        return Err(reject(RejectReason::Special {
            kind: "sparse file".into(),
        }));
    }
    match (member.kind, expected, rel.is_empty()) {
        (_, PathKind::File, false) => Err(reject(RejectReason::BelowAFile)),
        (EntryType::Directory, PathKind::File, true) => Err(wrong("directory")),
        (EntryType::Directory, PathKind::Directory, _) => {
            let dest = target.staged(&rel)?;
            match fs::symlink_metadata(&dest) {
                Ok(m) if m.is_dir() => Ok(()),
                Ok(_) => Err(reject(RejectReason::Duplicate)),
                Err(_) => create_dirs(&dest, name),
            }
        }
        (EntryType::Regular | EntryType::Continuous, PathKind::Directory, true) => {
            Err(wrong("file"))
        }
        (EntryType::Regular | EntryType::Continuous, _, _) => {
            let dest = target.staged(&rel)?;
            let out = create_new(&dest, name)?;
            let written = write_file(reader, member, out, &dest)?;
            report.files += 1;
            report.bytes += written;
            Ok(())
        }
        (EntryType::Link, PathKind::Directory, false) => {
            let source = hard_link_source(member, targets)?;
            let dest = targets[index].staged(&rel)?;
            let len = fs::metadata(&source)
                .map_err(|e| extraction(&source, "cannot read a restored file", e))?
                .len();
            reader.account(len)?;
            let mut from =
                File::open(&source).map_err(|e| extraction(&source, "cannot open", e))?;
            let mut out = create_new(&dest, name)?;
            io::copy(&mut from, &mut out)
                .map_err(|e| extraction(&dest, "cannot copy hard link", e))?;
            report.files += 1;
            report.bytes += len;
            Ok(())
        }
        (EntryType::Link, _, _) => Err(wrong("hard link")),
        (EntryType::Symlink, _, _) => Err(reject(RejectReason::Symlink)),
        (other, _, _) => Err(reject(RejectReason::Special {
            kind: special_kind(other),
        })),
    }
}

fn special_kind(kind: EntryType) -> String {
    match kind {
        EntryType::Char => "character device".into(),
        EntryType::Block => "block device".into(),
        EntryType::Fifo => "fifo".into(),
        EntryType::GNUSparse => "sparse file".into(),
        other => format!("member of type {:?}", char::from(other.as_byte())),
    }
}

/// The staged regular file a hard link names: restored earlier from this entry, below a directory
/// cache path (file cache paths accept only a regular file).
fn hard_link_source(member: &MemberHeader, targets: &mut [Target]) -> Result<PathBuf, MemberError> {
    let name = member_name(&member.name)?;
    let link = member.link.as_deref().unwrap_or_default();
    let link_str = String::from_utf8_lossy(link).into_owned();
    let outside = || {
        MemberError::Cache(member_rejected(
            name,
            RejectReason::HardLinkOutside {
                target: link_str.clone(),
            },
        ))
    };
    let Ok(link) = std::str::from_utf8(link) else {
        return Err(outside());
    };
    let Ok((index, rel)) = locate(link, false, targets) else {
        return Err(outside());
    };
    if rel.is_empty() || targets[index].staging.is_none() {
        return Err(outside());
    }
    let source = targets[index].staged(&rel)?;
    match fs::symlink_metadata(&source) {
        Ok(m) if m.is_file() => Ok(source),
        _ => Err(outside()),
    }
}

/// A refusal by [`locate`], turned into the entry's rejection.
enum LocateError {
    Reason(RejectReason),
    ComponentTooLong,
}

impl LocateError {
    fn into_error(self, name: &str, limits: &Limits) -> MemberError {
        MemberError::Cache(match self {
            LocateError::Reason(reason) => member_rejected(name, reason),
            LocateError::ComponentTooLong => rejected(Rejection::OverCap {
                cap: Cap::NameLength,
                limit: limits.limit_of(Cap::NameLength),
            }),
        })
    }
}

/// The innermost target whose member name `name` is or lies below, and the components below it.
/// Only canonical names are accepted: the target's own member name, then `/`-separated
/// components that are neither empty, `.` nor `..` (a directory may end in one `/`).
fn locate<'n>(
    name: &'n str,
    is_dir: bool,
    targets: &[Target],
) -> Result<(usize, Vec<&'n str>), LocateError> {
    if name.starts_with('/') {
        return Err(LocateError::Reason(RejectReason::AbsolutePath));
    }
    let name = match name.strip_suffix('/') {
        Some(stripped) if is_dir => stripped,
        _ => name,
    };
    let (index, rest) = targets
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let rest = name.strip_prefix(t.member.as_str())?;
            (rest.is_empty() || rest.starts_with('/')).then_some((i, rest))
        })
        .max_by_key(|(_, rest)| std::cmp::Reverse(rest.len()))
        .ok_or(LocateError::Reason(RejectReason::OutsideCachePaths))?;
    let mut rel = Vec::new();
    if let Some(below) = rest.strip_prefix('/') {
        for part in below.split('/') {
            if part.is_empty() || part == "." || part == ".." {
                return Err(LocateError::Reason(RejectReason::NotCanonical));
            }
            if part.len() > limits::MAX_COMPONENT_BYTES {
                return Err(LocateError::ComponentTooLong);
            }
            rel.push(part);
        }
    }
    Ok((index, rel))
}

/// Creates `dir` and its parents in staging; a parent that is a file refuses the member.
fn create_dirs(dir: &Path, name: &str) -> Result<(), MemberError> {
    match fs::create_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotADirectory | io::ErrorKind::AlreadyExists
            ) =>
        {
            Err(MemberError::Cache(member_rejected(
                name,
                RejectReason::BelowAFile,
            )))
        }
        Err(e) => Err(MemberError::Cache(extraction(
            dir,
            "cannot create directory",
            e,
        ))),
    }
}

/// A new staged file; one that exists already is a duplicate member.
fn create_new(dest: &Path, name: &str) -> Result<File, MemberError> {
    if let Some(parent) = dest.parent() {
        create_dirs(parent, name)?;
    }
    match File::create_new(dest) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(MemberError::Cache(
            member_rejected(name, RejectReason::Duplicate),
        )),
        Err(e) => Err(MemberError::Cache(extraction(
            dest,
            "cannot create file",
            e,
        ))),
    }
}

fn write_file<R: Read>(
    reader: &mut TarReader<R>,
    member: &MemberHeader,
    out: File,
    dest: &Path,
) -> Result<u64, MemberError> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = io::BufWriter::with_capacity(super::WRITE_BUF, out);
    let written = reader.copy_data(&mut out)?;
    let out = out
        .into_inner()
        .map_err(|e| extraction(dest, "cannot write file", e.into_error()))?;
    // Permission bits only: never setuid/setgid/sticky from an archive.
    if let Some(mode) = member.mode {
        out.set_permissions(fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| extraction(dest, "cannot set permissions", e))?;
    }
    if let Some(mtime) = member.mtime {
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
        // Best effort: a wrong mtime does not make the restore wrong.
        let _ = out.set_modified(when);
    }
    Ok(written)
}

/// Replaces each target that the entry held by its staged version. Outer paths first, so a nested
/// target lands inside its (already moved) parent.
fn move_into_place(mut targets: Vec<Target>, report: &mut ExtractReport) -> Result<(), CacheError> {
    targets.sort_by_key(|t| t.path.components().count());
    for target in targets {
        let Some(staging) = target.staging else {
            continue;
        };
        let item = staging.path().join("item");
        if fs::symlink_metadata(&item).is_err() {
            continue;
        }
        // Existing content at the target is moved aside into the staging dir (removed with it),
        // then the new tree renamed into place.
        if fs::symlink_metadata(&target.path).is_ok() {
            fs::rename(&target.path, staging.path().join("old"))
                .map_err(|e| extraction(&target.path, "cannot move the existing path aside", e))?;
        }
        fs::rename(&item, &target.path)
            .map_err(|e| extraction(&target.path, "cannot move the restored path into place", e))?;
        report.restored.push(target.path);
    }
    Ok(())
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
/// never a silently short archive. Memory: at most 16 chunks of 64 KiB in flight plus the zstd
/// window ([`WINDOW_LOG_MAX`]).
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
            if let Err(e) = decoder.window_log_max(WINDOW_LOG_MAX) {
                let _ = tx.send(Chunk::Failed(e));
                return;
            }
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
