//! `replaysafe verify compare`: how far a table the user's own consumer writes is from what the topic says — the
//! shadow pipeline's counter or sum projection —, per group-by key from the later of the two first days through the newest day of either, and which of the
//! differences are redeliveries the hand-made consumer counted again.
//!
//! One read-only `REPEATABLE READ` transaction (one MVCC snapshot) reads the projection, the user's table, the
//! checkpoints and — after the topic is read up to those checkpoints — the ledger claims of the records read. A
//! record whose delivery key the ledger holds at another (topic, partition, offset) is a *redelivery* of that
//! claim: the projection counted the claim once, a consumer that applies every record counted it again. The
//! claim's ledger row holds the group-by fields (key fields, partition-by, `[ledger] columns`), so each
//! redelivery is attributed to its projection row without recomputing the projection.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bigdecimal::{BigDecimal, Zero};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio_postgres::{IsolationLevel, Transaction};

use super::{aggregate_target, database_url, num, Target};
use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::ident::{Ident, QualifiedName};
use crate::printable::escape_controls;
use crate::projection::ProjectionKind;
use crate::sink;

/// Records sent to PostgreSQL per ledger lookup.
const CHUNK: usize = 5_000;

/// What `verify compare` compares.
pub struct CompareOptions {
    /// The shadow pipeline's counter or sum projection: its table or `name`.
    pub table: String,
    /// Its value column (needed when a sum has several); the user's table has a column of the same name.
    pub column: Option<String>,
    /// The user's table, `schema.table` (a bare name is refused: replaysafe's sessions pin their `search_path`).
    pub with: String,
    /// Kafka bootstrap servers, resolved.
    pub brokers: String,
}

/// One group-by key whose value differs between the user's table and the projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowDiff {
    /// The group-by values joined with `|`.
    pub key: String,
    /// The user's table's value (decimal text; `None`: no row).
    pub theirs: Option<String>,
    /// The projection's value (decimal text; `None`: no row).
    pub ours: Option<String>,
    /// theirs − ours (a missing row counts 0).
    pub difference: String,
    /// The redeliveries of this row's claims in the topic: records, and (sum) their summed field. `None` when the
    /// ledger does not hold every group-by field.
    pub redeliveries: Option<(i64, Option<String>)>,
    /// Whether the difference equals what the redeliveries add.
    pub explained: bool,
    /// The printed explanation.
    pub why: String,
}

/// What `verify compare` found: the rows that differ, the printed table.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The rows that differ, by key.
    pub differ: Vec<RowDiff>,
    /// The header, the differing rows, the totals and what was left out.
    pub table: String,
}

/// The user's table, resolved.
struct Theirs {
    name: QualifiedName,
}

/// One table's rows: key → (day, value).
type Values = BTreeMap<String, (String, BigDecimal)>;

