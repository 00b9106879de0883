//! The outbox relay (`replaysafe outbox relay`, `run --relay`; docs/reference.md "Outbox relay") against the real
//! broker: every outbox row published once per event across replays, a republished topic and crashes of the
//! consumer; a relay killed between the broker's acknowledgement and the mark republishes exactly those messages
//! with the same delivery header; two relays publish each row once, each key in order; case C33 (transactions
//! committing out of id order never skip a row); `purge_published`.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::common::*;
use crate::horizon::ev;

/// JSON events of entities (`entity`, `version`), one outbox keyed by entity, relayed to `{out}`.
pub(crate) const EVENTS: &str = concat!(
    header!(),
    r#"[batch]
max-records = 20
linger-ms = 10
[fields]
event_id = { path = "/event_id", type = "uuid" }
entity = { path = "/entity", type = "text" }
version = { path = "/version", type = "bigint" }
day = { path = "/at", type = "date" }
[identity]
key = ["event_id"]
partition-by = "day"
[[projection]]
kind = "counter"
table = "daily"
group-by = ["day"]
[[projection]]
kind = "outbox"
table = "outbox"
key = ["entity"]
payload = ["event_id", "entity", "version"]
[outbox]
topic = "{out}"
batch-size = BATCH
poll-interval-ms = 20
"#
);

/// One message read back from the relay's topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub delivery: Option<String>,
    pub value: String,
}

/// Every message of `topic` (partition by partition, offset order) up to the high watermarks.
pub fn read_topic(topic: &str) -> Vec<Msg> {
    let c: BaseConsumer = consumer(&[
        ("group.id", &unique("reader")),
        ("enable.auto.commit", "false"),
    ]);
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let parts = md.topics()[0].partitions().len() as i32;
    let mut tpl = TopicPartitionList::new();
    let mut high = HashMap::new();
    for p in 0..parts {
        let (_, h) = c
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap();
        high.insert(p, h);
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out: Vec<Msg> = Vec::new();
    let mut next: HashMap<i32, i64> = (0..parts).map(|p| (p, 0)).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while (0..parts).any(|p| next[&p] < high[&p]) {
        assert!(std::time::Instant::now() < deadline, "reading {topic} back");
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.unwrap();
        let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8(b.to_vec()).unwrap());
        let delivery = m.headers().and_then(|h| {
            h.iter()
                .find(|x| x.key == "replaysafe-delivery")
                .and_then(|x| text(x.value))
        });
        next.insert(m.partition(), m.offset() + 1);
        out.push(Msg {
            partition: m.partition(),
            offset: m.offset(),
            key: text(m.key()),
            delivery,
            value: text(m.payload()).unwrap(),
        });
    }
    out.sort_by_key(|m| (m.partition, m.offset));
    out
}

/// How many messages `topic` holds (sum of the high watermarks; the relay's producer is not transactional).
fn topic_len(topic: &str) -> i64 {
    let c: BaseConsumer = consumer(&[]);
    let Ok(md) = c.fetch_metadata(Some(topic), Duration::from_secs(10)) else {
        return 0;
    };
    let parts = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    (0..parts)
        .map(|p| {
            c.fetch_watermarks(topic, p, Duration::from_secs(10))
                .map_or(0, |(_, h)| h)
        })
        .sum()
}

/// `n` versions of each of `entities` entities, entity `i` on partition `i % partitions` (every event of one
/// entity on one partition, the entities spread over them).
pub(crate) fn events(entities: usize, n: i64, partitions: i32, tag: u32) -> Vec<Rec> {
    let mut out = Vec::new();
    for v in 1..=n {
        for e in 0..entities {
            let id = format!("{tag:08x}-0000-4000-8000-{:06x}{:06x}", e, v);
            let value = format!(
                r#"{{"event_id":"{id}","entity":"e-{e}","version":{v},"at":"2026-07-0{}T10:00:00Z"}}"#,
                1 + (v % 3)
            );
            out.push(Rec::json(
                e as i32 % partitions,
                &format!("e-{e}"),
                &value,
                1_782_000_000_000 + v,
            ));
        }
    }
    out
}

