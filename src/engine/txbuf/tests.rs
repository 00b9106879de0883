//! Unit tests of the transaction buffer.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::sink::Pending;

fn plan(ms: u64, bytes: usize) -> TxPlan {
    TxPlan {
        timeout: Duration::from_millis(ms),
        buffer_bytes: bytes,
    }
}

fn item(offset: i64, v: serde_json::Value) -> Item {
    Item {
        offset,
        timestamp_ms: None,
        key: None,
        value: Some(v.to_string().into_bytes()),
        pending: Pending::Filtered("t".into()),
    }
}

fn change(tx: &str, table: &str) -> serde_json::Value {
    json!({"op": "c", "after": {"id": 1}, "source": {"db": "app", "schema": "public", "table": table},
        "transaction": {"id": tx, "total_order": 1, "data_collection_order": 1}})
}

fn end(tx: &str, orders: u64, lines: u64) -> serde_json::Value {
    json!({"status": "END", "id": tx, "event_count": orders + lines, "data_collections": [
        {"data_collection": "public.orders", "event_count": orders},
        {"data_collection": "public.lines", "event_count": lines}]})
}

fn tp(t: &str, p: i32) -> Tp {
    (t.to_string(), p)
}

#[test]
fn meta_reads_changes_begin_end_with_and_without_schemas() {
    assert_eq!(
        meta(Some(change("7:1", "orders").to_string().as_bytes())),
        Meta::Change {
            id: "7".into(),
            collections: vec![
                "public.orders".into(),
                "app.public.orders".into(),
                "app.orders".into()
            ]
        }
    );
    let wrapped =
        json!({"schema": {}, "payload": {"status": "BEGIN", "id": "7:1", "event_count": null}});
    assert_eq!(
        meta(Some(wrapped.to_string().as_bytes())),
        Meta::Begin { id: "7".into() }
    );
    assert_eq!(
        meta(Some(end("7:1", 1, 2).to_string().as_bytes())),
        Meta::End {
            id: "7".into(),
            total: 3,
            counts: vec![("public.orders".into(), 1), ("public.lines".into(), 2)]
        }
    );
    let no_tx = json!({"op": "r", "after": {"id": 1}, "source": {}, "transaction": null});
    assert_eq!(meta(Some(no_tx.to_string().as_bytes())), Meta::Other);
    assert_eq!(meta(Some(b"not json")), Meta::Other);
    assert_eq!(meta(None), Meta::Other);
}

#[test]
fn postgres_ids_are_keyed_by_txid_others_kept_whole() {
    assert_eq!(tx_key("1143726:20165186216"), "1143726");
    assert_eq!(tx_key("1143726"), "1143726");
    assert_eq!(
        tx_key("3E11FA47-71CA-11E1-9E33-C80AA9429562:23"),
        "3E11FA47-71CA-11E1-9E33-C80AA9429562:23"
    );
    assert_eq!(tx_key("00000025:00000d08:0025"), "00000025:00000d08:0025");
    let begin = json!({"status": "BEGIN", "id": "571:100"});
    assert_eq!(
        meta(Some(begin.to_string().as_bytes())),
        Meta::Begin { id: "571".into() }
    );
}

