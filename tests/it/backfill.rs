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

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The seed scenario: a pipeline that silently filtered refunds for six days, the fix, a targeted backfill of
/// the refunds that verifies to the row, a second run that changes nothing, and another writer left undisturbed.
#[test]
fn six_day_refund_backfill_verifies_to_the_row() {
    let db = Db::fresh("bf_seed");
    let topic = unique("bf_seed");
    create_topic(&topic, 3, &[]);
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
    replaysafe(&[
        "offsets",
        "snapshot",
        "--config",
        cfg(&p),
        "--group",
        &prod,
        "-o",
        stop.to_str().unwrap(),
    ])
    .assert_ok();
    let s = json(&stop);
    assert_eq!(s["source"], "postgres-checkpoints");
    assert_eq!(s["partitions"].as_array().unwrap().len(), 3);
    let filter = "day between '2024-04-25' and '2024-04-30'";
    replaysafe(&[
        "verify",
        "snapshot",
        "--config",
        cfg(&p),
        "--table",
        "daily_counts",
        "--where",
        filter,
        "-o",
        before.to_str().unwrap(),
    ])
    .assert_ok();

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
            };
            while !stop_writer.load(Ordering::Relaxed) {
                other.execute("UPDATE {s}.daily_counts SET n = n + 1 WHERE day = '2024-06-01' AND customer_id = 'other-writer'");
                writes.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let bf = unique("bf");
    let out = replaysafe(&[
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-25T00:00:00Z",
        "--to-offsets",
        stop.to_str().unwrap(),
        "--filter",
        "amount < 0",
        "--group-id",
        &bf,
        "-o",
        report.to_str().unwrap(),
    ]);
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
    let v = replaysafe(&[
        "verify",
        "diff",
        "--before",
        before.to_str().unwrap(),
        "--expect",
        report.to_str().unwrap(),
    ]);
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
    let again = replaysafe(&[
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-25",
        "--to-offsets",
        stop.to_str().unwrap(),
        "--filter",
        "amount < 0",
        "--group-id",
        &bf,
    ]);
    again.assert_ok();
    assert!(
        again.stderr.contains("consumed 0 = landed 0"),
        "{}",
        again.stderr
    );
    let fresh = replaysafe(&[
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-25",
        "--to-offsets",
        stop.to_str().unwrap(),
        "--filter",
        "amount < 0",
        "--group-id",
        &unique("bf2"),
    ]);
    fresh.assert_ok();
    assert!(fresh.stderr.contains(" landed 0 "), "{}", fresh.stderr);
    final_counts = counts(&db);
    final_counts.remove(&("2024-06-01".to_string(), "other-writer".to_string()));
    assert_eq!(final_counts, truth);

    // Refusals: the production group, the stop file's group, a window beyond the horizon.
    let refused = replaysafe(&[
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-25",
        "--to-offsets",
        stop.to_str().unwrap(),
        "--group-id",
        &prod,
    ]);
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
    let db = Db::fresh("bf_missing");
    let topic = unique("bf_missing");
    create_topic(&topic, 2, &[]);
    let (recs, _) = seed_events(200, 2);
    let offsets = produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    let stop = p.dir.path().join("stop.json");
    let end0 = recs
        .iter()
        .zip(&offsets)
        .filter(|(r, _)| r.partition == 0)
        .count() as i64;
    std::fs::write(
        &stop,
        format!(r#"{{"group":"prod","taken_at":"2024-05-01T00:00:00Z","source":"kafka-committed","partitions":[{{"topic":"{topic}","partition":0,"next_offset":{end0}}}]}}"#),
    )
    .unwrap();
    let base = [
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-25",
        "--to-offsets",
        stop.to_str().unwrap(),
    ];
    let refused = replaysafe(&[&base[..], &["--group-id", &unique("bf")]].concat());
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
    let skip = replaysafe(
        &[
            &base[..],
            &["--group-id", &unique("bf"), "--missing-stop", "skip"],
        ]
        .concat(),
    );
    skip.assert_ok();
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        end0,
        "only partition 0 was replayed"
    );
    let end = replaysafe(
        &[
            &base[..],
            &["--group-id", &unique("bf"), "--missing-stop", "end"],
        ]
        .concat(),
    );
    end.assert_ok();
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 200);
}

/// C15: a timestamp lookup that answers End starts at the end captured with the lookup; an empty partition
/// finishes at once; End is never used as a number.
#[test]
fn c15_lookup_answering_end_and_empty_partition() {
    let db = Db::fresh("c15");
    let topic = unique("c15");
    create_topic(&topic, 3, &[]);
    let records = load("C15", None);
    let (early, late): (Vec<_>, Vec<_>) = records
        .iter()
        .partition(|r| !(r.partition == 1 && r.offset == 2));
    let mut map = produce_case(&topic, &early);
    let p = orders_pipeline(&topic, &unique("prod"), &db, None);
    let from = "2024-04-25T00:00:00Z";
    let dry = replaysafe(&[
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        from,
        "--to",
        "2024-05-01",
        "--group-id",
        &unique("bf"),
        "--dry-run",
    ]);
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
    let orders: Vec<String> = db
        .query("SELECT order_id FROM {s}.orders ORDER BY 1", &[])
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(orders, vec!["o-2", "o-3", "o-6"]);
    assert_eq!(map[&(1, 2)], 2);
}

