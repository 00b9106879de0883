//! Issue 20 (items 1, 2, 3, 5): CDC rows that ended wrong with exit 0. Hand-written Debezium envelopes (the
//! schemaless JSON converter's shape, some wrapped with a schema) against the final table, tombstones,
//! conflicts, dead letters and the accounting line — in both tombstone modes and at batch sizes 1 and 5000.

use serde_json::{json, Value};

use crate::common::*;

/// `customers (id, name, version)` ordered by the `version` column. GENERATION, MAXREC, TOMBSTONES, EXTRA are
/// substituted.
const CUSTOMERS: &str = concat!(
    debezium_header!(),
    r#"[batch]
max-records = MAXREC
linger-ms = 10
GENERATION
[[projection]]
kind = "row"
table = "customers"
key = ["id"]
columns = { id = "bigint", name = "text", version = "bigint" }
version = "version"
tombstones = "TOMBSTONES"
EXTRA
"#
);

fn customers(
    db: &Db,
    topic: &str,
    group: &str,
    generation: &str,
    max: usize,
    mode: &str,
    extra: &str,
) -> Pipeline {
    let g = if generation.is_empty() {
        String::new()
    } else {
        format!("[identity]\ngeneration = \"{generation}\"")
    };
    let text = CUSTOMERS
        .replace("GENERATION", &g)
        .replace("MAXREC", &max.to_string())
        .replace("TOMBSTONES", mode)
        .replace("EXTRA", extra);
    pipeline(&text, topic, group, &db.schema)
}

/// [`customers`] whose row projection applies truncates (`truncate = "truncate"`).
fn truncating(
    db: &Db,
    topic: &str,
    group: &str,
    generation: &str,
    max: usize,
    mode: &str,
) -> Pipeline {
    customers(
        db,
        topic,
        group,
        generation,
        max,
        mode,
        "truncate = \"truncate\"",
    )
}

type Live = Vec<(i64, Option<String>, i64)>;
/// Tombstones `(id, _version, _position)`.
type Tombs = Vec<(i64, Vec<i64>, Option<Vec<i64>>)>;
/// Live `(id, status)` and tombstones `(id, _version)` of the filter test.
type Accounts = (Vec<(i64, String)>, Vec<(i64, Vec<i64>)>);

