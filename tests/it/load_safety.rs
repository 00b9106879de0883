//! Issue 16 item 2: `load` beside the pipeline's running `run` (its own group, production's checkpoints and
//! progress intact), a dump whose offsets pass the live topic's end (refused, checkpoints at or below the end),
//! and a `run` fenced by another writer (it takes the partition back, the fenced batch is counted).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use crate::core::{counts, seed_events, SEED};
use crate::file_source::kcat_line;

type Truth = BTreeMap<(String, String), i64>;

/// The truths of several batches of seed events, added.
fn sum(truths: &[&Truth]) -> Truth {
    let mut m = Truth::new();
    for t in truths {
        for (k, n) in *t {
            *m.entry(k.clone()).or_insert(0) += n;
        }
    }
    m
}

/// The offsets `recs` take when produced in order to a topic whose partitions hold `next[p]` records; `next`
/// advances past them.
fn offsets_of(recs: &[Rec], next: &mut [i64]) -> Vec<i64> {
    recs.iter()
        .map(|r| {
            next[r.partition as usize] += 1;
            next[r.partition as usize] - 1
        })
        .collect()
}

/// Writes a kcat `-J` file of `recs` at `offsets` (one per record).
fn dump(path: &Path, topic: &str, recs: &[Rec], offsets: &[i64]) {
    let lines: Vec<String> = recs
        .iter()
        .zip(offsets)
        .map(|(r, o)| kcat_line(topic, r.partition, *o, r))
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn load(p: &Pipeline, file: &Path, extra: &[&str]) -> Out {
    let head = ["load", "--config", arg(&p.path)];
    replaysafe(&[&head[..], extra, &[arg(file)]].concat())
}

/// `(partition, next_offset, fence)` of `group`'s checkpoints.
fn checkpoints(db: &Db, group: &str) -> Vec<(i32, Option<i64>, i64)> {
    db.query(
        "SELECT partition, next_offset, fence FROM {s}.replaysafe_checkpoints WHERE consumer_group = $1 \
         ORDER BY partition",
        &[&group],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn nexts(db: &Db, group: &str) -> Vec<Option<i64>> {
    checkpoints(db, group).iter().map(|c| c.1).collect()
}

fn read(p: &Pipeline, name: &str) -> String {
    std::fs::read_to_string(p.dir.path().join(name)).unwrap()
}

/// A `load` of production's own records while production's `run` runs: under its own group, production's
/// checkpoints (offsets and fences) are untouched and events produced afterwards are applied by production.
/// Then, production stopped, a load that lands new records: production reads them later as duplicates.
#[test]
fn load_beside_a_running_pipeline_leaves_its_checkpoints_and_progress() {
    let (db, topic) = stage("load_prod", 3);
    let group = unique("prod");
    let p = pipeline(SEED, &topic, &group, &db.schema);
    let mut next = [0i64; 3];
    let (a, truth_a) = seed_events(90, 3);
    produce(&topic, &a);
    let off_a = offsets_of(&a, &mut next);
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    let mut prod = spawn_run(&p, &[], "prod");
    wait_until(Duration::from_secs(90), "production applies A", || {
        nexts(&db, &group) == vec![Some(30); 3]
    });
    let before = checkpoints(&db, &group);

    let file = p.dir.path().join("prod-dump.jsonl");
    dump(&file, &topic, &a, &off_a);
    let out = load(&p, &file, &[]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate),
        (90, 0, 90),
        "{}",
        out.stderr
    );
    assert_eq!(
        checkpoints(&db, &group),
        before,
        "production's checkpoints and fences untouched"
    );
    let others: Vec<String> = db
        .query(
            "SELECT DISTINCT consumer_group FROM {s}.replaysafe_checkpoints WHERE consumer_group <> $1",
            &[&group],
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(others.len(), 1, "{others:?}");
    assert!(
        others[0].starts_with("replaysafe-load-prod-dump-"),
        "{others:?}"
    );
    let own = others[0].clone();
    assert_eq!(nexts(&db, &own), vec![Some(30); 3]);

    // Production goes on: what is produced after the load is applied by it.
    let (c, truth_c) = seed_events(60, 3);
    produce(&topic, &c);
    let off_c = offsets_of(&c, &mut next);
    wait_until(Duration::from_secs(90), "production applies C", || {
        nexts(&db, &group) == vec![Some(50); 3]
    });
    assert_eq!(terminate(&mut prod), Some(0));
    let out = read(&p, "prod.out");
    assert!(out.contains("consumed 150 = landed 150"), "{out}");
    let err = read(&p, "prod.err");
    assert!(!err.contains("fenced"), "{err}");

    // Production stopped; D is produced and loaded first (the load resumes after A under its group): the keys
    // it lands are claimed in the ledger, and production counts them duplicate when it reads them.
    let (d, truth_d) = seed_events(30, 3);
    produce(&topic, &d);
    let off_d = offsets_of(&d, &mut next);
    let all: Vec<Rec> = [&a[..], &c[..], &d[..]].concat();
    let offsets: Vec<i64> = [&off_a[..], &off_c[..], &off_d[..]].concat();
    dump(&file, &topic, &all, &offsets);
    let out = load(&p, &file, &[]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate),
        (90, 30, 60),
        "{}",
        out.stderr
    );
    assert_eq!(nexts(&db, &own), vec![Some(60); 3]);
    assert_eq!(nexts(&db, &group), vec![Some(50); 3]);
    let out = run_caught_up(&p.path);
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (30, 0, 30));

    assert_eq!(counts(&db), sum(&[&truth_a, &truth_c, &truth_d]));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 180);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    assert_eq!(nexts(&db, &group), vec![Some(60); 3]);
    assert_eq!(committed(&group, &topic, 3), vec![Some(60); 3]);
}

