//! The egress proxy (docs/security.md#the-agents-network): fro-bot serves it on 127.0.0.1 and the
//! agent's processes can reach no other address but fro-bot's own servers
//! ([`crate::confine::landlock`]). It tunnels `CONNECT host:port` and forwards plain-HTTP requests
//! (each request of a kept-alive connection is checked on its own), only to hosts on the run's
//! allowlist, through the runner proxy when there is one ([`super::runner_proxy`]). It resolves
//! names itself and connects to the address it checked, so a name cannot resolve one way for the
//! check and another for the connection. A refusal is a `403` whose reason phrase and body say
//! `fro-bot: host not on allowed-domains`, which the agent's tool prints; each decision is counted
//! ([`super::tally`]).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::address;
use super::allowlist::{self, Allowed, Allowlist};
use super::runner_proxy::{self, RunnerProxy};
use super::tally::{shown, Tally};

/// What the agent's tool shows for a host that is not listed.
pub const NOT_LISTED: &str = "fro-bot: host not on allowed-domains";
/// What it shows for an address that may be reached only when listed exactly.
pub const SPECIAL_ADDRESS: &str = "fro-bot: address not allowed";

/// Connections served at once; more wait for a slot (a flood cannot exhaust fro-bot).
const MAX_CONNECTIONS: usize = 256;
/// Tunnels open at once (each holds two of the runtime's blocking threads, which fro-bot's own
/// file work needs too); one more is refused.
const MAX_TUNNELS: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Refusals logged one by one; the summary counts the rest.
const LOGGED_REFUSALS: u64 = 50;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;

/// Why a request was not carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The host is not on the allowlist.
    NotListed,
    /// The host resolves only to addresses reached when listed exactly.
    Special { ip: IpAddr, kind: &'static str },
    /// Not a request a proxy takes (origin-form, `https://` in absolute form, no port).
    Malformed(&'static str),
    /// Allowed, but the name did not resolve or nothing answered.
    Unreachable(String),
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Refusal::NotListed | Refusal::Special { .. } => StatusCode::FORBIDDEN,
            Refusal::Malformed(_) => StatusCode::BAD_REQUEST,
            Refusal::Unreachable(_) => StatusCode::BAD_GATEWAY,
        }
    }

    fn phrase(&self) -> &'static str {
        match self {
            Refusal::NotListed => NOT_LISTED,
            Refusal::Special { .. } => SPECIAL_ADDRESS,
            Refusal::Malformed(_) => "fro-bot: not a proxy request",
            Refusal::Unreachable(_) => "fro-bot: host unreachable",
        }
    }

    /// The body: what the agent reads, and the log line.
    fn explain(&self, target: &str) -> String {
        match self {
            Refusal::NotListed => format!(
                "{} {NOT_LISTED}: {target} (the workflow's allowed-domains input lists what the \
                 agent may reach)",
                self.status().as_u16()
            ),
            Refusal::Special { ip, kind } => format!(
                "{} {SPECIAL_ADDRESS}: {target} resolves to {ip}, a {kind} address, reached only \
                 when allowed-domains lists it exactly",
                self.status().as_u16()
            ),
            Refusal::Malformed(why) => format!("400 fro-bot: {why}"),
            Refusal::Unreachable(why) => format!("502 fro-bot: {target}: {why}"),
        }
    }

    /// Refused by the policy, as opposed to allowed and then not reached.
    fn by_policy(&self) -> bool {
        match self {
            Refusal::NotListed | Refusal::Special { .. } | Refusal::Malformed(_) => true,
            Refusal::Unreachable(_) => false,
        }
    }
}

