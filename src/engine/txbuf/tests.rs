//! Unit tests of the transaction buffer.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::model::Pending;

/// A Debezium pipeline whose row projections read `public.orders` and `public.lines`.
fn pipeline() -> Arc<Pipeline> {
    let text = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[source]\nformat = \"debezium\"\n\
        transactions = \"atomic\"\n[[projection]]\nkind = \"row\"\ntable = \"orders\"\n\
        source-table = \"public.orders\"\nkey = [\"id\"]\ncolumns = { id = \"bigint\" }\n\
        [[projection]]\nkind = \"row\"\ntable = \"lines\"\nkey = [\"id\"]\ncolumns = { id = \"bigint\" }\n";
    Arc::new(crate::config::parse("p.toml", text).expect("pipeline"))
}

fn buf(ms: u64, bytes: usize) -> TxBuf {
    TxBuf::new(plan(ms, bytes), pipeline())
}

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
    change_n(tx, table, 1)
}

/// A change of `tx`, its `total_order` `n`.
fn change_n(tx: &str, table: &str, n: u64) -> serde_json::Value {
    json!({"op": "c", "after": {"id": 1}, "source": {"db": "app", "schema": "public", "table": table},
        "transaction": {"id": tx, "total_order": n, "data_collection_order": n}})
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
            ],
            order: Some(1),
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
    let mut t = buf(60_000, 1 << 20);
    let (o, l) = (tp("orders", 0), tp("lines", 1));
    // END first, then a line, a non-transaction record, the order, the last line.
    assert!(t.take(&tp("tx", 0), 1, item(0, end("a", 1, 2))).is_none());
    assert!(t.take(&l, 1, item(5, change_n("a", "lines", 2))).is_none());
    assert!(t
        .take(&l, 1, item(6, json!({"op": "c", "source": {}})))
        .is_some());
    assert!(t.take(&o, 1, item(3, change_n("a", "orders", 1))).is_none());
    assert!(!t.due(Instant::now()));
    assert_eq!(t.bound(&l, 1), Some(5));
    assert_eq!(t.bound(&o, 1), Some(3));
    // Line 2 delivered again (a connector restart re-emits it): the same change, not the last line.
    assert!(t.take(&l, 1, item(9, change_n("a", "lines", 2))).is_none());
    assert!(!t.due(Instant::now()), "a change twice is one change");
    assert!(t.take(&l, 1, item(7, change_n("a", "lines", 3))).is_none());
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
            ("lines".into(), vec![5, 7, 9]),
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
    let mut t = buf(50, 1 << 20);
    let start = Instant::now();
    t.take(&tp("lines", 0), 1, item(0, change("a", "lines")));
    assert!(t.ready(start).is_empty());
    let late = start + Duration::from_millis(60);
    assert!(t.due(late));
    // Checked against the ledger first (once): a copy, the transaction stays open.
    let r = t.ready(late);
    assert_eq!((r.len(), r[0].why), (1, Why::Check));
    t.checked(&r[0].parts, &Ok(Applied::Skipped));
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
    let mut t = buf(60_000, size * 2);
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
    let mut t = buf(60_000, 1 << 20);
    let l = tp("lines", 0);
    t.take(&tp("tx", 0), 1, item(0, end("a", 0, 2)));
    t.take(&l, 1, item(4, change_n("a", "lines", 1)));
    t.take(&l, 1, item(4, change_n("a", "lines", 1)));
    assert!(!t.due(Instant::now()), "one line twice is not two lines");
    t.take(&l, 1, item(5, change_n("a", "lines", 2)));
    assert_eq!(t.ready(Instant::now())[0].parts[0].items.len(), 2);
}

#[test]
fn counts_of_collections_the_pipeline_does_not_read_are_not_waited_for() {
    let mut t = buf(60_000, 1 << 20);
    // END counts an audit table no projection reads and no change of which comes here.
    let e = json!({"status": "END", "id": "a", "event_count": 3, "data_collections": [
        {"data_collection": "public.orders", "event_count": 1},
        {"data_collection": "public.audit", "event_count": 2}]});
    t.take(&tp("tx", 0), 1, item(0, e));
    assert!(!t.due(Instant::now()));
    t.take(&tp("orders", 0), 1, item(0, change_n("a", "orders", 1)));
    let r = t.ready(Instant::now());
    assert_eq!((r.len(), r[0].why), (1, Why::Complete));
    // Once a change of a collection was read, its count is waited for.
    t.take(&tp("audit", 0), 1, item(0, change_n("b", "audit", 1)));
    let e = json!({"status": "END", "id": "c", "event_count": 2, "data_collections": [
        {"data_collection": "public.orders", "event_count": 1},
        {"data_collection": "public.audit", "event_count": 1}]});
    t.take(&tp("tx", 0), 1, item(1, e));
    t.take(&tp("orders", 0), 1, item(1, change_n("c", "orders", 1)));
    assert!(!t.ready(Instant::now()).iter().any(|r| r.id == "c"));
}

#[test]
fn at_the_end_of_the_input_old_transactions_are_checked_then_applied() {
    let mut t = buf(60_000, 1 << 20);
    let mut old = item(0, change_n("a", "lines", 1));
    old.timestamp_ms = Some(1_000);
    t.take(&tp("lines", 0), 1, old);
    let mut young = item(1, change_n("b", "lines", 1));
    young.timestamp_ms = Some(100_000);
    t.take(&tp("lines", 0), 1, young);
    assert!(!t.due(Instant::now()));
    assert_eq!(t.at_end(70_000), 1, "a began 69 s before, b not yet");
    let r = t.ready(Instant::now());
    assert!(r.iter().all(|x| x.why == Why::Check) && r.len() == 2);
    let (a, b): (Vec<&Ready>, Vec<&Ready>) = r.iter().partition(|x| x.id == "a");
    t.checked(&a[0].parts, &Ok(Applied::Committed(vec![Outcome::Landed])));
    t.checked(&b[0].parts, &Ok(Applied::Committed(vec![Outcome::Landed])));
    let r = t.ready(Instant::now());
    assert_eq!(
        r.iter().map(|x| (x.id.as_str(), x.why)).collect::<Vec<_>>(),
        vec![("a", Why::Timeout)]
    );
}
