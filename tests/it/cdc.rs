//! Debezium change events into version-guarded row projections: the handed cases (C04 C05 C07 C09 C11 C12 C19
//! C20 C22 C23 C31 C32) and the seed 004 fixture (applied once, twice, with restarts, shuffled across
//! partitions). Each asserts the final table, tombstones, conflicts, ledger rows and Kafka offsets.

use std::time::Duration;

use serde_json::{json, Value};

use crate::cases::{case_topic, load, produce_case, CaseRecord};
use crate::common::*;

/// `accounts` from Debezium, with an outbox that (by default) ignores snapshot reads.
/// A Debezium pipeline with one row projection `table` (key `id`) and the given `columns` inline table.
fn row_pipeline(table: &str, columns: &str) -> String {
    format!(
        r#"{DEBEZIUM_HEADER}[[projection]]
kind = "row"
table = "{table}"
key = ["id"]
columns = {columns}
"#
    )
}

const ACCOUNTS: &str = r#"
[kafka]
group-id = "{group}"
topics = [TOPICS]
start = "earliest"

[postgres]
schema = "{schema}"

[batch]
max-records = MAXREC
linger-ms = 10

[source]
format = "debezium"

[[projection]]
kind = "row"
table = "accounts"
source-table = "public.accounts"
key = ["id"]
columns = { id = "bigint", owner = "text", balance = "numeric(12,2)", updated_at = "timestamptz" }
truncate = "TRUNCATE"

[[projection]]
kind = "outbox"
table = "outbox"
payload = ["_op", "_entity", "_position"]
"#;

fn accounts_pipeline(
    topics: &[&str],
    group: &str,
    db: &Db,
    truncate: &str,
    max: usize,
) -> Pipeline {
    let list = topics
        .iter()
        .map(|t| format!("\"{t}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let text = ACCOUNTS
        .replace("TOPICS", &list)
        .replace("TRUNCATE", truncate)
        .replace("MAXREC", &max.to_string());
    pipeline(&text, topics[0], group, &db.schema)
}

fn run_pipeline(p: &Pipeline) -> Out {
    let out = run_caught_up(&p.path);
    out.assert_ok();
    out
}

fn balance(db: &Db, id: i64) -> Option<String> {
    db.query(
        "SELECT balance::text FROM {s}.accounts WHERE id = $1",
        &[&id],
    )
    .first()
    .map(|r| r.get(0))
}

fn version(db: &Db, table: &str, id: i64) -> Option<Vec<i64>> {
    db.query(
        &format!("SELECT _version FROM {{s}}.{table} WHERE id = $1"),
        &[&id],
    )
    .first()
    .map(|r| r.get(0))
}

/// C04: a connector restart re-emits a change with a new offset and envelope ts_ms but the same source
/// position: a duplicate by source identity (no ledger row, no outbox row).
#[test]
fn c04_debezium_reemission_is_a_duplicate_by_source_position() {
    let db = Db::fresh("c04");
    let (topic, map) = case_topic("C04", "c04", 1, None);
    let group = unique("g");
    let p = accounts_pipeline(&[&topic], &group, &db, "stop", 100);
    let t = run_pipeline(&p).tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (4, 3, 1));
    assert_eq!(balance(&db, 1).as_deref(), Some("175.00"));
    assert_eq!(version(&db, "accounts", 1), Some(vec![33000236, 33000300]));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 3);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 3);
    assert_eq!(committed(&group, &topic, 1), vec![Some(map[&(0, 503)] + 1)]);
    // A full replay under another group changes nothing.
    let again = run_pipeline(&accounts_pipeline(
        &[&topic],
        &unique("g"),
        &db,
        "stop",
        100,
    ))
    .tally();
    assert_eq!((again.landed, again.duplicate), (0, 4));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 3);
    assert_eq!(balance(&db, 1).as_deref(), Some("175.00"));
}

/// C05: a second snapshot mid-stream is an idempotent upsert under the version guard: no double counting, no
/// unique-key error; B stays because no delete was ever emitted.
#[test]
fn c05_resnapshot_mid_stream() {
    let db = Db::fresh("c05");
    let (topic, _) = case_topic("C05", "c05", 1, None);
    let text = concat!(
        debezium_header!(),
        r#"[[projection]]
kind = "row"
table = "t"
key = ["f1"]
columns = { f1 = "text", f2 = "integer" }
[[projection]]
kind = "counter"
table = "changes"
group-by = ["_day"]
"#
    );
    let p = pipeline(text, &topic, &unique("g"), &db.schema);
    let out = run_pipeline(&p);
    let t = out.tally();
    // The second snapshot's A holds the state already stored: a duplicate, not an applied change.
    assert_eq!((t.consumed, t.landed, t.duplicate), (4, 3, 1));
    let rows = db.query("SELECT f1, f2 FROM {s}.t ORDER BY f1", &[]);
    let got: Vec<(String, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got, vec![("A".to_string(), 2), ("B".to_string(), 5)]);
    assert_eq!(
        db.query("SELECT _version FROM {s}.t WHERE f1 = 'A'", &[])[0].get::<_, Vec<i64>>(0),
        vec![23500800, 0],
        "the snapshot's consistent point is the newest version of A (a read is [S, 0]: below every change \
         streamed after the snapshot)"
    );
    assert!(
        out.stderr.contains("re-snapshot detected"),
        "the second snapshot is reported: {}",
        out.stderr
    );
    // Counters of business actions skip snapshot reads: only the streaming update counts.
    assert_eq!(
        db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.changes"),
        1
    );
}

