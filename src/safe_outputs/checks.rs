//! What fro-bot checks before it carries a proposed change out
//! (docs/security.md#the-agent-proposes-fro-bot-disposes): a change is delivered whole or not at
//! all, and every reason it is not is named — the file, the limit and by how much, the line of a
//! secret (never the secret).

use std::collections::HashSet;

use super::capture::{ChangeSet, FileChange, Mode};

/// The inputs that bound a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangePolicy {
    /// `protected-paths`: patterns a delivered change may not touch.
    pub protected: Vec<String>,
    /// `max-change-files`.
    pub max_files: u64,
    /// `max-change-bytes`.
    pub max_bytes: u64,
}

/// Why a change is not delivered. Every variant names what the user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Protected { paths: Vec<String> },
    TooManyFiles { count: u64, limit: u64 },
    TooManyBytes { bytes: u64, limit: u64 },
    Secret { path: String, line: Option<usize> },
    SymlinkOutside { path: String },
    Symlink { path: String },
    ModeChange { path: String, mode: String },
    Submodule { path: String },
    GitDirectory { path: String },
    NotUtf8 { path: String },
}

impl Refusal {
    /// One line for the answer and the summary.
    pub fn describe(&self) -> String {
        match self {
            Refusal::Protected { paths } => format!(
                "it touches protected paths ({}); the `protected-paths` input lists the paths a change may not touch",
                code_list(paths)
            ),
            Refusal::TooManyFiles { count, limit } => format!(
                "it changes {count} files, {} over `max-change-files` ({limit})",
                count - limit
            ),
            Refusal::TooManyBytes { bytes, limit } => format!(
                "it holds {bytes} bytes of changed content, {} over `max-change-bytes` ({limit})",
                bytes - limit
            ),
            Refusal::Secret { path, line: Some(n) } => {
                format!("{} line {n} holds what looks like a secret", code(path))
            }
            Refusal::Secret { path, line: None } => {
                format!("the path {} looks like a secret", code(path))
            }
            Refusal::SymlinkOutside { path } => {
                format!("{} is a symlink that leaves the repository", code(path))
            }
            Refusal::Symlink { path } => format!(
                "{} is a symlink, which GitHub's signed-commit API cannot create",
                code(path)
            ),
            Refusal::ModeChange { path, mode } => format!(
                "{} would get mode {mode}, which GitHub's signed-commit API cannot set",
                code(path)
            ),
            Refusal::Submodule { path } => {
                format!("{} is a submodule (gitlink) change", code(path))
            }
            Refusal::GitDirectory { path } => format!("{} is inside a `.git` directory", code(path)),
            Refusal::NotUtf8 { path } => format!("{} is not a UTF-8 path", code(path)),
        }
    }
}

/// `text` as an inline code span that nothing in it can close (agent-chosen names), redacted.
pub fn code(text: &str) -> String {
    let clean: String = crate::redact::redact(text)
        .chars()
        .map(|c| if c == '`' || c.is_control() { '?' } else { c })
        .take(200)
        .collect();
    format!("`{clean}`")
}

fn code_list(paths: &[String]) -> String {
    let mut shown: Vec<String> = paths.iter().take(10).map(|p| code(p)).collect();
    if paths.len() > 10 {
        shown.push(format!("and {} more", paths.len() - 10));
    }
    shown.join(", ")
}

/// Every reason `change` may not be delivered; empty: deliver it.
pub fn check(change: &ChangeSet, policy: &ChangePolicy) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    let mut protected = Vec::new();
    for f in &change.files {
        let Ok(path) = std::str::from_utf8(&f.path) else {
            refusals.push(Refusal::NotUtf8 {
                path: f.path_lossy(),
            });
            continue;
        };
        refusals.extend(shape_refusal(f, path));
        if policy.protected.iter().any(|p| is_protected(path, p)) {
            protected.push(path.to_string());
        }
        refusals.extend(secret_refusals(f, path));
    }
    if !protected.is_empty() {
        refusals.insert(0, Refusal::Protected { paths: protected });
    }
    let count = change.files.len() as u64;
    if count > policy.max_files {
        refusals.push(Refusal::TooManyFiles {
            count,
            limit: policy.max_files,
        });
    }
    let bytes = change.content_bytes();
    if bytes > policy.max_bytes {
        refusals.push(Refusal::TooManyBytes {
            bytes,
            limit: policy.max_bytes,
        });
    }
    refusals
}

