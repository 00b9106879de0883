//! `replaysafe prove`: shows, for the user's own pipeline and a fixture of its records, that replay is harmless
//! at every dangerous boundary (issue 12). Each boundary runs the one engine on a scratch schema of the user's
//! database (dropped afterwards unless `--keep`) over a scratch topic (librdkafka's embedded mock cluster, or
//! `--brokers`), and compares the final state — every projection table, tombstones, conflicts, ledger, outbox,
//! dead letters, bookkeeping columns left out ([`state`]) — with the reference state of boundary 1.
//!
//! The boundaries ([`boundaries`]): 1 apply once (reference), 2 apply twice, 3 a crash between every database
//! commit and the following Kafka commit, 4 permitted shuffles, 5 a rebuilt topic, 6 a resnapshot, 7 an expired
//! ledger entry, 8 two workers and two groups at once, 9 an uncertain commit, 10 batch boundaries (sizes 1, 7,
//! 5000 and random cuts), 11 the same records again into a fresh schema ([`batching`]), 12 accounting on every
//! run.

pub mod batching;
pub mod boundaries;
pub mod report;
pub mod resnap;
pub mod scratch;
pub mod source;
pub mod state;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio_postgres::Client;

use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::model::Tally;
pub use report::{Boundary, Report};
use scratch::{Base, Cluster, Rec, Variant};
use state::{Norm, Snapshot};

/// Where the fixture comes from.
#[derive(Clone, Debug)]
pub enum Fixture {
    /// A kcat `-J` file (`--records`).
    File(PathBuf),
    /// `--from-topic T --max N`: the first records of a live topic (partitions in turn), on the pipeline's
    /// brokers (`[kafka] brokers` or `KAFKA_BROKERS`).
    Topic {
        /// The live brokers.
        brokers: String,
        /// The topic (one of `[kafka] topics`).
        topic: String,
        /// Records to take at most.
        max: usize,
    },
}

/// Options of one `prove`.
#[derive(Clone, Debug)]
pub struct ProveOptions {
    /// The records.
    pub fixture: Fixture,
    /// PostgreSQL connection string, resolved (the scratch schemas are made there).
    pub database_url: String,
    /// `--brokers`: a real cluster for the scratch topics; `None`: the embedded mock cluster.
    pub brokers: Option<String>,
    /// `--keep`: leave the scratch schemas (their names are printed).
    pub keep: bool,
    /// `--shuffles N` (default 20).
    pub shuffles: u32,
    /// `--seed` of the shuffles (default: from the clock; printed).
    pub seed: u64,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Set on SIGINT/SIGTERM: the engine run under way ends, no further run starts, the scratch schemas (and
    /// scratch topics on `--brokers`) are removed unless `--keep`, and `prove` returns [`interrupted`]'s error.
    pub interrupt: Arc<AtomicBool>,
}

/// The error of an interrupted `prove` (exit 1, docs/operations.md "Exit codes").
pub fn interrupted() -> Error {
    Error::Other(
        "interrupted (SIGINT/SIGTERM): no boundary was judged further; scratch state removed"
            .into(),
    )
}

/// The state shared by the boundaries.
pub struct Prover {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) base: Base,
    pub(crate) user: Arc<Pipeline>,
    pub(crate) cluster: Cluster,
    /// The fixture as published on the scratch topic.
    pub(crate) records: Vec<Rec>,
    pub(crate) url: String,
    pub(crate) client: Client,
    pub(crate) run_id: String,
    schemas: Vec<String>,
    pub(crate) opts: ProveOptions,
    /// Accounting checks of every run: (boundary, run, consumed, tally) that did not add up or missed records.
    pub(crate) accounting: Vec<String>,
    /// Runs checked for accounting.
    pub(crate) runs_checked: u64,
    pub(crate) bar: Option<indicatif::ProgressBar>,
}

