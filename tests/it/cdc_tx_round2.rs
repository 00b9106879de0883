//! Issue 36, source transactions second round (helpers and the commit-time watcher in `cdc_tx.rs`: a deferred
//! constraint trigger on both projection tables records, at every COMMIT, each order whose stored line count
//! differs from its `n_lines` and lines without their order — so `partial` stays empty only if no commit ever
//! showed part of a transaction). Atomic mode under every value encoding (JSON, JSON with schema, Avro and JSON
//! Schema through the registry), a change delivered twice, `--until-caught-up` and the timeout, a transaction
//! read again after a restart, END counting a table the pipeline does not read, a value replaysafe refuses.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cdc_tx::*;
use crate::common::*;
use crate::health::{free_addr, get};
use crate::registry::{frame, register, registry_url};

/// The value encodings atomic mode is tried with.
#[derive(Clone, Copy, Debug)]
enum Enc {
    Json,
    JsonWithSchema,
    Avro,
    JsonSchema,
}

/// The Avro schemas of the test's records: the change envelopes of `public.orders` and `public.lines`,
/// Debezium's transaction metadata value, and the keys.
fn envelope_avro(table: &str, columns: &[&str]) -> String {
    let cols: Vec<Value> = columns
        .iter()
        .map(|c| json!({"name": c, "type": ["null", "long"], "default": null}))
        .collect();
    json!({"type": "record", "name": "Envelope", "namespace": format!("t.public.{table}"), "fields": [
        {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": cols}], "default": null},
        {"name": "after", "type": ["null", "Value"], "default": null},
        {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
            "fields": [
            {"name": "connector", "type": "string"}, {"name": "name", "type": "string"},
            {"name": "ts_ms", "type": "long"}, {"name": "snapshot", "type": ["null", "string"], "default": null},
            {"name": "db", "type": "string"}, {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
            {"name": "txId", "type": ["null", "long"], "default": null},
            {"name": "lsn", "type": ["null", "long"], "default": null},
            {"name": "sequence", "type": ["null", "string"], "default": null}]}},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": null},
        {"name": "transaction", "type": ["null", {"type": "record", "name": "block", "namespace": "event", "fields": [
            {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
            {"name": "data_collection_order", "type": "long"}]}], "default": null}]})
    .to_string()
}

const TX_AVRO: &str = r#"{"type":"record","name":"TransactionMetadataValue","namespace":"io.debezium.connector.common",
 "fields":[{"name":"status","type":"string"},{"name":"id","type":"string"},{"name":"ts_ms","type":"long"},
 {"name":"event_count","type":["null","long"],"default":null},
 {"name":"data_collections","type":["null",{"type":"array","items":{"type":"record","name":"Collection",
   "fields":[{"name":"data_collection","type":"string"},{"name":"event_count","type":"long"}]}}],"default":null}]}"#;
const KEY_AVRO: &str =
    r#"{"type":"record","name":"Key","namespace":"t","fields":[{"name":"id","type":"long"}]}"#;
const TX_KEY_AVRO: &str =
    r#"{"type":"record","name":"TxKey","namespace":"t","fields":[{"name":"id","type":"string"}]}"#;

/// What a record of one kind (a table's change, the transaction topic's event, a key) becomes: Avro (schema
/// and registry id), a JSON Schema frame (registry id), or the Connect schema of "JSON with schema".
struct Codec {
    avro: Option<(apache_avro::Schema, u32)>,
    json_schema: Option<u32>,
    connect: Option<Value>,
}

impl Codec {
    fn new(enc: Enc, subject: &str, avro: &str) -> Codec {
        let parsed: Value = serde_json::from_str(avro).unwrap();
        match enc {
            Enc::Json => Codec {
                avro: None,
                json_schema: None,
                connect: None,
            },
            Enc::JsonWithSchema => Codec {
                avro: None,
                json_schema: None,
                connect: Some(replaysafe::decode::avro::connect_schema(
                    &parsed,
                    "",
                    &mut HashMap::new(),
                )),
            },
            Enc::Avro => Codec {
                avro: Some((
                    apache_avro::Schema::parse_str(avro).unwrap(),
                    register(subject, "AVRO", avro),
                )),
                json_schema: None,
                connect: None,
            },
            Enc::JsonSchema => Codec {
                avro: None,
                json_schema: Some(register(
                    subject,
                    "JSON",
                    r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}"#,
                )),
                connect: None,
            },
        }
    }

    /// The bytes of JSON `v` in this codec.
    fn encode(&self, v: &[u8]) -> Vec<u8> {
        let v: Value = serde_json::from_slice(v).unwrap();
        if let Some((schema, id)) = &self.avro {
            let a = apache_avro::types::Value::from(v).resolve(schema).unwrap();
            return frame(*id, &apache_avro::to_avro_datum(schema, a).unwrap());
        }
        if let Some(id) = self.json_schema {
            return frame(id, v.to_string().as_bytes());
        }
        match &self.connect {
            Some(c) => json!({"schema": c, "payload": v}).to_string().into_bytes(),
            None => v.to_string().into_bytes(),
        }
    }
}

