//! Issue 37.1–2, cases C46 and C47: a checkpoint's offset belongs to one log — a topic id (KIP-516) on one
//! cluster. A topic deleted and re-created under the same name, or a failover to a MirrorMaker 2 replica, is
//! refused at assignment (exit 7) until the operator starts the partition explicitly (`offsets start`) or
//! changes the generation; then every re-read record is recognised by its delivery key (docs/guarantees.md "A recreated
//! topic, another cluster").

use std::path::PathBuf;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::common::*;

/// C46's business events: an `orders` row per entity (its latest event type by version).
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
amount = { path = "/data/amount", type = "numeric", optional = true }

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

/// C47's account credits summed per account.
const BALANCES: &str = concat!(
    header!(),
    r#"[batch]
max-records = 100
linger-ms = 10

[fields]
event_id = { path = "/event_id", type = "uuid" }
entity_id = { path = "/entity_id", type = "text" }
amount = { path = "/data/amount", type = "numeric" }

[identity]
key = ["event_id"]

[[projection]]
kind = "sum"
table = "balances"
group-by = ["entity_id"]
add = { balance = "amount" }
"#
);

/// A business event of the cases (`{event_id, event_type, entity_id, version, occurred_at, data}`).
fn event(id: &str, kind: &str, entity: &str, version: i64, ts: i64) -> Rec {
    let value = format!(
        r#"{{"event_id":"{id}","event_type":"{kind}","entity_id":"{entity}","version":{version},"occurred_at":"2024-04-25T00:00:00Z","data":{{"amount":"1.00"}}}}"#
    );
    Rec::json(0, entity, &value, ts)
}

/// The `check --connect` output's cluster id and the topic's id (the ids `run` records).
pub(crate) fn ids_of(p: &Pipeline, brokers: &str, topic: &str) -> (String, String) {
    let out = replaysafe_with(
        &["check", "--connect", "--config", arg(&p.path)],
        &[("KAFKA_BROKERS", brokers)],
        Duration::from_secs(60),
    );
    out.assert_ok();
    let cluster = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("cluster id "))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no cluster id in:\n{}", out.stdout))
        .to_string();
    let marker = format!("topic {topic} (topic id ");
    let topic_id = out
        .stdout
        .lines()
        .find_map(|l| {
            l.split_once(&marker)
                .map(|(_, r)| r.trim_end_matches(')').to_string())
        })
        .unwrap_or_else(|| panic!("no topic id of {topic} in:\n{}", out.stdout));
    (cluster, topic_id)
}

