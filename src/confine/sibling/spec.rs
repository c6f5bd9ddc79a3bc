//! The sibling container's create request, from fro-bot's own container as the engine describes
//! it (docs/security.md#the-agents-network): the same image; fro-bot's mounts at the same paths,
//! except the Docker socket; fro-bot's own `/tmp` (the agent's private home, OpenCode's scratch
//! files) at `/tmp`; no network, no capability but the relay's three, `no-new-privileges`,
//! Docker's default system-call profile, a process limit, removed when its relay ends.

use serde_json::{json, Value};

use super::docker::SelfInspect;
use super::relay::RelayConfig;
use crate::confine::DOCKER_SOCKET;

/// Processes and threads the sibling may hold: a build's worth, not a fork bomb's.
pub const PIDS_LIMIT: i64 = 4096;

/// The label naming the container a sibling belongs to.
pub const LABEL: &str = "fro-bot.sibling-of";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error(
        "fro-bot's /tmp is neither a mount nor in a layer the engine names (storage driver \
         {driver:?}), so the agent's commands could not share it"
    )]
    NoSharedTmp { driver: String },
}

/// One mount of the sibling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// `bind` or `volume`.
    pub kind: &'static str,
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

/// fro-bot's mounts the agent's commands get, at the same paths: every bind and volume but the
/// Docker socket, plus fro-bot's `/tmp` when it is not a mount of its own.
pub fn mounts(own: &SelfInspect) -> Result<Vec<Mount>, SpecError> {
    let mut out: Vec<Mount> = own
        .mounts
        .iter()
        .filter(|m| m.destination != DOCKER_SOCKET && !m.destination.ends_with("/docker.sock"))
        .filter_map(|m| {
            let (kind, source) = match m.kind.as_str() {
                "bind" => ("bind", m.source.clone()),
                "volume" => ("volume", m.name.clone()?),
                _ => return None,
            };
            Some(Mount {
                kind,
                source,
                target: m.destination.clone(),
                read_only: !m.rw,
            })
        })
        .collect();
    if !out.iter().any(|m| m.target == "/tmp") {
        let driver = own.graph_driver.as_ref();
        let merged = driver
            .and_then(|g| g.data.as_ref())
            .and_then(|d| d.get("MergedDir"))
            .filter(|d| d.starts_with('/'));
        let Some(merged) = merged else {
            return Err(SpecError::NoSharedTmp {
                driver: driver.map(|g| g.name.clone()).unwrap_or_default(),
            });
        };
        out.push(Mount {
            kind: "bind",
            source: format!("{}/tmp", merged.trim_end_matches('/')),
            target: "/tmp".into(),
            read_only: false,
        });
    }
    Ok(out)
}

/// The engine's create request for the sibling of `own`, its relay started as `exe relay…`.
pub fn create_body(own: &SelfInspect, exe: &str, relay: &RelayConfig) -> Result<Value, SpecError> {
    let mounts: Vec<Value> = mounts(own)?
        .into_iter()
        .map(|m| {
            json!({"Type": m.kind, "Source": m.source, "Target": m.target,
                   "ReadOnly": m.read_only})
        })
        .collect();
    Ok(json!({
        "Image": own.image,
        "Entrypoint": [exe],
        "Cmd": relay.to_args(),
        "User": "0:0",
        "WorkingDir": "/",
        "Labels": {LABEL: own.id},
        "NetworkDisabled": true,
        "HostConfig": {
            "NetworkMode": "none",
            "CapDrop": ["ALL"],
            "CapAdd": ["SETUID", "SETGID", "KILL"],
            "SecurityOpt": ["no-new-privileges"],
            "PidsLimit": PIDS_LIMIT,
            "Mounts": mounts,
            "AutoRemove": true,
            "Init": false,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(mounts: Value, merged: Option<&str>) -> SelfInspect {
        serde_json::from_value(json!({
            "Id": "own", "Image": "sha256:img", "Mounts": mounts,
            "GraphDriver": {"Name": "overlay2",
                            "Data": merged.map(|m| json!({"MergedDir": m}))},
        }))
        .unwrap()
    }

    #[test]
    fn the_sibling_gets_fro_bots_mounts_and_tmp_but_never_the_docker_socket() {
        let o = own(
            json!([
                {"Type": "bind", "Source": "/var/run/docker.sock",
                 "Destination": "/var/run/docker.sock", "RW": true},
                {"Type": "bind", "Source": "/h/ws", "Destination": "/github/workspace", "RW": true},
                {"Type": "bind", "Source": "/h/wf", "Destination": "/github/workflow", "RW": false},
                {"Type": "volume", "Name": "v1", "Source": "/var/lib/docker/volumes/v1/_data",
                 "Destination": "/data", "RW": true},
                {"Type": "tmpfs", "Destination": "/run/x", "RW": true},
            ]),
            Some("/var/lib/docker/overlay2/abc/merged"),
        );
        let m = mounts(&o).unwrap();
        let targets: Vec<&str> = m.iter().map(|m| m.target.as_str()).collect();
        assert_eq!(
            targets,
            ["/github/workspace", "/github/workflow", "/data", "/tmp"]
        );
        assert!(m[1].read_only && !m[0].read_only);
        assert_eq!(m[2].source, "v1");
        assert_eq!(m[3].source, "/var/lib/docker/overlay2/abc/merged/tmp");
        let relay = RelayConfig {
            dir: "/tmp/s".into(),
            uid: 1001,
            gid: 1001,
            proxy_port: None,
            spec: "abi=7;connect=;bind=;ip=none".into(),
        };
        let body = create_body(&o, "/usr/local/bin/fro-bot", &relay).unwrap();
        let host = &body["HostConfig"];
        assert_eq!(host["NetworkMode"], "none");
        assert_eq!(host["CapDrop"], json!(["ALL"]));
        assert_eq!(host["SecurityOpt"], json!(["no-new-privileges"]));
        assert!(host.get("Binds").is_none() && host.get("Privileged").is_none());
        assert!(!body.to_string().contains("docker.sock"), "{body}");
        assert_eq!(body["Image"], "sha256:img");
    }

    #[test]
    fn without_a_shared_tmp_there_is_no_sibling() {
        let o = own(json!([]), None);
        assert!(matches!(mounts(&o), Err(SpecError::NoSharedTmp { .. })));
        let tmp = own(
            json!([{"Type": "bind", "Source": "/h/t", "Destination": "/tmp", "RW": true}]),
            None,
        );
        assert_eq!(mounts(&tmp).unwrap().len(), 1);
    }
}
