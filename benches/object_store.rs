//! Benchmark: publish + restore of a 200 MB session database through the object store adapter,
//! beside baselines measured in the same run against the same server: a plain aws-sdk-s3
//! put/get loop, and `aws s3 cp` when the AWS CLI is installed.
//!
//! Needs the SeaweedFS that `scripts/bench-object-store` starts (same env vars as the tests:
//! FRO_BOT_TEST_S3_ENDPOINT, _BUCKET, _ACCESS_KEY, _SECRET_KEY). Size and iterations:
//! FRO_BOT_BENCH_MB (default 200), FRO_BOT_BENCH_ITERS (default 3).

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use aws_config::BehaviorVersion;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use fro_bot::config::S3Input;
use fro_bot::object_store::{
    publish_session_db, restore_session_db, ObjectStore, PublishOutcome, StoreKeys, StoreRestore,
    StoreSettings,
};
use tokio::io::AsyncWriteExt;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        eprintln!("{name} is not set: run scripts/bench-object-store");
        std::process::exit(2)
    })
}

struct Row {
    name: &'static str,
    put: Vec<Duration>,
    get: Vec<Duration>,
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run());
}

async fn run() {
    let endpoint = env("FRO_BOT_TEST_S3_ENDPOINT");
    let bucket = env("FRO_BOT_TEST_S3_BUCKET");
    let access = env("FRO_BOT_TEST_S3_ACCESS_KEY");
    let secret = env("FRO_BOT_TEST_S3_SECRET_KEY");
    let mb: u64 = std::env::var("FRO_BOT_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let iters: usize = std::env::var("FRO_BOT_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let prefix = format!("bench-{}", hex::encode(rand::random::<[u8; 4]>()));

    let settings = StoreSettings::from_input_with_env_region(
        &S3Input {
            bucket: bucket.clone(),
            endpoint: Some(endpoint.clone()),
            prefix: prefix.clone(),
            allow_insecure_endpoint: true,
            ..S3Input::default()
        },
        None,
    )
    .expect("valid settings");
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(&access, &secret, None, None, "bench"))
        .load()
        .await;
    let store = ObjectStore::with_sdk_config(&settings, &sdk);
    let keys = StoreKeys::new(&prefix, "bench", "repo").expect("keys");

    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src.db");
    {
        // Incompressible-ish content, written once.
        let mut f = std::io::BufWriter::new(std::fs::File::create(&src).expect("create"));
        let mut block = vec![0u8; 1 << 20];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..mb {
            for b in block.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            f.write_all(&block).expect("write");
        }
    }
    let bytes = mb << 20;
    println!("object_store bench: {mb} MiB, {iters} iterations, SeaweedFS at {endpoint}");

    // fro-bot adapter: conditional publish (streamed from disk) and allowlisted restore (streamed
    // to a temp file, then renamed).
    let mut ours = Row {
        name: "fro-bot publish/restore",
        put: vec![],
        get: vec![],
    };
    let mut etag: Option<String> = None;
    for i in 0..iters {
        let t = Instant::now();
        match publish_session_db(&store, &keys, &src, etag.as_deref()).await {
            PublishOutcome::Published { etag: e } => etag = Some(e),
            other => panic!("publish {i}: {other:?}"),
        }
        ours.put.push(t.elapsed());
        let data = tmp.path().join(format!("data{i}"));
        let t = Instant::now();
        match restore_session_db(&store, &keys, &data).await {
            StoreRestore::Hit { bytes: got, .. } => assert_eq!(got, bytes),
            other => panic!("restore {i}: {other:?}"),
        }
        ours.get.push(t.elapsed());
        std::fs::remove_dir_all(&data).ok();
    }

    // Baseline: the plain SDK with default settings, path-style, put from path / get to file.
    let client = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .endpoint_url(&endpoint)
            .force_path_style(true)
            .build(),
    );
    let key = format!("{prefix}/baseline.db");
    let mut base = Row {
        name: "plain aws-sdk-s3 put/get",
        put: vec![],
        get: vec![],
    };
    for _ in 0..iters {
        let t = Instant::now();
        client
            .put_object()
            .bucket(&bucket)
            .key(&key)
            .body(ByteStream::from_path(&src).await.expect("body"))
            .send()
            .await
            .expect("baseline put");
        base.put.push(t.elapsed());
        let dst = tmp.path().join("baseline.out");
        let t = Instant::now();
        let out = client
            .get_object()
            .bucket(&bucket)
            .key(&key)
            .send()
            .await
            .expect("baseline get");
        let mut body = out.body;
        let mut f = tokio::fs::File::create(&dst).await.expect("create");
        while let Some(chunk) = body.try_next().await.expect("chunk") {
            f.write_all(&chunk).await.expect("write");
        }
        f.flush().await.expect("flush");
        f.sync_all().await.expect("sync");
        base.get.push(t.elapsed());
        std::fs::remove_file(&dst).ok();
    }
    let mut rows = vec![ours, base];

    if Command::new("aws")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let mut cli = Row {
            name: "aws s3 cp (CLI)",
            put: vec![],
            get: vec![],
        };
        let url = format!("s3://{bucket}/{prefix}/cli.db");
        let dst = tmp.path().join("cli.out");
        let cp = |from: &Path, to: &str| {
            let t = Instant::now();
            let ok = Command::new("aws")
                .args([
                    "--endpoint-url",
                    &endpoint,
                    "--region",
                    "us-east-1",
                    "s3",
                    "cp",
                    "--only-show-errors",
                ])
                .arg(from)
                .arg(to)
                .env("AWS_ACCESS_KEY_ID", &access)
                .env("AWS_SECRET_ACCESS_KEY", &secret)
                .status()
                .is_ok_and(|s| s.success());
            ok.then(|| t.elapsed())
        };
        for _ in 0..iters {
            let (Some(p), Some(g)) = (
                cp(&src, &url),
                cp(Path::new(&url), dst.to_str().expect("utf-8 temp path")),
            ) else {
                eprintln!("aws s3 cp failed; CLI row skipped");
                cli.put.clear();
                break;
            };
            cli.put.push(p);
            cli.get.push(g);
        }
        if !cli.put.is_empty() {
            rows.push(cli);
        }
    } else {
        println!("(aws CLI not installed: CLI baseline skipped)");
    }

    let mib = mb as f64;
    println!();
    println!("| path | put median | put MiB/s | get median | get MiB/s |");
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        let (p, g) = (median(&r.put), median(&r.get));
        println!(
            "| {} | {:.2} s | {:.0} | {:.2} s | {:.0} |",
            r.name,
            p.as_secs_f64(),
            mib / p.as_secs_f64(),
            g.as_secs_f64(),
            mib / g.as_secs_f64()
        );
    }
    println!();
    println!("(fro-bot get = download to temp + fsync + remove stale -wal/-shm + rename; baseline get = stream to file + fsync)");
}