/// Compares the user's table `opts.with` with the shadow pipeline's projection `opts.table` (see the module
/// documentation): every key from the later of the two first days through the newest day of either (all keys when the partition-by field is not a group-by
/// column) whose values differ, each explained by the redeliveries of its claims when they account for the
/// difference exactly.
///
/// # Errors
/// [`Error::Usage`] when the projection is not a counter or sum of the pipeline, the user's table does not exist,
/// lacks a group-by or the value column, or holds values that do not cast to the projection's column types;
/// database and Kafka errors.
pub fn compare(p: &Pipeline, opts: &CompareOptions) -> Result<Comparison> {
    let t = aggregate_target(p, &opts.table, opts.column.as_deref())?;
    let url = database_url(p)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    let mut client = rt.block_on(sink::connect_with(&url, &p.postgres.timeouts))?;
    let tx = rt.block_on(
        client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start(),
    )?;
    // The snapshot stays open while the topic is read back (each partition's wait for a record bounded at 30 s):
    // no statement bound, and an idle bound above that wait instead of the pipeline's (20 s by default).
    rt.block_on(tx.batch_execute(
        "SET LOCAL statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = '120s'",
    ))?;
    let theirs = rt.block_on(resolve(&tx, &t, &opts.with))?;
    let ours = rt.block_on(read(&tx, &t, &t.table, &[]))?;
    let ours_cols = rt.block_on(columns(&tx, &t.table))?;
    let mine = rt.block_on(read(&tx, &t, &theirs.name.to_string(), &ours_cols))?;
    let stops = rt.block_on(stops(&tx, p))?;
    if stops.is_empty() {
        return Err(Error::Usage(format!(
            "the shadow pipeline has consumed nothing yet (no checkpoint of its generation in schema {}): run \
             `replaysafe run --config …` with the shadow file first, then compare",
            p.postgres.schema
        )));
    }
    let ids = rt.block_on(stored_topic_ids(&tx, p))?;
    let redelivered = match t.ledger_lacks.is_empty() {
        true => Some(
            redeliveries(p, &rt, &tx, &t, &opts.brokers, (&stops, &ids)).map_err(|e| match e {
                // Which brokers, from where: librdkafka's own text names neither.
                Error::Kafka(k) => Error::Other(format!(
                "reading the topic back from the brokers {} ([kafka] brokers, or --brokers): {k}",
                crate::endpoint::mask_urls(&opts.brokers)
            )),
                other => other,
            })?,
        ),
        false => None,
    };
    rt.block_on(tx.rollback())?;
    let mut out = header(p, &t, &theirs, &stops);
    let (range, left_out) = covered(&t, &ours, &mine);
    let differ = judge(&t, &ours, &mine, range.as_ref(), redelivered.as_ref());
    out += &table(&t, &differ, &ours, &mine, range.as_ref());
    out += &left_out;
    if let Some(why) = lacks(&t) {
        out += &why;
    }
    if !t.exact {
        out += "note: the projection has a filter (or the pipeline a row projection): a redelivery is counted \
                above even when its claim did not reach the projection\n";
    }
    Ok(Comparison { differ, table: out })
}

/// Resolves the user's table (validated identifiers, schema-qualified) and checks that it has
/// the projection's group-by columns and value column.
async fn resolve(tx: &Transaction<'_>, t: &Target, with: &str) -> Result<Theirs> {
    let bad = |m: String| Error::Usage(format!("--with `{}`: {m}", escape_controls(with)));
    let quoted = match with.split('.').collect::<Vec<_>>().as_slice() {
        [name] => {
            Ident::new(name).map_err(bad)?;
            return Err(bad(format!(
                "name its schema (e.g. `public.{name}`): replaysafe's sessions pin their own search_path"
            )));
        }
        [s, name] => QualifiedName {
            schema: Ident::new(s).map_err(bad)?,
            name: Ident::new(name).map_err(bad)?,
        }
        .to_string(),
        _ => return Err(bad("not a table name (`schema.table` or `table`)".into())),
    };
    let found = tx
        .query_opt(
            "SELECT n.nspname::text, c.relname::text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n \
             ON n.oid = c.relnamespace WHERE c.oid = pg_catalog.to_regclass($1)",
            &[&quoted],
        )
        .await?
        .ok_or_else(|| bad("no such table".into()))?;
    let name = QualifiedName {
        schema: Ident::new(found.get(0)).map_err(bad)?,
        name: Ident::new(found.get(1)).map_err(bad)?,
    };
    if name.to_string() == t.table {
        return Err(bad(format!(
            "that is the projection's own table {}: name the table your consumer writes",
            t.qualified
        )));
    }
    let columns = columns(tx, &name.to_string()).await?;
    let needed: Vec<String> = t
        .group_by
        .iter()
        .map(|g| g.trim_matches('"').to_string())
        .chain([t.column.clone()])
        .collect();
    let missing: Vec<&String> = needed
        .iter()
        .filter(|n| !columns.iter().any(|(c, _)| c == *n))
        .collect();
    if !missing.is_empty() {
        let has: Vec<&str> = columns.iter().map(|(c, _)| c.as_str()).collect();
        return Err(bad(format!(
            "{}.{} has no column {} — it needs the projection's group-by columns ({}) and its value column `{}`, \
             named alike; it has: {}",
            name.schema.as_str(),
            name.name.as_str(),
            missing
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", "),
            needed[..needed.len() - 1].join(", "),
            t.column,
            has.join(", ")
        )));
    }
    Ok(Theirs { name })
}

