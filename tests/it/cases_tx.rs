//! C42: a transactional producer's aborted records never reach the ledger — consumers and backfill read with
//! `read_committed` (set explicitly), `read_uncommitted` in `[kafka.properties]` is refused before anything is
//! touched, and the offsets the COMMIT/ABORT markers occupy are stepped over (checkpoint = high watermark).

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::cases::{load, orders_pipeline, CaseRecord};
use crate::common::*;

/// A transactional producer on the test broker, its transactions initialised.
fn tx_producer() -> BaseProducer {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("transactional.id", unique("c42-tx"))
        .create()
        .unwrap();
    p.init_transactions(Duration::from_secs(30)).unwrap();
    p
}

/// Sends `r` to `topic` in a transaction of its own, committed or aborted.
fn in_transaction(p: &BaseProducer, topic: &str, r: &Rec, commit: bool) {
    p.begin_transaction().unwrap();
    let mut br: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(r.partition);
    if let Some(k) = &r.key {
        br = br.key(k.as_slice());
    }
    if let Some(v) = &r.value {
        br = br.payload(v.as_slice());
    }
    if let Some(ts) = r.timestamp_ms {
        br = br.timestamp(ts);
    }
    p.send(br).map_err(|(e, _)| e).unwrap();
    p.flush(Duration::from_secs(30)).unwrap();
    if commit {
        p.commit_transaction(Duration::from_secs(30)).unwrap();
    } else {
        p.abort_transaction(Duration::from_secs(30)).unwrap();
    }
}

fn high_watermark(topic: &str) -> i64 {
    consumer(&[])
        .fetch_watermarks(topic, 0, Duration::from_secs(30))
        .unwrap()
        .1
}

/// C42's sequence on a fresh one-partition topic: tx1 (50) committed, tx2 (52, amount 99.00) aborted, tx3 (54,
/// the retry of 52's event id, 9.90) committed, 56 without a transaction; then an aborted transaction at the end,
/// so the last offsets are an aborted record and its marker. Returns the topic and the broker offsets of 50, 54,
/// 56.
fn produce_c42(prefix: &str) -> (String, [i64; 3]) {
    let topic = new_topic(prefix, 1);
    let recs: Vec<CaseRecord> = load("C42", None);
    let tx = tx_producer();
    in_transaction(&tx, &topic, &recs[0].rec, true);
    in_transaction(&tx, &topic, &recs[1].rec, false);
    in_transaction(&tx, &topic, &recs[2].rec, true);
    let plain = produce(&topic, &[recs[3].rec.clone()]);
    // The aborted retry once more, after everything: the partition ends with an ABORT marker.
    in_transaction(&tx, &topic, &recs[1].rec, false);
    // Offsets: 0 tx1, 1 COMMIT, 2 tx2, 3 ABORT, 4 tx3, 5 COMMIT, 6 plain, 7 aborted, 8 ABORT.
    assert_eq!(plain, vec![6]);
    assert_eq!(high_watermark(&topic), 9);
    (topic, [0, 4, 6])
}

