//! The projection record of a ledger: which projections its claims are projected into, each with its settings and
//! state (`active`, `building` — added to a live pipeline, its history before the hand-over not built yet —, or
//! `removed`), and the definition *version* every batch transaction checks.
//!
//! - Table `replaysafe_projection_set` (in the pipeline schema): one row per ledger, `version` and `projections`
//!   (JSON `{name: Entry}`). Every batch transaction reads the row `FOR SHARE` and compares the version with the
//!   one its process started with ([`check_version`]): a worker still running an older definition fails that
//!   batch and stops, never commits.
//! - Table `replaysafe_projection_handover`: per projection added to a live pipeline (its `build_group`), the
//!   hand-over point H — every consumer group's checkpoint `(group, generation, topic, partition) → next_offset`
//!   at the moment the projection was added, read while holding the set row `FOR UPDATE` (so no batch of this
//!   ledger commits in between). A ledger row claimed by group g at offset o of (topic, partition) was claimed
//!   before the hand-over exactly when o < H(g, generation, topic, partition): those are the records
//!   `replaysafe projection build` applies; every later claim is applied by the batch that makes it.
//!
//! Ledgers recorded by earlier replaysafe versions kept the record in the ledger's table comment
//! (`projstart::legacy`); it is read once and moved here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio_postgres::{GenericClient, Statement, Transaction};

use super::checkpoint::CHECKPOINTS;
use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::model::apply_error::{classify, ApplyError};

/// Name of the projection record table (in the pipeline schema).
pub const PROJECTION_SET: &str = "replaysafe_projection_set";
/// Name of the hand-over table (in the pipeline schema).
pub const HANDOVER: &str = "replaysafe_projection_handover";

/// `setting → value` of each projection, by name ([`crate::projection::ProjectionPlan::settings`]).
pub type Settings = BTreeMap<String, BTreeMap<String, String>>;

/// `CREATE TABLE` for the record and hand-over tables.
pub fn create_tables(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (ledger text PRIMARY KEY, version bigint NOT NULL, projections jsonb NOT NULL, \
         updated_at timestamptz NOT NULL DEFAULT now()); \
         CREATE TABLE IF NOT EXISTS {} (build_group text NOT NULL, consumer_group text NOT NULL, \
         generation text NOT NULL, topic text NOT NULL, partition integer NOT NULL, next_offset bigint NOT NULL, \
         PRIMARY KEY (build_group, consumer_group, generation, topic, partition))",
        p.table(PROJECTION_SET),
        p.table(HANDOVER)
    )
}

/// A projection's state in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Fed by every batch; its table holds every claimed record it accepts.
    Active,
    /// Added to a live pipeline: fed by every batch since the hand-over; the records claimed before it are
    /// applied by `replaysafe projection build`, which then makes it `active`.
    Building,
    /// Removed from the pipeline (`replaysafe projection remove`): no longer fed; its table is left as it is.
    Removed,
}

/// One projection of the record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    /// Its settings when recorded.
    pub settings: BTreeMap<String, String>,
    /// Its state.
    pub state: State,
    /// `building`: the checkpoint group of its build, also the key of its hand-over rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_group: Option<String>,
    /// When it was added, removed, built (database time, text).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub at: BTreeMap<String, String>,
}

/// The record of a ledger.
#[derive(Debug, Clone)]
pub struct Record {
    /// The definition version (raised by every added or removed projection).
    pub version: i64,
    /// By name.
    pub entries: BTreeMap<String, Entry>,
}

/// The projections of `p` as settings.
pub fn pipeline_settings(p: &Pipeline) -> Settings {
    p.projections
        .iter()
        .map(|x| (x.name.clone(), x.settings.clone()))
        .collect()
}