/// Live rows `(id, name, version)` and tombstones `(id, _version, _position)`, in either tombstone mode.
fn customers_state(db: &Db, mode: &str) -> (Live, Tombs) {
    let (live_where, tomb_sql) = if mode == "column" {
        (
            "WHERE _deleted_at IS NULL",
            "SELECT id, _version, _position FROM {s}.customers WHERE _deleted_at IS NOT NULL ORDER BY id",
        )
    } else {
        (
            "",
            "SELECT id, _version, _position FROM {s}.customers_tombstones ORDER BY id",
        )
    };
    let live = db
        .query(
            &format!("SELECT id, name, version FROM {{s}}.customers {live_where} ORDER BY id"),
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let tombs = db
        .query(tomb_sql, &[])
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    (live, tombs)
}

fn tally_of(out: &Out) -> (u64, u64, u64, u64, u64, u64) {
    let t = out.tally();
    (
        t.consumed,
        t.landed,
        t.duplicate,
        out.stale(),
        t.filtered,
        t.quarantined,
    )
}

/// Item 1: under `version = "<column>"` a delete whose `before` holds only the key (REPLICA IDENTITY DEFAULT) has
/// no version of its own: it is ordered by its source position. Replaying the topic under a new generation and
/// group (every record claimed again) leaves the re-created row alone, and a late older insert cannot pass the
/// tombstone of a key-only delete of a row never seen.
#[test]
fn key_only_delete_is_ordered_by_source_position() {
    let topic = new_topic("kod", 2);
    let row = |id: i64, name: &str, v: i64| json!({"id": id, "name": name, "version": v});
    let key_only = |id: i64| json!({"id": id, "name": null, "version": null});
    let c = |p, id, name, v, lsn| Table("customers").create(p, id, row(id, name, v), lsn);
    let d = |p, id, lsn| Table("customers").delete(p, id, key_only(id), lsn);
    produce(
        &topic,
        &[
            // id 1: create v1, delete (key only), create again at v2 → live at v2.
            c(0, 1, "one", 1, 100),
            d(0, 1, 110),
            c(0, 1, "one again", 2, 120),
            // id 2 (other partition): create v1, update v2, delete (key only) → deleted.
            c(1, 2, "two", 1, 105),
            Table("customers").update(1, 2, row(2, "two b", 2), 115),
            // Debezium fills a NOT NULL column it does not have (REPLICA IDENTITY DEFAULT) with 0.
            Table("customers").delete(1, 2, json!({"id": 2, "name": null, "version": 0}), 125),
            // id 3: a key-only delete of a row never seen, then a late older insert → stays deleted.
            d(0, 3, 130),
            c(0, 3, "three (older)", 1, 90),
        ],
    );
    for mode in ["table", "column"] {
        for max in [1, 5000] {
            let ctx = format!("tombstones {mode}, max-records {max}");
            let db = Db::fresh("kod");
            let first =
                run_caught_up(&customers(&db, &topic, &unique("g"), "g1", max, mode, "").path);
            assert_eq!(
                tally_of(&first),
                (8, 7, 0, 1, 0, 0),
                "{ctx}: {}",
                first.stdout
            );
            let expected_live: Live = vec![(1, Some("one again".into()), 2)];
            let expected_tombs = vec![
                (2, vec![], Some(vec![89, 125])),
                (3, vec![], Some(vec![94, 130])),
            ];
            assert_eq!(
                customers_state(&db, mode),
                (expected_live.clone(), expected_tombs.clone()),
                "{ctx}"
            );

            // The same topic under a new generation and group: every record is claimed again, and the row
            // projection already claimed each one's state at its version (stored now or not): all duplicates,
            // nothing changes.
            let again =
                run_caught_up(&customers(&db, &topic, &unique("g"), "g2", max, mode, "").path);
            assert_eq!(
                tally_of(&again),
                (8, 0, 8, 0, 0, 0),
                "{ctx}: {}",
                again.stdout
            );
            assert_eq!(
                customers_state(&db, mode),
                (expected_live, expected_tombs),
                "{ctx}"
            );
            assert_eq!(
                db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
                0,
                "{ctx}"
            );
            assert_eq!(
                db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
                0,
                "{ctx}"
            );
            assert_eq!(
                db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
                16,
                "{ctx}: both generations claimed every record"
            );
        }
    }
}

/// Item 2: records flattened by Debezium's `ExtractNewRecordState` (the row alone; `__deleted` with
/// delete.handling rewrite; with or without a schema) are quarantined with a reason naming the transform, never
/// counted as heartbeats; heartbeats (schemaless `{"ts_ms"}` and the Heartbeat schema) are still filtered.
#[test]
fn flattened_records_are_quarantined_and_heartbeats_recognised() {
    let topic = new_topic("flat", 1);
    let key = Some(json!({"id": 1}));
    produce(
        &topic,
        &[
            raw(
                0,
                key.clone(),
                json!({"id": 1, "name": "one", "version": 1}),
            ),
            raw(
                0,
                key.clone(),
                json!({"id": 1, "name": "one", "version": 1, "__deleted": "true", "__op": "d"}),
            ),
            raw(
                0,
                key.clone(),
                json!({"schema": {"type": "struct", "name": "pg.public.customers.Value", "optional": false,
                    "fields": [{"field": "id", "type": "int64"}, {"field": "name", "type": "string"},
                               {"field": "version", "type": "int64"}]},
                    "payload": {"id": 1, "name": "one b", "version": 2}}),
            ),
            raw(
                0,
                Some(json!({"serverName": "pg"})),
                json!({"ts_ms": 1714003200000i64}),
            ),
            raw(
                0,
                Some(json!({"serverName": "pg"})),
                json!({"schema": {"type": "struct", "name": "io.debezium.connector.common.Heartbeat", "optional": false,
                    "fields": [{"field": "ts_ms", "type": "int64"}]}, "payload": {"ts_ms": 1714003201000i64}}),
            ),
            Table("customers").create(0, 2, json!({"id": 2, "name": "two", "version": 1}), 100),
        ],
    );
    let db = Db::fresh("flat");
    let out = run_caught_up(&customers(&db, &topic, &unique("g"), "", 5000, "table", "").path);
    assert_eq!(tally_of(&out), (6, 1, 0, 0, 2, 3), "{}", out.stdout);
    assert!(
        out.stdout.contains("[filtered cdc-heartbeat: 2]"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("[quarantined flattened-record: 3]"),
        "{}",
        out.stdout
    );
    let dead = db.query(
        "SELECT reason, detail FROM {s}.replaysafe_dead_letters ORDER BY \"offset\"",
        &[],
    );
    assert_eq!(dead.len(), 3);
    for r in &dead {
        assert_eq!(r.get::<_, String>(0), "flattened-record");
        let detail: String = r.get(1);
        assert!(detail.contains("ExtractNewRecordState"), "{detail}");
        assert!(!detail.contains("heartbeat"), "{detail}");
    }
    assert!(dead[1].get::<_, String>(1).contains("__deleted"));
    assert_eq!(
        customers_state(&db, "table"),
        (vec![(2, Some("two".into()), 1)], vec![])
    );
}

/// Item 3: a Debezium row projection's `filter` says which rows belong in the table: an update that leaves the
/// filter and a delete (whose `after` is null) remove the row (a tombstone at their version); a row entering the
/// filter later appears. Replayed under another group everything is a duplicate and nothing changes.
#[test]
fn row_filter_removes_rows_that_leave_it() {
    let topic = new_topic("rflt", 2);
    let text = concat!(
        debezium_header!(),
        r#"[batch]
max-records = MAXREC
linger-ms = 10
[fields]
status = { path = "/after/status", type = "text", optional = true }
[[projection]]
kind = "row"
table = "accounts"
key = ["id"]
columns = { id = "bigint", status = "text" }
filter = "status == 'active'"
tombstones = "TOMBSTONES"
"#
    );
    let row = |id: i64, status: &str| json!({"id": id, "status": status});
    let e = |p, op, id, before: Value, after: Value, lsn| {
        envelope(p, "accounts", op, Some(id), before, after, lsn)
    };
    produce(
        &topic,
        &[
            e(0, "c", 1, Value::Null, row(1, "active"), 100),
            e(1, "c", 2, Value::Null, row(2, "active"), 110),
            e(0, "u", 1, row(1, "active"), row(1, "closed"), 120),
            e(1, "d", 2, row(2, "active"), Value::Null, 130),
            e(0, "c", 3, Value::Null, row(3, "closed"), 140),
            e(0, "u", 3, row(3, "closed"), row(3, "active"), 150),
        ],
    );
    for mode in ["table", "column"] {
        for max in [1, 5000] {
            let ctx = format!("tombstones {mode}, max-records {max}");
            let db = Db::fresh("rflt");
            let p = |g: &str| {
                pipeline(
                    &text
                        .replace("MAXREC", &max.to_string())
                        .replace("TOMBSTONES", mode),
                    &topic,
                    g,
                    &db.schema,
                )
            };
            let state = |db: &Db| -> Accounts {
                let (live, tombs) = if mode == "column" {
                    (
                        "SELECT id, status FROM {s}.accounts WHERE _deleted_at IS NULL ORDER BY id",
                        "SELECT id, _version FROM {s}.accounts WHERE _deleted_at IS NOT NULL ORDER BY id",
                    )
                } else {
                    (
                        "SELECT id, status FROM {s}.accounts ORDER BY id",
                        "SELECT id, _version FROM {s}.accounts_tombstones ORDER BY id",
                    )
                };
                (
                    db.query(live, &[])
                        .iter()
                        .map(|r| (r.get(0), r.get(1)))
                        .collect(),
                    db.query(tombs, &[])
                        .iter()
                        .map(|r| (r.get(0), r.get(1)))
                        .collect(),
                )
            };
            let out = run_caught_up(&p(&unique("g")).path);
            assert_eq!(tally_of(&out), (6, 6, 0, 0, 0, 0), "{ctx}: {}", out.stdout);
            let expected = (
                vec![(3, "active".to_string())],
                vec![(1, vec![84, 120]), (2, vec![94, 130])],
            );
            assert_eq!(state(&db), expected, "{ctx}");
            let again = run_caught_up(&p(&unique("g")).path);
            assert_eq!(
                tally_of(&again),
                (6, 0, 6, 0, 0, 0),
                "{ctx}: {}",
                again.stdout
            );
            assert_eq!(state(&db), expected, "{ctx}");
            assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 0);
        }
    }
}

/// Item 5: with a version column and `truncate = "truncate"`, rows reloaded after the truncate apply whatever
/// their version (the same with other values, a lower one); a change from before the truncate arriving later is
/// stale (the truncate's watermark, by source position); a replay under a new generation changes nothing.
#[test]
fn truncate_then_reload_under_a_version_column() {
    let topic = new_topic("trl", 2);
    let row = |id: i64, name: &str, v: i64| json!({"id": id, "name": name, "version": v});
    let c = |p, id, name, v, lsn| Table("customers").create(p, id, row(id, name, v), lsn);
    produce(
        &topic,
        &[
            c(0, 1, "one", 1, 100),
            c(0, 2, "two", 3, 110),
            // id 5 deleted before the truncate with its own version (REPLICA IDENTITY FULL).
            c(0, 5, "five", 4, 120),
            Table("customers").delete(0, 5, row(5, "five", 4), 130),
            Table("customers").truncate(0, 200),
            // After the truncate's commit (the helper's commit LSN is lsn - 36).
            c(0, 1, "one reloaded", 1, 300),
            c(0, 2, "two reloaded", 1, 310),
            c(0, 3, "three", 1, 320),
            c(0, 5, "five reloaded", 1, 330),
        ],
    );
    let expected: Live = vec![
        (1, Some("one reloaded".into()), 1),
        (2, Some("two reloaded".into()), 1),
        (3, Some("three".into()), 1),
        (5, Some("five reloaded".into()), 1),
    ];
    for mode in ["table", "column"] {
        for max in [1, 5000] {
            let ctx = format!("tombstones {mode}, max-records {max}");
            let db = Db::fresh("trl");
            let group = unique("g");
            let p = truncating(&db, &topic, &group, "g1", max, mode);
            let out = run_caught_up(&p.path);
            assert_eq!(tally_of(&out), (9, 9, 0, 0, 0, 0), "{ctx}: {}", out.stdout);
            assert_eq!(
                customers_state(&db, mode),
                (expected.clone(), vec![]),
                "{ctx}"
            );
            assert_eq!(
                db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
                0,
                "{ctx}"
            );
            assert_eq!(
                db.column::<Vec<i64>>("SELECT version FROM {s}.replaysafe_truncates"),
                vec![vec![200, 200]],
                "{ctx}: the truncate's source position is the watermark"
            );

            // A change from before the truncate, arriving later from another partition: stale.
            let late = new_topic("trl_late", 1);
            produce(&late, &[c(0, 4, "four (before the truncate)", 9, 150)]);
            let pl = truncating(&db, &late, &unique("g"), "g1", max, mode);
            let out = run_caught_up(&pl.path);
            assert_eq!(tally_of(&out), (1, 0, 0, 1, 0, 0), "{ctx}: {}", out.stdout);

            // The whole topic again under a new generation: the truncate finds nothing older than itself; every
            // other change's state was claimed at its version and position before (those the truncate removed
            // too): duplicates.
            let again = truncating(&db, &topic, &unique("g"), "g2", max, mode);
            let out = run_caught_up(&again.path);
            assert_eq!(tally_of(&out), (9, 1, 8, 0, 0, 0), "{ctx}: {}", out.stdout);
            assert_eq!(
                customers_state(&db, mode),
                (expected.clone(), vec![]),
                "{ctx}"
            );
            assert_eq!(
                db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
                0,
                "{ctx}"
            );
        }
    }
}

/// Item 1, the case that cannot be ordered: a key-only delete meeting a row stored without a source position (by
/// a replaysafe that did not keep them) is quarantined with a message naming the entity, the row kept — never
/// applied blindly.
#[test]
fn key_only_delete_against_a_row_without_position_is_quarantined() {
    let topic = new_topic("kodq", 1);
    let row = json!({"id": 7, "name": "seven", "version": 3});
    produce(&topic, &[Table("customers").create(0, 7, row, 100)]);
    let db = Db::fresh("kodq");
    let group = unique("g");
    let p = customers(&db, &topic, &group, "", 5000, "table", "");
    run_caught_up(&p.path);
    // As an older replaysafe left it.
    db.execute("UPDATE {s}.customers SET _position = NULL");
    produce(
        &topic,
        &[Table("customers").delete(0, 7, json!({"id": 7, "name": null, "version": 0}), 200)],
    );
    let out = run_caught_up(&p.path);
    assert_eq!(tally_of(&out), (1, 0, 0, 0, 0, 1), "{}", out.stdout);
    let dead = db.query(
        "SELECT reason, detail FROM {s}.replaysafe_dead_letters",
        &[],
    );
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].get::<_, String>(0), "invalid-field");
    let detail: String = dead[0].get(1);
    assert!(
        detail.contains("cannot be ordered") && detail.contains("\"id\":\"7\""),
        "{detail}"
    );
    assert_eq!(
        customers_state(&db, "table"),
        (vec![(7, Some("seven".into()), 3)], vec![])
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        1,
        "the quarantined delete is not claimed"
    );
}

