//! Issue 41: operations an operator could not get out of. A backfill group or `projection build` resumed with a
//! later `--from` moves its checkpoint forward (no false "checkpoint moved back"); after a prune, a build goes
//! past a late record of a pruned day that production quarantined above the pruned offsets; a rebuild of days
//! inside the horizon is not locked out by late events' pruned offsets; a rebuild killed before a prune passed
//! its first day is finished by the rebuild its refusal names; a rebuild's lock timeout names the table and
//! step; `outbox relay` with the broker unreachable honours `--connect-timeout` and names the address. Each test
//! asserts the final tables and that the command the refusal recommends succeeds.

use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, Utc};

use crate::common::*;

/// A counter per day; the ledger keeps `{horizon}` days; `{batch}` records per batch.
const P: &str = concat!(
    header!(),
    r#"lock-timeout-ms = 500
[batch]
max-records = {batch}
linger-ms = 10

[fields]
event_id = { path = "/event_id", type = "uuid" }
entity = { path = "/entity", type = "text" }
day = { path = "/occurred_at", type = "date" }

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

/// The projection added to a running pipeline (built by `projection build`).
const ADDED: &str = r#"
[[projection]]
kind = "counter"
table = "by_entity"
group-by = ["entity"]
"#;

fn text(horizon: u32, batch: u32) -> String {
    P.replace("{horizon}", &horizon.to_string())
        .replace("{batch}", &batch.to_string())
}

fn days_ago(n: u64) -> NaiveDate {
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(n))
        .unwrap()
}

/// Event `n` of event day `day` on `partition`, with record timestamp `ts` (ms).
fn ev(n: u32, partition: i32, day: NaiveDate, ts: i64) -> Rec {
    let id = format!("41dead00-6a55-4c0b-9a55-{n:012}");
    let value = format!(r#"{{"event_id":"{id}","entity":"e{n}","occurred_at":"{day}T12:00:00Z"}}"#);
    Rec::json(partition, &format!("e{n}"), &value, ts)
}

fn rfc3339(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339()
}

fn counts(db: &Db) -> Vec<String> {
    db.strings("SELECT day::text || '=' || n FROM {s}.daily_counts ORDER BY day")
}

fn checkpoints(db: &Db, group: &str) -> Vec<String> {
    db.strings(&format!(
        "SELECT partition || ':' || next_offset FROM {{s}}.replaysafe_checkpoints \
         WHERE consumer_group = '{group}' ORDER BY partition"
    ))
}

/// Item 1: a backfill stopped after its first batch, rerun under its group with a later `--from` (the window's
/// first records were applied by other means), reads from the later start: its checkpoint rows move forward
/// there, the first compare-and-set holds (it used to fail for ever: "the checkpoint moved back … database
/// failover?"), and the records of the later window land once.
#[test]
fn a_backfill_resumed_with_a_later_from_moves_its_checkpoint_forward() {
    let (db, topic) = stage("d41_from", 2);
    let base = Utc::now().timestamp_millis() - 600_000;
    let recs: Vec<Rec> = (0..12u32)
        .map(|n| ev(n, (n % 2) as i32, days_ago(0), base + i64::from(n) * 1000))
        .collect();
    produce(&topic, &recs);
    let group = unique("bf");
    let p = pipeline(&text(30, 2), &topic, "prod", &db.schema);
    let to = rfc3339(base + 60_000);
    let args = |from: &str| {
        vec![
            "backfill".to_string(),
            "--config".into(),
            arg(&p.path).into(),
            "--from".into(),
            from.into(),
            "--to".into(),
            to.clone(),
            "--group-id".into(),
            group.clone(),
        ]
    };
    let first = args(&rfc3339(base));
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    let crashed = replaysafe_with(
        &first,
        &[("REPLAYSAFE_FAILPOINTS", "before-db-commit=1*off->return")],
        Duration::from_secs(60),
    );
    assert_ne!(crashed.code, Some(0), "{}", crashed.stderr);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        2,
        "one batch landed"
    );
    // Records 8..=11 are at offset 4 and 5 of each partition.
    let later = args(&rfc3339(base + 8000));
    let later: Vec<&str> = later.iter().map(String::as_str).collect();
    let out = replaysafe(&later);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(!out.stderr.contains("moved back"), "{}", out.stderr);
    assert_eq!(counts(&db), vec![format!("{}=6", days_ago(0))]);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 6);
    assert_eq!(checkpoints(&db, &group), vec!["0:6", "1:6"]);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
    // The same command again is a no-op.
    let again = replaysafe(&later);
    again.assert_ok();
    assert_eq!(counts(&db), vec![format!("{}=6", days_ago(0))]);
}