/// C18: retention moves the log start past where a backfill stopped: the rerun stops naming the lost range;
/// what was applied stays applied; nothing resets to latest.
#[test]
fn c18_retention_deleted_part_of_the_window() {
    let db = Db::fresh("c18");
    let topic = unique("c18");
    create_topic(&topic, 1, &[]);
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
    let write_stop = |next: i64| {
        std::fs::write(
            &stop,
            format!(r#"{{"group":"prod","taken_at":"2024-05-01T00:00:00Z","source":"kafka-committed","partitions":[{{"topic":"{topic}","partition":0,"next_offset":{next}}}]}}"#),
        )
        .unwrap()
    };
    // The backfill gets as far as 1198 and 1199 (mapped 0 and 1) ...
    write_stop(map[&(0, 1199)] + 1);
    let bf = unique("bf");
    replaysafe(&[
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-24",
        "--to-offsets",
        stop.to_str().unwrap(),
        "--group-id",
        &bf,
    ])
    .assert_ok();
    // ... then retention deletes everything before 1500 (mapped 2).
    delete_records_before(&topic, 0, map[&(0, 1500)]);
    write_stop(map[&(0, 1500)] + 1);
    let out = replaysafe(&[
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-24",
        "--to-offsets",
        stop.to_str().unwrap(),
        "--group-id",
        &bf,
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("[{}, {})", map[&(0, 1199)] + 1, map[&(0, 1500)])),
        "names the lost range: {}",
        out.stderr
    );
    let orders: Vec<String> = db
        .query("SELECT order_id FROM {s}.orders ORDER BY 1", &[])
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        orders,
        vec!["o-1198", "o-1199"],
        "1198 and 1199 stay applied; 1500 is not silently reached"
    );
}

/// rebuild: with the other writer paused, zeroing the window and replaying it gives the clean run's totals.
#[test]
fn rebuild_gives_the_same_totals_as_a_clean_run() {
    let db = Db::fresh("rebuild");
    let topic = unique("rebuild");
    create_topic(&topic, 2, &[]);
    let (recs, truth) = seed_events(1200, 2);
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    run_caught_up(&p.path);
    assert_eq!(counts(&db), truth);
    // Someone corrupted two days (a hand-made increment ran twice).
    db.execute(
        "UPDATE {s}.daily_counts SET n = n * 2 WHERE day BETWEEN '2024-04-26' AND '2024-04-27'",
    );
    let refused = replaysafe(&[
        "rebuild",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-26",
        "--to",
        "2024-04-27",
        "--group-id",
        &unique("rb"),
    ]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert_ne!(
        counts(&db),
        truth,
        "nothing was changed by the refused rebuild"
    );
    let out = replaysafe(&[
        "rebuild",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-26",
        "--to",
        "2024-04-27",
        "--group-id",
        &unique("rb"),
        "--i-paused-other-writers",
    ]);
    out.assert_ok();
    assert_eq!(counts(&db), truth, "rebuilt days equal the clean run");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1200);
    // A rerun under a used group id would delete the window and resume past it: refused, nothing changed.
    let rb = out_group(&out);
    let again = replaysafe(&[
        "rebuild",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-26",
        "--to",
        "2024-04-27",
        "--group-id",
        &rb,
        "--i-paused-other-writers",
    ]);
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
    let db = Db::fresh("bf_bad");
    let topic = unique("bf_bad");
    create_topic(&topic, 1, &[]);
    let (recs, _) = seed_events(40, 1);
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("prod"), &db.schema);
    let base = [
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-25",
        "--to",
        "2024-05-01",
    ];
    for bad in ["", "amount <", "nosuch < 0"] {
        let out = replaysafe(
            &[
                &base[..],
                &["--group-id", &unique("bf"), "--filter", bad, "--dry-run"],
            ]
            .concat(),
        );
        assert_eq!(out.code, Some(2), "filter `{bad}`: {}", out.stderr);
    }
    let failing = replaysafe(
        &[
            &base[..],
            &["--group-id", &unique("bf"), "--filter", "1 / 0 == 1"],
        ]
        .concat(),
    );
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
    let write = |o: i64| {
        std::fs::write(&stop, format!(r#"{{"group":"prod","taken_at":"2024-05-01T00:00:00Z","source":"kafka-committed","partitions":[{{"topic":"{topic}","partition":0,"next_offset":{o}}}]}}"#)).unwrap()
    };
    write(-5);
    let neg = replaysafe(&[
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-25",
        "--to-offsets",
        stop.to_str().unwrap(),
        "--group-id",
        &unique("bf"),
    ]);
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
    let base = [
        "backfill",
        "--config",
        cfg(&p),
        "--from",
        "2024-04-25",
        "--to",
        "2024-05-01",
    ];
    let dry = replaysafe(&[&base[..], &["--group-id", &unique("bf"), "--dry-run"]].concat());
    dry.assert_ok();
    let plan: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    let notes = plan["retention"].to_string();
    assert!(notes.contains("may delete"), "{notes}");
    let out = replaysafe(
        &[
            &base[..],
            &["--group-id", &unique("bf"), "--ensure-retention"],
        ]
        .concat(),
    );
    out.assert_ok();
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let notes = report["retention"].to_string();
    assert!(
        notes.contains(&format!("raised from {retention}")),
        "{notes}"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 50);
    // The raised retention now covers the window with margin.
    let dry2 = replaysafe(&[&base[..], &["--group-id", &unique("bf"), "--dry-run"]].concat());
    assert!(dry2.stdout.contains("safe"), "{}", dry2.stdout);

    let horizon = SEED.replace("[identity]", "[ledger]\nhorizon-days = 30\n\n[identity]");
    let ph = pipeline(&horizon, &topic, &unique("prod"), &db.schema);
    let refused = replaysafe(&[
        "backfill",
        "--config",
        cfg(&ph),
        "--from",
        "2024-04-25",
        "--to",
        "2024-05-01",
        "--group-id",
        &unique("bf"),
    ]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(refused.stderr.contains("rebuild"), "{}", refused.stderr);
}
