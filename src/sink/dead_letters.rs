//! Dead letters: one row per quarantined record, written in the batch transaction; resolved when a later batch
//! lands the record.

use sha2::{Digest, Sha256};
use tokio_postgres::{Statement, Transaction};

use super::batch::{Batch, Item, Pending};
use super::error::{classify, ApplyError};
use crate::config::Pipeline;
use crate::decode::Rejection;

/// Name of the dead-letter table (in the pipeline schema).
pub const DEAD_LETTERS: &str = "replaysafe_dead_letters";

/// `CREATE TABLE` for dead letters: one row per quarantined record, unique by generation and coordinates.
pub fn create_dead_letters(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, generation text NOT NULL DEFAULT '', \
         topic text NOT NULL, partition integer NOT NULL, \"offset\" bigint NOT NULL, record_timestamp timestamptz, \
         key bytea, value bytea, value_bytes integer, value_sha256 bytea, reason text NOT NULL, detail text NOT NULL, \
         consumer_group text NOT NULL, quarantined_at timestamptz NOT NULL DEFAULT now(), \
         resolved_at timestamptz, resolved_by text, UNIQUE (generation, topic, partition, \"offset\"))",
        p.table(DEAD_LETTERS)
    )
}

/// Adds `resolved_at` / `resolved_by` to a dead-letter table created before they existed.
pub fn upgrade_dead_letters(p: &Pipeline) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS resolved_at timestamptz, ADD COLUMN IF NOT EXISTS resolved_by text",
        p.table(DEAD_LETTERS)
    )
}

/// Marks the dead letters of records this batch landed as resolved: `resolved_at = now()`, `resolved_by` = the
/// delivery key that applied them (as the outbox's `delivery_key` spells it). Parameters: `$1` generation,
/// `$2` topic, `$3` partition, `$4` and `$5` the batch's first and last offset. Run in the batch transaction
/// after the projections, only when something landed; the offset range keeps it to one index range scan of
/// the dead letters' unique key.
pub fn resolve_statement(p: &Pipeline) -> String {
    let dk = crate::config::fields::delivery_key_sql(
        &p.fields,
        &p.identity.key,
        p.identity.partition_by,
    );
    format!(
        "UPDATE {} d SET resolved_at = now(), resolved_by = l.dk \
         FROM (SELECT _offset, {dk} AS dk FROM pg_temp.landed) l \
         WHERE d.generation = $1 AND d.topic = $2 AND d.partition = $3 AND d.\"offset\" BETWEEN $4 AND $5 \
         AND d.\"offset\" = l._offset AND d.resolved_at IS NULL",
        p.table(DEAD_LETTERS)
    )
}

/// Dead-letter insert. Parameters: `$1` generation, `$2` topic, `$3` partition, `$4` consumer group, `$5`
/// offsets (int8[]), `$6` timestamps ms (int8[]), `$7` keys (bytea[]), `$8` values (bytea[]), `$9` value sizes
/// (int4[]), `$10` value SHA-256 (bytea[]), `$11` reasons (text[]), `$12` details (text[]).
///
/// Rows are inserted in offset order (`ORDER BY u.o`), the unique key's order within one partition: two
/// consumer groups quarantining the same records take those keys in one order (case C36).
pub fn insert_dead_letters(p: &Pipeline) -> String {
    format!(
        "INSERT INTO {} (generation, topic, partition, \"offset\", record_timestamp, key, value, value_bytes, \
         value_sha256, reason, detail, consumer_group) \
         SELECT $1, $2, $3, u.o, CASE WHEN u.ts IS NULL THEN NULL ELSE to_timestamp(u.ts / 1000.0) END, u.k, u.v, u.n, \
         u.h, u.r, u.d, $4 FROM unnest($5::bigint[], $6::bigint[], $7::bytea[], $8::bytea[], $9::int[], $10::bytea[], \
         $11::text[], $12::text[]) AS u(o, ts, k, v, n, h, r, d) ORDER BY u.o \
         ON CONFLICT (generation, topic, partition, \"offset\") DO NOTHING",
        p.table(DEAD_LETTERS)
    )
}

