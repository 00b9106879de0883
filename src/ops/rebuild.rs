//! `replaysafe rebuild`: zero a window of event days in the aggregates and the ledger, then replay it through
//! [`backfill`] (the engine over the assign source) under a fresh group id.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use chrono::NaiveDate;

use crate::config::Pipeline;
use crate::error::{Error, Result};

use crate::ops::backfill::{
    backfill, plan, BackfillOptions, MissingRow, MissingStop, RebuildCheck, Report, StopSpec,
    MISSING_LISTED,
};
use crate::sink::ledger::pending_table;
use crate::sink::{checkpoint, ledger, verify};

fn usage(msg: String) -> Error {
    Error::Usage(msg)
}

/// Options of a rebuild.
#[derive(Debug, Clone)]
pub struct RebuildOptions {
    /// First event day of the window (inclusive).
    pub from: NaiveDate,
    /// Last event day of the window (inclusive).
    pub to: NaiveDate,
    /// The fresh group id that replays the window.
    pub group_id: String,
    /// Hours of record time read before `from` and after `to`, for events never landed (landed ones are re-read
    /// from the offsets their ledger rows hold).
    pub slack_hours: i64,
    /// The operator confirmed that other writers of the projection tables are paused.
    pub others_paused: bool,
    /// Show a progress bar.
    pub progress: bool,
}

/// Rebuilds a window of event days: in one transaction deletes the window's rows from every counter/sum
/// projection and from the ledger, then replays the records of those days under a fresh group id. The replay
/// reads, per partition, at least the offsets the window's ledger rows came from (lowest to highest) and the
/// record times `slack_hours` around the window. The report's `rebuild` section compares the window's ledger
/// rows per day before and after ([`Report::rebuild_shortfall`]).
///
/// # Errors
/// [`Error::Usage`] without `others_paused`, without `partition-by`, or when a projection cannot be zeroed per
/// day (kind sql or outbox, or not grouped by the day); [`Error::Other`] before deleting anything when the window's
/// ledger rows came from offsets the topic no longer holds (retention, recreated topic), another generation or a
/// foreign topic, or when ledger rows appeared outside the planned offsets (a writer not paused); then as
/// [`backfill`].
pub fn rebuild(
    pipeline: Arc<Pipeline>,
    brokers: &str,
    database_url: &str,
    opts: &RebuildOptions,
    shutdown: Arc<AtomicBool>,
) -> Result<Report> {
    if !opts.others_paused {
        return Err(usage(
            "rebuild deletes the window's aggregate rows and replays them: pause every other writer of those tables, \
             then pass --i-paused-other-writers"
                .into(),
        ));
    }
    let day = pipeline.identity.partition_by.ok_or_else(|| {
        usage("rebuild works per event day: the pipeline needs identity.partition-by".into())
    })?;
    if opts.to < opts.from || opts.slack_hours < 0 {
        return Err(usage(format!(
            "rebuild --from {} --to {} --slack-hours {}: the window needs --from <= --to and a slack >= 0",
            opts.from, opts.to, opts.slack_hours
        )));
    }
    let deletes = zero_statements(&pipeline, day)?;
    // A misspelled topic is refused before the database is touched (nothing created or deleted).
    crate::ops::check::require_topics(&pipeline, brokers, &[])?;
    let (from_ms, to_ms) = record_window(opts);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Other(e.to_string()))?;
    // This connection lives until the report is complete: it keeps the deleted ledger rows (a temporary table).
    let mut client = rt.block_on(async {
        let mut client =
            crate::sink::connect_with(database_url, &pipeline.postgres.timeouts).await?;
        verify::prepare(&mut client, &pipeline).await?;
        Ok::<_, Error>(client)
    })?;
    // A projection being built (docs/replay.md "Change a running pipeline") would race the window's delete.
    if let Some(rec) = rt.block_on(crate::sink::projset::load(&client, &pipeline))? {
        if let Some((name, _)) = rec
            .entries
            .iter()
            .find(|(_, e)| e.state == crate::sink::projset::State::Building)
        {
            return Err(usage(format!(
                "projection `{name}` is being built (`replaysafe projection build`): finish its build first, then \
                 rebuild"
            )));
        }
    }
    // A group with checkpoints would resume where it stopped after the window was deleted again: refuse.
    let table = pipeline.table(checkpoint::CHECKPOINTS).to_string();
    let used: bool = rt
        .block_on(client.query_one(
            &format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE consumer_group = $1)"),
            &[&opts.group_id],
        ))?
        .get(0);
    if used {
        return Err(usage(format!(
            "--group-id {} has been used before: a rebuild deletes the window again and must replay it from the \
             start, so give every rebuild (also a rerun after an interruption) a new group id",
            opts.group_id
        )));
    }
    // Days the ledger no longer remembers (the durable horizon, README "The four answers", 4): their records would be
    // quarantined as beyond-horizon after the window was zeroed.
    let horizon = rt.block_on(ledger::current_horizon(&client, &pipeline))?;
    if let Some(oldest) = horizon.and_then(|h| h.oldest).filter(|o| opts.from < *o) {
        return Err(usage(format!(
            "the window starts {} but the ledger horizon only recognises event days from {oldest} (older days \
             were pruned, or are past horizon-days): their records would be quarantined as beyond-horizon after \
             the window was zeroed; rebuild from {oldest} on",
            opts.from
        )));
    }
    // Ledger rows an interrupted rebuild deleted and did not re-land are kept until a rebuild completes.
    let oldest = horizon.and_then(|h| h.oldest);
    rt.block_on(unfinished_rebuild(&client, &pipeline, opts, oldest))?;
    // Where the window's events came from: the replay reads at least those offsets, whatever their times.
    let sources = rt.block_on(window_sources(&client, &pipeline, opts))?;
    let cover = cover_of(&pipeline, &sources)?;
    let bopts = BackfillOptions {
        from_ms,
        stop: StopSpec::Time(to_ms),
        filter: None,
        day_window: Some((opts.from, opts.to)),
        group_id: opts.group_id.clone(),
        ensure_retention: false,
        dry_run: false,
        missing_stop: MissingStop::End,
        progress: opts.progress,
        cover: cover.clone(),
        keep_group: false,
    };
    // Plan first (retention, the ledger's offsets still in the topic) so nothing is deleted when the replay
    // cannot re-read it all.
    plan(&pipeline, brokers, database_url, &bopts)?;
    rt.block_on(delete_window(
        &mut client,
        &pipeline,
        opts,
        &deletes,
        &cover,
    ))?;
    let mut report = backfill(pipeline.clone(), brokers, database_url, &bopts, shutdown)?;
    report.rebuild = Some(rt.block_on(rebuild_check(&client, &pipeline, opts))?);
    // The replay completed: the deleted rows are accounted for in this report.
    rt.block_on(client.execute(
        &format!(
            "DELETE FROM {} WHERE {} BETWEEN $1 AND $2",
            pending_table(&pipeline),
            pipeline.fields[day].name
        ),
        &[&opts.from, &opts.to],
    ))?;
    Ok(report)
}

