//! Issue 34 (break-it, b2): two events of one entity at one version whose *kept* columns are equal (a copy
//! under a new event id) but which differ in a field another projection reads (here the counter's `day`). The
//! row projection used to call the second one to arrive a `duplicate`, so no other projection saw it, and which
//! of the two the counter counted depended on arrival order. Now a copy reaches each other projection unless an
//! earlier claim of that state gave it the same values (`replaysafe_row_versions.reach`): the counter counts each
//! distinct (day, status) of a state once, in every order and batching.

use crate::common::{new_topic, pipeline, produce_singly, run_caught_up, unique, Db, Rec, HEADER};

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
"#
    )
}

fn event(n: u64, status: &str, version: i64, day: &str) -> Rec {
    let id = uuid::Uuid::from_u64_pair(0xb2c, n).to_string();
    let body = serde_json::json!({
        "event_id": id, "order_id": "o4", "status": status, "version": version,
        "occurred_at": format!("{day}T10:00:00Z"),
    });
    Rec::json(0, &id, &body.to_string(), 1_795_000_000_000)
}

/// The counter's rows and the accounting line's (landed, duplicate) after applying `recs` (one partition, this
/// order, batches of at most `max`) into a fresh schema, and the row's `_delivery`; the row must end at `paid` v2.
type Counts = (Vec<(String, String, i64)>, (u64, u64), String);

fn counts(recs: &[Rec], max: usize) -> Counts {
    let topic = new_topic("copies34", 1);
    produce_singly(&topic, recs);
    let db = Db::fresh("copies34");
    let p = pipeline(&orders_pipeline(max), &topic, &unique("g"), &db.schema);
    let out = run_caught_up(&p.path);
    let t = out.tally();
    assert_eq!(t.consumed, recs.len() as u64, "{}", out.stdout);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        recs.len() as i64,
        "every copy is claimed under its own event id"
    );
    assert_eq!(db.i64("SELECT version FROM {s}.orders"), 2);
    let rows = db
        .query(
            "SELECT day::text, status, n FROM {s}.status_counts ORDER BY 1, 2",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let delivery = db.strings("SELECT _delivery FROM {s}.orders").remove(0);
    (rows, (t.landed + out.stale(), t.duplicate), delivery)
}

#[test]
fn copies_at_one_version_with_another_day_count_the_same_whatever_the_order() {
    let a = event(1, "placed", 1, "2026-11-20");
    let paid = event(2, "paid", 2, "2026-11-20");
    let b = event(3, "placed", 1, "2026-11-19");
    let (first, ..) = counts(&[a.clone(), paid.clone(), b.clone()], 5000);
    let (second, ..) = counts(&[b, paid, a], 5000);
    assert_eq!(first, second, "the same records must give the same counter");
    assert_eq!(
        first,
        vec![
            ("2026-11-19".into(), "placed".into(), 1),
            ("2026-11-20".into(), "paid".into(), 1),
            ("2026-11-20".into(), "placed".into(), 1),
        ],
        "each distinct (day, status) of the copies is counted once"
    );
}

/// Copies that give the counter the same values are a `duplicate` for it in every order and batch size, beside
/// a copy that gives it another day: each distinct day of the state counts once, however many copies. Of two
/// copies of the stored version the row's `_delivery` is the lesser event id in every order.
#[test]
fn identical_copies_count_once_beside_a_copy_with_another_day_in_every_order_and_batching() {
    let a = event(11, "placed", 1, "2026-11-20");
    let a2 = event(12, "placed", 1, "2026-11-20");
    let a3 = event(13, "placed", 1, "2026-11-20");
    let b = event(14, "placed", 1, "2026-11-19");
    let paid = event(15, "paid", 2, "2026-11-20");
    let paid2 = event(16, "paid", 2, "2026-11-20");
    let least = [&paid, &paid2]
        .iter()
        .map(|r| String::from_utf8(r.key.clone().unwrap()).unwrap())
        .min()
        .unwrap();
    let want = vec![
        ("2026-11-19".to_string(), "placed".to_string(), 1),
        ("2026-11-20".to_string(), "paid".to_string(), 1),
        ("2026-11-20".to_string(), "placed".to_string(), 1),
    ];
    let orders = [
        vec![&a, &a2, &b, &paid, &a3, &paid2],
        vec![&paid2, &paid, &a3, &b, &a2, &a],
        vec![&b, &paid, &a2, &a, &paid2, &a3],
    ];
    for max in [1, 5000] {
        for order in &orders {
            let recs: Vec<Rec> = order.iter().map(|r| (*r).clone()).collect();
            let (rows, (landed, duplicate), delivery) = counts(&recs, max);
            assert_eq!(rows, want, "max-records {max}");
            // a, b and paid land (for the counter, whichever copy of each comes first); the two other copies
            // of a and the other copy of paid give it nothing new.
            assert_eq!((landed, duplicate), (3, 3), "max-records {max}");
            assert_eq!(
                delivery,
                format!("[\"\",\"{least}\"]"),
                "max-records {max}: the row's _delivery is the least copy's key"
            );
        }
    }
}

