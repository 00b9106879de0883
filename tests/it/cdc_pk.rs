//! Issue 34 item 3: a primary-key change (Debezium's delete of the old key and create of the new one, at one LSN,
//! the create carrying the `__debezium.oldkey` header) whose new-key image holds unchanged-TOAST placeholders.
//! The old and new keys are on different partitions; whichever is applied first, the new key's columns end with
//! the values the old key's delete removed — never NULL — and a replay into a fresh schema gives the same table.

use serde_json::{json, Value};

use crate::common::*;

const PIPELINE: &str = concat!(
    debezium_header!(),
    r#"[batch]
max-records = MAXREC
linger-ms = 10
[[projection]]
kind = "row"
table = "customers"
key = ["id"]
columns = { id = "bigint", name = "text", bio = "text" }
tombstones = "TOMBSTONES"
"#
);

const PLACEHOLDER: &str = "__debezium_unavailable_value";

fn bio() -> String {
    "toasted ".repeat(1000)
}

/// The old key's history (id 1, partition 0): create, update of the TOASTed bio, an update that leaves it
/// unchanged (placeholder), the primary-key change's delete (key-only `before`) at LSN 400, its Kafka tombstone.
fn old_key_records() -> Vec<(Rec, Option<Vec<u8>>)> {
    let t = Table("customers");
    let row = |name: &str, bio: &str| json!({"id": 1, "name": name, "bio": bio});
    vec![
        (t.create(0, 1, row("a", "short"), 100), None),
        (t.update(0, 1, row("a", &bio()), 200), None),
        (t.update(0, 1, row("b", PLACEHOLDER), 300), None),
        (
            t.delete(0, 1, json!({"id": 1, "name": null, "bio": null}), 400),
            None,
        ),
        (raw_tombstone(0, json!({"id": 1})), None),
    ]
}

/// The new key's records (id 2, partition 1): the primary-key change's create at LSN 400 (bio unchanged), then
/// an update of the name that leaves bio unchanged again.
fn new_key_records() -> Vec<(Rec, Option<Vec<u8>>)> {
    let t = Table("customers");
    let row = |name: &str| json!({"id": 2, "name": name, "bio": PLACEHOLDER});
    vec![
        (t.create(1, 2, row("b"), 400), Some(br#"{"id":1}"#.to_vec())),
        (t.update(1, 2, row("c"), 500), None),
    ]
}

fn raw_tombstone(partition: i32, key: Value) -> Rec {
    Rec {
        partition,
        key: Some(key.to_string().into_bytes()),
        value: None,
        timestamp_ms: None,
    }
}

/// `(id, name, bio, _unresolved)` of the live rows, and `(id, _last)` of the tombstones, in either mode.
type Rows = Vec<(i64, Option<String>, Option<String>, Option<Value>)>;
type Tombs = Vec<(i64, Option<Value>)>;

fn state(db: &Db, mode: &str) -> (Rows, Tombs) {
    let live_where = if mode == "column" {
        "WHERE _deleted_at IS NULL"
    } else {
        ""
    };
    let rows = db
        .query(
            &format!(
                "SELECT id, name, bio, _unresolved FROM {{s}}.customers {live_where} ORDER BY id"
            ),
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let tomb_sql = if mode == "column" {
        "SELECT id, jsonb_build_object('id', id::text, 'name', name, 'bio', bio) FROM {s}.customers \
         WHERE _deleted_at IS NOT NULL ORDER BY id"
    } else {
        "SELECT id, _last FROM {s}.customers_tombstones ORDER BY id"
    };
    let tombs = db
        .query(tomb_sql, &[])
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    (rows, tombs)
}

fn expected() -> (Rows, Tombs) {
    (
        vec![(2, Some("c".into()), Some(bio()), None)],
        vec![(1, Some(json!({"id": "1", "name": "b", "bio": bio()})))],
    )
}

fn counts(db: &Db) -> (i64, i64) {
    (
        db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"),
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
    )
}

fn tally(out: &Out) -> (u64, u64, u64, u64, u64, u64) {
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

/// Both orders (the new key applied before the old key's history, and after it), both tombstone modes, batch
/// sizes 1 and 5000: the same rows, tombstones (`_last`), no conflicts; while the new key waits, its bio is NULL
/// and `_unresolved` says what it waits for; a replay of the whole topic into a fresh schema gives the same table.
#[test]
fn pk_change_toast_placeholder_resolved_in_either_order() {
    for mode in ["table", "column"] {
        for max in [1usize, 5000] {
            for new_first in [true, false] {
                let ctx =
                    format!("tombstones {mode}, max-records {max}, new key first {new_first}");
                let topic = new_topic("pkt", 2);
                let db = Db::fresh("pkt");
                let group = unique("g");
                let text = PIPELINE
                    .replace("MAXREC", &max.to_string())
                    .replace("TOMBSTONES", mode);
                let p = pipeline(&text, &topic, &group, &db.schema);
                let (first, second) = if new_first {
                    (new_key_records(), old_key_records())
                } else {
                    (old_key_records(), new_key_records())
                };
                produce_with_old_keys(&topic, &first);
                let out = run_caught_up(&p.path);
                if new_first {
                    assert_eq!(tally(&out), (2, 2, 0, 0, 0, 0), "{ctx}: {}", out.stdout);
                    let (rows, _) = state(&db, mode);
                    assert_eq!(rows.len(), 1, "{ctx}");
                    assert_eq!(rows[0].2, None, "{ctx}: waiting");
                    assert_eq!(
                        rows[0].3,
                        Some(json!({"key": ["1"], "lsn": 400, "columns": ["bio"]})),
                        "{ctx}: the marker says what it waits for"
                    );
                    assert!(
                        out.stderr.contains("wait for the old key's delete"),
                        "{ctx}: {}",
                        out.stderr
                    );
                } else {
                    assert_eq!(tally(&out), (5, 4, 0, 0, 1, 0), "{ctx}: {}", out.stdout);
                }
                produce_with_old_keys(&topic, &second);
                let out = run_caught_up(&p.path);
                let t = tally(&out);
                assert_eq!(
                    t,
                    if new_first {
                        (5, 4, 0, 0, 1, 0)
                    } else {
                        (2, 2, 0, 0, 0, 0)
                    },
                    "{ctx}: {}",
                    out.stdout
                );
                assert_eq!(state(&db, mode), expected(), "{ctx}");
                assert_eq!(counts(&db), (0, 0), "{ctx}");
                assert_eq!(
                    db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
                    6,
                    "{ctx}: six row changes claimed"
                );

                // The same topic into a fresh schema, in one run (both partitions from offset 0).
                let fresh = Db::fresh("pkt");
                let p = pipeline(&text, &topic, &unique("g"), &fresh.schema);
                let out = run_caught_up(&p.path);
                assert_eq!(
                    tally(&out),
                    (7, 6, 0, 0, 1, 0),
                    "{ctx}: replay: {}",
                    out.stdout
                );
                assert_eq!(state(&fresh, mode), state(&db, mode), "{ctx}: replay");
                assert_eq!(counts(&fresh), (0, 0), "{ctx}: replay");
            }
        }
    }
}
