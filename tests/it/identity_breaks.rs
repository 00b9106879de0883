//! Issue 37 under attack (break-it review b3): the log's identity kept beside each checkpoint, seen by groups
//! other than the one that ran `offsets start`, by a running worker with default settings, and by `offsets
//! start` given bad values.

use std::time::Duration;

use crate::common::*;

/// Business events into an `orders` row per entity (as tests/it/log_identity.rs).
const ORDERS: &str = concat!(
    header!(),
    r#"[batch]
max-records = 100
linger-ms = 10

[fields]
event_id = { path = "/event_id", type = "uuid" }
event_type = { path = "/event_type", type = "text" }
entity_id = { path = "/entity_id", type = "text" }
version = { path = "/version", type = "bigint" }

[identity]
key = ["event_id"]

[[projection]]
kind = "row"
table = "orders"
key = ["entity_id"]
version = "version"
columns = ["entity_id", "event_type", "version"]
"#
);

fn event(n: u32, entity: &str, ts: i64) -> Rec {
    let value = format!(
        r#"{{"event_id":"b3b30000-0000-4000-8000-000000000{n}","event_type":"OrderPlaced","entity_id":"{entity}","version":1}}"#
    );
    Rec::json(0, entity, &value, ts)
}

fn poison(entity: &str, ts: i64) -> Rec {
    Rec::json(0, entity, r#"{"event_id": "b3b3"#, ts)
}

/// `(offset, log, resolved)` of every dead letter, in offset and log order.
fn dead_letters(db: &Db) -> Vec<(i64, String, bool)> {
    db.query(
        "SELECT \"offset\", log, resolved_at IS NOT NULL FROM {s}.replaysafe_dead_letters ORDER BY 1, 2",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// The old log's poison records at offsets 1 and 2 are dead letters of the production group (tag `''`). The
/// topic is deleted and re-created; its new log holds a valid new event at offset 1 and a poison record at
/// offset 2. A backfill (its own group, a fresh checkpoint) over the new log must keep the two incarnations'
/// dead letters apart (docs/guarantees.md "A recreated topic, another cluster": "dead letters are unique per
/// (generation, log, topic, partition, offset), so the new log's malformed record at an offset the old log also
/// quarantined is a row of its own"): the old log's two stay unresolved, the new log's offset 2 is a row of its
/// own. The fresh group's checkpoint gets the tag `''` — the old log's — so the new event at offset 1 resolves
/// the old log's dead letter and the new poison record at offset 2 is dropped by `ON CONFLICT DO NOTHING`.
#[test]
fn a_backfill_on_a_recreated_topic_keeps_the_old_logs_dead_letters() {
    let (db, topic) = stage("b3_dl_bf", 1);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    produce(
        &topic,
        &[
            event(100, "o-100", t0),
            poison("o-101", t0 + 1),
            poison("o-102", t0 + 2),
        ],
    );
    run_caught_up(&p.path);
    assert_eq!(
        dead_letters(&db),
        vec![(1, String::new(), false), (2, String::new(), false)]
    );

    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    produce(
        &topic,
        &[
            event(200, "o-200", t0 + 10),
            event(201, "o-201", t0 + 11),
            poison("o-202", t0 + 12),
        ],
    );
    let out = backfill(
        &p,
        "2024-04-25",
        ("--to", "2024-04-26T00:00:00Z"),
        &unique("bf"),
        &[],
    );
    out.assert_ok();
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.orders"),
        3,
        "o-100, o-200, o-201"
    );
    let dl = dead_letters(&db);
    let old: Vec<_> = dl.iter().filter(|d| d.1.is_empty()).cloned().collect();
    assert_eq!(
        old,
        vec![(1, String::new(), false), (2, String::new(), false)],
        "the old log's dead letters untouched by the new log's records: {dl:?}"
    );
    assert_eq!(
        dl.len(),
        3,
        "the new log's poison record at offset 2 is a row of its own: {dl:?}"
    );
}

/// The same with a second consumer group sharing the ledger (a new `group-id` started on the re-created topic).
#[test]
fn a_new_group_on_a_recreated_topic_keeps_the_old_logs_dead_letters() {
    let (db, topic) = stage("b3_dl_grp", 1);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    produce(
        &topic,
        &[
            event(110, "o-110", t0),
            poison("o-111", t0 + 1),
            poison("o-112", t0 + 2),
        ],
    );
    run_caught_up(&p.path);
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    produce(
        &topic,
        &[
            event(210, "o-210", t0 + 10),
            event(211, "o-211", t0 + 11),
            poison("o-212", t0 + 12),
        ],
    );
    let q = pipeline(ORDERS, &topic, &unique("g2"), &db.schema);
    run_caught_up(&q.path);
    let dl = dead_letters(&db);
    let old: Vec<_> = dl.iter().filter(|d| d.1.is_empty()).cloned().collect();
    assert_eq!(
        old,
        vec![(1, String::new(), false), (2, String::new(), false)],
        "the old log's dead letters untouched by the new log's records: {dl:?}"
    );
    assert_eq!(
        dl.len(),
        3,
        "the new log's offset 2 is a row of its own: {dl:?}"
    );
}

/// C46 under a running worker with the default `topic.metadata.refresh.interval.ms` (the log_identity test
/// lowers it to 500 ms): the topic is deleted and re-created and its new log grows past the checkpoint. The
/// worker must stop (exit 7) without applying any of the new log, naming the topic, both ids and the stored
/// offset (docs/guarantees.md "A recreated topic, another cluster").
#[test]
fn a_running_worker_with_default_settings_stops_when_its_topic_is_recreated() {
    running_worker_on_a_recreated_topic(8);
}

/// The same while the new log is still shorter than the checkpoint (one record below it): exit 7 naming the
/// ids and the stored offset, not a generic "out of range".
#[test]
fn a_running_worker_with_default_settings_stops_when_its_topic_is_recreated_shorter() {
    running_worker_on_a_recreated_topic(1);
}

/// Waits (bounded) for `child` to exit; its code (`None`: killed at the bound).
fn exit_within(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = terminate(child);
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The stop of a worker whose topic was re-created under it names the partition, both topic ids and the stored
/// offset.
fn assert_names(err: &str, parts: &[String]) {
    for part in parts {
        assert!(err.contains(part.as_str()), "`{part}` in:\n{err}");
    }
}

/// The shorter new log with the watch blinded (failpoint `logwatch-blind`: librdkafka's announcement is missed): the
/// position out of range on the new log asks the broker for the ids and still stops with exit 7 naming both ids and
/// the stored offset, not as records lost to retention.
#[test]
fn a_shorter_new_log_is_named_from_the_out_of_range_position_when_the_announcement_is_missed() {
    running_worker_on_a_recreated_topic_with(
        1,
        &[("REPLAYSAFE_FAILPOINTS", "logwatch-blind=return")],
    );
}

fn running_worker_on_a_recreated_topic(new_records: u32) {
    running_worker_on_a_recreated_topic_with(new_records, &[]);
}

fn running_worker_on_a_recreated_topic_with(new_records: u32, envs: &[(&str, &str)]) {
    let (db, topic) = stage("b3_live", 1);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    produce(
        &topic,
        &[
            event(120, "o-120", t0),
            event(121, "o-121", t0 + 1),
            event(122, "o-122", t0 + 2),
        ],
    );
    let (_, a) = crate::log_identity::ids_of(&p, &brokers(), &topic);
    let mut child = spawn(
        &["run", "--config", arg(&p.path)],
        envs,
        p.dir.path(),
        "run",
    );
    wait_until(Duration::from_secs(60), "the old log applied", || {
        db.i64("SELECT (to_regclass('{s}.replaysafe_checkpoints') IS NOT NULL)::int::bigint") == 1
            && db.checkpoint(&group, &topic, 0) == Some(3)
    });
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    let recs: Vec<Rec> = (0..new_records)
        .map(|i| event(220 + i, &format!("o-22{i}"), t0 + 10 + i64::from(i)))
        .collect();
    produce(&topic, &recs);
    let (_, b) = crate::log_identity::ids_of(&p, &brokers(), &topic);
    let code = exit_within(&mut child, Duration::from_secs(120));
    let err = std::fs::read_to_string(p.dir.path().join("run.err")).unwrap();
    let ledger = db.i64("SELECT count(*) FROM {s}.replaysafe_ledger");
    let cp = db.checkpoint(&group, &topic, 0);
    eprintln!("code {code:?} ledger {ledger} checkpoint {cp:?}\n{err}");
    assert_eq!(ledger, 3, "nothing of the new log applied");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.orders"), 3);
    assert_eq!(
        cp,
        Some(3),
        "the checkpoint stays where the old log left it"
    );
    assert_eq!(code, Some(7), "{err}");
    assert_names(
        &err,
        &[
            format!("{topic}/0"),
            a,
            b,
            "next offset 3".into(),
            "re-created".into(),
        ],
    );
}

/// Three workers under an incremental protocol, one killed with SIGKILL mid-stream (its partitions move only
/// after `session.timeout.ms`, its in-flight batch lost), one SIGSTOPped past the session timeout and resumed
/// (a zombie whose partitions were lost, not revoked): every event counted once, no partition stalled, Kafka's
/// committed offsets equal to the checkpoints.
fn kill_and_freeze(prefix: &str, properties: &str) {
    use crate::core::{counts, seed_events, SEED};
    const PARTS: i32 = 6;
    const N: usize = 3000;
    let (db, topic) = stage(prefix, PARTS);
    let (recs, truth) = seed_events(N, PARTS);
    let group = unique("g");
    let text = format!("{SEED}\n[kafka.properties]\n{properties}\n");
    let base = pipeline(&text, &topic, &group, &db.schema);
    let dir = base.dir.path();
    let slow = [("REPLAYSAFE_FAILPOINTS", "before-db-commit=sleep(200)")];
    let start = |name: &str| spawn(&["run", "--config", arg(&base.path)], &slow, dir, name);
    let third = N / 3;
    let mut offsets = produce(&topic, &recs[..third]);
    let mut a = start("a");
    let mut b = start("b");
    let mut c = start("c");
    std::thread::sleep(Duration::from_secs(8));
    offsets.extend(produce(&topic, &recs[third..2 * third]));
    unsafe_kill(a.id(), "KILL");
    let _ = a.wait();
    unsafe_kill(b.id(), "STOP");
    offsets.extend(produce(&topic, &recs[2 * third..]));
    std::thread::sleep(Duration::from_secs(16));
    unsafe_kill(b.id(), "CONT");
    let last: Vec<Option<i64>> = (0..PARTS)
        .map(|p| {
            recs.iter()
                .zip(&offsets)
                .filter(|(r, _)| r.partition == p)
                .map(|(_, o)| *o)
                .max()
        })
        .collect();
    let at_end =
        || (0..PARTS).all(|p| db.checkpoint(&group, &topic, p) == last[p as usize].map(|l| l + 1));
    wait_until(
        Duration::from_secs(120),
        "every partition at its end",
        at_end,
    );
    std::thread::sleep(Duration::from_secs(3));
    let cb = terminate(&mut b);
    let cc = terminate(&mut c);
    eprintln!("b exit {cb:?}, c exit {cc:?}");
    assert_eq!(counts(&db), truth, "each event counted once");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        N as i64
    );
    let committed = committed(&group, &topic, PARTS);
    for p in 0..PARTS {
        assert_eq!(
            committed[p as usize],
            db.checkpoint(&group, &topic, p),
            "partition {p}"
        );
    }
}

#[test]
fn cooperative_sticky_survives_a_kill_and_a_zombie() {
    kill_and_freeze(
        "b3_coop_kill",
        "\"partition.assignment.strategy\" = \"cooperative-sticky\"\n\"session.timeout.ms\" = \"6000\"\n\
         \"heartbeat.interval.ms\" = \"1000\"",
    );
}

#[test]
fn kip848_survives_a_kill_and_a_zombie() {
    kill_and_freeze("b3_848_kill", "\"group.protocol\" = \"consumer\"");
}

/// `offsets start` under a running owner (docs: "a running owner is fenced and takes the new position over"):
/// the worker re-reads from the new start, every re-read record a duplicate, and later records land.
#[test]
fn offsets_start_under_a_running_owner_is_taken_over() {
    let (db, topic) = stage("b3_start_live", 1);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    let recs: Vec<Rec> = (0..6)
        .map(|i| event(300 + i, &format!("o-30{i}"), t0 + i64::from(i)))
        .collect();
    produce(&topic, &recs);
    let mut child = spawn_run(&p, &[], "run");
    wait_until(Duration::from_secs(60), "applied", || {
        db.i64("SELECT (to_regclass('{s}.replaysafe_checkpoints') IS NOT NULL)::int::bigint") == 1
            && db.checkpoint(&group, &topic, 0) == Some(6)
    });
    let out = replaysafe(&[
        "offsets",
        "start",
        "--config",
        arg(&p.path),
        "--from-offset",
        "2",
    ]);
    out.assert_ok();
    produce(&topic, &[event(310, "o-310", t0 + 10)]);
    wait_until(Duration::from_secs(60), "the new record applied", || {
        db.checkpoint(&group, &topic, 0) == Some(7)
    });
    assert_eq!(terminate(&mut child), Some(0));
    let out = std::fs::read_to_string(p.dir.path().join("run.out")).unwrap();
    eprintln!("{out}");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 7);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.orders"), 7);
    assert_eq!(committed(&group, &topic, 1), vec![Some(7)]);
}

/// `offsets start --group` naming a group without checkpoints (misspelled) is refused (exit 2) naming the group,
/// the groups that have checkpoints of the topic and how to list them all; nothing is written — neither a
/// checkpoint row of the misspelled group nor a retired copy, and the real group's checkpoint stays. Before any
/// `run` (no checkpoints table) it is refused the same way.
#[test]
fn offsets_start_refuses_a_group_without_checkpoints() {
    let (db, topic) = stage("b3_start_group", 1);
    let group = unique("orders");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    produce(
        &topic,
        &[event(400, "o-400", t0), event(401, "o-401", t0 + 1)],
    );
    let start = |g: &str| {
        replaysafe(&[
            "offsets",
            "start",
            "--config",
            arg(&p.path),
            "--group",
            g,
            "--from-earliest",
        ])
    };
    let before = start(&group);
    assert_eq!(before.code, Some(2), "{}", before.stderr);
    assert!(
        before
            .stderr
            .contains(&format!("group `{group}` has no checkpoints"))
            && before.stderr.contains("does not exist"),
        "{}",
        before.stderr
    );
    run_caught_up(&p.path);
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(2));
    let typo = format!("{group}x");
    let out = start(&typo);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    for part in [
        format!("group `{typo}` has no checkpoint of {topic}"),
        format!("`{group}`"),
        "SELECT consumer_group".to_string(),
        "Nothing was changed".to_string(),
    ] {
        assert!(out.stderr.contains(&part), "`{part}` in:\n{}", out.stderr);
    }
    assert_eq!(
        db.strings("SELECT DISTINCT consumer_group FROM {s}.replaysafe_checkpoints"),
        vec![group.clone()]
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_checkpoints_retired"),
        0
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(2));
    // The group meant is accepted.
    let ok = start(&group);
    ok.assert_ok();
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(0));
}

