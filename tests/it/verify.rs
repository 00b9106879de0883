//! `verify snapshot` / `verify diff` while production writes into the window (issue 13 part 3): the diff accounts
//! each day for the backfill's report and for every other consumer group's ledger claims between the two
//! snapshots; counter and sum projections; a real double count exits 1; a dry run's report, another pipeline's
//! report and a changed pipeline file are refused (exit 2).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;

use crate::common::*;
use crate::core::{seed_events, SEED};

/// The seed pipeline whose ledger also holds `amount`, so that `verify` can account other groups' sums.
fn seed_with_amount() -> String {
    format!("{SEED}\n[ledger]\ncolumns = [\"amount\"]\n")
}

/// The buggy pipeline: refunds (amount < 0) dropped by a filter rule.
fn buggy(text: &str) -> String {
    text.replace(
        "[identity]",
        "[[filter]]\nname = \"no-refunds\"\ndrop-if = \"amount < 0.0\"\n\n[identity]",
    )
}

const APR25: i64 = 1_714_003_200_000; // 2024-04-25T00:00:00Z
const WINDOW: &str = "day between '2024-04-25' and '2024-04-30'";

/// A late event of a window day (2024-04-25 + `day`) produced now: (record, day, customer, amount in cents).
fn late(i: usize, day: i64) -> (Rec, String, String, i64) {
    let mut rng = rand::rng();
    let occurred_ms = APR25 + day * 86_400_000 + rng.random_range(0..86_000_000);
    let occurred = chrono::DateTime::from_timestamp_millis(occurred_ms)
        .unwrap()
        .to_rfc3339();
    let customer = format!("c-{}", rng.random_range(0..7));
    let (amount, cents) = if i % 4 == 0 {
        ("-5.25", -525)
    } else {
        ("12.50", 1250)
    };
    let id = uuid::Uuid::new_v4();
    let rec = Rec::json(
        (i % 3) as i32,
        &customer,
        &format!(
            r#"{{"event_id":"{id}","customer_id":"{customer}","amount":"{amount}","occurred_at":"{occurred}"}}"#
        ),
        chrono::Utc::now().timestamp_millis(),
    );
    (rec, occurred[..10].to_string(), customer, cents)
}