/// The codecs of one test's records.
struct Codecs {
    enc: Enc,
    orders: Codec,
    lines: Codec,
    tx: Codec,
    key: Codec,
    tx_key: Codec,
}

impl Codecs {
    fn new(enc: Enc, base: &str) -> Codecs {
        let s = |what: &str| format!("{base}.{what}-value");
        Codecs {
            enc,
            orders: Codec::new(
                enc,
                &s("orders"),
                &envelope_avro("orders", &["id", "n_lines"]),
            ),
            lines: Codec::new(
                enc,
                &s("lines"),
                &envelope_avro("lines", &["id", "order_id"]),
            ),
            tx: Codec::new(enc, &s("tx"), TX_AVRO),
            key: Codec::new(enc, &format!("{base}-key"), KEY_AVRO),
            tx_key: Codec::new(enc, &format!("{base}.tx-key"), TX_KEY_AVRO),
        }
    }

    /// `r` (a record of `what`: "orders", "lines" or "tx") encoded.
    fn rec(&self, what: &str, r: &Rec) -> Rec {
        let (value, key) = match what {
            "orders" => (&self.orders, &self.key),
            "lines" => (&self.lines, &self.key),
            _ => (&self.tx, &self.tx_key),
        };
        let mut r = r.clone();
        r.value = r.value.as_deref().map(|v| value.encode(v));
        // Keys: plain JSON for the JSON encodings (Debezium's key converter), framed with the registry ones.
        if matches!(self.enc, Enc::Avro | Enc::JsonSchema) {
            r.key = r.key.as_deref().map(|k| key.encode(k));
        }
        r
    }

    /// `[source]`'s encoding keys.
    fn source(&self) -> String {
        match self.enc {
            Enc::Json | Enc::JsonWithSchema => String::new(),
            Enc::Avro => format!(
                "encoding = \"avro\"\nschema-registry = {{ url = \"{}\" }}",
                registry_url()
            ),
            Enc::JsonSchema => format!(
                "encoding = \"json-schema\"\nschema-registry = {{ url = \"{}\" }}",
                registry_url()
            ),
        }
    }
}

/// Produces `recs` of `what` to `<base>.<what>`, encoded.
fn send(c: &Codecs, base: &str, what: &str, recs: &[Rec]) {
    let recs: Vec<Rec> = recs.iter().map(|r| c.rec(what, r)).collect();
    produce(&format!("{base}.{what}"), &recs);
}

fn partial(db: &Db) -> i64 {
    db.i64("SELECT count(*) FROM {s}.partial")
}

