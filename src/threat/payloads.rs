//! Payload-like text on added lines (docs/security.md#the-threat-check): a line too long for
//! anyone to read (minified or generated code), or a long run of encoded, high-entropy text
//! (base64, hex). Such lines hide what they do from a reviewer and from the model check alike, yet
//! generated assets have them too: they mark the change "needs review" — a labelled draft a person
//! must look at — rather than refusing it.

use super::{Finding, Kind};

/// The longest added line that passes (characters).
pub const MAX_LINE_CHARS: usize = 5_000;
/// The shortest run of base64/hex-alphabet characters looked at as a blob: longer than hashes and
/// lockfile integrity strings (a sha512 in base64 is 88), PEM lines (64) and most identifiers.
pub const MIN_BLOB_CHARS: usize = 256;
/// Bits of entropy per character from which such a run counts as encoded data: random hex has
/// about 4, base64 about 6; repeated or word-like runs stay well below.
pub const MIN_BLOB_ENTROPY: f64 = 3.5;

/// One finding per added line: an encoded blob if there is one, else an over-long line.
pub fn scan(path: &str, added: &[(usize, &str)]) -> Vec<Finding> {
    added
        .iter()
        .filter_map(|(n, line)| {
            let kind = match blob(line) {
                Some(chars) => Kind::EncodedBlob { chars },
                None => {
                    // Bytes bound characters from above: most lines are settled without counting.
                    if line.len() <= MAX_LINE_CHARS {
                        return None;
                    }
                    let chars = line.chars().count();
                    (chars > MAX_LINE_CHARS).then_some(Kind::LongLine { chars })?
                }
            };
            Some(Finding {
                path: path.to_string(),
                line: Some(*n),
                kind,
            })
        })
        .collect()
}

fn is_blob_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'_' | b'-')
}

/// The length of the longest high-entropy run of encoded-looking characters on `line`.
fn blob(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    if bytes.len() < MIN_BLOB_CHARS {
        return None;
    }
    let mut best = None;
    let mut start = 0;
    while start < bytes.len() {
        let len = bytes[start..]
            .iter()
            .position(|b| !is_blob_char(*b))
            .unwrap_or(bytes.len() - start);
        if len >= MIN_BLOB_CHARS && entropy(&bytes[start..start + len]) >= MIN_BLOB_ENTROPY {
            best = best.max(Some(len));
        }
        start += len + 1;
    }
    best
}

/// Shannon entropy of `run` in bits per byte.
fn entropy(run: &[u8]) -> f64 {
    let mut counts = [0usize; 256];
    for b in run {
        counts[usize::from(*b)] += 1;
    }
    let n = run.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = *c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threat::gate::tests::{added, gate};
    use base64::Engine;

    fn random(n: usize) -> Vec<u8> {
        (0..n).map(|_| rand::random::<u8>()).collect()
    }

    #[test]
    fn encoded_blobs_need_review_and_ordinary_long_text_does_not() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(random(600));
        let hex = hex::encode(random(200));
        let code = format!("const a = \"{b64}\";\nconst b = '{hex}';\nshort\n");
        let r = gate(vec![added("src/x.js", code.as_bytes())]);
        let found: Vec<_> = r.review.shown.iter().map(|f| (f.line, &f.kind)).collect();
        assert_eq!(
            found,
            [
                (Some(1), &Kind::EncodedBlob { chars: b64.len() }),
                (Some(2), &Kind::EncodedBlob { chars: 400 })
            ]
        );
        assert!(!r.review.lines()[0].contains(&b64[..20]));
        // Long but not encoded: repeated, word-like, or separated.
        let repeated = "a".repeat(4000);
        let words = "the quick brown fox ".repeat(200);
        let integrity = format!("integrity sha512-{}", &b64[..88]);
        for line in [repeated, words, integrity] {
            assert!(scan("f", &[(1, &line)]).is_empty(), "{}", &line[..40]);
        }
    }

    #[test]
    fn an_over_long_line_needs_review_counted_in_characters() {
        let minified = "var a=1;".repeat(700);
        let found = scan("dist/app.min.js", &[(3, &minified)]);
        assert_eq!(found[0].kind, Kind::LongLine { chars: 5600 });
        assert_eq!(found[0].line, Some(3));
        // 5,000 characters of three bytes each: under the limit in characters.
        let wide = "日".repeat(MAX_LINE_CHARS);
        assert!(scan("f", &[(1, &wide)]).is_empty());
    }

    #[test]
    fn a_huge_line_is_read_in_one_pass() {
        let huge = "x=1;".repeat(2_000_000);
        let t = std::time::Instant::now();
        assert_eq!(scan("f", &[(1, &huge)]).len(), 1);
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }
}
