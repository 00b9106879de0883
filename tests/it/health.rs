//! Health for orchestrators: transaction markers leave no lag (the checkpoint steps over a trailing COMMIT or
//! ABORT marker), `/healthz`, `/readyz` and the `replaysafe_consumer_lag` gauge of `run --metrics-addr`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};

use crate::common::*;
use crate::core::{counts, seed_events, SEED};

/// A transactional producer on the test broker.
fn tx_producer() -> ThreadedProducer<rdkafka::producer::DefaultProducerContext> {
    let p: ThreadedProducer<_> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("transactional.id", unique("tx"))
        .create()
        .unwrap();
    p.init_transactions(Duration::from_secs(30)).unwrap();
    p
}

/// Sends `recs` to `topic` in one transaction, committed or aborted.
fn in_transaction(
    p: &ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    topic: &str,
    recs: &[Rec],
    commit: bool,
) {
    p.begin_transaction().unwrap();
    for r in recs {
        let mut br: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(r.partition);
        br = br
            .key(r.key.as_deref().unwrap())
            .payload(r.value.as_deref().unwrap());
        br = br.timestamp(r.timestamp_ms.unwrap());
        p.send(br).map_err(|(e, _)| e).unwrap();
    }
    if commit {
        p.commit_transaction(Duration::from_secs(30)).unwrap();
    } else {
        p.flush(Duration::from_secs(30)).unwrap();
        p.abort_transaction(Duration::from_secs(30)).unwrap();
    }
}

/// The high watermark of every partition of `topic`.
fn highs(topic: &str, partitions: i32) -> Vec<i64> {
    let c = consumer(&[]);
    (0..partitions)
        .map(|p| {
            rdkafka::consumer::Consumer::fetch_watermarks(&c, topic, p, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect()
}

/// A transactional producer's records: partition 0 ends with a committed transaction (COMMIT marker last),
/// partition 1 with an aborted one (its records and the ABORT marker last). After `run --until-caught-up`
/// every checkpoint and Kafka committed offset equals the high watermark (no lag of 1 left by the marker),
/// and the state holds exactly the committed records (`read_committed` skips the aborted ones).
#[test]
fn transaction_markers_leave_checkpoint_at_high_watermark() {
    let (db, topic) = stage("txmark", 2);
    let group = unique("g");
    let (recs, _) = seed_events(120, 2);
    let (first, rest) = recs.split_at(60);
    let (aborted, last) = rest.split_at(30);
    let aborted: Vec<Rec> = aborted
        .iter()
        .map(|r| Rec {
            partition: 1,
            ..r.clone()
        })
        .collect();
    let last: Vec<Rec> = last
        .iter()
        .map(|r| Rec {
            partition: 0,
            ..r.clone()
        })
        .collect();
    let p = tx_producer();
    in_transaction(&p, &topic, first, true);
    in_transaction(&p, &topic, &aborted, false);
    in_transaction(&p, &topic, &last, true);
    let applied: Vec<Rec> = first.iter().chain(&last).cloned().collect();
    let truth = tally_of(&applied);

    let out = run_text(SEED, &topic, &group, &db);
    let t = out.tally();
    assert_eq!((t.consumed, t.landed), (90, 90), "{:?}", out.tally_line());
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 90);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    let high = highs(&topic, 2);
    // p0: 30 + 1 marker + 30 + 1 marker; p1: 30 + 1 marker + 30 aborted + 1 marker.
    assert_eq!(high, vec![62, 62]);
    let committed = committed(&group, &topic, 2);
    for part in 0..2 {
        assert_eq!(
            db.checkpoint(&group, &topic, part),
            Some(high[part as usize]),
            "p{part}"
        );
        assert_eq!(
            committed[part as usize],
            Some(high[part as usize]),
            "p{part}"
        );
    }
    // Nothing left to read: a second run consumes nothing and changes nothing.
    let again = run_text(SEED, &topic, &group, &db);
    assert_eq!(again.tally().consumed, 0);
    assert_eq!(counts(&db), truth);
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(62));
}

/// `(day, customer) → count` of seed records.
fn tally_of(recs: &[Rec]) -> BTreeMap<(String, String), i64> {
    let mut m = BTreeMap::new();
    for r in recs {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let day = v["occurred_at"].as_str().unwrap()[..10].to_string();
        let customer = v["customer_id"].as_str().unwrap().to_string();
        *m.entry((day, customer)).or_insert(0) += 1;
    }
    m
}

/// `GET path` on `addr`: status code and body.
pub(crate) fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// The value of `replaysafe_consumer_lag{topic, partition}` in a `/metrics` text.
fn lag(metrics: &str, topic: &str, partition: i32) -> Option<f64> {
    let partition = partition.to_string();
    sample(
        metrics,
        "replaysafe_consumer_lag",
        &[("topic", topic), ("partition", &partition)],
    )
}

/// The number of members of `group` when the broker reports it `Stable` (a rebalance finished).
fn stable_members(group: &str) -> Option<usize> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .ok()?;
    let list = c
        .fetch_group_list(Some(group), Duration::from_secs(5))
        .ok()?;
    let g = list.groups().first()?;
    (g.state() == "Stable").then(|| g.members().len())
}

