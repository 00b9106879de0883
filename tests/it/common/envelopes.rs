//! Hand-written Debezium change events (the schemaless JSON converter's shape) and raw JSON records.

use serde_json::{json, Value};

use super::Rec;

/// A schemaless Debezium envelope of `public.<table>` at source position `[lsn - 36, lsn]` (`[lsn, lsn]` for a
/// truncate, op `t`), envelope and source `ts_ms` 2024-04-25T00:00:00Z + `lsn` ms, key `{"id": id}` (none when
/// `id` is `None`), no Kafka timestamp.
pub fn envelope(
    partition: i32,
    table: &str,
    op: &str,
    id: Option<i64>,
    before: Value,
    after: Value,
    lsn: i64,
) -> Rec {
    let value = json!({
        "before": before, "after": after, "op": op, "ts_ms": 1714003200000i64 + lsn,
        "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public", "table": table,
            "snapshot": "false", "txId": lsn / 10, "lsn": lsn, "ts_ms": 1714003200000i64 + lsn,
            "sequence": format!("[\"{}\",\"{}\"]", if op == "t" { lsn } else { lsn - 36 }, lsn)},
    });
    raw(partition, id.map(|i| json!({ "id": i })), value)
}

/// A record of JSON `key` (none when `None`) and JSON `value`, no Kafka timestamp.
pub fn raw(partition: i32, key: Option<Value>, value: Value) -> Rec {
    Rec {
        partition,
        key: key.map(|k| k.to_string().into_bytes()),
        value: Some(value.to_string().into_bytes()),
        timestamp_ms: None,
    }
}

/// The [`envelope`]s of one source table `public.<name>`, op by op (`before` null for creates and updates,
/// `after` null for deletes).
#[derive(Clone, Copy)]
pub struct Table(pub &'static str);

impl Table {
    /// A create (`op = c`) of `after`, key `{"id": id}`, at `[lsn - 36, lsn]`.
    pub fn create(self, partition: i32, id: i64, after: Value, lsn: i64) -> Rec {
        envelope(partition, self.0, "c", Some(id), Value::Null, after, lsn)
    }

    /// An update (`op = u`) to `after` (no `before`), key `{"id": id}`, at `[lsn - 36, lsn]`.
    pub fn update(self, partition: i32, id: i64, after: Value, lsn: i64) -> Rec {
        envelope(partition, self.0, "u", Some(id), Value::Null, after, lsn)
    }

    /// A delete (`op = d`) of `before`, key `{"id": id}`, at `[lsn - 36, lsn]`.
    pub fn delete(self, partition: i32, id: i64, before: Value, lsn: i64) -> Rec {
        envelope(partition, self.0, "d", Some(id), before, Value::Null, lsn)
    }

    /// A truncate (`op = t`, no key) at `[lsn, lsn]`.
    pub fn truncate(self, partition: i32, lsn: i64) -> Rec {
        envelope(partition, self.0, "t", None, Value::Null, Value::Null, lsn)
    }
}
