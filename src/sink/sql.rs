//! SQL text for the statements replaysafe owns, built from the validated plan. Every identifier is an
//! [`Ident`](crate::ident::Ident) (validated, quoted); every value is a bound parameter.

use crate::config::Pipeline;

/// Name of the checkpoint table (in the pipeline schema).
pub const CHECKPOINTS: &str = "replaysafe_checkpoints";
/// Name of the dead-letter table (in the pipeline schema).
pub const DEAD_LETTERS: &str = "replaysafe_dead_letters";
/// Name of the horizon table (in the pipeline schema): the durable pruned-below day of each ledger.
pub const HORIZON: &str = "replaysafe_horizon";

/// Ledger columns other than the fixed bookkeeping ones: `(column, type)` for the key fields, the
/// partition-by field and `ledger.columns`, in that order without repeats.
pub fn ledger_field_columns(p: &Pipeline) -> Vec<usize> {
    let mut cols: Vec<usize> = p.identity.key.clone();
    if let Some(pb) = p.identity.partition_by {
        if !cols.contains(&pb) {
            cols.push(pb);
        }
    }
    for &c in &p.ledger.columns {
        if !cols.contains(&c) {
            cols.push(c);
        }
    }
    cols
}

/// The ledger primary key columns: generation, key fields, partition-by field.
pub fn ledger_pk(p: &Pipeline) -> Vec<String> {
    let mut pk = vec!["generation".to_string()];
    let mut idx = p.identity.key.clone();
    if let Some(pb) = p.identity.partition_by {
        if !idx.contains(&pb) {
            idx.push(pb);
        }
    }
    pk.extend(idx.iter().map(|&i| p.fields[i].name.to_string()));
    pk
}

/// `CREATE TABLE` for the ledger (range-partitioned by day when `partition-by` is set).
pub fn create_ledger(p: &Pipeline) -> String {
    let mut defs = vec!["generation text NOT NULL DEFAULT ''".to_string()];
    let key_like: Vec<usize> = {
        let mut k = p.identity.key.clone();
        k.extend(p.identity.partition_by);
        k
    };
    for i in ledger_field_columns(p) {
        let f = &p.fields[i];
        let null = if key_like.contains(&i) {
            " NOT NULL"
        } else {
            ""
        };
        defs.push(format!("{} {}{null}", f.name, f.ty.sql()));
    }
    defs.extend([
        "topic text NOT NULL".to_string(),
        "partition integer NOT NULL".to_string(),
        "\"offset\" bigint NOT NULL".to_string(),
        "consumer_group text NOT NULL".to_string(),
        "landed_at timestamptz NOT NULL DEFAULT now()".to_string(),
    ]);
    defs.push(format!("PRIMARY KEY ({})", ledger_pk(p).join(", ")));
    let partition = match p.identity.partition_by {
        Some(i) => format!(" PARTITION BY RANGE ({})", p.fields[i].name),
        None => String::new(),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({}){partition}",
        p.ledger.table,
        defs.join(", ")
    )
}

/// `CREATE TABLE` for the checkpoint table: `(consumer_group, topic, partition) → next_offset` (the next
/// offset to read, Kafka's convention), plus the fence epoch bumped by every new owner of the partition, and
/// the *fingerprint* of the last record applied (`last_offset`, `last_timestamp` in ms, `last_sha256` of its key
/// and value, the same digest as `start::fingerprint`): a new stream generation reads that record back to tell whether
/// the topic is the same one or was recreated. The `ALTER` adds the fingerprint to tables of earlier versions.
pub fn create_checkpoints(p: &Pipeline) -> String {
    let t = p.table(CHECKPOINTS);
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL, \
         generation text NOT NULL DEFAULT '', next_offset bigint, fence bigint NOT NULL DEFAULT 0, \
         updated_at timestamptz NOT NULL DEFAULT now(), last_offset bigint, last_timestamp bigint, last_sha256 bytea, \
         PRIMARY KEY (consumer_group, generation, topic, partition)); \
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS last_offset bigint, ADD COLUMN IF NOT EXISTS last_timestamp bigint, \
         ADD COLUMN IF NOT EXISTS last_sha256 bytea"
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
pub fn resolve_dead_letters(p: &Pipeline) -> String {
    let dk =
        crate::config::plan::delivery_key_sql(&p.fields, &p.identity.key, p.identity.partition_by);
    format!(
        "UPDATE {} d SET resolved_at = now(), resolved_by = l.dk \
         FROM (SELECT _offset, {dk} AS dk FROM pg_temp.landed) l \
         WHERE d.generation = $1 AND d.topic = $2 AND d.partition = $3 AND d.\"offset\" BETWEEN $4 AND $5 \
         AND d.\"offset\" = l._offset AND d.resolved_at IS NULL",
        p.table(DEAD_LETTERS)
    )
}

