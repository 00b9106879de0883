//! Issue 34 item 1: `stale` is a row projection's judgement about its own table, not a verdict on the event. A
//! claimed record reaches every other projection (counter, outbox) exactly once whatever its version, so the
//! aggregates do not depend on which partition's batch commits first; a redelivery of the state already
//! claimed at its version (a new event id, the same version and state) is a `duplicate` for each projection it
//! gives nothing new (the counter here), while the outbox gets every event id.

use std::collections::BTreeMap;

use crate::common::{
    new_topic, pipeline, produce_singly, run_caught_up, try_run, unique, Db, Out, Rec, HEADER,
};

/// A row projection of orders by `version`, a counter per (day, status) and an outbox of every event.
fn orders_pipeline(max_records: usize) -> String {
    format!(
        r#"{HEADER}[batch]
max-records = {max_records}
linger-ms = 5
[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
order_id = {{ path = "/order_id", type = "text" }}
status = {{ path = "/status", type = "text" }}
version = {{ path = "/version", type = "bigint" }}
day = {{ path = "/occurred_at", type = "date" }}
[identity]
key = ["event_id"]
[[projection]]
kind = "row"
table = "orders"
key = ["order_id"]
version = "version"
columns = ["order_id", "status", "version"]
[[projection]]
kind = "counter"
table = "status_counts"
group-by = ["day", "status"]
column = "n"
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["event_id", "order_id", "status", "version"]
key = ["order_id"]
"#
    )
}

const STEPS: [&str; 4] = ["placed", "paid", "packed", "shipped"];

/// One order event: `event_id` of its own (`tag` makes a redelivery's id differ).
fn order_event(partition: i32, order: usize, version: usize, tag: u64) -> Rec {
    let id = uuid::Uuid::from_u64_pair(34 + tag, (order * 10 + version) as u64);
    let body = serde_json::json!({
        "event_id": id.to_string(), "order_id": format!("o-{order:03}"), "status": STEPS[version - 1],
        "version": version, "occurred_at": "2026-11-20T10:00:00Z",
    });
    Rec::json(
        partition,
        &id.to_string(),
        &body.to_string(),
        1_795_000_000_000,
    )
}

/// 100 orders × 4 events (v1..v4, distinct event ids) over 4 partitions: event v of order o on partition
/// (o + v) % 4, and each partition holds its events newest version first, so later versions often arrive first.
fn orders_topic() -> String {
    let topic = new_topic("stale34", 4);
    let mut per: BTreeMap<i32, Vec<(usize, usize)>> = BTreeMap::new();
    for o in 0..100 {
        for v in 1..=4 {
            per.entry(((o + v) % 4) as i32).or_default().push((o, v));
        }
    }
    let mut recs = Vec::new();
    for (p, mut evs) in per {
        evs.sort_by_key(|&(o, v)| (std::cmp::Reverse(v), o));
        recs.extend(evs.into_iter().map(|(o, v)| order_event(p, o, v, 0)));
    }
    produce_singly(&topic, &recs);
    topic
}

/// What a run must leave, whatever the arrival order: 100 per status on the day, the v4 row of every order,
/// 400 ledger rows and 400 outbox rows (one per event id); returns the row table.
fn assert_order_independent(db: &Db, ctx: &str) -> Vec<(String, String, i64)> {
    let counts: Vec<(String, i64)> = db
        .query(
            "SELECT status, n FROM {s}.status_counts WHERE day = '2026-11-20' ORDER BY status",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let want: Vec<(String, i64)> = ["packed", "paid", "placed", "shipped"]
        .iter()
        .map(|s| (s.to_string(), 100))
        .collect();
    assert_eq!(counts, want, "{ctx}: the counter counts every event once");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.status_counts"), 4, "{ctx}");
    let rows: Vec<(String, String, i64)> = db
        .query(
            "SELECT order_id, status, version FROM {s}.orders ORDER BY order_id",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(rows.len(), 100, "{ctx}");
    assert!(
        rows.iter().all(|r| r.1 == "shipped" && r.2 == 4),
        "{ctx}: every order at v4: {rows:?}"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        400,
        "{ctx}"
    );
    assert_eq!(
        db.i64("SELECT count(DISTINCT payload->>'event_id') FROM {s}.outbox"),
        400,
        "{ctx}: the outbox holds every event once, stale ones included"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 400, "{ctx}");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
        0,
        "{ctx}"
    );
    rows
}

/// The accounting lines of `outs` added up: (consumed, landed, duplicate, stale).
fn summed(outs: &[Out]) -> (u64, u64, u64, u64) {
    outs.iter().fold((0, 0, 0, 0), |a, o| {
        let t = o.tally();
        (
            a.0 + t.consumed,
            a.1 + t.landed,
            a.2 + t.duplicate,
            a.3 + o.stale(),
        )
    })
}

/// Two `run --until-caught-up` workers of one group side by side, then one more of the group (it finds
/// whatever a rebalance left); their accounting lines.
fn two_workers(text: &str, topic: &str, db: &Db) -> Vec<Out> {
    let p = pipeline(text, topic, &unique("g"), &db.schema);
    let cfg = p.path.to_str().unwrap().to_string();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let cfg = cfg.clone();
            std::thread::spawn(move || try_run(&cfg))
        })
        .collect();
    let mut outs: Vec<Out> = workers.into_iter().map(|h| h.join().unwrap()).collect();
    for o in &outs {
        o.assert_ok();
    }
    outs.push(run_caught_up(&p.path));
    outs
}

