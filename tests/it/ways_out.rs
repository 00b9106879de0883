//! Issue 41: every state an interrupted operation can leave — a backfill, a `projection build` and a `rebuild`
//! each killed (`kill -9`, its batch held before its COMMIT) mid-way, before and after a prune — and the way out
//! the "… if it stopped here → do this" tables of docs/replay.md give for it, followed to the letter while
//! production writes and late events (of earlier days, the pruned day among them) arrive. Each test ends with
//! the tables compared with a reference schema that applied the same records once, under the same horizon
//! history (the prune at the same point): the aggregate rows, the ledger's delivery keys, the dead letters, the
//! checkpoints, nothing left `building` or kept by a rebuild.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, Utc};

use crate::common::*;

/// One partition, one record per batch (so a batch held before its COMMIT is one known offset); a counter per
/// day; the ledger keeps `{horizon}` days; `FILTER` is where the buggy deployment's filter goes.
const P: &str = concat!(
    header!(),
    r#"lock-timeout-ms = 2000
[batch]
max-records = 1
linger-ms = 10

[fields]
event_id = { path = "/event_id", type = "uuid" }
kind = { path = "/kind", type = "text" }
day = { path = "/occurred_at", type = "date" }

FILTER
[identity]
key = ["event_id"]
partition-by = "day"

[ledger]
horizon-days = {horizon}

[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day"]
column = "n"
"#
);

/// The deployment that dropped refunds (what a backfill or a rebuild repairs).
const BUGGY: &str = "[[filter]]\nname = \"no-refunds\"\ndrop-if = \"kind == 'refund'\"\n";

/// The projection added to the running pipeline (what `projection build` builds).
const ADDED: &str = r#"
[[projection]]
kind = "counter"
table = "by_kind"
group-by = ["day", "kind"]
"#;

/// The horizon before the prune (nothing expires) and after it (the day 10 days ago expires).
const LONG: u32 = 30;
const SHORT: u32 = 5;

/// The three operations, each killed mid-way.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Backfill,
    Build,
    Rebuild,
}

fn days_ago(n: u64) -> NaiveDate {
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(n))
        .unwrap()
}

fn rfc3339(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339()
}

/// The world of one test: the schema the operations run on, the reference schema that applies every record
/// once, the topic, and what was produced (offset → (event day, kind)).
struct World {
    op: Op,
    db: Db,
    reference: Db,
    topic: String,
    prod: String,
    base: i64,
    produced: Vec<(u64, &'static str)>,
}

impl World {
    fn new(op: Op, prefix: &str) -> World {
        let (db, topic) = stage(prefix, 1);
        World {
            op,
            db,
            reference: Db::fresh(&format!("{prefix}_ref")),
            topic,
            prod: unique("prod"),
            base: Utc::now().timestamp_millis() - 600_000,
            produced: Vec::new(),
        }
    }

    /// The pipeline file of `horizon` days: production's (`buggy`: the deployment before the fix; the build's
    /// pipelines carry the added projection once it was added) on `db` or on the reference schema.
    fn file(&self, horizon: u32, buggy: bool, added: bool, reference: bool) -> Pipeline {
        let mut text = P
            .replace("FILTER", if buggy { BUGGY } else { "" })
            .replace("{horizon}", &horizon.to_string());
        if added {
            text.push_str(ADDED);
        }
        let (schema, group) = match reference {
            true => (&self.reference.schema, format!("{}-ref", self.prod)),
            false => (&self.db.schema, self.prod.clone()),
        };
        pipeline(&text, &self.topic, &group, schema)
    }

    /// The production file now (`horizon` days, the fix deployed, the added projection for a build).
    fn production(&self, horizon: u32) -> Pipeline {
        self.file(horizon, false, self.op == Op::Build, false)
    }

    /// The reference: the fixed pipeline (with the added projection for a build) from the start.
    fn reference_file(&self, horizon: u32) -> Pipeline {
        self.file(horizon, false, self.op == Op::Build, true)
    }

