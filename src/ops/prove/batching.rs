//! Boundaries 10 and 11 (issue 34): where batches end, and the same records applied again into a fresh schema.
//! Both build their state from scratch on fresh schemas and compare it with the reference (boundary 1).

use std::sync::Arc;

use super::boundaries::{judge, kafka_run, scripted_with, Done};
use super::scratch::Variant;
use super::state::{Norm, Snapshot};
use super::Prover;
use crate::config::Pipeline;
use crate::error::Result;

/// The fixed batch sizes of boundary 10.
pub const BATCH_SIZES: [usize; 3] = [1, 7, 5000];

/// Boundary 10: the fixture's records, in the order published, applied with `batch.max-records` 1, 7 and 5000
/// (one connection, records handed as batches free up), then in chunks of seeded random sizes (1 to `n / 20`
/// records, at least 2 and at most 500: [`super::source::Scripted::with_cuts`]) with batch size 5000: batches
/// end at random places. Each run
/// on a fresh schema; every state must be the reference's — batch boundaries must not change a value (a row
/// state, a tombstone's `_last`, a count).
pub(super) fn batching(pr: &mut Prover, _p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    let mut runs = 0u64;
    let chunk = (pr.records.len() / 20).clamp(2, 500);
    let plans: Vec<(String, usize, Option<usize>)> = BATCH_SIZES
        .iter()
        .map(|&m| (format!("batch size {m}"), m, None))
        .chain(std::iter::once((
            format!("random cuts (chunks of 1–{chunk}, seed {})", pr.opts.seed),
            5000,
            Some(chunk),
        )))
        .collect();
    for (what, max, cuts) in &plans {
        let schema = pr.fresh_schema()?;
        let v = Variant {
            schema,
            max_records: Some(*max),
            linger_ms: Some(1),
            connections: Some(1),
            ..Variant::default()
        };
        let p = pr.pipeline(&v, &format!("prove-batching-{}", runs + 1))?;
        let cut = cuts.map(|c| (pr.opts.seed, c));
        let (tally, delivered) = scripted_with(pr, &p, pr.records.clone(), cut.is_none(), cut)?;
        runs += 1;
        pr.account(&format!("10 {what}"), delivered, &tally);
        pr.tick("10 batch boundaries");
        let got = pr.snapshot(&p, &Norm::default())?;
        let d = judge(reference, &got, runs, String::new(), what.clone())?;
        if d.failure.is_some() {
            return Ok(d);
        }
        pr.drop_schema(p.postgres.schema.as_str());
    }
    let names: Vec<&str> = plans.iter().map(|(w, _, _)| w.as_str()).collect();
    Done::pass(runs, format!("{}; state identical", names.join(", ")))
}

/// Boundary 11: the whole topic applied once more, as boundary 1 did (`run --until-caught-up` under a consumer
/// group), but under a fresh group into a fresh schema: a second reference. Whatever the consumer's fetches
/// interleave differently this time must not change the state — it catches a projection whose result depends
/// on which partition's batch commits first, without a shuffle.
pub(super) fn again(pr: &mut Prover, _p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    let schema = pr.fresh_schema()?;
    let v = Variant {
        schema,
        ..Variant::default()
    };
    let p = pr.pipeline(&v, "prove-again")?;
    let tally = kafka_run(pr, &p)?;
    pr.account("11 again, fresh schema", pr.records.len() as u64, &tally);
    pr.tick("11 again");
    let got = pr.snapshot(&p, &Norm::default())?;
    judge(
        reference,
        &got,
        1,
        format!("{}; state identical", tally.line()),
        "the same records again into a fresh schema".into(),
    )
}
