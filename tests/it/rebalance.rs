//! Rebalances under each supported strategy (issue 37 item 3, case C48) and two processes sharing one
//! `group.instance.id` (item 5): three workers joining and leaving one group while records arrive, entities
//! spread over the partitions, batch sizes 5000, 1 and 200. The end state is exact under eager (`range`),
//! cooperative (`cooperative-sticky`) and KIP-848 (`group.protocol = consumer`) rebalancing; under the two
//! incremental ones a member keeps the partitions not revoked — they are never assigned (re-sought) again.

use std::time::Duration;

use crate::common::*;
use crate::core::{counts, seed_events, SEED};

const PARTITIONS: i32 = 6;
const EVENTS: usize = 3000;

/// [`SEED`] plus a `version` field (the event's index) and a version-guarded row projection `latest` (each
/// customer's newest amount): the counter, the sum and a row table over entities spread over the partitions.
fn with_rows() -> String {
    SEED.replace(
        "[identity]",
        "version = { path = \"/version\", type = \"bigint\" }\n\n[identity]",
    ) + "\n[[projection]]\nkind = \"row\"\ntable = \"latest\"\nkey = [\"customer_id\"]\nversion = \"version\"\n\
         columns = [\"customer_id\", \"amount\"]\n"
}

/// [`seed_events`] with each event's index as its `version`; also the true row of each customer (its newest
/// event's amount and version).
#[allow(clippy::type_complexity)]
fn versioned(
    n: usize,
) -> (
    Vec<Rec>,
    std::collections::BTreeMap<(String, String), i64>,
    std::collections::BTreeMap<String, (String, i64)>,
) {
    let (mut recs, truth) = seed_events(n, PARTITIONS);
    let mut rows = std::collections::BTreeMap::new();
    for (i, r) in recs.iter_mut().enumerate() {
        let mut v: serde_json::Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
        v["version"] = serde_json::json!(i);
        let customer = v["customer_id"].as_str().unwrap().to_string();
        let amount = v["amount"].as_str().unwrap().to_string();
        rows.insert(customer, (amount, i as i64));
        r.value = Some(serde_json::to_vec(&v).unwrap());
    }
    (recs, truth, rows)
}