/// The outbox's rows: (delivery_key, message_key, payload text, published).
fn outbox_rows(db: &Db) -> Vec<(String, Option<String>, String, bool)> {
    db.query(
        "SELECT delivery_key, message_key, payload::text, published_at IS NOT NULL FROM {s}.outbox ORDER BY id",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// Asserts that the topic holds the outbox's rows: every message is a row (key = message_key, header =
/// delivery_key, value = payload), every row is on it `times(delivery_key)` times, each key's first
/// occurrences in version order; and that every row is marked published.
fn assert_topic_matches(db: &Db, msgs: &[Msg], times: impl Fn(&str) -> usize) {
    let rows = outbox_rows(db);
    let by_delivery: HashMap<&str, _> = rows.iter().map(|r| (r.0.as_str(), r)).collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut last_version: HashMap<(i32, String), i64> = HashMap::new();
    for m in msgs {
        let d = m
            .delivery
            .as_deref()
            .expect("every message has the delivery header");
        let row = by_delivery
            .get(d)
            .unwrap_or_else(|| panic!("message {m:?} is no outbox row"));
        assert_eq!(
            (&m.key, &m.value),
            (&row.1, &row.2),
            "key and value are the row's"
        );
        let first = *seen
            .entry(d.to_string())
            .and_modify(|n| *n += 1)
            .or_insert(1)
            == 1;
        let v: serde_json::Value = serde_json::from_str(&m.value).unwrap();
        let k = (m.partition, m.key.clone().unwrap_or_default());
        if let (true, Some(version)) = (first, v["version"].as_i64()) {
            let before = last_version.insert(k.clone(), version);
            assert!(
                before.is_none_or(|b| b < version),
                "key {k:?}: version {version} after {before:?}"
            );
        }
    }
    for r in &rows {
        assert_eq!(
            seen.get(&r.0).copied().unwrap_or(0),
            times(&r.0),
            "times on the topic: {}",
            r.0
        );
        assert!(r.3, "row {} marked published", r.0);
    }
}

pub(crate) fn events_pipeline(
    topic: &str,
    group: &str,
    db: &Db,
    out: &str,
    batch: u32,
) -> Pipeline {
    let text = EVENTS
        .replace("{out}", out)
        .replace("BATCH", &batch.to_string());
    pipeline(&text, topic, group, &db.schema)
}

fn relay_until_empty(p: &Pipeline, envs: &[(&str, &str)]) -> Out {
    let out = replaysafe_with(
        &["outbox", "relay", "--config", arg(&p.path), "--until-empty"],
        envs,
        Duration::from_secs(120),
    );
    out.assert_ok();
    out
}

/// Outbox rows exactly once per event: across a crash after every database commit before its Kafka commit, a
/// full replay under another group, the same records republished at new offsets (a rebuilt topic) and a
/// backfill of the window; the
/// relay then publishes each row once, and publishes nothing more after further replays. A rebuild is refused
/// for an outbox pipeline and leaves the outbox alone.
#[test]
fn outbox_rows_and_messages_once_per_event_across_replays_and_crashes() {
    let (db, topic) = stage("rly1", 3);
    let out = unique("rly1out");
    create_topic(&out, 2, &[]);
    let recs = events(6, 10, 3, 0x11);
    produce(&topic, &recs);
    let group = unique("g");
    let text = format!(
        "{}\n[kafka.properties]\n\"group.instance.id\" = \"{}\"\n",
        EVENTS.replace("{out}", &out).replace("BATCH", "500"),
        unique("member")
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs < 60, "did not converge");
        if try_run_with(&p.path, &[CRASH_AFTER_DB_COMMIT], Duration::from_secs(120)).code == Some(0)
        {
            break;
        }
    }
    assert!(runs > 2, "the failpoint interrupted runs");
    let n = recs.len() as i64;
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), n);
    // A full replay under another group; the same records produced again at new offsets.
    let t = run_caught_up(&events_pipeline(&topic, &unique("g"), &db, &out, 500).path).tally();
    assert_eq!((t.landed, t.duplicate), (0, n as u64));
    produce(&topic, &recs);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.landed, t.duplicate), (0, n as u64));
    // A backfill of the whole window (both copies): nothing lands again.
    let b = backfill(&p, "2026-01-01", ("--to", "2027-01-01"), &unique("bf"), &[]);
    b.assert_ok();
    assert!(b.stderr.contains("landed 0"), "{}", b.stderr);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), n);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily"), n);

    let r = relay_until_empty(&p, &[]);
    assert!(r.stdout.contains(&format!("published {n}")), "{}", r.stdout);
    let msgs = read_topic(&out);
    assert_eq!(msgs.len() as i64, n);
    assert_topic_matches(&db, &msgs, |_| 1);

    // Replays after publication: nothing new in the outbox, nothing more on the topic.
    run_caught_up(&events_pipeline(&topic, &unique("g"), &db, &out, 500).path);
    let r = relay_until_empty(&p, &[]);
    assert!(r.stdout.contains("published 0"), "{}", r.stdout);
    let rebuilt = rebuild(
        &p,
        "2026-07-01",
        "2026-07-03",
        &unique("rb"),
        &["--i-paused-other-writers"],
    );
    assert_eq!(rebuilt.code, Some(2), "{}", rebuilt.stderr);
    assert!(
        rebuilt
            .stderr
            .contains("projection `outbox` cannot be zeroed"),
        "{}",
        rebuilt.stderr
    );
    assert_eq!(read_topic(&out), msgs);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), n);
}

