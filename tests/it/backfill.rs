//! Replay operations: offsets snapshot, backfill, verify, rebuild — against the real broker, with explicit
//! CreateTime timestamps spread over days and retention loss made real with DeleteRecords.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cases::{load, orders_pipeline, produce_case};
use crate::common::*;
use crate::core::{counts, seed_events, SEED};

fn cfg(p: &Pipeline) -> &str {
    p.path.to_str().unwrap()
}

/// A fresh schema and topic named after `prefix` holding `n` seed events over `partitions` partitions, applied by
/// a production group; returns them, the production pipeline and the true counts.
fn seeded(
    prefix: &str,
    partitions: i32,
    n: usize,
) -> (Db, String, Pipeline, BTreeMap<(String, String), i64>) {
    let (db, topic) = stage(prefix, partitions);
    let (recs, truth) = seed_events(n, partitions);
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    run_caught_up(&p.path);
    (db, topic, p, truth)
}

/// Writes a stop file (`kafka-committed`, group `prod`) holding `next_offset` for partition 0 of `topic` only.
fn write_stop_file(path: &std::path::Path, topic: &str, next_offset: i64) {
    std::fs::write(
        path,
        format!(r#"{{"group":"prod","taken_at":"2024-05-01T00:00:00Z","source":"kafka-committed","partitions":[{{"topic":"{topic}","partition":0,"next_offset":{next_offset}}}]}}"#),
    )
    .unwrap();
}

/// `backfill` of `p` from 2024-04-25 to 2024-05-01 under a new group, with the `extra` options.
fn backfill_window(p: &Pipeline, extra: &[&str]) -> Out {
    backfill(
        p,
        "2024-04-25",
        ("--to", "2024-05-01"),
        &unique("bf"),
        extra,
    )
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The seed scenario: a pipeline that silently filtered refunds for six days, the fix, a targeted backfill of
/// the refunds that verifies to the row, a second run that changes nothing, and another writer left undisturbed.
#[test]
fn six_day_refund_backfill_verifies_to_the_row() {
    let (db, topic) = stage("bf_seed", 3);
    let (recs, truth) = seed_events(3000, 3);
    produce(&topic, &recs);
    let prod = unique("prod");
    // The buggy pipeline: refunds (amount < 0) dropped by a filter.
    let buggy = SEED.replace(
        "[identity]",
        "[[filter]]\nname = \"no-refunds\"\ndrop-if = \"amount < 0.0\"\n\n[identity]",
    );
    let p_buggy = pipeline(&buggy, &topic, &prod, &db.schema);
    let t = run_caught_up(&p_buggy.path).tally();
    assert!(t.filtered > 0, "the bug dropped refunds: {t:?}");
    assert_eq!(t.landed + t.filtered, 3000);
    // The fix is deployed (same group): nothing new yet.
    let p = pipeline(SEED, &topic, &prod, &db.schema);
    let dir = p.dir.path();
    let stop = dir.join("stop.json");
    let before = dir.join("before.json");
    let report = dir.join("report.json");
    offsets_snapshot(&p, &prod, &stop).assert_ok();
    let s = json(&stop);
    assert_eq!(s["source"], "postgres-checkpoints");
    assert_eq!(s["partitions"].as_array().unwrap().len(), 3);
    let filter = "day between '2024-04-25' and '2024-04-30'";
    verify_snapshot(&p, "daily_counts", Some(filter), &before).assert_ok();

    // Another writer keeps incrementing a row of the same table (outside the window) during the backfill.
    db.execute("INSERT INTO {s}.daily_counts (day, customer_id, n) VALUES ('2024-06-01', 'other-writer', 0)");
    let stop_writer = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicI64::new(0));
    let writer = {
        let (stop_writer, writes, schema) =
            (stop_writer.clone(), writes.clone(), db.schema.clone());
        std::thread::spawn(move || {
            let other = Db {
                rt: tokio::runtime::Runtime::new().unwrap(),
                client: connect_plain(),
                schema,
                owns: false,
            };
            while !stop_writer.load(Ordering::Relaxed) {
                other.execute("UPDATE {s}.daily_counts SET n = n + 1 WHERE day = '2024-06-01' AND customer_id = 'other-writer'");
                writes.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let bf = unique("bf");
    let out = backfill(
        &p,
        "2024-04-25T00:00:00Z",
        ("--to-offsets", arg(&stop)),
        &bf,
        &["--filter", "amount < 0", "-o", arg(&report)],
    );
    stop_writer.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    out.assert_ok();
    let r = json(&report);
    let landed: u64 = r["per_day"]
        .as_object()
        .unwrap()
        .values()
        .map(|d| d["landed"].as_u64().unwrap())
        .sum();
    assert_eq!(
        landed, t.filtered,
        "the backfill landed exactly the refunds the bug dropped"
    );
    // The aggregate changed, per day, by exactly what the backfill reported.
    let v = verify_diff(&before, &report);
    v.assert_ok();
    assert!(v.stdout.contains("verified"), "{}", v.stdout);
    let mut final_counts = counts(&db);
    let other = final_counts.remove(&("2024-06-01".to_string(), "other-writer".to_string()));
    assert_eq!(
        other,
        Some(writes.load(Ordering::Relaxed)),
        "the other writer's increments are all there"
    );
    assert_eq!(
        final_counts, truth,
        "after the backfill every event is counted once"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 3000);

    // Running it a second time changes nothing: same group (checkpoints at the stop) and a new group (duplicates).
    let refunds_again = |group: &str| {
        let stop = ("--to-offsets", arg(&stop));
        backfill(&p, "2024-04-25", stop, group, &["--filter", "amount < 0"])
    };
    let again = refunds_again(&bf);
    again.assert_ok();
    assert!(
        again.stderr.contains("consumed 0 = landed 0"),
        "{}",
        again.stderr
    );
    let fresh = refunds_again(&unique("bf2"));
    fresh.assert_ok();
    assert!(fresh.stderr.contains(" landed 0 "), "{}", fresh.stderr);
    final_counts = counts(&db);
    final_counts.remove(&("2024-06-01".to_string(), "other-writer".to_string()));
    assert_eq!(final_counts, truth);

    // Refusals: the production group, the stop file's group, a window beyond the horizon.
    let refused = backfill(&p, "2024-04-25", ("--to-offsets", arg(&stop)), &prod, &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("production group"),
        "{}",
        refused.stderr
    );
}

fn connect_plain() -> tokio_postgres::Client {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(conn).ok();
        });
        c
    });
    std::mem::forget(rt);
    client
}

/// A stop file with a missing partition: `--missing-stop` decides (error by default; never offset 0).
#[test]
fn stop_file_with_a_missing_partition() {
    let (db, topic) = stage("bf_missing", 2);
    let (recs, _) = seed_events(200, 2);
    let offsets = produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    let stop = p.dir.path().join("stop.json");
    let end0 = recs
        .iter()
        .zip(&offsets)
        .filter(|(r, _)| r.partition == 0)
        .count() as i64;
    write_stop_file(&stop, &topic, end0);
    let backfill_to = |extra: &[&str]| {
        backfill(
            &p,
            "2024-04-25",
            ("--to-offsets", arg(&stop)),
            &unique("bf"),
            extra,
        )
    };
    let refused = backfill_to(&[]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("/1 has no stop offset"),
        "{}",
        refused.stderr
    );
    let ledger: Option<String> = db.query(
        "SELECT to_regclass($1)::text",
        &[&format!("\"{}\".replaysafe_ledger", db.schema)],
    )[0]
    .get(0);
    assert!(
        ledger.is_none(),
        "refused before anything was created or applied"
    );
    let skip = backfill_to(&["--missing-stop", "skip"]);
    skip.assert_ok();
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        end0,
        "only partition 0 was replayed"
    );
    let end = backfill_to(&["--missing-stop", "end"]);
    end.assert_ok();
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 200);
}

