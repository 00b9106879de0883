//! One entity's events on several partitions (issue 18): partition batches commit in parallel on separate
//! connections, and the row projections' version guard must still give what one serial application gives — no
//! resurrection, every equal-version conflict recorded, every older version stale. And a strictly newer version
//! with an unchanged row state is `landed` for the other projections (issue 19, item 1).

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

/// Two row projections of one JSON event stream, one per tombstone mode, plus an outbox (= every claimed record).
const JSON_ROWS: &str = concat!(
    header!(),
    r#"[batch]
max-records = MAXREC
linger-ms = 5
[fields]
event_id = { path = "/event_id", type = "text" }
event_type = { path = "/event_type", type = "text" }
customer_id = { path = "/customer_id", type = "text" }
amount = { path = "/amount", type = "bigint", optional = true }
version = { path = "/version", type = "bigint" }
[identity]
key = ["event_id"]
[[projection]]
kind = "row"
table = "cust_t"
key = ["customer_id"]
version = "version"
columns = ["customer_id", "amount"]
delete-if = "event_type == 'CustomerClosed'"
[[projection]]
kind = "row"
table = "cust_c"
key = ["customer_id"]
version = "version"
columns = ["customer_id", "amount"]
delete-if = "event_type == 'CustomerClosed'"
tombstones = "column"
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["event_id", "customer_id", "amount"]
[kafka.properties]
"max.partition.fetch.bytes" = "4096"
"#
);

/// The accounting line's figures, and the conflicts it names (`[stale: N conflict(s)]`).
#[derive(Debug, Clone, Copy)]
struct Counts {
    consumed: i64,
    landed: i64,
    duplicate: i64,
    stale: i64,
    conflicts: i64,
}

impl Counts {
    fn of(out: &Out) -> Counts {
        let t = out.tally();
        let line = out.tally_line().unwrap_or("");
        let conflicts = line
            .split("[stale: ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Counts {
            consumed: t.consumed as i64,
            landed: t.landed as i64,
            duplicate: t.duplicate as i64,
            stale: out.stale() as i64,
            conflicts,
        }
    }
}

/// Asserts two final states are equal, naming the first lines that differ (not the whole state).
fn same(got: &[String], want: &[String], what: &str) {
    let differ: Vec<(&String, &String)> = got
        .iter()
        .zip(want)
        .filter(|(a, b)| a != b)
        .take(5)
        .collect();
    assert!(
        got.len() == want.len() && differ.is_empty(),
        "{what}: final state differs ({} vs {} lines), first differing (got, want): {differ:?}",
        got.len(),
        want.len()
    );
}

/// The outcome of one run: the final state (every table), and the same with the winner of each equal-version
/// conflict masked (which of two equal versions arrives first is not defined across partitions).
struct Final {
    full: Vec<String>,
    masked: Vec<String>,
}

/// Asserts the serial-equivalent result for `n` closed customers `a<i>` (delete v2 on partition 1, create v1 on
/// partition 0) and `n` conflicting ones `b<i>` (v2 with amount 100+i on partition 0, 200+i on partition 1).
fn check_json(db: &Db, n: i64, out: &Out) -> Final {
    let t = out.tally();
    let stale = out.stale() as i64;
    // No resurrection: the closed customers are tombstones in both modes, at version 2.
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.cust_t WHERE customer_id LIKE 'a%'"),
        0,
        "resurrected rows next to their tombstones"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.cust_t_tombstones WHERE customer_id LIKE 'a%' AND _version = '{2}'"),
        n
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.cust_t_tombstones"),
        n,
        "tombstones only for closed customers"
    );
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM {s}.cust_c WHERE customer_id LIKE 'a%' AND _deleted_at IS NOT NULL AND _version = '{2}'"
        ),
        n,
        "column mode: every closed customer deleted at version 2"
    );
    // The conflicting customers: one row at version 2 holding one of the two amounts, the same in both modes.
    for table in ["cust_t", "cust_c"] {
        let alive = if table == "cust_c" {
            " AND _deleted_at IS NULL"
        } else {
            ""
        };
        assert_eq!(
            db.i64(&format!(
                "SELECT count(*) FROM {{s}}.{table} WHERE customer_id LIKE 'b%' AND _version = '{{2}}' \
                 AND amount IN (100 + substr(customer_id, 2)::int, 200 + substr(customer_id, 2)::int){alive}"
            )),
            n,
            "{table}"
        );
        // Every equal-version conflict recorded: the stored state is the one in the table, the incoming the other.
        assert_eq!(
            db.i64(&format!(
                "SELECT count(*) FROM {{s}}.replaysafe_conflicts c JOIN {{s}}.{table} t \
                 ON t.customer_id = c.entity->>'customer_id' WHERE c.projection = '{table}' AND c.version = '{{2}}' \
                 AND (c.stored->>'amount')::bigint = t.amount \
                 AND (c.stored->>'amount')::bigint + (c.incoming->>'amount')::bigint = 300 + 2 * substr(t.customer_id, 2)::int"
            )),
            n,
            "conflicts of {table}"
        );
    }
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
        2 * n
    );
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM {s}.cust_t t JOIN {s}.cust_c c USING (customer_id) WHERE t.amount = c.amount"
        ),
        n,
        "both projections keep the same winner"
    );
    // The outbox holds every claimed record (issue 34: stale and conflict are the row projections' verdict only):
    // every create and close, both conflicting versions.
    for (like, want) in [("a%-open", n), ("a%-close", n), ("b%", 2 * n)] {
        assert_eq!(
            db.i64(&format!(
                "SELECT count(*) FROM {{s}}.outbox WHERE payload->>'event_id' LIKE '{like}'"
            )),
            want,
            "{like}"
        );
    }
    // Accounting: every record is landed or stale (n conflicts + the creates judged after their close).
    assert_eq!(t.consumed as i64, 4 * n);
    assert_eq!(t.duplicate, 0);
    assert!((n..=2 * n).contains(&stale), "{}", out.stdout);
    assert_eq!(t.landed as i64, 4 * n - stale);
    assert!(
        out.stdout.contains(&format!("[stale: {n} conflict(s)]")),
        "{}",
        out.stdout
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 4 * n);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 4 * n);
    let full = full_json_state(db);
    let masked = [
        db.strings("SELECT customer_id || ' ' || _version::text FROM {s}.cust_t ORDER BY 1",
        ),
        db.strings("SELECT customer_id || ' ' || _version::text FROM {s}.cust_t_tombstones ORDER BY 1",
        ),
        db.strings("SELECT customer_id || ' ' || _version::text || ' ' || (_deleted_at IS NOT NULL)::text \
             FROM {s}.cust_c ORDER BY 1",
        ),
        db.strings("SELECT projection || ' ' || entity::text || ' ' || version::text FROM {s}.replaysafe_conflicts ORDER BY 1",
        ),
    ]
    .concat();
    Final { full, masked }
}

