//! Debezium change events (the JSON converter's output, `schemas.enable` on or off) turned into a [`Change`]
//! and a flat document the pipeline's `[fields]` read.
//!
//! Envelope reference: Debezium PostgreSQL connector documentation, "Data change events" (`before`, `after`,
//! `source`, `op` c/u/d/r/t/m, `ts_ms`) and "Data type mappings" (Connect logical types such as
//! `org.apache.kafka.connect.data.Decimal`, `io.debezium.time.MicroTimestamp`). The JSON converter wraps key and
//! value in `{"schema": …, "payload": …}` when `schemas.enable=true` (Kafka Connect `JsonConverter`).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::schema;
use crate::decode::rejection::{Reason, Rejection};

/// Placeholder Debezium writes for an unchanged TOASTed column (`unavailable.value.placeholder`).
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";
/// The placeholder as base64 (how it appears in `bytea` columns with the JSON converter).
pub const UNAVAILABLE_BASE64: &str = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==";

/// The kind of change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `c`: insert.
    Create,
    /// `u`: update.
    Update,
    /// `d`: delete.
    Delete,
    /// `r`: snapshot read (observed state, not a business action).
    Read,
    /// `t`: truncate of the whole table.
    Truncate,
}

impl Op {
    /// The envelope's letter.
    pub fn letter(self) -> &'static str {
        match self {
            Op::Create => "c",
            Op::Update => "u",
            Op::Delete => "d",
            Op::Read => "r",
            Op::Truncate => "t",
        }
    }
}

/// One column value of a row image, with the Connect schema of its field when the message carried one.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// The JSON value as sent.
    pub value: Value,
    /// The field's Connect schema (`type`, `name`, `parameters`, `items`), when schemas are enabled.
    pub schema: Option<Arc<Value>>,
}

/// A row image (`before`/`after`) or a key: column name → value, in message order.
pub type Row = Vec<(String, Cell)>;

/// One row change (or truncate) as the row projections need it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The operation.
    pub op: Op,
    /// `source.schema` + `.` + `source.table`.
    pub table: String,
    /// The version of this change: `source.sequence` = `[last commit LSN, change LSN]` (Debezium PostgreSQL
    /// connector, "source" metadata: `sequence[0]` is the end of the last commit the connector processed before
    /// this change, not this change's own commit). Without `sequence`, `[lsn, lsn]`. A snapshot read with a null
    /// `sequence[0]` (an initial or blocking snapshot; its `lsn` is the snapshot's consistent point S) is
    /// `[S, 0]`: below every change streamed after that snapshot, whatever their change LSN (see
    /// [`Change::follows_snapshot`]). Any other null `sequence[0]` is taken as the change LSN. Incremental
    /// snapshot reads carry both elements and keep them.
    pub position: [i64; 2],
    /// A streamed change (not a read) whose `sequence[0]` is null: the first transaction the connector streamed
    /// after a snapshot (or after it first started), which committed after the snapshot's point S but can hold
    /// change LSNs below S (it began before the snapshot). Real Debezium 3.6.1 output: reads `[null, S]`, then
    /// such a transaction `[null, L]` with L < S, the next one `[end of its commit, …]`. The row projection
    /// orders it after the entity's stored state ([`crate::projection::row`]'s fold).
    pub follows_snapshot: bool,
    /// A read of an incremental snapshot (`source.snapshot = "incremental"`, Debezium's signal-driven chunks
    /// read while streaming goes on): observed state like every read, but not an initial or repeated snapshot
    /// (no resnapshot warning), and never covering a whole table (nothing is removed for rows it lacks).
    pub incremental: bool,
    /// An incremental-snapshot read without a source position: Debezium 2.x leaves `source.lsn`, `txId`, `xmin`
    /// and `sequence` null on them (DBZ-4329). [`Change::position`] is then `[0, 0]`, and the row projection
    /// places the read at the entity's stored state (Debezium's chunk window drops every key changed while the
    /// chunk was read, so a read is at least as new as every earlier record of its key in the partition): it
    /// never lowers a stored version and never recreates a tombstoned row. Its `_position` is
    /// `incremental/<envelope ts_ms>`.
    pub unpositioned: bool,
    /// The Debezium key (unwrapped), when the record had one.
    pub key: Option<Row>,
    /// The record has no Kafka key at all (null): Debezium's change of a table without a primary key (DBZ-916).
    pub null_key: bool,
    /// `before` (deletes and REPLICA IDENTITY FULL updates).
    pub before: Option<Row>,
    /// `after` (creates, updates, reads).
    pub after: Option<Row>,
    /// The previous key of a primary-key change (the create's `__debezium.oldkey` header): unchanged TOASTed
    /// values of the new key are those of the old one.
    pub old_key: Option<Row>,
}

