//! Lexical path arithmetic shared by the archive writer and the confined extractor. Lexical on
//! purpose: the toolkit (`path.relative` in Node, GNU tar `-P -C $GITHUB_WORKSPACE`) works on the
//! strings, and the extractor must judge member names without touching the file system.

use std::path::{Component, Path, PathBuf};

/// Removes `.` and resolves `..` against the preceding component (`..` at the root stays at the root).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => out.push(component.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() && !out.has_root() {
                    out.push("..");
                }
            }
            Component::Normal(part) => out.push(part),
        }
    }
    out
}

/// A cache path as the user gave it, made absolute against the workspace (as the toolkit resolves
/// relative patterns from the working directory, which is the workspace).
pub(crate) fn resolve(workspace: &Path, path: &str) -> PathBuf {
    normalize(&workspace.join(path))
}

/// The tar member name of `target`: relative to the workspace, `/`-separated, usually `../...`.
pub(crate) fn member_name(workspace: &Path, target: &Path) -> String {
    let (base, target) = (normalize(workspace), normalize(target));
    let base: Vec<Component> = base.components().collect();
    let target: Vec<Component> = target.components().collect();
    let common = base
        .iter()
        .zip(target.iter())
        .take_while(|(a, b)| a == b)
        .count();
    let mut parts: Vec<String> = vec!["..".to_string(); base.len() - common];
    parts.extend(
        target[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_workspace_relative() {
        let ws = Path::new("/github/workspace");
        assert_eq!(
            member_name(
                ws,
                Path::new("/github/home/.local/share/opencode/opencode.db")
            ),
            "../home/.local/share/opencode/opencode.db"
        );
        assert_eq!(member_name(ws, Path::new("/github/workspace/a/b")), "a/b");
        assert_eq!(member_name(ws, Path::new("/etc/x")), "../../etc/x");
        assert_eq!(
            member_name(Path::new("/ws/./x/../"), Path::new("/ws/y")),
            "y"
        );
    }

    #[test]
    fn normalize_is_lexical_and_stops_at_root() {
        assert_eq!(normalize(Path::new("/a/b/../../../c")), PathBuf::from("/c"));
        assert_eq!(normalize(Path::new("/a/./b/")), PathBuf::from("/a/b"));
        assert_eq!(
            resolve(Path::new("/ws/sub"), "../../home/x"),
            PathBuf::from("/home/x")
        );
        assert_eq!(resolve(Path::new("/ws"), "/abs/y"), PathBuf::from("/abs/y"));
    }
}