/// Item 1: `"atomic"` holds transactions under every value encoding the project reads. Transactions 1 and 2
/// complete (lines produced before their orders, so a per-record apply would show lines without their order),
/// transaction 3 open (its order and one line, no END): no commit ever shows a partial transaction, the open one
/// is counted `buffered` and its partitions' checkpoints stay before its records. Batches of 1 and 5000 records.
#[test]
fn atomic_mode_holds_transactions_under_every_value_encoding() {
    let encs = [Enc::Json, Enc::JsonWithSchema, Enc::Avro, Enc::JsonSchema];
    for (enc, batch) in encs.iter().flat_map(|e| [(*e, 1), (*e, 5000)]) {
        let base = topics();
        let c = Codecs::new(enc, &base);
        let group = unique("cdctx-enc");
        let (db, p) = staged_with(
            &format!("{ATOMIC}\ntransaction-timeout-ms = 600000\n{}", c.source()),
            &base,
            &group,
            batch,
        );
        let (t1, t2, t3) = (tx(1, 3), tx(2, 2), tx(3, 2));
        let ls: Vec<Rec> = [
            t1.lines.clone(),
            t2.lines.clone(),
            vec![t3.lines[0].clone()],
        ]
        .concat()
        .into_iter()
        .rev()
        .collect();
        send(&c, &base, "lines", &ls);
        send(&c, &base, "orders", &[t1.order, t2.order, t3.order]);
        send(
            &c,
            &base,
            "tx",
            &[t1.begin, t1.end, t2.begin, t2.end, t3.begin],
        );
        let out = run_caught_up(&p.path);
        assert_eq!(
            partial(&db),
            0,
            "{enc:?} batch {batch}: no commit shows a partial transaction"
        );
        assert!(
            db.i64("SELECT count(*) FROM {s}.checks") > 0,
            "{enc:?} batch {batch}: the watcher ran"
        );
        let (o, l) = expected(&[(1, 3), (2, 2)]);
        assert_eq!(orders(&db), o, "{enc:?} batch {batch}: {}", out.stderr);
        assert_eq!(lines(&db), l, "{enc:?} batch {batch}");
        let t = out.tally();
        assert_eq!(
            (
                t.consumed,
                t.landed,
                t.filtered,
                t.quarantined,
                out.buffered()
            ),
            (14, 7, 5, 0, 2),
            "{enc:?} batch {batch}: {:?}",
            out.tally_line()
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
            7,
            "{enc:?} batch {batch}"
        );
        // Order 3 at orders/1 offset 1 (after order 1), line 30 at lines/0 offset 0 (lines produced reversed).
        assert_eq!(
            db.checkpoint(&group, &format!("{base}.orders"), 1)
                .unwrap_or(0),
            1,
            "{enc:?} batch {batch}"
        );
        assert_eq!(
            db.checkpoint(&group, &format!("{base}.lines"), 0)
                .unwrap_or(0),
            0,
            "{enc:?} batch {batch}"
        );
        assert_eq!(
            db.checkpoint(&group, &format!("{base}.orders"), 0),
            Some(1),
            "{enc:?} batch {batch}"
        );
        assert_eq!(
            db.checkpoint(&group, &format!("{base}.tx"), 0),
            Some(5),
            "{enc:?} batch {batch}"
        );
    }
}