#[test]
fn stale_events_reach_the_counter_and_the_outbox_whatever_the_arrival_order() {
    let topic = orders_topic();
    let mut tables = Vec::new();
    let mut stale_seen = 0;
    for (max, ctx) in [
        (1, "batch size 1, two workers"),
        (5000, "batch size 5000, two workers"),
        (5000, "the same topic again into a fresh schema"),
    ] {
        let db = Db::fresh("stale34");
        let outs = two_workers(&orders_pipeline(max), &topic, &db);
        let (consumed, landed, duplicate, stale) = summed(&outs);
        // Every record claimed once over the workers: landed or stale (counted), never dropped.
        assert_eq!(
            (consumed, landed + stale, duplicate),
            (400, 400, 0),
            "{ctx}: {:?}",
            outs.iter().map(|o| o.tally_line()).collect::<Vec<_>>()
        );
        stale_seen += stale;
        tables.push(assert_order_independent(&db, ctx));
    }
    assert!(
        stale_seen > 0,
        "later versions arrived first somewhere: the scenario exercises stale records"
    );
    assert!(tables.windows(2).all(|w| w[0] == w[1]), "row tables differ");
}

/// A redelivery under a new event id of the state stored at its version (same version, same state) is a copy:
/// a `duplicate` for the row and for the counter (its day and status are those of the claim before), but the
/// outbox, whose rows are the event ids, gets its row (so which copy came first never decides the outbox); the
/// record counts `landed`, its ledger claim stays. So is a republished older version under a new event id after
/// a newer one is stored: the row projection remembers the state it claimed at that version
/// (`replaysafe_row_versions`) and what the claims gave the other projections, whatever is stored now.
#[test]
fn a_same_state_redelivery_is_not_counted_and_reaches_only_the_outbox() {
    let recs = [
        order_event(0, 7, 1, 0),
        order_event(1, 7, 2, 0),
        // v2 again, same state, new event id, on the other partition.
        order_event(0, 7, 2, 1),
    ];
    for max in [1, 5000] {
        let db = Db::fresh("stale34dup");
        let t0 = new_topic("stale34dup", 2);
        produce_singly(&t0, &recs[..2]);
        let p = pipeline(&orders_pipeline(max), &t0, &unique("g"), &db.schema);
        let first = run_caught_up(&p.path);
        assert_eq!(first.tally().landed + first.stale(), 2, "{}", first.stdout);
        produce_singly(&t0, &recs[2..]);
        let out = run_caught_up(&p.path);
        let t = out.tally();
        assert_eq!(
            (t.consumed, t.landed, t.duplicate, out.stale()),
            (1, 1, 0, 0),
            "max-records {max}: {}",
            out.stdout
        );
        let counts: Vec<(String, i64)> = db
            .query(
                "SELECT status, n FROM {s}.status_counts ORDER BY status",
                &[],
            )
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            counts,
            vec![("paid".into(), 1), ("placed".into(), 1)],
            "max-records {max}: the redelivery is not counted"
        );
        assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 3);
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 3);
        let row = db.query("SELECT status, version FROM {s}.orders", &[]);
        assert_eq!(
            (row[0].get::<_, String>(0), row[0].get::<_, i64>(1)),
            ("paid".into(), 2)
        );
        // v1 republished under a new event id after v2 is stored: a copy too, not counted, sent.
        produce_singly(&t0, &[order_event(1, 7, 1, 2)]);
        let out = run_caught_up(&p.path);
        let t = out.tally();
        assert_eq!(
            (t.consumed, t.landed, t.duplicate, out.stale()),
            (1, 1, 0, 0),
            "{}",
            out.stdout
        );
        assert_eq!(
            db.i64("SELECT n FROM {s}.status_counts WHERE status = 'placed'"),
            1
        );
        assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 4);
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 4);
        assert_eq!(db.i64("SELECT version FROM {s}.orders"), 2);
    }
}