/// A worker's partitions on topic `topic`, their checkpoints: `(partition, next offset)` of every checkpoint row.
fn checkpoints(db: &Db, group: &str, topic: &str) -> Vec<(i32, Option<i64>)> {
    db.query(
        "SELECT partition, next_offset FROM {s}.replaysafe_checkpoints WHERE consumer_group = $1 AND topic = $2 \
         ORDER BY 1",
        &[&group, &topic],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The entities in `orders`, sorted.
fn entities(db: &Db) -> Vec<String> {
    db.strings("SELECT entity_id FROM {s}.orders ORDER BY 1")
}

/// Break-it: the topic re-created with more partitions under a worker of a cooperative group (the kept partition
/// 0 is not revoked; the new partitions 1 and 2 are assigned incrementally on the new log). The worker stops with
/// exit 7 naming partition 0; nothing of the new log below or past partition 0's checkpoint is applied; the new
/// partitions, if taken over before the stop, are positioned on the new log (never past its records).
#[test]
fn a_topic_recreated_with_more_partitions_under_a_cooperative_worker_stops_it() {
    let (db, topic) = stage("b3_live_more", 1);
    let group = unique("g");
    let text = format!(
        "{ORDERS}\n[kafka.properties]\n\"partition.assignment.strategy\" = \"cooperative-sticky\"\n"
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    produce(
        &topic,
        &[
            event(500, "o-500", t0),
            event(501, "o-501", t0 + 1),
            event(502, "o-502", t0 + 2),
        ],
    );
    let (_, a) = crate::log_identity::ids_of(&p, &brokers(), &topic);
    let mut child = spawn_run(&p, &[], "run");
    wait_until(Duration::from_secs(60), "the old log applied", || {
        db.i64("SELECT (to_regclass('{s}.replaysafe_checkpoints') IS NOT NULL)::int::bigint") == 1
            && db.checkpoint(&group, &topic, 0) == Some(3)
    });
    delete_topic(&topic);
    create_topic(&topic, 3, &[]);
    let recs: Vec<Rec> = (0..12u32)
        .map(|i| Rec {
            partition: (i % 3) as i32,
            ..event(510 + i, &format!("o-51{i:02}"), t0 + 10 + i64::from(i))
        })
        .collect();
    produce(&topic, &recs);
    let (_, b) = crate::log_identity::ids_of(&p, &brokers(), &topic);
    let code = exit_within(&mut child, Duration::from_secs(120));
    let err = std::fs::read_to_string(p.dir.path().join("run.err")).unwrap();
    let cps = checkpoints(&db, &group, &topic);
    eprintln!("code {code:?} checkpoints {cps:?}\n{err}");
    assert_eq!(
        entities(&db),
        vec!["o-500", "o-501", "o-502"],
        "nothing of the new log applied"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 3);
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(3));
    // A new partition taken over before the stop starts on the new log at its beginning, nothing applied.
    for (partition, next) in &cps {
        if *partition > 0 {
            assert_eq!(*next, Some(0), "partition {partition}: {cps:?}");
        }
    }
    assert_eq!(code, Some(7), "{err}");
    assert_names(&err, &[format!("{topic}/0"), a, b, "next offset 3".into()]);
}

/// Break-it: the topic re-created while a second worker joins the group (the rebalance under way). Every worker
/// ends with exit 7 (through the take-over check or through the watch), nothing of the new log applied, the
/// checkpoints where the old log left them.
#[test]
fn a_topic_recreated_during_a_rebalance_stops_both_workers() {
    let (db, topic) = stage("b3_live_rebal", 2);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    let old: Vec<Rec> = (0..6u32)
        .map(|i| Rec {
            partition: (i % 2) as i32,
            ..event(600 + i, &format!("o-60{i}"), t0 + i64::from(i))
        })
        .collect();
    produce(&topic, &old);
    let mut x = spawn_run(&p, &[], "x");
    wait_until(Duration::from_secs(60), "the old log applied", || {
        db.i64("SELECT (to_regclass('{s}.replaysafe_checkpoints') IS NOT NULL)::int::bigint") == 1
            && checkpoints(&db, &group, &topic) == vec![(0, Some(3)), (1, Some(3))]
    });
    let mut y = spawn_run(&p, &[], "y");
    let y_err = p.dir.path().join("y.err");
    wait_until(
        Duration::from_secs(60),
        "the second worker subscribed",
        || std::fs::read_to_string(&y_err).is_ok_and(|e| e.contains("consuming")),
    );
    // The join's rebalance is under way (y's JoinGroup makes the coordinator rebalance x too).
    std::thread::sleep(Duration::from_millis(300));
    delete_topic(&topic);
    create_topic(&topic, 2, &[]);
    let new: Vec<Rec> = (0..10u32)
        .map(|i| Rec {
            partition: (i % 2) as i32,
            ..event(610 + i, &format!("o-61{i}"), t0 + 10 + i64::from(i))
        })
        .collect();
    produce(&topic, &new);
    let cx = exit_within(&mut x, Duration::from_secs(150));
    let cy = exit_within(&mut y, Duration::from_secs(150));
    let ex = std::fs::read_to_string(p.dir.path().join("x.err")).unwrap();
    let ey = std::fs::read_to_string(p.dir.path().join("y.err")).unwrap();
    eprintln!("x {cx:?} y {cy:?}\n--- x\n{ex}\n--- y\n{ey}");
    assert_eq!(
        entities(&db),
        vec!["o-600", "o-601", "o-602", "o-603", "o-604", "o-605"],
        "nothing of the new log applied"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 6);
    assert_eq!(
        checkpoints(&db, &group, &topic),
        vec![(0, Some(3)), (1, Some(3))]
    );
    assert_eq!((cx, cy), (Some(7), Some(7)), "x:\n{ex}\ny:\n{ey}");
}

/// Break-it: the topic re-created while a batch of the old log is in flight (its transaction held before COMMIT
/// by the `hold-before-db-commit` failpoint until the new log has records). The old log's batch commits (its records are the old log's); the worker
/// stops with exit 7; nothing of the new log applied; the checkpoint is where the old log's records end.
#[test]
fn a_topic_recreated_while_a_batch_is_in_flight_lets_only_the_old_logs_batch_commit() {
    let (db, topic) = stage("b3_live_flight", 1);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    produce(
        &topic,
        &[event(700, "o-700", t0), event(701, "o-701", t0 + 1)],
    );
    let (_, a) = crate::log_identity::ids_of(&p, &brokers(), &topic);
    let release = p.dir.path().join("release");
    let hold = format!("hold-before-db-commit=1*return({})", release.display());
    let mut child = spawn(
        &["run", "--config", arg(&p.path)],
        &[("REPLAYSAFE_FAILPOINTS", hold.as_str())],
        p.dir.path(),
        "run",
    );
    let err_path = p.dir.path().join("run.err");
    // The first batch (offsets 0, 1) is held before its COMMIT.
    let held = p.dir.path().join("release.held");
    wait_until(Duration::from_secs(60), "the first batch held", || {
        held.exists()
    });
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    let new: Vec<Rec> = (0..6u32)
        .map(|i| event(710 + i, &format!("o-71{i}"), t0 + 10 + i64::from(i)))
        .collect();
    produce(&topic, &new);
    let (_, b) = crate::log_identity::ids_of(&p, &brokers(), &topic);
    std::fs::write(&release, "").unwrap();
    let code = exit_within(&mut child, Duration::from_secs(120));
    let err = std::fs::read_to_string(&err_path).unwrap();
    eprintln!("code {code:?}\n{err}");
    assert_eq!(
        entities(&db),
        vec!["o-700", "o-701"],
        "only the old log applied"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 2);
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(2));
    assert_eq!(code, Some(7), "{err}");
    assert_names(&err, &[format!("{topic}/0"), a, b]);
}

/// C46 under a running worker of a KIP-848 group (`group.protocol = consumer`: the broker assigns partitions by
/// topic id, so the re-created topic's partition is a new assignment).
#[test]
fn a_running_kip848_worker_stops_when_its_topic_is_recreated() {
    let (db, topic) = stage("b3_live_848", 1);
    let group = unique("g");
    let text = format!("{ORDERS}\n[kafka.properties]\n\"group.protocol\" = \"consumer\"\n");
    let p = pipeline(&text, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    produce(
        &topic,
        &[
            event(800, "o-800", t0),
            event(801, "o-801", t0 + 1),
            event(802, "o-802", t0 + 2),
        ],
    );
    let mut child = spawn_run(&p, &[], "run");
    wait_until(Duration::from_secs(60), "the old log applied", || {
        db.i64("SELECT (to_regclass('{s}.replaysafe_checkpoints') IS NOT NULL)::int::bigint") == 1
            && db.checkpoint(&group, &topic, 0) == Some(3)
    });
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    let new: Vec<Rec> = (0..8u32)
        .map(|i| event(810 + i, &format!("o-81{i}"), t0 + 10 + i64::from(i)))
        .collect();
    produce(&topic, &new);
    let code = exit_within(&mut child, Duration::from_secs(120));
    let err = std::fs::read_to_string(p.dir.path().join("run.err")).unwrap();
    eprintln!("code {code:?}\n{err}");
    assert_eq!(
        entities(&db),
        vec!["o-800", "o-801", "o-802"],
        "nothing of the new log applied"
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(3));
    assert_eq!(code, Some(7), "{err}");
}
