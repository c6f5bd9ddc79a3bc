//! Integration tests: object_store, on the real SeaweedFS `scripts/test` starts (SigV4 enforced).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use fro_bot::object_store::{
    publish_session_db, restore_session_db, upload_run_artifacts, upload_run_metadata,
    ArtifactsOutcome, Condition, DeleteOutcome, GetOutcome, ObjectKind, PublishOutcome, PutOutcome,
    StoreError, StoreRestore, UploadOutcome,
};

use crate::support::s3;
use fro_bot::lease::Clock;

fn etag_of(out: PutOutcome) -> String {
    match out {
        PutOutcome::Written { etag } => etag,
        PutOutcome::PreconditionFailed => panic!("expected a write"),
    }
}

async fn body_of(store: &fro_bot::object_store::ObjectStore, key: &str) -> Option<Bytes> {
    match store.get_bytes(key).await.unwrap() {
        GetOutcome::Found(b) => Some(b.bytes),
        GetOutcome::NotFound => None,
    }
}

#[tokio::test]
async fn conditional_put_and_delete_semantics() {
    let (store, keys) = s3::fresh("cond").await;
    let key = keys.lease().to_string();
    let b = |s: &'static str| Bytes::from_static(s.as_bytes());
    let k = ObjectKind::LeaseRecord;

    let e1 = etag_of(
        store
            .put_bytes(&key, b("one"), Condition::IfAbsent, k)
            .await
            .unwrap(),
    );
    assert!(!e1.is_empty());
    assert_eq!(
        store
            .put_bytes(&key, b("two"), Condition::IfAbsent, k)
            .await
            .unwrap(),
        PutOutcome::PreconditionFailed
    );
    let e2 = etag_of(
        store
            .put_bytes(&key, b("two"), Condition::IfMatch(&e1), k)
            .await
            .unwrap(),
    );
    assert_ne!(e1, e2);
    // A stale ETag loses and the object keeps the newer body.
    assert_eq!(
        store
            .put_bytes(&key, b("three"), Condition::IfMatch(&e1), k)
            .await
            .unwrap(),
        PutOutcome::PreconditionFailed
    );
    assert_eq!(body_of(&store, &key).await.as_deref(), Some(&b"two"[..]));
    match store.get_bytes(&key).await.unwrap() {
        GetOutcome::Found(body) => {
            assert_eq!(body.etag, e2);
            let lm = body.last_modified_ms.expect("LastModified");
            let now = fro_bot::lease::SystemClock.now_ms();
            assert!(lm <= now + 2_000 && lm + 60_000 > now, "{lm} vs {now}");
        }
        GetOutcome::NotFound => panic!("missing"),
    }
    // Conditional delete: wrong ETag keeps the object, right ETag removes it.
    assert_eq!(
        store.delete(&key, Condition::IfMatch(&e1)).await.unwrap(),
        DeleteOutcome::PreconditionFailed
    );
    assert!(body_of(&store, &key).await.is_some());
    assert_eq!(
        store.delete(&key, Condition::IfMatch(&e2)).await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(body_of(&store, &key).await.is_none());
    // If-Match on a missing key means "lost", for put and delete.
    assert_eq!(
        store
            .put_bytes(&key, b("x"), Condition::IfMatch(&e2), k)
            .await
            .unwrap(),
        PutOutcome::PreconditionFailed
    );
    assert_eq!(
        store.delete(&key, Condition::IfMatch(&e2)).await.unwrap(),
        DeleteOutcome::PreconditionFailed
    );
    assert!(body_of(&store, &key).await.is_none());
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn concurrent_publishers_from_one_etag_one_wins_store_keeps_winner() {
    let (store, keys) = s3::fresh("pub").await;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.db");
    write(&base, b"base session db");
    let e0 = match publish_session_db(&store, &keys, &base, None).await {
        PublishOutcome::Published { etag } => etag,
        other => panic!("{other:?}"),
    };
    // No ETag at restore but the object exists: never overwrite.
    assert!(matches!(
        publish_session_db(&store, &keys, &base, None).await,
        PublishOutcome::Conflict
    ));
    for round in 0..5 {
        let current = match store.get_bytes(&keys.session_db()).await.unwrap() {
            GetOutcome::Found(b) => b.etag,
            GetOutcome::NotFound => panic!("missing"),
        };
        let a = dir.path().join(format!("a{round}.db"));
        let b = dir.path().join(format!("b{round}.db"));
        write(&a, format!("publisher A round {round}").as_bytes());
        write(&b, format!("publisher B round {round} (longer)").as_bytes());
        let (ra, rb) = tokio::join!(
            publish_session_db(&store, &keys, &a, Some(&current)),
            publish_session_db(&store, &keys, &b, Some(&current)),
        );
        let winner = match (&ra, &rb) {
            (PublishOutcome::Published { .. }, PublishOutcome::Conflict) => &a,
            (PublishOutcome::Conflict, PublishOutcome::Published { .. }) => &b,
            other => panic!("round {round}: want one winner, got {other:?}"),
        };
        let stored = body_of(&store, &keys.session_db()).await.unwrap();
        assert_eq!(stored.as_ref(), std::fs::read(winner).unwrap().as_slice());
    }
    assert!(matches!(
        publish_session_db(&store, &keys, &base, Some(&e0)).await,
        PublishOutcome::Conflict
    ));
}

#[tokio::test]
async fn restore_downloads_only_the_allowlisted_db_and_clears_stale_wal() {
    let (store, keys) = s3::fresh("restore").await;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");

    assert!(matches!(
        restore_session_db(&store, &keys, &data).await,
        StoreRestore::Miss
    ));

    let sessions = keys.sessions_dir();
    let plant = |k: String, body: &'static [u8]| {
        let store = store.clone();
        async move {
            store
                .put_bytes(
                    &k,
                    Bytes::from_static(body),
                    Condition::None,
                    ObjectKind::Artifact,
                )
                .await
        }
    };
    plant(
        format!("{sessions}auth.json"),
        b"{\"anthropic\":{\"key\":\"stolen\"}}",
    )
    .await
    .unwrap();
    // The server may normalize or refuse a `..` key; either way it must never land locally.
    let _ = plant(format!("{sessions}../x"), b"escape").await;
    let _ = plant(format!("{sessions}sub/opencode.db"), b"nested").await;
    let src = tmp.path().join("src.db");
    write(&src, b"the real database");
    let etag = match publish_session_db(&store, &keys, &src, None).await {
        PublishOutcome::Published { etag } => etag,
        other => panic!("{other:?}"),
    };

    std::fs::create_dir_all(&data).unwrap();
    write(&data.join("opencode.db"), b"old local db");
    write(&data.join("opencode.db-wal"), b"stale wal");
    write(&data.join("opencode.db-shm"), b"stale shm");
    match restore_session_db(&store, &keys, &data).await {
        StoreRestore::Hit {
            etag: got,
            bytes,
            sha256,
        } => {
            assert_eq!(got, etag);
            assert_eq!(bytes, 17);
            use sha2::Digest;
            let want = hex::encode(sha2::Sha256::digest(b"the real database"));
            assert_eq!(sha256, want, "the SHA-256 of the body as downloaded");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        std::fs::read(data.join("opencode.db")).unwrap(),
        b"the real database"
    );
    let mut names: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["opencode.db"],
        "only the allowlisted file, no wal/shm/temp"
    );
    let mut outside: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    outside.sort();
    assert_eq!(
        outside,
        ["data", "src.db"],
        "nothing written outside the data dir"
    );
}

#[tokio::test]
async fn failed_or_cancelled_download_leaves_target_untouched_and_no_partial_file() {
    let (store, keys) = s3::fresh("abort").await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("big.db");
    // Large enough that the download is still streaming when it is cancelled.
    let big: Vec<u8> = (0..48u32 << 20).map(|i| (i % 251) as u8).collect();
    write(&src, &big);
    assert!(matches!(
        publish_session_db(&store, &keys, &src, None).await,
        PublishOutcome::Published { .. }
    ));
    drop(big);

    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    write(&data.join("opencode.db"), b"keep me");
    write(&data.join("opencode.db-wal"), b"wal of keep me");

    // Cancelled at several points: never a partial file, and the target either untouched (the old
    // database with its WAL) or the whole new one — never the old one without its WAL. At least one
    // must land mid-download (on a machine fast enough to finish them all, nothing is tested).
    let mut cancelled = 0;
    for ms in [1u64, 20, 80, 200] {
        let res = tokio::time::timeout(
            Duration::from_millis(ms),
            restore_session_db(&store, &keys, &data),
        )
        .await;
        // A swap already under way when the timeout fired finishes on its own.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut names: Vec<String> = std::fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let db = std::fs::read(data.join("opencode.db")).unwrap();
        if db.len() == 48 << 20 {
            // Restored whole (inside the window, or the swap had begun): the old WAL is gone.
            assert_eq!(names, ["opencode.db"], "after {ms} ms");
            write(&data.join("opencode.db"), b"keep me");
            write(&data.join("opencode.db-wal"), b"wal of keep me");
            continue;
        }
        assert!(res.is_err(), "a finished restore leaves the whole database");
        assert_eq!(names, ["opencode.db", "opencode.db-wal"], "after {ms} ms");
        assert_eq!(db, b"keep me");
        cancelled += 1;
    }
    assert!(cancelled > 0, "every restore finished inside its window");

    // A failing request (bad credentials) is a Failed outcome, not a panic, and touches nothing.
    let bad = s3::connect_with_secret(store.settings(), "wrong-secret-value").await;
    assert!(matches!(
        restore_session_db(&bad, &keys, &data).await,
        StoreRestore::Failed { .. }
    ));
    assert_eq!(std::fs::read(data.join("opencode.db")).unwrap(), b"keep me");
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 2);
}