/// A table's columns and their types (`format_type`), in column order.
async fn columns(tx: &Transaction<'_>, table: &str) -> Result<Vec<(String, String)>> {
    let rows = tx
        .query(
            "SELECT attname::text, pg_catalog.format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute \
             WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&table],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// A table's rows per group-by key (values summed: the user's table may hold several rows per key), each
/// group-by column cast to the type the projection's column has (`cast`: the projection's columns; empty for
/// the projection itself), and the day (empty when the partition-by field is not a group-by column).
async fn read(
    tx: &Transaction<'_>,
    t: &Target,
    table: &str,
    cast: &[(String, String)],
) -> Result<Values> {
    let typed = |g: &str| {
        let bare = g.trim_matches('"');
        match cast.iter().find(|(c, _)| c == bare) {
            Some((_, ty)) => format!("({g})::{ty}::text"),
            None => format!("{g}::text"),
        }
    };
    let key: Vec<String> = t.group_by.iter().map(|g| typed(g)).collect();
    let day = match t.day_index {
        Some(i) => key[i].clone(),
        None => "''".to_string(),
    };
    let column = Ident::new(&t.column).map_err(Error::Usage)?;
    // Each group-by value on its own: a NULL one is named in its place, never merged with other keys.
    let named: Vec<String> = key
        .iter()
        .map(|k| format!("coalesce({k}, '(null)')"))
        .collect();
    let sql = format!(
        "SELECT {k}, coalesce({day}, ''), coalesce(pg_catalog.sum({column}), 0)::text FROM {table} GROUP BY 1, 2",
        k = named.join(" || '|' || ")
    );
    let rows = tx.query(&sql, &[]).await.map_err(|e| {
        let class = e.code().map(|c| c.code()[..2].to_string());
        match (class.as_deref(), e.as_db_error()) {
            (_, Some(d)) if cast.is_empty() && d.code().code() == "42P01" => Error::Usage(format!(
                "the shadow pipeline's table {table} does not exist: run `replaysafe run --config …` with the \
                 shadow file first, then compare"
            )),
            (Some("22" | "42"), Some(d)) => Error::Usage(format!(
                "{table}: its group-by or value columns do not read as the projection's ({}): {}",
                cast.iter()
                    .map(|(c, ty)| format!("{c} {ty}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                d.message()
            )),
            _ => Error::Postgres(e),
        }
    })?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), num(r.get(2)))))
        .collect())
}