/// The checkpoint of `group` on partition 0 of `topic`: `(next_offset, topic_id, cluster_id, log)`.
fn checkpoint_row(
    db: &Db,
    group: &str,
    topic: &str,
    generation: &str,
) -> (i64, String, String, String) {
    let rows = db.query(
        "SELECT next_offset, topic_id, cluster_id, log FROM {s}.replaysafe_checkpoints WHERE consumer_group = $1 \
         AND topic = $2 AND partition = 0 AND generation = $3",
        &[&group, &topic, &generation],
    );
    let r = rows.first().expect("a checkpoint row");
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// `replaysafe offsets start -c P <args…>` against `brokers`, asserted successful; its stdout.
fn offsets_start(p: &Pipeline, brokers: &str, args: &[&str]) -> String {
    let head = ["offsets", "start", "--config", arg(&p.path)];
    let out = replaysafe_with(
        &[&head[..], args].concat(),
        &[("KAFKA_BROKERS", brokers)],
        Duration::from_secs(60),
    );
    out.assert_ok();
    out.stdout
}

/// Case C46: generation 1 of the topic (topic id A) consumed to checkpoint 4, its offset 2 a dead letter; the
/// topic deleted and re-created (topic id B) with six records — the old checkpoint's offset 4 now inside the log.
/// `run` refuses, naming the topic, both ids and offset 4, and changes nothing; `offsets start --from-earliest`
/// then reads the new log from offset 0: the re-published o-463 is a duplicate by event id, the new offset 2 a
/// dead letter of its own beside generation 1's.
#[test]
fn a_recreated_topic_is_refused_until_started_explicitly() {
    let (db, topic) = stage("recreated", 1);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let (t0, brokers) = (1_714_003_200_000, brokers());
    let id = |n: u32| format!("c46e0000-0000-4000-8000-000000000{n}");
    produce(
        &topic,
        &[
            event(&id(460), "OrderPlaced", "o-460", 1, t0),
            event(&id(461), "OrderPlaced", "o-461", 1, t0 + 1),
            Rec::json(0, "o-462", r#"{"event_id": "c46e"#, t0 + 2),
            event(&id(463), "OrderPlaced", "o-463", 1, t0 + 3),
        ],
    );
    let first = run_caught_up(&p.path).tally();
    assert_eq!((first.landed, first.quarantined), (3, 1), "{first:?}");
    let (cluster, a) = ids_of(&p, &brokers, &topic);
    assert_eq!(
        checkpoint_row(&db, &group, &topic, ""),
        (4, a.clone(), cluster.clone(), String::new())
    );

    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    let t1 = t0 + 60_000;
    produce(
        &topic,
        &[
            event(&id(463), "OrderPlaced", "o-463", 1, t1),
            event(&id(470), "OrderPlaced", "o-470", 1, t1 + 1),
            Rec::json(
                0,
                "o-472",
                r#"{"event_id": "c46e0000-0000-4000-8000-000000000472", "event_type": "OrderPlaced", "entity_id": "o-47"#,
                t1 + 2,
            ),
            event(&id(473), "OrderPlaced", "o-473", 1, t1 + 3),
            event(&id(474), "OrderPlaced", "o-474", 1, t1 + 4),
            event(&id(475), "OrderShipped", "o-470", 2, t1 + 5),
        ],
    );
    let (_, b) = ids_of(&p, &brokers, &topic);
    assert_ne!(a, b, "a re-created topic has another topic id");

    let refused = try_run(&p.path);
    assert_eq!(
        refused.code,
        Some(7),
        "{}\n{}",
        refused.stdout,
        refused.stderr
    );
    for part in [
        format!("{topic}/0"),
        a.clone(),
        b.clone(),
        "next offset 4".to_string(),
        "offsets start".into(),
    ] {
        assert!(
            refused.stderr.contains(&part),
            "`{part}` in:\n{}",
            refused.stderr
        );
    }
    // Nothing consumed: the checkpoint still names the old log.
    assert_eq!(checkpoint_row(&db, &group, &topic, "").0, 4);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 3);

    let line = offsets_start(&p, &brokers, &["--from-earliest"]);
    assert!(
        line.contains("starts at offset 0") && line.contains(&b),
        "{line}"
    );
    let second = run_caught_up(&p.path).tally();
    assert_eq!(
        (
            second.consumed,
            second.landed,
            second.duplicate,
            second.quarantined
        ),
        (6, 4, 1, 1),
        "{second:?}"
    );
    let orders: Vec<(String, String, i64)> = db
        .query(
            "SELECT entity_id, event_type, version FROM {s}.orders ORDER BY entity_id",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let placed = |e: &str| (e.to_string(), "OrderPlaced".to_string(), 1);
    assert_eq!(
        orders,
        vec![
            placed("o-460"),
            placed("o-461"),
            placed("o-463"),
            ("o-470".into(), "OrderShipped".into(), 2),
            placed("o-473"),
            placed("o-474"),
        ]
    );
    // Seven delivery keys: generation 1's three and the new log's four (o-463 was recognised).
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 7);
    // Both logs' offset 2 are dead letters, apart by the incarnation tag.
    let tag = format!("{cluster}/{b}");
    assert_eq!(
        db.strings("SELECT log FROM {s}.replaysafe_dead_letters WHERE partition = 0 AND \"offset\" = 2 ORDER BY log"),
        vec![String::new(), tag.clone()]
    );
    assert_eq!(
        checkpoint_row(&db, &group, &topic, ""),
        (6, b, cluster, tag)
    );
    assert_eq!(
        db.query(
            "SELECT next_offset, topic_id FROM {s}.replaysafe_checkpoints_retired WHERE consumer_group = $1",
            &[&group]
        )
        .iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)))
        .collect::<Vec<_>>(),
        vec![(4, a)],
        "the replaced checkpoint is kept"
    );
    assert_eq!(committed(&group, &topic, 1), vec![Some(6)]);
    // A replay cannot tell the two logs' dead letters at offset 2 apart: refused, nothing resolved.
    let replay = replaysafe(&["dead-letters", "replay", "--config", arg(&p.path)]);
    assert_eq!(replay.code, Some(2), "{}", replay.stderr);
    assert!(replay.stderr.contains("two logs"), "{}", replay.stderr);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_at IS NULL"),
        2
    );
}

