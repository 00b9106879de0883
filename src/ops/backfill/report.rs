//! The backfill report (`-o report.json`; read by `verify diff --expect`) and what fills it while the engine
//! runs: per-day outcome counts of every committed batch, progress.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use crate::engine::{Observer, PartState, Tp};
use crate::ops::backfill::options::PartitionPlan;
use std::str::FromStr;

use bigdecimal::BigDecimal;

use crate::config::Pipeline;
use crate::model::{Batch, Item, Outcome, Pending, Tally};
use crate::projection::ProjectionKind;

/// Per-day outcome counts of a backfill.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DayCounts {
    /// Newly claimed and projected.
    pub landed: u64,
    /// Already in the ledger, or a row projection already holds that state.
    pub duplicate: u64,
    /// Claimed, but a row projection holds a newer version (or the same version with another state); counters,
    /// sums and the outbox saw it as a landed record.
    #[serde(default)]
    pub stale: u64,
    /// Dropped by `--filter` or a pipeline filter rule.
    pub filtered: u64,
    /// Dead-lettered.
    pub quarantined: u64,
    /// Per `sum` projection column (`schema.table.column`): what the landed and stale records added to it
    /// (decimal text; records its `filter` skips add nothing), for `verify diff`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sums: BTreeMap<String, String>,
}

/// The backfill report (`-o report.json`; read by `verify diff --expect`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The backfill group id.
    pub group_id: String,
    /// The pipeline's production group.
    pub pipeline_group: String,
    /// Window start (RFC 3339).
    pub from: String,
    /// How the stop offsets were chosen.
    pub stop: String,
    /// The `--filter` expression.
    pub filter: Option<String>,
    /// Exact start/stop offsets used.
    pub partitions: Vec<PartitionPlan>,
    /// Retention findings and actions.
    pub retention: Vec<String>,
    /// Per partition-by day (`YYYY-MM-DD`, or `unknown` for undecodable records): the outcomes of the records
    /// this session consumed — the same records as `accounting` and `partitions` ([`COUNTS_COVER`]).
    pub per_day: BTreeMap<String, DayCounts>,
    /// What `per_day`, `accounting` and `partitions` cover: [`COUNTS_COVER`].
    #[serde(default)]
    pub counts: String,
    /// The accounting line of this session.
    pub accounting: String,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// The pipeline's fingerprint (`crate::ops::fingerprint::pipeline_fingerprint`), checked by `verify diff`
    /// against its snapshot's; absent in reports of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
    /// `--to TIME` only: partitions where records after the stop offset carry a timestamp inside the window
    /// (out-of-order timestamps); they were not applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub past_the_stop: Vec<PastTheStop>,
    /// Rebuild only: the window's ledger rows per day before and after, and the rows that did not come back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild: Option<RebuildCheck>,
}

/// Records after a partition's `--to TIME` stop whose timestamps lie in `[--from, --to)`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PastTheStop {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset read past the stop (the stop offset).
    pub scanned_from: i64,
    /// End of the scan (exclusive).
    pub scanned_to: i64,
    /// Records in the scanned range with a timestamp inside the window (not applied).
    pub earlier: u64,
}

/// Ledger rows of a rebuild's window of event days.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RebuildCheck {
    /// Per event day (`YYYY-MM-DD`): ledger rows before the rebuild deleted them, and after the replay.
    pub per_day: BTreeMap<String, LedgerRows>,
    /// Ledger rows of the window that the replay did not bring back (first [`MISSING_LISTED`]).
    pub missing: Vec<MissingRow>,
    /// How many ledger rows of the window did not come back.
    pub missing_total: u64,
}

/// Ledger rows of one day.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LedgerRows {
    /// Rows before the rebuild.
    pub before: u64,
    /// Rows after the replay.
    pub after: u64,
}

/// A ledger row deleted by a rebuild that the replay did not claim again.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MissingRow {
    /// Event day.
    pub day: String,
    /// The delivery key (generation first), as stored.
    pub key: Vec<String>,
    /// Where it had come from.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// The report's `counts` label: a resumed backfill reports the session that ran, from where each partition
/// resumed (`start_from = "checkpoint"`) to its stop; earlier sessions' records are in the ledger, not counted
/// again.
pub const COUNTS_COVER: &str =
    "this session: per_day, accounting and partitions cover the offsets this run read \
    (a partition resumed at its checkpoint starts there, start_from = checkpoint)";

/// What this session committed, shared with the observer: per partition the next offset after its last
/// committed batch, and the outcomes.
#[derive(Default)]
pub struct Committed {
    /// Per partition, the end of the last committed batch.
    pub reached: BTreeMap<Tp, i64>,
    /// The outcomes of the committed batches.
    pub tally: Tally,
}

/// [`Committed`], shared.
pub type Reached = Arc<Mutex<Committed>>;