/// A truncate in the middle of a multi-partition stream, arriving *after* the rows reloaded behind it: Debezium
/// sends a truncate with no key, so it lands on any partition, while each row's changes follow its key's
/// partition. Partition 1 holds, in source order, the rows before the truncate (position < 200) and their reload
/// after it (id 1 at a lower version, id 2 at the same version with other values, id 3 at a higher one; id 4 not
/// reloaded); partition 0 holds the truncate (position 200), consumed after partition 1 has been applied. The
/// serial application in source order leaves exactly the reloaded rows (1, 2, 3) and a tombstone for 4, every
/// record landed, no conflict — whatever the order the partitions are read in.
#[test]
fn truncate_arriving_after_its_reload_from_another_partition() {
    let topic = new_topic("trlate", 2);
    let row = |id: i64, name: &str, v: i64| json!({"id": id, "name": name, "version": v});
    let c = |id, name, v, lsn| Table("customers").create(1, id, row(id, name, v), lsn);
    let u = |id, name, v, lsn| Table("customers").update(1, id, row(id, name, v), lsn);
    produce(
        &topic,
        &[
            c(1, "one", 1, 100),
            c(2, "two", 3, 110),
            c(3, "three", 1, 120),
            c(4, "four", 1, 130),
            u(1, "one b", 2, 150),
            // After the truncate (position 200).
            c(1, "one reloaded", 1, 300),
            c(2, "two reloaded", 3, 310),
            c(3, "three reloaded", 5, 320),
        ],
    );
    let expected: Live = vec![
        (1, Some("one reloaded".into()), 1),
        (2, Some("two reloaded".into()), 3),
        (3, Some("three reloaded".into()), 5),
    ];
    let mut dbs = Vec::new();
    for mode in ["table", "column"] {
        for max in [1, 5000] {
            let db = Db::fresh("trlate");
            let group = unique("g");
            let p = truncating(&db, &topic, &group, "", max, mode);
            let out = run_caught_up(&p.path);
            assert_eq!(
                tally_of(&out),
                (8, 8, 0, 0, 0, 0),
                "{mode} {max}: {}",
                out.stdout
            );
            dbs.push((db, group, mode, max));
        }
    }
    produce(&topic, &[Table("customers").truncate(0, 200)]);
    for (db, group, mode, max) in &dbs {
        let ctx = format!("tombstones {mode}, max-records {max}");
        let p = truncating(db, &topic, group, "", *max, mode);
        let out = run_caught_up(&p.path);
        assert_eq!(tally_of(&out), (1, 1, 0, 0, 0, 0), "{ctx}: {}", out.stdout);
        let (live, tombs) = customers_state(db, mode);
        assert_eq!(live, expected, "{ctx}");
        assert_eq!(
            tombs.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![4],
            "{ctx}: only the row not reloaded is gone"
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
            0,
            "{ctx}"
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
            9,
            "{ctx}"
        );
        // The whole topic again under a new generation: the truncate finds nothing older than itself; every
        // other change's state was claimed at its version and position before (those the truncate removed too):
        // duplicates.
        let again = truncating(db, &topic, &unique("g"), "g2", *max, mode);
        let out = run_caught_up(&again.path);
        assert_eq!(tally_of(&out), (9, 1, 8, 0, 0, 0), "{ctx}: {}", out.stdout);
        assert_eq!(customers_state(db, mode).0, expected, "{ctx}");
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
            0,
            "{ctx}"
        );
    }
}

