//! The partition checkpoint: its table, the take-over statement (fence bump), the compare-and-set that advances
//! it in every batch transaction, and the stale-generation check.

use tokio_postgres::{Statement, Transaction};

use crate::config::Pipeline;
use crate::model::apply_error::{classify, ApplyError};
use crate::model::batch::Batch;

/// `last_offset` of a checkpoint whose start was resolved and under which no record was applied yet.
pub const NOTHING_APPLIED: i64 = -1;

/// The fingerprint of a record stored beside a checkpoint: SHA-256 over the key and the value, each as a
/// presence byte, an 8-byte big-endian length and the bytes. 32 bytes.
pub fn fingerprint(key: Option<&[u8]>, value: Option<&[u8]>) -> Vec<u8> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for part in [key, value] {
        match part {
            None => h.update([0u8]),
            Some(b) => {
                h.update([1u8]);
                h.update((b.len() as u64).to_be_bytes());
                h.update(b);
            }
        }
    }
    h.finalize().to_vec()
}

/// Name of the checkpoint table (in the pipeline schema).
pub const CHECKPOINTS: &str = "replaysafe_checkpoints";

/// `CREATE TABLE` for the checkpoint table: `(consumer_group, topic, partition) → next_offset` (the next
/// offset to read, Kafka's convention), plus the fence epoch bumped by every new owner of the partition, and
/// the *fingerprint* of the last record applied (`last_offset`, `last_timestamp` in ms, `last_sha256` of its key
/// and value, the same digest as [`fingerprint`]): a new stream generation reads that record back to tell whether
/// the topic is the same one or was recreated. The `ALTER` adds the fingerprint to tables of earlier versions, only
/// when missing: its ACCESS EXCLUSIVE lock would otherwise wait for every open batch transaction (a frozen owner's
/// too) at each start.
///
/// The log the offsets belong to (case C46, C47): `topic_id` (KIP-516) and `cluster_id` as the broker answered
/// them when the partition was taken over (NULL in rows of earlier versions until their next take-over records
/// them), and `log`, the incarnation tag of the dead letters (`''` for the log a checkpoint began on;
/// `<cluster id>/<topic id>` once `offsets start` moved it onto another log): dead letters are unique per tag, so
/// the records of two incarnations at one offset are two rows. Added to older tables only when missing, as above.
/// The checkpoints `offsets start` replaced are kept in [`RETIRED`].
pub fn create_checkpoints(p: &Pipeline) -> String {
    let t = p.table(CHECKPOINTS);
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL, \
         generation text NOT NULL DEFAULT '', next_offset bigint, fence bigint NOT NULL DEFAULT 0, \
         updated_at timestamptz NOT NULL DEFAULT now(), last_offset bigint, last_timestamp bigint, last_sha256 bytea, \
         topic_id text, cluster_id text, log text NOT NULL DEFAULT '', \
         PRIMARY KEY (consumer_group, generation, topic, partition)); \
         DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{t}'::regclass \
         AND attname = 'last_sha256' AND NOT attisdropped) THEN \
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS last_offset bigint, ADD COLUMN IF NOT EXISTS last_timestamp bigint, \
         ADD COLUMN IF NOT EXISTS last_sha256 bytea; END IF; END $$; {}",
        upgrade_checkpoints(p)
    )
}

/// The migration of a checkpoint table of an earlier version (run by every `init`/`run` under the DDL lock):
/// `topic_id`, `cluster_id` and `log` added when missing — existing rows get no ids, recorded at their next
/// take-over ([`record_log_ids`]), never refused for lacking them —, and [`RETIRED`] created when missing (only
/// then: a runtime role without CREATE on the schema runs this at every start).
pub fn upgrade_checkpoints(p: &Pipeline) -> String {
    let t = p.table(CHECKPOINTS);
    let r = p.table(RETIRED);
    format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = '{t}'::regclass \
         AND attname = 'log' AND NOT attisdropped) THEN \
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS topic_id text, ADD COLUMN IF NOT EXISTS cluster_id text, \
         ADD COLUMN IF NOT EXISTS log text NOT NULL DEFAULT ''; END IF; \
         IF pg_catalog.to_regclass('{r}') IS NULL THEN \
         CREATE TABLE {r} (consumer_group text NOT NULL, generation text NOT NULL, topic text NOT NULL, \
         partition integer NOT NULL, next_offset bigint, topic_id text, cluster_id text, log text NOT NULL, \
         last_offset bigint, updated_at timestamptz NOT NULL, retired_at timestamptz NOT NULL DEFAULT now(), \
         retired_by text NOT NULL); END IF; END $$"
    )
}

/// Name of the table keeping the checkpoints `offsets start` replaced (in the pipeline schema), for audit:
/// `(consumer_group, generation, topic, partition, next_offset, topic_id, cluster_id, log, last_offset,
/// updated_at)` as they stood, `retired_at`, and `retired_by` (the start that replaced them, in words).
pub const RETIRED: &str = "replaysafe_checkpoints_retired";

