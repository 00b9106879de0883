//! The HTTP listener of `run --metrics-addr`: `/metrics` (Prometheus text of the `metrics` counters, rendered by
//! `metrics-exporter-prometheus`), `/healthz` and `/readyz` ([`crate::health`]: the rules and the reasons a
//! 503 gives). Plain HTTP/1.1 (hyper), one small response per request; any other path is 404.
//!
//! Metrics: `replaysafe_records_total{outcome="landed"|"duplicate"|"stale"|"filtered"|"quarantined", rule,
//! reason}`, `replaysafe_batches_total`, `replaysafe_db_retries_total`, `replaysafe_flush_seconds` (histogram,
//! seconds), `replaysafe_consumer_lag{topic, partition}` (gauge, records: the partition's high watermark minus
//! its checkpoint, the next offset to apply — [`crate::source::lag`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use crate::error::{Error, Result};

/// A gauge not set for this long disappears from `/metrics` (a revoked partition's lag).
pub const GAUGE_IDLE: Duration = Duration::from_secs(60);

/// Installs the Prometheus recorder and starts the HTTP listener on `addr` (`/metrics`, `/healthz`,
/// `/readyz`). Must be called inside a tokio runtime context; the listener runs until the runtime stops.
///
/// # Errors
/// [`Error::Other`] when the address cannot be bound (in use, not local) or a recorder is already installed.
pub fn install(addr: SocketAddr) -> Result<()> {
    crate::health::init();
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| Error::Other(format!("--metrics-addr {addr}: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Other(format!("--metrics-addr {addr}: {e}")))?;
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| Error::Other(format!("--metrics-addr {addr}: {e}")))?;
    let handle = PrometheusBuilder::new()
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE))
        .install_recorder()
        .map_err(|e| Error::Other(format!("metrics recorder: {e}")))?;
    // With `install_recorder` the upkeep (draining histogram samples) is ours to run.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
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
