//! `replaysafe projection build | remove`: the two steps of changing the projections of a running pipeline
//! (docs/replay.md "Change a running pipeline"). Adding is done by a start (`init`/`run`) with a file that has the new
//! projection: it is recorded `building` with its hand-over point ([`crate::sink::projset`]); `build` applies
//! the records the ledger claimed before that point to it alone and makes it `active`; `remove` records a
//! projection deleted from the file as removed (its table left as it is).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio_postgres::Client;

use crate::config::Pipeline;
use crate::engine::{Engine, Options};
use crate::error::{Error, Result};
use crate::model::Tally;
use crate::sink::checkpoint;
use crate::sink::ledger::DDL_LOCK;
use crate::sink::projset::{self, State, HANDOVER};
use crate::source::assign::{Assign, Range};

/// Options of `projection build`.
pub struct BuildOptions {
    /// `bootstrap.servers`, resolved.
    pub brokers: String,
    /// PostgreSQL connection string, resolved.
    pub database_url: String,
    /// The projection to build (its `name`).
    pub projection: String,
    /// A declared start: read each partition from its first record at or after this time (ms since the epoch)
    /// instead of its beginning; the records the ledger claimed before it are not applied (counted, logged).
    pub from_ms: Option<i64>,
    /// Set to stop (what was applied stays; a rerun resumes).
    pub shutdown: Arc<AtomicBool>,
}

/// What a build did.
#[derive(Debug)]
pub struct BuildSummary {
    /// The outcomes: `landed` = applied to the projection, `duplicate` = not claimed at this position before the
    /// hand-over (applied through another claim, or by `run`).
    pub tally: Tally,
    /// `(topic, partition, start, stop)` read.
    pub partitions: Vec<(String, i32, i64, i64)>,
    /// Claimed records before a declared start (`--from`), not applied.
    pub before_start: i64,
    /// Whether it was complete already (nothing done).
    pub already_complete: bool,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))
}

/// The build group of `name` when it is `building`; `None` when it is active (built, or never needed one).
///
/// # Errors
/// [`Error::Usage`] when the projection is not in the file or not recorded for the ledger.
async fn build_group(client: &Client, p: &Pipeline, name: &str) -> Result<Option<String>> {
    if !p.projections.iter().any(|x| x.name == name) {
        return Err(Error::Usage(format!(
            "projection `{name}` is not in the pipeline file"
        )));
    }
    let record = projset::load(client, p).await?;
    let entry = record.as_ref().and_then(|r| r.entries.get(name));
    match entry {
        Some(e) if e.state == State::Building => Ok(e.build_group.clone()),
        Some(e) if e.state == State::Active => Ok(None),
        _ => Err(Error::Usage(format!(
            "projection `{name}` is not recorded for ledger {}: start the pipeline (init or run) with this file \
             first; that records it and its hand-over point",
            p.ledger.table
        ))),
    }
}

