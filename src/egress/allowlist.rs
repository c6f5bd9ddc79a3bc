//! `allowed-domains`: the hosts the agent may reach through the egress proxy
//! (docs/security.md#the-agents-network). Entries are exact names (`api.example.com`), `*.suffix`
//! patterns (any name below the suffix, not the suffix itself), IP addresses and named sets
//! ([`SETS`]: the registry and download hosts of one ecosystem). Each reaches ports 443 and 80;
//! `entry:port` reaches that port instead.
//!
//! Only an entry the workflow wrote out exactly (a name or an address, not a pattern or a set)
//! may lead to a loopback, private, link-local or metadata address ([`super::address`]).

use std::net::IpAddr;

/// The named sets, one per ecosystem: the hosts its package manager and toolchain downloads from.
/// The README's table of sets is held equal to this one (tests/it/inputs.rs).
pub const SETS: &[(&str, &[&str])] = &[
    (
        "node",
        &[
            "registry.npmjs.org",
            "registry.yarnpkg.com",
            "repo.yarnpkg.com",
            "nodejs.org",
        ],
    ),
    ("python", &["pypi.org", "files.pythonhosted.org"]),
    (
        "rust",
        &[
            "crates.io",
            "index.crates.io",
            "static.crates.io",
            "static.rust-lang.org",
        ],
    ),
    (
        "go",
        &[
            "proxy.golang.org",
            "sum.golang.org",
            "go.dev",
            "dl.google.com",
        ],
    ),
    (
        "java",
        &[
            "repo.maven.apache.org",
            "repo1.maven.org",
            "plugins.gradle.org",
            "services.gradle.org",
        ],
    ),
    ("ruby", &["rubygems.org", "index.rubygems.org"]),
    (
        "debian",
        &[
            "deb.debian.org",
            "security.debian.org",
            "snapshot.debian.org",
        ],
    ),
    (
        "ubuntu",
        &[
            "archive.ubuntu.com",
            "security.ubuntu.com",
            "ports.ubuntu.com",
        ],
    ),
];

/// The ports an entry without `:port` reaches.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllowlistError {
    #[error("'{entry}' is not a host name, '*.suffix', address or set ({why})")]
    Entry { entry: String, why: &'static str },
}

/// What an entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// This name exactly (lower case, no trailing dot).
    Name(String),
    /// Any name ending in `.{suffix}`.
    Below(String),
    Address(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    pattern: Pattern,
    /// `None`: [`DEFAULT_PORTS`].
    port: Option<u16>,
    /// Written out by the workflow, not from a set.
    explicit: bool,
}

/// How a request matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// An exact name or address the workflow listed: any address it resolves to may be reached.
    Explicitly,
    /// A `*.suffix` pattern or a set: loopback, private and metadata addresses stay refused.
    ByPattern,
}

/// The parsed `allowed-domains`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    entries: Vec<Entry>,
    /// What the workflow wrote, for the summary (sets by name).
    written: Vec<String>,
}

impl Allowlist {
    /// Comma-, space- or newline-separated entries.
    pub fn parse(raw: &str) -> Result<Allowlist, AllowlistError> {
        let mut list = Allowlist::default();
        for word in raw
            .split([',', '\n', ' ', '\t'])
            .map(str::trim)
            .filter(|w| !w.is_empty())
        {
            list.add(word)?;
            if !list.written.iter().any(|w| w == word) {
                list.written.push(word.to_string());
            }
        }
        Ok(list)
    }

    fn add(&mut self, word: &str) -> Result<(), AllowlistError> {
        let bad = |why| AllowlistError::Entry {
            entry: word.to_string(),
            why,
        };
        let (target, port) = split_port(word).ok_or_else(|| bad("the port must be 1-65535"))?;
        if let Some((_, hosts)) = SETS.iter().find(|(name, _)| *name == target) {
            for host in *hosts {
                self.entries.push(Entry {
                    pattern: parse_pattern(host).ok_or_else(|| bad("a set member is invalid"))?,
                    port,
                    explicit: false,
                });
            }
            return Ok(());
        }
        let pattern = parse_pattern(target).ok_or_else(|| bad("not a valid name"))?;
        let explicit = !matches!(pattern, Pattern::Below(_));
        self.entries.push(Entry {
            pattern,
            port,
            explicit,
        });
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries as written, for the summary.
    pub fn written(&self) -> &[String] {
        &self.written
    }

    /// Whether `host` (a name or an address, as a client sent it) may be reached on `port`.
    pub fn allows(&self, host: &str, port: u16) -> Option<Allowed> {
        let host = normalize(host)?;
        let address = parse_address(&host);
        let mut found = None;
        for e in &self.entries {
            let port_ok = match e.port {
                Some(p) => p == port,
                None => DEFAULT_PORTS.contains(&port),
            };
            let host_ok = match (&e.pattern, address) {
                (Pattern::Address(a), Some(b)) => *a == b,
                (Pattern::Address(_), None) => false,
                (Pattern::Name(n), None) => *n == host,
                (Pattern::Below(s), None) => {
                    host.len() > s.len() + 1
                        && host.ends_with(s.as_str())
                        && host.as_bytes()[host.len() - s.len() - 1] == b'.'
                }
                (Pattern::Name(_) | Pattern::Below(_), Some(_)) => false,
            };
            if port_ok && host_ok {
                if e.explicit {
                    return Some(Allowed::Explicitly);
                }
                found = Some(Allowed::ByPattern);
            }
        }
        found
    }
}

/// `word` as target and optional port. `[v6]:port` and `v4:port` take a port; a bare IPv6
/// address does not.
fn split_port(word: &str) -> Option<(&str, Option<u16>)> {
    let port = |p: &str| -> Option<u16> {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        p.parse().ok().filter(|&n| n != 0)
    };
    if let Some(rest) = word.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(p) => Some((addr, Some(port(p)?))),
            None if after.is_empty() => Some((addr, None)),
            None => None,
        };
    }
    if word.parse::<std::net::Ipv6Addr>().is_ok() {
        return Some((word, None));
    }
    match word.rsplit_once(':') {
        Some((target, p)) => Some((target, Some(port(p)?))),
        None => Some((word, None)),
    }
}

