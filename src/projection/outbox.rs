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
            name: Ident::new(DEFAULT_OUTBOX_TABLE)
                .expect("a built-in name is a valid SQL identifier"),
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
    // Lock order (case C36): rows stay in offset order (docs/reference.md "Outbox relay": a relay sees one batch's
    // ids in offset order). That cannot deadlock: `landed` holds only keys this transaction claimed in the ledger
    // (in key order, see `sink::ledger::claim`), and the outbox's unique `delivery_key` is that same identity
    // (generation, key fields, partition-by day) — another batch inserting the same outbox key would first have
    // waited on our ledger claim. (Two pipelines with different ledgers sharing one outbox table are not covered.)
    let statement = format!(
        "INSERT INTO {table} (delivery_key, source_topic, source_partition, source_offset, message_key, payload) \
         SELECT {dk}, _topic, _partition, _offset, {message_key}, jsonb_build_object({obj}) \
         FROM landed{where_pass} ORDER BY _offset ON CONFLICT (delivery_key) DO NOTHING"
    );
    let setup = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, delivery_key text NOT NULL UNIQUE, \
             source_topic text NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL, \
             message_key text, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), \
             published_at timestamptz)"
        ),
        upgrade(&table),
    ];
    Ok(Compiled {
        name: table.name.as_str().to_string(),
        statement,
        setup,
        aggregate: None,
        reads_record: false,
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

/// The relay's column and indexes on an existing outbox table, added only when missing (a `DO` block: `ALTER
/// TABLE … IF NOT EXISTS` and `CREATE INDEX IF NOT EXISTS` would take their table locks first, waiting behind a
/// relay's round on every start): `published_at timestamptz` (NULL = not yet published), a partial index on
/// `id` of the unpublished rows (the relay's scan in outbox order) and one on `(message_key, id)` of them (each
/// key's oldest unpublished row).
fn upgrade(table: &QualifiedName) -> String {
    let lit = table.to_string().replace('\'', "''");
    let (ids, keys) = (
        index_name(table, "_unpublished"),
        index_name(table, "_unpublished_key"),
    );
    let schema = &table.schema;
    format!(
        "DO $$ BEGIN \
         IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{lit}'::regclass AND attname = 'published_at' \
         AND NOT attisdropped) THEN ALTER TABLE {table} ADD COLUMN IF NOT EXISTS published_at timestamptz; END IF; \
         IF to_regclass('{schema}.\"{ids}\"') IS NULL THEN \
         CREATE INDEX IF NOT EXISTS \"{ids}\" ON {table} (id) WHERE published_at IS NULL; END IF; \
         IF to_regclass('{schema}.\"{keys}\"') IS NULL THEN \
         CREATE INDEX IF NOT EXISTS \"{keys}\" ON {table} (message_key, id) WHERE published_at IS NULL; END IF; \
         END $$"
    )
}

/// `<table><suffix>`, the table's name shortened so that the whole fits PostgreSQL's 63 bytes (names are ASCII).
/// An index name of `table`: its name (cut to fit PostgreSQL's 63 bytes) and `suffix`.
pub(crate) fn index_name(table: &QualifiedName, suffix: &str) -> String {
    let name = table.name.as_str();
    format!("{}{suffix}", &name[..name.len().min(63 - suffix.len())])
}

/// The outbox tables of a pipeline: per `kind = "outbox"` projection, its name and table, in file order.
pub fn tables(p: &crate::config::Pipeline) -> Vec<(String, QualifiedName)> {
    p.projections
        .iter()
        .filter(|x| x.kind == super::ProjectionKind::Outbox)
        .filter_map(|x| {
            let t = x.settings.get("table")?;
            let (schema, name) = t.split_once('.')?;
            let q = QualifiedName {
                schema: Ident::new(schema).ok()?,
                name: Ident::new(name).ok()?,
            };
            Some((x.name.clone(), q))
        })
        .collect()
}

/// Deletes (or with `dry_run` only counts) the published rows of every outbox table of the pipeline whose
/// `published_at` is older than `[outbox] keep-days` days before the database's `now()`; unpublished rows are never
/// touched, whatever their age. For `replaysafe ledger prune` (docs/reference.md "Outbox relay"). Returns the count
/// per table (qualified name), in file order; a table that does not exist counts 0.
///
/// # Errors
/// [`crate::Error::Postgres`] (e.g. `statement_timeout`, or a table without `published_at`: run `init`).
pub async fn purge_published(
    client: &impl tokio_postgres::GenericClient,
    p: &crate::config::Pipeline,
    dry_run: bool,
) -> Result<Vec<(String, u64)>> {
    let days = i32::try_from(p.outbox.keep_days).unwrap_or(i32::MAX);
    let mut out = Vec::new();
    for (_, table) in tables(p) {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table.to_string()])
            .await?
            .get(0);
        let n = if !exists {
            0
        } else if dry_run {
            let sql = format!(
                "SELECT count(*) FROM {table} WHERE published_at < now() - make_interval(days => $1)"
            );
            crate::units::count(client.query_one(&sql, &[&days]).await?.get::<_, i64>(0))
        } else {
            let sql = format!(
                "DELETE FROM {table} WHERE published_at < now() - make_interval(days => $1)"
            );
            client.execute(&sql, &[&days]).await?
        };
        out.push((table.to_string(), n));
    }
    Ok(out)
}