/// `CREATE TABLE` for the horizon table: one row per ledger table (`ledger`, its schema-qualified name as
/// written in SQL), holding `pruned_below`: no delivery key of an event day before it is remembered any more
/// (those day partitions were dropped, or are to be dropped by the next prune). Claims of such days are
/// quarantined as `beyond-horizon` and their partitions are never re-created. `NULL`: nothing pruned yet. It
/// only moves forward, raised by the prune in the transaction that drops the partitions.
pub fn create_horizon(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (ledger text PRIMARY KEY, pruned_below date, \
         updated_at timestamptz NOT NULL DEFAULT now())",
        p.table(HORIZON)
    )
}

/// The ledger's claim horizon, read under a share lock on its horizon row (the prune updates that row, so a
/// claim and a prune serialize). Parameters: `$1` the ledger table (as in [`create_horizon`]), `$2` the
/// pipeline's `horizon-days` (int4, null for none). Returns one row: the oldest claimable day (the later of
/// `pruned_below` and the database's UTC date minus `$2`; null when neither), `pruned_below`, and the
/// database's UTC date.
pub fn claim_horizon(p: &Pipeline) -> String {
    format!(
        "WITH h AS (SELECT pruned_below FROM {} WHERE ledger = $1 FOR SHARE), \
         d AS (SELECT (now() AT TIME ZONE 'UTC')::date AS today) \
         SELECT greatest((SELECT pruned_below FROM h), d.today - $2::int), (SELECT pruned_below FROM h), d.today \
         FROM d",
        p.table(HORIZON)
    )
}

/// `CREATE TEMP TABLE landed`: the rows one batch newly claimed, visible to projection statements.
pub fn create_landed(p: &Pipeline) -> String {
    let mut defs = vec![
        "_generation text".to_string(),
        "_topic text".to_string(),
        "_partition integer".to_string(),
        "_offset bigint".to_string(),
        "_timestamp timestamptz".to_string(),
    ];
    defs.extend(
        p.fields
            .iter()
            .map(|f| format!("{} {}", f.name, f.ty.sql())),
    );
    defs.extend((0..p.pass_columns()).map(|i| format!("\"_pass_{i}\" boolean")));
    format!(
        "CREATE TEMP TABLE IF NOT EXISTS landed ({}) ON COMMIT DELETE ROWS",
        defs.join(", ")
    )
}

/// The claim statement. Parameters: `$1` generation (text, '' for none), `$2` topic, `$3` partition (int4),
/// `$4` consumer group, `$5` offsets (int8[]), `$6` record timestamps in ms (int8[], null elements allowed),
/// then one `text[]` per field, then one `bool[]` per projection pass column. Returns the offsets of the rows it
/// newly claimed (and copied into `landed`); copies of one key inside the batch count once (the lowest offset).
pub fn claim(p: &Pipeline) -> String {
    let n = p.fields.len();
    let passes = p.pass_columns();
    let mut params = vec!["$5::bigint[]".to_string(), "$6::bigint[]".to_string()];
    let mut names = vec!["_offset".to_string(), "_ts".to_string()];
    for i in 0..n {
        params.push(format!("${}::text[]", 7 + i));
        names.push(format!("f{i}"));
    }
    for j in 0..passes {
        params.push(format!("${}::boolean[]", 7 + n + j));
        names.push(format!("p{j}"));
    }
    let mut select = vec![
        "u._offset".to_string(),
        "CASE WHEN u._ts IS NULL THEN NULL ELSE to_timestamp(u._ts / 1000.0) END AS _timestamp"
            .to_string(),
    ];
    for (i, f) in p.fields.iter().enumerate() {
        select.push(format!("u.f{i}::{} AS {}", f.ty.sql(), f.name));
    }
    for j in 0..passes {
        select.push(format!("u.p{j} AS \"_pass_{j}\""));
    }
    let pk_fields: Vec<String> = ledger_pk(p).into_iter().skip(1).collect();
    let lcols: Vec<String> = ledger_field_columns(p)
        .iter()
        .map(|&i| p.fields[i].name.to_string())
        .collect();
    let mut landed_cols = vec![
        "_generation".to_string(),
        "_topic".to_string(),
        "_partition".to_string(),
        "_offset".to_string(),
        "_timestamp".to_string(),
    ];
    landed_cols.extend(p.fields.iter().map(|f| f.name.to_string()));
    landed_cols.extend((0..passes).map(|j| format!("\"_pass_{j}\"")));
    let mut landed_vals = vec![
        "$1".to_string(),
        "$2".into(),
        "$3".into(),
        "d._offset".into(),
        "d._timestamp".into(),
    ];
    landed_vals.extend(p.fields.iter().map(|f| format!("d.{}", f.name)));
    landed_vals.extend((0..passes).map(|j| format!("d.\"_pass_{j}\"")));
    format!(
        "WITH input AS (SELECT {select} FROM unnest({params}) AS u({names})), \
         dedup AS (SELECT DISTINCT ON ({pk}) * FROM input ORDER BY {pk}, _offset), \
         claimed AS (INSERT INTO {ledger} (generation, {lcols}, topic, partition, \"offset\", consumer_group) \
           SELECT $1, {lcols}, $2, $3, _offset, $4 FROM dedup ON CONFLICT DO NOTHING RETURNING \"offset\") \
         INSERT INTO pg_temp.landed ({landed_cols}) SELECT {landed_vals} FROM dedup d \
           JOIN claimed c ON c.\"offset\" = d._offset RETURNING _offset",
        select = select.join(", "),
        params = params.join(", "),
        names = names.join(", "),
        pk = pk_fields.join(", "),
        ledger = p.ledger.table,
        lcols = lcols.join(", "),
        landed_cols = landed_cols.join(", "),
        landed_vals = landed_vals.join(", "),
    )
}