/// Per partition, the highest hand-over offset of `group`: the build reads up to it (exclusive).
async fn stops(client: &Client, p: &Pipeline, group: &str) -> Result<Vec<(String, i32, i64)>> {
    let rows = client
        .query(
            &format!(
                "SELECT topic, partition, max(next_offset) FROM {} WHERE build_group = $1 GROUP BY 1, 2 \
                 ORDER BY 1, 2",
                p.table(HANDOVER)
            ),
            &[&group],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// The ledger rows the build would apply in `(topic, partition)` below `start`: their count and lowest offset.
async fn claimed_below(
    client: &Client,
    p: &Pipeline,
    group: &str,
    (topic, partition, start): (&str, i32, i64),
) -> Result<(i64, Option<i64>)> {
    let row = client
        .query_one(
            &format!(
                "WITH l AS MATERIALIZED (SELECT consumer_group, generation, topic, partition, \"offset\" FROM {} r \
                 WHERE topic = $2 AND partition = $3 AND \"offset\" < $4) \
                 SELECT count(*), min(l.\"offset\") FROM l WHERE {}",
                crate::sink::ledger::ledger_rows(p),
                crate::sink::build::claimed_before_handover(p, "$1")
            ),
            &[&group, &topic, &partition, &start],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Where each partition's build starts: its log start, or the first offset at or after `from_ms`.
fn starts(
    p: &Pipeline,
    brokers: &str,
    parts: &[(String, i32)],
    from_ms: Option<i64>,
) -> Result<Vec<i64>> {
    let consumer: BaseConsumer = crate::source::kafka::consumer_config(p, brokers, &[]).create()?;
    let by_time = match from_ms {
        Some(ms) => {
            let mut tpl = TopicPartitionList::new();
            for (t, q) in parts {
                tpl.add_partition_offset(t, *q, Offset::Offset(ms))?;
            }
            let got = consumer.offsets_for_times(tpl, Duration::from_secs(30))?;
            let found: BTreeMap<(String, i32), Offset> = got
                .elements()
                .iter()
                .map(|e| ((e.topic().to_string(), e.partition()), e.offset()))
                .collect();
            Some(found)
        }
        None => None,
    };
    let mut out = Vec::new();
    for (t, part) in parts {
        let (low, high) = consumer.fetch_watermarks(t, *part, Duration::from_secs(30))?;
        let start = match by_time
            .as_ref()
            .and_then(|m| m.get(&(t.clone(), *part)).copied())
        {
            Some(Offset::Offset(o)) => o.max(low),
            Some(_) => high,
            None => low,
        };
        out.push(start);
    }
    Ok(out)
}

/// Builds projection `opts.projection` (recorded `building`) from the records the ledger claimed before its
/// hand-over point, then records it `active`. Resumes from its checkpoints after an interruption or a crash
/// (its progress commits with its projection changes). Production keeps running meanwhile.
///
/// # Errors
/// [`Error::Usage`] for a projection that is not in the file or not recorded; [`Error::Other`] when records the
/// ledger claimed before the hand-over are no longer in the topic (without `--from`), when a record is older
/// than the ledger horizon, or when interrupted; database and Kafka errors.
pub fn build(pipeline: Arc<Pipeline>, opts: BuildOptions) -> Result<BuildSummary> {
    let rt = runtime()?;
    let name = opts.projection.as_str();
    let p = pipeline.clone();
    let mut client = rt.block_on(crate::sink::connect_with(
        &opts.database_url,
        &p.postgres.timeouts,
    ))?;
    let Some(group) = rt.block_on(build_group(&client, &p, name))? else {
        tracing::info!(projection = %name, "projection is active (built): nothing to build");
        return Ok(BuildSummary {
            tally: Tally::default(),
            partitions: Vec::new(),
            before_start: 0,
            already_complete: true,
        });
    };
    let stops = rt.block_on(stops(&client, &p, &group))?;
    let parts: Vec<(String, i32)> = stops.iter().map(|(t, q, _)| (t.clone(), *q)).collect();
    let starts = starts(&p, &opts.brokers, &parts, opts.from_ms)?;
    let mut before_start = 0;
    let mut ranges = Vec::new();
    let mut partitions = Vec::new();
    for ((t, q, stop), start) in stops.iter().zip(starts) {
        let (n, lowest) = rt.block_on(claimed_below(&client, &p, &group, (t, *q, start)))?;
        if n > 0 && opts.from_ms.is_none() {
            return Err(Error::Other(format!(
                "{t}/{q}: {n} records the ledger claimed before the hand-over (from offset {}) are no longer in \
                 the topic (its log starts at {start}): projection `{name}` cannot be built from the topic's \
                 history. Declare a start with `--from TIME` (those records are then left out of it, said in the \
                 summary)",
                lowest.unwrap_or_default()
            )));
        }
        before_start += n;
        partitions.push((t.clone(), *q, start, *stop));
        ranges.push(Range {
            tp: (t.clone(), *q),
            start: start.min(*stop),
            stop: *stop,
        });
    }
    if before_start > 0 {
        tracing::warn!(
            projection = %name,
            records = before_start,
            "records the ledger claimed before the declared start (--from) are not applied to the projection"
        );
    }
    let tally = replay(&rt, &pipeline, &opts, &group, ranges)?;
    rt.block_on(complete(&mut client, &p, name, &group, &stops))?;
    Ok(BuildSummary {
        tally,
        partitions,
        before_start,
        already_complete: false,
    })
}

/// The engine over the assign source, its sinks in build mode, under the build group.
fn replay(
    rt: &tokio::runtime::Runtime,
    pipeline: &Arc<Pipeline>,
    opts: &BuildOptions,
    group: &str,
    ranges: Vec<Range>,
) -> Result<Tally> {
    let index = pipeline
        .projections
        .iter()
        .position(|x| x.name == opts.projection)
        .expect("the projection is found in the file before the build starts");
    let mut o = Options::new(&opts.database_url, opts.shutdown.clone());
    o.group = Some(group.to_string());
    o.prune_on_start = false;
    o.build = Some(index);
    o.summary_interval = Some(Duration::from_secs(10));
    let engine = Engine::start(rt.handle(), pipeline.clone(), o)?;
    let mut notes = Vec::new();
    let source = Assign::open(
        engine.shared(),
        &opts.brokers,
        group,
        ranges,
        &mut notes,
        false,
    )?
    .rerun(format!(
        "interrupted; rerun `replaysafe projection build {}` (the same options) to resume from its checkpoints",
        opts.projection
    ));
    for n in notes {
        tracing::info!("{n}");
    }
    engine.run(source)
}

/// Records the projection `active` once every partition's build checkpoint reached its stop.
async fn complete(
    client: &mut Client,
    p: &Pipeline,
    name: &str,
    group: &str,
    stops: &[(String, i32, i64)],
) -> Result<()> {
    for (t, q, stop) in stops {
        let at: Option<i64> = client
            .query_opt(
                &format!(
                    "SELECT next_offset FROM {} WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
                    p.table(checkpoint::CHECKPOINTS)
                ),
                &[&group, t, q],
            )
            .await?
            .and_then(|r| r.get(0));
        if at.is_none_or(|a| a < *stop) {
            return Err(Error::Other(format!(
                "build of `{name}` stopped before the hand-over on {t}/{q} (at {at:?}, hand-over {stop}); rerun it \
                 to resume"
            )));
        }
    }
    let tx = client.transaction().await?;
    tx.execute(DDL_LOCK, &[]).await?;
    let mut rec = projset::lock(&tx, p).await?.ok_or_else(|| {
        Error::Other(format!(
            "the projection record of ledger {} is gone",
            p.ledger.table
        ))
    })?;
    let at: String = tx.query_one("SELECT now()::text", &[]).await?.get(0);
    match rec.entries.get_mut(name) {
        Some(e) if e.state == State::Building && e.build_group.as_deref() == Some(group) => {
            e.state = State::Active;
            e.at.insert("built".to_string(), at);
        }
        _ => {
            return Err(Error::Other(format!(
                "projection `{name}` was removed or added again while it was built: not recorded as built"
            )))
        }
    }
    projset::store(&tx, p, &rec).await?;
    tx.commit().await?;
    tracing::info!(projection = %name, ledger = %p.ledger.table, "projection built: active");
    Ok(())
}

/// Records projection `name` — deleted from the pipeline file — as removed from the ledger's pipeline: no
/// longer fed by any batch (processes still running a file that has it stop at their next batch); its table is
/// left as it is. Returns the table (when the projection has one).
///
/// # Errors
/// [`Error::Usage`] when `name` is still in the file or not recorded, or when the file differs from the record
/// in other ways; database errors.
pub fn remove(pipeline: &Pipeline, database_url: &str, name: &str) -> Result<Option<String>> {
    let rt = runtime()?;
    rt.block_on(async {
        let mut client =
            crate::sink::connect_with(database_url, &pipeline.postgres.timeouts).await?;
        remove_in(&mut client, pipeline, name).await
    })
}

async fn remove_in(client: &mut Client, p: &Pipeline, name: &str) -> Result<Option<String>> {
    if p.projections.iter().any(|x| x.name == name) {
        return Err(Error::Usage(format!(
            "projection `{name}` is still in the pipeline file: delete its entry first, then remove it"
        )));
    }
    let tx = client.transaction().await?;
    tx.execute(DDL_LOCK, &[]).await?;
    let mut rec = match projset::lock(&tx, p).await? {
        Some(r) => r,
        None => match crate::sink::projstart::legacy(&tx, p).await? {
            Some(s) => projset::all_active(1, s),
            None => {
                return Err(Error::Usage(format!(
                    "ledger {} has no projection record: nothing to remove",
                    p.ledger.table
                )))
            }
        },
    };
    let at: String = tx.query_one("SELECT now()::text", &[]).await?.get(0);
    let table = match rec.entries.get_mut(name) {
        Some(e) if e.state != State::Removed => {
            e.state = State::Removed;
            e.at.insert("removed".to_string(), at);
            e.settings.get("table").cloned()
        }
        _ => {
            return Err(Error::Usage(format!(
                "projection `{name}` is not recorded for ledger {} (or removed already)",
                p.ledger.table
            )))
        }
    };
    let d = projset::diff(&rec, &projset::pipeline_settings(p));
    if !d.is_same() {
        projset::refuse_changes(p, &d)?;
        return Err(Error::Usage(format!(
            "the file also adds projection `{}`: remove `{name}` with the file that only lacks it, then start \
                the pipeline with the new one",
            d.added[0]
        )));
    }
    rec.version += 1;
    projset::store(&tx, p, &rec).await?;
    tx.commit().await?;
    Ok(table)
}