/// The record header Debezium puts on the create of a primary-key change, naming the old key.
pub const OLD_KEY_HEADER: &str = "__debezium.oldkey";

/// What a Debezium record is.
#[derive(Debug)]
pub enum Record {
    /// A row change or truncate: the change and the document `[fields]` read.
    Change(Arc<Change>, Value),
    /// Not a row change: acknowledged and counted as filtered under this built-in rule name.
    Skip(&'static str),
}

fn reject(detail: impl Into<String>) -> Rejection {
    Rejection {
        reason: Reason::InvalidField,
        detail: detail.into(),
    }
}

fn parse_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_str().parse().ok(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A row image (or key) as a [`Row`], its values moved in, each with its field's Connect schema.
fn row(v: Option<Value>, schema: &[(String, Arc<Value>)]) -> Result<Option<Row>, Rejection> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(
            m.into_iter()
                .map(|(k, value)| {
                    let schema = schema.iter().find(|(n, _)| *n == k).map(|(_, s)| s.clone());
                    (k, Cell { value, schema })
                })
                .collect(),
        )),
        Some(other) => Err(reject(format!(
            "row image is not an object: {}",
            excerpt(&other)
        ))),
    }
}

fn excerpt(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s
    }
}

/// What the document of a decoded change holds (the `serde_json::Value` a pipeline's `[fields]` read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doc {
    /// The whole envelope (and the record key as `key`) plus the built-in fields: for `[fields]` that point
    /// into the envelope.
    Full,
    /// Only the built-in fields (`_source`, `_entity`, `_position`, `_op`, `_snapshot`, `_day`): the envelope
    /// is parsed leanly ([`super::lean`]) and its row images are moved into the change, not copied.
    BuiltIns,
}

/// Decodes one Debezium record (raw key and value bytes) with the whole envelope in its document.
///
/// # Errors
/// A [`Rejection`] (`invalid-json`, `invalid-field`) naming what is wrong with the envelope.
pub fn decode(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    old_key: Option<&[u8]>,
) -> Result<Record, Rejection> {
    decode_with(key, value, old_key, Doc::Full)
}

