//! The `replaysafe_consumer_lag{topic, partition}` gauge of `run`: per held partition, in records, the
//! broker's high watermark minus the partition's checkpoint (the next offset to apply; the assigned start
//! before the first batch) — what is in Kafka and not yet in PostgreSQL, buffered records included.
//!
//! A background thread updates it every [`EVERY`] with one `ListOffsets` request per held partition on the
//! group-less side client (each bounded by [`WATERMARK_TIMEOUT`]; a partition whose watermark does not come
//! keeps its last value). A partition no longer held (revoked, fenced) is set to 0 at the next update and
//! disappears from `/metrics` after `metrics_http::GAUGE_IDLE`. With `read_committed` (librdkafka's
//! default) the high watermark includes records of open transactions and the final transaction marker; the
//! checkpoint steps over a trailing marker once the partition is idle, so an idle, applied partition reads 0.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::engine::{Core, Tp};

/// Interval of the gauge's update.
pub const EVERY: Duration = Duration::from_secs(5);
/// Bound of one partition's watermark request.
pub const WATERMARK_TIMEOUT: Duration = Duration::from_secs(2);

/// The running updater; dropping it stops the thread (within 100 ms, or after the request under way).
pub struct Lag {
    stop: Arc<AtomicBool>,
}

impl Drop for Lag {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts the updater over the engine's state (`core`, held weakly) and the side client.
pub fn spawn(core: Weak<Mutex<Core>>, side: Arc<BaseConsumer>) -> Lag {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut shown: BTreeSet<Tp> = BTreeSet::new();
        let mut next_at = Instant::now();
        while !flag.load(Ordering::Relaxed) {
            if Instant::now() >= next_at {
                let Some(core) = core.upgrade() else { return };
                let held = checkpoints(&core);
                drop(core);
                shown = update(&side, &held, &shown);
                next_at = Instant::now() + EVERY;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    Lag { stop }
}

/// Each held partition with its next offset to apply.
fn checkpoints(core: &Mutex<Core>) -> Vec<(Tp, i64)> {
    let core = core
        .lock()
        .expect("engine state: a thread panicked holding this lock");
    core.parts
        .iter()
        .map(|(tp, st)| (tp.clone(), st.next.unwrap_or(st.start)))
        .collect()
}

/// Sets the gauge of every held partition and zeroes those shown before and no longer held; returns the
/// partitions shown now.
fn update(side: &BaseConsumer, held: &[(Tp, i64)], shown: &BTreeSet<Tp>) -> BTreeSet<Tp> {
    let now: BTreeSet<Tp> = held.iter().map(|(tp, _)| tp.clone()).collect();
    for tp in shown.difference(&now) {
        gauge(tp, 0);
    }
    for ((topic, partition), next) in held {
        match side.fetch_watermarks(topic, *partition, WATERMARK_TIMEOUT) {
            Ok((_, high)) => gauge(&(topic.clone(), *partition), (high - next).max(0)),
            Err(e) => tracing::debug!(%topic, partition, "lag: watermarks: {e}"),
        }
    }
    now
}

fn gauge(tp: &Tp, lag: i64) {
    metrics::gauge!("replaysafe_consumer_lag", "topic" => tp.0.clone(), "partition" => tp.1.to_string())
        .set(lag as f64);
}
