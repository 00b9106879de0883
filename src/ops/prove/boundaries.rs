//! The twelve boundaries. Each returns its [`Boundary`] row; an error inside one is that boundary's failure (the
//! others still run). Boundaries 2, 5 and 6 apply on top of the reference state (schema of boundary 1); 3, 4,
//! 7, 8, 9, 10 and 11 ([`super::batching`]) build their state from scratch on their own schema; 12 checks the
//! accounting of every run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::report::{Boundary, Report};
use super::scratch::{Rec, Variant};
use super::source::Scripted;
use super::state::{diff, missing_rows, without_columns, Norm, Snapshot};
use super::{ms, Prover};
use crate::config::{Format, Pipeline};
use crate::engine::{Engine, Options, Tp};
use crate::error::{Error, Result};
use crate::model::Tally;
use crate::ops::run::{self, RunOptions};
use crate::sink::fault::Fault;

/// Rows shown per table and direction in a diff.
const DIFF_ROWS: usize = 5;
/// Crash points at most (boundary 3): past this many commits, a crash every `n / MAX_CRASHES` commits.
const MAX_CRASHES: usize = 100;

/// What a boundary body returns: pass (`None`) or the failure, its runs and its note.
pub(super) struct Done {
    runs: u64,
    note: String,
    pub(super) failure: Option<(String, Vec<super::state::TableDiff>)>,
}

impl Done {
    pub(super) fn pass(runs: u64, note: impl Into<String>) -> Result<Done> {
        Ok(Done {
            runs,
            note: note.into(),
            failure: None,
        })
    }
}

