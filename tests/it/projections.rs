//! Issue 16.1: changing the projections of a running pipeline (docs/replay.md "Change a running pipeline"). A
//! projection added while production runs and events keep arriving ends exact (counters and sums against the truth
//! computed from the produced events, duplicates across partitions included), the old projections unchanged;
//! workers still running the old file stop without committing; a build interrupted midway resumes and ends exact; a
//! table fed by two ledgers, a projection changed in place and one dropped from the file are refused before
//! anything is created, and following each message's advice never counts anything twice.

use std::collections::BTreeMap;
use std::process::Child;
use std::time::Duration;

use crate::common::*;
use crate::core::{seed_events, SEED};

const BASE: &str = concat!(
    header!(),
    r#"[batch]
max-records = 20
linger-ms = 20
[fields]
id = { path = "/id", type = "text" }
cust = { path = "/cust", type = "text" }
day = { path = "/day", type = "date" }
amount = { path = "/amount", type = "numeric" }
[identity]
key = ["id"]
partition-by = "day"
[kafka.properties]
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "500"
[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day", "cust"]
[[projection]]
kind = "sum"
table = "totals"
group-by = ["cust"]
add = { total = "amount" }
"#
);

/// The projections added to [`BASE`]: a counter per customer and a filtered sum per day.
const ADDED: &str = r#"[[projection]]
kind = "counter"
table = "by_cust"
group-by = ["cust"]
[[projection]]
kind = "sum"
table = "amounts"
group-by = ["day"]
add = { total = "amount" }
filter = "amount > 0.0"
"#;

const PARTITIONS: i32 = 4;

/// One event (unique by `id`).
#[derive(Clone, Debug)]
struct Ev {
    id: String,
    cust: String,
    day: String,
    amount: i64,
}

impl Ev {
    fn rec(&self, partition: i32) -> Rec {
        let v = format!(
            r#"{{"id":"{}","cust":"{}","day":"{}","amount":"{}"}}"#,
            self.id, self.cust, self.day, self.amount
        );
        Rec::json(partition, &self.cust, &v, 1_782_864_000_000)
    }
}

/// The events produced so far, and how many records (copies included) per partition.
struct Truth {
    events: Vec<Ev>,
    records: i64,
    rng: Box<dyn FnMut(u64) -> u64 + Send>,
}

impl Truth {
    fn new(seed: u64) -> Truth {
        Truth {
            events: Vec::new(),
            records: 0,
            rng: Box::new(seeded_random(seed)),
        }
    }

    /// `n` new events spread over the partitions, and after every fourth one a copy of an earlier event (of
    /// any earlier batch) on another partition: a redelivery the ledger must recognise.
    fn batch(&mut self, n: usize) -> Vec<Rec> {
        let mut recs = Vec::new();
        for _ in 0..n {
            let i = self.events.len();
            let ev = Ev {
                id: format!("e{i}"),
                cust: format!("c{}", (self.rng)(7)),
                day: format!("2026-07-0{}", 1 + (self.rng)(5)),
                amount: (self.rng)(200) as i64 - 50,
            };
            recs.push(ev.rec((self.rng)(PARTITIONS as u64) as i32));
            self.events.push(ev);
            if i % 4 == 3 {
                let old = (self.rng)(self.events.len() as u64) as usize;
                recs.push(self.events[old].rec((self.rng)(PARTITIONS as u64) as i32));
            }
        }
        self.records += recs.len() as i64;
        recs
    }

    fn counts(
        &self,
        key: impl Fn(&Ev) -> String,
        keep: impl Fn(&Ev) -> bool,
    ) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for e in self.events.iter().filter(|e| keep(e)) {
            *m.entry(key(e)).or_insert(0) += 1;
        }
        m
    }

    fn sums(
        &self,
        key: impl Fn(&Ev) -> String,
        keep: impl Fn(&Ev) -> bool,
    ) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for e in self.events.iter().filter(|e| keep(e)) {
            *m.entry(key(e)).or_insert(0) += e.amount;
        }
        m
    }
}

fn table(db: &Db, sql: &str) -> BTreeMap<String, i64> {
    db.query(sql, &[])
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect()
}

/// The old projections equal the truth.
fn assert_old_exact(db: &Db, t: &Truth) {
    assert_eq!(
        table(
            db,
            "SELECT day::text || '/' || cust, n FROM {s}.daily_counts"
        ),
        t.counts(|e| format!("{}/{}", e.day, e.cust), |_| true),
        "daily_counts"
    );
    assert_eq!(
        table(db, "SELECT cust, total::bigint FROM {s}.totals"),
        t.sums(|e| e.cust.clone(), |_| true),
        "totals"
    );
}

