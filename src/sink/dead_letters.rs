//! Dead letters: one row per quarantined record, written in the batch transaction (then the `[errors]` tolerance
//! check over them, [`tolerance_statement`]); resolved when a later batch lands the record, or settled by
//! `replaysafe dead-letters replay` (`ops/dead_letters.rs`).

use sha2::{Digest, Sha256};
use tokio_postgres::{Statement, Transaction};

use crate::config::Pipeline;
use crate::decode::Rejection;
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::{Batch, Item, Pending};

/// Name of the dead-letter table (in the pipeline schema).
pub const DEAD_LETTERS: &str = "replaysafe_dead_letters";

/// `CREATE TABLE` for dead letters: one row per quarantined record, unique by generation, the log's incarnation
/// tag (`log`, the checkpoint's: `''` until `offsets start` moved the partition onto another topic id or
/// cluster, case C46/C47) and coordinates.
pub fn create_dead_letters(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, generation text NOT NULL DEFAULT '', \
         log text NOT NULL DEFAULT '', \
         topic text NOT NULL, partition integer NOT NULL, \"offset\" bigint NOT NULL, record_timestamp timestamptz, \
         key bytea, value bytea, value_bytes integer, value_sha256 bytea, reason text NOT NULL, detail text NOT NULL, \
         consumer_group text NOT NULL, quarantined_at timestamptz NOT NULL DEFAULT now(), \
         resolved_at timestamptz, resolved_by text, UNIQUE (generation, log, topic, partition, \"offset\"))",
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

/// Adds the incarnation tag `log` (`''` for every existing row) to a dead-letter table created before it, and
/// moves its unique key to `(generation, log, topic, partition, offset)`, only when the column is missing (the
/// ALTER's ACCESS EXCLUSIVE lock; the new unique index is built once).
pub fn upgrade_dead_letters_log(p: &Pipeline) -> String {
    let t = p.table(DEAD_LETTERS);
    format!(
        "DO $$ DECLARE c text; BEGIN IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = '{t}'::regclass \
         AND attname = 'log' AND NOT attisdropped) THEN \
         ALTER TABLE {t} ADD COLUMN log text NOT NULL DEFAULT ''; \
         FOR c IN SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid = '{t}'::regclass AND contype = 'u' LOOP \
         EXECUTE pg_catalog.format('ALTER TABLE {t} DROP CONSTRAINT %I', c); END LOOP; \
         ALTER TABLE {t} ADD UNIQUE (generation, log, topic, partition, \"offset\"); END IF; END $$"
    )
}

/// The incarnation tag of the partition's checkpoint (`$1` generation, `$2` topic, `$3` partition, `$4` group),
/// as a scalar sub-select of the batch statements.
fn log_of_checkpoint(p: &Pipeline, group: &str) -> String {
    format!(
        "coalesce((SELECT c.log FROM {} c WHERE c.consumer_group = {group} AND c.generation = $1 AND c.topic = $2 \
         AND c.partition = $3), '')",
        p.table(super::checkpoint::CHECKPOINTS)
    )
}

/// Marks the dead letters of records this batch landed as resolved: `resolved_at = now()`, `resolved_by` = the
/// delivery key that applied them (as the outbox's `delivery_key` spells it). Parameters: `$1` generation,
/// `$2` topic, `$3` partition, `$4` and `$5` the batch's first and last offset, `$6` the consumer group (whose
/// checkpoint's incarnation tag `log` the dead letters must carry). Run in the batch transaction
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
         AND d.\"offset\" = l._offset AND d.resolved_at IS NULL AND d.log = {log}",
        p.table(DEAD_LETTERS),
        log = log_of_checkpoint(p, "$6")
    )
}

