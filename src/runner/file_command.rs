//! The runner's file commands: `GITHUB_OUTPUT`, `GITHUB_STATE` and `GITHUB_ENV` take appended
//! `name=value` lines, or `name<<DELIM\nvalue\nDELIM\n` for values that may hold a line break.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use rand::Rng as _;

use super::RunnerError;

/// Appends one entry to a file-command file, with a single `write` call so a concurrent or
/// interrupted writer can never leave half an entry behind that would swallow later ones.
pub fn append(path: &Path, name: &str, value: &str) -> Result<(), RunnerError> {
    let entry = format_entry(name, value)?;
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| RunnerError::FileCommand {
            path: path.to_path_buf(),
            source,
        })?;
    file.write_all(entry.as_bytes())
        .map_err(|source| RunnerError::FileCommand {
            path: path.to_path_buf(),
            source,
        })
}

/// Formats one entry. Single-line values use `name=value`; anything with a line break uses the
/// heredoc form with a random delimiter checked not to occur in the value.
pub fn format_entry(name: &str, value: &str) -> Result<String, RunnerError> {
    if name.is_empty() || name.contains('=') || name.contains("<<") || name.contains(['\n', '\r']) {
        return Err(RunnerError::InvalidName {
            name: name.to_string(),
        });
    }
    if !value.contains(['\n', '\r']) {
        return Ok(format!("{name}={value}\n"));
    }
    let delimiter = loop {
        let candidate = random_delimiter();
        if !value.contains(&candidate) {
            break candidate;
        }
    };
    Ok(format!("{name}<<{delimiter}\n{value}\n{delimiter}\n"))
}

fn random_delimiter() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    format!("ghadelimiter_{}", hex::encode(bytes))
}

/// A port of the runner's parser for these files (`SetEnvFileCommand`/`SetOutputFileCommand`),
/// used to prove that everything we write reads back as written.
pub fn parse(content: &str) -> Result<Vec<(String, String)>, String> {
    // The runner reads with `StreamReader.ReadLine`, which ends a line at \n, \r or \r\n.
    let lines = super::lines::split(content);
    let mut entries = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index];
        index += 1;
        if line.is_empty() {
            continue;
        }
        let equals = line.find('=');
        let heredoc = line.find("<<");
        match (equals, heredoc) {
            (Some(eq), h) if h.is_none_or(|h| eq < h) => {
                let key = &line[..eq];
                if key.is_empty() {
                    return Err(format!("invalid format '{line}': empty name"));
                }
                entries.push((key.to_string(), line[eq + 1..].to_string()));
            }
            (_, Some(h)) => {
                let key = &line[..h];
                let delimiter = &line[h + 2..];
                if key.is_empty() || delimiter.is_empty() {
                    return Err(format!("invalid format '{line}'"));
                }
                let mut value_lines = Vec::new();
                loop {
                    let Some(next) = lines.get(index) else {
                        return Err(format!("matching delimiter not found '{delimiter}'"));
                    };
                    index += 1;
                    if *next == delimiter {
                        break;
                    }
                    value_lines.push(*next);
                }
                entries.push((key.to_string(), value_lines.join("\n")));
            }
            _ => return Err(format!("invalid format '{line}'")),
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(values: &[(&str, &str)]) -> Vec<(String, String)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output");
        for (name, value) in values {
            append(&path, name, value).unwrap();
        }
        parse(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    #[test]
    fn every_value_shape_reads_back_as_written() {
        let values = [
            ("plain", "hello"),
            ("empty", ""),
            ("equals", "a=b=c"),
            ("heredoc-marker", "x<<EOF"),
            ("multi", "line one\nline two\n\nline four"),
            ("trailing-newline-inside", "a\nb"),
            ("unicode", "söme ünïcode ✓ 🎉"),
            ("looks-like-entry", "other=value\nname<<D\nD"),
            ("json", "{\"a\":[1,2],\"b\":\"c\\nd\"}"),
        ];
        let parsed = round_trip(&values);
        let expected: Vec<(String, String)> = values
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(parsed, expected);
    }

    #[test]
    fn a_value_holding_a_delimiter_still_round_trips() {
        // A value that contains a previously generated delimiter line must not end the heredoc.
        let first = format_entry("a", "x\ny").unwrap();
        let delimiter = first.lines().next().unwrap().split("<<").nth(1).unwrap();
        let hostile = format!("before\n{delimiter}\nafter");
        let parsed = round_trip(&[("a", "x\ny"), ("b", &hostile)]);
        assert_eq!(parsed[1], ("b".to_string(), hostile));
    }

    #[test]
    fn bad_names_are_refused() {
        for name in ["", "a=b", "a<<b", "a\nb"] {
            assert!(format_entry(name, "v").is_err(), "{name:?} accepted");
        }
    }

    #[test]
    fn parser_rejects_an_unterminated_heredoc() {
        assert!(parse("name<<EOF\nvalue\n").is_err());
        assert!(parse("=value\n").is_err());
        assert!(parse("garbage\n").is_err());
    }

    #[test]
    fn crlf_files_parse_like_the_runner() {
        assert_eq!(
            parse("a=1\r\nb<<D\r\nx\r\nD\r\n").unwrap(),
            vec![("a".into(), "1".into()), ("b".into(), "x".into())]
        );
    }
}
