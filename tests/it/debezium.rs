//! End to end with real Debezium (3.6.1.Final PostgreSQL connector under Kafka Connect standalone, started by
//! `scripts/connect-start`): a source table with numeric, timestamp, timestamptz, date, json, uuid, bytea, text[]
//! and a TOASTed text column gets inserts, updates, a delete, a re-insert, a primary-key change and a truncate; the
//! projection equals the source table afterwards, with `schemas.enable` on and off; a resnapshot (Connect
//! restarted with its offsets deleted) leaves the projection unchanged with no side effects.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;
use crate::connect::{drop_slot, read_values, unique_name, Connect};

const COLUMNS: &str =
    "id bigint PRIMARY KEY, amount numeric(12,2), created timestamp(6), seen timestamptz, \
    due date, doc json, uid uuid, blob bytea, tags text[], note text";
const COMPARED: &str = "id, amount, created, seen, due, doc::text, uid, blob, tags, note";

/// Rows in one table and not the other, both ways (typed comparison; json as text), as text for messages.
fn differences(db: &Db, src: &str) -> String {
    let shown = "id, amount::text, created::text, seen::text, due::text, doc::text, uid::text, \
        left(encode(blob, 'hex'), 40), left(tags::text, 60), left(note, 40), length(note)";
    let side = |a: &str, b: &str| -> Vec<String> {
        db.query(
            &format!(
                "SELECT {shown} FROM {a}.items WHERE ({COMPARED}) IN \
                 (SELECT {COMPARED} FROM {a}.items EXCEPT SELECT {COMPARED} FROM {b}.items)"
            ),
            &[],
        )
        .iter()
        .map(|r| {
            (0..r.len())
                .map(|i| {
                    r.try_get::<_, Option<String>>(i)
                        .ok()
                        .flatten()
                        .or_else(|| {
                            r.try_get::<_, Option<i64>>(i)
                                .ok()
                                .flatten()
                                .map(|v| v.to_string())
                        })
                        .or_else(|| {
                            r.try_get::<_, Option<i32>>(i)
                                .ok()
                                .flatten()
                                .map(|v| v.to_string())
                        })
                        .unwrap_or_else(|| "NULL".into())
                })
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect()
    };
    let only_src = side(src, "{s}");
    let only_proj = side("{s}", src);
    if only_src.is_empty() && only_proj.is_empty() {
        String::new()
    } else {
        format!("only in source: {only_src:#?}\nonly in projection: {only_proj:#?}")
    }
}

fn payload(v: &Value) -> &Value {
    match v {
        Value::Object(m)
            if m.len() == 2 && m.contains_key("schema") && m.contains_key("payload") =>
        {
            &m["payload"]
        }
        other => other,
    }
}

/// Waits until the topic holds a change whose row has `id`.
fn wait_for_id(topic: &str, id: i64, op: &str) {
    read_values(topic, Duration::from_secs(120), |vs| {
        vs.iter().any(|v| {
            let p = payload(v);
            p["op"] == op && p["after"]["id"] == id
        })
    });
}

fn count_op(topic: &str, op: &str, at_least: usize) -> usize {
    read_values(topic, Duration::from_secs(120), |vs| {
        vs.iter().filter(|v| payload(v)["op"] == op).count() >= at_least
    })
    .iter()
    .filter(|v| payload(v)["op"] == op)
    .count()
}

fn scenario(schemas_enable: bool) {
    let db = Db::fresh("dbz");
    let src = unique_name("dbzsrc");
    db.execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.items ({COLUMNS}); ALTER TABLE {src}.items REPLICA IDENTITY DEFAULT;
         INSERT INTO {src}.items (id, amount, note) VALUES (0, 0.00, 'snapshot row');
         CREATE TABLE {{s}}.items ({COLUMNS})"
    ));
    let dir = tempfile::tempdir().unwrap();
    let table = format!("{src}.items");
    let mut connect = Connect::start(
        &dir.path().join(&src),
        &[
            ("topic.prefix", &src),
            ("table.include.list", &table),
            // bytes (the default): an unchanged TOASTed bytea arrives as the base64 placeholder; in base64 mode
            // Debezium sends null, indistinguishable from SQL NULL.
            ("binary.handling.mode", "bytes"),
        ],
        schemas_enable,
    );
    let topic = connect.topic(&src, "items");
    let text = format!(
        r#"{DEBEZIUM_HEADER}[batch]
linger-ms = 10
# Columns and key come from the existing table (same DDL as the source).
[[projection]]
kind = "row"
table = "items"
source-table = "{src}.items"
truncate = "truncate"
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["_op", "_entity", "_position"]
"#
    );
    let run = |group: &str| -> Out {
        let p = pipeline(&text, &topic, group, &db.schema);
        let out = run_caught_up(&p.path);
        out.assert_ok();
        out
    };
    let group = unique("g");

    // Phase 1: insert (large incompressible TOASTed note/blob/tags), updates leaving them unchanged, delete,
    // re-insert, a primary-key change, two updates in one transaction, a row of NULLs.
    let phase1 = format!(
        "INSERT INTO {src}.items VALUES (1, 123.45, '2024-01-02 03:04:05.123456', '2024-01-02 01:04:05.5+00', \
           '2024-12-31', '{{\"a\": [1, 2], \"b\": \"x\"}}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', \
           (SELECT string_agg(decode(md5(g::text), 'hex'), ''::bytea) FROM generate_series(1, 700) g), \
           (SELECT array_agg(md5(g::text)) FROM generate_series(1, 400) g) || ARRAY[NULL, 'a b', 'x,y'], \
           (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 500) g));
         UPDATE {src}.items SET amount = -7.90 WHERE id = 1;
         UPDATE {src}.items SET due = '2025-01-01', seen = '2024-06-30 23:59:59.999999+02' WHERE id = 1;
         INSERT INTO {src}.items (id, amount, note) VALUES (2, 2.00, 'two');
         DELETE FROM {src}.items WHERE id = 2;
         INSERT INTO {src}.items (id, amount, note, tags) VALUES (2, 22.00, 'two again', '{{}}');
         UPDATE {src}.items SET id = 3 WHERE id = 1;
         BEGIN; UPDATE {src}.items SET amount = 1 WHERE id = 3; UPDATE {src}.items SET amount = 2 WHERE id = 3; COMMIT;
         INSERT INTO {src}.items (id) VALUES (4);
         INSERT INTO {src}.items (id, note) VALUES (900, 'marker 1');"
    );
    // One transaction per line.
    for stmt in phase1.split(";\n") {
        db.execute(stmt);
    }
    wait_for_id(&topic, 900, "c");
    let out = run(&group);
    let dead: Vec<String> = db.column("SELECT \"offset\"::text || ' ' || reason || ': ' || detail FROM {s}.replaysafe_dead_letters");
    assert!(dead.is_empty(), "dead letters: {dead:#?}\n{}", out.stdout);
    assert_eq!(
        differences(&db, &src),
        "",
        "projection = source after phase 1"
    );
    assert_eq!(
        db.i64(&format!("SELECT count(*) FROM {src}.items")),
        db.i64("SELECT count(*) FROM {s}.items")
    );
    // Column by column, types included.
    let types = |schema: &str| -> Vec<(String, String)> {
        db.query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = 'items' AND a.attnum > 0 AND NOT a.attisdropped \
             AND a.attname NOT LIKE '\\_%' ORDER BY a.attnum",
            &[&schema],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    };
    assert_eq!(types(&src).len(), 10);
    assert_eq!(types(&src), types(&db.schema));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.items_tombstones WHERE id = 1"),
        1,
        "the old primary key is a tombstone"
    );
    assert_eq!(
        db.i64("SELECT length(note)::bigint FROM {s}.items WHERE id = 3"),
        16000,
        "the TOASTed note survived updates that did not carry it"
    );

    // Phase 2: TRUNCATE (policy `truncate`), then new rows and a re-used key.
    for stmt in [
        format!("TRUNCATE {src}.items"),
        format!("INSERT INTO {src}.items (id, amount, note) VALUES (3, 3.33, 'after truncate'), (5, 5.00, 'five')"),
        format!("INSERT INTO {src}.items (id, note) VALUES (901, 'marker 2')"),
    ] {
        db.execute(&stmt);
    }
    wait_for_id(&topic, 901, "c");
    run(&group);
    assert_eq!(
        differences(&db, &src),
        "",
        "projection = source after the truncate"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.items_tombstones WHERE id IN (0, 2, 4, 900)"),
        4
    );

    // Phase 3: a resnapshot (offsets deleted): no change, no side effect.
    let outbox = db.i64("SELECT count(*) FROM {s}.outbox");
    let rows = db.i64(&format!("SELECT count(*) FROM {src}.items")) as usize;
    let snapshot_reads = count_op(&topic, "r", 1);
    connect.stop();
    connect.reset_offsets();
    connect.restart();
    count_op(&topic, "r", snapshot_reads + rows);
    let out = run(&group);
    let t = out.tally();
    assert_eq!(
        t.landed, 0,
        "a resnapshot of unchanged rows applies nothing: {}",
        out.stdout
    );
    assert_eq!(t.duplicate as usize, rows);
    assert_eq!(differences(&db, &src), "");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox"),
        outbox,
        "no side effects"
    );

    // A full replay of the topic under another group changes nothing either.
    let t = run(&unique("g")).tally();
    assert_eq!(t.landed, 0);
    assert_eq!(differences(&db, &src), "");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), outbox);

    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    db.execute(&format!("DROP SCHEMA {src} CASCADE"));
}