/// An existing table (the source's DDL: NOT NULL columns) as a row projection with `tombstones = "column"`: the
/// tombstone of an entity never seen (its delete arrives before its create, from another partition, or its
/// create is past the topic's retention) is a row without values.
const EXISTING_COLUMN_MODE: &str = concat!(
    debezium_header!(),
    r#"[[projection]]
kind = "row"
table = "accounts"
tombstones = "column"
"#
);

/// Such a table is refused at start (exit 2, naming the columns) instead of quarantining the delete as
/// `rejected-by-database` and letting the older create, arriving later from another partition, resurrect the row;
/// with the constraint dropped the delete leaves its tombstone row and the create is `stale`.
#[test]
fn column_mode_delete_of_an_unseen_entity_on_not_null_columns() {
    let db = Db::fresh("cmnn");
    db.execute(
        "CREATE TABLE {s}.accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance bigint NOT NULL)",
    );
    let topic = new_topic("cmnn", 2);
    let row = |id: i64| json!({"id": id, "owner": format!("o{id}"), "balance": 5});
    produce(&topic, &[Table("accounts").delete(1, 9, row(9), 200)]);
    let group = unique("g");
    let p = pipeline(EXISTING_COLUMN_MODE, &topic, &group, &db.schema);
    let cfg = p.path.to_str().unwrap();
    let out = try_run(cfg);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("owner, balance") && out.stderr.contains("NOT NULL"),
        "{}",
        out.stderr
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.accounts"), 0);
    assert_eq!(committed(&group, &topic, 2), vec![None, None]);

    db.execute("ALTER TABLE {s}.accounts ALTER COLUMN owner DROP NOT NULL, ALTER COLUMN balance DROP NOT NULL");
    let out = run_caught_up(&p.path);
    assert_eq!(tally_of(&out), (1, 1, 0, 0, 0, 0), "{}", out.stdout);
    produce(&topic, &[Table("accounts").create(0, 9, row(9), 100)]);
    let out = run_caught_up(&p.path);
    assert_eq!(tally_of(&out), (1, 0, 0, 1, 0, 0), "{}", out.stdout);
    let rows = db.query(
        "SELECT id, _deleted_at IS NOT NULL, _position FROM {s}.accounts",
        &[],
    );
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i64>(0), 9);
    assert!(rows[0].get::<_, bool>(1), "row 9 stays deleted");
    assert_eq!(rows[0].get::<_, Option<Vec<i64>>>(2), Some(vec![164, 200]));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// A pseudo-random CDC stream of `n` rows under a version column and `truncate = "truncate"`: creates, updates,
