//! A start's side of the projection record ([`super::projset`]): what the pipeline's projections are against
//! the record — read before anything is created ([`start`]) — and recording them with the hand-over point of
//! added ones ([`record`]); ledgers of earlier versions kept the record in their table comment ([`legacy`]).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use tokio_postgres::{GenericClient, Transaction};

use super::projset::{
    all_active, build_group, diff, load, lock, pipeline_settings, record_handover, refuse_changes,
    store, Diff, Entry, Record, Settings, State, HANDOVER, PROJECTION_SET,
};
use crate::config::Pipeline;
use crate::error::{Error, Result};

/// Prefix of the format-2 ledger comment (replaysafe before the record table): a JSON object of settings.
const OWNER_V2: &str = "replaysafe projections v2 ";
/// Prefix of the format-1 ledger comment: a digest of the projections' names and kinds.
const OWNER_V1: &str = "replaysafe projections sha256:";
/// What every ledger comment written by replaysafe starts with.
const OWNER_PREFIX: &str = "replaysafe projections ";

/// Format 1: the digest of the projections' names and kinds.
fn projection_digest_v1(p: &Pipeline) -> String {
    let mut parts: Vec<String> = p
        .projections
        .iter()
        .map(|x| format!("{}:{:?}", x.name, x.kind))
        .collect();
    parts.sort();
    let digest = Sha256::digest(parts.join("\n").as_bytes());
    format!("{OWNER_V1}{}", hex::encode(digest))
}

/// The record an earlier replaysafe kept in the ledger's table comment, as settings (all active); `None` when
/// it recorded nothing usable — no comment, or a comment replaysafe did not write (warned). A format-1 digest
/// equal to the pipeline's names and kinds gives the pipeline's settings (they cannot be compared).
///
/// # Errors
/// [`Error::Schema`] for an unreadable record, or a format-1 digest of another set of names and kinds.
pub async fn legacy(client: &impl GenericClient, p: &Pipeline) -> Result<Option<Settings>> {
    let table = p.ledger.table.to_string();
    let have: Option<String> = client
        .query_one(
            "SELECT obj_description(to_regclass($1), 'pg_class')",
            &[&table],
        )
        .await?
        .get(0);
    let Some(h) = have else { return Ok(None) };
    if let Some(json) = h.strip_prefix(OWNER_V2) {
        return serde_json::from_str(json).map(Some).map_err(|e| {
            Error::Schema(format!(
                "ledger {table}: its comment records projections in an unreadable form ({e}); restore it"
            ))
        });
    }
    if h == projection_digest_v1(p) {
        tracing::info!(
            ledger = %table,
            "ledger recorded its projections' names and kinds only (replaysafe before format 2); recording their \
             settings now — a settings change made before this start cannot be detected"
        );
        return Ok(Some(pipeline_settings(p)));
    }
    if h.starts_with(OWNER_PREFIX) {
        let names: Vec<&str> = p.projections.iter().map(|x| x.name.as_str()).collect();
        return Err(Error::Schema(format!(
            "ledger {table} already holds delivery keys claimed for a different set of projections than this \
             pipeline's [{}] (recorded by replaysafe before format 2 as a digest of names and kinds, so which ones \
             differ cannot be said): start it once with the pipeline file it ran with, which records them in full; \
             then add, change or remove projections as docs/replay.md \"Change a running pipeline\" says",
            names.join(", ")
        )));
    }
    tracing::warn!(
        ledger = %table,
        replaced = %h,
        "the ledger's table comment is not a replaysafe projection record; recording this pipeline's projections \
         (in {})",
        p.table(PROJECTION_SET)
    );
    Ok(None)
}

/// What a start found, before anything is created: the record (`None`: nothing recorded — a new ledger, or one
/// without a record), how the pipeline differs from it, and whether the ledger holds claims.
#[derive(Debug)]
pub struct Start {
    /// The record (from the table, or moved from an earlier version's ledger comment).
    pub record: Option<Record>,
    /// The pipeline against the record (only additions get past [`start`]).
    pub diff: Diff,
    /// Whether the ledger exists and holds at least one delivery key.
    pub ledger_rows: bool,
}