#[tokio::test]
async fn streamed_round_trip_metadata_artifacts_and_listing() {
    let (store, keys) = s3::fresh("rt").await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src.db");
    let data: Vec<u8> = (0..(5u32 << 20) + 7).map(|i| (i * 7 % 256) as u8).collect();
    write(&src, &data);
    assert!(matches!(
        publish_session_db(&store, &keys, &src, None).await,
        PublishOutcome::Published { .. }
    ));
    let dest = tmp.path().join("dest");
    assert!(matches!(
        restore_session_db(&store, &keys, &dest).await,
        StoreRestore::Hit { bytes, .. } if bytes == data.len() as u64
    ));
    assert_eq!(std::fs::read(dest.join("opencode.db")).unwrap(), data);

    let meta = serde_json::json!({"run_id": 12, "generation": 3});
    assert!(matches!(
        upload_run_metadata(&store, &keys, "12-1-job", &meta).await,
        UploadOutcome::Uploaded { .. }
    ));
    let got = body_of(&store, &keys.run_metadata("12-1-job").unwrap())
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got).unwrap(),
        meta
    );
    assert!(matches!(
        upload_run_metadata(&store, &keys, "..", &meta).await,
        UploadOutcome::Failed {
            error: StoreError::InvalidKey { .. }
        }
    ));

    let logs = tmp.path().join("log");
    std::fs::create_dir_all(logs.join("nested")).unwrap();
    write(&logs.join("a.log"), b"alpha");
    write(&logs.join("nested/b.log"), b"beta");
    match upload_run_artifacts(&store, &keys, "12-1-job", &logs).await {
        ArtifactsOutcome::Uploaded {
            files,
            bytes,
            skipped,
        } => {
            assert_eq!((files, bytes, skipped), (2, 9, 0));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        upload_run_artifacts(&store, &keys, "12-1-job", &tmp.path().join("none")).await,
        ArtifactsOutcome::NothingToUpload
    ));
    let listing = store
        .list(&format!(
            "{}/",
            keys.session_db().trim_end_matches("/sessions/opencode.db")
        ))
        .await
        .unwrap();
    let mut listed: Vec<&str> = listing.objects.iter().map(|o| o.key.as_str()).collect();
    listed.sort();
    let root = keys.session_db().replace("/sessions/opencode.db", "");
    assert_eq!(
        listed,
        [
            format!("{root}/artifacts/12-1-job/a.log"),
            format!("{root}/artifacts/12-1-job/nested/b.log"),
            format!("{root}/metadata/12-1-job.json"),
            format!("{root}/sessions/opencode.db"),
        ]
    );
    assert!(!listing.capped);
}