pub(crate) fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

pub(crate) fn wait_for(
    addr: &str,
    path: &str,
    what: &str,
    cond: impl Fn(u16, &str) -> bool,
) -> String {
    let mut last = String::new();
    wait_until(Duration::from_secs(60), what, || match get(addr, path) {
        Some((code, body)) => {
            let ok = cond(code, &body);
            last = body;
            ok
        }
        None => false,
    });
    last
}

/// Two workers with `--metrics-addr` in one group over one partition: the first is ready once assigned; the
/// one without a partition answers `/readyz` 503 ("no partitions assigned"), the owner 200; the owner's lag
/// gauge shows its buffered backlog exactly; after the owner stops, the other takes over and becomes ready
/// with lag 0; a fence bumped behind its back makes it not ready (fenced partition). `/healthz` is 200 throughout; the final state is exact.
#[test]
fn readyz_follows_assignment_and_fencing_and_lag_gauge_shows_backlog() {
    let (db, topic) = stage("ready", 1);
    let group = unique("g");
    // Long linger: records wait in the buffer until 8 have arrived, so the backlog is known.
    let text = SEED
        .replace("max-records = 200", "max-records = 8")
        .replace("linger-ms = 20", "linger-ms = 600000");
    let p = pipeline(&text, &topic, &group, &db.schema);
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a = spawn_run(&p, &["--metrics-addr", &a_addr], "a");
    wait_for(&a_addr, "/readyz", "a ready", |c, _| c == 200);
    let b = spawn_run(&p, &["--metrics-addr", &b_addr], "b");
    let first = wait_for(&b_addr, "/readyz", "b answers", |c, _| c == 503);
    assert!(first.starts_with("not ready: "), "{first}");
    assert_eq!(get(&b_addr, "/healthz").unwrap().0, 200);
    // Once both have joined (and probed the database), one owns p0 — whichever the assignor picked — and the
    // other's only reason is the missing partition. Right after the second join the first may still answer from
    // before the rebalance, so the owner is the one whose lag gauge then shows the backlog.
    wait_until(
        Duration::from_secs(60),
        "one ready, one without partitions",
        || {
            let (ra, rb) = (get(&a_addr, "/readyz"), get(&b_addr, "/readyz"));
            let idle = |r: &Option<(u16, String)>| {
                r.as_ref().is_some_and(|(c, t)| {
                    *c == 503
                        && t.trim()
                            .starts_with("not ready: no partitions assigned (no assignment since ")
                        && !t.trim().contains('\n')
                })
            };
            let ok = |r: &Option<(u16, String)>| r.as_ref().is_some_and(|(c, _)| *c == 200);
            (ok(&ra) && idle(&rb)) || (idle(&ra) && ok(&rb))
        },
    );
    // Readiness can answer from before the second join's rebalance: wait for the group itself to be stable with
    // both members, so no revocation flushes the backlog below while it is being looked at.
    wait_until(
        Duration::from_secs(60),
        "the group stable with 2 members",
        || stable_members(&group) == Some(2),
    );

    let (recs, _) = seed_events(13, 1);
    produce(&topic, &recs[..5]);
    let shows =
        |addr: &str| get(addr, "/metrics").is_some_and(|(_, m)| lag(&m, &topic, 0) == Some(5.0));
    let mut owner = None;
    wait_until(
        Duration::from_secs(60),
        "the owner's lag shows 5 buffered",
        || {
            owner = match (shows(&a_addr), shows(&b_addr)) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            };
            owner.is_some()
        },
    );
    let (mut own, own_addr, other, other_addr) = if owner == Some(true) {
        (a, a_addr, b, b_addr)
    } else {
        (b, b_addr, a, a_addr)
    };
    let idle = get(&other_addr, "/readyz").map(|(c, t)| (c, t.trim().to_string()));
    assert!(
        idle.as_ref().is_some_and(|(c, t)| *c == 503
            && t.starts_with("not ready: no partitions assigned (no assignment since ")
            && t.ends_with(" s ago)")),
        "the worker without the partition: {idle:?}"
    );
    assert_eq!(get(&own_addr, "/readyz").map(|(c, _)| c), Some(200));
    assert_eq!(
        db.checkpoint(&group, &topic, 0),
        Some(0),
        "nothing applied yet"
    );
    assert_eq!(
        terminate(&mut own),
        Some(0),
        "the owner applies its buffer on SIGTERM"
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(5));

    let (b_addr, mut b) = (other_addr, other);
    wait_for(
        &b_addr,
        "/readyz",
        "the other ready after taking over",
        |c, _| c == 200,
    );
    wait_for(&b_addr, "/metrics", "its lag 0", |_, m| {
        lag(m, &topic, 0) == Some(0.0)
    });

    // Another owner's fence behind b's back: b's next batch is fenced and p0 paused.
    db.execute("UPDATE {s}.replaysafe_checkpoints SET fence = fence + 1");
    produce(&topic, &recs[5..]);
    let why = wait_for(&b_addr, "/readyz", "b not ready: fenced", |c, b| {
        c == 503 && b.contains("fenced")
    });
    assert!(
        why.contains(&format!("partition {topic}/0 fenced")),
        "{why}"
    );
    assert_eq!(
        get(&b_addr, "/healthz").unwrap().0,
        200,
        "fenced is not dead"
    );
    assert_eq!(
        db.checkpoint(&group, &topic, 0),
        Some(5),
        "the fenced batch wrote nothing"
    );

    // b takes p0 back by itself once the coordinator confirms it still owns it (tests/it/load_safety.rs), or —
    // whichever comes first — a member joining the group for another topic makes everyone rebalance (eager
    // protocol): b is given p0 again, resumes it (librdkafka keeps a paused partition paused across a rebalance
    // unless told) and applies the rest from the checkpoint.
    let other_topic = new_topic("ready_other", 1);
    let q = pipeline(&text, &other_topic, &group, &db.schema);
    let mut c = spawn_run(&q, &[], "c");
    wait_until(
        Duration::from_secs(60),
        "b applies the rest after the rebalance",
        || db.checkpoint(&group, &topic, 0) == Some(13),
    );
    assert_eq!(terminate(&mut c), Some(0));
    assert_eq!(terminate(&mut b), Some(0));

    // Nothing is left for a new owner; the final state is exact.
    let out = run_text(&text, &topic, &group, &db);
    assert_eq!(out.tally().landed, 0);
    assert_eq!(counts(&db), tally_of(&recs));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 13);
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(13));
    assert_eq!(committed(&group, &topic, 1), vec![Some(13)]);
}