/// A dump of another cluster (5 more records per partition than the live topic) is refused before anything
/// is applied, with `--take-over` and under the load's own group: no checkpoint passes the real end, and the
/// pipeline applies every real record produced afterwards. A dump of the live topic with `--take-over` writes
/// production's checkpoints, which production resumes from.
#[test]
fn load_of_a_foreign_dump_leaves_checkpoints_at_or_below_the_end() {
    let (db, topic) = stage("load_foreign", 3);
    let group = unique("prod");
    let p = pipeline(SEED, &topic, &group, &db.schema);
    let mut live_next = [0i64; 3];
    let (a, truth_a) = seed_events(30, 3);
    produce(&topic, &a);
    let off_a = offsets_of(&a, &mut live_next);
    assert_eq!(run_caught_up(&p.path).tally().landed, 30);
    let before = checkpoints(&db, &group);
    assert_eq!(nexts(&db, &group), vec![Some(10); 3]);

    let (f, _) = seed_events(45, 3);
    let foreign = offsets_of(&f, &mut [0i64; 3]);
    let file = p.dir.path().join("other-cluster.jsonl");
    dump(&file, &topic, &f, &foreign);
    for extra in [&["--take-over"][..], &[]] {
        let out = load(&p, &file, extra);
        assert_eq!(out.code, Some(2), "{extra:?}: {}", out.stderr);
        for part in 0..3 {
            let says = format!(
                "{topic}/{part}: offsets 0 to 14 in the file, the live partition ends at 10"
            );
            assert!(out.stderr.contains(&says), "{says}\n{}", out.stderr);
        }
        assert!(out.stderr.contains("Nothing was applied"), "{}", out.stderr);
    }
    assert_eq!(checkpoints(&db, &group), before);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_checkpoints"),
        3,
        "no other group's checkpoints"
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 30);

    // The real records that follow are all applied.
    let (b, truth_b) = seed_events(15, 3);
    produce(&topic, &b);
    let off_b = offsets_of(&b, &mut live_next);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.consumed, t.landed), (15, 15));
    assert_eq!(nexts(&db, &group), vec![Some(15); 3]);

    // A dump of the live topic, taken over deliberately (production stopped): production's checkpoints are
    // written (nothing past the end: records below them skipped, C landed) and production resumes after them.
    let (c, truth_c) = seed_events(9, 3);
    produce(&topic, &c);
    let off_c = offsets_of(&c, &mut live_next);
    let live = p.dir.path().join("live.jsonl");
    dump(
        &live,
        &topic,
        &[&a[..], &b[..], &c[..]].concat(),
        &[&off_a[..], &off_b[..], &off_c[..]].concat(),
    );
    let out = load(&p, &live, &["--take-over"]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!((t.consumed, t.landed), (9, 9), "{}", out.stderr);
    assert_eq!(nexts(&db, &group), vec![Some(18); 3]);
    let (e, truth_e) = seed_events(6, 3);
    produce(&topic, &e);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.consumed, t.landed), (6, 6));

    assert_eq!(counts(&db), sum(&[&truth_a, &truth_b, &truth_c, &truth_e]));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 60);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_checkpoints"),
        3,
        "only production's checkpoints"
    );
    assert_eq!(nexts(&db, &group), vec![Some(20); 3]);
    assert_eq!(committed(&group, &topic, 3), vec![Some(20); 3]);

    // A checkpoint already past the end (what an earlier `load` could write): `run` refuses to position there
    // instead of skipping the records that will arrive below it.
    db.execute("UPDATE {s}.replaysafe_checkpoints SET next_offset = 25 WHERE partition = 1");
    let out = try_run(&p.path);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let says =
        format!("{topic}/1: the checkpoint is offset 25 but the broker's partition ends at 20");
    assert!(out.stderr.contains(&says), "{says}\n{}", out.stderr);
    assert_eq!(nexts(&db, &group), vec![Some(20), Some(25), Some(20)]);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 60);
}

