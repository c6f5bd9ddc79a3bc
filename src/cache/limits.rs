//! Caps on what one restored entry may cost. A cache entry is written by anyone with cache write
//! access to the default branch's scope, so every cap rejects the whole entry, naming itself
//! (docs/persistence.md, "Restoring untrusted entries").

use std::fmt;
use std::path::Path;
use std::time::Duration;

/// Largest pax extended header (`x`, `g`) or GNU long-name/long-link (`L`, `K`) header accepted.
/// Checked against the header's declared size before a byte of it is read, so no header can make
/// the extractor allocate more than this. Ours are one `path` record (< 5 KiB).
pub const MAX_EXTENSION_HEADER_BYTES: u64 = 64 * 1024;
/// Most tar headers in one entry, each pax and GNU long-name header counted as one (our writer
/// emits two per member). OpenCode 1.18 keeps its memory in one database, so a real entry holds a
/// handful; this leaves room for a legacy `storage/` tree of 50 000 files.
pub const MAX_HEADERS: u64 = 100_000;
/// Longest member or hard-link target name, in bytes (Linux `PATH_MAX`).
pub const MAX_NAME_BYTES: usize = 4096;
/// Longest single path component (Linux `NAME_MAX`).
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Data accepted after the tar end-of-archive block: GNU tar pads to its 10 KiB record, other
/// writers to their block size; anything past this is not padding.
pub const MAX_TRAILING_BYTES: u64 = 1024 * 1024;
/// Decompressed bytes allowed per compressed byte of the entry. zstd squeezes a zero-filled file
/// about 30 000-fold; real databases and JSON compress 3–10-fold.
pub const EXPANSION_RATIO: u64 = 100;
/// The decompressed allowance of a small entry, whatever its size: a fresh database compresses
/// far better than the ratio.
pub const MIN_TOTAL_BYTES: u64 = 512 * 1024 * 1024;
/// Share of the free space at the restore target the extraction may fill, in percent: the job
/// needs the rest.
pub const FREE_DISK_PERCENT: u64 = 90;
/// Longest an extraction may run (a restore of a 1 GiB database takes seconds).
pub const MAX_DURATION: Duration = Duration::from_secs(300);

/// Which cap an entry exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cap {
    /// [`MAX_EXTENSION_HEADER_BYTES`].
    HeaderSize,
    /// [`MAX_HEADERS`].
    Members,
    /// [`MAX_NAME_BYTES`] / [`MAX_COMPONENT_BYTES`].
    NameLength,
    /// [`Limits::for_entry`]: all tar bytes read plus every hard-link copy.
    TotalSize,
    /// [`MAX_TRAILING_BYTES`].
    TrailingData,
    /// [`MAX_DURATION`].
    Time,
}

impl Cap {
    /// The cap's name as warnings and the summary show it.
    pub fn name(self) -> &'static str {
        match self {
            Cap::HeaderSize => "header-size",
            Cap::Members => "member-count",
            Cap::NameLength => "name-length",
            Cap::TotalSize => "total-size",
            Cap::TrailingData => "trailing-data",
            Cap::Time => "time",
        }
    }
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The caps one extraction runs under. [`Limits::for_entry`] is what restores use; tests and the
/// fuzz targets shrink them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_extension_header_bytes: u64,
    pub max_headers: u64,
    pub max_name_bytes: usize,
    pub max_total_bytes: u64,
    pub max_trailing_bytes: u64,
    pub max_duration: Duration,
}

impl Limits {
    /// The caps for an entry of `archive_bytes` compressed bytes restored onto a file system with
    /// `free_bytes` available: the total is `max(archive × EXPANSION_RATIO, MIN_TOTAL_BYTES)`, but
    /// never more than `FREE_DISK_PERCENT` of the free space.
    pub fn for_entry(archive_bytes: u64, free_bytes: u64) -> Self {
        let wanted = archive_bytes
            .saturating_mul(EXPANSION_RATIO)
            .max(MIN_TOTAL_BYTES);
        // In u128: the product cannot overflow, the quotient is at most `free_bytes`.
        let disk = (u128::from(free_bytes) * u128::from(FREE_DISK_PERCENT) / 100) as u64;
        Self {
            max_total_bytes: wanted.min(disk),
            ..Self::fixed(u64::MAX)
        }
    }

    /// The fixed caps with the given total.
    pub fn fixed(max_total_bytes: u64) -> Self {
        Self {
            max_extension_header_bytes: MAX_EXTENSION_HEADER_BYTES,
            max_headers: MAX_HEADERS,
            max_name_bytes: MAX_NAME_BYTES,
            max_total_bytes,
            max_trailing_bytes: MAX_TRAILING_BYTES,
            max_duration: MAX_DURATION,
        }
    }

    /// The limit `cap` stands at, for messages.
    pub fn limit_of(&self, cap: Cap) -> String {
        match cap {
            Cap::HeaderSize => format!("{} bytes", self.max_extension_header_bytes),
            Cap::Members => format!("{} headers", self.max_headers),
            Cap::NameLength => format!(
                "{} bytes, {MAX_COMPONENT_BYTES} per component",
                self.max_name_bytes
            ),
            Cap::TotalSize => format!("{} bytes", self.max_total_bytes),
            Cap::TrailingData => format!("{} bytes", self.max_trailing_bytes),
            Cap::Time => format!("{} s", self.max_duration.as_secs_f64()),
        }
    }
}

/// Bytes available to an unprivileged writer on the file system holding `path` (or its nearest
/// existing ancestor); `None` when it cannot be told.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists())?;
    let c_path = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a valid NUL-terminated string and `stat` points to writable memory of
    // the right type; statvfs initializes it when it returns 0.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: rc == 0, so statvfs filled the struct.
    let stat = unsafe { stat.assume_init() };
    // Both fields are u64 on the 64-bit Linux targets the action runs on.
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_follows_the_entry_and_the_disk() {
        const GIB: u64 = 1024 * 1024 * 1024;
        // Small entries get the floor; large ones the ratio; the disk caps both.
        assert_eq!(
            Limits::for_entry(500_000, 100 * GIB).max_total_bytes,
            MIN_TOTAL_BYTES
        );
        assert_eq!(
            Limits::for_entry(GIB, 1000 * GIB).max_total_bytes,
            100 * GIB
        );
        assert_eq!(Limits::for_entry(GIB, 10 * GIB).max_total_bytes, 9 * GIB);
        assert!(free_bytes(Path::new("/tmp/does/not/exist")).is_some_and(|b| b > 0));
    }
}
