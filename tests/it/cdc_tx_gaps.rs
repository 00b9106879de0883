//! Issue 14 part 2, the gaps of `[source] transactions = "atomic"` (helpers in `cdc_tx.rs`): a value PostgreSQL
//! rejects quarantines the whole source transaction and the run goes on; a transaction's commit takes its
//! partitions' fences; a lost COMMIT reply counts its records once; transactions still open at the stop are
//! counted `buffered` and read again.

use std::time::Duration;

use crate::cdc_tx::*;
use crate::common::*;
use crate::health::{free_addr, get};

/// Transactions `(k, n)` → changes (the order and its `n` lines).
fn changes(spec: &[(i64, i64)]) -> u64 {
    spec.iter().map(|&(_, n)| n as u64 + 1).sum()
}

/// Asserts every partition of orders/lines/tx stands at its end.
fn checkpoints_at_end(db: &Db, group: &str, base: &str, spec: &[(i64, i64)]) {
    let (_, l) = expected(spec);
    for part in 0..2 {
        let n_orders = spec.iter().filter(|(k, _)| k % 2 == part as i64).count() as i64;
        let n_lines = l.iter().filter(|(id, _)| (id % 10) % 2 == part as i64).count() as i64;
        assert_eq!(
            db.checkpoint(group, &format!("{base}.orders"), part),
            Some(n_orders)
        );
        assert_eq!(
            db.checkpoint(group, &format!("{base}.lines"), part),
            Some(n_lines)
        );
    }
    assert_eq!(
        db.checkpoint(group, &format!("{base}.tx"), 0),
        Some(2 * spec.len() as i64)
    );
}

/// Gap 1: line 21 of transaction 2 violates a CHECK constraint. The whole transaction (order 2, lines 20 and
/// 21) becomes dead letters naming the transaction, the record and the constraint — nothing of it applied —
/// and the run goes on with transaction 3. Read again by another group, the dead letters stay one per record.
#[test]
fn a_rejected_value_quarantines_the_whole_transaction_and_the_run_goes_on() {
    let base = topics();
    let group = unique("cdctx-quar");
    let (db, p) = staged(ATOMIC, &base, &group);
    db.execute("ALTER TABLE {s}.lines ADD CONSTRAINT no_line_21 CHECK (id <> 21)");
    let spec = [(1, 3), (2, 2), (3, 4)];
    let txs: Vec<Tx> = spec.iter().map(|&(k, n)| tx(k, n)).collect();
    produce_all(&base, &txs);
    let out = run_caught_up(&p.path);
    let ok = [(1, 3), (3, 4)];
    let (o, l) = expected(&ok);
    assert_eq!(orders(&db), o, "{}", out.stderr);
    assert_eq!(lines(&db), l);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.partial"), 0);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        changes(&ok) as i64,
        "nothing of transaction 2 claimed"
    );
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined, t.filtered, t.duplicate),
        (changes(&spec) + 6, changes(&ok), 3, 6, 0),
        "{:?}",
        out.tally_line()
    );
    let dead = db.query(
        "SELECT topic, partition, \"offset\", value, reason, detail FROM {s}.replaysafe_dead_letters \
         ORDER BY topic, partition, \"offset\"",
        &[],
    );
    assert_eq!(dead.len(), 3, "order 2 and its two lines");
    let t2 = &txs[1];
    let mut want: Vec<(String, i32, Vec<u8>)> =
        [("orders", &t2.order), ("lines", &t2.lines[0]), ("lines", &t2.lines[1])]
            .iter()
            .map(|(topic, r)| (format!("{base}.{topic}"), r.partition, r.value.clone().unwrap()))
            .collect();
    want.sort();
    let mut got: Vec<(String, i32, Vec<u8>)> = dead
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(3)))
        .collect();
    got.sort();
    assert_eq!(got, want, "raw values at their coordinates");
    for r in &dead {
        let (reason, detail): (String, String) = (r.get(4), r.get(5));
        assert_eq!(reason, "rejected-by-database");
        assert!(
            detail.contains("source transaction 2 quarantined whole (3 records")
                && detail.contains(&format!("{base}.lines/1 offset"))
                && detail.contains("no_line_21"),
            "{detail}"
        );
    }
    checkpoints_at_end(&db, &group, &base, &spec);

    // Another group reads it all again: transaction 2 quarantined again, still one dead letter per record.
    let text = PIPELINE.replace("TXMODE", ATOMIC);
    let again = pipeline(&text, &base, &unique("cdctx-quar2"), &db.schema);
    let t = run_caught_up(&again.path).tally();
    assert_eq!(
        (t.landed, t.duplicate, t.quarantined),
        (0, changes(&ok), 3)
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        3
    );
    assert_eq!(orders(&db), o);
}