/// The added projections equal the truth.
fn assert_added_exact(db: &Db, t: &Truth) {
    assert_eq!(
        table(db, "SELECT cust, n FROM {s}.by_cust"),
        t.counts(|e| e.cust.clone(), |_| true),
        "by_cust"
    );
    assert_eq!(
        table(db, "SELECT day::text, total::bigint FROM {s}.amounts"),
        t.sums(|e| e.day.clone(), |e| e.amount > 0),
        "amounts"
    );
}

/// Waits until the ledger holds every event and the group's checkpoints cover every record produced.
fn wait_applied(db: &Db, group: &str, t: &Truth) {
    let want = t.events.len() as i64;
    wait_until(Duration::from_secs(180), "every record applied", || {
        if db
            .text("SELECT to_regclass('{s}.replaysafe_ledger')::text")
            .is_none()
        {
            return false;
        }
        let ledger = db.i64("SELECT count(*) FROM {s}.replaysafe_ledger");
        let done = db.query(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM {s}.replaysafe_checkpoints \
             WHERE consumer_group = $1",
            &[&group],
        )[0]
        .get::<_, i64>(0);
        ledger == want && done == t.records
    });
}

/// Waits for a worker to exit on its own; its exit code and stderr.
fn wait_exit(child: &mut Child, p: &Pipeline, name: &str) -> (Option<i32>, String) {
    let mut code = None;
    wait_until(
        Duration::from_secs(120),
        &format!("{name} to stop"),
        || match child.try_wait().unwrap() {
            Some(s) => {
                code = Some(s.code());
                true
            }
            None => false,
        },
    );
    let err = std::fs::read_to_string(p.dir.path().join(format!("{name}.err"))).unwrap();
    (code.flatten(), err)
}

fn build(p: &Pipeline, projection: &str, envs: &[(&str, &str)]) -> Out {
    replaysafe_with(
        &[
            "projection",
            "build",
            "--config",
            arg(&p.path),
            "--projection",
            projection,
        ],
        envs,
        Duration::from_secs(180),
    )
}

fn state(db: &Db, projection: &str) -> Option<String> {
    db.text(&format!(
        "SELECT projections->'{projection}'->>'state' FROM {{s}}.replaysafe_projection_set"
    ))
}

/// Two workers run the pipeline; a third process adds two projections (`init` with the new file) while events
/// keep arriving: the hand-over point is every partition's checkpoint at that moment, the two old workers stop
/// at their next batch without committing it, two workers with the new file take over, and `projection build`
/// runs while production goes on. At the end every table is exact — the old ones unchanged by the addition,
/// the new ones equal to the truth over all events (history, events during the change, later ones, and
/// redeliveries across partitions of each) — and the record says `active`.
#[test]
fn a_projection_added_to_a_live_pipeline_ends_exact() {
    let (db, topic) = stage("projadd", PARTITIONS);
    let group = unique("g");
    let old = pipeline(BASE, &topic, &group, &db.schema);
    let new = pipeline(&format!("{BASE}{ADDED}"), &topic, &group, &db.schema);
    let mut truth = Truth::new(16);
    produce(&topic, &truth.batch(300));
    let mut w1 = spawn_run(&old, &[], "w1");
    let mut w2 = spawn_run(&old, &[], "w2");
    wait_applied(&db, &group, &truth);

    // The change: the hand-over point is recorded under the record's lock, equal to the checkpoints now.
    let before: Vec<i64> = db.column(&format!(
        "SELECT next_offset FROM {{s}}.replaysafe_checkpoints WHERE consumer_group = '{group}' ORDER BY partition"
    ));
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();
    assert_eq!(state(&db, "by_cust").as_deref(), Some("building"));
    assert_eq!(state(&db, "amounts").as_deref(), Some("building"));
    let handover: Vec<i64> = db.column(&format!(
        "SELECT next_offset FROM {{s}}.replaysafe_projection_handover WHERE consumer_group = '{group}' \
         AND build_group LIKE '%.build.by_cust.%' ORDER BY partition"
    ));
    assert_eq!(
        handover, before,
        "the hand-over is the checkpoints at the change"
    );
    assert_eq!(before.iter().sum::<i64>(), truth.records);

    // Events keep arriving: the old workers meet them and stop without committing.
    let live = truth.batch(200);
    let producer = {
        let topic = topic.clone();
        std::thread::spawn(move || {
            for chunk in live.chunks(20) {
                produce(&topic, chunk);
                std::thread::sleep(Duration::from_millis(150));
            }
        })
    };
    for (w, name) in [(&mut w1, "w1"), (&mut w2, "w2")] {
        let (code, err) = wait_exit(w, &old, name);
        assert_ne!(code, Some(0), "{name} must stop: {err}");
        assert!(
            err.contains("runs an older pipeline file") && err.contains("restart"),
            "{name}: {err}"
        );
    }
    let mut w3 = spawn_run(&new, &[], "w3");
    let mut w4 = spawn_run(&new, &[], "w4");
    // The build runs while production consumes the live events.
    // Exactly the 300 events claimed before the hand-over are applied by the build (not their redeliveries,
    // not the live events claimed after it, already applied by the batches that claimed them).
    for name in ["by_cust", "amounts"] {
        let out = build(&new, name, &[]);
        out.assert_ok();
        assert!(out.stdout.contains("built: applied 300,"), "{}", out.stdout);
        assert_eq!(state(&db, name).as_deref(), Some("active"));
    }
    producer.join().unwrap();
    produce(&topic, &truth.batch(100));
    wait_applied(&db, &group, &truth);
    assert_eq!(terminate(&mut w3), Some(0));
    assert_eq!(terminate(&mut w4), Some(0));

    assert_old_exact(&db, &truth);
    assert_added_exact(&db, &truth);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        truth.events.len() as i64
    );
    // A second build is a no-op.
    let again = build(&new, "by_cust", &[]);
    again.assert_ok();
    assert!(
        again.stdout.contains("nothing to build"),
        "{}",
        again.stdout
    );
    assert_added_exact(&db, &truth);
}