/// Whether `new` equals `old` on every setting both hold (a setting present on one side only was written by
/// another version of replaysafe).
fn same_settings(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> bool {
    old.iter().all(|(k, v)| new.get(k).is_none_or(|nv| nv == v))
}

/// What differs in one projection's settings, one sentence each.
fn setting_changes(
    name: &str,
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Vec<String> {
    let shown = |v: &str| {
        if v.is_empty() {
            "none".to_string()
        } else {
            format!("`{v}`")
        }
    };
    old.iter()
        .filter_map(|(k, ov)| {
            let nv = new.get(k)?;
            (nv != ov).then(|| {
                format!(
                    "projection `{name}`: `{k}` was {}, now {}",
                    shown(ov),
                    shown(nv)
                )
            })
        })
        .collect()
}

/// How the pipeline's projections relate to the record.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Diff {
    /// In the pipeline, not (or only as removed) in the record.
    pub added: Vec<String>,
    /// Recorded (not removed), not in the pipeline.
    pub missing: Vec<String>,
    /// Recorded and in the pipeline with other settings: one sentence per changed setting.
    pub changed: Vec<String>,
    /// Of `added`: recorded as removed (`replaysafe projection remove`), with when it was removed (database
    /// time, text; empty when unknown) — the file has it again.
    pub readded: Vec<(String, String)>,
}

impl Diff {
    /// Whether the pipeline runs exactly the recorded projections.
    pub fn is_same(&self) -> bool {
        self.added.is_empty() && self.missing.is_empty() && self.changed.is_empty()
    }
}

/// Compares the pipeline's projections with the record.
pub fn diff(record: &Record, new: &Settings) -> Diff {
    let mut d = Diff::default();
    for (name, e) in &record.entries {
        if e.state == State::Removed {
            continue;
        }
        match new.get(name) {
            None => d.missing.push(name.clone()),
            Some(n) if !same_settings(&e.settings, n) => {
                d.changed.extend(setting_changes(name, &e.settings, n))
            }
            Some(_) => {}
        }
    }
    for name in new.keys() {
        match record.entries.get(name) {
            Some(e) if e.state != State::Removed => {}
            Some(e) => {
                let at = e.at.get("removed").cloned().unwrap_or_default();
                d.readded.push((name.clone(), at));
                d.added.push(name.clone());
            }
            None => d.added.push(name.clone()),
        }
    }
    d
}

/// The path for a changed projection, given with every refusal of one: never one that counts twice.
pub const CHANGE_PATH: &str = "A projection's definition cannot change in place: the records already claimed were \
    projected under the recorded one and are never projected again. To change it on the running pipeline, keep \
    the old projection in the file unchanged and add the changed one beside it under a new `name` and a new \
    table; start one worker with that file (init or run records it and its hand-over point), restart the others \
    with it, and build its history with `replaysafe projection build --config FILE --projection NEW`; once built, \
    delete the old entry from the file and run `replaysafe projection remove --config FILE --projection OLD` \
    (docs/replay.md \"Change a running pipeline\")";

/// Refuses a pipeline whose projections changed or lost one (see [`CHANGE_PATH`]), or that has a projection
/// recorded as removed again (an older file looks the same, and must not silently feed it again); added ones
/// are allowed.
///
/// # Errors
/// [`Error::Schema`] saying what changed and the path to take.
pub fn refuse_changes(p: &Pipeline, d: &Diff) -> Result<()> {
    let ledger = &p.ledger.table;
    if let Some((name, at)) = d.readded.first() {
        let when = if at.is_empty() {
            String::new()
        } else {
            format!(" at {at}")
        };
        return Err(Error::Schema(format!(
            "ledger {ledger} records projection `{name}` as removed (`replaysafe projection remove`{when}), and \
             this file has it again. If this process runs an older pipeline file, start it with the current one. \
             To add such a projection back, give it a new `name` and a new table, then build it (docs/replay.md \"Change \
             a running pipeline\"): a removed name is not fed again, as an older file would otherwise resume \
             feeding it unnoticed"
        )));
    }
    if !d.changed.is_empty() {
        return Err(Error::Schema(format!(
            "ledger {ledger} already holds delivery keys claimed for other projections: {}. {CHANGE_PATH}",
            d.changed.join("; ")
        )));
    }
    if !d.missing.is_empty() {
        let names = d
            .missing
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let first = &d.missing[0];
        return Err(Error::Schema(format!(
            "ledger {ledger} records projection {names}, which this file does not have. If this process runs an \
             older pipeline file, start it with the current one. To remove a projection from the pipeline, run \
             `replaysafe projection remove --config FILE --projection {first}` with the file that no longer has \
             it (its table is left as it is, no longer fed). A second pipeline with other projections needs its \
             own [ledger] table and projection tables of its own (and its own [kafka] group-id with start = \
             \"earliest\")"
        )));
    }
    Ok(())
}

/// Reads the record of the pipeline's ledger (`None`: none recorded in the table yet).
///
/// # Errors
/// [`Error::Postgres`]; [`Error::Schema`] when the record cannot be read.
pub async fn load(client: &impl GenericClient, p: &Pipeline) -> Result<Option<Record>> {
    let set = p.table(PROJECTION_SET).to_string();
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&set])
        .await?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let row = client
        .query_opt(
            &format!("SELECT version, projections FROM {set} WHERE ledger = $1"),
            &[&p.ledger.table.to_string()],
        )
        .await?;
    row.map(|r| parse(p, r.get(0), r.get(1))).transpose()
}

