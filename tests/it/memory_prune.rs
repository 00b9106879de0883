//! Issue 34 (break-it, b2): a row projection's memory of versions and `ledger prune`. Two copies of one state
//! at one version (distinct event ids, days D-7 and D-1) and a newer version: the memory row carried the first
//! claim's day only, so when the copy of D-7 came first a prune of D-7 forgot the state although the ledger still
//! held the D-1 copy — a third copy (day D) was then `stale` and counted, while in the other order it was a
//! `duplicate`. The memory must last as long as the latest claim of the state. (The counter groups by status
//! only: copies on other days give it the same values, so a remembered copy is a duplicate for it.)

use crate::common::{
    arg, new_topic, pipeline, produce_singly, replaysafe, unique, Db, Rec, HEADER,
};

fn text(horizon: u32) -> String {
    format!(
        r#"{HEADER}[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
order_id = {{ path = "/order_id", type = "text" }}
status = {{ path = "/status", type = "text" }}
version = {{ path = "/version", type = "bigint" }}
day = {{ path = "/occurred_at", type = "date", time-zone = "UTC" }}
[identity]
key = ["event_id"]
partition-by = "day"
[ledger]
horizon-days = {horizon}
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
"#
    )
}

/// A `kcat -C -J` file of `events` (n, status, version, days before today) on partition 0 from `first`.
fn dump(
    dir: &std::path::Path,
    name: &str,
    topic: &str,
    first: i64,
    events: &[(u64, &str, i64, i64)],
) -> std::path::PathBuf {
    let today = chrono::Utc::now().date_naive();
    let lines: Vec<String> = events
        .iter()
        .enumerate()
        .map(|(i, &(n, status, version, ago))| {
            let id = uuid::Uuid::from_u64_pair(0xb2d, n).to_string();
            let day = today - chrono::Duration::days(ago);
            let payload = serde_json::json!({
                "event_id": id, "order_id": "o1", "status": status, "version": version,
                "occurred_at": format!("{day}T10:00:00Z"),
            })
            .to_string();
            serde_json::json!({
                "topic": topic, "partition": 0, "offset": first + i as i64, "tstype": "create",
                "ts": 1_795_000_000_000i64 + i as i64, "key": id, "payload": payload,
            })
            .to_string()
        })
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// Placed events counted (any day) after: `first` applied, a prune to a 5-day horizon, then a third copy.
fn placed_after_prune(first: &[(u64, &str, i64, i64)]) -> i64 {
    let db = Db::fresh("memprune");
    // The live topic holds four records, so the dumps' offsets are below its end (`load` checks).
    let topic = new_topic("memprune", 1);
    produce_singly(&topic, &vec![Rec::json(0, "k", "{}", 1_795_000_000_000); 4]);
    let group = unique("g");
    let long = pipeline(&text(10), &topic, &group, &db.schema);
    let short = pipeline(&text(5), &topic, &group, &db.schema);
    let a = dump(long.dir.path(), "a.jsonl", &topic, 0, first);
    replaysafe(&["load", "--config", arg(&long.path), arg(&a)]).assert_ok();
    replaysafe(&["ledger", "prune", "--config", arg(&short.path)]).assert_ok();
    let b = dump(
        long.dir.path(),
        "b.jsonl",
        &topic,
        3,
        &[(4, "placed", 1, 0)],
    );
    replaysafe(&["load", "--config", arg(&short.path), arg(&b)]).assert_ok();
    db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.status_counts WHERE status = 'placed'")
}

#[test]
fn a_pruned_first_copy_does_not_make_a_later_copy_count() {
    let old = (1, "placed", 1, 7);
    let recent = (2, "placed", 1, 1);
    let paid = (3, "paid", 2, 1);
    let old_first = placed_after_prune(&[old, recent, paid]);
    let recent_first = placed_after_prune(&[recent, old, paid]);
    assert_eq!(
        old_first, recent_first,
        "the copy of today is a duplicate in both orders: the D-1 copy's claim is still in the ledger"
    );
    assert_eq!(old_first, 1);
}