/// C07: an older business event after a newer one for the same entity is stale: recorded in the ledger, the row
/// unchanged. Issue 34: stale is the row projection's verdict about its table only, so the event — a real one —
/// gets its outbox message like any claimed event (the outbox is then the same whatever the arrival order).
#[test]
fn c07_out_of_order_business_event_is_stale() {
    let db = Db::fresh("c07");
    let (topic, map) = case_topic("C07", "c07", 1, None);
    let group = unique("g");
    let p = pipeline(ORDERS_ROW, &topic, &group, &db.schema);
    let out = run_pipeline(&p);
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, out.stale()), (3, 2, 1));
    let o = db.query(
        "SELECT status, version, _version FROM {s}.orders WHERE entity_id = 'o-2002'",
        &[],
    );
    assert_eq!(o[0].get::<_, String>(0), "SHIPPED");
    assert_eq!(o[0].get::<_, i64>(1), 3);
    assert_eq!(o[0].get::<_, Vec<i64>>(2), vec![3]);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.processed_events"),
        3,
        "the stale event is in the ledger, never retried"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.order_outbox"), 3);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.order_outbox WHERE payload->>'event_id' = 'c1000000-0000-4000-8000-000000000021'"),
        1,
        "the stale event's outbox message"
    );
    assert_eq!(committed(&group, &topic, 1), vec![Some(map[&(0, 21)] + 1)]);
}

/// JSON events into a row projection: the latest status per order, guarded by the event's version.
const ORDERS_ROW: &str = concat!(
    header!(),
    r#"[fields]
event_id = { path = "/event_id", type = "uuid" }
event_type = { path = "/event_type", type = "text" }
entity_id = { path = "/entity_id", type = "text" }
version = { path = "/version", type = "bigint" }
status = { path = "/data/status", type = "text", optional = true }
email = { path = "/data/email", type = "text", optional = true }
[identity]
key = ["event_id"]
[ledger]
table = "processed_events"
[[projection]]
kind = "row"
table = "orders"
filter = "event_type == 'OrderStatusChanged'"
key = ["entity_id"]
version = "version"
columns = ["entity_id", "status", "version", "event_id"]
[[projection]]
kind = "row"
table = "customers"
filter = "event_type.startsWith('Customer')"
key = ["entity_id"]
version = "version"
columns = ["entity_id", "email", "version"]
delete-if = "event_type == 'CustomerDeleted'"
[[projection]]
kind = "outbox"
table = "order_outbox"
payload = ["event_id", "event_type", "entity_id", "version"]
"#
);

/// C31: two events claim version 5 of one order with different payloads: the version's winner (the smaller state
/// hash: `ON_HOLD`, which arrived second) is the row, the other state a conflict row naming it as stored (both
/// deliveries, both hashes), the verbatim re-send a duplicate; a full replay is identical.
#[test]
fn c31_equal_version_different_payload_is_a_conflict() {
    let db = Db::fresh("c31");
    let (topic, map) = case_topic("C31", "c31", 2, None);
    let group = unique("g");
    let p = pipeline(ORDERS_ROW, &topic, &group, &db.schema);
    let out = run_pipeline(&p);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, out.stale()),
        (3, 1, 1, 1)
    );
    let check = |db: &Db| {
        let o = db.query(
            "SELECT status, version FROM {s}.orders WHERE entity_id = 'o-3003'",
            &[],
        );
        assert_eq!(o[0].get::<_, String>(0), "ON_HOLD");
        assert_eq!(o[0].get::<_, i64>(1), 5);
        let c = db.query(
            "SELECT entity->>'entity_id', version, stored_delivery, incoming_delivery, stored_sha256 <> incoming_sha256, \
             incoming->>'status', stored->>'status' FROM {s}.replaysafe_conflicts",
            &[],
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].get::<_, String>(0), "o-3003");
        assert_eq!(c[0].get::<_, Vec<i64>>(1), vec![5]);
        assert!(c[0]
            .get::<_, String>(2)
            .contains("b3000000-0000-4000-8000-000000000701"));
        assert!(c[0]
            .get::<_, String>(3)
            .contains("b3000000-0000-4000-8000-000000000700"));
        assert!(c[0].get::<_, bool>(4));
        assert_eq!(c[0].get::<_, String>(5), "PACKED");
        assert_eq!(c[0].get::<_, String>(6), "ON_HOLD");
    };
    check(&db);
    assert_eq!(committed(&group, &topic, 2)[1], Some(map[&(1, 702)] + 1));
    let again = run_text(ORDERS_ROW, &topic, &unique("g"), &db).tally();
    assert_eq!((again.landed, again.duplicate), (0, 3));
    check(&db);
}