/// The pipeline of member `name` with `max-records = max` and `properties` (TOML lines of `[kafka.properties]`).
fn member(dir: &std::path::Path, base: &Pipeline, name: &str, max: usize) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&base.path)
        .unwrap()
        .replace("max-records = 200", &format!("max-records = {max}"));
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The "partition assigned" log lines of a member's stderr, as partition numbers in order.
fn assigned(dir: &std::path::Path, name: &str) -> Vec<i32> {
    let log = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("partition assigned"))
        .filter_map(|l| {
            let rest = l.split("partition=").nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Whether every partition's checkpoint is past its last produced record.
fn at_end(db: &Db, group: &str, topic: &str, last: &[Option<i64>]) -> bool {
    (0..PARTITIONS).all(|p| db.checkpoint(group, topic, p) == last[p as usize].map(|l| l + 1))
}

/// Three workers join one after another while records arrive, the first leaves, a fourth joins, the second
/// leaves; the two left catch up. Returns the first member's assigned partitions (log order) for the caller's
/// strategy-specific check.
fn join_and_leave(prefix: &str, properties: &str) -> Vec<i32> {
    let (db, topic) = stage(prefix, PARTITIONS);
    let (recs, truth, rows) = versioned(EVENTS);
    let group = unique("g");
    let text = format!("{}\n[kafka.properties]\n{properties}\n", with_rows());
    let base = pipeline(&text, &topic, &group, &db.schema);
    let dir = base.dir.path();
    // Batch commits of the members with large batches take 300 ms more (failpoint): a rebalance finds batches in
    // flight and offset commits overlap it.
    let slow = [("REPLAYSAFE_FAILPOINTS", "before-db-commit=sleep(300)")];
    let start = |name: &str, max: usize| {
        let path = member(dir, &base, name, max);
        let envs: &[(&str, &str)] = if max > 1 { &slow } else { &[] };
        spawn(&["run", "--config", arg(&path)], envs, dir, name)
    };
    let joined = |name: &str| {
        wait_until(
            Duration::from_secs(90),
            &format!("{name} is assigned partitions"),
            || !assigned(dir, name).is_empty(),
        )
    };
    let quarter = EVENTS / 4;
    let mut offsets = produce(&topic, &recs[..quarter]);
    let mut a = start("a", 5000);
    joined("a");
    offsets.extend(produce(&topic, &recs[quarter..2 * quarter]));
    let mut b = start("b", 1);
    joined("b");
    let mut c = start("c", 200);
    joined("c");
    offsets.extend(produce(&topic, &recs[2 * quarter..3 * quarter]));
    assert_eq!(terminate(&mut a), Some(0), "a leaves cleanly on SIGTERM");
    let mut d = start("d", 5000);
    joined("d");
    offsets.extend(produce(&topic, &recs[3 * quarter..]));
    assert_eq!(terminate(&mut b), Some(0), "b leaves cleanly on SIGTERM");
    let last: Vec<Option<i64>> = (0..PARTITIONS)
        .map(|p| {
            recs.iter()
                .zip(&offsets)
                .filter(|(r, _)| r.partition == p)
                .map(|(_, o)| *o)
                .max()
        })
        .collect();
    // No partition stalled: every checkpoint reaches its partition's end with c and d alone.
    wait_until(
        Duration::from_secs(120),
        "every partition applied to its end",
        || at_end(&db, &group, &topic, &last),
    );
    assert_eq!(terminate(&mut c), Some(0));
    assert_eq!(terminate(&mut d), Some(0));
    assert_eq!(counts(&db), truth, "the counter, each event once");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        EVENTS as i64
    );
    assert_eq!(
        db.i64("SELECT count(*)::bigint FROM {s}.daily_totals"),
        truth.len() as i64,
        "one sum row per counter row"
    );
    let got: std::collections::BTreeMap<String, (String, i64)> = db
        .query(
            "SELECT customer_id, amount::text, _version[1] FROM {s}.latest",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    assert_eq!(got, rows, "the row table: each customer's newest event");
    assert!(at_end(&db, &group, &topic, &last));
    // Every process's accounting line adds up (checked by `tally`); together they landed every event once.
    let mut landed = 0;
    for name in ["a", "b", "c", "d"] {
        let out = Out {
            code: Some(0),
            stdout: std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap(),
            stderr: String::new(),
        };
        // Stale: older than the customer's row (its events come from every partition), still counted and summed.
        landed += out.tally().landed + out.stale();
    }
    assert_eq!(
        landed, EVENTS as u64,
        "landed + stale over the four processes"
    );
    let committed = committed(&group, &topic, PARTITIONS);
    for p in 0..PARTITIONS {
        assert_eq!(
            committed[p as usize],
            db.checkpoint(&group, &topic, p),
            "committed offset = checkpoint, partition {p}"
        );
    }
    for name in ["b", "c", "d"] {
        assert!(!assigned(dir, name).is_empty(), "{name} took part");
    }
    // Commits rejected during a rebalance are superseded by later ones, never retried into more rebalances:
    // the first member serves its first assignment, two joins (eager: revoke + assign each; incremental:
    // revoke, assign, and the assign of the rejoin that follows) and its own leave — a loop would show dozens.
    let log = std::fs::read_to_string(dir.join("a.err")).unwrap();
    let callbacks = log.matches("rebalance: ").count();
    let failed: usize = ["a", "b", "c", "d"]
        .iter()
        .map(|n| {
            let log = std::fs::read_to_string(dir.join(format!("{n}.err"))).unwrap();
            log.matches("offset commit failed").count()
                + log.matches("offset commit rejected").count()
        })
        .sum();
    eprintln!("a: {callbacks} rebalance callbacks; {failed} failed offset commits in all");
    assert!(
        (3..=12).contains(&callbacks),
        "a served {callbacks} rebalance callbacks"
    );
    assigned(dir, "a")
}

/// Whether some partition was assigned (positioned at its checkpoint) twice to one member.
fn reassigned(parts: &[i32]) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    parts.iter().any(|p| !seen.insert(*p))
}

/// Eager `range`: every join revokes every partition of every member and assigns again — the first member's
/// partitions are positioned again at each join (the check the incremental tests rely on sees it).
#[test]
fn three_workers_join_and_leave_under_eager_range() {
    let a = join_and_leave(
        "rebal_range",
        "\"partition.assignment.strategy\" = \"range\"\n\"session.timeout.ms\" = \"10000\"\n\
         \"heartbeat.interval.ms\" = \"1000\"",
    );
    assert!(
        reassigned(&a),
        "eager: a's partitions assigned again at each join: {a:?}"
    );
}

/// `cooperative-sticky` (case C48): a join revokes only the partitions that move; the first member keeps the
/// others running — never assigned or positioned again (no re-seek, no buffer dropped) — and the end state is
/// exact.
#[test]
fn three_workers_join_and_leave_under_cooperative_sticky() {
    let a = join_and_leave(
        "rebal_coop",
        "\"partition.assignment.strategy\" = \"cooperative-sticky\"\n\"session.timeout.ms\" = \"10000\"\n\
         \"heartbeat.interval.ms\" = \"1000\"",
    );
    assert!(
        !reassigned(&a) && a.len() == PARTITIONS as usize,
        "cooperative: a got each partition once and kept what was not revoked: {a:?}"
    );
}

/// KIP-848 (`group.protocol = consumer`, the 4.x broker's own assignor): incremental like cooperative-sticky.
#[test]
fn three_workers_join_and_leave_under_the_consumer_protocol() {
    let a = join_and_leave("rebal_kip848", "\"group.protocol\" = \"consumer\"");
    assert!(
        !reassigned(&a) && a.len() == PARTITIONS as usize,
        "KIP-848: a got each partition once and kept what was not revoked: {a:?}"
    );
}

/// Two processes with one `group.instance.id` (static membership, KIP-345), classic protocol: Kafka fences the
/// member already in the group, which exits 1 naming the id's value and what to change; the other goes on and
/// applies everything.
#[test]
fn a_second_process_with_the_same_instance_id_fences_one_that_names_it() {
    shared_instance_id("\"session.timeout.ms\" = \"10000\"\n\"heartbeat.interval.ms\" = \"1000\"");
}

/// The same under KIP-848 (`group.protocol = consumer`): the joining process is fenced
/// (`UNRELEASED_INSTANCE_ID`), with the same message.
#[test]
fn a_second_process_with_the_same_instance_id_under_kip848_is_fenced_and_names_it() {
    shared_instance_id("\"group.protocol\" = \"consumer\"");
}

fn shared_instance_id(properties: &str) {
    let (db, topic) = stage("instance", 2);
    let (recs, truth) = seed_events(400, 2);
    let group = unique("g");
    let id = unique("worker");
    let text =
        format!("{SEED}\n[kafka.properties]\n\"group.instance.id\" = \"{id}\"\n{properties}\n");
    let p = pipeline(&text, &topic, &group, &db.schema);
    let dir = p.dir.path();
    let mut offsets = produce(&topic, &recs[..200]);
    let mut a = spawn_run(&p, &[], "a");
    wait_until(Duration::from_secs(90), "a is assigned partitions", || {
        !assigned(dir, "a").is_empty()
    });
    let mut b = spawn_run(&p, &[], "b");
    let mut fenced = None;
    wait_until(Duration::from_secs(60), "one of the two exits", || {
        for (name, child) in [("a", &mut a), ("b", &mut b)] {
            if let Some(status) = child.try_wait().unwrap() {
                fenced = Some((name, status.code()));
                return true;
            }
        }
        false
    });
    let (name, code) = fenced.unwrap();
    assert_eq!(code, Some(1), "the fenced process {name} exits 1");
    let err = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap();
    assert!(
        err.contains(&format!("`group.instance.id` = `{id}`"))
            && err.contains(
                "set \"group.instance.id\" in [kafka.properties] to a value unique to this worker"
            ),
        "{err}"
    );
    let mut survivor = if name == "a" { b } else { a };
    offsets.extend(produce(&topic, &recs[200..]));
    let last: Vec<Option<i64>> = (0..2)
        .map(|part| {
            recs.iter()
                .zip(&offsets)
                .filter(|(r, _)| r.partition == part)
                .map(|(_, o)| *o)
                .max()
        })
        .collect();
    wait_until(
        Duration::from_secs(90),
        "the survivor applies everything",
        || {
            (0..2).all(|part| {
                db.checkpoint(&group, &topic, part) == last[part as usize].map(|l| l + 1)
            })
        },
    );
    assert_eq!(terminate(&mut survivor), Some(0));
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 400);
}