/// `dead-letters replay` of an event that is stale by the time it is replayed: its dead letter is resolved as
/// `replay: stale`, the row keeps the newer version, and the counter and the outbox get the event (issue 34).
#[test]
fn a_replayed_dead_letter_that_is_stale_reaches_the_counter_and_says_replay_stale() {
    let (db, topic) = crate::common::stage("stale34dl", 1);
    let group = unique("g");
    let with_note = |optional: bool| {
        orders_pipeline(5000).replace(
            "[identity]",
            &format!(
                "note = {{ path = \"/note\", type = \"text\"{} }}\n[identity]",
                if optional { ", optional = true" } else { "" }
            ),
        )
    };
    let strict = pipeline(&with_note(false), &topic, &group, &db.schema);
    // v1 without `note` (quarantined as missing-field), then v2 with it.
    let v2 = {
        let r = order_event(0, 9, 2, 0);
        let mut body: serde_json::Value =
            serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
        body["note"] = "n".into();
        Rec::json(0, "k", &body.to_string(), 1_795_000_000_000)
    };
    produce_singly(&topic, &[order_event(0, 9, 1, 0), v2]);
    let out = run_caught_up(&strict.path);
    let t = out.tally();
    assert_eq!((t.landed, t.quarantined), (1, 1), "{}", out.stdout);
    let lenient = pipeline(&with_note(true), &topic, &group, &db.schema);
    let replay = crate::common::replaysafe(&[
        "dead-letters",
        "replay",
        "--config",
        crate::common::arg(&lenient.path),
    ]);
    replay.assert_ok();
    assert_eq!(
        db.strings("SELECT resolved_by FROM {s}.replaysafe_dead_letters"),
        vec!["replay: stale"],
        "{}\n{}",
        replay.stdout,
        replay.stderr
    );
    assert_eq!(db.i64("SELECT version FROM {s}.orders"), 2);
    let counts: Vec<(String, i64)> = db
        .query(
            "SELECT status, n FROM {s}.status_counts ORDER BY status",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(counts, vec![("paid".into(), 1), ("placed".into(), 1)]);
    assert_eq!(
        db.strings("SELECT payload->>'status' FROM {s}.outbox ORDER BY id"),
        vec!["paid", "placed"]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 2);
}