/// How names become addresses: the system's resolver, or a test's.
pub type Resolver = Arc<
    dyn Fn(
            String,
            u16,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = std::io::Result<Vec<SocketAddr>>> + Send>,
        > + Send
        + Sync,
>;

/// The system's resolver (`getaddrinfo`).
pub fn system_resolver() -> Resolver {
    Arc::new(|host, port| {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    })
}

struct Shared {
    allowlist: Allowlist,
    runner_proxy: RunnerProxy,
    resolve: Resolver,
    tally: Arc<Tally>,
    logged: std::sync::atomic::AtomicU64,
    tunnels: Arc<tokio::sync::Semaphore>,
}

/// The running egress proxy; stops (listener and every connection) when dropped.
pub struct EgressProxy {
    addr: SocketAddr,
    tally: Arc<Tally>,
    stop: CancellationToken,
    shared: Arc<Shared>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl EgressProxy {
    pub async fn start(
        allowlist: Allowlist,
        runner_proxy: RunnerProxy,
    ) -> std::io::Result<EgressProxy> {
        Self::start_with(allowlist, runner_proxy, system_resolver()).await
    }

    /// [`Self::start`] with names resolved by `resolve`.
    pub async fn start_with(
        allowlist: Allowlist,
        runner_proxy: RunnerProxy,
        resolve: Resolver,
    ) -> std::io::Result<EgressProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tally = Arc::new(Tally::default());
        let shared = Arc::new(Shared {
            allowlist,
            runner_proxy,
            resolve,
            tally: tally.clone(),
            logged: Default::default(),
            tunnels: Arc::new(tokio::sync::Semaphore::new(MAX_TUNNELS)),
        });
        let stop = CancellationToken::new();
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let listener = Arc::new(listener);
        tokio::spawn(accept_loop(
            move || {
                let l = listener.clone();
                async move { l.accept().await.map(|(s, _)| s) }
            },
            shared.clone(),
            slots.clone(),
            stop.clone(),
        ));
        Ok(EgressProxy {
            addr,
            tally,
            stop,
            shared,
            slots,
        })
    }

    /// Also serves at the Unix socket `path` (0660; its group is its directory's): the sibling
    /// container's way to this proxy (`crate::confine::sibling`). The same rules and counts, and
    /// the same connection cap.
    pub fn listen_unix(&self, path: &std::path::Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let listener = tokio::net::UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
        let listener = Arc::new(listener);
        tokio::spawn(accept_loop(
            move || {
                let l = listener.clone();
                async move { l.accept().await.map(|(s, _)| s) }
            },
            self.shared.clone(),
            self.slots.clone(),
            self.stop.clone(),
        ));
        Ok(())
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:<port>`, the agent's `HTTP_PROXY` and `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn counts(&self) -> super::tally::Counts {
        self.tally.counts()
    }
}

async fn accept_loop<S, F, A>(
    mut accept: A,
    shared: Arc<Shared>,
    slots: Arc<tokio::sync::Semaphore>,
    stop: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: std::future::Future<Output = std::io::Result<S>>,
    A: FnMut() -> F,
{
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p,
            () = stop.cancelled() => return,
        };
        let Ok(permit) = permit else { return };
        let accepted = tokio::select! {
            a = accept() => a,
            () = stop.cancelled() => return,
        };
        let Ok(stream) = accepted else { continue };
        let (shared, stop) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let svc_stop = stop.clone();
            let service = hyper::service::service_fn(move |req| {
                let (shared, stop) = (shared.clone(), svc_stop.clone());
                async move { Ok::<_, Infallible>(handle(req, &shared, stop).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::select! {
                _ = conn => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: &Shared,
    stop: CancellationToken,
) -> Response<ProxyBody> {
    let (host, port, tunnel) = match target(&req) {
        Ok(t) => t,
        // Counted under a name no host has.
        Err(refusal) => return refuse(shared, "malformed-request", 0, &refusal),
    };
    let allowed = match shared.allowlist.allows(&host, port) {
        Some(a) => a,
        None => return refuse(shared, &host, port, &Refusal::NotListed),
    };
    let result = if tunnel {
        open_tunnel(req, shared, &host, port, allowed, stop).await
    } else {
        forward(req, shared, &host, port, allowed).await
    };
    match result {
        Ok(response) => {
            shared.tally.allowed(&host, port);
            response
        }
        Err(refusal) => refuse(shared, &host, port, &refusal),
    }
}

/// `(host, port, is CONNECT)`, the host normalized.
fn target(req: &Request<Incoming>) -> Result<(String, u16, bool), Refusal> {
    let uri = req.uri();
    let authority = uri.authority().ok_or(Refusal::Malformed(
        "send requests through this proxy (HTTP_PROXY/HTTPS_PROXY), with the full URL",
    ))?;
    let host = allowlist::normalize(authority.host())
        .ok_or(Refusal::Malformed("not a valid host name"))?;
    if req.method() == Method::CONNECT {
        let port = authority
            .port_u16()
            .ok_or(Refusal::Malformed("CONNECT needs host:port"))?;
        return Ok((host, port, true));
    }
    match uri.scheme_str() {
        Some("http") => Ok((host, authority.port_u16().unwrap_or(80), false)),
        _ => Err(Refusal::Malformed(
            "only http:// is forwarded; https:// goes through CONNECT",
        )),
    }
}

fn refuse(shared: &Shared, host: &str, port: u16, refusal: &Refusal) -> Response<ProxyBody> {
    let target = shown(host, port);
    let text = refusal.explain(&target);
    if refusal.by_policy() {
        shared.tally.refused(host, port);
    } else {
        shared.tally.allowed(host, port);
    }
    let n = shared
        .logged
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if n < LOGGED_REFUSALS {
        tracing::info!("network: {text}");
    }
    let mut response = Response::new(full(format!("{text}\n")));
    *response.status_mut() = refusal.status();
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(refusal.phrase().as_bytes()) {
        response.extensions_mut().insert(phrase);
    }
    response
}

fn full(text: String) -> ProxyBody {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

/// The addresses `host` may be reached at: all it resolves to, less the special ones unless the
/// workflow listed it exactly.
async fn addresses(
    shared: &Shared,
    host: &str,
    port: u16,
    allowed: Allowed,
) -> Result<Vec<SocketAddr>, Refusal> {
    let all: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(RESOLVE_TIMEOUT, (shared.resolve)(host.to_string(), port))
            .await
            .map_err(|_| Refusal::Unreachable("the name did not resolve in time".into()))?
            .map_err(|e| Refusal::Unreachable(format!("the name does not resolve ({e})")))?,
    };
    let mut first_special = None;
    let usable: Vec<SocketAddr> = all
        .into_iter()
        .filter(|a| match (address::special(a.ip()), allowed) {
            (None, _) | (Some(_), Allowed::Explicitly) => true,
            (Some(kind), Allowed::ByPattern) => {
                first_special.get_or_insert((a.ip(), kind));
                false
            }
        })
        .collect();
    match (usable.is_empty(), first_special) {
        (true, Some((ip, kind))) => Err(Refusal::Special { ip, kind }),
        (true, None) => Err(Refusal::Unreachable("the name has no address".into())),
        (false, _) => Ok(usable),
    }
}

/// A connection to `host:port`, and the runner proxy it goes through: that proxy when it has
/// one for this host (an address literal is still checked here), else a checked address.
async fn dial<'s>(
    shared: &'s Shared,
    host: &str,
    port: u16,
    allowed: Allowed,
    tunnel: bool,
) -> Result<(TcpStream, Option<&'s runner_proxy::ProxyUrl>), Refusal> {
    let via = if tunnel {
        shared.runner_proxy.for_tunnel(host)
    } else {
        shared.runner_proxy.for_http(host)
    };
    if let Some(runner) = via {
        if let (Ok(ip), Allowed::ByPattern) = (host.parse::<IpAddr>(), allowed) {
            if let Some(kind) = address::special(ip) {
                return Err(Refusal::Special { ip, kind });
            }
        }
        let stream = if tunnel {
            tokio::time::timeout(CONNECT_TIMEOUT, runner_proxy::tunnel(runner, host, port)).await
        } else {
            tokio::time::timeout(
                CONNECT_TIMEOUT,
                TcpStream::connect((runner.host.as_str(), runner.port)),
            )
            .await
        };
        return match stream {
            Ok(Ok(s)) => Ok((s, Some(runner))),
            Ok(Err(e)) => Err(Refusal::Unreachable(format!(
                "through the runner proxy: {e}"
            ))),
            Err(_) => Err(Refusal::Unreachable(
                "the runner proxy did not answer in time".into(),
            )),
        };
    }
    let mut last = String::from("nothing answered");
    for addr in addresses(shared, host, port, allowed).await? {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok((s, None));
            }
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => last = format!("{addr}: no answer in time"),
        }
    }
    Err(Refusal::Unreachable(last))
}

async fn open_tunnel(
    req: Request<Incoming>,
    shared: &Shared,
    host: &str,
    port: u16,
    allowed: Allowed,
    stop: CancellationToken,
) -> Result<Response<ProxyBody>, Refusal> {
    let slot = shared
        .tunnels
        .clone()
        .try_acquire_owned()
        .map_err(|_| Refusal::Unreachable(format!("{MAX_TUNNELS} tunnels are open already")))?;
    let (server, _) = dial(shared, host, port, allowed, true).await?;
    tokio::spawn(async move {
        let _slot = slot;
        if let Ok(client) = hyper::upgrade::on(req).await {
            super::splice::carry(client, server, stop).await;
        }
    });
    Ok(Response::new(full(String::new())))
}

/// Hop-by-hop and proxy headers: never sent on.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

async fn forward(
    req: Request<Incoming>,
    shared: &Shared,
    host: &str,
    port: u16,
    allowed: Allowed,
) -> Result<Response<ProxyBody>, Refusal> {
    let (stream, via) = dial(shared, host, port, allowed, false).await?;
    let (mut parts, body) = req.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    if let Some(runner) = via {
        if let Some(auth) = runner_proxy::proxy_authorization(runner) {
            if let Ok(v) = hyper::header::HeaderValue::from_str(&auth) {
                parts.headers.insert(hyper::header::PROXY_AUTHORIZATION, v);
            }
        }
    } else {
        // Origin form for the server itself.
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        parts.uri = path
            .parse()
            .map_err(|_| Refusal::Malformed("not a valid path"))?;
    }
    if !parts.headers.contains_key(hyper::header::HOST) {
        let value = runner_proxy::authority(host, port);
        if let Ok(v) = hyper::header::HeaderValue::from_str(&value) {
            parts.headers.insert(hyper::header::HOST, v);
        }
    }
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| Refusal::Unreachable(format!("cannot speak HTTP to it: {e}")))?;
    tokio::spawn(conn);
    let response = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| Refusal::Unreachable(format!("the request failed: {e}")))?;
    let (mut parts, body) = response.into_parts();
    // The server's connection is not the client's: its `Connection: close` must not end a
    // connection the client keeps alive.
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    let body = body.map_err(|e| Box::new(e) as BoxError).boxed();
    Ok(Response::from_parts(parts, body))
}
