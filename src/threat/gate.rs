//! The deterministic gate (docs/security.md#the-threat-check): every file the change adds or
//! rewrites, read by the detectors of this module's siblings. Binary files are refused unless
//! `allowed-binary-paths` lists them; text files are read line by line, and only the lines the
//! change adds count (a line already in the old file is not new, as for the secret check).

use std::collections::HashSet;

use super::runs_code::{self, Seen};
use super::{dependencies, payloads, unicode, Finding, Kind, Severity};
use crate::safe_outputs::capture::{ChangeSet, FileChange, Mode};
use crate::safe_outputs::checks::is_protected;

/// The most findings of one severity the answer lists; the rest are counted.
pub const MAX_LISTED: usize = 20;

/// How far git looks for a NUL to call a file binary (`buffer_is_binary`).
const BINARY_PROBE: usize = 8000;

/// What the gate is told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatePolicy {
    /// `allowed-binary-paths`, matched as `protected-paths` is (`checks::is_protected`).
    pub allowed_binary: Vec<String>,
}

/// Findings of one severity: the first [`MAX_LISTED`], and how many there were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    pub shown: Vec<Finding>,
    pub total: usize,
}

impl Listed {
    fn push(&mut self, f: Finding) {
        self.total += 1;
        if self.shown.len() < MAX_LISTED {
            self.shown.push(f);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// One line a finding, and one for those not listed.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.shown.iter().map(Finding::describe).collect();
        if self.total > self.shown.len() {
            out.push(format!(
                "and {} more finding(s) of this kind",
                self.total - self.shown.len()
            ));
        }
        out
    }
}

/// What the gate found in a change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateReport {
    /// Findings that refuse the change.
    pub refused: Listed,
    /// Findings that mark it "needs review".
    pub review: Listed,
    /// Binary files delivered because `allowed-binary-paths` lists them.
    pub allowed_binaries: Vec<String>,
    /// Files read.
    pub files: usize,
}

impl GateReport {
    fn push(&mut self, f: Finding) {
        match f.kind.severity() {
            Severity::Refuse => self.refused.push(f),
            Severity::NeedsReview => self.review.push(f),
        }
    }
}

/// Every finding in `change`.
pub fn check(change: &ChangeSet, policy: &GatePolicy) -> GateReport {
    let mut report = GateReport::default();
    let mut runs = runs_code::Scan::default();
    for f in &change.files {
        // Deletions, symlinks and gitlinks carry no content of their own (the checks deal with
        // the last two).
        if !matches!(
            f.new.as_ref().map(|s| s.mode),
            Some(Mode::File | Mode::Executable)
        ) {
            continue;
        }
        report.files += 1;
        let path = f.path_lossy();
        let Some(text) = text_of(&f.content) else {
            match policy.allowed_binary.iter().any(|p| is_protected(&path, p)) {
                true => report.allowed_binaries.push(path),
                false => report.push(Finding {
                    path,
                    line: None,
                    kind: Kind::Binary,
                }),
            }
            continue;
        };
        let added = added_lines(text, f);
        for finding in unicode::scan(&path, &added)
            .into_iter()
            .chain(unicode::mixed_scripts(&path, &added))
            .chain(dependencies::scan(&path, f, &added))
            .chain(payloads::scan(&path, &added))
        {
            report.push(finding);
        }
        runs.file(&Seen {
            path: &path,
            change: f,
            text,
            added: &added,
        });
    }
    for finding in runs.finish() {
        report.push(finding);
    }
    report
}

/// `content` as text, or `None` for a binary file: git's test (a NUL in the first 8000 bytes),
/// or bytes that are not UTF-8 (the detectors read text, and such a file is not text to a
/// reviewer either).
pub fn text_of(content: &[u8]) -> Option<&str> {
    let probe = &content[..content.len().min(BINARY_PROBE)];
    if memchr::memchr(0, probe).is_some() {
        return None;
    }
    std::str::from_utf8(content).ok()
}

/// The lines of `text` (the new content of `f`) the change adds, numbered from 1.
pub fn added_lines<'a>(text: &'a str, f: &FileChange) -> Vec<(usize, &'a str)> {
    let old: HashSet<&[u8]> = match f.old {
        Some(_) => f.old_content.split(|b| *b == b'\n').collect(),
        None => HashSet::new(),
    };
    // What follows a final newline is not a line.
    let text = text.strip_suffix('\n').unwrap_or(text);
    text.split('\n')
        .enumerate()
        .filter(|(_, l)| !old.contains(l.as_bytes()))
        .map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l)))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::safe_outputs::capture::Side;

    pub(crate) fn added(path: &str, content: &[u8]) -> FileChange {
        FileChange {
            path: path.as_bytes().to_vec(),
            old: None,
            new: Some(Side {
                mode: Mode::File,
                oid: "0".repeat(40),
            }),
            content: content.to_vec(),
            old_content: Vec::new(),
        }
    }

    pub(crate) fn modified(path: &str, old: &str, new: &str) -> FileChange {
        let mut f = added(path, new.as_bytes());
        f.old = f.new.clone();
        f.old_content = old.as_bytes().to_vec();
        f
    }

    pub(crate) fn gate(files: Vec<FileChange>) -> GateReport {
        let change = ChangeSet {
            base: "b".repeat(40),
            files,
        };
        check(&change, &GatePolicy::default())
    }

    #[test]
    fn only_the_lines_the_change_adds_count() {
        let f = modified("a.txt", "one\ntwo\n", "one\nnew\ntwo\n");
        let text = std::str::from_utf8(&f.content).unwrap();
        assert_eq!(added_lines(text, &f), [(2, "new")]);
        let f = added("b.txt", b"x\r\ny");
        let text = std::str::from_utf8(&f.content).unwrap();
        assert_eq!(added_lines(text, &f), [(1, "x"), (2, "y")]);
    }

    #[test]
    fn binary_files_are_refused_unless_allowed_and_named_by_path() {
        let png = added("img/logo.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
        let latin1 = added("notes.txt", b"caf\xe9\n");
        let text = added("ok.txt", b"fine\n");
        let r = gate(vec![png.clone(), latin1, text]);
        let paths: Vec<&str> = r.refused.shown.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["img/logo.png", "notes.txt"]);
        assert!(r.refused.shown.iter().all(|f| f.kind == Kind::Binary));
        assert!(r.refused.lines()[0].contains("`allowed-binary-paths`"));
        let change = ChangeSet {
            base: String::new(),
            files: vec![png],
        };
        let allowed = check(
            &change,
            &GatePolicy {
                allowed_binary: vec!["img/".into()],
            },
        );
        assert!(allowed.refused.is_empty(), "{allowed:?}");
        assert_eq!(allowed.allowed_binaries, ["img/logo.png"]);
    }

    #[test]
    fn deletions_and_symlinks_are_not_read() {
        let mut gone = added("gone.bin", b"");
        gone.new = None;
        let mut link = added("link", b"\0target");
        link.new = Some(Side {
            mode: Mode::Symlink,
            oid: "0".repeat(40),
        });
        assert_eq!(gate(vec![gone, link]), GateReport::default());
    }

    #[test]
    fn many_findings_are_capped_and_counted() {
        let body: String = (0..500).map(|_| "x\u{202E}y\n").collect();
        let r = gate(vec![added("many.rs", body.as_bytes())]);
        assert_eq!(r.refused.total, 500);
        assert_eq!(r.refused.shown.len(), MAX_LISTED);
        let lines = r.refused.lines();
        assert_eq!(lines.len(), MAX_LISTED + 1);
        assert!(lines[MAX_LISTED].contains("480 more"), "{lines:?}");
    }
}