/// Issue 18, JSON events: a two-partition topic keyed by event id. For `n` customers the close (v2) sits on
/// partition 1 and the open (v1) on partition 0; for `n` others both partitions hold v2 with different amounts.
/// Under batch sizes 5000, 200 and 1 (partitions applied in parallel on separate connections; records produced
/// one per record batch and fetched in small chunks, so each flush carries both partitions' batches side by side —
/// without the entity locks the 5000 and 200 runs resurrect deleted customers and miss conflicts on every try),
/// both tombstone modes: no resurrection, every conflict recorded, every older version stale; the same final
/// state each time (up to which of two equal versions won); a replay under a fresh group changes nothing.
#[test]
fn json_entities_split_across_partitions() {
    let n = 300i64;
    let topic = new_topic("split", 2);
    let mut recs = Vec::new();
    for i in 0..n {
        let ev = |partition: i32, id: String, customer: String, ty: &str, amount: Value, v: i64| {
            let body = json!({"event_id": id, "event_type": ty, "customer_id": customer, "amount": amount, "version": v});
            Rec::json(partition, &id, &body.to_string(), 1_760_000_000_000)
        };
        recs.push(ev(
            1,
            format!("a{i}-close"),
            format!("a{i}"),
            "CustomerClosed",
            Value::Null,
            2,
        ));
        recs.push(ev(
            0,
            format!("a{i}-open"),
            format!("a{i}"),
            "CustomerOpened",
            json!(i),
            1,
        ));
        recs.push(ev(
            0,
            format!("b{i}-x"),
            format!("b{i}"),
            "CustomerChanged",
            json!(100 + i),
            2,
        ));
        recs.push(ev(
            1,
            format!("b{i}-y"),
            format!("b{i}"),
            "CustomerChanged",
            json!(200 + i),
            2,
        ));
    }
    produce_singly(&topic, &recs);
    let mut first: Option<(Db, Final)> = None;
    for max in [5000, 200, 1] {
        let db = Db::fresh("split");
        let text = JSON_ROWS.replace("MAXREC", &max.to_string());
        let out = run_text(&text, &topic, &unique("g"), &db);
        let f = check_json(&db, n, &out);
        match &first {
            None => first = Some((db, f)),
            Some((_, f0)) => same(&f.masked, &f0.masked, &format!("max-records {max}")),
        }
    }
    // A replay under a fresh group: every record a duplicate, nothing changes.
    let (db, f0) = first.unwrap();
    let text = JSON_ROWS.replace("MAXREC", "5000");
    let out = run_text(&text, &topic, &unique("g"), &db);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, out.stale()),
        (4 * n as u64, 0, 4 * n as u64, 0)
    );
    let again = full_json_state(&db);
    same(&again, &f0.full, "replay");
}

/// Every table of the JSON pipeline, a line per row (the conflicts with both states).
fn full_json_state(db: &Db) -> Vec<String> {
    [
        db.strings("SELECT customer_id || ' ' || coalesce(amount::text, '-') || ' ' || _version::text FROM {s}.cust_t ORDER BY 1",
        ),
        db.strings("SELECT customer_id || ' ' || _version::text FROM {s}.cust_t_tombstones ORDER BY 1",
        ),
        db.strings("SELECT customer_id || ' ' || coalesce(amount::text, '-') || ' ' || _version::text || ' ' || \
             (_deleted_at IS NOT NULL)::text FROM {s}.cust_c ORDER BY 1",
        ),
        db.strings("SELECT projection || ' ' || entity::text || ' ' || version::text || ' ' || stored::text || ' ' || \
             incoming::text FROM {s}.replaysafe_conflicts ORDER BY 1",
        ),
    ]
    .concat()
}