#[test]
fn debezium_end_to_end_schemas_enabled() {
    scenario(true);
}

#[test]
fn debezium_end_to_end_schemas_disabled() {
    scenario(false);
}

/// Issue 20: a version column under REPLICA IDENTITY DEFAULT (a delete's `before` holds only the key) while a
/// column is dropped and re-added at the source mid-stream: the projection equals the source after the first
/// run, and still after the whole topic is replayed under a new generation and group (every record claimed
/// again): a key-only delete never removes the row re-created after it.
#[test]
fn debezium_version_column_key_only_deletes_and_column_drop() {
    let db = Db::fresh("dbzv");
    let src = unique_name("dbzvsrc");
    let cols = "id bigint PRIMARY KEY, name text, extra text, version bigint NOT NULL";
    db.execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.items ({cols}); ALTER TABLE {src}.items REPLICA IDENTITY DEFAULT;
         INSERT INTO {src}.items VALUES (0, 'snapshot row', 'x0', 1);
         CREATE TABLE {{s}}.items ({cols})"
    ));
    let dir = tempfile::tempdir().unwrap();
    let table = format!("{src}.items");
    let mut connect = Connect::start(
        &dir.path().join(&src),
        &[("topic.prefix", &src), ("table.include.list", &table)],
        false,
    );
    let topic = connect.topic(&src, "items");
    let text = format!(
        r#"{DEBEZIUM_HEADER}[batch]
linger-ms = 10
[identity]
generation = "GENERATION"
[[projection]]
kind = "row"
table = "items"
source-table = "{src}.items"
version = "version"
"#
    );
    let run = |generation: &str| -> Out {
        let p = pipeline(
            &text.replace("GENERATION", generation),
            &topic,
            &unique("g"),
            &db.schema,
        );
        run_caught_up(&p.path)
    };
    let same = |what: &str| {
        let cmp = "id, name, extra, version";
        let diff = |a: &str, b: &str| {
            db.i64(&format!(
                "SELECT count(*) FROM (SELECT {cmp} FROM {a}.items EXCEPT SELECT {cmp} FROM {b}.items) d"
            ))
        };
        let rows: Vec<String> = db.column(
            "SELECT id::text || ' ' || coalesce(name, 'NULL') || ' ' || coalesce(extra, 'NULL') || ' v' || \
             version::text FROM {s}.items ORDER BY id",
        );
        assert_eq!(
            (diff(&src, "{s}"), diff("{s}", &src)),
            (0, 0),
            "projection = source {what}: projection {rows:?}"
        );
    };
    for stmt in [
        format!("INSERT INTO {src}.items VALUES (1, 'one', 'x1', 1), (2, 'two', 'x2', 1)"),
        format!("DELETE FROM {src}.items WHERE id = 1"),
        format!("INSERT INTO {src}.items VALUES (1, 'one again', 'x1b', 2)"),
        format!("UPDATE {src}.items SET name = 'two b', version = 2 WHERE id = 2"),
        format!("ALTER TABLE {src}.items DROP COLUMN extra"),
        format!("INSERT INTO {src}.items (id, name, version) VALUES (3, 'three', 1)"),
        format!("DELETE FROM {src}.items WHERE id = 2"),
        format!("DELETE FROM {src}.items WHERE id = 0"),
        format!("ALTER TABLE {src}.items ADD COLUMN extra text"),
        format!("UPDATE {src}.items SET extra = 'e' || id, version = version + 1"),
        format!("DELETE FROM {src}.items WHERE id = 3"),
        format!("INSERT INTO {src}.items (id, name, version) VALUES (3, 'three again', 5)"),
        format!("INSERT INTO {src}.items (id, name, version) VALUES (900, 'marker', 1)"),
    ] {
        db.execute(&stmt);
    }
    wait_for_id(&topic, 900, "c");
    let deletes: Vec<Value> = read_values(&topic, Duration::from_secs(60), |vs| {
        vs.iter().filter(|v| payload(v)["op"] == "d").count() >= 4
    })
    .into_iter()
    .filter(|v| payload(v)["op"] == "d")
    .map(|v| payload(&v)["before"].clone())
    .collect();
    assert_eq!(deletes.len(), 4, "{deletes:?}");
    let first = run("g1");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0,
        "{}\n{deletes:?}",
        first.stdout
    );
    same("after the first run");
    assert_eq!(
        db.column::<i64>("SELECT id FROM {s}.items_tombstones ORDER BY id"),
        vec![0, 2]
    );

    let again = run("g2");
    let t = again.tally();
    assert_eq!(t.landed, 0, "{}", again.stdout);
    assert_eq!(t.quarantined, 0, "{}", again.stdout);
    same("after a replay under a new generation");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 0);

    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    db.execute(&format!("DROP SCHEMA {src} CASCADE"));
}

