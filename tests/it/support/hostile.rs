//! Hostile cache entries, as anyone with cache write access to the default branch's scope could
//! plant them: raw tar written block by block (no sanitizing: that is the point), streamed through
//! zstd so a 1 GiB header costs a few KB of entry and no test memory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use fro_bot::cache::{Cap, PathKind, RejectReason};
use tar::EntryType;

/// The data dir as a member-name prefix: workspace `<root>/workspace` or
/// `<root>/github/workspace`, data dir `<root>[/github]/home/.local/share/opencode`.
pub const D: &str = "../home/.local/share/opencode";
/// Every name a hostile member would create contains this, so a walk can prove none exists.
pub const PLANTED: &str = "pwned";

const BLOCK: u64 = 512;

pub struct TarZst {
    enc: zstd::stream::write::Encoder<'static, BufWriter<File>>,
}

impl TarZst {
    pub fn create(path: &Path) -> Self {
        let file = BufWriter::new(File::create(path).unwrap());
        let mut enc = zstd::stream::write::Encoder::new(file, 3).unwrap();
        enc.include_checksum(true).unwrap();
        TarZst { enc }
    }

    /// One header block with a raw ustar name/link (each at most 100 bytes).
    pub fn header(&mut self, name: &[u8], kind: EntryType, size: u64, link: &[u8]) -> &mut Self {
        let mut h = tar::Header::new_ustar();
        let u = h.as_ustar_mut().unwrap();
        u.name[..name.len()].copy_from_slice(name);
        u.linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        self.enc.write_all(h.as_bytes()).unwrap();
        self
    }

    pub fn bytes(&mut self, data: &[u8]) -> &mut Self {
        self.enc.write_all(data).unwrap();
        self
    }

    /// `n` copies of `byte`, streamed.
    pub fn fill(&mut self, byte: u8, mut n: u64) -> &mut Self {
        let chunk = vec![byte; 1 << 20];
        while n > 0 {
            let k = n.min(chunk.len() as u64) as usize;
            self.enc.write_all(&chunk[..k]).unwrap();
            n -= k as u64;
        }
        self
    }

    pub fn pad(&mut self, size: u64) -> &mut Self {
        let pad = (BLOCK - size % BLOCK) % BLOCK;
        self.fill(0, pad)
    }

    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.header(name.as_bytes(), EntryType::Regular, data.len() as u64, b"")
            .bytes(data)
            .pad(data.len() as u64)
    }

    pub fn dir(&mut self, name: &str) -> &mut Self {
        self.header(name.as_bytes(), EntryType::Directory, 0, b"")
    }

    /// A pax `x` header holding these records, then the member's own ustar header.
    pub fn pax_member(
        &mut self,
        records: &[(&str, &[u8])],
        kind: EntryType,
        data: &[u8],
    ) -> &mut Self {
        let mut body = Vec::new();
        for (k, v) in records {
            let rest = 1 + k.len() + 1 + v.len() + 1;
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {k}=").as_bytes());
            body.extend_from_slice(v);
            body.push(b'\n');
        }
        self.header(b"pax", EntryType::XHeader, body.len() as u64, b"")
            .bytes(&body)
            .pad(body.len() as u64)
            .header(b"placeholder", kind, data.len() as u64, b"")
            .bytes(data)
            .pad(data.len() as u64)
    }

    /// The end-of-archive blocks, then `trailing` more bytes of `byte`.
    pub fn end(mut self, trailing: u64, byte: u8) {
        self.fill(0, 2 * BLOCK);
        self.fill(byte, trailing);
        self.enc.finish().unwrap().flush().unwrap();
    }
}

/// What restoring a hostile entry must be refused with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    Cap(Cap),
    Member(RejectReason),
}

impl Expect {
    /// Words the warning must contain.
    pub fn needle(&self) -> String {
        match self {
            Expect::Cap(cap) => format!("{cap} cap"),
            Expect::Member(reason) => reason.to_string(),
        }
    }
}