/// Runs every boundary on `pipeline_path`'s pipeline and returns the report (whether all passed is
/// [`Report::passed`]).
///
/// # Errors
/// [`Error::Usage`] for a fixture that cannot be read, or a `sql` projection whose tables are not qualified
/// with the pipeline's schema; a database or Kafka error that stops `prove` itself (not a boundary's failure).
pub fn prove(pipeline_path: &Path, opts: ProveOptions) -> Result<Report> {
    let user = Arc::new(crate::config::load(pipeline_path)?);
    let text = std::fs::read_to_string(pipeline_path)
        .map_err(|e| Error::Usage(format!("cannot read {}: {e}", pipeline_path.display())))?;
    let doc: toml::Table = toml::from_str(&text).map_err(|e| Error::Usage(e.to_string()))?;
    let schema = user.postgres.schema.as_str().to_string();
    if let Some(n) = scratch::unqualified_sql(&doc, &schema) {
        return Err(Error::Usage(format!(
            "{}: [[projection]] number {n} (kind = \"sql\") does not name its tables with the pipeline's schema \
             `{schema}` (as `{schema}.table`): prove runs every projection on a scratch schema and rewrites \
             `{schema}.` there; it would write elsewhere",
            pipeline_path.display()
        )));
    }
    if let Fixture::Topic { topic, .. } = &opts.fixture {
        if !user.kafka.topics.contains(topic) {
            return Err(Error::Usage(format!(
                "--from-topic {topic} is not one of the pipeline's [kafka] topics ({})",
                user.kafka.topics.join(", ")
            )));
        }
    }
    let records = match &opts.fixture {
        Fixture::File(path) => scratch::read_fixture(&user, path)?,
        Fixture::Topic {
            brokers,
            topic,
            max,
        } => scratch::sample_topic(&user, brokers, topic, *max)?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))?;
    let run_id = run_id();
    tracing::info!(
        "prove {run_id}: scratch schemas rsprove_{run_id}_<n>{}",
        if opts.brokers.is_some() {
            format!(", scratch topics <topic>.prove-{run_id}")
        } else {
            String::new()
        }
    );
    let client = rt.block_on(crate::sink::connect(&opts.database_url))?;
    if let Some((n, other)) = rt.block_on(scratch::foreign_schema(&client, &doc, &schema))? {
        return Err(Error::Usage(format!(
            "{}: [[projection]] number {n} (kind = \"sql\") names the schema `{other}`, not only the pipeline's \
             `{schema}`: prove runs every projection on a scratch schema and would write to `{other}`, outside it",
            pipeline_path.display()
        )));
    }
    let cluster = Cluster::open(opts.brokers.clone(), &run_id, &user.kafka.properties)?;
    let records = cluster.publish(&records, &rt)?;
    let topics = user
        .kafka
        .topics
        .iter()
        .map(|t| format!("{t}{}", cluster.suffix))
        .collect();
    let base = Base {
        name: pipeline_path.display().to_string(),
        doc,
        topics,
        mock: opts.brokers.is_none(),
        group_suffix: cluster.suffix.clone(),
    };
    let mut prover = Prover {
        rt,
        base,
        user,
        cluster,
        records,
        url: opts.database_url.clone(),
        client,
        run_id,
        schemas: Vec::new(),
        opts,
        accounting: Vec::new(),
        runs_checked: 0,
        bar: None,
    };
    let report = boundaries::run_all(&mut prover);
    let kept = prover.cleanup();
    if prover.stopped() {
        return Err(interrupted());
    }
    let mut report = report?;
    (report.kept, report.kept_topics) = kept;
    Ok(report)
}

impl Prover {
    /// Whether SIGINT/SIGTERM arrived.
    pub fn stopped(&self) -> bool {
        self.opts.interrupt.load(Ordering::Relaxed)
    }

    /// [`interrupted`] once SIGINT/SIGTERM arrived.
    ///
    /// # Errors
    /// That error.
    pub fn check(&self) -> Result<()> {
        match self.stopped() {
            true => Err(interrupted()),
            false => Ok(()),
        }
    }

    /// A new scratch schema (dropped first if it exists); its name is remembered for the clean-up.
    ///
    /// # Errors
    /// A database error.
    pub fn fresh_schema(&mut self) -> Result<String> {
        self.check()?;
        let name = format!("rsprove_{}_{}", self.run_id, self.schemas.len() + 1);
        self.rt.block_on(self.client.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
        )))?;
        self.schemas.push(name.clone());
        Ok(name)
    }

    /// The pipeline variant `v` under `group`.
    ///
    /// # Errors
    /// As [`Base::pipeline`].
    pub fn pipeline(&self, v: &Variant, group: &str) -> Result<Arc<Pipeline>> {
        Ok(Arc::new(self.base.pipeline(v, group)?))
    }

    /// The compared state of `p`'s schema.
    ///
    /// # Errors
    /// A database error.
    pub fn snapshot(&self, p: &Pipeline, norm: &Norm) -> Result<Snapshot> {
        self.rt.block_on(state::snapshot(
            &self.client,
            p.postgres.schema.as_str(),
            p.ledger.table.name.as_str(),
            norm,
        ))
    }

    /// Checks one run's accounting: `consumed = landed + duplicate + stale + filtered + quarantined` (the
    /// tally's own sum against the records the run was handed).
    pub fn account(&mut self, what: &str, consumed: u64, tally: &Tally) {
        self.runs_checked += 1;
        let filtered: u64 = tally.filtered.values().sum();
        let quarantined: u64 = tally.quarantined.values().sum();
        let sum = tally.landed + tally.duplicate + tally.stale + filtered + quarantined;
        if sum != consumed {
            self.accounting.push(format!(
                "{what}: consumed {consumed} ≠ {} ({sum})",
                tally.line()
            ));
        }
    }

    /// Advances the progress bar by one run.
    pub fn tick(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
            b.inc(1);
        }
    }

    /// Drops one scratch schema now (unless `--keep`), e.g. a shuffle's that passed.
    pub fn drop_schema(&mut self, name: &str) {
        if self.opts.keep {
            return;
        }
        if self
            .rt
            .block_on(
                self.client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")),
            )
            .is_ok()
        {
            self.schemas.retain(|s| s != name);
        }
    }

    /// Drops the scratch schemas and deletes the scratch topics of `--brokers` (unless `--keep`: then returns
    /// their names).
    fn cleanup(&mut self) -> (Vec<String>, Vec<String>) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if self.opts.keep {
            return (self.schemas.clone(), self.cluster.scratch_topics());
        }
        if let Err(e) = self.cluster.delete_topics(&self.rt) {
            tracing::warn!("prove: deleting the scratch topics: {e}");
        }
        for s in &self.schemas {
            if let Err(e) = self.rt.block_on(
                self.client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {s} CASCADE")),
            ) {
                tracing::warn!("prove: dropping scratch schema {s}: {e}");
            }
        }
        (Vec::new(), Vec::new())
    }
}

/// A short id for this prove's scratch schemas and topics: clock, process and call.
fn run_id() -> String {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ms = chrono::Utc::now().timestamp_millis() % 0xff_ffff;
    format!("{ms:x}{:x}{n}", std::process::id() % 0xfff)
}

/// Milliseconds since `t`.
pub(crate) fn ms(t: Instant) -> u64 {
    crate::units::ms(t.elapsed())
}
