//! The periodic ledger prune of a running `run`: every interval, one prune ([`lifecycle::prune`]: partitions,
//! pruned offsets, tombstones, conflicts) in the background on its own connection (never two at once), bounded
//! by [`PRUNE_TIMEOUT`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Pipeline;
use crate::sink::lifecycle;

/// Longest a periodic prune may take (connecting, reading the expired partitions — about 2.5 s per million
/// rows —, waiting for locks, dropping) before it is abandoned and tried again at the next interval. Its lock
/// waits are bounded on their own ([`crate::sink::lifecycle::PRUNE_LOCK_TIMEOUT`]).
pub const PRUNE_TIMEOUT: Duration = Duration::from_secs(1800);

pub(crate) struct Pruner {
    interval: Option<Duration>,
    last: Instant,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Pruner {
    pub(crate) fn new(interval: Option<Duration>) -> Pruner {
        Pruner {
            interval,
            last: Instant::now(),
            task: None,
        }
    }

    pub(crate) fn tick(
        &mut self,
        rt: &tokio::runtime::Handle,
        p: &Arc<Pipeline>,
        url: &str,
        now: Instant,
    ) {
        let Some(interval) = self.interval else {
            return;
        };
        // Without DDL (manage-schema = false) the owner's `init` prunes; claims still refuse days past the horizon.
        if p.ledger.horizon_days.is_none()
            || !p.postgres.manage_schema
            || now.duration_since(self.last) < interval
            || self.task.as_ref().is_some_and(|t| !t.is_finished())
        {
            return;
        }
        self.last = now;
        let (p, url) = (p.clone(), url.to_string());
        self.task = Some(rt.spawn(async move {
            let work = async {
                let mut client = crate::sink::connect_with(&url, &p.postgres.timeouts).await?;
                lifecycle::prune(&mut client, &p, false).await
            };
            match tokio::time::timeout(PRUNE_TIMEOUT, work).await {
                Ok(Ok(r)) if !r.dropped.is_empty() => {
                    let dropped: Vec<_> = r.dropped.iter().map(|d| d.day).collect();
                    let pruned: Vec<_> = r
                        .offsets
                        .iter()
                        .map(|o| format!("{}/{} through {}", o.topic, o.partition, o.through))
                        .collect();
                    tracing::info!(
                        ?dropped,
                        ?pruned,
                        tombstones = ?r.tombstones,
                        conflicts = r.conflicts,
                        row_versions = r.row_versions,
                        "dropped ledger partitions older than the horizon; pruned offsets recorded"
                    )
                }
                Ok(Ok(_)) => tracing::debug!("ledger prune: nothing to drop"),
                Ok(Err(e)) => {
                    tracing::warn!("ledger prune failed, retried at the next interval: {e}")
                }
                Err(_) => tracing::warn!(
                    "ledger prune did not finish in {PRUNE_TIMEOUT:?}; retried at the next interval"
                ),
            }
        }));
    }
}
