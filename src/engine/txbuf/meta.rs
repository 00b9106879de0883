//! Reading Debezium's transaction metadata from a record value: a change's `transaction` block, the
//! transaction topic's BEGIN and END events. Shapes: <https://debezium.io/documentation/reference/stable/connectors/postgresql.html#postgresql-transaction-metadata>.
//! Read from the decoded value ([`read`]): a schema-registry frame (`[source] encoding = "avro"` or
//! `"json-schema"`) is unwrapped first, as the change decoder does.

use serde_json::Value;

use crate::config::Pipeline;

/// What a record says about source transactions.
#[derive(Debug, PartialEq)]
pub enum Meta {
    /// A change event of transaction `id`; `collections`: the names END may count it under (`schema.table`,
    /// `db.table`, `db.schema.table`); `order`: its `transaction.total_order` (the event's position among all
    /// events of the transaction, 1-based), when given.
    Change {
        id: String,
        collections: Vec<String>,
        order: Option<u64>,
    },
    /// The transaction topic's BEGIN event.
    Begin { id: String },
    /// The transaction topic's END event: `event_count` and `data_collections[]`.
    End {
        id: String,
        total: u64,
        counts: Vec<(String, u64)>,
    },
    /// Anything else (no `transaction` block, not JSON, a heartbeat…): applied per record.
    Other,
}

/// The key a transaction id is buffered under. Debezium's PostgreSQL connector (3.6.1, seen in
/// `tests/it/cdc_tx.rs`) writes `<txId>:<LSN>` with the LSN of each event — BEGIN, every change and END of one
/// transaction carry different ids — so an id of two all-digit parts is keyed by its txId; any other id (MySQL
/// GTIDs `uuid:n`, SQL Server `lsn:lsn:n`, …) is kept whole.
pub fn tx_key(id: &str) -> String {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once(':') {
        Some((tx, lsn)) if digits(tx) && digits(lsn) => tx.to_string(),
        _ => id.to_string(),
    }
}

/// Reads the transaction metadata of a record value as the pipeline decodes it: a schema-registry frame is
/// converted first ([`crate::decode::framed::unframe`]: Avro → the JSON converter's `{schema, payload}` form,
/// JSON Schema → its JSON body), then [`meta`]. A value that cannot be unwrapped is [`Meta::Other`] (the change
/// decoder quarantines it, per record).
pub fn read(pipeline: &Pipeline, value: Option<&[u8]>) -> Meta {
    if pipeline.registry.is_none() {
        return meta(value);
    }
    match crate::decode::framed::unframe(pipeline, value, "value") {
        Ok(v) => meta(v.as_deref()),
        Err(_) => Meta::Other,
    }
}

/// Reads the transaction metadata of a Debezium value in JSON (schemas on or off); ids as [`tx_key`]s.
pub fn meta(value: Option<&[u8]>) -> Meta {
    let Some(Ok(Value::Object(mut m))) = value.map(serde_json::from_slice::<Value>) else {
        return Meta::Other;
    };
    if m.contains_key("schema") {
        if let Some(Value::Object(p)) = m.remove("payload") {
            m = p;
        }
    }
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    match (
        m.get("status").and_then(Value::as_str),
        s(m.get("id")).map(|i| tx_key(&i)),
    ) {
        (Some("BEGIN"), Some(id)) if !m.contains_key("op") => return Meta::Begin { id },
        (Some("END"), Some(id)) if !m.contains_key("op") => {
            let counts = m
                .get("data_collections")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| {
                    Some((
                        s(c.get("data_collection"))?,
                        c.get("event_count")?.as_u64()?,
                    ))
                })
                .collect();
            let total = m.get("event_count").and_then(Value::as_u64).unwrap_or(0);
            return Meta::End { id, total, counts };
        }
        _ => {}
    }
    let tx = m.get("transaction");
    let Some(id) = tx.and_then(|t| s(t.get("id"))).map(|i| tx_key(&i)) else {
        return Meta::Other;
    };
    let order = tx
        .and_then(|t| t.get("total_order"))
        .and_then(Value::as_u64);
    let src = m.get("source");
    let f = |k: &str| src.and_then(|x| x.get(k)).and_then(Value::as_str);
    let mut collections = Vec::new();
    if let Some(t) = f("table") {
        if let Some(sc) = f("schema") {
            collections.push(format!("{sc}.{t}"));
            if let Some(db) = f("db") {
                collections.push(format!("{db}.{sc}.{t}"));
            }
        }
        if let Some(db) = f("db") {
            collections.push(format!("{db}.{t}"));
        }
    }
    Meta::Change {
        id,
        collections,
        order,
    }
}