/// full deletes (REPLICA IDENTITY FULL), key-only deletes (REPLICA IDENTITY DEFAULT: `before` holds the key, the
/// version 0), re-inserts, and truncates after which the versions start again at 1. Rows sit on partition
/// `id % 3`, truncates on any partition. Returns the records and the live rows of a serial application in source
/// order.
fn random_cdc(n: i64, seed: u64) -> (Vec<Rec>, Vec<Rec>, Live) {
    let mut next = seeded_random(seed);
    let row = |id: i64, name: String, v: i64| json!({"id": id, "name": name, "version": v});
    let mut rows: std::collections::BTreeMap<i64, (String, i64)> = Default::default();
    let mut version: std::collections::BTreeMap<i64, i64> = Default::default();
    let (mut changes, mut truncates) = (Vec::new(), Vec::new());
    let mut lsn = 1000;
    for step in 0..(n * 8) {
        lsn += 40;
        if next(25) == 0 {
            truncates.push(Table("customers").truncate(next(3) as i32, lsn));
            rows.clear();
            version.clear();
            continue;
        }
        let id = 1 + next(n as u64) as i64;
        let p = (id % 3) as i32;
        let v = version.entry(id).or_insert(0);
        *v += 1;
        let v = *v;
        match rows.get(&id).cloned() {
            None => {
                let name = format!("n{id}-{step}");
                changes.push(Table("customers").create(p, id, row(id, name.clone(), v), lsn));
                rows.insert(id, (name, v));
            }
            Some((old, ov)) => match next(4) {
                0 => {
                    changes.push(Table("customers").delete(p, id, row(id, old, ov), lsn));
                    rows.remove(&id);
                }
                1 => {
                    let key_only = json!({"id": id, "name": null, "version": 0});
                    changes.push(Table("customers").delete(p, id, key_only, lsn));
                    rows.remove(&id);
                }
                _ => {
                    let name = format!("n{id}-{step}");
                    changes.push(Table("customers").update(p, id, row(id, name.clone(), v), lsn));
                    rows.insert(id, (name, v));
                }
            },
        }
    }
    let live = rows
        .into_iter()
        .map(|(id, (name, v))| (id, Some(name), v))
        .collect();
    (changes, truncates, live)
}

