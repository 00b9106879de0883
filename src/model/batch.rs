//! What a batch carries into the sink transaction (an [`Item`] per record with its [`Pending`] decision) and what
//! comes out (an [`Outcome`] per record, counted in a [`Tally`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::decode::{Fields, Reason, Rejection};

/// What the decode/filter stage decided for a record before the transaction.
#[derive(Debug, Clone)]
pub enum Pending {
    /// Claim the delivery key; `passes` are the projection filter results (pass-column order).
    Claim {
        /// Decoded fields.
        fields: Fields,
        /// Projection filter results.
        passes: Vec<bool>,
        /// Debezium pipelines: the row change.
        change: Option<Arc<crate::decode::debezium::Change>>,
        /// Per projection: whether its `delete-if` matched (JSON row projections; empty when none has one).
        deletes: Vec<bool>,
    },
    /// Dropped by the named `[[filter]]` rule.
    Filtered(String),
    /// Goes to the dead-letter table.
    Quarantine(Rejection),
}

/// One consumed record with its decision.
#[derive(Debug, Clone)]
pub struct Item {
    /// Kafka offset of the record.
    pub offset: i64,
    /// Record timestamp, ms since the Unix epoch (CreateTime or LogAppendTime), if any.
    pub timestamp_ms: Option<i64>,
    /// Raw key bytes.
    pub key: Option<Vec<u8>>,
    /// Raw value bytes (kept for dead letters).
    pub value: Option<Vec<u8>>,
    /// The decision.
    pub pending: Pending,
}

impl Item {
    /// Bytes of the record's key and value as consumed: what `batch.max-bytes` counts.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.value.as_ref().map_or(0, Vec::len)
    }
}

/// A batch of one partition: offsets ascending, applied in one transaction.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The fence epoch this owner acquired for the partition.
    pub fence: i64,
    /// The checkpoint this batch starts from (next offset to read), `None` when the partition has none yet.
    pub expected: Option<i64>,
    /// The checkpoint after this batch: last offset + 1.
    pub end: i64,
    /// The records.
    pub items: Vec<Item>,
}

/// Where one record ended up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Newly claimed: every projection saw it.
    Landed,
    /// Its delivery key was already in the ledger (or earlier in the same batch), or a row projection already
    /// holds the same state at the same version (or, for a snapshot read, at any version).
    Duplicate,
    /// Claimed, but every row projection it reached holds a newer version (or tombstone) of the entity, or the
    /// same version with another state (`conflict`: recorded in `replaysafe_conflicts`). The row projections'
    /// verdict only: every other projection (counter, sum, outbox, sql) saw it as a landed record.
    Stale {
        /// Equal version, different state.
        conflict: bool,
    },
    /// Dropped by the named filter rule.
    Filtered(String),
    /// Written to the dead-letter table.
    Quarantined(Reason),
}

/// Counts of outcomes; they always add up to the records consumed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Records newly applied.
    pub landed: u64,
    /// Records whose delivery key was already claimed.
    pub duplicate: u64,
    /// Records older than the stored row version (including conflicts); the other projections saw them.
    pub stale: u64,
    /// Of `stale`: equal version, different state.
    pub conflicts: u64,
    /// Records dropped, by rule name.
    pub filtered: BTreeMap<String, u64>,
    /// Records quarantined, by reason.
    pub quarantined: BTreeMap<&'static str, u64>,
    /// Records consumed but not applied when the run stopped (`[source] transactions = "atomic"`: changes of
    /// source transactions still open, and records after them): the checkpoints stay before them and the next
    /// run reads them again.
    pub buffered: u64,
}

impl Tally {
    /// Adds one outcome.
    pub fn add(&mut self, o: &Outcome) {
        match o {
            Outcome::Landed => self.landed += 1,
            Outcome::Duplicate => self.duplicate += 1,
            Outcome::Stale { conflict } => {
                self.stale += 1;
                if *conflict {
                    self.conflicts += 1;
                }
            }
            Outcome::Filtered(rule) => *self.filtered.entry(rule.clone()).or_default() += 1,
            Outcome::Quarantined(r) => *self.quarantined.entry(r.as_str()).or_default() += 1,
        }
    }

    /// Adds another tally.
    pub fn merge(&mut self, other: &Tally) {
        self.landed += other.landed;
        self.duplicate += other.duplicate;
        self.stale += other.stale;
        self.conflicts += other.conflicts;
        for (k, v) in &other.filtered {
            *self.filtered.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.quarantined {
            *self.quarantined.entry(k).or_default() += v;
        }
        self.buffered += other.buffered;
    }

    /// Total records accounted for.
    pub fn total(&self) -> u64 {
        self.landed
            + self.duplicate
            + self.stale
            + self.filtered.values().sum::<u64>()
            + self.quarantined.values().sum::<u64>()
            + self.buffered
    }

    /// `consumed N = landed a + duplicate b + filtered c + quarantined d` (`+ buffered e` when records were left
    /// unapplied at the stop, read again by the next run), with per-rule/reason detail.
    pub fn line(&self) -> String {
        fn detail<K: std::fmt::Display>(m: &BTreeMap<K, u64>) -> String {
            m.iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
        let filtered: u64 = self.filtered.values().sum();
        let quarantined: u64 = self.quarantined.values().sum();
        let stale = if self.stale > 0 {
            format!(" + stale {}", self.stale)
        } else {
            String::new()
        };
        let mut s = format!(
            "consumed {} = landed {} + duplicate {}{stale} + filtered {} + quarantined {}",
            self.total(),
            self.landed,
            self.duplicate,
            filtered,
            quarantined
        );
        if self.buffered > 0 {
            s += &format!(" + buffered {}", self.buffered);
        }
        if self.conflicts > 0 {
            s += &format!(" [stale: {} conflict(s)]", self.conflicts);
        }
        if filtered > 0 {
            s += &format!(" [filtered {}]", detail(&self.filtered));
        }
        if quarantined > 0 {
            s += &format!(" [quarantined {}]", detail(&self.quarantined));
        }
        s
    }
}

/// Each item's outcome, in item order: a claim that landed is `Landed` unless the row projections overrode it
/// (`overrides`: stale, conflict — still in `landed` —, or duplicate), a claim that did not land is a
/// `Duplicate`.
pub fn outcomes(
    batch: &Batch,
    landed: &HashSet<i64>,
    overrides: &HashMap<i64, Outcome>,
) -> Vec<Outcome> {
    let mut out = Vec::with_capacity(batch.items.len());
    for it in &batch.items {
        out.push(match &it.pending {
            Pending::Claim { .. } if overrides.contains_key(&it.offset) => {
                overrides[&it.offset].clone()
            }
            Pending::Claim { .. } if landed.contains(&it.offset) => Outcome::Landed,
            Pending::Claim { .. } => Outcome::Duplicate,
            Pending::Filtered(rule) => Outcome::Filtered(rule.clone()),
            Pending::Quarantine(r) => Outcome::Quarantined(r.reason),
        });
    }
    out
}
