//! Test service: a runner proxy like a corporate one, on 127.0.0.1. It tunnels `CONNECT` and
//! forwards absolute-form requests, and it alone resolves the `.test` names tests give their
//! services (`github.test:<port>` is `127.0.0.1:<port>`), so a client that does not use it cannot
//! reach them at all. Every request it gets is recorded; one for any other host (the runner's
//! loopback included, which a real proxy cannot reach) is answered 502.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};

type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// One request the proxy got: `CONNECT` or the forwarded method, and where it was for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub host: String,
    pub port: u16,
}

pub struct FakeRunnerProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRunnerProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `url` of a service on 127.0.0.1 under `name`, which only the proxy resolves.
pub fn named(url: &str, name: &str) -> String {
    url.replacen("127.0.0.1", name, 1)
}

impl FakeRunnerProxy {
    pub async fn start() -> FakeRunnerProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let forward = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let recorded = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, forward) = (recorded.clone(), forward.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (seen, forward) = (seen.clone(), forward.clone());
                        async move { Ok::<_, Infallible>(handle(&seen, &forward, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        FakeRunnerProxy { addr, seen, task }
    }

    /// For `HTTPS_PROXY`/`HTTP_PROXY`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests were for `host`.
    pub fn count(&self, host: &str) -> usize {
        self.seen().iter().filter(|s| s.host == host).count()
    }

    /// `host:port` → requests, for a failing assertion's message.
    pub fn summary(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for s in self.seen() {
            *out.entry(format!("{} {}:{}", s.method, s.host, s.port))
                .or_default() += 1;
        }
        out
    }

    /// Requests for hosts other than the `.test` names: the runner's loopback, or anything else.
    pub fn elsewhere(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| !s.host.ends_with(".test"))
            .collect()
    }
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    r
}

async fn handle(
    seen: &Mutex<Vec<Seen>>,
    forward: &reqwest::Client,
    req: Request<Incoming>,
) -> Response<Body> {
    let Some(authority) = req.uri().authority().cloned() else {
        return empty(StatusCode::BAD_REQUEST);
    };
    let default_port = if req.uri().scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let (host, port) = (
        authority.host().to_string(),
        authority.port_u16().unwrap_or(default_port),
    );
    seen.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        host: host.clone(),
        port,
    });
    if !host.ends_with(".test") {
        return empty(StatusCode::BAD_GATEWAY);
    }
    let target = SocketAddr::from(([127, 0, 0, 1], port));
    if req.method() == Method::CONNECT {
        tokio::spawn(async move {
            let Ok(upgraded) = hyper::upgrade::on(req).await else {
                return;
            };
            let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
                return;
            };
            let mut client = hyper_util::rt::TokioIo::new(upgraded);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        });
        return empty(StatusCode::OK);
    }
    forward_request(forward, target, req).await
}

/// Headers that belong to one hop (or to the proxy) and are not passed on.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// An absolute-form request sent on to `target` with its `Host` (signed by S3 clients) unchanged.
async fn forward_request(
    forward: &reqwest::Client,
    target: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let method = req.method().clone();
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in req.headers() {
        if !hop_by_hop(name.as_str()) && name != "content-length" {
            headers.append(name.clone(), value.clone());
        }
    }
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        return empty(StatusCode::BAD_REQUEST);
    };
    let sent = forward
        .request(method, format!("http://{target}{path}"))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let Ok(resp) = sent else {
        return empty(StatusCode::BAD_GATEWAY);
    };
    let mut out = Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if !hop_by_hop(name.as_str()) {
            out = out.header(name, value);
        }
    }
    let stream = resp
        .bytes_stream()
        .map(|chunk| chunk.map(Frame::data).map_err(|e| Box::new(e) as _));
    out.body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap_or_else(|_| empty(StatusCode::BAD_GATEWAY))
}
