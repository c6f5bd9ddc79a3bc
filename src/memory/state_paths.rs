//! Where memory lives, and the one path list that the cache version is computed over. Main, restore
//! and post all call [`StatePaths::from_env`], so the version never drifts between them (or from the
//! official toolkit given the same strings).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cache::{CachePath, PathKind};
use crate::memory::checkpoint;
use crate::runner::{env, Env};

/// Our marker file beside the database: storage version and what was saved.
pub const MARKER_FILE: &str = "fro-bot.json";
/// Bumped only when the saved layout changes incompatibly; a mismatch means a clean slate.
pub const STORAGE_VERSION: u32 = 1;
/// OpenCode may store provider credentials here; it must never be saved or restored.
pub const AUTH_FILE: &str = "auth.json";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePaths {
    /// `$XDG_DATA_HOME/opencode`, or `$HOME/.local/share/opencode`.
    pub data_dir: PathBuf,
    /// The path strings exactly as they enter the cache version and the archive.
    list: Vec<String>,
    /// The same paths with what a restored entry must hold at each.
    targets: Vec<CachePath>,
}

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error(
        "neither {data} nor {home} is set: cannot tell where OpenCode keeps its data",
        data = env::XDG_DATA_HOME,
        home = env::HOME
    )]
    NoHome,
}

impl StatePaths {
    pub fn from_env(env: &Env) -> Result<Self, PathsError> {
        let data_dir = match env.get(env::XDG_DATA_HOME) {
            Some(xdg) => PathBuf::from(xdg).join("opencode"),
            None => PathBuf::from(env.get(env::HOME).ok_or(PathsError::NoHome)?)
                .join(".local/share/opencode"),
        };
        Ok(Self::new(data_dir))
    }

    pub fn new(data_dir: PathBuf) -> Self {
        // Exactly these, in this order. Never -wal, -shm, auth.json, log/ or snapshot/.
        let targets: Vec<CachePath> = [
            (checkpoint::LEGACY_STORAGE_DIR, PathKind::Directory),
            (checkpoint::DB_FILE, PathKind::File),
            (MARKER_FILE, PathKind::File),
        ]
        .into_iter()
        .map(|(name, kind)| CachePath {
            path: data_dir.join(name).to_string_lossy().into_owned(),
            kind,
        })
        .collect();
        let list = targets.iter().map(|t| t.path.clone()).collect();
        Self {
            data_dir,
            list,
            targets,
        }
    }

    /// The cache path list (what is saved, and what the version is computed over).
    pub fn cache_paths(&self) -> &[String] {
        &self.list
    }

    /// The cache paths with their kinds: the roots extraction is confined to.
    pub fn restore_targets(&self) -> &[CachePath] {
        &self.targets
    }

    pub fn db(&self) -> PathBuf {
        checkpoint::db_path(&self.data_dir)
    }

    pub fn marker(&self) -> PathBuf {
        self.data_dir.join(MARKER_FILE)
    }

    pub fn auth_file(&self) -> PathBuf {
        self.data_dir.join(AUTH_FILE)
    }