/// The statements that zero the window in every projection (counter/sum grouped by the partition-by field).
fn zero_statements(pipeline: &Pipeline, day: usize) -> Result<Vec<(String, String)>> {
    let mut deletes = Vec::new();
    for p in &pipeline.projections {
        match &p.aggregate {
            Some(a) if a.group_by.contains(&day) => deletes.push((
                a.table.to_string(),
                format!(
                    "DELETE FROM {} WHERE {} BETWEEN $1 AND $2",
                    a.table, pipeline.fields[day].name
                ),
            )),
            _ => {
                return Err(usage(format!(
                    "projection `{}` cannot be zeroed per day (only counter/sum projections grouped by the \
                     partition-by field can); rebuild refused",
                    p.name
                )))
            }
        }
    }
    Ok(deletes)
}

/// The record-time window read: the days `from..=to` widened by the slack, ms since the epoch.
fn record_window(opts: &RebuildOptions) -> (i64, i64) {
    let slack = opts.slack_hours * 3_600_000;
    let from_ms = opts
        .from
        .and_hms_opt(0, 0, 0)
        .expect("00:00:00 is a time of every day")
        .and_utc()
        .timestamp_millis()
        - slack;
    let to_ms = opts
        .to
        .succ_opt()
        .unwrap_or(opts.to)
        .and_hms_opt(0, 0, 0)
        .expect("00:00:00 is a time of every day")
        .and_utc()
        .timestamp_millis()
        + slack;
    (from_ms, to_ms)
}

