//! Building a projection added to a live pipeline (`projection build`) beside production: dead letters replayed
//! while it builds and before it is built count once, builds killed at random beside a rebalancing production
//! end exact, records a `load` of a foreign dump claimed. Each test drives the real binary against the real
//! broker and PostgreSQL and asserts the final tables against the truth computed from the produced events.

use crate::common::*;
use std::collections::BTreeMap;
use std::time::Duration;

pub const BASE: &str = concat!(
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

pub const PARTITIONS: i32 = 3;

pub fn ev(i: usize, cust: &str) -> Rec {
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