/// A schemaless Debezium envelope of `public.accounts` at position `[lsn - 5, lsn]`, key `{"id": id}`.
fn change(partition: i32, op: &str, id: i64, before: Value, after: Value, lsn: i64) -> Rec {
    let value = json!({
        "before": before, "after": after, "op": op, "ts_ms": 1_760_000_000_000i64 + lsn,
        "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public", "table": "accounts",
            "snapshot": if op == "r" { "true" } else { "false" }, "txId": lsn / 10, "lsn": lsn,
            "ts_ms": 1_760_000_000_000i64 + lsn,
            "sequence": if op == "r" { format!("[null,\"{lsn}\"]") } else { format!("[\"{}\",\"{lsn}\"]", lsn - 5) }},
    });
    raw(partition, Some(json!({ "id": id })), value)
}

/// Debezium rows versioned by the application's `version` column, in both tombstone modes, plus an outbox.
const DBZ_ROWS: &str = concat!(
    debezium_header!(),
    r#"[batch]
max-records = MAXREC
linger-ms = 5
[[projection]]
kind = "row"
table = "acc_t"
source-table = "public.accounts"
key = ["id"]
columns = { id = "bigint", owner = "text", balance = "bigint", version = "bigint" }
version = "version"
[[projection]]
kind = "row"
table = "acc_c"
source-table = "public.accounts"
key = ["id"]
columns = { id = "bigint", owner = "text", balance = "bigint", version = "bigint" }
version = "version"
tombstones = "column"
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["_op", "_entity", "_position"]
[kafka.properties]
"max.partition.fetch.bytes" = "4096"
"#
);

fn acc(id: i64, balance: i64, v: i64) -> Value {
    json!({"id": id, "owner": format!("o{id}"), "balance": balance, "version": v})
}

/// The Debezium final state: every table, with the conflicting entities' balances (`id` in `conflicting`)
/// masked when `mask`.
fn dbz_state(db: &Db, mask: bool) -> Vec<String> {
    // Masked: the balance of a conflicting account (which equal version won is arrival order), and the values a
    // column-mode tombstone keeps (those of the row it deleted, none when the delete came first).
    let bal = if mask {
        "CASE WHEN id BETWEEN 1001 AND 1999 OR _deleted_at IS NOT NULL THEN '*' ELSE balance::text END"
    } else {
        "balance::text"
    };
    let conflict = if mask {
        "projection || ' ' || entity::text || ' ' || version::text"
    } else {
        "projection || ' ' || entity::text || ' ' || version::text || ' ' || stored::text || ' ' || incoming::text"
    };
    [
        db.strings(&format!(
            "SELECT id || ' ' || {} || ' ' || _version::text FROM {{s}}.acc_t ORDER BY id",
            bal.replace(" OR _deleted_at IS NOT NULL", "")
        )),
        db.strings("SELECT id || ' ' || _version::text FROM {s}.acc_t_tombstones ORDER BY id"),
        db.strings(&format!(
            "SELECT id || ' ' || coalesce({bal}, '-') || ' ' || _version::text || ' ' || \
                 (_deleted_at IS NOT NULL)::text FROM {{s}}.acc_c ORDER BY id"
        )),
        db.strings(&format!(
            "SELECT {conflict} FROM {{s}}.replaysafe_conflicts ORDER BY 1"
        )),
    ]
    .concat()
}

