//! The inputs table (`src/config/inputs.rs`) against what users read: `action.yaml`, the README's
//! inputs and outputs tables, and `fro-bot local --help`. The table is the truth; each check lists
//! every disagreement it finds. Likewise the README's other tables generated from code: the
//! `allowed-domains` sets and the threat gate's table of what makes code run.

use fro_bot::config::inputs::{InputDefault, InputSpec, INPUTS};
use fro_bot::runner::env::output;
use serde_norway::{Mapping, Value};

fn repo_file(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A scalar as the runner hands it to the step (`default: 50` and `default: "50"` are the same).
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn section<'a>(doc: &'a Value, name: &str) -> &'a Mapping {
    doc.get(name)
        .and_then(Value::as_mapping)
        .unwrap_or_else(|| panic!("action.yaml has no '{name}' mapping"))
}

fn keys(map: &Mapping) -> Vec<String> {
    map.keys()
        .map(|k| scalar(k).unwrap_or_else(|| format!("{k:?}")))
        .collect()
}

/// How two lists of names differ: names only one side has, else the order.
fn name_problems(what: &str, source: &str, theirs: &[String], ours: &[&str]) -> Vec<String> {
    let truth = if what == "outputs" {
        "runner::env::output::ALL"
    } else {
        "the table"
    };
    let only_theirs: Vec<&String> = theirs
        .iter()
        .filter(|n| !ours.contains(&n.as_str()))
        .collect();
    let only_ours: Vec<&&str> = ours
        .iter()
        .filter(|n| !theirs.iter().any(|t| t == *n))
        .collect();
    let mut problems = Vec::new();
    if !only_theirs.is_empty() {
        problems.push(format!("{what} in {source} only: {only_theirs:?}"));
    }
    if !only_ours.is_empty() {
        problems.push(format!("{what} in {truth} but not {source}: {only_ours:?}"));
    }
    if problems.is_empty() && theirs != ours {
        problems.push(format!(
            "{what}: {source} lists {theirs:?}, {truth} {ours:?}"
        ));
    }
    problems
}

/// Every way `action.yaml`'s inputs and outputs differ from the table and `runner::env::output`.
fn action_yaml_problems(text: &str) -> Vec<String> {
    let doc: Value = serde_norway::from_str(text).expect("action.yaml is YAML");
    let mut problems = Vec::new();
    let inputs = section(&doc, "inputs");
    let table: Vec<&str> = INPUTS.iter().map(|s| s.name).collect();
    problems.extend(name_problems(
        "inputs",
        "action.yaml",
        &keys(inputs),
        &table,
    ));
    for spec in INPUTS {
        let Some(entry) = inputs.get(spec.name).and_then(Value::as_mapping) else {
            continue; // Reported by the name check.
        };
        let field = |key: &str| entry.get(key).and_then(scalar);
        let name = spec.name;
        for key in keys(entry) {
            if !["description", "required", "default"].contains(&key.as_str()) {
                problems.push(format!(
                    "{name}: action.yaml has '{key}', the table has no such field"
                ));
            }
        }
        if field("description").as_deref() != Some(spec.description) {
            problems.push(format!(
                "{name}: description {:?} in action.yaml, {:?} in the table",
                field("description"),
                spec.description
            ));
        }
        let required = entry
            .get("required")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if required != spec.required {
            problems.push(format!(
                "{name}: required {required} in action.yaml, {} in the table",
                spec.required
            ));
        }
        if field("default").as_deref() != spec.default.in_action_yaml() {
            problems.push(format!(
                "{name}: default {:?} in action.yaml, {:?} in the table",
                field("default"),
                spec.default
            ));
        }
    }
    let outputs = keys(section(&doc, "outputs"));
    problems.extend(name_problems(
        "outputs",
        "action.yaml",
        &outputs,
        output::ALL,
    ));
    problems
}