/// A build that fails midway (the 6th batch's transaction is rolled back, as by a crash before its commit)
/// leaves its committed progress and the projection `building`; the rerun resumes from its checkpoints and ends
/// exact, and production then feeds the projection like the others.
#[test]
fn an_interrupted_build_resumes_and_ends_exact() {
    let (db, topic) = stage("projbuild", PARTITIONS);
    let group = unique("g");
    let old = pipeline(BASE, &topic, &group, &db.schema);
    let new = pipeline(&format!("{BASE}{ADDED}"), &topic, &group, &db.schema);
    let mut truth = Truth::new(7);
    produce(&topic, &truth.batch(400));
    run_caught_up(&old.path);
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();

    let out = build(
        &new,
        "by_cust",
        &[("REPLAYSAFE_FAILPOINTS", "before-db-commit=5*off->return")],
    );
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(state(&db, "by_cust").as_deref(), Some("building"));
    let partial = db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.by_cust");
    assert!(
        partial > 0 && partial < truth.events.len() as i64,
        "the failed build committed part of the history: {partial}"
    );
    build(&new, "by_cust", &[]).assert_ok();
    build(&new, "amounts", &[]).assert_ok();
    produce(&topic, &truth.batch(100));
    run_caught_up(&new.path);
    assert_old_exact(&db, &truth);
    assert_added_exact(&db, &truth);
}