/// A relay killed (SIGKILL) after the broker acknowledged a round and before it marked the rows: the next
/// relay publishes exactly those rows again, with the same key, delivery header and bytes; nothing else is
/// duplicated; every row ends marked once.
#[test]
fn relay_killed_between_publish_and_mark_republishes_the_same_messages() {
    let (db, topic) = stage("rly2", 3);
    let out = unique("rly2out");
    create_topic(&out, 3, &[]);
    produce(&topic, &events(6, 5, 3, 0x22));
    let p = events_pipeline(&topic, &unique("g"), &db, &out, 10);
    run_caught_up(&p.path);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 30);
    let mut killed = spawn(
        &["outbox", "relay", "--config", arg(&p.path)],
        &[(
            "REPLAYSAFE_FAILPOINTS",
            "outbox-after-publish-before-mark=pause",
        )],
        p.dir.path(),
        "relay1",
    );
    wait_until(
        Duration::from_secs(60),
        "the first round on the topic",
        || topic_len(&out) >= 10,
    );
    unsafe_kill(killed.id(), "KILL");
    killed.wait().unwrap();
    let first = read_topic(&out);
    assert_eq!(first.len(), 10, "one round of batch-size 10 was published");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NOT NULL"),
        0
    );

    // The next relay, with its metrics: 30 rows published (the 10 again and the 20 others), none pending.
    let addr = crate::health::free_addr();
    let mut relay = spawn(
        &[
            "outbox",
            "relay",
            "--config",
            arg(&p.path),
            "--metrics-addr",
            &addr,
        ],
        &[],
        p.dir.path(),
        "relay2",
    );
    crate::health::wait_for(&addr, "/metrics", "the relay's metrics", |c, _| c == 200);
    crate::health::wait_for(&addr, "/metrics", "every row published", |c, b| {
        c == 200
            && sample(b, "replaysafe_outbox_published_total", &[]) == Some(30.0)
            && sample(b, "replaysafe_outbox_pending", &[]) == Some(0.0)
            && sample(b, "replaysafe_outbox_oldest_pending_seconds", &[]) == Some(0.0)
    });
    assert_eq!(terminate(&mut relay), Some(0));
    let msgs = read_topic(&out);
    assert_eq!(msgs.len(), 40);
    let twice: std::collections::HashSet<String> =
        first.iter().filter_map(|m| m.delivery.clone()).collect();
    assert_eq!(twice.len(), 10);
    assert_topic_matches(&db, &msgs, |d| if twice.contains(d) { 2 } else { 1 });
    // The same delivery header carries the same key and bytes both times.
    let mut bodies: HashMap<&str, (&Option<String>, &str)> = HashMap::new();
    for m in &msgs {
        let d = m.delivery.as_deref().unwrap();
        let b = bodies.entry(d).or_insert((&m.key, &m.value));
        assert_eq!(*b, (&m.key, m.value.as_str()));
    }
}

