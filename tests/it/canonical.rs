//! Issue 34, item 2: every value a row projection stores or compares has one form, whatever the batching, the
//! replay and the encoding. A Debezium row projection of a table with `timestamptz`, `numeric(12,2)`, `jsonb`,
//! `timestamp(6)`, `text[]` and `bytea` columns gets snapshot reads, resnapshot reads and republished updates
//! of the same state spelled differently, conflicting updates, and deletes with their Kafka tombstones — for
//! entities over three partitions, applied with batches of 1 record and of 5000, and again into a fresh schema.
//! The rows, the tombstones (`_last` included), the conflicts and the accounting line are identical every time.

use serde_json::{json, Value};

use crate::common::*;

const COLUMNS: &str = r#"{ id = "bigint", rev = "bigint", seen = "timestamptz", amount = "numeric(12,2)", doc = "jsonb", at = "timestamp(6)", tags = "text[]", blob = "bytea" }"#;

fn text(max_records: usize) -> String {
    format!(
        "{DEBEZIUM_HEADER}[batch]\nmax-records = {max_records}\nlinger-ms = 50\n[[projection]]\nkind = \"row\"\n\
         table = \"readings\"\nsource-table = \"public.readings\"\nkey = [\"id\"]\nversion = \"rev\"\n\
         columns = {COLUMNS}\n"
    )
}

