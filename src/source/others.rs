//! `run --until-caught-up` in a consumer group: before a member exits 0, the partitions of the pipeline's topics
//! it does not hold must be caught up too — by their checkpoints in PostgreSQL. Another member may hold them, or
//! a member that was killed: Kafka's classic group protocol keeps a dead member's assignment until its
//! `session.timeout.ms` passes (Kafka documentation, "consumer configs": session.timeout.ms), so without this
//! look a member joining beside it could find its own partitions caught up and exit 0 with the dead member's
//! records unread (tests/it/break13.rs `relay_and_run_relay_killed_at_random_while_rows_arrive`, once in a loaded
//! run). The wait is bounded: past twice the session timeout (a dead member's partitions have been handed out by
//! then) the member exits, warning which partitions other members still have to read.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;

use crate::config::{Pipeline, StartPolicy};
use crate::engine::{lock, Shared, Tp};
use crate::error::Result;
use crate::sink::checkpoint::CHECKPOINTS;
use crate::source::kafka::{partitions, watermarks};

/// How often the partitions held elsewhere are looked at while waiting for them (ms between looks).
const EVERY: Duration = Duration::from_millis(500);

/// The group's checkpoints: `$1` consumer group, `$2` generation ('' for none); rows `(topic, partition,
/// next_offset)` — the next offset to read of each partition that has one.
pub fn checkpoints_statement(p: &Pipeline) -> String {
    format!(
        "SELECT topic, partition, next_offset FROM {} WHERE consumer_group = $1 AND generation = $2 \
         AND next_offset IS NOT NULL",
        p.table(CHECKPOINTS)
    )
}

/// The wait for partitions held elsewhere (one per group source).
#[derive(Debug, Default)]
pub struct Others {
    /// When this member's own partitions were first found caught up in the current wait.
    since: Option<Instant>,
    /// When the partitions held elsewhere were last looked at.
    last: Option<Instant>,
    /// Whether the wait was logged.
    told: bool,
}

impl Others {
    /// This member's own partitions are not caught up (any more): a later wait starts afresh.
    pub fn reset(&mut self) {
        *self = Others::default();
    }

    /// Whether every partition of the pipeline's topics that this member does not hold is caught up (its
    /// checkpoint at its high watermark, or nothing to read: low = high), or the wait has lasted twice
    /// `session`. Looks at most every [`EVERY`]; a failed look (broker, database) counts as not caught up
    /// (within the same bound).
    pub fn caught_up(&mut self, core: &Shared, side: &BaseConsumer, session: Duration) -> bool {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if self.last.is_some_and(|l| now.duration_since(l) < EVERY) {
            return false;
        }
        self.last = Some(now);
        let behind = match behind(core, side) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("looking at the partitions other members hold: {e}");
                return now.duration_since(since) >= session * 2;
            }
        };
        if behind.is_empty() {
            return true;
        }
        let shown: Vec<String> = behind
            .iter()
            .take(8)
            .map(|(t, p, d)| format!("{t}/{p} {d}"))
            .collect();
        if now.duration_since(since) >= session * 2 {
            tracing::warn!(
                waited_ms = crate::units::ms(now.duration_since(since)),
                behind = behind.len(),
                "this member's partitions are caught up, partitions held by other members are not ({}): \
                 exiting; their members read them",
                shown.join(", ")
            );
            return true;
        }
        if !self.told {
            self.told = true;
            tracing::info!(
                behind = behind.len(),
                limit_ms = crate::units::ms(session * 2),
                "this member's partitions are caught up; waiting for the partitions held by other members (or by a \
                 member that stopped and has not expired: session.timeout.ms) to be caught up too ({})",
                shown.join(", ")
            );
        }
        false
    }
}

/// The partitions of the pipeline's topics not held here whose checkpoint is before their high watermark (or
/// that have none and records, unless `start = "latest"`): `(topic, partition, "checkpoint N < high H")`.
fn behind(core: &Shared, side: &BaseConsumer) -> Result<Vec<(String, i32, String)>> {
    let (p, mine) = {
        let c = lock(core);
        (
            c.pipeline.clone(),
            c.parts.keys().cloned().collect::<HashSet<Tp>>(),
        )
    };
    let others: Vec<Tp> = partitions(side, &p.kafka.topics)?
        .into_iter()
        .filter(|tp| !mine.contains(tp))
        .collect();
    if others.is_empty() {
        return Ok(Vec::new());
    }
    let checkpoints = checkpoints(core, &p)?;
    let mut out = Vec::new();
    for (topic, partition) in others {
        let (low, high) = watermarks(side, &topic, partition, Duration::from_secs(10))?;
        let at = checkpoints.get(&(topic.clone(), partition)).copied();
        // Never read under `start = "latest"`: whoever takes it starts at its end — nothing is behind.
        let unread_latest = at.is_none() && p.kafka.start == Some(StartPolicy::Latest);
        if high > low && !unread_latest && at.is_none_or(|n| n < high) {
            let at = at.map_or("none".to_string(), |n| n.to_string());
            out.push((topic, partition, format!("checkpoint {at} < high {high}")));
        }
    }
    Ok(out)
}

/// The group's checkpoints by partition, read on the engine's first connection (no flush is in flight when
/// the group source asks: its own partitions are caught up).
fn checkpoints(core: &Shared, p: &Pipeline) -> Result<HashMap<Tp, i64>> {
    let mut c = lock(core);
    if c.in_flight() {
        return Err(crate::error::Error::Other("a flush is in flight".into()));
    }
    let rt = c.runtime();
    let generation = p.identity.generation.clone().unwrap_or_default();
    let client = c.sink().client();
    let rows =
        rt.block_on(client.query(&checkpoints_statement(p), &[&p.kafka.group_id, &generation]))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                (r.get::<_, String>(0), r.get::<_, i32>(1)),
                r.get::<_, i64>(2),
            )
        })
        .collect())
}