/// Two relays at once over hot keys (50 rows per key): each row published once, each key's rows in order on
/// its partition.
#[test]
fn two_relays_publish_each_row_once_and_each_key_in_order() {
    let (db, topic) = stage("rly3", 3);
    let out = unique("rly3out");
    create_topic(&out, 2, &[]);
    produce(&topic, &events(6, 50, 3, 0x33));
    // Three rows a round: each relay holds a few keys at a time, the other takes the rest.
    let p = events_pipeline(&topic, &unique("g"), &db, &out, 3);
    run_caught_up(&p.path);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 300);
    let args = ["outbox", "relay", "--config", arg(&p.path), "--until-empty"];
    let mut a = spawn(&args, &[], p.dir.path(), "a");
    let mut b = spawn(&args, &[], p.dir.path(), "b");
    for c in [&mut a, &mut b] {
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "relay did not finish");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(status.success());
    }
    let published = |name: &str| {
        let text = std::fs::read_to_string(p.dir.path().join(format!("{name}.out"))).unwrap();
        let n = text
            .rsplit("published ")
            .next()
            .unwrap()
            .trim()
            .parse::<u64>();
        n.unwrap_or_else(|_| panic!("relay {name}: {text}"))
    };
    let (na, nb) = (published("a"), published("b"));
    eprintln!("relay a published {na}, relay b {nb}");
    assert_eq!(na + nb, 300);
    assert!(na > 0 && nb > 0, "both relays published: {na} + {nb}");
    let msgs = read_topic(&out);
    assert_eq!(msgs.len(), 300);
    assert_topic_matches(&db, &msgs, |_| 1);
}

/// C33's pipeline: two connections (partitions 0 and 1 commit in parallel); `gate_b` holds o-300's transaction
/// before its outbox insert, `gate_a` holds o-200 v1's after it (advisory locks the test holds); waits bounded
/// by the 60 s lock timeout. No `partition-by`: the first batch of a day creates its ledger partition, which
/// would make tx B wait for tx A.
const C33_PIPELINE: &str = r#"[kafka]
group-id = "{group}"
topics = ["{topic}"]
start = "earliest"
[postgres]
schema = "{schema}"
connections = 2
lock-timeout-ms = 60000
statement-timeout-ms = 120000
[batch]
max-records = 10
linger-ms = 3000
[fields]
event_id = { path = "/event_id", type = "uuid" }
entity_id = { path = "/entity_id", type = "text" }
version = { path = "/version", type = "bigint" }
[identity]
key = ["event_id"]
[ledger]
table = "processed_events"
[[projection]]
name = "gate_b"
kind = "sql"
sql = "SELECT pg_advisory_xact_lock(GATE_B) FROM landed WHERE entity_id = 'o-300'"
[[projection]]
kind = "outbox"
table = "outbox"
key = ["entity_id"]
payload = ["event_id", "entity_id", "version"]
[[projection]]
name = "gate_a"
kind = "sql"
sql = "SELECT pg_advisory_xact_lock(GATE_A) FROM landed WHERE entity_id = 'o-200' AND version = 1"
[outbox]
topic = "OUT"
poll-interval-ms = 50
"#;

