//! The runner proxy, the runner's own (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, either
//! case; upper case wins): self-hosted runners often reach the outside only through one, so the
//! egress proxy sends what it allows on through it, as fro-bot's own clients do
//! (docs/security.md#runner-proxy-and-private-ca). Through it, names are resolved by the runner
//! proxy: the egress proxy still checks each name against the allowlist, and an address written as
//! the host against [`super::address`].

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::runner::Env;

/// One URL of the runner proxy: `http://[user:password@]host:port`.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    pub host: String,
    pub port: u16,
    /// `Proxy-Authorization: Basic …`, when the URL holds a user.
    auth: Option<String>,
}

impl std::fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The runner proxy, as the egress proxy sends its traffic on through it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerProxy {
    /// For tunnels (`CONNECT`): `HTTPS_PROXY`, else `ALL_PROXY`.
    tunnel: Option<ProxyUrl>,
    /// For plain-HTTP requests: `HTTP_PROXY`, else `ALL_PROXY`.
    http: Option<ProxyUrl>,
    no_proxy: Vec<String>,
}

fn first(env: &Env, names: [&str; 2]) -> Option<String> {
    names
        .iter()
        .find_map(|n| env.get(n).filter(|v| !v.trim().is_empty()))
        .map(str::to_string)
}

impl RunnerProxy {
    /// The runner proxy from the job's environment. A setting that is not an `http://` URL is
    /// left out with a warning: the egress proxy then connects directly, and fails closed where
    /// the network allows only the runner proxy.
    pub fn from_env(env: &Env) -> RunnerProxy {
        let parse = |names: [&str; 2]| {
            let raw = first(env, names)?;
            match parse_proxy_url(&raw) {
                Some(p) => Some(p),
                None => {
                    tracing::warn!(
                        "{}: only http:// proxies can carry the agent's traffic; it goes direct",
                        names[0]
                    );
                    None
                }
            }
        };
        let all = parse(["ALL_PROXY", "all_proxy"]);
        RunnerProxy {
            tunnel: parse(["HTTPS_PROXY", "https_proxy"]).or_else(|| all.clone()),
            http: parse(["HTTP_PROXY", "http_proxy"]).or(all),
            no_proxy: first(env, ["NO_PROXY", "no_proxy"])
                .map(|v| {
                    v.split(',')
                        .map(|e| e.trim().trim_start_matches("*.").trim_start_matches('.'))
                        .map(str::to_ascii_lowercase)
                        .filter(|e| !e.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    fn bypassed(&self, host: &str) -> bool {
        self.no_proxy.iter().any(|e| {
            e == "*"
                || e == host
                || (host.ends_with(e.as_str()) && host[..host.len() - e.len()].ends_with('.'))
        })
    }

    /// The runner proxy for a tunnel to `host`, unless `NO_PROXY` names it.
    pub fn for_tunnel(&self, host: &str) -> Option<&ProxyUrl> {
        self.tunnel.as_ref().filter(|_| !self.bypassed(host))
    }

    /// The runner proxy for a plain-HTTP request to `host`, unless `NO_PROXY` names it.
    pub fn for_http(&self, host: &str) -> Option<&ProxyUrl> {
        self.http.as_ref().filter(|_| !self.bypassed(host))
    }
}

fn parse_proxy_url(raw: &str) -> Option<ProxyUrl> {
    use base64::Engine;
    let raw = raw.trim();
    let with_scheme = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("http://{raw}")
    };
    let url = url::Url::parse(&with_scheme).ok()?;
    if url.scheme() != "http" {
        return None;
    }
    let auth = (!url.username().is_empty()).then(|| {
        let decode = |s: &str| percent_decode(s);
        let pair = format!(
            "{}:{}",
            decode(url.username()),
            decode(url.password().unwrap_or(""))
        );
        base64::engine::general_purpose::STANDARD.encode(pair)
    });
    Some(ProxyUrl {
        host: url
            .host_str()?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port: url.port_or_known_default()?,
        auth,
    })
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// The authority `host:port` as a request line writes it (brackets around an IPv6 address).
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A tunnel to `host:port` through the runner proxy: `CONNECT`, and its `200`.
pub async fn tunnel(proxy: &ProxyUrl, host: &str, port: u16) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect((proxy.host.as_str(), proxy.port)).await?;
    let target = authority(host, port);
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = &proxy.auth {
        head.push_str(&format!("Proxy-Authorization: Basic {auth}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    // Byte by byte up to the blank line: what follows belongs to the tunnel.
    let mut got = Vec::with_capacity(256);
    while !got.ends_with(b"\r\n\r\n") {
        if got.len() >= 16 * 1024 {
            return Err(std::io::Error::other(
                "the runner proxy sent an oversized answer",
            ));
        }
        let mut byte = [0u8; 1];
        if stream.read(&mut byte).await? == 0 {
            return Err(std::io::Error::other(
                "the runner proxy closed the connection",
            ));
        }
        got.push(byte[0]);
    }
    let status = String::from_utf8_lossy(&got);
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    if code != "200" {
        let line = status.lines().next().unwrap_or_default().to_string();
        return Err(std::io::Error::other(format!(
            "the runner proxy answered {line}"
        )));
    }
    Ok(stream)
}

/// `Proxy-Authorization` for a plain-HTTP request sent on through `proxy`.
pub fn proxy_authorization(proxy: &ProxyUrl) -> Option<String> {
    proxy.auth.as_ref().map(|a| format!("Basic {a}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_proxy_is_read_upper_case_first_and_no_proxy_bypasses_it() {
        let env = Env::from_pairs([
            ("HTTPS_PROXY", "http://u%40x:p%3Aw@proxy.corp:3128"),
            ("https_proxy", "http://other:1"),
            ("http_proxy", "proxy.corp:8080"),
            ("NO_PROXY", "intranet.example, .corp.example,*.svc"),
        ]);
        let up = RunnerProxy::from_env(&env);
        let t = up.for_tunnel("github.com").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("proxy.corp", 3128));
        assert_eq!(
            proxy_authorization(t).as_deref(),
            Some("Basic dUB4OnA6dw=="),
            "user u@x, password p:w"
        );
        assert_eq!(
            format!("{t:?}"),
            "proxy.corp:3128",
            "no credentials in Debug"
        );
        assert_eq!(up.for_http("github.com").unwrap().port, 8080);
        for bypassed in ["intranet.example", "a.corp.example", "x.svc"] {
            assert!(up.for_tunnel(bypassed).is_none(), "{bypassed}");
        }
        assert!(up.for_tunnel("notintranet.example").is_some());
    }

    #[test]
    fn a_proxy_that_is_not_http_is_left_out() {
        let env = Env::from_pairs([
            ("HTTPS_PROXY", "https://proxy.corp:443"),
            ("ALL_PROXY", "socks5://s:1"),
        ]);
        assert_eq!(RunnerProxy::from_env(&env), RunnerProxy::default());
    }
}
