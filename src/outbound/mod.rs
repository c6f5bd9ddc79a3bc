//! Text that leaves the run in the agent's words (docs/security.md#links-in-what-fro-bot-posts):
//! the answer, comments, issues, the pull request's title and body, the commit message. Each is
//! redacted, its links and images to hosts the workflow did not allow are made inert (`markdown`),
//! and its mentions are made inert — in that order, so a URL's `@` is never read as a mention.
//!
//! One process-wide policy and tally, like the redactor's registry: [`configure`] sets the policy
//! once the run knows its repository and `allowed-domains`; [`prose`] applies it and counts what
//! it did for the summary's "Links" row ([`summary_row`]). Until configured, only GitHub's own
//! hosts are kept.

mod bare;
mod fences;
mod html;
pub mod markdown;
pub mod policy;
mod tags;

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock, RwLock};

pub use markdown::{rewrite, Finding, Rewritten};
pub use policy::LinkPolicy;

/// Hosts named in the summary; the rest are counted.
const MAX_HOSTS: usize = 20;

fn policy() -> &'static RwLock<LinkPolicy> {
    static POLICY: OnceLock<RwLock<LinkPolicy>> = OnceLock::new();
    POLICY.get_or_init(|| {
        RwLock::new(LinkPolicy::new(
            "https://github.com",
            "",
            crate::egress::Allowlist::default(),
        ))
    })
}

/// What [`prose`] did this run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    /// Host (or "no host") → links made inert.
    pub inert: BTreeMap<String, u64>,
    pub inert_total: u64,
    pub cut: u64,
    pub fenced: u64,
}

fn tally() -> &'static Mutex<Tally> {
    static TALLY: OnceLock<Mutex<Tally>> = OnceLock::new();
    TALLY.get_or_init(|| Mutex::new(Tally::default()))
}

/// Sets the policy for the rest of the run.
pub fn configure(p: LinkPolicy) {
    *policy().write().unwrap_or_else(|e| e.into_inner()) = p;
}

/// The agent's text as fro-bot posts it: redacted, links made inert, mentions inert except
/// `keep`'s.
pub fn prose(text: &str, keep: Option<&str>) -> String {
    let redacted = crate::redact::redact(text);
    let linked = links(&redacted);
    crate::redact::neutralize_mentions(&linked, keep)
}

/// Only the links rule (for one-line texts such as a title, which are redacted on their own).
pub fn links(text: &str) -> String {
    let r = {
        let p = policy().read().unwrap_or_else(|e| e.into_inner());
        rewrite(text, &p)
    };
    count(&r.findings);
    r.text
}

fn count(findings: &[Finding]) {
    if findings.is_empty() {
        return;
    }
    // A poisoned lock only means another thread panicked mid-count.
    let mut t = tally().lock().unwrap_or_else(|e| e.into_inner());
    for f in findings {
        match f {
            Finding::Inert { host } => {
                t.inert_total += 1;
                let name = host
                    .as_deref()
                    .map_or("no host".to_string(), crate::egress::tally::shown_name);
                if t.inert.len() < MAX_HOSTS || t.inert.contains_key(&name) {
                    *t.inert.entry(name).or_default() += 1;
                }
            }
            Finding::Cut { .. } => t.cut += 1,
            Finding::Fenced => t.fenced += 1,
        }
    }
}

/// The summary's "Links" row; `None` when nothing was rewritten.
pub fn summary_row() -> Option<String> {
    let t = tally().lock().unwrap_or_else(|e| e.into_inner()).clone();
    describe(&t)
}

fn describe(t: &Tally) -> Option<String> {
    let mut parts = Vec::new();
    if t.inert_total > 0 {
        let named: u64 = t.inert.values().sum();
        let mut hosts: Vec<String> = t.inert.iter().map(|(h, n)| format!("`{h}` ×{n}")).collect();
        if named < t.inert_total {
            hosts.push(format!("{} more", t.inert_total - named));
        }
        parts.push(format!(
            "{} made inert, not on `allowed-domains` ({})",
            t.inert_total,
            hosts.join(", ")
        ));
    }
    if t.cut > 0 {
        parts.push(format!(
            "{} cut to {} bytes a part",
            t.cut,
            policy::MAX_PART
        ));
    }
    if t.fenced > 0 {
        parts.push(format!("{} text(s) posted as a code block", t.fenced));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_row_names_hosts_cut_and_counts_the_rest() {
        let mut t = Tally::default();
        assert_eq!(describe(&t), None);
        t.inert.insert("a.example".into(), 2);
        t.inert_total = 3;
        t.cut = 1;
        assert_eq!(
            describe(&t).unwrap(),
            "3 made inert, not on `allowed-domains` (`a.example` ×2, 1 more); 1 cut to 256 bytes a part"
        );
        assert_eq!(
            crate::egress::tally::shown_name("a`b|c<d>.example"),
            "abcd.example"
        );
    }
}

#[cfg(test)]
mod rewrite_tests;