/// The rows of the README table under `heading`: (first cell, second cell), backticks kept.
fn readme_rows(text: &str, heading: &str) -> Vec<(String, String)> {
    let mut lines = text.lines().skip_while(|l| l.trim() != heading).skip(1);
    let rows = lines
        .by_ref()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.trim_start().starts_with('|'));
    rows.skip(2) // The header and the |---| line.
        .map(|row| {
            let cells: Vec<&str> = row
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let cell = |i: usize| cells.get(i).copied().unwrap_or_default().to_string();
            (cell(0), cell(1))
        })
        .collect()
}

/// What the README's default column says for an input.
fn readme_default(spec: &InputSpec) -> String {
    if spec.required {
        return "**required**".into();
    }
    match spec.default {
        InputDefault::None => String::new(),
        InputDefault::Value(v) | InputDefault::Expression(v) => format!("`{v}`"),
        InputDefault::Derived(text) => text.to_string(),
    }
}

fn readme_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let rows = readme_rows(text, "## Inputs");
    let names: Vec<String> = rows
        .iter()
        .map(|(n, _)| n.trim_matches('`').to_string())
        .collect();
    let table: Vec<&str> = INPUTS.iter().map(|s| s.name).collect();
    problems.extend(name_problems("inputs", "the README", &names, &table));
    for (name, default) in &rows {
        let name = name.trim_matches('`');
        let Some(spec) = INPUTS.iter().find(|s| s.name == name) else {
            continue; // Reported by the name check.
        };
        if *default != readme_default(spec) {
            problems.push(format!(
                "{name}: the README's default is {default:?}, the table's {:?}",
                readme_default(spec)
            ));
        }
    }
    let outputs: Vec<String> = readme_rows(text, "## Outputs")
        .into_iter()
        .map(|(n, _)| n.trim_matches('`').to_string())
        .collect();
    problems.extend(name_problems(
        "outputs",
        "the README",
        &outputs,
        output::ALL,
    ));
    problems
}

#[test]
fn action_yaml_agrees_with_the_table() {
    let problems = action_yaml_problems(&repo_file("action.yaml"));
    assert!(
        problems.is_empty(),
        "action.yaml vs src/config/inputs.rs:\n{}",
        problems.join("\n")
    );
}

#[test]
fn readme_agrees_with_the_table() {
    let problems = readme_problems(&repo_file("README.md"));
    assert!(
        problems.is_empty(),
        "README.md vs src/config/inputs.rs:\n{}",
        problems.join("\n")
    );
}

#[test]
fn an_input_in_action_yaml_only_is_caught() {
    let text = repo_file("action.yaml").replacen(
        "inputs:\n",
        "inputs:\n  extra-knob:\n    description: Not in the table.\n    required: false\n",
        1,
    );
    let problems = action_yaml_problems(&text);
    assert!(
        problems.iter().any(|p| p.contains("extra-knob")),
        "{problems:?}"
    );
}

#[test]
fn a_changed_default_or_description_in_action_yaml_is_caught() {
    let original = repo_file("action.yaml");
    let text = original.replacen("default: \"1800000\"", "default: \"60000\"", 1);
    assert_ne!(
        text, original,
        "the timeout default moved; update this test"
    );
    let problems = action_yaml_problems(&text);
    assert!(
        problems.iter().any(|p| p.starts_with("timeout: default")),
        "{problems:?}"
    );

    let text = original.replacen("Model as provider/model", "Model as vendor/model", 1);
    assert_ne!(text, original);
    let problems = action_yaml_problems(&text);
    assert!(
        problems.iter().any(|p| p.starts_with("model: description")),
        "{problems:?}"
    );

    let text = original.replacen(
        "  session-id:\n",
        "  session-id:\n    description: x\n  extra-output:\n",
        1,
    );
    let problems = action_yaml_problems(&text);
    assert!(
        problems.iter().any(|p| p.contains("extra-output")),
        "{problems:?}"
    );
}

#[test]
fn a_readme_row_out_of_line_is_caught() {
    let original = repo_file("README.md");
    let text = original.replacen(
        "| `s3-sse-kms-key-id` |",
        "| `extra-knob` | `on` | not in the table |\n| `s3-sse-kms-key-id` |",
        1,
    );
    assert_ne!(text, original);
    assert!(readme_problems(&text)
        .iter()
        .any(|p| p.contains("extra-knob")));
    let text = original.replacen("| `timeout` | `1800000` |", "| `timeout` | `60000` |", 1);
    assert_ne!(text, original);
    assert!(readme_problems(&text)
        .iter()
        .any(|p| p.starts_with("timeout:")));
}