/// C15: a timestamp lookup that answers End starts at the end captured with the lookup; an empty partition
/// finishes at once; End is never used as a number.
#[test]
fn c15_lookup_answering_end_and_empty_partition() {
    let (db, topic) = stage("c15", 3);
    let records = load("C15", None);
    let (early, late): (Vec<_>, Vec<_>) = records
        .iter()
        .partition(|r| !(r.partition == 1 && r.offset == 2));
    let mut map = produce_case(&topic, &early);
    let p = orders_pipeline(&topic, &unique("prod"), &db, None);
    let from = "2024-04-25T00:00:00Z";
    let dry = backfill(
        &p,
        from,
        ("--to", "2024-05-01"),
        &unique("bf"),
        &["--dry-run"],
    );
    dry.assert_ok();
    let plan: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    let starts: BTreeMap<i64, (i64, String)> = plan["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["partition"].as_i64().unwrap(),
                (
                    x["start_offset"].as_i64().unwrap(),
                    x["start_from"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect();
    assert_eq!(starts[&0], (1, "time".to_string()));
    assert_eq!(
        starts[&1],
        (2, "end-at-lookup".to_string()),
        "End = the log end captured with the lookup"
    );
    assert_eq!(starts[&2], (0, "empty".to_string()));
    // o-6 is appended after the lookup; the backfill (stop beyond) applies o-2, o-3, o-6 only.
    map.extend(produce_case(&topic, &late));
    let out = replaysafe_with(
        &[
            "backfill",
            "--config",
            cfg(&p),
            "--from",
            from,
            "--to",
            "2024-05-01",
            "--group-id",
            &unique("bf"),
        ],
        &[],
        Duration::from_secs(120),
    );
    out.assert_ok();
    let orders: Vec<String> = db.column("SELECT order_id FROM {s}.orders ORDER BY 1");
    assert_eq!(orders, vec!["o-2", "o-3", "o-6"]);
    assert_eq!(map[&(1, 2)], 2);
}

/// C18: retention moves the log start past where a backfill stopped: the rerun stops naming the lost range;
/// what was applied stays applied; nothing resets to latest.
#[test]
fn c18_retention_deleted_part_of_the_window() {
    let (db, topic) = stage("c18", 1);
    let records = load("C18", None);
    // 1198 and 1199, then records the broker will delete (1200..1499, three stand for them), then 1500.
    let mut map = produce_case(&topic, &records[..2].iter().collect::<Vec<_>>());
    let filler: Vec<Rec> = (0..3)
        .map(|i| {
            let id = format!("ad000000-0000-4000-8000-00000000120{i}");
            let v = format!(r#"{{"event_id":"{id}","event_type":"OrderPlaced","entity_id":"o-120{i}","version":1,"occurred_at":"2024-04-24T00:10:00Z"}}"#);
            Rec::json(0, "o-filler", &v, 1_713_917_800_000)
        })
        .collect();
    produce(&topic, &filler);
    map.extend(produce_case(
        &topic,
        &records[2..].iter().collect::<Vec<_>>(),
    ));
    let p = orders_pipeline(&topic, &unique("prod"), &db, None);
    let stop = p.dir.path().join("stop.json");
    let write_stop = |next: i64| write_stop_file(&stop, &topic, next);
    // The backfill gets as far as 1198 and 1199 (mapped 0 and 1) ...
    write_stop(map[&(0, 1199)] + 1);
    let bf = unique("bf");
    backfill(&p, "2024-04-24", ("--to-offsets", arg(&stop)), &bf, &[]).assert_ok();
    // ... then retention deletes everything before 1500 (mapped 2).
    delete_records_before(&topic, 0, map[&(0, 1500)]);
    write_stop(map[&(0, 1500)] + 1);
    let out = backfill(&p, "2024-04-24", ("--to-offsets", arg(&stop)), &bf, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("[{}, {})", map[&(0, 1199)] + 1, map[&(0, 1500)])),
        "names the lost range: {}",
        out.stderr
    );
    let orders: Vec<String> = db.column("SELECT order_id FROM {s}.orders ORDER BY 1");
    assert_eq!(
        orders,
        vec!["o-1198", "o-1199"],
        "1198 and 1199 stay applied; 1500 is not silently reached"
    );
}

/// rebuild: with the other writer paused, zeroing the window and replaying it gives the clean run's totals.
#[test]
fn rebuild_gives_the_same_totals_as_a_clean_run() {
    let (db, _topic, p, truth) = seeded("rebuild", 2, 1200);
    assert_eq!(counts(&db), truth);
    // Someone corrupted two days (a hand-made increment ran twice).
    db.execute(
        "UPDATE {s}.daily_counts SET n = n * 2 WHERE day BETWEEN '2024-04-26' AND '2024-04-27'",
    );
    let refused = rebuild(&p, "2024-04-26", "2024-04-27", &unique("rb"), &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert_ne!(
        counts(&db),
        truth,
        "nothing was changed by the refused rebuild"
    );
    let out = rebuild(
        &p,
        "2024-04-26",
        "2024-04-27",
        &unique("rb"),
        &["--i-paused-other-writers"],
    );
    out.assert_ok();
    assert_eq!(counts(&db), truth, "rebuilt days equal the clean run");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1200);
    // A rerun under a used group id would delete the window and resume past it: refused, nothing changed.
    let rb = out_group(&out);
    let again = rebuild(
        &p,
        "2024-04-26",
        "2024-04-27",
        &rb,
        &["--i-paused-other-writers"],
    );
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert_eq!(counts(&db), truth);
}

fn out_group(out: &Out) -> String {
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    report["group_id"].as_str().unwrap().to_string()
}

/// Operator input is checked before anything is applied: a filter that does not compile or fails on a record,
/// a stop file with a negative offset; a stop offset beyond the partition's end is capped, never waited for.
#[test]
fn backfill_rejects_bad_filters_and_stop_files() {
    let (db, topic) = stage("bf_bad", 1);
    let (recs, _) = seed_events(40, 1);
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    for bad in ["", "amount <", "nosuch < 0"] {
        let out = backfill_window(&p, &["--filter", bad, "--dry-run"]);
        assert_eq!(out.code, Some(2), "filter `{bad}`: {}", out.stderr);
    }
    let failing = backfill_window(&p, &["--filter", "1 / 0 == 1"]);
    assert_eq!(failing.code, Some(2), "{}", failing.stderr);
    assert!(
        failing.stderr.contains("--filter failed on"),
        "{}",
        failing.stderr
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        0,
        "nothing applied, nothing quarantined"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    let stop = p.dir.path().join("stop.json");
    let write = |o: i64| write_stop_file(&stop, &topic, o);
    write(-5);
    let neg = backfill(
        &p,
        "2024-04-25",
        ("--to-offsets", arg(&stop)),
        &unique("bf"),
        &[],
    );
    assert_eq!(neg.code, Some(2), "{}", neg.stderr);
    write(99_999_999);
    let far = replaysafe_with(
        &[
            "backfill",
            "--config",
            cfg(&p),
            "--from",
            "2024-04-25",
            "--to-offsets",
            stop.to_str().unwrap(),
            "--group-id",
            &unique("bf"),
        ],
        &[],
        Duration::from_secs(60),
    );
    far.assert_ok();
    assert!(far.stdout.contains("capped at 40"), "{}", far.stdout);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 40);
}

/// Retention close to the window: the dry run says so; `--ensure-retention` raises `retention.ms` first and
/// reports old and new values. A window older than the ledger horizon is refused, pointing at rebuild.
#[test]
fn retention_margin_and_horizon_checks() {
    let db = Db::fresh("bf_ret");
    let topic = unique("bf_ret");
    let from_ms = 1_714_003_200_000i64; // 2024-04-25
    let age = chrono::Utc::now().timestamp_millis() - from_ms;
    // Retention just above the window's age: nothing deleted yet, but within the run's safety margin.
    let retention = (age + 3_600_000).to_string();
    create_topic(
        &topic,
        1,
        &[
            ("retention.ms", &retention),
            ("cleanup.policy", "delete"),
            ("max.message.bytes", "2000000"),
        ],
    );
    let (recs, _) = seed_events(50, 1);
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    let dry = backfill_window(&p, &["--dry-run"]);
    dry.assert_ok();
    let plan: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    let notes = plan["retention"].to_string();
    assert!(notes.contains("may delete"), "{notes}");
    let out = backfill_window(&p, &["--ensure-retention"]);
    out.assert_ok();
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let notes = report["retention"].to_string();
    assert!(
        notes.contains(&format!("raised from {retention}")),
        "{notes}"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 50);
    // The raised retention now covers the window with margin.
    let dry2 = backfill_window(&p, &["--dry-run"]);
    assert!(dry2.stdout.contains("safe"), "{}", dry2.stdout);

    let horizon = SEED.replace("[identity]", "[ledger]\nhorizon-days = 30\n\n[identity]");
    let ph = pipeline(&horizon, &topic, &unique("prod"), &db.schema);
    let refused = backfill_window(&ph, &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(refused.stderr.contains("rebuild"), "{}", refused.stderr);
}

/// The ledger's identity and origin of every row (not the group that claimed it).
fn ledger_rows(db: &Db) -> Vec<(String, String, String, i32, i64)> {
    db.query(
        "SELECT event_id::text, day::text, topic, partition, \"offset\" FROM {s}.replaysafe_ledger l JOIN {s}.replaysafe_sources s ON s.id = l._source_id ORDER BY 1, 2",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
    .collect()
}

fn totals_of(db: &Db) -> BTreeMap<(String, String), String> {
    db.query(
        "SELECT day::text, customer_id, total::text FROM {s}.daily_totals",
        &[],
    )
    .iter()
    .map(|r| ((r.get(0), r.get(1)), r.get(2)))
    .collect()
}

/// One seed-pipeline event: `occurred` is the event time (its day is the event day), `ts` the Kafka timestamp.
fn event(partition: i32, customer: &str, occurred_ms: i64, ts: i64) -> Rec {
    let occurred = chrono::DateTime::from_timestamp_millis(occurred_ms)
        .unwrap()
        .to_rfc3339();
    let id = uuid::Uuid::new_v4();
    Rec::json(
        partition,
        customer,
        &format!(
            r#"{{"event_id":"{id}","customer_id":"{customer}","amount":"1.50","occurred_at":"{occurred}"}}"#
        ),
        ts,
    )
}

const DAY_MS: i64 = 86_400_000;
const APR25: i64 = 1_714_003_200_000; // 2024-04-25T00:00:00Z

/// Issue 17: events of the window's days that arrived (Kafka timestamp) more than the default 24 h slack after
/// their day. A rebuild with default options must re-read them — it reads at least the offsets the window's
/// ledger rows came from — and end with the aggregates and the ledger exactly as before the damage. A rebuild
/// whose replay does not bring every row back (here: a filter rule added since) exits 1 naming the rows.
#[test]
fn rebuild_rereads_late_events_beyond_the_slack() {
    let (db, topic) = stage("rb_late", 2);
    let (mut recs, _) = seed_events(600, 2);
    // Late arrivals: events of 2024-04-26 and 2024-04-27 produced two to four days later.
    for i in 0..24i64 {
        let day = 1 + i % 2;
        let occurred = APR25 + day * DAY_MS + 3_600_000 * (i % 20);
        let ts = occurred + (2 + i % 3) * DAY_MS;
        recs.push(event((i % 2) as i32, &format!("c-{}", i % 5), occurred, ts));
    }
    recs.sort_by_key(|r| r.timestamp_ms);
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    run_caught_up(&p.path);
    let (counts0, totals0, ledger0) = (counts(&db), totals_of(&db), ledger_rows(&db));
    assert_eq!(ledger0.len(), 624);
    // Damage the window.
    db.execute(
        "UPDATE {s}.daily_counts SET n = n * 2 + 1 WHERE day BETWEEN '2024-04-26' AND '2024-04-27'",
    );
    db.execute("UPDATE {s}.daily_totals SET total = 0 WHERE day = '2024-04-26'");
    let report = p.dir.path().join("rebuild.json");
    let out = rebuild(
        &p,
        "2024-04-26",
        "2024-04-27",
        &unique("rb"),
        &["--i-paused-other-writers", "-o", arg(&report)],
    );
    out.assert_ok();
    assert_eq!(counts(&db), counts0, "every count as before the damage");
    assert_eq!(totals_of(&db), totals0, "every total as before the damage");
    assert_eq!(
        ledger_rows(&db),
        ledger0,
        "the same ledger rows, from the same offsets"
    );
    let r = json(&report);
    let check = &r["rebuild"];
    assert_eq!(check["missing_total"], 0, "{check}");
    for d in ["2024-04-26", "2024-04-27"] {
        let n = ledger0.iter().filter(|x| x.1 == d).count() as u64;
        assert_eq!(check["per_day"][d]["before"], n, "{check}");
        assert_eq!(check["per_day"][d]["after"], n, "{check}");
    }
    assert!(
        r["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["stop_offset"].as_i64().unwrap() > 0),
        "{r}"
    );

    // A replay that does not bring every row back (the pipeline now drops customer c-1): exit 1, rows named.
    let filtered = SEED.replace(
        "[identity]",
        "[[filter]]\nname = \"no-c1\"\ndrop-if = \"customer_id == 'c-1'\"\n\n[identity]",
    );
    let pf = pipeline(&filtered, &topic, &unique("prod"), &db.schema);
    let c1 = db.i64(
        "SELECT coalesce(sum(n), 0)::bigint FROM {s}.daily_counts WHERE day = '2024-04-26' AND customer_id = 'c-1'",
    );
    assert!(c1 > 0);
    let report2 = pf.dir.path().join("rebuild2.json");
    let short = rebuild(
        &pf,
        "2024-04-26",
        "2024-04-26",
        &unique("rb"),
        &["--i-paused-other-writers", "-o", arg(&report2)],
    );
    assert_eq!(short.code, Some(1), "{}", short.stderr);
    assert!(
        short.stderr.contains("did not bring back"),
        "{}",
        short.stderr
    );
    let r2 = json(&report2);
    assert_eq!(r2["rebuild"]["missing_total"], c1, "{}", r2["rebuild"]);
    let d = &r2["rebuild"]["per_day"]["2024-04-26"];
    assert_eq!(
        d["before"].as_i64().unwrap() - d["after"].as_i64().unwrap(),
        c1
    );
    let named = r2["rebuild"]["missing"].as_array().unwrap();
    assert_eq!(named.len() as i64, c1);
    let ids: Vec<&str> = named
        .iter()
        .map(|m| m["key"][1].as_str().unwrap())
        .collect();
    for id in ids {
        let origin = ledger0
            .iter()
            .find(|x| x.0 == id)
            .expect("a row of the window");
        assert!(named
            .iter()
            .any(|m| m["offset"] == origin.4 && m["partition"] == origin.3));
    }
}

/// A rebuild interrupted after it deleted the window (a crash in its first replay batches), then run again with a
/// new group id as the error says: the rerun must still re-read the offsets the *first* run's deleted ledger
/// rows came from — late events beyond the slack included — and end with the aggregates and the ledger exactly
/// as before the damage, its report counting the rows the window held before the first run.
#[test]
fn rebuild_interrupted_then_rerun_rereads_what_the_first_run_deleted() {
    let (db, topic) = stage("rb_rerun", 2);
    let (mut recs, _) = seed_events(300, 2);
    for i in 0..12i64 {
        let occurred = APR25 + DAY_MS + 3_600_000 * (i % 20);
        let ts = occurred + (2 + i % 3) * DAY_MS;
        recs.push(event((i % 2) as i32, &format!("c-{}", i % 5), occurred, ts));
    }
    recs.sort_by_key(|r| r.timestamp_ms);
    produce(&topic, &recs);
    let text = SEED.replace("max-records = 200", "max-records = 5");
    let p = pipeline(&text, &topic, &unique("prod"), &db.schema);
    run_caught_up(&p.path);
    let (counts0, totals0, ledger0) = (counts(&db), totals_of(&db), ledger_rows(&db));
    assert_eq!(ledger0.len(), 312);
    let day_rows = ledger0.iter().filter(|x| x.1 == "2024-04-26").count() as u64;
    db.execute("UPDATE {s}.daily_counts SET n = n + 7 WHERE day = '2024-04-26'");
    let args = |group: &str, report: &str, to: &str| {
        vec![
            "rebuild".to_string(),
            "--config".into(),
            cfg(&p).into(),
            "--from".into(),
            "2024-04-26".into(),
            "--to".into(),
            to.into(),
            "--group-id".into(),
            group.into(),
            "--i-paused-other-writers".into(),
            "-o".into(),
            report.into(),
        ]
    };
    let report = p.dir.path().join("rebuild.json");
    let first = args(&unique("rb"), report.to_str().unwrap(), "2024-04-27");
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    // Two replay batches commit, the third fails: the process ends mid-replay.
    let crashed = replaysafe_with(
        &first,
        &[("REPLAYSAFE_FAILPOINTS", "before-db-commit=2*off->return")],
        Duration::from_secs(120),
    );
    assert_ne!(crashed.code, Some(0), "{}", crashed.stderr);
    let left = db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE day = '2024-04-26'");
    assert!(
        (left as u64) < day_rows,
        "the first run deleted the window and re-landed only part of it ({left} of {day_rows})"
    );
    // A rerun whose window leaves out a day the interrupted one deleted is refused, naming the days.
    let narrow = args(&unique("rb"), report.to_str().unwrap(), "2024-04-26");
    let narrow: Vec<&str> = narrow.iter().map(String::as_str).collect();
    let refused = replaysafe(&narrow);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--from 2024-04-26 --to 2024-04-27"),
        "{}",
        refused.stderr
    );
    let second = args(&unique("rb"), report.to_str().unwrap(), "2024-04-27");
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    replaysafe(&second).assert_ok();
    assert_eq!(counts(&db), counts0, "every count as before the damage");
    assert_eq!(totals_of(&db), totals0, "every total as before the damage");
    assert_eq!(
        ledger_rows(&db),
        ledger0,
        "the same ledger rows, from the same offsets"
    );
    let r = json(&report);
    assert_eq!(r["rebuild"]["missing_total"], 0, "{}", r["rebuild"]);
    assert_eq!(
        r["rebuild"]["per_day"]["2024-04-26"]["before"], day_rows,
        "{}",
        r["rebuild"]
    );
    assert_eq!(
        r["rebuild"]["per_day"]["2024-04-26"]["after"], day_rows,
        "{}",
        r["rebuild"]
    );
}

/// Issue 17: retention removed part of the offsets the window's ledger rows came from. The rebuild refuses
/// before deleting anything (aggregate and ledger unchanged), exit 1, naming the partition and the offsets.
#[test]
fn rebuild_refuses_when_retention_removed_part_of_the_window() {
    let (db, topic) = stage("rb_ret", 1);
    // 04-25: offsets 0..10; 04-26: 10..20; a late 04-25 event at 20 (Kafka time 04-28); 04-28: 21..25.
    let mut recs: Vec<Rec> = (0..10)
        .map(|i| event(0, "c-0", APR25 + i * 60_000, APR25 + i * 60_000))
        .collect();
    recs.extend((0..10).map(|i| event(0, "c-0", APR25 + DAY_MS + i, APR25 + DAY_MS + i)));
    recs.push(event(0, "c-1", APR25 + 7_200_000, APR25 + 3 * DAY_MS));
    recs.extend((0..4).map(|i| event(0, "c-2", APR25 + 3 * DAY_MS + i, APR25 + 3 * DAY_MS + i)));
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    run_caught_up(&p.path);
    let (counts0, ledger0) = (counts(&db), ledger_rows(&db));
    assert_eq!(ledger0.len(), 25);
    // Retention deletes offsets 0..5 (five events of 2024-04-25).
    delete_records_before(&topic, 0, 5);
    let out = rebuild(
        &p,
        "2024-04-25",
        "2024-04-25",
        &unique("rb"),
        &["--i-paused-other-writers"],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("{topic}/0")) && out.stderr.contains("[0, 5)"),
        "names partition and lost offsets: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("refused before deleting"),
        "{}",
        out.stderr
    );
    assert_eq!(counts(&db), counts0, "the aggregate is untouched");
    assert_eq!(ledger_rows(&db), ledger0, "the ledger is untouched");
    // A window whose events are all still in the topic is rebuilt.
    let ok = rebuild(
        &p,
        "2024-04-26",
        "2024-04-26",
        &unique("rb"),
        &["--i-paused-other-writers"],
    );
    ok.assert_ok();
    let r: serde_json::Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(r["rebuild"]["per_day"]["2024-04-26"]["before"], 10, "{r}");
    assert_eq!(r["rebuild"]["per_day"]["2024-04-26"]["after"], 10, "{r}");
    assert_eq!(counts(&db), counts0);
    assert_eq!(ledger_rows(&db), ledger0);
    // With a horizon that the window's days are older than, the rebuild is refused (issue 22): their records
    // would be quarantined as beyond-horizon after the window was zeroed. Nothing changes.
    let horizon = SEED.replace("[identity]", "[ledger]\nhorizon-days = 30\n\n[identity]");
    let ph = pipeline(&horizon, &topic, &unique("prod"), &db.schema);
    let refused = rebuild(
        &ph,
        "2024-04-26",
        "2024-04-26",
        &unique("rb"),
        &["--i-paused-other-writers"],
    );
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("ledger horizon"),
        "{}",
        refused.stderr
    );
    assert_eq!(counts(&db), counts0);
    assert_eq!(ledger_rows(&db), ledger0);
}

/// A row projection (`accounts`, key `entity`, version `v`) next to a counter per day.
const ROW_AND_COUNTER: &str = concat!(
    header!(),
    r#"[batch]
max-records = MAXRECORDS
linger-ms = 20
[fields]
event_id = { path = "/event_id", type = "uuid" }
entity = { path = "/entity", type = "text" }
status = { path = "/status", type = "text" }
v = { path = "/v", type = "bigint" }
day = { path = "/occurred_at", type = "date" }
FILTER
[identity]
key = ["event_id"]
partition-by = "day"
[[projection]]
kind = "row"
table = "accounts"
key = ["entity"]
version = "v"
columns = ["entity", "status", "v"]
[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day"]
column = "n"
"#
);

fn account_event(partition: i32, entity: &str, v: i64, status: &str, day: &str, ts: i64) -> Rec {
    let id = uuid::Uuid::new_v4();
    Rec::json(
        partition,
        entity,
        &format!(
            r#"{{"event_id":"{id}","entity":"{entity}","status":"{status}","v":{v},"occurred_at":"{day}T10:00:00Z"}}"#
        ),
        ts,
    )
}

/// Issue 19 item 4: with a row projection in the pipeline, the backfill's per-day figures come from the same
/// outcomes as its accounting line: a record the row projection judged stale is claimed in the ledger and counted
/// `stale` for its day, not `landed`; the counter counts it all the same (issue 34: stale is the row projection's
/// verdict only), and `verify diff` agrees with the report (landed + stale).
#[test]
fn backfill_per_day_counts_match_the_accounting_with_a_row_projection() {
    for batch in ["1", "5000"] {
        per_day_counts_with_a_row_projection(&ROW_AND_COUNTER.replace("MAXRECORDS", batch));
    }
}

fn per_day_counts_with_a_row_projection(text: &str) {
    let (db, topic) = stage("bf_row", 2);
    let mut recs = Vec::new();
    // Entities spread over both partitions; per entity v2 `active` first, then an older v1 `closed`, on
    // 2024-04-25; one `closed` v1 of a new entity per partition on 2024-04-26.
    for e in 0..6i32 {
        let ent = format!("a-{e}");
        recs.push(account_event(
            e % 2,
            &ent,
            2,
            "active",
            "2024-04-25",
            APR25 + 1000 * e as i64,
        ));
        recs.push(account_event(
            e % 2,
            &ent,
            1,
            "closed",
            "2024-04-25",
            APR25 + 60_000 + 1000 * e as i64,
        ));
    }
    for p in 0..2 {
        recs.push(account_event(
            p,
            &format!("b-{p}"),
            1,
            "closed",
            "2024-04-26",
            APR25 + DAY_MS + p as i64,
        ));
    }
    produce(&topic, &recs);
    let prod = unique("prod");
    // The buggy deployment dropped every `closed` event.
    let buggy = text.replace(
        "FILTER",
        "[[filter]]\nname = \"no-closed\"\ndrop-if = \"status == 'closed'\"",
    );
    let t = run_text(&buggy, &topic, &prod, &db).tally();
    assert_eq!((t.landed, t.filtered), (6, 8));
    let p = pipeline(&text.replace("FILTER", ""), &topic, &prod, &db.schema);
    let dir = p.dir.path();
    let (before, report) = (dir.join("before.json"), dir.join("report.json"));
    verify_snapshot(&p, "daily_counts", None, &before).assert_ok();
    let out = backfill_window(&p, &["-o", arg(&report)]);
    out.assert_ok();
    assert!(
        out.stderr
            .contains("consumed 14 = landed 2 + duplicate 6 + stale 6"),
        "{}",
        out.stderr
    );
    let r = json(&report);
    let day = |d: &str, k: &str| r["per_day"][d][k].as_u64().unwrap_or(0);
    assert_eq!(
        (
            day("2024-04-25", "landed"),
            day("2024-04-25", "duplicate"),
            day("2024-04-25", "stale")
        ),
        (0, 6, 6),
        "{r}"
    );
    assert_eq!(day("2024-04-26", "landed"), 2, "{r}");
    let sum = |k: &str| -> u64 {
        r["per_day"]
            .as_object()
            .unwrap()
            .values()
            .map(|c| c[k].as_u64().unwrap_or(0))
            .sum()
    };
    assert_eq!(
        (
            sum("landed"),
            sum("duplicate"),
            sum("stale"),
            sum("filtered")
        ),
        (2, 6, 6, 0)
    );
    // The stale records are in the ledger (claimed), the row table keeps v2, the counter saw them and the two
    // landed.
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 14);
    let rows: Vec<(String, String, i64)> = db
        .query("SELECT entity, status, v FROM {s}.accounts ORDER BY 1", &[])
        .iter()
        .map(|x| (x.get(0), x.get(1), x.get(2)))
        .collect();
    assert_eq!(rows.len(), 8);
    assert!(
        rows[..6].iter().all(|x| x.1 == "active" && x.2 == 2),
        "{rows:?}"
    );
    assert!(
        rows[6..].iter().all(|x| x.1 == "closed" && x.2 == 1),
        "{rows:?}"
    );
    let n: Vec<(String, i64)> = db
        .query("SELECT day::text, n FROM {s}.daily_counts ORDER BY 1", &[])
        .iter()
        .map(|x| (x.get(0), x.get(1)))
        .collect();
    assert_eq!(n, vec![("2024-04-25".into(), 12), ("2024-04-26".into(), 2)]);
    let v = verify_diff(&before, &report);
    v.assert_ok();
    assert!(v.stdout.contains("verified"), "{}", v.stdout);
}

/// One partition around `--to 2024-04-26`: offset 0 inside the window, 1 past it (the stop), 2 inside but after
/// the stop, 3 past it; its topic and the seed pipeline over it.
fn out_of_order_around_the_cut(prefix: &str) -> (Db, String, Pipeline) {
    let (db, topic) = stage(prefix, 1);
    let t = APR25 + DAY_MS;
    produce(
        &topic,
        &[
            event(0, "c-0", t - 7_200_000, t - 7_200_000),
            event(0, "c-0", t + 3_600_000, t + 3_600_000),
            event(0, "c-0", t - 3_600_000, t - 3_600_000),
            event(0, "c-0", t + 7_200_000, t + 7_200_000),
        ],
    );
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    (db, topic, p)
}

/// Issue 20 item 6: `--to TIME` stops each partition at its first record at or after the time; records after
/// it with earlier timestamps are not applied, and the report counts them.
#[test]
fn backfill_to_time_reports_records_past_the_stop() {
    let (db, _, p) = out_of_order_around_the_cut("bf_cut");
    let out = backfill(&p, "2024-04-25", ("--to", "2024-04-26"), &unique("bf"), &[]);
    out.assert_ok();
    let r: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(r["partitions"][0]["stop_offset"], 1, "{r}");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1);
    let past = &r["past_the_stop"][0];
    assert_eq!(
        (
            past["partition"].as_i64(),
            past["scanned_from"].as_i64(),
            past["scanned_to"].as_i64(),
            past["earlier"].as_u64()
        ),
        (Some(0), Some(1), Some(4), Some(1)),
        "{r}"
    );
    assert!(out.stderr.contains("were not applied"), "{}", out.stderr);
}

/// Issue 20 item 6: a stop offset below the window's start is noted in the report (like the beyond-the-end cap).
#[test]
fn backfill_notes_a_stop_offset_below_the_start() {
    let (db, topic, p) = out_of_order_around_the_cut("bf_below");
    // A stop file whose offset lies below the window's start.
    let stop = p.dir.path().join("stop.json");
    write_stop_file(&stop, &topic, 0);
    let below = backfill(
        &p,
        "2024-04-26T00:30:00Z",
        ("--to-offsets", arg(&stop)),
        &unique("bf"),
        &[],
    );
    below.assert_ok();
    let r: serde_json::Value = serde_json::from_str(&below.stdout).unwrap();
    assert_eq!(r["partitions"][0]["start_offset"], 1, "{r}");
    assert_eq!(r["partitions"][0]["stop_offset"], 1, "{r}");
    assert!(
        r["retention"]
            .to_string()
            .contains("stop offset 0 is below the start offset 1"),
        "{r}"
    );
    assert!(
        r["past_the_stop"].is_null(),
        "only --to TIME scans past the stop: {r}"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        0,
        "nothing of the partition is in the window"
    );
}

/// Issue 20 item 6, issue 42 item 3: `offsets snapshot` of a group with no position on any partition (a
/// misspelled group) is refused with exit 2 naming the group and the groups that have checkpoints, and writes no
/// file; `--allow-empty` writes it (nulls, never 0) with the warning.
#[test]
fn offsets_snapshot_of_a_group_without_positions_is_refused_unless_allowed() {
    let (db, topic) = stage("snap_warn", 2);
    produce(&topic, &seed_events(20, 2).0);
    let group = unique("prod");
    let p = pipeline(SEED, &topic, &group, &db.schema);
    run_caught_up(&p.path).assert_ok();
    let file = p.dir.path().join("stop.json");
    let nobody = unique("nobody");
    let out = offsets_snapshot(&p, &nobody, &file);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    for want in [
        nobody.as_str(),
        "no position on any partition",
        &topic,
        &group,
        "--allow-empty",
    ] {
        assert!(out.stderr.contains(want), "{want}: {}", out.stderr);
    }
    assert!(!file.exists(), "nothing written");

    let args = [
        "offsets",
        "snapshot",
        "--config",
        arg(&p.path),
        "--group",
        &nobody,
        "--allow-empty",
        "-o",
        arg(&file),
    ];
    let out = replaysafe(&args);
    out.assert_ok();
    assert!(
        out.stderr.contains("has no position on any partition"),
        "{}",
        out.stderr
    );
    let s = json(&file);
    assert!(
        s["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["next_offset"].is_null()),
        "{s}"
    );
    assert!(s["warnings"].to_string().contains(&nobody), "{s}");
    assert!(s.get("known_groups").is_none(), "not written: {s}");

    // The pipeline's own group, which has checkpoints, is not refused.
    let out = offsets_snapshot(&p, &group, &file);
    out.assert_ok();
    assert!(!json(&file)["partitions"][0]["next_offset"].is_null());
}

/// Issue 20 item 6: `verify snapshot --where` naming a missing column is bad usage (exit 2), nothing written.
#[test]
fn verify_snapshot_where_naming_a_missing_column_is_usage() {
    let (_db, _topic, p, _) = seeded("where_bad", 1, 10);
    let bad = verify_snapshot(
        &p,
        "daily_counts",
        Some("nosuch_column = 1"),
        &p.dir.path().join("snap.json"),
    );
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("--where `nosuch_column = 1`"),
        "{}",
        bad.stderr
    );
    assert!(!p.dir.path().join("snap.json").exists());
    // Issue 42 item 3: a misspelled table is refused naming the tables verify can compare.
    let bad = verify_snapshot(&p, "daily_count", None, &p.dir.path().join("snap.json"));
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("`daily_count` is not the table")
            && bad
                .stderr
                .contains("its counter and sum tables: daily_counts, daily_totals"),
        "{}",
        bad.stderr
    );
    assert!(!p.dir.path().join("snap.json").exists());
}

/// Issue 17, the same class in `backfill`: its window is chosen by record time, but the horizon judges the
/// event day. A late event (recent Kafka timestamp) of a day older than the horizon, whose ledger partition was
/// dropped, is quarantined `beyond-horizon` — never claimed and counted a second time. The prune recorded the
/// dropped row's offset: a backfill window reaching it is refused (issue 13, exit 2); a later copy of the late
/// event, above it, is quarantined by production and by the backfill.
#[test]
fn backfill_quarantines_a_late_event_older_than_the_horizon() {
    let (db, topic) = stage("bf_hz", 1);
    let now = chrono::Utc::now().timestamp_millis();
    let recs = vec![
        event(0, "c-old", now - 40 * DAY_MS, now - 3_600_000), // event day 40 days ago, arrived an hour ago
        event(0, "c-new", now - 3_600_000, now - 3_600_000),
    ];
    produce(&topic, &recs);
    let prod = unique("prod");
    run_text(SEED, &topic, &prod, &db);
    let old_day = db.text("SELECT day::text FROM {s}.daily_counts WHERE customer_id = 'c-old'");
    // The horizon is set to 30 days; the next start drops the old day's ledger partition.
    let horizon = SEED.replace("[identity]", "[ledger]\nhorizon-days = 30\n\n[identity]");
    let p = pipeline(&horizon, &topic, &prod, &db.schema);
    run_caught_up(&p.path);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        1,
        "the old day's ledger partition was dropped"
    );
    let from = chrono::DateTime::from_timestamp_millis(now - DAY_MS)
        .unwrap()
        .to_rfc3339();
    let refused = backfill(&p, &from, ("--to-group", &prod), &unique("bf"), &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains(&format!("{topic}/0: offsets 0..=0 are below")),
        "{}",
        refused.stderr
    );
    // The late event once more (offset 2), consumed by production, then a backfill from after the first two.
    let mut copy = recs[0].clone();
    copy.timestamp_ms = Some(chrono::Utc::now().timestamp_millis());
    produce(&topic, &[copy]);
    run_caught_up(&p.path);
    let from = chrono::DateTime::from_timestamp_millis(now - 1_800_000)
        .unwrap()
        .to_rfc3339();
    let out = backfill(&p, &from, ("--to-group", &prod), &unique("bf"), &[]);
    out.assert_ok();
    assert!(
        out.stderr.contains(
            "consumed 1 = landed 0 + duplicate 0 + filtered 0 + quarantined 1 [quarantined beyond-horizon: 1]"
        ),
        "{}",
        out.stderr
    );
    let n: Vec<(String, i64)> = db
        .query(
            "SELECT customer_id, n FROM {s}.daily_counts ORDER BY 1",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        n,
        vec![("c-new".into(), 1), ("c-old".into(), 1)],
        "counted once"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1);
    let dl = db.query(
        "SELECT reason, \"offset\" FROM {s}.replaysafe_dead_letters",
        &[],
    );
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].get::<_, String>(0), "beyond-horizon");
    assert_eq!(dl[0].get::<_, i64>(1), 2);
    assert!(old_day.is_some());
}