/// What a correct consumer leaves: orders[o-50] SHIPPED v3, paid 9.90, three ledger rows (052's from offset 54),
/// no trace of the aborted records.
fn assert_committed_state(db: &Db, topic: &str, offsets: [i64; 3]) {
    let order = db.query(
        "SELECT status, version FROM {s}.orders WHERE order_id = 'o-50'",
        &[],
    );
    assert_eq!(
        (order[0].get::<_, String>(0), order[0].get::<_, i64>(1)),
        ("SHIPPED".to_string(), 3)
    );
    assert_eq!(
        db.text("SELECT paid_total::text FROM {s}.customer_stats WHERE customer_id = 'c-5'")
            .as_deref(),
        Some("9.90"),
        "the committed retry's amount, not the aborted 99.00"
    );
    let ledger = db.query(
        "SELECT event_id::text, topic, \"offset\" FROM {s}.processed_events l \
         JOIN {s}.replaysafe_sources s ON s.id = l._source_id ORDER BY \"offset\"",
        &[],
    );
    let got: Vec<(String, i64)> = ledger
        .iter()
        .map(|r| {
            assert_eq!(r.get::<_, String>(1), topic);
            (r.get(0), r.get(2))
        })
        .collect();
    let id = |n: &str| format!("c42e0000-0000-4000-8000-000000000{n}");
    assert_eq!(
        got,
        vec![
            (id("050"), offsets[0]),
            (id("052"), offsets[1]),
            (id("056"), offsets[2])
        ],
        "052's claim is the committed retry's offset"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 3);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// `[kafka.properties] "isolation.level" = "read_uncommitted"` appended to `p`'s file: its line number.
fn read_uncommitted(p: &Pipeline) -> usize {
    let text = std::fs::read_to_string(&p.path).unwrap();
    let text = format!("{text}\n[kafka.properties]\n\"isolation.level\" = \"read_uncommitted\"\n");
    std::fs::write(&p.path, &text).unwrap();
    text.lines().count()
}

#[test]
fn c42_aborted_transactions_never_reach_the_ledger() {
    let db = Db::fresh("c42");
    let (topic, offsets) = produce_c42("c42");
    let group = unique("g");

    // A pass-through of read_uncommitted: refused by check, run and backfill, naming the key and file:line,
    // before any table is created.
    let bad = orders_pipeline(&topic, &group, &db, None);
    let line = read_uncommitted(&bad);
    let at = format!("{}:{line}:", bad.path.display());
    for args in [
        vec!["check", "--config", arg(&bad.path)],
        vec!["run", "--config", arg(&bad.path), "--until-caught-up"],
        vec![
            "backfill",
            "--config",
            arg(&bad.path),
            "--from",
            "2024-04-25",
            "--to",
            "2024-04-26",
            "--group-id",
            "c42-bf",
        ],
    ] {
        let out = replaysafe(&args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(&at) && out.stderr.contains("isolation.level"),
            "{args:?}: {}",
            out.stderr
        );
    }
    assert_eq!(
        db.i64(&format!(
            "SELECT count(*) FROM pg_tables WHERE schemaname = '{}'",
            db.schema
        )),
        0,
        "nothing was created"
    );

    // The pipeline as written: 50, 54 and 56 are applied, the aborted records are never delivered.
    let p = orders_pipeline(&topic, &group, &db, None);
    let t = run_caught_up(&p.path).tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered, t.quarantined),
        (3, 3, 0, 0, 0)
    );
    assert_committed_state(&db, &topic, offsets);
    // The markers (1, 3, 5, 8) and the aborted records (2, 7) are stepped over: checkpoint = high watermark.
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(9));
    assert_eq!(committed(&group, &topic, 1), vec![Some(9)]);
    // A restart reads nothing and changes nothing.
    let again = run_caught_up(&p.path).tally();
    assert_eq!(again.consumed, 0);
    assert_committed_state(&db, &topic, offsets);
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(9));
}

#[test]
fn c42_backfill_reads_committed_records_only() {
    let db = Db::fresh("c42bf");
    let (topic, offsets) = produce_c42("c42bf");
    let p = orders_pipeline(&topic, &unique("prod"), &db, None);
    let bf = unique("bf");
    // `--to` beyond every timestamp: the stop is the partition's end (9), past the last ABORT marker. (A cut
    // between the records' CreateTime and the markers' — written at the broker's clock — would stop at a marker:
    // what lies after it is reported past the stop, as for any record.)
    let out = backfill(&p, "2024-04-25", ("--to", "2099-01-01"), &bf, &[]);
    out.assert_ok();
    let r: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(r["partitions"][0]["stop_offset"], 9, "{r}");
    assert_committed_state(&db, &topic, offsets);
    assert_eq!(db.checkpoint(&bf, &topic, 0), Some(9), "{r}");
    assert!(
        out.stderr
            .contains("consumed 3 = landed 3 + duplicate 0 + filtered 0 + quarantined 0"),
        "{}",
        out.stderr
    );

    // A stop in the middle, right after a COMMIT marker (stop 6: records 0 and 4, markers 1, 3, 5; record 6 is
    // past it): the checkpoint reaches the stop, not the last record's 5.
    let stop = p.dir.path().join("stop.json");
    std::fs::write(
        &stop,
        format!(
            r#"{{"group":"prod","taken_at":"2024-05-01T00:00:00Z","source":"kafka-committed","partitions":[{{"topic":"{topic}","partition":0,"next_offset":6}}]}}"#
        ),
    )
    .unwrap();
    let mid = unique("bf-mid");
    let out = backfill(&p, "2024-04-25", ("--to-offsets", arg(&stop)), &mid, &[]);
    out.assert_ok();
    assert!(
        out.stderr
            .contains("consumed 2 = landed 0 + duplicate 2 + filtered 0 + quarantined 0"),
        "{}",
        out.stderr
    );
    assert_eq!(db.checkpoint(&mid, &topic, 0), Some(6));
    assert_committed_state(&db, &topic, offsets);
}
