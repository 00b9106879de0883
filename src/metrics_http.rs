//! The HTTP listener of `run --metrics-addr`: `/metrics` (Prometheus text of the `metrics` counters, rendered by
//! `metrics-exporter-prometheus`), `/healthz` and `/readyz` ([`crate::health`]: the rules and the reasons a
//! 503 gives). Plain HTTP/1.1 (hyper), one small response per request; any other path is 404.
//!
//! The series, their types and labels are the table of docs/operations.md "Metrics and health" (a test parses it
//! and scrapes an idle instance): every series is registered at zero on start ([`register`]) with the labels known
//! then, so an idle or restarted instance serves them all; `replaysafe_flush_seconds` is a histogram with
//! [`FLUSH_BUCKETS`] (without buckets the exporter would render a summary). Every family is described
//! ([`FAMILIES`], the `# HELP` line) and carries the global labels `pipeline` and `group` ([`install`]); names
//! follow Prometheus's naming doc (<https://prometheus.io/docs/practices/naming/>): base units (`_seconds`,
//! `_bytes`), `_total` on counters, `_timestamp_seconds` for points in time.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use crate::config::{Format, Pipeline};
use crate::decode::Reason;
use crate::error::{Error, Result};

/// The flush histogram's name: seconds from a flush's start to its settle (every batch of the flush applied).
pub const FLUSH_SECONDS: &str = "replaysafe_flush_seconds";

/// Upper bounds (seconds) of the `replaysafe_flush_seconds` buckets: 5 ms to 60 s (a flush waits out lock and
/// statement timeouts of 30 s by default), `+Inf` beyond.
pub const FLUSH_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The filtered rules the Debezium decoder applies by itself (`rule` label).
const CDC_RULES: [&str; 4] = [
    "cdc-kafka-tombstone",
    "cdc-transaction-metadata",
    "cdc-heartbeat",
    "cdc-message",
];

/// The kind of a metric family (its `# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic count (`_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Buckets, sum and count of observations.
    Histogram,
}

/// Every family `/metrics` serves: name, kind, the `# HELP` text. The one list of names: the docs' table, the
/// dashboard's queries and [`register`] agree with it (tests).
pub const FAMILIES: &[(&str, Kind, &str)] = &[
    ("replaysafe_records_total", Kind::Counter, "Consumed records by outcome (landed, duplicate, stale, filtered by rule, quarantined by reason)."),
    ("replaysafe_batches_total", Kind::Counter, "Batches committed."),
    ("replaysafe_db_retries_total", Kind::Counter, "Database attempts retried, by SQLSTATE (connection when the server sent none)."),
    (FLUSH_SECONDS, Kind::Histogram, "Seconds from a flush's start until every batch of it is applied."),
    ("replaysafe_conflicts_total", Kind::Counter, "Changes that claimed a stored version with another row state, by projection (rows of replaysafe_conflicts)."),
    ("replaysafe_resnapshot_reads_total", Kind::Counter, "Snapshot reads of a row already stored in that state, by projection."),
    ("replaysafe_takeover_deferrals_total", Kind::Counter, "Take-overs that found the checkpoint row locked and were deferred."),
    ("replaysafe_checkpoint_rewinds_total", Kind::Counter, "Checkpoints found moved under our own fence (commits lost by a failover), read again."),
    ("replaysafe_fenced_batches_total", Kind::Counter, "Batches rolled back because another owner's fence was on the checkpoint."),
    ("replaysafe_consumer_lag", Kind::Gauge, "Records in Kafka not yet applied, per held partition: high watermark minus the checkpoint."),
    ("replaysafe_outbox_published_total", Kind::Counter, "Outbox rows this process's relay published."),
    ("replaysafe_outbox_pending", Kind::Gauge, "Unpublished rows of the relayed outbox."),
    ("replaysafe_outbox_oldest_pending_seconds", Kind::Gauge, "Age in seconds of the oldest unpublished outbox row; 0 when none."),
    ("replaysafe_transactions_applied_total", Kind::Counter, "Source transactions applied in one batch transaction."),
    ("replaysafe_transactions_incomplete_total", Kind::Counter, "Source transactions applied without their END or some changes, by reason."),
    ("replaysafe_transactions_open", Kind::Gauge, "Source transactions buffered, not yet applied."),
    ("replaysafe_transaction_buffer_bytes", Kind::Gauge, "Bytes (keys and values) of source-transaction changes buffered, not yet applied."),
    ("replaysafe_registry_retries_total", Kind::Counter, "Schema-registry requests retried."),
    ("replaysafe_ledger_rows", Kind::Gauge, "Rows of the ledger (PostgreSQL's estimate pg_class.reltuples, refreshed by ANALYZE and autovacuum)."),
    ("replaysafe_ledger_bytes", Kind::Gauge, "Bytes on disk of the ledger, its partitions and indexes (pg_total_relation_size)."),
    ("replaysafe_horizon_timestamp_seconds", Kind::Gauge, "The oldest event day a claim may land (midnight UTC, Unix seconds); 0 without a horizon."),
    ("replaysafe_pruned_below_timestamp_seconds", Kind::Gauge, "The ledger's pruned-below day (midnight UTC, Unix seconds); 0 when nothing was pruned."),
    ("replaysafe_dead_letters", Kind::Gauge, "Unresolved dead letters of this consumer group, by reason."),
];