/// Issue 18, Debezium rows: the accounts topic had one partition; its partition count was raised to 2 (a real
/// CreatePartitions on the broker) and the entities' newer changes went to the new partition. Entities 1..=n are
/// created and updated on partition 0 and deleted on partition 1; 1001..=1000+n are updated to version 2 on
/// both partitions with different balances; 2001..=2000+n are created on 0 and updated on 1. Applied live
/// (partition 0 first) and replayed into fresh schemas under batch sizes 5000, 200 and 1 (both partitions at
/// once, entity i's changes at the same positions on both; without the entity locks every size fails): the same
/// rows, tombstones (both modes) and conflicts as the serial run; no resurrection; every older version stale.
/// Accounts 3001.. are fillers on the new partition that keep the positions aligned.
#[test]
fn debezium_entities_moved_by_a_partition_increase() {
    let n = 150i64;
    let topic = new_topic("moved", 1);
    let mut lsn = 10_000i64;
    let mut next = || {
        lsn += 10;
        lsn
    };
    let mut old = Vec::new();
    for i in 1..=n {
        old.push(change(0, "c", i, Value::Null, acc(i, 1, 1), next()));
        old.push(change(0, "u", i, Value::Null, acc(i, 2, 2), next()));
        old.push(change(
            0,
            "c",
            1000 + i,
            Value::Null,
            acc(1000 + i, 1, 1),
            next(),
        ));
        old.push(change(
            0,
            "u",
            1000 + i,
            Value::Null,
            acc(1000 + i, 100 + i, 2),
            next(),
        ));
        old.push(change(
            0,
            "c",
            2000 + i,
            Value::Null,
            acc(2000 + i, 1, 1),
            next(),
        ));
    }
    produce_singly(&topic, &old);
    // The live replica: partition 0 applied before the partition exists.
    let live = Db::fresh("moved");
    let group = unique("g");
    let text = DBZ_ROWS.replace("MAXREC", "5000");
    let p = pipeline(&text, &topic, &group, &live.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.consumed, t.landed), (5 * n as u64, 5 * n as u64));
    add_partitions(&topic, 2);
    let mut new = Vec::new();
    for i in 1..=n {
        new.push(change(1, "d", i, acc(i, 2, 2), Value::Null, next()));
        new.push(change(
            1,
            "u",
            1000 + i,
            Value::Null,
            acc(1000 + i, 200 + i, 2),
            next(),
        ));
        new.push(change(
            1,
            "u",
            2000 + i,
            Value::Null,
            acc(2000 + i, 3, 2),
            next(),
        ));
        // Two changes of another account per block: entity i's changes sit at the same positions on both
        // partitions, so their batches run at the same time.
        new.push(change(
            1,
            "c",
            3000 + i,
            Value::Null,
            acc(3000 + i, 1, 1),
            next(),
        ));
        new.push(change(
            1,
            "u",
            3000 + i,
            Value::Null,
            acc(3000 + i, 4, 2),
            next(),
        ));
    }
    produce_singly(&topic, &new);
    let out = run_caught_up(&p.path);
    let t = out.tally();
    // Serially: the deletes and the newer updates land, the other version 2 of 1001.. is a conflict.
    assert_eq!(
        (t.consumed, t.landed, out.stale()),
        (5 * n as u64, 4 * n as u64, n as u64)
    );
    let check = |db: &Db, c: Counts| {
        for (table, live_rows) in [("acc_t", "acc_t"), ("acc_c", "acc_c")] {
            let deleted = if table == "acc_c" {
                " AND _deleted_at IS NULL"
            } else {
                ""
            };
            assert_eq!(
                db.i64(&format!(
                    "SELECT count(*) FROM {{s}}.{live_rows} WHERE id <= 1000{deleted}"
                )),
                0,
                "{table}: deleted accounts resurrected"
            );
            assert_eq!(
                db.i64(&format!(
                    "SELECT count(*) FROM {{s}}.{table} WHERE id > 2000 AND balance = 3 AND _version = '{{2}}'{deleted}"
                )),
                n,
                "{table}: newest updates"
            );
            assert_eq!(
                db.i64(&format!(
                    "SELECT count(*) FROM {{s}}.replaysafe_conflicts c JOIN {{s}}.{table} t ON t.id = (c.entity->>'id')::bigint \
                     WHERE c.projection = '{table}' AND c.version = '{{2}}' AND (c.stored->>'balance')::bigint = t.balance \
                     AND t.id BETWEEN 1001 AND 1999 \
                     AND (c.stored->>'balance')::bigint + (c.incoming->>'balance')::bigint = 300 + 2 * (t.id - 1000)"
                )),
                n,
                "{table}: conflicts"
            );
        }
        assert_eq!(
            db.i64(
                "SELECT count(*) FROM {s}.acc_t_tombstones WHERE id <= 1000 AND _version = '{2}'"
            ),
            n
        );
        assert_eq!(db.i64("SELECT count(*) FROM {s}.acc_t_tombstones"), n);
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.acc_c WHERE id <= 1000 AND _deleted_at IS NOT NULL AND _version = '{2}'"),
            n
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
            2 * n
        );
        // Every delete landed; of each conflicting pair exactly one landed; the outbox holds every claimed
        // change, both of each conflicting pair and the stale ones (issue 34: the row projections' verdict only).
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.outbox WHERE payload->>'_op' = 'd'"),
            n
        );
        assert_eq!(
            db.i64(
                "SELECT count(*) FROM {s}.outbox WHERE payload->>'_op' = 'u' \
                 AND ((payload->>'_entity')::jsonb->>'id')::bigint BETWEEN 1001 AND 1999"
            ),
            2 * n
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.outbox"),
            c.landed + c.stale
        );
        assert_eq!(
            (c.consumed, c.duplicate, c.conflicts),
            (10 * n, 0, n),
            "{c:?}"
        );
        assert_eq!(c.landed + c.stale, 10 * n, "{c:?}");
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.acc_t WHERE id > 3000 AND balance = 4 AND _version = '{2}'"),
            n
        );
        assert!(c.stale >= n, "at least the n conflicts are stale: {c:?}");
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 10 * n);
    };
    check(
        &live,
        Counts {
            consumed: 10 * n,
            landed: 9 * n,
            duplicate: 0,
            stale: n,
            conflicts: Counts::of(&out).conflicts,
        },
    );
    let serial = dbz_state(&live, false);
    let serial_masked = dbz_state(&live, true);
    // Replays into fresh schemas: both partitions at once, batch sizes 5000 and 1.
    for max in [5000, 200, 1] {
        let db = Db::fresh("moved");
        let text = DBZ_ROWS.replace("MAXREC", &max.to_string());
        let out = run_text(&text, &topic, &unique("g"), &db);
        check(&db, Counts::of(&out));
        same(
            &dbz_state(&db, true),
            &serial_masked,
            &format!("max-records {max}"),
        );
    }
    // The live replica replayed under a fresh group: every record a duplicate, nothing changes.
    let out = run_text(&text, &topic, &unique("g"), &live);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate),
        (10 * n as u64, 0, 10 * n as u64)
    );
    same(&dbz_state(&live, false), &serial, "replay");
}