/// The membership bound covers a member that believes it is in the group but whose group coordinator answers
/// nothing (librdkafka#3082, #2944; the failpoint `coordinator-silent` hides the coordinator's responses from
/// the watchdog): while it holds no partition it says so on `/readyz` ("no assignment since …"), and it exits 1
/// once `max.poll.interval.ms + session.timeout.ms` (12 s here) has passed, naming the state and its assignment
/// (the eager assignor may give it the one partition or not). The two other members, whose coordinator answers
/// their heartbeats — one of them idle as long —, stay; the partition's owner applies everything.
#[test]
fn a_member_whose_coordinator_never_answers_exits_within_the_bound() {
    let (db, topic) = stage("coordsilent", 1);
    let (recs, truth) = seed_events(300, 1);
    let group = unique("g");
    let text = format!(
        "{SEED}\n[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"max.poll.interval.ms\" = \"6000\"\n\
         \"heartbeat.interval.ms\" = \"1000\"\n\"statistics.interval.ms\" = \"1000\"\n"
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let dir = p.dir.path();
    let mut offsets = produce(&topic, &recs[..100]);
    let mut owner = spawn_run(&p, &[], "owner");
    wait_until(Duration::from_secs(90), "the owner is assigned", || {
        !assigned(dir, "owner").is_empty()
    });
    let mut idle = spawn_run(&p, &[], "idle");
    let addr = crate::health::free_addr();
    let head = ["run", "--config", arg(&p.path), "--metrics-addr", &addr];
    let silent = [("REPLAYSAFE_FAILPOINTS", "coordinator-silent=return")];
    let mut stuck = spawn(&head, &silent, dir, "stuck");
    let mut said = None;
    wait_until(
        Duration::from_secs(60),
        "/readyz of the stuck member",
        || {
            said = crate::health::get(&addr, "/readyz")
                .filter(|(c, t)| *c == 503 && t.contains("no assignment"));
            said.is_some()
        },
    );
    let text = said.unwrap().1;
    assert!(
        text.starts_with("not ready: no partitions assigned (no assignment since 20"),
        "{text}"
    );
    let started = std::time::Instant::now();
    wait_until(Duration::from_secs(60), "the stuck member exits", || {
        stuck.try_wait().unwrap().is_some()
    });
    assert_eq!(
        stuck.wait().unwrap().code(),
        Some(1),
        "the documented exit code"
    );
    let err = std::fs::read_to_string(dir.join("stuck.err")).unwrap();
    assert!(
        err.contains("the group coordinator has answered none of this member's requests for")
            && err.contains(" partitions assigned) while the brokers answer")
            && err.contains("session.timeout.ms = 12.0 s"),
        "{err}"
    );
    eprintln!(
        "stuck member exited {:?} after /readyz first named it",
        started.elapsed()
    );
    // The members whose coordinator answers are still running (one of them idle all along).
    assert!(idle.try_wait().unwrap().is_none(), "a healthy member stays");
    assert!(
        owner.try_wait().unwrap().is_none(),
        "a healthy member stays"
    );
    offsets.extend(produce(&topic, &recs[100..]));
    let last = offsets.iter().max().copied();
    wait_until(
        Duration::from_secs(60),
        "the owner applies everything",
        || db.checkpoint(&group, &topic, 0) == last.map(|l| l + 1),
    );
    assert_eq!(terminate(&mut idle), Some(0));
    assert_eq!(terminate(&mut owner), Some(0));
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 300);
    assert_eq!(
        committed(&group, &topic, 1)[0],
        db.checkpoint(&group, &topic, 0)
    );
}

