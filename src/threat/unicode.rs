//! Hidden Unicode controls on added lines ("Trojan Source", docs/security.md#the-threat-check):
//! bidirectional embeddings, overrides and isolates reorder what a reviewer sees against what the
//! compiler reads; zero-width characters and tag characters hide text (and instructions to a
//! model) in plain sight. Each refuses the change, named by file, line and code point.

use super::{Finding, Kind};

/// Whether `c` is a control that changes how a line reads without being seen.
pub fn is_hidden_control(c: char) -> bool {
    matches!(c,
        // Bidirectional embeddings and overrides (LRE, RLE, PDF, LRO, RLO) and isolates (LRI,
        // RLI, FSI, PDI).
        '\u{202A}'..='\u{202E}'
        | '\u{2066}'..='\u{2069}'
        // Zero-width space, non-joiner, joiner; left-to-right and right-to-left marks; the
        // Arabic letter mark.
        | '\u{200B}'..='\u{200F}'
        | '\u{061C}'
        // Word joiner and the invisible operators.
        | '\u{2060}'..='\u{2064}'
        // The byte-order mark anywhere but the start of a file (`scan` lets that one pass).
        | '\u{FEFF}'
        // Tag characters (invisible ASCII) and the variation-selector supplement: both carry
        // hidden text.
        | '\u{E0000}'..='\u{E007F}'
        | '\u{E0100}'..='\u{E01EF}')
}

/// One finding per added line holding a hidden control (the first one's code point).
pub fn scan(path: &str, added: &[(usize, &str)]) -> Vec<Finding> {
    added
        .iter()
        .filter_map(|(n, line)| {
            let line = match n {
                // A byte-order mark that starts the file is an encoding mark, not a hidden one.
                1 => line.strip_prefix('\u{FEFF}').unwrap_or(line),
                _ => line,
            };
            let c = line.chars().find(|c| is_hidden_control(*c))?;
            Some(Finding {
                path: path.to_string(),
                line: Some(*n),
                kind: Kind::HiddenControl {
                    code_point: u32::from(c),
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threat::gate::tests::{added, gate, modified};

    #[test]
    fn trojan_source_is_refused_by_file_line_and_code_point_never_the_line() {
        // The classic: a comment that ends, to the eye, before code the compiler sees inside it.
        let evil = "fn main() {\n    let admin = false; /*\u{202E} } \u{2066}if admin\u{2069} \u{2066} begin admins only */\n}\n";
        let r = gate(vec![added("src/main.rs", evil.as_bytes())]);
        assert_eq!(r.refused.total, 1);
        let f = &r.refused.shown[0];
        assert_eq!(
            (f.path.as_str(), f.line, &f.kind),
            (
                "src/main.rs",
                Some(2),
                &Kind::HiddenControl { code_point: 0x202E }
            )
        );
        let text = f.describe();
        assert!(text.starts_with("`src/main.rs` line 2 "), "{text}");
        assert!(text.contains("U+202E"), "{text}");
        assert!(
            !text.contains("admin"),
            "the content is never shown: {text}"
        );
    }

    #[test]
    fn every_listed_control_is_found_and_plain_text_passes() {
        for c in [
            '\u{202A}',
            '\u{202E}',
            '\u{2066}',
            '\u{2069}',
            '\u{200B}',
            '\u{200F}',
            '\u{FEFF}',
            '\u{061C}',
            '\u{2060}',
            '\u{E0041}',
            '\u{E0100}',
        ] {
            let found = scan("a", &[(2, &format!("x{c}y"))]);
            assert_eq!(found.len(), 1, "U+{:04X}", u32::from(c));
        }
        let plain = "héllo wörld — “quoted” 日本語 👍🏽 e\u{0301} ❤\u{FE0F}";
        assert!(scan("a", &[(1, plain)]).is_empty());
    }

    #[test]
    fn a_byte_order_mark_at_the_start_passes_and_an_old_line_is_not_new() {
        assert!(scan("a", &[(1, "\u{FEFF}first")]).is_empty());
        assert_eq!(scan("a", &[(3, "\u{FEFF}mid")]).len(), 1);
        let old = "keep \u{202E} this\n";
        let f = modified("a.txt", old, &format!("{old}clean\n"));
        assert!(gate(vec![f]).refused.is_empty());
    }
}
