//! Issue 34, found by breaking the merged work: what a row projection decides about a change at a version it no
//! longer stores (the entity moved on) still depends on arrival order. Each test applies the same records in two
//! permitted orders (the entity's events are on different partitions: the older ones first, or the newer one
//! first), each into a fresh schema, at batch sizes 1 and 5000, and compares the tables.

use crate::common::{new_topic, pipeline, produce_singly, run_caught_up, unique, Db, Rec, HEADER};

/// A row projection of orders by `version`, a counter per status and an outbox of every event.
fn orders_pipeline(max_records: usize) -> String {
    format!(
        r#"{HEADER}[batch]
max-records = {max_records}
linger-ms = 5
[fields]
event_id = {{ path = "/event_id", type = "text" }}
order_id = {{ path = "/order_id", type = "text" }}
status = {{ path = "/status", type = "text" }}
version = {{ path = "/version", type = "bigint" }}
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
group-by = ["status"]
column = "n"
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["event_id", "order_id", "status", "version"]
"#
    )
}

/// An event of order `o-1` on `partition`.
fn ev(partition: i32, id: &str, status: &str, version: i64) -> Rec {
    let body = serde_json::json!({"event_id": id, "order_id": "o-1", "status": status, "version": version});
    Rec::json(partition, id, &body.to_string(), 1_795_000_000_000)
}

/// What a run left: counter rows, outbox event ids, the row, conflicts (version, stored, incoming), ledger rows.
type State = (
    Vec<(String, i64)>,
    Vec<String>,
    Vec<(String, i64)>,
    Vec<(Vec<i64>, String, String)>,
    i64,
);

fn state(db: &Db) -> State {
    let q = |sql: &str| db.query(sql, &[]);
    (
        q("SELECT status, n FROM {s}.status_counts ORDER BY status")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
        db.column("SELECT payload->>'event_id' FROM {s}.outbox ORDER BY 1"),
        q("SELECT status, version FROM {s}.orders")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect(),
        q("SELECT version, stored->>'status', incoming->>'status' FROM {s}.replaysafe_conflicts ORDER BY 1, 2, 3")
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
    )
}

/// `older` then `newer` (`newer_first` false) or the other way round, each phase run to the end; the state.
fn apply_in_order(older: &[Rec], newer: &[Rec], newer_first: bool, max: usize) -> State {
    let db = Db::fresh("brk34");
    let topic = new_topic("brk34", 3);
    let p = pipeline(&orders_pipeline(max), &topic, &unique("g"), &db.schema);
    let (a, b) = if newer_first {
        (newer, older)
    } else {
        (older, newer)
    };
    for phase in [a, b] {
        produce_singly(&topic, phase);
        run_caught_up(&p.path).assert_ok();
    }
    state(&db)
}

/// v1 published twice under two event ids with the same state (a producer retry with a fresh id: a
/// `duplicate` by the README's rule), v2 on a third partition. With v1's copies first, the second copy meets v1
/// stored and is a duplicate the counter does not count; with v2 first both copies are `stale` and both are
/// counted and sent: `placed` is 1 or 2 by arrival order (`replaysafe prove` fails such a fixture at
/// boundaries 3, 4, 9, 10 and 11).
#[test]
#[ignore = "issue 34 follow-up: a same-state copy is told apart only while its version is stored; needs each entity's claimed (version, state) kept"]
fn a_same_state_copy_counts_once_whatever_the_arrival_order() {
    let older = [ev(0, "e-1a", "placed", 1), ev(1, "e-1b", "placed", 1)];
    let newer = [ev(2, "e-2", "paid", 2)];
    for max in [1, 5000] {
        let a = apply_in_order(&older, &newer, false, max);
        let b = apply_in_order(&older, &newer, true, max);
        assert_eq!(
            a.0,
            [("paid".to_string(), 1), ("placed".to_string(), 1)],
            "max-records {max}: older first"
        );
        assert_eq!(a, b, "max-records {max}: older first vs newer first");
        assert_eq!(
            a.4, 3,
            "max-records {max}: every copy keeps its ledger claim"
        );
    }
}

/// v1 with two different states (two event ids), v2 on a third partition. With v1's events first the second is
/// a conflict row (stored `paid`, incoming `placed`); with v2 first both are `stale` and no conflict is ever
/// recorded: `replaysafe_conflicts` depends on arrival order (and on batching and the crash history: `prove`
/// fails such a fixture at boundaries 3, 4, 8, 9, 10 and 11 on `replaysafe_conflicts` alone).
#[test]
#[ignore = "issue 34 follow-up: an equal-version conflict is detected only while that version is stored; needs each entity's claimed (version, state) kept"]
fn an_equal_version_conflict_is_recorded_whatever_the_arrival_order() {
    let older = [ev(0, "e-1a", "paid", 1), ev(1, "e-1b", "placed", 1)];
    let newer = [ev(2, "e-2", "shipped", 2)];
    for max in [1, 5000] {
        let a = apply_in_order(&older, &newer, false, max);
        let b = apply_in_order(&older, &newer, true, max);
        assert_eq!(
            a.3,
            [(vec![1], "paid".to_string(), "placed".to_string())],
            "max-records {max}: older first records the conflict"
        );
        assert_eq!(a.2, [("shipped".to_string(), 2)], "max-records {max}");
        assert_eq!(
            a.3.len(),
            b.3.len(),
            "max-records {max}: a conflict row whatever the arrival order"
        );
        assert_eq!((a.0, a.1, a.4), (b.0, b.1, b.4), "max-records {max}");
    }
}