/// Per `(generation, topic, partition)`: lowest and highest offset and the number of the window's ledger rows.
type Sources = Vec<(String, String, i32, i64, i64, i64)>;

async fn window_sources(
    client: &tokio_postgres::Client,
    pipeline: &Pipeline,
    opts: &RebuildOptions,
) -> Result<Sources> {
    let day = pipeline
        .identity
        .partition_by
        .expect("partition-by is checked before a rebuild starts");
    let (pending, day) = (pending_table(pipeline), &pipeline.fields[day].name);
    // With the rows an interrupted rebuild of the window deleted and did not re-land yet.
    let (ledger, pending) = (
        ledger::ledger_rows(pipeline),
        ledger::ledger_rows_of(pipeline, &pending.to_string()),
    );
    let q = format!(
        "SELECT generation, topic, partition, min(\"offset\"), max(\"offset\"), count(*) FROM ( \
         SELECT generation, topic, partition, \"offset\" FROM {ledger} l WHERE {day} BETWEEN $1 AND $2 UNION \
         SELECT generation, topic, partition, \"offset\" FROM {pending} p WHERE {day} BETWEEN $1 AND $2) s \
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    );
    let rows = client.query(&q, &[&opts.from, &opts.to]).await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect())
}

/// The offsets the replay must cover; refuses ledger rows that no replay of this pipeline can bring back (another
/// generation, a topic no longer in the pipeline).
fn cover_of(pipeline: &Pipeline, sources: &Sources) -> Result<BTreeMap<(String, i32), (i64, i64)>> {
    let generation = pipeline.identity.generation.clone().unwrap_or_default();
    let foreign: Vec<String> = sources
        .iter()
        .filter(|s| s.0 != generation || !pipeline.kafka.topics.contains(&s.1))
        .map(|s| {
            format!(
                "{} row(s) of generation '{}' from {}/{} offsets {}..={}",
                s.5, s.0, s.1, s.2, s.3, s.4
            )
        })
        .collect();
    if !foreign.is_empty() {
        return Err(Error::Other(format!(
            "the window's ledger holds events this pipeline cannot re-read (generation '{generation}', topics {:?}): \
             {}; the rebuild would delete them for good — refused before deleting anything",
            pipeline.kafka.topics,
            foreign.join(", ")
        )));
    }
    Ok(sources
        .iter()
        .map(|s| ((s.1.clone(), s.2), (s.3, s.4)))
        .collect())
}

/// Refuses a window that does not cover every day an interrupted rebuild deleted and did not finish (its rerun
/// must re-read those days' offsets, whatever window the operator types).
async fn unfinished_rebuild(
    client: &tokio_postgres::Client,
    pipeline: &Pipeline,
    opts: &RebuildOptions,
    oldest: Option<NaiveDate>,
) -> Result<()> {
    let day = &pipeline.fields[pipeline
        .identity
        .partition_by
        .expect("partition-by is checked before a rebuild starts")]
    .name;
    let pending = pending_table(pipeline);
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {pending} (LIKE {})",
        pipeline.ledger.table
    );
    if !crate::sink::privileges::table_exists(client, &pending.to_string()).await? {
        if !pipeline.postgres.manage_schema {
            return Err(Error::Schema(format!(
                "rebuild keeps the ledger rows it deleted in {pending}, which does not exist, and manage-schema = \
                 false creates nothing: as the ledger's owner run `{create}` and grant the runtime role SELECT, \
                 INSERT, UPDATE, DELETE on it"
            )));
        }
        client.batch_execute(&create).await?;
    }
    if let Some(oldest) = oldest {
        abandon_expired(client, &pending, day, oldest).await?;
    }
    let r = client
        .query_one(
            &format!("SELECT min({day}), max({day}), count(*) FROM {pending}"),
            &[],
        )
        .await?;
    let (lo, hi, n): (Option<NaiveDate>, Option<NaiveDate>, i64) = (r.get(0), r.get(1), r.get(2));
    if let (Some(lo), Some(hi)) = (lo, hi) {
        if lo < opts.from || hi > opts.to {
            return Err(usage(format!(
                "an interrupted rebuild deleted {n} ledger row(s) of event days {lo}..={hi} (kept in {pending}) \
                 and did not finish replaying them; rerun the rebuild with a window covering those days \
                 (--from {} --to {}) and a new --group-id",
                lo.min(opts.from),
                hi.max(opts.to)
            )));
        }
        tracing::warn!(
            rows = n,
            "an interrupted rebuild of {lo}..={hi} deleted ledger rows it did not replay; this rebuild re-reads \
             their offsets and reports them"
        );
    }
    Ok(())
}