/// Dead-letter insert. Parameters: `$1` generation, `$2` topic, `$3` partition, `$4` consumer group, `$5`
/// offsets (int8[]), `$6` timestamps ms (int8[]), `$7` keys (bytea[]), `$8` values (bytea[]), `$9` value sizes
/// (int4[]), `$10` value SHA-256 (bytea[]), `$11` reasons (text[]), `$12` details (text[]).
pub fn insert_dead_letters(p: &Pipeline) -> String {
    format!(
        "INSERT INTO {} (generation, topic, partition, \"offset\", record_timestamp, key, value, value_bytes, \
         value_sha256, reason, detail, consumer_group) \
         SELECT $1, $2, $3, u.o, CASE WHEN u.ts IS NULL THEN NULL ELSE to_timestamp(u.ts / 1000.0) END, u.k, u.v, u.n, \
         u.h, u.r, u.d, $4 FROM unnest($5::bigint[], $6::bigint[], $7::bytea[], $8::bytea[], $9::int[], $10::bytea[], \
         $11::text[], $12::text[]) AS u(o, ts, k, v, n, h, r, d) \
         ON CONFLICT (generation, topic, partition, \"offset\") DO NOTHING",
        p.table(DEAD_LETTERS)
    )
}

/// Compare-and-set of a partition's checkpoint, guarded by the fence. Parameters: `$1` group, `$2` topic,
/// `$3` partition, `$4` fence, `$5` expected next_offset (null: no checkpoint yet), `$6` new next_offset,
/// `$7` generation, then the fingerprint of the batch's last record: `$8` offset, `$9` timestamp ms,
/// `$10` SHA-256 (nulls keep the stored fingerprint).
/// Affects one row when this owner still holds the partition and nobody moved the checkpoint.
pub fn advance_checkpoint(p: &Pipeline) -> String {
    format!(
        "UPDATE {} SET next_offset = $6, updated_at = now(), last_offset = coalesce($8, last_offset), \
         last_timestamp = CASE WHEN $8::bigint IS NULL THEN last_timestamp ELSE $9 END, \
         last_sha256 = coalesce($10, last_sha256) WHERE consumer_group = $1 AND topic = $2 \
         AND partition = $3 AND fence = $4 AND next_offset IS NOT DISTINCT FROM $5 AND generation = $7",
        p.table(CHECKPOINTS)
    )
}

/// Takes ownership of a partition: creates its checkpoint row if missing and bumps the fence, so that any
/// previous owner's in-flight batch fails its compare-and-set. Parameters: `$1` group, `$2` topic,
/// `$3` partition, `$4` generation ('' for none). Returns `(next_offset, fence)`. Checkpoints are kept per
/// stream generation: a recreated topic under a new generation starts from its own positions.
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

pub fn acquire_checkpoint(p: &Pipeline) -> String {
    let t = p.table(CHECKPOINTS);
    format!(
        "INSERT INTO {t} AS c (consumer_group, generation, topic, partition, next_offset, fence) \
         VALUES ($1, $4, $2, $3, NULL, 1) ON CONFLICT (consumer_group, generation, topic, partition) \
         DO UPDATE SET fence = c.fence + 1, updated_at = now() RETURNING next_offset, fence"
    )
}
