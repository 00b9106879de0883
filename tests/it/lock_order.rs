//! Case C36: two partitions' batches (or two consumer groups) update the same aggregate rows in opposite record
//! order. Every batch statement takes its row locks in one key order, so they wait instead of deadlocking; a
//! deadlock PostgreSQL still detects (40P01) is retried as a brand-new transaction.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::cases::{load, produce_case, CaseRecord};
use crate::common::*;

/// C36's pipeline: counter and sum over one pre-created `customer_stats` table (both statements lock the same
/// rows), an outbox, the ledger `processed_events`. `MAXREC` is `batch.max-records`.
const C36: &str = concat!(
    header!(),
    r#"[batch]
max-records = MAXREC
linger-ms = 10

[fields]
event_id = { path = "/event_id", type = "uuid" }
entity_id = { path = "/entity_id", type = "text" }
day = { path = "/occurred_at", type = "date" }
customer_id = { path = "/data/customer_id", type = "text" }
total = { path = "/data/total", type = "numeric" }

[identity]
key = ["event_id"]
partition-by = "day"

[ledger]
table = "processed_events"

[[projection]]
name = "orders_placed"
kind = "counter"
table = "customer_stats"
group-by = ["customer_id"]
column = "orders_placed"

[[projection]]
name = "order_totals"
kind = "sum"
table = "customer_stats"
group-by = ["customer_id"]
add = { total = "total" }

[[projection]]
kind = "outbox"
table = "outbox"
payload = ["event_id", "customer_id", "total"]
key = ["entity_id"]
"#
);

/// A fresh schema and 2-partition topic, `customer_stats` created with both value columns, the C36 pipeline
/// (`max_records` per batch) under a fresh group, and `init` run.
fn c36_stage(prefix: &str, max_records: usize) -> (Db, String, String, Pipeline) {
    c36_stage_with(prefix, max_records, "")
}

/// [`c36_stage`] with `postgres` added to the pipeline's `[postgres]` table (the header's last).
fn c36_stage_with(
    prefix: &str,
    max_records: usize,
    postgres: &str,
) -> (Db, String, String, Pipeline) {
    let (db, topic) = stage(prefix, 2);
    let group = unique("g");
    db.execute(
        "CREATE TABLE {s}.customer_stats (customer_id text NOT NULL PRIMARY KEY, \
         orders_placed bigint NOT NULL DEFAULT 0, total numeric NOT NULL DEFAULT 0)",
    );
    let text = C36
        .replace("MAXREC", &max_records.to_string())
        .replace("[batch]", &format!("{postgres}[batch]"));
    let p = pipeline(&text, &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    (db, topic, group, p)
}

/// `(orders_placed, total as text)` of a customer.
fn stats(db: &Db, customer: &str) -> (i64, String) {
    let r = db.query(
        "SELECT orders_placed, total::text FROM {s}.customer_stats WHERE customer_id = $1",
        &[&customer],
    );
    (r[0].get(0), r[0].get(1))
}

fn assert_stats(db: &Db, customer: &str, orders: i64, total: f64) {
    let (n, t) = stats(db, customer);
    assert_eq!(n, orders, "{customer} orders_placed");
    let t: f64 = t.parse().unwrap();
    assert!(
        (t - total).abs() < 1e-9,
        "{customer} total {t}, want {total}"
    );
}

/// A second session of the test (its own connection on the test's runtime) and its backend pid.
fn session(db: &Db) -> (Arc<tokio_postgres::Client>, i32) {
    let c = pg_client(&db.rt);
    let pid: i32 = db
        .rt
        .block_on(c.query_one("SELECT pg_backend_pid()", &[]))
        .unwrap()
        .get(0);
    (Arc::new(c), pid)
}

fn exec(db: &Db, c: &tokio_postgres::Client, sql: &str) {
    let sql = sql.replace("{s}", &format!("\"{}\"", db.schema));
    db.rt
        .block_on(c.batch_execute(&sql))
        .unwrap_or_else(|e| panic!("{sql}: {e} {:?}", e.as_db_error().map(|d| d.message())));
}

/// How many backends wait for a lock `pid` holds (PostgreSQL's `pg_blocking_pids`).
fn blocked_by(db: &Db, pid: i32) -> i64 {
    blocked_in(db, pid, "")
}

/// How many backends wait for a lock `pid` holds in a statement starting with `prefix` (not, say, in start-up
/// DDL).
fn blocked_in(db: &Db, pid: i32, prefix: &str) -> i64 {
    db.query(
        "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) \
         AND starts_with(query, $2)",
        &[&pid, &prefix],
    )[0]
    .get(0)
}

/// The final state the case expects plus the test's own adjustments of `total` (`extra_c1`, `extra_c2`):
/// customer_stats, ledger 4, outbox 4 (one per event), no dead letter, checkpoints and Kafka offsets at the
/// end of both partitions (case offsets 12 and 22).
fn assert_c36_final(
    db: &Db,
    (topic, group): (&str, &str),
    map: &BTreeMap<(i32, i64), i64>,
    (extra_c1, extra_c2): (f64, f64),
) {
    assert_stats(db, "c-1", 2, 50.0 + extra_c1);
    assert_stats(db, "c-2", 2, 50.0 + extra_c2);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 4);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 4);
    assert_eq!(
        db.i64("SELECT count(DISTINCT payload->>'event_id') FROM {s}.outbox"),
        4
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    let (p0, p1) = (map[&(0, 11)] + 1, map[&(1, 21)] + 1);
    assert_eq!(db.checkpoint(group, topic, 0), Some(p0));
    assert_eq!(db.checkpoint(group, topic, 1), Some(p1));
    wait_until(Duration::from_secs(30), "Kafka offsets committed", || {
        committed(group, topic, 2) == vec![Some(p0), Some(p1)]
    });
}

