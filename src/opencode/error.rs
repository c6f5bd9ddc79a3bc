//! The errors of OpenCode's HTTP API: our client's (`ApiError`) and OpenCode's own named errors
//! (`NamedError`), shared by the client, the event stream and the turn.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("OpenCode API {method} {route}: request failed: {detail}")]
    Transport {
        method: &'static str,
        route: String,
        detail: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("OpenCode API {method} {route} returned {status}: {body}")]
    Status {
        method: &'static str,
        route: String,
        status: u16,
        body: String,
    },
    #[error("OpenCode API {method} {route}: unexpected response body")]
    Decode {
        method: &'static str,
        route: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("invalid OpenCode URL {url:?}")]
    Url { url: String },
}

impl ApiError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ApiError::Status { status: 404, .. })
    }
}

/// OpenCode's named error (`{name, data:{message, statusCode?, ...}}`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct NamedError {
    pub name: String,
    #[serde(default)]
    pub data: Value,
}

impl NamedError {
    pub fn message(&self) -> String {
        self.data["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| self.name.clone())
    }
}
