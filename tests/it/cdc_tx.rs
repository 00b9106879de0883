//! Issue 14 part 2: Debezium source transactions (`provide.transaction.metadata=true`) applied atomically with
//! `[source] transactions = "atomic"`. An order and its lines reach us over two topics of two partitions each,
//! with BEGIN/END on a third; a deferred constraint trigger on both projection tables records, at every COMMIT,
//! each order whose stored line count differs from its `n_lines` (and lines without their order): with
//! `"atomic"` no commit ever shows a partial transaction, with `"none"` (today's per-record default) some do.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;
use crate::health::{free_addr, get};

pub(crate) const PIPELINE: &str = r#"[kafka]
group-id = "{group}"
topics = ["{topic}.orders", "{topic}.lines", "{topic}.tx"]
start = "earliest"
[postgres]
schema = "{schema}"
[source]
format = "debezium"
TXMODE
[batch]
max-records = 1
linger-ms = 10
[[projection]]
kind = "row"
table = "orders"
source-table = "public.orders"
key = ["id"]
columns = { id = "bigint", n_lines = "bigint" }
[[projection]]
kind = "row"
table = "lines"
source-table = "public.lines"
key = ["id"]
columns = { id = "bigint", order_id = "bigint" }
"#;

/// Topics `<base>.orders` (2 partitions), `<base>.lines` (2), `<base>.tx` (1).
pub(crate) fn topics() -> String {
    let base = unique("cdctx");
    create_topic(&format!("{base}.orders"), 2, &[]);
    create_topic(&format!("{base}.lines"), 2, &[]);
    create_topic(&format!("{base}.tx"), 1, &[]);
    base
}

/// `replaysafe init`, then the deferred constraint triggers writing every commit's partial orders into
/// `partial (order_id, want, have)` and counting checks in `checks`.
pub(crate) fn staged(mode: &str, base: &str, group: &str) -> (Db, Pipeline) {
    staged_with(mode, base, group, 1)
}

/// [`staged`] with `batch.max-records = max_records`.
pub(crate) fn staged_with(
    mode: &str,
    base: &str,
    group: &str,
    max_records: usize,
) -> (Db, Pipeline) {
    let db = Db::fresh("cdctx");
    let text = PIPELINE.replace("TXMODE", mode).replace(
        "max-records = 1\n",
        &format!("max-records = {max_records}\n"),
    );
    let p = pipeline(&text, base, group, &db.schema);
    replaysafe(&["init", "--config", p.path.to_str().unwrap()]).assert_ok();
    db.execute(
        "CREATE TABLE {s}.partial (order_id bigint, want bigint, have bigint);
         CREATE TABLE {s}.checks (n bigint);
         CREATE FUNCTION {s}.check_tx() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO {s}.checks VALUES (1);
           INSERT INTO {s}.partial
             SELECT o.id, o.n_lines, (SELECT count(*) FROM {s}.lines l WHERE l.order_id = o.id) FROM {s}.orders o
             WHERE o.n_lines <> (SELECT count(*) FROM {s}.lines l WHERE l.order_id = o.id);
           INSERT INTO {s}.partial
             SELECT l.order_id, -1, count(*) FROM {s}.lines l
             WHERE NOT EXISTS (SELECT 1 FROM {s}.orders o WHERE o.id = l.order_id) GROUP BY l.order_id;
           RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER tx_orders AFTER INSERT OR UPDATE ON {s}.orders DEFERRABLE INITIALLY DEFERRED
           FOR EACH ROW EXECUTE FUNCTION {s}.check_tx();
         CREATE CONSTRAINT TRIGGER tx_lines AFTER INSERT OR UPDATE ON {s}.lines DEFERRABLE INITIALLY DEFERRED
           FOR EACH ROW EXECUTE FUNCTION {s}.check_tx();",
    );
    (db, p)
}

/// A change of `public.<table>` in transaction `tx` (Debezium's `transaction` block).
pub(crate) fn change(
    table: &str,
    partition: i32,
    id: i64,
    after: Value,
    lsn: i64,
    tx: &str,
    order: i64,
) -> Rec {
    let mut r =
        Table(if table == "orders" { "orders" } else { "lines" }).create(partition, id, after, lsn);
    let mut v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
    v["transaction"] = json!({"id": tx, "total_order": order, "data_collection_order": order});
    r.value = Some(v.to_string().into_bytes());
    r
}