/// Issue 17, the same class in `verify`: a backfill picks records by record time, `verify` compares event days.
/// A late event in the window lands on an earlier day; a `before` snapshot whose `--where` misses that day shows
/// it as a MISMATCH saying so (exit 1) — never as verified; a snapshot covering it verifies.
#[test]
fn verify_flags_a_late_event_day_outside_the_snapshot() {
    let (db, topic) = stage("vf_late", 1);
    let mut recs: Vec<Rec> = (0..3)
        .map(|i| event(0, "c-0", APR25 + i * 60_000, APR25 + i * 60_000))
        .collect();
    recs.push(event(0, "c-1", APR25 - 7_200_000, APR25 + 3_600_000)); // 2024-04-24, arrived on the 25th
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    replaysafe(&["init", "--config", cfg(&p)]).assert_ok();
    let dir = p.dir.path();
    let snap = |name: &str, filter: &str| {
        let f = dir.join(name);
        verify_snapshot(&p, "daily_counts", Some(filter), &f).assert_ok();
        f
    };
    let narrow = snap("narrow.json", "day between '2024-04-25' and '2024-04-26'");
    let wide = snap("wide.json", "day between '2024-04-18' and '2024-04-26'");
    let report = dir.join("report.json");
    backfill(
        &p,
        "2024-04-25",
        ("--to", "2024-04-27"),
        &unique("bf"),
        &["-o", arg(&report)],
    )
    .assert_ok();
    let r = json(&report);
    assert_eq!(r["per_day"]["2024-04-24"]["landed"], 1, "{r}");
    assert_eq!(r["per_day"]["2024-04-25"]["landed"], 3, "{r}");
    let diff = |before: &std::path::Path| verify_diff(before, &report);
    let bad = diff(&narrow);
    assert_eq!(bad.code, Some(1), "{}", bad.stdout);
    let line = bad
        .stdout
        .lines()
        .find(|l| l.starts_with("2024-04-24"))
        .unwrap_or_default();
    assert!(
        line.contains("MISMATCH") && line.contains("--where"),
        "{}",
        bad.stdout
    );
    let good = diff(&wide);
    good.assert_ok();
    assert!(good.stdout.contains("verified"), "{}", good.stdout);
}