/// Case C46's last sentence: a worker that keeps running while its topic is deleted and re-created ends the same
/// way — the re-created partition's assignment is refused (exit 7), nothing of the new log is applied.
#[test]
fn a_running_worker_stops_when_its_topic_is_recreated() {
    let (db, topic) = stage("recreated_live", 1);
    let group = unique("g");
    let text = ORDERS.replace(
        "[batch]",
        "[kafka.properties]\n\"topic.metadata.refresh.interval.ms\" = \"500\"\n[batch]",
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    let id = |n: u32| format!("c46e0000-0000-4000-8000-000000002{n}");
    produce(
        &topic,
        &[
            event(&id(460), "OrderPlaced", "o-460", 1, t0),
            event(&id(461), "OrderPlaced", "o-461", 1, t0 + 1),
        ],
    );
    let mut child = spawn_run(&p, &[], "run");
    wait_until(Duration::from_secs(60), "the old log applied", || {
        db.i64("SELECT (to_regclass('{s}.replaysafe_checkpoints') IS NOT NULL)::int::bigint") == 1
            && db.checkpoint(&group, &topic, 0) == Some(2)
    });
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    produce(
        &topic,
        &[
            event(&id(470), "OrderPlaced", "o-470", 1, t0 + 10),
            event(&id(471), "OrderPlaced", "o-471", 1, t0 + 11),
            event(&id(472), "OrderPlaced", "o-472", 1, t0 + 12),
        ],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = terminate(&mut child);
            let err = std::fs::read_to_string(p.dir.path().join("run.err")).unwrap();
            panic!("the worker kept running after the re-creation:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let err = std::fs::read_to_string(p.dir.path().join("run.err")).unwrap();
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("re-created"), "{err}");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        2,
        "nothing of the new log applied"
    );
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(2));
}

/// Tables of an earlier version (no `topic_id`, `cluster_id`, `log`; dead letters unique by generation and
/// coordinates) are migrated by the next `run`: its checkpoints are not refused for lacking ids, the broker's ids
/// are recorded at the take-over, the old dead letters get the tag `''` under the new unique key.
#[test]
fn checkpoints_of_an_earlier_version_get_the_ids_at_their_next_take_over() {
    let (db, topic) = stage("ids_migrate", 1);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    let id = |n: u32| format!("c46e0000-0000-4000-8000-000000003{n}");
    produce(
        &topic,
        &[
            event(&id(460), "OrderPlaced", "o-460", 1, t0),
            Rec::json(0, "o-462", "{", t0 + 1),
        ],
    );
    run_caught_up(&p.path);
    db.execute(
        "ALTER TABLE {s}.replaysafe_checkpoints DROP COLUMN topic_id, DROP COLUMN cluster_id, DROP COLUMN log; \
         DROP TABLE {s}.replaysafe_checkpoints_retired; \
         ALTER TABLE {s}.replaysafe_dead_letters DROP COLUMN log; \
         ALTER TABLE {s}.replaysafe_dead_letters ADD UNIQUE (generation, topic, partition, \"offset\")",
    );
    produce(
        &topic,
        &[
            event(&id(461), "OrderPlaced", "o-461", 1, t0 + 2),
            Rec::json(0, "o-463", "{", t0 + 3),
        ],
    );
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (2, 1, 1), "{t:?}");
    let (cluster, topic_id) = ids_of(&p, &brokers(), &topic);
    assert_eq!(
        checkpoint_row(&db, &group, &topic, ""),
        (4, topic_id, cluster, String::new())
    );
    assert_eq!(
        db.strings(
            "SELECT log || '@' || \"offset\" FROM {s}.replaysafe_dead_letters ORDER BY \"offset\""
        ),
        vec!["@1".to_string(), "@3".to_string()]
    );
    let unique_keys = db.strings(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = '{s}.replaysafe_dead_letters'::regclass \
         AND contype = 'u'",
    );
    assert_eq!(
        unique_keys,
        vec!["UNIQUE (generation, log, topic, partition, \"offset\")".to_string()]
    );
}

