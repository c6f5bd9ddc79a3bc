//! The crate's shape: no module imports another that imports it back (directly or through a ring),
//! so each phase and each boundary can be read and changed on its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `src/a/b.rs` → `a::b`; `src/a/mod.rs` → `a`; `lib.rs`/`main.rs` → the crate root `""`.
fn module_name(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                // Unit tests may reach anywhere; the shape is about the code that ships.
                let code = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
                out.insert(module_name(path.strip_prefix(src).unwrap()), code);
            }
        }
    }
    out
}

/// The module a `crate::…`/`super::…`/`self::…` path lands in: its longest prefix that is a file.
fn resolve(current: &str, path: &str, known: &BTreeMap<String, String>) -> Option<String> {
    let mut segs: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = match segs.first()? {
        &"crate" => vec![],
        &"super" | &"self" => current.split("::").filter(|s| !s.is_empty()).collect(),
        _ => return None,
    };
    while let Some(&first) = segs.first() {
        match first {
            "crate" | "self" => {}
            "super" => {
                base.pop();
            }
            _ => break,
        }
        segs.remove(0);
    }
    (1..=segs.len()).rev().find_map(|i| {
        let name = base
            .iter()
            .chain(&segs[..i])
            .copied()
            .collect::<Vec<_>>()
            .join("::");
        known.contains_key(&name).then_some(name)
    })
}

/// Every `crate::`, `super::` and `self::` path in the code, braces expanded one level.
fn referenced_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let starts = ["crate::", "super::", "self::"];
    let mut i = 0;
    while i < code.len() {
        let at_word_start = code.is_char_boundary(i)
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        let Some(prefix) = starts
            .iter()
            .find(|p| at_word_start && code[i..].starts_with(**p))
        else {
            i += 1;
            continue;
        };
        let mut end = i + prefix.len();
        while end < code.len()
            && (bytes[end].is_ascii_alphanumeric()
                || bytes[end] == b'_'
                || code[end..].starts_with("::"))
        {
            end += if code[end..].starts_with("::") { 2 } else { 1 };
        }
        let path = code[i..end].trim_end_matches("::").to_string();
        if code[i..end].ends_with("::") && code[end..].starts_with('{') {
            let close = code[end..].find('}').map_or(code.len(), |c| end + c);
            for item in code[end + 1..close].split(',') {
                let item = item.trim().split([' ', ':', '{']).next().unwrap_or("");
                match item {
                    "" | "self" => out.push(path.clone()),
                    name => out.push(format!("{path}::{name}")),
                }
            }
            i = close;
        } else {
            out.push(path);
            i = end;
        }
    }
    out
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &known {
        for path in referenced_paths(code) {
            let Some(target) = resolve(module, &path, &known) else {
                continue;
            };
            // A parent and its own children are one unit (re-exports, `super::` helpers).
            let related = target == *module
                || module.starts_with(&format!("{target}::"))
                || target.starts_with(&format!("{module}::"))
                || target.is_empty()
                || module.is_empty();
            if !related {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    assert!(
        edges
            .get("phases::run")
            .is_some_and(|e| e.contains("phases::agent")),
        "the import scan found nothing: the test would pass vacuously ({edges:?})"
    );
    // Reachability from each module back to itself finds rings of any length.
    let mut rings = Vec::new();
    for start in edges.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&String> = edges[start].iter().collect();
        while let Some(m) = todo.pop() {
            if m == start {
                rings.push(start.clone());
                break;
            }
            if seen.insert(m) {
                todo.extend(edges.get(m).into_iter().flatten());
            }
        }
    }
    assert!(
        rings.is_empty(),
        "modules that import themselves back through others: {rings:?}\nedges: {edges:#?}"
    );
}