/// The kept ledger rows of an interrupted rebuild ([`ledger::pending_table`]) of event days before `oldest`, the oldest
/// day the ledger horizon recognises: no rebuild may replay them any more (their records are quarantined as
/// beyond-horizon), so they are deleted, with a warning naming the days whose aggregates keep only what the
/// interrupted rebuild re-landed. What is left is what a rebuild from `oldest` on must cover.
///
/// # Errors
/// Database errors.
async fn abandon_expired(
    client: &tokio_postgres::Client,
    pending: &impl std::fmt::Display,
    day: &impl std::fmt::Display,
    oldest: NaiveDate,
) -> Result<()> {
    let r = client
        .query_one(
            &format!(
                "WITH d AS (DELETE FROM {pending} WHERE {day} < $1 RETURNING {day}) \
                 SELECT pg_catalog.min({day}), pg_catalog.max({day}), pg_catalog.count(*) FROM d"
            ),
            &[&oldest],
        )
        .await?;
    let (lo, hi, n): (Option<NaiveDate>, Option<NaiveDate>, i64) = (r.get(0), r.get(1), r.get(2));
    if let (Some(lo), Some(hi)) = (lo, hi) {
        tracing::warn!(
            rows = n,
            "an interrupted rebuild deleted ledger rows of event days {lo}..={hi} and did not replay them; those \
             days are now older than the ledger horizon (oldest {oldest}), so no rebuild can replay them: their \
             aggregate rows keep only what that rebuild re-landed (compare with `replaysafe verify`); the kept \
             rows are abandoned"
        );
    }
    Ok(())
}

/// A failed statement of the rebuild's delete transaction, naming the step and the table; a lock wait past
/// `postgres.lock-timeout-ms` (SQLSTATE 55P03, `lock_not_available`) says who is likely holding the rows.
/// Nothing of the transaction was committed, and the rebuild's group has no checkpoint yet: the same command
/// can be rerun.
fn step_error(step: &str, table: &str, e: &tokio_postgres::Error) -> Error {
    let cause = crate::model::describe(e);
    let why = if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        "a row or table lock was not granted within postgres.lock-timeout-ms: another transaction holds rows of the \
         window (a writer that was not paused, a long-running transaction or an open psql session); "
    } else {
        ""
    };
    Error::Other(format!(
        "rebuild stopped while {step} of {table}: {why}{cause}. Nothing was deleted (the transaction rolled \
         back); rerun the same rebuild command once that transaction has ended"
    ))
}