/// Items 1 and 2: after a prune, a projection added to the pipeline is built. Without `--from` the build stops
/// at the pruned day's records below the pruned offsets (whether production landed them cannot be known) and
/// names `--from`; rerun with `--from` (a later start than the stopped build's checkpoints: item 1), it passes
/// the late records of the pruned day that production quarantined as `beyond-horizon` above the pruned offsets
/// (they provably never landed: item 2), completes and records the projection active — `dead-letters replay`,
/// refused while it was building, then runs.
#[test]
fn a_build_after_a_prune_passes_late_records_that_never_landed() {
    let (db, topic) = stage("d41_build", 2);
    let base = Utc::now().timestamp_millis() - 600_000;
    let group = unique("prod");
    // Each partition: an event of 10 days ago (offset 0), one of yesterday (offset 1).
    let mut recs = Vec::new();
    for q in 0..2 {
        recs.push(ev(q as u32, q, days_ago(10), base));
        recs.push(ev(10 + q as u32, q, days_ago(1), base + 1000));
    }
    produce(&topic, &recs);
    let long = pipeline(&text(30, 50), &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&long.path).tally().landed, 4);
    let short = pipeline(&text(5, 50), &topic, &group, &db.schema);
    replaysafe(&["ledger", "prune", "--config", arg(&short.path)]).assert_ok();
    // Production goes on: a late event of the pruned day (offset 2: quarantined), one of today (offset 3).
    let mut late = Vec::new();
    for q in 0..2 {
        late.push(ev(20 + q as u32, q, days_ago(10), base + 2000));
        late.push(ev(30 + q as u32, q, days_ago(0), base + 3000));
    }
    produce(&topic, &late);
    let t = run_caught_up(&short.path).tally();
    assert_eq!((t.landed, t.quarantined), (2, 2), "{t:?}");
    let added = pipeline(
        &format!("{}{ADDED}", text(5, 50)),
        &topic,
        &group,
        &db.schema,
    );
    replaysafe(&["init", "--config", arg(&added.path)]).assert_ok();
    let build = |extra: &[&str]| {
        let head = [
            "projection",
            "build",
            "--config",
            arg(&added.path),
            "--projection",
            "by_entity",
        ];
        replaysafe(&[&head[..], extra].concat())
    };
    let stopped = build(&[]);
    assert_eq!(stopped.code, Some(1), "{}", stopped.stderr);
    assert!(
        stopped.stderr.contains("--from TIME") && stopped.stderr.contains("at offset 0"),
        "{}",
        stopped.stderr
    );
    let from = rfc3339(base + 1000);
    // Interrupted (SIGTERM while a batch waits to commit): it names the command that resumes it.
    let args = [
        "projection",
        "build",
        "--config",
        arg(&added.path),
        "--projection",
        "by_entity",
        "--from",
        &from,
    ];
    let slow = [("REPLAYSAFE_FAILPOINTS", "before-db-commit=sleep(3000)")];
    let mut child = spawn(&args, &slow, added.dir.path(), "build");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(terminate(&mut child), Some(1));
    let log = std::fs::read_to_string(added.dir.path().join("build.err")).unwrap();
    assert!(
        log.contains("rerun `replaysafe projection build by_entity`"),
        "{log}"
    );
    let built = build(&["--from", &from]);
    assert_eq!(built.code, Some(0), "{}\n{}", built.stdout, built.stderr);
    assert!(!built.stderr.contains("moved back"), "{}", built.stderr);
    let by_entity = db.strings("SELECT entity || '=' || n FROM {s}.by_entity ORDER BY entity");
    assert_eq!(by_entity, vec!["e10=1", "e11=1", "e30=1", "e31=1"]);
    assert_eq!(
        counts(&db),
        vec![
            format!("{}=2", days_ago(10)),
            format!("{}=2", days_ago(1)),
            format!("{}=2", days_ago(0)),
        ]
    );
    assert_eq!(
        db.i64(
            "SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'beyond-horizon' \
             AND resolved_at IS NULL"
        ),
        2
    );
    // Active: the dead-letter replay a building projection refuses runs (its records stay beyond-horizon).
    let replayed = replaysafe(&["dead-letters", "replay", "--config", arg(&added.path)]);
    assert_eq!(
        replayed.code,
        Some(0),
        "{}\n{}",
        replayed.stdout,
        replayed.stderr
    );
    assert_eq!(by_entity.len(), 4);
    assert_eq!(
        db.strings("SELECT entity || '=' || n FROM {s}.by_entity ORDER BY entity"),
        by_entity
    );
}

