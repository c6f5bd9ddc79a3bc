//! Integration tests: the coordination lease on real SeaweedFS (the invariants of
//! docs/design.md#the-coordination-lease).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fro_bot::lease::{
    release_left_behind, AcquireOutcome, Clock, Holder, Lease, LeaseConfig, LeaseHandle,
    LeaseRecord, LeaseStatus, LostReason, ManualClock, PublishGate, ReleaseOutcome, RenewOutcome,
    SystemClock,
};
use fro_bot::object_store::{Condition, GetOutcome, ObjectKind, ObjectStore, PutOutcome};

use crate::support::s3;
use tokio_util::sync::CancellationToken;

fn holder(run_id: u64) -> Holder {
    Holder {
        repo: "octo/repo".into(),
        run_id,
        run_attempt: 1,
        identity: Some("job".into()),
    }
}

/// A config whose background renewal never fires during a test: ticks are driven by hand.
fn manual(ttl: Duration) -> LeaseConfig {
    LeaseConfig {
        ttl,
        renew_interval: Duration::from_secs(3600),
        call_timeout: Duration::from_secs(15),
    }
}

fn acquired(out: AcquireOutcome) -> LeaseHandle {
    match out {
        AcquireOutcome::Acquired(h) => h,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

async fn stored(store: &ObjectStore, key: &str) -> Option<(LeaseRecord, String)> {
    match store.get_bytes(key).await.unwrap() {
        GetOutcome::Found(b) => Some((LeaseRecord::parse(&b.bytes).expect("well-formed"), b.etag)),
        GetOutcome::NotFound => None,
    }
}

#[tokio::test]
async fn acquire_writes_the_record_and_release_leaves_it_released() {
    let (store, keys) = s3::fresh("lease-basic").await;
    let clock = ManualClock::at_system_time();
    let out = Lease::acquire(
        &store,
        keys.lease(),
        &holder(1),
        manual(Duration::from_secs(300)),
        Arc::new(clock.clone()),
    )
    .await;
    assert_eq!(out.status(), LeaseStatus::Acquired { generation: 1 });
    let h = acquired(out);
    let (rec, etag) = stored(&store, keys.lease()).await.unwrap();
    assert_eq!(rec.holder_id, "action:1:1:job");
    assert_eq!(rec.surface, "github");
    assert_eq!(rec.repo, "octo/repo");
    assert_eq!(rec.expires_at, clock.now_ms() + 300_000);
    assert_eq!(rec.ttl_seconds, 300);
    assert_eq!(h.state_for_post(), (keys.lease().to_string(), etag));
    assert!(h.can_publish(Duration::from_secs(60)));
    assert_eq!(
        h.publish_gate(Duration::from_secs(60)),
        PublishGate::Open { generation: 1 }
    );
    assert!(!h.can_publish(Duration::from_secs(300)));
    assert_eq!(
        h.publish_gate(Duration::from_secs(300)),
        PublishGate::TooLittleTime {
            remaining_ms: 300_000
        }
    );
    assert!(matches!(h.release().await, ReleaseOutcome::Released));
    // Kept, expired at once: the next holder continues its generation.
    let (released, _) = stored(&store, keys.lease()).await.unwrap();
    assert_eq!(released.generation, 1);
    assert!(released.expires_at <= clock.now_ms());
    let next = Lease::acquire(
        &store,
        keys.lease(),
        &holder(2),
        manual(Duration::from_secs(300)),
        Arc::new(clock.clone()),
    )
    .await;
    assert_eq!(next.status(), LeaseStatus::Acquired { generation: 2 });
}

/// The generation is a fencing token: it never restarts, whoever releases and however often.
#[tokio::test]
async fn the_generation_grows_across_releases_and_post_releases() {
    let (store, keys) = s3::fresh("lease-fence").await;
    let cfg = manual(Duration::from_secs(300));
    let mut seen = Vec::new();
    for run in 1..=4u64 {
        let h = acquired(
            Lease::acquire(
                &store,
                keys.lease(),
                &holder(run),
                cfg,
                Arc::new(SystemClock),
            )
            .await,
        );
        seen.push(h.generation());
        if run % 2 == 0 {
            let (key, etag) = h.state_for_post();
            drop(h); // main died: post releases it
            assert!(matches!(
                release_left_behind(&store, &key, &etag, Duration::from_secs(10)).await,
                ReleaseOutcome::Released
            ));
        } else {
            assert!(matches!(h.release().await, ReleaseOutcome::Released));
        }
    }
    assert_eq!(seen, vec![1, 2, 3, 4]);
}

/// A record claiming to live for ever (a skewed clock, or planted by anyone who can write the
/// bucket) locks the repository no longer than its `LastModified` plus the TTL.
#[tokio::test]
async fn a_far_future_expiry_cannot_lock_the_repository() {
    let (store, keys) = s3::fresh("lease-future").await;
    let planted = LeaseRecord {
        expires_at: u64::MAX / 2,
        ..LeaseRecord::new(&holder(9), 41, SystemClock.now_ms(), 300_000)
    };
    let put = store
        .put_bytes(
            keys.lease(),
            planted.to_bytes(),
            Condition::None,
            ObjectKind::LeaseRecord,
        )
        .await
        .unwrap();
    assert!(matches!(put, PutOutcome::Written { .. }));
    let cfg = manual(Duration::from_secs(300));
    // Within LastModified + TTL it is honoured (as a live holder's would be)...
    let clock = ManualClock::at_system_time();
    match Lease::acquire(
        &store,
        keys.lease(),
        &holder(1),
        cfg,
        Arc::new(clock.clone()),
    )
    .await
    {
        AcquireOutcome::HeldByOther { expires_at, .. } => assert!(
            expires_at < clock.now_ms() + 400_000,
            "bounded, not {expires_at}"
        ),
        other => panic!("{other:?}"),
    }
    // ...and once that has passed, it is taken over, with the next generation.
    clock.advance(Duration::from_secs(400));
    let h = acquired(
        Lease::acquire(
            &store,
            keys.lease(),
            &holder(1),
            cfg,
            Arc::new(clock.clone()),
        )
        .await,
    );
    assert_eq!(h.generation(), 42);
}

/// A run that finds the lease held waits for the holder's section to end instead of skipping.
#[tokio::test]
async fn acquire_waiting_gets_the_lease_when_the_holder_releases() {
    let (store, keys) = s3::fresh("lease-wait").await;
    let cfg = manual(Duration::from_secs(300));
    let first = acquired(
        Lease::acquire(&store, keys.lease(), &holder(1), cfg, Arc::new(SystemClock)).await,
    );
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        first.release().await
    });
    let (out, waits) = Lease::acquire_waiting(
        &store,
        keys.lease(),
        &holder(2),
        cfg,
        Arc::new(SystemClock),
        Duration::from_secs(60),
        &CancellationToken::new(),
    )
    .await;
    assert!(matches!(release.await.unwrap(), ReleaseOutcome::Released));
    assert_eq!(out.status(), LeaseStatus::Acquired { generation: 2 });
    assert!(waits >= 1, "it had to wait");
    // A holder that never lets go: the wait ends at its bound with the holder named.
    let _held = acquired(out);
    let (out, _) = Lease::acquire_waiting(
        &store,
        keys.lease(),
        &holder(3),
        cfg,
        Arc::new(SystemClock),
        Duration::from_millis(800),
        &CancellationToken::new(),
    )
    .await;
    match out {
        AcquireOutcome::HeldByOther { holder_id, .. } => assert_eq!(holder_id, "action:2:1:job"),
        other => panic!("{other:?}"),
    }
}

