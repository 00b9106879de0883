//! What a backfill is asked to do: the window's start and end, the policies, and the plan per partition.

use std::collections::BTreeMap;

use chrono::NaiveDate;
use serde::{Deserialize, Serialize};

use crate::ops::offsets::StopFile;

/// Where the window ends.
#[derive(Debug, Clone)]
pub enum StopSpec {
    /// A snapshot file (`offsets snapshot`).
    Offsets(StopFile),
    /// Another group's positions, read now.
    Group(String),
    /// The first offset at or after this time (ms since the epoch), or the end captured with the lookup.
    Time(i64),
}

/// What to do with a partition that has no stop position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MissingStop {
    /// Stop at the partition's end as captured when planning.
    End,
    /// Leave the partition out.
    Skip,
    /// Refuse to start.
    Error,
}

/// Options of a backfill.
#[derive(Debug, Clone)]
pub struct BackfillOptions {
    /// Window start, ms since the Unix epoch (record timestamps).
    pub from_ms: i64,
    /// Window end.
    pub stop: StopSpec,
    /// Keep only records for which this CEL expression is true (others are `filtered` by rule `--filter`).
    pub filter: Option<String>,
    /// Keep only records whose partition-by day lies in this window (rebuild).
    pub day_window: Option<(NaiveDate, NaiveDate)>,
    /// The backfill's own consumer group id (checkpoints, Kafka commits).
    pub group_id: String,
    /// Raise the topic's `retention.ms` when the window is close to expiring.
    pub ensure_retention: bool,
    /// Plan and print only.
    pub dry_run: bool,
    /// Policy for partitions without a stop position.
    pub missing_stop: MissingStop,
    /// Show a progress bar (when stderr is a terminal).
    pub progress: bool,
    /// Offsets the replay must read whatever the times say, per `(topic, partition)`: `(lowest, highest)`,
    /// both inclusive (rebuild: where the window's ledger rows came from). Empty for a plain backfill.
    pub cover: BTreeMap<(String, i32), (i64, i64)>,
    /// Commit the backfill group's offsets to Kafka (`--keep-group`); by default nothing is committed, so the
    /// group never shows in Kafka (lag tools would show it as a consumer with a permanent lag). The checkpoints
    /// in PostgreSQL are what a rerun resumes from either way.
    pub keep_group: bool,
}

/// One partition of the plan.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartitionPlan {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset to read.
    pub start_offset: i64,
    /// Stop offset (exclusive): next offset to read after the window.
    pub stop_offset: i64,
    /// How the start was found (`time`, `end-at-lookup`, `empty`; `ledger` when a rebuild's ledger rows lie
    /// below the time-based start; in the report, `checkpoint` when this session resumed at the backfill group's
    /// checkpoint — `start_offset` is then where this session started).
    pub start_from: String,
}
