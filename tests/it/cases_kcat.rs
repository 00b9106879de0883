//! C43: replaying a `kcat -C -J` dump with `replaysafe load`: the payload is a JSON string decoded twice, null
//! and empty keys stay distinct, header arrays (duplicates, nulls) are read, a missing `ts` is an unknown time
//! (never 1970), a raw non-UTF-8 byte stops the load naming the line and the record (or, with
//! `--quarantine-invalid-utf8`, becomes a dead letter holding the line), and a value kcat could not decode
//! (`payload_error`) is quarantined with kcat's message — never filtered, never dropped.

use std::path::Path;

use serde_json::Value;

use crate::cases::orders_pipeline;
use crate::common::*;
use crate::secrets::PIPE;

/// The dump lines of C43 (each record's note holds the exact kcat line) for `topic`, `$HEX(e9)` as the raw
/// byte 0xE9.
fn c43_dump(topic: &str) -> Vec<Vec<u8>> {
    let path = format!(
        "{}/tests/fixtures/cases/C43.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let case: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    case["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let note = r["note"].as_str().unwrap();
            let rest = &note[note.find("kcat line: ").unwrap() + "kcat line: ".len()..];
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            values.next().unwrap().unwrap();
            let line = rest[..values.byte_offset()].replace("shop.order-events", topic);
            let parts: Vec<&[u8]> = line.split("$HEX(e9)").map(str::as_bytes).collect();
            parts.join(&[0xE9u8][..])
        })
        .collect()
}

fn write_dump(path: &Path, lines: &[Vec<u8>]) {
    let mut bytes = Vec::new();
    for l in lines {
        bytes.extend_from_slice(l);
        bytes.push(b'\n');
    }
    std::fs::write(path, bytes).unwrap();
}

fn load_dump(p: &Pipeline, file: &Path, extra: &[&str]) -> Out {
    let mut args = vec!["load", "--config", arg(&p.path)];
    args.extend_from_slice(extra);
    args.push(arg(file));
    replaysafe(&args)
}

fn order(db: &Db, id: &str) -> (String, i64) {
    let r = db.query(
        "SELECT status, version FROM {s}.orders WHERE order_id = $1",
        &[&id],
    );
    (r[0].get(0), r[0].get(1))
}

#[test]
fn c43_kcat_dump_with_raw_bytes_stops_then_quarantines_the_line() {
    let db = Db::fresh("c43");
    // A topic name of this test only, never created: the load is not checked against a live end.
    let topic = unique("c43.dump");
    let p = orders_pipeline(&topic, &unique("g"), &db, None);
    let file = p.dir.path().join("dump.jsonl");
    let lines = c43_dump(&topic);
    assert!(
        std::str::from_utf8(&lines[4]).is_err(),
        "line 5 holds the raw 0xE9"
    );
    write_dump(&file, &lines);

    // By default the load stops at line 5, naming it and the record; lines 1-4 are applied, line 6 is not.
    let first = load_dump(&p, &file, &[]);
    assert_eq!(first.code, Some(1), "{}", first.stderr);
    assert!(
        first.stderr.contains("dump.jsonl:5") && first.stderr.contains(&format!("{topic}/1@0")),
        "{}",
        first.stderr
    );
    assert_eq!(order(&db, "o-900"), ("ORDERNOTED".to_string(), 3));
    // Key null and key "" stay distinct records (both land); the tombstone is quarantined (C14's policy).
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 3);
    let dl = db.query(
        "SELECT partition, \"offset\", reason, key, value IS NULL FROM {s}.replaysafe_dead_letters",
        &[],
    );
    assert_eq!(dl.len(), 1);
    assert_eq!(
        (
            dl[0].get::<_, i32>(0),
            dl[0].get::<_, i64>(1),
            dl[0].get::<_, String>(2)
        ),
        (0, 4, "null-value".to_string())
    );
    assert_eq!(dl[0].get::<_, Option<Vec<u8>>>(3), Some(b"o-900".to_vec()));
    assert!(dl[0].get::<_, bool>(4));

    // With the skip flag: the line becomes a dead letter holding its raw bytes, line 6 lands; 1-4 are no-ops.
    let second = load_dump(&p, &file, &["--quarantine-invalid-utf8"]);
    second.assert_ok();
    let t = second.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.quarantined),
        (2, 1, 0, 1),
        "{}",
        second.stderr
    );
    assert_eq!(order(&db, "o-900"), ("SHIPPED".to_string(), 4));
    let bad = db.query(
        "SELECT reason, detail, value, record_timestamp IS NULL FROM {s}.replaysafe_dead_letters \
         WHERE partition = 1 AND \"offset\" = 0",
        &[],
    );
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].get::<_, String>(0), "undecodable-value");
    let detail: String = bad[0].get(1);
    assert!(
        detail.contains("not UTF-8") && detail.contains("0xE9") && detail.contains("dump.jsonl:5"),
        "{detail}"
    );
    assert_eq!(bad[0].get::<_, Vec<u8>>(2), lines[4], "the raw line bytes");
    assert!(!bad[0].get::<_, bool>(3), "line 5 has a ts");
    // Line 6 has no ts: nothing of it is dated 1970.
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE record_timestamp < '2000-01-01'"),
        0
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 4);

    // Again: nothing changes.
    let third = load_dump(&p, &file, &["--quarantine-invalid-utf8"]);
    third.assert_ok();
    assert_eq!(third.tally().consumed, 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 4);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        2
    );
    assert_eq!(order(&db, "o-900"), ("SHIPPED".to_string(), 4));
}