    /// Deletes `storage/`, OpenCode's legacy JSON storage: the scrub reads only the database, so
    /// whatever an OpenCode version wrote there never reaches a cache entry.
    pub fn remove_legacy_storage(&self) -> std::io::Result<bool> {
        let dir = self.data_dir.join(checkpoint::LEGACY_STORAGE_DIR);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&dir).map(|()| true),
            Ok(_) => std::fs::remove_file(&dir).map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes `auth.json`: credentials never reach a cache entry, and never come from one.
    pub fn remove_auth_file(&self) -> std::io::Result<bool> {
        match std::fs::remove_file(self.auth_file()) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Marker {
    pub storage_version: u32,
    pub writer_version: String,
    pub run_id: String,
    /// Epoch milliseconds.
    pub saved_at: u64,
    pub db_size: u64,
    pub db_sha256: String,
    /// Logical key → id of the session fro-bot keeps that conversation in. Absent in markers
    /// written before the map existed (then threads are found by title once, and migrated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<crate::memory::session_map::Map>,
    /// Session id → who wrote it (docs/security.md#trust-follows-memory). Absent in markers
    /// written before trust was recorded: every session then counts as the lowest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<crate::trust::TrustMap>,
    /// `scrub::SCRUB_VERSION` when every row and the free space of the database it names were
    /// scrubbed (the save's own scrub, or that of the run it restored from, plus what the run
    /// wrote). Absent: unknown provenance, which the next save scrubs whole
    /// (docs/security.md#scrubbed-memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrubbed: Option<u32>,
    /// The spend ledger (`memory::spend_ledger`), kept as JSON so that a hostile one never makes
    /// the marker unreadable: `SpendLedger::read` judges it line by line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerCheck {
    /// No marker (an entry from an older writer or the toolkit): compatible.
    Missing,
    Compatible(Marker),
    /// A different storage version: the data is not ours to read.
    VersionMismatch {
        found: u32,
    },
    /// Present but unreadable JSON: treated as compatible, reported.
    Unreadable {
        message: String,
    },
}

pub fn check_marker(path: &Path) -> MarkerCheck {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_marker(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => MarkerCheck::Missing,
        Err(e) => MarkerCheck::Unreadable {
            message: e.to_string(),
        },
    }
}

/// Judges a marker file's text (restored, so untrusted).
pub fn parse_marker(text: &str) -> MarkerCheck {
    #[derive(Deserialize)]
    struct VersionOnly {
        storage_version: u32,
    }
    match serde_json::from_str::<VersionOnly>(text) {
        Ok(v) if v.storage_version != STORAGE_VERSION => MarkerCheck::VersionMismatch {
            found: v.storage_version,
        },
        Ok(_) => match serde_json::from_str::<Marker>(text) {
            Ok(m) => MarkerCheck::Compatible(m),
            Err(e) => MarkerCheck::Unreadable {
                message: e.to_string(),
            },
        },
        Err(e) => MarkerCheck::Unreadable {
            message: e.to_string(),
        },
    }
}

/// The marker in `bytes` (the store's, so untrusted) if it may stand beside the database whose
/// SHA-256 is `db_sha256`: one of our storage version that names exactly that database. A publish
/// whose marker put did not follow, or a planted marker, names another one.
pub fn marker_naming(bytes: &[u8], db_sha256: &str) -> Result<Marker, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string())?;
    match parse_marker(text) {
        MarkerCheck::Compatible(m) if m.db_sha256.eq_ignore_ascii_case(db_sha256) => Ok(m),
        MarkerCheck::Compatible(_) => Err("it names another database".into()),
        MarkerCheck::VersionMismatch { found } => Err(format!(
            "storage version {found}, this fro-bot reads version {STORAGE_VERSION}"
        )),
        MarkerCheck::Unreadable { message } => Err(format!("it is unreadable: {message}")),
        MarkerCheck::Missing => Err("it is empty".into()),
    }
}

/// Whether the marker vouches that the database it names holds no secret, in a row or in free
/// space (`Marker::scrubbed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scrubbed {
    /// This save scrubbed it (whole, or what it wrote into memory a fro-bot had scrubbed).
    Whole,
    /// Something went in after the scrub (another run's memory, merged): not vouched for.
    NotVouched,
}

/// A file's SHA-256 and length, from one read of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileDigest {
    pub sha256: [u8; 32],
    pub size: u64,
}

impl FileDigest {
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        let size = std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
        Ok(FileDigest {
            sha256: hasher.finalize().into(),
            size,
        })
    }
}