/// C36 with a deterministic lock order: a test session holds customer c-1's row; the worker applies p1's batch
/// (c-2 then c-1 in record order) and waits for c-1 first, holding no other customer_stats row — so the test
/// session takes c-2 at once (`NOWAIT`). In record order the worker would hold c-2 and the test session's lock
/// of it would fail (or deadlock without `NOWAIT`). Then p0's batch (c-1 then c-2) follows: the case's final
/// state plus the test session's adjustments.
#[test]
fn c36_batches_lock_aggregate_rows_in_key_order() {
    let (db, topic, group, p) = c36_stage("c36a", 2);
    db.execute("INSERT INTO {s}.customer_stats (customer_id) VALUES ('c-1'), ('c-2')");
    let (s, s_pid) = session(&db);
    exec(
        &db,
        &s,
        "BEGIN; SET LOCAL lock_timeout = '5s'; \
         UPDATE {s}.customer_stats SET total = total + 100 WHERE customer_id = 'c-1'",
    );
    let records = load("C36", None);
    let part =
        |n: i32| -> Vec<&CaseRecord> { records.iter().filter(|r| r.partition == n).collect() };
    let mut map = produce_case(&topic, &part(1));
    let mut child = spawn_run(&p, &[], "c36a");
    wait_until(
        Duration::from_secs(60),
        "p1's batch waiting for c-1",
        || blocked_in(&db, s_pid, "INSERT INTO") == 1,
    );
    // Sorted: the batch holds no lock on c-2. Record order: it would (SQLSTATE 55P03 here).
    exec(
        &db,
        &s,
        "SELECT 1 FROM {s}.customer_stats WHERE customer_id = 'c-2' FOR UPDATE NOWAIT; \
         UPDATE {s}.customer_stats SET total = total + 1000 WHERE customer_id = 'c-2'; COMMIT",
    );
    map.extend(produce_case(&topic, &part(0)));
    let end = (map[&(0, 11)] + 1, map[&(1, 21)] + 1);
    wait_until(Duration::from_secs(60), "both batches committed", || {
        db.checkpoint(&group, &topic, 0) == Some(end.0)
            && db.checkpoint(&group, &topic, 1) == Some(end.1)
    });
    assert_c36_final(&db, (&topic, &group), &map, (100.0, 1000.0));
    assert_eq!(terminate(&mut child), Some(0));
    let err = std::fs::read_to_string(p.dir.path().join("c36a.err")).unwrap();
    assert!(!err.contains("40P01"), "{err}");
    let out = std::fs::read_to_string(p.dir.path().join("c36a.out")).unwrap();
    assert!(
        out.contains("consumed 4 = landed 4 + duplicate 0 + filtered 0 + quarantined 0"),
        "{out}"
    );
}