/// Describes every family of [`FAMILIES`] (their `# HELP` lines). Call after [`install`].
pub fn describe() {
    for &(name, kind, help) in FAMILIES {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => metrics::describe_histogram!(name, help),
        }
    }
}

/// Registers every series at zero with the labels known on start: each outcome, each `[[filter]]` rule (and
/// the Debezium decoder's own), each quarantine reason, each row projection; the flush histogram empty. The
/// lag gauge (`topic`, `partition`) appears per partition once held ([`crate::source::lag`]). Call after
/// [`install`]; without a recorder it does nothing.
pub fn register(p: &Pipeline) {
    for outcome in ["landed", "duplicate", "stale"] {
        metrics::counter!("replaysafe_records_total", "outcome" => outcome).absolute(0);
    }
    let mut rules: Vec<String> = p.filters.iter().map(|f| f.name.clone()).collect();
    if p.format == Format::Debezium {
        rules.extend(CDC_RULES.iter().map(|r| r.to_string()));
    }
    for rule in rules {
        metrics::counter!("replaysafe_records_total", "outcome" => "filtered", "rule" => rule)
            .absolute(0);
    }
    for r in Reason::ALL {
        metrics::counter!("replaysafe_records_total", "outcome" => "quarantined", "reason" => r.as_str())
            .absolute(0);
    }
    describe();
    metrics::counter!("replaysafe_db_retries_total", "sqlstate" => "connection").absolute(0);
    for name in [
        "replaysafe_batches_total",
        "replaysafe_registry_retries_total",
        "replaysafe_takeover_deferrals_total",
        "replaysafe_checkpoint_rewinds_total",
    ] {
        metrics::counter!(name).absolute(0);
    }
    // Source transactions ([source] transactions = "atomic", src/engine/txbuf.rs); zero otherwise.
    metrics::counter!("replaysafe_transactions_applied_total").absolute(0);
    for reason in ["timeout", "memory"] {
        metrics::counter!("replaysafe_transactions_incomplete_total", "reason" => reason)
            .absolute(0);
    }
    metrics::gauge!("replaysafe_transaction_buffer_bytes").set(0.0);
    metrics::gauge!("replaysafe_transactions_open").set(0.0);
    crate::db_gauges::register();
    for proj in p.projections.iter().filter(|x| x.row.is_some()) {
        let name = proj.name.clone();
        metrics::counter!("replaysafe_conflicts_total", "projection" => name.clone()).absolute(0);
        metrics::counter!("replaysafe_resnapshot_reads_total", "projection" => name).absolute(0);
    }
    crate::ops::outbox::register_metrics();
    // Registered with no sample: `_bucket` lines at 0, `_sum` and `_count` 0.
    let _ = metrics::histogram!(FLUSH_SECONDS);
}