/// What the commit API cannot express or fro-bot never delivers: `.git` paths, gitlinks,
/// symlinks, file modes.
fn shape_refusal(f: &FileChange, path: &str) -> Option<Refusal> {
    let path_s = path.to_string();
    if path
        .split('/')
        .any(|c| c.eq_ignore_ascii_case(".git") || c.is_empty() || c == "..")
    {
        return Some(Refusal::GitDirectory { path: path_s });
    }
    let old = f.old.as_ref().map(|s| s.mode);
    let new = f.new.as_ref().map(|s| s.mode);
    if old == Some(Mode::Gitlink) || new == Some(Mode::Gitlink) {
        return Some(Refusal::Submodule { path: path_s });
    }
    match new {
        Some(Mode::Symlink) if symlink_leaves(path, &f.content) => {
            Some(Refusal::SymlinkOutside { path: path_s })
        }
        Some(Mode::Symlink) => Some(Refusal::Symlink { path: path_s }),
        // The API keeps an existing file's mode and creates 100644: anything else is a change
        // it would silently drop.
        Some(mode @ (Mode::Executable | Mode::Other(_))) if old != Some(mode) => {
            Some(Refusal::ModeChange {
                path: path_s,
                mode: mode.octal(),
            })
        }
        Some(Mode::File) if old.is_some_and(|m| m != Mode::File) => Some(Refusal::ModeChange {
            path: path_s,
            mode: Mode::File.octal(),
        }),
        _ => None,
    }
}

/// Whether a symlink at `path` pointing at `target` resolves outside the repository.
fn symlink_leaves(path: &str, target: &[u8]) -> bool {
    let Ok(target) = std::str::from_utf8(target) else {
        return true;
    };
    if target.starts_with('/') {
        return true;
    }
    let mut depth: i64 = path.split('/').count() as i64 - 1;
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => depth -= 1,
            _ => depth += 1,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// gitignore-like: `dir/` protects a directory, a pattern with no inner `/` matches a name at
/// any depth, one with an inner or leading `/` is anchored at the root. Compared without regard
/// to ASCII case (the safe side: `.GitHub/` is refused too).
pub fn is_protected(path: &str, pattern: &str) -> bool {
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return false;
    }
    let dir = pattern.ends_with('/');
    let body = pattern.trim_end_matches('/');
    let anchored = body.contains('/');
    let body = body.trim_start_matches('/');
    let comps: Vec<&str> = path.split('/').collect();
    let pat: Vec<&str> = body.split('/').collect();
    let eq = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let matches_at = |start: usize| {
        comps.len() >= start + pat.len()
            && pat.iter().zip(&comps[start..]).all(|(p, c)| eq(p, c))
            // A directory pattern needs something under it; a file pattern may also be a dir.
            && (!dir || comps.len() > start + pat.len())
    };
    if anchored {
        matches_at(0)
    } else {
        (0..comps.len()).any(matches_at)
    }
}

/// Secrets on lines the change adds (a line already in the old content is not new), and in the
/// path itself.
fn secret_refusals(f: &FileChange, path: &str) -> Vec<Refusal> {
    let mut out = Vec::new();
    if !crate::redact::secret_spans(path.as_bytes()).is_empty() {
        out.push(Refusal::Secret {
            path: path.to_string(),
            line: None,
        });
    }
    let spans = crate::redact::secret_spans(&f.content);
    if spans.is_empty() {
        return out;
    }
    let old_lines: HashSet<&[u8]> = f.old_content.split(|b| *b == b'\n').collect();
    let starts = line_starts(&f.content);
    let mut seen = HashSet::new();
    for (at, _) in spans {
        let line = starts.partition_point(|s| *s <= at);
        let text = line_text(&f.content, &starts, line);
        if !old_lines.contains(text) && seen.insert(line) {
            out.push(Refusal::Secret {
                path: path.to_string(),
                line: Some(line),
            });
        }
    }
    out
}

/// Line `n` (1-based) of `content`, without its newline.
fn line_text<'a>(content: &'a [u8], starts: &[usize], n: usize) -> &'a [u8] {
    let start = starts[n - 1];
    let end = starts.get(n).map_or(content.len(), |next| next - 1);
    &content[start..end.max(start)]
}