/// A backfill's own checkpoints belong to one log too: rerun on the re-created topic under the same backfill
/// group, it is refused at its take-over (exit 7) instead of resuming at the old log's offset.
#[test]
fn a_backfill_rerun_on_a_recreated_topic_is_refused() {
    let (db, topic) = stage("recreated_bf", 1);
    let p = pipeline(ORDERS, &topic, &unique("g"), &db.schema);
    let t0 = 1_714_003_200_000;
    let id = |n: u32| format!("c46e0000-0000-4000-8000-000000004{n}");
    let bf = unique("bf");
    let stop = ("--to", "2024-04-26T00:00:00Z");
    produce(
        &topic,
        &[
            event(&id(460), "OrderPlaced", "o-460", 1, t0),
            event(&id(461), "OrderPlaced", "o-461", 1, t0 + 1),
        ],
    );
    backfill(&p, "2024-04-25", stop, &bf, &[]).assert_ok();
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    produce(
        &topic,
        &[
            event(&id(470), "OrderPlaced", "o-470", 1, t0 + 10),
            event(&id(471), "OrderPlaced", "o-471", 1, t0 + 11),
            event(&id(472), "OrderPlaced", "o-472", 1, t0 + 12),
        ],
    );
    let out = backfill(&p, "2024-04-25", stop, &bf, &[]);
    assert_eq!(out.code, Some(7), "{}", out.stderr);
    assert!(
        out.stderr.contains("re-created") && out.stderr.contains("next offset 2"),
        "{}",
        out.stderr
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        2,
        "nothing of the new log applied"
    );
    assert_eq!(db.checkpoint(&bf, &topic, 0), Some(2));
}

/// Case C46 under the other way forward: a new `[identity] generation` on the re-created topic starts it at its
/// beginning (the ids differ: no read-back needed), with its own delivery keys, checkpoint and dead letters;
/// generation 1's checkpoint stays as it was.
#[test]
fn a_new_generation_reads_a_recreated_topic_from_its_beginning() {
    let (db, topic) = stage("recreated_gen", 1);
    let group = unique("g");
    let p = pipeline(ORDERS, &topic, &group, &db.schema);
    let t0 = 1_714_003_200_000;
    let id = |n: u32| format!("c46e0000-0000-4000-8000-000000001{n}");
    produce(
        &topic,
        &[
            event(&id(460), "OrderPlaced", "o-460", 1, t0),
            Rec::json(0, "o-462", "{", t0 + 1),
            event(&id(463), "OrderPlaced", "o-463", 1, t0 + 2),
        ],
    );
    run_caught_up(&p.path);
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    produce(
        &topic,
        &[
            event(&id(463), "OrderPlaced", "o-463", 1, t0 + 10),
            Rec::json(0, "o-472", "{", t0 + 11),
            event(&id(470), "OrderPlaced", "o-470", 1, t0 + 12),
            event(&id(475), "OrderShipped", "o-470", 2, t0 + 13),
        ],
    );
    assert_eq!(
        try_run(&p.path).code,
        Some(7),
        "refused under the same generation"
    );
    let text = ORDERS.replace(
        "key = [\"event_id\"]",
        "key = [\"event_id\"]\ngeneration = \"g2\"",
    );
    let g2 = pipeline(&text, &topic, &group, &db.schema);
    let out = run_caught_up(&g2.path);
    assert!(out.stderr.contains("topic recreated"), "{}", out.stderr);
    let t = out.tally();
    // o-463's same state under new delivery keys: a same-state redelivery of the row projection.
    assert_eq!(
        (t.consumed, t.landed + t.duplicate, t.quarantined),
        (4, 3, 1),
        "{t:?}"
    );
    assert_eq!(
        db.i64("SELECT version FROM {s}.orders WHERE entity_id = 'o-470'"),
        2
    );
    assert_eq!(checkpoint_row(&db, &group, &topic, "g2").0, 4);
    assert_eq!(
        checkpoint_row(&db, &group, &topic, "").0,
        3,
        "generation 1's checkpoint is kept"
    );
    assert_eq!(
        db.strings("SELECT generation FROM {s}.replaysafe_dead_letters WHERE \"offset\" = 1 ORDER BY generation"),
        vec![String::new(), "g2".to_string()]
    );
}

