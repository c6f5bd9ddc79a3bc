//! The Actions cache client against the in-process cache server, real files, and GNU tar/zstd.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fro_bot::cache::{
    extract_confined, version, write_archive, ActionsCacheClient, Backend, CacheError, CacheMode,
    FsBackend, RejectReason, RestoreOutcome, RestoreRequest, RetryPolicy, SaveRequest,
    TransferOptions,
};
use rand::{RngCore, SeedableRng};

use crate::support::cache_server::{
    CacheServer, Fault, Truncation, CREATE, FINALIZE, GET_BLOB, LOOKUP, PUT_BLOB, PUT_BLOCK,
    PUT_BLOCK_LIST,
};

const MIB: usize = 1024 * 1024;

/// A runner-like layout in a temp dir: workspace `<root>/github/workspace`, data dir
/// `<root>/github/home/.local/share/opencode`, and the three cache paths
/// (docs/design.md#keys-and-identities).
struct Layout {
    _root: tempfile::TempDir,
    root: PathBuf,
    workspace: PathBuf,
    data: PathBuf,
    paths: Vec<String>,
}

impl Layout {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().to_path_buf();
        let workspace = base.join("github/workspace");
        let data = base.join("github/home/.local/share/opencode");
        fs::create_dir_all(&workspace).unwrap();
        let paths = ["storage", "opencode.db", "fro-bot.json"]
            .iter()
            .map(|p| data.join(p).to_string_lossy().into_owned())
            .collect();
        Layout {
            _root: root,
            root: base,
            workspace,
            data,
            paths,
        }
    }

    /// Writes a db of `db_bytes` pseudo-random bytes (seeded), a storage tree and the marker.
    fn populate(&self, db_bytes: usize, seed: u64) {
        fs::create_dir_all(self.data.join("storage/session/a")).unwrap();
        fs::create_dir_all(self.data.join("storage/empty")).unwrap();
        fs::write(
            self.data.join("storage/session/a/s1.json"),
            format!("{{\"seed\":{seed}}}"),
        )
        .unwrap();
        fs::write(self.data.join("storage/top.txt"), b"top").unwrap();
        fs::write(
            self.data.join("fro-bot.json"),
            format!("{{\"storage_version\":1,\"seed\":{seed}}}"),
        )
        .unwrap();
        fs::write(self.data.join("opencode.db"), random_bytes(db_bytes, seed)).unwrap();
        // Not a cache path: must never travel.
        fs::write(self.data.join("auth.json"), b"secret").unwrap();
    }

    fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        snapshot(&self.data)
    }

    fn save_req(&self, key: &'static str) -> SaveRequest<'_> {
        SaveRequest {
            key,
            paths: &self.paths,
            workspace: &self.workspace,
        }
    }

    fn restore_req<'a>(&'a self, key: &'a str, restore_keys: &'a [String]) -> RestoreRequest<'a> {
        RestoreRequest {
            key,
            restore_keys,
            paths: &self.paths,
            workspace: &self.workspace,
        }
    }
}

/// Every file below `dir` (relative name → contents); directories as empty entries ending in `/`.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                out.insert(format!("{rel}/"), Vec::new());
                walk(base, &p, out);
            } else {
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 5,
        base_delay: Duration::from_millis(2),
        connect_retries: 1,
    }
}

fn client(server: &CacheServer) -> ActionsCacheClient {
    let mut c =
        ActionsCacheClient::new(&server.url(), &server.token(), CacheMode::ReadWrite).unwrap();
    c.set_retry(fast_retry());
    c
}

fn hit_key(outcome: &RestoreOutcome) -> &str {
    match outcome {
        RestoreOutcome::Hit { matched_key, .. } => matched_key,
        other => panic!("expected a hit: {other:?}"),
    }
}

