//! The Actions cache client against the in-process cache server, real files, and GNU tar/zstd.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fro_bot::cache::{
    extract_confined, extract_confined_into, version, write_archive, ActionsCacheClient, Backend,
    CacheError, CacheMode, CachePath, FsBackend, PathKind, RejectReason, Rejection, RestoreOutcome,
    RestoreRequest, RetryPolicy, SaveRequest, TransferOptions,
};
use rand::{RngCore, SeedableRng};

use crate::support::cache_server::{
    CacheServer, Fault, Truncation, CREATE, FINALIZE, GET_BLOB, LOOKUP, PUT_BLOB, PUT_BLOCK,
    PUT_BLOCK_LIST,
};
use crate::support::hostile;

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
    targets: Vec<CachePath>,
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
        let targets = fro_bot::memory::state_paths::StatePaths::new(data.clone())
            .restore_targets()
            .to_vec();
        Layout {
            _root: root,
            root: base,
            workspace,
            data,
            paths,
            targets,
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
            paths: &self.targets,
            workspace: &self.workspace,
            into: None,
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
            size_bytes,
        } => {
            assert_eq!(matched_key, "opencode-storage-k-1");
            assert_eq!(restored.len(), 3);
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
    let other = vec![CachePath::file(
        layout.data.join("opencode.db").to_string_lossy(),
    )];
    let req = RestoreRequest {
        key: "p-1",
        restore_keys: &[],
        paths: &other,
        workspace: &layout.workspace,
        into: None,
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
    c.reserve("pending", &version(&layout.paths)).await.unwrap();
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
    let Ok(listing) = fs::read_dir(&layout.data) else {
        return;
    };
    for e in listing {
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

/// Plants `archive` as entry `key` and restores it through the real client and service.
async fn plant_and_restore(
    layout: &Layout,
    archive: &Path,
    key: &str,
) -> Result<RestoreOutcome, CacheError> {
    let server = CacheServer::start().await;
    server.plant(key, &version(&layout.paths), archive);
    client(&server).restore(&layout.restore_req(key, &[])).await
}

#[tokio::test]
async fn each_hostile_member_refuses_the_whole_entry_and_changes_nothing() {
    // The member-level cases (the caps need GiB-sized streams: e2e::hostile runs those through
    // the binary); garbage and long names are cheap, so they run here too.
    let cheap = |c: &hostile::Case| {
        matches!(c.expect, hostile::Expect::Member(_))
            || c.label.starts_with("garbage")
            || c.label.contains("5000 bytes")
    };
    for case in hostile::cases().into_iter().filter(cheap) {
        let layout = Layout::new();
        layout.populate(10, 3);
        let local = write_local_state(&layout);
        let outside = layout.root.join("outside");
        fs::create_dir_all(&outside).unwrap();
        let archive = layout.root.join("hostile.tzst");
        (case.build)(&archive, &outside);
        // Through the service: the entry is unrestorable, the reason names the cap or member.
        match plant_and_restore(&layout, &archive, "hostile").await {
            Ok(RestoreOutcome::Unrestorable { reason, .. }) => assert!(
                reason.starts_with("cache entry refused") && reason.contains(&case.expect.needle()),
                "{}: {reason}",
                case.label
            ),
            other => panic!("{}: {other:?}", case.label),
        }
        // The extractor's typed refusal for the same archive.
        let err =
            extract_confined(&archive, &layout.targets, &layout.workspace).expect_err(case.label);
        assert!(err.is_hostile() && err.is_entry_fault(), "{err:?}");
        let CacheError::Rejected { rejection } = &err else {
            unreachable!()
        };
        match (&case.expect, rejection) {
            (hostile::Expect::Member(want), Rejection::Member { reason, .. }) => {
                assert_eq!(reason, want, "{}", case.label)
            }
            (hostile::Expect::Cap(want), r) => assert_eq!(r.cap(), Some(*want), "{}", case.label),
            (want, got) => panic!("{}: want {want:?}, got {got:?}", case.label),
        }
        // The same refusal when the entry is read beside live memory, for a merge.
        let into = layout.root.join("merge-scratch");
        fs::create_dir_all(&into).unwrap();
        let err = extract_confined_into(&archive, &layout.targets, &layout.workspace, &into)
            .expect_err(case.label);
        assert!(
            err.is_hostile() && err.is_entry_fault(),
            "{}: {err:?}",
            case.label
        );
        assert_eq!(fs::read_dir(&into).unwrap().count(), 0, "{}", case.label);
        // Nothing restored, nothing planted, nothing left staged.
        assert_eq!(layout.snapshot(), local, "{}", case.label);
        assert!(
            hostile::planted_files(&layout.root).is_empty(),
            "{}: {:?}",
            case.label,
            hostile::planted_files(&layout.root)
        );
        no_staging_left(&layout);
    }
}

/// The raw tar inside a [`hostile::TarZst`] entry, for [`extract_tar`] under small limits.
fn raw_tar(build: impl FnOnce(&mut hostile::TarZst)) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.tzst");
    let mut t = hostile::TarZst::create(&path);
    build(&mut t);
    t.end(0, 0);
    zstd::decode_all(&fs::read(&path).unwrap()[..]).unwrap()
}

#[test]
fn every_cap_refuses_the_entry_naming_itself() {
    use fro_bot::cache::{extract_tar, Cap, Limits};
    use hostile::D;
    let small = Limits {
        max_extension_header_bytes: 1024,
        max_headers: 10,
        max_name_bytes: 200,
        max_total_bytes: 64 * 1024,
        max_trailing_bytes: 2048,
        max_duration: Duration::from_secs(60),
    };
    let db = format!("{D}/opencode.db");
    let big_name = format!("{D}/storage/{}", "n".repeat(300));
    let long_component = format!("{D}/storage/{}", "c".repeat(256));
    let cases: Vec<(Cap, Limits, Vec<u8>)> = vec![
        (
            Cap::HeaderSize,
            small,
            raw_tar(|t| {
                t.header(b"././@LongLink", tar::EntryType::GNULongName, 1025, b"")
                    .fill(b'a', 1025)
                    .pad(1025)
                    .file(&db, b"x");
            }),
        ),
        (
            Cap::HeaderSize,
            small,
            raw_tar(|t| {
                t.pax_member(&[("comment", &[b'c'; 1100])], tar::EntryType::Regular, b"x");
            }),
        ),
        (
            Cap::Members,
            small,
            raw_tar(|t| {
                t.dir(&format!("{D}/storage/"));
                for i in 0..10 {
                    t.file(&format!("{D}/storage/f{i}"), b"");
                }
            }),
        ),
        (
            Cap::NameLength,
            small,
            raw_tar(|t| {
                t.pax_member(
                    &[("path", big_name.as_bytes())],
                    tar::EntryType::Regular,
                    b"",
                );
            }),
        ),
        (
            Cap::NameLength,
            Limits::fixed(u64::MAX),
            raw_tar(|t| {
                t.pax_member(
                    &[("path", long_component.as_bytes())],
                    tar::EntryType::Regular,
                    b"",
                );
            }),
        ),
        (
            Cap::TotalSize,
            small,
            raw_tar(|t| {
                t.header(db.as_bytes(), tar::EntryType::Regular, 1 << 30, b"");
            }),
        ),
        (
            // Hard-link copies count: 3 × 24 KiB of data is over 64 KiB only with the copies.
            Cap::TotalSize,
            small,
            raw_tar(|t| {
                let f = format!("{D}/storage/f");
                t.dir(&format!("{D}/storage/"))
                    .file(&f, &[7u8; 24 * 1024])
                    .header(
                        format!("{D}/storage/l1").as_bytes(),
                        tar::EntryType::Link,
                        0,
                        f.as_bytes(),
                    )
                    .header(
                        format!("{D}/storage/l2").as_bytes(),
                        tar::EntryType::Link,
                        0,
                        f.as_bytes(),
                    );
            }),
        ),
        (
            Cap::TrailingData,
            small,
            raw_tar(|t| {
                t.file(&db, b"db").fill(0, 3 * 1024);
            }),
        ),
        (
            Cap::Time,
            Limits {
                max_duration: Duration::ZERO,
                ..small
            },
            raw_tar(|t| {
                t.file(&db, b"db");
            }),
        ),
    ];
    for (i, (cap, limits, tar)) in cases.into_iter().enumerate() {
        let layout = Layout::new();
        let err = extract_tar(&tar[..], &layout.targets, &layout.workspace, limits)
            .expect_err(&format!("case {i} ({cap})"));
        let CacheError::Rejected { rejection } = &err else {
            panic!("case {i}: {err:?}")
        };
        assert_eq!(rejection.cap(), Some(cap), "case {i}: {err}");
        assert!(err.to_string().contains(&format!("{cap} cap")), "{err}");
        assert!(layout.snapshot().is_empty(), "case {i}");
        no_staging_left(&layout);
    }
    // Within the caps, the same shapes restore: a hard link is a copy.
    let layout = Layout::new();
    let f = format!("{D}/storage/f");
    let tar = raw_tar(|t| {
        t.dir(&format!("{D}/storage/"))
            .file(&f, &[7u8; 20 * 1024])
            .header(
                format!("{D}/storage/l1").as_bytes(),
                tar::EntryType::Link,
                0,
                f.as_bytes(),
            )
            .file(&db, b"db")
            .fill(0, 1024);
    });
    let report = extract_tar(&tar[..], &layout.targets, &layout.workspace, small).unwrap();
    assert_eq!(report.files, 3);
    assert_eq!(report.restored.len(), 2);
    assert_eq!(
        fs::read(layout.data.join("storage/l1")).unwrap(),
        vec![7u8; 20 * 1024]
    );
    assert_eq!(fs::read(layout.data.join("opencode.db")).unwrap(), b"db");
}

#[test]
fn kinds_are_what_the_paths_say() {
    use fro_bot::cache::extract_tar;
    use hostile::D;
    let limits = fro_bot::cache::Limits::fixed(u64::MAX);
    // A directory cache path given a file, a file path given a hard link: refused.
    for (tar, want) in [
        (
            raw_tar(|t| {
                t.file(&format!("{D}/storage"), b"x");
            }),
            RejectReason::WrongKind {
                expected: PathKind::Directory,
                found: "file".into(),
            },
        ),
        (
            raw_tar(|t| {
                let f = format!("{D}/storage/f");
                t.dir(&format!("{D}/storage/")).file(&f, b"x").header(
                    format!("{D}/opencode.db").as_bytes(),
                    tar::EntryType::Link,
                    0,
                    f.as_bytes(),
                );
            }),
            RejectReason::WrongKind {
                expected: PathKind::File,
                found: "hard link".into(),
            },
        ),
        (
            raw_tar(|t| {
                t.file(&format!("{D}/opencode.db"), b"1")
                    .file(&format!("{D}/opencode.db"), b"2");
            }),
            RejectReason::Duplicate,
        ),
        (
            raw_tar(|t| {
                t.dir(&format!("{D}/storage/"))
                    .file(&format!("{D}/storage/a"), b"1")
                    .file(&format!("{D}/storage/a/b"), b"2");
            }),
            RejectReason::BelowAFile,
        ),
        (
            raw_tar(|t| {
                t.file(&format!("{D}/storage//x"), b"1");
            }),
            RejectReason::NotCanonical,
        ),
    ] {
        let layout = Layout::new();
        let err = extract_tar(&tar[..], &layout.targets, &layout.workspace, limits).unwrap_err();
        match &err {
            CacheError::Rejected {
                rejection: Rejection::Member { reason, .. },
            } => assert_eq!(reason, &want),
            other => panic!("{other:?}"),
        }
        assert!(layout.snapshot().is_empty());
    }
}

#[test]
fn invalid_tar_is_refused_as_malformed() {
    use fro_bot::cache::extract_tar;
    let limits = fro_bot::cache::Limits::fixed(u64::MAX);
    let good = raw_tar(|t| {
        t.file(&format!("{}/opencode.db", hostile::D), b"db");
    });
    let mut bad_checksum = good.clone();
    bad_checksum[10] ^= 1;
    let bad_pax = raw_tar(|t| {
        t.header(b"pax", tar::EntryType::XHeader, 8, b"")
            .bytes(b"9 path=x")
            .pad(8)
            .file(&format!("{}/opencode.db", hostile::D), b"db");
    });
    for tar in [bad_checksum, bad_pax] {
        let layout = Layout::new();
        let err = extract_tar(&tar[..], &layout.targets, &layout.workspace, limits).unwrap_err();
        assert!(
            matches!(
                &err,
                CacheError::Rejected {
                    rejection: Rejection::Malformed { .. }
                }
            ),
            "{err:?}"
        );
        assert!(layout.snapshot().is_empty());
    }
    // The unmodified stream restores.
    let layout = Layout::new();
    extract_tar(&good[..], &layout.targets, &layout.workspace, limits).unwrap();
    assert_eq!(fs::read(layout.data.join("opencode.db")).unwrap(), b"db");
}

/// From the archive fuzz target's only finding (a harness bug, kept as a regression test): an
/// empty stream is an empty archive, restoring nothing and creating nothing.
#[test]
fn an_empty_stream_restores_nothing() {
    let layout = Layout::new();
    let limits = fro_bot::cache::Limits::fixed(u64::MAX);
    let report =
        fro_bot::cache::extract_tar(&[][..], &layout.targets, &layout.workspace, limits).unwrap();
    assert!(report.restored.is_empty() && report.files == 0);
    assert!(!layout.data.exists());
}

#[test]
fn a_corrupt_tail_moves_nothing_into_place() {
    let layout = Layout::new();
    layout.populate(10, 1);
    let local = write_local_state(&layout);
    let d = hostile::D;
    let archive = layout.root.join("a.tzst");
    let big = random_bytes(300_000, 9);
    let mut t = hostile::TarZst::create(&archive);
    t.file(&format!("{d}/opencode.db"), b"from archive")
        .dir(&format!("{d}/storage/"))
        .file(&format!("{d}/storage/top.txt"), &big);
    t.end(0, 0);
    // Flip a byte near the end: the zstd checksum (or the block decoder) must refuse it.
    let mut bytes = fs::read(&archive).unwrap();
    let n = bytes.len();
    bytes[n - 6] ^= 0xff;
    fs::write(&archive, &bytes).unwrap();
    let err = extract_confined(&archive, &layout.targets, &layout.workspace).unwrap_err();
    assert!(matches!(err, CacheError::Archive { .. }), "{err:?}");
    assert!(err.is_entry_fault() && !err.is_hostile());
    assert_eq!(layout.snapshot(), local);
    no_staging_left(&layout);
}

/// An entry read beside live memory (the cache merge): each target lands under `into` by its file
/// name, and live memory stays exactly as it was.
#[test]
fn an_entry_extracted_into_a_scratch_dir_leaves_live_memory_alone() {
    let layout = Layout::new();
    layout.populate(2, 1);
    let local = write_local_state(&layout);
    let d = hostile::D;
    let archive = layout.root.join("into.tzst");
    let mut t = hostile::TarZst::create(&archive);
    t.file(&format!("{d}/opencode.db"), b"their db")
        .file(&format!("{d}/fro-bot.json"), b"{}")
        .dir(&format!("{d}/storage/"))
        .file(&format!("{d}/storage/top.txt"), b"their top");
    t.end(0, 0);
    let into = layout.root.join("scratch");
    fs::create_dir_all(&into).unwrap();
    extract_confined_into(&archive, &layout.targets, &layout.workspace, &into).unwrap();
    assert_eq!(fs::read(into.join("opencode.db")).unwrap(), b"their db");
    assert_eq!(fs::read(into.join("fro-bot.json")).unwrap(), b"{}");
    assert_eq!(
        fs::read(into.join("storage/top.txt")).unwrap(),
        b"their top"
    );
    assert_eq!(layout.snapshot(), local, "live memory untouched");
}

#[test]
fn a_window_over_the_decoder_cap_is_refused() {
    // A frame whose window exceeds WINDOW_LOG_MAX would make the decoder's buffer grow to it. The
    // content is larger than the window, so the encoder cannot shrink it.
    let layout = Layout::new();
    let archive = layout.root.join("w.tzst");
    let log = fro_bot::cache::WINDOW_LOG_MAX + 2;
    let tar = raw_tar(|t| {
        t.header(
            format!("{}/opencode.db", hostile::D).as_bytes(),
            tar::EntryType::Regular,
            2 << log,
            b"",
        )
        .fill(0, 2 << log);
    });
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.window_log(log).unwrap();
    std::io::Write::write_all(&mut enc, &tar).unwrap();
    fs::write(&archive, enc.finish().unwrap()).unwrap();
    let err = extract_confined(&archive, &layout.targets, &layout.workspace).unwrap_err();
    assert!(matches!(err, CacheError::Archive { .. }), "{err:?}");
    assert!(layout.snapshot().is_empty());
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
    let RestoreOutcome::Hit { matched_key, .. } = o else {
        panic!("miss")
    };
    assert_eq!(matched_key, "toolkit-key-1");
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
    let other = vec![CachePath::file(
        layout.data.join("opencode.db").to_string_lossy(),
    )];
    let req = RestoreRequest {
        key: "p-1",
        restore_keys: &[],
        paths: &other,
        workspace: &layout.workspace,
        into: None,
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

// ---- cache service v1 (Enterprise Server) -----------------------------------------------------

mod v1 {
    use std::sync::{Arc, Mutex};

    use fro_bot::cache::{ChunkOptions, Protocol};

    use super::*;
    use crate::support::cache_server::{HEAD_BLOB, LOOKUP as V2_LOOKUP};
    use crate::support::cache_server_v1::{V1_COMMIT, V1_LOOKUP, V1_RESERVE, V1_UPLOAD};
    use crate::support::services::required_env;

    /// The v1 client at the server's `ACTIONS_CACHE_URL`, with millisecond retries.
    pub(super) fn client_v1(server: &CacheServer) -> ActionsCacheClient {
        let mut c = ActionsCacheClient::v1(&server.v1_url(), &server.token(), CacheMode::ReadWrite)
            .unwrap();
        c.set_retry(RetryPolicy {
            attempts: 2,
            ..fast_retry()
        });
        c
    }

    fn no_v2_calls(server: &CacheServer) {
        for op in [CREATE, FINALIZE, V2_LOOKUP, PUT_BLOB, PUT_BLOCK] {
            assert!(server.calls_of(op).is_empty(), "a v2 call: {op}");
        }
    }

    #[tokio::test]
    async fn round_trip_in_chunks_speaks_the_v1_protocol() {
        let server = CacheServer::start().await;
        let mut c = client_v1(&server);
        let chunk = 256 * 1024;
        c.set_chunks(ChunkOptions {
            chunk_size: chunk,
            concurrency: 3,
        });
        let layout = Layout::new();
        layout.populate(MIB, 11);
        let before = layout.snapshot();
        let receipt = c
            .save(&layout.save_req("opencode-storage-k-1"))
            .await
            .unwrap();
        let size = receipt.size_bytes;
        let entry = &server.entries()[0];
        assert!(entry.finalized && entry.size == Some(size));
        assert_eq!(receipt.entry_id, Some(entry.id));

        let reserve = &server.calls_of(V1_RESERVE)[0];
        let body = reserve.body.as_ref().unwrap();
        assert_eq!(body["key"], "opencode-storage-k-1");
        assert_eq!(body["version"], version(&layout.paths).as_str());
        assert_eq!(body["cacheSize"], size);
        assert_eq!(reserve.base, Some(server.v1_tenant()));
        // Every chunk a PATCH with its exact range and length, none chunked-encoded.
        let uploads = server.calls_of(V1_UPLOAD);
        assert_eq!(uploads.len() as u64, size.div_ceil(chunk));
        assert!(uploads.len() >= 4, "{}", uploads.len());
        let mut ranges: Vec<String> = uploads.iter().map(|u| u.range.clone().unwrap()).collect();
        ranges.sort_by_key(|r| r[6..].split('-').next().unwrap().parse::<u64>().unwrap());
        for (i, (u, r)) in uploads.iter().zip(&ranges).enumerate() {
            let a = i as u64 * chunk;
            let b = (a + chunk).min(size) - 1;
            assert_eq!(r, &format!("bytes {a}-{b}/*"));
            assert!(u.status == 204 && !u.chunked && u.content_length.is_some());
        }
        assert_eq!(
            server.calls_of(V1_COMMIT)[0].body.as_ref().unwrap()["size"],
            size
        );

        fs::remove_dir_all(&layout.data).unwrap();
        let keys = vec!["opencode-storage-".to_string()];
        let o = c
            .restore(&layout.restore_req("opencode-storage-k-9", &keys))
            .await
            .unwrap();
        assert_eq!(hit_key(&o), "opencode-storage-k-1");
        let mut expected = before;
        expected.remove("auth.json");
        assert_eq!(layout.snapshot(), expected);
        // One lookup naming both keys; the archive fetched with one plain GET.
        let lookup = server.calls_of(V1_LOOKUP).pop().unwrap();
        let q = lookup.body.unwrap();
        assert_eq!(q["keys"], "opencode-storage-k-9,opencode-storage-");
        assert_eq!(q["version"], version(&layout.paths).as_str());
        assert_eq!(server.calls_of(GET_BLOB).len(), 1);
        assert!(server.calls_of(HEAD_BLOB).is_empty());
        no_v2_calls(&server);

        // A miss is a 204.
        let o = c.restore(&layout.restore_req("other", &[])).await.unwrap();
        assert_eq!(o, RestoreOutcome::Miss);
        assert_eq!(server.calls_of(V1_LOOKUP).pop().unwrap().status, 204);
    }

    #[tokio::test]
    async fn a_second_save_of_a_key_is_already_exists_also_while_pending() {
        let server = CacheServer::start().await;
        let c = client_v1(&server);
        let layout = Layout::new();
        layout.populate(100, 1);
        c.save(&layout.save_req("k")).await.unwrap();
        let err = c.save(&layout.save_req("k")).await.unwrap_err();
        assert!(
            matches!(&err, CacheError::AlreadyExists { key } if key.starts_with("Cache already exists.")),
            "{err:?}"
        );
        assert!(err.is_rejection());
        // Reserved by another job that never committed.
        c.reserve("pending", &version(&layout.paths)).await.unwrap();
        let err = c.save(&layout.save_req("pending")).await.unwrap_err();
        assert!(matches!(err, CacheError::AlreadyExists { .. }), "{err:?}");
        // A 409 is not retried.
        assert_eq!(server.calls_of(V1_RESERVE).len(), 4);
        assert_eq!(
            server
                .calls_of(V1_RESERVE)
                .iter()
                .filter(|c| c.status == 409)
                .count(),
            2
        );
    }

    #[tokio::test]
    async fn gateway_errors_are_retried_but_not_500_or_429() {
        let server = CacheServer::start().await;
        let mut c = client_v1(&server);
        c.set_chunks(ChunkOptions {
            chunk_size: 1024,
            concurrency: 2,
        });
        let layout = Layout::new();
        layout.populate(4096, 1);
        // One 503, 502 or 504 on every kind of call: the second attempt succeeds.
        server.inject(V1_RESERVE, [Fault::status(503)]);
        server.inject(V1_UPLOAD, [Fault::status(502)]);
        server.inject(V1_COMMIT, [Fault::status(504)]);
        c.save(&layout.save_req("k")).await.unwrap();
        assert_eq!(server.calls_of(V1_RESERVE).len(), 2);
        assert_eq!(server.calls_of(V1_COMMIT).len(), 2);
        let uploads = server.calls_of(V1_UPLOAD);
        assert_eq!(uploads.iter().filter(|u| u.status == 502).count(), 1);
        server.inject(V1_LOOKUP, [Fault::status(503)]);
        let o = c.restore(&layout.restore_req("k", &[])).await.unwrap();
        assert_eq!(hit_key(&o), "k");

        // Two 503s exhaust the two attempts.
        server.inject(V1_RESERVE, [Fault::status(503), Fault::status(503)]);
        let err = c.save(&layout.save_req("k2")).await.unwrap_err();
        assert!(
            matches!(
                err,
                CacheError::Server {
                    status: 503,
                    attempts: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!err.is_rejection());
        // 500 fails at once, as the toolkit does.
        let before = server.calls_of(V1_RESERVE).len();
        server.inject(V1_RESERVE, [Fault::status(500)]);
        let err = c.save(&layout.save_req("k3")).await.unwrap_err();
        assert!(
            matches!(
                err,
                CacheError::Server {
                    status: 500,
                    attempts: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(server.calls_of(V1_RESERVE).len(), before + 1);
        // 429 is a rate limit, not retried, keeping Retry-After: rejected like v2's.
        server.inject(V1_RESERVE, [Fault::rate_limited("60")]);
        let err = c.save(&layout.save_req("k4")).await.unwrap_err();
        match &err {
            CacheError::RateLimited { retry_after } => {
                assert_eq!(retry_after.as_deref(), Some("60"))
            }
            other => panic!("{other:?}"),
        }
        assert!(err.is_rejection());
        assert_eq!(server.calls_of(V1_RESERVE).len(), before + 2);
        // A chunk rate-limited mid-upload: the save fails, nothing is committed under the key.
        server.inject(V1_UPLOAD, [Fault::rate_limited("5")]);
        let err = c.save(&layout.save_req("k5")).await.unwrap_err();
        assert!(matches!(err, CacheError::RateLimited { .. }), "{err:?}");
        assert!(!server
            .entries()
            .iter()
            .any(|e| e.key == "k5" && e.finalized));
    }

    #[tokio::test]
    async fn each_refusal_has_the_typed_error_v2_gives_it() {
        let server = CacheServer::start().await;
        let c = client_v1(&server);
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

        // The toolkit reads a 400 on reserve as the entry being over the size cap.
        server.inject(
            V1_RESERVE,
            [Fault::body(
                400,
                r#"{"message":"Cache size of ~11000 MB is over the limit"}"#,
            )],
        );
        let err = c.save(&layout.save_req("k")).await.unwrap_err();
        assert!(matches!(err, CacheError::Quota { .. }), "{err:?}");
        assert!(err.is_rejection());

        // A reservation without an id.
        server.inject(V1_RESERVE, [Fault::body(201, "{}")]);
        let err = c.save(&layout.save_req("k")).await.unwrap_err();
        assert!(matches!(err, CacheError::NotReserved { .. }), "{err:?}");

        // A commit the service refuses (chunks that do not add up): nothing visible.
        server.inject(
            V1_COMMIT,
            [Fault::body(400, r#"{"message":"size mismatch"}"#)],
        );
        let err = c.save(&layout.save_req("k2")).await.unwrap_err();
        assert!(
            matches!(&err, CacheError::Http { status: 400, message, .. } if message == "size mismatch"),
            "{err:?}"
        );
        assert!(!err.is_rejection());

        server.set_deny_read(true);
        let err = c.restore(&layout.restore_req("k", &[])).await.unwrap_err();
        assert!(matches!(err, CacheError::ReadDenied { .. }), "{err:?}");
        server.set_deny_read(false);

        // An error page answered with 200, on every attempt.
        server.inject(V1_LOOKUP, [Fault::garbage(), Fault::garbage()]);
        let err = c.restore(&layout.restore_req("k", &[])).await.unwrap_err();
        assert!(matches!(err, CacheError::InvalidResponse { .. }), "{err:?}");

        let mut bad =
            ActionsCacheClient::v1(&server.v1_url(), "wrong-token", CacheMode::ReadWrite).unwrap();
        bad.set_retry(fast_retry());
        let err = bad
            .restore(&layout.restore_req("k", &[]))
            .await
            .unwrap_err();
        assert!(
            matches!(err, CacheError::Http { status: 401, .. }),
            "{err:?}"
        );
    }

    /// A server elsewhere that records what reaches it and serves `body`.
    async fn elsewhere(body: &'static [u8]) -> (String, Arc<Mutex<Vec<axum::http::HeaderMap>>>) {
        let seen: Arc<Mutex<Vec<axum::http::HeaderMap>>> = Arc::default();
        let log = seen.clone();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(headers);
                body
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}"), seen)
    }

    #[tokio::test]
    async fn a_hostile_lookup_answer_changes_nothing_and_gets_no_token() {
        let server = CacheServer::start().await;
        let c = client_v1(&server);
        let layout = Layout::new();
        layout.populate(100, 1);
        let local = write_local_state(&layout);
        let hit = |location: &str| {
            Fault::body(
                200,
                &serde_json::json!({"cacheKey": "k", "archiveLocation": location}).to_string(),
            )
        };
        // Not an http(s) location: refused before anything is fetched.
        for odd in [
            "file:///etc/passwd",
            "/_apis/artifactcache/x",
            "ftp://h/x",
            "",
        ] {
            server.inject(V1_LOOKUP, [hit(odd)]);
            let err = c.restore(&layout.restore_req("k", &[])).await.unwrap_err();
            assert!(
                matches!(err, CacheError::InvalidResponse { .. }),
                "{odd}: {err:?}"
            );
            assert_eq!(layout.snapshot(), local);
        }
        // Another host: fetched without the runtime token; what it serves is no archive.
        let (other, seen) = elsewhere(b"<html>not an archive</html>").await;
        let location = format!("{other}/a.tzst?X-Amz-Signature=deadbeefcafe0123&X-Amz-Date=1");
        server.inject(V1_LOOKUP, [hit(&location)]);
        let o = c.restore(&layout.restore_req("k", &[])).await.unwrap();
        assert!(
            matches!(&o, RestoreOutcome::Unrestorable { matched_key, .. } if matched_key == "k"),
            "{o:?}"
        );
        assert_eq!(layout.snapshot(), local);
        no_staging_left(&layout);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].get("authorization").is_none(), "{:?}", seen[0]);
        assert!(!format!("{seen:?}").contains(&server.token()));
        // The location's signature, and the location itself, are secrets from then on.
        let redacted = fro_bot::runner::log::redact(&format!("GET {location} failed"));
        assert!(!redacted.contains("deadbeefcafe0123"), "{redacted}");
        assert!(!fro_bot::runner::log::redact(&server.token()).contains(&server.token()));
    }

    #[tokio::test]
    async fn a_short_or_cut_download_changes_nothing() {
        let server = CacheServer::start().await;
        let c = client_v1(&server);
        let layout = Layout::new();
        layout.populate(256 * 1024, 5);
        c.save(&layout.save_req("k")).await.unwrap();
        let local = write_local_state(&layout);
        // A short archive that claims to be complete: the archive check catches it.
        server.truncate_downloads(1, Truncation::Honest { keep: 100_000 });
        let o = c.restore(&layout.restore_req("k", &[])).await.unwrap();
        assert!(matches!(o, RestoreOutcome::Unrestorable { .. }), "{o:?}");
        assert_eq!(layout.snapshot(), local);
        // Cut on both attempts: a transport error; cut once: retried, then restored.
        server.truncate_downloads(2, Truncation::Cut { keep: 1000 });
        let err = c.restore(&layout.restore_req("k", &[])).await.unwrap_err();
        assert!(matches!(err, CacheError::Transport { .. }), "{err:?}");
        assert_eq!(layout.snapshot(), local);
        no_staging_left(&layout);
        server.truncate_downloads(1, Truncation::Cut { keep: 1000 });
        let o = c.restore(&layout.restore_req("k", &[])).await.unwrap();
        assert_eq!(hit_key(&o), "k");
        assert_ne!(layout.snapshot(), local);
    }

    #[tokio::test]
    async fn hostile_and_oversized_entries_are_refused_as_on_v2() {
        let cheap = |c: &hostile::Case| {
            matches!(c.expect, hostile::Expect::Member(_)) || c.label.starts_with("garbage")
        };
        let layout = Layout::new();
        let mut cases: Vec<(String, PathBuf, String)> = Vec::new();
        for (i, case) in hostile::cases().into_iter().filter(cheap).enumerate() {
            let outside = layout.root.join(format!("outside-{i}"));
            fs::create_dir_all(&outside).unwrap();
            let archive = layout.root.join(format!("hostile-{i}.tzst"));
            (case.build)(&archive, &outside);
            cases.push((case.label.to_string(), archive, case.expect.needle()));
        }
        // Over the total-size cap: a database that declares 4 GiB (refused at its header, before
        // a byte is written).
        let oversized = layout.root.join("oversized.tzst");
        let mut t = hostile::TarZst::create(&oversized);
        t.header(
            format!("{}/opencode.db", hostile::D).as_bytes(),
            tar::EntryType::Regular,
            4 << 30,
            b"",
        )
        .fill(0, 1 << 20);
        t.end(0, 0);
        cases.push(("oversized".into(), oversized, "total-size".into()));

        let server = CacheServer::start().await;
        let c = client_v1(&server);
        for (i, (label, archive, needle)) in cases.iter().enumerate() {
            layout.populate(10, 3);
            let local = write_local_state(&layout);
            let key = format!("hostile-{i}");
            server.plant(&key, &version(&layout.paths), archive);
            match c.restore(&layout.restore_req(&key, &[])).await {
                Ok(RestoreOutcome::Unrestorable { reason, .. }) => assert!(
                    reason.starts_with("cache entry refused") && reason.contains(needle.as_str()),
                    "{label}: {reason}"
                ),
                other => panic!("{label}: {other:?}"),
            }
            assert_eq!(layout.snapshot(), local, "{label}");
            no_staging_left(&layout);
        }
        assert!(hostile::planted_files(&layout.root).is_empty());
        no_v2_calls(&server);
    }

    #[tokio::test]
    async fn an_enterprise_runner_with_only_the_cache_url_gets_v1() {
        let server = CacheServer::start().await;
        let layout = Layout::new();
        layout.populate(100, 3);
        let mut env = fro_bot::runner::Env::from_pairs(server.env_pairs_v1());
        env.set("GITHUB_SERVER_URL", "https://ghes.example");
        let backend = Backend::from_env(&env).unwrap();
        let Backend::Actions(client) = &backend else {
            unreachable!()
        };
        assert_eq!(client.protocol(), Protocol::V1);
        backend.save(&layout.save_req("env-key")).await.unwrap();
        assert!(backend.has_entry("env-key", &layout.paths).await.unwrap());
        assert!(!backend.has_entry("env-k", &layout.paths).await.unwrap());
        let o = backend
            .restore_exact(&layout.restore_req("env-key", &[]))
            .await
            .unwrap();
        assert_eq!(hit_key(&o), "env-key");
        assert_eq!(server.calls_of(V1_COMMIT).len(), 1);
        no_v2_calls(&server);
    }

    /// Runs the pinned `@actions/cache` (tests/it/fixtures/toolkit_cache.mjs) against `server` as
    /// an Enterprise Server runner's JavaScript action would: v1, only `ACTIONS_CACHE_URL`.
    async fn toolkit(server: &CacheServer, layout: &Layout, mode: &str, key: &str) -> String {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures/toolkit_cache.mjs");
        let temp = layout.root.join("runner_temp");
        fs::create_dir_all(&temp).unwrap();
        let out = tokio::process::Command::new("node")
            .arg(script)
            .args([mode, key])
            .args(&layout.paths)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(
                "FRO_BOT_TEST_ACTIONS_CACHE",
                required_env("FRO_BOT_TEST_ACTIONS_CACHE"),
            )
            .env("GITHUB_SERVER_URL", "https://ghes.example")
            .env("ACTIONS_CACHE_URL", server.v1_url())
            .env("ACTIONS_RUNTIME_TOKEN", server.token())
            .env("GITHUB_WORKSPACE", &layout.workspace)
            .env("RUNNER_TEMP", &temp)
            // Several chunks in flight, as a large entry would go.
            .env("CACHE_UPLOAD_CHUNK_SIZE", "1")
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "toolkit {mode} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    #[tokio::test]
    async fn the_toolkit_in_v1_mode_and_fro_bot_restore_each_others_entries() {
        let server = CacheServer::start().await;
        let mut c = client_v1(&server);
        c.set_chunks(ChunkOptions {
            chunk_size: MIB as u64,
            concurrency: 4,
        });
        let layout = Layout::new();

        // The toolkit saves (in 1 MiB chunks), fro-bot restores: byte-identical files.
        layout.populate(3 * MIB + 123, 21);
        let mut saved = layout.snapshot();
        saved.remove("auth.json");
        toolkit(&server, &layout, "save", "opencode-storage-toolkit-1").await;
        let uploads = server.calls_of(V1_UPLOAD);
        assert!(uploads.len() >= 3 && uploads.iter().all(|u| u.status == 204));
        fs::remove_dir_all(&layout.data).unwrap();
        let o = c
            .restore(&layout.restore_req("opencode-storage-toolkit-1", &[]))
            .await
            .unwrap();
        assert_eq!(hit_key(&o), "opencode-storage-toolkit-1");
        assert_eq!(layout.snapshot(), saved);

        // fro-bot saves, the toolkit restores: byte-identical files.
        layout.populate(2 * MIB + 7, 22);
        let mut saved = layout.snapshot();
        saved.remove("auth.json");
        c.save(&layout.save_req("opencode-storage-fro-bot-2"))
            .await
            .unwrap();
        fs::remove_dir_all(&layout.data).unwrap();
        let out = toolkit(&server, &layout, "restore", "opencode-storage-fro-bot-2").await;
        assert!(
            out.contains(r#"{"hit":"opencode-storage-fro-bot-2"}"#),
            "{out}"
        );
        assert_eq!(layout.snapshot(), saved);
        no_v2_calls(&server);
    }
}
