//! The gauges of `/metrics` read from PostgreSQL (`run --metrics-addr`): the ledger's rows and bytes, the
//! horizon and the pruned-below day, the group's unresolved dead letters by reason. A background task on its own
//! connection every [`EVERY`], each round (connect and statements) bounded by [`BOUND`]; a failed round is logged
//! at debug (`/readyz`'s probe reports the database) and leaves the last values, which disappear from `/metrics`
//! after `metrics_http::GAUGE_IDLE` without a successful round. Catalog reads only: no lock on the ledger, no scan
//! of it (its row count is PostgreSQL's estimate, `pg_class.reltuples`; `ledger stats` counts exactly).

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use crate::config::Pipeline;
use crate::decode::Reason;

/// Interval of the reads.
pub const EVERY: Duration = Duration::from_secs(15);
/// Bound of one round (connect and statements).
pub const BOUND: Duration = Duration::from_secs(5);

/// Registers the gauges at zero (each quarantine reason of `replaysafe_dead_letters`).
pub fn register() {
    for name in [
        "replaysafe_ledger_rows",
        "replaysafe_ledger_bytes",
        "replaysafe_horizon_timestamp_seconds",
        "replaysafe_pruned_below_timestamp_seconds",
    ] {
        metrics::gauge!(name).set(0.0);
    }
    for r in Reason::ALL {
        metrics::gauge!("replaysafe_dead_letters", "reason" => r.as_str()).set(0.0);
    }
}

/// `(rows, bytes)` of the ledger: `$1` the ledger's qualified name. Partitions are summed; a partitioned parent
/// counts no rows of its own (its `reltuples` after an `ANALYZE` would count its partitions' again).
const LEDGER_SQL: &str = "SELECT coalesce(pg_catalog.sum(CASE WHEN c.relkind = 'p' THEN 0 \
     ELSE greatest(c.reltuples, 0) END), 0)::float8, \
     coalesce(pg_catalog.sum(pg_catalog.pg_total_relation_size(c.oid)), 0)::float8 \
     FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass($1) \
     OR c.oid IN (SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = pg_catalog.to_regclass($1))";

/// The horizon's oldest claimable day and the pruned-below day, as Unix seconds (0: none): `$1` ledger, `$2`
/// `horizon-days` (NULL: no horizon) — the rule of [`crate::sink::ledger::horizon_statement`], without its lock.
fn horizon_sql(p: &Pipeline) -> String {
    format!(
        "WITH d AS (SELECT (pg_catalog.now() AT TIME ZONE 'UTC')::date AS today), \
         h AS (SELECT pruned_below FROM {} WHERE ledger = $1) \
         SELECT coalesce(EXTRACT(epoch FROM greatest((SELECT pruned_below FROM h), d.today - $2::int)), 0)::float8, \
         coalesce(EXTRACT(epoch FROM (SELECT pruned_below FROM h)), 0)::float8 FROM d",
        p.table(crate::sink::ledger::HORIZON)
    )
}

/// Unresolved dead letters of `$1` (the group) by reason.
fn dead_letters_sql(p: &Pipeline) -> String {
    format!(
        "SELECT reason, pg_catalog.count(*)::float8 FROM {} WHERE consumer_group = $1 AND resolved_at IS NULL \
         GROUP BY reason",
        p.table(crate::sink::dead_letters::DEAD_LETTERS)
    )
}

/// Starts the reads on `rt`; they run until the runtime stops.
pub fn spawn(rt: &tokio::runtime::Handle, pipeline: Arc<Pipeline>, url: String) {
    rt.spawn(async move {
        let mut client: Option<Client> = None;
        loop {
            match tokio::time::timeout(BOUND, round(&mut client, &url, &pipeline)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!("metrics from the database: {e}");
                    client = None;
                }
                Err(_) => {
                    tracing::debug!(
                        "metrics from the database: no answer within {} s",
                        BOUND.as_secs()
                    );
                    client = None;
                }
            }
            tokio::time::sleep(EVERY).await;
        }
    });
}

async fn round(client: &mut Option<Client>, url: &str, p: &Pipeline) -> Result<(), String> {
    if client.as_ref().is_none_or(Client::is_closed) {
        *client = Some(crate::sink::connect(url).await.map_err(|e| e.to_string())?);
    }
    let c = client.as_ref().expect("connected just above");
    let db = |e: tokio_postgres::Error| crate::model::describe(&e);
    let ledger = p.ledger.table.to_string();
    let row = c.query_one(LEDGER_SQL, &[&ledger]).await.map_err(db)?;
    metrics::gauge!("replaysafe_ledger_rows").set(row.get::<_, f64>(0));
    metrics::gauge!("replaysafe_ledger_bytes").set(row.get::<_, f64>(1));
    let days: Option<i32> = p.ledger.horizon_days.map(crate::units::int_days);
    let row = c
        .query_one(&horizon_sql(p), &[&ledger, &days])
        .await
        .map_err(db)?;
    metrics::gauge!("replaysafe_horizon_timestamp_seconds").set(row.get::<_, f64>(0));
    metrics::gauge!("replaysafe_pruned_below_timestamp_seconds").set(row.get::<_, f64>(1));
    let rows = c
        .query(&dead_letters_sql(p), &[&p.kafka.group_id])
        .await
        .map_err(db)?;
    let mut seen: Vec<(String, f64)> = Reason::ALL
        .iter()
        .map(|r| (r.as_str().to_string(), 0.0))
        .collect();
    for r in rows {
        let (reason, n): (String, f64) = (r.get(0), r.get(1));
        match seen.iter_mut().find(|(s, _)| *s == reason) {
            Some(entry) => entry.1 = n,
            None => seen.push((reason, n)),
        }
    }
    for (reason, n) in seen {
        metrics::gauge!("replaysafe_dead_letters", "reason" => reason).set(n);
    }
    Ok(())
}
