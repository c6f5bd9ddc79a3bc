//! Dependency-source changes (docs/security.md#the-threat-check): where packages come from (what
//! runs when they are installed is `runs_code`'s table). Each marks the change "needs review" — a person must see
//! it before anything installs it — named by file and line.
//!
//! - A lockfile entry resolved from outside its registry: `package-lock.json`/`npm-shrinkwrap.json`
//!   `"resolved"`, `yarn.lock` `resolved`/`resolution:`, `pnpm-lock.yaml` `tarball:`/`repo:`,
//!   `bun.lock`, `Cargo.lock` `source`, `poetry.lock`, `uv.lock`, `Pipfile.lock`, `Gemfile.lock`
//!   `remote:` ([`lockfile_rule`]).
//! - A manifest dependency given by URL, git or a GitHub shorthand (`package.json`,
//!   `requirements*.txt`).
//! - A registry or index setting: `.npmrc`, `.yarnrc`, `.yarnrc.yml`, `bunfig.toml`, `pip.conf`,
//!   `pip.ini`, `nuget.config`, `.cargo/config[.toml]`, index lines of `requirements*.txt` and
//!   `pyproject.toml`, a non-rubygems `source` in a `Gemfile`.
//! - A source override: `[patch]`/`[replace]`, `git =` and `registry =` in `Cargo.toml`, `replace`
//!   in `go.mod`, `git =` in `pyproject.toml`, `git:`/`github:` in a `Gemfile`.

use serde_json::Value;

use super::{Finding, Kind};
use crate::safe_outputs::capture::FileChange;

const NPM: &[&str] = &[
    "https://registry.npmjs.org/",
    "https://registry.yarnpkg.com/",
];
const PYPI: &[&str] = &["https://pypi.org/", "https://files.pythonhosted.org/"];
const RUBYGEMS: &[&str] = &["https://rubygems.org/", "https://rubygems.org"];
/// crates.io's index, the two ways Cargo names it (exact values).
const CRATES_IO: &[&str] = &[
    "registry+https://github.com/rust-lang/crates.io-index",
    "sparse+https://index.crates.io/",
];

const DEPENDENCY_FIELDS: &[&str] = &[
    "dependencies",
    "devDependencies",
    "optionalDependencies",
    "peerDependencies",
    "overrides",
    "resolutions",
];

/// Files whose every new line changes where packages come from.
const REGISTRY_FILES: &[&str] = &[
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    "bunfig.toml",
    ".bunfig.toml",
    "pip.conf",
    "pip.ini",
    "nuget.config",
];

/// Every dependency-source finding in one file.
pub fn scan(path: &str, f: &FileChange, added: &[(usize, &str)]) -> Vec<Finding> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let parent = path.rsplit('/').nth(1).unwrap_or("");
    let finding = |line: Option<usize>, kind: Kind| Finding {
        path: path.to_string(),
        line,
        kind,
    };
    let lines = |rule: &dyn Fn(&str) -> Option<Kind>| -> Vec<Finding> {
        added
            .iter()
            .filter_map(|(n, l)| rule(l).map(|k| finding(Some(*n), k)))
            .collect()
    };
    let first_added = |kind: Kind| -> Vec<Finding> {
        added
            .iter()
            .find(|(_, l)| !l.trim().is_empty())
            .map(|(n, _)| finding(Some(*n), kind))
            .into_iter()
            .collect()
    };
    if let Some(rule) = lockfile_rule(name) {
        return lines(&|l| rule(l).then_some(Kind::ForeignSource));
    }
    match name {
        "package.json" => package_json(path, f, added),
        "Cargo.toml" => lines(&cargo_toml),
        "go.mod" => lines(&|l| l.contains("=>").then_some(Kind::SourceOverride)),
        "pyproject.toml" => lines(&pyproject),
        "Gemfile" => lines(&gemfile),
        "config" | "config.toml" if parent == ".cargo" => first_added(Kind::RegistrySetting),
        n if REGISTRY_FILES.iter().any(|r| r.eq_ignore_ascii_case(n)) => {
            first_added(Kind::RegistrySetting)
        }
        n if is_requirements(n) => lines(&requirements),
        _ => Vec::new(),
    }
}

