//! Issue 40 item 6 (case C50): `dead-letters replay` after newer events were applied. The replay applies the
//! dead letters in (topic, partition, offset) order, so a constrained aggregate sees the add before the removal;
//! an older event whose columns the stored, newer row lacks is never resolved as `stale` with its data missing:
//! it stays unresolved as `superseded`, naming the columns.
//!
//! The case's dead letters come from a wrong mapping; here they come from wrong constraints (`orders` requiring
//! a status, `stock` capped at 10) that the operator drops before replaying: a field a projection reads cannot
//! change its path under a ledger (docs/replay.md "Changing a field type or a projection"), and the replay's order and
//! settlement are the same whatever made the records fail.

use crate::common::{arg, committed, pipeline, produce, replaysafe, run_caught_up, stage, unique};
use crate::common::{Rec, HEADER};

/// Orders as a row projection by `version` (columns an event lacks are written NULL: whole rows), stock as a
/// `sql` projection adding StockAdded/StockRemoved to a row per sku under `CHECK (quantity >= 0)`, and an outbox of every event.
fn c50_pipeline(max_records: usize) -> String {
    format!(
        r#"{HEADER}[batch]
max-records = {max_records}
linger-ms = 5
[errors]
tolerance = "all"
[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
event_type = {{ path = "/event_type", type = "text" }}
entity_id = {{ path = "/entity_id", type = "text" }}
version = {{ path = "/version", type = "bigint" }}
day = {{ path = "/occurred_at", type = "date" }}
customer_id = {{ path = "/data/customer_id", type = "text", optional = true }}
total = {{ path = "/data/total", type = "numeric", optional = true }}
status = {{ path = "/data/status", type = "text", optional = true }}
qty = {{ path = "/data/qty", type = "bigint", optional = true }}
[identity]
key = ["event_id"]
[[projection]]
kind = "row"
table = "orders"
filter = "event_type.startsWith('Order')"
key = ["entity_id"]
version = "version"
columns = ["entity_id", "customer_id", "total", "status", "version"]
[[projection]]
kind = "sql"
name = "stock"
setup = "CREATE TABLE IF NOT EXISTS {{schema}}.stock (sku text PRIMARY KEY, quantity bigint NOT NULL CHECK (quantity >= 0))"
sql = "UPDATE {{schema}}.stock AS s SET quantity = s.quantity + d.delta FROM (SELECT entity_id, sum(CASE WHEN event_type = 'StockRemoved' THEN -qty ELSE qty END) AS delta FROM pg_temp.landed WHERE event_type IN ('StockAdded', 'StockRemoved') GROUP BY entity_id) AS d WHERE s.sku = d.entity_id"
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["event_id", "event_type", "entity_id"]
key = ["entity_id"]
"#
    )
    .replace("{{schema}}", "{schema}")
}

/// The case's event id of offset `n` (300…304).
fn id(n: u64) -> String {
    format!("c50e0000-0000-4000-8000-000000000{n}")
}

/// The five records of C50 (their data spelled as the fixed mapping reads it), at offsets 0…4 of partition 0.
fn c50_records() -> Vec<Rec> {
    let ev = |n: u64, ty: &str, entity: &str, version: i64, data: serde_json::Value| {
        let body = serde_json::json!({
            "event_id": id(n), "event_type": ty, "entity_id": entity, "version": version,
            "occurred_at": format!("2026-11-20T00:05:0{}Z", n - 300), "data": data,
        });
        Rec::json(0, entity, &body.to_string(), 1_795_000_000_000)
    };
    vec![
        ev(
            300,
            "OrderPlaced",
            "o-300",
            1,
            serde_json::json!({"customer_id": "c-3", "total": "10.00"}),
        ),
        ev(
            301,
            "OrderShipped",
            "o-300",
            2,
            serde_json::json!({"status": "SHIPPED"}),
        ),
        ev(
            302,
            "StockAdded",
            "sku-1",
            1,
            serde_json::json!({"qty": 100}),
        ),
        ev(
            303,
            "StockRemoved",
            "sku-1",
            2,
            serde_json::json!({"qty": 50}),
        ),
        ev(304, "StockAdded", "sku-2", 1, serde_json::json!({"qty": 5})),
    ]
}

fn replays_dead_letters_in_offset_order_and_keeps_superseded_ones(max_records: usize) {
    let (db, topic) = stage("c50replay", 1);
    let group = unique("g");
    let p = pipeline(&c50_pipeline(max_records), &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.orders ADD CONSTRAINT wrong_status CHECK (status IS NOT NULL)");
    db.execute("ALTER TABLE {s}.stock ADD CONSTRAINT wrong_cap CHECK (quantity <= 10)");
    db.execute("INSERT INTO {s}.stock VALUES ('sku-1', 0), ('sku-2', 0)");
    // v1 alone first (in one batch with v2 the row projection would fold it into v2's write).
    let records = c50_records();
    produce(&topic, &records[..1]);
    let out = run_caught_up(&p.path);
    assert_eq!(out.tally().quarantined, 1, "{}", out.stdout);
    produce(&topic, &records[1..]);
    let out = run_caught_up(&p.path);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (4, 2, 2),
        "{}",
        out.stdout
    );
    let dead = "SELECT \"offset\" || ' ' || reason || ' ' || coalesce(resolved_by, '-') FROM {s}.replaysafe_dead_letters ORDER BY 1";
    assert_eq!(
        db.strings(dead),
        [
            "0 rejected-by-database -",
            "2 rejected-by-database -",
            "3 rejected-by-database -"
        ]
    );

    // The fix, then one replay.
    db.execute("ALTER TABLE {s}.orders DROP CONSTRAINT wrong_status");
    db.execute("ALTER TABLE {s}.stock DROP CONSTRAINT wrong_cap");
    let replay = || replaysafe(&["dead-letters", "replay", "--config", arg(&p.path)]);
    let first = replay();
    first.assert_ok();
    assert!(
        first.stdout.contains("still unresolved 1"),
        "{}\n{}",
        first.stdout,
        first.stderr
    );
    let state = || {
        (
            db.strings("SELECT sku || '=' || quantity FROM {s}.stock ORDER BY sku"),
            db.strings(
                "SELECT entity_id || ' ' || coalesce(customer_id, '∅') || ' ' || coalesce(total::text, '∅') || ' ' \
                 || status || ' v' || version FROM {s}.orders",
            ),
            db.strings("SELECT payload->>'event_id' FROM {s}.outbox ORDER BY id"),
            db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
            db.strings(dead),
        )
    };
    let after = state();
    // The add (302) before the removal (303): the CHECK holds, sku-1 = 50.
    assert_eq!(after.0, ["sku-1=50", "sku-2=5"]);
    // The row projection cannot merge v1 into the stored v2: o-300 keeps v2 and its dead letter stays open.
    assert_eq!(after.1, ["o-300 ∅ ∅ SHIPPED v2"]);
    let order: Vec<String> = [301, 304, 300, 302, 303].map(id).to_vec();
    assert_eq!(
        after.2, order,
        "outbox: the original event ids, the replayed ones in offset order"
    );
    assert_eq!(after.3, 5, "one ledger row per event id");
    assert_eq!(
        db.strings("SELECT reason FROM {s}.replaysafe_dead_letters ORDER BY \"offset\""),
        ["superseded", "rejected-by-database", "rejected-by-database"]
    );
    let resolved = db.strings(
        "SELECT \"offset\" || ' ' || (resolved_at IS NOT NULL) FROM {s}.replaysafe_dead_letters ORDER BY \"offset\"",
    );
    assert_eq!(resolved, ["0 false", "2 true", "3 true"]);
    assert_eq!(
        db.strings(
            "SELECT reason || ': ' || detail FROM {s}.replaysafe_dead_letters WHERE \"offset\" = 0"
        )[0]
        .split(" (")
        .next()
        .unwrap(),
        "superseded: superseded: customer_id, total not applied",
    );

    let listed = replaysafe(&[
        "dead-letters",
        "list",
        "--config",
        arg(&p.path),
        "--reason",
        "superseded",
    ]);
    listed.assert_ok();
    assert_eq!(
        listed
            .stdout
            .lines()
            .map(|l| l.split('\t').take(4).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>(),
        [format!("{topic} 0 0 superseded")],
        "{}",
        listed.stderr
    );

    // A second replay changes nothing: the superseded record is a ledger duplicate, still unresolved.
    let second = replay();
    second.assert_ok();
    assert!(
        second.stdout.contains("still unresolved 1"),
        "{}",
        second.stdout
    );
    assert_eq!(state(), after);
    // No checkpoint moved and nothing was committed to Kafka by the replays.
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(5));
    assert_eq!(committed(&group, &topic, 1), vec![Some(5)]);
}

/// C50 with every record its own batch.
#[test]
fn c50_replay_in_offset_order_keeps_a_superseded_dead_letter_open_batch_1() {
    replays_dead_letters_in_offset_order_and_keeps_superseded_ones(1);
}

/// C50 with batches of up to 5000 records.
#[test]
fn c50_replay_in_offset_order_keeps_a_superseded_dead_letter_open_batch_5000() {
    replays_dead_letters_in_offset_order_and_keeps_superseded_ones(5000);
}