    /// Produces events `(days ago, kind)`, the history's record times inside a backfill's window (before
    /// `base + 50 s`), later ones after it.
    fn produce(&mut self, events: &[(u64, &'static str)], later: bool) {
        let recs: Vec<Rec> = events
            .iter()
            .enumerate()
            .map(|(i, (ago, kind))| {
                let n = self.produced.len() + i;
                let id = format!("41a1a100-6a55-4c0b-9a55-{n:012}");
                let value = format!(
                    r#"{{"event_id":"{id}","kind":"{kind}","occurred_at":"{}T12:00:00Z"}}"#,
                    days_ago(*ago)
                );
                let ts = ts(self.base, n as i64);
                assert_eq!(later, n >= HISTORY.len());
                Rec::json(0, &format!("k{n}"), &value, ts)
            })
            .collect();
        produce(&self.topic, &recs);
        self.produced.extend_from_slice(events);
    }

    fn end(&self) -> i64 {
        self.produced.len() as i64
    }
}

/// The history: events of 10 days ago (the day the prune expires), 3 days ago and today; refunds of the days
/// inside the horizon only (the buggy deployment dropped them).
const HISTORY: [(u64, &str); 8] = [
    (10, "sale"),
    (3, "sale"),
    (0, "sale"),
    (3, "refund"),
    (10, "sale"),
    (0, "refund"),
    (3, "sale"),
    (10, "sale"),
];

/// Late events production writes after the kill: one of the expiring day, one of 3 days ago, a refund of today.
const LATE: [(u64, &str); 3] = [(10, "sale"), (3, "sale"), (0, "refund")];

/// Late events production writes while the way out runs.
const DURING: [(u64, &str); 2] = [(3, "sale"), (0, "sale")];

/// The batch the killed process holds before its COMMIT when it is killed: three committed before it.
const KILLED_AT: u32 = 4;

/// Runs `args` with the `KILLED_AT`-th batch held before its COMMIT (failpoint `hold-before-db-commit`) and kills
/// the process there with SIGKILL (`kill -9`): the held transaction is rolled back with the connection.
fn kill_mid_way(args: &[&str], dir: &Path) {
    let release = dir.join("never-released");
    let hold = format!(
        "hold-before-db-commit={}*off->return({})",
        KILLED_AT - 1,
        release.display()
    );
    let mut child = spawn(args, &[("REPLAYSAFE_FAILPOINTS", &hold)], dir, "killed");
    let held = dir.join("never-released.held");
    wait_until(Duration::from_secs(60), "the batch held", || held.exists());
    child.kill().unwrap();
    child.wait().unwrap();
}

fn counts(db: &Db, table: &str) -> Vec<String> {
    let cols = match table {
        "by_kind" => "day::text || '|' || kind || '=' || n",
        _ => "day::text || '=' || n",
    };
    db.strings(&format!("SELECT {cols} FROM {{s}}.{table} ORDER BY 1"))
}

fn ledger_keys(db: &Db) -> Vec<String> {
    db.strings("SELECT day::text || ' ' || event_id FROM {s}.replaysafe_ledger ORDER BY 1")
}

fn dead_letters(db: &Db) -> Vec<String> {
    db.strings(
        "SELECT \"offset\" || ':' || reason || ':' || consumer_group FROM {s}.replaysafe_dead_letters \
         WHERE resolved_at IS NULL ORDER BY \"offset\"",
    )
}

fn checkpoint(db: &Db, group: &str) -> Vec<String> {
    db.strings(&format!(
        "SELECT partition || ':' || next_offset FROM {{s}}.replaysafe_checkpoints \
         WHERE consumer_group = '{group}' ORDER BY partition"
    ))
}

/// The command line of `op` on pipeline `p`: a backfill of the history's record times from `from` under `group`,
/// the build of `by_kind`, or a rebuild of the event days from `from` through today under `group`.
fn command(op: Op, p: &Pipeline, from: &str, group: &str, base: i64) -> Vec<String> {
    let config = arg(&p.path);
    let args: Vec<String> = match op {
        Op::Backfill => vec![
            "backfill".into(),
            "--config".into(),
            config.into(),
            "--from".into(),
            from.into(),
            "--to".into(),
            rfc3339(base + 50_000),
            "--group-id".into(),
            group.into(),
        ],
        Op::Build => [
            "projection",
            "build",
            "--config",
            config,
            "--projection",
            "by_kind",
        ]
        .map(String::from)
        .to_vec(),
        Op::Rebuild => vec![
            "rebuild".into(),
            "--config".into(),
            config.into(),
            "--from".into(),
            from.into(),
            "--to".into(),
            days_ago(0).to_string(),
            "--group-id".into(),
            group.into(),
            "--i-paused-other-writers".into(),
        ],
    };
    args
}

/// The killed state: the operation committed offsets 0..=2 and its held batch (offset 3) did not commit; a
/// rebuild keeps the window's ledger rows it deleted (the buggy deployment's 6 claims).
fn assert_killed(w: &World, group: &str) {
    let db = &w.db;
    match w.op {
        Op::Backfill => assert_eq!(checkpoint(db, group), vec!["0:3"]),
        Op::Build => assert_eq!(
            db.strings(
                "SELECT partition || ':' || next_offset FROM {s}.replaysafe_checkpoints \
                 WHERE consumer_group LIKE '%.build.by_kind.%'"
            ),
            vec!["0:3"]
        ),
        Op::Rebuild => {
            assert_eq!(checkpoint(db, group), vec!["0:3"]);
            assert_eq!(
                db.i64("SELECT count(*) FROM {s}.replaysafe_ledger_rebuilding"),
                6,
                "every ledger row of the window it deleted, kept until its replay completes"
            );
        }
    }
}

/// The killed state of `op`: the history produced and applied by production (the buggy deployment for a backfill
/// or a rebuild; a build's pipeline had no bug: only claimed records are built) and by the reference, then `op`
/// killed mid-way. Returns the world, the operation's group and its window's start.
fn killed(op: Op, pruned: bool) -> (World, String, String) {
    let prefix = format!("wo_{op:?}_{}", if pruned { "p" } else { "n" }).to_lowercase();
    let mut w = World::new(op, &prefix);
    w.produce(&HISTORY, false);
    let first = w.file(LONG, op != Op::Build, false, false);
    run_caught_up(&first.path);
    run_caught_up(&w.reference_file(LONG).path);
    let long = w.production(LONG);
    let group = unique("op");
    let first_from = match op {
        Op::Backfill => rfc3339(w.base),
        _ => days_ago(10).to_string(),
    };
    if op == Op::Build {
        // The projection is added to the running pipeline (recorded `building`, its hand-over point production's
        // checkpoint); production restarts with that file.
        replaysafe(&["init", "--config", arg(&long.path)]).assert_ok();
    }
    let args = command(op, &long, &first_from, &group, w.base);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kill_mid_way(&args, long.dir.path());
    assert_killed(&w, &group);
    (w, group, first_from)
}

/// Runs `way_out` while production (`now`) writes late events — a rebuild with production paused, as it
/// requires, which resumes afterwards —, then waits until production caught up.
fn while_production_writes(w: &mut World, now: &Pipeline, way_out: &dyn Fn() -> Out) -> Out {
    let mut worker = (w.op != Op::Rebuild).then(|| spawn_run(now, &[], "worker"));
    w.produce(&DURING, true);
    let out = way_out();
    if w.op == Op::Rebuild {
        run_caught_up(&now.path);
    }
    let end = w.end();
    wait_until(Duration::from_secs(60), "production caught up", || {
        w.db.checkpoint(&w.prod, &w.topic, 0) == Some(end)
    });
    if let Some(worker) = worker.as_mut() {
        assert_eq!(terminate(worker), Some(0));
    }
    out
}

/// The six states: `op` killed mid-way, then (`pruned`) a prune expiring the day 10 days ago, production writing
/// late events meanwhile and during the way out; the way out the docs give; the final tables.
fn walk(op: Op, pruned: bool) {
    let (mut w, group, first_from) = killed(op, pruned);
    let base = w.base;
    let window = |p: &Pipeline, from: &str, group: &str| command(op, p, from, group, base);

    // Meanwhile: the prune (the reference prunes at the same point), production writes late events.
    let horizon = if pruned { SHORT } else { LONG };
    let now = w.production(horizon);
    let reference = w.reference_file(horizon);
    if pruned {
        replaysafe(&["ledger", "prune", "--config", arg(&now.path)]).assert_ok();
        replaysafe(&["ledger", "prune", "--config", arg(&reference.path)]).assert_ok();
    }
    w.produce(&LATE, true);
    run_caught_up(&now.path);
    run_caught_up(&reference.path);

    // The way out, as the tables say.
    let h = days_ago(u64::from(horizon));
    let during =
        |w: &mut World, way_out: &dyn Fn() -> Out| while_production_writes(w, &now, way_out);
    // The record time of the first record above the pruned offsets.
    let above = match pruned {
        true => rfc3339(ts(base, pruned_through(&w.db) + 1)),
        false => String::new(),
    };
    let out = match (op, pruned) {
        // "interrupted (… kill -9 …): rerun the same command: it resumes from its group's checkpoints" — after a
        // prune too.
        (Op::Backfill, _) => during(&mut w, &|| {
            let args = window(&now, &first_from, &group);
            replaysafe(&args.iter().map(String::as_str).collect::<Vec<_>>())
        }),
        // "`projection build` interrupted or crashed: rerun the same command: it resumes from its checkpoints".
        (Op::Build, false) => during(&mut w, &|| {
            let args = window(&now, "", "");
            replaysafe(&args.iter().map(String::as_str).collect::<Vec<_>>())
        }),
        // The rerun stops at the expired day's first record at or below the pruned offsets: "a record older than
        // the ledger horizon: … --from TIME (1) → rerun with a later --from: accepted, also after a stopped build".
        // The first record above the pruned offsets is the latest start that leaves out none above them.
        (Op::Build, true) => during(&mut w, &|| {
            let args = window(&now, "", "");
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let stopped = replaysafe(&args);
            assert_eq!(stopped.code, Some(1), "{}", stopped.stderr);
            assert!(
                stopped.stderr.contains("at offset 4") && stopped.stderr.contains("`--from TIME`"),
                "{}",
                stopped.stderr
            );
            replaysafe(&[&args[..], &["--from", &above]].concat())
        }),
        // "interrupted or killed during the replay: rerun with a new --group-id and a window covering the days
        // it kept".
        (Op::Rebuild, false) => during(&mut w, &|| {
            let args = window(&now, &first_from, &unique("rb"));
            replaysafe(&args.iter().map(String::as_str).collect::<Vec<_>>())
        }),
        // "killed, then a prune passed its first days: the old window … rebuild from H on (2) → rebuild --from H
        // (new --group-id): accepted".
        (Op::Rebuild, true) => during(&mut w, &|| {
            let args = window(&now, &first_from, &unique("rb"));
            let old = replaysafe(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(old.code, Some(2), "{}", old.stderr);
            assert!(
                old.stderr.contains(&format!("rebuild from {h} on")),
                "{}",
                old.stderr
            );
            let args = window(&now, &h.to_string(), &unique("rb"));
            replaysafe(&args.iter().map(String::as_str).collect::<Vec<_>>())
        }),
    };
    assert_eq!(
        out.code,
        Some(0),
        "the way out\nstdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    if (op, pruned) == (Op::Rebuild, true) {
        assert!(out.stderr.contains("abandoned"), "{}", out.stderr);
    }
    // The reference reads the late events of the way out too.
    run_caught_up(&reference.path);
    assert_final(&w, pruned);
}

/// The final tables of `w` against its reference, with what the docs say differs: a rebuild killed before a prune
/// leaves the expired day what it had re-landed (`verify` shows it); a build stopped after a prune and rerun with
/// `--from` leaves out the records before that start (the expired day's and, below the pruned offsets, the other
/// days' too: 10 days ago, 3 days ago and today at offsets 4..=7).
fn assert_final(w: &World, pruned: bool) {
    let (db, rf) = (&w.db, &w.reference);
    let d10 = days_ago(10);
    let mut want = counts(rf, "daily_counts");
    if (w.op, pruned) == (Op::Rebuild, true) {
        want[0] = format!("{d10}=1");
    }
    assert_eq!(counts(db, "daily_counts"), want, "daily_counts");
    if w.op == Op::Build {
        let mut want = counts(rf, "by_kind");
        if pruned {
            // Offsets 4..=7: (10, sale), (0, refund), (3, sale), (10, sale).
            let less = |want: &mut Vec<String>, row: String, by: i64| {
                let at = want
                    .iter()
                    .position(|r| r.starts_with(&format!("{row}=")))
                    .unwrap();
                let n: i64 = want[at].rsplit('=').next().unwrap().parse().unwrap();
                want[at] = format!("{row}={}", n - by);
            };
            less(&mut want, format!("{d10}|sale"), 2);
            less(&mut want, format!("{}|refund", days_ago(0)), 1);
            less(&mut want, format!("{}|sale", days_ago(3)), 1);
        }
        assert_eq!(counts(db, "by_kind"), want, "by_kind");
    }
    assert_eq!(ledger_keys(db), ledger_keys(rf), "the ledger's keys");
    assert_eq!(checkpoint(db, &w.prod), vec![format!("0:{}", w.end())]);
    let rebuilding = db.text("SELECT to_regclass('{s}.replaysafe_ledger_rebuilding')::text");
    if rebuilding.is_some() {
        assert_eq!(
            db.i64("SELECT count(*) FROM {s}.replaysafe_ledger_rebuilding"),
            0,
            "nothing kept by a rebuild"
        );
    }
    let states = db.strings(
        "SELECT p.key || ':' || (p.value->>'state') FROM {s}.replaysafe_projection_set s, \
         jsonb_each(s.projections) p ORDER BY 1",
    );
    assert!(states.iter().all(|s| s.ends_with(":active")), "{states:?}");
    // Production's late event of the expired day is quarantined in both; the backfill resumed at offset 3 after
    // the prune quarantines the expired day's records it re-reads (4 and 7: production had landed them).
    let production = match pruned {
        true => vec!["8:beyond-horizon:production".to_string()],
        false => Vec::new(),
    };
    let reference = who(dead_letters(rf), &w.prod);
    assert_eq!(reference, production, "the reference's dead letters");
    let mut want = production;
    if pruned && w.op == Op::Backfill {
        want.splice(
            0..0,
            [
                "4:beyond-horizon:op".to_string(),
                "7:beyond-horizon:op".into(),
            ],
        );
    }
    assert_eq!(who(dead_letters(db), &w.prod), want, "dead letters");
}

/// Dead letters `offset:reason:group` with production's group (`prod`, `prod-ref`) named `production` and the
/// operation's (`op_…`) `op`.
fn who(rows: Vec<String>, prod: &str) -> Vec<String> {
    rows.into_iter()
        .map(|r| match r.rsplit_once(':') {
            Some((head, g)) if g == prod || g == format!("{prod}-ref") => {
                format!("{head}:production")
            }
            Some((head, g)) if g.starts_with("op_") => format!("{head}:op"),
            _ => r,
        })
        .collect()
}

/// The record time (ms) of the record at `offset`: the history's inside a backfill's window (`base` + 50 s is
/// its `--to`), later ones after it.
fn ts(base: i64, offset: i64) -> i64 {
    base + if offset >= HISTORY.len() as i64 {
        100_000
    } else {
        0
    } + offset * 1000
}

/// The highest offset whose ledger row the prune dropped (one partition).
fn pruned_through(db: &Db) -> i64 {
    db.i64("SELECT pruned_through FROM {s}.replaysafe_pruned")
}

/// A backfill killed mid-way is finished by its rerun (the same command): the refunds the buggy deployment
/// dropped land once, every table as the reference's.
#[test]
fn a_killed_backfill_is_finished_by_its_rerun() {
    walk(Op::Backfill, false);
}

/// A backfill killed mid-way, then a prune whose pruned offsets (raised by late events of the expired day) lie
/// above its checkpoint: the same command used to be refused ("offsets 0..=7 are below the ledger's pruned
/// horizon … could count them again", recommending a later `--from` that skips the refunds not yet applied); it
/// now continues from its checkpoint, quarantines the expired day's records it re-reads and lands the refunds.
#[test]
fn a_killed_backfill_is_finished_by_its_rerun_after_a_prune() {
    walk(Op::Backfill, true);
}

/// A `projection build` killed mid-way is finished by its rerun; the new projection equals the reference's.
#[test]
fn a_killed_build_is_finished_by_its_rerun() {
    walk(Op::Build, false);
}

/// A `projection build` killed mid-way, then a prune: the rerun stops at the expired day's record at offset 4,
/// naming `--from TIME`; rerun from the first record above the pruned offsets it completes, the records below it
/// left out of the new projection (as the docs say), every other table exact.
#[test]
fn a_killed_build_is_finished_by_its_rerun_after_a_prune() {
    walk(Op::Build, true);
}

/// A rebuild killed mid-way is finished by a rebuild of the same window under a new `--group-id`.
#[test]
fn a_killed_rebuild_is_finished_by_a_rebuild_under_a_new_group() {
    walk(Op::Rebuild, false);
}

/// A rebuild killed mid-way, then a prune passed its first day: the old window is refused naming the horizon's
/// first day; the rebuild from it completes, abandons the kept rows of the expired day (which keeps what the
/// killed rebuild re-landed) and every day inside the horizon is exact.
#[test]
fn a_killed_rebuild_is_finished_by_a_rebuild_from_the_horizon_after_a_prune() {
    walk(Op::Rebuild, true);
}