/// Decodes one Debezium record (raw key and value bytes); `doc` says what its document must hold. Both give
/// the same change, skip or rejection.
///
/// # Errors
/// A [`Rejection`] (`invalid-json`, `invalid-field`) naming what is wrong with the envelope.
pub fn decode_with(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    old_key: Option<&[u8]>,
    doc: Doc,
) -> Result<Record, Rejection> {
    let lean = match (doc, value) {
        (Doc::BuiltIns, Some(bytes)) => super::lean::parse(bytes)
            .map(|(env, schema)| classify(Value::Object(env), schema))
            .and_then(Result::ok),
        _ => None,
    };
    let (mut env, schema, op) = match lean.map_or_else(|| parse(value), Ok)? {
        Parsed::Skip(rule) => return Ok(Record::Skip(rule)),
        Parsed::Envelope { env, schema, op } => (env, schema, op),
    };
    let snapshot = op == Op::Read;
    let incremental = snapshot && snapshot_kind(&env) == Some("incremental");
    let at = source_position(&env, incremental)?;
    let (commit_lsn, change_lsn) = (at.commit_lsn, at.change_lsn);

    // The key: unwrapped the same way (a connector may switch schemas.enable mid-topic).
    let key_json = key.and_then(|k| schema::parse(k).ok());
    // The entity: the key's columns (sorted), or the whole row image for tables without a primary key.
    let entity = match (&key_json, op) {
        (_, Op::Truncate) => String::new(),
        (Some((v @ Value::Object(_), _)), _) => canonical(v),
        _ => {
            let img = if op == Op::Delete {
                env.get("before")
            } else {
                env.get("after")
            };
            img.map(canonical).unwrap_or_default()
        }
    };
    // Row images and key: moved out when the document does not keep them, copied when it does.
    let mut image = |name: &str| match doc {
        Doc::Full => env.get(name).cloned(),
        Doc::BuiltIns => env.remove(name),
    };
    let (before_json, after_json) = (image("before"), image("after"));
    let (key_value, key_schema) = match key_json {
        Some((k @ Value::Object(_), ks)) if doc == Doc::Full => (Some(k.clone()), Some((k, ks))),
        Some((k @ Value::Object(_), ks)) => (None, Some((k, ks))),
        Some((k, _)) if doc == Doc::Full => (Some(k), None),
        _ => (None, None),
    };
    let key_row = match key_schema {
        Some((k, ks)) => row(Some(k), fields_of(&ks, |s| &s.fields))?,
        None => None,
    };
    let before = row(before_json, fields_of(&schema, |s| &s.before))?;
    let after = row(after_json, fields_of(&schema, |s| &s.after))?;
    if matches!(op, Op::Create | Op::Update | Op::Read) && after.is_none() {
        return Err(reject(format!("op `{}` without `after`", op.letter())));
    }
    if op == Op::Delete && before.is_none() && key_row.is_none() {
        return Err(reject("delete without `before` and without a key"));
    }

    let source_id = format!("{}.{}.{}", at.db, at.schema, at.table);
    let position = match (at.unpositioned, at.tx) {
        (Some(ts), _) => format!("incremental/{ts}"),
        (None, Some(t)) => format!("{commit_lsn}/{change_lsn}/{t}"),
        (None, None) => format!("{commit_lsn}/{change_lsn}"),
    };
    // The envelope itself becomes the document `[fields]` read (moved, not copied: 3 KB per record with schema).
    let mut doc_map = match doc {
        Doc::Full => env,
        Doc::BuiltIns => Map::new(),
    };
    doc_map.insert("_source".into(), Value::String(source_id));
    doc_map.insert("_entity".into(), Value::String(entity));
    doc_map.insert("_position".into(), Value::String(position));
    doc_map.insert("_op".into(), Value::String(op.letter().into()));
    doc_map.insert("_snapshot".into(), Value::Bool(snapshot));
    doc_map.insert(
        "_day".into(),
        Value::String(crate::decode::day::text(at.day)),
    );
    if let Some(k) = key_value {
        doc_map.insert("key".into(), k);
    }
    let pos = match (snapshot, at.commit_null) {
        (true, true) => [change_lsn, 0],
        _ => [commit_lsn, change_lsn],
    };
    Ok(Record::Change(
        Arc::new(Change {
            op,
            table: format!("{}.{}", at.schema, at.table),
            position: pos,
            follows_snapshot: !snapshot && at.commit_null && op != Op::Truncate,
            incremental,
            unpositioned: at.unpositioned.is_some(),
            key: key_row,
            null_key: key.is_none(),
            before,
            after,
            old_key: match old_key.and_then(|k| schema::parse(k).ok()) {
                Some((k, ks)) => row(Some(k), fields_of(&ks, |s| &s.fields)).ok().flatten(),
                None => None,
            },
        }),
        Value::Object(doc_map),
    ))
}