#[tokio::test]
async fn listing_paginates() {
    let (store, keys) = s3::fresh("list").await;
    let root = keys.sessions_dir();
    // 1 001 keys need two pages of the server's 1 000-key maximum.
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in 0..8u32 {
        let store = store.clone();
        let root = root.clone();
        tasks.spawn(async move {
            for i in (chunk..1001).step_by(8) {
                store
                    .put_bytes(
                        &format!("{root}k{i:05}"),
                        Bytes::from_static(b"x"),
                        Condition::None,
                        ObjectKind::Artifact,
                    )
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let listing = store.list(&root).await.unwrap();
    assert_eq!(listing.objects.len(), 1001);
    assert!(!listing.capped);
    // The page cap stops the walk and says so.
    let capped = store.list_with_page_cap(&root, 1).await.unwrap();
    assert_eq!(capped.objects.len(), 1000);
    assert!(capped.capped);
}

#[tokio::test]
async fn wrong_secret_fails_sigv4_with_a_sanitized_error() {
    let (good, keys) = s3::fresh("sig").await;
    let secret = "wrong-secret-0123456789abcdef";
    fro_bot::runner::log::add_mask(secret);
    let bad = s3::connect_with_secret(good.settings(), secret).await;
    let err = bad
        .put_bytes(
            keys.lease(),
            Bytes::from_static(b"x"),
            Condition::IfAbsent,
            ObjectKind::LeaseRecord,
        )
        .await
        .expect_err("a wrong secret must not be accepted");
    let text = format!("{err} | {err:?}");
    assert_eq!(err.status(), Some(403), "{text}");
    assert!(err.code().is_some(), "{text}");
    assert!(text.contains("PutObject"), "{text}");
    assert!(!text.contains(secret), "{text}");
    let lower = text.to_ascii_lowercase();
    for needle in ["signature=", "x-amz-signature", "authorization:"] {
        if let Some(pos) = lower.find(needle) {
            let after = &text[pos + needle.len()..];
            assert!(
                after
                    .trim_start_matches(['=', ':', ' ', '"'])
                    .starts_with("***"),
                "{text}"
            );
        }
    }
    // Nothing was written.
    assert!(body_of(&good, keys.lease()).await.is_none());
}

/// No local S3 server checks ExpectedBucketOwner or SSE headers; a header-capturing HTTP server
/// shows what the adapter sends.
#[tokio::test]
async fn requests_carry_expected_owner_and_sse_but_no_tagging_on_custom_endpoints() {
    use axum::http::HeaderMap;
    use std::sync::{Arc, Mutex};

    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let app = axum::Router::new().fallback({
        let seen = seen.clone();
        move |headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(headers);
                ([("etag", "\"abc\"")], "")
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let input = fro_bot::config::S3Input {
        bucket: "b".into(),
        endpoint: Some(format!("http://{addr}")),
        prefix: "p".into(),
        allow_insecure_endpoint: true,
        expected_bucket_owner: Some("123456789012".into()),
        ..Default::default()
    };
    let settings =
        fro_bot::object_store::StoreSettings::from_input_with_env_region(&input, None).unwrap();
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "AKID",
            "SECRETKEY",
            None,
            None,
            "t",
        ))
        .load()
        .await;
    let store = fro_bot::object_store::ObjectStore::with_sdk_config(&settings, &sdk);
    let out = store
        .put_bytes(
            "p/k",
            Bytes::from_static(b"x"),
            Condition::IfAbsent,
            ObjectKind::LeaseRecord,
        )
        .await
        .unwrap();
    assert_eq!(
        out,
        PutOutcome::Written {
            etag: "\"abc\"".into()
        }
    );
    store
        .delete("p/k", Condition::IfMatch("\"abc\""))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    let h = |i: usize, name: &str| seen[i].get(name).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(
        h(0, "x-amz-expected-bucket-owner").as_deref(),
        Some("123456789012")
    );
    assert_eq!(
        h(0, "x-amz-server-side-encryption").as_deref(),
        Some("AES256")
    );
    assert_eq!(h(0, "if-none-match").as_deref(), Some("*"));
    assert_eq!(h(0, "x-amz-tagging"), None);
    assert_eq!(h(0, "x-amz-server-side-encryption-aws-kms-key-id"), None);
    assert_eq!(
        h(1, "x-amz-expected-bucket-owner").as_deref(),
        Some("123456789012")
    );
    assert_eq!(h(1, "if-match").as_deref(), Some("\"abc\""));
}

/// The marker published beside the database comes back as it was; a marker object larger than
/// `MAX_MARKER_BYTES` (anyone with the store's credentials can write one) is refused unread.
#[tokio::test]
async fn the_marker_round_trips_and_an_oversized_one_is_refused() {
    use fro_bot::object_store::sync::{fetch_marker, publish_marker, MAX_MARKER_BYTES};
    let (store, keys) = s3::fresh("marker").await;
    assert!(fetch_marker(&store, &keys).await.unwrap().is_none());
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("fro-bot.json");
    write(&marker, b"{\"storage_version\":1}");
    assert!(matches!(
        publish_marker(&store, &keys, &marker).await,
        UploadOutcome::Uploaded { .. }
    ));
    assert_eq!(
        fetch_marker(&store, &keys).await.unwrap().as_deref(),
        Some(&b"{\"storage_version\":1}"[..])
    );

    let huge = Bytes::from(vec![b' '; MAX_MARKER_BYTES + 1]);
    store
        .put_bytes(
            &keys.session_marker(),
            huge,
            Condition::None,
            ObjectKind::Artifact,
        )
        .await
        .unwrap();
    match fetch_marker(&store, &keys).await {
        Err(StoreError::Integrity { message, .. }) => {
            assert!(message.contains("more than the"), "{message}")
        }
        other => panic!(
            "an oversized marker was read: {:?}",
            other.map(|b| b.map(|b| b.len()))
        ),
    }
    // Exactly at the cap is still a marker (the bound is inclusive).
    let full = Bytes::from(vec![b' '; MAX_MARKER_BYTES]);
    store
        .put_bytes(
            &keys.session_marker(),
            full,
            Condition::None,
            ObjectKind::Artifact,
        )
        .await
        .unwrap();
    assert_eq!(
        fetch_marker(&store, &keys).await.unwrap().map(|b| b.len()),
        Some(MAX_MARKER_BYTES)
    );
}