pub(crate) fn begin(tx: &str) -> Rec {
    raw(
        0,
        Some(json!({"id": tx})),
        json!({"status": "BEGIN", "id": tx, "ts_ms": 1, "event_count": null, "data_collections": null}),
    )
}

pub(crate) fn end(tx: &str, lines: u64) -> Rec {
    raw(
        0,
        Some(json!({"id": tx})),
        json!({"status": "END", "id": tx, "ts_ms": 2, "event_count": lines + 1, "data_collections": [
            {"data_collection": "public.orders", "event_count": 1},
            {"data_collection": "public.lines", "event_count": lines}]}),
    )
}

/// Transaction `k`: order `k` with `n` lines `k*10 + i`, the order on partition `k % 2`, line `i` on `i % 2`.
pub(crate) struct Tx {
    pub(crate) order: Rec,
    pub(crate) lines: Vec<Rec>,
    pub(crate) begin: Rec,
    pub(crate) end: Rec,
}

pub(crate) fn tx(k: i64, n: i64) -> Tx {
    let id = format!("{k}:{}", 1000 + k);
    let lsn = 10_000 * k;
    let order = change(
        "orders",
        (k % 2) as i32,
        k,
        json!({"id": k, "n_lines": n}),
        lsn,
        &id,
        1,
    );
    let lines = (0..n)
        .map(|i| {
            let l = k * 10 + i;
            change(
                "lines",
                (i % 2) as i32,
                l,
                json!({"id": l, "order_id": k}),
                lsn + 100 * (i + 1),
                &id,
                i + 2,
            )
        })
        .collect();
    Tx {
        order,
        lines,
        begin: begin(&id),
        end: end(&id, n as u64),
    }
}

/// Produces transactions `txs` interleaved: lines first (reversed), then the orders, then BEGIN/END.
pub(crate) fn produce_all(base: &str, txs: &[Tx]) {
    let mut lines: Vec<Rec> = txs.iter().flat_map(|t| t.lines.clone()).collect();
    lines.reverse();
    produce(&format!("{base}.lines"), &lines);
    produce(
        &format!("{base}.orders"),
        &txs.iter().map(|t| t.order.clone()).collect::<Vec<_>>(),
    );
    let meta: Vec<Rec> = txs
        .iter()
        .flat_map(|t| [t.begin.clone(), t.end.clone()])
        .collect();
    produce(&format!("{base}.tx"), &meta);
}

pub(crate) fn orders(db: &Db) -> Vec<(i64, i64)> {
    db.query("SELECT id, n_lines FROM {s}.orders ORDER BY id", &[])
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

pub(crate) fn lines(db: &Db) -> Vec<(i64, i64)> {
    db.query("SELECT id, order_id FROM {s}.lines ORDER BY id", &[])
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Rows `(id, n_lines)` of orders and `(id, order_id)` of lines.
pub(crate) type Rows = (Vec<(i64, i64)>, Vec<(i64, i64)>);

pub(crate) fn expected(txs: &[(i64, i64)]) -> Rows {
    let o = txs.to_vec();
    let l = txs
        .iter()
        .flat_map(|&(k, n)| (0..n).map(move |i| (k * 10 + i, k)))
        .collect();
    (o, l)
}

pub(crate) const ATOMIC: &str = "transactions = \"atomic\"";

#[test]
fn atomic_transactions_never_commit_an_order_without_its_lines() {
    let base = topics();
    let spec = [(1, 3), (2, 1), (3, 4), (4, 2), (5, 3), (6, 1)];
    let txs: Vec<Tx> = spec.iter().map(|&(k, n)| tx(k, n)).collect();
    produce_all(&base, &txs);
    let changes: u64 = spec.iter().map(|&(_, n)| n as u64 + 1).sum();

    // Per record (today's default): some commit shows an order without all its lines (the check can fail).
    let (db0, p0) = staged("", &base, &unique("cdctx-none"));
    run_caught_up(&p0.path);
    assert!(
        db0.i64("SELECT count(*) FROM {s}.partial") > 0,
        "per-record commits show partial transactions"
    );

    let group = unique("cdctx-atomic");
    let (db, p) = staged(ATOMIC, &base, &group);
    let out = run_caught_up(&p.path);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.partial"),
        0,
        "no commit shows a partial transaction"
    );
    assert!(
        db.i64("SELECT count(*) FROM {s}.checks") > 0,
        "the commit check ran"
    );
    let (o, l) = expected(&spec);
    assert_eq!(orders(&db), o);
    assert_eq!(lines(&db), l);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.filtered, t.duplicate),
        (changes + 12, changes, 12, 0)
    );
    assert!(
        out.stdout.contains("cdc-transaction-metadata"),
        "{}",
        out.stdout
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        changes as i64
    );
    // Every partition's checkpoint at its end: nothing held back once every transaction is applied.
    let lines_per: Vec<i64> = (0..2)
        .map(|p| l.iter().filter(|(id, _)| (id % 10) % 2 == p).count() as i64)
        .collect();
    for part in 0..2 {
        let n_orders = spec.iter().filter(|(k, _)| k % 2 == part as i64).count() as i64;
        assert_eq!(
            db.checkpoint(&group, &format!("{base}.orders"), part),
            Some(n_orders)
        );
        assert_eq!(
            db.checkpoint(&group, &format!("{base}.lines"), part),
            Some(lines_per[part as usize])
        );
    }
    assert_eq!(db.checkpoint(&group, &format!("{base}.tx"), 0), Some(12));
}