/// The class, with more keys than C36's two (whose hash order happens to be their sorted order): one batch of
/// 16 customers in descending record order waits for the smallest key, which a test session holds, without
/// holding any other customer's row.
#[test]
fn c36_a_batch_waits_on_its_smallest_key_holding_no_other() {
    let (db, topic, group, p) = c36_stage("c36k", 100);
    let customers: Vec<String> = (1..=16).map(|i| format!("k-{i:02}")).collect();
    for c in &customers {
        db.query(
            "INSERT INTO {s}.customer_stats (customer_id) VALUES ($1)",
            &[c],
        );
    }
    let (s, s_pid) = session(&db);
    exec(
        &db,
        &s,
        "BEGIN; SET LOCAL lock_timeout = '5s'; \
         UPDATE {s}.customer_stats SET total = total + 100 WHERE customer_id = 'k-01'",
    );
    let recs: Vec<Rec> = customers
        .iter()
        .rev()
        .enumerate()
        .map(|(i, c)| {
            let v = format!(
                r#"{{"event_id":"c36f0000-0000-4000-8000-{i:012}","entity_id":"o-{i}","occurred_at":"2024-04-25T00:00:01Z","data":{{"customer_id":"{c}","total":"1.00"}}}}"#
            );
            Rec::json(0, &format!("o-{i}"), &v, 1_714_003_201_000)
        })
        .collect();
    let offsets = produce(&topic, &recs);
    let mut child = spawn_run(&p, &[], "c36k");
    wait_until(
        Duration::from_secs(60),
        "the batch waiting for k-01",
        || blocked_in(&db, s_pid, "INSERT INTO") == 1,
    );
    let others: Vec<String> = customers[1..].iter().map(|c| format!("'{c}'")).collect();
    exec(
        &db,
        &s,
        &format!(
            "SELECT 1 FROM {{s}}.customer_stats WHERE customer_id IN ({}) FOR UPDATE NOWAIT; COMMIT",
            others.join(", ")
        ),
    );
    let end = offsets.last().unwrap() + 1;
    wait_until(Duration::from_secs(60), "the batch committed", || {
        db.checkpoint(&group, &topic, 0) == Some(end)
    });
    assert_eq!(terminate(&mut child), Some(0));
    assert_stats(&db, "k-01", 1, 101.0);
    for c in &customers[1..] {
        assert_stats(&db, c, 1, 1.0);
    }
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 16);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 16);
}

/// The ledger claim in one order: two batches claiming overlapping delivery keys (a redelivery on another
/// partition, a second consumer group) wait on each other's uncommitted claims. A test session holds an
/// uncommitted claim of the batch's smallest key; the batch (keys in descending record order) waits for it
/// holding no other claim, so the session's claims of every other key go through without waiting (each would
/// otherwise wait on the worker and end in a deadlock or the session's lock timeout). The session rolls back;
/// the batch then lands everything.
#[test]
fn c36_ledger_claims_wait_on_the_smallest_key_holding_no_other() {
    let (db, topic, group, p) = c36_stage("c36l", 100);
    let id = |i: usize| format!("c36d0000-0000-4000-8000-{i:012}");
    let claim = |ids: &[String]| {
        let values: Vec<String> = ids
            .iter()
            .map(|e| format!("('{e}', '2024-04-25', 0, 0)"))
            .collect();
        format!(
            "INSERT INTO {{s}}.processed_events (event_id, day, _source_id, \"offset\") \
             VALUES {}",
            values.join(", ")
        )
    };
    // The day partition the worker would create first.
    db.execute(
        "CREATE TABLE {s}.processed_events_p20240425 PARTITION OF {s}.processed_events \
         (EXCLUDE USING hash ((ROW(generation, event_id, day)::{s}.processed_events_key) WITH =)) \
         FOR VALUES FROM ('2024-04-25') TO ('2024-04-26')",
    );
    let (s, s_pid) = session(&db);
    exec(
        &db,
        &s,
        &format!("BEGIN; SET LOCAL lock_timeout = '5s'; {}", claim(&[id(1)])),
    );
    let recs: Vec<Rec> = (1..=8)
        .rev()
        .map(|i| {
            let v = format!(
                r#"{{"event_id":"{}","entity_id":"o-{i}","occurred_at":"2024-04-25T00:00:01Z","data":{{"customer_id":"c-{}","total":"1.00"}}}}"#,
                id(i),
                i % 3
            );
            Rec::json(0, &format!("o-{i}"), &v, 1_714_003_201_000)
        })
        .collect();
    let offsets = produce(&topic, &recs);
    // The worker's deadlock check waits 60 s: a wait of the session on the worker ends in the session's own error
    // (its deadlock check after 1 s, or its lock timeout), never in the worker being aborted and retried.
    let url = database_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}options=-c%20deadlock_timeout%3D60s");
    let config = arg(&p.path);
    let mut child = spawn(
        &["run", "--config", config],
        &[("DATABASE_URL", &url)],
        p.dir.path(),
        "c36l",
    );
    wait_until(
        Duration::from_secs(60),
        "the batch waiting for key 1",
        || blocked_in(&db, s_pid, "WITH input AS") == 1,
    );
    let others: Vec<String> = (2..=8).map(id).collect();
    exec(&db, &s, &format!("{}; ROLLBACK", claim(&others)));
    let end = offsets.last().unwrap() + 1;
    wait_until(Duration::from_secs(60), "the batch committed", || {
        db.checkpoint(&group, &topic, 0) == Some(end)
    });
    assert_eq!(terminate(&mut child), Some(0));
    let mine: i64 = db.query(
        "SELECT count(*) FROM {s}.processed_events l JOIN {s}.replaysafe_sources s ON s.id = l._source_id \
         WHERE consumer_group = $1",
        &[&group],
    )[0]
    .get(0);
    assert_eq!(mine, 8);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 8);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 8);
    assert_eq!(
        db.i64("SELECT sum(orders_placed)::bigint FROM {s}.customer_stats"),
        8
    );
    let out = std::fs::read_to_string(p.dir.path().join("c36l.out")).unwrap();
    assert!(
        out.contains("consumed 8 = landed 8 + duplicate 0 + filtered 0 + quarantined 0"),
        "{out}"
    );
}