/// Moves each partition's `start_offset` to where this session starts (`starts`, from the assign source) when it
/// resumed at a checkpoint inside the window (`start_from` becomes `checkpoint`), so that the report's offsets,
/// per-day counts and accounting line cover the same records.
pub fn resumed_at(partitions: &mut [PartitionPlan], starts: &[(Tp, i64)]) {
    for p in partitions.iter_mut() {
        let tp = (p.topic.clone(), p.partition);
        if let Some((_, s)) = starts.iter().find(|(t, _)| *t == tp) {
            if *s > p.start_offset {
                p.start_offset = (*s).min(p.stop_offset);
                p.start_from = "checkpoint".to_string();
            }
        }
    }
}

/// The summary of a backfill that stopped before its end (`how`: interrupted by SIGINT/SIGTERM, or stopped by an
/// error): what this session applied (its accounting, from the committed batches) and, per partition, where it
/// stopped and what is left.
pub fn stopped(how: &str, partitions: &[PartitionPlan], committed: &Reached) -> String {
    let committed = committed
        .lock()
        .expect("committed offsets: a thread panicked holding this lock");
    let (reached, tally) = (&committed.reached, &committed.tally);
    let mut left = 0;
    let parts: Vec<String> = partitions
        .iter()
        .map(|p| {
            let tp = (p.topic.clone(), p.partition);
            let at = reached
                .get(&tp)
                .copied()
                .unwrap_or(p.start_offset)
                .max(p.start_offset);
            left += (p.stop_offset - at).max(0);
            format!(
                "{}/{} at {at}: {} left",
                p.topic,
                p.partition,
                (p.stop_offset - at).max(0)
            )
        })
        .collect();
    format!(
        "backfill {how}: this session {}; {left} records of the window left ({}); what was applied stays \
         (checkpoints): rerun the same command to resume",
        tally.line(),
        parts.join(", "),
    )
}

/// How many missing rows a rebuild report lists by name.
pub const MISSING_LISTED: usize = 100;

impl Report {
    /// Rebuild only: `Some(message)` when a day of the window ends with fewer ledger rows than it had, naming
    /// the days and the first rows that did not come back.
    pub fn rebuild_shortfall(&self) -> Option<String> {
        let check = self.rebuild.as_ref()?;
        let short: Vec<String> = check
            .per_day
            .iter()
            .filter(|(_, r)| r.after < r.before)
            .map(|(d, r)| format!("{d}: {} before, {} after", r.before, r.after))
            .collect();
        if short.is_empty() && check.missing_total == 0 {
            return None;
        }
        let named: Vec<String> = check
            .missing
            .iter()
            .take(10)
            .map(|m| {
                format!(
                    "{} key {} from {}/{} offset {}",
                    m.day,
                    m.key.join("|"),
                    m.topic,
                    m.partition,
                    m.offset
                )
            })
            .collect();
        Some(format!(
            "the rebuild did not bring back {} ledger row(s) of the window ({}); first: {}; see `rebuild.missing` \
             in the report and the per-day filtered/quarantined counts",
            check.missing_total,
            if short.is_empty() { "no day ended short".to_string() } else { short.join(", ") },
            named.join(", ")
        ))
    }
}

/// Per-day counts shared between the engine's observer and the report (`None`: the day is unknown).
pub type PerDay = Arc<Mutex<BTreeMap<Option<NaiveDate>, DayCounts>>>;

/// The report's per-day section: `YYYY-MM-DD`, or `unknown` for records without a day.
pub fn per_day_report(per_day: &PerDay) -> BTreeMap<String, DayCounts> {
    let counts = std::mem::take(
        &mut *per_day
            .lock()
            .expect("per-day counts: a thread panicked holding this lock"),
    );
    counts
        .into_iter()
        .map(|(d, c)| {
            (
                d.map_or_else(|| "unknown".to_string(), |d| d.to_string()),
                c,
            )
        })
        .collect()
}

/// The backfill's [`Observer`]: counts each committed record under its partition-by day, advances the progress
/// bar, and logs progress every 5 s when there is no bar.
pub struct Progress {
    per_day: PerDay,
    sums: Vec<SumTarget>,
    reached: Reached,
    plans: Vec<PartitionPlan>,
    total: i64,
    bar: indicatif::ProgressBar,
    show_bar: bool,
    started: Instant,
    last_log: Instant,
}

impl Progress {
    /// Progress over `plans` (a bar when `show_bar`), counting into `per_day`, each partition's committed end
    /// into `reached`.
    pub fn new(
        plans: &[PartitionPlan],
        show_bar: bool,
        per_day: PerDay,
        reached: Reached,
    ) -> Progress {
        let total: i64 = plans.iter().map(|p| p.stop_offset - p.start_offset).sum();
        let bar = if show_bar {
            let b = indicatif::ProgressBar::new(crate::units::count(total));
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} records  {per_sec}  ETA {eta}  {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        } else {
            indicatif::ProgressBar::hidden()
        };
        Progress {
            per_day,
            sums: Vec::new(),
            reached,
            plans: plans.to_vec(),
            total,
            bar,
            show_bar,
            started: Instant::now(),
            last_log: Instant::now(),
        }
    }
}

