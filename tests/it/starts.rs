//! Where a partition starts without a checkpoint in its generation: partitions added to a running group, and a
//! changed `[identity] generation` on the same topic or a recreated one (docs/guarantees.md "Where a partition
//! starts").

use std::time::Duration;

use crate::common::*;
use crate::core::{counts, seed_events, SEED};
use crate::projection_builds::BASE;

fn ledger(db: &Db) -> i64 {
    db.i64("SELECT count(*) FROM {s}.replaysafe_ledger")
}

fn event(partition: i32, n: u32) -> Rec {
    Rec::json(
        partition,
        "c",
        &format!(
            r#"{{"event_id":"{}","customer_id":"c","amount":"1","occurred_at":"2024-04-25T10:00:00Z"}}"#,
            uuid::Uuid::from_u128(u128::from(n) + 0xabc0_0000)
        ),
        1_714_039_200_000,
    )
}

/// Issue 19.2: under `start = "latest"` a partition added to the topic while the group runs holds only new
/// records: it is read from its beginning (it used to start at its end and skip its first record).
#[test]
fn a_partition_added_under_start_latest_is_read_from_its_beginning() {
    let (db, topic) = stage("addpart", 1);
    // Records before the group began: `latest` skips them.
    produce(&topic, &[event(0, 1), event(0, 2)]);
    let group = unique("g");
    // Metadata refreshed often, so the running group sees the new partition at once.
    let text = SEED.replace(
        "start = \"earliest\"\n",
        "start = \"latest\"\n[kafka.properties]\n\"topic.metadata.refresh.interval.ms\" = \"500\"\n",
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let mut child = spawn_run(&p, &[], "run");
    wait_until(Duration::from_secs(60), "partition 0 assigned", || {
        db.i64("SELECT (to_regclass('{s}.replaysafe_checkpoints') IS NOT NULL)::int::bigint") == 1
            && db.query(
            "SELECT 1 FROM {s}.replaysafe_checkpoints WHERE topic = $1 AND partition = 0 AND next_offset = 2",
            &[&topic],
        )
        .len()
            == 1
    });
    produce(&topic, &[event(0, 3)]);
    add_partitions(&topic, 2);
    produce(&topic, &[event(1, 4)]);
    std::thread::sleep(Duration::from_secs(3));
    produce(&topic, &[event(1, 5)]);
    wait_until(Duration::from_secs(60), "both partitions applied", || {
        db.checkpoint(&group, &topic, 0) == Some(3) && db.checkpoint(&group, &topic, 1) == Some(2)
    });
    assert_eq!(terminate(&mut child), Some(0));
    let out = std::fs::read_to_string(p.dir.path().join("run.out")).unwrap();
    let err = std::fs::read_to_string(p.dir.path().join("run.err")).unwrap();
    assert!(
        out.contains("consumed 3 = landed 3 + duplicate 0 + filtered 0 + quarantined 0"),
        "{out}\n{err}"
    );
    assert!(
        err.contains("partition added after the group began"),
        "{err}"
    );
    assert_eq!(ledger(&db), 3);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger l JOIN {s}.replaysafe_sources src ON src.id = l._source_id WHERE partition = 1"),
        2,
        "both records of the added partition are in the ledger"
    );
    assert_eq!(counts(&db).values().sum::<i64>(), 3);
    assert_eq!(
        db.i64("SELECT partitions::bigint FROM {s}.replaysafe_group_starts"),
        1,
        "the group began with one partition"
    );
}

/// The generation of a running pipeline, changed on the same topic after a crash between the database commit
/// and the Kafka commit.
fn generation(text: &str, g: &str) -> String {
    text.replace(
        "key = [\"event_id\"]",
        &format!("key = [\"event_id\"]\ngeneration = \"{g}\""),
    )
}

/// The seed pipeline under generation `g`, for `group` on `topic` into `db`'s schema.
fn seed_generation(g: &str, topic: &str, group: &str, db: &Db) -> Pipeline {
    pipeline(&generation(SEED, g), topic, group, &db.schema)
}

