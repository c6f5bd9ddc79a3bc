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

/// Every module of `src/` and its shipping code ([`shipping`]). Unit tests may reach anywhere; the
/// shape is about the code that ships, so a test-only module (`#[cfg(test)] mod tests;` and its
/// file) is left out.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let module = module_name(path.strip_prefix(src).unwrap());
                for child in test_only_modules(&text) {
                    test_only.insert(match module.as_str() {
                        "" => child,
                        m => format!("{m}::{child}"),
                    });
                }
                out.insert(module, shipping(&text));
            }
        }
    }
    out.retain(|m, _| !test_only.contains(m));
    out
}

/// `#[cfg(test)]`, as [`code_only`] leaves it.
const CFG_TEST: &str = "#[cfg(test)]";

/// `code` with every item under `#[cfg(test)]` blanked (newlines kept, so lines still count): a
/// test module, and a test-only `fn`, `use` or `impl` anywhere in the file, shipping code before
/// and after it kept.
fn shipping(code: &str) -> String {
    let clean = code_only(code);
    let mut out = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(at) = clean[from..].find(CFG_TEST).map(|a| from + a) {
        let end = item_end(&clean, at + CFG_TEST.len());
        for b in &mut out[at..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
        from = end;
    }
    // Whole characters were blanked (the span runs from `#` to an ASCII `;` or `}`).
    String::from_utf8(out).unwrap()
}

/// Where the item starting at `from` in `clean` (comments and literals blanked) ends: after its
/// `;` or its body's closing `}`, further attributes included; at the enclosing block's `}` if
/// that comes first.
fn item_end(clean: &str, from: usize) -> usize {
    let b = clean.as_bytes();
    let mut i = from;
    // Parentheses and brackets (`[u8; 4]`, attributes) hold no end.
    let mut nested = 0usize;
    while i < b.len() {
        match b[i] {
            b'(' | b'[' => nested += 1,
            b')' | b']' => nested = nested.saturating_sub(1),
            b';' if nested == 0 => return i + 1,
            b'}' if nested == 0 => return i,
            b'{' if nested == 0 => {
                let mut depth = 0usize;
                for (j, &c) in b.iter().enumerate().skip(i) {
                    match c {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                return j + 1;
                            }
                        }
                        _ => {}
                    }
                }
                return b.len();
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The modules `code` declares test-only, by name: `#[cfg(test)] mod tests;` (its file is a test).
fn test_only_modules(code: &str) -> Vec<String> {
    let clean = code_only(code);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = clean[from..].find(CFG_TEST).map(|a| from + a) {
        let start = at + CFG_TEST.len();
        let end = item_end(&clean, start);
        let item: Vec<&str> = clean[start..end].split_whitespace().collect();
        if let ["mod", name] = item.as_slice() {
            out.push(name.trim_end_matches(';').to_string());
        } else if let ["pub" | "pub(crate)", "mod", name] = item.as_slice() {
            out.push(name.trim_end_matches(';').to_string());
        }
        from = end;
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

/// Every import between two modules of `src/` that are not one unit (a module and its own
/// parent or children: re-exports, `super::` helpers), as module → modules it imports.
fn import_edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &known {
        // Code only: a comment that names a module (`crate::config::inputs`) imports nothing.
        for path in referenced_paths(&code_only(code)) {
            let Some(target) = resolve(module, &path, &known) else {
                continue;
            };
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
            .is_some_and(|e| e.contains("phases::turn::agent")),
        "the import scan found nothing: the tests would pass vacuously ({edges:?})"
    );
    edges
}

/// The nodes of `edges` that reach themselves again (rings of any length).
fn rings(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
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
    rings
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let edges = import_edges();
    let rings = rings(&edges);
    assert!(
        rings.is_empty(),
        "modules that import themselves back through others: {rings:?}\nedges: {edges:#?}"
    );
}

/// `a` and `b` seen from where they part: the two children of their deepest common folder that
/// hold them (`phases::turn::agent`, `phases::context` → `phases::turn`, `phases::context`).
fn siblings(a: &str, b: &str) -> (String, String) {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split("::").collect(), b.split("::").collect());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    (a[..=common].join("::"), b[..=common].join("::"))
}

/// Every import between modules, lifted to the folders they sit in where they part.
fn folder_edges(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in edges {
        for to in targets {
            let (a, b) = siblings(from, to);
            out.entry(a).or_default().insert(b);
        }
    }
    out
}

/// No two folders (or a folder and a file beside it) import each other, directly or through a
/// ring: a room can be read and changed without the ones above it.
#[test]
fn no_folder_imports_a_folder_that_imports_it_back() {
    let folders = folder_edges(&import_edges());
    let rings = rings(&folders);
    let ring_edges: Vec<String> = folders
        .iter()
        .filter(|(from, _)| rings.contains(from))
        .flat_map(|(from, to)| {
            to.iter()
                .filter(|t| rings.contains(t))
                .map(move |t| format!("{from} → {t}"))
        })
        .collect();
    assert!(
        rings.is_empty(),
        "rooms that import each other back: {rings:?}\n{}",
        ring_edges.join("\n")
    );
}

#[test]
fn the_folder_scan_sees_a_ring_between_folders_that_files_alone_do_not_make() {
    let edges: BTreeMap<String, BTreeSet<String>> =
        [("a::x", "b::y"), ("b::z", "a::w"), ("c::d::e", "c::f")]
            .into_iter()
            .map(|(f, t)| (f.to_string(), BTreeSet::from([t.to_string()])))
            .collect();
    assert!(rings(&edges).is_empty(), "no ring between files");
    assert_eq!(rings(&folder_edges(&edges)), ["a", "b"]);
}

/// The layers, bottom first (docs/architecture.md draws them): a room may import rooms of its
/// own layer and those below, never one above. Every room of `src/` is named here once.
const LAYERS: &[(&str, &[&str])] = &[
    ("protocols", &["runner", "redact", "untrusted", "net"]),
    ("confinement", &["confine", "egress", "trust"]),
    ("settings", &["config"]),
    (
        "services",
        &["cache", "object_store", "lease", "github", "outbound"],
    ),
    ("agent", &["opencode"]),
    ("memory", &["memory"]),
    ("outputs", &["safe_outputs", "review", "threat", "tools"]),
    ("pipeline", &["phases", "fuzzing"]),
];

fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    let room = module.split("::").next()?;
    LAYERS
        .iter()
        .position(|(_, rooms)| rooms.contains(&room))
        .map(|i| (i, LAYERS[i].0))
}

/// The layers as docs/architecture.md draws them (its first code block after `## Layers`, top
/// first: a layer's name, then its rooms separated by commas).
fn drawn_layers(page: &str) -> Vec<(String, Vec<String>)> {
    let after = page
        .split("## Layers")
        .nth(1)
        .expect("docs/architecture.md has ## Layers");
    let block = after
        .split("```")
        .nth(1)
        .expect("a code block under ## Layers");
    let mut layers: Vec<(String, Vec<String>)> = block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut fields = line.split("  ").map(str::trim).filter(|f| !f.is_empty());
            let name = fields.next().unwrap_or_default().to_string();
            let rooms = fields.next().unwrap_or_default();
            let rooms = rooms.split(',').map(|r| r.trim().to_string()).collect();
            (name, rooms)
        })
        .collect();
    layers.reverse();
    layers
}

#[test]
fn the_architecture_page_draws_the_layers_this_test_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let held: Vec<(String, Vec<String>)> = LAYERS
        .iter()
        .map(|(name, rooms)| {
            (
                name.to_string(),
                rooms.iter().map(|r| r.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(
        drawn_layers(&page),
        held,
        "docs/architecture.md ## Layers, bottom last"
    );
}

#[test]
fn no_room_imports_a_room_of_a_layer_above_it() {
    let edges = import_edges();
    let mut unnamed = BTreeSet::new();
    let mut up = Vec::new();
    for (from, targets) in &edges {
        for to in targets {
            match (layer_of(from), layer_of(to)) {
                (Some((a, la)), Some((b, lb))) if b > a => {
                    up.push(format!("{from} ({la}) → {to} ({lb})"));
                }
                (Some(_), Some(_)) => {}
                (None, _) => drop(unnamed.insert(from.clone())),
                (_, None) => drop(unnamed.insert(to.clone())),
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "rooms no layer names (add them to LAYERS and docs/architecture.md): {unnamed:?}"
    );
    assert!(
        up.is_empty(),
        "imports that run up a layer:\n{}",
        up.join("\n")
    );
}

/// Longest a function in `src/` may be (the fn line through its closing brace), tests excepted.
const MAX_FN_LINES: usize = 80;

/// `code` with comments, strings and char literals blanked (newlines kept), so braces count.
fn code_only(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let end = code[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            b[i..end].iter().for_each(|&c| blank(&mut out, c));
            i = end;
        } else if rest.starts_with(b"r\"") || rest.starts_with(b"r#") {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let start = i + 2 + hashes;
            let end = code[start..]
                .find(&close)
                .map_or(b.len(), |e| start + e + close.len());
            b[i..end].iter().for_each(|&c| blank(&mut out, c));
            i = end;
        } else if b[i] == b'"' {
            blank(&mut out, b[i]);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                let n = if b[i] == b'\\' { 2 } else { 1 };
                for _ in 0..n.min(b.len() - i) {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            if i < b.len() {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{7f}'); otherwise a lifetime.
            let len = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let ch = code[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            let len = len.unwrap_or(1);
            b[i..i + len].iter().for_each(|&c| blank(&mut out, c));
            i += len;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every function with a body in the shipping code of `code` ([`shipping`]): (name, first line,
/// lines).
fn function_lengths(code: &str) -> Vec<(String, usize, usize)> {
    let clean = code_only(&shipping(code));
    let lines: Vec<&str> = clean.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(name) = line
            .split_whitespace()
            .skip_while(|w| *w != "fn")
            .nth(1)
            .map(|w| w.split(['(', '<']).next().unwrap_or(w).to_string())
        else {
            continue;
        };
        if name.is_empty() || line.trim_start().starts_with("//") {
            continue;
        }
        // The body: the first `{` before any `;` (a declaration without one has none).
        let mut depth = 0usize;
        let mut opened = false;
        'scan: for (m, l) in lines.iter().enumerate().skip(n) {
            for c in l.chars() {
                match c {
                    ';' if !opened => break 'scan,
                    '{' => {
                        opened = true;
                        depth += 1;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            out.push((name.clone(), n + 1, m - n + 1));
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

#[test]
fn no_function_in_src_is_longer_than_eighty_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut seen = 0;
    let mut long = Vec::new();
    for (module, code) in modules(&src) {
        for (name, line, len) in function_lengths(&code) {
            seen += 1;
            if len > MAX_FN_LINES {
                long.push(format!("{module}:{line} {name}: {len} lines"));
            }
        }
    }
    assert!(seen > 500, "the scan found only {seen} functions");
    long.sort();
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_scan_measures_bodies_not_braces_in_text() {
    let code = "fn a() {\n    let s = \"{\";\n    let c = '{';\n    // {\n    let r = r#\"}\"#;\n}\nfn b<'x>(v: &'x str) -> &'x str {\n    v\n}\ntrait T {\n    fn decl(&self);\n}\n#[cfg(test)]\nmod tests {\n    fn long() {\n    }\n}\n";
    assert_eq!(
        function_lengths(code),
        vec![("a".to_string(), 1, 6), ("b".to_string(), 7, 3)]
    );
}

/// Code after a test-only item ships, and is scanned: a `#[cfg(test)]` method in an `impl` ends
/// neither the import scan nor the function scan; the test module itself is left out.
#[test]
fn the_scans_read_past_a_test_only_item_to_the_code_after_it() {
    let code = "use crate::a::A;\nimpl A {\n    #[cfg(test)]\n    pub fn tied(&self) -> [u8; 2] {\n        crate::t::x()\n    }\n\n    pub fn later(&self) {\n        crate::b::y();\n    }\n}\n#[cfg(test)]\nuse crate::c;\nfn last() {\n    super::d::z();\n}\n#[cfg(test)]\nmod tests {\n    use crate::e;\n}\n#[cfg(test)]\nmod more;\n";
    assert_eq!(
        referenced_paths(&shipping(code)),
        ["crate::a::A", "crate::b::y", "super::d::z"]
    );
    assert_eq!(
        function_lengths(code),
        vec![("later".to_string(), 8, 3), ("last".to_string(), 14, 3)]
    );
    assert_eq!(shipping(code).lines().count(), code.lines().count());
    assert_eq!(test_only_modules(code), ["more"]);
}

/// Every module opens with a comment that says what it holds, and the crate's own comment (the map
/// a newcomer reads first) names every room.
#[test]
fn every_module_says_what_it_holds_and_the_crate_map_names_every_room() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    let silent: Vec<&String> = known
        .iter()
        .filter(|(_, code)| !code.trim_start().starts_with("//!"))
        .map(|(m, _)| m)
        .collect();
    assert!(
        silent.is_empty(),
        "modules without a `//!` comment: {silent:?}"
    );
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let map: String = lib
        .lines()
        .filter(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let rooms: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .collect();
    assert!(rooms.len() > 20, "lib.rs declares only {rooms:?}");
    let unnamed: Vec<&&str> = rooms
        .iter()
        .filter(|r| !map.contains(&format!("`{r}`")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "rooms lib.rs's map does not name: {unnamed:?}"
    );
}

/// The pipeline's files are named for the step they take, not after the room they drive: no file
/// under `phases/` shares its name with a room or a file elsewhere in `src/`.
#[test]
fn no_phase_is_named_after_another_room() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    let last = |m: &str| m.rsplit("::").next().unwrap_or(m).to_string();
    let elsewhere: BTreeSet<String> = known
        .keys()
        .filter(|m| !m.starts_with("phases"))
        .flat_map(|m| m.split("::").map(str::to_string).collect::<Vec<_>>())
        .collect();
    // A folder of phases (`phases::turn`) names a stage of the pipeline, not a file beside another.
    let folder = |m: &str| known.keys().any(|k| k.starts_with(&format!("{m}::")));
    let clashes: Vec<&String> = known
        .keys()
        .filter(|m| m.starts_with("phases::") && !folder(m) && elsewhere.contains(&last(m)))
        .collect();
    assert!(
        known.keys().filter(|m| m.starts_with("phases::")).count() > 10,
        "the scan found no phases"
    );
    assert!(
        clashes.is_empty(),
        "phases named after another room: {clashes:?}"
    );
}