async fn round_trip(db_bytes: usize, transfer: TransferOptions) -> (CacheServer, Layout) {
    let server = CacheServer::start().await;
    let mut c = client(&server);
    c.set_transfer(transfer);
    let layout = Layout::new();
    layout.populate(db_bytes, 7);
    let before = layout.snapshot();
    let receipt = c
        .save(&layout.save_req("opencode-storage-k-1"))
        .await
        .unwrap();
    assert!(receipt.entry_id.is_some());
    let entry = &server.entries()[0];
    assert_eq!(entry.size, Some(receipt.size_bytes));
    assert_eq!(entry.version, version(&layout.paths));

    fs::remove_dir_all(&layout.data).unwrap();
    let outcome = c
        .restore(&layout.restore_req("opencode-storage-k-1", &[]))
        .await
        .unwrap();
    match &outcome {
        RestoreOutcome::Hit {
            matched_key,
            restored,
            rejected,
            size_bytes,
        } => {
            assert_eq!(matched_key, "opencode-storage-k-1");
            assert_eq!(restored.len(), 3);
            assert!(rejected.is_empty());
            assert_eq!(*size_bytes, receipt.size_bytes);
        }
        other => panic!("expected a hit: {other:?}"),
    }
    let mut expected = before;
    expected.remove("auth.json");
    assert_eq!(layout.snapshot(), expected);
    (server, layout)
}

#[tokio::test]
async fn round_trip_1kb_speaks_the_wire_protocol() {
    let (server, layout) = round_trip(1024, TransferOptions::default()).await;
    let create = &server.calls_of(CREATE)[0];
    let body = create.body.as_ref().unwrap();
    assert_eq!(body["key"], "opencode-storage-k-1");
    assert_eq!(body["version"], version(&layout.paths).as_str());
    let fin = &server.calls_of(FINALIZE)[0];
    // int64 goes as a JSON string.
    assert!(fin.body.as_ref().unwrap()["size_bytes"].is_string());
    let put = &server.calls_of(PUT_BLOB)[0];
    assert_eq!(put.status, 201);
    assert!(!put.chunked && put.content_length.is_some());
    // A lookup without restore keys omits the field.
    let lookup = &server.calls_of(LOOKUP)[0];
    assert!(lookup.body.as_ref().unwrap().get("restore_keys").is_none());

    // The SAS signature of a signed URL is a credential: registered as a secret on receipt.
    let c = client(&server);
    let hit = c
        .twirp
        .lookup("opencode-storage-k-1", &[], &version(&layout.paths))
        .await
        .unwrap()
        .unwrap();
    let sig = url::Url::parse(&hit.download_url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "sig")
        .unwrap()
        .1
        .into_owned();
    assert!(!fro_bot::runner::log::redact(&hit.download_url).contains(&sig));
}

#[tokio::test]
async fn round_trip_50mb() {
    let (server, _layout) = round_trip(50 * MIB, TransferOptions::default()).await;
    assert_eq!(server.calls_of(PUT_BLOB).len(), 1);
    assert!(server.calls_of(PUT_BLOCK).is_empty());
}

#[tokio::test]
async fn block_upload_and_ranged_download_when_forced() {
    let transfer = TransferOptions {
        single_put_max: MIB as u64,
        block_size: MIB as u64,
        upload_concurrency: 3,
        ranged_download_min: 1,
        range_size: 700 * 1024,
        download_concurrency: 3,
    };
    let (server, _layout) = round_trip(5 * MIB, transfer).await;
    assert!(server.calls_of(PUT_BLOB).is_empty());
    let blocks = server.calls_of(PUT_BLOCK);
    assert!(blocks.len() >= 5, "{} blocks", blocks.len());
    assert!(blocks.iter().all(|c| c.status == 201 && !c.chunked));
    assert_eq!(server.calls_of(PUT_BLOCK_LIST).len(), 1);
    let gets = server.calls_of(GET_BLOB);
    assert!(gets.len() >= 7);
    assert!(gets.iter().all(|c| c.status == 206 && c.range.is_some()));
}

#[tokio::test]
async fn large_round_trip_over_128mib_uses_blocks() {
    let (server, _layout) = round_trip(140 * MIB, TransferOptions::default()).await;
    assert!(server.calls_of(PUT_BLOB).is_empty());
    assert_eq!(server.calls_of(PUT_BLOCK).len(), 3);
    assert!(server.calls_of(GET_BLOB).iter().all(|c| c.status == 206));
}

