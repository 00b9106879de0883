//! The batch of `replaysafe projection build` (a [`super::Sink`] turned by [`super::Sink::for_build`]): instead
//! of claiming, it matches each record with the ledger row of its delivery key claimed *at this record's* topic,
//! partition and offset before the projection's hand-over point, and feeds only the projection being built.

use super::checkpoint::CHECKPOINTS;
use super::ledger::{ledger_pk, HORIZON};
use super::projset::HANDOVER;
use crate::config::Pipeline;
use crate::error::Error;
use crate::model::apply_error::ApplyError;
use crate::model::batch::{Batch, Pending};

/// The match statement, with the parameters of [`super::ledger::claim`] (field arrays typed alike) (`$4` is the build group, the key of
/// its hand-over rows): copies the records whose delivery key the ledger holds at exactly their `(topic,
/// partition, offset)`, claimed by a consumer group below that group's hand-over offset of the partition, into
/// `landed`, and returns their offsets. A record whose key was claimed at another position (a duplicate — in
/// history, or after the hand-over in another partition) or after the hand-over is not copied: it reached the
/// projection (or will) through its own claim. Nothing is locked or written in the ledger. `hashed`: the ledger
/// keeps its keys by [`super::ledger::key_constraint`] (the key is then compared through its hash index).
pub fn match_statement(p: &Pipeline, hashed: bool) -> String {
    let n = p.fields.len();
    let passes = p.pass_columns();
    let mut params = vec!["$5::bigint[]".to_string(), "$6::bigint[]".to_string()];
    let mut names = vec!["_offset".to_string(), "_ts".to_string()];
    let mut select = vec![
        "u._offset".to_string(),
        "CASE WHEN u._ts IS NULL THEN NULL ELSE to_timestamp(u._ts / 1000.0) END AS _timestamp"
            .to_string(),
    ];
    for (i, f) in p.fields.iter().enumerate() {
        params.push(format!("${}::{}[]", 7 + i, super::ledger::param_type(f.ty)));
        names.push(format!("f{i}"));
        select.push(format!("u.f{i}::{} AS {}", f.ty.sql(), f.name));
    }
    for j in 0..passes {
        params.push(format!("${}::boolean[]", 7 + n + j));
        names.push(format!("p{j}"));
        select.push(format!("u.p{j} AS \"_pass_{j}\""));
    }
    // The key row compared whole is what the ledger's hash index holds ([`super::ledger::key_row`]); the
    // columns compared one by one use a primary key of the earlier layout.
    let mut key: Vec<String> = ledger_pk(p)
        .into_iter()
        .skip(1)
        .map(|c| format!("l.{c} = d.{c}"))
        .collect();
    if hashed {
        let d_key = super::ledger::key_row(p, "d").replacen("d.generation", "$1::text", 1);
        key.push(format!("{} = {d_key}", super::ledger::key_row(p, "l")));
    }
    let mut cols = vec![
        "_generation".to_string(),
        "_topic".into(),
        "_partition".into(),
        "_offset".into(),
        "_timestamp".into(),
    ];
    let mut vals = vec![
        "$1".to_string(),
        "$2".into(),
        "$3".into(),
        "d._offset".into(),
        "d._timestamp".into(),
    ];
    cols.extend(p.fields.iter().map(|f| f.name.to_string()));
    vals.extend(p.fields.iter().map(|f| format!("d.{}", f.name)));
    cols.extend((0..passes).map(|j| format!("\"_pass_{j}\"")));
    vals.extend((0..passes).map(|j| format!("d.\"_pass_{j}\"")));
    format!(
        "WITH input AS (SELECT {select} FROM unnest({params}) AS u({names})), \
         joined AS MATERIALIZED (SELECT d.*, l.consumer_group, l.generation, l.topic, l.partition, \
           l.\"offset\" FROM input d JOIN {ledger} l ON l.generation = $1 AND {key} \
           AND l.topic = $2 AND l.partition = $3 AND l.\"offset\" = d._offset), \
         matched AS (SELECT l.* FROM joined l WHERE {before}) \
         INSERT INTO pg_temp.landed ({cols}) SELECT {vals} FROM matched d ORDER BY d._offset RETURNING _offset",
        select = select.join(", "),
        params = params.join(", "),
        names = names.join(", "),
        ledger = super::ledger::ledger_rows(p),
        key = key.join(" AND "),
        before = claimed_before_handover(p, "$4"),
        cols = cols.join(", "),
        vals = vals.join(", "),
    )
}