/// Records the log ids of a checkpoint taken over by `fence` where they are missing (rows of earlier versions,
/// rows just created). Parameters: `$1` group, `$2` topic, `$3` partition, `$4` generation, `$5` fence,
/// `$6` topic id, `$7` cluster id. A stored id is never overwritten here (that is `offsets start`'s).
///
/// The incarnation tag `''` is the partition's first known log, shared by every group and generation (dead
/// letters are unique per generation, log and coordinates, not per group). A row without ids whose tag is `''`
/// gets the tag `<cluster id>/<topic id>` instead when another checkpoint of the partition (kept or retired)
/// tagged `''` recorded other ids: a fresh group or backfill on a re-created topic or another cluster would
/// otherwise file its dead letters under the old log's tag (and resolve the old log's by offset).
pub fn record_log_ids(p: &Pipeline) -> String {
    let (t, r) = (p.table(CHECKPOINTS), p.table(RETIRED));
    format!(
        "UPDATE {t} SET topic_id = coalesce(topic_id, $6), cluster_id = coalesce(cluster_id, $7), \
         log = CASE WHEN log = '' AND topic_id IS NULL AND cluster_id IS NULL AND EXISTS (SELECT 1 FROM \
         (SELECT topic, partition, topic_id, cluster_id, log FROM {t} UNION ALL \
         SELECT topic, partition, topic_id, cluster_id, log FROM {r}) o \
         WHERE o.topic = $2 AND o.partition = $3 AND o.log = '' \
         AND ((o.topic_id IS NOT NULL AND $6::text IS NOT NULL AND o.topic_id <> $6::text) \
         OR (o.cluster_id IS NOT NULL AND $7::text IS NOT NULL AND o.cluster_id <> $7::text))) \
         THEN coalesce($7::text, '') || '/' || coalesce($6::text, '') ELSE log END \
         WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND generation = $4 AND fence = $5 \
         AND (topic_id IS NULL OR cluster_id IS NULL)"
    )
}

/// Name of the table recording where a consumer group began on a topic (in the pipeline schema).
pub const GROUP_STARTS: &str = "replaysafe_group_starts";

/// `CREATE TABLE` for group starts: `(consumer_group, generation, topic) → partitions`, the topic's partition
/// count when the group (in that generation) first resolved a position from `start`. A partition numbered at or
/// above it was added later: it holds only records newer than the group and is read from its beginning.
pub fn create_group_starts(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (consumer_group text NOT NULL, generation text NOT NULL, topic text NOT NULL, \
         partitions integer NOT NULL, began_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (consumer_group, generation, topic))",
        p.table(GROUP_STARTS)
    )
}

/// Compare-and-set of a partition's checkpoint, guarded by the fence. Parameters: `$1` group, `$2` topic,
/// `$3` partition, `$4` fence, `$5` expected next_offset (null: no checkpoint yet), `$6` new next_offset,
/// `$7` generation, then the fingerprint of the batch's last record: `$8` offset, `$9` timestamp ms,
/// `$10` SHA-256 (nulls keep the stored fingerprint).
/// Affects one row when this owner still holds the partition and nobody moved the checkpoint; returns the
/// `last_offset` the row held before (the sub-select reads the statement's snapshot, not this update).
pub fn advance_checkpoint(p: &Pipeline) -> String {
    let t = p.table(CHECKPOINTS);
    format!(
        "UPDATE {t} SET next_offset = $6, updated_at = now(), last_offset = coalesce($8, last_offset), \
         last_timestamp = CASE WHEN $8::bigint IS NULL THEN last_timestamp ELSE $9 END, \
         last_sha256 = coalesce($10, last_sha256) WHERE consumer_group = $1 AND topic = $2 \
         AND partition = $3 AND fence = $4 AND next_offset IS NOT DISTINCT FROM $5 AND generation = $7 \
         RETURNING (SELECT o.last_offset FROM {t} o WHERE o.consumer_group = $1 AND o.topic = $2 \
         AND o.partition = $3 AND o.generation = $7)"
    )
}

/// Another generation's checkpoint of a partition that was written after this generation's and stands
/// elsewhere: this generation's checkpoint is stale. Parameters: `$1` group, `$2` topic, `$3` partition (int4),
/// `$4` this generation. Returns the other generation and its next offset (at most one row, the newest).
pub fn newer_generation(p: &Pipeline) -> String {
    let t = p.table(CHECKPOINTS);
    format!(
        "SELECT o.generation, o.next_offset FROM {t} o JOIN {t} m ON m.consumer_group = o.consumer_group \
         AND m.topic = o.topic AND m.partition = o.partition AND m.generation = $4 \
         WHERE o.consumer_group = $1 AND o.topic = $2 AND o.partition = $3 AND o.generation <> $4 \
         AND o.next_offset IS NOT NULL AND m.next_offset IS NOT NULL AND o.next_offset <> m.next_offset \
         AND o.updated_at > m.updated_at ORDER BY o.updated_at DESC LIMIT 1"
    )
}

