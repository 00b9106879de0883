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
        let n_lines = l
            .iter()
            .filter(|(id, _)| (id % 10) % 2 == part as i64)
            .count() as i64;
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
    let mut want: Vec<(String, i32, Vec<u8>)> = [
        ("orders", &t2.order),
        ("lines", &t2.lines[0]),
        ("lines", &t2.lines[1]),
    ]
    .iter()
    .map(|(topic, r)| {
        (
            format!("{base}.{topic}"),
            r.partition,
            r.value.clone().unwrap(),
        )
    })
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
    assert_eq!((t.landed, t.duplicate, t.quarantined), (0, changes(&ok), 3));
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
    assert!(
        o0.unwrap_or(0) <= 0 && l0.unwrap_or(0) <= 2,
        "{o0:?} {l0:?}"
    );

    // SIGTERM while it is still open: read again, counted buffered again, nothing applied.
    let addr = free_addr();
    let mut w = spawn_run(&p, &["--metrics-addr", &addr], "w");
    let both = size(&open.order) + size(&open.lines[0]);
    wait_until(
        Duration::from_secs(60),
        "order 2 and line 20 held again",
        || buffer_bytes(&addr) == Some(both),
    );
    let (_, m) = get(&addr, "/metrics").unwrap();
    assert_eq!(
        sample(&m, "replaysafe_transactions_open", &[]),
        Some(1.0),
        "transaction 2 open:\n{m}"
    );
    assert_eq!(terminate(&mut w), Some(0));
    let text = std::fs::read_to_string(p.dir.path().join("w.out")).unwrap();
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with("consumed "))
        .unwrap();
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
    sample(&m, "replaysafe_transaction_buffer_bytes", &[])
}

fn size(r: &Rec) -> f64 {
    (r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len)) as f64
}

/// Gap 2: while transaction 1 waits for its last line, another owner takes lines/0 (fence bumped, its
/// checkpoint moved past line 10, as a new owner's batch does). When the last line comes, the transaction's
/// commit is fenced: nothing of it is written — no order without its lines, no claim — and at the stop its
/// records read again (and its END, held before the transaction topic's checkpoint) are counted `buffered`.
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
        buffer_bytes(&addr) == Some(both)
            && db.checkpoint(&group, &format!("{base}.tx"), 0) == Some(1)
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
    assert!(
        db.checkpoint(&group, &format!("{base}.orders"), 1)
            .unwrap_or(0)
            <= 0
    );
    assert!(
        db.checkpoint(&group, &format!("{base}.lines"), 1)
            .unwrap_or(0)
            <= 0
    );
    let text = std::fs::read_to_string(p.dir.path().join("w.out")).unwrap();
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with("consumed "))
        .unwrap();
    assert!(
        line.contains("buffered 3"),
        "order 1, line 11 and the END: {line}"
    );
    assert_eq!(
        db.checkpoint(&group, &format!("{base}.tx"), 0),
        Some(1),
        "the END is held: a new owner reads it again"
    );
}

/// SIGTERM to worker `name`; it exits 0 (its stderr shown otherwise).
fn stopped(p: &Pipeline, w: &mut std::process::Child, name: &str) {
    let code = terminate(w);
    let err = std::fs::read_to_string(p.dir.path().join(format!("{name}.err"))).unwrap_or_default();
    assert_eq!(code, Some(0), "{name}: {err}");
}

/// The accounting line of a spawned worker's `<name>.out` (it adds up, `buffered` included).
fn worker_tally(p: &Pipeline, name: &str) -> (Tally, u64) {
    let out = Out {
        code: Some(0),
        stdout: std::fs::read_to_string(p.dir.path().join(format!("{name}.out"))).unwrap(),
        stderr: String::new(),
    };
    (out.tally(), out.buffered())
}

/// Gap 2 with two workers of one group: A applies transactions 1–4 alone; transactions 5–8 arrive without
/// their END, B joins (a rebalance splits the partitions while A holds copies of them all), the ENDs come, then A
/// leaves and B takes everything over. Every change lands exactly once over the two workers, no commit ever
/// shows a partial transaction, every checkpoint ends at its partition's end.
#[test]
fn two_workers_and_a_rebalance_apply_every_transaction_once() {
    two_workers(false);
}