#[tokio::test]
async fn restore_keys_and_prefixes_match_like_the_service() {
    let server = CacheServer::start().await;
    let c = client(&server);
    let layout = Layout::new();
    for (i, key) in ["p-1", "p-2", "q-1"].into_iter().enumerate() {
        layout.populate(100, i as u64);
        c.save(&layout.save_req(key)).await.unwrap();
    }
    let rk = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Exact key beats a newer prefix match.
    let o = c.restore(&layout.restore_req("p-1", &[])).await.unwrap();
    assert_eq!(hit_key(&o), "p-1");
    assert!(fs::read_to_string(layout.data.join("fro-bot.json"))
        .unwrap()
        .contains("\"seed\":0"));
    // Prefix: the newest entry wins.
    let keys = rk(&["p-"]);
    let o = c.restore(&layout.restore_req("nope", &keys)).await.unwrap();
    assert_eq!(hit_key(&o), "p-2");
    // The primary key is a prefix too.
    let o = c.restore(&layout.restore_req("p-", &[])).await.unwrap();
    assert_eq!(hit_key(&o), "p-2");
    // Restore keys are tried in order.
    let keys = rk(&["q-", "p-"]);
    let o = c.restore(&layout.restore_req("nope", &keys)).await.unwrap();
    assert_eq!(hit_key(&o), "q-1");
    // Another path list is another version: a miss.
    let other = vec![layout
        .data
        .join("opencode.db")
        .to_string_lossy()
        .into_owned()];
    let req = RestoreRequest {
        key: "p-1",
        restore_keys: &[],
        paths: &other,
        workspace: &layout.workspace,
    };
    assert_eq!(c.restore(&req).await.unwrap(), RestoreOutcome::Miss);
}

#[tokio::test]
async fn second_save_of_a_key_is_already_exists_also_while_pending() {
    let server = CacheServer::start().await;
    let c = client(&server);
    let layout = Layout::new();
    layout.populate(100, 1);
    c.save(&layout.save_req("k")).await.unwrap();
    let err = c.save(&layout.save_req("k")).await.unwrap_err();
    assert!(matches!(err, CacheError::AlreadyExists { .. }), "{err:?}");
    assert!(err.is_rejection());
    // Reserved by another job but not finalized yet.
    c.twirp
        .create("pending", &version(&layout.paths))
        .await
        .unwrap();
    let err = c.save(&layout.save_req("pending")).await.unwrap_err();
    assert!(matches!(err, CacheError::AlreadyExists { .. }), "{err:?}");
    // 409 is not retried.
    assert_eq!(server.calls_of(CREATE).len(), 4);
}

#[tokio::test]
async fn transient_503_is_retried_then_succeeds() {
    let server = CacheServer::start().await;
    let c = client(&server);
    let layout = Layout::new();
    layout.populate(100, 1);
    server.inject(CREATE, [Fault::status(503), Fault::status(502)]);
    server.inject(PUT_BLOB, [Fault::status(503)]);
    server.inject(FINALIZE, [Fault::status(504)]);
    server.inject(LOOKUP, [Fault::garbage(), Fault::status(500)]);
    c.save(&layout.save_req("k")).await.unwrap();
    assert_eq!(server.calls_of(CREATE).len(), 3);
    assert_eq!(server.calls_of(PUT_BLOB).len(), 2);
    assert_eq!(server.calls_of(FINALIZE).len(), 2);
    let o = c.restore(&layout.restore_req("k", &[])).await.unwrap();
    assert_eq!(hit_key(&o), "k");
    assert_eq!(server.calls_of(LOOKUP).len(), 3);
}

#[tokio::test]
async fn server_errors_exhaust_five_attempts() {
    let server = CacheServer::start().await;
    let c = client(&server);
    let layout = Layout::new();
    layout.populate(100, 1);
    server.inject(CREATE, (0..5).map(|_| Fault::status(500)));
    let err = c.save(&layout.save_req("k")).await.unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::Server {
                status: 500,
                attempts: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_rejection());
    server.inject(LOOKUP, (0..5).map(|_| Fault::garbage()));
    let err = c.restore(&layout.restore_req("k", &[])).await.unwrap_err();
    assert!(matches!(err, CacheError::InvalidResponse { .. }), "{err:?}");
    assert_eq!(server.calls_of(LOOKUP).len(), 5);
}

