//! Every HTTP client fro-bot makes is built here, so each one follows the runner's network
//! (docs/security.md#runner-proxy-and-private-ca).
//!
//! The runner proxy is `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`, in either case,
//! which reqwest reads itself for every client built by [`external`], as the S3 client does
//! ([`aws_http_client`]). fro-bot's own servers on 127.0.0.1 (the key proxy, OpenCode's
//! server) are reached by [`loopback`] clients, which never use a proxy whatever `NO_PROXY` says: a
//! proxy elsewhere cannot reach this machine's loopback. OpenCode gets the same settings, with the
//! loopback added to its `NO_PROXY` ([`agent_vars`]), and fro-bot's own `git` gets them too
//! ([`git_vars`]), with the certificates below as a bundle of its own ([`git_trust`]).
//!
//! Trusted certificates: the system store, or `SSL_CERT_FILE`/`SSL_CERT_DIR` in its place (read by
//! rustls-native-certs under both HTTP stacks), plus those in `NODE_EXTRA_CA_CERTS`, which only
//! Node reads on its own ([`extra_roots`]). OpenCode gets all three variables.
//!
//! Beside them, [`splice`]: bytes moved from one socket to another by the kernel.

pub mod splice;

use std::sync::OnceLock;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::runner::env as names;
use crate::runner::Env;

/// Names OpenCode's `NO_PROXY` always holds: the key proxy and fro-bot's client are here.
const LOOPBACK: &[&str] = &["127.0.0.1", "localhost", "::1"];

/// A client for anything outside the runner: GitHub, the Actions cache, LLM providers.
pub fn external() -> reqwest::ClientBuilder {
    let extra = extra_roots()
        .iter()
        .filter_map(|der| reqwest::Certificate::from_der(der).ok());
    // reqwest takes the runner proxy from the environment unless a proxy is set on the builder.
    reqwest::Client::builder().tls_certs_merge(extra)
}

/// The S3 client's HTTP client: the AWS SDK's default (rustls, native roots, the runner proxy from
/// the environment) with [`extra_roots`] added to its trust store.
pub fn aws_http_client() -> aws_sdk_s3::config::SharedHttpClient {
    use aws_smithy_http_client::{proxy::ProxyConfig, tls, Builder, ConnectorBuilder};
    let mut trust = tls::TrustStore::default();
    for der in extra_roots() {
        trust.add_pem_certificate(pem(der));
    }
    let context = tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .unwrap_or_else(|e| {
            tracing::warn!("S3 client: {e}; the extra certificates are not trusted");
            tls::TlsContext::default()
        });
    // `build_with_connector_fn` is how the SDK builds its own default client: the public builders
    // cannot take the runner proxy's settings.
    Builder::new().build_with_connector_fn(move |settings, components| {
        let mut connector = ConnectorBuilder::default()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::AwsLc,
            ))
            .tls_context(context.clone());
        connector.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            connector.set_sleep_impl(components.sleep_impl());
        }
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    })
}

/// The certificates in `NODE_EXTRA_CA_CERTS` that can serve as roots, read once. As Node does, a
/// file that cannot be read is a warning; so is a certificate that cannot be a root (it would make
/// every client fail to build).
fn extra_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| read_roots(&Env::from_process()))
}

fn read_roots(env: &Env) -> Vec<CertificateDer<'static>> {
    let Some(path) = env.get(names::NODE_EXTRA_CA_CERTS) else {
        return Vec::new();
    };
    let warn = |why: String| {
        tracing::warn!("{}={path}: {why}", names::NODE_EXTRA_CA_CERTS);
    };
    let certs = match CertificateDer::pem_file_iter(path) {
        Ok(certs) => certs,
        Err(e) => {
            warn(format!("cannot read it ({e}); no certificate added"));
            return Vec::new();
        }
    };
    let mut roots = Vec::new();
    for cert in certs {
        match cert {
            Ok(der) if rustls::RootCertStore::empty().add(der.clone()).is_ok() => roots.push(der),
            Ok(_) => warn("a certificate that cannot be a root is left out".into()),
            Err(e) => warn(format!("unreadable PEM left out ({e})")),
        }
    }
    roots
}

/// `der` as a PEM block.
fn pem(der: &CertificateDer<'_>) -> Vec<u8> {
    use base64::Engine;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out.into_bytes()
}

/// A client for a server on this machine's loopback: never through the runner proxy.
pub fn loopback() -> reqwest::ClientBuilder {
    reqwest::Client::builder().no_proxy()
}