/// A record value, parsed: a change envelope, or something to skip under a built-in rule.
enum Parsed {
    /// Not a row change: skipped under this rule name.
    Skip(&'static str),
    /// A change envelope, its Connect schema (when the converter sends one) and its op.
    Envelope {
        env: Map<String, Value>,
        schema: Option<Arc<schema::Parsed>>,
        op: Op,
    },
}

/// The field schemas `pick` selects from a parsed schema (none without one).
fn fields_of(
    s: &Option<Arc<schema::Parsed>>,
    pick: impl Fn(&schema::Parsed) -> &schema::RowSchema,
) -> &[(String, Arc<Value>)] {
    s.as_deref().map(|p| pick(p).as_slice()).unwrap_or(&[])
}

/// Parses a record value: Kafka tombstones, transaction metadata, heartbeats and logical messages are skipped;
/// a flattened row, non-JSON or an unknown op is rejected.
fn parse(value: Option<&[u8]>) -> Result<Parsed, Rejection> {
    let Some(bytes) = value else {
        // A Kafka tombstone after a delete: log compaction's marker; the `op = d` record carried the delete.
        return Ok(Parsed::Skip("cdc-kafka-tombstone"));
    };
    let (payload, schema) = schema::parse(bytes).map_err(|e| Rejection {
        reason: Reason::InvalidJson,
        detail: crate::decode::json::not_json(bytes, &e),
    })?;
    classify(payload, schema)
}

/// What a parsed record value is: a change envelope (with its op), a skip, or a rejection.
fn classify(payload: Value, schema: Option<Arc<schema::Parsed>>) -> Result<Parsed, Rejection> {
    let env = match payload {
        Value::Null => return Ok(Parsed::Skip("cdc-kafka-tombstone")),
        Value::Object(m) => m,
        _ => {
            return Err(Rejection {
                reason: Reason::InvalidJson,
                detail: "value is not a JSON object".into(),
            })
        }
    };
    // Transaction metadata (provide.transaction.metadata): {status: BEGIN|END, id, event_count, …}.
    if matches!(
        env.get("status").and_then(Value::as_str),
        Some("BEGIN" | "END")
    ) && env.contains_key("id")
        && !env.contains_key("op")
    {
        return Ok(Parsed::Skip("cdc-transaction-metadata"));
    }
    // Heartbeats (heartbeat.interval.ms), recognised by what they are: the Heartbeat schema, or a payload that is
    // only `ts_ms`. Never by what is missing: a flattened row has no `op` and no `source` either.
    if is_heartbeat(&env, schema.as_deref()) {
        return Ok(Parsed::Skip("cdc-heartbeat"));
    }
    if !env.contains_key("source") && !env.contains_key("before") && !env.contains_key("after") {
        return Err(flattened(&env));
    }
    let op = match env.get("op").and_then(Value::as_str) {
        Some("c") => Op::Create,
        Some("u") => Op::Update,
        Some("d") => Op::Delete,
        Some("r") => Op::Read,
        Some("t") => Op::Truncate,
        Some("m") => return Ok(Parsed::Skip("cdc-message")),
        Some(other) => return Err(reject(format!("unknown Debezium op `{other}`"))),
        None => return Err(reject("Debezium envelope without `op`")),
    };
    Ok(Parsed::Envelope { env, schema, op })
}

/// Where a change comes from, read from its `source` block.
struct SourceAt {
    db: String,
    schema: String,
    table: String,
    /// The commit's LSN (`sequence[0]`, else the change's).
    commit_lsn: i64,
    /// `source.sequence` is there and its first element is null.
    commit_null: bool,
    /// The change's LSN (`sequence[1]`, else `lsn`).
    change_lsn: i64,
    tx: Option<i64>,
    /// The UTC day of `ts_ms`.
    day: chrono::NaiveDate,
    /// An incremental-snapshot read without `lsn` and `sequence`: the envelope's `ts_ms` (when the connector
    /// emitted it), its identity; the LSNs are then 0.
    unpositioned: Option<i64>,
}

/// `source.snapshot`: `true`, `first`, `first_in_data_collection`, `last_in_data_collection`, `last`
/// (initial and blocking snapshots), `incremental`, or `false` (streaming); Debezium PostgreSQL connector
/// documentation, "source" metadata. Absent on older connectors.
fn snapshot_kind(env: &Map<String, Value>) -> Option<&str> {
    env.get("source")
        .and_then(|s| s.get("snapshot"))
        .and_then(Value::as_str)
}

/// The change's source position and day, from its `source` block. `incremental`: an incremental-snapshot read,
/// which may carry no position at all (then [`SourceAt::unpositioned`]).
fn source_position(env: &Map<String, Value>, incremental: bool) -> Result<SourceAt, Rejection> {
    let source = env
        .get("source")
        .and_then(Value::as_object)
        .ok_or_else(|| reject("Debezium envelope without a `source` block"))?;
    let text = |k: &str| {
        source
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (db, sch, tbl) = (text("db"), text("schema"), text("table"));
    if tbl.is_empty() {
        return Err(reject("`source.table` is missing"));
    }
    let lsn = source.get("lsn").and_then(parse_i64);
    let seq: Option<Vec<Option<i64>>> = match source.get("sequence") {
        Some(Value::String(s)) => match super::lean::sequence(s) {
            Some(seq) => Some(seq),
            None => {
                let arr: Vec<Value> = serde_json::from_str(s)
                    .map_err(|_| reject(format!("`source.sequence` is not a JSON array: {s}")))?;
                Some(arr.iter().map(parse_i64).collect())
            }
        },
        _ => None,
    };
    let change_lsn = seq
        .as_ref()
        .and_then(|s| s.get(1).copied().flatten())
        .or(lsn);
    let unpositioned = match (change_lsn, incremental) {
        (Some(_), _) => None,
        (None, true) => Some(env.get("ts_ms").and_then(parse_i64).ok_or_else(|| {
            reject("an incremental-snapshot read without a source position and without `ts_ms`")
        })?),
        (None, false) => {
            return Err(reject(
                "no source position: `source.sequence` and `source.lsn` are both missing",
            ))
        }
    };
    let change_lsn = change_lsn.unwrap_or(0);
    let commit = seq.as_ref().and_then(|s| s.first().copied().flatten());
    let commit_lsn = commit.unwrap_or(change_lsn);
    let tx = source.get("txId").and_then(parse_i64);
    let ts_ms = source
        .get("ts_ms")
        .and_then(parse_i64)
        .or_else(|| env.get("ts_ms").and_then(parse_i64))
        .ok_or_else(|| reject("`source.ts_ms` is missing"))?;
    let day = chrono::DateTime::from_timestamp_millis(ts_ms)
        .ok_or_else(|| reject(format!("`source.ts_ms` {ts_ms} is out of range")))?
        .date_naive();

    Ok(SourceAt {
        db,
        schema: sch,
        table: tbl,
        commit_lsn,
        commit_null: seq.is_some() && commit.is_none(),
        change_lsn,
        tx,
        day,
        unpositioned,
    })
}

/// Connect schema name of Debezium's heartbeat value (`heartbeat.interval.ms`).
pub const HEARTBEAT_SCHEMA: &str = "io.debezium.connector.common.Heartbeat";

/// Whether a record value is a Debezium heartbeat: its schema is [`HEARTBEAT_SCHEMA`], or (schemaless) its
/// payload holds `ts_ms` and nothing else.
fn is_heartbeat(env: &Map<String, Value>, schema: Option<&schema::Parsed>) -> bool {
    let named = schema
        .and_then(|s| s.name.as_deref())
        .is_some_and(|n| n == HEARTBEAT_SCHEMA);
    named || (env.len() == 1 && env.contains_key("ts_ms"))
}

/// The quarantine of a record flattened by Debezium's `ExtractNewRecordState` transform (the row alone, no
/// `op`/`source`/`before`/`after`): it carries no source position and no table, so it cannot be ordered or
/// identified as a change.
fn flattened(env: &Map<String, Value>) -> Rejection {
    let mut members: Vec<&str> = env.keys().map(String::as_str).take(8).collect();
    if env.len() > members.len() {
        members.push("…");
    }
    Rejection {
        reason: Reason::Flattened,
        detail: format!(
            "flattened record (Debezium's ExtractNewRecordState transform, `io.debezium.transforms.\
             ExtractNewRecordState`: no `op`, `source`, `before` or `after`; members: {}): it carries no source \
             position, so it can neither be identified nor ordered. Remove the transform from the connector's \
             `transforms` and replay the topic",
            members.join(", ")
        ),
    }
}

/// JSON text with object members sorted, so that one key always gives one entity string.
fn canonical(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = Map::new();
                for k in keys {
                    out.insert(k.clone(), sort(&m[k]));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

/// The value of the [`OLD_KEY_HEADER`] header of a consumed record, if any.
pub fn old_key_header<M: rdkafka::message::Message>(msg: &M) -> Option<&[u8]> {
    use rdkafka::message::Headers;
    let headers = msg.headers()?;
    headers
        .iter()
        .find(|h| h.key == OLD_KEY_HEADER)
        .and_then(|h| h.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each fixture file of `tests/fixtures/debezium/` (records real Debezium 3.6.1 produced) with its records:
    /// the line and its parsed JSON (`topic`, `key`, `value`).
    fn fixtures() -> Vec<(&'static str, Vec<(String, Value)>)> {
        [
            "schema-on.jsonl",
            "schema-off.jsonl",
            "schema-off-bytes-numeric.jsonl",
        ]
        .into_iter()
        .map(|file| {
            let path = format!(
                "{}/tests/fixtures/debezium/{file}",
                env!("CARGO_MANIFEST_DIR")
            );
            let text = std::fs::read_to_string(&path).unwrap();
            let records = text
                .lines()
                .map(|l| (l.to_string(), serde_json::from_str(l).unwrap()))
                .collect();
            (file, records)
        })
        .collect()
    }

    /// A fixture's key or value as the record's bytes (`None` for JSON null).
    fn bytes(v: &Value) -> Option<Vec<u8>> {
        (!v.is_null()).then(|| serde_json::to_vec(v).unwrap())
    }

    /// Every record real Debezium 3.6.1 produced in `tests/fixtures/debezium/` (schemas on and off): heartbeats
    /// are recognised as heartbeats, everything else is a change or another built-in skip — nothing rejected.
    #[test]
    fn real_debezium_records_heartbeats_and_changes() {
        for (file, records) in fixtures() {
            let mut heartbeats = 0;
            for (line, r) in records {
                let (key, value) = (bytes(&r["key"]), bytes(&r["value"]));
                let topic = r["topic"].as_str().unwrap();
                let got = decode(key.as_deref(), value.as_deref(), None)
                    .unwrap_or_else(|e| panic!("{file}: {line}: {}", e.detail));
                let heartbeat = matches!(got, Record::Skip("cdc-heartbeat"));
                assert_eq!(
                    heartbeat,
                    topic.starts_with("__debezium-heartbeat."),
                    "{file}: {line}"
                );
                heartbeats += usize::from(heartbeat);
            }
            assert!(heartbeats > 0, "{file}");
        }
    }

    /// The two documents give the same outcome: the same change (or skip, or rejection word for word) and the
    /// same built-in fields — on every record real Debezium produced and on hand-made edge cases (the lean
    /// parse declines most of those and the full parse decides).
    #[test]
    fn lean_and_full_decode_agree() {
        type Bytes = Option<Vec<u8>>;
        let mut cases: Vec<(Bytes, Bytes)> = Vec::new();
        for (_, records) in fixtures() {
            for (_, r) in records {
                cases.push((bytes(&r["key"]), bytes(&r["value"])));
                // As the JSON converter writes it (`schema` first), twice: the second one is split at the
                // schema text looked up last (`schema::split_known`).
                let v = &r["value"];
                if let (Some(s), Some(p)) = (v.get("schema"), v.get("payload")) {
                    let wire = format!(r#"{{"schema":{s},"payload":{p}}}"#).into_bytes();
                    cases.push((bytes(&r["key"]), Some(wire.clone())));
                    cases.push((bytes(&r["key"]), Some(wire)));
                }
            }
        }
        let src = r#""source":{"db":"app","schema":"public","table":"t","ts_ms":1714003700000,"lsn":7,"sequence":"[\"5\",\"7\"]","txId":3}"#;
        for v in [
            format!(r#"{{"before":null,"after":{{"id":1,"n":"a"}},{src},"op":"c"}}"#),
            format!(r#"{{"before":{{"id":1}},"after":null,{src},"op":"d"}}"#),
            format!(r#"{{"before":null,"after":null,{src},"op":"c"}}"#),
            format!(r#"{{"before":null,"after":"x",{src},"op":"u"}}"#),
            format!(r#"{{"after":{{"id":1}},{src},"op":"z"}}"#),
            format!(r#"{{"after":{{"id":1}},{src},"op":"m"}}"#),
            format!(r#"{{"after":{{"id":1}},{src},"op":"t"}}"#),
            format!(r#"{{"after":{{"id":1}},{src},"op":"c","op":"u"}}"#),
            r#"{"after":{"id":1},"source":{"table":"t","ts_ms":1,"sequence":"[1, 2]"},"op":"r"}"#
                .to_string(),
            r#"{"after":{"id":1},"source":{"table":"t","ts_ms":1,"sequence":"nope"},"op":"r"}"#
                .to_string(),
            r#"{"after":{"id":1},"source":{"ts_ms":1,"lsn":2},"op":"r"}"#.to_string(),
            format!(r#"{{"payload":{{"after":{{"id":1}},{src},"op":"c"}},"schema":null}}"#),
            format!(r#"{{"schema":null,"payload":{{"after":{{"id":1}},{src},"op":"c"}}}}"#),
            format!(
                r#"{{"schema":{{"type":"struct"}},"payload":{{"after":{{"id":1}},{src},"op":"c"}},"x":1}}"#
            ),
            // Found by a break-it review: what no one reads must still be valid JSON, serde_json's marker
            // keys mean what they mean to `Value`, and a control character is no sequence digit.
            format!(r#"{{"after":{{"id":1}},{src},"op":"c","version":"\ud800"}}"#),
            format!(
                r#"{{"after":{{"id":1}},{src},"op":"c","transaction":{}{}}}"#,
                "[".repeat(300),
                "]".repeat(300)
            ),
            r#"{"after":{"id":1},"op":"c","source":{"$serde_json::private::RawValue":"{\"table\":\"t\",\"lsn\":1,\"ts_ms\":1}"}}"#
                .to_string(),
            r#"{"after":{"id":1},"op":"c","source":{"$serde_json::private::Number":"5"}}"#.to_string(),
            format!(
                r#"{{"after":{{"id":1}},{src},"op":"c","transaction":{{"$serde_json::private::Number":"x"}}}}"#
            ),
            "{\"after\":{\"id\":1},\"source\":{\"table\":\"t\",\"ts_ms\":1,\"sequence\":\"[\\\"\t5\\\",\\\"7\\\"]\"},\"op\":\"r\"}".to_string(),
            r#"{"status":"BEGIN","id":"1","event_count":null}"#.to_string(),
            r#"{"ts_ms":1}"#.to_string(),
            r#"{"id":1,"name":"a"}"#.to_string(),
            "null".to_string(),
            "not json".to_string(),
        ] {
            for key in [None, Some(br#"{"id":1}"#.to_vec()), Some(b"7".to_vec())] {
                cases.push((key, Some(v.clone().into_bytes())));
            }
        }
        cases.push((Some(br#"{"id":1}"#.to_vec()), None));
        let mut not_utf8 =
            format!(r#"{{"after":{{"id":1}},{src},"op":"c","version":"x"}}"#).into_bytes();
        let at = not_utf8.len() - 3;
        not_utf8[at] = 0xFF;
        cases.push((None, Some(not_utf8)));
        let builtins = [
            "_source",
            "_entity",
            "_position",
            "_op",
            "_snapshot",
            "_day",
        ];
        let (mut changes, mut lean_parsed) = (0, 0);
        for (key, value) in &cases {
            let (k, v) = (key.as_deref(), value.as_deref());
            let full = decode_with(k, v, None, Doc::Full);
            let lean = decode_with(k, v, None, Doc::BuiltIns);
            let what = format!(
                "{:?} {:?}",
                k.map(String::from_utf8_lossy),
                v.map(String::from_utf8_lossy)
            );
            match (full, lean) {
                (Ok(Record::Change(cf, df)), Ok(Record::Change(cl, dl))) => {
                    changes += 1;
                    lean_parsed += usize::from(v.and_then(super::super::lean::parse).is_some());
                    assert_eq!(format!("{cf:?}"), format!("{cl:?}"), "{what}");
                    for b in builtins {
                        assert_eq!(df[b], dl[b], "{b} {what}");
                    }
                    let members = dl.as_object().unwrap().len();
                    assert_eq!(members, builtins.len(), "{what}");
                }
                (Ok(Record::Skip(a)), Ok(Record::Skip(b))) => assert_eq!(a, b, "{what}"),
                (Err(a), Err(b)) => {
                    assert_eq!((a.reason, &a.detail), (b.reason, &b.detail), "{what}")
                }
                (a, b) => panic!("{what}: full {a:?} lean {b:?}"),
            }
        }
        // Every change took the lean parse but the `source` spelled as a serde_json RawValue marker (× 3 keys),
        // which the lean parse leaves to the full one.
        assert!(changes > 60, "{changes}");
        assert_eq!(lean_parsed, changes - 3, "{changes}");
    }

    /// A flattened row (ExtractNewRecordState) is rejected as `flattened-record`, never taken for a heartbeat.
    #[test]
    fn flattened_rows_are_not_heartbeats() {
        for v in [
            r#"{"id":1,"name":"a"}"#,
            r#"{"id":1,"__deleted":"true"}"#,
            r#"{"ts_ms":1,"id":1}"#,
        ] {
            let e = decode(None, Some(v.as_bytes()), None).unwrap_err();
            assert_eq!(e.reason, Reason::Flattened, "{v}");
            assert!(e.detail.contains("ExtractNewRecordState"), "{v}");
        }
        assert!(matches!(
            decode(None, Some(br#"{"ts_ms":1}"#), None),
            Ok(Record::Skip("cdc-heartbeat"))
        ));
    }

    /// C51: an incremental-snapshot read without lsn, txId and sequence (Debezium 2.x, DBZ-4329) is a read
    /// placed later by the row projection — position `[0, 0]`, `_position` its emission time — in both parses;
    /// one with a position (Debezium 3.6.1) keeps it; a streamed change without a position is still refused.
    #[test]
    fn incremental_reads_without_a_position_are_reads() {
        let v = |snapshot: &str, op: &str, seq: &str, lsn: &str| {
            format!(
                r#"{{"before":null,"after":{{"id":1}},"source":{{"db":"app","schema":"public","table":"t",
                "ts_ms":5,"snapshot":"{snapshot}","sequence":{seq},"lsn":{lsn},"txId":null}},"op":"{op}",
                "ts_ms":1714003272010}}"#
            )
        };
        for doc in [Doc::Full, Doc::BuiltIns] {
            let text = v("incremental", "r", "null", "null");
            let Record::Change(c, d) =
                decode_with(Some(br#"{"id":1}"#), Some(text.as_bytes()), None, doc).unwrap()
            else {
                panic!("not a change")
            };
            assert!(c.incremental && c.unpositioned, "{doc:?}");
            assert_eq!(c.position, [0, 0]);
            assert_eq!(d["_position"], "incremental/1714003272010");
            assert_eq!(d["_snapshot"], true);
            let text = v(
                "incremental",
                "r",
                r#""[\"28758576\",\"28758576\"]""#,
                "28758576",
            );
            let Record::Change(c, _) =
                decode_with(Some(br#"{"id":1}"#), Some(text.as_bytes()), None, doc).unwrap()
            else {
                panic!("not a change")
            };
            assert!(c.incremental && !c.unpositioned, "{doc:?}");
            assert_eq!(c.position, [28_758_576, 28_758_576]);
            let text = v("true", "r", r#""[null,\"100\"]""#, "100");
            let Record::Change(c, _) =
                decode_with(Some(br#"{"id":1}"#), Some(text.as_bytes()), None, doc).unwrap()
            else {
                panic!("not a change")
            };
            assert!(!c.incremental && !c.unpositioned, "{doc:?}");
            for (snapshot, op) in [("false", "u"), ("true", "r")] {
                let text = v(snapshot, op, "null", "null");
                let e = decode_with(Some(br#"{"id":1}"#), Some(text.as_bytes()), None, doc)
                    .unwrap_err();
                assert!(
                    e.detail.contains("no source position"),
                    "{snapshot} {doc:?}"
                );
            }
        }
    }
}