/// Gap 3: the first source transaction's COMMIT is applied and its reply lost (failpoint, the connection cut):
/// the retry finds its claims held and counts the first attempt's outcomes — landed once, no duplicate.
#[test]
fn a_lost_commit_reply_of_a_transaction_counts_its_records_once() {
    let base = topics();
    let group = unique("cdctx-lost");
    let (db, p) = staged(ATOMIC, &base, &group);
    let spec = [(1, 3), (2, 1), (3, 2)];
    let txs: Vec<Tx> = spec.iter().map(|&(k, n)| tx(k, n)).collect();
    produce_all(&base, &txs);
    let out = try_run_with(
        &p.path,
        &[("REPLAYSAFE_FAILPOINTS", "tx-commit-reply-lost=1*return")],
        Duration::from_secs(120),
    );
    out.assert_ok();
    assert!(
        out.stderr.contains("its claims show it committed"),
        "{}",
        out.stderr
    );
    let (o, l) = expected(&spec);
    assert_eq!(orders(&db), o);
    assert_eq!(lines(&db), l);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.partial"), 0);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        changes(&spec) as i64
    );
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.filtered),
        (changes(&spec) + 6, changes(&spec), 0, 6),
        "{:?}",
        out.tally_line()
    );
    checkpoints_at_end(&db, &group, &base, &spec);
}

/// Gap 4: transaction 2 is still open (no END) when the run stops — at the end of `--until-caught-up` and on
/// SIGTERM: its records are counted `buffered` (the line adds up), the checkpoints stay before them, and once
/// its END comes the next run applies it once.
#[test]
fn open_transactions_at_the_stop_are_counted_buffered_and_read_again() {
    let base = topics();
    let group = unique("cdctx-buf");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 600000"),
        &base,
        &group,
    );
    let (done, open) = (tx(1, 3), tx(2, 2));
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
    let out = run_caught_up(&p.path);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.filtered, out.buffered()),
        (9, 4, 3, 2),
        "{:?}",
        out.tally_line()
    );
    assert_eq!(orders(&db), vec![(1, 3)]);
    let held = |db: &Db| {
        (
            db.checkpoint(&group, &format!("{base}.orders"), 0),
            db.checkpoint(&group, &format!("{base}.lines"), 0),
        )
    };
    let (o0, l0) = held(&db);
    assert!(o0.unwrap_or(0) <= 0 && l0.unwrap_or(0) <= 2, "{o0:?} {l0:?}");

    // SIGTERM while it is still open: read again, counted buffered again, nothing applied.
    let addr = free_addr();
    let mut w = spawn_run(&p, &["--metrics-addr", &addr], "w");
    let both = size(&open.order) + size(&open.lines[0]);
    wait_until(Duration::from_secs(60), "order 2 and line 20 held again", || {
        buffer_bytes(&addr) == Some(both)
    });
    assert_eq!(terminate(&mut w), Some(0));
    let text = std::fs::read_to_string(p.dir.path().join("w.out")).unwrap();
    let line = text.lines().rev().find(|l| l.starts_with("consumed ")).unwrap();
    assert!(
        line.starts_with("consumed 2 = landed 0") && line.contains("buffered 2"),
        "{line}"
    );
    assert_eq!(held(&db), (o0, l0));

    produce(&format!("{base}.lines"), &[open.lines[1].clone()]);
    produce(&format!("{base}.tx"), std::slice::from_ref(&open.end));
    let out = run_caught_up(&p.path);
    let t = out.tally();
    assert_eq!(
        (t.landed, t.duplicate, out.buffered()),
        (3, 0, 0),
        "{:?}",
        out.tally_line()
    );
    let (o, l) = expected(&[(1, 3), (2, 2)]);
    assert_eq!(orders(&db), o);
    assert_eq!(lines(&db), l);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.partial"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 7);
    assert_eq!(db.checkpoint(&group, &format!("{base}.tx"), 0), Some(4));
}