/// Item 2: line 10 is delivered twice (a connector restart re-emits it) and line 12 has not come yet. END's
/// count of three lines is not met by two distinct lines: nothing of transaction 1 is applied, its records are
/// `buffered`. Once line 12 comes, the transaction is applied whole, each change claimed once (the copy a
/// `duplicate`).
#[test]
fn a_change_delivered_twice_counts_once_toward_end() {
    let base = topics();
    let group = unique("cdctx-twice");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 600000"),
        &base,
        &group,
    );
    let t = tx(1, 3);
    // Lines 10 and 12 on lines/0, 11 on lines/1: line 10, its copy, line 11.
    produce(
        &format!("{base}.lines"),
        &[t.lines[0].clone(), t.lines[0].clone(), t.lines[1].clone()],
    );
    produce(&format!("{base}.orders"), std::slice::from_ref(&t.order));
    produce(&format!("{base}.tx"), &[t.begin.clone(), t.end.clone()]);
    let out = run_caught_up(&p.path);
    assert_eq!(orders(&db), vec![], "{}", out.stderr);
    assert_eq!(lines(&db), vec![]);
    assert_eq!(partial(&db), 0);
    let tl = out.tally();
    assert_eq!(
        (tl.consumed, tl.landed, tl.filtered, out.buffered()),
        (6, 0, 1, 5),
        "{:?}",
        out.tally_line()
    );
    assert_eq!(
        db.checkpoint(&group, &format!("{base}.lines"), 0)
            .unwrap_or(0),
        0
    );
    assert_eq!(
        db.checkpoint(&group, &format!("{base}.tx"), 0).unwrap_or(0),
        1,
        "before the END"
    );

    produce(&format!("{base}.lines"), &[t.lines[2].clone()]);
    let out = run_caught_up(&p.path);
    assert_eq!(partial(&db), 0, "no commit shows a partial transaction");
    let (o, l) = expected(&[(1, 3)]);
    assert_eq!(orders(&db), o);
    assert_eq!(lines(&db), l);
    let tl = out.tally();
    assert_eq!(
        (
            tl.consumed,
            tl.landed,
            tl.duplicate,
            tl.filtered,
            out.buffered()
        ),
        (6, 4, 1, 1, 0),
        "BEGIN is not read again: {:?}",
        out.tally_line()
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        4,
        "each change claimed once"
    );
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 0), Some(3));
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 1), Some(1));
    assert_eq!(db.checkpoint(&group, &format!("{base}.orders"), 1), Some(1));
    assert_eq!(db.checkpoint(&group, &format!("{base}.tx"), 0), Some(2));
    assert_eq!(
        committed(&group, &format!("{base}.lines"), 2),
        vec![Some(3), Some(1)]
    );
}

/// Item 3: under `--until-caught-up` a transaction whose END never comes is applied as it is once it began
/// (its records' timestamps) `transaction-timeout-ms` ago — here 60 s before the run, with a 5 s timeout — so
/// the checkpoints pass it; a transaction that began just now stays `buffered`, its checkpoints before it.
#[test]
fn until_caught_up_applies_a_transaction_older_than_the_timeout() {
    let base = topics();
    let group = unique("cdctx-age");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 5000"),
        &base,
        &group,
    );
    let now = chrono::Utc::now().timestamp_millis();
    let at = |mut r: Rec, ts: i64| {
        r.timestamp_ms = Some(ts);
        r
    };
    let (old, young) = (tx(1, 2), tx(2, 1));
    // Old: order 1 on orders/1, lines 10 (lines/0) and 11 (lines/1, missing); young: order 2 on orders/0, line
    // 20 on lines/0 after line 10.
    produce(
        &format!("{base}.lines"),
        &[
            at(old.lines[0].clone(), now - 60_000),
            at(young.lines[0].clone(), now),
        ],
    );
    produce(
        &format!("{base}.orders"),
        &[
            at(old.order.clone(), now - 60_000),
            at(young.order.clone(), now),
        ],
    );
    produce(
        &format!("{base}.tx"),
        &[
            at(old.begin.clone(), now - 60_000),
            at(young.begin.clone(), now),
        ],
    );
    let out = run_caught_up(&p.path);
    assert_eq!(
        db.column::<i64>("SELECT DISTINCT order_id FROM {s}.partial"),
        vec![1],
        "only the old transaction, applied as it is, shows partial (order 1 without line 11)"
    );
    assert_eq!(orders(&db), vec![(1, 2)], "{}", out.stderr);
    assert_eq!(lines(&db), vec![(10, 1)]);
    assert_eq!(
        out.stderr.matches("applied as it is (incomplete)").count(),
        1,
        "{}",
        out.stderr
    );
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.filtered, out.buffered()),
        (6, 2, 2, 2),
        "{:?}",
        out.tally_line()
    );
    assert_eq!(db.checkpoint(&group, &format!("{base}.orders"), 1), Some(1));
    assert_eq!(
        db.checkpoint(&group, &format!("{base}.lines"), 0),
        Some(1),
        "before line 20"
    );
    assert_eq!(
        db.checkpoint(&group, &format!("{base}.orders"), 0)
            .unwrap_or(0),
        0,
        "before order 2"
    );
    assert_eq!(committed(&group, &format!("{base}.lines"), 2)[0], Some(1));
}