async fn ledger_has_rows(c: &impl GenericClient, p: &Pipeline) -> Result<bool> {
    let name: Option<String> = c
        .query_one(
            "SELECT to_regclass($1)::text",
            &[&p.ledger.table.to_string()],
        )
        .await?
        .get(0);
    let Some(name) = name else { return Ok(false) };
    Ok(
        c.query_one(&format!("SELECT EXISTS (SELECT 1 FROM {name})"), &[])
            .await?
            .get(0),
    )
}

/// Checks the pipeline's projections against the ledger's record and the projection tables' marks
/// ([`super::marks::check`]), creating nothing: a changed or missing projection is refused ([`refuse_changes`]),
/// added ones are allowed. Call under the DDL lock.
///
/// # Errors
/// [`Error::Schema`] as [`refuse_changes`], [`legacy`], [`super::marks::check`]; [`Error::Postgres`].
pub async fn start(c: &impl GenericClient, p: &Pipeline) -> Result<Start> {
    let ledger_rows = ledger_has_rows(c, p).await?;
    let record = match load(c, p).await? {
        Some(r) => Some(r),
        None if ledger_rows => legacy(c, p).await?.map(|s| all_active(1, s)),
        None => None,
    };
    let diff = match &record {
        Some(r) => diff(r, &pipeline_settings(p)),
        None => Diff::default(),
    };
    // A ledger without claims has nothing projected under the recorded definition: any change is recorded.
    if ledger_rows {
        refuse_changes(p, &diff)?;
    }
    super::marks::check(c, p, &diff.added, ledger_rows).await?;
    Ok(Start {
        record,
        diff,
        ledger_rows,
    })
}

/// Records the pipeline's projections after [`start`], in the start's transaction. Nothing recorded yet: all
/// active, version 1. Projections added: the record row is locked ([`lock`]), the version raised (batches of
/// processes running the previous definition fail from now on), and each added projection recorded `building`
/// with its hand-over point ([`record_handover`]) — or `active` when the ledger holds no claims (no history).
/// Otherwise settings recorded by another replaysafe version are refreshed without a new version.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn record(tx: &Transaction<'_>, p: &Pipeline, start: Start) -> Result<()> {
    let now = pipeline_settings(p);
    let Some(recorded) = start.record else {
        return store(tx, p, &all_active(1, now)).await;
    };
    let mut rec = lock(tx, p).await?.unwrap_or(recorded);
    let changed = !(start.diff.missing.is_empty() && start.diff.changed.is_empty());
    if !start.ledger_rows && changed {
        // Checked again under the lock: a batch of the recorded definition may have claimed meanwhile.
        if ledger_has_rows(tx, p).await? {
            return Err(Error::Schema(format!(
                "ledger {} received its first delivery keys while this start changed its projections; start again \
                 (the change is then checked against them)",
                p.ledger.table
            )));
        }
        return store(tx, p, &all_active(rec.version + 1, now)).await;
    }
    if start.diff.added.is_empty() {
        let mut changed = false;
        for (name, e) in rec.entries.iter_mut() {
            match now.get(name) {
                Some(s) if e.state != State::Removed && *s != e.settings => {
                    e.settings = s.clone();
                    changed = true;
                }
                _ => {}
            }
        }
        return if changed || load(tx, p).await?.is_none() {
            store(tx, p, &rec).await
        } else {
            Ok(())
        };
    }
    rec.version += 1;
    let rows = ledger_has_rows(tx, p).await?;
    let at: String = tx.query_one("SELECT now()::text", &[]).await?.get(0);
    for name in &start.diff.added {
        let mut entry = Entry {
            settings: now[name].clone(),
            state: State::Active,
            build_group: None,
            at: BTreeMap::from([("added".to_string(), at.clone())]),
        };
        if rows {
            let group = build_group(p, name, rec.version);
            let n = record_handover(tx, p, &group).await?;
            tracing::info!(
                projection = %name,
                ledger = %p.ledger.table,
                partitions = n,
                "projection added to a live pipeline: fed by every batch from its hand-over point on (recorded in \
                {}); build the records claimed before it with `replaysafe projection build --config FILE \
                --projection {name}`",
                p.table(HANDOVER)
            );
            entry.state = State::Building;
            entry.build_group = Some(group);
        }
        rec.entries.insert(name.clone(), entry);
    }
    store(tx, p, &rec).await
}