/// A row projection (columns `customer`, `status`; not the version), a counter and an outbox.
const UNCHANGED_JSON: &str = concat!(
    header!(),
    r#"[batch]
max-records = MAXREC
[fields]
id = { path = "/id", type = "text" }
customer = { path = "/customer", type = "text" }
status = { path = "/status", type = "text" }
v = { path = "/v", type = "bigint" }
[identity]
key = ["id"]
[[projection]]
kind = "row"
table = "customers"
key = ["customer"]
version = "v"
columns = ["customer", "status"]
[[projection]]
kind = "counter"
table = "events"
group-by = ["customer"]
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["id", "customer", "status", "v"]
"#
);

/// Issue 19, item 1 (JSON): a strictly newer version whose row columns did not change is a real event: `landed`
/// (counter and outbox see it; the row keeps its state and takes the new version and delivery). An equal
/// version with a state already claimed there is a copy — also an older version's, after the row moved on (issue
/// 34): a duplicate for the row and the counter (the same customer), while the outbox gets every event id. The
/// same under batch sizes 1 and 5000.
#[test]
fn newer_version_with_unchanged_row_lands() {
    let topic = new_topic("unch", 1);
    let ev = |id: &str, status: &str, v: i64| {
        let body = json!({"id": id, "customer": "c1", "status": status, "v": v});
        Rec::json(0, id, &body.to_string(), 1_760_000_000_000)
    };
    produce(
        &topic,
        &[
            ev("e1", "active", 1),
            ev("e2", "active", 2),
            // The same version and state under another event id: a copy.
            ev("e3", "active", 2),
            // The older version's state again under another event id: a copy too, though v2 is stored.
            ev("e0", "active", 1),
        ],
    );
    for max in [5000, 1] {
        let db = Db::fresh("unch");
        let text = UNCHANGED_JSON.replace("MAXREC", &max.to_string());
        let out = run_text(&text, &topic, &unique("g"), &db);
        let t = out.tally();
        assert_eq!(
            (t.consumed, t.landed, t.duplicate, out.stale()),
            (4, 4, 0, 0),
            "max-records {max}: {}",
            out.stdout
        );
        assert_eq!(db.i64("SELECT n FROM {s}.events WHERE customer = 'c1'"), 2);
        assert_eq!(
            db.strings("SELECT payload->>'id' FROM {s}.outbox ORDER BY id"),
            vec!["e1", "e2", "e3", "e0"]
        );
        let r = db.query(
            "SELECT status, _version, _delivery FROM {s}.customers WHERE customer = 'c1'",
            &[],
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].get::<_, String>(0), "active");
        assert_eq!(r[0].get::<_, Vec<i64>>(1), vec![2]);
        assert!(r[0].get::<_, String>(2).contains("e2"), "max-records {max}");
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 4);
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 0);
    }
}

/// The Debezium layout of `reference-debezium.toml`: the row projection keeps id/owner/balance, the outbox payload
/// carries `status` (a column the row projection does not keep), a counter counts changes per op.
const UNCHANGED_DBZ: &str = concat!(
    debezium_header!(),
    r#"[batch]
max-records = MAXREC
[fields]
status = { path = "/after/status", type = "text", optional = true }
[[projection]]
kind = "row"
table = "accounts"
source-table = "public.accounts"
key = ["id"]
columns = { id = "bigint", owner = "text", balance = "bigint" }
[[projection]]
kind = "outbox"
table = "account_events"
payload = ["_op", "_entity", "status"]
snapshots = "skip"
[[projection]]
kind = "counter"
table = "changes"
group-by = ["_op"]
snapshots = "include"
"#
);

/// Issue 19, item 1 (Debezium): an update changing only `status` (not kept by the row projection, carried by the
/// outbox) lands — one outbox row, counted — and the row takes its version; a resnapshot read (`op = r`) of the
/// unchanged row is a `duplicate` with no side effects (no outbox row, no count, even with `snapshots =
/// "include"`).
#[test]
fn debezium_update_of_an_unkept_column_lands() {
    let topic = new_topic("unchd", 1);
    let row = |status: &str| json!({"id": 7, "owner": "o7", "balance": 5, "status": status});
    produce(
        &topic,
        &[
            change(0, "c", 7, Value::Null, row("new"), 100),
            change(0, "u", 7, Value::Null, row("verified"), 200),
            change(0, "r", 7, Value::Null, row("verified"), 300),
        ],
    );
    for max in [5000, 1] {
        let db = Db::fresh("unchd");
        let text = UNCHANGED_DBZ.replace("MAXREC", &max.to_string());
        let out = run_text(&text, &topic, &unique("g"), &db);
        let t = out.tally();
        assert_eq!(
            (t.consumed, t.landed, t.duplicate, out.stale()),
            (3, 2, 1, 0),
            "max-records {max}: {}",
            out.stdout
        );
        assert_eq!(
            db.strings("SELECT payload->>'_op' || ' ' || (payload->>'status') FROM {s}.account_events ORDER BY id"
            ),
            vec!["c new", "u verified"]
        );
        assert_eq!(
            db.strings("SELECT _op || ' ' || n FROM {s}.changes ORDER BY 1"),
            vec!["c 1", "u 1"]
        );
        let r = db.query(
            "SELECT owner, balance, _version FROM {s}.accounts WHERE id = 7",
            &[],
        );
        assert_eq!(r[0].get::<_, String>(0), "o7");
        assert_eq!(r[0].get::<_, i64>(1), 5);
        // The resnapshot's consistent point is the newest version (applied under the guard, no side effects); a
        // read with a null `sequence[0]` is [S, 0].
        assert_eq!(r[0].get::<_, Vec<i64>>(2), vec![300, 0]);
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 3);
    }
}