/// Item 4: transaction 2 (complete) was applied while transaction 1 stayed open before it on the same
/// partitions, so a restart reads transaction 2's changes again but not its END (the transaction topic's
/// checkpoint passed it). Its changes are found already claimed: it is applied at once as duplicates — no
/// timeout, no `incomplete` alarm — while transaction 1 completes when its END comes.
#[test]
fn a_transaction_read_again_after_a_restart_needs_no_end() {
    let base = topics();
    let group = unique("cdctx-again");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 600000"),
        &base,
        &group,
    );
    let (a, b) = (tx(1, 3), tx(3, 2));
    // Both orders on orders/1 (1 then 3); lines/0: 10 then 30, lines/1: 11 then 31 — b behind a everywhere;
    // a's line 12 and END wait.
    produce(
        &format!("{base}.lines"),
        &[
            a.lines[0].clone(),
            a.lines[1].clone(),
            b.lines[0].clone(),
            b.lines[1].clone(),
        ],
    );
    produce(
        &format!("{base}.orders"),
        &[a.order.clone(), b.order.clone()],
    );
    produce(
        &format!("{base}.tx"),
        &[a.begin.clone(), b.begin.clone(), b.end.clone()],
    );
    let out = run_caught_up(&p.path);
    assert_eq!(orders(&db), vec![(3, 2)], "{}", out.stderr);
    assert_eq!(out.buffered(), 3, "{:?}", out.tally_line());
    assert_eq!(
        db.checkpoint(&group, &format!("{base}.tx"), 0),
        Some(3),
        "past b's END"
    );
    for part in 0..2 {
        assert_eq!(
            db.checkpoint(&group, &format!("{base}.lines"), part)
                .unwrap_or(0),
            0
        );
    }
    assert_eq!(
        db.checkpoint(&group, &format!("{base}.orders"), 1)
            .unwrap_or(0),
        0
    );

    produce(&format!("{base}.lines"), &[a.lines[2].clone()]);
    produce(&format!("{base}.tx"), std::slice::from_ref(&a.end));
    let addr = free_addr();
    let mut w = spawn_run(&p, &["--metrics-addr", &addr], "w");
    wait_until(
        Duration::from_secs(60),
        "both transactions applied, checkpoints at the end",
        || {
            db.checkpoint(&group, &format!("{base}.lines"), 0) == Some(3)
                && db.checkpoint(&group, &format!("{base}.lines"), 1) == Some(2)
                && db.checkpoint(&group, &format!("{base}.orders"), 1) == Some(2)
                && db.checkpoint(&group, &format!("{base}.tx"), 0) == Some(4)
        },
    );
    let m = get(&addr, "/metrics").expect("metrics").1;
    assert_eq!(
        sample(&m, "replaysafe_transactions_applied_total", &[]),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "replaysafe_records_total", &[("outcome", "duplicate")]),
        Some(3.0),
        "b's order and lines: {m}"
    );
    for reason in ["timeout", "memory"] {
        let n = sample(
            &m,
            "replaysafe_transactions_incomplete_total",
            &[("reason", reason)],
        );
        assert!(n.unwrap_or(0.0) == 0.0, "{m}");
    }
    assert_eq!(terminate(&mut w), Some(0));
    let err = std::fs::read_to_string(p.dir.path().join("w.err")).unwrap();
    assert!(!err.contains("applied as it is (incomplete)"), "{err}");
    assert!(err.contains("already claimed"), "{err}");
    let out = std::fs::read_to_string(p.dir.path().join("w.out")).unwrap();
    assert!(
        out.contains("consumed 8 = landed 4 + duplicate 3 + filtered 1 + quarantined 0"),
        "{out}"
    );
    assert_eq!(partial(&db), 0, "no commit shows a partial transaction");
    let (o, l) = expected(&[(1, 3), (3, 2)]);
    assert_eq!(orders(&db), o);
    assert_eq!(lines(&db), l);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 7);
}