#[test]
fn complete_whatever_the_order_and_bounds_hold_until_settled() {
    let mut t = TxBuf::new(plan(60_000, 1 << 20));
    let (o, l) = (tp("orders", 0), tp("lines", 1));
    // END first, then a line, a non-transaction record, the order, the last line.
    assert!(t.take(&tp("tx", 0), 1, item(0, end("a", 1, 2))).is_none());
    assert!(t.take(&l, 1, item(5, change("a", "lines"))).is_none());
    assert!(t
        .take(&l, 1, item(6, json!({"op": "c", "source": {}})))
        .is_some());
    assert!(t.take(&o, 1, item(3, change("a", "orders"))).is_none());
    assert!(!t.due(Instant::now()));
    assert_eq!(t.bound(&l, 1), Some(5));
    assert_eq!(t.bound(&o, 1), Some(3));
    assert!(t.take(&l, 1, item(7, change("a", "lines"))).is_none());
    assert!(t.due(Instant::now()));
    let ready = t.ready(Instant::now());
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].why, Why::Complete);
    let shape: Vec<(String, Vec<i64>)> = ready[0]
        .parts
        .iter()
        .map(|b| (b.topic.clone(), b.items.iter().map(|i| i.offset).collect()))
        .collect();
    assert_eq!(
        shape,
        vec![
            ("lines".into(), vec![5, 7]),
            ("orders".into(), vec![3]),
            ("tx".into(), vec![0])
        ]
    );
    // Held until the commit settles (the END too), then bounded by what was taken only.
    assert_eq!(t.bound(&l, 1), Some(5));
    assert_eq!(t.bound(&tp("tx", 0), 1), Some(0));
    t.settled(&ready[0].parts);
    assert_eq!(t.bound(&l, 1), Some(8));
    assert_eq!(t.bound(&o, 1), Some(4));
    assert!(!t.holds());
    // Taken over again (another fence) or rewound: what was taken before is no bound any more.
    assert_eq!(t.bound(&o, 2), None);
    t.rewound(&l);
    assert_eq!(t.bound(&l, 1), None);
}

#[test]
fn timeout_and_memory_apply_incomplete_transactions_as_they_are() {
    let mut t = TxBuf::new(plan(50, 1 << 20));
    let start = Instant::now();
    t.take(&tp("lines", 0), 1, item(0, change("a", "lines")));
    assert!(t.ready(start).is_empty());
    let late = start + Duration::from_millis(60);
    assert!(t.due(late));
    let r = t.ready(late);
    assert_eq!((r.len(), r[0].why), (1, Why::Timeout));
    // Its late change and END are applied per record, not held for another timeout.
    assert!(t
        .take(&tp("lines", 0), 1, item(1, change("a", "lines")))
        .is_some());
    assert!(t.take(&tp("tx", 0), 1, item(0, end("a", 0, 2))).is_some());
    // A BEGIN of a transaction without changes of ours is forgotten after the timeout.
    t.take(
        &tp("tx", 0),
        1,
        item(1, json!({"status": "BEGIN", "id": "z"})),
    );
    assert!(t
        .ready(Instant::now() + Duration::from_millis(60))
        .is_empty());
    assert!(t.open.is_empty());

    let size = change("b", "lines").to_string().len();
    let mut t = TxBuf::new(plan(60_000, size * 2));
    t.take(&tp("lines", 0), 1, item(0, change("b", "lines")));
    t.take(&tp("lines", 0), 1, item(1, change("c", "lines")));
    assert!(!t.due(Instant::now()));
    t.take(&tp("lines", 0), 1, item(2, change("c", "lines")));
    assert!(t.due(Instant::now()));
    let r = t.ready(Instant::now());
    assert_eq!(
        r.iter().map(|x| (x.id.as_str(), x.why)).collect::<Vec<_>>(),
        vec![("b", Why::Memory)]
    );
    assert_eq!(t.bytes, size * 2);
    assert_eq!(
        t.bound(&tp("lines", 0), 1),
        Some(0),
        "b's record held until its commit settles"
    );
}

#[test]
fn a_record_read_again_replaces_its_copy() {
    let mut t = TxBuf::new(plan(60_000, 1 << 20));
    let l = tp("lines", 0);
    t.take(&tp("tx", 0), 1, item(0, end("a", 0, 2)));
    t.take(&l, 1, item(4, change("a", "lines")));
    t.take(&l, 1, item(4, change("a", "lines")));
    assert!(!t.due(Instant::now()), "one line twice is not two lines");
    t.take(&l, 1, item(5, change("a", "lines")));
    assert_eq!(t.ready(Instant::now())[0].parts[0].items.len(), 2);
}