/// A signal ends the wait for a lease another run holds: at once, with the holder named, and
/// without taking it; the holder keeps it.
#[tokio::test]
async fn a_stop_ends_the_wait_at_once_and_leaves_the_lease_with_its_holder() {
    let (store, keys) = s3::fresh("lease-stop").await;
    let cfg = manual(Duration::from_secs(300));
    let held = acquired(
        Lease::acquire(&store, keys.lease(), &holder(1), cfg, Arc::new(SystemClock)).await,
    );
    let stop = CancellationToken::new();
    let signal = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            stop.cancel();
        })
    };
    // Far longer than any test may take: only the stop can end it.
    let (out, _) = tokio::time::timeout(
        Duration::from_secs(60),
        Lease::acquire_waiting(
            &store,
            keys.lease(),
            &holder(2),
            cfg,
            Arc::new(SystemClock),
            Duration::from_secs(3600),
            &stop,
        ),
    )
    .await
    .expect("the stop ended the wait");
    signal.await.unwrap();
    match out {
        AcquireOutcome::HeldByOther { holder_id, .. } => assert_eq!(holder_id, "action:1:1:job"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(held.release().await, ReleaseOutcome::Released));
}

#[tokio::test]
async fn live_lease_is_never_taken_over() {
    let (store, keys) = s3::fresh("lease-live").await;
    let clock = ManualClock::at_system_time();
    let cfg = manual(Duration::from_secs(60));
    let a = acquired(
        Lease::acquire(
            &store,
            keys.lease(),
            &holder(1),
            cfg,
            Arc::new(clock.clone()),
        )
        .await,
    );
    let before = stored(&store, keys.lease()).await.unwrap();
    let start = clock.now_ms();
    for advance_ms in [0u64, 30_000, 29_999] {
        clock.advance(Duration::from_millis(advance_ms));
        match Lease::acquire(
            &store,
            keys.lease(),
            &holder(2),
            cfg,
            Arc::new(clock.clone()),
        )
        .await
        {
            AcquireOutcome::HeldByOther {
                holder_id,
                expires_at,
            } => {
                assert_eq!(holder_id, "action:1:1:job");
                assert_eq!(expires_at, a.expires_at());
            }
            other => panic!("live lease taken: {other:?}"),
        }
    }
    // One millisecond before expiry: still untouched.
    assert_eq!(stored(&store, keys.lease()).await.unwrap(), before);
    // The holder itself still renews while time is left (a renewal is bounded by that time).
    clock.set(start + 1_000);
    assert!(matches!(a.renew_now().await, RenewOutcome::Renewed { .. }));
    assert!(matches!(a.release().await, ReleaseOutcome::Released));
}