/// Item 5: the connector captures an audit table the pipeline does not read; END counts it. The transaction is
/// complete with the order and lines — applied at once, not after the timeout, no warning.
#[test]
fn end_counting_a_table_the_pipeline_does_not_read_is_met() {
    let base = topics();
    let group = unique("cdctx-subset");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 600000"),
        &base,
        &group,
    );
    let t = tx(1, 2);
    let id = "1:1001";
    let end = raw(
        0,
        Some(json!({"id": id})),
        json!({"status": "END", "id": id, "ts_ms": 2, "event_count": 5, "data_collections": [
            {"data_collection": "public.orders", "event_count": 1},
            {"data_collection": "public.audit", "event_count": 2},
            {"data_collection": "public.lines", "event_count": 2}]}),
    );
    produce(&format!("{base}.lines"), &t.lines);
    produce(&format!("{base}.orders"), std::slice::from_ref(&t.order));
    produce(&format!("{base}.tx"), &[t.begin.clone(), end]);
    let out = run_caught_up(&p.path);
    assert_eq!(partial(&db), 0);
    let (o, l) = expected(&[(1, 2)]);
    assert_eq!(orders(&db), o, "{}", out.stderr);
    assert_eq!(lines(&db), l);
    assert!(
        !out.stderr.contains("applied as it is (incomplete)"),
        "{}",
        out.stderr
    );
    let tl = out.tally();
    assert_eq!(
        (tl.consumed, tl.landed, tl.filtered, out.buffered()),
        (5, 3, 2, 0),
        "{:?}",
        out.tally_line()
    );
    assert_eq!(db.checkpoint(&group, &format!("{base}.tx"), 0), Some(2));
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 0), Some(1));
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 1), Some(1));
}