/// Lines kcat wrote when it could not decode the value (`-s value=avro` with a schema-registry error): payload
/// null and `payload_error`. Line 1 has the empty key and no timestamp, line 2 a null key and a timestamp.
fn payload_error_lines(topic: &str) -> String {
    format!(
        r#"{{"topic":"{topic}","partition":0,"offset":0,"broker":1,"key":"","payload":null,"payload_error":"Avro/Schema-registry message deserialization: schema id 7 not found"}}
{{"topic":"{topic}","partition":0,"offset":1,"tstype":"create","ts":1714003209000,"broker":1,"headers":["flag",null],"key":null,"payload":null,"payload_error":"Invalid CP1 magic byte 123, expected 0"}}
"#
    )
}

/// A dead letter: offset, reason, detail, key, record timestamp as text.
type DeadLetter = (i64, String, String, Option<Vec<u8>>, Option<String>);

fn undecodable(db: &Db) -> Vec<DeadLetter> {
    db.query(
        "SELECT \"offset\", reason, detail, key, record_timestamp::text FROM {s}.replaysafe_dead_letters \
         ORDER BY \"offset\"",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
    .collect()
}

fn assert_undecodable(db: &Db) {
    let dl = undecodable(db);
    assert_eq!(dl.len(), 2, "{dl:?}");
    for (row, msg) in dl
        .iter()
        .zip(["schema id 7 not found", "Invalid CP1 magic byte 123"])
    {
        assert_eq!(row.1, "undecodable-value", "{dl:?}");
        assert!(
            row.2.contains("could not be decoded") && row.2.contains(msg),
            "kcat's message kept: {dl:?}"
        );
    }
    assert_eq!(dl[0].3, Some(Vec::new()), "the empty key is not null");
    assert_eq!(dl[1].3, None, "the null key is not empty");
    assert_eq!(dl[0].4, None, "no ts: the time is unknown, not 1970");
    assert!(
        dl[1]
            .4
            .as_deref()
            .is_some_and(|t| t.starts_with("2024-04-25")),
        "{dl:?}"
    );
}

#[test]
fn c43_payload_error_is_quarantined_with_kcats_message() {
    // A pipeline of JSON events: not "null value (a Kafka tombstone)".
    let db = Db::fresh("c43pe");
    let topic = unique("c43.pe");
    let p = orders_pipeline(&topic, &unique("g"), &db, None);
    let file = p.dir.path().join("dump.jsonl");
    std::fs::write(&file, payload_error_lines(&topic)).unwrap();
    let out = load_dump(&p, &file, &[]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!((t.consumed, t.filtered, t.quarantined), (2, 0, 2));
    assert_undecodable(&db);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.processed_events"), 0);

    // A Debezium pipeline: not filtered as `cdc-kafka-tombstone`.
    let db = Db::fresh("c43cdc");
    let text = concat!(
        debezium_header!(),
        r#"[[projection]]
kind = "row"
table = "t"
key = ["f1"]
columns = { f1 = "text", f2 = "integer" }
"#
    );
    let p = pipeline(text, &topic, &unique("g"), &db.schema);
    let file = p.dir.path().join("dump.jsonl");
    std::fs::write(&file, payload_error_lines(&topic)).unwrap();
    let out = load_dump(&p, &file, &[]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.filtered, t.quarantined),
        (2, 0, 2),
        "{}",
        out.stdout
    );
    assert_undecodable(&db);
}

/// kcat lines with both `payload_error` and `key_error`, or `key_error` alone: every error kcat reported is in
/// the dead letter under the member's own name (the detail said `value_error`, a member kcat never writes, and
/// dropped the key's error when both were set).
#[test]
fn kcat_payload_and_key_errors_are_all_kept_under_their_names() {
    let db = Db::fresh("b11_kcat");
    // Never created: the load is not checked against a live end.
    let topic = unique("b11.kcat");
    let p = pipeline(PIPE, &topic, &unique("g"), &db.schema);
    let ev = r#""{\"event_id\":\"e1\",\"day\":\"2026-11-29\"}""#;
    let file = p.dir.path().join("dump.jsonl");
    std::fs::write(
        &file,
        format!(
            "{{\"topic\":\"{topic}\",\"partition\":0,\"offset\":0,\"key\":null,\"payload\":null,\
             \"payload_error\":\"val err\",\"key_error\":\"key err\"}}\n\
             {{\"topic\":\"{topic}\",\"partition\":0,\"offset\":1,\"key\":\"k\",\"payload\":{ev},\
             \"key_error\":\"bad key\"}}\n\
             {{\"topic\":\"{topic}\",\"partition\":0,\"offset\":2,\"key\":\"k\",\"payload\":{ev},\
             \"payload_error\":null,\"key_error\":null}}\n"
        ),
    )
    .unwrap();
    let out = replaysafe(&["load", "--config", arg(&p.path), arg(&file)]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (3, 1, 2),
        "{}",
        out.stdout
    );
    let dl = db.query(
        "SELECT \"offset\", reason, detail FROM {s}.replaysafe_dead_letters ORDER BY 1",
        &[],
    );
    let dl: Vec<(i64, String, String)> =
        dl.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(dl.len(), 2, "{dl:?}");
    assert!(dl.iter().all(|d| d.1 == "undecodable-value"), "{dl:?}");
    assert!(
        dl[0]
            .2
            .contains("kcat's payload_error in the dump): val err")
            && dl[0].2.contains("kcat's key_error in the dump): key err"),
        "{dl:?}"
    );
    assert!(
        dl[1].2.contains("kcat's key_error in the dump): bad key"),
        "{dl:?}"
    );
    assert!(!dl.iter().any(|d| d.2.contains("value_error")), "{dl:?}");
    assert_eq!(db.i64("SELECT n FROM {s}.per_day"), 1);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1);
}