fn parse(p: &Pipeline, version: i64, json: serde_json::Value) -> Result<Record> {
    let entries = serde_json::from_value(json).map_err(|e| {
        Error::Schema(format!(
            "{} of ledger {}: unreadable projection record ({e})",
            p.table(PROJECTION_SET),
            p.ledger.table
        ))
    })?;
    Ok(Record { version, entries })
}

/// A record of `settings`, all active.
pub fn all_active(version: i64, settings: Settings) -> Record {
    Record {
        version,
        entries: settings
            .into_iter()
            .map(|(name, settings)| {
                (
                    name,
                    Entry {
                        settings,
                        state: State::Active,
                        build_group: None,
                        at: BTreeMap::new(),
                    },
                )
            })
            .collect(),
    }
}

/// The checkpoint group of a build of projection `name` added at `version` (also its hand-over key).
pub fn build_group(p: &Pipeline, name: &str, version: i64) -> String {
    format!("{}.build.{name}.v{version}", p.kafka.group_id)
}

/// Writes `record` (insert or update) in `tx`.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn store(tx: &Transaction<'_>, p: &Pipeline, record: &Record) -> Result<()> {
    let json = serde_json::to_value(&record.entries).expect("strings serialise");
    tx.execute(
        &format!(
            "INSERT INTO {} (ledger, version, projections) VALUES ($1, $2, $3) ON CONFLICT (ledger) DO UPDATE \
             SET version = EXCLUDED.version, projections = EXCLUDED.projections, updated_at = now()",
            p.table(PROJECTION_SET)
        ),
        &[&p.ledger.table.to_string(), &record.version, &json],
    )
    .await?;
    Ok(())
}

/// Locks the record row `FOR UPDATE` (waiting for every batch transaction of the ledger that holds it `FOR
/// SHARE`, blocking new ones until `tx` ends) and reads it again.
///
/// # Errors
/// [`Error::Postgres`] (a lock timeout included).
pub async fn lock(tx: &Transaction<'_>, p: &Pipeline) -> Result<Option<Record>> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT version, projections FROM {} WHERE ledger = $1 FOR UPDATE",
                p.table(PROJECTION_SET)
            ),
            &[&p.ledger.table.to_string()],
        )
        .await?;
    row.map(|r| parse(p, r.get(0), r.get(1))).transpose()
}

/// Records the hand-over point of `build_group`: every consumer group's checkpoint of the pipeline's topics now
/// (call with the record row locked, [`lock`]). Returns the number of partitions recorded.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn record_handover(tx: &Transaction<'_>, p: &Pipeline, build_group: &str) -> Result<u64> {
    Ok(tx
        .execute(
            &format!(
                "INSERT INTO {} (build_group, consumer_group, generation, topic, partition, next_offset) \
                 SELECT $1, consumer_group, generation, topic, partition, next_offset FROM {} \
                 WHERE topic = ANY($2) AND next_offset IS NOT NULL AND consumer_group <> $1 \
                 ON CONFLICT DO NOTHING",
                p.table(HANDOVER),
                p.table(CHECKPOINTS)
            ),
            &[&build_group, &p.kafka.topics],
        )
        .await?)
}