/// Issue 34 item 3: a source transaction open across a resnapshot (Connect stopped, its offsets deleted,
/// restarted: a new snapshot while the transaction holds an update and a delete) commits after the snapshot.
/// Debezium streams it first after the snapshot with `sequence` `[null, L]`, its change LSNs L below the
/// snapshot's point. Its update and delete are newer than the snapshot reads: the replica ends with the committed
/// value and a tombstone, nothing stale; the same topic applied into a fresh schema (batch size 1 there, 5000
/// here) gives the same table, tombstones and accounting.
#[test]
fn transaction_open_across_a_resnapshot_is_newer_than_the_snapshot() {
    let src = unique_name("dbzopen");
    let cols = "id bigint PRIMARY KEY, v text";
    let dbs = [Db::fresh("dbzopen"), Db::fresh("dbzopen")];
    dbs[0].execute(&format!(
        "CREATE SCHEMA {src}; CREATE TABLE {src}.items ({cols}); \
         INSERT INTO {src}.items VALUES (1, 'one'), (2, 'two')"
    ));
    let dir = tempfile::tempdir().unwrap();
    let table = format!("{src}.items");
    let mut connect = Connect::start(
        &dir.path().join(&src),
        &[("topic.prefix", &src), ("table.include.list", &table)],
        false,
    );
    let topic = connect.topic(&src, "items");
    dbs[0].execute(&format!("UPDATE {src}.items SET v = 'one b' WHERE id = 1"));
    count_op(&topic, "u", 1);
    // The transaction: open across the resnapshot.
    let rt = runtime();
    let open = pg_client(&rt);
    rt.block_on(open.batch_execute(&format!(
        "BEGIN; UPDATE {src}.items SET v = 'committed after the snapshot' WHERE id = 1; \
         DELETE FROM {src}.items WHERE id = 2"
    )))
    .unwrap();
    connect.stop();
    connect.reset_offsets();
    connect.restart();
    count_op(&topic, "r", 4);
    rt.block_on(open.batch_execute("COMMIT")).unwrap();
    dbs[0].execute(&format!("INSERT INTO {src}.items VALUES (900, 'marker')"));
    wait_for_id(&topic, 900, "c");
    // The envelopes as Debezium wrote them: the open transaction's changes below the second snapshot's point.
    let values = read_values(&topic, Duration::from_secs(60), |vs| vs.len() >= 9);
    let src_of = |i: usize| &payload(&values[i])["source"];
    let lsn = |i: usize| src_of(i)["lsn"].as_i64().unwrap();
    let ops: Vec<String> = values
        .iter()
        .map(|v| payload(v)["op"].as_str().unwrap_or("tombstone").to_string())
        .collect();
    assert_eq!(
        ops,
        ["r", "r", "u", "r", "r", "u", "d", "tombstone", "c"],
        "{values:#?}"
    );
    // The open transaction: the first streamed after the second snapshot, `sequence[0]` null, its change LSNs
    // below the snapshot's point.
    for i in [5, 6] {
        assert!(
            src_of(i)["sequence"]
                .as_str()
                .unwrap()
                .starts_with("[null,"),
            "{values:#?}"
        );
        assert!(lsn(i) < lsn(3), "{values:#?}");
    }
    let text = format!(
        r#"{DEBEZIUM_HEADER}[batch]
max-records = MAXREC
linger-ms = 10
[[projection]]
kind = "row"
table = "items"
source-table = "{src}.items"
key = ["id"]
columns = {{ id = "bigint", v = "text" }}
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["_op", "_entity"]
"#
    );
    let mut seen = Vec::new();
    for (db, max) in dbs.iter().zip(["5000", "1"]) {
        let p = pipeline(
            &text.replace("MAXREC", max),
            &topic,
            &unique("g"),
            &db.schema,
        );
        let out = run_caught_up(&p.path);
        let t = out.tally();
        // r r u (landed: the reads and the first update), r r (the resnapshot: the row of id 1 at 'one b' and
        // of id 2 unchanged: duplicates), u d (the open transaction: landed), the Kafka tombstone (filtered),
        // c (landed).
        assert_eq!(
            (
                t.consumed,
                t.landed,
                t.duplicate,
                out.stale(),
                t.filtered,
                t.quarantined
            ),
            (9, 6, 2, 0, 1, 0),
            "batch size {max}: {}",
            out.stdout
        );
        let rows: Vec<String> = db.column("SELECT id::text || ' ' || v FROM {s}.items ORDER BY id");
        assert_eq!(
            rows,
            ["1 committed after the snapshot", "900 marker"],
            "batch size {max}"
        );
        let tombs: Vec<(i64, Vec<i64>)> = db
            .query(
                "SELECT id, _version FROM {s}.items_tombstones ORDER BY id",
                &[],
            )
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        // The delete took the snapshot's point as its last commit: [S, L].
        assert_eq!(tombs, [(2, vec![lsn(3), lsn(6)])], "batch size {max}");
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 0);
        let outbox: Vec<String> = db.column("SELECT payload->>'_op' FROM {s}.outbox ORDER BY id");
        seen.push((rows, tombs, outbox));
    }
    assert_eq!(seen[0], seen[1], "the same topic into a fresh schema");
    assert_eq!(
        dbs[0].strings(&format!(
            "SELECT id::text || ' ' || v FROM {src}.items ORDER BY id"
        )),
        seen[0].0,
        "the replica equals the source"
    );

    connect.stop();
    drop_slot(&connect.slot, &connect.publication);
    dbs[0].execute(&format!("DROP SCHEMA {src} CASCADE"));
}