/// The issue's regression: a pipeline given a fresh `[ledger] table` (and group) over the existing projection
/// tables is refused — `init` and `run` — before anything is created, whether the tables carry the old ledger's
/// mark or predate the marks; following the message (tables of its own) counts nothing twice.
#[test]
fn a_table_fed_by_two_ledgers_is_refused_before_anything_is_created() {
    let (db, topic) = stage("projtwo", PARTITIONS);
    let mut truth = Truth::new(3);
    produce(&topic, &truth.batch(120));
    let p = pipeline(BASE, &topic, &unique("g"), &db.schema);
    run_caught_up(&p.path);
    assert_old_exact(&db, &truth);
    let fresh_ledger = BASE.replace("[identity]", "[ledger]\ntable = \"ledger_b\"\n[identity]");
    let q = pipeline(&fresh_ledger, &topic, &unique("g"), &db.schema);
    for cmd in ["init", "run"] {
        let out = if cmd == "init" {
            replaysafe(&["init", "--config", arg(&q.path)])
        } else {
            try_run(&q.path)
        };
        assert_eq!(out.code, Some(2), "{cmd}: {}", out.stderr);
        assert!(
            out.stderr.contains("is fed by ledger") && out.stderr.contains("table of its own"),
            "{cmd}: {}",
            out.stderr
        );
        assert_eq!(db.text("SELECT to_regclass('{s}.ledger_b')::text"), None);
        assert_old_exact(&db, &truth);
    }
    // Tables from before the marks (no comment): the new, empty ledger is refused as well.
    db.execute("COMMENT ON TABLE {s}.daily_counts IS NULL; COMMENT ON TABLE {s}.totals IS NULL");
    let out = try_run(&q.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("no ledger is recorded as feeding it"),
        "{}",
        out.stderr
    );
    assert_eq!(db.text("SELECT to_regclass('{s}.ledger_b')::text"), None);
    assert_old_exact(&db, &truth);
    // The advice: tables of its own. The old tables stay as they were.
    let own = fresh_ledger
        .replace("\"daily_counts\"", "\"daily_counts_b\"")
        .replace("\"totals\"", "\"totals_b\"");
    let r = pipeline(&own, &topic, &unique("g"), &db.schema);
    run_caught_up(&r.path);
    assert_old_exact(&db, &truth);
    assert_eq!(
        table(&db, "SELECT cust, total::bigint FROM {s}.totals_b"),
        truth.sums(|e| e.cust.clone(), |_| true)
    );
    assert!(db
        .text("SELECT obj_description('{s}.totals_b'::regclass, 'pg_class')")
        .unwrap()
        .contains("ledger_b"));
}

/// A projection changed in place (another filter) is refused with the path to take; a projection dropped from
/// the file is refused until `projection remove` records it. Following the path — the changed projection added
/// under a new name and table, built, the old one removed — ends exact, the old table left as it was.
#[test]
fn a_projection_changed_in_place_is_refused_and_the_advised_path_is_exact() {
    let (db, topic) = stage("projchange", PARTITIONS);
    let group = unique("g");
    let mut truth = Truth::new(5);
    produce(&topic, &truth.batch(150));
    let p = pipeline(BASE, &topic, &group, &db.schema);
    run_caught_up(&p.path);
    let record = || db.text("SELECT projections::text FROM {s}.replaysafe_projection_set");
    let before = record();

    // In place: refused, nothing created or recorded, and the message gives the path.
    let filtered = "add = { total = \"amount\" }\nfilter = \"amount > 0.0\"\n";
    let changed = BASE.replace("add = { total = \"amount\" }\n", filtered);
    let out = replaysafe(&[
        "init",
        "--config",
        arg(&pipeline(&changed, &topic, &group, &db.schema).path),
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    for needle in [
        "`filter` was none, now `amount > 0.0`",
        "cannot change in place",
        "new `name` and a new table",
        "replaysafe projection build",
        "replaysafe projection remove",
    ] {
        assert!(out.stderr.contains(needle), "`{needle}` in {}", out.stderr);
    }
    assert!(!out.stderr.contains("own [ledger] table"), "{}", out.stderr);
    assert_eq!(record(), before);

    // The path: the changed one beside the old one, under a new name and table.
    let beside = format!(
        "{BASE}[[projection]]\nname = \"totals_v2\"\nkind = \"sum\"\ntable = \"totals_v2\"\n\
         group-by = [\"cust\"]\n{filtered}"
    );
    let beside = pipeline(&beside, &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&beside.path)]).assert_ok();
    produce(&topic, &truth.batch(50));
    run_caught_up(&beside.path);
    build(&beside, "totals_v2", &[]).assert_ok();
    // The old one deleted from the file: refused until removed, naming the command.
    let without = beside_text_without_totals(&topic, &group, &db.schema, filtered);
    let out = try_run(&without.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("replaysafe projection remove --config FILE --projection totals"),
        "{}",
        out.stderr
    );
    // A worker still running the file that has it stops at its next batch once it is removed.
    let mut worker = spawn_run(&beside, &[], "beside");
    wait_until(
        Duration::from_secs(60),
        "the worker to take its partitions",
        || {
            std::fs::read_to_string(beside.dir.path().join("beside.err"))
                .unwrap()
                .contains("partition assigned")
        },
    );
    let removed = replaysafe(&[
        "projection",
        "remove",
        "--config",
        arg(&without.path),
        "--projection",
        "totals",
    ]);
    removed.assert_ok();
    assert!(
        removed.stdout.contains("is left as it is"),
        "{}",
        removed.stdout
    );
    assert_eq!(state(&db, "totals").as_deref(), Some("removed"));
    let totals_then = table(&db, "SELECT cust, total::bigint FROM {s}.totals");
    produce(&topic, &truth.batch(50));
    let (code, err) = wait_exit(&mut worker, &beside, "beside");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("runs an older pipeline file"), "{err}");
    run_caught_up(&without.path);
    assert_eq!(
        table(&db, "SELECT cust, total::bigint FROM {s}.totals_v2"),
        truth.sums(|e| e.cust.clone(), |e| e.amount > 0)
    );
    assert_eq!(
        table(
            &db,
            "SELECT day::text || '/' || cust, n FROM {s}.daily_counts"
        ),
        truth.counts(|e| format!("{}/{}", e.day, e.cust), |_| true)
    );
    assert_eq!(
        table(&db, "SELECT cust, total::bigint FROM {s}.totals"),
        totals_then
    );

    // Its table dropped (docs/replay.md "Change a running pipeline": "drop it yourself when nothing reads it"),
    // a worker restarted with the older file that still has it
    // is refused: it must not silently feed the removed projection again (nor stop the current workers).
    db.execute("DROP TABLE {s}.totals");
    let record_then = record();
    let out = try_run(&beside.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    for needle in [
        "projection `totals` as removed",
        "start it with the current one",
        "new `name`",
    ] {
        assert!(out.stderr.contains(needle), "`{needle}` in {}", out.stderr);
    }
    assert_eq!(record(), record_then);
    assert_eq!(state(&db, "totals").as_deref(), Some("removed"));
    assert!(db.text("SELECT to_regclass('{s}.totals')::text").is_none());
    run_caught_up(&without.path);
}