/// Case C48's pipeline: the order events counted per customer, a row per order (version-guarded), the ledger.
const C48: &str = concat!(
    header!(),
    r#"[batch]
max-records = 5000
linger-ms = 300

[fields]
event_id = { path = "/event_id", type = "uuid" }
entity_id = { path = "/entity_id", type = "text" }
version = { path = "/version", type = "bigint" }
customer_id = { path = "/data/customer_id", type = "text" }
total = { path = "/data/total", type = "numeric" }

[identity]
key = ["event_id"]

[[projection]]
kind = "counter"
table = "processed"
group-by = ["customer_id"]
column = "n"

[[projection]]
kind = "row"
table = "orders"
key = ["entity_id"]
version = "version"
columns = ["entity_id", "total"]

[kafka.properties]
"partition.assignment.strategy" = "cooperative-sticky"
"session.timeout.ms" = "10000"
"heartbeat.interval.ms" = "1000"
"#
);

/// One of case C48's order events (`o-<n>`, total `<n>.00`) on `partition`.
fn c48_event(partition: i32, n: u32) -> Rec {
    let value = format!(
        r#"{{"event_id":"c48e0000-0000-4000-8000-{n:012}","event_type":"OrderPlaced","entity_id":"o-{n}","version":1,"occurred_at":"2024-04-25T00:00:{n:02}Z","data":{{"customer_id":"c-48","total":"{n}.00"}}}}"#
    );
    Rec::json(
        partition,
        &format!("o-{n}"),
        &value,
        1_714_003_200_000 + i64::from(n) * 1000,
    )
}