/// Longest dead-letter `detail` stored, in characters (the raw value is in the `value` column).
pub const MAX_DETAIL_CHARS: usize = 2000;

/// A detail PostgreSQL `text` can store: NUL characters escaped (they come from record values quoted in
/// messages), cut to [`MAX_DETAIL_CHARS`].
pub fn storable_detail(detail: &str) -> String {
    let mut s: String = detail
        .chars()
        .take(MAX_DETAIL_CHARS)
        .collect::<String>()
        .replace('\0', "\\u0000");
    if detail.chars().count() > MAX_DETAIL_CHARS {
        s.push('…');
    }
    s
}

/// Marks the dead letters of the records a batch landed as resolved, by the delivery key that applied them
/// ([`resolve_statement`]).
pub(super) async fn resolve_landed(
    tx: &tokio_postgres::Transaction<'_>,
    stmt: &Statement,
    batch: &Batch,
    generation: &str,
) -> std::result::Result<(), ApplyError> {
    let (Some(first), Some(last)) = (batch.items.first(), batch.items.last()) else {
        return Ok(());
    };
    tx.execute(
        stmt,
        &[
            &generation,
            &batch.topic,
            &batch.partition,
            &first.offset,
            &last.offset,
        ],
    )
    .await
    .map_err(|e| classify(e, false))?;
    Ok(())
}

/// Step 4 of the batch transaction: one dead-letter row per quarantined item ([`insert_dead_letters`]). Values
/// above `batch.max-record-bytes` keep only their size and SHA-256.
///
/// # Errors
/// As [`classify`].
pub(super) async fn insert(
    tx: &Transaction<'_>,
    stmt: &Statement,
    p: &Pipeline,
    group: &str,
    generation: &str,
    batch: &Batch,
) -> Result<(), ApplyError> {
    let dead: Vec<(&Item, &Rejection)> = batch
        .items
        .iter()
        .filter_map(|i| match &i.pending {
            Pending::Quarantine(r) => Some((i, r)),
            _ => None,
        })
        .collect();
    if !dead.is_empty() {
        let max = p.max_record_bytes;
        let offsets: Vec<i64> = dead.iter().map(|(i, _)| i.offset).collect();
        let ts: Vec<Option<i64>> = dead.iter().map(|(i, _)| i.timestamp_ms).collect();
        let keys: Vec<Option<&[u8]>> = dead.iter().map(|(i, _)| i.key.as_deref()).collect();
        // Values above max-record-bytes keep only their size and SHA-256.
        let values: Vec<Option<&[u8]>> = dead
            .iter()
            .map(|(i, _)| i.value.as_deref().filter(|v| v.len() <= max))
            .collect();
        let sizes: Vec<Option<i32>> = dead
            .iter()
            .map(|(i, _)| {
                i.value
                    .as_ref()
                    .map(|v| i32::try_from(v.len()).unwrap_or(i32::MAX))
            })
            .collect();
        let hashes: Vec<Option<Vec<u8>>> = dead
            .iter()
            .map(|(i, _)| i.value.as_ref().map(|v| Sha256::digest(v).to_vec()))
            .collect();
        let reasons: Vec<&str> = dead.iter().map(|(_, r)| r.reason.as_str()).collect();
        let details: Vec<String> = dead
            .iter()
            .map(|(_, r)| storable_detail(&r.detail))
            .collect();
        tx.execute(
            stmt,
            &[
                &generation,
                &batch.topic,
                &batch.partition,
                &group,
                &offsets,
                &ts,
                &keys,
                &values,
                &sizes,
                &hashes,
                &reasons,
                &details,
            ],
        )
        .await
        .map_err(|e| classify(e, false))?;
    }
    Ok(())
}