/// Dead-letter insert. Parameters: `$1` generation, `$2` topic, `$3` partition, `$4` consumer group, `$5`
/// offsets (int8[]), `$6` timestamps ms (int8[]), `$7` keys (bytea[]), `$8` values (bytea[]), `$9` value sizes
/// (int4[]), `$10` value SHA-256 (bytea[]), `$11` reasons (text[]), `$12` details (text[]). The incarnation tag
/// `log` is the group's checkpoint's (case C46/C47: two logs' records at one offset are two rows).
///
/// Rows are inserted in offset order (`ORDER BY u.o`), the unique key's order within one partition: two
/// consumer groups quarantining the same records take those keys in one order (case C36).
pub fn insert_dead_letters(p: &Pipeline) -> String {
    format!(
        "INSERT INTO {} (generation, log, topic, partition, \"offset\", record_timestamp, key, value, value_bytes, \
         value_sha256, reason, detail, consumer_group) \
         SELECT $1, {log}, $2, $3, u.o, CASE WHEN u.ts IS NULL THEN NULL ELSE to_timestamp(u.ts / 1000.0) END, u.k, u.v, u.n, \
         u.h, u.r, u.d, $4 FROM unnest($5::bigint[], $6::bigint[], $7::bytea[], $8::bytea[], $9::int[], $10::bytea[], \
         $11::text[], $12::text[]) AS u(o, ts, k, v, n, h, r, d) ORDER BY u.o \
         ON CONFLICT (generation, log, topic, partition, \"offset\") DO NOTHING",
        p.table(DEAD_LETTERS),
        log = log_of_checkpoint(p, "$4")
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
    group: &str,
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
            &group,
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

/// The tolerance check ([`crate::config::ErrorsPlan`]), run in the batch transaction after the dead-letter
/// insert when the batch quarantined records and `[errors] tolerance = "none"`. Over the partition's unresolved
/// dead letters of this generation (those of earlier batches and processes included: the database holds the
/// history, so the decision depends on the records only — not on batch boundaries, restarts or which process
/// reads them), for each reason, each dead letter counts the dead letters of its reason in the
/// `max-consecutive` offsets and in the `window` offsets ending at it (`RANGE … PRECEDING` window frames). The
/// first of this batch's quarantined offsets that ends a full run or a window above the limit is returned:
/// `offset, reason, detail, run, win`. Parameters: `$1` generation, `$2` topic, `$3` partition, `$4` and `$5`
/// the batch's first and last offset, `$6` the offsets this batch quarantined (int8[]).
pub fn tolerance_statement(p: &Pipeline) -> String {
    let e = &p.errors;
    let (run, win) = (e.max_consecutive, e.window);
    format!(
        "WITH d AS (SELECT \"offset\" AS o, reason, detail, \
         count(*) OVER (PARTITION BY reason ORDER BY \"offset\" RANGE BETWEEN {rp} PRECEDING AND CURRENT ROW) AS run, \
         count(*) OVER (PARTITION BY reason ORDER BY \"offset\" RANGE BETWEEN {wp} PRECEDING AND CURRENT ROW) AS win \
         FROM {t} WHERE generation = $1 AND topic = $2 AND partition = $3 AND resolved_at IS NULL \
         AND \"offset\" BETWEEN $4::bigint - {back} AND $5::bigint) \
         SELECT o, reason, detail, run, win FROM d WHERE o = ANY($6::bigint[]) AND (run >= {run} OR win > {limit}) \
         ORDER BY o LIMIT 1",
        rp = run - 1,
        wp = win - 1,
        back = run.max(win) - 1,
        limit = e.window_limit(),
        t = p.table(DEAD_LETTERS)
    )
}

/// Step 4b of the batch transaction: [`tolerance_statement`] over this batch's quarantined offsets. Nothing is
/// checked when the batch quarantined nothing.
///
/// # Errors
/// [`ApplyError::Fatal`] with [`crate::error::Error::Tolerance`] — the transaction is then rolled back, nothing
/// of the batch committed — naming the partition, the offsets, the reason and its detail (the field and its
/// JSON pointer for `missing-field` / `invalid-field`), the threshold crossed and what to do; otherwise as
/// [`classify`].
pub(super) async fn check_tolerance(
    tx: &Transaction<'_>,
    stmt: &Statement,
    p: &Pipeline,
    generation: &str,
    batch: &Batch,
) -> Result<(), ApplyError> {
    let offsets: Vec<i64> = batch
        .items
        .iter()
        .filter(|i| matches!(i.pending, Pending::Quarantine(_)))
        .map(|i| i.offset)
        .collect();
    let (Some(first), Some(last)) = (batch.items.first(), batch.items.last()) else {
        return Ok(());
    };
    if offsets.is_empty() {
        return Ok(());
    }
    let row = tx
        .query_opt(
            stmt,
            &[
                &generation,
                &batch.topic,
                &batch.partition,
                &first.offset,
                &last.offset,
                &offsets,
            ],
        )
        .await
        .map_err(|e| classify(e, false))?;
    let Some(row) = row else {
        return Ok(());
    };
    let (at, reason, detail, run, win): (i64, String, String, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    Err(ApplyError::Fatal(crate::error::Error::Tolerance(
        tolerance_message(p, batch, at, &reason, &detail, run, win),
    )))
}

fn tolerance_message(
    p: &Pipeline,
    batch: &Batch,
    at: i64,
    reason: &str,
    detail: &str,
    run: i64,
    win: i64,
) -> String {
    let e = &p.errors;
    let crossed = if run >= i64::from(e.max_consecutive) {
        format!(
            "offsets {}–{at}: {run} consecutive offsets quarantined as `{reason}` (errors.max-consecutive = {})",
            at + 1 - run,
            e.max_consecutive
        )
    } else {
        format!(
            "offsets {}–{at}: {win} of {} offsets quarantined as `{reason}`, more than errors.max-percent = {} %",
            (at + 1 - i64::from(e.window)).max(0),
            e.window,
            e.max_percent
        )
    };
    let checkpoint = match batch.expected {
        Some(n) => format!("stays at offset {n}"),
        None => "was not written".to_string(),
    };
    format!(
        "{topic}/{partition} {crossed}; the last one: {detail}. Stopped by [errors] tolerance = \"none\": nothing \
         of the batch {topic}/{partition} offsets {first}–{last} was committed (no ledger claim, projection row or \
         dead letter) and its checkpoint {checkpoint}. Fix the pipeline file (a misspelled [fields] path?) and \
         rerun: the same records are read again. To quarantine them and go on instead, set [errors] tolerance = \
         \"all\" (then `replaysafe dead-letters replay` re-applies them after a fix)",
        topic = batch.topic,
        partition = batch.partition,
        first = batch.items.first().map_or(0, |i| i.offset),
        last = batch.items.last().map_or(0, |i| i.offset),
    )
}

/// Settles, in the transaction of a dead-letter replay batch (`replaysafe dead-letters replay`), the dead
/// letters of its records that are not `landed` (those that landed were resolved by [`resolve_statement`] with
/// their delivery key): a duplicate, stale or filtered record is resolved with `resolved_by` saying so
/// (`replay: duplicate`, `replay: stale`, `replay: conflict`, `replay: filtered by <rule>`); a record
/// quarantined again stays unresolved with its new `reason` and `detail`. A stale record reached the other
/// projections (docs/reference.md "Accounting"), so [`resolve_statement`] resolved it in this transaction already: its
/// `resolved_by` is replaced here (`resolved_at = now()`, the transaction's start, marks this transaction's).
///
/// A stale record whose values a row projection's stored (newer) row lacks ([`crate::projection::row::superseded::columns`]: the row
/// projection replaces whole rows, so the older event's columns can no longer be applied) is not resolved: it
/// stays unresolved with reason [`SUPERSEDED`] and a detail naming the columns not applied (case C50). A second
/// replay finds its ledger claim (a `duplicate`) and leaves it so: it is never resolved while its data is missing.
///
/// # Errors
/// As [`classify`].
pub(super) async fn settle_replayed(
    tx: &Transaction<'_>,
    p: &Pipeline,
    generation: &str,
    batch: &Batch,
    outcomes: &[crate::model::batch::Outcome],
) -> Result<(), ApplyError> {
    use crate::model::batch::Outcome;
    let stale: Vec<i64> = batch
        .items
        .iter()
        .zip(outcomes)
        .filter(|(_, o)| matches!(o, Outcome::Stale { conflict: false }))
        .map(|(i, _)| i.offset)
        .collect();
    let missing = crate::projection::row::superseded::columns(tx, p, batch, &stale).await?;
    let mut offsets = Vec::new();
    let mut by: Vec<Option<String>> = Vec::new();
    let mut reasons: Vec<Option<&str>> = Vec::new();
    let mut details: Vec<Option<String>> = Vec::new();
    for (item, o) in batch.items.iter().zip(outcomes) {
        let (b, r, d) = match (o, &item.pending) {
            (Outcome::Landed, _) => continue,
            (Outcome::Duplicate, _) => (Some("replay: duplicate".to_string()), None, None),
            (Outcome::Stale { conflict: false }, _) => match missing.get(&item.offset) {
                Some(cols) => (
                    None,
                    Some(SUPERSEDED),
                    Some(format!(
                        "superseded: {} not applied (a newer version of the row is stored without them; the row \
                         projection writes whole rows, so this older event cannot fill them)",
                        cols.join(", ")
                    )),
                ),
                None => (Some("replay: stale".into()), None, None),
            },
            (Outcome::Stale { conflict: true }, _) => (Some("replay: conflict".into()), None, None),
            (Outcome::Filtered(rule), _) => {
                (Some(format!("replay: filtered by {rule}")), None, None)
            }
            (Outcome::Quarantined(reason), Pending::Quarantine(r)) => (
                None,
                Some(reason.as_str()),
                Some(storable_detail(&r.detail)),
            ),
            (Outcome::Quarantined(reason), _) => (None, Some(reason.as_str()), None),
        };
        offsets.push(item.offset);
        by.push(b);
        reasons.push(r);
        details.push(d);
    }
    if offsets.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "UPDATE {} d SET resolved_at = CASE WHEN u.by IS NULL OR {kept} THEN NULL ELSE now() END, \
         resolved_by = CASE WHEN {kept} THEN NULL ELSE u.by END, \
         reason = coalesce(u.r, d.reason), detail = coalesce(u.d, d.detail) \
         FROM unnest($4::bigint[], $5::text[], $6::text[], $7::text[]) AS u(o, by, r, d) \
         WHERE d.generation = $1 AND d.topic = $2 AND d.partition = $3 AND d.\"offset\" = u.o \
         AND (d.resolved_at IS NULL OR d.resolved_at = now())",
        p.table(DEAD_LETTERS),
        // A superseded dead letter replayed again is a ledger duplicate: its data is still missing.
        kept = format!("(u.by = 'replay: duplicate' AND d.reason = '{SUPERSEDED}')"),
    );
    tx.execute(
        &sql,
        &[
            &generation,
            &batch.topic,
            &batch.partition,
            &offsets,
            &by,
            &reasons,
            &details,
        ],
    )
    .await
    .map_err(|e| classify(e, false))?;
    Ok(())
}

/// The `reason` of a replayed dead letter that a row projection judged stale while its stored, newer row lacks
/// columns the dead letter carries ([`settle_replayed`]); not a quarantine reason (the record is claimed).
pub const SUPERSEDED: &str = "superseded";