/// The random CDC stream against the serial oracle, with the truncates consumed after every row change (the
/// adversarial order: each reload is applied before the truncate it follows) and with everything at once, in both
/// tombstone modes and batch sizes 1 and 5000: the live rows are those of a serial application in source order,
/// nothing is quarantined, no conflict; a replay under a new generation changes nothing.
#[test]
fn random_cdc_stream_with_truncates_matches_the_serial_oracle() {
    let (changes, truncates, live) = random_cdc(12, 20);
    assert!(!truncates.is_empty() && !live.is_empty());
    let n = (changes.len() + truncates.len()) as u64;
    let late = new_topic("rcdc", 3);
    produce(&late, &changes);
    let all = new_topic("rcdc", 3);
    let mut mixed = changes.clone();
    mixed.extend(truncates.iter().cloned());
    produce(&all, &mixed);
    let mut late_dbs = Vec::new();
    for mode in ["table", "column"] {
        for max in [1, 5000] {
            let db = Db::fresh("rcdc");
            let group = unique("g");
            let p = truncating(&db, &late, &group, "", max, mode);
            let out = run_caught_up(&p.path);
            assert_eq!(out.tally().quarantined, 0, "{}", out.stdout);
            late_dbs.push((db, group, mode, max));
            let db = Db::fresh("rcdc");
            let p = truncating(&db, &all, &unique("g"), "", max, mode);
            let out = run_caught_up(&p.path);
            let t = out.tally();
            assert_eq!((t.consumed, t.quarantined), (n, 0), "{}", out.stdout);
            let ctx = format!("all at once, {mode} {max}");
            assert_eq!(customers_state(&db, mode).0, live, "{ctx}");
            assert_eq!(
                db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
                0,
                "{ctx}"
            );
            assert_eq!(
                db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
                n as i64,
                "{ctx}"
            );
            let again = truncating(&db, &all, &unique("g"), "g2", max, mode);
            let out = run_caught_up(&again.path);
            let t = out.tally();
            assert_eq!(
                (
                    t.consumed,
                    t.landed - (truncates.len() as u64),
                    t.quarantined
                ),
                (n, 0, 0),
                "{ctx}: {}",
                out.stdout
            );
            assert_eq!(customers_state(&db, mode).0, live, "{ctx}: replay");
        }
    }
    produce(&late, &truncates);
    for (db, group, mode, max) in &late_dbs {
        let ctx = format!("truncates late, {mode} {max}");
        let p = truncating(db, &late, group, "", *max, mode);
        let out = run_caught_up(&p.path);
        assert_eq!(out.tally().quarantined, 0, "{ctx}: {}", out.stdout);
        assert_eq!(customers_state(db, mode).0, live, "{ctx}");
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
            0,
            "{ctx}"
        );
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
            n as i64,
            "{ctx}"
        );
    }
}

