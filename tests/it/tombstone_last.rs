//! Issue 34 (break-it, b2): a JSON row projection's tombstone must not depend on arrival order. `_last` holds
//! "the values the delete removed" (docs/cdc.md, docs/reference.md "Tables"), but a delete takes whatever row is
//! stored when it is applied: when a newer delete arrives before the older write it removed (entities spread
//! over partitions, newer first, or a delete and a write at one version in either order), `_last` is all-null
//! in one order and the removed row in the other. `prove` fails such a pipeline on boundaries 3, 4, 8, 9, 10.
//! Now a tombstone keeps the values of the newest write claimed at or before its version (`_last_version`), in
//! every order, with batches of 1 record and of 5000, under `tombstones = "table"` and `"column"`.

use crate::common::{new_topic, pipeline, produce_singly, run_caught_up, unique, Db, Rec, HEADER};

fn orders_pipeline(max_records: usize, tombstones: &str) -> String {
    format!(
        r#"{HEADER}[batch]
max-records = {max_records}
linger-ms = 50
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
delete-if = "status == 'cancelled'"
tombstones = "{tombstones}"
"#
    )
}

fn event(n: u64, order: &str, status: &str, version: i64) -> Rec {
    let id = uuid::Uuid::from_u64_pair(0xb2, n).to_string();
    let body = serde_json::json!({
        "event_id": id, "order_id": order, "status": status, "version": version,
        "occurred_at": "2026-11-20T10:00:00Z",
    });
    Rec::json(0, &id, &body.to_string(), 1_795_000_000_000)
}

/// The tombstones (order_id, _version, _last, _last_version) and the live rows (order_id, status, version,
/// _version) after applying `recs` (one partition, this order) into a fresh schema with batches of
/// `max_records`, under `tombstones = "table"`; under `"column"` the deleted rows (with their kept values) are
/// the "tombstones" and `_last` is NULL.
type Rows = (Vec<Vec<Option<String>>>, Vec<Vec<Option<String>>>);

fn outcome(recs: &[Rec], max_records: usize, tombstones: &str) -> Rows {
    let topic = new_topic("tomblast", 1);
    produce_singly(&topic, recs);
    let db = Db::fresh("tomblast");
    let p = pipeline(
        &orders_pipeline(max_records, tombstones),
        &topic,
        &unique("g"),
        &db.schema,
    );
    run_caught_up(&p.path).assert_ok();
    let rows = |sql: &str| -> Vec<Vec<Option<String>>> {
        db.query(sql, &[])
            .iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| r.get::<_, Option<String>>(i))
                    .collect()
            })
            .collect()
    };
    if tombstones == "table" {
        (
            rows("SELECT order_id, _version::text, _last::text, _last_version::text FROM {s}.orders_tombstones \
                  ORDER BY order_id"),
            rows("SELECT order_id, status, version::text, _version::text FROM {s}.orders ORDER BY order_id"),
        )
    } else {
        (
            rows("SELECT order_id, _version::text, status || '/' || version, _last_version::text FROM {s}.orders \
                  WHERE _deleted_at IS NOT NULL ORDER BY order_id"),
            rows("SELECT order_id, status, version::text, _version::text FROM {s}.orders \
                  WHERE _deleted_at IS NULL ORDER BY order_id"),
        )
    }
}

fn row(v: &[Option<&str>]) -> Vec<Option<String>> {
    v.iter().map(|x| x.map(str::to_string)).collect()
}

/// o1: placed v1, then cancelled v2 (a newer delete). o3: paid v2 and cancelled v2 (the delete wins the version
/// in every order). o4: placed v1, packed v3, cancelled v4 and a late paid v2 (older than the kept packed v3).
/// o5: only a delete (nothing to keep). o2: placed v1, paid v2 (live).
fn events() -> Vec<Rec> {
    vec![
        event(1, "o1", "placed", 1),
        event(2, "o1", "cancelled", 2),
        event(3, "o3", "paid", 2),
        event(4, "o3", "cancelled", 2),
        event(5, "o4", "placed", 1),
        event(6, "o4", "packed", 3),
        event(7, "o4", "cancelled", 4),
        event(8, "o4", "paid", 2),
        event(9, "o5", "cancelled", 1),
        event(10, "o2", "placed", 1),
        event(11, "o2", "paid", 2),
    ]
}

#[test]
fn a_tombstones_last_is_the_same_whatever_the_arrival_order() {
    let older_first = events();
    let newer_first: Vec<Rec> = older_first.iter().rev().cloned().collect();
    // A third order: every other record first.
    let interleaved: Vec<Rec> = older_first
        .iter()
        .step_by(2)
        .chain(older_first.iter().skip(1).step_by(2))
        .cloned()
        .collect();
    let last = |o: &str, s: &str, v: &str| {
        format!(r#"{{"status": "{s}", "version": "{v}", "order_id": "{o}"}}"#)
    };
    let (l1, l3, l4) = (
        last("o1", "placed", "1"),
        last("o3", "paid", "2"),
        last("o4", "packed", "3"),
    );
    let table_tombs = vec![
        row(&[Some("o1"), Some("{2}"), Some(&l1), Some("{1}")]),
        row(&[Some("o3"), Some("{2}"), Some(&l3), Some("{2}")]),
        row(&[Some("o4"), Some("{4}"), Some(&l4), Some("{3}")]),
        row(&[
            Some("o5"),
            Some("{1}"),
            Some(r#"{"status": null, "version": null, "order_id": null}"#),
            None,
        ]),
    ];
    let column_tombs = vec![
        row(&[Some("o1"), Some("{2}"), Some("placed/1"), Some("{1}")]),
        row(&[Some("o3"), Some("{2}"), Some("paid/2"), Some("{2}")]),
        row(&[Some("o4"), Some("{4}"), Some("packed/3"), Some("{3}")]),
        row(&[Some("o5"), Some("{1}"), None, None]),
    ];
    let live = vec![row(&[Some("o2"), Some("paid"), Some("2"), Some("{2}")])];
    for (mode, tombs) in [("table", &table_tombs), ("column", &column_tombs)] {
        for max_records in [1, 5000] {
            for (name, recs) in [
                ("older first", &older_first),
                ("newer first", &newer_first),
                ("interleaved", &interleaved),
            ] {
                let (t, l) = outcome(recs, max_records, mode);
                assert_eq!(
                    (&t, &l),
                    (tombs, &live),
                    "tombstones = {mode}, batches of {max_records}, {name}: the same records must give the same \
                     tombstones (`_last` included) and rows"
                );
            }
        }
    }
}