/// As [`two_workers_and_a_rebalance_apply_every_transaction_once`], A killed (SIGKILL) instead of leaving: B takes
/// its partitions over from the checkpoints and applies every transaction once.
#[test]
fn a_killed_worker_hands_its_open_transactions_over() {
    two_workers(true);
}

fn two_workers(kill: bool) {
    let base = topics();
    let group = unique("cdctx-two");
    let (db, p) = staged(
        &format!("{ATOMIC}\ntransaction-timeout-ms = 600000"),
        &base,
        &group,
    );
    let spec = [
        (1, 3),
        (2, 1),
        (3, 2),
        (4, 4),
        (5, 2),
        (6, 3),
        (7, 1),
        (8, 4),
    ];
    let txs: Vec<Tx> = spec.iter().map(|&(k, n)| tx(k, n)).collect();
    produce_all(&base, &txs[..4]);
    let mut a = spawn_run(&p, &[], "a");
    wait_until(Duration::from_secs(60), "transactions 1-4 by A", || {
        orders(&db).len() == 4
    });
    let late = &txs[4..];
    let mut ls: Vec<Rec> = late.iter().flat_map(|t| t.lines.clone()).collect();
    ls.reverse();
    produce(&format!("{base}.lines"), &ls);
    let os: Vec<Rec> = late.iter().map(|t| t.order.clone()).collect();
    produce(&format!("{base}.orders"), &os);
    let begins: Vec<Rec> = late.iter().map(|t| t.begin.clone()).collect();
    produce(&format!("{base}.tx"), &begins);
    let mut b = spawn_run(&p, &[], "b");
    wait_until(Duration::from_secs(90), "B owns partitions", || {
        db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_checkpoints WHERE consumer_group = '{group}' AND fence > 1"
        )) > 0
    });
    let ends: Vec<Rec> = late.iter().map(|t| t.end.clone()).collect();
    produce(&format!("{base}.tx"), &ends);
    std::thread::sleep(Duration::from_secs(3));
    if kill {
        unsafe_kill(a.id(), "KILL");
        let _ = a.wait();
    } else {
        stopped(&p, &mut a, "a");
    }
    wait_until(
        Duration::from_secs(120),
        "every transaction applied",
        || orders(&db).len() == spec.len() && lines(&db).len() == expected(&spec).1.len(),
    );
    wait_until(
        Duration::from_secs(60),
        "every checkpoint at its end",
        || {
            db.checkpoint(&group, &format!("{base}.tx"), 0) == Some(16)
                && (0..2).all(|q| {
                    db.checkpoint(&group, &format!("{base}.lines"), q)
                        == Some(
                            expected(&spec)
                                .1
                                .iter()
                                .filter(|(id, _)| (id % 10) % 2 == q as i64)
                                .count() as i64,
                        )
                })
        },
    );
    stopped(&p, &mut b, "b");
    let (o, l) = expected(&spec);
    assert_eq!(orders(&db), o);
    assert_eq!(lines(&db), l);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.partial"), 0);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        changes(&spec) as i64
    );
    let (tb, bb) = worker_tally(&p, "b");
    assert_eq!(bb, 0, "B applied everything it read");
    checkpoints_at_end(&db, &group, &base, &spec);
    if kill {
        return;
    }
    let (ta, ba) = worker_tally(&p, "a");
    assert_eq!(
        ta.landed + tb.landed,
        changes(&spec),
        "each change landed once: a {ta:?} (buffered {ba}), b {tb:?} (buffered {bb})"
    );
}