#[tokio::test]
async fn expired_holder_is_never_renewed_and_loses_to_a_takeover() {
    let (store, keys) = s3::fresh("lease-expired").await;
    let clock_a = ManualClock::at_system_time();
    let cfg = manual(Duration::from_secs(10));
    let a = acquired(
        Lease::acquire(
            &store,
            keys.lease(),
            &holder(1),
            cfg,
            Arc::new(clock_a.clone()),
        )
        .await,
    );
    let (_, etag_a) = stored(&store, keys.lease()).await.unwrap();

    clock_a.advance(Duration::from_secs(10));
    // Exactly at expires_at: expired. The renewal is refused locally and nothing is written.
    assert_eq!(a.renew_now().await, RenewOutcome::Lost(LostReason::Expired));
    assert_eq!(stored(&store, keys.lease()).await.unwrap().1, etag_a);
    assert!(!a.can_publish(Duration::ZERO));
    // Latched: it stays lost even if the clock went back.
    clock_a.set(0);
    assert!(matches!(a.renew_now().await, RenewOutcome::Lost(_)));
    assert!(!a.can_publish(Duration::ZERO));

    let clock_b = ManualClock::new(clock_a_now_plus(&store, keys.lease(), 1).await);
    let b =
        acquired(Lease::acquire(&store, keys.lease(), &holder(2), cfg, Arc::new(clock_b)).await);
    assert_eq!(b.generation(), 2, "takeover increments the generation");
    // A lost lease is not released: B's record stays.
    assert!(matches!(a.release().await, ReleaseOutcome::NotHeld));
    assert_eq!(
        stored(&store, keys.lease()).await.unwrap().0.holder_id,
        "action:2:1:job"
    );
    assert!(matches!(b.release().await, ReleaseOutcome::Released));
}

/// `expires_at + delta` of the stored record.
async fn clock_a_now_plus(store: &ObjectStore, key: &str, delta: u64) -> u64 {
    stored(store, key).await.unwrap().0.expires_at + delta
}