/// C09: several rows of one statement share an LSN and sequence: the delivery key separates them by table and
/// primary key; a redelivery is a no-op; `transaction.id` is opaque.
#[test]
fn c09_rows_sharing_an_lsn_are_distinct_changes() {
    let db = Db::fresh("c09");
    let (topic, mut map) = case_topic("C09", "c09", 1, None);
    // The redelivery of offset 41 after a consumer restart: the same record again.
    let records = load("C09", None);
    let last: Vec<&CaseRecord> = records.iter().filter(|r| r.offset == 41).collect();
    let again = produce_case(&topic, &last);
    map.insert((0, 42), again[&(0, 41)]);
    let group = unique("g");
    let t = run_pipeline(&accounts_pipeline(&[&topic], &group, &db, "stop", 100)).tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (3, 2, 1));
    assert_eq!(balance(&db, 10).as_deref(), Some("1.00"));
    assert_eq!(balance(&db, 11).as_deref(), Some("2.00"));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 2);
    assert_eq!(committed(&group, &topic, 1), vec![Some(map[&(0, 42)] + 1)]);
}

/// C11: a re-emitted DELETE (same source position, later envelope ts_ms) after a re-insert never wins: versions
/// come from the source position, not from processing or envelope time.
#[test]
fn c11_reemitted_delete_does_not_outrank_reinsert() {
    let (topic, map) = case_topic("C11", "c11", 1, None);
    let group = unique("g");
    // One record per batch too: the order of batches must not matter.
    for max in [100, 1] {
        let db = Db::fresh("c11");
        let g = if max == 100 {
            group.clone()
        } else {
            unique("g")
        };
        let t = run_pipeline(&accounts_pipeline(&[&topic], &g, &db, "stop", max)).tally();
        assert_eq!(
            (t.consumed, t.landed, t.duplicate, t.filtered),
            (5, 3, 1, 1),
            "max-records {max}"
        );
        assert_eq!(balance(&db, 5).as_deref(), Some("0.00"));
        assert_eq!(version(&db, "accounts", 5), Some(vec![42000236, 42000300]));
        assert_eq!(db.i64("SELECT count(*) FROM {s}.accounts_tombstones"), 0);
    }
    assert_eq!(committed(&group, &topic, 1), vec![Some(map[&(0, 63)] + 1)]);
}

/// C12: a delete leaves a versioned tombstone; a late older write (business event or snapshot read) cannot
/// resurrect the row.
#[test]
fn c12_tombstones_stop_resurrection() {
    let db = Db::fresh("c12");
    // CDC part.
    let (cdc, map) = case_topic("C12", "c12cdc", 1, Some("pg.public.accounts"));
    let group = unique("g");
    let out = run_pipeline(&accounts_pipeline(&[&cdc], &group, &db, "stop", 100));
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.filtered, out.stale()),
        (3, 1, 1, 1)
    );
    assert_eq!(balance(&db, 8), None);
    let tomb = db.query("SELECT id, _version FROM {s}.accounts_tombstones", &[]);
    assert_eq!(tomb.len(), 1);
    assert_eq!(tomb[0].get::<_, i64>(0), 8);
    assert_eq!(tomb[0].get::<_, Vec<i64>>(1), vec![43000436, 43000500]);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox"),
        1,
        "the stale snapshot read has no side effect"
    );
    assert_eq!(committed(&group, &cdc, 1), vec![Some(map[&(0, 82)] + 1)]);

    // Business part.
    let (biz, map) = case_topic("C12", "c12biz", 3, Some("shop.order-events"));
    let group = unique("g");
    let out = run_text(ORDERS_ROW, &biz, &group, &db);
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, out.stale()), (3, 2, 1));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.customers"), 0);
    let tomb = db.query(
        "SELECT entity_id, _version FROM {s}.customers_tombstones",
        &[],
    );
    assert_eq!(tomb.len(), 1);
    assert_eq!(tomb[0].get::<_, String>(0), "c-9");
    assert_eq!(tomb[0].get::<_, Vec<i64>>(1), vec![3]);
    assert_eq!(committed(&group, &biz, 3)[2], Some(map[&(2, 72)] + 1));
}