pub struct Case {
    pub label: &'static str,
    pub expect: Expect,
    /// Writes the entry; the argument is an absolute directory outside the data dir (for names
    /// that try to reach it).
    pub build: fn(&Path, &Path),
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn wrong(expected: PathKind, found: &str) -> Expect {
    Expect::Member(RejectReason::WrongKind {
        expected,
        found: found.into(),
    })
}

/// Every hostile entry of issue 14, each with the refusal it must get.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            label: "GNU long-name header of 1 GiB",
            expect: Expect::Cap(Cap::HeaderSize),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.header(b"././@LongLink", EntryType::GNULongName, GIB, b"")
                    .fill(b'a', GIB)
                    .file(&format!("{D}/opencode.db"), b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "pax header of 1 GiB",
            expect: Expect::Cap(Cap::HeaderSize),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.header(b"pax", EntryType::XHeader, GIB, b"")
                    .fill(b'a', GIB)
                    .file(&format!("{D}/opencode.db"), b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "GNU long-link header of 256 MiB",
            expect: Expect::Cap(Cap::HeaderSize),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.header(b"././@LongLink", EntryType::GNULongLink, 256 * MIB, b"")
                    .fill(b'a', 256 * MIB)
                    .header(format!("{D}/storage/l").as_bytes(), EntryType::Link, 0, b"");
                t.end(0, 0);
            },
        },
        Case {
            label: "zero-filled opencode.db of 4 GiB",
            expect: Expect::Cap(Cap::TotalSize),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.header(
                    format!("{D}/opencode.db").as_bytes(),
                    EntryType::Regular,
                    4 * GIB,
                    b"",
                )
                .fill(0, 4 * GIB);
                t.end(0, 0);
            },
        },
        Case {
            label: "eight zero-filled files of 128 MiB",
            expect: Expect::Cap(Cap::TotalSize),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.dir(&format!("{D}/storage/"));
                for i in 0..8 {
                    t.header(
                        format!("{D}/storage/z{i}").as_bytes(),
                        EntryType::Regular,
                        128 * MIB,
                        b"",
                    )
                    .fill(0, 128 * MIB);
                }
                t.end(0, 0);
            },
        },
        Case {
            label: "hard-link amplification (64 MiB × 1000 links)",
            expect: Expect::Cap(Cap::TotalSize),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                let big = format!("{D}/storage/big");
                t.dir(&format!("{D}/storage/"))
                    .header(big.as_bytes(), EntryType::Regular, 64 * MIB, b"")
                    .fill(0, 64 * MIB);
                for i in 0..1000 {
                    t.header(
                        format!("{D}/storage/l{i}").as_bytes(),
                        EntryType::Link,
                        0,
                        big.as_bytes(),
                    );
                }
                t.end(0, 0);
            },
        },
        Case {
            label: "a million members",
            expect: Expect::Cap(Cap::Members),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.dir(&format!("{D}/storage/"));
                for i in 0..1_000_000 {
                    t.header(
                        format!("{D}/storage/f{i}").as_bytes(),
                        EntryType::Regular,
                        0,
                        b"",
                    );
                }
                t.end(0, 0);
            },
        },
        Case {
            label: "1 GiB of zeros after the tar end",
            expect: Expect::Cap(Cap::TrailingData),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.file(&format!("{D}/opencode.db"), b"db");
                t.end(GIB, 0);
            },
        },
        Case {
            label: "garbage after the tar end",
            expect: Expect::Cap(Cap::TrailingData),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.file(&format!("{D}/opencode.db"), b"db");
                t.end(4 * MIB, 0x5a);
            },
        },
        Case {
            label: "a member name of 5000 bytes",
            expect: Expect::Cap(Cap::NameLength),
            build: |dest, _| {
                let name = format!("{D}/storage/{}", "a".repeat(5000));
                let mut t = TarZst::create(dest);
                t.pax_member(&[("path", name.as_bytes())], EntryType::Regular, b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "a directory at opencode.db",
            expect: wrong(PathKind::File, "directory"),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.dir(&format!("{D}/opencode.db/"))
                    .file(&format!("{D}/opencode.db/{PLANTED}"), b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "a file below opencode.db",
            expect: Expect::Member(RejectReason::BelowAFile),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.file(&format!("{D}/opencode.db/{PLANTED}"), b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "a symlink at opencode.db",
            expect: Expect::Member(RejectReason::Symlink),
            build: |dest, outside| {
                let mut t = TarZst::create(dest);
                let target = outside.join(PLANTED);
                t.header(
                    format!("{D}/opencode.db").as_bytes(),
                    EntryType::Symlink,
                    0,
                    target.to_string_lossy().as_bytes(),
                );
                t.end(0, 0);
            },
        },
        Case {
            label: "a directory at fro-bot.json",
            expect: wrong(PathKind::File, "directory"),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.dir(&format!("{D}/fro-bot.json/"));
                t.end(0, 0);
            },
        },
        Case {
            label: "a NUL byte in a name (pax path)",
            expect: Expect::Member(RejectReason::InvalidName),
            build: |dest, _| {
                let name = format!("{D}/storage/{PLANTED}\0.json");
                let mut t = TarZst::create(dest);
                t.file(&format!("{D}/opencode.db"), b"good db").pax_member(
                    &[("path", name.as_bytes())],
                    EntryType::Regular,
                    b"x",
                );
                t.end(0, 0);
            },
        },
        Case {
            label: "a NUL byte in a name (GNU long name)",
            expect: Expect::Member(RejectReason::InvalidName),
            build: |dest, _| {
                let name = format!("{D}/storage/{PLANTED}\0x\0\0");
                let mut t = TarZst::create(dest);
                t.header(
                    b"././@LongLink",
                    EntryType::GNULongName,
                    name.len() as u64,
                    b"",
                )
                .bytes(name.as_bytes())
                .pad(name.len() as u64)
                .file("placeholder", b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "traversal out of storage/",
            expect: Expect::Member(RejectReason::NotCanonical),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.file(&format!("{D}/storage/../../../../{PLANTED}"), b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "traversal from storage/ onto opencode.db",
            expect: Expect::Member(RejectReason::NotCanonical),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.file(&format!("{D}/storage/../opencode.db"), b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "a dot component before opencode.db",
            expect: Expect::Member(RejectReason::OutsideCachePaths),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.file("../home/./.local/share/opencode/opencode.db", b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "a name outside the data dir",
            expect: Expect::Member(RejectReason::OutsideCachePaths),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.file(&format!("{D}/opencode.db"), b"good db")
                    .file(&format!("../../{PLANTED}"), b"x");
                t.end(0, 0);
            },
        },
        Case {
            label: "an absolute name",
            expect: Expect::Member(RejectReason::AbsolutePath),
            build: |dest, outside| {
                let name = outside.join(PLANTED);
                let mut t = TarZst::create(dest);
                t.pax_member(
                    &[("path", name.to_string_lossy().as_bytes())],
                    EntryType::Regular,
                    b"x",
                );
                t.end(0, 0);
            },
        },
        Case {
            label: "a hard link to a file outside",
            expect: Expect::Member(RejectReason::HardLinkOutside {
                target: format!("../../{PLANTED}"),
            }),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.dir(&format!("{D}/storage/")).header(
                    format!("{D}/storage/{PLANTED}").as_bytes(),
                    EntryType::Link,
                    0,
                    format!("../../{PLANTED}").as_bytes(),
                );
                t.end(0, 0);
            },
        },
        Case {
            label: "a device node",
            expect: Expect::Member(RejectReason::Special {
                kind: "character device".into(),
            }),
            build: |dest, _| {
                let mut t = TarZst::create(dest);
                t.dir(&format!("{D}/storage/")).header(
                    format!("{D}/storage/{PLANTED}").as_bytes(),
                    EntryType::Char,
                    0,
                    b"",
                );
                t.end(0, 0);
            },
        },
    ]
}

/// Every path below `dir` whose name contains [`PLANTED`].
pub fn planted_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains(PLANTED))
            {
                found.push(p.clone());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    found
}