#[tokio::test]
async fn rate_limit_is_not_retried_and_keeps_retry_after() {
    let server = CacheServer::start().await;
    let c = client(&server);
    let layout = Layout::new();
    layout.populate(100, 1);
    server.inject(CREATE, [Fault::rate_limited("60")]);
    let err = c.save(&layout.save_req("k")).await.unwrap_err();
    match &err {
        CacheError::RateLimited { retry_after } => assert_eq!(retry_after.as_deref(), Some("60")),
        other => panic!("{other:?}"),
    }
    assert!(err.is_rejection());
    assert_eq!(server.calls_of(CREATE).len(), 1);
}

#[tokio::test]
async fn each_refusal_has_its_typed_error() {
    let server = CacheServer::start().await;
    let c = client(&server);
    let layout = Layout::new();
    layout.populate(100, 1);

    server.set_read_only(true);
    let err = c.save(&layout.save_req("k")).await.unwrap_err();
    assert!(
        matches!(&err, CacheError::WriteDenied { message } if message.starts_with("cache write denied:")),
        "{err:?}"
    );
    assert!(err.is_rejection());
    server.set_read_only(false);

    server.inject(CREATE, [Fault::quota()]);
    let err = c.save(&layout.save_req("k")).await.unwrap_err();
    assert!(matches!(err, CacheError::Quota { .. }), "{err:?}");
    assert!(err.is_rejection());

    // "ok":"true" (a string) is not ok.
    server.inject(
        CREATE,
        [Fault::body(
            200,
            r#"{"ok":"true","signed_upload_url":"http://x/"}"#,
        )],
    );
    let err = c.save(&layout.save_req("k")).await.unwrap_err();
    assert!(matches!(err, CacheError::NotReserved { .. }), "{err:?}");
    assert!(err.is_rejection());

    server.inject(
        CREATE,
        [Fault::body(
            400,
            r#"{"code":"invalid_argument","msg":"bad key"}"#,
        )],
    );
    let err = c.save(&layout.save_req("k")).await.unwrap_err();
    assert!(
        matches!(&err, CacheError::Http { status: 400, message, .. } if message == "bad key"),
        "{err:?}"
    );
    assert!(!err.is_rejection());

    server.inject(
        FINALIZE,
        [Fault::body(200, r#"{"ok":false,"message":"nope"}"#)],
    );
    let err = c.save(&layout.save_req("k2")).await.unwrap_err();
    assert!(matches!(err, CacheError::NotReserved { .. }), "{err:?}");

    server.set_deny_read(true);
    let err = c.restore(&layout.restore_req("k", &[])).await.unwrap_err();
    assert!(matches!(err, CacheError::ReadDenied { .. }), "{err:?}");
    assert!(!err.is_rejection());
    server.set_deny_read(false);

    // A token the service does not know.
    let mut bad =
        ActionsCacheClient::new(&server.url(), "wrong-token", CacheMode::ReadWrite).unwrap();
    bad.set_retry(fast_retry());
    let err = bad
        .restore(&layout.restore_req("k", &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CacheError::Http { status: 401, .. }),
        "{err:?}"
    );

    // Expired signed URLs fail the upload (403 from the blob store, not retried).
    server.set_expire_urls(true);
    let err = c.save(&layout.save_req("k3")).await.unwrap_err();
    assert!(
        matches!(err, CacheError::Http { status: 403, .. }),
        "{err:?}"
    );
    assert_eq!(
        server
            .calls_of(PUT_BLOB)
            .iter()
            .filter(|c| c.status == 403)
            .count(),
        1
    );
}

#[tokio::test]
async fn modes_nothing_to_save_and_dead_service() {
    let server = CacheServer::start().await;
    let layout = Layout::new();
    layout.populate(100, 1);
    let mut ro = client(&server);
    ro.mode = CacheMode::ReadOnly;
    assert!(matches!(
        ro.save(&layout.save_req("k")).await,
        Err(CacheError::Disabled { .. })
    ));
    let mut wo = client(&server);
    wo.mode = CacheMode::WriteOnly;
    assert!(matches!(
        wo.restore(&layout.restore_req("k", &[])).await,
        Err(CacheError::Disabled { .. })
    ));

    let c = client(&server);
    fs::remove_dir_all(&layout.data).unwrap();
    let err = c.save(&layout.save_req("k")).await.unwrap_err();
    assert!(matches!(err, CacheError::NothingToSave { .. }), "{err:?}");
    assert!(server.calls_of(CREATE).is_empty(), "nothing reserved");

    // Nothing listens on a port we just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut dead = ActionsCacheClient::new(
        &format!("http://127.0.0.1:{port}/"),
        "tok-dead",
        CacheMode::ReadWrite,
    )
    .unwrap();
    dead.set_retry(fast_retry());
    let err = dead
        .restore(&layout.restore_req("k", &[]))
        .await
        .unwrap_err();
    assert!(matches!(err, CacheError::Transport { .. }), "{err:?}");
}

#[tokio::test]
async fn backend_from_env_talks_to_the_service() {
    let server = CacheServer::start().await;
    let layout = Layout::new();
    layout.populate(100, 3);
    let env = fro_bot::runner::Env::from_pairs(server.env_pairs());
    let backend = Backend::from_env(&env).unwrap();
    assert!(backend.can_save() && backend.can_restore());
    backend.save(&layout.save_req("env-key")).await.unwrap();
    let o = backend
        .restore(&layout.restore_req("env-key", &[]))
        .await
        .unwrap();
    assert_eq!(hit_key(&o), "env-key");
}

/// A local tree we must not lose: different content from the cached one.
fn write_local_state(layout: &Layout) -> BTreeMap<String, Vec<u8>> {
    fs::write(layout.data.join("opencode.db"), b"local db").unwrap();
    fs::write(layout.data.join("storage/top.txt"), b"local top").unwrap();
    layout.snapshot()
}

fn no_staging_left(layout: &Layout) {
    for e in fs::read_dir(&layout.data).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.starts_with(".fro-bot-restore-"),
            "staging left: {name}"
        );
    }
}