/// C19: unchanged TOAST values (`__debezium_unavailable_value` in text, in an array, base64 in bytea) keep the
/// stored value — also when several updates of one key fold inside one batch.
#[test]
fn c19_toast_placeholders_keep_stored_values() {
    let (topic, map) = case_topic("C19", "c19", 1, None);
    let text = concat!(
        debezium_header!(),
        r#"[batch]
max-records = MAXREC
[[projection]]
kind = "row"
table = "customers"
key = ["id"]
columns = { id = "bigint", name = "text", bio = "text", tags = "text[]", avatar = "bytea" }
"#
    );
    for max in [100, 1] {
        let db = Db::fresh("c19");
        let group = unique("g");
        let p = pipeline(
            &text.replace("MAXREC", &max.to_string()),
            &topic,
            &group,
            &db.schema,
        );
        let t = run_pipeline(&p).tally();
        assert_eq!((t.consumed, t.landed), (3, 3));
        let r = db.query(
            "SELECT name, bio, tags, avatar, position('__debezium' in bio) FROM {s}.customers WHERE id = 42",
            &[],
        );
        assert_eq!(r[0].get::<_, String>(0), "Ada Lovelace");
        assert_eq!(r[0].get::<_, String>(1), "b".repeat(3000));
        assert_eq!(r[0].get::<_, Vec<String>>(2), vec!["vip", "beta"]);
        assert_eq!(
            r[0].get::<_, Vec<u8>>(3),
            vec![0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]
        );
        assert_eq!(committed(&group, &topic, 1), vec![Some(map[&(0, 2)] + 1)]);
    }
}

/// C20: NUMERIC as base64 big-endian two's-complement bytes with the scale from the schema: never unsigned,
/// never through f64, the base64 text never stored.
#[test]
fn c20_decimal_bytes_with_schema() {
    let db = Db::fresh("c20");
    let (topic, map) = case_topic("C20", "c20", 1, None);
    let text = row_pipeline(
        "accounts",
        r#"{ id = "bigint", balance = "numeric(12,2)" }"#,
    );
    let group = unique("g");
    run_text(&text, &topic, &group, &db);
    assert_eq!(balance(&db, 1).as_deref(), Some("-1.00"));
    assert_eq!(balance(&db, 2).as_deref(), Some("12345.50"));
    assert_eq!(committed(&group, &topic, 1), vec![Some(map[&(0, 2)] + 1)]);
}

/// C22: temporal units from the column types when schemas are off (timestamp(6) µs, timestamp(3) ms, date days,
/// timestamptz an ISO string).
#[test]
fn c22_temporal_units() {
    let db = Db::fresh("c22");
    let (topic, map) = case_topic("C22", "c22", 1, None);
    let text = row_pipeline(
        "events",
        r#"{ id = "bigint", created_at = "timestamp(6)", updated_at = "timestamp(3)", seen_at = "timestamptz", due = "date" }"#,
    );
    let group = unique("g");
    run_text(&text, &topic, &group, &db);
    let r = db.query(
        "SELECT created_at::text, updated_at::text, (seen_at AT TIME ZONE 'UTC')::text, due::text FROM {s}.events WHERE id = 1",
        &[],
    );
    assert_eq!(r[0].get::<_, String>(0), "2023-07-26 10:22:47.048491");
    assert_eq!(r[0].get::<_, String>(1), "2023-07-26 10:22:47.048");
    assert_eq!(r[0].get::<_, String>(2), "2023-07-26 10:22:47.048491");
    assert_eq!(r[0].get::<_, String>(3), "2024-12-31");
    assert_eq!(committed(&group, &topic, 1), vec![Some(map[&(0, 0)] + 1)]);
}

/// C23: `{schema, payload}` and bare envelopes (keys too) in one topic; a stray top-level `payload` member of a
/// bare envelope does not trigger unwrapping.
#[test]
fn c23_wrapped_and_bare_envelopes() {
    let db = Db::fresh("c23");
    let (topic, map) = case_topic("C23", "c23", 1, None);
    let group = unique("g");
    let t = run_pipeline(&accounts_pipeline(&[&topic], &group, &db, "stop", 100)).tally();
    assert_eq!((t.consumed, t.landed), (3, 3));
    assert_eq!(balance(&db, 1).as_deref(), Some("12.00"));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.accounts"),
        1,
        "both key forms are one entity"
    );
    assert_eq!(committed(&group, &topic, 1), vec![Some(map[&(0, 2)] + 1)]);
}