/// A `sum` projection column whose additions the report counts per day.
struct SumTarget {
    /// `schema.table.column`.
    name: String,
    /// The field it adds.
    field: usize,
    /// The projection's pass column (its `filter`), if any.
    pass: Option<usize>,
}

impl Progress {
    /// Also adds up, per day, what the landed records added to each `sum` projection column of `p`
    /// ([`DayCounts::sums`]).
    pub fn with_sums(mut self, p: &Pipeline) -> Progress {
        for x in p
            .projections
            .iter()
            .filter(|x| x.kind == ProjectionKind::Sum)
        {
            let Some(agg) = &x.aggregate else { continue };
            for (col, field) in agg.values.iter().zip(&agg.value_fields) {
                if let Some(field) = *field {
                    self.sums.push(SumTarget {
                        name: format!(
                            "{}.{}.{}",
                            agg.table.schema.as_str(),
                            agg.table.name.as_str(),
                            col.as_str()
                        ),
                        field,
                        pass: x.pass_column,
                    });
                }
            }
        }
        self
    }

    /// Adds what one landed (or stale) item added to each sum column into `c`.
    fn add_sums(&self, item: &Item, c: &mut DayCounts) {
        let Pending::Claim { fields, passes, .. } = &item.pending else {
            return;
        };
        for t in &self.sums {
            if t.pass
                .is_some_and(|i| !passes.get(i).copied().unwrap_or(false))
            {
                continue;
            }
            let Some(v) = fields.get(t.field).and_then(Option::as_ref) else {
                continue;
            };
            let Ok(v) = BigDecimal::from_str(&v.text) else {
                continue;
            };
            let e = c.sums.entry(t.name.clone()).or_insert_with(|| "0".into());
            let total = BigDecimal::from_str(e).unwrap_or_default() + v;
            *e = total.normalized().to_plain_string();
        }
    }
}

impl Observer for Progress {
    fn committed(&mut self, batch: &Batch, days: &[Option<NaiveDate>], outcomes: &[Outcome]) {
        let mut per_day = self
            .per_day
            .lock()
            .expect("per-day counts: a thread panicked holding this lock");
        for (i, o) in outcomes.iter().enumerate() {
            let c = per_day.entry(days.get(i).copied().flatten()).or_default();
            // A stale record reached the sums like a landed one (only the row projections judged it).
            let added = matches!(o, Outcome::Landed | Outcome::Stale { .. });
            if added && !self.sums.is_empty() {
                if let Some(item) = batch.items.get(i) {
                    self.add_sums(item, c);
                }
            }
            match o {
                Outcome::Landed => c.landed += 1,
                Outcome::Duplicate => c.duplicate += 1,
                Outcome::Stale { .. } => c.stale += 1,
                Outcome::Filtered(_) => c.filtered += 1,
                Outcome::Quarantined(_) => c.quarantined += 1,
            }
        }
        let from = batch.expected.unwrap_or(batch.end);
        self.bar.inc(crate::units::count(batch.end - from));
        let tp = (batch.topic.clone(), batch.partition);
        let mut committed = self
            .reached
            .lock()
            .expect("committed offsets: a thread panicked holding this lock");
        committed.reached.insert(tp, batch.end);
        for o in outcomes {
            committed.tally.add(o);
        }
    }

    fn tick(&mut self, parts: &BTreeMap<Tp, PartState>, _tally: &Tally) {
        if self.show_bar || self.last_log.elapsed() < Duration::from_secs(5) {
            return;
        }
        self.last_log = Instant::now();
        let next = |p: &PartitionPlan| {
            parts
                .get(&(p.topic.clone(), p.partition))
                .and_then(|s| s.next)
                .unwrap_or(p.start_offset)
        };
        let done: i64 = self.plans.iter().map(|p| next(p) - p.start_offset).sum();
        let rate = done as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        let eta = if rate > 0.0 {
            (self.total - done) as f64 / rate
        } else {
            f64::INFINITY
        };
        let remaining: Vec<String> = self
            .plans
            .iter()
            .filter(|p| next(p) < p.stop_offset)
            .map(|p| {
                format!(
                    "{}/{}: {} left",
                    p.topic,
                    p.partition,
                    p.stop_offset - next(p)
                )
            })
            .collect();
        tracing::info!(
            "backfill {done}/{} records, {rate:.0}/s, ETA {eta:.0} s; {}",
            self.total,
            remaining.join(", ")
        );
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}