/// Issue 20.4: a generation bump on a topic that was not recreated continues from the earlier generation's
/// checkpoint (the record it applied last is still at its offset) — it used to fall back to Kafka's committed
/// offset, which lags after a crash, and land the records in between again under new delivery keys.
#[test]
fn a_generation_bump_on_the_same_topic_continues_from_the_old_checkpoint() {
    let (db, topic) = stage("genbump", 2);
    let (recs, truth) = seed_events(300, 2);
    produce(&topic, &recs[..200]);
    let group = unique("g");
    let g1 = seed_generation("g1", &topic, &group, &db);
    run_caught_up(&g1.path).assert_ok();
    // More records, applied in the database but never acknowledged to Kafka (a crash between the two commits).
    produce(&topic, &recs[200..250]);
    let crash = try_run_with(&g1.path, &[CRASH_AFTER_DB_COMMIT], Duration::from_secs(120));
    assert_ne!(crash.code, Some(0), "the crash failpoint fired");
    let applied = ledger(&db);
    let acked: i64 = committed(&group, &topic, 2)
        .iter()
        .map(|o| o.unwrap_or(0))
        .sum();
    assert!(
        applied > 200 && acked < applied,
        "applied {applied}, Kafka's committed offsets lag at {acked}"
    );
    produce(&topic, &recs[250..]);
    let g2 = seed_generation("g2", &topic, &group, &db);
    let out = run_caught_up(&g2.path);
    let t = out.tally();
    let rest = 300 - applied as u64;
    assert_eq!((t.consumed, t.landed), (rest, rest), "{}", out.stderr);
    assert!(out.stderr.contains("topic unchanged"), "{}", out.stderr);
    assert_eq!(counts(&db), truth, "every event counted once");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE generation = 'g2'"),
        300 - applied
    );
}

/// Issue 20.4, the other direction: a generation bump on a recreated topic starts at its beginning even when
/// the new topic already has more records than the old checkpoint (the record at the old generation's last
/// offset is another one).
#[test]
fn a_generation_bump_on_a_recreated_topic_starts_at_its_beginning() {
    let (db, topic) = stage("genrecreate", 1);
    let (first, _) = seed_events(50, 1);
    produce(&topic, &first);
    let group = unique("g");
    let g1 = seed_generation("g1", &topic, &group, &db);
    assert_eq!(run_caught_up(&g1.path).assert_ok().tally().landed, 50);
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    let (second, _) = seed_events(120, 1);
    produce(&topic, &second);
    let g2 = seed_generation("g2", &topic, &group, &db);
    let out = run_caught_up(&g2.path);
    let t = out.tally();
    assert_eq!((t.consumed, t.landed), (120, 120), "{}", out.stderr);
    assert!(out.stderr.contains("topic recreated"), "{}", out.stderr);
    assert_eq!(ledger(&db), 170);
}

/// A checkpoint written before fingerprints existed cannot tell the same topic from a recreated one: the
/// generation change is refused with exit 3 and nothing is consumed.
#[test]
fn a_generation_bump_without_a_fingerprint_is_refused() {
    let (db, topic) = stage("genlegacy", 1);
    let (recs, _) = seed_events(40, 1);
    produce(&topic, &recs);
    let group = unique("g");
    let g1 = seed_generation("g1", &topic, &group, &db);
    run_caught_up(&g1.path).assert_ok();
    // As an earlier version wrote it: no fingerprint, no log ids (with ids, the ids decide: `log_identity`).
    db.execute(
        "UPDATE {s}.replaysafe_checkpoints SET last_offset = NULL, last_sha256 = NULL, topic_id = NULL, cluster_id = NULL",
    );
    let g2 = seed_generation("g2", &topic, &group, &db);
    let out = try_run(&g2.path);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(
        out.stderr.contains("no record fingerprint"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!(
            "UPDATE \"{}\".\"replaysafe_checkpoints\" SET next_offset = 40",
            db.schema
        )),
        "the statement to run names the pipeline's schema: {}",
        out.stderr
    );
    assert_eq!(ledger(&db), 40);
}

/// A partition that was empty while the old generation ran has a checkpoint at 0 and no fingerprint: nothing
/// lies between the log start and it, so a generation bump reads it from its beginning instead of refusing the
/// whole run with exit 3 ("written by an earlier replaysafe"); the other partition continues from its checkpoint.
#[test]
fn a_generation_bump_with_a_partition_empty_before_continues() {
    let (db, topic) = stage("genempty", 2);
    produce(&topic, &[event(0, 1), event(0, 2)]);
    let group = unique("g");
    let g1 = seed_generation("g1", &topic, &group, &db);
    assert_eq!(run_caught_up(&g1.path).tally().landed, 2);
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(0));
    produce(&topic, &[event(0, 3), event(1, 4), event(1, 5)]);
    let g2 = seed_generation("g2", &topic, &group, &db);
    let out = run_caught_up(&g2.path);
    out.assert_ok();
    let t = out.tally();
    assert_eq!((t.consumed, t.landed), (3, 3), "{}", out.stderr);
    assert!(
        out.stderr.contains("at or below the log start")
            || out.stderr.contains("applied no record of this partition")
            || out.stderr.contains("topic unchanged (topic id"),
        "{}",
        out.stderr
    );
    assert_eq!(ledger(&db), 5);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE generation = 'g2'"),
        3
    );
    assert_eq!(counts(&db).values().sum::<i64>(), 5);
}