/// Item 6: line 21 carries an `order_id` its bigint column refuses (replaysafe's cast, not a constraint). Per
/// record it is quarantined `invalid-field`; in atomic mode its whole transaction is quarantined under the same
/// reason (not `rejected-by-database`), the detail naming the transaction and the record.
#[test]
fn a_value_replaysafe_refuses_quarantines_the_transaction_under_its_own_reason() {
    let base = topics();
    let bad = |mut t: Tx| {
        let mut v: Value = serde_json::from_slice(t.lines[1].value.as_deref().unwrap()).unwrap();
        v["after"]["order_id"] = json!("twenty");
        t.lines[1].value = Some(v.to_string().into_bytes());
        t
    };
    let txs = vec![tx(1, 2), bad(tx(2, 2))];
    produce_all(&base, &txs);
    let reasons = |db: &Db| -> Vec<(String, String)> {
        db.query(
            "SELECT reason, detail FROM {s}.replaysafe_dead_letters ORDER BY topic, partition, \"offset\"",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    let (db0, p0) = staged("", &base, &unique("cdctx-refuse-none"));
    run_caught_up(&p0.path);
    let per_record = reasons(&db0);
    assert_eq!(per_record.len(), 1, "{per_record:?}");
    assert_eq!(per_record[0].0, "invalid-field", "{per_record:?}");

    let group = unique("cdctx-refuse");
    let (db, p) = staged(ATOMIC, &base, &group);
    let out = run_caught_up(&p.path);
    assert_eq!(partial(&db), 0);
    let (o, l) = expected(&[(1, 2)]);
    assert_eq!(orders(&db), o, "{}", out.stderr);
    assert_eq!(lines(&db), l);
    let dead = reasons(&db);
    assert_eq!(dead.len(), 3, "order 2 and its two lines: {dead:?}");
    for (reason, detail) in &dead {
        assert_eq!(reason, "invalid-field", "{dead:?}");
        assert!(
            detail.contains("source transaction 2 quarantined whole (3 records")
                && detail.contains(&format!("{base}.lines/1 offset")),
            "{detail}"
        );
    }
    let t = out.tally();
    assert_eq!(
        (t.landed, t.quarantined, t.filtered),
        (3, 3, 4),
        "{:?}",
        out.tally_line()
    );
    assert!(out.stdout.contains("quarantined 3"), "{}", out.stdout);
}

/// Item 7: while the schema registry is retried, `/readyz` is not ready and names it; the final error gives
/// `--connect-timeout`'s value.
#[test]
fn readyz_is_not_ready_while_the_registry_is_retried() {
    let base = topics();
    let group = unique("cdctx-regdown");
    let db = Db::fresh("cdctx");
    let text = PIPELINE.replace(
        "TXMODE",
        "encoding = \"avro\"\nschema-registry = { url = \"http://127.0.0.1:1/apis/ccompat/v7\" }",
    );
    let p = pipeline(&text, &base, &group, &db.schema);
    replaysafe(&["init", "--config", p.path.to_str().unwrap()]).assert_ok();
    produce(
        &format!("{base}.orders"),
        &[Rec {
            partition: 0,
            key: Some(frame(1, b"\x02")),
            value: Some(frame(1, b"\x02a")),
            timestamp_ms: None,
        }],
    );
    let addr = free_addr();
    let mut w = spawn_run(
        &p,
        &["--metrics-addr", &addr, "--connect-timeout", "8"],
        "w",
    );
    wait_until(
        Duration::from_secs(60),
        "/readyz names the registry",
        || {
            get(&addr, "/readyz").is_some_and(|(code, body)| {
                code == 503 && body.contains("schema registry unavailable, retrying")
            })
        },
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(s) = w.try_wait().unwrap() {
            break s.code();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run did not give up"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code, Some(1));
    let err = std::fs::read_to_string(p.dir.path().join("w.err")).unwrap();
    assert!(err.contains("(--connect-timeout 8)"), "{err}");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    assert_eq!(
        db.checkpoint(&group, &format!("{base}.orders"), 0)
            .unwrap_or(0),
        0
    );
}

/// Item 3 for `backfill`: at its stop, a transaction whose END lies beyond the window and that began longer than
/// `transaction-timeout-ms` ago is applied as it is (warning), a complete one whole — nothing held forever.
#[test]
fn backfill_applies_at_its_stop_a_transaction_older_than_the_timeout() {
    let base = topics();
    let group = unique("cdctx-bf");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 5000"),
        &base,
        &group,
    );
    let from = chrono::Utc::now() - chrono::Duration::seconds(120);
    let ts = from.timestamp_millis() + 1_000;
    let at = |mut r: Rec| {
        r.timestamp_ms = Some(ts);
        r
    };
    let (done, open) = (tx(1, 2), tx(2, 2));
    let ls: Vec<Rec> = [done.lines.clone(), vec![open.lines[0].clone()]].concat();
    produce(
        &format!("{base}.lines"),
        &ls.into_iter().map(at).collect::<Vec<_>>(),
    );
    produce(
        &format!("{base}.orders"),
        &[at(done.order.clone()), at(open.order.clone())],
    );
    produce(
        &format!("{base}.tx"),
        &[
            at(done.begin.clone()),
            at(done.end.clone()),
            at(open.begin.clone()),
        ],
    );
    let to = chrono::Utc::now().to_rfc3339();
    let out = backfill(
        &p,
        &from.to_rfc3339(),
        ("--to", &to),
        &unique("cdctx-bfg"),
        &[],
    );
    out.assert_ok();
    assert_eq!(orders(&db), vec![(1, 2), (2, 2)], "{}", out.stderr);
    assert_eq!(lines(&db), vec![(10, 1), (11, 1), (20, 2)]);
    assert_eq!(
        db.column::<i64>("SELECT DISTINCT order_id FROM {s}.partial"),
        vec![2],
        "only transaction 2, applied as it is, shows partial"
    );
    assert_eq!(
        out.stderr.matches("applied as it is (incomplete)").count(),
        1,
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 5);
    let report: Value = serde_json::from_str(&out.stdout).expect("the report");
    assert_eq!(
        report["accounting"],
        "consumed 8 = landed 5 + duplicate 0 + filtered 3 + quarantined 0 [filtered cdc-transaction-metadata: 3]",
        "nothing buffered at the stop: {report}"
    );
}
