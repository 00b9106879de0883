//! `kind = "outbox"`: one outbox row per landed record, unique by delivery key, written in the batch
//! transaction (a relay publishes it later).

use super::kind::{Compiled, Ctx, Settings};
use crate::config::fields::{delivery_key_sql, message_key_sql, table_name};
use crate::error::Result;
use crate::ident::{Ident, QualifiedName};

/// Default outbox table.
pub const DEFAULT_OUTBOX_TABLE: &str = "replaysafe_outbox";

/// The keys an outbox takes.
pub(crate) const KEYS: &[&str] = &["table", "payload", "key", "snapshots"];

/// Checks an outbox's keys and builds its insert and table.
///
/// # Errors
/// [`crate::Error::Config`] naming `file:line:column`.
pub(crate) fn compile(ctx: &Ctx<'_>) -> Result<Compiled> {
    let (src, fields, schema, rp) = (ctx.src, ctx.fields, ctx.schema, ctx.raw());
    let table = match &rp.table {
        Some(t) => table_name(src, schema, t)?,
        None => QualifiedName {
            schema: schema.clone(),
            name: Ident::new(DEFAULT_OUTBOX_TABLE).expect("static"),
        },
    };
    let payload: Vec<usize> = match &rp.payload {
        Some(pl) => fields.list(pl, "payload")?,
        None => (0..fields.plans.len()).collect(),
    };
    let message_key = match &rp.key {
        Some(k) => message_key_sql(&fields.plans, &fields.list(k, "key")?),
        None => "NULL".to_string(),
    };
    let dk = delivery_key_sql(&fields.plans, ctx.key, ctx.partition_by);
    let obj = payload
        .iter()
        .map(|&i| {
            format!(
                "'{}', {}",
                fields.plans[i].name.as_str(),
                fields.plans[i].name
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let where_pass = &ctx.where_pass;
    // Lock order (case C36): rows stay in offset order (README: a relay sees one batch's ids in offset order).
    // That cannot deadlock: `landed` holds only keys this transaction claimed in the ledger (in key order, see
    // `sink::ledger::claim`), and the outbox's unique `delivery_key` is that same identity (generation, key
    // fields, partition-by day) — another batch inserting the same outbox key would first have waited on our
    // ledger claim. (Two pipelines with different ledgers sharing one outbox table are not covered.)
    let statement = format!(
        "INSERT INTO {table} (delivery_key, source_topic, source_partition, source_offset, message_key, payload) \
         SELECT {dk}, _topic, _partition, _offset, {message_key}, jsonb_build_object({obj}) \
         FROM landed{where_pass} ORDER BY _offset ON CONFLICT (delivery_key) DO NOTHING"
    );
    let setup = vec![format!(
        "CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, delivery_key text NOT NULL UNIQUE, \
         source_topic text NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL, \
         message_key text, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), \
         published_at timestamptz)"
    )];
    Ok(Compiled {
        name: table.name.as_str().to_string(),
        statement,
        setup,
        aggregate: None,
    })
}

/// Records `table`, `payload`, `key` and the message-key encoding (and marks payload and key fields read).
pub(crate) fn settings(s: &mut Settings<'_>) {
    let table = s.table(DEFAULT_OUTBOX_TABLE);
    s.put("table", table);
    let payload = match &s.rp.payload {
        Some(_) => Settings::list(&s.rp.payload),
        None => s
            .fields
            .iter()
            .map(|f| f.name.as_str().to_string())
            .collect(),
    };
    let key = Settings::list(&s.rp.key);
    s.put("payload", payload.join(", "));
    s.put("key", key.join(", "));
    s.put("message-key-encoding", "json-array-v1".into());
    s.used.extend(payload.iter().chain(&key).cloned());
}