#[tokio::test]
async fn holder_that_lost_the_lease_cannot_publish_or_renew() {
    let (store, keys) = s3::fresh("lease-lost").await;
    // A's clock runs slow (skew): A still believes its lease is live when B takes it over.
    let clock_a = ManualClock::at_system_time();
    let cfg = manual(Duration::from_secs(10));
    let a = acquired(
        Lease::acquire(
            &store,
            keys.lease(),
            &holder(1),
            cfg,
            Arc::new(clock_a.clone()),
        )
        .await,
    );
    assert!(a.can_publish(Duration::from_secs(1)));
    let clock_b = ManualClock::new(a.expires_at() + 5);
    let b =
        acquired(Lease::acquire(&store, keys.lease(), &holder(2), cfg, Arc::new(clock_b)).await);

    assert_eq!(
        a.renew_now().await,
        RenewOutcome::Lost(LostReason::Superseded)
    );
    assert!(
        !a.can_publish(Duration::ZERO),
        "a superseded holder must not publish"
    );
    assert_eq!(a.lost(), Some(LostReason::Superseded));
    assert_eq!(
        a.publish_gate(Duration::ZERO),
        PublishGate::Lost(LostReason::Superseded)
    );
    assert!(b.can_publish(Duration::from_secs(1)));
    assert!(matches!(b.renew_now().await, RenewOutcome::Renewed { .. }));
    assert!(matches!(a.release().await, ReleaseOutcome::NotHeld));
    assert!(stored(&store, keys.lease()).await.is_some());
    assert!(matches!(b.release().await, ReleaseOutcome::Released));
}

#[tokio::test]
async fn aba_identical_bodies_cannot_give_two_winners() {
    let (store, keys) = s3::fresh("lease-aba").await;
    // Frozen time: without the nonce every renewal would write byte-identical bodies.
    let clock = ManualClock::at_system_time();
    let cfg = manual(Duration::from_secs(10));
    let a = acquired(
        Lease::acquire(
            &store,
            keys.lease(),
            &holder(1),
            cfg,
            Arc::new(clock.clone()),
        )
        .await,
    );
    let (_, e1) = stored(&store, keys.lease()).await.unwrap();
    assert!(matches!(a.renew_now().await, RenewOutcome::Renewed { .. }));
    let (_, e2) = stored(&store, keys.lease()).await.unwrap();
    assert!(matches!(a.renew_now().await, RenewOutcome::Renewed { .. }));
    let (rec3, e3) = stored(&store, keys.lease()).await.unwrap();
    assert!(
        e1 != e2 && e2 != e3 && e1 != e3,
        "same-time renewals must change the ETag"
    );
    // A contender holding the first ETag (read before the renewals) cannot swap in.
    let stale = store
        .put_bytes(
            keys.lease(),
            LeaseRecord::new(&holder(9), 2, clock.now_ms(), 10_000).to_bytes(),
            Condition::IfMatch(&e1),
            ObjectKind::LeaseRecord,
        )
        .await
        .unwrap();
    assert_eq!(stale, PutOutcome::PreconditionFailed);

    // Two contenders racing to take over the same expired record: exactly one wins.
    let later = ManualClock::new(rec3.expires_at + 1);
    drop(a);
    for round in 0..5u64 {
        let (hx, hy) = (holder(100 + round), holder(200 + round));
        let (x, y) = tokio::join!(
            Lease::acquire(&store, keys.lease(), &hx, cfg, Arc::new(later.clone())),
            Lease::acquire(&store, keys.lease(), &hy, cfg, Arc::new(later.clone())),
        );
        let winner = match (x, y) {
            (AcquireOutcome::Acquired(h), AcquireOutcome::HeldByOther { .. })
            | (AcquireOutcome::HeldByOther { .. }, AcquireOutcome::Acquired(h)) => h,
            other => panic!("round {round}: {other:?}"),
        };
        // Let this round's winner expire so the next round races again.
        later.set(winner.expires_at() + 1);
    }
}