/// The `replaysafe_transaction_buffer_bytes` gauge of a worker's metrics endpoint.
fn buffer_bytes(addr: &str) -> Option<f64> {
    let (_, m) = get(addr, "/metrics")?;
    m.lines()
        .find(|l| l.starts_with("replaysafe_transaction_buffer_bytes"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn size(r: &Rec) -> f64 {
    (r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len)) as f64
}

/// Gap 2: while transaction 1 waits for its last line, another owner takes lines/0 (fence bumped, its
/// checkpoint moved past line 10, as a new owner's batch does). When the last line comes, the transaction's
/// commit is fenced: nothing of it is written — no order without its lines, no claim — and at the stop its
/// records read again are counted `buffered`.
#[test]
fn a_fenced_partition_stops_the_transaction_commit() {
    let base = topics();
    let group = unique("cdctx-fence");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 600000"),
        &base,
        &group,
    );
    let t = tx(1, 2);
    produce(&format!("{base}.orders"), std::slice::from_ref(&t.order));
    produce(&format!("{base}.lines"), std::slice::from_ref(&t.lines[0]));
    produce(&format!("{base}.tx"), &[t.begin.clone(), t.end.clone()]);
    let addr = free_addr();
    let mut w = spawn_run(&p, &["--metrics-addr", &addr], "w");
    let both = size(&t.order) + size(&t.lines[0]);
    wait_until(Duration::from_secs(60), "order 1 and line 10 held", || {
        buffer_bytes(&addr) == Some(both) && db.checkpoint(&group, &format!("{base}.tx"), 0) == Some(2)
    });
    db.execute(&format!(
        "UPDATE {{s}}.replaysafe_checkpoints SET fence = fence + 1, next_offset = 1 \
         WHERE topic = '{base}.lines' AND partition = 0"
    ));
    produce(&format!("{base}.lines"), std::slice::from_ref(&t.lines[1]));
    wait_until(Duration::from_secs(60), "the commit fenced", || {
        std::fs::read_to_string(p.dir.path().join("w.err"))
            .is_ok_and(|e| e.contains("(fenced); not applied"))
    });
    // Taken over again from the checkpoints: order 1 and line 11 read again (line 10 is the other owner's).
    let again = size(&t.order) + size(&t.lines[1]);
    wait_until(Duration::from_secs(60), "read again", || {
        buffer_bytes(&addr) == Some(again)
    });
    assert_eq!(terminate(&mut w), Some(0));
    assert_eq!(orders(&db), vec![]);
    assert_eq!(lines(&db), vec![]);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.partial"), 0);
    assert_eq!(db.checkpoint(&group, &format!("{base}.lines"), 0), Some(1));
    assert!(db.checkpoint(&group, &format!("{base}.orders"), 1).unwrap_or(0) <= 0);
    assert!(db.checkpoint(&group, &format!("{base}.lines"), 1).unwrap_or(0) <= 0);
    let text = std::fs::read_to_string(p.dir.path().join("w.out")).unwrap();
    let line = text.lines().rev().find(|l| l.starts_with("consumed ")).unwrap();
    assert!(line.contains("buffered 2"), "{line}");
}