/// The topic range the pipeline's groups decided: per topic and partition of the pipeline, the highest next
/// offset of a checkpoint of its generation.
async fn stops(tx: &Transaction<'_>, p: &Pipeline) -> Result<Vec<(String, i32, i64)>> {
    let generation = p.identity.generation.clone().unwrap_or_default();
    let rows = tx
        .query(
            &format!(
                "SELECT topic, partition, max(next_offset) FROM {} WHERE generation = $1 AND topic = ANY($2) \
                 AND next_offset IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2",
                p.table(sink::checkpoint::CHECKPOINTS)
            ),
            &[&generation, &p.kafka.topics],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// The topic id (KIP-516) the shadow's checkpoints recorded per topic, where one was recorded.
async fn stored_topic_ids(tx: &Transaction<'_>, p: &Pipeline) -> Result<BTreeMap<String, String>> {
    let generation = p.identity.generation.clone().unwrap_or_default();
    let rows = tx
        .query(
            &format!(
                "SELECT topic, max(topic_id) FROM {} WHERE generation = $1 AND topic = ANY($2) \
                 AND topic_id IS NOT NULL GROUP BY 1",
                p.table(sink::checkpoint::CHECKPOINTS)
            ),
            &[&generation, &p.kafka.topics],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The log the shadow read: per partition its stop (the highest checkpoint, next offset to read), and per topic
/// the topic id its checkpoints recorded.
type Log<'a> = (&'a [(String, i32, i64)], &'a BTreeMap<String, String>);

/// A record read back: its coordinates and its delivery key (generation left out).
struct Seen {
    topic: String,
    partition: i32,
    offset: i64,
    key: Vec<String>,
}

/// Per projection row key: the records of the topic (up to `stops`) whose delivery key the ledger holds at
/// another coordinate — their count and (a sum whose field the ledger holds) the claims' field summed. `log`: the
/// stops and the topic ids the checkpoints recorded ([`stored_topic_ids`]).
fn redeliveries(
    p: &Pipeline,
    rt: &tokio::runtime::Runtime,
    tx: &Transaction<'_>,
    t: &Target,
    brokers: &str,
    log: Log<'_>,
) -> Result<BTreeMap<String, (i64, BigDecimal)>> {
    let (stops, ids) = log;
    let sql = lookup(p, t);
    let mut out: BTreeMap<String, (i64, BigDecimal)> = BTreeMap::new();
    let mut add = |chunk: &mut Vec<Seen>| -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        let topics: Vec<&str> = chunk.iter().map(|s| s.topic.as_str()).collect();
        let parts: Vec<i32> = chunk.iter().map(|s| s.partition).collect();
        let offsets: Vec<i64> = chunk.iter().map(|s| s.offset).collect();
        let keys: Vec<Vec<&str>> = (0..chunk[0].key.len())
            .map(|j| chunk.iter().map(|s| s.key[j].as_str()).collect())
            .collect();
        let generation = p.identity.generation.clone().unwrap_or_default();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&generation, &topics, &parts, &offsets];
        params.extend(
            keys.iter()
                .map(|k| k as &(dyn tokio_postgres::types::ToSql + Sync)),
        );
        for r in rt.block_on(tx.query(&sql, &params))? {
            let e = out.entry(r.get(0)).or_insert((0, BigDecimal::zero()));
            e.0 += r.get::<_, i64>(1);
            e.1 += num(r.get(2));
        }
        chunk.clear();
        Ok(())
    };
    let mut chunk = Vec::with_capacity(CHUNK);
    scan(p, brokers, (stops, ids), |seen| {
        chunk.push(seen);
        match chunk.len() >= CHUNK {
            true => add(&mut chunk),
            false => Ok(()),
        }
    })?;
    add(&mut chunk)?;
    Ok(out)
}

/// The delivery-key fields in [`crate::decode::delivery_key`]'s order (generation left out).
fn key_fields(p: &Pipeline) -> Vec<usize> {
    let mut k = p.identity.key.clone();
    if let Some(pb) = p.identity.partition_by {
        if !k.contains(&pb) {
            k.push(pb);
        }
    }
    k
}

/// The ledger lookup of a chunk of records read back. Parameters: `$1` generation, `$2` topics (text[]), `$3`
/// partitions (int4[]), `$4` offsets (int8[]), then one text[] per delivery-key field (cast to its type, as the
/// claim casts it). Returns per projection row key the claims held at another coordinate: count, field sum.
fn lookup(p: &Pipeline, t: &Target) -> String {
    let fields = key_fields(p);
    let mut names = vec!["_t".to_string(), "_p".into(), "_o".into()];
    let mut arrays = vec![
        "$2::text[]".to_string(),
        "$3::int4[]".into(),
        "$4::int8[]".into(),
    ];
    let mut on = vec!["l.generation = $1".to_string()];
    for (j, &i) in fields.iter().enumerate() {
        names.push(format!("_k{j}"));
        arrays.push(format!("${}::text[]", 5 + j));
        on.push(format!(
            "l.{} = r._k{j}::{}",
            p.fields[i].name,
            p.fields[i].ty.sql()
        ));
    }
    let key: Vec<String> = t.group_by.iter().map(|g| format!("l.{g}::text")).collect();
    let sum = t
        .ledger_sum
        .as_ref()
        .map_or_else(|| "0".to_string(), |f| format!("coalesce(sum(l.{f}), 0)"));
    format!(
        "SELECT {key}, count(*)::bigint, ({sum})::text FROM unnest({arrays}) AS r({names}) JOIN {ledger} l ON {on} \
         WHERE (l.topic, l.partition, l.\"offset\") IS DISTINCT FROM (r._t, r._p, r._o) GROUP BY 1",
        key = key.join(" || '|' || "),
        arrays = arrays.join(", "),
        names = names.join(", "),
        ledger = sink::ledger::ledger_rows(p),
        on = on.join(" AND ")
    )
}

/// Reads each partition of `stops` from its first offset to its stop with the pipeline's consumer configuration
/// (read_committed), decodes each record as the engine does and hands on those with a delivery key.
///
/// # Errors
/// [`Error::Usage`] when the log is not the one the shadow read: a topic id other than its checkpoints recorded
/// (the topic re-created), or a partition whose end is below its checkpoint; Kafka's errors.
fn scan(
    p: &Pipeline,
    brokers: &str,
    log: Log<'_>,
    mut each: impl FnMut(Seen) -> Result<()>,
) -> Result<()> {
    let (stops, ids) = log;
    let consumer: BaseConsumer = crate::source::kafka::consumer_config(p, brokers, &[]).create()?;
    let topics: Vec<String> = ids.keys().cloned().collect();
    if !topics.is_empty() {
        let now = crate::source::kafka::log_ids(&consumer, &topics)?;
        for (topic, stored) in ids {
            if let Some(id) = now.topic(topic).filter(|id| *id != stored) {
                return Err(Error::Usage(format!(
                    "topic {topic} is not the log the shadow read: its topic id is {id}, the shadow's checkpoints \
                     recorded {stored} (the topic was re-created); run the shadow again into a fresh schema"
                )));
            }
        }
    }
    let mut tpl = TopicPartitionList::new();
    let mut open: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (topic, part, stop) in stops {
        let (low, high) = crate::source::kafka::watermarks(
            &consumer,
            topic,
            *part,
            crate::endpoint::connect_timeout(),
        )?;
        if high < *stop {
            return Err(Error::Usage(format!(
                "{topic}/{part} ends at offset {high}, below the shadow's checkpoint {stop}: not the log the \
                 shadow read (the topic re-created, or its records deleted); run the shadow again into a fresh \
                 schema"
            )));
        }
        if *stop > low {
            tpl.add_partition_offset(topic, *part, Offset::Offset(low))?;
            open.insert((topic.clone(), *part), *stop);
        }
    }
    if open.is_empty() {
        return Ok(());
    }
    consumer.assign(&tpl)?;
    let mut idle_since = Instant::now();
    while !open.is_empty() {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) => {
                idle_since = Instant::now();
                let tp = (msg.topic().to_string(), msg.partition());
                let Some(&stop) = open.get(&tp) else { continue };
                if msg.offset() >= stop {
                    open.remove(&tp);
                    continue;
                }
                let old = crate::decode::debezium::envelope::old_key_header(&msg);
                if let Ok(crate::decode::Decoded::Fields { fields, .. }) =
                    crate::decode::record(p, msg.key(), msg.payload(), old)
                {
                    if let Some(k) = crate::decode::delivery_key(p, &fields) {
                        each(Seen {
                            topic: tp.0.clone(),
                            partition: tp.1,
                            offset: msg.offset(),
                            key: k.iter().skip(1).map(|s| (*s).to_string()).collect(),
                        })?;
                    }
                }
                if msg.offset() + 1 >= stop {
                    open.remove(&tp);
                }
            }
            Some(Err(e)) => return Err(Error::Other(format!("reading the topic back: {e}"))),
            None => {
                // Transaction markers or compaction can leave the last offsets before a stop without a record.
                let pos = consumer.position()?;
                open.retain(|(t, q), stop| {
                    !matches!(pos.find_partition(t, *q).map(|e| e.offset()),
                        Some(Offset::Offset(o)) if o >= *stop)
                });
                if !open.is_empty() && idle_since.elapsed() >= Duration::from_secs(30) {
                    let left: Vec<String> = open.keys().map(|(t, q)| format!("{t}/{q}")).collect();
                    return Err(Error::Other(format!(
                        "reading the topic back: no record for 30 s before the checkpoints of {}",
                        left.join(", ")
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The days both tables cover (`None`: not compared per day, or a table is empty) and the line naming the rows
/// of other days left out.
fn covered(t: &Target, ours: &Values, theirs: &Values) -> (Option<(String, String)>, String) {
    if t.day_index.is_none() {
        return (None, String::new());
    }
    let bounds = |v: &Values| {
        let days: BTreeSet<DayKey> = v.values().map(|(d, _)| DayKey::of(d)).collect();
        Some((days.first()?.clone(), days.last()?.clone()))
    };
    let (Some((lo_o, hi_o)), Some((lo_t, hi_t))) = (bounds(ours), bounds(theirs)) else {
        return (None, String::new());
    };
    // From the later first day (one of them started later, or retention took the older days) to the later
    // last day: a table missing the newest days while the shadow has them differs.
    let (lo, hi) = (
        lo_o.clone().max(lo_t.clone()),
        hi_o.clone().max(hi_t.clone()),
    );
    let outside = |v: &Values| {
        v.values()
            .filter(|(d, _)| {
                let d = DayKey::of(d);
                d < lo || d > hi
            })
            .count()
    };
    let (o, m) = (outside(ours), outside(theirs));
    let line = match o + m {
        0 => String::new(),
        _ => format!(
            "not compared (before the later first day of the two): {m} row(s) of the table, {o} of the projection\n"
        ),
    };
    (Some((lo.1, hi.1)), line)
}

/// A day's text ordered by its date when it reads as one (BC and years past 9999 included).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct DayKey(Option<chrono::NaiveDate>, String);

impl DayKey {
    fn of(d: &str) -> DayKey {
        DayKey(crate::decode::day::parse(d), d.to_string())
    }
}

/// Whether `day` lies in `range` (always, without one).
fn inside(range: Option<&(String, String)>, day: &str) -> bool {
    range.is_none_or(|(lo, hi)| {
        let d = DayKey::of(day);
        d >= DayKey::of(lo) && d <= DayKey::of(hi)
    })
}

/// Every key of the compared days whose values differ, with its explanation.
fn judge(
    t: &Target,
    ours: &Values,
    theirs: &Values,
    range: Option<&(String, String)>,
    redelivered: Option<&BTreeMap<String, (i64, BigDecimal)>>,
) -> Vec<RowDiff> {
    let keys: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
    let is_sum = t.kind == ProjectionKind::Sum;
    let text = |d: &BigDecimal| d.normalized().to_plain_string();
    let mut out = Vec::new();
    for k in keys {
        let (o, m) = (ours.get(k), theirs.get(k));
        let day = o.or(m).map_or("", |(d, _)| d.as_str());
        if !inside(range, day) {
            continue;
        }
        let zero = BigDecimal::zero();
        let (ov, mv) = (o.map_or(&zero, |x| &x.1), m.map_or(&zero, |x| &x.1));
        // A missing row holds 0: a sum row of 0 on one side only is no difference.
        if ov == mv {
            continue;
        }
        let diff = mv - ov;
        let r = redelivered.map(|r| r.get(k).cloned().unwrap_or((0, BigDecimal::zero())));
        let adds = r.as_ref().and_then(|(n, s)| match is_sum {
            false => Some(BigDecimal::from(*n)),
            true => t.ledger_sum.as_ref().map(|_| s.clone()),
        });
        let explained = adds.as_ref().is_some_and(|a| *a == diff && !diff.is_zero());
        let why = match (&r, &adds) {
            (None, _) => "not explained: unknown (the ledger lacks a group-by field, see below)".to_string(),
            (Some((0, _)), _) => {
                "not explained: no redelivery of its claims in the topic".to_string()
            }
            (Some((n, _)), _) if explained => {
                format!("explained: {} (same event id at other offsets)", plural(*n))
            }
            (Some((n, _)), Some(a)) => format!(
                "not explained: {} (same event id at other offsets) add {}, {} unexplained",
                plural(*n),
                text(a),
                text(&(&diff - a))
            ),
            (Some((n, _)), None) => format!(
                "not explained: {} (same event id at other offsets), what they add unknown (the ledger does \
                 not hold the summed field: add it to [ledger] columns)",
                plural(*n)
            ),
        };
        out.push(RowDiff {
            key: k.clone(),
            theirs: m.map(|x| text(&x.1)),
            ours: o.map(|x| text(&x.1)),
            difference: text(&diff),
            redeliveries: r.map(|(n, s)| (n, t.ledger_sum.as_ref().map(|_| text(&s)))),
            explained,
            why,
        });
    }
    out
}

/// `1 redelivery`, `n redeliveries`.
fn plural(n: i64) -> String {
    match n {
        1 => "1 redelivery".to_string(),
        n => format!("{n} redeliveries"),
    }
}

/// The first lines: what is compared with what, from which snapshot and topic range.
fn header(p: &Pipeline, t: &Target, theirs: &Theirs, stops: &[(String, i32, i64)]) -> String {
    let read: Vec<String> = stops
        .iter()
        .map(|(t, q, s)| format!("{t}/{q} < {s}"))
        .collect();
    format!(
        "{kind} {ours}.{col} (pipeline group `{group}`) against {schema}.{name}.{col}; redeliveries from the topic \
         read back to the checkpoints ({read})\n",
        kind = format!("{:?}", t.kind).to_lowercase(),
        ours = t.qualified,
        col = t.column,
        group = escape_controls(&p.kafka.group_id),
        schema = theirs.name.schema.as_str(),
        name = theirs.name.name.as_str(),
        read = if read.is_empty() {
            "no checkpoint: nothing read".to_string()
        } else {
            read.join(", ")
        }
    )
}

/// The rows that differ, then the totals of both sides over the compared days.
fn table(
    t: &Target,
    differ: &[RowDiff],
    ours: &Values,
    theirs: &Values,
    range: Option<&(String, String)>,
) -> String {
    let mut out = match range {
        Some((lo, hi)) if DayKey::of(lo) > DayKey::of(hi) => "days compared: none\n".to_string(),
        Some((lo, hi)) => format!("days compared: {lo} … {hi} (both tables cover them)\n"),
        None if t.day_index.is_some() => "days compared: none\n".to_string(),
        None => "compared: the whole tables (the partition-by field is not a group-by column)\n"
            .to_string(),
    };
    let width = differ
        .iter()
        .map(|d| escape_controls(&d.key).len())
        .max()
        .unwrap_or(0)
        .max(24);
    out += &format!(
        "{:<width$} {:>14} {:>14} {:>14}   explanation\n",
        "key", "theirs", "ours", "difference"
    );
    for d in differ {
        out += &format!(
            "{:<width$} {:>14} {:>14} {:>14}   {}\n",
            escape_controls(&d.key),
            d.theirs.as_deref().unwrap_or("(no row)"),
            d.ours.as_deref().unwrap_or("(no row)"),
            d.difference,
            d.why
        );
    }
    let total = |v: &Values| -> (usize, BigDecimal) {
        let rows: Vec<&BigDecimal> = v
            .values()
            .filter(|(d, _)| inside(range, d))
            .map(|(_, x)| x)
            .collect();
        (rows.len(), rows.into_iter().sum())
    };
    let ((nt, st), (no, so)) = (total(theirs), total(ours));
    let text = |d: &BigDecimal| d.normalized().to_plain_string();
    out += &format!(
        "totals: theirs {} ({nt} rows), ours {} ({no} rows), difference {}\n",
        text(&st),
        text(&so),
        text(&(&st - &so))
    );
    let explained = differ.iter().filter(|d| d.explained).count();
    out += &format!(
        "{} row(s) differ: {explained} explained by redeliveries, {} not explained\n",
        differ.len(),
        differ.len() - explained
    );
    out
}

/// The note when the ledger does not hold every group-by field: redeliveries cannot be attributed to rows.
fn lacks(t: &Target) -> Option<String> {
    (!t.ledger_lacks.is_empty()).then(|| {
        format!(
            "the ledger does not hold the group-by field(s) {}: redeliveries cannot be attributed to rows; add them \
             to `[ledger] columns` of the shadow pipeline and run it again into a fresh schema\n",
            t.ledger_lacks.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
[kafka]
group-id = "g"
topics = ["t"]
[postgres]
schema = "s"
[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date" }
customer_id = { path = "/customer_id", type = "text" }
amount = { path = "/amount", type = "numeric" }
[identity]
key = ["event_id"]
partition-by = "day"
[ledger]
columns = ["customer_id"]
[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day", "customer_id"]
"#;

    fn values(rows: &[(&str, &str, i64)]) -> Values {
        rows.iter()
            .map(|(k, d, v)| (k.to_string(), (d.to_string(), BigDecimal::from(*v))))
            .collect()
    }

    #[test]
    fn a_difference_is_explained_only_by_exactly_its_redeliveries() {
        let p = crate::config::parse("p.toml", TEXT).unwrap();
        let t = aggregate_target(&p, "daily_counts", None).unwrap();
        let ours = values(&[
            ("a", "2024-04-25", 4),
            ("b", "2024-04-25", 3),
            ("c", "2024-04-25", 1),
        ]);
        let theirs = values(&[
            ("a", "2024-04-25", 6),
            ("b", "2024-04-25", 5),
            ("d", "2024-04-25", 2),
        ]);
        let r: BTreeMap<String, (i64, BigDecimal)> = [
            ("a".to_string(), (2, BigDecimal::zero())),
            ("b".to_string(), (1, BigDecimal::zero())),
        ]
        .into();
        let d = judge(&t, &ours, &theirs, None, Some(&r));
        let got: Vec<(&str, bool, &str)> = d
            .iter()
            .map(|x| (x.key.as_str(), x.explained, x.why.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", true, "explained: 2 redeliveries (same event id at other offsets)"),
                (
                    "b",
                    false,
                    "not explained: 1 redelivery (same event id at other offsets) add 1, 1 unexplained"
                ),
                ("c", false, "not explained: no redelivery of its claims in the topic"),
                ("d", false, "not explained: no redelivery of its claims in the topic"),
            ]
        );
        assert_eq!(
            (d[2].theirs.as_deref(), d[2].difference.as_str()),
            (None, "-1")
        );
        // The ledger lacking a group-by field: nothing is attributed.
        let d = judge(&t, &ours, &theirs, None, None);
        assert!(
            d.iter().all(|x| !x.explained && x.why.contains("unknown")),
            "{d:?}"
        );
    }

    #[test]
    fn days_from_the_later_first_day_through_the_newest_of_either_are_compared() {
        let p = crate::config::parse("p.toml", TEXT).unwrap();
        let t = aggregate_target(&p, "daily_counts", None).unwrap();
        let ours = values(&[("x", "2024-04-25", 1), ("y", "2024-04-27", 1)]);
        let theirs = values(&[
            ("z", "2024-04-20", 9),
            ("x", "2024-04-25", 2),
            ("w", "2024-04-26", 1),
        ]);
        let (range, line) = covered(&t, &ours, &theirs);
        // The table lacks the projection's newest day: it is compared (a consumer that lost a day differs).
        assert_eq!(range, Some(("2024-04-25".into(), "2024-04-27".into())));
        assert!(
            line.contains("1 row(s) of the table, 0 of the projection"),
            "{line}"
        );
        let keys: Vec<String> = judge(&t, &ours, &theirs, range.as_ref(), None)
            .into_iter()
            .map(|d| d.key)
            .collect();
        assert_eq!(keys, ["w", "x", "y"]);
        // A row of 0 on one side only is no difference.
        let zero = values(&[("x", "2024-04-25", 1), ("v", "2024-04-25", 0)]);
        let (range, _) = covered(&t, &zero, &values(&[("x", "2024-04-25", 1)]));
        assert!(judge(
            &t,
            &zero,
            &values(&[("x", "2024-04-25", 1)]),
            range.as_ref(),
            None
        )
        .is_empty());
    }
}