/// The rule for a lockfile's lines: whether one resolves a package from outside the registry.
pub fn lockfile_rule(name: &str) -> Option<fn(&str) -> bool> {
    let rule: fn(&str) -> bool = match name {
        "package-lock.json" | "npm-shrinkwrap.json" => {
            |l| value_after(l, "\"resolved\":").is_some_and(|v| !allowed(v, NPM))
        }
        "yarn.lock" => |l| {
            value_after(l, "resolved ").is_some_and(|v| !allowed(v, NPM))
                || value_after(l, "resolution:").is_some_and(|v| !yarn_berry_local(v))
        },
        "pnpm-lock.yaml" => |l| {
            value_after(l, "tarball:").is_some_and(|v| !allowed(v, NPM))
                || l.contains("repo:")
                || l.contains("type: git")
        },
        "bun.lock" => |l| urls(l).any(|u| !allowed(u, NPM)) || l.contains("github:"),
        "Cargo.lock" => |l| {
            l.trim_start().starts_with("source =")
                && value_after(l, "source =").is_some_and(|v| !CRATES_IO.contains(&v))
        },
        "poetry.lock" => |l| {
            l.trim() == "[package.source]"
                || value_after(l, "url =").is_some_and(|v| !allowed(v, PYPI))
        },
        "uv.lock" | "Pipfile.lock" => {
            |l| urls(l).any(|u| !allowed(u, PYPI)) || l.contains("git =") || l.contains("\"git\":")
        }
        "Gemfile.lock" => |l| value_after(l, "remote:").is_some_and(|v| !allowed(v, RUBYGEMS)),
        _ => return None,
    };
    Some(rule)
}

/// The value after `key` on the line: quotes, spaces and braces trimmed, up to the next quote,
/// space or comma.
fn value_after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    let rest = line[at..].trim_start_matches([' ', '"', '\'', '{', '\t']);
    let end = rest.find(['"', '\'', ' ', ',', '}']).unwrap_or(rest.len());
    Some(&rest[..end]).filter(|v| !v.is_empty())
}

/// Whether `value` starts with one of the registry's URLs (ASCII case ignored; each prefix ends
/// its host with `/`, so `registry.npmjs.org.evil.example` does not pass).
fn allowed(value: &str, prefixes: &[&str]) -> bool {
    prefixes.iter().any(|p| {
        value
            .get(..p.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(p))
            && (p.ends_with('/') || value.len() == p.len())
    })
}