/// Issue 17: ledger rows of the window that no replay of this pipeline can bring back — another generation, or
/// offsets past the end of a recreated topic — make the rebuild refuse before deleting anything.
#[test]
fn rebuild_refuses_ledger_rows_it_cannot_reread() {
    let (db, topic) = stage("rb_gen", 1);
    let recs: Vec<Rec> = (0..6)
        .map(|i| event(0, "c-0", APR25 + i * 60_000, APR25 + i * 60_000))
        .collect();
    produce(&topic, &recs);
    let gen_a = SEED.replace(
        "partition-by = \"day\"",
        "partition-by = \"day\"\ngeneration = \"a\"",
    );
    run_text(&gen_a, &topic, &unique("prod"), &db);
    let (counts0, ledger0) = (counts(&db), ledger_rows(&db));
    let rebuild = |text: &str| {
        let p = pipeline(text, &topic, &unique("prod"), &db.schema);
        rebuild(
            &p,
            "2024-04-25",
            "2024-04-25",
            &unique("rb"),
            &["--i-paused-other-writers"],
        )
    };
    let other = rebuild(&gen_a.replace("generation = \"a\"", "generation = \"b\""));
    assert_eq!(other.code, Some(1), "{}", other.stderr);
    assert!(
        other.stderr.contains("generation 'a'") && other.stderr.contains("refused before deleting"),
        "{}",
        other.stderr
    );
    assert_eq!(
        (counts(&db), ledger_rows(&db)),
        (counts0.clone(), ledger0.clone())
    );
    // The topic recreated with fewer records, the generation left unchanged.
    delete_topic(&topic);
    create_topic(&topic, 1, &[]);
    produce(&topic, &recs[..2]);
    let recreated = rebuild(&gen_a);
    assert_eq!(recreated.code, Some(1), "{}", recreated.stderr);
    assert!(
        recreated.stderr.contains(&format!("{topic}/0"))
            && recreated.stderr.contains("offsets up to 5")
            && recreated.stderr.contains("ends at 2"),
        "{}",
        recreated.stderr
    );
    assert_eq!((counts(&db), ledger_rows(&db)), (counts0, ledger0));
}