#[tokio::test]
async fn truncated_download_leaves_local_state_untouched() {
    let server = CacheServer::start().await;
    let c = client(&server);
    let layout = Layout::new();
    layout.populate(256 * 1024, 5);
    c.save(&layout.save_req("k")).await.unwrap();
    let local = write_local_state(&layout);

    // A short blob that claims to be complete: the archive check catches it.
    server.truncate_downloads(1, Truncation::Honest { keep: 100_000 });
    let o = c.restore(&layout.restore_req("k", &[])).await.unwrap();
    assert!(
        matches!(&o, RestoreOutcome::Unrestorable { matched_key, .. } if matched_key == "k"),
        "{o:?}"
    );
    assert_eq!(layout.snapshot(), local);
    no_staging_left(&layout);

    // Connections dropped mid-body on every attempt: a transport error after the retries.
    server.truncate_downloads(5, Truncation::Cut { keep: 1000 });
    let err = c.restore(&layout.restore_req("k", &[])).await.unwrap_err();
    assert!(matches!(err, CacheError::Transport { .. }), "{err:?}");
    assert_eq!(layout.snapshot(), local);

    // One dropped connection is retried and the restore then replaces the local files.
    server.truncate_downloads(1, Truncation::Cut { keep: 1000 });
    let o = c.restore(&layout.restore_req("k", &[])).await.unwrap();
    assert_eq!(hit_key(&o), "k");
    assert_eq!(
        fs::read(layout.data.join("storage/top.txt")).unwrap(),
        b"top"
    );
    assert_ne!(
        fs::read(layout.data.join("opencode.db")).unwrap(),
        b"local db"
    );

    // An error page stored as the blob (served with 200): not an archive, nothing replaced.
    let local = write_local_state(&layout);
    let entry = server.entries()[0].clone();
    fs::write(server.blob_path(&entry), b"<html>oops</html>").unwrap();
    let o = c.restore(&layout.restore_req("k", &[])).await.unwrap();
    assert!(
        matches!(&o, RestoreOutcome::Unrestorable { matched_key, .. } if matched_key == "k"),
        "{o:?}"
    );
    assert_eq!(layout.snapshot(), local);
    no_staging_left(&layout);
}

