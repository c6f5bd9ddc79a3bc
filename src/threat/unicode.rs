//! Hidden and confusable Unicode on added lines ("Trojan Source", docs/security.md#the-threat-check):
//! bidirectional embeddings, overrides and isolates reorder what a reviewer sees against what the
//! compiler reads; zero-width characters, tag characters and variation selectors hide text (and
//! instructions to a model) in plain sight; Hangul fillers are letters nobody sees, so they make
//! invisible identifiers (the "invisible backdoor"). Each refuses the change, named by file, line
//! and code point ([`scan`]). A word whose letters mix scripts that do not go together (a Cyrillic
//! `а` in a Latin name) makes one name look like another: it marks the change "needs review"
//! ([`mixed_scripts`]).

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
        // Tag characters (invisible ASCII) carry hidden text.
        | '\u{E0000}'..='\u{E007F}'
        // Hangul fillers: letters (so identifier characters) that show nothing.
        | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}')
}

/// Whether `c` is a variation selector (VS1–VS16, and the supplement VS17–VS256, which carry
/// hidden bytes one a character).
pub fn is_variation_selector(c: char) -> bool {
    matches!(c, '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}')
}

/// Whether `c` can show as an emoji, so that VS15/VS16 (text or emoji presentation) may follow it.
fn is_emoji_base(c: char) -> bool {
    matches!(c,
        '\u{00A9}' | '\u{00AE}' | '\u{203C}' | '\u{2049}' | '\u{2122}' | '\u{2139}'
        | '\u{2194}'..='\u{2199}' | '\u{21A9}'..='\u{21AA}' | '\u{231A}'..='\u{231B}'
        | '\u{2328}' | '\u{23CF}' | '\u{23E9}'..='\u{23F3}' | '\u{23F8}'..='\u{23FA}'
        | '\u{24C2}' | '\u{25AA}'..='\u{25AB}' | '\u{25B6}' | '\u{25C0}'
        | '\u{25FB}'..='\u{25FE}' | '\u{2600}'..='\u{27BF}' | '\u{2934}'..='\u{2935}'
        | '\u{2B05}'..='\u{2B07}' | '\u{2B1B}'..='\u{2B1C}' | '\u{2B50}' | '\u{2B55}'
        | '\u{3030}' | '\u{303D}' | '\u{3297}' | '\u{3299}' | '\u{1F000}'..='\u{1FAFF}')
}

/// The first hidden character of a line: a hidden control, or a variation selector other than
/// one VS15/VS16 directly after an emoji base (a keycap's digit, `#` or `*` when U+20E3 follows).
pub fn first_hidden(line: &str) -> Option<char> {
    let mut prev: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let presentation = matches!(c, '\u{FE0E}' | '\u{FE0F}');
        let before_keycap = chars.peek() == Some(&'\u{20E3}');
        let keycap = |p: char| (p.is_ascii_digit() || p == '#' || p == '*') && before_keycap;
        let allowed = presentation && prev.is_some_and(|p| is_emoji_base(p) || keycap(p));
        if is_hidden_control(c) || (is_variation_selector(c) && !allowed) {
            return Some(c);
        }
        prev = Some(c);
    }
    None
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
            let c = first_hidden(line)?;
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

/// The script of a letter, for the scripts whose letters are confused with each other's or
/// that go together in identifiers (Unicode's UTS #39); `None` for other characters (digits,
/// `_`, marks, scripts not listed).
fn script_of(c: char) -> Option<&'static str> {
    Some(match c {
        'A'..='Z'
        | 'a'..='z'
        | '\u{AA}'
        | '\u{BA}'
        | '\u{C0}'..='\u{24F}'
        | '\u{250}'..='\u{2AF}'
        | '\u{1D00}'..='\u{1D7F}'
        | '\u{1E00}'..='\u{1EFF}'
        | '\u{2C60}'..='\u{2C7F}'
        | '\u{A720}'..='\u{A7FF}'
        | '\u{AB30}'..='\u{AB6F}'
        | '\u{FF21}'..='\u{FF3A}'
        | '\u{FF41}'..='\u{FF5A}' => "Latin",
        '\u{370}'..='\u{3FF}' | '\u{1F00}'..='\u{1FFF}' => "Greek",
        '\u{400}'..='\u{52F}'
        | '\u{1C80}'..='\u{1C8F}'
        | '\u{2DE0}'..='\u{2DFF}'
        | '\u{A640}'..='\u{A69F}' => "Cyrillic",
        '\u{531}'..='\u{58F}' => "Armenian",
        '\u{591}'..='\u{5FF}' => "Hebrew",
        '\u{600}'..='\u{6FF}' | '\u{750}'..='\u{77F}' | '\u{8A0}'..='\u{8FF}' => "Arabic",
        '\u{10A0}'..='\u{10FF}' => "Georgian",
        '\u{13A0}'..='\u{13FF}' | '\u{AB70}'..='\u{ABBF}' => "Cherokee",
        '\u{3040}'..='\u{309F}' => "Hiragana",
        '\u{30A0}'..='\u{30FF}' | '\u{31F0}'..='\u{31FF}' | '\u{FF66}'..='\u{FF9F}' => "Katakana",
        '\u{3100}'..='\u{312F}' => "Bopomofo",
        '\u{1100}'..='\u{11FF}' | '\u{3130}'..='\u{318F}' | '\u{AC00}'..='\u{D7AF}' => "Hangul",
        '\u{3400}'..='\u{4DBF}'
        | '\u{4E00}'..='\u{9FFF}'
        | '\u{F900}'..='\u{FAFF}'
        | '\u{20000}'..='\u{2FFFF}' => "Han",
        _ => return None,
    })
}