/// The second single-node cluster of the failover test (a MirrorMaker 2 target): `scripts/kafka-start` with its
/// own state directory (`.kafka-dr/` at the repository root; the jars linked from `.kafka/lib`), started once and
/// left running like the main broker (`KAFKA_STATE_DIR=.kafka-dr scripts/kafka-stop` stops it), or
/// `KAFKA_DR_BROKERS` when set.
fn dr_brokers() -> String {
    if let Ok(b) = std::env::var("KAFKA_DR_BROKERS") {
        return b;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/kafka-start"))
        .env_remove("KAFKA_BROKERS")
        .env("KAFKA_STATE_DIR", root.join(".kafka-dr"))
        .env("KAFKA_SASL", "off")
        .output()
        .expect("scripts/kafka-start");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "second broker: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("KAFKA_BROKERS="))
        .expect("KAFKA_BROKERS= line")
        .to_string()
}

fn client(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    c
}

/// Creates `topic` on `brokers` (no retention: the records carry 2024 timestamps).
fn create_on(brokers: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = client(brokers).create().unwrap();
    let t = NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set("retention.ms", "-1");
    for r in runtime()
        .block_on(admin.create_topics([&t], &AdminOptions::new()))
        .unwrap()
    {
        r.unwrap();
    }
}

/// Produces `(key, value, timestamp)` records to partition 0 of `topic` on `brokers`, in order.
fn produce_on(brokers: &str, topic: &str, records: &[(Vec<u8>, Vec<u8>, i64)]) {
    let producer: FutureProducer = client(brokers)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    runtime().block_on(async {
        for (k, v, ts) in records {
            producer
                .send(
                    FutureRecord::to(topic)
                        .partition(0)
                        .key(k)
                        .payload(v)
                        .timestamp(*ts),
                    Duration::from_secs(30),
                )
                .await
                .unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
        }
    });
}

/// `group`'s committed offset on partition 0 of `topic` on `brokers`.
fn committed_on(brokers: &str, group: &str, topic: &str) -> Option<i64> {
    let c: BaseConsumer = client(brokers).set("group.id", group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    match c
        .committed_offsets(tpl, Duration::from_secs(20))
        .unwrap()
        .elements()[0]
        .offset()
    {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// Case C47 with two single-node clusters: the primary's log has four records before the account's (gone from the
/// replica, as if MirrorMaker 2 started after retention removed them), so the replica holds each record 4 offsets
/// lower. The group consumed the primary to checkpoint 5 (primary 1000 of the case = offset 5, produced but not
/// consumed); four new events follow on the replica. `run` on the replica refuses, naming both cluster ids and
/// offset 5 (resuming there would skip replica offsets 1–4). MirrorMaker 2's checkpoints topic is emulated (a
/// record in its `Checkpoint` format in `primary.checkpoints.internal`, translating upstream 5 conservatively to
/// 0); `offsets start --from-mm2 primary` starts there: replica offset 0 is a duplicate by event id, 1–5 apply once.
#[test]
fn a_failover_to_another_cluster_is_refused_until_started_from_mm2s_translation() {
    fail_over(Way::Mm2);
}

/// Case C47, started from a time instead: the primary's last applied record's timestamp (replica offset 0).
#[test]
fn a_failover_started_from_a_time_reads_each_record_once() {
    fail_over(Way::Time);
}

/// Case C47, started from a given offset of the replica.
#[test]
fn a_failover_started_from_an_offset_reads_each_record_once() {
    fail_over(Way::Offset);
}

/// How the operator starts the replica's partition in [`fail_over`].
enum Way {
    Mm2,
    Time,
    Offset,
}

/// Case C47 on two clusters, started the `way` given (see the first test's docs).
fn fail_over(way: Way) {
    let dr = dr_brokers();
    let (db, topic) = stage("failover", 1);
    let group = unique("g");
    let p = pipeline(BALANCES, &topic, &group, &db.schema);
    let primary = brokers();
    let t0 = 1_714_003_299_000;
    let id = |n: u32| format!("c47e0000-0000-4000-8000-00000000{n:04}");
    let fillers: Vec<Rec> = (1..=4)
        .map(|n| {
            event(
                &id(n),
                "AccountCredited",
                &format!("b-{n}"),
                1,
                t0 - 10 + i64::from(n),
            )
        })
        .collect();
    let e999 = event(&id(999), "AccountCredited", "a-47", 1, t0);
    let e1000 = event(&id(1000), "AccountCredited", "a-47", 2, t0 + 1000);
    produce(
        &topic,
        &[&fillers[..], std::slice::from_ref(&e999)].concat(),
    );
    let before = run_caught_up(&p.path).tally();
    assert_eq!(before.landed, 5);
    produce(&topic, std::slice::from_ref(&e1000));
    let (primary_cluster, _) = ids_of(&p, &primary, &topic);

    // The replica: the mirrored records from primary offset 4 on, then four events produced after the failover.
    create_on(&dr, &topic);
    let news: Vec<Rec> = (2001..=2004)
        .map(|n| {
            event(
                &id(n),
                "AccountCredited",
                "a-47",
                i64::from(n) - 1998,
                t0 + 200_000 + i64::from(n),
            )
        })
        .collect();
    let copied: Vec<(Vec<u8>, Vec<u8>, i64)> = [e999, e1000]
        .iter()
        .chain(&news)
        .map(|r| {
            (
                r.key.clone().unwrap(),
                r.value.clone().unwrap(),
                r.timestamp_ms.unwrap(),
            )
        })
        .collect();
    produce_on(&dr, &topic, &copied);
    let (dr_cluster, _) = ids_of(&p, &dr, &topic);
    assert_ne!(primary_cluster, dr_cluster);

    let refused = try_run_with(&p.path, &[("KAFKA_BROKERS", &dr)], Duration::from_secs(120));
    assert_eq!(
        refused.code,
        Some(7),
        "{}\n{}",
        refused.stdout,
        refused.stderr
    );
    for part in [
        primary_cluster.as_str(),
        dr_cluster.as_str(),
        "next offset 5",
        "another cluster",
    ] {
        assert!(
            refused.stderr.contains(part),
            "`{part}` in:\n{}",
            refused.stderr
        );
    }
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        5,
        "nothing consumed"
    );

    let line = match way {
        Way::Mm2 => {
            // MirrorMaker 2's checkpoint of the group: upstream 5 → downstream 0 (emulated: the record
            // MirrorCheckpointConnector writes, in the source alias's checkpoints topic on the target).
            let (k, v) = replaysafe::ops::start_at::checkpoint_record(
                &group,
                &topic,
                0,
                replaysafe::ops::start_at::Mm2Checkpoint {
                    upstream: 5,
                    downstream: 0,
                },
            );
            let alias = unique("primary");
            let checkpoints = format!("{alias}.checkpoints.internal");
            create_on(&dr, &checkpoints);
            produce_on(&dr, &checkpoints, &[(k, v, t0 + 300_000)]);
            let line = offsets_start(&p, &dr, &["--from-mm2", &alias]);
            assert!(line.contains("upstream offset 5"), "{line}");
            line
        }
        Way::Time => offsets_start(&p, &dr, &["--from-time", "2024-04-25T00:01:39Z"]),
        Way::Offset => offsets_start(
            &p,
            &dr,
            &["--topic", &topic, "--partition", "0", "--from-offset", "0"],
        ),
    };
    assert!(
        line.contains("starts at offset 0") && line.contains(&dr_cluster),
        "{line}"
    );

    let after = try_run_with(&p.path, &[("KAFKA_BROKERS", &dr)], Duration::from_secs(120));
    let t = after.assert_ok().tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (6, 5, 1), "{t:?}");
    assert_eq!(
        db.text("SELECT balance::text FROM {s}.balances WHERE entity_id = 'a-47'")
            .as_deref(),
        Some("6.00")
    );
    let mut ids: Vec<String> = db.strings("SELECT event_id::text FROM {s}.replaysafe_ledger");
    ids.sort();
    let mut want: Vec<String> = [1, 2, 3, 4, 999, 1000, 2001, 2002, 2003, 2004]
        .iter()
        .map(|n| id(*n))
        .collect();
    want.sort();
    assert_eq!(ids, want, "each event once in the ledger");
    let (next, _, cluster, _) = checkpoint_row(&db, &group, &topic, "");
    assert_eq!((next, cluster), (6, dr_cluster));
    assert_eq!(
        db.query(
            "SELECT next_offset, cluster_id FROM {s}.replaysafe_checkpoints_retired WHERE consumer_group = $1",
            &[&group]
        )
        .iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)))
        .collect::<Vec<_>>(),
        vec![(5, primary_cluster)],
        "the primary's checkpoint is kept under the primary's cluster id"
    );
    assert_eq!(committed_on(&dr, &group, &topic), Some(6));
    assert_eq!(committed_on(&primary, &group, &topic), Some(5));
}