/// Killed (SIGKILL) while a transaction is buffered without its END: the checkpoints and Kafka offsets of the
/// partitions holding its records stay at or before them; the restart re-reads them, and once the END (and the
/// last line) come, everything is applied exactly once — no commit ever partial.
#[test]
fn a_crash_while_a_transaction_is_buffered_rereads_it() {
    let base = topics();
    let group = unique("cdctx-crash");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 600000"),
        &base,
        &group,
    );
    let done = tx(1, 3);
    let open = tx(2, 2);
    // Transaction 1 complete; transaction 2: its order and first line, BEGIN, no END yet.
    produce(
        &format!("{base}.lines"),
        &[done.lines.clone(), vec![open.lines[0].clone()]].concat(),
    );
    produce(
        &format!("{base}.orders"),
        &[done.order.clone(), open.order.clone()],
    );
    produce(
        &format!("{base}.tx"),
        &[done.begin.clone(), done.end.clone(), open.begin.clone()],
    );
    let mut w = spawn_run(&p, &[], "w");
    wait_until(
        Duration::from_secs(60),
        "transaction 1 applied and the tx topic read",
        || lines(&db).len() == 3 && db.checkpoint(&group, &format!("{base}.tx"), 0) == Some(3),
    );
    // Order 1 sits at orders/1 offset 0, order 2 at orders/0 offset 0; line 20 at lines/0 offset 2.
    wait_until(
        Duration::from_secs(60),
        "orders/1 stepped over transaction 1",
        || db.checkpoint(&group, &format!("{base}.orders"), 1) == Some(1),
    );
    unsafe_kill(w.id(), "KILL");
    let _ = w.wait();
    assert_eq!(orders(&db), vec![(1, 3)]);
    assert!(
        db.checkpoint(&group, &format!("{base}.orders"), 0)
            .unwrap_or(0)
            <= 0,
        "orders/0 holds order 2"
    );
    assert!(
        db.checkpoint(&group, &format!("{base}.lines"), 0)
            .unwrap_or(0)
            <= 2,
        "lines/0 holds line 20"
    );
    let kafka = committed(&group, &format!("{base}.lines"), 2);
    assert!(
        kafka[0].unwrap_or(0) <= 2,
        "Kafka offset of lines/0 past the held line: {kafka:?}"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.partial"), 0);

    produce(&format!("{base}.lines"), &[open.lines[1].clone()]);
    produce(&format!("{base}.tx"), std::slice::from_ref(&open.end));
    let out = run_caught_up(&p.path);
    let (o, l) = expected(&[(1, 3), (2, 2)]);
    assert_eq!(orders(&db), o);
    assert_eq!(lines(&db), l);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.partial"),
        0,
        "no commit shows a partial transaction"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        7,
        "each change claimed once"
    );
    let t = out.tally();
    assert_eq!(
        t.landed,
        3,
        "order 2 and its two lines land on the restart: {:?}",
        out.tally_line()
    );
    assert_eq!(db.checkpoint(&group, &format!("{base}.orders"), 0), Some(1));
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 0), Some(3));
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 1), Some(2));
    assert_eq!(db.checkpoint(&group, &format!("{base}.tx"), 0), Some(4));
}

