//! Fall back, never shadow (docs/persistence.md, "When the newest entry cannot be restored"):
//! listing the repository's cache entries under the restore prefixes, newest first, so the restore
//! phase can try older ones by exact key, and deleting entries that cannot be restored.
//!
//! The Actions cache is listed through the REST API (`actions: read`; deleting needs
//! `actions: write`); `fro-bot local`'s filesystem cache lists its own directory.

use crate::cache::FsBackend;
use crate::github::GitHub;

/// At most this many older entries are tried after the newest one failed.
pub const MAX_FALLBACK: usize = 5;
/// One page of the REST listing per prefix (its maximum).
const LIST_LIMIT: usize = 100;

/// Where the repository's entries are listed and deleted.
pub enum Catalog<'a> {
    /// The Actions cache, through the REST API.
    GitHub(&'a GitHub),
    /// `fro-bot local`'s filesystem cache.
    Local(&'a FsBackend),
    /// No way to list (no GitHub token or API): older entries cannot be found.
    Unavailable { reason: &'static str },
}

/// Entry keys to try, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    Keys {
        keys: Vec<String>,
        /// Every entry under the prefixes is in `keys` (no page was cut short).
        complete: bool,
    },
    Failed {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    Deleted,
    /// Already gone.
    Absent,
    /// The token may not delete (no `actions: write`).
    Forbidden {
        message: String,
    },
    Failed {
        message: String,
    },
}

impl Catalog<'_> {
    /// Entries of this `version` under `prefixes` (most specific prefix first, each newest
    /// first), without duplicates and without the keys in `skip`.
    pub async fn list(&self, prefixes: &[String], version: &str, skip: &[String]) -> Listing {
        let mut keys: Vec<String> = Vec::new();
        let mut complete = true;
        for prefix in prefixes {
            let found: Vec<String> = match self {
                Catalog::GitHub(gh) => match gh.list_caches(prefix, LIST_LIMIT).await {
                    Ok(listing) => {
                        if listing.total_count > listing.entries.len() as u64 {
                            complete = false;
                        }
                        listing
                            .entries
                            .into_iter()
                            .filter(|e| e.version == version)
                            .map(|e| e.key)
                            .collect()
                    }
                    Err(e) => {
                        let hint = match e.status() {
                            Some(403) | Some(404) => {
                                " (the workflow's token needs `permissions: actions: read`)"
                            }
                            _ => "",
                        };
                        return Listing::Failed {
                            message: format!("{e}{hint}"),
                        };
                    }
                },
                Catalog::Local(fs) => match fs.list(prefix, version) {
                    Ok(entries) => entries.into_iter().map(|e| e.key).collect(),
                    Err(e) => {
                        return Listing::Failed {
                            message: e.to_string(),
                        }
                    }
                },
                Catalog::Unavailable { reason } => {
                    return Listing::Failed {
                        message: (*reason).to_string(),
                    }
                }
            };
            for key in found {
                if !skip.contains(&key) && !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        Listing::Keys { keys, complete }
    }

    pub async fn delete(&self, key: &str) -> Deletion {
        match self {
            Catalog::GitHub(gh) => match gh.delete_cache(key).await {
                Ok(true) => Deletion::Deleted,
                Ok(false) => Deletion::Absent,
                Err(e) if e.status() == Some(403) => Deletion::Forbidden {
                    message: e.to_string(),
                },
                Err(e) => Deletion::Failed {
                    message: e.to_string(),
                },
            },
            Catalog::Local(fs) => match fs.delete(key) {
                Ok(true) => Deletion::Deleted,
                Ok(false) => Deletion::Absent,
                Err(e) => Deletion::Failed {
                    message: e.to_string(),
                },
            },
            Catalog::Unavailable { reason } => Deletion::Failed {
                message: (*reason).to_string(),
            },
        }
    }
}

/// The catalog for this run's cache: the filesystem cache lists itself; the Actions cache needs the
/// GitHub API.
pub fn catalog<'a>(
    backend: Option<&'a crate::cache::Backend>,
    gh: Option<&'a GitHub>,
) -> Catalog<'a> {
    match (backend, gh) {
        (Some(crate::cache::Backend::Filesystem(fs)), _) => Catalog::Local(fs),
        (Some(crate::cache::Backend::Actions(_)), Some(gh)) => Catalog::GitHub(gh),
        (Some(crate::cache::Backend::Actions(_)), None) => Catalog::Unavailable {
            reason: "no GitHub token or API to list cache entries with",
        },
        (None, _) => Catalog::Unavailable {
            reason: "no cache service",
        },
    }
}
