//! What makes a review finding the same finding on a later run: the file, the code it points at
//! (whitespace-normalized, so a re-indent or a move to other line numbers keeps it) and the
//! finding's first line (case, spacing and punctuation folded). It travels in the comment's body
//! as an HTML comment, which GitHub keeps in the body it returns and does not render.

use sha2::{Digest, Sha256};

const PREFIX: &str = "<!-- fro-bot:finding:";
const SUFFIX: &str = " -->";
/// Hex digits kept: 64 bits, plenty for the findings of one pull request.
const LEN: usize = 16;

#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(path: &str, lines: &[&str], finding: &str) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(path.as_bytes());
        h.update([0]);
        for l in lines {
            h.update(
                l.split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .as_bytes(),
            );
            h.update([b'\n']);
        }
        h.update([0]);
        h.update(fold(finding.lines().next().unwrap_or_default()).as_bytes());
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Fingerprint(hex[..LEN].to_string())
    }

    /// The hidden marker for a comment's body.
    pub fn marker(&self) -> String {
        format!("{PREFIX}{}{SUFFIX}", self.0)
    }

    /// The marker in a body fro-bot posted, if it carries one (exactly `LEN` hex digits: a
    /// forged marker with anything else in it is not one).
    pub fn in_body(body: &str) -> Option<Fingerprint> {
        let at = body.rfind(PREFIX)?;
        let rest = &body[at + PREFIX.len()..];
        let hex = rest.split(SUFFIX).next()?;
        (hex.len() == LEN && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| Fingerprint(hex.to_ascii_lowercase()))
    }
}

fn fold(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_alphanumeric() || c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_finding_on_moved_or_reindented_code_is_the_same() {
        let a = Fingerprint::of(
            "src/a.rs",
            &["    let x = y.unwrap();"],
            "Unwrap can panic here.",
        );
        let b = Fingerprint::of(
            "src/a.rs",
            &["let x =  y.unwrap();"],
            "unwrap can PANIC here\nmore",
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            Fingerprint::of(
                "src/b.rs",
                &["let x = y.unwrap();"],
                "Unwrap can panic here."
            )
        );
        assert_ne!(
            a,
            Fingerprint::of("src/a.rs", &["let x = y?;"], "Unwrap can panic here.")
        );
        assert_ne!(
            a,
            Fingerprint::of("src/a.rs", &["let x = y.unwrap();"], "Name is unclear.")
        );
    }

    #[test]
    fn the_marker_round_trips_and_a_forged_one_is_not_believed() {
        let f = Fingerprint::of("a", &["b"], "c");
        let body = format!("Finding text.\n\n{}", f.marker());
        assert_eq!(Fingerprint::in_body(&body), Some(f.clone()));
        let followed = format!("{body}\n<!-- fro-bot:response -->");
        assert_eq!(Fingerprint::in_body(&followed), Some(f));
        assert_eq!(
            Fingerprint::in_body("<!-- fro-bot:finding:zz' onload=x -->"),
            None
        );
        assert_eq!(Fingerprint::in_body("no marker"), None);
    }
}