/// Case C48 (cooperative-sticky revokes only some partitions): W1 owns both partitions and is committing one
/// batch over both (each batch commit takes 2 s more, failpoint) when W2 joins; the rebalance moves one
/// partition. W1 keeps the other running — never assigned or positioned again — and applies the record that
/// arrives on it afterwards (o-12); the moved one is applied once, by W1 before the move or by W2 after it
/// (never both, never neither). Every event once; checkpoints and committed offsets at the ends; W1 serves at
/// most its first assignment and two rebalances' callbacks after W2 joins (no commit loop).
#[test]
fn c48_a_cooperative_revoke_of_one_partition_leaves_the_other_running() {
    let (db, topic) = stage("c48", 2);
    let group = unique("g");
    let p = pipeline(C48, &topic, &group, &db.schema);
    let dir = p.dir.path();
    produce(
        &topic,
        &[
            c48_event(0, 10),
            c48_event(0, 11),
            c48_event(1, 20),
            c48_event(1, 21),
        ],
    );
    let head = ["run", "--config", arg(&p.path)];
    let slow = [("REPLAYSAFE_FAILPOINTS", "before-db-commit=sleep(2000)")];
    let mut w1 = spawn(&head, &slow, dir, "w1");
    wait_until(Duration::from_secs(90), "W1 holds both partitions", || {
        assigned(dir, "w1").len() == 2
    });
    let mut w2 = spawn(&head, &[], dir, "w2");
    wait_until(Duration::from_secs(90), "W2 is given one partition", || {
        !assigned(dir, "w2").is_empty()
    });
    let moved = assigned(dir, "w2")[0];
    let kept = 1 - moved;
    // After the rebalance, a record on the partition W1 kept (the case's p0@12).
    let n = if kept == 0 { 12 } else { 22 };
    produce(&topic, &[c48_event(kept, n)]);
    wait_until(
        Duration::from_secs(60),
        "both partitions applied to their ends",
        || {
            db.checkpoint(&group, &topic, kept) == Some(3)
                && db.checkpoint(&group, &topic, moved) == Some(2)
        },
    );
    assert_eq!(terminate(&mut w2), Some(0));
    assert_eq!(terminate(&mut w1), Some(0));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 5);
    assert_eq!(
        db.i64("SELECT n FROM {s}.processed WHERE customer_id = 'c-48'"),
        5,
        "each event counted once"
    );
    let mut want = vec![
        ("o-10".to_string(), "10.00".to_string()),
        ("o-11".into(), "11.00".into()),
        ("o-20".into(), "20.00".into()),
        ("o-21".into(), "21.00".into()),
        (format!("o-{n}"), format!("{n}.00")),
    ];
    want.sort();
    let got: Vec<(String, String)> = db
        .query(
            "SELECT entity_id, total::text FROM {s}.orders ORDER BY 1",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(got, want);
    let committed = committed(&group, &topic, 2);
    assert_eq!(
        committed[kept as usize],
        Some(3),
        "committed offset of the kept partition"
    );
    assert_eq!(
        committed[moved as usize],
        Some(2),
        "committed offset of the moved partition"
    );
    // W1 positioned each partition once: the kept one was never taken over or sought again.
    let w1_parts = assigned(dir, "w1");
    assert_eq!(
        w1_parts.iter().filter(|p| **p == kept).count(),
        1,
        "{w1_parts:?}"
    );
    assert_eq!(
        assigned(dir, "w2"),
        vec![moved],
        "W2 got only the moved partition"
    );
    // The two outcomes for the moved partition: W1's batch committed before the move (W2 finds nothing new, or
    // counts a redelivery as duplicate), or W2 applied it. Over both processes: 5 landed, the rest duplicates.
    let tally = |name: &str| {
        Out {
            code: Some(0),
            stdout: std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap(),
            stderr: String::new(),
        }
        .tally()
    };
    let (t1, t2) = (tally("w1"), tally("w2"));
    assert_eq!(t1.landed + t2.landed, 5, "W1 {t1:?}, W2 {t2:?}");
    assert!(
        t1.landed >= 1,
        "W1 applied the kept partition's new record: {t1:?}"
    );
    let log = std::fs::read_to_string(dir.join("w1.err")).unwrap();
    let callbacks = log.matches("rebalance: ").count();
    // First assign; W2's join: revoke one, assign none, the rejoin's assign; the leave on SIGTERM: revoke.
    assert!(
        callbacks <= 6,
        "W1 served {callbacks} rebalance callbacks:\n{log}"
    );
}

/// The same under `cooperative-sticky` (break-it review b3): classic protocol, incremental assignor.
#[test]
fn a_second_process_with_the_same_instance_id_under_cooperative_sticky_fences_one_that_names_it() {
    shared_instance_id(
        "\"partition.assignment.strategy\" = \"cooperative-sticky\"\n\"session.timeout.ms\" = \"10000\"\n\
         \"heartbeat.interval.ms\" = \"1000\"",
    );
}