/// A generation change on a compacted topic whose cleaner removed the record the old generation applied last
/// (a later record of the same key superseded it): reading that offset back returns a later record. That is not
/// evidence of a recreated topic — starting at the beginning would land every record again under new delivery
/// keys. Refused with exit 3, nothing consumed; after the operator's decision (continue), only the new records
/// land.
#[test]
fn a_generation_bump_after_compaction_removed_the_last_record_is_refused() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let db = Db::fresh("gencompact");
    let topic = unique("gencompact");
    create_topic(
        &topic,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.001"),
            ("min.compaction.lag.ms", "0"),
        ],
    );
    let keyed = |key: &str, n: u32| {
        let mut r = event(0, n);
        r.key = Some(key.as_bytes().to_vec());
        // Segments roll by record time: each record a second after the one before.
        r.timestamp_ms = r.timestamp_ms.map(|t| t + i64::from(n) * 1_000);
        r
    };
    produce(&topic, &[keyed("k1", 1), keyed("k2", 2)]);
    let group = unique("g");
    let g1 = seed_generation("g1", &topic, &group, &db);
    assert_eq!(run_caught_up(&g1.path).assert_ok().tally().landed, 2);
    // k2 again (supersedes offset 1), then records that roll the segments so the cleaner may clean them.
    for (i, k) in ["k2", "k3", "k4", "k5"].iter().enumerate() {
        std::thread::sleep(Duration::from_millis(300));
        produce(&topic, &[keyed(k, 3 + i as u32)]);
    }
    let first_from_1 = || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", unique("peek"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Offset(1))
            .unwrap();
        c.assign(&tpl).unwrap();
        for _ in 0..20 {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(250)) {
                return m.offset();
            }
        }
        -1
    };
    wait_until(
        Duration::from_secs(120),
        "the cleaner removed offset 1",
        || {
            std::thread::sleep(Duration::from_secs(1));
            first_from_1() > 1
        },
    );
    // Checkpoints of an earlier version (no log ids): the read-back decides. With the topic id recorded, the same
    // id says the topic is the same one and the partition continues (`log_identity`).
    db.execute("UPDATE {s}.replaysafe_checkpoints SET topic_id = NULL, cluster_id = NULL");
    let g2 = seed_generation("g2", &topic, &group, &db);
    let out = try_run(&g2.path);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(
        out.stderr.contains("no longer in the log"),
        "{}",
        out.stderr
    );
    assert_eq!(ledger(&db), 2, "nothing landed again");
    // The operator decides as the message says: the topic is the same one, continue at g1's checkpoint.
    assert!(
        out.stderr.contains("SET next_offset = 2 WHERE")
            && out.stderr.contains("generation = 'g2'"),
        "{}",
        out.stderr
    );
    db.execute(&format!(
        "UPDATE {{s}}.replaysafe_checkpoints SET next_offset = 2 WHERE consumer_group = '{group}' \
         AND generation = 'g2' AND topic = '{topic}' AND partition = 0"
    ));
    let out = run_caught_up(&g2.path);
    let t = out.assert_ok().tally();
    assert_eq!((t.consumed, t.landed), (4, 4), "{}", out.stderr);
    assert_eq!(ledger(&db), 6);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE generation = 'g2'"),
        4
    );
    assert_eq!(
        counts(&db).values().sum::<i64>(),
        6,
        "every event counted once"
    );
}