fn beside_text_without_totals(topic: &str, group: &str, schema: &str, filtered: &str) -> Pipeline {
    let base = BASE.replace(
        "[[projection]]\nkind = \"sum\"\ntable = \"totals\"\ngroup-by = [\"cust\"]\nadd = { total = \"amount\" }\n",
        "",
    );
    assert!(!base.contains("\"totals\""));
    let text = format!(
        "{base}[[projection]]\nname = \"totals_v2\"\nkind = \"sum\"\ntable = \"totals_v2\"\n\
         group-by = [\"cust\"]\n{filtered}"
    );
    pipeline(&text, topic, group, schema)
}

/// Records the ledger claimed before the hand-over that retention deleted from the topic: the build refuses
/// (exit 1) naming the partition and offsets, the projection stays `building` and untouched; with a declared
/// start (`--from`) it builds the rest, says how many claimed records it left out, and the projection holds
/// exactly the ledger's claims minus those.
#[test]
fn a_build_refuses_history_lost_to_retention_unless_a_start_is_declared() {
    let (db, topic) = stage("projlost", PARTITIONS);
    let group = unique("g");
    let old = pipeline(BASE, &topic, &group, &db.schema);
    let new = pipeline(&format!("{BASE}{ADDED}"), &topic, &group, &db.schema);
    let mut truth = Truth::new(11);
    produce(&topic, &truth.batch(200));
    run_caught_up(&old.path);
    replaysafe(&["init", "--config", arg(&new.path)]).assert_ok();
    delete_records_before(&topic, 0, 10);
    let lost = db.i64(&format!(
        "SELECT count(*) FROM {{s}}.replaysafe_ledger l JOIN {{s}}.replaysafe_sources s ON s.id = l._source_id \
         WHERE topic = '{topic}' AND partition = 0 AND \"offset\" < 10"
    ));
    assert!(lost > 0);

    let out = build(&new, "by_cust", &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("{topic}/0: {lost} records the ledger claimed"))
            && out.stderr.contains("--from"),
        "{}",
        out.stderr
    );
    assert_eq!(state(&db, "by_cust").as_deref(), Some("building"));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.by_cust"), 0);

    let out = replaysafe(&[
        "projection",
        "build",
        "--config",
        arg(&new.path),
        "--projection",
        "by_cust",
        "--from",
        "2026-07-01T00:00:00Z",
    ]);
    out.assert_ok();
    assert!(
        out.stdout
            .contains(&format!("claimed before --from {lost}")),
        "{}",
        out.stdout
    );
    assert_eq!(state(&db, "by_cust").as_deref(), Some("active"));
    assert_eq!(
        db.i64("SELECT sum(n)::bigint FROM {s}.by_cust"),
        truth.events.len() as i64 - lost
    );
    assert_old_exact(&db, &truth);
}