/// The statement every batch transaction runs to read the record's version under a share lock. `$1`: the ledger.
pub fn version_statement(p: &Pipeline) -> String {
    format!(
        "SELECT version FROM {} WHERE ledger = $1 FOR SHARE",
        p.table(PROJECTION_SET)
    )
}

/// The version of the record when the pipeline's projections are exactly the recorded ones (what a batch of
/// this process compares with, [`check_version`]).
///
/// # Errors
/// [`Error::Schema`] when there is no record or it differs from the pipeline (a process started with an older
/// file, after another one changed the projections).
pub async fn current_version(client: &impl GenericClient, p: &Pipeline) -> Result<i64> {
    let Some(record) = load(client, p).await? else {
        return Err(Error::Schema(format!(
            "ledger {} has no projection record in {}: run `replaysafe init` first",
            p.ledger.table,
            p.table(PROJECTION_SET)
        )));
    };
    let d = diff(&record, &pipeline_settings(p));
    if d.is_same() {
        return Ok(record.version);
    }
    refuse_changes(p, &d)?;
    Err(Error::Schema(format!(
        "ledger {}: projection `{}` was added by another process since this one started; restart with the \
         current pipeline file",
        p.ledger.table, d.added[0]
    )))
}

/// Step 1a of the batch transaction: the record's version, read under a share lock (a start adding or removing
/// a projection waits for this batch, and this batch for it), must be the one this process started with.
///
/// # Errors
/// [`ApplyError::Fatal`] when it is not: this process runs an older definition of the projections; the batch is
/// rolled back.
pub(super) async fn check_version(
    tx: &Transaction<'_>,
    stmt: &Statement,
    p: &Pipeline,
    version: i64,
) -> std::result::Result<(), ApplyError> {
    let have: Option<i64> = tx
        .query_opt(stmt, &[&p.ledger.table.to_string()])
        .await
        .map_err(|e| classify(e, false))?
        .map(|r| r.get(0));
    if have == Some(version) {
        return Ok(());
    }
    Err(ApplyError::Fatal(Error::Other(format!(
        "the projections of ledger {} changed while this process ran (definition version {} now, {version} when \
         it started): this process runs an older pipeline file. Stopped without committing this batch; restart \
         it with the current file",
        p.ledger.table,
        have.map_or("none".to_string(), |v| v.to_string())
    ))))
}

/// Whether the ledger's projection record  holds exactly this pipeline's projections — none added,
/// missing or changed (read only).
///
/// # Errors
/// [`Error::Postgres`]; [`Error::Schema`] when the record cannot be read.
pub(crate) async fn matches(c: &impl tokio_postgres::GenericClient, p: &Pipeline) -> Result<bool> {
    Ok(match load(c, p).await? {
        Some(r) => diff(&r, &pipeline_settings(p)).is_same(),
        None => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(entries: &[(&str, &[(&str, &str)])]) -> Settings {
        entries
            .iter()
            .map(|(name, kv)| {
                (
                    name.to_string(),
                    kv.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn diff_names_added_missing_and_changed_settings_and_ignores_one_sided_settings() {
        let mut old = all_active(
            3,
            settings(&[
                ("totals", &[("kind", "sum"), ("filter", "amount > 0.0")]),
                ("gone", &[("kind", "counter")]),
                ("was", &[("kind", "counter")]),
            ]),
        );
        old.entries.get_mut("was").unwrap().state = State::Removed;
        let new = settings(&[
            (
                "totals",
                &[
                    ("kind", "sum"),
                    ("filter", "amount > 100.0"),
                    ("later", "x"),
                ],
            ),
            ("added", &[("kind", "outbox")]),
            ("was", &[("kind", "counter")]),
        ]);
        let d = diff(&old, &new);
        assert_eq!(d.added, ["added", "was"]);
        assert_eq!(d.readded, [("was".to_string(), String::new())]);
        assert_eq!(d.missing, ["gone"]);
        assert_eq!(
            d.changed,
            ["projection `totals`: `filter` was `amount > 0.0`, now `amount > 100.0`"]
        );
        assert!(diff(&all_active(1, new.clone()), &new).is_same());
    }
}
