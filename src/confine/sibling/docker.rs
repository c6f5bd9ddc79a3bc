//! The few Docker Engine API calls the sibling container needs, over the socket the runner
//! mounts into every container action (`crate::confine::DOCKER_SOCKET`): inspect fro-bot's own
//! container, create, start and remove the sibling. Unversioned paths: the engine answers in
//! its own current API version.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::Value;

/// One call's bound: the engine answers these in milliseconds.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("cannot reach the Docker engine at {}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the Docker engine's answer to {what} could not be read")]
    Transport {
        what: String,
        #[source]
        source: hyper::Error,
    },
    #[error("the Docker engine did not answer {what} within {}s", CALL_TIMEOUT.as_secs())]
    Timeout { what: String },
    #[error("the Docker engine refused {what}: {status} {message}")]
    Refused {
        what: String,
        status: StatusCode,
        message: String,
    },
    #[error("the Docker engine's answer to {what} is not what its API describes")]
    Shape {
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A client of the engine behind one socket.
#[derive(Debug, Clone)]
pub struct Docker {
    socket: PathBuf,
}

/// What fro-bot reads of its own container.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SelfInspect {
    pub id: String,
    /// The image's id (`sha256:…`): the sibling starts from the same one, already on the host.
    pub image: String,
    #[serde(default)]
    pub mounts: Vec<MountInfo>,
    #[serde(default)]
    pub graph_driver: Option<GraphDriver>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MountInfo {
    #[serde(rename = "Type", default)]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub source: String,
    pub destination: String,
    #[serde(rename = "RW", default)]
    pub rw: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GraphDriver {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub data: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Created {
    id: String,
}

impl Docker {
    pub fn new(socket: &Path) -> Docker {
        Docker {
            socket: socket.to_path_buf(),
        }
    }

    pub async fn inspect(&self, container: &str) -> Result<SelfInspect, DockerError> {
        let what = format!("inspecting container {container}");
        let path = format!("/containers/{container}/json");
        let body = self.call(Method::GET, &path, None, &what).await?;
        serde_json::from_slice(&body).map_err(|source| DockerError::Shape { what, source })
    }

    /// Creates a container named `name` from `body` (the engine's create request); its id.
    pub async fn create(&self, name: &str, body: &Value) -> Result<String, DockerError> {
        let what = format!("creating container {name}");
        let path = format!("/containers/create?name={name}");
        let answer = self.call(Method::POST, &path, Some(body), &what).await?;
        let created: Created = serde_json::from_slice(&answer)
            .map_err(|source| DockerError::Shape { what, source })?;
        Ok(created.id)
    }

    pub async fn start(&self, id: &str) -> Result<(), DockerError> {
        let what = format!("starting container {id}");
        let path = format!("/containers/{id}/start");
        self.call(Method::POST, &path, None, &what).await.map(drop)
    }

    /// Kills and removes `id`; a container already gone is nothing to remove. Whether it was
    /// still there.
    pub async fn remove(&self, id: &str) -> Result<bool, DockerError> {
        let what = format!("removing container {id}");
        let path = format!("/containers/{id}?force=true&v=true");
        match self.call(Method::DELETE, &path, None, &what).await {
            Ok(_) => Ok(true),
            Err(DockerError::Refused { status, .. }) if status == StatusCode::NOT_FOUND => {
                Ok(false)
            }
            // Removal already under way (the container's own `AutoRemove`).
            Err(DockerError::Refused { status, .. }) if status == StatusCode::CONFLICT => Ok(true),
            Err(e) => Err(e),
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
    ) -> Result<Bytes, DockerError> {
        tokio::time::timeout(CALL_TIMEOUT, self.exchange(method, path, body, what))
            .await
            .map_err(|_| DockerError::Timeout {
                what: what.to_string(),
            })?
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        what: &str,
    ) -> Result<Bytes, DockerError> {
        let transport = |source| DockerError::Transport {
            what: what.to_string(),
            source,
        };
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| DockerError::Connect {
                socket: self.socket.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(transport)?;
        tokio::spawn(conn);
        let bytes = body.map_or_else(Vec::new, |b| b.to_string().into_bytes());
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "docker")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| DockerError::Refused {
                what: what.to_string(),
                status: StatusCode::BAD_REQUEST,
                message: e.to_string(),
            })?;
        let response = sender.send_request(request).await.map_err(transport)?;
        let status = response.status();
        let answer = response
            .into_body()
            .collect()
            .await
            .map_err(transport)?
            .to_bytes();
        if !status.is_success() {
            return Err(DockerError::Refused {
                what: what.to_string(),
                status,
                message: engine_message(&answer),
            });
        }
        Ok(answer)
    }
}

/// The engine's `{"message": …}`, else its answer's first bytes.
fn engine_message(answer: &[u8]) -> String {
    serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&answer[..answer.len().min(300)]).into_owned())
}

/// fro-bot's own container's id, from its mounts: the engine bind-mounts `/etc/hostname` (and
/// `resolv.conf`, `hosts`) from `…/containers/<id>/`. The hostname is not it under
/// `--network host`, which the suite's runs use.
pub fn own_container_id() -> Option<String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    container_id_in(&mountinfo)
}

fn container_id_in(mountinfo: &str) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let (_, after) = line.split_once("/containers/")?;
        let id: String = after.chars().take_while(char::is_ascii_hexdigit).collect();
        (id.len() == 64 && after[64..].starts_with('/')).then_some(id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_id_is_read_from_the_engines_mounts_and_nothing_else_passes_for_it() {
        let id = "baaf9091e8a545c3514ede5d98a99257c5a18872869beabcd0111edd00558609";
        let info = format!(
            "1 2 0:1 / / rw - overlay overlay rw\n\
             3 1 8:1 /var/lib/docker/containers/{id}/hostname /etc/hostname rw - ext4 /dev/sda1 rw"
        );
        assert_eq!(container_id_in(&info).as_deref(), Some(id));
        for bad in [
            "3 1 8:1 /var/lib/docker/containers/abc/hostname /etc/hostname rw",
            "3 1 8:1 /home/x/containers/not-hex/hosts /etc/hosts rw",
            "1 2 0:1 / / rw - overlay overlay rw",
        ] {
            assert_eq!(container_id_in(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_inspect_answer_reads_into_what_the_sibling_needs() {
        let v = serde_json::json!({
            "Id": "abc", "Image": "sha256:1",
            "Mounts": [{"Type": "bind", "Source": "/h/ws", "Destination": "/github/workspace",
                        "Mode": "", "RW": true, "Propagation": "rprivate"}],
            "GraphDriver": {"Name": "overlay2", "Data": {"MergedDir": "/var/lib/docker/o/m"}}
        });
        let s: SelfInspect = serde_json::from_value(v).unwrap();
        assert_eq!(s.mounts[0].destination, "/github/workspace");
        assert!(s.mounts[0].rw);
        assert_eq!(
            s.graph_driver.unwrap().data.unwrap()["MergedDir"],
            "/var/lib/docker/o/m"
        );
    }
}