/// A partition that goes back to a worker of an earlier generation (a rolling deploy of a generation change,
/// with partitions moving between old and new workers, or a rollback of the change): the earlier generation's
/// checkpoint is older than what the newer generation applied since. Resuming from it would land the records
/// in between again under the earlier generation's delivery keys; the partition continues from the newest
/// checkpoint of the group (the same record read back), and every event is counted once.
#[test]
fn a_partition_back_in_an_earlier_generation_continues_from_the_newest_checkpoint() {
    let (db, topic) = stage("genback", 2);
    let (recs, truth) = seed_events(300, 2);
    let group = unique("g");
    let g1 = seed_generation("g1", &topic, &group, &db);
    let g2 = seed_generation("g2", &topic, &group, &db);
    produce(&topic, &recs[..100]);
    assert_eq!(run_caught_up(&g1.path).assert_ok().tally().landed, 100);
    produce(&topic, &recs[100..200]);
    let out = run_caught_up(&g2.path);
    assert_eq!(out.assert_ok().tally().landed, 100, "{}", out.stderr);
    produce(&topic, &recs[200..]);
    // The old worker gets the partitions back.
    let out = run_caught_up(&g1.path);
    let t = out.assert_ok().tally();
    assert_eq!((t.consumed, t.landed), (100, 100), "{}", out.stderr);
    assert_eq!(counts(&db), truth, "every event counted once");
    assert_eq!(ledger(&db), 300);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE generation = 'g1'"),
        200
    );
    // And forward again: nothing is read twice.
    let out = run_caught_up(&g2.path);
    assert_eq!(out.assert_ok().tally().consumed, 0, "{}", out.stderr);
    assert_eq!(ledger(&db), 300);
}

/// A generation change on a topic with a partition the earlier generation was assigned but never applied a
/// record of (no record there yet): its checkpoint holds a start position and no fingerprint — not a
/// checkpoint of an earlier replaysafe. The change is not refused: the idle partition starts at its beginning,
/// the others continue from their checkpoints, and every event is counted once.
#[test]
fn a_generation_bump_with_an_idle_partition_is_not_refused() {
    let (db, topic) = stage("genidle", 2);
    let (recs, truth) = seed_events(60, 1);
    produce(&topic, &recs[..40]);
    let group = unique("g");
    let g1 = seed_generation("g1", &topic, &group, &db);
    assert_eq!(run_caught_up(&g1.path).assert_ok().tally().landed, 40);
    // The rest arrives on the partition that was idle under g1.
    let later: Vec<Rec> = recs[40..]
        .iter()
        .cloned()
        .map(|mut r| {
            r.partition = 1;
            r
        })
        .collect();
    produce(&topic, &later);
    let g2 = seed_generation("g2", &topic, &group, &db);
    let out = run_caught_up(&g2.path);
    let t = out.assert_ok().tally();
    assert_eq!((t.consumed, t.landed), (20, 20), "{}", out.stderr);
    assert_eq!(counts(&db), truth, "every event counted once");
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM {s}.replaysafe_ledger l JOIN {s}.replaysafe_sources src ON src.id = l._source_id WHERE generation = 'g2' AND partition = 1"
        ),
        20
    );
}

/// A generation change after retention deleted the old generation's last record *and* records it had not
/// applied yet: the partition must not start at the log start silently (records between the old checkpoint and
/// the log start were never applied). As without a generation change, the run refuses before consuming,
/// naming the lost offsets.
#[test]
fn a_generation_bump_past_records_lost_to_retention_is_refused() {
    let (db, topic) = stage("genlost", 1);
    let (recs, _) = seed_events(30, 1);
    produce(&topic, &recs[..10]);
    let group = unique("g");
    let g1 = seed_generation("g1", &topic, &group, &db);
    assert_eq!(run_caught_up(&g1.path).assert_ok().tally().landed, 10);
    produce(&topic, &recs[10..]);
    delete_records_before(&topic, 0, 15);
    let g2 = seed_generation("g2", &topic, &group, &db);
    let out = try_run(&g2.path);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("10..15"), "{}", out.stderr);
    assert_eq!(ledger(&db), 10, "nothing consumed");
}

/// Kafka's committed offsets behind the checkpoints (commits that failed while a broker restarted and the group
/// coordinator was loading: nothing retried them) are committed again by a running member once it holds the
/// partitions and is idle — not only when new records arrive (the chaos harness's `broker` scenario saw them
/// stay behind). The checkpoints, ledger and table are not touched.
#[test]
fn a_running_member_commits_checkpoints_kafka_has_behind() {
    let (db, topic) = stage("recommit", 2);
    let records: Vec<Rec> = (0..10).map(|n| event(n as i32 % 2, n)).collect();
    produce(&topic, &records);
    let group = unique("g");
    let p = pipeline(SEED, &topic, &group, &db.schema);
    run_caught_up(&p.path);
    assert_eq!(committed(&group, &topic, 2), vec![Some(5), Some(5)]);

    // Lost commits: Kafka's committed offsets set back to 1 (the group has no member now).
    // No auto commit: closing would commit the consumer's own position.
    let c = consumer(&[
        ("group.id", group.as_str()),
        ("enable.auto.commit", "false"),
    ]);
    let mut tpl = rdkafka::TopicPartitionList::new();
    for part in 0..2 {
        tpl.add_partition_offset(&topic, part, rdkafka::Offset::Offset(1))
            .unwrap();
    }
    rdkafka::consumer::Consumer::assign(&c, &tpl).unwrap();
    rdkafka::consumer::Consumer::commit(&c, &tpl, rdkafka::consumer::CommitMode::Sync).unwrap();
    drop(c);
    assert_eq!(committed(&group, &topic, 2), vec![Some(1), Some(1)]);

    // A running member with nothing new to read commits its checkpoints.
    let mut child = spawn_run(&p, &[], "run");
    wait_until(
        Duration::from_secs(60),
        "committed offsets = checkpoints",
        || committed(&group, &topic, 2) == vec![Some(5), Some(5)],
    );
    assert_eq!(terminate(&mut child), Some(0));
    let out = std::fs::read_to_string(p.dir.path().join("run.out")).unwrap();
    assert!(
        out.contains("consumed 0 = landed 0 + duplicate 0 + filtered 0 + quarantined 0"),
        "{out}"
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(5));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(5));
    assert_eq!(ledger(&db), 10);
}

