//! The archive writer: pax tar of the cache paths, member names relative to the workspace, one
//! zstd frame with a checksum, written to a file so the upload can stream it.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use tar::{Builder, EntryType, Header};

use super::paths;
use super::{CacheError, WRITE_BUF};

/// zstd level: the toolkit's `zstdmt` default.
const LEVEL: i32 = 3;
/// 2 MiB window, as the toolkit's zstdmt: well under the 2^27 `unzstd` accepts without `--long`;
/// it also bounds zstdmt's job buffers (4 windows each), hence peak memory.
const WINDOW_LOG: u32 = 21;

/// What went into an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// Cache paths that existed and were archived.
    pub included: Vec<String>,
    /// Cache paths that did not exist (skipped, like the toolkit).
    pub missing: Vec<String>,
    /// Entries below the cache paths that are neither files nor directories (symlinks, sockets):
    /// left out because the extractor would reject them anyway.
    pub skipped_special: Vec<PathBuf>,
    /// Size of the compressed archive.
    pub size_bytes: u64,
}

/// Which of the cache paths exist.
struct Found {
    /// As given.
    included: Vec<String>,
    missing: Vec<String>,
    /// The included ones, resolved.
    roots: Vec<PathBuf>,
}

impl Found {
    fn of(paths: &[String], workspace: &Path) -> Result<Found, CacheError> {
        let mut found = Found {
            included: Vec::new(),
            missing: Vec::new(),
            roots: Vec::new(),
        };
        for p in paths {
            let abs = paths::resolve(workspace, p);
            match fs::symlink_metadata(&abs) {
                Ok(_) => {
                    found.included.push(p.clone());
                    found.roots.push(abs);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => found.missing.push(p.clone()),
                Err(e) => return Err(CacheError::io("cannot read cache path", abs, e)),
            }
        }
        Ok(found)
    }
}

/// A zstd stream into a new file at `dest`, as the toolkit's `zstdmt` writes one: one checksummed
/// frame, its level and window, compressed on every core. The error says what failed.
fn zstd_encoder(
    dest: &Path,
) -> Result<zstd::stream::write::Encoder<'static, BufWriter<File>>, (&'static str, io::Error)> {
    let file = File::create(dest).map_err(|e| ("cannot create", e))?;
    let mut encoder =
        zstd::stream::write::Encoder::new(BufWriter::with_capacity(WRITE_BUF, file), LEVEL)
            .map_err(|e| ("cannot start zstd", e))?;
    encoder
        .include_checksum(true)
        .and_then(|_| encoder.window_log(WINDOW_LOG))
        .map_err(|e| ("cannot configure zstd", e))?;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    if workers > 1 {
        // Still one frame: zstdmt splits the work, not the output.
        encoder
            .multithread(workers)
            .map_err(|e| ("cannot configure zstd workers", e))?;
    }
    Ok(encoder)
}

/// Writes the archive of `paths` (relative ones are resolved against `workspace`) to `dest`.
/// Fails with [`CacheError::NothingToSave`] when none of the paths exists.
pub fn write_archive(
    paths: &[String],
    workspace: &Path,
    dest: &Path,
) -> Result<ArchiveSummary, CacheError> {
    let Found {
        included,
        missing,
        roots,
    } = Found::of(paths, workspace)?;
    if roots.is_empty() {
        return Err(CacheError::NothingToSave {
            paths: paths.to_vec(),
        });
    }
    let archive_err = |detail: &str, source: io::Error| CacheError::Archive {
        path: dest.to_path_buf(),
        detail: detail.to_string(),
        source,
    };
    let encoder = zstd_encoder(dest).map_err(|(detail, e)| archive_err(detail, e))?;
    let mut builder = Builder::new(encoder);
    let mut writer = Writer {
        builder: &mut builder,
        workspace,
        skipped_special: Vec::new(),
    };
    for root in &roots {
        writer.add(root)?;
    }
    let skipped_special = writer.skipped_special;
    let encoder = builder
        .into_inner()
        .map_err(|e| archive_err("cannot finish tar", e))?;
    let mut buffered = encoder
        .finish()
        .map_err(|e| archive_err("cannot finish zstd", e))?;
    buffered
        .flush()
        .map_err(|e| archive_err("cannot write", e))?;
    let size_bytes = buffered
        .get_ref()
        .metadata()
        .map_err(|e| archive_err("cannot stat", e))?
        .len();
    Ok(ArchiveSummary {
        included,
        missing,
        skipped_special,
        size_bytes,
    })
}

struct Writer<'a, W: Write> {
    builder: &'a mut Builder<W>,
    workspace: &'a Path,
    skipped_special: Vec<PathBuf>,
}

impl<W: Write> Writer<'_, W> {
    /// Adds `path` and, for a directory, everything below it: the directory entry comes first.
    fn add(&mut self, path: &Path) -> Result<(), CacheError> {
        let meta =
            fs::symlink_metadata(path).map_err(|e| CacheError::io("cannot read", path, e))?;
        let name = paths::member_name(self.workspace, path);
        if meta.is_dir() {
            self.append(
                &format!("{name}/"),
                &meta,
                EntryType::Directory,
                io::empty(),
                path,
            )?;
            let mut children: Vec<PathBuf> = fs::read_dir(path)
                .and_then(|rd| rd.map(|e| e.map(|e| e.path())).collect())
                .map_err(|e| CacheError::io("cannot list", path, e))?;
            // Sorted: archives of the same tree are byte-identical and easy to diff.
            children.sort();
            for child in children {
                self.add(&child)?;
            }
        } else if meta.is_file() {
            let file = File::open(path).map_err(|e| CacheError::io("cannot open", path, e))?;
            // Size from the header, contents from the open file: a file still growing would
            // otherwise corrupt the stream, so read exactly the declared length.
            self.append(
                &name,
                &meta,
                EntryType::Regular,
                io::Read::take(file, meta.len()),
                path,
            )?;
        } else {
            tracing::warn!(
                "not caching {} (neither a file nor a directory)",
                path.display()
            );
            self.skipped_special.push(path.to_path_buf());
        }
        Ok(())
    }

    fn append(
        &mut self,
        name: &str,
        meta: &fs::Metadata,
        kind: EntryType,
        data: impl io::Read,
        source_path: &Path,
    ) -> Result<(), CacheError> {
        use std::os::unix::fs::MetadataExt;
        let err = |e| CacheError::Archive {
            path: source_path.to_path_buf(),
            detail: "cannot add to the archive".to_string(),
            source: e,
        };
        // The tar crate refuses `..` in set_path: the name goes in a pax `path` record (which GNU
        // tar and our reader prefer) and, as far as it fits, raw into the ustar name field.
        self.builder
            .append_pax_extensions([("path", name.as_bytes())])
            .map_err(err)?;
        let mut header = Header::new_ustar();
        if let Some(ustar) = header.as_ustar_mut() {
            let raw = name.as_bytes();
            let n = raw.len().min(ustar.name.len());
            ustar.name[..n].copy_from_slice(&raw[..n]);
        }
        header.set_entry_type(kind);
        header.set_size(if kind == EntryType::Regular {
            meta.len()
        } else {
            0
        });
        header.set_mode(meta.mode() & 0o7777);
        header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
        header.set_uid(u64::from(meta.uid()));
        header.set_gid(u64::from(meta.gid()));
        header.set_cksum();
        self.builder.append(&header, data).map_err(err)
    }
}