/// Issue 41 item 8: the producers stamp records with the event's time (2024-04-25 … 30) and the operator gives
/// the incident's wall-clock start as `--from`: Kafka's time lookup finds no record at or after it, so the window
/// would read nothing although the offsets below the stop file hold every record. The backfill (and its dry run)
/// exits 1 naming the offsets and the `--from` that reads from there, having applied nothing; the rerun with that
/// `--from` succeeds, and its report notes per partition which offsets were not read and why.
#[test]
fn backfill_refuses_a_window_empty_by_record_time_over_offsets_that_hold_records() {
    let (db, topic) = stage("bf_ts", 2);
    let (recs, _) = seed_events(120, 2);
    produce(&topic, &recs);
    let prod = unique("prod");
    let buggy = SEED.replace(
        "[identity]",
        "[[filter]]\nname = \"no-refunds\"\ndrop-if = \"amount < 0.0\"\n\n[identity]",
    );
    let filtered = run_text(&buggy, &topic, &prod, &db).tally().filtered as i64;
    assert!(filtered > 0);
    let p = pipeline(SEED, &topic, &prod, &db.schema);
    let stop = p.dir.path().join("stop.json");
    offsets_snapshot(&p, &prod, &stop).assert_ok();
    let ledger = || db.i64("SELECT count(*) FROM {s}.replaysafe_ledger");
    let before = (ledger(), counts(&db));
    let bf = unique("bf");
    let run = |from: &str, extra: &[&str]| {
        backfill(
            &p,
            from,
            ("--to-offsets", arg(&stop)),
            &bf,
            &[&["--filter", "amount < 0"], extra].concat(),
        )
    };
    for extra in [&["--dry-run"][..], &[]] {
        let out = run("2024-05-02T00:00:00Z", extra);
        assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains("holds no record by record time")
                && out.stderr.contains(&format!("{topic}/0 offsets 0..60"))
                && out.stderr.contains("Nothing was applied"),
            "{}",
            out.stderr
        );
    }
    assert_eq!((ledger(), counts(&db)), before, "nothing applied");
    let out = run("2024-05-02T00:00:00Z", &[]);
    let from = out
        .stderr
        .split("rerun with --from ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("a --from to rerun with")
        .to_string();
    let report = p.dir.path().join("report.json");
    let out = run(&from, &["-o", arg(&report)]);
    out.assert_ok();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let read: i64 = r["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["stop_offset"].as_i64().unwrap() - x["start_offset"].as_i64().unwrap())
        .sum();
    assert!(
        read >= 2,
        "each partition reads at least its last record: {r}"
    );
    let notes = r["retention"].to_string();
    for part in 0..2 {
        assert!(
            notes.contains(&format!("{topic}/{part}: offsets 0..")) && notes.contains("not read"),
            "{r}"
        );
    }
    let landed: i64 = r["per_day"]
        .as_object()
        .unwrap()
        .values()
        .map(|d| d["landed"].as_i64().unwrap())
        .sum();
    assert_eq!(ledger(), before.0 + landed, "{r}");
    assert_eq!(
        counts(&db).values().sum::<i64>(),
        before.1.values().sum::<i64>() + landed
    );
}