/// `GET /metrics` on `addr`.
fn metrics(addr: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// `replaysafe_fenced_batches_total{topic, partition}` in a `/metrics` text.
fn fenced_batches(text: &str, topic: &str, partition: i32) -> Option<f64> {
    let partition = partition.to_string();
    sample(
        text,
        "replaysafe_fenced_batches_total",
        &[("topic", topic), ("partition", &partition)],
    )
}

/// Another writer bumps a partition's fence behind a running `run` (what `load --take-over` does): the run's
/// next batch of it is fenced and counted, and once the group coordinator confirms the worker still owns the
/// partition it takes it back and applies the rest — it never idles holding it.
#[test]
fn a_fenced_run_takes_its_partition_back_and_counts_the_fenced_batch() {
    let (db, topic) = stage("fenced_run", 2);
    let group = unique("prod");
    let p = pipeline(SEED, &topic, &group, &db.schema);
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    replaysafe(&["init", "--config", arg(&p.path)]).assert_ok();
    let mut w = spawn_run(&p, &["--metrics-addr", &addr], "w");
    let (recs, truth) = seed_events(40, 2);
    produce(&topic, &recs[..20]);
    wait_until(Duration::from_secs(90), "the first 20 applied", || {
        nexts(&db, &group) == vec![Some(10); 2]
    });

    db.execute("UPDATE {s}.replaysafe_checkpoints SET fence = fence + 1 WHERE partition = 0");
    produce(&topic, &recs[20..]);
    wait_until(
        Duration::from_secs(90),
        "the rest applied by the worker",
        || nexts(&db, &group) == vec![Some(20); 2],
    );
    let text = metrics(&addr).expect("/metrics");
    assert_eq!(fenced_batches(&text, &topic, 0), Some(1.0), "{text}");
    assert_eq!(fenced_batches(&text, &topic, 1).unwrap_or(0.0), 0.0);
    assert_eq!(terminate(&mut w), Some(0));
    let err = read(&p, "w.err");
    assert!(err.contains("fenced"), "{err}");
    assert!(err.contains("confirms this member still owns"), "{err}");
    let out = read(&p, "w.out");
    assert!(out.contains("consumed 40 = landed 40"), "{out}");

    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 40);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    assert_eq!(committed(&group, &topic, 2), vec![Some(20); 2]);
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