/// The Connect schema (JSON converter, `schemas.enable=true`) of the row.
fn row_schema(name: &str) -> Value {
    json!({"type": "struct", "optional": true, "name": name, "fields": [
        {"field": "id", "type": "int64", "optional": false},
        {"field": "rev", "type": "int64", "optional": false},
        {"field": "seen", "type": "string", "optional": true, "name": "io.debezium.time.ZonedTimestamp", "version": 1},
        {"field": "amount", "type": "bytes", "optional": true, "name": "org.apache.kafka.connect.data.Decimal",
         "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "12"}},
        {"field": "doc", "type": "string", "optional": true, "name": "io.debezium.data.Json", "version": 1},
        {"field": "at", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp", "version": 1},
        {"field": "tags", "type": "array", "optional": true, "items": {"type": "string", "optional": true}},
        {"field": "blob", "type": "bytes", "optional": true}
    ]})
}

/// `rec` (a schemaless envelope) in the `{schema, payload}` form.
fn with_schema(mut rec: Rec) -> Rec {
    let Some(v) = rec.value.as_ref() else {
        return rec;
    };
    let payload: Value = serde_json::from_slice(v).unwrap();
    let image = |field: &str| {
        let mut s = row_schema("pg.public.readings.Value");
        s["field"] = json!(field);
        s
    };
    let schema = json!({"type": "struct", "optional": false, "name": "pg.public.readings.Envelope", "fields": [
        image("before"),
        image("after"),
        {"field": "source", "type": "struct", "optional": false, "name": "io.debezium.connector.postgresql.Source",
         "fields": [{"field": "lsn", "type": "int64", "optional": true}]},
        {"field": "op", "type": "string", "optional": false},
        {"field": "ts_ms", "type": "int64", "optional": true}
    ]});
    rec.value = Some(
        json!({"schema": schema, "payload": payload})
            .to_string()
            .into_bytes(),
    );
    rec
}

/// One spelling of a row state: `form` 0 or 1 spell the same values differently (`amount_cents` is the
/// amount in hundredths).
fn row(id: i64, rev: i64, amount_cents: i64, form: u8, schema: bool) -> Value {
    let seen = [
        "2026-12-02T01:05:36.649077Z",
        "2026-12-02T02:05:36.649077+01:00",
    ][usize::from(form)];
    let doc = [r#"{"b":1,"a":[1,2]}"#, r#"{"a": [1, 2], "b": 1}"#][usize::from(form)];
    let amount = if schema {
        // Decimal: the unscaled value, big-endian two's complement, base64.
        let b = amount_cents.to_be_bytes();
        let skip = b.iter().take_while(|&&x| x == 0).count().min(6);
        json!(base64_encode(&b[skip..]))
    } else {
        let whole = amount_cents / 100;
        let frac = amount_cents % 100;
        // "1.0" / "1.00" / "1": one value of a numeric(12,2) column.
        json!(match (form, frac) {
            (0, 0) => format!("{whole}.0"),
            (0, f) if f % 10 == 0 => format!("{whole}.{}", f / 10),
            (_, f) => format!("{whole}.{f:02}"),
        })
    };
    json!({"id": id, "rev": rev, "seen": seen, "amount": amount, "doc": doc, "at": 1_764_637_536_649_077i64,
           "tags": ["x", "y z"], "blob": "3q2+7w=="})
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Per entity (partition `id % 3`): a snapshot read (rev 1), a resnapshot read of the same state spelled
/// otherwise (duplicate), an update (rev 2), the update republished at a later position spelled otherwise
/// (duplicate: equal version, same state); for `id % 4 == 0` an update at rev 2 with another amount (a
/// conflict); for even ids a delete of rev 2 and its Kafka tombstone.
fn records(entities: i64, schema: bool) -> Vec<Rec> {
    let mut out = Vec::new();
    let wrap = |r: Rec| if schema { with_schema(r) } else { r };
    for step in 0..6i64 {
        for id in 1..=entities {
            let p = (id % 3) as i32;
            let lsn = 10_000_000 + step * 100_000 + id * 100;
            let t = |op: &str, before: Value, after: Value| {
                let mut r = envelope(p, "readings", op, Some(id), before, after, lsn);
                if op == "r" {
                    // A snapshot read: `source.snapshot` set.
                    let mut v: Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
                    v["source"]["snapshot"] = json!("true");
                    r.value = Some(v.to_string().into_bytes());
                }
                wrap(r)
            };
            match step {
                0 => out.push(t("r", Value::Null, row(id, 1, 100, 0, schema))),
                1 => out.push(t("r", Value::Null, row(id, 1, 100, 1, schema))),
                2 => out.push(t("u", Value::Null, row(id, 2, 250, 0, schema))),
                3 => out.push(t("u", Value::Null, row(id, 2, 250, 1, schema))),
                4 if id % 4 == 0 => out.push(t("u", Value::Null, row(id, 2, 300, 0, schema))),
                5 if id % 2 == 0 => {
                    out.push(t("d", row(id, 2, 250, 1, schema), Value::Null));
                    out.push(raw(p, Some(json!({"id": id})), Value::Null));
                    out.last_mut().unwrap().value = None;
                }
                _ => {}
            }
        }
    }
    out
}

/// Rows, tombstones and conflicts, as text.
type State = (Vec<String>, Vec<String>, Vec<String>);

/// Everything the projection stored, as text: rows, tombstones, conflicts (what a run leaves, offsets and
/// times aside).
fn state(db: &Db) -> State {
    (
        db.strings(
            "SELECT row(id, rev, seen, amount, doc, at, tags, blob, _version, _sha256, _delivery, _position)::text \
             FROM {s}.readings ORDER BY id",
        ),
        db.strings(
            "SELECT row(id, _version, _delivery, _last, _position)::text FROM {s}.readings_tombstones ORDER BY id",
        ),
        db.strings(
            "SELECT row(entity, version, stored_delivery, incoming_delivery, stored_sha256, incoming_sha256, stored, \
             incoming, partition, \"offset\")::text FROM {s}.replaysafe_conflicts ORDER BY entity::text, \"offset\"",
        ),
    )
}

fn one_form(schema: bool) {
    let entities = 12i64;
    let topic = new_topic("canon", 3);
    produce(&topic, &records(entities, schema));
    let mut seen: Vec<(State, String)> = Vec::new();
    for (prefix, max) in [("canon1", 1), ("canon5000", 5000), ("canonfresh", 5000)] {
        let db = Db::fresh(prefix);
        let out = run_text(&text(max), &topic, &unique("g"), &db);
        out.assert_ok();
        let tally = out.tally_line().expect("tally").to_string();
        let st = state(&db);
        // The values themselves, as PostgreSQL prints them: one form whatever the record's spelling.
        let last = db.text("SELECT _last::text FROM {s}.readings_tombstones WHERE id = 2");
        assert_eq!(
            last.as_deref(),
            Some(
                r#"{"at": "2025-12-02 01:05:36.649077", "id": "2", "doc": "{\"a\": [1, 2], \"b\": 1}", "rev": "2", "blob": "\\xdeadbeef", "seen": "2026-12-02 01:05:36.649077+00", "tags": "{x,\"y z\"}", "amount": "2.50"}"#
            ),
            "max-records {max}"
        );
        let odd = db.strings(
            "SELECT row(seen, amount, doc, at, tags, blob)::text FROM {s}.readings WHERE id IN (1, 3) ORDER BY id",
        );
        assert_eq!(
            odd,
            vec![
                r#"("2026-12-02 01:05:36.649077+00",2.50,"{""a"": [1, 2], ""b"": 1}","2025-12-02 01:05:36.649077","{x,""y z""}","\\xdeadbeef")"#;
                2
            ],
            "max-records {max}"
        );
        // 12 entities: 6 deleted (tombstones), 6 live; 3 conflicts (ids 4, 8, 12), none for a same state spelled
        // otherwise.
        assert_eq!(
            (st.0.len(), st.1.len(), st.2.len()),
            (6, 6, 3),
            "max-records {max}: {:?}",
            st.2.first()
        );
        let conflicted: Vec<String> = db.strings(
            "SELECT entity->>'id' FROM {s}.replaysafe_conflicts ORDER BY (entity->>'id')::int",
        );
        assert_eq!(conflicted, vec!["4", "8", "12"]);
        // The two states at version 2 (amounts 2.50 and 3.00): one row each, naming the same winner (the
        // smaller state hash) as stored whichever came first.
        assert_eq!(
            db.strings(
                "SELECT least(stored->>'amount', incoming->>'amount') || ' ' || \
                 greatest(stored->>'amount', incoming->>'amount') FROM {s}.replaysafe_conflicts"
            ),
            vec!["2.50 3.00"; 3]
        );
        seen.push((st, tally));
    }
    assert_eq!(seen[0], seen[1], "batches of 1 and of 5000");
    assert_eq!(seen[1], seen[2], "a replay into a fresh schema");
    // 12 reads, 12 updates landed; 12 resnapshot reads and 12 republished updates duplicate; 3 conflicts
    // (stale); 6 deletes landed, 6 Kafka tombstones filtered.
    let t = &seen[0].1;
    assert_eq!(
        t,
        "consumed 63 = landed 30 + duplicate 24 + stale 3 + filtered 6 + quarantined 0 [stale: 3 conflict(s)] \
         [filtered cdc-kafka-tombstone: 6]"
    );
}

#[test]
fn debezium_schemaless_values_have_one_form_whatever_the_batching() {
    one_form(false);
}

#[test]
fn debezium_with_schema_values_have_one_form_whatever_the_batching() {
    one_form(true);
}

const JSON_EVENTS: &str = concat!(
    header!(),
    r#"[fields]
event_id = { path = "/event_id", type = "uuid" }
event_type = { path = "/event_type", type = "text" }
customer_id = { path = "/customer_id", type = "text" }
at = { path = "/at", type = "timestamptz" }
doc = { path = "/doc", type = "jsonb" }
version = { path = "/version", type = "bigint" }
[identity]
key = ["event_id"]
[batch]
max-records = MAXREC
linger-ms = 50
[[projection]]
kind = "row"
table = "customers"
key = ["customer_id"]
version = "version"
columns = ["customer_id", "at", "doc"]
delete-if = "event_type == 'CustomerClosed'"
"#
);

/// JSON events: per customer (over three partitions) an opening at version 1, the same state again at
/// version 1 spelled otherwise (another offset, jsonb keys in another order: a duplicate, not a conflict), for
/// every third customer a different state at version 1 (a conflict), and for even customers a closing at
/// version 2 (a tombstone whose `_last` holds the values as PostgreSQL prints them, whether the opening was in
/// the same batch or not) — identical with batches of 1 and 5000 and into a fresh schema.
#[test]
fn json_event_values_have_one_form_whatever_the_batching() {
    let customers = 12u32;
    let mut recs = Vec::new();
    let mut n = 0u32;
    let mut event = |p: i32, c: u32, ty: &str, at: &str, doc: &str, version: i64| {
        n += 1;
        Rec::json(
            p,
            &format!("c{c}"),
            &format!(
                r#"{{"event_id":"00000000-0000-4000-8000-{n:012}","event_type":"{ty}","customer_id":"c{c}","at":"{at}","doc":{doc},"version":{version}}}"#
            ),
            1_764_637_536_000,
        )
    };
    for step in 0..4 {
        for c in 1..=customers {
            let p = (c % 3) as i32;
            match step {
                0 => recs.push(event(
                    p,
                    c,
                    "CustomerOpened",
                    "2026-12-02T02:05:36.649077+01:00",
                    r#"{"b":1,"a":[1,2]}"#,
                    1,
                )),
                1 => recs.push(event(
                    p,
                    c,
                    "CustomerOpened",
                    "2026-12-02T01:05:36.649077Z",
                    r#"{"a": [1, 2], "b": 1}"#,
                    1,
                )),
                2 if c % 3 == 0 => recs.push(event(
                    p,
                    c,
                    "CustomerOpened",
                    "2026-12-02T01:05:37Z",
                    r#"{"a":[1,2],"b":1}"#,
                    1,
                )),
                3 if c % 2 == 0 => recs.push(event(
                    p,
                    c,
                    "CustomerClosed",
                    "2026-12-03T00:00:00Z",
                    "{}",
                    2,
                )),
                _ => {}
            }
        }
    }
    let topic = new_topic("canonj", 3);
    produce(&topic, &recs);
    let mut seen: Vec<(State, String)> = Vec::new();
    for (prefix, max) in [("canonj1", 1), ("canonj5000", 5000), ("canonjfresh", 5000)] {
        let db = Db::fresh(prefix);
        let out = run_text(
            &JSON_EVENTS.replace("MAXREC", &max.to_string()),
            &topic,
            &unique("g"),
            &db,
        );
        out.assert_ok();
        assert_eq!(
            db.text("SELECT _last::text FROM {s}.customers_tombstones WHERE customer_id = 'c2'")
                .as_deref(),
            Some(
                r#"{"at": "2026-12-02 01:05:36.649077+00", "doc": "{\"a\": [1, 2], \"b\": 1}", "customer_id": "c2"}"#
            ),
            "max-records {max}"
        );
        let st = (
            db.strings(
                "SELECT row(customer_id, at, doc, _version, _sha256, _delivery)::text FROM {s}.customers ORDER BY 1",
            ),
            db.strings(
                "SELECT row(customer_id, _version, _delivery, _last)::text FROM {s}.customers_tombstones ORDER BY 1",
            ),
            db.strings(
                "SELECT row(entity, version, stored, incoming, stored_sha256, incoming_sha256)::text \
                 FROM {s}.replaysafe_conflicts ORDER BY 1",
            ),
        );
        assert_eq!(
            (st.0.len(), st.1.len(), st.2.len()),
            (6, 6, 4),
            "max-records {max}: {:?}",
            st.2.first()
        );
        seen.push((st, out.tally_line().expect("tally").to_string()));
    }
    assert_eq!(seen[0], seen[1], "batches of 1 and of 5000");
    assert_eq!(seen[1], seen[2], "a replay into a fresh schema");
    assert_eq!(
        seen[0].1,
        "consumed 34 = landed 18 + duplicate 12 + stale 4 + filtered 0 + quarantined 0 [stale: 4 conflict(s)]"
    );
}