#[tokio::test]
async fn malformed_record_is_stale_only_after_last_modified_plus_default_ttl() {
    let (store, keys) = s3::fresh("lease-bad").await;
    store
        .put_bytes(
            keys.lease(),
            Bytes::from_static(b"not json"),
            Condition::None,
            ObjectKind::LeaseRecord,
        )
        .await
        .unwrap();
    let cfg = manual(Duration::from_secs(30));
    let now = SystemClock.now_ms();
    match Lease::acquire(
        &store,
        keys.lease(),
        &holder(1),
        cfg,
        Arc::new(ManualClock::new(now)),
    )
    .await
    {
        AcquireOutcome::HeldByOther { expires_at, .. } => {
            assert!(
                expires_at > now + 290_000 && expires_at <= now + 301_000,
                "{expires_at} vs {now}"
            )
        }
        other => panic!("{other:?}"),
    }
    let later = ManualClock::new(now + 302_000);
    let h = acquired(Lease::acquire(&store, keys.lease(), &holder(1), cfg, Arc::new(later)).await);
    assert_eq!(h.generation(), 1);
    assert!(matches!(h.release().await, ReleaseOutcome::Released));
}

#[tokio::test]
async fn background_renewal_extends_and_a_failed_renewal_latches_lost() {
    let (store, keys) = s3::fresh("lease-bg").await;
    let cfg = LeaseConfig {
        ttl: Duration::from_secs(4),
        renew_interval: Duration::from_millis(300),
        call_timeout: Duration::from_secs(5),
    };
    let h = acquired(
        Lease::acquire(&store, keys.lease(), &holder(1), cfg, Arc::new(SystemClock)).await,
    );
    let (first, e1) = stored(&store, keys.lease()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (now, e_now) = stored(&store, keys.lease()).await.unwrap();
    assert_ne!(e1, e_now);
    assert!(now.renewed_at > first.renewed_at && now.expires_at > first.expires_at);
    assert_eq!(now.generation, first.generation);
    assert_eq!(h.etag(), e_now, "the handle tracks the current ETag");
    assert!(h.can_publish(Duration::from_secs(2)));

    // Someone overwrites the record: the next tick fails and the handle stays lost.
    store
        .put_bytes(
            keys.lease(),
            LeaseRecord::new(&holder(2), 5, SystemClock.now_ms(), 60_000).to_bytes(),
            Condition::None,
            ObjectKind::LeaseRecord,
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(h.lost(), Some(LostReason::Superseded));
    assert!(!h.can_publish(Duration::ZERO));
    assert!(matches!(h.release().await, ReleaseOutcome::NotHeld));
    assert_eq!(
        stored(&store, keys.lease()).await.unwrap().0.holder_id,
        "action:2:1:job"
    );
}

#[tokio::test]
async fn post_releases_a_lease_left_behind_only_with_its_etag() {
    let (store, keys) = s3::fresh("lease-post").await;
    let cfg = manual(Duration::from_secs(300));
    let h = acquired(
        Lease::acquire(&store, keys.lease(), &holder(1), cfg, Arc::new(SystemClock)).await,
    );
    let (key, etag) = h.state_for_post();
    drop(h); // main "died" without releasing
    assert!(matches!(
        release_left_behind(
            &store,
            &key,
            "\"0123456789abcdef0123456789abcdef\"",
            Duration::from_secs(10)
        )
        .await,
        ReleaseOutcome::NotHeld
    ));
    assert!(stored(&store, &key).await.is_some());
    assert!(matches!(
        release_left_behind(&store, &key, &etag, Duration::from_secs(10)).await,
        ReleaseOutcome::Released
    ));
    let (released, _) = stored(&store, &key).await.unwrap();
    assert!(released.expires_at <= SystemClock.now_ms(), "released");
    assert!(matches!(
        release_left_behind(&store, &key, &etag, Duration::from_secs(10)).await,
        ReleaseOutcome::NotHeld
    ));
}

#[tokio::test]
async fn post_release_is_cancelled_at_its_deadline() {
    // A server that accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let mut settings = s3::settings("p");
    settings.endpoint = Some(format!("http://{addr}").parse().unwrap());
    let store = s3::connect(&settings).await;
    let started = Instant::now();
    let out = release_left_behind(
        &store,
        "p/coordination/o/r/locks/repo.json",
        "\"e\"",
        Duration::from_millis(500),
    )
    .await;
    let took = started.elapsed();
    assert!(
        matches!(
            out,
            ReleaseOutcome::Failed {
                error: fro_bot::lease::LeaseError::TimedOut { .. }
            }
        ),
        "{out:?}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
}

struct RaceResult {
    /// How many contenders held the lease in each round.
    per_round: Vec<usize>,
    max_simultaneous: usize,
    errors: usize,
}

/// `CONTENDERS` tasks race for `key` for `rounds` rounds. Every round, all contenders try to
/// acquire at once; a holder keeps the lease until every contender has finished its attempt, so
/// two `Acquired` in one round would be two simultaneous holders.
async fn race_on_key(store: ObjectStore, key: String, rounds: usize) -> RaceResult {
    const CONTENDERS: usize = 16;
    let cfg = LeaseConfig {
        ttl: Duration::from_secs(120),
        renew_interval: Duration::from_secs(3600),
        call_timeout: Duration::from_secs(30),
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(CONTENDERS));
    let per_round: Arc<Vec<AtomicUsize>> =
        Arc::new((0..rounds).map(|_| AtomicUsize::new(0)).collect());
    let holders_now = Arc::new(AtomicUsize::new(0));
    let max_holders = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CONTENDERS {
        let (store, key, barrier) = (store.clone(), key.clone(), barrier.clone());
        let (per_round, holders_now, max_holders) =
            (per_round.clone(), holders_now.clone(), max_holders.clone());
        tasks.spawn(async move {
            let mut errors = 0usize;
            for round in 0..rounds {
                barrier.wait().await;
                let out =
                    Lease::acquire(&store, &key, &holder(c as u64), cfg, Arc::new(SystemClock))
                        .await;
                let handle = match out {
                    AcquireOutcome::Acquired(h) => {
                        per_round[round].fetch_add(1, Ordering::SeqCst);
                        let n = holders_now.fetch_add(1, Ordering::SeqCst) + 1;
                        max_holders.fetch_max(n, Ordering::SeqCst);
                        Some(h)
                    }
                    AcquireOutcome::HeldByOther { .. } => None,
                    AcquireOutcome::Error { error } => {
                        eprintln!("contender {c} round {round}: {error}");
                        errors += 1;
                        None
                    }
                };
                // Everyone has finished trying before the holder renews and lets go.
                barrier.wait().await;
                if let Some(h) = handle {
                    assert!(matches!(h.renew_now().await, RenewOutcome::Renewed { .. }));
                    holders_now.fetch_sub(1, Ordering::SeqCst);
                    assert!(matches!(h.release().await, ReleaseOutcome::Released));
                }
                barrier.wait().await;
            }
            errors
        });
    }
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        errors += r.unwrap();
    }
    RaceResult {
        per_round: per_round.iter().map(|a| a.load(Ordering::SeqCst)).collect(),
        max_simultaneous: max_holders.load(Ordering::SeqCst),
        errors,
    }
}

/// docs/design.md#the-coordination-lease: never two holders at once under many concurrent
/// contenders. 16 contenders per lease key × 100 rounds in total. SeaweedFS makes each loser wait
/// 1–5 s (in 1 s steps) for its 412, so one key manages ~4.5 s/round; ten keys race side by side
/// (10 rounds each, 160 clients at once) to fit 100 rounds in under a minute (49 s, against 92 s
/// with four keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_race_16_contenders_100_rounds_never_two_holders() {
    const KEYS: usize = 10;
    let total_rounds: usize = std::env::var("FRO_BOT_LEASE_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let rounds = total_rounds.div_ceil(KEYS);
    let started = Instant::now();
    let mut groups = tokio::task::JoinSet::new();
    let mut keys = Vec::new();
    for g in 0..KEYS {
        let (store, k) = s3::fresh(&format!("lease-race{g}")).await;
        keys.push((store.clone(), k.lease().to_string()));
        groups.spawn(race_on_key(store, k.lease().to_string(), rounds));
    }
    let mut per_round = Vec::new();
    let (mut max_simultaneous, mut errors) = (0, 0);
    while let Some(r) = groups.join_next().await {
        let r = r.unwrap();
        per_round.extend(r.per_round);
        max_simultaneous = max_simultaneous.max(r.max_simultaneous);
        errors += r.errors;
    }
    let double = per_round.iter().filter(|&&n| n > 1).count();
    let empty = per_round.iter().filter(|&&n| n == 0).count();
    let took = started.elapsed();
    println!(
        "lease race: 16 contenders x {} rounds ({KEYS} keys x {rounds}) in {took:.1?}: rounds with two holders = {double}, rounds with no holder = {empty}, acquire errors = {errors}, max simultaneous holders = {max_simultaneous}",
        per_round.len()
    );
    assert_eq!(double, 0, "two holders at once: {per_round:?}");
    assert_eq!(max_simultaneous, 1);
    assert_eq!(errors, 0);
    assert_eq!(empty, 0, "every round someone must win: {per_round:?}");
    for (store, key) in keys {
        let (last, _) = stored(&store, &key).await.unwrap();
        assert!(
            last.expires_at <= SystemClock.now_ms(),
            "released at the end"
        );
        // One holder per round, and the fencing token counted every one of them.
        assert_eq!(last.generation, rounds as u64);
    }
}

/// 16 contenders race to take over the same expired record (all `If-Match` on one ETag): exactly
/// one wins each round, and the generation goes up by one per takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_race_takeover_of_expired_record_has_one_winner() {
    let (store, keys) = s3::fresh("lease-takeover").await;
    let cfg = manual(Duration::from_secs(10));
    let start = ManualClock::at_system_time();
    let first = acquired(
        Lease::acquire(
            &store,
            keys.lease(),
            &holder(0),
            cfg,
            Arc::new(start.clone()),
        )
        .await,
    );
    let mut expired_at = first.expires_at();
    drop(first); // dies without releasing
    for round in 0..3u64 {
        let clock = ManualClock::new(expired_at + 1);
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..16u64 {
            let (store, key, clock) = (store.clone(), keys.lease().to_string(), clock.clone());
            tasks.spawn(async move {
                Lease::acquire(
                    &store,
                    &key,
                    &holder(1000 * (round + 1) + c),
                    cfg,
                    Arc::new(clock),
                )
                .await
            });
        }
        let mut winners = Vec::new();
        while let Some(out) = tasks.join_next().await {
            match out.unwrap() {
                AcquireOutcome::Acquired(h) => winners.push(h),
                AcquireOutcome::HeldByOther { .. } => {}
                AcquireOutcome::Error { error } => panic!("round {round}: {error}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        assert_eq!(winners[0].generation(), round + 2);
        expired_at = winners[0].expires_at();
    }
}

/// A re-run is not kept waiting by the lease its own earlier attempt left behind (a runner lost
/// before post could release it): it takes it over at once, with the next generation. Another run
/// still waits.
#[tokio::test]
async fn a_rerun_takes_over_the_lease_its_earlier_attempt_left_behind() {
    let (store, keys) = s3::fresh("lease-rerun").await;
    let clock = ManualClock::at_system_time();
    let cfg = manual(Duration::from_secs(300));
    let first = acquired(
        Lease::acquire(
            &store,
            keys.lease(),
            &holder(5),
            cfg,
            Arc::new(clock.clone()),
        )
        .await,
    );
    // Dropped without a release: the record stays live for its TTL.
    drop(first);
    let other = Lease::acquire(
        &store,
        keys.lease(),
        &holder(6),
        cfg,
        Arc::new(clock.clone()),
    )
    .await;
    assert!(
        matches!(other, AcquireOutcome::HeldByOther { .. }),
        "{other:?}"
    );
    let rerun = Holder {
        run_attempt: 2,
        ..holder(5)
    };
    let second =
        acquired(Lease::acquire(&store, keys.lease(), &rerun, cfg, Arc::new(clock.clone())).await);
    assert_eq!(second.generation(), 2);
    let (record, _) = stored(&store, keys.lease()).await.unwrap();
    assert_eq!(record.holder_id, "action:5:2:job");
    // ...and the first attempt cannot take it back from its re-run.
    let back = Lease::acquire(
        &store,
        keys.lease(),
        &holder(5),
        cfg,
        Arc::new(clock.clone()),
    )
    .await;
    assert!(
        matches!(back, AcquireOutcome::HeldByOther { .. }),
        "{back:?}"
    );
    assert!(matches!(second.release().await, ReleaseOutcome::Released));
}
