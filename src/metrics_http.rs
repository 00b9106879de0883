//! Prometheus exposition of the `metrics` counters (`metrics-exporter-prometheus`).
//!
//! Metrics: `replaysafe_records_total{outcome="landed"|"duplicate"|"filtered"|"quarantined", rule, reason}`,
//! `replaysafe_batches_total`, `replaysafe_db_retries_total`, `replaysafe_flush_seconds` (histogram, seconds).

use std::net::SocketAddr;

use crate::error::{Error, Result};

/// Starts the HTTP listener serving `/metrics` on `addr`. Must be called inside a tokio runtime context.
///
/// # Errors
/// [`Error::Other`] when the exporter cannot be installed (address in use, recorder already set).
pub fn install(addr: SocketAddr) -> Result<()> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| Error::Other(format!("metrics exporter on {addr}: {e}")))
}