// ---- hostile archives -------------------------------------------------------------------------

enum Member<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    CharDevice(&'a str),
    Fifo(&'a str),
}

/// Builds a tar.zst with raw names (no sanitizing: that is the point).
fn hostile_archive(dest: &Path, members: &[Member]) {
    let mut tar = tar::Builder::new(Vec::new());
    for m in members {
        let (name, kind, link, data): (&str, tar::EntryType, Option<&str>, &[u8]) = match m {
            Member::File(n, d) => (n, tar::EntryType::Regular, None, d),
            Member::Dir(n) => (n, tar::EntryType::Directory, None, b""),
            Member::Symlink(n, t) => (n, tar::EntryType::Symlink, Some(t), b""),
            Member::HardLink(n, t) => (n, tar::EntryType::Link, Some(t), b""),
            Member::CharDevice(n) => (n, tar::EntryType::Char, None, b""),
            Member::Fifo(n) => (n, tar::EntryType::Fifo, None, b""),
        };
        let mut h = tar::Header::new_ustar();
        let u = h.as_ustar_mut().unwrap();
        u.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            u.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append(&h, data).unwrap();
    }
    let bytes = tar.into_inner().unwrap();
    fs::write(dest, zstd::encode_all(&bytes[..], 3).unwrap()).unwrap();
}

#[tokio::test]
async fn hostile_archives_are_confined() {
    let layout = Layout::new();
    let outside = layout.root.join("outside");
    fs::create_dir_all(&outside).unwrap();
    let abs = format!("{}/abs-x", outside.display());
    // From the workspace, `../home/...` is the data dir; `../../outside` is beside `github/`.
    let d = "../home/.local/share/opencode";
    let good = format!("{d}/storage/ok.txt");
    let traversal = format!("{d}/storage/../../../../../outside/trav-x");
    let traversal2 = "../../outside/trav-y".to_string();
    let link = format!("{d}/storage/link");
    let through_link = format!("{d}/storage/link/evil");
    let hard = format!("{d}/storage/hard");
    let hard_ok = format!("{d}/storage/hard-ok");
    let dev = format!("{d}/storage/dev");
    let fifo = format!("{d}/storage/fifo");
    let outside_str = outside.to_string_lossy().into_owned();
    let archive = layout.root.join("hostile.tzst");
    hostile_archive(
        &archive,
        &[
            Member::Dir(&format!("{d}/storage/")),
            Member::File(&good, b"good"),
            Member::File(&traversal, b"x"),
            Member::File(&traversal2, b"x"),
            Member::File(&abs, b"x"),
            Member::Symlink(&link, &outside_str),
            Member::File(&through_link, b"x"),
            Member::HardLink(&hard, "../../outside/target"),
            Member::HardLink(&hard_ok, &good),
            Member::CharDevice(&dev),
            Member::Fifo(&fifo),
        ],
    );
    fs::write(outside.join("target"), b"target").unwrap();

    // Through the real service and client: planted, looked up, downloaded, extracted.
    let server = CacheServer::start().await;
    server.plant("hostile", &version(&layout.paths), &archive);
    let c = client(&server);
    let o = c
        .restore(&layout.restore_req("hostile", &[]))
        .await
        .unwrap();
    let RestoreOutcome::Hit {
        rejected, restored, ..
    } = o
    else {
        panic!("miss")
    };
    let reason = |name: &str| {
        rejected
            .iter()
            .find(|r| r.name.trim_end_matches('/') == name)
            .map(|r| r.reason.clone())
    };
    assert_eq!(reason(&traversal), Some(RejectReason::OutsideCachePaths));
    assert_eq!(reason(&traversal2), Some(RejectReason::OutsideCachePaths));
    assert_eq!(reason(&abs), Some(RejectReason::AbsolutePath));
    assert_eq!(reason(&link), Some(RejectReason::Symlink));
    assert!(matches!(
        reason(&hard),
        Some(RejectReason::HardLinkOutside { .. })
    ));
    assert!(matches!(reason(&dev), Some(RejectReason::Special { .. })));
    assert!(matches!(reason(&fifo), Some(RejectReason::Special { .. })));
    assert_eq!(rejected.len(), 7, "{rejected:?}");
    assert_eq!(restored, vec![layout.data.join("storage")]);

    // Nothing outside the cache paths changed.
    assert_eq!(
        snapshot(&outside),
        BTreeMap::from([("target".to_string(), b"target".to_vec())])
    );
    // Inside: the good file, the in-archive hard link as a copy, no symlink, no special files.
    let storage = layout.data.join("storage");
    assert_eq!(fs::read(storage.join("ok.txt")).unwrap(), b"good");
    assert_eq!(fs::read(storage.join("hard-ok")).unwrap(), b"good");
    assert!(!fs::symlink_metadata(storage.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(fs::symlink_metadata(storage.join("dev")).is_err());
    assert!(fs::symlink_metadata(storage.join("hard")).is_err());
    assert!(fs::symlink_metadata(storage.join("fifo")).is_err());
    no_staging_left(&layout);
}

#[test]
fn a_corrupt_tail_moves_nothing_into_place() {
    let layout = Layout::new();
    layout.populate(10, 1);
    let local = write_local_state(&layout);
    let d = "../home/.local/share/opencode";
    let archive = layout.root.join("a.tzst");
    let big = random_bytes(300_000, 9);
    hostile_archive(
        &archive,
        &[
            Member::File(&format!("{d}/opencode.db"), b"from archive"),
            Member::File(&format!("{d}/storage/top.txt"), &big),
        ],
    );
    // Flip a byte near the end: the zstd checksum (or the block decoder) must refuse it.
    let mut bytes = fs::read(&archive).unwrap();
    let n = bytes.len();
    bytes[n - 6] ^= 0xff;
    fs::write(&archive, &bytes).unwrap();
    let err = extract_confined(&archive, &layout.paths, &layout.workspace).unwrap_err();
    assert!(matches!(err, CacheError::Archive { .. }), "{err:?}");
    assert_eq!(layout.snapshot(), local);
    no_staging_left(&layout);
}

// ---- interoperability with GNU tar and the toolkit's archive ---------------------------------

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn gnu_tar_reads_our_archive_with_the_toolkits_command() {
    let layout = Layout::new();
    layout.populate(4096, 2);
    let before = layout.snapshot();
    let archive = layout.root.join("cache.tzst");
    let summary = write_archive(&layout.paths, &layout.workspace, &archive).unwrap();
    assert_eq!(summary.included.len(), 3);

    let listing = run(Command::new("tar")
        .args(["--use-compress-program", "unzstd", "-tf"])
        .arg(&archive));
    let names: Vec<&str> = listing.lines().collect();
    let d = "../home/.local/share/opencode";
    assert_eq!(
        names[0],
        format!("{d}/storage/"),
        "directories first: {names:?}"
    );
    for want in [
        format!("{d}/opencode.db"),
        format!("{d}/fro-bot.json"),
        format!("{d}/storage/session/a/s1.json"),
        format!("{d}/storage/empty/"),
    ] {
        assert!(names.contains(&want.as_str()), "{want} not in {names:?}");
    }
    assert!(!listing.contains("auth.json"));

    // The toolkit restores with `tar -xf cache.tzst -P -C $GITHUB_WORKSPACE --use-compress-program unzstd`.
    fs::remove_dir_all(&layout.data).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-P")
        .arg("-C")
        .arg(&layout.workspace)
        .args(["--use-compress-program", "unzstd"]));
    let mut expected = before;
    expected.remove("auth.json");
    assert_eq!(layout.snapshot(), expected);

    // One frame, window within what unzstd accepts without --long.
    let info = run(Command::new("zstd").arg("-lv").arg(&archive));
    assert!(info.contains("# Zstandard Frames: 1"), "{info}");
    assert!(info.contains("Check: XXH64"), "{info}");
}

#[tokio::test]
async fn we_restore_an_archive_made_by_the_toolkits_command() {
    let layout = Layout::new();
    layout.populate(64 * 1024, 4);
    let before = layout.snapshot();
    let tmp = tempfile::tempdir().unwrap();
    let manifest = tmp.path().join("manifest.txt");
    let d = "../home/.local/share/opencode";
    fs::write(
        &manifest,
        format!("{d}/storage\n{d}/opencode.db\n{d}/fro-bot.json\n"),
    )
    .unwrap();
    let archive = tmp.path().join("cache.tzst");
    run(Command::new("tar")
        .current_dir(tmp.path())
        .args([
            "--posix",
            "-cf",
            "cache.tzst",
            "--exclude",
            "cache.tzst",
            "-P",
            "-C",
        ])
        .arg(&layout.workspace)
        .arg("--files-from")
        .arg(&manifest)
        .args(["--use-compress-program", "zstdmt"]));

    let server = CacheServer::start().await;
    server.plant("toolkit-key-1", &version(&layout.paths), &archive);
    write_local_state(&layout);
    let c = client(&server);
    let keys = vec!["toolkit-key-".to_string()];
    let o = c
        .restore(&layout.restore_req("other", &keys))
        .await
        .unwrap();
    let RestoreOutcome::Hit {
        matched_key,
        rejected,
        ..
    } = o
    else {
        panic!("miss")
    };
    assert_eq!(matched_key, "toolkit-key-1");
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(layout.snapshot(), before);
}

// ---- filesystem backend ---------------------------------------------------------------------

#[tokio::test]
async fn fs_backend_matches_like_the_service_and_refuses_duplicates() {
    let store = tempfile::tempdir().unwrap();
    let backend = Backend::Filesystem(FsBackend::new(store.path().join("cache")));
    let layout = Layout::new();
    for (i, key) in ["p-1", "p-2", "q-1"].into_iter().enumerate() {
        layout.populate(1000, i as u64);
        backend.save(&layout.save_req(key)).await.unwrap();
    }
    let err = backend.save(&layout.save_req("p-1")).await.unwrap_err();
    assert!(matches!(err, CacheError::AlreadyExists { .. }), "{err:?}");
    // Exactly one archive per committed entry: the refused save left nothing behind.
    let archives = fs::read_dir(store.path().join("cache"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "tzst")
        })
        .count();
    assert_eq!(archives, 3);

    fs::remove_dir_all(&layout.data).unwrap();
    let rk = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let o = backend
        .restore(&layout.restore_req("p-1", &[]))
        .await
        .unwrap();
    assert_eq!(hit_key(&o), "p-1");
    assert!(fs::read_to_string(layout.data.join("fro-bot.json"))
        .unwrap()
        .contains("\"seed\":0"));
    let keys = rk(&["p-"]);
    let o = backend
        .restore(&layout.restore_req("x", &keys))
        .await
        .unwrap();
    assert_eq!(hit_key(&o), "p-2");
    assert_eq!(
        fs::read(layout.data.join("opencode.db")).unwrap(),
        random_bytes(1000, 1)
    );
    let keys = rk(&["q-", "p-"]);
    let o = backend
        .restore(&layout.restore_req("x", &keys))
        .await
        .unwrap();
    assert_eq!(hit_key(&o), "q-1");
    let keys = rk(&["zzz"]);
    assert_eq!(
        backend
            .restore(&layout.restore_req("x", &keys))
            .await
            .unwrap(),
        RestoreOutcome::Miss
    );
    let other = vec![layout
        .data
        .join("opencode.db")
        .to_string_lossy()
        .into_owned()];
    let req = RestoreRequest {
        key: "p-1",
        restore_keys: &[],
        paths: &other,
        workspace: &layout.workspace,
    };
    assert_eq!(backend.restore(&req).await.unwrap(), RestoreOutcome::Miss);
}

#[tokio::test]
async fn cancellation_stops_a_transfer() {
    let server = CacheServer::start().await;
    let layout = Layout::new();
    layout.populate(100, 1);
    let cancel = fro_bot::runner::Cancellation::new();
    let backend = Backend::Actions(client(&server)).with_cancellation(cancel.clone());
    cancel.cancel_with(
        fro_bot::runner::cancel::Signal::Interrupt,
        std::time::Instant::now(),
    );
    let err = backend.save(&layout.save_req("k")).await.unwrap_err();
    assert!(matches!(err, CacheError::Cancelled), "{err:?}");
    assert!(server.entries().is_empty());
}