/// C32: truncate follows the projection's policy (default: stop with a clear error, nothing committed;
/// `truncate`: tombstone every older row in the batch transaction); heartbeats and logical messages are
/// acknowledged as filtered.
#[test]
fn c32_truncate_heartbeat_and_messages() {
    let accounts = unique("c32acc");
    let heartbeat = unique("c32hb");
    let message = unique("c32msg");
    for t in [&accounts, &heartbeat, &message] {
        create_topic(t, 1, &[("retention.ms", "-1")]);
    }
    // A row that exists before the truncate (older position).
    let before = Rec {
        partition: 0,
        key: Some(br#"{"id":2}"#.to_vec()),
        value: Some(
            json!({"before":null,"after":{"id":2,"owner":"acct-two","balance":"2.00","updated_at":"2024-04-25T00:00:00Z"},
                "source":{"connector":"postgresql","name":"pg","ts_ms":1714003100000i64,"snapshot":"false","db":"app",
                "sequence":"[\"51000036\",\"51000100\"]","schema":"public","table":"accounts","txId":1800,"lsn":51000100},
                "op":"c","ts_ms":1714003100100i64})
            .to_string()
            .into_bytes(),
        ),
        timestamp_ms: Some(1714003100000),
    };
    produce(&accounts, &[before]);
    let records = load("C32", None);
    let on = |t: &str| -> Vec<&CaseRecord> {
        records
            .iter()
            .filter(|r| {
                let v: Value =
                    serde_json::from_slice(r.rec.value.as_deref().unwrap_or(b"null")).unwrap();
                let is_hb = v.get("source").is_none();
                let is_msg = v.get("op").and_then(Value::as_str) == Some("m");
                match t {
                    "hb" => is_hb,
                    "msg" => is_msg,
                    _ => !is_hb && !is_msg,
                }
            })
            .collect()
    };
    let acc_map = produce_case(&accounts, &on("acc"));
    let hb_map = produce_case(&heartbeat, &on("hb"));
    let msg_map = produce_case(&message, &on("msg"));
    let topics = [accounts.as_str(), heartbeat.as_str(), message.as_str()];

    // Default policy: stop, naming the offset; the truncate is not committed.
    let db = Db::fresh("c32");
    let group = unique("g");
    let p = accounts_pipeline(&topics, &group, &db, "stop", 100);
    let out = try_run_with(&p.path, &[], Duration::from_secs(120));
    assert_ne!(out.code, Some(0), "{}", out.stdout);
    assert!(
        out.stderr.contains("TRUNCATE")
            && out
                .stderr
                .contains(&format!("offset {}", acc_map[&(0, 800)])),
        "{}",
        out.stderr
    );
    assert!(db.checkpoint(&group, &accounts, 0).unwrap_or(0) <= acc_map[&(0, 800)]);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE _position LIKE '52000000/%'"),
        0
    );

    // `truncate = "truncate"`.
    let db = Db::fresh("c32t");
    let group = unique("g");
    let t = run_pipeline(&accounts_pipeline(&topics, &group, &db, "truncate", 100)).tally();
    assert_eq!((t.consumed, t.landed, t.filtered), (5, 3, 2));
    let rows = db.query(
        "SELECT id, balance::text FROM {s}.accounts ORDER BY id",
        &[],
    );
    let got: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got, vec![(1, "1.00".to_string())]);
    let tomb = db.query("SELECT id, _version FROM {s}.accounts_tombstones", &[]);
    assert_eq!(tomb.len(), 1);
    assert_eq!(tomb[0].get::<_, Vec<i64>>(1), vec![52000000, 52000000]);
    assert_eq!(
        committed(&group, &accounts, 1),
        vec![Some(acc_map[&(0, 801)] + 1)]
    );
    assert_eq!(
        committed(&group, &heartbeat, 1),
        vec![Some(hb_map[&(0, 12)] + 1)]
    );
    assert_eq!(
        committed(&group, &message, 1),
        vec![Some(msg_map[&(0, 3)] + 1)]
    );
}