/// A BEGIN whose END never comes: after `transaction-timeout-ms` the changes are applied as they are, with a
/// warning and `replaysafe_transactions_incomplete_total{reason="timeout"}`; the checkpoints then pass them.
#[test]
fn a_transaction_without_end_is_applied_as_it_is_after_the_timeout() {
    let base = topics();
    let group = unique("cdctx-timeout");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 300"),
        &base,
        &group,
    );
    let open = tx(7, 2);
    produce(&format!("{base}.lines"), &[open.lines[0].clone()]);
    produce(&format!("{base}.orders"), std::slice::from_ref(&open.order));
    produce(&format!("{base}.tx"), std::slice::from_ref(&open.begin));
    let addr = free_addr();
    let mut w = spawn_run(&p, &["--metrics-addr", &addr], "w");
    wait_until(
        Duration::from_secs(60),
        "the incomplete transaction applied",
        || orders(&db).len() == 1 && db.checkpoint(&group, &format!("{base}.orders"), 1) == Some(1),
    );
    let metric = |m: &str| {
        sample(
            m,
            "replaysafe_transactions_incomplete_total",
            &[("reason", "timeout")],
        )
    };
    wait_until(Duration::from_secs(30), "the metric", || {
        get(&addr, "/metrics").is_some_and(|(_, m)| metric(&m) == Some(1.0))
    });
    assert_eq!(terminate(&mut w), Some(0));
    assert_eq!(orders(&db), vec![(7, 2)]);
    assert_eq!(lines(&db), vec![(70, 7)]);
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 0), Some(1));
    assert_eq!(db.checkpoint(&group, &format!("{base}.tx"), 0), Some(1));
    let err = std::fs::read_to_string(p.dir.path().join("w.err")).unwrap();
    assert!(err.contains("applied as it is"), "{err}");
    let out = std::fs::read_to_string(p.dir.path().join("w.out")).unwrap();
    assert!(out.contains("consumed 3 = landed 2"), "{out}");
}