fn line_starts(content: &[u8]) -> Vec<usize> {
    std::iter::once(0)
        .chain(memchr::memchr_iter(b'\n', content).map(|i| i + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safe_outputs::capture::Side;

    fn side(mode: Mode) -> Option<Side> {
        Some(Side {
            mode,
            oid: "0".repeat(40),
        })
    }

    fn file(path: &str, content: &str) -> FileChange {
        FileChange {
            path: path.as_bytes().to_vec(),
            old: None,
            new: side(Mode::File),
            content: content.as_bytes().to_vec(),
            old_content: Vec::new(),
        }
    }

    fn policy() -> ChangePolicy {
        ChangePolicy {
            protected: [
                ".github/",
                ".opencode/",
                "opencode.json",
                "AGENTS.md",
                "CODEOWNERS",
            ]
            .map(String::from)
            .to_vec(),
            max_files: 3,
            max_bytes: 100,
        }
    }

    fn set(files: Vec<FileChange>) -> ChangeSet {
        ChangeSet {
            base: "b".repeat(40),
            files,
        }
    }

    #[test]
    fn a_clean_change_passes() {
        let c = set(vec![
            file("src/a.rs", "fn a() {}\n"),
            file("docs/guide.md", "x"),
        ]);
        assert_eq!(check(&c, &policy()), []);
    }

    #[test]
    fn protected_paths_are_named_and_matched_like_gitignore() {
        assert!(is_protected(".github/workflows/ci.yml", ".github/"));
        assert!(is_protected(".GitHub/workflows/ci.yml", ".github/"));
        assert!(
            !is_protected(".github", ".github/"),
            "a file named like the dir is not in it"
        );
        assert!(is_protected("docs/CODEOWNERS", "CODEOWNERS"));
        assert!(is_protected("pkg/AGENTS.md", "AGENTS.md"));
        assert!(!is_protected("pkg/NOT-AGENTS.md", "AGENTS.md"));
        assert!(is_protected("sub/.opencode/x", ".opencode/"));
        assert!(!is_protected("sub/opencode.json", "/opencode.json"));
        assert!(is_protected("opencode.json", "/opencode.json"));
        let c = set(vec![
            file(".github/workflows/x.yml", "x"),
            file("CODEOWNERS", "* @me"),
        ]);
        let r = check(&c, &policy());
        assert_eq!(
            r,
            [Refusal::Protected {
                paths: vec![".github/workflows/x.yml".into(), "CODEOWNERS".into()]
            }]
        );
        assert!(
            r[0].describe().contains("`protected-paths`"),
            "{}",
            r[0].describe()
        );
    }

    #[test]
    fn limits_say_which_and_by_how_much() {
        let c = set((0..5)
            .map(|i| file(&format!("f{i}"), &"x".repeat(30)))
            .collect());
        let r = check(&c, &policy());
        assert_eq!(
            r,
            [
                Refusal::TooManyFiles { count: 5, limit: 3 },
                Refusal::TooManyBytes {
                    bytes: 150,
                    limit: 100
                }
            ]
        );
        assert!(r[0].describe().contains("2 over `max-change-files` (3)"));
        assert!(r[1].describe().contains("50 over `max-change-bytes` (100)"));
    }

    #[test]
    fn secrets_on_added_lines_are_refused_by_line_never_shown() {
        let token = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";
        let mut f = file("config.txt", &format!("a\nold {token}\nb\nnew {token}\n"));
        f.old = side(Mode::File);
        f.old_content = format!("a\nold {token}\n").into_bytes();
        let r = check(&set(vec![f]), &policy());
        assert_eq!(
            r,
            [Refusal::Secret {
                path: "config.txt".into(),
                line: Some(4)
            }],
            "the line already there is not new"
        );
        assert!(!r[0].describe().contains(token));
        let named = check(&set(vec![file(&format!("keys/{token}"), "x")]), &policy());
        assert!(matches!(named[..], [Refusal::Secret { line: None, .. }]));
        assert!(
            !named[0].describe().contains(token),
            "{}",
            named[0].describe()
        );
    }

    #[test]
    fn what_the_commit_api_cannot_carry_is_refused() {
        let mut out = file("link", "/etc/passwd");
        out.new = side(Mode::Symlink);
        let mut up = file("a/link", "../../x");
        up.new = side(Mode::Symlink);
        let mut inside = file("a/link2", "../b");
        inside.new = side(Mode::Symlink);
        let mut exe = file("run.sh", "#!/bin/sh");
        exe.new = side(Mode::Executable);
        let mut sub = file("vendor/sub", "");
        sub.new = side(Mode::Gitlink);
        let git = file("x/.GIT/config", "");
        let r = check(
            &set(vec![out, up, inside, exe, sub, git]),
            &ChangePolicy {
                max_files: 100,
                ..policy()
            },
        );
        assert!(matches!(r[0], Refusal::SymlinkOutside { .. }));
        assert!(matches!(r[1], Refusal::SymlinkOutside { .. }));
        assert!(matches!(r[2], Refusal::Symlink { .. }));
        assert!(matches!(r[3], Refusal::ModeChange { .. }));
        assert!(matches!(r[4], Refusal::Submodule { .. }));
        assert!(matches!(r[5], Refusal::GitDirectory { .. }));
        assert_eq!(r.len(), 6);
    }

    #[test]
    fn agent_chosen_names_cannot_break_out_of_their_code_span() {
        assert_eq!(code("a`b\nc"), "`a?b?c`");
    }
}