/// The runner proxy's settings in `env`, as they are (each case is read by some tool).
fn proxy_settings(env: &Env) -> Vec<(String, String)> {
    set_in(env, names::PROXY.iter().chain(names::NO_PROXY))
}

/// `names` that are set in `env`, with their values.
fn set_in<'a>(env: &Env, names: impl Iterator<Item = &'a &'a str>) -> Vec<(String, String)> {
    names
        .filter_map(|&name| Some((name.to_string(), env.get(name)?.to_string())))
        .collect()
}

/// `NO_PROXY` with the loopback names added (those missing), for a child that must reach
/// fro-bot's servers directly.
fn no_proxy_with_loopback(env: &Env) -> String {
    let mut entries: Vec<String> = names::NO_PROXY
        .iter()
        .filter_map(|&name| env.get(name))
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    for name in LOOPBACK {
        if !entries.iter().any(|e| e == name) {
            entries.push(name.to_string());
        }
    }
    entries.dedup();
    entries.join(",")
}

/// The agent's network settings from the job's `env`: the certificates it trusts and the runner
/// proxy's variables, as set, and, when a runner proxy is set, `NO_PROXY`/`no_proxy` naming the
/// loopback (OpenCode reaches its provider through fro-bot's key proxy on 127.0.0.1). A password
/// in the runner proxy's URL is masked: the agent can print it.
pub fn agent_vars(env: &Env) -> Vec<(String, String)> {
    let mut out = set_in(env, names::TRUST.iter());
    out.extend(proxy_settings(env));
    let proxied: Vec<&str> = names::PROXY.iter().filter_map(|&n| env.get(n)).collect();
    for value in &proxied {
        // As written in the URL, which is what the agent's environment holds.
        if let Some(password) = url::Url::parse(value)
            .ok()
            .and_then(|u| u.password().map(str::to_string))
        {
            crate::runner::log::add_mask(&password);
        }
    }
    if !proxied.is_empty() {
        let no_proxy = no_proxy_with_loopback(env);
        out.retain(|(k, _)| !names::NO_PROXY.contains(&k.as_str()));
        out.extend(
            names::NO_PROXY
                .iter()
                .map(|&n| (n.to_string(), no_proxy.clone())),
        );
    }
    out
}

/// The agent's network settings when fro-bot enforces its network (docs/security.md#the-agents-network):
/// the certificates as the job set them, and every proxy variable naming `egress`, fro-bot's
/// egress proxy, with only `127.0.0.1` (fro-bot's key proxy, OpenCode's own server) kept
/// off it; with no egress proxy (`agent-network: none`), no proxy variable at all. The runner
/// proxy is not the agent's: the egress proxy sends what it allows on through it.
pub fn agent_vars_behind(env: &Env, egress: Option<&str>) -> Vec<(String, String)> {
    let mut out = set_in(env, names::TRUST.iter());
    if let Some(url) = egress {
        out.extend(
            names::PROXY
                .iter()
                .map(|&n| (n.to_string(), url.to_string())),
        );
        out.extend(
            names::NO_PROXY
                .iter()
                .map(|&n| (n.to_string(), LOOPBACK[0].to_string())),
        );
    }
    out
}

/// What fro-bot's own `git` (which runs with a cleared environment) needs to reach GitHub: the
/// runner proxy's settings in this process, and the certificates it trusts ([`git_trust`]).
pub fn git_vars() -> Vec<(String, String)> {
    let env = Env::from_process();
    let mut vars = proxy_settings(&env);
    vars.extend(git_trust(&env));
    vars
}

/// The system's CA bundles, where Debian/Ubuntu/Alpine and Fedora/RHEL keep them.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// git's own trust settings for the same certificates fro-bot's clients trust. git reads only its
/// TLS library's default store (GnuTLS on Debian reads neither `SSL_CERT_FILE` nor
/// `NODE_EXTRA_CA_CERTS`), so when either is set it gets a bundle of `SSL_CERT_FILE` (else the
/// system's) and the extra roots; `SSL_CERT_DIR` alone becomes its CA path. Nothing when none is
/// set: git's default is the system store.
fn git_trust(env: &Env) -> Vec<(String, String)> {
    let file = env.get(names::SSL_CERT_FILE);
    if file.is_none() && extra_roots().is_empty() {
        return set_in(env, [names::SSL_CERT_DIR].iter())
            .into_iter()
            .map(|(_, dir)| (names::GIT_SSL_CAPATH.to_string(), dir))
            .collect();
    }
    static BUNDLE: OnceLock<Option<tempfile::TempPath>> = OnceLock::new();
    let bundle = BUNDLE.get_or_init(|| match write_git_bundle(file) {
        Ok(path) => Some(path),
        Err(e) => {
            tracing::warn!("cannot write git's CA bundle ({e}): git trusts the system store only");
            None
        }
    });
    bundle
        .iter()
        .map(|p| {
            let path = p.to_string_lossy().into_owned();
            (names::GIT_SSL_CAINFO.to_string(), path)
        })
        .collect()
}