/// Takes ownership of a partition: creates its checkpoint row if missing and bumps the fence, so that any
/// previous owner's in-flight batch fails its compare-and-set. Parameters: `$1` group, `$2` topic,
/// `$3` partition, `$4` generation ('' for none). Returns `(next_offset, fence, topic_id, cluster_id)`: the ids of
/// the log the checkpoint was written on (NULL: not recorded yet). Checkpoints are kept per stream generation: a
/// recreated topic under a new generation starts from its own positions.
pub fn acquire_checkpoint(p: &Pipeline) -> String {
    let t = p.table(CHECKPOINTS);
    format!(
        "INSERT INTO {t} AS c (consumer_group, generation, topic, partition, next_offset, fence) \
         VALUES ($1, $4, $2, $3, NULL, 1) ON CONFLICT (consumer_group, generation, topic, partition) \
         DO UPDATE SET fence = c.fence + 1, updated_at = now() RETURNING next_offset, fence, topic_id, cluster_id"
    )
}

/// Step 1 of the batch transaction: the checkpoint compare-and-set ([`advance_checkpoint`]) first — it locks the
/// partition's row, so a new owner's fence bump waits for this batch. Records the fingerprint of the batch's
/// last record (`last_sha`: its fingerprint, [`fingerprint`] of its key and value). Returns whether the
/// batch continues what this group applied of the partition: the checkpoint's last applied offset before it was
/// a record (not [`NOTHING_APPLIED`], not unknown) below the batch's start — false for a start
/// just resolved (a fresh group) and for a checkpoint moved back (a reset).
///
/// # Errors
/// [`ApplyError::Fenced`] (with the checkpoint and fence now stored) when another owner took the partition or
/// moved the checkpoint; otherwise as [`classify`].
pub(super) async fn advance(
    tx: &Transaction<'_>,
    stmt: &Statement,
    p: &Pipeline,
    group: &str,
    generation: &str,
    batch: &Batch,
    last_sha: Option<Vec<u8>>,
) -> Result<bool, ApplyError> {
    let (last_offset, last_ts) = match batch.items.last() {
        Some(it) => (Some(it.offset), it.timestamp_ms),
        None => (None, None),
    };
    let moved = tx
        .query_opt(
            stmt,
            &[
                &group,
                &batch.topic,
                &batch.partition,
                &batch.fence,
                &batch.expected,
                &batch.end,
                &generation,
                &last_offset,
                &last_ts,
                &last_sha,
            ],
        )
        .await
        .map_err(|e| classify(e, false))?;
    let Some(moved) = moved else {
        let row = tx
            .query_opt(
                &format!(
                    "SELECT next_offset, fence FROM {} WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND generation = $4",
                    p.table(CHECKPOINTS)
                ),
                &[&group, &batch.topic, &batch.partition, &generation],
            )
            .await
            .map_err(|e| classify(e, false))?;
        let (next_offset, fence) = row.map(|r| (r.get(0), r.get(1))).unwrap_or((None, 0));
        return Err(ApplyError::Fenced { next_offset, fence });
    };
    let prev: Option<i64> = moved.get(0);
    Ok(matches!((prev, batch.expected), (Some(last), Some(next)) if last >= 0 && last < next))
}

/// Step 1 of a source transaction's part ([`super::Sink::apply_transaction`]): the partition's checkpoint row,
/// share-locked (a new owner's fence bump, an `UPDATE`, waits for this transaction), must still carry the part's
/// fence and stand at or before the part's first record — the same ownership test as [`advance`]'s
/// compare-and-set, without moving the checkpoint (the partition's next batch steps over the records).
///
/// # Errors
/// [`ApplyError::Fenced`] (with the checkpoint and fence stored) when another owner took the partition or the
/// checkpoint passed the part's records; otherwise as [`classify`].
pub(super) async fn hold(
    tx: &Transaction<'_>,
    p: &Pipeline,
    group: &str,
    generation: &str,
    batch: &Batch,
) -> Result<(), ApplyError> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT next_offset, fence FROM {} WHERE consumer_group = $1 AND topic = $2 AND partition = $3 \
                 AND generation = $4 FOR SHARE",
                p.table(CHECKPOINTS)
            ),
            &[&group, &batch.topic, &batch.partition, &generation],
        )
        .await
        .map_err(|e| classify(e, false))?;
    let (next_offset, fence): (Option<i64>, i64) =
        row.map(|r| (r.get(0), r.get(1))).unwrap_or((None, 0));
    let first = batch.items.first().map_or(batch.end, |i| i.offset);
    if fence == batch.fence && next_offset.is_none_or(|n| n <= first) {
        return Ok(());
    }
    Err(ApplyError::Fenced { next_offset, fence })
}