/// A record older than the ledger's horizon (its delivery key may have been pruned: whether production landed it
/// cannot be known) stops the build (exit 1, nothing of that batch applied) instead of being guessed at; the
/// projection stays `building`.
#[test]
fn a_build_stops_at_a_record_older_than_the_ledger_horizon() {
    let (db, topic) = stage("projhorizon", PARTITIONS);
    let group = unique("g");
    let horizon = |t: &str| t.replace("[identity]", "[ledger]\nhorizon-days = 400\n[identity]");
    let old = pipeline(&horizon(BASE), &topic, &group, &db.schema);
    let new = pipeline(
        &horizon(&format!("{BASE}{ADDED}")),
        &topic,
        &group,
        &db.schema,
    );
    let mut truth = Truth::new(13);
    produce(&topic, &truth.batch(100));
    run_caught_up(&old.path);
    let init = replaysafe(&["init", "--config", arg(&new.path)]);
    init.assert_ok();
    // init says what is left to do, on stdout.
    for name in ["by_cust", "amounts"] {
        let says = format!(
            "projection `{name}` is building (fed from its hand-over point on): build its history"
        );
        assert!(init.stdout.contains(&says), "{says}\n{}", init.stdout);
    }
    // The ledger aged by hand: days before 2026-07-03 are no longer remembered.
    db.execute("UPDATE {s}.replaysafe_horizon SET pruned_below = '2026-07-03'");
    let out = build(&new, "by_cust", &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("older than the horizon of ledger") && out.stderr.contains("--from"),
        "{}",
        out.stderr
    );
    assert_eq!(state(&db, "by_cust").as_deref(), Some("building"));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.by_cust"), 0);
    assert_old_exact(&db, &truth);
}

/// A ledger that holds no claims has projected nothing under its recorded projections: a changed or dropped
/// projection is recorded (no refusal, no build).
#[test]
fn a_ledger_without_claims_takes_any_change() {
    let (db, topic) = stage("projempty", 1);
    let group = unique("g");
    replaysafe(&[
        "init",
        "--config",
        arg(&pipeline(BASE, &topic, &group, &db.schema).path),
    ])
    .assert_ok();
    let changed = BASE.replace(
        "add = { total = \"amount\" }\n",
        "add = { total = \"amount\" }\nfilter = \"amount > 0.0\"\n",
    );
    let p = pipeline(&changed, &topic, &group, &db.schema);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    assert_eq!(
        db.text("SELECT projections->'totals'->'settings'->>'filter' FROM {s}.replaysafe_projection_set")
            .as_deref(),
        Some("amount > 0.0")
    );
    assert_eq!(state(&db, "totals").as_deref(), Some("active"));
}

/// A second pipeline with other projections on the same ledger is refused (it used to find every event
/// already claimed and leave its projections empty).
#[test]
fn a_ledger_is_not_shared_by_pipelines_with_other_projections() {
    let (db, topic) = stage("shared", 1);
    let (recs, _) = seed_events(50, 1);
    produce(&topic, &recs);
    let p1 = pipeline(SEED, &topic, &unique("g"), &db.schema);
    run_caught_up(&p1.path);
    let other = SEED.replace("table = \"daily_counts\"", "table = \"other_counts\"");
    let p2 = pipeline(&other, &topic, &unique("g"), &db.schema);
    let out = try_run(&p2.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("own [ledger] table"), "{}", out.stderr);
    // Its own ledger over the first pipeline's `daily_totals` is refused: that table would count every event
    // twice (issue 16.1); nothing is created.
    let own = other.replace(
        "[identity]",
        "[ledger]\ntable = \"other_ledger\"\n\n[identity]",
    );
    let out = try_run(&pipeline(&own, &topic, &unique("g"), &db.schema).path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("is fed by ledger"), "{}", out.stderr);
    assert_eq!(
        db.text("SELECT to_regclass('{s}.other_ledger')::text"),
        None
    );
    // With its own ledger and tables it counts everything; the first pipeline's tables are unchanged.
    let own = own.replace("\"daily_totals\"", "\"other_totals\"");
    let p3 = pipeline(&own, &topic, &unique("g"), &db.schema);
    assert_eq!(run_caught_up(&p3.path).tally().landed, 50);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.other_counts"), 50);
    assert_eq!(db.i64("SELECT sum(n)::bigint FROM {s}.daily_counts"), 50);
}