/// Every `scheme://…` on a line.
fn urls(line: &str) -> impl Iterator<Item = &str> {
    line.match_indices("://").map(move |(at, _)| {
        let start = line[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+.-".contains(c)))
            .map_or(0, |i| i + 1);
        let end = line[at..]
            .find(['"', '\'', ' ', ',', '}', ']', ')'])
            .map_or(line.len(), |i| at + i);
        &line[start..end]
    })
}

/// A yarn (berry) `resolution:` from the registry or the repository itself.
fn yarn_berry_local(value: &str) -> bool {
    // `name@protocol:…`; a scoped name starts with `@`.
    let Some(at) = value.get(1..).and_then(|v| v.find('@')).map(|i| i + 1) else {
        return false;
    };
    let protocol = &value[at + 1..];
    ["npm:", "workspace:", "patch:", "portal:", "link:", "file:"]
        .iter()
        .any(|p| protocol.starts_with(p))
}

/// A dependency version that names its own source: a URL, git, a hosted-git shorthand.
fn foreign_spec(spec: &str) -> bool {
    let s = spec.trim();
    let shorthand = {
        let repo = s.split('#').next().unwrap_or(s);
        !s.starts_with(['@', '.', '/', '~'])
            && repo.split('/').count() == 2
            && repo
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    };
    s.contains("://")
        || s.starts_with("git")
        || ["github:", "gitlab:", "bitbucket:", "gist:"]
            .iter()
            .any(|p| s.starts_with(p))
        || shorthand
}

fn package_json(path: &str, f: &FileChange, added: &[(usize, &str)]) -> Vec<Finding> {
    let old: Value = serde_json::from_slice(&f.old_content).unwrap_or(Value::Null);
    let Ok(new) = serde_json::from_slice::<Value>(&f.content) else {
        // Not JSON npm would read (its scripts are read by line in `runs_code`).
        return Vec::new();
    };
    let line_of = |key: &str| {
        let quoted = format!("\"{key}\"");
        added
            .iter()
            .find(|(_, l)| l.contains(&quoted))
            .map(|(n, _)| *n)
    };
    let mut out = Vec::new();
    for field in DEPENDENCY_FIELDS {
        let Some(deps) = new[field].as_object() else {
            continue;
        };
        for (name, spec) in deps {
            let spec_text = spec.as_str().unwrap_or("");
            if foreign_spec(spec_text) && old[field][name] != *spec {
                out.push(Finding {
                    path: path.to_string(),
                    line: line_of(name),
                    kind: Kind::ForeignSource,
                });
            }
        }
    }
    out
}

fn cargo_toml(line: &str) -> Option<Kind> {
    let l: String = line
        .split('#')
        .next()
        .unwrap_or("")
        .replace([' ', '\t'], "");
    if l.starts_with("[patch") || l.starts_with("[replace") {
        return Some(Kind::SourceOverride);
    }
    if l.contains("git=\"") || l.contains("registry=\"") || l.contains("registry-index=\"") {
        return Some(Kind::SourceOverride);
    }
    None
}

fn pyproject(line: &str) -> Option<Kind> {
    let l = line.trim();
    let index = [
        "[[tool.uv.index]]",
        "[tool.uv.sources]",
        "[[tool.poetry.source]]",
        "[[tool.pdm.source]]",
    ];
    if index.iter().any(|h| l.starts_with(h)) || l.contains("index-url") {
        return Some(Kind::RegistrySetting);
    }
    l.replace(' ', "")
        .contains("git=\"")
        .then_some(Kind::SourceOverride)
}

fn gemfile(line: &str) -> Option<Kind> {
    let l = line.trim();
    if l.starts_with("source ") && !l.contains("https://rubygems.org") {
        return Some(Kind::RegistrySetting);
    }
    (l.contains("git:") || l.contains("github:") || l.contains(":git =>"))
        .then_some(Kind::SourceOverride)
}

fn is_requirements(name: &str) -> bool {
    (name.starts_with("requirements") || name.starts_with("constraints")) && name.ends_with(".txt")
}

fn requirements(line: &str) -> Option<Kind> {
    let l = line.trim();
    let index = [
        "-i ",
        "-i=",
        "--index-url",
        "--extra-index-url",
        "-f ",
        "--find-links",
        "--trusted-host",
    ];
    if index.iter().any(|p| l.starts_with(p)) {
        return Some(Kind::RegistrySetting);
    }
    (!l.starts_with('#') && (l.contains("://") || l.starts_with("git+") || l.contains(" @ ")))
        .then_some(Kind::ForeignSource)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threat::gate::tests::{added, gate, modified};

    fn kinds(path: &str, old: Option<&str>, new: &str) -> Vec<(Option<usize>, Kind)> {
        let f = match old {
            Some(old) => modified(path, old, new),
            None => added(path, new.as_bytes()),
        };
        gate(vec![f])
            .review
            .shown
            .into_iter()
            .map(|f| (f.line, f.kind))
            .collect()
    }

    #[test]
    fn lockfile_entries_from_outside_the_registry_need_review() {
        let npm = "{\n  \"a\": {\"resolved\": \"https://registry.npmjs.org/a/-/a-1.tgz\"},\n  \"b\": {\"resolved\": \"https://evil.example/b.tgz\"},\n  \"c\": {\"resolved\": \"https://registry.npmjs.org.evil.example/c.tgz\"},\n  \"d\": {\"resolved\": \"git+ssh://git@github.com/x/d.git\"}\n}\n";
        assert_eq!(
            kinds("package-lock.json", None, npm),
            [
                (Some(3), Kind::ForeignSource),
                (Some(4), Kind::ForeignSource),
                (Some(5), Kind::ForeignSource)
            ]
        );
        let yarn = "a@^1:\n  resolved \"https://registry.yarnpkg.com/a/-/a-1.tgz#abc\"\nb@^1:\n  resolved \"http://registry.yarnpkg.com/b.tgz\"\n\"c@npm:1\":\n  resolution: \"c@npm:1.0.0\"\n\"@s/d@x\":\n  resolution: \"@s/d@https://evil.example/d.tgz\"\n";
        let lines: Vec<_> = kinds("yarn.lock", None, yarn)
            .into_iter()
            .map(|k| k.0)
            .collect();
        assert_eq!(lines, [Some(4), Some(8)]);
        let cargo = "[[package]]\nname = \"a\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\n[[package]]\nname = \"b\"\nsource = \"git+https://github.com/x/b#0123\"\nsource = \"sparse+https://index.crates.io/\"\n";
        assert_eq!(
            kinds("sub/Cargo.lock", None, cargo),
            [(Some(6), Kind::ForeignSource)]
        );
        let pnpm = "  a@1:\n    resolution: {integrity: sha512-x}\n  b@1:\n    resolution: {tarball: https://evil.example/b.tgz}\n  c@1:\n    resolution: {type: git, repo: https://github.com/x/c, commit: 01}\n";
        assert_eq!(kinds("pnpm-lock.yaml", None, pnpm).len(), 2);
        let uv = "source = { registry = \"https://pypi.org/simple\" }\nsdist = { url = \"https://files.pythonhosted.org/p/a.tar.gz\" }\nsource = { git = \"https://github.com/x/y\" }\nwheels = [{ url = \"https://evil.example/a.whl\" }]\n";
        let lines: Vec<_> = kinds("uv.lock", None, uv)
            .into_iter()
            .map(|k| k.0)
            .collect();
        assert_eq!(lines, [Some(3), Some(4)]);
        let gems =
            "GEM\n  remote: https://rubygems.org/\nGIT\n  remote: https://github.com/x/y.git\n";
        assert_eq!(kinds("Gemfile.lock", None, gems).len(), 1);
        let poetry = "[[package]]\nname = \"a\"\n[package.source]\ntype = \"git\"\nurl = \"https://github.com/x/a\"\n";
        assert_eq!(kinds("poetry.lock", None, poetry).len(), 2);
    }

    #[test]
    fn a_lockfile_line_already_there_is_not_new() {
        let old = "source = \"git+https://github.com/x/b#0123\"\n";
        let new = format!("{old}name = \"c\"\n");
        assert!(kinds("Cargo.lock", Some(old), &new).is_empty());
    }

    #[test]
    fn registry_settings_and_source_overrides_need_review() {
        assert_eq!(
            kinds(".npmrc", None, "\nregistry=https://evil.example/\n"),
            [(Some(2), Kind::RegistrySetting)]
        );
        for path in [
            ".yarnrc.yml",
            "pip.conf",
            "NuGet.Config",
            ".cargo/config.toml",
            "x/.cargo/config",
        ] {
            assert_eq!(kinds(path, None, "x = 1\n").len(), 1, "{path}");
        }
        assert!(kinds("config.toml", None, "x = 1\n").is_empty());
        let toml = "[dependencies]\nserde = \"1\"\nevil = { git = \"https://x.example/evil\" }\nmine = { version = \"1\", registry = \"corp\" }\n[patch.crates-io]\nserde = { path = \"../serde\" }\n";
        let lines: Vec<_> = kinds("Cargo.toml", None, toml)
            .into_iter()
            .map(|k| k.0)
            .collect();
        assert_eq!(lines, [Some(3), Some(4), Some(5)]);
        let gomod = "module x\nrequire a v1\nreplace a => github.com/evil/a v1\n";
        assert_eq!(
            kinds("go.mod", None, gomod),
            [(Some(3), Kind::SourceOverride)]
        );
        let req = "requests==2\n--extra-index-url https://evil.example/simple\nx @ https://evil.example/x.whl\ngit+https://github.com/x/y\n# https://example.com\n";
        let found = kinds("requirements-dev.txt", None, req);
        assert_eq!(
            found,
            [
                (Some(2), Kind::RegistrySetting),
                (Some(3), Kind::ForeignSource),
                (Some(4), Kind::ForeignSource)
            ]
        );
        let py = "[[tool.uv.index]]\nurl = \"https://evil.example\"\n[project]\nname = \"x\"\n";
        assert_eq!(kinds("pyproject.toml", None, py).len(), 1);
        let gemfile = "source \"https://rubygems.org\"\nsource \"https://gems.evil.example\"\ngem \"x\", git: \"https://github.com/x/x\"\n";
        assert_eq!(kinds("Gemfile", None, gemfile).len(), 2);
    }

    #[test]
    fn manifest_dependencies_by_url_or_git_need_review() {
        let new = "{\n  \"dependencies\": {\n    \"a\": \"^1.2.3\",\n    \"b\": \"github:evil/b\",\n    \"c\": \"evil/c#main\",\n    \"d\": \"https://evil.example/d.tgz\",\n    \"e\": \"npm:e@1\",\n    \"@s/f\": \"workspace:*\"\n  }\n}\n";
        let lines: Vec<_> = kinds("package.json", None, new)
            .into_iter()
            .map(|k| k.0)
            .collect();
        assert_eq!(lines, [Some(4), Some(5), Some(6)]);
    }

    #[test]
    fn hostile_values_do_not_slip_past_the_url_checks() {
        let npm = [
            "https://registry.npmjs.org@evil.example/a.tgz",
            "HTTPS://REGISTRY.NPMJS.ORG/a.tgz",
            "https://registry.npmjs.org",
        ];
        assert!(!allowed(npm[0], NPM));
        assert!(allowed(npm[1], NPM));
        assert!(!allowed(npm[2], NPM), "a prefix with its slash");
        assert_eq!(value_after("x", "\"resolved\":"), None);
        assert_eq!(value_after("\"resolved\": \"\"", "\"resolved\":"), None);
        let u: Vec<&str> = urls("a (https://x.example/p) 'git+ssh://y'").collect();
        assert_eq!(u, ["https://x.example/p", "git+ssh://y"]);
    }
}