/// C14 (Debezium part): a delete followed by its Kafka tombstone (null value) on a CDC topic, composite key in
/// the `{schema, payload}` form: the delete leaves one tombstone row, the null value is acknowledged as filtered.
#[test]
fn c14_debezium_delete_then_kafka_tombstone() {
    let db = Db::fresh("c14d");
    let (topic, map) = case_topic(
        "C14",
        "c14d",
        1,
        Some("prod_db.public.products_to_categories"),
    );
    let text = concat!(
        debezium_header!(),
        r#"[[projection]]
kind = "row"
table = "products_to_categories"
key = ["products_id", "categories_id"]
columns = { products_id = "integer", categories_id = "integer" }
"#
    );
    let group = unique("g");
    let t = run_text(text, &topic, &group, &db).tally();
    assert_eq!((t.consumed, t.landed, t.filtered), (2, 1, 1));
    let tomb = db.query(
        "SELECT products_id, categories_id FROM {s}.products_to_categories_tombstones",
        &[],
    );
    assert_eq!(tomb.len(), 1);
    assert_eq!(
        (tomb[0].get::<_, i32>(0), tomb[0].get::<_, i32>(1)),
        (16056, 601)
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.products_to_categories"), 0);
    assert_eq!(
        committed(&group, &topic, 1),
        vec![Some(map[&(0, 543501)] + 1)]
    );
}

/// Seed 004: per entity an insert, two updates, a delete and a re-creation — as Debezium envelopes (the key in
/// the message key; positions increasing per transaction).
pub(crate) fn seed004(entities: i64) -> Vec<(i64, Value, Option<Value>)> {
    let mut out = Vec::new();
    let mut lsn = 60_000_000i64;
    let mut tx = 3000i64;
    for step in 0..5 {
        for id in 1..=entities {
            lsn += 100;
            tx += 1;
            let row = |qty: i64, name: &str| json!({"id": id, "name": name, "qty": qty});
            let (op, before, after) = match step {
                0 => ("c", Value::Null, row(1, "first")),
                1 => ("u", Value::Null, row(2, "first")),
                2 => ("u", Value::Null, row(3, "renamed")),
                3 => ("d", row(3, "renamed"), Value::Null),
                _ => ("c", Value::Null, row(10 + id, "again")),
            };
            let value = json!({
                "before": before, "after": after, "op": op, "ts_ms": 1714003200000i64 + lsn,
                "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public", "table": "items",
                    "snapshot": "false", "txId": tx, "lsn": lsn, "ts_ms": 1714003200000i64 + lsn,
                    "sequence": format!("[\"{}\",\"{}\"]", lsn - 36, lsn)},
                "transaction": null
            });
            out.push((id, value, None));
            if op == "d" {
                out.push((id, Value::Null, None)); // the Kafka tombstone after a delete
            }
        }
    }
    out
}

pub(crate) const ITEMS: &str = concat!(
    debezium_header!(),
    r#"[batch]
max-records = MAXREC
linger-ms = 10
[[projection]]
kind = "row"
table = "items"
key = ["id"]
columns = { id = "bigint", name = "text", qty = "bigint" }
[[projection]]
kind = "outbox"
table = "outbox"
payload = ["_op", "_entity"]
"#
);

pub(crate) fn produce_seed004(
    topic: &str,
    partitions: i32,
    changes: &[(i64, Value, Option<Value>)],
) {
    let recs: Vec<Rec> = changes
        .iter()
        .map(|(id, v, _)| Rec {
            partition: (*id % i64::from(partitions)) as i32,
            key: Some(json!({ "id": id }).to_string().into_bytes()),
            value: if v.is_null() {
                None
            } else {
                Some(v.to_string().into_bytes())
            },
            timestamp_ms: None,
        })
        .collect();
    produce(topic, &recs);
}

type ItemRow = (i64, String, i64, Vec<i64>);