/// Runs every boundary and builds the report.
///
/// # Errors
/// Only when the reference (boundary 1) cannot be made.
pub fn run_all(pr: &mut Prover) -> Result<Report> {
    let n = pr.records.len();
    let crashes = n.min(MAX_CRASHES) as u64;
    if pr.opts.progress {
        let batching = super::batching::BATCH_SIZES.len() as u64 + 1;
        let bar =
            indicatif::ProgressBar::new(12 + batching + crashes + u64::from(pr.opts.shuffles));
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        pr.bar = Some(bar);
    }
    let started = Instant::now();
    let s0 = pr.fresh_schema()?;
    let v0 = Variant {
        schema: s0,
        ..Variant::default()
    };
    let p0 = pr.pipeline(&v0, "prove-reference")?;
    let tally = kafka_run(pr, &p0)?;
    pr.check()?;
    pr.account("1 apply once", n as u64, &tally);
    pr.tick("1 apply once");
    let reference = pr.snapshot(&p0, &Norm::default())?;
    let rows: usize = reference.values().map(|t| t.rows.len()).sum();
    let mut out = vec![Boundary {
        number: 1,
        name: "apply once (reference)",
        result: "pass",
        runs: 1,
        ms: ms(started),
        note: format!(
            "{}; {rows} rows in {} tables",
            tally.line(),
            reference.len()
        ),
        diff: Vec::new(),
    }];
    type Body = fn(&mut Prover, &Arc<Pipeline>, &Snapshot) -> Result<Done>;
    let bodies: [(u8, &'static str, Body); 10] = [
        (2, "apply twice (fresh group)", apply_twice),
        (3, "crash between DB and Kafka commit", crash),
        (4, "permitted shuffles", shuffles),
        (5, "rebuilt topic (new offsets)", rebuilt),
        (6, "resnapshot (op = r)", resnapshot),
        (7, "expired ledger entry", expired),
        (8, "two workers, two groups at once", concurrent),
        (9, "uncertain commit", uncertain),
        (10, "batch boundaries", super::batching::batching),
        (11, "again, into a fresh schema", super::batching::again),
    ];
    for (number, name, body) in bodies {
        pr.check()?;
        let t = Instant::now();
        if let Some(b) = &pr.bar {
            b.set_message(format!("{number} {name}"));
        }
        let done = body(pr, &p0, &reference);
        out.push(row(number, name, t, done));
    }
    let t = Instant::now();
    let accounting = match pr.accounting.is_empty() {
        true => Done::pass(
            0,
            format!(
                "consumed = landed + duplicate + stale + filtered + quarantined on all {} runs",
                pr.runs_checked
            ),
        ),
        false => Ok(Done {
            runs: 0,
            note: String::new(),
            failure: Some((pr.accounting.join("; "), Vec::new())),
        }),
    };
    out.push(row(12, "accounting", t, accounting));
    Ok(Report {
        pipeline: pr.base.name.clone(),
        answers: pr.user.four_answers(),
        records: n,
        partitions: pr
            .records
            .iter()
            .map(|r| r.tp.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        seed: pr.opts.seed,
        run_id: pr.run_id.clone(),
        kept: Vec::new(),
        kept_topics: Vec::new(),
        passed: out.iter().all(Boundary::ok),
        boundaries: out,
    })
}

fn row(number: u8, name: &'static str, t: Instant, done: Result<Done>) -> Boundary {
    let (result, runs, note, diff) = match done {
        Ok(Done {
            runs,
            note,
            failure: None,
        }) if note.starts_with("n/a") => ("n/a", runs, note, Vec::new()),
        Ok(Done {
            runs,
            note,
            failure: None,
        }) => ("pass", runs, note, Vec::new()),
        Ok(Done {
            runs,
            failure: Some((why, diff)),
            ..
        }) => ("fail", runs, why, diff),
        Err(e) => ("fail", 0, format!("error: {e}"), Vec::new()),
    };
    Boundary {
        number,
        name,
        result,
        runs,
        ms: ms(t),
        note,
        diff,
    }
}

/// Compares a state with the reference: pass, or the failure with the diff.
pub(super) fn judge(
    want: &Snapshot,
    got: &Snapshot,
    runs: u64,
    ok: String,
    bad: String,
) -> Result<Done> {
    let d = diff(want, got, DIFF_ROWS);
    if d.is_empty() {
        return Done::pass(runs, ok);
    }
    let tables: Vec<&str> = d.iter().map(|t| t.table.as_str()).collect();
    Ok(Done {
        runs,
        note: String::new(),
        failure: Some((format!("{bad}: {} differ", tables.join(", ")), d)),
    })
}

/// `run --until-caught-up` of `p` on the scratch topic (a real consumer group).
pub(super) fn kafka_run(pr: &Prover, p: &Arc<Pipeline>) -> Result<Tally> {
    let stop = pr.opts.interrupt.clone();
    let tally = kafka_run_on(
        pr.rt.handle().clone(),
        &pr.cluster.brokers,
        &pr.url,
        p,
        stop,
    )?;
    pr.check()?;
    Ok(tally)
}

fn kafka_run_on(
    rt: tokio::runtime::Handle,
    brokers: &str,
    url: &str,
    p: &Arc<Pipeline>,
    stop: Arc<AtomicBool>,
) -> Result<Tally> {
    let opts = RunOptions {
        brokers: brokers.to_string(),
        database_url: url.to_string(),
        until_caught_up: true,
        shutdown: stop,
        give_up: None,
        summary_interval: Duration::from_secs(3600),
        crash_after_batches: None,
        extra_properties: vec![("session.timeout.ms".into(), "6000".into())],
        prune_interval: Duration::from_secs(3600),
        state: None,
    };
    run::run_on(rt, p.clone(), opts)
}

/// The engine over the scripted source: `order` under `p`'s group; returns the tally and the records handed.
fn scripted(
    pr: &Prover,
    p: &Arc<Pipeline>,
    order: Vec<Rec>,
    paced: bool,
    crash: Option<u64>,
    fault: Option<Arc<Fault>>,
) -> Result<(Tally, u64)> {
    run_scripted(pr, p, order, paced, None, crash, fault)
}

/// [`scripted`] without faults, the records handed in chunks of random sizes when `cuts` is `Some((seed,
/// max))` ([`Scripted::with_cuts`]).
pub(super) fn scripted_with(
    pr: &Prover,
    p: &Arc<Pipeline>,
    order: Vec<Rec>,
    paced: bool,
    cuts: Option<(u64, usize)>,
) -> Result<(Tally, u64)> {
    run_scripted(pr, p, order, paced, cuts, None, None)
}

fn run_scripted(
    pr: &Prover,
    p: &Arc<Pipeline>,
    order: Vec<Rec>,
    paced: bool,
    cuts: Option<(u64, usize)>,
    crash: Option<u64>,
    fault: Option<Arc<Fault>>,
) -> Result<(Tally, u64)> {
    let mut o = Options::new(&pr.url, pr.opts.interrupt.clone());
    o.crash_after_batches = crash;
    o.fault = fault;
    o.prune_on_start = false;
    let engine = Engine::start(pr.rt.handle(), p.clone(), o)?;
    let mut source = Scripted::new(
        engine.shared(),
        &pr.cluster.client(),
        &p.kafka.group_id,
        order,
        paced,
    )?;
    if let Some((seed, max)) = cuts {
        source = source.with_cuts(seed, max);
    }
    let delivered = source.delivered.clone();
    let tally = engine.run(source)?;
    pr.check()?;
    Ok((tally, delivered.load(Ordering::Relaxed)))
}

fn apply_twice(pr: &mut Prover, p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    let p = pr.pipeline(&schema_of(p0), "prove-replay")?;
    let tally = kafka_run(pr, &p)?;
    pr.account("2 apply twice", pr.records.len() as u64, &tally);
    pr.tick("2 apply twice");
    let got = pr.snapshot(&p, &Norm::default())?;
    judge(
        reference,
        &got,
        1,
        format!("{}; state identical", tally.line()),
        "the replay changed the state".into(),
    )
}

fn schema_of(p: &Pipeline) -> Variant {
    Variant {
        schema: p.postgres.schema.as_str().to_string(),
        ..Variant::default()
    }
}

/// Boundary 3: batch size 1, one connection; run after run, each ends ("crashes") after `step` database
/// commits without the Kafka commit of the last one (every commit when the fixture has at most [`MAX_CRASHES`]
/// records). Every other restart resumes from the checkpoints; the others lose them first and start from the
/// group's committed Kafka offsets, as a hand-made consumer would (the records after them are read again).
fn crash(pr: &mut Prover, _p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    let schema = pr.fresh_schema()?;
    let v = Variant {
        schema,
        max_records: Some(1),
        connections: Some(1),
        linger_ms: Some(1),
        ..Variant::default()
    };
    let p = pr.pipeline(&v, "prove-crash")?;
    let n = pr.records.len();
    let step = n.div_ceil(MAX_CRASHES) as u64;
    let tps: Vec<Tp> = ends(&pr.records).into_keys().collect();
    let (mut runs, mut from_kafka, mut reread) = (0u64, 0u64, 0u64);
    loop {
        let kafka_restart = runs % 2 == 1;
        let mut limit = step;
        if kafka_restart {
            // What the checkpoints hold beyond Kafka's committed offsets is read again: one commit each.
            let db = checkpoints(pr, &p)?;
            let committed = super::source::KafkaAck::new(&pr.cluster.client(), &p.kafka.group_id)?
                .committed(&tps)?;
            let first = |tp: &Tp| {
                pr.records
                    .iter()
                    .find(|r| &r.tp == tp)
                    .map_or(0, |r| r.offset)
            };
            let lag: i64 = db
                .iter()
                .map(|(tp, next)| next - committed.get(tp).copied().unwrap_or_else(|| first(tp)))
                .filter(|l| *l > 0)
                .sum();
            pr.rt.block_on(pr.client.execute(
                &format!(
                    "DELETE FROM {} WHERE consumer_group = $1",
                    p.table("replaysafe_checkpoints")
                ),
                &[&p.kafka.group_id],
            ))?;
            from_kafka += 1;
            reread += crate::units::count(lag);
            limit += crate::units::count(lag);
        }
        let (tally, delivered) = scripted(pr, &p, pr.records.clone(), true, Some(limit), None)?;
        runs += 1;
        pr.account(&format!("3 crash run {runs}"), delivered, &tally);
        pr.tick("3 crash");
        tracing::debug!(run = runs, kafka_restart, limit, delivered, tally = %tally.line(), "prove: crash run");
        if delivered < limit {
            break;
        }
        if runs > n as u64 * 2 + 10 {
            return Err(Error::Other(format!("no progress after {runs} crash runs")));
        }
    }
    let got = pr.snapshot(&p, &Norm::default())?;
    judge(
        reference,
        &got,
        runs,
        format!(
            "{}, {from_kafka} restarts from Kafka's committed offsets ({reread} records read again); state identical",
            crash_points(runs - 1, n as u64, step)
        ),
        format!("after {} crash/restart runs", runs - 1),
    )
}

/// What boundary 3 covered: `crash points: C of N commits` (batch size 1: a commit per record), and when the
/// fixture has more than [`MAX_CRASHES`] records, that they were sampled (every `step`-th commit).
pub fn crash_points(crashes: u64, commits: u64, step: u64) -> String {
    if step == 1 {
        format!("crash points: {crashes} of {commits} commits (every commit)")
    } else {
        format!(
            "crash points: {crashes} of {commits} commits (sampled: one every {step} commits, at most {MAX_CRASHES})"
        )
    }
}

/// Each partition's end (next offset after its last record).
fn ends(records: &[Rec]) -> BTreeMap<Tp, i64> {
    let mut m = BTreeMap::new();
    for r in records {
        let e = m.entry(r.tp.clone()).or_insert(0);
        *e = (*e).max(r.offset + 1);
    }
    m
}

/// The group's checkpoints in `p`'s schema.
fn checkpoints(pr: &Prover, p: &Pipeline) -> Result<BTreeMap<Tp, i64>> {
    let rows = pr.rt.block_on(pr.client.query(
        &format!(
            "SELECT topic, \"partition\", next_offset FROM {} WHERE consumer_group = $1 AND next_offset IS NOT NULL",
            p.table("replaysafe_checkpoints")
        ),
        &[&p.kafka.group_id],
    ))?;
    Ok(rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect())
}

/// A permitted order of `records`: partitions interleaved at random (seeded), each partition's order kept.
pub fn shuffle(records: &[Rec], seed: u64) -> Vec<Rec> {
    let mut queues: BTreeMap<Tp, std::collections::VecDeque<Rec>> = BTreeMap::new();
    for r in records {
        queues.entry(r.tp.clone()).or_default().push_back(r.clone());
    }
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(records.len());
    while out.len() < records.len() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let left: usize = queues.values().map(|q| q.len()).sum();
        let mut pick = crate::units::len(x % left as u64);
        for q in queues.values_mut() {
            if pick < q.len() {
                out.push(q.pop_front().expect("checked non-empty just above"));
                break;
            }
            pick -= q.len();
        }
    }
    out
}

fn shuffles(pr: &mut Prover, _p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    let n = pr.records.len();
    let m = (n / 100).clamp(1, pr.user.max_records);
    for i in 0..pr.opts.shuffles {
        let schema = pr.fresh_schema()?;
        let v = Variant {
            schema,
            max_records: Some(m),
            linger_ms: Some(1),
            ..Variant::default()
        };
        let p = pr.pipeline(&v, &format!("prove-shuffle-{}", i + 1))?;
        let seed = pr.opts.seed.wrapping_add(u64::from(i));
        let (tally, delivered) = scripted(pr, &p, shuffle(&pr.records, seed), true, None, None)?;
        pr.account(&format!("4 shuffle {}", i + 1), delivered, &tally);
        pr.tick("4 shuffles");
        let got = pr.snapshot(&p, &Norm::default())?;
        let d = judge(
            reference,
            &got,
            u64::from(i) + 1,
            String::new(),
            format!("shuffle {} (seed {seed})", i + 1),
        )?;
        if d.failure.is_some() {
            return Ok(d);
        }
        pr.drop_schema(p.postgres.schema.as_str());
    }
    Done::pass(
        u64::from(pr.opts.shuffles),
        format!(
            "{} interleavings of the partitions (batches of {m}); state identical",
            pr.opts.shuffles
        ),
    )
}

/// Boundary 5: the records republished at new offsets (2 × offset + 1: gaps, as transaction markers leave);
/// with a `generation`, under a new generation on a fresh schema (every key is new there), else on top of the
/// reference under a fresh group (every record a duplicate, no new outbox row).
fn rebuilt(pr: &mut Prover, p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    // With a generation the reference is read again with its generation columns left out (see below).
    let moved: Vec<Rec> = pr
        .records
        .iter()
        .map(|r| Rec {
            offset: 2 * r.offset + 1,
            ..r.clone()
        })
        .collect();
    let Some(gen) = pr.user.identity.generation.clone() else {
        let p = pr.pipeline(&schema_of(p0), "prove-rebuilt")?;
        let (tally, delivered) = scripted(pr, &p, moved, false, None, None)?;
        pr.account("5 rebuilt topic", delivered, &tally);
        pr.tick("5 rebuilt");
        let got = pr.snapshot(&p, &Norm::default())?;
        return judge(
            reference,
            &got,
            1,
            format!("{}; state identical, no new outbox row", tally.line()),
            "the rebuilt topic changed the state".into(),
        );
    };
    let new = format!("{gen}-rebuilt-{}", pr.run_id);
    let schema = pr.fresh_schema()?;
    let v = Variant {
        schema,
        generation: Some(new.clone()),
        ..Variant::default()
    };
    let p = pr.pipeline(&v, "prove-rebuilt")?;
    let (tally, delivered) = scripted(pr, &p, moved, false, None, None)?;
    pr.account("5 rebuilt topic", delivered, &tally);
    pr.tick("5 rebuilt");
    let norm = Norm {
        generation: Some((gen.clone(), new.clone())),
    };
    let want = pr.snapshot(
        p0,
        &Norm {
            generation: Some((gen.clone(), gen)),
        },
    )?;
    let got = pr.snapshot(&p, &norm)?;
    judge(
        &want,
        &got,
        1,
        format!(
            "under generation `{new}`: {}; state identical (generation aside)",
            tally.line()
        ),
        "the rebuilt topic under a new generation ends differently".into(),
    )
}

/// Boundary 6 (Debezium pipelines): a resnapshot as Debezium makes one (an incremental or blocking snapshot, or
/// a new initial snapshot after the slot was lost): for every entity that exists at the fixture's end, one
/// snapshot read (`op = r`) of its current state at a new source position above every position of the fixture,
/// appended after the topic's end on the entity's partition; nothing for deleted entities. Applied on top of the
/// reference under a fresh group: every read is of a row already stored in that state, so it must be a
/// `duplicate` (docs/cdc.md "Snapshots") and the state identical — projections, tombstones, conflicts, outbox, dead
/// letters — but for the bookkeeping such a read advances: the row's `_version`, `_position`, `_delivery`, and
/// its claim in the ledger.
fn resnapshot(pr: &mut Prover, p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    if pr.user.format != Format::Debezium {
        return Done::pass(0, "n/a: not a Debezium pipeline (no snapshot reads)");
    }
    let (reads, ambiguous) = super::resnap::reads(&pr.records);
    let p = pr.pipeline(&schema_of(p0), "prove-resnapshot")?;
    let (tally, delivered) = scripted(pr, &p, reads, false, None, None)?;
    pr.account("6 resnapshot", delivered, &tally);
    pr.tick("6 resnapshot");
    let got = pr.snapshot(&p, &Norm::default())?;
    // A newer snapshot read of the same state is a duplicate that leaves its claim in the ledger, and the row
    // takes its version, delivery and position (docs/cdc.md "Snapshots", `duplicate`): those are left out; every
    // reference ledger row must still be there, and at most one more per read.
    let ledger = p.ledger.table.name.as_str();
    let (lost, more) = missing_rows(reference, &got, ledger);
    let keep = |s: &Snapshot| -> Snapshot {
        let s = without_columns(s, &["_version", "_position", "_delivery"]);
        s.into_iter().filter(|(t, _)| t != ledger).collect()
    };
    let why = if tally.landed > 0 || tally.stale > 0 {
        Some("a snapshot read of an unchanged row must be a duplicate")
    } else if lost > 0 || more > crate::units::bigint(delivered) {
        Some("the ledger lost reference rows or gained more than one per read")
    } else {
        None
    };
    let seen = format!(
        "{delivered} snapshot reads of the current state at a new position{}: {}",
        if ambiguous > 0 {
            format!(
                " ({ambiguous} entit{} with two states at its newest position not read: the source's state is \
                 not known)",
                if ambiguous == 1 { "y" } else { "ies" }
            )
        } else {
            String::new()
        },
        tally.line()
    );
    if let Some(why) = why {
        return Ok(Done {
            runs: 1,
            note: String::new(),
            failure: Some((format!("{seen} — {why}"), diff(reference, &got, DIFF_ROWS))),
        });
    }
    judge(
        &keep(reference),
        &keep(&got),
        1,
        format!("{seen}; state identical (versions/positions aside), no side effects"),
        "the resnapshot (current state at new positions) changed the state".into(),
    )
}

/// Boundary 7: the records applied on a fresh schema, then every ledger day partition dropped past the horizon
/// (`pruned_below` moved after the last event day, as time passing would), then replayed under a fresh group:
/// every record the ledger had claimed must be quarantined as `beyond-horizon`, the projections unchanged.
fn expired(pr: &mut Prover, _p0: &Arc<Pipeline>, _reference: &Snapshot) -> Result<Done> {
    let Some(pb) = pr.user.identity.partition_by else {
        return Done::pass(
            0,
            "n/a: no `partition-by`: the ledger keeps every key (no horizon)",
        );
    };
    let schema = pr.fresh_schema()?;
    let v = Variant {
        schema,
        ..Variant::default()
    };
    let p = pr.pipeline(&v, "prove-expired")?;
    let (first, delivered) = scripted(pr, &p, pr.records.clone(), false, None, None)?;
    pr.account("7 expired: first apply", delivered, &first);
    pr.tick("7 expired");
    let claimed = first.landed + first.duplicate + first.stale;
    let keep = |s: Snapshot| -> Snapshot {
        s.into_iter()
            .filter(|(t, _)| t != p.ledger.table.name.as_str() && t != "replaysafe_dead_letters")
            .collect()
    };
    let day = &pr.user.fields[pb].name;
    let pruned: Option<chrono::NaiveDate> = pr.rt.block_on(async {
        let max: Option<chrono::NaiveDate> = pr
            .client
            .query_one(&format!("SELECT max(\"{}\")::date FROM {}", day.as_str(), p.ledger.table), &[])
            .await?
            .get(0);
        let Some(max) = max else { return Ok::<_, Error>(None) };
        let below = max.succ_opt().unwrap_or(max);
        pr.client
            .execute(
                &format!(
                    "INSERT INTO {} AS h (ledger, pruned_below) VALUES ($1, $2) ON CONFLICT (ledger) DO UPDATE \
                     SET pruned_below = greatest(h.pruned_below, EXCLUDED.pruned_below)",
                    p.table(crate::sink::ledger::HORIZON)
                ),
                &[&p.ledger.table.to_string(), &below],
            )
            .await?;
        let mut admin = crate::sink::connect(&pr.url).await?;
        crate::sink::ledger::drop_expired_partitions(&mut admin, &p).await?;
        Ok(Some(below))
    })?;
    let Some(below) = pruned else {
        return Done::pass(
            1,
            "n/a: no record was claimed in the ledger (nothing to expire)",
        );
    };
    // Taken after the prune: what it purges by its declared lifecycle (conflicts, tombstones older than the
    // horizon) is not the replay's doing; the replay must change nothing of what is left.
    let before = keep(pr.snapshot(&p, &Norm::default())?);
    let p2 = pr.pipeline(&schema_of(&p), "prove-expired-replay")?;
    let tally = match scripted(pr, &p2, pr.records.clone(), false, None, None) {
        Ok((tally, delivered)) => {
            pr.account("7 expired: replay", delivered, &tally);
            tally
        }
        // `[errors] tolerance = "none"`: a replay quarantining a run of records as beyond-horizon is refused
        // (the batch rolled back) — the declared policy too; the projections must be unchanged all the same.
        Err(Error::Tolerance(why)) if why.contains("beyond-horizon") => {
            pr.tick("7 expired");
            let after = keep(pr.snapshot(&p2, &Norm::default())?);
            return judge(
                &before,
                &after,
                2,
                format!(
                    "ledger pruned below {below}; the replay was refused by [errors] tolerance \
                     (beyond-horizon, nothing committed); projections unchanged"
                ),
                "the replay past the horizon changed the projections".into(),
            );
        }
        // The pruned offsets (docs/replay.md "The ledger's lifecycle"): a replay reaching offsets whose ledger rows a
        // prune dropped is refused before anything is committed — the declared policy as well.
        Err(Error::BelowHorizon(why)) => {
            pr.tick("7 expired");
            let after = keep(pr.snapshot(&p2, &Norm::default())?);
            let first = why.split(':').next().unwrap_or_default().to_string();
            return judge(
                &before,
                &after,
                2,
                format!(
                    "ledger pruned below {below}; the replay was refused (offsets of {first} below the pruned \
                     horizon, nothing committed); projections unchanged"
                ),
                "the replay past the horizon changed the projections".into(),
            );
        }
        Err(e) => return Err(e),
    };
    pr.tick("7 expired");
    let beyond = tally
        .quarantined
        .get("beyond-horizon")
        .copied()
        .unwrap_or(0);
    let after = keep(pr.snapshot(&p2, &Norm::default())?);
    if beyond != claimed {
        return Ok(Done {
            runs: 2,
            note: String::new(),
            failure: Some((
                format!("ledger pruned below {below}: {claimed} records were claimed before, but the replay quarantined {beyond} as beyond-horizon ({})", tally.line()),
                Vec::new(),
            )),
        });
    }
    judge(
        &before,
        &after,
        2,
        format!("ledger pruned below {below}; the replay quarantined all {beyond} claimed records as beyond-horizon; projections unchanged"),
        "the replay past the horizon changed the projections".into(),
    )
}

/// Boundary 8: two workers of one group and a worker of a second group, at once, on a fresh schema (real
/// consumer groups on the scratch topic).
fn concurrent(pr: &mut Prover, _p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    let schema = pr.fresh_schema()?;
    let v = Variant {
        schema,
        ..Variant::default()
    };
    let a = pr.pipeline(&v, "prove-two-workers")?;
    let b = pr.pipeline(&v, "prove-second-group")?;
    pr.rt.block_on(async {
        let mut c = crate::sink::connect(&pr.url).await?;
        crate::sink::verify::prepare(&mut c, &a).await
    })?;
    let handles: Vec<_> = [a.clone(), a.clone(), b.clone()]
        .into_iter()
        .map(|p| {
            let (rt, brokers, url, stop) = (
                pr.rt.handle().clone(),
                pr.cluster.brokers.clone(),
                pr.url.clone(),
                pr.opts.interrupt.clone(),
            );
            std::thread::spawn(move || kafka_run_on(rt, &brokers, &url, &p, stop))
        })
        .collect();
    let mut tallies = Vec::new();
    for h in handles {
        tallies.push(
            h.join()
                .map_err(|_| Error::Other("a worker thread panicked".into()))??,
        );
        pr.tick("8 two workers, two groups");
    }
    pr.check()?;
    let n = pr.records.len() as u64;
    let group_a = tallies[0].total() + tallies[1].total();
    pr.account("8 second group", n, &tallies[2]);
    if group_a < n {
        pr.accounting.push(format!(
            "8 two workers: together they consumed {group_a} of {n} records"
        ));
    }
    let got = pr.snapshot(&a, &Norm::default())?;
    judge(
        reference,
        &got,
        3,
        format!(
            "group A: {} + {}; group B: {}; state identical",
            tallies[0].line(),
            tallies[1].line(),
            tallies[2].line()
        ),
        "two workers and two groups at once".into(),
    )
}

/// Boundary 9: every second COMMIT's reply (every `commits / 16`-th on a large fixture) lost (the connection cut after COMMIT), alternately with the COMMIT
/// applied and not applied; the engine retries with the same keys.
fn uncertain(pr: &mut Prover, _p0: &Arc<Pipeline>, reference: &Snapshot) -> Result<Done> {
    let schema = pr.fresh_schema()?;
    let m = (pr.records.len() / 8).clamp(1, pr.user.max_records);
    let v = Variant {
        schema,
        max_records: Some(m),
        ..Variant::default()
    };
    let p = pr.pipeline(&v, "prove-uncertain")?;
    // About 16 lost replies at most: each costs a reconnect and a backoff.
    let commits = pr.records.len().div_ceil(m) as u64;
    let fault = Arc::new(Fault::uncertain_commits((commits / 16).max(2)));
    let (tally, delivered) =
        scripted(pr, &p, pr.records.clone(), false, None, Some(fault.clone()))?;
    pr.account("9 uncertain commit", delivered, &tally);
    pr.tick("9 uncertain commit");
    let (applied, lost) = fault.fired();
    let got = pr.snapshot(&p, &Norm::default())?;
    judge(
        reference,
        &got,
        1,
        format!("{applied} COMMITs applied and {lost} not applied, each reply lost and retried; state identical"),
        format!("after {applied} lost replies of applied COMMITs and {lost} of COMMITs not applied"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_points_say_when_they_were_sampled() {
        assert_eq!(
            crash_points(29, 30, 1),
            "crash points: 29 of 30 commits (every commit)"
        );
        let n = 10_517u64;
        let step = n.div_ceil(MAX_CRASHES as u64);
        assert_eq!(
            crash_points(n / step, n, step),
            "crash points: 99 of 10517 commits (sampled: one every 106 commits, at most 100)"
        );
    }
}