/// Case C33: partition 0's transaction inserts its outbox row first (lower id) and commits after partition 1's;
/// the relay publishes 502 first, never skips 501 once it commits, publishes o-200 v1 before v2; killed after
/// publishing 501 and before marking it, the next relay publishes 501 again with the same header and bytes.
/// (Case offsets 200/201 and 300 are broker offsets 0/1 and 0 here: committed offsets p0 = 2, p1 = 1.)
#[test]
fn c33_rows_committed_out_of_id_order_are_never_skipped() {
    let db = Db::fresh("c33");
    let topic = new_topic("c33", 2);
    let out = unique("c33out");
    create_topic(&out, 1, &[]);
    let records = crate::cases::load("C33", None);
    let (gate_a, gate_b) = (
        0x33_0000_0000_i64 + i64::from(std::process::id()),
        0x34_0000_0000_i64 + i64::from(std::process::id()),
    );
    let holder = pg_client(&db.rt);
    db.rt
        .block_on(holder.batch_execute(&format!(
            "SELECT pg_advisory_lock({gate_a}), pg_advisory_lock({gate_b})"
        )))
        .unwrap();
    let text = C33_PIPELINE
        .replace("GATE_A", &gate_a.to_string())
        .replace("GATE_B", &gate_b.to_string())
        .replace("OUT", &out);
    let group = unique("g");
    let p = pipeline(&text, &topic, &group, &db.schema);
    crate::cases::produce_case(&topic, &[&records[0], &records[1]]);
    let mut run = spawn_run(&p, &[], "run");
    // Tx A (p0@200) has inserted its outbox row and waits at its gate; tx B (p1@300) waits before its insert.
    let waiting = |key: i64| {
        db.i64(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND ((classid::bigint << 32) | objid::bigint) = {key}"
        )) > 0
    };
    wait_until(Duration::from_secs(90), "tx A at its gate", || {
        waiting(gate_a)
    });
    wait_until(Duration::from_secs(30), "tx B at its gate", || {
        waiting(gate_b)
    });
    // The relay starts once `run` has created the outbox table.
    let mut relay = spawn(
        &["outbox", "relay", "--config", arg(&p.path)],
        &[(
            "REPLAYSAFE_FAILPOINTS",
            "outbox-after-publish-before-mark=1*off->pause",
        )],
        p.dir.path(),
        "relay1",
    );
    db.rt
        .block_on(holder.batch_execute(&format!("SELECT pg_advisory_unlock({gate_b})")))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NOT NULL") != 1 {
        if std::time::Instant::now() > deadline {
            let log = |n: &str| std::fs::read_to_string(p.dir.path().join(n)).unwrap_or_default();
            let act = db.strings("SELECT coalesce(wait_event_type,'') || ' ' || coalesce(wait_event,'') || ' ' || state || ' ' || left(query, 150) FROM pg_stat_activity WHERE backend_type = 'client backend'");
            panic!(
                "o-300 not published\nrelay:\n{}\nrun:\n{}\n{act:#?}",
                log("relay1.err"),
                log("run.err")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox"),
        1,
        "tx A has not committed"
    );
    db.rt
        .block_on(holder.batch_execute(&format!("SELECT pg_advisory_unlock({gate_a})")))
        .unwrap();
    wait_until(Duration::from_secs(60), "501 on the topic", || {
        topic_len(&out) == 2
    });
    unsafe_kill(relay.id(), "KILL");
    relay.wait().unwrap();
    crate::cases::produce_case(&topic, &[&records[2]]);
    wait_until(Duration::from_secs(60), "503 landed", || {
        db.i64("SELECT count(*) FROM {s}.outbox") == 3
    });
    relay_until_empty(&p, &[]);
    assert_eq!(terminate(&mut run), Some(0));

    let rows = db.query(
        "SELECT id, message_key, payload->>'version', published_at IS NOT NULL FROM {s}.outbox ORDER BY id",
        &[],
    );
    let got: Vec<(Option<String>, Option<String>, bool)> = rows
        .iter()
        .map(|r| (r.get(1), r.get(2), r.get(3)))
        .collect();
    let key = |k: &str| Some(format!("[\"{k}\"]"));
    assert_eq!(
        got,
        vec![
            (key("o-200"), Some("1".into()), true),
            (key("o-300"), Some("1".into()), true),
            (key("o-200"), Some("2".into()), true),
        ],
        "501 (o-200 v1) has the lowest id though it committed last"
    );
    let msgs = read_topic(&out);
    let seq: Vec<(Option<String>, String)> = msgs
        .iter()
        .map(|m| {
            (
                m.key.clone(),
                serde_json::from_str::<serde_json::Value>(&m.value).unwrap()["version"].to_string(),
            )
        })
        .collect();
    assert_eq!(
        seq,
        vec![
            (key("o-300"), "1".into()),
            (key("o-200"), "1".into()),
            (key("o-200"), "1".into()),
            (key("o-200"), "2".into())
        ],
        "502 first, 501 twice (the relay killed before its mark), then 503"
    );
    assert_eq!(msgs[1].delivery, msgs[2].delivery);
    assert_eq!(msgs[1].value, msgs[2].value);
    assert_topic_matches(&db, &msgs, |d| {
        if Some(d) == msgs[1].delivery.as_deref() {
            2
        } else {
            1
        }
    });
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 3);
    assert_eq!(
        (
            db.checkpoint(&group, &topic, 0),
            db.checkpoint(&group, &topic, 1)
        ),
        (Some(2), Some(1))
    );
}