/// Issue 34 item 3b: two records at one source position (the Debezium delivery key: position, table, key) with
/// different row data. The second is a ledger duplicate, but its state differs from the state claimed at that
/// position: a conflict in `replaysafe_conflicts`, counted `stale` (conflict), never in the outbox or the counter;
/// the row holds the position's winner (a delete, else the smaller state hash: here `B!` over `b`, the delete of
/// 4 over `alive?`), each losing state one conflict row naming it `stored`. An identical second record stays a
/// duplicate; one whose entity has moved on to a newer position since is judged the same way (id 3's `m3`: a
/// second conflict at `[84, 120]`). Entities on two partitions, batch sizes 1 and 5000, each into a fresh schema:
/// the same tables.
#[test]
fn equal_position_different_state_is_a_conflict() {
    let topic = new_topic("eqpos", 2);
    let row = |id: i64, name: &str| json!({"id": id, "name": name});
    let t = Table("people");
    produce(
        &topic,
        &[
            t.create(0, 1, row(1, "a"), 100),
            t.update(0, 1, row(1, "b"), 200),
            t.update(0, 1, row(1, "B!"), 200),
            t.create(1, 2, row(2, "x"), 110),
            t.update(1, 2, row(2, "y"), 210),
            t.update(1, 2, row(2, "y"), 210),
            t.create(0, 3, row(3, "m"), 120),
            t.create(0, 3, row(3, "m2"), 120),
            t.update(0, 3, row(3, "n"), 300),
            t.update(0, 3, row(3, "m3"), 120),
            t.create(1, 4, row(4, "d"), 130),
            t.delete(1, 4, row(4, "d"), 230),
            t.update(1, 4, row(4, "alive?"), 230),
        ],
    );
    let text = concat!(
        debezium_header!(),
        r#"[batch]
max-records = MAXREC
linger-ms = 10
[[projection]]
kind = "row"
table = "people"
key = ["id"]
columns = { id = "bigint", name = "text" }
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["_op", "_entity", "_position"]
[[projection]]
kind = "counter"
table = "changes"
group-by = ["_day"]
"#
    );
    type Conflicts = Vec<(String, Vec<i64>, Option<String>, Option<String>)>;
    type Seen = (Vec<String>, Vec<(i64, Vec<i64>)>, Conflicts, Vec<String>);
    let mut seen: Vec<Seen> = Vec::new();
    for max in [1, 5000] {
        let db = Db::fresh("eqpos");
        let p = pipeline(
            &text.replace("MAXREC", &max.to_string()),
            &topic,
            &unique("g"),
            &db.schema,
        );
        let out = run_caught_up(&p.path);
        assert_eq!(
            tally_of(&out),
            (13, 8, 1, 4, 0, 0),
            "batch size {max}: {}",
            out.stdout
        );
        assert!(
            out.tally_line().unwrap().contains("[stale: 4 conflict(s)]"),
            "{}",
            out.stdout
        );
        let rows: Vec<String> =
            db.column("SELECT id::text || ' ' || name FROM {s}.people ORDER BY id");
        assert_eq!(rows, ["1 B!", "2 y", "3 n"], "batch size {max}");
        let tombs: Vec<(i64, Vec<i64>)> = db
            .query(
                "SELECT id, _version FROM {s}.people_tombstones ORDER BY id",
                &[],
            )
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(tombs, [(4, vec![194, 230])], "batch size {max}");
        let conflicts: Conflicts = db
            .query(
                "SELECT entity->>'id', version, stored->>'name', incoming->>'name' FROM {s}.replaysafe_conflicts \
                 ORDER BY entity->>'id', incoming->>'name'",
                &[],
            )
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect();
        assert_eq!(
            conflicts,
            [
                (
                    "1".into(),
                    vec![164, 200],
                    Some("B!".into()),
                    Some("b".into())
                ),
                (
                    "3".into(),
                    vec![84, 120],
                    Some("m".into()),
                    Some("m2".into())
                ),
                (
                    "3".into(),
                    vec![84, 120],
                    Some("m".into()),
                    Some("m3".into())
                ),
                ("4".into(), vec![194, 230], None, Some("alive?".into())),
            ],
            "batch size {max}"
        );
        // The ledger holds each delivery key once; the outbox and the counter saw the 8 landed changes only.
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 8);
        let outbox: Vec<String> = db.column(
            "SELECT (payload->>'_op') || ' ' || (payload->>'_position') FROM {s}.outbox ORDER BY 1",
        );
        assert_eq!(outbox.len(), 8, "{outbox:?}");
        assert_eq!(
            db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.changes"),
            8
        );
        seen.push((rows, tombs, conflicts, outbox));
    }
    assert_eq!(seen[0], seen[1], "batch sizes 1 and 5000");
}
