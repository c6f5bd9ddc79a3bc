//! Test services: a private certificate authority and HTTPS fronts. The CA is made with `openssl`,
//! as a company makes its own, and signs one certificate for the `.test` names the runner proxy
//! resolves (`super::fake_runner_proxy`). A front terminates TLS with that certificate and passes the bytes
//! on to a plain service on 127.0.0.1.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The names the certificate is good for.
pub const NAMES: &[&str] = &[
    "github.test",
    "cache.test",
    "s3.test",
    "llm.test",
    "web.test",
];

/// Where Debian (the image's base, and this test machine) keeps its system trust store.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

pub struct TestCa {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (the private-CA tests make their CA with it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestCa {
    /// A new CA and a certificate it signed for [`NAMES`]. The directory is world-readable, as a
    /// runner's certificate files are: the agent's uid reads them.
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=fro-bot test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(dir.path(), &ca);
        let mut csr = vec!["req", "-nodes"];
        csr.extend(ec);
        csr.extend([
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=fro-bot test services",
        ]);
        openssl(dir.path(), &csr);
        let sans: Vec<String> = NAMES.iter().map(|n| format!("DNS:{n}")).collect();
        std::fs::write(
            dir.path().join("leaf.ext"),
            format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
                sans.join(",")
            ),
        )
        .unwrap();
        openssl(
            dir.path(),
            &[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                "leaf.pem",
                "-extfile",
                "leaf.ext",
            ],
        );
        let pem = dir.path().join("ca.pem");
        std::fs::set_permissions(&pem, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        TestCa { dir }
    }

    /// The CA's certificate (PEM), what a runner points `SSL_CERT_FILE` or
    /// `NODE_EXTRA_CA_CERTS` at.
    pub fn pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The system trust store with this CA added, as `update-ca-certificates` leaves it.
    pub fn system_bundle(&self) -> PathBuf {
        let path = self.dir.path().join("system-bundle.crt");
        let mut bundle = std::fs::read(SYSTEM_BUNDLE).unwrap_or_default();
        bundle.extend(std::fs::read(self.pem()).unwrap());
        std::fs::write(&path, bundle).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        path
    }

    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(self.dir.path().join("leaf.pem"))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_file(self.dir.path().join("leaf.key")).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        Arc::new(config)
    }
}

/// HTTPS in front of a plain service; stops when dropped.
pub struct TlsFront {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsFront {
    pub async fn start(ca: &TestCa, backend: SocketAddr) -> TlsFront {
        let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront { port, task }
    }
}