/// `purge_published` deletes only published rows older than `[outbox] keep-days` (by `published_at`); the
/// dry run counts the same rows and deletes nothing; unpublished rows stay whatever their age.
#[test]
fn ledger_prune_purges_only_published_outbox_rows_older_than_keep_days() {
    let (db, topic) = stage("rly5", 2);
    let out = unique("rly5out");
    produce(&topic, &events(4, 3, 2, 0x55));
    let text = EVENTS
        .replace("{out}", &out)
        .replace("BATCH", "500")
        .replace("[outbox]\n", "[outbox]\nkeep-days = 3\n");
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    run_caught_up(&p.path);
    db.execute(
        "UPDATE {s}.outbox SET published_at = now() - interval '5 days' WHERE id % 3 = 0; \
         UPDATE {s}.outbox SET published_at = now() - interval '1 day' WHERE id % 3 = 1; \
         UPDATE {s}.outbox SET created_at = now() - interval '30 days' WHERE id % 3 = 2",
    );
    let old = db.i64("SELECT count(*) FROM {s}.outbox WHERE id % 3 = 0");
    let pipeline = replaysafe::config::load(&p.path).unwrap();
    let client = pg_client(&db.rt);
    let dry = db
        .rt
        .block_on(replaysafe::projection::outbox::purge_published(
            &client, &pipeline, true,
        ))
        .unwrap();
    assert_eq!(
        dry,
        vec![(format!("\"{}\".\"outbox\"", db.schema), old as u64)]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 12);
    // The purge itself through `ledger prune` (this pipeline has no horizon: only the outbox ages out).
    let out = replaysafe(&["ledger", "prune", "--config", arg(&p.path), "--json"]);
    out.assert_ok();
    let done: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        done["outbox"],
        serde_json::json!([{"table": dry[0].0, "purged": dry[0].1}]),
        "{}",
        out.stdout
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE id % 3 = 0"),
        0
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 12 - old);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NULL"),
        db.i64("SELECT count(*) FROM {s}.outbox WHERE id % 3 = 2")
    );
}

/// Seed 004 (Debezium: insert, two updates, delete, re-creation per entity) behind a snapshot read of every
/// entity and followed by a resnapshot, relayed by `run --relay` in the consumer's process: the outbox holds
/// one row per streaming change and none for a snapshot read, each published once; a second `run --relay`
/// under another group (a full replay) adds nothing to the outbox or the topic.
#[test]
fn seed004_snapshot_reads_never_reach_the_outbox_and_run_relay_publishes_once() {
    let n = 5;
    let mut changes = Vec::new();
    let snap = |id: i64, lsn: i64, name: &str, qty: i64| {
        serde_json::json!({
            "before": null, "after": {"id": id, "name": name, "qty": qty}, "op": "r", "ts_ms": 1714003100000i64,
            "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public", "table": "items",
                "snapshot": "true", "txId": 2000 + id, "lsn": lsn, "ts_ms": 1714003100000i64,
                "sequence": format!("[null,\"{lsn}\"]")},
            "transaction": null
        })
    };
    for id in 1..=n {
        changes.push((id, snap(id, 59_000_000, "first", 0), None));
    }
    changes.extend(crate::cdc::seed004(n));
    for id in 1..=n {
        changes.push((id, snap(id, 61_000_000, "again", 10 + id), None));
    }
    let (db, topic) = stage("rly6", 3);
    crate::cdc::produce_seed004(&topic, 3, &changes);
    let out = unique("rly6out");
    create_topic(&out, 3, &[]);
    let text = format!(
        "{}[outbox]\ntopic = \"{out}\"\n",
        crate::cdc::ITEMS.replace("MAXREC", "7")
    );
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    let args = [
        "run",
        "--config",
        arg(&p.path),
        "--until-caught-up",
        "--relay",
    ];
    let o = replaysafe(&args);
    o.assert_ok();
    let t = o.tally();
    assert_eq!(
        t.landed,
        6 * n as u64,
        "the first snapshot reads and the streaming changes"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 5 * n);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE payload->>'_op' = 'r'"),
        0
    );
    let msgs = read_topic(&out);
    assert_eq!(msgs.len() as i64, 5 * n);
    assert_topic_matches(&db, &msgs, |_| 1);
    // A full replay under another group, relayed again: nothing new anywhere.
    let p2 = pipeline(&text, &topic, &unique("g"), &db.schema);
    let o = replaysafe(&[
        "run",
        "--config",
        arg(&p2.path),
        "--until-caught-up",
        "--relay",
    ]);
    o.assert_ok();
    assert_eq!(o.tally().landed, 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 5 * n);
    assert_eq!(read_topic(&out), msgs);
}