/// C36 when a deadlock does happen: a real 40P01 aborts the worker's p0 batch in the middle. The cycle: the
/// worker holds c-1 and waits for c-2 (session B); session A (its own `deadlock_timeout` long, so the worker's
/// backend is the one PostgreSQL aborts) inserts an outbox row with the delivery key of event 11 and waits for
/// c-1; B commits, and the worker's outbox insert of event 11 waits for A: worker → A → worker. The worker
/// retries the whole transaction: ledger claims redone (a retry trusting the aborted attempt's claims would find
/// 10 and 11 "already claimed" and lose them), nothing dead-lettered, exit 0, the retry logged with its SQLSTATE.
#[test]
fn c36_deadlock_is_retried_as_a_new_transaction() {
    // The worker's lock waits must outlast the set-up of the cycle on a loaded machine (the default 5 s could
    // end its wait for c-2 before B commits, and no deadlock would form).
    let (db, topic, group, p) = c36_stage_with("c36b", 2, "lock-timeout-ms = 50000\n");
    db.execute("INSERT INTO {s}.customer_stats (customer_id) VALUES ('c-1'), ('c-2')");
    let (b, b_pid) = session(&db);
    exec(
        &db,
        &b,
        "BEGIN; UPDATE {s}.customer_stats SET total = total + 1000 WHERE customer_id = 'c-2'",
    );
    let records = load("C36", None);
    let p0: Vec<&CaseRecord> = records.iter().filter(|r| r.partition == 0).collect();
    let mut map = produce_case(&topic, &p0);
    let mut child = spawn_run(&p, &[], "c36b");
    wait_until(
        Duration::from_secs(60),
        "the p0 batch waiting for c-2",
        || blocked_in(&db, b_pid, "INSERT INTO") == 1,
    );
    let worker: i32 = db.query(
        "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        &[&b_pid],
    )[0]
    .get(0);
    let (a, a_pid) = session(&db);
    exec(
        &db,
        &a,
        "SET deadlock_timeout = '60s'; BEGIN; \
         INSERT INTO {s}.outbox (delivery_key, source_topic, source_partition, source_offset, payload) \
         VALUES (json_build_array('', 'c36e0000-0000-4000-8000-000000000011', '2024-04-25')::text, 'x', 0, 0, '{}')",
    );
    let sql = format!(
        "UPDATE \"{}\".customer_stats SET total = total + 100 WHERE customer_id = 'c-1'",
        db.schema
    );
    let a2 = a.clone();
    let a_waits = db.rt.spawn(async move { a2.batch_execute(&sql).await });
    wait_until(Duration::from_secs(60), "session A waiting for c-1", || {
        blocked_by(&db, worker) == 1 && blocked_by(&db, a_pid) == 0
    });
    exec(&db, &b, "COMMIT");
    // PostgreSQL aborts the worker's transaction (its deadlock_timeout, 1 s, is the shorter); A gets c-1.
    db.rt
        .block_on(a_waits)
        .unwrap()
        .expect("session A's update after the worker's abort");
    exec(&db, &a, "ROLLBACK");
    let err = p.dir.path().join("c36b.err");
    wait_until(Duration::from_secs(60), "the deadlock retried", || {
        std::fs::read_to_string(&err).is_ok_and(|l| l.contains("40P01"))
    });
    map.extend(produce_case(
        &topic,
        &records
            .iter()
            .filter(|r| r.partition == 1)
            .collect::<Vec<_>>(),
    ));
    let end = (map[&(0, 11)] + 1, map[&(1, 21)] + 1);
    wait_until(Duration::from_secs(60), "both partitions applied", || {
        db.checkpoint(&group, &topic, 0) == Some(end.0)
            && db.checkpoint(&group, &topic, 1) == Some(end.1)
    });
    assert_c36_final(&db, (&topic, &group), &map, (0.0, 1000.0));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE source_topic = 'x'"),
        0
    );
    assert_eq!(terminate(&mut child), Some(0));
    let log = std::fs::read_to_string(&err).unwrap();
    assert!(
        log.contains("retrying the batch") && log.contains("deadlock detected (SQLSTATE 40P01)"),
        "{log}"
    );
    let out = std::fs::read_to_string(p.dir.path().join("c36b.out")).unwrap();
    assert!(
        out.contains("consumed 4 = landed 4 + duplicate 0 + filtered 0 + quarantined 0"),
        "{out}"
    );
}