/// A fresh 0644 file (certificates are public) holding `file` (else the system bundle) and the
/// extra roots. Root's, in the sticky system temp dir (not `RUNNER_TEMP`, which the agent's uid
/// may write), so the agent cannot swap it; it stays after the process (statics are not dropped;
/// in the action the container's `/tmp` goes with it).
fn write_git_bundle(file: Option<&str>) -> std::io::Result<tempfile::TempPath> {
    use std::io::Write;
    let base = match file {
        Some(f) => Some(std::path::PathBuf::from(f)),
        None => SYSTEM_BUNDLES
            .iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.is_file()),
    };
    let mut out = tempfile::Builder::new()
        .prefix("fro-bot-git-ca-")
        .suffix(".pem")
        .tempfile()?;
    if let Some(base) = base {
        let mut pem = std::fs::read(&base)?;
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        out.write_all(&pem)?;
    }
    for der in extra_roots() {
        out.write_all(&pem(der))?;
    }
    out.flush()?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(out.path(), std::fs::Permissions::from_mode(0o644))?;
    Ok(out.into_temp_path())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
        vars.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_agent_gets_the_runner_proxy_in_either_case_and_never_proxies_the_loopback() {
        let env = Env::from_pairs([
            ("https_proxy", "http://proxy.corp:3128"),
            ("HTTP_PROXY", "http://proxy.corp:3128"),
            ("no_proxy", "corp.example, localhost"),
            ("NO_PROXY", ".internal"),
        ]);
        let vars = agent_vars(&env);
        assert_eq!(get(&vars, "https_proxy"), Some("http://proxy.corp:3128"));
        assert_eq!(get(&vars, "HTTP_PROXY"), Some("http://proxy.corp:3128"));
        assert_eq!(get(&vars, "HTTPS_PROXY"), None, "only what the job set");
        let want = ".internal,corp.example,localhost,127.0.0.1,::1";
        assert_eq!(get(&vars, "NO_PROXY"), Some(want));
        assert_eq!(get(&vars, "no_proxy"), Some(want));
        assert_eq!(vars.iter().filter(|(k, _)| k == "NO_PROXY").count(), 1);

        let env = Env::from_pairs([("ALL_PROXY", "http://u:proxy-pass%40word@proxy.corp:3128")]);
        let vars = agent_vars(&env);
        assert_eq!(get(&vars, "NO_PROXY"), Some("127.0.0.1,localhost,::1"));
        assert_eq!(
            crate::redact::redact("proxy-pass%40word"),
            "***",
            "the password is masked"
        );

        let env = Env::from_pairs([
            ("no_proxy", "corp.example"),
            ("NODE_EXTRA_CA_CERTS", "/etc/corp/ca.pem"),
            ("SSL_CERT_FILE", "/etc/corp/bundle.pem"),
        ]);
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            agent_vars(&env),
            pairs(&[
                ("SSL_CERT_FILE", "/etc/corp/bundle.pem"),
                ("NODE_EXTRA_CA_CERTS", "/etc/corp/ca.pem"),
                ("no_proxy", "corp.example"),
            ]),
            "no proxy: NO_PROXY as it is; the certificates as they are"
        );
    }

    #[test]
    fn extra_roots_that_cannot_be_read_or_be_roots_are_left_out_and_pem_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let env = Env::from_pairs([("NODE_EXTRA_CA_CERTS", missing.to_str().unwrap())]);
        assert!(read_roots(&env).is_empty());
        let bad = dir.path().join("bad.pem");
        let not_a_cert = CertificateDer::from(b"not a certificate".to_vec());
        std::fs::write(&bad, pem(&not_a_cert)).unwrap();
        let env = Env::from_pairs([("NODE_EXTRA_CA_CERTS", bad.to_str().unwrap())]);
        assert!(read_roots(&env).is_empty(), "no client would build with it");
        let der = CertificateDer::from((0..=255u8).cycle().take(700).collect::<Vec<_>>());
        let back: Vec<_> = CertificateDer::pem_slice_iter(&pem(&der))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, [der]);
    }
}
