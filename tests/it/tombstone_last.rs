//! Issue 34 (break-it, b2): a JSON row projection's tombstone must not depend on arrival order. `_last` holds
//! "the values the delete removed" (docs/cdc.md, docs/reference.md "Tables"), but a delete takes whatever row is
//! stored when it is applied: when a newer delete arrives before the older write it removed (entities spread
//! over partitions, newer first, or a delete and a write at one version in either order), `_last` is all-null
//! in one order and the removed row in the other. `prove` fails such a pipeline on boundaries 3, 4, 8, 9, 10.

use crate::common::{new_topic, pipeline, produce_singly, run_caught_up, unique, Db, Rec, HEADER};

fn orders_pipeline() -> String {
    format!(
        r#"{HEADER}[fields]
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

/// The tombstones (order_id, _version, _last) after applying `recs` (one partition, this order) into a
/// fresh schema.
fn tombstones(recs: &[Rec]) -> Vec<(String, String, String)> {
    let topic = new_topic("tomblast", 1);
    produce_singly(&topic, recs);
    let db = Db::fresh("tomblast");
    let p = pipeline(&orders_pipeline(), &topic, &unique("g"), &db.schema);
    run_caught_up(&p.path).assert_ok();
    db.query(
        "SELECT order_id, _version::text, _last::text FROM {s}.orders_tombstones ORDER BY order_id",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

#[test]
#[ignore = "issue 34 follow-up: a delete writes the row stored when it is applied into _last, not its own before image or the version winner"]
fn a_tombstones_last_is_the_same_whatever_the_arrival_order() {
    // o1: placed v1, then cancelled v2 (a newer delete). o3: paid v2 and cancelled v2 (the delete wins the
    // version in every order).
    let placed = event(1, "o1", "placed", 1);
    let cancel = event(2, "o1", "cancelled", 2);
    let paid = event(3, "o3", "paid", 2);
    let cancel3 = event(4, "o3", "cancelled", 2);
    let older_first = tombstones(&[
        placed.clone(),
        cancel.clone(),
        paid.clone(),
        cancel3.clone(),
    ]);
    let newer_first = tombstones(&[cancel, placed, cancel3, paid]);
    assert_eq!(older_first.len(), 2, "{older_first:?}");
    assert_eq!(
        older_first, newer_first,
        "the same records must give the same tombstones (`_last` included)"
    );
}