/// Two consumer groups (batches of 2 and of 1) apply the same two partitions at once, round after round, with
/// customers shared across partitions and ~10% of the events redelivered on the other partition (overlapping
/// ledger keys). Every event counts once whichever group claims it; sums and counts equal the truth, no
/// deadlock is logged, and the groups' accounting adds up to the events.
#[test]
fn c36_two_groups_on_shared_customers_never_deadlock() {
    let (db, topic, _g1, p1) = c36_stage("c36c", 2);
    let g2 = unique("g");
    let text = C36.replace("MAXREC", "1");
    let p2 = pipeline(&text, &topic, &g2, &db.schema);
    let mut rnd = seeded_random(36);
    let mut truth: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut n = 0u64;
    for round in 0..3 {
        let mut recs = Vec::new();
        let mut events = 0u64;
        for _ in 0..120 {
            n += 1;
            let c = format!("c-{}", rnd(6));
            let cents = 1 + rnd(999) as i64;
            let v = format!(
                r#"{{"event_id":"c36c0000-0000-4000-8000-{n:012}","entity_id":"o-{n}","occurred_at":"2024-04-25T00:00:01Z","data":{{"customer_id":"{c}","total":"{}.{:02}"}}}}"#,
                cents / 100,
                cents % 100
            );
            let part = rnd(2) as i32;
            recs.push(Rec::json(part, &format!("o-{n}"), &v, 1_714_003_201_000));
            if rnd(10) == 0 {
                recs.push(Rec::json(
                    1 - part,
                    &format!("o-{n}"),
                    &v,
                    1_714_003_201_000,
                ));
            }
            let e = truth.entry(c).or_default();
            e.0 += 1;
            e.1 += cents;
            events += 1;
        }
        produce(&topic, &recs);
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| try_run(&p1.path));
            let b = s.spawn(|| try_run(&p2.path));
            (a.join().unwrap(), b.join().unwrap())
        });
        let (ta, tb) = (a.assert_ok().tally(), b.assert_ok().tally());
        assert_eq!(ta.consumed, recs.len() as u64, "round {round}");
        assert_eq!(tb.consumed, recs.len() as u64, "round {round}");
        assert_eq!(ta.landed + tb.landed, events, "round {round}");
        assert_eq!(ta.quarantined + tb.quarantined, 0, "round {round}");
        for o in [&a, &b] {
            assert!(!o.stderr.contains("40P01"), "round {round}: {}", o.stderr);
        }
        for (c, (orders, cents)) in &truth {
            assert_stats(&db, c, *orders, *cents as f64 / 100.0);
        }
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.processed_events"),
            n as i64
        );
        assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), n as i64);
    }
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}