/// An outbox table made before the relay (no `published_at`, no indexes) is upgraded by `run`: the column and
/// the two partial indexes are added, the rows already there stay and are published once.
#[test]
fn an_outbox_table_without_published_at_is_upgraded_and_relayed() {
    let (db, topic) = stage("rly7", 2);
    let out = unique("rly7out");
    create_topic(&out, 2, &[]);
    db.execute(
        "CREATE TABLE {s}.outbox (id bigserial PRIMARY KEY, delivery_key text NOT NULL UNIQUE, \
         source_topic text NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL, \
         message_key text, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now()); \
         INSERT INTO {s}.outbox (delivery_key, source_topic, source_partition, source_offset, message_key, payload) \
         VALUES ('[\"old\"]', 'older', 0, 0, '[\"e-0\"]', '{\"version\": 0}')",
    );
    // An earlier replaysafe's table: recorded as fed by this pipeline's ledger.
    db.execute(&format!(
        "COMMENT ON TABLE {{s}}.outbox IS 'replaysafe: fed by ledger \"{}\".\"replaysafe_ledger\"'",
        db.schema
    ));
    produce(&topic, &events(2, 3, 2, 0x77));
    let p = events_pipeline(&topic, &unique("g"), &db, &out, 500);
    run_caught_up(&p.path);
    let indexes = db.strings(&format!(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = '{}' AND tablename = 'outbox' ORDER BY 1",
        db.schema
    ));
    assert_eq!(
        indexes,
        [
            "outbox_delivery_key_key",
            "outbox_pkey",
            "outbox_unpublished",
            "outbox_unpublished_key"
        ]
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NULL"),
        7
    );
    relay_until_empty(&p, &[]);
    let msgs = read_topic(&out);
    assert_eq!(msgs.len(), 7);
    assert_topic_matches(&db, &msgs, |_| 1);
}

/// Chaos on the relay: `run --relay` (outbox batch-size 1) and `outbox relay` (batch-size 5000) on one outbox
/// while records keep arriving (entities spread over 3 partitions), each SIGKILLed and restarted at pseudo-random
/// points; then the rest is consumed and relayed. Every event is one outbox row, every row is published and on
/// the topic at least once (a kill between acknowledgement and mark republishes it) with its key, bytes and
/// delivery header, each key's rows first appear in version order, and nothing else is on the topic.
#[test]
fn relay_and_run_relay_killed_at_random_while_rows_arrive() {
    use crate::relay::{events, events_pipeline, read_topic};
    use std::collections::{HashMap, HashSet};
    let (db, topic) = stage("b13_chaos", 3);
    let out = unique("b13out");
    create_topic(&out, 2, &[]);
    let group = unique("g");
    let one = events_pipeline(&topic, &group, &db, &out, 1);
    let big = events_pipeline(&topic, &group, &db, &out, 5000);
    let run_args = ["run", "--config", arg(&one.path), "--relay"];
    let relay_args = ["outbox", "relay", "--config", arg(&big.path)];
    let mut seed: u64 = 0x5eed_1313;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut runner = spawn(&run_args, &[], one.dir.path(), "run0");
    let mut relay = spawn(&relay_args, &[], big.dir.path(), "relay0");
    let mut all = Vec::new();
    for round in 0..12u32 {
        let recs = events(6, 4, 3, 0x1300 + round);
        produce(&topic, &recs);
        all.extend(recs);
        std::thread::sleep(Duration::from_millis(200 + rnd(1200)));
        if rnd(2) == 0 {
            runner.kill().unwrap();
            runner.wait().unwrap();
            runner = spawn(&run_args, &[], one.dir.path(), &format!("run{round}"));
        } else {
            relay.kill().unwrap();
            relay.wait().unwrap();
            relay = spawn(&relay_args, &[], big.dir.path(), &format!("relay{round}"));
        }
    }
    std::thread::sleep(Duration::from_millis(rnd(1500)));
    for c in [&mut runner, &mut relay] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    let t = run_caught_up(&one.path).tally();
    assert_eq!(t.quarantined + t.filtered, 0);
    let done = replaysafe_with(
        &[
            "outbox",
            "relay",
            "--config",
            arg(&big.path),
            "--until-empty",
        ],
        &[],
        Duration::from_secs(120),
    );
    done.assert_ok();
    // The events are 12 rounds × 6 entities × 4 versions, but versions repeat per round (the event ids differ).
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), all.len() as i64);
    assert_eq!(
        db.i64("SELECT count(DISTINCT delivery_key) FROM {s}.outbox"),
        all.len() as i64
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NULL"),
        0
    );
    assert_eq!(
        db.i64("SELECT sum(n)::bigint FROM {s}.daily"),
        all.len() as i64
    );
    let rows: HashMap<String, (Option<String>, String, i64)> = db
        .query(
            "SELECT delivery_key, message_key, payload::text, id FROM {s}.outbox",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    let msgs = read_topic(&out);
    let mut seen = HashSet::new();
    let mut last_id: HashMap<Option<String>, i64> = HashMap::new();
    for m in &msgs {
        let d = m.delivery.clone().expect("delivery header");
        let (key, value, id) = rows
            .get(&d)
            .unwrap_or_else(|| panic!("{m:?} is no outbox row"));
        assert_eq!((&m.key, &m.value), (key, value));
        if seen.insert(d) {
            let before = last_id.insert(key.clone(), *id);
            assert!(
                before.is_none_or(|b| b < *id),
                "key {key:?}: row {id} first seen after {before:?}"
            );
        }
    }
    assert_eq!(seen.len(), rows.len(), "every row on the topic");
    eprintln!("{} rows, {} messages", rows.len(), msgs.len());
}

