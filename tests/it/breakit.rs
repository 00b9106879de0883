//! Adversarial checks of the issue-16 work (operator moves around a live pipeline): each test drives the real
//! binary against the real broker and PostgreSQL and asserts the final tables against the truth computed from
//! the produced events.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;

const BASE: &str = concat!(
    header!(),
    r#"[batch]
max-records = 20
linger-ms = 20
[fields]
id = { path = "/id", type = "text" }
cust = { path = "/cust", type = "text" }
day = { path = "/day", type = "date" }
[identity]
key = ["id"]
partition-by = "day"
[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day", "cust"]
"#
);

const ADDED: &str = r#"[[projection]]
kind = "counter"
table = "by_cust"
group-by = ["cust"]
"#;

const PARTITIONS: i32 = 3;

fn ev(i: usize, cust: &str) -> Rec {
    let v = format!(
        r#"{{"id":"e{i}","cust":"{cust}","day":"2026-07-0{}"}}"#,
        1 + i % 3
    );
    Rec::json(
        (i % PARTITIONS as usize) as i32,
        cust,
        &v,
        1_782_864_000_000,
    )
}

fn table(db: &Db, sql: &str) -> BTreeMap<String, i64> {
    db.query(sql, &[])
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect()
}

fn build(p: &Pipeline, projection: &str) -> Out {
    replaysafe(&[
        "projection",
        "build",
        "--config",
        arg(&p.path),
        "--projection",
        projection,
    ])
}

fn replay_dead_letters(p: &Pipeline, extra: &[&str]) -> Out {
    let mut args = vec!["dead-letters", "replay", "--config", arg(&p.path)];
    args.extend_from_slice(extra);
    replaysafe(&args)
}

/// A record PostgreSQL rejected (a CHECK constraint of the operator's on a projection table) is quarantined
/// `rejected-by-database`; a projection is added; the operator drops the constraint and replays the dead
/// letters (with the current file, as README says) before building the new projection. The replayed record
/// must reach the new projection exactly once: either the replay feeds it or the build does, never both.
#[test]
fn a_dead_letter_replayed_while_a_projection_is_building_counts_once() {
    let (db, topic) = stage("bkreplay", PARTITIONS);
    let group = unique("g");
    let old = pipeline(BASE, &topic, &group, &db.schema);
    let new = pipeline(&format!("{BASE}{ADDED}"), &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&old.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.daily_counts ADD CONSTRAINT no_bad CHECK (cust <> 'bad')");
    let recs: Vec<Rec> = (0..30)
        .map(|i| ev(i, if i % 10 == 4 { "bad" } else { "good" }))
        .collect();
    produce(&topic, &recs);
    run_caught_up(&old.path);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'rejected-by-database'"),
        3
    );
    // The change, then the fix of the cause and the documented replay — with the current (new) file.
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.daily_counts DROP CONSTRAINT no_bad");
    let replayed = replay_dead_letters(&new, &[]);
    // Refused while building (nothing replayed: the build would apply the replayed records again); build
    // first, then replay.
    assert_eq!(replayed.code, Some(2), "{}", replayed.stderr);
    assert!(
        replayed.stderr.contains("projection build"),
        "{}",
        replayed.stderr
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_at IS NULL"),
        3
    );
    build(&new, "by_cust").assert_ok();
    let again = replay_dead_letters(&new, &[]);
    again.assert_ok();
    assert!(again.stdout.contains("landed 3"), "{}", again.stdout);
    let want: BTreeMap<String, i64> = [("bad".to_string(), 3), ("good".to_string(), 27)].into();
    assert_eq!(
        table(&db, "SELECT cust, n FROM {s}.by_cust"),
        want,
        "by_cust"
    );
    assert_eq!(
        db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.daily_counts"),
        30
    );
}

/// Dead letters replayed *before* a projection is added (with `--group-id`, or quarantined by a `load` under
/// its own group and replayed under the pipeline's) were claimed before the hand-over: the build must apply them
/// to the new projection like every other record claimed before it.
#[test]
fn a_dead_letter_replayed_under_another_group_before_the_change_is_built() {
    let (db, topic) = stage("bkreplaygrp", PARTITIONS);
    let group = unique("g");
    let old = pipeline(BASE, &topic, &group, &db.schema);
    let new = pipeline(&format!("{BASE}{ADDED}"), &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&old.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.daily_counts ADD CONSTRAINT no_bad CHECK (cust <> 'bad')");
    let recs: Vec<Rec> = (0..30)
        .map(|i| ev(i, if i % 10 == 4 { "bad" } else { "good" }))
        .collect();
    produce(&topic, &recs);
    run_caught_up(&old.path);
    db.execute("ALTER TABLE {s}.daily_counts DROP CONSTRAINT no_bad");
    replay_dead_letters(&old, &["--group-id", "fixup"]).assert_ok();
    assert_eq!(
        db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.daily_counts"),
        30
    );
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();
    let out = build(&new, "by_cust");
    out.assert_ok();
    let want: BTreeMap<String, i64> = [("bad".to_string(), 3), ("good".to_string(), 27)].into();
    assert_eq!(
        table(&db, "SELECT cust, n FROM {s}.by_cust"),
        want,
        "by_cust: {}",
        out.stdout
    );
}

/// Events with redeliveries of earlier events on other partitions (the same `event_id` across partitions).
struct Events {
    n: usize,
    recs: usize,
    custs: Vec<String>,
    days: Vec<String>,
    rng: Box<dyn FnMut(u64) -> u64 + Send>,
}

impl Events {
    fn next(&mut self, n: usize) -> Vec<Rec> {
        let mut out = Vec::new();
        for _ in 0..n {
            let i = self.n;
            let cust = format!("c{}", (self.rng)(9));
            let day = format!("2026-07-0{}", 1 + (self.rng)(5));
            self.custs.push(cust);
            self.days.push(day);
            self.n += 1;
            out.push(self.rec(i));
            if i % 5 == 2 {
                let old = (self.rng)(self.n as u64) as usize;
                out.push(self.rec(old));
            }
        }
        self.recs += out.len();
        out
    }

    fn rec(&mut self, i: usize) -> Rec {
        let v = format!(
            r#"{{"id":"e{i}","cust":"{}","day":"{}"}}"#,
            self.custs[i], self.days[i]
        );
        let part = (self.rng)(PARTITIONS as u64) as i32;
        Rec::json(part, &self.custs[i], &v, 1_782_864_000_000)
    }

    fn count_by(&self, key: impl Fn(usize) -> String) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for i in 0..self.n {
            *m.entry(key(i)).or_insert(0) += 1;
        }
        m
    }
}

const ADDED_TWO: &str = r#"[[projection]]
kind = "counter"
table = "by_cust"
group-by = ["cust"]
[[projection]]
kind = "counter"
table = "by_day"
group-by = ["day"]
"#;

/// Two workers run the pipeline while events (with cross-partition redeliveries) keep arriving; two projections
/// are added at once; two new workers take over (one is SIGKILLed midway: a rebalance); the two builds run at
/// the same time and are SIGKILLed at pseudo-random points several times, then rerun to the end. Every table
/// must equal the truth.
#[test]
fn builds_killed_at_random_points_beside_a_rebalancing_production_end_exact() {
    let (db, topic) = stage("bkkill", PARTITIONS);
    let group = unique("g");
    let live = format!(
        "{BASE}[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n"
    );
    let old = pipeline(&live, &topic, &group, &db.schema);
    let new = pipeline(&format!("{live}{ADDED_TWO}"), &topic, &group, &db.schema);
    let mut ev = Events {
        n: 0,
        recs: 0,
        custs: Vec::new(),
        days: Vec::new(),
        rng: Box::new(seeded_random(1616)),
    };
    produce(&topic, &ev.next(1500));
    let mut w1 = spawn_run(&old, &[], "w1");
    let mut w2 = spawn_run(&old, &[], "w2");
    let applied = |db: &Db, recs: usize, n: usize| {
        db.text("SELECT to_regclass('{s}.replaysafe_ledger')::text")
            .is_some()
            && db.i64("SELECT count(*) FROM {s}.replaysafe_ledger") == n as i64
            && db.query(
                "SELECT coalesce(sum(next_offset), 0)::bigint FROM {s}.replaysafe_checkpoints \
                 WHERE consumer_group = $1",
                &[&group],
            )[0]
            .get::<_, i64>(0)
                == recs as i64
    };
    wait_until(Duration::from_secs(180), "history applied", || {
        applied(&db, ev.recs, ev.n)
    });
    // Events keep arriving while the change is made.
    let more = ev.next(600);
    let producer = {
        let topic = topic.clone();
        std::thread::spawn(move || {
            for chunk in more.chunks(30) {
                produce(&topic, chunk);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(400));
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();
    let mut w3 = spawn_run(&new, &[], "w3");
    let mut w4 = spawn_run(&new, &[], "w4");
    for w in [&mut w1, &mut w2] {
        wait_until(Duration::from_secs(120), "old worker to stop", || {
            w.try_wait().unwrap().is_some()
        });
    }
    let mut rng = seeded_random(77);
    let builds = |name: &str, tag: usize| {
        spawn(
            &[
                "projection",
                "build",
                "--config",
                arg(&new.path),
                "--projection",
                name,
            ],
            &[],
            new.dir.path(),
            &format!("build_{name}_{tag}"),
        )
    };
    for round in 0..5 {
        let mut a = builds("by_cust", round);
        let mut b = builds("by_day", round);
        std::thread::sleep(Duration::from_millis(300 + rng(1200)));
        if round == 2 {
            unsafe_kill(w3.id(), "KILL");
            let _ = w3.wait();
            w3 = spawn_run(&new, &[], "w3b");
        }
        unsafe_kill(a.id(), "KILL");
        unsafe_kill(b.id(), "KILL");
        let _ = a.wait();
        let _ = b.wait();
        eprintln!(
            "round {round}: build checkpoints {:?}",
            db.strings(
                "SELECT consumer_group || ':' || partition || '=' || coalesce(next_offset::text, '-') \
                 FROM {s}.replaysafe_checkpoints WHERE consumer_group LIKE '%.build.%' ORDER BY 1"
            )
        );
    }
    for name in ["by_cust", "by_day"] {
        let out = build(&new, name);
        out.assert_ok();
    }
    producer.join().unwrap();
    produce(&topic, &ev.next(200));
    wait_until(Duration::from_secs(180), "everything applied", || {
        applied(&db, ev.recs, ev.n)
    });
    assert_eq!(terminate(&mut w3), Some(0));
    assert_eq!(terminate(&mut w4), Some(0));
    let custs = ev.custs.clone();
    let days = ev.days.clone();
    assert_eq!(
        table(&db, "SELECT cust, n FROM {s}.by_cust"),
        ev.count_by(|i| custs[i].clone()),
        "by_cust"
    );
    assert_eq!(
        table(&db, "SELECT day::text, n FROM {s}.by_day"),
        ev.count_by(|i| days[i].clone()),
        "by_day"
    );
    assert_eq!(
        table(
            &db,
            "SELECT day::text || '/' || cust, n FROM {s}.daily_counts"
        ),
        ev.count_by(|i| format!("{}/{}", days[i], custs[i])),
        "daily_counts"
    );
}

/// `load --take-over` of a dump of the live topic, started at the same moment as two workers of the pipeline
/// (and then again while they run): the workers and the load fence each other back and forth; at the end every
/// event counts once, the workers hold and apply every partition (new events after the load are applied, no
/// partition left idle), and the checkpoints equal the topic's end.
#[test]
fn load_take_over_racing_two_workers_counts_once_and_leaves_no_partition_idle() {
    use crate::core::{counts, seed_events, SEED};
    use crate::file_source::kcat_line;
    let (db, topic) = stage("bkload", 4);
    let group = unique("prod");
    let text = format!(
        "{SEED}[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n"
    );
    let text = text.replace("max-records = 200", "max-records = 7");
    let p = pipeline(&text, &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    let (recs, _) = seed_events(1200, 4);
    let offsets = produce(&topic, &recs[..800]);
    let file = p.dir.path().join("dump.json");
    let lines: Vec<String> = recs[..800]
        .iter()
        .zip(&offsets)
        .map(|(r, o)| kcat_line(&topic, r.partition, *o, r))
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let load = |name: &str| {
        spawn(
            &["load", "--config", arg(&p.path), "--take-over", arg(&file)],
            &[],
            p.dir.path(),
            name,
        )
    };
    let mut l1 = load("l1");
    let mut w1 = spawn_run(&p, &[], "w1");
    let mut w2 = spawn_run(&p, &[], "w2");
    std::thread::sleep(Duration::from_millis(1500));
    // The second load while the workers apply new events (their batches meet its fences).
    let late = recs[800..].to_vec();
    let producer = {
        let topic = topic.clone();
        std::thread::spawn(move || {
            for chunk in late.chunks(10) {
                produce(&topic, chunk);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut l2 = load("l2");
    for l in [&mut l1, &mut l2] {
        wait_until(Duration::from_secs(120), "a load to end", || {
            l.try_wait().unwrap().is_some()
        });
    }
    for name in ["l1", "l2", "w1", "w2"] {
        let err = std::fs::read_to_string(p.dir.path().join(format!("{name}.err"))).unwrap();
        let fenced = err.lines().filter(|l| l.contains("fenced")).count();
        eprintln!(
            "{name}: {fenced} fenced lines; last: {:?}",
            err.lines().last()
        );
    }
    producer.join().unwrap();
    let ends = |db: &Db| {
        db.i64(&format!(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM {{s}}.replaysafe_checkpoints \
             WHERE consumer_group = '{group}'"
        ))
    };
    wait_until(
        Duration::from_secs(240),
        "every event applied by the workers",
        || ends(&db) == 1200,
    );
    assert_eq!(terminate(&mut w1), Some(0));
    assert_eq!(terminate(&mut w2), Some(0));
    let mut want = BTreeMap::new();
    for r in &recs {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
        let day = v["occurred_at"].as_str().unwrap()[..10].to_string();
        let cust = v["customer_id"].as_str().unwrap().to_string();
        *want.entry((day, cust)).or_insert(0i64) += 1;
    }
    assert_eq!(counts(&db), want);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1200);
    assert_eq!(
        committed(&group, &topic, 4)
            .iter()
            .map(|c| c.unwrap_or(0))
            .sum::<i64>(),
        1200
    );
}

/// The tolerance's stop point depends on the records only: the same partition read with batches of 1, 7 and
/// 5,000 records stops at the same offset with the same message (the window rule: two of every three records
/// missing a field), nothing at or past that offset is committed, and a rerun stops there again.
#[test]
fn the_tolerance_stops_at_the_same_record_whatever_the_batch_size() {
    let topic = new_topic("bktol", 1);
    let recs: Vec<Rec> = (0..1500)
        .map(|i| {
            let v = if i >= 50 && i % 3 != 0 {
                format!(r#"{{"id":"e{i}","day":"2026-07-01"}}"#)
            } else {
                format!(r#"{{"id":"e{i}","cust":"c{}","day":"2026-07-01"}}"#, i % 4)
            };
            Rec::json(0, "k", &v, 1_782_864_000_000)
        })
        .collect();
    produce(&topic, &recs);
    let mut stops = Vec::new();
    for size in [1, 7, 5000] {
        let db = Db::fresh("bktol");
        let text = BASE.replace("max-records = 20", &format!("max-records = {size}"));
        let p = pipeline(&text, &topic, &unique("g"), &db.schema);
        let limit = Duration::from_secs(300);
        let out = try_run_with(&p.path, &[], limit);
        assert_eq!(out.code, Some(5), "{size}: {}", out.stderr);
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("caused by:") && l.contains("quarantined as"))
            .unwrap_or_default()
            .to_string();
        let at = line
            .split("offsets ")
            .nth(1)
            .and_then(|s| s.split(':').next())
            .unwrap_or_default()
            .to_string();
        let checkpoint =
            db.i64("SELECT coalesce(max(next_offset), 0) FROM {s}.replaysafe_checkpoints");
        let past = db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_dead_letters WHERE \"offset\" >= {checkpoint}"
        ));
        let landed_past = db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_ledger WHERE \"offset\" >= {checkpoint}"
        ));
        assert_eq!(
            (past, landed_past),
            (0, 0),
            "{size}: committed past the checkpoint"
        );
        // Every offset below the checkpoint is landed or quarantined: nothing skipped over.
        let accounted = db.i64(
            "SELECT (SELECT count(*) FROM {s}.replaysafe_ledger) \
             + (SELECT count(*) FROM {s}.replaysafe_dead_letters)",
        );
        assert_eq!(
            accounted, checkpoint,
            "{size}: records below the checkpoint never applied"
        );
        assert!(
            line.contains(&format!("stays at offset {checkpoint}")),
            "{size}: {line}"
        );
        eprintln!("size {size}: checkpoint {checkpoint}, first stop: {line}");
        let again = try_run_with(&p.path, &[], limit);
        for l in again
            .stderr
            .lines()
            .filter(|l| l.contains("assigned") || l.contains("caused by"))
        {
            eprintln!("  rerun: {l}");
        }
        assert_eq!(again.code, Some(5), "{size} rerun: {}", again.stderr);
        assert!(again.stderr.contains(&at), "{size} rerun: {}", again.stderr);
        stops.push((size, at, line.len()));
    }
    eprintln!("{stops:?}");
    assert!(
        stops.iter().all(|s| s.1 == stops[0].1 && !s.1.is_empty()),
        "{stops:?}"
    );
}

/// `--no-ddl` with a day partition missing mid-stream, one record per batch: the run stops at the record of the
/// missing day and nothing after it on that partition is committed (a drain must not apply the next records
/// over it); after `init` creates the partition a rerun applies everything exactly once.
#[test]
fn a_missing_day_partition_under_no_ddl_with_small_batches_skips_nothing() {
    let (db, topic) = stage("bknoddl", 1);
    let text = BASE.replace("max-records = 20", "max-records = 1");
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    let today = db
        .text("SELECT (now() AT TIME ZONE 'UTC')::date::text")
        .unwrap();
    let recs: Vec<Rec> = (0..40)
        .map(|i| {
            let day = if i == 20 {
                "2026-07-01"
            } else {
                today.as_str()
            };
            let v = format!(r#"{{"id":"e{i}","cust":"c{}","day":"{day}"}}"#, i % 3);
            Rec::json(0, "k", &v, 1_782_864_000_000)
        })
        .collect();
    produce(&topic, &recs);
    replaysafe(&["init", "--config", arg(&p.path), "--days", "1"]).assert_ok();
    let out = replaysafe(&[
        "run",
        "--config",
        arg(&p.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("replaysafe_ledger_p20260701"),
        "{}",
        out.stderr
    );
    let checkpoint = db.i64("SELECT coalesce(max(next_offset), 0) FROM {s}.replaysafe_checkpoints");
    assert_eq!(checkpoint, 20, "stopped at the record of the missing day");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 20);
    replaysafe(&["init", "--config", arg(&p.path), "--days", "1"]).assert_ok();
    db.execute(
        "CREATE TABLE {s}.replaysafe_ledger_p20260701 PARTITION OF {s}.replaysafe_ledger \
         (EXCLUDE USING hash ((ROW(generation, id, day)::{s}.replaysafe_ledger_key) WITH =)) \
         FOR VALUES FROM ('2026-07-01') TO ('2026-07-02')",
    );
    let again = replaysafe(&[
        "run",
        "--config",
        arg(&p.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    again.assert_ok();
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 40);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 40);
}

/// A dump of another cluster whose offsets lie below the live topic's end is accepted by `load` under its own
/// group: its records are claimed and counted by every projection. A projection added later is built from the
/// topic, where other records sit at those offsets: the loaded records never reach it, and nothing says so.
#[test]
#[ignore = "open: `projection build` reads history from the topic only; records claimed by a `load` of a file \
            whose records are not the topic's (a foreign dump below the live end) are never built, silently \
            (by_cust 30 instead of 60)"]
fn records_loaded_from_a_foreign_dump_reach_a_projection_added_later() {
    use crate::file_source::kcat_line;
    let (db, topic) = stage("bkforeign", 1);
    let group = unique("g");
    let old = pipeline(BASE, &topic, &group, &db.schema);
    let new = pipeline(&format!("{BASE}{ADDED}"), &topic, &group, &db.schema);
    let live: Vec<Rec> = (0..30)
        .map(|i| {
            let v = format!(r#"{{"id":"e{i}","cust":"live","day":"2026-07-01"}}"#);
            Rec::json(0, "k", &v, 1_782_864_000_000)
        })
        .collect();
    produce(&topic, &live);
    let foreign: Vec<String> = (0..30)
        .map(|i| {
            let v = format!(r#"{{"id":"f{i}","cust":"foreign","day":"2026-07-01"}}"#);
            kcat_line(&topic, 0, i, &Rec::json(0, "k", &v, 1_782_864_000_000))
        })
        .collect();
    let file = old.dir.path().join("foreign.json");
    std::fs::write(&file, foreign.join("\n") + "\n").unwrap();
    replaysafe(&["load", "--config", arg(&old.path), arg(&file)]).assert_ok();
    run_caught_up(&old.path);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 60);
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();
    let out = build(&new, "by_cust");
    assert!(
        out.code != Some(0) || db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.by_cust") == 60,
        "the build ended silently without the loaded records: {}",
        out.stdout
    );
}

/// Two `dead-letters replay` at once, while `run` runs with new events: every dead letter is resolved once,
/// the projection counts each record once, and the two replay lines add up to at least the dead letters.
#[test]
fn two_concurrent_dead_letter_replays_beside_run_count_once() {
    let (db, topic) = stage("bkreplay2", PARTITIONS);
    let group = unique("g");
    let text = BASE.replace(
        "[[projection]]",
        "[errors]\ntolerance = \"all\"\n[[projection]]",
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    db.execute("ALTER TABLE {s}.daily_counts ADD CONSTRAINT no_bad CHECK (cust <> 'bad')");
    let recs: Vec<Rec> = (0..600)
        .map(|i| ev(i, if i % 3 == 0 { "bad" } else { "good" }))
        .collect();
    produce(&topic, &recs[..300]);
    run_caught_up(&p.path);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_at IS NULL"),
        100
    );
    db.execute("ALTER TABLE {s}.daily_counts DROP CONSTRAINT no_bad");
    let mut w = spawn_run(&p, &[], "w");
    produce(&topic, &recs[300..]);
    let replay = |name: &str| {
        spawn(
            &["dead-letters", "replay", "--config", arg(&p.path)],
            &[],
            p.dir.path(),
            name,
        )
    };
    let mut a = replay("ra");
    let mut b = replay("rb");
    for (c, name) in [(&mut a, "ra"), (&mut b, "rb")] {
        wait_until(Duration::from_secs(120), "a replay to end", || {
            c.try_wait().unwrap().is_some()
        });
        let out = std::fs::read_to_string(p.dir.path().join(format!("{name}.out"))).unwrap();
        eprintln!("{name}: {out}");
    }
    wait_until(Duration::from_secs(120), "run caught up", || {
        db.i64(&format!(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM {{s}}.replaysafe_checkpoints \
             WHERE consumer_group = '{group}'"
        )) == 600
    });
    assert_eq!(terminate(&mut w), Some(0));
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_at IS NULL"),
        0
    );
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE resolved_by LIKE 'replay:%'"
        ),
        0,
        "a dead letter landed by one replay was marked a duplicate by the other"
    );
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 600);
    assert_eq!(
        db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts WHERE cust = 'bad'"),
        200
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);
}

/// Another writer (`load --take-over`, here the fence bumped by hand) takes a partition over between the
/// worker's take-over and the write of its start (a partition without a checkpoint, positioned from `start`):
/// the worker pauses it and takes it back once the group confirms the assignment — it does not exit, and every
/// event lands once.
#[test]
fn a_fence_bumped_while_the_start_is_written_is_taken_back_not_fatal() {
    let (db, topic) = stage("bkstart", 1);
    let group = unique("g");
    let text = format!(
        "{BASE}[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n"
    );
    let p = pipeline(&text, &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    let recs: Vec<Rec> = (0..40)
        .map(|i| {
            let v = format!(r#"{{"id":"e{i}","cust":"c","day":"2026-07-01"}}"#);
            Rec::json(0, "k", &v, 1_782_864_000_000)
        })
        .collect();
    produce(&topic, &recs[..20]);
    let mut w = spawn(
        &["run", "--config", arg(&p.path)],
        &[("REPLAYSAFE_FAILPOINTS", "before-write-start=1*sleep(4000)")],
        p.dir.path(),
        "w",
    );
    wait_until(Duration::from_secs(60), "the take-over's row", || {
        db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_checkpoints WHERE consumer_group = '{group}'"
        )) == 1
    });
    db.execute("UPDATE {s}.replaysafe_checkpoints SET fence = fence + 1");
    produce(&topic, &recs[20..]);
    let next = || {
        db.i64(&format!(
            "SELECT coalesce(max(next_offset), -1) FROM {{s}}.replaysafe_checkpoints \
             WHERE consumer_group = '{group}'"
        ))
    };
    let mut exited = None;
    wait_until(Duration::from_secs(120), "every event applied", || {
        exited = w.try_wait().unwrap();
        exited.is_some() || next() == 40
    });
    let err = std::fs::read_to_string(p.dir.path().join("w.err")).unwrap();
    assert!(exited.is_none(), "the worker exited: {err}");
    assert_eq!(terminate(&mut w), Some(0));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 40);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 40);
}