/// In one transaction: deletes the window from every aggregate and from the ledger, keeping the deleted ledger
/// rows in [`ledger::pending_table`] (once per key); rolls back when they came from offsets the plan does not cover (a
/// writer was not paused).
async fn delete_window(
    client: &mut tokio_postgres::Client,
    pipeline: &Pipeline,
    opts: &RebuildOptions,
    deletes: &[(String, String)],
    cover: &BTreeMap<(String, i32), (i64, i64)>,
) -> Result<()> {
    let day = pipeline
        .identity
        .partition_by
        .expect("partition-by is checked before a rebuild starts");
    let ledger = &pipeline.ledger.table;
    let pending = pending_table(pipeline);
    let same: Vec<String> = ledger::ledger_pk(pipeline)
        .iter()
        .map(|c| format!("k.{c} = d.{c}"))
        .collect();
    let tx = client.transaction().await?;
    // The window's deletes may run longer than a batch statement may: no statement timeout for this operator
    // command's transaction (lock waits stay bounded by the session's lock timeout).
    tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
    for (table, d) in deletes {
        let n = tx
            .execute(d.as_str(), &[&opts.from, &opts.to])
            .await
            .map_err(|e| step_error("zeroing the window's aggregate rows", table, &e))?;
        tracing::info!(rows = n, "{d}");
    }
    let n = tx
        .execute(
            &format!(
                "WITH d AS (DELETE FROM {ledger} WHERE {} BETWEEN $1 AND $2 RETURNING *) \
                 INSERT INTO {pending} SELECT * FROM d WHERE NOT EXISTS (SELECT 1 FROM {pending} k WHERE {})",
                pipeline.fields[day].name,
                same.join(" AND ")
            ),
            &[&opts.from, &opts.to],
        )
        .await
        .map_err(|e| step_error("deleting the window's ledger rows", &ledger.to_string(), &e))?;
    tracing::info!(
        rows = n,
        "ledger rows of {}..={} deleted",
        opts.from,
        opts.to
    );
    let q = format!(
        "SELECT topic, partition, min(\"offset\"), max(\"offset\") FROM {} p WHERE {} BETWEEN $1 AND $2 \
         GROUP BY 1, 2",
        ledger::ledger_rows_of(pipeline, &pending.to_string()),
        pipeline.fields[day].name
    );
    for r in tx.query(&q, &[&opts.from, &opts.to]).await? {
        let (t, p, lo, hi): (String, i32, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        if !cover
            .get(&(t.clone(), p))
            .is_some_and(|&(a, b)| a <= lo && hi <= b)
        {
            tx.rollback().await?;
            return Err(Error::Other(format!(
                "{t}/{p}: ledger rows of the window appeared at offsets {lo}..={hi} after the rebuild was planned — \
                 another writer is running; nothing was deleted"
            )));
        }
    }
    tx.commit().await?;
    Ok(())
}

/// After the replay: ledger rows per day before and after, and the deleted rows that did not come back.
async fn rebuild_check(
    client: &tokio_postgres::Client,
    pipeline: &Pipeline,
    opts: &RebuildOptions,
) -> Result<RebuildCheck> {
    let day = &pipeline.fields[pipeline
        .identity
        .partition_by
        .expect("partition-by is checked before a rebuild starts")]
    .name;
    let ledger = &pipeline.ledger.table;
    let removed = pending_table(pipeline);
    let mut check = RebuildCheck::default();
    for r in client
        .query(
            &format!("SELECT {day}::text, count(*) FROM {removed} WHERE {day} BETWEEN $1 AND $2 GROUP BY 1"),
            &[&opts.from, &opts.to],
        )
        .await?
    {
        check.per_day.entry(r.get(0)).or_default().before = crate::units::count(r.get::<_, i64>(1));
    }
    for r in client
        .query(
            &format!("SELECT {day}::text, count(*) FROM {ledger} WHERE {day} BETWEEN $1 AND $2 GROUP BY 1"),
            &[&opts.from, &opts.to],
        )
        .await?
    {
        check.per_day.entry(r.get(0)).or_default().after = crate::units::count(r.get::<_, i64>(1));
    }
    let pk = ledger::ledger_pk(pipeline);
    let same: Vec<String> = pk.iter().map(|c| format!("l.{c} = r.{c}")).collect();
    let key: Vec<String> = pk.iter().map(|c| format!("r.{c}::text")).collect();
    let gone = format!(
        // `l.day` bounded too: only the window's day partitions are read (the ledger's hash key serves no
        // column-by-column lookup; a ledger row of the same key has the same day).
        "FROM {} r WHERE r.{day} BETWEEN $1 AND $2 AND NOT EXISTS (SELECT 1 FROM {ledger} l \
         WHERE l.{day} BETWEEN $1 AND $2 AND {})",
        ledger::ledger_rows_of(pipeline, &removed.to_string()),
        same.join(" AND ")
    );
    check.missing_total = crate::units::count(
        client
            .query_one(&format!("SELECT count(*) {gone}"), &[&opts.from, &opts.to])
            .await?
            .get::<_, i64>(0),
    );
    let rows = client
        .query(
            &format!(
                "SELECT r.{day}::text, ARRAY[{}], r.topic, r.partition, r.\"offset\" {gone} \
                 ORDER BY 3, 4, 5 LIMIT {MISSING_LISTED}",
                key.join(", ")
            ),
            &[&opts.from, &opts.to],
        )
        .await?;
    check.missing = rows
        .iter()
        .map(|r| MissingRow {
            day: r.get(0),
            key: r.get(1),
            topic: r.get(2),
            partition: r.get(3),
            offset: r.get(4),
        })
        .collect();
    Ok(check)
}