/// The day lines of `verify diff`'s table: day → column name → cell.
fn table(stdout: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with("day "));
    let head: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // "changed by" is two words in the header.
    let names: Vec<String> = ["day", "changed", "backfill"]
        .iter()
        .map(|s| s.to_string())
        .chain(head.iter().skip(4).map(|s| s.to_string()))
        .collect();
    lines
        .filter(|l| l.starts_with("20"))
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            let row = names
                .iter()
                .zip(cells.iter())
                .map(|(n, c)| (n.clone(), c.to_string()))
                .collect();
            (cells[0].to_string(), row)
        })
        .collect()
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The issue's scenario: production (two `run` workers of the fixed pipeline) keeps landing late events of the
/// window's days while a six-day refund backfill runs; `verify diff` — taken while production still writes, and
/// again once it is caught up — exits 0 for the counter and the sum, with per day the backfill's column equal to
/// its report and production's column equal to the late events it landed since the snapshot.
#[test]
fn verify_diff_accounts_for_production_writing_into_the_window() {
    let (db, topic) = stage("vd_prod", 3);
    let (recs, mut truth) = seed_events(1800, 3);
    produce(&topic, &recs);
    let prod = unique("prod");
    let text = seed_with_amount();
    let buggy_run = run_caught_up(&pipeline(&buggy(&text), &topic, &prod, &db.schema).path).tally();
    assert!(buggy_run.filtered > 0, "{buggy_run:?}");
    // The fix is deployed: two production workers of the same group.
    let p = pipeline(&text, &topic, &prod, &db.schema);
    let mut w1 = spawn_run(&p, &[], "w1");
    let mut w2 = spawn_run(&p, &[], "w2");
    let ledger = || db.i64("SELECT count(*) FROM {s}.replaysafe_ledger");
    let mut expected_ledger = 1800 - buggy_run.filtered as i64;
    // Late events before the snapshot, landed by production.
    let first: Vec<_> = (0..60).map(|i| late(i, (i % 6) as i64)).collect();
    produce(
        &topic,
        &first.iter().map(|x| x.0.clone()).collect::<Vec<_>>(),
    );
    for (_, d, c, _) in &first {
        *truth.entry((d.clone(), c.clone())).or_insert(0) += 1;
    }
    expected_ledger += 60;
    wait_until(
        Duration::from_secs(120),
        "production lands the first late events",
        || ledger() == expected_ledger,
    );
    let dir = p.dir.path();
    let (stop, report) = (dir.join("stop.json"), dir.join("report.json"));
    let (before_n, before_t) = (dir.join("before_n.json"), dir.join("before_t.json"));
    offsets_snapshot(&p, &prod, &stop).assert_ok();
    verify_snapshot(&p, "daily_counts", Some(WINDOW), &before_n).assert_ok();
    verify_snapshot(&p, "daily_totals", Some(WINDOW), &before_t).assert_ok();
    let snap = json(&before_n);
    assert!(snap["taken_at"].as_str().unwrap().ends_with('Z'), "{snap}");
    assert_eq!(
        snap["ledger"]["2024-04-25"][&prod]["rows"].as_i64().unwrap(),
        db.i64(&format!(
            "SELECT count(*) FROM {{s}}.replaysafe_ledger l JOIN {{s}}.replaysafe_sources s ON s.id = l._source_id \
             WHERE day = '2024-04-25' AND consumer_group = '{prod}'"
        )),
        "{snap}"
    );

    // Late events keep arriving during the backfill and the diff.
    let stop_producing = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(Mutex::new(Vec::new()));
    let producer = {
        let (stop_producing, produced, topic) =
            (stop_producing.clone(), produced.clone(), topic.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop_producing.load(Ordering::Relaxed) {
                let batch: Vec<_> = (i..i + 6).map(|j| late(j, (j % 6) as i64)).collect();
                produce(
                    &topic,
                    &batch.iter().map(|x| x.0.clone()).collect::<Vec<_>>(),
                );
                produced
                    .lock()
                    .unwrap()
                    .extend(batch.into_iter().map(|(_, d, c, a)| (d, c, a)));
                i += 6;
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let at_snapshot = expected_ledger;
    wait_until(
        Duration::from_secs(120),
        "production lands late events after the snapshot",
        || ledger() >= at_snapshot + 30,
    );
    let bf = unique("bf");
    let out = backfill(
        &p,
        "2024-04-25T00:00:00Z",
        ("--to-offsets", arg(&stop)),
        &bf,
        &["--filter", "amount < 0", "-o", arg(&report)],
    );
    out.assert_ok();
    let r = json(&report);
    let landed: u64 = r["per_day"]
        .as_object()
        .unwrap()
        .values()
        .map(|d| d["landed"].as_u64().unwrap())
        .sum();
    assert_eq!(
        landed, buggy_run.filtered,
        "the backfill landed exactly the dropped refunds"
    );
    // The diff while production still writes: exit 0, a column for the production group.
    for before in [&before_n, &before_t] {
        let v = verify_diff(before, &report);
        v.assert_ok();
        assert!(
            v.stdout.contains("verified") && v.stdout.contains(&prod),
            "{}",
            v.stdout
        );
    }
    stop_producing.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    let second = produced.lock().unwrap().clone();
    assert!(second.len() >= 30);
    for (d, c, _) in &second {
        *truth.entry((d.clone(), c.clone())).or_insert(0) += 1;
    }
    expected_ledger += second.len() as i64 + landed as i64;
    wait_until(Duration::from_secs(120), "production catches up", || {
        ledger() == expected_ledger
    });

    // Caught up: per day, production's column is exactly the late events produced after the snapshot.
    let mut late_n: BTreeMap<String, i64> = BTreeMap::new();
    let mut late_cents: BTreeMap<String, i64> = BTreeMap::new();
    for (d, _, a) in &second {
        *late_n.entry(d.clone()).or_default() += 1;
        *late_cents.entry(d.clone()).or_default() += a;
    }
    let v = verify_diff(&before_n, &report);
    v.assert_ok();
    let t = table(&v.stdout);
    assert_eq!(t.len(), 6, "{}", v.stdout);
    for (day, row) in &t {
        let n = |c: &str| row[c].parse::<i64>().unwrap();
        assert_eq!(n(&prod), late_n[day], "{day}: {}", v.stdout);
        assert_eq!(
            n("backfill"),
            r["per_day"][day]["landed"].as_i64().unwrap(),
            "{}",
            v.stdout
        );
        assert_eq!(n("changed"), n("backfill") + n(&prod), "{}", v.stdout);
        assert_eq!(n("unexplained"), 0);
    }
    let v = verify_diff(&before_t, &report);
    v.assert_ok();
    for (day, row) in &table(&v.stdout) {
        let cents = |c: &str| (row[c].parse::<f64>().unwrap() * 100.0).round() as i64;
        assert_eq!(cents(&prod), late_cents[day], "{day}: {}", v.stdout);
        assert_eq!(
            cents("backfill"),
            -525 * r["per_day"][day]["landed"].as_i64().unwrap(),
            "{}",
            v.stdout
        );
        assert_eq!(
            cents("changed"),
            cents("backfill") + cents(&prod),
            "{}",
            v.stdout
        );
    }
    assert_eq!(terminate(&mut w1), Some(0));
    assert_eq!(terminate(&mut w2), Some(0));
    assert_eq!(crate::core::counts(&db), truth, "every event counted once");
    assert_eq!(ledger(), expected_ledger);
}

/// `verify diff`'s stderr and stdout, for messages.
fn both(o: &Out) -> String {
    format!("{}\n{}", o.stdout, o.stderr)
}

/// The day line of `day` in a diff's stdout.
fn line<'a>(o: &'a Out, day: &str) -> &'a str {
    o.stdout
        .lines()
        .find(|l| l.starts_with(day))
        .unwrap_or_default()
}

/// A backfill that really double-counts — a writer adds to the projection outside the ledger — exits 1 naming
/// only that day, for the counter and the sum; with it undone the diff verifies. A sum whose field the ledger
/// does not hold cannot account production's claims: UNACCOUNTED, exit 1 (the counter still verifies). A dry
/// run's report, a snapshot of another pipeline, a pipeline file changed since the snapshot and a snapshot of an
/// earlier version are refused with exit 2; a snapshot taken after the backfill exits 1 saying so.
#[test]
fn verify_diff_finds_double_counts_and_refuses_what_cannot_be_compared() {
    let (db, topic) = stage("vd_double", 3);
    let (recs, _) = seed_events(600, 3);
    produce(&topic, &recs);
    let prod = unique("prod");
    let buggy_run = run_text(&buggy(SEED), &topic, &prod, &db).tally();
    let p = pipeline(SEED, &topic, &prod, &db.schema);
    let dir = p.dir.path();
    let f = |n: &str| dir.join(n);
    offsets_snapshot(&p, &prod, &f("stop.json")).assert_ok();
    verify_snapshot(&p, "daily_counts", Some(WINDOW), &f("n.json")).assert_ok();
    verify_snapshot(&p, "daily_totals", Some(WINDOW), &f("t.json")).assert_ok();
    let bf = unique("bf");
    let refunds = |extra: &[&str]| {
        let stop_file = f("stop.json");
        let stop = ("--to-offsets", arg(&stop_file));
        backfill(
            &p,
            "2024-04-25T00:00:00Z",
            stop,
            &bf,
            &[&["--filter", "amount < 0"], extra].concat(),
        )
    };
    refunds(&["--dry-run", "-o", arg(&f("dry.json"))]).assert_ok();
    let dry = verify_diff(&f("n.json"), &f("dry.json"));
    assert_eq!(dry.code, Some(2), "{}", both(&dry));
    assert!(dry.stderr.contains("dry run"), "{}", dry.stderr);
    refunds(&["-o", arg(&f("report.json"))]).assert_ok();
    let r = json(&f("report.json"));
    assert_eq!(r["dry_run"], false);
    assert!(r["pipeline"].as_str().unwrap().len() == 64, "{r}");
    let landed: i64 = r["per_day"]
        .as_object()
        .unwrap()
        .values()
        .map(|d| d["landed"].as_i64().unwrap())
        .sum();
    assert_eq!(landed, buggy_run.filtered as i64);
    let sums: f64 = r["per_day"]
        .as_object()
        .unwrap()
        .values()
        .map(|d| {
            d["sums"][format!("{}.daily_totals.total", db.schema)]
                .as_str()
                .unwrap_or("0")
                .parse::<f64>()
                .unwrap()
        })
        .sum();
    assert_eq!((sums * 100.0).round() as i64, -525 * landed, "{r}");

    // A double count outside the ledger on 2024-04-27.
    let bump = |n: i64, total: &str| {
        db.execute(&format!(
            "UPDATE {{s}}.daily_counts SET n = n + {n} WHERE day = '2024-04-27' AND customer_id = 'c-1'; \
             UPDATE {{s}}.daily_totals SET total = total + {total} WHERE day = '2024-04-27' AND customer_id = 'c-1'"
        ))
    };
    bump(1, "12.50");
    for (snap, unexplained) in [("n.json", "1"), ("t.json", "12.5")] {
        let v = verify_diff(&f(snap), &f("report.json"));
        assert_eq!(v.code, Some(1), "{}", both(&v));
        let l = line(&v, "2024-04-27");
        assert!(l.contains("MISMATCH"), "{}", v.stdout);
        assert_eq!(
            table(&v.stdout)["2024-04-27"]["unexplained"],
            unexplained,
            "{}",
            v.stdout
        );
        assert_eq!(v.stdout.matches("MISMATCH").count(), 1, "{}", v.stdout);
        assert!(
            v.stderr.contains("1 day(s)") && v.stderr.contains("2024-04-27"),
            "{}",
            v.stderr
        );
    }
    bump(-1, "-12.50");
    for snap in ["n.json", "t.json"] {
        verify_diff(&f(snap), &f("report.json")).assert_ok();
    }
    // A move of one increment from a row the backfill did not change to another row of its day nets out on the
    // day; the ledger does not hold customer_id, yet the first row falls although its day's claims only add:
    // named (issue 41 item 5). (A move between two rows that both received claims cannot be seen without
    // customer_id in the ledger: the next test has it.)
    let snap = json(&f("n.json"));
    let now = crate::core::counts(&db);
    let unchanged = now
        .iter()
        .find(|((d, c), n)| snap["rows"][format!("{d}|{c}")].as_str() == Some(&n.to_string()))
        .map(|(k, _)| k.clone())
        .expect("a row no refund reached");
    let (day, from) = unchanged;
    let to = now
        .keys()
        .find(|(d, c)| *d == day && *c != from)
        .unwrap()
        .1
        .clone();
    let move_one = |sign: i64| {
        db.execute(&format!(
            "UPDATE {{s}}.daily_counts SET n = n + {sign} * CASE customer_id WHEN '{to}' THEN 1 ELSE -1 END \
             WHERE day = '{day}' AND customer_id IN ('{from}', '{to}')"
        ))
    };
    move_one(1);
    let v = verify_diff(&f("n.json"), &f("report.json"));
    assert_eq!(v.code, Some(1), "{}", both(&v));
    assert_eq!(rows_named(&v), [format!("{day}|{from}")], "{}", v.stdout);
    assert!(
        v.stdout.contains("the ledger does not hold customer_id"),
        "{}",
        v.stdout
    );
    move_one(-1);
    let v = verify_diff(&f("n.json"), &f("report.json"));
    v.assert_ok();
    assert!(
        v.stdout.contains("each row within its day's claims"),
        "{}",
        v.stdout
    );

    // Production lands late events; the ledger does not hold `amount`: the counter accounts for them, the sum
    // cannot.
    let late_events: Vec<Rec> = (0..12).map(|i| late(i, (i % 6) as i64).0).collect();
    produce(&topic, &late_events);
    run_caught_up(&p.path).assert_ok();
    let v = verify_diff(&f("n.json"), &f("report.json"));
    v.assert_ok();
    let t = table(&v.stdout);
    assert_eq!(
        t.values()
            .map(|r| r[&prod].parse::<i64>().unwrap())
            .sum::<i64>(),
        12,
        "{}",
        v.stdout
    );
    let v = verify_diff(&f("t.json"), &f("report.json"));
    assert_eq!(v.code, Some(1), "{}", both(&v));
    assert!(
        line(&v, "2024-04-25").contains("UNACCOUNTED"),
        "{}",
        v.stdout
    );
    assert!(
        line(&v, "2024-04-25").contains("[ledger] columns"),
        "{}",
        v.stdout
    );

    // A snapshot taken after the backfill cannot see its claims.
    verify_snapshot(&p, "daily_counts", Some(WINDOW), &f("late.json")).assert_ok();
    let v = verify_diff(&f("late.json"), &f("report.json"));
    assert_eq!(v.code, Some(1), "{}", both(&v));
    assert!(
        v.stdout.contains("snapshot taken after the backfill"),
        "{}",
        v.stdout
    );

    // Another pipeline's snapshot (a filter rule more), then this pipeline's file changed since its snapshot.
    let other = pipeline(&buggy(SEED), &topic, &prod, &db.schema);
    verify_snapshot(&other, "daily_counts", Some(WINDOW), &f("other.json")).assert_ok();
    let v = verify_diff(&f("other.json"), &f("report.json"));
    assert_eq!(v.code, Some(2), "{}", both(&v));
    assert!(v.stderr.contains("another pipeline"), "{}", v.stderr);
    let original = std::fs::read_to_string(&p.path).unwrap();
    std::fs::write(&p.path, buggy(&original)).unwrap();
    let v = verify_diff(&f("n.json"), &f("report.json"));
    assert_eq!(v.code, Some(2), "{}", both(&v));
    assert!(
        v.stderr.contains("changed since the snapshot"),
        "{}",
        v.stderr
    );
    std::fs::write(&p.path, original).unwrap();

    // A snapshot of an earlier version (no fingerprint, no ledger claims).
    let mut old = json(&f("n.json"));
    for k in ["format", "pipeline", "ledger"] {
        old.as_object_mut().unwrap().remove(k);
    }
    std::fs::write(f("old.json"), old.to_string()).unwrap();
    let v = verify_diff(&f("old.json"), &f("report.json"));
    assert_eq!(v.code, Some(2), "{}", both(&v));
    assert!(v.stderr.contains("earlier replaysafe"), "{}", v.stderr);

    // A --where the ledger cannot take (customer_id is not a ledger column) is bad usage.
    let v = verify_snapshot(
        &p,
        "daily_counts",
        Some("customer_id = 'c-1'"),
        &f("c1.json"),
    );
    assert_eq!(v.code, Some(2), "{}", both(&v));
    assert!(v.stderr.contains("applies to the ledger"), "{}", v.stderr);
}

/// A rebuild of the window verifies too: its report's landed rows, and the claims it deleted counted negatively
/// for the group that had made them — every day explained, the counts back to the truth.
#[test]
fn verify_diff_accounts_a_rebuild() {
    let (db, topic) = stage("vd_rebuild", 3);
    let (recs, truth) = seed_events(600, 3);
    produce(&topic, &recs);
    let prod = unique("prod");
    let p = pipeline(SEED, &topic, &prod, &db.schema);
    run_caught_up(&p.path).assert_ok();
    let dir = p.dir.path();
    let (before, report) = (dir.join("before.json"), dir.join("rebuild.json"));
    verify_snapshot(&p, "daily_counts", Some(WINDOW), &before).assert_ok();
    let rb = unique("rb");
    rebuild(
        &p,
        "2024-04-26",
        "2024-04-28",
        &rb,
        &["--i-paused-other-writers", "-o", arg(&report)],
    )
    .assert_ok();
    let v = verify_diff(&before, &report);
    v.assert_ok();
    let t = table(&v.stdout);
    for day in ["2024-04-26", "2024-04-27", "2024-04-28"] {
        let row = &t[day];
        assert_eq!(row["changed"], "0", "{}", v.stdout);
        assert_eq!(
            row[&prod].parse::<i64>().unwrap(),
            -row["backfill"].parse::<i64>().unwrap(),
            "{}",
            v.stdout
        );
    }
    assert_eq!(crate::core::counts(&db), truth);
}

/// A backfill whose identity lets it count again: production claimed every event (refunds included) without a
/// generation; the backfill (and its snapshot) run a pipeline file with `generation = "b"`, so the ledger does not
/// recognise the refunds and the backfill counts them a second time. Its claims, its report and the projection's
/// change agree with each other — `verify diff` still exits 1, naming the generations.
#[test]
fn verify_diff_exits_1_when_a_backfill_under_another_generation_counts_again() {
    let (db, topic) = stage("vd_gen", 2);
    let (recs, truth) = seed_events(300, 2);
    produce(&topic, &recs);
    let prod = unique("prod");
    run_text(SEED, &topic, &prod, &db).assert_ok();
    assert_eq!(crate::core::counts(&db), truth);
    let gen_b = SEED.replace(
        "partition-by = \"day\"",
        "partition-by = \"day\"\ngeneration = \"b\"",
    );
    let p = pipeline(&gen_b, &topic, &prod, &db.schema);
    let dir = p.dir.path();
    let (stop, before, report) = (
        dir.join("stop.json"),
        dir.join("before.json"),
        dir.join("report.json"),
    );
    offsets_snapshot(&p, &prod, &stop).assert_ok();
    verify_snapshot(&p, "daily_counts", Some(WINDOW), &before).assert_ok();
    backfill(
        &p,
        "2024-04-25T00:00:00Z",
        ("--to-offsets", arg(&stop)),
        &unique("bf"),
        &["--filter", "amount < 0", "-o", arg(&report)],
    )
    .assert_ok();
    let refunds = db.i64("SELECT count(*) FROM {s}.replaysafe_ledger WHERE generation = 'b'");
    assert!(refunds > 0);
    let total: i64 = crate::core::counts(&db).values().sum();
    assert_eq!(
        total,
        300 + refunds,
        "the refunds really were counted twice"
    );
    let v = verify_diff(&before, &report);
    assert_eq!(v.code, Some(1), "{}", both(&v));
    assert!(
        line(&v, "2024-04-25").contains("generation 'b'") && line(&v, "2024-04-25").contains("''"),
        "{}",
        v.stdout
    );
}

/// The seed pipeline whose ledger holds `amount` and `customer_id` (every group-by field), so that `verify`
/// accounts each projection row against the claims of its own key.
fn seed_with_rows() -> String {
    format!("{SEED}\n[ledger]\ncolumns = [\"amount\", \"customer_id\"]\n")
}

/// The row keys a diff's stdout names as differing.
fn rows_named(o: &Out) -> Vec<String> {
    o.stdout
        .lines()
        .skip_while(|l| !l.starts_with("row "))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Issue 41 items 5 and 6: with production landing late events of the window while a refund backfill runs, a
/// move of +1/−1 and ±50.00 between two customers of one day — which nets to nothing per day — exits 1 naming both
/// rows (counter and sum); undone, the diff verifies every row. A `--where customer_id = …` selects part of
/// each day and is refused (exit 2) naming that cause; the day-only condition it recommends is accepted. A
/// snapshot of format 1 (per-day claims only) is refused.
#[test]
fn verify_diff_names_the_rows_of_a_move_between_customers_of_one_day() {
    let (db, topic) = stage("vd_rows", 3);
    let (recs, mut truth) = seed_events(600, 3);
    produce(&topic, &recs);
    let prod = unique("prod");
    let text = seed_with_rows();
    let buggy_run = run_text(&buggy(&text), &topic, &prod, &db).tally();
    let p = pipeline(&text, &topic, &prod, &db.schema);
    let dir = p.dir.path();
    let f = |n: &str| dir.join(n);
    offsets_snapshot(&p, &prod, &f("stop.json")).assert_ok();
    let part = verify_snapshot(
        &p,
        "daily_counts",
        Some("customer_id = 'c-1'"),
        &f("c1.json"),
    );
    assert_eq!(part.code, Some(2), "{}", both(&part));
    assert!(
        part.stderr.contains("selects part of day 2024-04-25")
            && part.stderr.contains("day between"),
        "{}",
        part.stderr
    );
    verify_snapshot(&p, "daily_counts", Some(WINDOW), &f("n.json")).assert_ok();
    verify_snapshot(&p, "daily_totals", Some(WINDOW), &f("t.json")).assert_ok();
    let snap = json(&f("n.json"));
    assert_eq!(snap["format"], 2, "{snap}");
    assert_eq!(
        snap["row_claims"]["2024-04-25|c-1"][&prod]["rows"].as_i64(),
        Some(db.i64(
            "SELECT count(*) FROM {s}.replaysafe_ledger WHERE day = '2024-04-25' AND customer_id = 'c-1'"
        )),
        "{snap}"
    );
    // Production lands late events of every window day while the backfill runs.
    let mut w = spawn_run(&p, &[], "w");
    let late_events: Vec<_> = (0..24).map(|i| late(i, (i % 6) as i64)).collect();
    produce(
        &topic,
        &late_events.iter().map(|x| x.0.clone()).collect::<Vec<_>>(),
    );
    for (_, d, c, _) in &late_events {
        *truth.entry((d.clone(), c.clone())).or_insert(0) += 1;
    }
    let out = backfill(
        &p,
        "2024-04-25T00:00:00Z",
        ("--to-offsets", arg(&f("stop.json"))),
        &unique("bf"),
        &["--filter", "amount < 0", "-o", arg(&f("report.json"))],
    );
    out.assert_ok();
    let ledger = || db.i64("SELECT count(*) FROM {s}.replaysafe_ledger");
    wait_until(
        Duration::from_secs(120),
        "production lands the late events",
        || ledger() == 600 + 24,
    );
    for snap in ["n.json", "t.json"] {
        let v = verify_diff(&f(snap), &f("report.json"));
        v.assert_ok();
        assert!(
            v.stdout
                .contains("against the ledger claims of its own key; 0 differ"),
            "{}",
            v.stdout
        );
    }
    assert_eq!(crate::core::counts(&db), truth);
    assert!(buggy_run.filtered > 0);

    // The move: one increment and 50.00 from c-2 to c-1 on 2024-04-27; each day's total is unchanged.
    let have = |c: &str| {
        db.i64(&format!(
            "SELECT count(*) FROM {{s}}.daily_counts WHERE day = '2024-04-27' AND customer_id = '{c}' AND n > 1"
        ))
    };
    assert!(have("c-1") == 1 && have("c-2") == 1, "both rows exist");
    let moved = |sign: i64| {
        db.execute(&format!(
            "UPDATE {{s}}.daily_counts SET n = n + {sign} * (CASE customer_id WHEN 'c-1' THEN 1 ELSE -1 END) \
             WHERE day = '2024-04-27' AND customer_id IN ('c-1', 'c-2'); \
             UPDATE {{s}}.daily_totals SET total = total + {sign} * (CASE customer_id WHEN 'c-1' THEN 50.00 ELSE \
             -50.00 END) WHERE day = '2024-04-27' AND customer_id IN ('c-1', 'c-2')"
        ))
    };
    moved(1);
    for (snap, by) in [("n.json", "1"), ("t.json", "50")] {
        let v = verify_diff(&f(snap), &f("report.json"));
        assert_eq!(v.code, Some(1), "{}", both(&v));
        assert_eq!(
            rows_named(&v),
            ["2024-04-27|c-1", "2024-04-27|c-2"],
            "{}",
            v.stdout
        );
        let c1 = v
            .stdout
            .lines()
            .find(|l| l.starts_with("2024-04-27|c-1"))
            .unwrap();
        assert!(
            c1.contains(&format!(" {by} ")) && c1.contains("MISMATCH"),
            "{c1}"
        );
        assert!(
            line(&v, "2024-04-27 ").contains("netting out"),
            "{}",
            v.stdout
        );
        assert_eq!(table(&v.stdout)["2024-04-27"]["unexplained"], "0");
        assert!(
            v.stderr.contains("1 day(s) and 2 row(s)") && v.stderr.contains("2024-04-27|c-2"),
            "{}",
            v.stderr
        );
    }
    moved(-1);
    for snap in ["n.json", "t.json"] {
        verify_diff(&f(snap), &f("report.json")).assert_ok();
    }
    assert_eq!(terminate(&mut w), Some(0));
    assert_eq!(crate::core::counts(&db), truth);

    // A snapshot of format 1 (no per-row claims) is refused.
    let mut old = json(&f("n.json"));
    for k in ["format", "row_claims", "ledger_lacks"] {
        old.as_object_mut().unwrap().remove(k);
    }
    std::fs::write(f("old.json"), old.to_string()).unwrap();
    let v = verify_diff(&f("old.json"), &f("report.json"));
    assert_eq!(v.code, Some(2), "{}", both(&v));
    assert!(v.stderr.contains("format 1"), "{}", v.stderr);
}