fn parse_pattern(target: &str) -> Option<Pattern> {
    if let Some(suffix) = target.strip_prefix("*.") {
        let suffix = normalize(suffix)?;
        return (parse_address(&suffix).is_none() && suffix.contains('.'))
            .then_some(Pattern::Below(suffix));
    }
    let host = normalize(target)?;
    Some(match parse_address(&host) {
        Some(a) => Pattern::Address(a),
        None => Pattern::Name(host),
    })
}

/// A host as the egress proxy compares it: lower case, no trailing dot, brackets off an IPv6
/// address; `None` for anything that is not a plain DNS name or an address.
pub fn normalize(host: &str) -> Option<String> {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Some(a) = parse_address(host) {
        return Some(a.to_string());
    }
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (host.len() <= 253 && host.split('.').all(label_ok)).then_some(host)
}

fn parse_address(host: &str) -> Option<IpAddr> {
    host.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_patterns_addresses_and_sets_match_as_written() {
        let list = Allowlist::parse(
            "api.example.com, *.example.org\nlocalhost:8080 10.0.0.7 [::1]:9000 rust",
        )
        .unwrap();
        assert_eq!(
            list.allows("API.Example.com.", 443),
            Some(Allowed::Explicitly)
        );
        assert_eq!(
            list.allows("api.example.com", 80),
            Some(Allowed::Explicitly)
        );
        assert_eq!(
            list.allows("api.example.com", 8443),
            None,
            "only 443 and 80"
        );
        assert_eq!(list.allows("x.api.example.com", 443), None, "exact only");
        assert_eq!(
            list.allows("a.b.example.org", 443),
            Some(Allowed::ByPattern)
        );
        assert_eq!(
            list.allows("example.org", 443),
            None,
            "not the suffix itself"
        );
        assert_eq!(list.allows("evilexample.org", 443), None);
        assert_eq!(list.allows("localhost", 8080), Some(Allowed::Explicitly));
        assert_eq!(
            list.allows("localhost", 443),
            None,
            "a port replaces 443/80"
        );
        assert_eq!(list.allows("10.0.0.7", 443), Some(Allowed::Explicitly));
        assert_eq!(list.allows("[::1]", 9000), Some(Allowed::Explicitly));
        assert_eq!(list.allows("::1", 9000), Some(Allowed::Explicitly));
        assert_eq!(
            list.allows("index.crates.io", 443),
            Some(Allowed::ByPattern)
        );
        assert_eq!(list.allows("rust", 443), None, "a set is not a host");
        assert_eq!(
            list.written(),
            [
                "api.example.com",
                "*.example.org",
                "localhost:8080",
                "10.0.0.7",
                "[::1]:9000",
                "rust"
            ]
        );
    }

    #[test]
    fn an_empty_list_allows_nothing() {
        let list = Allowlist::parse("  \n ").unwrap();
        assert!(list.is_empty());
        assert_eq!(list.allows("example.com", 443), None);
    }

    #[test]
    fn a_bad_entry_is_named() {
        for bad in [
            "exa mple.com:x",
            "host:0",
            "host:70000",
            "*.com.",
            "*.10.0.0.1",
            "-bad.example",
            "a/b",
            "user@host",
            "*",
            "http://example.com",
        ] {
            let err = Allowlist::parse(bad).unwrap_err();
            assert!(err.to_string().contains('\''), "{bad}: {err}");
        }
    }

    #[test]
    fn every_set_member_is_a_valid_name() {
        for (name, hosts) in SETS {
            assert!(!hosts.is_empty(), "{name}");
            let list = Allowlist::parse(name).unwrap();
            for host in *hosts {
                assert_eq!(list.allows(host, 443), Some(Allowed::ByPattern), "{host}");
            }
        }
    }
}