/// `outbox relay --until-empty` when the broker refuses every message (the topic's `max.message.bytes` below
/// them): it used to retry forever; it stops after [`STALLED_ROUNDS`] rounds that
/// published nothing, exits 1 naming the rows left, and leaves them unpublished (none marked, none on the topic).
#[test]
fn relay_until_empty_stops_when_the_broker_refuses_every_row() {
    use crate::relay::{events, events_pipeline, read_topic};
    let (db, topic) = stage("b13_big", 2);
    let out = unique("b13small");
    create_topic(&out, 2, &[("max.message.bytes", "16")]);
    produce(&topic, &events(3, 2, 2, 0x1313));
    let p = events_pipeline(&topic, &unique("g"), &db, &out, 5000);
    run_caught_up(&p.path);
    let done = replaysafe_with(
        &["outbox", "relay", "--config", arg(&p.path), "--until-empty"],
        &[],
        Duration::from_secs(120),
    );
    assert_eq!(done.code, Some(1), "{}\n{}", done.stdout, done.stderr);
    assert!(
        done.stderr.contains("6 rows left unpublished"),
        "{}",
        done.stderr
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NULL"),
        6
    );
    assert_eq!(read_topic(&out), vec![]);
}

/// `outbox relay --metrics-addr` alone (no `run` beside it): `/readyz` answers 200 `ready: outbox relay` once
/// the database probe succeeded — it used to say `no partitions assigned` forever (and `/healthz` failed after
/// 60 s, the engine loop never turning), so a liveness/readiness probe would restart or shun every relay. The
/// rows are published meanwhile and the readiness holds after the relay emptied the outbox.
#[test]
fn a_standalone_relay_is_ready_without_partitions() {
    let (db, topic) = stage("n13_relay", 2);
    let out = new_topic("n13_relay_out", 2);
    let text = concat!(
        header!(),
        r#"[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date" }

[identity]
key = ["event_id"]

[[projection]]
kind = "outbox"
table = "outbox"
key = ["event_id"]
"#
    );
    let text = format!("{text}\n[outbox]\ntopic = \"{out}\"\n");
    let p = pipeline(&text, &topic, &unique("relay"), &db.schema);
    let recs: Vec<Rec> = (0..6).map(|n| ev(100 + n, (n % 2) as i32, 1)).collect();
    produce(&topic, &recs);
    assert_eq!(run_caught_up(&p.path).tally().landed, 6);
    let addr = crate::health::free_addr();
    let args = [
        "outbox",
        "relay",
        "--config",
        arg(&p.path),
        "--metrics-addr",
        &addr,
    ];
    let mut relay = spawn(&args, &[], p.dir.path(), "relay");
    let body = crate::health::wait_for(&addr, "/readyz", "the relay ready", |c, _| c == 200);
    assert_eq!(body, "ready: outbox relay\n");
    wait_until(
        std::time::Duration::from_secs(60),
        "every row published",
        || db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NULL") == 0,
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 6);
    assert_eq!(crate::health::get(&addr, "/readyz").map(|r| r.0), Some(200));
    assert_eq!(
        crate::health::get(&addr, "/healthz").map(|r| r.0),
        Some(200)
    );
    assert_eq!(terminate(&mut relay), Some(0));
}
