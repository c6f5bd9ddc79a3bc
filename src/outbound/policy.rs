//! Which URLs may stay links in what fro-bot posts (docs/security.md#links-in-what-fro-bot-posts):
//! GitHub's own hosts, the repository's Pages site and `allowed-domains`, over http(s) only (and a
//! plain `mailto:` address), with paths, queries and fragments of at most [`MAX_PART`] bytes.
//! Everything else is a way out for what the agent read — GitHub's image proxy fetches an image's
//! URL as soon as the comment renders.

use url::Url;

use crate::egress::Allowlist;

/// The most a kept URL's path, query or fragment may hold: longer ones carry data, and are cut.
pub const MAX_PART: usize = 256;

/// Where the agent's links may point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkPolicy {
    /// The GitHub server's host (`github.com`, or the Enterprise Server's), lower case.
    server_host: String,
    /// `owner/name`, for relative links and the Pages host.
    repository: String,
    /// `allowed-domains`.
    allowed: Allowlist,
}

/// What becomes of one URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed as it is.
    Keep,
    Change(Change),
}

/// A URL that does not stay as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Allowed host, but a part over [`MAX_PART`]: this shorter URL instead.
    Cut { url: String, host: String },
    /// Shown as code, no link: the host (if it has one) is not allowed, the scheme is not
    /// http(s), or it does not parse.
    Inert { host: Option<String> },
}