/// The conflict rows, per projection: `projection entity version stored incoming` (amounts only).
fn conflict_lines(db: &Db) -> Vec<String> {
    db.strings("SELECT projection || ' ' || (entity->>'customer_id') || ' ' || version::text || ' ' || \
         coalesce(stored->>'amount', stored::text) || ' ' || coalesce(incoming->>'amount', incoming::text) \
         FROM {s}.replaysafe_conflicts ORDER BY 1",
    )
}

/// An equal-version conflict is recorded whichever of the two states committed first: a change at the version of
/// a delete that arrives later from the other partition is a conflict against the tombstone (not a plain `stale`
/// that nothing records), exactly as a delete at the version of a stored row is one. Customer `d`: the close (v2)
/// commits first, then a change at v2 arrives from partition 0; customer `u`: the change at v2 first, then the
/// close at v2 from partition 1. Both tombstone modes, batch sizes 1 and 5000; the version's winner (a delete, else
/// the smaller state hash) is kept whichever committed first: both customers end deleted, each conflict row names
/// the delete as stored; replays under a fresh group and under a new generation change nothing (every state was
/// claimed at its version: all duplicates).
#[test]
fn equal_version_after_a_delete_is_a_conflict() {
    let topic = new_topic("eqdel", 2);
    let ev = |partition: i32, id: &str, customer: &str, ty: &str, amount: Value| {
        let body = json!({"event_id": id, "event_type": ty, "customer_id": customer, "amount": amount, "version": 2});
        Rec::json(partition, id, &body.to_string(), 1_760_000_000_000)
    };
    let first = [
        ev(1, "d-close", "d", "CustomerClosed", Value::Null),
        ev(0, "u-change", "u", "CustomerChanged", json!(7)),
    ];
    let second = [
        ev(0, "d-change", "d", "CustomerChanged", json!(9)),
        ev(1, "u-close", "u", "CustomerClosed", Value::Null),
    ];
    produce(&topic, &first);
    let dbs: Vec<(Db, String)> = [5000, 1]
        .iter()
        .map(|max| {
            let db = Db::fresh("eqdel");
            let text = JSON_ROWS.replace("MAXREC", &max.to_string());
            let group = unique("g");
            let out = run_text(&text, &topic, &group, &db);
            let t = out.tally();
            assert_eq!((t.consumed, t.landed), (2, 2), "{}", out.stdout);
            (db, text)
        })
        .collect();
    produce(&topic, &second);
    let want_conflicts = vec![
        "cust_c d {2} null 9",
        "cust_c u {2} null 7",
        "cust_t d {2} null 9",
        "cust_t u {2} null 7",
    ];
    let state = |db: &Db| {
        [
            db.strings("SELECT customer_id || ' ' || coalesce(amount::text, '-') || ' ' || _version::text FROM {s}.cust_t ORDER BY 1",
            ),
            db.strings("SELECT customer_id || ' ' || _version::text FROM {s}.cust_t_tombstones ORDER BY 1",
            ),
            db.strings("SELECT customer_id || ' ' || _version::text || ' ' || (_deleted_at IS NOT NULL)::text \
                 FROM {s}.cust_c ORDER BY 1",
            ),
            db.strings("SELECT payload->>'event_id' FROM {s}.outbox ORDER BY 1"),
        ]
        .concat()
    };
    let want_state = vec![
        "d {2}",
        "u {2}",
        "d {2} true",
        "u {2} true",
        // The outbox: every claimed event, the conflicting ones too (issue 34).
        "d-change",
        "d-close",
        "u-change",
        "u-close",
    ];
    for (db, text) in &dbs {
        // The same group continues with the second pair: both records are conflicts.
        let group = db
            .text("SELECT min(consumer_group) FROM {s}.replaysafe_checkpoints")
            .unwrap();
        let out = run_text(text, &topic, &group, db);
        let t = out.tally();
        assert_eq!(
            (t.consumed, t.landed, t.duplicate, out.stale()),
            (2, 0, 0, 2),
            "{}",
            out.stdout
        );
        assert!(
            out.stdout.contains("[stale: 2 conflict(s)]"),
            "{}",
            out.stdout
        );
        assert_eq!(conflict_lines(db), want_conflicts, "{text}");
        assert_eq!(state(db), want_state);
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 4);
    }
    // Replays: a fresh group (every record a duplicate) and a new generation (claimed again, judged again: the
    // same two conflicts, not recorded twice).
    let (db, text) = &dbs[0];
    let out = run_text(text, &topic, &unique("g"), db);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, out.stale()),
        (4, 0, 4, 0),
        "{}",
        out.stdout
    );
    let text2 = text.replace("[identity]\n", "[identity]\ngeneration = \"g2\"\n");
    let out = run_text(&text2, &topic, &unique("g"), db);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, out.stale()),
        (4, 0, 4, 0),
        "{}",
        out.stdout
    );
    assert_eq!(conflict_lines(db), want_conflicts);
    assert_eq!(state(db), want_state);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 8);
}