/// A gauge not set for this long disappears from `/metrics` (a revoked partition's lag).
pub const GAUGE_IDLE: Duration = Duration::from_secs(60);

/// The process-wide gauges that only change with what they count (an idle pipeline sets them no more): touched
/// (`+ 0`) by the upkeep so [`GAUGE_IDLE`] never removes them; their values are unchanged.
const KEPT_ALIVE: [&str; 4] = [
    "replaysafe_transactions_open",
    "replaysafe_transaction_buffer_bytes",
    "replaysafe_outbox_pending",
    "replaysafe_outbox_oldest_pending_seconds",
];

fn keep_alive() {
    for name in KEPT_ALIVE {
        metrics::gauge!(name).increment(0.0);
    }
}

/// The global labels of every series: `pipeline` (the pipeline file's name without its directory and
/// extension: `orders` for `conf/orders.toml`) and `group` (`[kafka] group-id`), so the series of several
/// processes scraped by one Prometheus stay apart.
pub fn labels(p: &Pipeline) -> Vec<(&'static str, String)> {
    let path = std::path::Path::new(&p.source.path);
    let name = path.file_stem().map_or_else(
        || p.source.path.clone(),
        |s| s.to_string_lossy().into_owned(),
    );
    vec![("pipeline", name), ("group", p.kafka.group_id.clone())]
}

/// Installs the Prometheus recorder with the global `labels` ([`labels`]) and starts the HTTP listener on
/// `addr` (`/metrics`, `/healthz`, `/readyz`). Must be called inside a tokio runtime context; the listener runs
/// until the runtime stops.
///
/// # Errors
/// [`Error::Other`] when the address cannot be bound (in use, not local) or a recorder is already installed.
pub fn install(addr: SocketAddr, labels: &[(&'static str, String)]) -> Result<()> {
    crate::health::init();
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| Error::Other(format!("--metrics-addr {addr}: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Other(format!("--metrics-addr {addr}: {e}")))?;
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| Error::Other(format!("--metrics-addr {addr}: {e}")))?;
    let builder = labels.iter().fold(PrometheusBuilder::new(), |b, (k, v)| {
        b.add_global_label(*k, v)
    });
    let handle = builder
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE))
        .set_buckets_for_metric(Matcher::Full(FLUSH_SECONDS.into()), FLUSH_BUCKETS)
        .map_err(|e| Error::Other(format!("metrics buckets: {e}")))?
        .install_recorder()
        .map_err(|e| Error::Other(format!("metrics recorder: {e}")))?;
    // With `install_recorder` the upkeep (draining histogram samples) is ours to run.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            keep_alive();
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(serve(listener, handle));
    Ok(())
}

async fn serve(listener: tokio::net::TcpListener, handle: PrometheusHandle) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("metrics listener: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let handle = handle.clone();
                async move { Ok::<_, Infallible>(respond(&req, &handle)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            // A client that stalls is dropped after a bound.
            let _ = tokio::time::timeout(Duration::from_secs(30), conn).await;
        });
    }
}

fn respond(req: &Request<Incoming>, handle: &PrometheusHandle) -> Response<Full<Bytes>> {
    let (status, body) = match req.uri().path() {
        "/metrics" => (StatusCode::OK, handle.render()),
        "/healthz" => verdict("not alive", crate::health::alive()),
        "/readyz" => verdict("not ready", crate::health::ready()),
        other => (
            StatusCode::NOT_FOUND,
            format!("no such path {other}: /metrics, /healthz, /readyz\n"),
        ),
    };
    let content_type = if status == StatusCode::OK && req.uri().path() == "/metrics" {
        "text/plain; version=0.0.4"
    } else {
        "text/plain; charset=utf-8"
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts")
}

fn verdict(no: &str, r: std::result::Result<String, String>) -> (StatusCode, String) {
    match r {
        Ok(text) => (StatusCode::OK, format!("{text}\n")),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{no}: {why}\n")),
    }
}