/// Item 3: late events of a pruned day raise the pruned offsets above records of days inside the horizon. A
/// backfill reaching them is refused (its late records may have lost their ledger rows) and advises a rebuild of
/// the days from the pruned-below day on; that rebuild is accepted (it used to be refused with the same text) and
/// ends with every count exact, while production went on writing.
#[test]
fn a_prune_with_late_events_does_not_lock_out_a_rebuild_inside_the_horizon() {
    let (db, topic) = stage("d41_late", 2);
    let base = Utc::now().timestamp_millis() - 600_000;
    let group = unique("prod");
    let mut recs = Vec::new();
    for n in 0..12u32 {
        // Every third event is of 10 days ago (late), the others of yesterday and today.
        let day = match n % 3 {
            0 => days_ago(10),
            1 => days_ago(1),
            _ => days_ago(0),
        };
        recs.push(ev(n, (n % 2) as i32, day, base + i64::from(n) * 1000));
    }
    produce(&topic, &recs);
    let long = pipeline(&text(30, 50), &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&long.path).tally().landed, 12);
    let short = pipeline(&text(5, 50), &topic, &group, &db.schema);
    replaysafe(&["ledger", "prune", "--config", arg(&short.path)]).assert_ok();
    assert_eq!(
        db.strings(
            "SELECT partition || ':' || pruned_through FROM {s}.replaysafe_pruned ORDER BY 1"
        ),
        vec!["0:3", "1:4"],
        "late events: the pruned offsets are above records of yesterday and today"
    );
    // Production writes on.
    produce(
        &topic,
        &[
            ev(50, 0, days_ago(0), base + 50_000),
            ev(51, 1, days_ago(1), base + 51_000),
        ],
    );
    run_caught_up(&short.path).assert_ok();
    let want = counts(&db);
    assert_eq!(
        want,
        vec![
            format!("{}=4", days_ago(10)),
            format!("{}=5", days_ago(1)),
            format!("{}=5", days_ago(0)),
        ]
    );
    let refused = backfill(
        &short,
        &rfc3339(base + 1000),
        ("--to", &rfc3339(base + 60_000)),
        &unique("bf"),
        &[],
    );
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    let advice = format!("rebuild the days from {} on", days_ago(5));
    assert!(refused.stderr.contains(&advice), "{}", refused.stderr);
    // The advice, followed.
    let ok = rebuild(
        &short,
        &days_ago(5).to_string(),
        &days_ago(0).to_string(),
        &unique("rb"),
        &["--i-paused-other-writers"],
    );
    assert_eq!(ok.code, Some(0), "{}\n{}", ok.stdout, ok.stderr);
    let report: serde_json::Value = serde_json::from_str(&ok.stdout).unwrap();
    let accounting = report["accounting"].as_str().unwrap();
    assert!(
        accounting
            .starts_with("consumed 14 = landed 10 + duplicate 0 + filtered 4 + quarantined 0"),
        "{accounting}"
    );
    assert_eq!(counts(&db), want, "every day exact");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"),
        10,
        "the rebuilt days' ledger rows"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// Item 4: a rebuild stopped mid-replay (its process gone, as after `kill -9`) whose first day a prune then