/// Scripts one identifier may mix (UTS #39's "highly restrictive" level): Latin with Japanese,
/// Chinese or Korean writing.
const TOGETHER: &[&[&str]] = &[
    &["Latin", "Han", "Hiragana", "Katakana"],
    &["Latin", "Han", "Bopomofo"],
    &["Latin", "Han", "Hangul"],
];

/// The first two scripts of `word` when they do not go together.
fn mixed(word: &str) -> Option<[&'static str; 2]> {
    let mut seen: Vec<&'static str> = Vec::new();
    for s in word.chars().filter_map(script_of) {
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    let fits = |set: &&[&str]| seen.iter().all(|s| set.contains(s));
    match seen.as_slice() {
        [a, b, ..] if !TOGETHER.iter().any(fits) => Some([*a, *b]),
        _ => None,
    }
}

/// One finding per added line holding a word (letters, digits, `_`, `$`) that mixes scripts.
pub fn mixed_scripts(path: &str, added: &[(usize, &str)]) -> Vec<Finding> {
    added
        .iter()
        .filter_map(|(n, line)| {
            let scripts = line
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
                .find_map(mixed)?;
            Some(Finding {
                path: path.to_string(),
                line: Some(*n),
                kind: Kind::MixedScripts { scripts },
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

    #[test]
    fn hangul_fillers_make_invisible_identifiers_and_are_refused() {
        // The published "invisible backdoor": U+3164 as a JavaScript identifier.
        let js = "const { timeout, \u{3164} } = req.query;\nexec(\u{3164});\n";
        let r = gate(vec![added("server.js", js.as_bytes())]);
        let found: Vec<_> = r.refused.shown.iter().map(|f| (f.line, &f.kind)).collect();
        assert_eq!(
            found,
            [
                (Some(1), &Kind::HiddenControl { code_point: 0x3164 }),
                (Some(2), &Kind::HiddenControl { code_point: 0x3164 })
            ]
        );
        for c in ['\u{115F}', '\u{1160}', '\u{FFA0}'] {
            assert_eq!(
                scan("a", &[(1, &format!("let a{c} = 1"))]).len(),
                1,
                "U+{:04X}",
                u32::from(c)
            );
        }
    }

    #[test]
    fn variation_selectors_are_refused_except_one_after_an_emoji() {
        // Bytes hidden one a selector, after an ordinary letter and after an emoji.
        let hidden: String = (0..16u32)
            .filter_map(|i| char::from_u32(0xFE00 + i))
            .collect();
        for line in [
            format!("x{hidden}"),
            "ok \u{1F600}\u{FE0F}\u{FE01}".to_string(),
            "a\u{FE0F}".to_string(),
            "\u{1F600}\u{E0101}".to_string(),
            "\u{2764}\u{FE0F}\u{FE0F}".to_string(),
            "1\u{FE0F}".to_string(),
        ] {
            assert_eq!(
                scan("a", &[(1, &line)]).len(),
                1,
                "{:?}",
                line.escape_unicode().to_string()
            );
        }
        // An emoji with its VS16 (or VS15), a keycap, a heart: plain text.
        for line in [
            "\u{2764}\u{FE0F} thanks \u{1F44D}\u{FE0F}",
            "\u{263A}\u{FE0E}",
            "1\u{FE0F}\u{20E3} #\u{FE0F}\u{20E3}",
            "\u{00A9}\u{FE0F} 2026",
        ] {
            assert!(
                scan("a", &[(1, line)]).is_empty(),
                "{:?}",
                line.escape_unicode().to_string()
            );
        }
    }

    #[test]
    fn a_word_that_mixes_scripts_needs_review() {
        // A Cyrillic a (U+0430) in a Latin name: `isAdmin` that is not `isAdmin`.
        let js = "if (user.is\u{0430}dmin) grant();\nconst \u{03BF}k = 1;\n";
        let r = gate(vec![added("auth.js", js.as_bytes())]);
        assert!(r.refused.is_empty(), "{r:?}");
        let found: Vec<_> = r.review.shown.iter().map(|f| (f.line, &f.kind)).collect();
        assert_eq!(
            found,
            [
                (
                    Some(1),
                    &Kind::MixedScripts {
                        scripts: ["Latin", "Cyrillic"]
                    }
                ),
                (
                    Some(2),
                    &Kind::MixedScripts {
                        scripts: ["Greek", "Latin"]
                    }
                )
            ]
        );
        let text = r.review.lines().join("\n");
        assert!(
            text.contains(
                "`auth.js` line 1 holds a word that mixes the Latin and Cyrillic scripts"
            ),
            "{text}"
        );
        // One script a word, or scripts that go together, pass: Russian beside English, Japanese
        // and Latin in one name, accents, digits.
        for line in [
            "let name = \"\u{041F}\u{0440}\u{0438}\u{0432}\u{0435}\u{0442}\" // hello",
            "const \u{691C}\u{7D22}Query = search_\u{3059}\u{308B}();",
            "caf\u{E9} na\u{EF}ve r\u{E9}sum\u{E9} v2_final",
            "\u{D55C}\u{AD6D}\u{C5B4}API",
        ] {
            assert!(mixed_scripts("a", &[(1, line)]).is_empty(), "{line}");
        }
    }
}