/// The worker's database turns read-only (what a failover to a replica looks like; here only for the worker's
/// own role: `default_transaction_read_only` on its sessions, which are then reconnected): `/readyz` answers
/// 503 naming SQLSTATE 25006 while `/healthz` stays 200; records produced meanwhile are retried (counted in
/// `replaysafe_db_retries_total{sqlstate="25006"}`), not lost;
/// once writable again the worker is ready and the final state is exact.
#[test]
fn readyz_503_while_the_database_is_read_only() {
    let (db, topic) = stage("ro", 1);
    let group = unique("g");
    let role = db.schema.clone();
    db.execute(&format!("CREATE ROLE \"{role}\" LOGIN SUPERUSER"));
    let rest = database_url().split_once('@').unwrap().1.to_string();
    let url = format!("postgresql://{role}@{rest}");
    let kick = || {
        db.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
            &[&role],
        );
    };
    let p = pipeline(SEED, &topic, &group, &db.schema);
    let addr = free_addr();
    let head = [
        "run",
        "--config",
        p.path.to_str().unwrap(),
        "--metrics-addr",
        &addr,
    ];
    let mut w = spawn(&head, &[("DATABASE_URL", &url)], p.dir.path(), "w");
    let (recs, _) = seed_events(5, 1);
    produce(&topic, &recs[..3]);
    wait_for(&addr, "/readyz", "ready", |c, _| c == 200);
    wait_until(Duration::from_secs(60), "3 applied", || {
        db.checkpoint(&group, &topic, 0) == Some(3)
    });

    db.execute(&format!(
        "ALTER ROLE \"{role}\" SET default_transaction_read_only = on"
    ));
    kick();
    let why = wait_for(&addr, "/readyz", "not ready: read-only", |c, b| {
        c == 503 && b.contains("database not writable")
    });
    assert!(why.contains("SQLSTATE 25006"), "{why}");
    assert_eq!(get(&addr, "/healthz").unwrap().0, 200);
    produce(&topic, &recs[3..]);
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(3));

    db.execute(&format!(
        "ALTER ROLE \"{role}\" RESET default_transaction_read_only"
    ));
    kick();
    wait_for(&addr, "/readyz", "ready again", |c, _| c == 200);
    wait_until(Duration::from_secs(60), "5 applied", || {
        db.checkpoint(&group, &topic, 0) == Some(5)
    });
    // The batch retried while read-only is counted under its SQLSTATE.
    let metrics = get(&addr, "/metrics").unwrap().1;
    let retries = sample(
        &metrics,
        "replaysafe_db_retries_total",
        &[("sqlstate", "25006")],
    );
    assert!(
        retries.is_some_and(|n| n >= 1.0),
        "retries by SQLSTATE 25006:\n{metrics}"
    );
    assert_eq!(terminate(&mut w), Some(0));
    assert_eq!(counts(&db), tally_of(&recs));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 5);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    assert_eq!(committed(&group, &topic, 1), vec![Some(5)]);
    let out = std::fs::read_to_string(p.dir.path().join("w.out")).unwrap();
    assert!(out.contains("consumed 5 = landed 5"), "{out}");
}