/// passed. The rerun of the old window is refused by the horizon, which names a start; the rebuild from that
/// start used to be refused because the stopped rebuild's kept rows reach the pruned day — the two refusals
/// pointed at each other. It now completes: the kept rows of the pruned day are abandoned (warned), every day
/// of the window is exact, nothing is kept.
#[test]
fn a_killed_rebuild_whose_days_a_prune_passed_can_be_finished() {
    let (db, topic) = stage("d41_kill", 2);
    let base = Utc::now().timestamp_millis() - 600_000;
    let group = unique("prod");
    let mut recs = Vec::new();
    for n in 0..12u32 {
        let day = match n % 3 {
            0 => days_ago(6),
            1 => days_ago(3),
            _ => days_ago(0),
        };
        recs.push(ev(n, (n % 2) as i32, day, base + i64::from(n) * 1000));
    }
    produce(&topic, &recs);
    let long = pipeline(&text(30, 1), &topic, &group, &db.schema);
    assert_eq!(run_caught_up(&long.path).tally().landed, 12);
    let window = |p: &Pipeline, from: NaiveDate, envs: &[(&str, &str)]| {
        let args = [
            "rebuild",
            "--config",
            arg(&p.path),
            "--from",
            &from.to_string(),
            "--to",
            &days_ago(0).to_string(),
            "--group-id",
            &unique("rb"),
            "--i-paused-other-writers",
        ]
        .map(str::to_string);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        replaysafe_with(&args, envs, Duration::from_secs(60))
    };
    let stopped = window(
        &long,
        days_ago(6),
        &[("REPLAYSAFE_FAILPOINTS", "before-db-commit=1*off->return")],
    );
    assert_ne!(stopped.code, Some(0), "{}", stopped.stderr);
    assert!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger") < 12,
        "the stopped rebuild re-landed only part of the window"
    );
    let short = pipeline(&text(5, 1), &topic, &group, &db.schema);
    replaysafe(&["ledger", "prune", "--config", arg(&short.path)]).assert_ok();
    let refused = window(&short, days_ago(6), &[]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    let named = format!("rebuild from {} on", days_ago(5));
    assert!(refused.stderr.contains(&named), "{}", refused.stderr);
    let ok = window(&short, days_ago(5), &[]);
    assert_eq!(ok.code, Some(0), "{}\n{}", ok.stdout, ok.stderr);
    assert!(ok.stderr.contains("abandoned"), "{}", ok.stderr);
    let inside = db.strings(&format!(
        "SELECT day::text || '=' || n FROM {{s}}.daily_counts WHERE day >= '{}' ORDER BY day",
        days_ago(5)
    ));
    assert_eq!(
        inside,
        vec![format!("{}=4", days_ago(3)), format!("{}=4", days_ago(0))]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 8);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_ledger_rebuilding"),
        0,
        "nothing kept"
    );
}

