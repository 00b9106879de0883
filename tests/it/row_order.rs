//! Issue 34, found by breaking the merged work: what a row projection decides about a change at a version it no
//! longer stores (the entity moved on) must not depend on arrival order. Each test applies the same records in
//! several permitted orders (the entity's events are on different partitions: the older ones first, or the newer
//! one first; the two older ones either way round), each into a fresh schema, and compares the tables: at batch
//! sizes 1 and 5000 with each order's phases run to the end, for JSON events and for Debezium envelopes.

use serde_json::json;

use crate::common::*;

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

/// The same shape over Debezium envelopes of `public.orders (id, status, version)`: the row projection ordered by
/// its `version` column, a counter per `_op` and an outbox of every change's position.
fn cdc_pipeline(max_records: usize) -> String {
    format!(
        r#"{DEBEZIUM_HEADER}[batch]
max-records = {max_records}
linger-ms = 5
[[projection]]
kind = "row"
table = "orders"
key = ["id"]
columns = {{ id = "bigint", status = "text", version = "bigint" }}
version = "version"
[[projection]]
kind = "counter"
table = "op_counts"
group-by = ["_op"]
column = "n"
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["_op", "_entity", "_position"]
"#
    )
}

/// An event of order `o-1` on `partition`.
fn ev(partition: i32, id: &str, status: &str, version: i64) -> Rec {
    let body = serde_json::json!({"event_id": id, "order_id": "o-1", "status": status, "version": version});
    Rec::json(partition, id, &body.to_string(), 1_795_000_000_000)
}

/// An update of order 1 to `status` at `version`, source position `[lsn - 36, lsn]`, on `partition`.
fn cdc(partition: i32, status: &str, version: i64, lsn: i64) -> Rec {
    Table("orders").update(
        partition,
        1,
        json!({"id": 1, "status": status, "version": version}),
        lsn,
    )
}

/// What a run left: counter rows, outbox payloads (without the event id or source position, which differ by
/// copy), the row, conflicts (version, stored, incoming), ledger rows.
type State = (
    Vec<(String, i64)>,
    Vec<String>,
    Vec<(String, i64)>,
    Vec<(Vec<i64>, String, String)>,
    i64,
);