/// One JSON event of the randomized stream: partition, event id, customer, delete?, amount, version.
#[derive(Clone, Debug)]
struct Ev {
    partition: i32,
    id: String,
    customer: String,
    delete: bool,
    amount: i64,
    version: i64,
}

impl Ev {
    /// The state the event gives its entity: `D` for a delete, else the amount.
    fn state(&self) -> String {
        if self.delete {
            "D".into()
        } else {
            self.amount.to_string()
        }
    }
}

/// A deterministic pseudo-random stream: `n` customers, 1–6 events each, versions 1–4 (repeats: equal versions
/// with equal or different states), a quarter deletes, amounts from {1, 2, 3}, spread over 3 partitions.
fn random_stream(n: usize, seed: u64) -> Vec<Ev> {
    let mut next = seeded_random(seed);
    let mut out = Vec::new();
    for c in 0..n {
        for e in 0..(1 + next(6)) {
            out.push(Ev {
                partition: next(3) as i32,
                id: format!("r{c}-{e}"),
                customer: format!("r{c}"),
                delete: next(4) == 0,
                amount: 1 + next(3) as i64,
                version: 1 + next(4) as i64,
            });
        }
    }
    // Interleave the customers' events (each partition keeps its events in this order).
    let mut mixed = Vec::new();
    while !out.is_empty() {
        let i = next(out.len() as u64) as usize;
        mixed.push(out.remove(i));
    }
    mixed
}