fn items_state(db: &Db) -> (Vec<ItemRow>, i64, i64) {
    let rows = db
        .query(
            "SELECT id, name, qty, _version FROM {s}.items ORDER BY id",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    (
        rows,
        db.i64("SELECT count(*) FROM {s}.items_tombstones"),
        db.i64("SELECT count(*) FROM {s}.outbox"),
    )
}

/// Seed 004 applied once, applied twice, with a crash between every destination commit and Kafka commit, and
/// shuffled across partitions (never within one key's order): the same final table, tombstones and outbox.
#[test]
fn seed004_row_state_is_the_same_however_it_is_delivered() {
    let n = 6;
    let changes = seed004(n);
    let expected: Vec<ItemRow> = (1..=n)
        .map(|id| {
            let lsn = 60_000_000 + (4 * n + id) * 100;
            (id, "again".to_string(), 10 + id, vec![lsn - 36, lsn])
        })
        .collect();
    let records = changes.len() as u64;

    // Once, then twice (a replay under another group).
    let (db, topic) = stage("s004", 3);
    produce_seed004(&topic, 3, &changes);
    let p = pipeline(
        &ITEMS.replace("MAXREC", "100"),
        &topic,
        &unique("g"),
        &db.schema,
    );
    let t = run_pipeline(&p).tally();
    assert_eq!(
        (t.consumed, t.landed, t.filtered),
        (records, 5 * n as u64, n as u64)
    );
    let once = items_state(&db);
    assert_eq!(once, (expected.clone(), 0, 5 * n));
    let p2 = pipeline(
        &ITEMS.replace("MAXREC", "100"),
        &topic,
        &unique("g"),
        &db.schema,
    );
    let t = run_pipeline(&p2).tally();
    assert_eq!((t.landed, t.duplicate), (0, 5 * n as u64));
    assert_eq!(items_state(&db), once);

    // A crash after every database commit, before its Kafka commit; small batches.
    let db = Db::fresh("s004c");
    let group = unique("g");
    // Static membership: each restarted process takes its predecessor's place in the group at once instead of
    // waiting for the crashed member's session to time out.
    let text = format!(
        "{}\n[kafka.properties]\n\"group.instance.id\" = \"{}\"\n",
        ITEMS.replace("MAXREC", "4"),
        unique("member")
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    let mut runs = 0;
    loop {
        runs += 1;
        assert!(runs < 60, "did not converge");
        let out = try_run_with(&p.path, &[CRASH_AFTER_DB_COMMIT], Duration::from_secs(120));
        if out.code == Some(0) {
            break;
        }
    }
    assert!(runs > 2, "the failpoint interrupted runs");
    assert_eq!(items_state(&db), once);

    // Shuffled across partitions: one partition, keys interleaved differently, each key's order kept.
    let (db, topic) = stage("s004s", 1);
    let mut shuffled = Vec::new();
    for id in (1..=n).rev() {
        shuffled.extend(changes.iter().filter(|(i, _, _)| *i == id).cloned());
    }
    produce_seed004(&topic, 1, &shuffled);
    let p = pipeline(
        &ITEMS.replace("MAXREC", "7"),
        &topic,
        &unique("g"),
        &db.schema,
    );
    run_pipeline(&p);
    assert_eq!(items_state(&db), once);
}

/// C12 with `tombstones = "column"`: the deleted row stays with `_deleted_at` and the delete's version; the late
/// snapshot read is stale; a newer create revives it.
#[test]
fn c12_tombstone_column_mode() {
    let db = Db::fresh("c12col");
    let (topic, _) = case_topic("C12", "c12col", 1, Some("pg.public.accounts"));
    let text = ACCOUNTS
        .replace("TOPICS", "\"{topic}\"")
        .replace("TRUNCATE", "stop")
        .replace("MAXREC", "100")
        .replace(
            "truncate = \"stop\"",
            "truncate = \"stop\"\ntombstones = \"column\"",
        );
    let out = run_text(&text, &topic, &unique("g"), &db);
    assert_eq!(out.stale(), 1);
    let r = db.query(
        "SELECT _deleted_at IS NOT NULL, _version FROM {s}.accounts WHERE id = 8",
        &[],
    );
    assert_eq!(r.len(), 1);
    assert!(r[0].get::<_, bool>(0));
    assert_eq!(r[0].get::<_, Vec<i64>>(1), vec![43000436, 43000500]);
    // A newer create recreates it.
    let recreate = Rec {
        partition: 0,
        key: Some(br#"{"id":8}"#.to_vec()),
        value: Some(
            json!({"before":null,"after":{"id":8,"owner":"acct-eight","balance":"8.00","updated_at":"2024-04-26T00:00:00Z"},
                "source":{"connector":"postgresql","db":"app","schema":"public","table":"accounts","txId":980,
                "lsn":43000900,"sequence":"[\"43000836\",\"43000900\"]","ts_ms":1714003300000i64,"snapshot":"false"},
                "op":"c","ts_ms":1714003300100i64})
            .to_string()
            .into_bytes(),
        ),
        timestamp_ms: None,
    };
    produce(&topic, &[recreate]);
    run_text(&text, &topic, &unique("g"), &db);
    let r = db.query(
        "SELECT _deleted_at IS NULL, balance::text FROM {s}.accounts WHERE id = 8",
        &[],
    );
    assert!(r[0].get::<_, bool>(0));
    assert_eq!(r[0].get::<_, String>(1), "8.00");
}

const VERSIONED: &str = concat!(
    debezium_header!(),
    r#"[batch]
max-records = MAXREC
[[projection]]
kind = "row"
table = "customers"
key = ["id"]
columns = { id = "bigint", name = "text", version = "bigint" }
version = "version"
truncate = "truncate"
"#
);

/// `version = "<column>"`: a delete carries the version of the row it deletes — or, under REPLICA IDENTITY
/// DEFAULT, no version at all, and is then ordered by its source position — and applies; an insert after a
/// key-only delete applies (it follows it at the source), even at the deleted row's version; a truncate leaves
/// tombstones without a version of their own at its position, and the rows inserted after it apply. Batch size
/// does not matter.
#[test]
fn version_column_deletes_and_truncates() {
    let topic = new_topic("vcol", 1);
    let row = |id: i64, name: &str, v: i64| json!({"id": id, "name": name, "version": v});
    let key_only = |id: i64| json!({"id": id, "name": null, "version": null});
    produce(
        &topic,
        &[
            Table("customers").create(0, 1, row(1, "a", 1), 100),
            Table("customers").create(0, 2, row(2, "b", 1), 110),
            Table("customers").update(0, 1, row(1, "a2", 2), 120),
            Table("customers").delete(0, 1, key_only(1), 130),
            Table("customers").delete(0, 2, row(2, "b", 1), 140),
            Table("customers").create(0, 1, row(1, "a2", 2), 150),
            Table("customers").create(0, 3, row(3, "c", 1), 160),
            Table("customers").truncate(0, 170),
            // Committed after the truncate (the helper's commit LSN is lsn - 36).
            Table("customers").create(0, 3, row(3, "c2", 2), 220),
        ],
    );
    for max in [100, 1] {
        let db = Db::fresh("vcol");
        let p = pipeline(
            &VERSIONED.replace("MAXREC", &max.to_string()),
            &topic,
            &unique("g"),
            &db.schema,
        );
        let out = run_pipeline(&p);
        let t = out.tally();
        assert_eq!(
            (t.consumed, t.landed, out.stale(), t.quarantined),
            (9, 9, 0, 0),
            "max {max}"
        );
        let live = db.query(
            "SELECT id, name, version FROM {s}.customers ORDER BY id",
            &[],
        );
        let live: Vec<(i64, String, i64)> = live
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        assert_eq!(live, vec![(3, "c2".to_string(), 2)], "max {max}");
        let tomb = db.query(
            "SELECT id, _version FROM {s}.customers_tombstones ORDER BY id",
            &[],
        );
        let tomb: Vec<(i64, Vec<i64>)> = tomb.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(tomb, vec![(1, vec![]), (2, vec![])], "max {max}");
        assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 0);
    }
}

/// A truncate is a table-wide watermark: a change older than it that arrives later from another partition is
/// stale, not a resurrection; newer changes apply.
#[test]
fn truncate_watermark_holds_across_partitions() {
    let (db, topic) = stage("twm", 2);
    let row = |id: i64| json!({"id": id, "owner": format!("o{id}"), "balance": "1.00", "updated_at": "2024-04-25T00:00:00Z"});
    produce(
        &topic,
        &[
            Table("accounts").create(0, 1, row(1), 100),
            Table("accounts").truncate(0, 200),
        ],
    );
    let group = unique("g");
    run_pipeline(&accounts_pipeline(&[&topic], &group, &db, "truncate", 100));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.accounts"), 0);
    produce(
        &topic,
        &[
            Table("accounts").create(1, 5, row(5), 150),
            Table("accounts").create(1, 6, row(6), 250),
        ],
    );
    let out = run_pipeline(&accounts_pipeline(&[&topic], &group, &db, "truncate", 100));
    assert_eq!((out.tally().landed, out.stale()), (1, 1));
    let ids: Vec<i64> = db.column("SELECT id FROM {s}.accounts ORDER BY id");
    assert_eq!(ids, vec![6]);
    assert_eq!(
        db.query("SELECT version FROM {s}.replaysafe_truncates", &[])[0].get::<_, Vec<i64>>(0),
        vec![200, 200]
    );
}

/// Schemaless numerics: a string that is both a decimal and base64 (`"1234"`) is quarantined as ambiguous
/// unless `[source] decimal-handling` names the connector's mode; the rest of the batch lands. Intervals are
/// Debezium's MicroDuration microseconds.
#[test]
fn ambiguous_decimals_and_intervals() {
    let topic = new_topic("amb", 1);
    let row = |id: i64, amt: &str| json!({"id": id, "amt": amt, "iv": 3600000000i64});
    produce(
        &topic,
        &[
            Table("prices").create(0, 1, row(1, "1234"), 100),
            Table("prices").create(0, 2, row(2, "AxY="), 110),
        ],
    );
    let text = concat!(
        header!(),
        r#"[source]
format = "debezium"
MODE
[[projection]]
kind = "row"
table = "prices"
key = ["id"]
columns = { id = "bigint", amt = "numeric(12,2)", iv = "interval" }
"#
    );
    let db = Db::fresh("amb");
    let out = run_text(&text.replace("MODE", ""), &topic, &unique("g"), &db);
    assert_eq!((out.tally().landed, out.tally().quarantined), (1, 1));
    let dl = db.query(
        "SELECT reason, detail FROM {s}.replaysafe_dead_letters",
        &[],
    );
    assert_eq!(dl[0].get::<_, String>(0), "invalid-field");
    assert!(
        dl[0].get::<_, String>(1).contains("ambiguous"),
        "{}",
        dl[0].get::<_, String>(1)
    );
    let r = db.query(
        "SELECT amt::text, iv::text FROM {s}.prices WHERE id = 2",
        &[],
    );
    assert_eq!(r[0].get::<_, String>(0), "7.90");
    assert_eq!(r[0].get::<_, String>(1), "01:00:00");

    let db = Db::fresh("amb2");
    let p = pipeline(
        &text.replace("MODE", "decimal-handling = \"precise\""),
        &topic,
        &unique("g"),
        &db.schema,
    );
    assert_eq!(run_pipeline(&p).tally().landed, 2);
    let amounts: Vec<String> = db.column("SELECT amt::text FROM {s}.prices ORDER BY id");
    assert_eq!(amounts, vec!["-26588.24", "7.90"]);
}