/// Issue 14's "Done when": real Debezium (`provide.transaction.metadata=true`, topics of two partitions), an
/// order with six lines in ONE source transaction after two small ones; the process crashes (abort, no clean-up,
/// as SIGKILL) with part of the big transaction buffered. No commit ever shows part of a transaction; the
/// restart applies exactly the full transactions, the ledger holds each change once and the checkpoints end at
/// the topics' ends.
#[test]
fn real_debezium_transaction_survives_a_crash_in_the_middle() {
    use crate::connect::{drop_slot, unique_name, Connect};
    let src = unique_name("dbzcr");
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
            ("topic.creation.default.partitions", "2"),
            ("topic.creation.default.replication.factor", "1"),
        ],
        false,
    );
    let spec = [(1i64, 1i64), (2, 2), (3, 6)];
    for &(k, n) in &spec {
        let lines: Vec<String> = (0..n).map(|i| format!("({}, {k})", k * 10 + i)).collect();
        db.execute(&format!(
            "BEGIN; INSERT INTO {src}.orders VALUES ({k}, {n}); INSERT INTO {src}.lines VALUES {}; COMMIT",
            lines.join(", ")
        ));
    }
    let tx_topic = format!("{src}.transaction");
    read_both(&tx_topic, |vs| {
        vs.iter().filter(|v| v["status"] == "END").count() >= spec.len()
    });
    let n_orders =
        read_both(&format!("{src}.{src}.orders"), |vs| vs.len() >= spec.len()).len() as i64;
    let n_lines = read_both(&format!("{src}.{src}.lines"), |vs| vs.len() >= 9).len() as i64;
    let text = PIPELINE
        .replace(
            "TXMODE",
            &format!("{ATOMIC}\ntransaction-timeout-ms = 600000"),
        )
        .replace(
            "\"{topic}.orders\", \"{topic}.lines\", \"{topic}.tx\"",
            "\"{topic}.orders\", \"{topic}.lines\", \"TXTOPIC\"",
        )
        .replace("TXTOPIC", &tx_topic)
        .replace("public.", &format!("{src}."));
    let group = unique("cdctx-dbzcr");
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
    // The 9th record held (changes and ENDs) aborts the process: at least one earlier record shares a partition
    // with the big transaction (8 held), so 1 to 7 of its 8 are buffered — never all.
    let crash = try_run_with(
        &p.path,
        &[("REPLAYSAFE_FAILPOINTS", "tx-record-held=8*off->return")],
        Duration::from_secs(120),
    );
    assert_ne!(crash.code, Some(0), "the failpoint aborted the run");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.partial"), 0);
    let before = orders(&db);
    assert!(
        !before.iter().any(|&(k, _)| k == 3),
        "the big transaction is not visible before its restart: {before:?}"
    );
    let landed_before = db.i64("SELECT count(*) FROM {s}.replaysafe_ledger");
    let out = run_caught_up(&p.path);
    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.partial"),
        0,
        "no commit shows a partial transaction"
    );
    let (o, l) = expected(&spec);
    assert_eq!(orders(&db), o, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(lines(&db), l);
    let changes = changes(&spec) as i64;
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        changes
    );
    let t = out.tally();
    assert_eq!(
        t.landed as i64,
        changes - landed_before,
        "the restart lands exactly what the crash left: {:?}",
        out.tally_line()
    );
    assert_eq!((t.quarantined, out.buffered()), (0, 0));
    let ck = |topic: &str| {
        (0..2)
            .map(|q| db.checkpoint(&group, topic, q).unwrap_or(0))
            .sum::<i64>()
    };
    assert_eq!(ck(&format!("{src}.{src}.orders")), n_orders);
    assert_eq!(ck(&format!("{src}.{src}.lines")), n_lines);
    assert_eq!(
        ck(&tx_topic),
        2 * spec.len() as i64,
        "BEGIN and END of each transaction"
    );
}

/// Reads partitions 0 and 1 of `topic` from the beginning until `done` holds for the JSON values read (at most
/// 120 s).
fn read_both(topic: &str, done: impl Fn(&[serde_json::Value]) -> bool) -> Vec<serde_json::Value> {
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    let c = consumer(&[
        ("group.id", &unique("read")),
        ("enable.auto.commit", "false"),
    ]);
    let mut tpl = TopicPartitionList::new();
    for q in 0..2 {
        tpl.add_partition_offset(topic, q, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut out = Vec::new();
    while !done(&out) {
        assert!(
            std::time::Instant::now() < deadline,
            "{topic}: read {out:?}"
        );
        if let Some(Ok(m)) = c.poll(Duration::from_millis(500)) {
            out.push(m.payload().map_or(serde_json::Value::Null, |b| {
                serde_json::from_slice(b).unwrap()
            }));
        }
    }
    out
}