/// Writes the marker for the database as it is now (after its checkpoint), atomically. `sessions`
/// is the session map to record; `None` keeps the map of the marker on disk (post, which did not
/// see the run); so does `trust` for the trust records. Entries whose session is gone from the
/// database are dropped. `scrubbed` is what it says of secrets in the database. `digest` is the
/// caller's digest of the database when nothing wrote it since (a full read saved); `None`
/// hashes it here.
pub fn write_marker(
    paths: &StatePaths,
    run_id: &str,
    now_ms: u64,
    sessions: Option<&crate::memory::session_map::Map>,
    trust: Option<&crate::trust::TrustMap>,
    scrubbed: Scrubbed,
    digest: Option<FileDigest>,
) -> std::io::Result<Marker> {
    let on_disk = || match check_marker(&paths.marker()) {
        MarkerCheck::Compatible(old) => Some(old),
        MarkerCheck::Missing
        | MarkerCheck::VersionMismatch { .. }
        | MarkerCheck::Unreadable { .. } => None,
    };
    let mut sessions = match sessions {
        Some(map) => Some(map.clone()),
        None => on_disk().and_then(|old| old.sessions),
    };
    if let Some(map) = sessions.as_mut() {
        crate::memory::session_map::retain_existing(&paths.db(), map);
    }
    let mut trust = match trust {
        Some(map) => Some(map.clone()),
        None => on_disk().and_then(|old| old.trust),
    };
    if let Some(map) = trust.as_mut() {
        crate::memory::session_map::retain_existing_trust(&paths.db(), map);
    }
    let digest = match digest {
        Some(known) => known,
        None => FileDigest::of(&paths.db())?,
    };
    let on_disk_spend = on_disk().and_then(|old| old.spend);
    let spend =
        crate::memory::spend_ledger::for_marker(&paths.data_dir, on_disk_spend.as_ref(), now_ms);
    let marker = Marker {
        storage_version: STORAGE_VERSION,
        writer_version: format!("fro-bot {}", env!("CARGO_PKG_VERSION")),
        run_id: run_id.to_string(),
        saved_at: now_ms,
        db_size: digest.size,
        db_sha256: hex::encode(digest.sha256),
        sessions,
        trust,
        scrubbed: match scrubbed {
            Scrubbed::Whole => Some(crate::memory::scrub::SCRUB_VERSION),
            Scrubbed::NotVouched => None,
        },
        spend,
    };
    let tmp = paths.data_dir.join(format!(".{MARKER_FILE}.tmp"));
    let json = serde_json::to_vec_pretty(&marker).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, paths.marker())?;
    Ok(marker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_from_the_store_stands_only_beside_the_database_it_names() {
        let sha = "ab".repeat(32);
        let marker = |version: u32, sha: &str| {
            serde_json::json!({
                "storage_version": version, "writer_version": "fro-bot 0", "run_id": "1",
                "saved_at": 1, "db_size": 4, "db_sha256": sha, "sessions": {"issue-1": "ses_a"},
            })
            .to_string()
        };
        let named = marker_naming(marker(1, &sha).as_bytes(), &sha).unwrap();
        assert_eq!(named.sessions.unwrap()["issue-1"], "ses_a");
        assert!(marker_naming(marker(1, &sha.to_uppercase()).as_bytes(), &sha).is_ok());
        let other = marker_naming(marker(1, &"cd".repeat(32)).as_bytes(), &sha).unwrap_err();
        assert_eq!(other, "it names another database");
        let version = marker_naming(marker(2, &sha).as_bytes(), &sha).unwrap_err();
        assert!(version.contains("storage version 2"), "{version}");
        assert!(marker_naming(b"{\"storage_version\": 1}", &sha).is_err());
        assert!(marker_naming(b"\xff\xfe", &sha).is_err());
        assert!(marker_naming(b"", &sha).is_err());
    }

    #[test]
    fn path_list_is_exact_and_follows_xdg() {
        let env = Env::from_pairs([("HOME", "/github/home")]);
        let p = StatePaths::from_env(&env).unwrap();
        assert_eq!(
            p.cache_paths(),
            [
                "/github/home/.local/share/opencode/storage",
                "/github/home/.local/share/opencode/opencode.db",
                "/github/home/.local/share/opencode/fro-bot.json",
            ]
        );
        let env = Env::from_pairs([("HOME", "/h"), ("XDG_DATA_HOME", "/x/data")]);
        assert_eq!(
            StatePaths::from_env(&env).unwrap().data_dir,
            PathBuf::from("/x/data/opencode")
        );
        // A blank XDG_DATA_HOME is unset.
        let env = Env::from_pairs([("HOME", "/h"), ("XDG_DATA_HOME", "  ")]);
        assert_eq!(
            StatePaths::from_env(&env).unwrap().data_dir,
            PathBuf::from("/h/.local/share/opencode")
        );
        assert!(StatePaths::from_env(&Env::default()).is_err());
    }

    #[test]
    fn marker_round_trip_and_version_check() {
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::new(dir.path().to_path_buf());
        assert_eq!(check_marker(&paths.marker()), MarkerCheck::Missing);
        std::fs::write(paths.db(), b"0123456789").unwrap();
        let m = write_marker(
            &paths,
            "42",
            1_700_000_000_000,
            None,
            None,
            Scrubbed::NotVouched,
            None,
        )
        .unwrap();
        assert_eq!(m.sessions, None, "no map given, none on disk");
        assert_eq!(m.db_size, 10);
        assert_eq!(
            m.db_sha256,
            "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882"
        );
        assert_eq!(check_marker(&paths.marker()), MarkerCheck::Compatible(m));
        // A map given is recorded; without one, the map on disk is kept.
        let map = crate::memory::session_map::Map::from([("issue-1".into(), "ses_1".into())]);
        std::fs::remove_file(paths.db()).unwrap();
        rusqlite::Connection::open(paths.db())
            .unwrap()
            .execute_batch("CREATE TABLE session(id text); INSERT INTO session VALUES ('ses_1');")
            .unwrap();
        let trust = crate::trust::TrustMap::from([
            (
                "ses_1".to_string(),
                crate::trust::SessionTrust::new("eve", "NONE", false, false),
            ),
            (
                "ses_gone".to_string(),
                crate::trust::SessionTrust::new("mona", "OWNER", false, false),
            ),
        ]);
        let m = write_marker(
            &paths,
            "43",
            1,
            Some(&map),
            Some(&trust),
            Scrubbed::Whole,
            None,
        )
        .unwrap();
        assert_eq!(m.sessions.as_ref(), Some(&map));
        let kept_trust = m.trust.clone().unwrap();
        assert_eq!(
            kept_trust.keys().collect::<Vec<_>>(),
            ["ses_1"],
            "records of deleted sessions are dropped"
        );
        let kept = write_marker(&paths, "44", 2, None, None, Scrubbed::NotVouched, None).unwrap();
        assert_eq!(kept.sessions, Some(map));
        assert_eq!(kept.trust, Some(kept_trust));
        // A marker from before the map existed parses, without one.
        std::fs::write(
            paths.marker(),
            r#"{"storage_version":1,"writer_version":"fro-bot 0.1","run_id":"1","saved_at":1,"db_size":1,"db_sha256":"x"}"#,
        )
        .unwrap();
        assert!(matches!(
            check_marker(&paths.marker()),
            MarkerCheck::Compatible(Marker {
                sessions: None,
                trust: None,
                ..
            })
        ));
        std::fs::write(paths.marker(), r#"{"storage_version":2}"#).unwrap();
        assert_eq!(
            check_marker(&paths.marker()),
            MarkerCheck::VersionMismatch { found: 2 }
        );
        std::fs::write(paths.marker(), "{").unwrap();
        assert!(matches!(
            check_marker(&paths.marker()),
            MarkerCheck::Unreadable { .. }
        ));
    }
}