/// Real Debezium (`provide.transaction.metadata=true`): five source transactions, each an order and its lines,
/// go through `"atomic"`; no commit shows a partial transaction and the projection equals the source.
#[test]
fn real_debezium_transactions_are_applied_atomically() {
    use crate::connect::{drop_slot, read_values, unique_name, Connect};
    let src = unique_name("dbztx");
    let db = Db::fresh("cdctx");
    db.execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.orders (id bigint PRIMARY KEY, n_lines bigint);
         CREATE TABLE {src}.lines (id bigint PRIMARY KEY, order_id bigint)"
    ));
    let dir = tempfile::tempdir().unwrap();
    let include = format!("{src}.orders,{src}.lines");
    let mut connect = Connect::start(
        &dir.path().join(&src),
        &[
            ("topic.prefix", &src),
            ("table.include.list", &include),
            ("provide.transaction.metadata", "true"),
        ],
        false,
    );
    let spec = [(1i64, 3i64), (2, 1), (3, 4), (4, 2), (5, 3)];
    for &(k, n) in &spec {
        let lines: Vec<String> = (0..n).map(|i| format!("({}, {k})", k * 10 + i)).collect();
        db.execute(&format!(
            "BEGIN; INSERT INTO {src}.orders VALUES ({k}, {n}); INSERT INTO {src}.lines VALUES {}; COMMIT",
            lines.join(", ")
        ));
    }
    let tx_topic = format!("{src}.transaction");
    let ends = read_values(&tx_topic, Duration::from_secs(120), |vs| {
        vs.iter().filter(|v| v["status"] == "END").count() >= spec.len()
    });
    assert!(
        ends.iter().any(|v| v["data_collections"].is_array()),
        "{ends:?}"
    );
    let text = PIPELINE
        .replace("TXMODE", ATOMIC)
        .replace(
            "\"{topic}.orders\", \"{topic}.lines\", \"{topic}.tx\"",
            "\"{topic}.orders\", \"{topic}.lines\", \"TXTOPIC\"",
        )
        .replace("TXTOPIC", &tx_topic)
        .replace("public.", &format!("{src}."));
    let group = unique("cdctx-dbz");
    let p = pipeline(&text, &format!("{src}.{src}"), &group, &db.schema);
    replaysafe(&["init", "--config", p.path.to_str().unwrap()]).assert_ok();
    db.execute(
        "CREATE TABLE {s}.partial (order_id bigint, want bigint, have bigint);
         CREATE FUNCTION {s}.check_tx() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO {s}.partial
             SELECT o.id, o.n_lines, (SELECT count(*) FROM {s}.lines l WHERE l.order_id = o.id) FROM {s}.orders o
             WHERE o.n_lines <> (SELECT count(*) FROM {s}.lines l WHERE l.order_id = o.id);
           INSERT INTO {s}.partial
             SELECT l.order_id, -1, count(*) FROM {s}.lines l
             WHERE NOT EXISTS (SELECT 1 FROM {s}.orders o WHERE o.id = l.order_id) GROUP BY l.order_id;
           RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER tx_orders AFTER INSERT OR UPDATE ON {s}.orders DEFERRABLE INITIALLY DEFERRED
           FOR EACH ROW EXECUTE FUNCTION {s}.check_tx();
         CREATE CONSTRAINT TRIGGER tx_lines AFTER INSERT OR UPDATE ON {s}.lines DEFERRABLE INITIALLY DEFERRED
           FOR EACH ROW EXECUTE FUNCTION {s}.check_tx();",
    );
    let out = run_caught_up(&p.path);
    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.partial"),
        0,
        "no commit shows a partial transaction"
    );
    let (o, l) = expected(&spec);
    assert_eq!(orders(&db), o, "{}\n{}\n{ends:?}", out.stdout, out.stderr);
    assert_eq!(lines(&db), l);
    let changes = spec.iter().map(|&(_, n)| n + 1).sum::<i64>();
    let t = out.tally();
    assert_eq!(t.landed as i64, changes, "{:?}", out.tally_line());
    assert_eq!(t.quarantined, 0);
    assert!(
        t.filtered >= 2 * spec.len() as u64,
        "BEGIN/END filtered: {:?}",
        out.tally_line()
    );
    assert!(
        out.stderr.matches("applied as it is").count() == 0,
        "every transaction complete: {}",
        out.stderr
    );
}

/// Over `transaction-buffer-bytes` the oldest open transaction is applied as it is (warning, reason memory):
/// polling goes on, nothing is held past the limit, and the accounting adds up.
#[test]
fn over_the_buffer_limit_the_oldest_transaction_is_applied_as_it_is() {
    let base = topics();
    let group = unique("cdctx-memory");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-buffer-bytes = 1"),
        &base,
        &group,
    );
    let (a, b) = (tx(8, 2), tx(9, 1));
    // No END at all: only the byte limit lets them through before the (default, 60 s) timeout.
    produce(
        &format!("{base}.lines"),
        &[a.lines.clone(), b.lines.clone()].concat(),
    );
    produce(
        &format!("{base}.orders"),
        &[a.order.clone(), b.order.clone()],
    );
    produce(&format!("{base}.tx"), &[a.begin.clone(), b.begin.clone()]);
    let out = run_caught_up(&p.path);
    let (o, l) = expected(&[(8, 2), (9, 1)]);
    assert_eq!(orders(&db), o);
    assert_eq!(lines(&db), l);
    assert!(
        out.stderr.contains("applied as it is") && out.stderr.contains("Memory"),
        "{}",
        out.stderr
    );
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, t.filtered), (7, 5, 2));
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 0), Some(2));
    assert_eq!(db.checkpoint(&group, &format!("{base}.orders"), 0), Some(1));
    assert_eq!(db.checkpoint(&group, &format!("{base}.orders"), 1), Some(1));
}
