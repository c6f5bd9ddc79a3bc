//! The step summary: markdown appended to `GITHUB_STEP_SUMMARY`, at most 1 MiB per step.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use super::RunnerError;

/// The runner refuses a step summary above this size.
pub const MAX_SUMMARY_BYTES: u64 = 1024 * 1024;

const TRUNCATED_NOTE: &str = "\n\n_(summary truncated: the step summary limit is 1 MiB)_\n";

/// Appends markdown, cutting it (at a character boundary, with a note) so the file stays under the
/// limit: an oversized summary would be dropped by the runner entirely.
pub fn append(path: &Path, markdown: &str) -> Result<(), RunnerError> {
    let err = |source| RunnerError::Summary {
        path: path.to_path_buf(),
        source,
    };
    let existing = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let room = MAX_SUMMARY_BYTES.saturating_sub(existing) as usize;
    let text = if markdown.len() <= room {
        markdown.to_string()
    } else if room > TRUNCATED_NOTE.len() {
        let mut cut = room - TRUNCATED_NOTE.len();
        while !markdown.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}{TRUNCATED_NOTE}", &markdown[..cut])
    } else {
        return Ok(());
    };
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(err)?;
    file.write_all(text.as_bytes()).map_err(err)
}

/// Escapes a table cell: `|` would end the cell and a line break the row.
pub fn escape_cell(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace("\r\n", "<br>")
        .replace(['\n', '\r'], "<br>")
}

/// A markdown table with a header row.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    out.push_str(&line(header.iter().map(|h| escape_cell(h)).collect()));
    out.push_str(&line(header.iter().map(|_| "---".to_string()).collect()));
    for row in rows {
        out.push_str(&line(row.iter().map(|c| escape_cell(c)).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_escaped() {
        let t = table(&["a", "b"], &[vec!["x|y".into(), "1\n2".into()]]);
        assert_eq!(t, "| a | b |\n| --- | --- |\n| x\\|y | 1<br>2 |\n");
    }

    #[test]
    fn summary_never_exceeds_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.md");
        append(&path, &"é".repeat(400_000)).unwrap();
        append(&path, &"x".repeat(600_000)).unwrap();
        append(&path, "more").unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len <= MAX_SUMMARY_BYTES, "{len}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("summary truncated"));
    }
}