/// The state of `db`; `counter`: the counter table's `SELECT group, n`.
fn state(db: &Db, counter: &str) -> State {
    let q = |sql: &str| db.query(sql, &[]);
    (
        q(counter)
            .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect(),
        db.column("SELECT (payload - 'event_id' - '_position')::text FROM {s}.outbox ORDER BY 1"),
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

/// Each phase produced and run to the end, in order, into a fresh schema (`cdc`: [`cdc_pipeline`]); the state.
fn apply_phases(phases: &[&[Rec]], max: usize, cdc: bool) -> State {
    let db = Db::fresh("roword");
    let topic = new_topic("roword", 3);
    let text = if cdc {
        cdc_pipeline(max)
    } else {
        orders_pipeline(max)
    };
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    for phase in phases {
        produce_singly(&topic, phase);
        run_caught_up(&p.path).assert_ok();
    }
    let counter = if cdc {
        "SELECT _op, n FROM {s}.op_counts ORDER BY 1"
    } else {
        "SELECT status, n FROM {s}.status_counts ORDER BY 1"
    };
    state(&db, counter)
}

/// The orders every test applies: the two older records (`a`, `b`) together then `newer` (batch size 1), `newer`
/// first (batch size 5000), and each record alone in two more orders (`b` before `a`, `newer` last or first).
/// Every order's state.
fn all_orders(a: &Rec, b: &Rec, newer: &Rec, cdc: bool) -> Vec<(String, State)> {
    let older = [a.clone(), b.clone()];
    let n = [newer.clone()];
    let mut out = vec![
        (
            "max-records 1: older first".to_string(),
            apply_phases(&[&older, &n], 1, cdc),
        ),
        (
            "max-records 5000: newer first".to_string(),
            apply_phases(&[&n, &older], 5000, cdc),
        ),
    ];
    let (a, b) = (std::slice::from_ref(a), std::slice::from_ref(b));
    out.push((
        "singly: b, a, newer".into(),
        apply_phases(&[b, a, &n], 1, cdc),
    ));
    out.push((
        "singly: newer, b, a".into(),
        apply_phases(&[&n, b, a], 1, cdc),
    ));
    out
}

/// Every order's state equals the first's.
fn assert_same(states: &[(String, State)]) {
    for (what, s) in &states[1..] {
        assert_eq!(s, &states[0].1, "{what} vs {}", states[0].0);
    }
}

/// v1 published twice under two event ids with the same state (a producer retry with a fresh id: a `duplicate` by
/// the README's rule), v2 on a third partition. Before the row projections kept what they claimed per version, the
/// second copy was a duplicate only while v1 was stored: with v2 first both copies were `stale`, both counted and
/// sent (`placed` 1 or 2 by arrival order). Now the second copy of v1's state is a duplicate for the row and the
/// counter in every order (it gives the counter the same status), and the outbox, whose rows are event ids, gets
/// both copies in every order.
#[test]
fn a_same_state_copy_counts_once_whatever_the_arrival_order() {
    let states = all_orders(
        &ev(0, "e-1a", "placed", 1),
        &ev(1, "e-1b", "placed", 1),
        &ev(2, "e-2", "paid", 2),
        false,
    );
    let s = &states[0].1;
    assert_eq!(s.0, [("paid".to_string(), 1), ("placed".to_string(), 1)]);
    assert_eq!(
        s.1,
        [
            r#"{"status": "paid", "version": 2, "order_id": "o-1"}"#,
            r#"{"status": "placed", "version": 1, "order_id": "o-1"}"#,
            r#"{"status": "placed", "version": 1, "order_id": "o-1"}"#
        ]
    );
    assert_eq!(s.2, [("paid".to_string(), 2)]);
    assert!(s.3.is_empty(), "no conflict: {:?}", s.3);
    assert_eq!(s.4, 3, "every copy keeps its ledger claim");
    assert_same(&states);
}

/// v1 with two different states (two event ids), v2 on a third partition. Before, the second was a conflict row
/// only while v1 was stored (with v2 first both were `stale` and no conflict was ever recorded), and which state
/// was "stored" depended on which came first. Now one conflict row in every order, naming the same winner (the
/// smaller state hash) as stored; every event reaches the counter and the outbox once.
#[test]
fn an_equal_version_conflict_is_recorded_whatever_the_arrival_order() {
    let states = all_orders(
        &ev(0, "e-1a", "paid", 1),
        &ev(1, "e-1b", "placed", 1),
        &ev(2, "e-2", "shipped", 2),
        false,
    );
    let s = &states[0].1;
    assert_eq!(
        s.0,
        [
            ("paid".to_string(), 1),
            ("placed".to_string(), 1),
            ("shipped".to_string(), 1)
        ]
    );
    assert_eq!(s.1.len(), 3);
    assert_eq!(s.2, [("shipped".to_string(), 2)]);
    assert_eq!(s.3.len(), 1, "one conflict row: {:?}", s.3);
    let (v, stored, incoming) = &s.3[0];
    assert_eq!(v, &[1]);
    let mut pair = [stored.as_str(), incoming.as_str()];
    pair.sort_unstable();
    assert_eq!(pair, ["paid", "placed"]);
    assert_eq!(s.4, 3);
    assert_same(&states);
}

/// While v1 is the stored version, the conflict's winner is the row whichever of v1's states came first.
#[test]
fn the_stored_row_holds_an_equal_version_conflicts_winner_in_every_order() {
    let (a, b) = (ev(0, "e-1a", "paid", 1), ev(1, "e-1b", "placed", 1));
    let mut rows = Vec::new();
    for (first, second) in [(&a, &b), (&b, &a)] {
        let s = apply_phases(
            &[std::slice::from_ref(first), std::slice::from_ref(second)],
            1,
            false,
        );
        assert_eq!(s.3.len(), 1, "{:?}", s.3);
        assert_eq!(
            s.2,
            [(s.3[0].1.clone(), 1)],
            "the row holds the conflict's stored state"
        );
        rows.push(s);
    }
    assert_eq!(rows[0], rows[1]);
}

/// The same two shapes through Debezium envelopes (a version column; updates of one row on different
/// partitions): a no-op update that repeats v1's state at a later source position (a new delivery key) is a
/// duplicate for the row and the counter in every order (the same `_op`), and reaches the outbox (a new position
/// is a new outbox row) in every order; a redelivery of the v1 change at its own position with another state (same delivery
/// key, a ledger duplicate) is a conflict in every order — before, with v2 first, it stayed a silent duplicate.
#[test]
fn cdc_same_state_copies_and_equal_version_conflicts_whatever_the_arrival_order() {
    let same = all_orders(
        &cdc(0, "placed", 1, 200),
        &cdc(1, "placed", 1, 300),
        &cdc(2, "paid", 2, 400),
        true,
    );
    let s = &same[0].1;
    assert_eq!(s.0, [("u".to_string(), 2)], "the copy reaches no counter");
    assert_eq!(s.1.len(), 3, "every position has its outbox row");
    assert_eq!(s.2, [("paid".to_string(), 2)]);
    assert!(s.3.is_empty(), "{:?}", s.3);
    assert_eq!(s.4, 3);
    assert_same(&same);

    let conflict = all_orders(
        &cdc(0, "placed", 1, 200),
        &cdc(1, "cancelled", 1, 200),
        &cdc(2, "paid", 2, 400),
        true,
    );
    let s = &conflict[0].1;
    assert_eq!(
        s.0,
        [("u".to_string(), 2)],
        "the redelivery's key was claimed once"
    );
    assert_eq!(s.2, [("paid".to_string(), 2)]);
    assert_eq!(s.3.len(), 1, "{:?}", s.3);
    let mut pair = [s.3[0].1.as_str(), s.3[0].2.as_str()];
    pair.sort_unstable();
    assert_eq!(pair, ["cancelled", "placed"]);
    assert_eq!(s.4, 2);
    assert_same(&conflict);
}