/// Another writer (`load --take-over`, here the fence bumped by hand) takes a partition over between the
/// worker's take-over and the write of its start (a partition without a checkpoint, positioned from `start`):
/// the worker pauses it and takes it back once the group confirms the assignment — it does not exit, and every
/// event lands once.
#[test]
fn a_fence_bumped_while_the_start_is_written_is_taken_back_not_fatal() {
    let (db, topic) = stage("bkstart", 1);
    let group = unique("g");
    let text = format!(
        "{BASE}[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n"
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    let recs: Vec<Rec> = (0..40)
        .map(|i| {
            let v = format!(r#"{{"id":"e{i}","cust":"c","day":"2026-07-01"}}"#);
            Rec::json(0, "k", &v, 1_782_864_000_000)
        })
        .collect();
    produce(&topic, &recs[..20]);
    // The worker holds between its take-over and the write of the start until `release` exists: the fence is
    // bumped in that window whatever the machine's speed.
    let release = p.dir.path().join("release");
    let failpoint = format!("hold-before-write-start=1*return({})", release.display());
    let mut w = spawn(
        &["run", "--config", arg(&p.path)],
        &[("REPLAYSAFE_FAILPOINTS", failpoint.as_str())],
        p.dir.path(),
        "w",
    );
    wait_until(
        Duration::from_secs(60),
        "the worker held before its start",
        || p.dir.path().join("release.held").exists(),
    );
    assert_eq!(
        db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_checkpoints WHERE consumer_group = '{group}'"
        )),
        1,
        "the take-over's row"
    );
    db.execute("UPDATE {s}.replaysafe_checkpoints SET fence = fence + 1");
    std::fs::write(&release, "").unwrap();
    produce(&topic, &recs[20..]);
    let next = || {
        db.i64(&format!(
            "SELECT coalesce(max(next_offset), -1) FROM {{s}}.replaysafe_checkpoints \
             WHERE consumer_group = '{group}'"
        ))
    };
    let mut exited = None;
    wait_until(Duration::from_secs(120), "every event applied", || {
        exited = w.try_wait().unwrap();
        exited.is_some() || next() == 40
    });
    let err = std::fs::read_to_string(p.dir.path().join("w.err")).unwrap();
    assert!(exited.is_none(), "the worker exited: {err}");
    assert_eq!(terminate(&mut w), Some(0));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 40);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 40);
}

/// A topic recreated under a new stream generation starts from its own positions: checkpoints are kept per
/// generation (it used to resume at the old topic's offset and skip the new records).
#[test]
fn a_new_generation_does_not_reuse_the_old_topics_checkpoints() {
    let (db, topic) = stage("gen", 1);
    let (first, _) = seed_events(100, 1);
    produce(&topic, &first);
    let group = unique("g");
    let g1 = SEED.replace(
        "key = [\"event_id\"]",
        "key = [\"event_id\"]\ngeneration = \"g1\"",
    );
    let p1 = pipeline(&g1, &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&p1.path).tally().landed, 100);
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    let (second, _) = seed_events(150, 1);
    produce(&topic, &second);
    let p2 = pipeline(&g1.replace("\"g1\"", "\"g2\""), &topic, &group, &db.schema);
    let t = run_caught_up(&p2.path).tally();
    assert_eq!(
        (t.consumed, t.landed),
        (150, 150),
        "every record of the new topic is read"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE generation = 'g2'"),
        150
    );
}