/// `fro-bot local --help` lists each `local` input with its description and no other input.
#[test]
fn local_help_lists_the_local_inputs_with_their_descriptions() {
    let out = std::process::Command::new(crate::support::action::BIN)
        .args(["local", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    // Whatever clap wraps or indents, the words stay in order.
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let help = words(&String::from_utf8_lossy(&out.stdout));
    for spec in INPUTS {
        let flag = format!("--{} <{}>", spec.name, spec.parser.value_name());
        if spec.local_flag {
            assert!(help.contains(&flag), "{flag} missing:\n{help}");
            assert!(
                help.contains(&words(spec.description)),
                "{}'s help missing:\n{help}",
                spec.name
            );
            if let Some(default) = spec.default.value() {
                let shown = format!("{} [default: {default}]", words(spec.description));
                assert!(
                    help.contains(&shown),
                    "{}'s default missing:\n{help}",
                    spec.name
                );
            }
        } else {
            assert!(
                !help.contains(&format!("--{} ", spec.name)),
                "{} is a flag:\n{help}",
                spec.name
            );
        }
    }
}

/// The README's table of `allowed-domains` sets, as (set, hosts), read from the table whose header
/// is `| set | hosts |`.
fn readme_sets(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .skip_while(|l| l.trim() != "| set | hosts |")
        .skip(2)
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(|row| {
            let cells: Vec<&str> = row.trim().trim_matches('|').split('|').collect();
            let unquote = |s: &str| s.trim().trim_matches('`').to_string();
            let hosts = cells
                .get(1)
                .map(|c| c.split(',').map(unquote).collect())
                .unwrap_or_default();
            (unquote(cells[0]), hosts)
        })
        .collect()
}

#[test]
fn the_readmes_named_sets_are_the_codes() {
    let ours: Vec<(String, Vec<String>)> = fro_bot::egress::allowlist::SETS
        .iter()
        .map(|(name, hosts)| {
            (
                name.to_string(),
                hosts.iter().map(|h| h.to_string()).collect(),
            )
        })
        .collect();
    let readme = readme_sets(&repo_file("README.md"));
    assert_eq!(readme, ours, "README.md's sets vs egress::allowlist::SETS");
    // The check itself: a host the code lacks is caught.
    let changed = repo_file("README.md").replacen("`pypi.org`", "`pypi.example`", 1);
    assert_ne!(readme_sets(&changed), ours);
}

/// The README's table of what makes code run, as it stands: the lines from its header row to the
/// end of the table.
fn readme_runs_code(text: &str) -> String {
    text.lines()
        .skip_while(|l| !l.starts_with("| runs on | ecosystem | files | what counts |"))
        .take_while(|l| l.starts_with('|'))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn the_readmes_runs_code_table_is_generated_from_the_gates_table() {
    let ours = fro_bot::threat::runs_code::readme_table();
    let readme = readme_runs_code(&repo_file("README.md"));
    assert!(
        readme == ours,
        "README.md's table of what makes code run differs from threat::runs_code::RUNS_CODE; \
         paste this in its place:\n\n{ours}"
    );
    // The check itself: a row the code lacks, or a changed cell, is caught.
    let original = repo_file("README.md");
    let extra = original.replacen(
        "| runs on | ecosystem | files | what counts |\n|---|---|---|---|\n",
        "| runs on | ecosystem | files | what counts |\n|---|---|---|---|\n| install or build | x | `y` | z |\n",
        1,
    );
    assert_ne!(extra, original);
    assert_ne!(readme_runs_code(&extra), ours);
    let changed = original.replacen("`extconf.rb`", "`extconf.rake`", 1);
    assert_ne!(changed, original);
    assert_ne!(readme_runs_code(&changed), ours);
}