impl LinkPolicy {
    /// `server_url` is `GITHUB_SERVER_URL` (`https://github.com` when unset or unparsable).
    pub fn new(server_url: &str, repository: &str, allowed: Allowlist) -> LinkPolicy {
        let server_host = Url::parse(server_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .unwrap_or_else(|| "github.com".to_string());
        LinkPolicy {
            server_host,
            repository: repository.to_string(),
            allowed,
        }
    }

    /// What a URL written in a comment resolves to, read as a browser reads it (relative to the
    /// repository's page, backslashes as slashes, percent-encoded hosts decoded).
    pub fn judge(&self, written: &str) -> Verdict {
        let base = format!("https://{}/{}/", self.server_host, self.repository);
        let resolved = Url::parse(&base).and_then(|b| b.join(written.trim()));
        let Ok(url) = resolved else {
            return Verdict::Change(Change::Inert { host: None });
        };
        // An address alone: nothing fetches it, and a click only opens a draft. A query
        // (`?body=`) is data.
        if url.scheme() == "mailto" && url.query().is_none() && url.as_str().len() <= MAX_PART {
            return Verdict::Keep;
        }
        let host = url.host_str().map(str::to_ascii_lowercase);
        let web = matches!(url.scheme(), "http" | "https");
        let Some(host) = host.filter(|h| web && self.allows(h, &url)) else {
            return Verdict::Change(Change::Inert {
                host: url.host_str().map(str::to_ascii_lowercase),
            });
        };
        match cut(&url) {
            Some(shorter) => Verdict::Change(Change::Cut { url: shorter, host }),
            None => Verdict::Keep,
        }
    }

    fn allows(&self, host: &str, url: &Url) -> bool {
        let below =
            |h: &str, suffix: &str| h.len() > suffix.len() && h.ends_with(&format!(".{suffix}"));
        let github = self.server_host == "github.com";
        let owner = self.repository.split('/').next().unwrap_or_default();
        host == self.server_host
            || below(host, &self.server_host)
            || (github
                && (host == "githubusercontent.com"
                    || below(host, "githubusercontent.com")
                    || (!owner.is_empty()
                        && host == format!("{}.github.io", owner.to_ascii_lowercase()))))
            || self
                .allowed
                .allows(host, url.port_or_known_default().unwrap_or(443))
                .is_some()
    }
}

/// `url` with a path cut to [`MAX_PART`] bytes and a longer query or fragment dropped; `None`
/// when nothing is over.
fn cut(url: &Url) -> Option<String> {
    let long = |s: Option<&str>| s.is_some_and(|s| s.len() > MAX_PART);
    let path_long = url.path().len() > MAX_PART;
    if !path_long && !long(url.query()) && !long(url.fragment()) {
        return None;
    }
    let mut u = url.clone();
    if path_long {
        // The serialized path is ASCII (the url crate percent-encodes the rest).
        let mut end = MAX_PART;
        while !url.path().is_char_boundary(end) {
            end -= 1;
        }
        u.set_path(&url.path()[..end]);
    }
    if long(url.query()) {
        u.set_query(None);
    }
    if long(url.fragment()) {
        u.set_fragment(None);
    }
    Some(u.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allowed: &str) -> LinkPolicy {
        LinkPolicy::new(
            "https://github.com",
            "octo/hello",
            Allowlist::parse(allowed).unwrap(),
        )
    }

    fn inert(p: &LinkPolicy, url: &str) -> bool {
        matches!(p.judge(url), Verdict::Change(Change::Inert { .. }))
    }

    #[test]
    fn github_its_user_content_the_repositorys_pages_and_allowed_domains_are_kept() {
        let p = policy("docs.rs, *.example.org");
        for url in [
            "https://github.com/octo/hello/pull/3",
            "https://gist.github.com/x",
            "https://raw.githubusercontent.com/octo/hello/main/a.png",
            "https://octo.github.io/hello/",
            "https://docs.rs/url",
            "https://a.example.org/x",
            "/octo/hello/blob/main/README.md",
            "docs/design.md",
            "#section",
            "mailto:someone@anywhere.example",
        ] {
            assert_eq!(p.judge(url), Verdict::Keep, "{url}");
        }
    }

    #[test]
    fn other_hosts_other_schemes_and_disguised_hosts_are_inert() {
        let p = policy("docs.rs");
        for url in [
            "https://anywhere.example/p.png?d=c2VjcmV0",
            "//anywhere.example/p.png",
            "\\\\anywhere.example/p.png",
            "https:\\\\anywhere.example/p.png",
            "https://github.com@anywhere.example/",
            "https://github.com.anywhere.example/",
            "https://%61nywhere.example/",
            "https://attacker.github.io/",
            "ws://docs.rs/x",
            "smb://anywhere.example/share",
            "ftp://docs.rs/x",
            "data:image/png;base64,AAAA",
            "javascript:alert(1)",
            "mailto:someone@anywhere.example?body=c2VjcmV0",
            "https://docs.rs:8443/x",
            "http://[::1]/",
        ] {
            assert!(inert(&p, url), "{url}: {:?}", p.judge(url));
        }
        assert_eq!(
            p.judge("https://%61nywhere.example/"),
            Verdict::Change(Change::Inert {
                host: Some("anywhere.example".into())
            })
        );
    }

    #[test]
    fn a_long_path_query_or_fragment_on_an_allowed_host_is_cut() {
        let p = policy("");
        let data = "A".repeat(300);
        let Verdict::Change(Change::Cut { url, host }) =
            p.judge(&format!("https://github.com/x?d={data}"))
        else {
            panic!()
        };
        assert_eq!(
            (url.as_str(), host.as_str()),
            ("https://github.com/x", "github.com")
        );
        let Verdict::Change(Change::Cut { url, .. }) =
            p.judge(&format!("https://github.com/{data}#{data}"))
        else {
            panic!()
        };
        assert_eq!(url.len(), "https://github.com".len() + MAX_PART);
        let short = format!("https://github.com/x?d={}", "A".repeat(200));
        assert_eq!(p.judge(&short), Verdict::Keep);
    }

    #[test]
    fn an_enterprise_server_keeps_its_own_hosts_not_githubs() {
        let p = LinkPolicy::new(
            "https://ghe.example:8443/",
            "octo/hello",
            Allowlist::default(),
        );
        assert_eq!(p.judge("https://ghe.example/octo/hello"), Verdict::Keep);
        assert_eq!(p.judge("https://media.ghe.example/u/1.png"), Verdict::Keep);
        assert!(inert(&p, "https://raw.githubusercontent.com/x"));
        assert!(inert(&p, "https://octo.github.io/"));
    }
}