/// Item 7: a rebuild whose delete meets a row lock held by another session fails naming the table and the step
/// (not a bare "canceling statement due to lock timeout"), having deleted nothing; the same command succeeds
/// once that session ended. `outbox relay` with the broker unreachable gives up after `--connect-timeout`,
/// naming the address.
#[test]
fn a_rebuild_lock_timeout_and_an_unreachable_relay_broker_are_named() {
    let (db, topic) = stage("d41_lock", 2);
    let base = Utc::now().timestamp_millis() - 600_000;
    let recs: Vec<Rec> = (0..6u32)
        .map(|n| ev(n, (n % 2) as i32, days_ago(1), base + i64::from(n) * 1000))
        .collect();
    produce(&topic, &recs);
    let p = pipeline(&text(30, 50), &topic, &unique("prod"), &db.schema);
    run_caught_up(&p.path).assert_ok();
    let rt = runtime();
    let mut holder = pg_client(&rt);
    let tx = rt.block_on(holder.transaction()).unwrap();
    rt.block_on(tx.batch_execute(&format!(
        "SELECT * FROM {}.daily_counts FOR UPDATE",
        db.schema
    )))
    .unwrap();
    let group = unique("rb");
    let (from, to) = (days_ago(2).to_string(), days_ago(0).to_string());
    let refused = rebuild(&p, &from, &to, &group, &["--i-paused-other-writers"]);
    assert_eq!(refused.code, Some(1), "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("zeroing the window's aggregate rows")
            && refused.stderr.contains("daily_counts")
            && refused.stderr.contains("lock-timeout-ms"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        counts(&db),
        vec![format!("{}=6", days_ago(1))],
        "nothing deleted"
    );
    rt.block_on(tx.rollback()).unwrap();
    let ok = rebuild(&p, &from, &to, &group, &["--i-paused-other-writers"]);
    assert_eq!(ok.code, Some(0), "{}\n{}", ok.stdout, ok.stderr);
    assert_eq!(counts(&db), vec![format!("{}=6", days_ago(1))]);

    // The relay, the broker away (nothing listens on port 1).
    let outbox = format!(
        "{}\n[[projection]]\nkind = \"outbox\"\ntable = \"outbox\"\nkey = [\"entity\"]\npayload = [\"event_id\"]\n\
         [outbox]\ntopic = \"{}\"\n",
        text(30, 50),
        unique("out")
    );
    let r = pipeline(&outbox, &topic, &unique("prod"), &db.schema);
    let relay = replaysafe(&[
        "outbox",
        "relay",
        "--config",
        arg(&r.path),
        "--brokers",
        "127.0.0.1:1",
        "--connect-timeout",
        "2",
        "--until-empty",
    ]);
    assert_eq!(relay.code, Some(1), "{}", relay.stderr);
    assert!(relay.stderr.contains("127.0.0.1:1"), "{}", relay.stderr);
}

/// Item 7: a relay whose every send the broker refuses (the topic's `max.message.bytes` below the rows — what a
/// broker outage does to every send) logs a bounded number of warnings (one summary at most every 30 s, where it
/// logged one per row per round: 1,601 in 80 s) and `/readyz` says it is not ready, naming the cause; once the
/// topic accepts them, the rows are published, each once, and `/readyz` is ready again.
#[test]
fn a_relay_that_cannot_publish_is_not_ready_and_warns_a_bounded_number_of_times() {
    use crate::relay::{events, events_pipeline, read_topic};
    let (db, topic) = stage("d41_relay", 2);
    let out = unique("d41small");
    create_topic(&out, 2, &[("max.message.bytes", "16")]);
    produce(&topic, &events(3, 2, 2, 0x4141));
    let p = events_pipeline(&topic, &unique("g"), &db, &out, 5000);
    run_caught_up(&p.path);
    let addr = crate::health::free_addr();
    let args = [
        "outbox",
        "relay",
        "--config",
        arg(&p.path),
        "--metrics-addr",
        &addr,
    ];
    let mut relay = spawn(&args, &[], p.dir.path(), "relay");
    let why = crate::health::wait_for(&addr, "/readyz", "the relay not ready", |c, b| {
        c == 503 && b.contains("outbox relay published nothing")
    });
    assert!(why.contains(&out), "{why}");
    // Several rounds fail meanwhile (each within the ack timeout).
    std::thread::sleep(Duration::from_secs(3));
    let rt = runtime();
    let cfg = rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(&out))
        .set("max.message.bytes", "1048576");
    rt.block_on(admin().alter_configs(&[cfg], &rdkafka::admin::AdminOptions::new()))
        .unwrap();
    wait_until(Duration::from_secs(60), "every row published", || {
        db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NULL") == 0
    });
    crate::health::wait_for(&addr, "/readyz", "the relay ready again", |c, _| c == 200);
    assert_eq!(terminate(&mut relay), Some(0));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.outbox"), 6);
    assert_eq!(read_topic(&out).len(), 6, "each row once");
    let log = std::fs::read_to_string(p.dir.path().join("relay.err")).unwrap();
    let warned = log.matches("not acknowledged in").count();
    assert!(
        (1..=2).contains(&warned),
        "one summary (two if 30 s passed), not one per row and round: {warned}\n{log}"
    );
    assert!(!log.contains("outbox publish failed"), "{log}");
}