/// Checks a final state against the serial oracle, whatever the arrival order: per entity and projection the
/// stored version is the highest, its state one of that version's states (the only one when they agree; a
/// tombstone when that is a delete; never a live row next to a tombstone); every other state at that version is
/// a recorded conflict against the stored one; both projections keep the same winner; outbox = landed + stale; ledger =
/// every record. Returns the winners (`customer -> state`).
fn check_oracle(
    db: &Db,
    evs: &[Ev],
    out: &[&Out],
    ctx: &str,
) -> std::collections::BTreeMap<String, String> {
    use std::collections::{BTreeMap, BTreeSet};
    // What the other projections saw: the landed and the stale records (issue 34).
    let mut landed = 0;
    let mut consumed = 0;
    for o in out {
        let t = o.tally();
        landed += t.landed as i64 + o.stale() as i64;
        consumed += t.consumed as i64;
    }
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        evs.len() as i64,
        "{ctx}"
    );
    // No runs given: one crashed (no accounting line); the caller checks the outbox.
    if !out.is_empty() {
        assert!(consumed >= evs.len() as i64, "{ctx}: consumed {consumed}");
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.outbox"),
            landed,
            "{ctx}: outbox = landed + stale"
        );
    }
    let mut by: BTreeMap<String, Vec<&Ev>> = BTreeMap::new();
    for e in evs {
        by.entry(e.customer.clone()).or_default().push(e);
    }
    let live_t: BTreeMap<String, (String, i64)> = db
        .query(
            "SELECT customer_id, coalesce(amount::text, '-'), _version[1] FROM {s}.cust_t",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let tomb_t: BTreeMap<String, i64> = db
        .query(
            "SELECT customer_id, _version[1] FROM {s}.cust_t_tombstones",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let col: BTreeMap<String, (String, i64)> = db
        .query(
            "SELECT customer_id, CASE WHEN _deleted_at IS NOT NULL THEN 'D' ELSE coalesce(amount::text, '-') END, \
             _version[1] FROM {s}.cust_c",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let conflicts: Vec<(String, String, i64, String, String)> = db
        .query(
            "SELECT projection, entity->>'customer_id', version[1], coalesce(stored->>'amount', 'D'), \
             coalesce(incoming->>'amount', 'D') FROM {s}.replaysafe_conflicts",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let mut winners = BTreeMap::new();
    for (c, es) in &by {
        let maxv = es.iter().map(|e| e.version).max().unwrap();
        let at_max: BTreeSet<String> = es
            .iter()
            .filter(|e| e.version == maxv)
            .map(|e| e.state())
            .collect();
        let t_state = match (live_t.get(c), tomb_t.get(c)) {
            (Some((a, v)), None) => (a.clone(), *v),
            (None, Some(v)) => ("D".to_string(), *v),
            other => panic!("{ctx}: {c}: cust_t live and tombstone {other:?}; events {es:?}"),
        };
        let c_state = col
            .get(c)
            .cloned()
            .unwrap_or_else(|| panic!("{ctx}: {c} missing in cust_c"));
        assert_eq!(t_state.1, maxv, "{ctx}: {c} cust_t version; events {es:?}");
        assert_eq!(
            c_state, t_state,
            "{ctx}: {c}: both projections keep the same winner; events {es:?}"
        );
        assert!(
            at_max.contains(&t_state.0),
            "{ctx}: {c}: {t_state:?} not a state of v{maxv}; events {es:?}"
        );
        for proj in ["cust_t", "cust_c"] {
            let recorded: BTreeSet<String> = conflicts
                .iter()
                .filter(|k| k.0 == proj && &k.1 == c && k.2 == maxv)
                .map(|k| {
                    assert_eq!(k.3, t_state.0, "{ctx}: {c}: conflict's stored state");
                    k.4.clone()
                })
                .collect();
            let want: BTreeSet<String> = at_max
                .iter()
                .filter(|s| **s != t_state.0)
                .cloned()
                .collect();
            assert_eq!(
                recorded, want,
                "{ctx}: {proj} {c}: conflicts at v{maxv}; events {es:?}"
            );
        }
        winners.insert(c.clone(), t_state.0);
    }
    assert_eq!(
        live_t.len() + tomb_t.len(),
        by.len(),
        "{ctx}: no other entities"
    );
    winners
}

/// Issue 18 against a serial oracle: a pseudo-random stream (equal versions with equal and different states,
/// deletes, older versions) of one customer's events spread over 3 partitions, applied with batch sizes 5000 and
/// 1, and by two `run` processes of one group side by side (batch size 5); then replays under a fresh group (all
/// duplicates) and under a new generation (exactly: the records at the winning version with the winning state
/// are duplicates, those with another state conflicts, everything else stale; nothing changes).
#[test]
fn json_random_stream_matches_the_serial_oracle() {
    let evs = random_stream(120, 18);
    let topic = new_topic("orac", 3);
    let recs: Vec<Rec> = evs
        .iter()
        .map(|e| {
            let body = json!({"event_id": e.id, "event_type": if e.delete { "CustomerClosed" } else { "CustomerChanged" },
                "customer_id": e.customer, "amount": e.amount, "version": e.version});
            Rec::json(e.partition, &e.id, &body.to_string(), 1_760_000_000_000)
        })
        .collect();
    produce_singly(&topic, &recs);
    let mut kept: Option<(Db, String, std::collections::BTreeMap<String, String>)> = None;
    for max in [5000, 1] {
        let db = Db::fresh("orac");
        let text = JSON_ROWS.replace("MAXREC", &max.to_string());
        let out = run_text(&text, &topic, &unique("g"), &db);
        let w = check_oracle(&db, &evs, &[&out], &format!("max-records {max}"));
        kept.get_or_insert((db, text, w));
    }
    // Two processes of one group, side by side; a third run finishes what a rebalance left.
    {
        let db = Db::fresh("orac");
        let text = JSON_ROWS.replace("MAXREC", "5");
        let p = pipeline(&text, &topic, &unique("g"), &db.schema);
        let cfg = p.path.to_str().unwrap().to_string();
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let cfg = cfg.clone();
                std::thread::spawn(move || try_run(&cfg))
            })
            .collect();
        let mut outs: Vec<Out> = workers.into_iter().map(|h| h.join().unwrap()).collect();
        for o in &outs {
            o.assert_ok();
        }
        outs.push(run_caught_up(&p.path));
        let refs: Vec<&Out> = outs.iter().collect();
        check_oracle(&db, &evs, &refs, "two processes");
    }
    // A crash (abort) between the first database commit and its Kafka commit, then the same group again: the
    // committed batch is not applied twice, the rest lands, the state is the oracle's.
    {
        let db = Db::fresh("orac");
        let text = JSON_ROWS.replace("MAXREC", "5");
        let p = pipeline(&text, &topic, &unique("g"), &db.schema);
        let cfg = p.path.to_str().unwrap();
        let crashed = try_run_with(cfg, &[CRASH_AFTER_DB_COMMIT], Duration::from_secs(120));
        assert_ne!(crashed.code, Some(0), "{}", crashed.stderr);
        let landed_before = db.i64("SELECT count(*) FROM {s}.outbox");
        assert!(landed_before > 0);
        let ledger_before = db.i64("SELECT count(*) FROM {s}.replaysafe_ledger");
        let out = run_caught_up(&p.path);
        check_oracle(&db, &evs, &[], "crash between the commits");
        let t = out.tally();
        assert_eq!(
            t.consumed as i64,
            evs.len() as i64 - ledger_before,
            "the restart reads from the checkpoint exactly what the crashed run had not committed: {}",
            out.stdout
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.outbox"),
            landed_before + t.landed as i64 + out.stale() as i64,
            "the outbox holds each landed or stale record once"
        );
    }
    let (db, text, _winners) = kept.unwrap();
    let before = full_json_state(&db);
    let out = run_text(&text, &topic, &unique("g"), &db);
    let t = out.tally();
    let n = evs.len() as u64;
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, out.stale()),
        (n, 0, n, 0),
        "{}",
        out.stdout
    );
    same(&full_json_state(&db), &before, "replay, fresh group");
    // A new generation: every record claimed again, and its state was claimed at its version before: all
    // duplicates, whatever is stored now.
    let text2 = text.replace("[identity]\n", "[identity]\ngeneration = \"g2\"\n");
    let out = run_text(&text2, &topic, &unique("g"), &db);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, out.stale()),
        (n, 0, n, 0),
        "{}",
        out.stdout
    );
    same(&full_json_state(&db), &before, "replay, new generation");
}