/// The condition on ledger row `l` (its `consumer_group`, `generation`, `topic`, `partition`, `offset`) that it
/// was claimed before the hand-over point of build group `group` (a SQL parameter): by a group whose checkpoint
/// the hand-over recorded, below that offset; or by a group that holds no checkpoint of the partition at all —
/// a `dead-letters replay --group-id G` (it moves no checkpoint), which is refused while a projection is
/// building, so its claims precede the hand-over. (Every other writer — `run`, `load`, `backfill`, `rebuild`
/// — takes its checkpoint row over before it claims: one that started after the hand-over has a checkpoint and
/// no hand-over row, and is left out.) Apply it to a materialized set of ledger rows, not inside a scan of the
/// partitioned ledger: pushed into every day partition's scan, its subqueries make a plan of thousands of JIT
/// functions.
pub fn claimed_before_handover(p: &Pipeline, group: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM {handover} h WHERE h.build_group = {group} \
           AND h.consumer_group = l.consumer_group AND h.generation = l.generation AND h.topic = l.topic \
           AND h.partition = l.partition AND l.\"offset\" < h.next_offset) \
         OR NOT EXISTS (SELECT 1 FROM {checkpoints} c WHERE c.consumer_group = l.consumer_group \
           AND c.generation = l.generation AND c.topic = l.topic AND c.partition = l.partition))",
        handover = p.table(HANDOVER),
        checkpoints = p.table(CHECKPOINTS),
    )
}

/// Whether a batch holds a record quarantined as older than the ledger's horizon (a `future-day` one is no
/// obstacle to a build: production quarantined it too, so its ledger holds no claim of it).
pub(super) fn holds_beyond_horizon(horizoned: &Batch) -> bool {
    horizoned.items.iter().any(|it| {
        matches!(&it.pending, Pending::Quarantine(r) if r.reason == crate::decode::Reason::BeyondHorizon)
    })
}

/// Whether every record of `horizoned` quarantined as beyond-horizon provably never landed: it lies above the
/// offsets a prune recorded for its partition (`pruned`: [`super::lifecycle::pruned_statement`]; had it been
/// claimed, its ledger row would still be there and the match would find it) and production quarantined it (an
/// unresolved `beyond-horizon` dead letter at its coordinates). Such records are left out of the build.
///
/// # Errors
/// As [`crate::model::apply_error::classify`].
pub(super) async fn beyond_horizon_never_landed(
    tx: &tokio_postgres::Transaction<'_>,
    pruned: Option<&tokio_postgres::Statement>,
    p: &Pipeline,
    generation: &str,
    horizoned: &Batch,
) -> Result<bool, ApplyError> {
    let classify = |e| crate::model::apply_error::classify(e, false);
    let through: i64 = match pruned {
        Some(stmt) => tx
            .query_opt(
                stmt,
                &[
                    &p.ledger.table.to_string(),
                    &generation,
                    &horizoned.topic,
                    &horizoned.partition,
                ],
            )
            .await
            .map_err(classify)?
            .map_or(-1, |r| r.get(0)),
        None => -1,
    };
    let offsets: Vec<i64> = horizoned
        .items
        .iter()
        .filter(|it| {
            matches!(&it.pending, Pending::Quarantine(r) if r.reason == crate::decode::Reason::BeyondHorizon)
        })
        .map(|it| it.offset)
        .collect();
    if offsets.iter().any(|o| *o <= through) {
        return Ok(false);
    }
    let quarantined: i64 = tx
        .query_one(
            &format!(
                "SELECT pg_catalog.count(*) FROM {} d WHERE d.generation = $1 AND d.topic = $2 \
                 AND d.partition = $3 AND d.\"offset\" = ANY($4) AND d.reason = 'beyond-horizon' \
                 AND d.resolved_at IS NULL",
                p.table(super::dead_letters::DEAD_LETTERS)
            ),
            &[
                &generation,
                &horizoned.topic,
                &horizoned.partition,
                &offsets,
            ],
        )
        .await
        .map_err(classify)?
        .get(0);
    Ok(usize::try_from(quarantined).is_ok_and(|n| n == offsets.len()))
}

/// The error of a build batch holding a record older than the ledger's horizon (`horizoned`: the batch with
/// those records quarantined): its ledger row may have been pruned, so whether it was claimed before the
/// hand-over cannot be known — the build stops rather than guess.
pub(super) fn beyond_horizon(p: &Pipeline, horizoned: &Batch) -> ApplyError {
    let first = horizoned.items.iter().find(|it| {
        matches!(&it.pending, Pending::Quarantine(r) if r.reason == crate::decode::Reason::BeyondHorizon)
    });
    let at = first.map_or(String::new(), |it| format!(" at offset {}", it.offset));
    ApplyError::Fatal(Error::Other(format!(
        "{}/{}: a record{at} is older than the horizon of ledger {} ({}): its delivery key may have been \
         pruned (it is at or below the offsets a prune recorded, or production left no `beyond-horizon` dead \
         letter of it), so whether production landed it cannot be known. Nothing of this batch was applied; \
         rerun the build from a later start with `--from TIME` (records of event days inside the horizon)",
        horizoned.topic,
        horizoned.partition,
        p.ledger.table,
        p.table(HORIZON)
    )))
}