/// Two row projections, one filtered (`web_orders`: channel web), and a counter per status. A copy that only the
/// unfiltered one sees (channel app) and one both see (web), in either order: the counter counts the state once
/// (a projection is left out when any row projection the record reached remembers giving it those values), and
/// both row tables hold the state (break-it, issue 34).
#[test]
fn a_copy_seen_by_only_one_of_two_row_projections_counts_the_same_in_either_order() {
    let text = format!(
        r#"{HEADER}[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
order_id = {{ path = "/order_id", type = "text" }}
status = {{ path = "/status", type = "text" }}
version = {{ path = "/version", type = "bigint" }}
channel = {{ path = "/channel", type = "text" }}
[identity]
key = ["event_id"]
[[projection]]
kind = "row"
table = "orders"
key = ["order_id"]
version = "version"
columns = ["order_id", "status", "version"]
[[projection]]
kind = "row"
table = "web_orders"
filter = "channel == 'web'"
key = ["order_id"]
version = "version"
columns = ["order_id", "status", "version"]
[[projection]]
kind = "counter"
table = "status_counts"
group-by = ["status"]
column = "n"
"#
    );
    let ev = |n: u64, channel: &str| {
        let id = uuid::Uuid::from_u64_pair(0xb2e, n).to_string();
        let body = serde_json::json!({
            "event_id": id, "order_id": "o-1", "status": "placed", "version": 1, "channel": channel,
        });
        Rec::json(0, &id, &body.to_string(), 1_795_000_000_000)
    };
    let (app, web) = (ev(1, "app"), ev(2, "web"));
    for recs in [[app.clone(), web.clone()], [web, app]] {
        let topic = new_topic("copies34r", 1);
        produce_singly(&topic, &recs);
        let db = Db::fresh("copies34r");
        let p = pipeline(&text, &topic, &unique("g"), &db.schema);
        run_caught_up(&p.path).assert_ok();
        assert_eq!(
            db.i64("SELECT n FROM {s}.status_counts WHERE status = 'placed'"),
            1
        );
        assert_eq!(db.i64("SELECT count(*) FROM {s}.orders"), 1);
        assert_eq!(db.i64("SELECT count(*) FROM {s}.web_orders"), 1);
    }
}

/// One state at v1, then another state at v1 under two event ids: the conflict row names the lesser event id
/// (and its offset) as `incoming`, whichever copy arrived first (break-it, issue 34).
#[test]
fn a_conflict_row_names_the_least_copy_whatever_the_order() {
    let ev = |n: u64, status: &str| event(20 + n, status, 1, "2026-11-20");
    let (first, x, y) = (ev(0, "placed"), ev(1, "paid"), ev(2, "paid"));
    let least = [&x, &y]
        .iter()
        .map(|r| String::from_utf8(r.key.clone().unwrap()).unwrap())
        .min()
        .unwrap();
    let mut rows = Vec::new();
    for recs in [
        [first.clone(), x.clone(), y.clone()],
        [first.clone(), y.clone(), x.clone()],
    ] {
        let topic = new_topic("copies34c", 1);
        produce_singly(&topic, &recs);
        let db = Db::fresh("copies34c");
        let p = pipeline(&orders_pipeline(5000), &topic, &unique("g"), &db.schema);
        run_caught_up(&p.path).assert_ok();
        let got = db.strings(
            "SELECT coalesce(stored_delivery, '-') || ' ' || incoming_delivery FROM {s}.replaysafe_conflicts",
        );
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains(&least), "{got:?} names {least}");
        rows.push(got);
    }
    assert_eq!(rows[0], rows[1]);
}
