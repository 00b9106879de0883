//! The ledger horizon as a durable fact in the database (`replaysafe_horizon.pruned_below`): every claim path
//! checks it in the batch transaction, a lengthened horizon does not reopen pruned days, and a day pruned by
//! another process is `beyond-horizon` for every other process — never re-created, never the record's fault.
//!
//! The ledger is partitioned by the event day; "today" is the database's UTC date (the machine's, here).

use std::sync::Arc;
use std::time::Duration;

use chrono::{Days, NaiveDate, Utc};
use replaysafe::engine::apply::{apply_batch, Applied};
use replaysafe::model::{Batch, Item, Outcome, Tally as SinkTally};
use replaysafe::sink::{checkpoint, ledger, schema, Sink};

use crate::common::*;
use crate::core::{counts, SEED};

/// One counter per (day, customer); the ledger keeps `{horizon}` days.
const HZ: &str = concat!(
    header!(),
    r#"[batch]
max-records = 50
linger-ms = 20

[fields]
event_id = { path = "/event_id", type = "uuid" }
day = { path = "/occurred_at", type = "date" }
customer_id = { path = "/customer_id", type = "text" }

[identity]
key = ["event_id"]
partition-by = "day"

[ledger]
horizon-days = {horizon}

[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day", "customer_id"]
column = "n"
"#
);

const E1: &str = "6f1c1f4e-6a55-4c0b-9a55-000000000001";
const E2: &str = "6f1c1f4e-6a55-4c0b-9a55-000000000002";
const E3: &str = "6f1c1f4e-6a55-4c0b-9a55-000000000003";

fn days_ago(n: u64) -> NaiveDate {
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(n))
        .unwrap()
}

fn event(id: &str, day: NaiveDate) -> String {
    format!(r#"{{"event_id":"{id}","occurred_at":"{day}T12:00:00Z","customer_id":"c1"}}"#)
}

/// A record produced now (its Kafka time is recent; its event day is `day`).
fn rec(id: &str, day: NaiveDate) -> Rec {
    Rec::json(0, id, &event(id, day), Utc::now().timestamp_millis())
}

/// A record of event day `day` produced with CreateTime `ts` (ms).
fn rec_at(id: &str, day: NaiveDate, ts: i64) -> Rec {
    Rec::json(0, id, &event(id, day), ts)
}

/// `(topic, partition, pruned_through)` of every recorded pruned offset.
fn pruned_offsets(db: &Db) -> Vec<(String, i32, i64)> {
    db.query(
        "SELECT topic, partition, pruned_through FROM {s}.replaysafe_pruned ORDER BY 1, 2",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn text(horizon: u32) -> String {
    HZ.replace("{horizon}", &horizon.to_string())
}

fn counter(db: &Db, day: NaiveDate) -> i64 {
    if db
        .text("SELECT to_regclass('{s}.daily_counts')::text")
        .is_none()
    {
        return 0;
    }
    db.query(
        "SELECT coalesce(sum(n), 0)::bigint FROM {s}.daily_counts WHERE day = $1",
        &[&day],
    )[0]
    .get(0)
}

fn ledger_rows(db: &Db) -> i64 {
    db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_ledger")
}

/// `(consumer_group, offset, reason)` of every dead letter, ordered.
fn dead_letters(db: &Db) -> Vec<(String, i64, String)> {
    db.query(
        "SELECT consumer_group, \"offset\", reason FROM {s}.replaysafe_dead_letters ORDER BY id",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn partition_days(db: &Db) -> Vec<NaiveDate> {
    let mut days: Vec<NaiveDate> = db
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = to_regclass($1)",
            &[&format!("\"{}\".replaysafe_ledger", db.schema)],
        )
        .iter()
        .filter_map(|r| {
            let name: String = r.get(0);
            NaiveDate::parse_from_str(name.strip_prefix("replaysafe_ledger_p")?, "%Y%m%d").ok()
        })
        .collect();
    days.sort();
    days
}

fn pruned_below(db: &Db) -> Option<NaiveDate> {
    db.query("SELECT pruned_below FROM {s}.replaysafe_horizon", &[])
        .first()
        .and_then(|r| r.get(0))
}

fn backfill_last_hour(p: &Pipeline, group: &str) -> Out {
    let from = (Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    backfill(p, &from, ("--to", &to), group, &[])
}

/// Issue 22 item 1: a backfill decides the horizon per record, like `run`. An event ten days old landed under a
/// 30-day horizon; the horizon shortened to 5 days prunes its day and records its offset as pruned. A late copy
/// of it produced afterwards (above the pruned offset) is quarantined as `beyond-horizon` by production and by
/// every backfill group starting above the pruned offset; a backfill reaching the pruned offset is refused
/// (issue 13: exit 2, the partition and range named). The counter stays at 1.
#[test]
fn backfill_quarantines_events_older_than_the_horizon() {
    let (db, topic) = stage("hz_bf", 1);
    let d = days_ago(10);
    let two_hours_ago = (Utc::now() - chrono::Duration::hours(2)).timestamp_millis();
    produce(&topic, &[rec_at(E1, d, two_hours_ago)]);
    let prod = unique("prod");
    let long = pipeline(&text(30), &topic, &prod, &db.schema);
    let t = run_caught_up(&long.path).tally();
    assert_eq!((t.consumed, t.landed), (1, 1));
    assert_eq!(counter(&db, d), 1);

    // The horizon shortened to 5 days: the run prunes the day (durably) and records offset 0 as pruned.
    let short = pipeline(&text(5), &topic, &prod, &db.schema);
    let t = run_caught_up(&short.path).tally();
    assert_eq!(t.consumed, 0);
    assert_eq!(pruned_below(&db), Some(days_ago(5)));
    assert_eq!(pruned_offsets(&db), vec![(topic.clone(), 0, 0)]);
    assert!(
        !partition_days(&db).contains(&d),
        "the day's partition was dropped"
    );
    // A late copy of the event (offset 1): production quarantines it.
    produce(&topic, &[rec(E1, d)]);
    let t = run_caught_up(&short.path).tally();
    assert_eq!((t.consumed, t.quarantined), (1, 1));

    for n in 0..2 {
        let group = unique("bf");
        let out = backfill_last_hour(&short, &group);
        out.assert_ok();
        let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            report["accounting"].as_str().unwrap(),
            "consumed 1 = landed 0 + duplicate 0 + filtered 0 + quarantined 1 [quarantined beyond-horizon: 1]",
            "backfill {n}: {}",
            out.stdout
        );
        let day = &report["per_day"][d.to_string()];
        assert_eq!(day["quarantined"], 1, "{}", out.stdout);
        assert_eq!(day["landed"], 0, "{}", out.stdout);
        assert_eq!(counter(&db, d), 1, "backfill {n} counted nothing again");
        assert_eq!(ledger_rows(&db), 0, "backfill {n} claimed nothing");
        assert!(
            !partition_days(&db).contains(&d),
            "backfill {n} did not re-create the pruned day"
        );
        // One dead letter per record (unique by its coordinates): the production run's.
        assert_eq!(
            dead_letters(&db),
            vec![(prod.clone(), 1, "beyond-horizon".to_string())]
        );
        // The next production run prunes again; nothing reopens.
        let t = run_caught_up(&short.path).tally();
        assert_eq!(t.consumed, 0);
    }
    // A backfill reaching offset 0 (pruned) is refused before anything is read.
    let from = (Utc::now() - chrono::Duration::hours(3)).to_rfc3339();
    let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let out = backfill(&short, &from, ("--to", &to), &unique("bf"), &[]);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains(&format!("{topic}/0: offsets 0..=0 are below")),
        "{}",
        out.stderr
    );
    assert_eq!(counter(&db, d), 1);
    assert_eq!(dead_letters(&db).len(), 1);
}

/// Issue 22 item 2: lengthening `horizon-days` does not reopen pruned days. Horizon 30 (counter 1), then 5
/// (the day is pruned, its offset recorded), then 30 again: under a fresh group reading from the earliest
/// offset the run is refused (exit 2: offset 0 is below the pruned offset) and says that the ledger was pruned
/// below the day the file asks for; a late copy of the event under the production group is `beyond-horizon`.
/// The counter stays 1.
#[test]
fn lengthening_the_horizon_does_not_reopen_pruned_days() {
    let (db, topic) = stage("hz_len", 1);
    let d = days_ago(10);
    produce(&topic, &[rec(E1, d), rec(E2, days_ago(1))]);
    let g30 = unique("g30");
    let t = run_text(&text(30), &topic, &g30, &db).tally();
    assert_eq!((t.consumed, t.landed), (2, 2));
    assert_eq!(counter(&db, d), 1);

    let t = run_text(&text(5), &topic, &g30, &db).tally();
    assert_eq!(t.consumed, 0);
    assert_eq!(pruned_below(&db), Some(days_ago(5)));
    assert_eq!(partition_days(&db), vec![days_ago(1)]);
    assert_eq!(pruned_offsets(&db), vec![(topic.clone(), 0, 0)]);

    let fresh = pipeline(&text(30), &topic, &unique("g30b"), &db.schema);
    let out = try_run(&fresh.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains(&format!("{topic}/0: offsets 0..=0 are below")),
        "{}",
        out.stderr
    );
    assert!(
        out.stdout.contains("pruned below") || out.stderr.contains("pruned below"),
        "the run warns that the longer horizon holds only from the pruned-below day:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    // A late copy of the event (offset 2) under the production group and horizon 30 again.
    produce(&topic, &[rec(E1, d)]);
    let t = run_text(&text(30), &topic, &g30, &db).tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (1, 0, 1));
    assert_eq!(counter(&db, d), 1, "the pruned day is not counted again");
    assert_eq!(counter(&db, days_ago(1)), 1);
    assert_eq!(pruned_below(&db), Some(days_ago(5)), "never moves back");
    assert_eq!(partition_days(&db), vec![days_ago(1)], "nothing re-created");
    assert_eq!(ledger_rows(&db), 1);
    assert_eq!(
        dead_letters(&db),
        vec![(g30, 2, "beyond-horizon".to_string())]
    );
}

/// Two processes sharing a ledger, driven batch by batch: their `Sink`s (connections) and a prune of the
/// other process in between.
struct Proc {
    sink: Sink,
    topic: String,
    partition: i32,
    fence: i64,
    next: Option<i64>,
    tally: SinkTally,
}

struct Harness {
    db: Db,
    text: String,
}

impl Harness {
    fn new(prefix: &str) -> Harness {
        let db = Db::fresh(prefix);
        let text = text(30)
            .replace("{topic}", "hz_topic")
            .replace("{group}", "hz_group")
            .replace("{schema}", &db.schema);
        let h = Harness { db, text };
        let p = h.pipeline(30);
        h.db.rt.block_on(async {
            let mut c = replaysafe::sink::connect(&database_url()).await.unwrap();
            schema::init(&mut c, &p).await.unwrap();
        });
        h
    }

    fn pipeline(&self, horizon: u32) -> Arc<replaysafe::config::Pipeline> {
        let t = self
            .text
            .replace("horizon-days = 30", &format!("horizon-days = {horizon}"));
        Arc::new(replaysafe::config::parse("hz.toml", &t).unwrap())
    }

    /// A process (one connection) owning `partition` of the pipeline's topic.
    fn open(&self, partition: i32) -> Proc {
        let p = self.pipeline(30);
        self.db.rt.block_on(async {
            let mut sink = Sink::open(p.clone(), &database_url()).await.unwrap();
            let row = sink
                .client()
                .query_one(
                    &checkpoint::acquire_checkpoint(&p),
                    &[&"hz_group", &"hz_topic", &partition, &""],
                )
                .await
                .unwrap();
            Proc {
                sink,
                topic: "hz_topic".into(),
                partition,
                fence: row.get(1),
                next: row.get(0),
                tally: SinkTally::default(),
            }
        })
    }

    /// Another process with `horizon` days starts: its prune.
    fn prune(&self, horizon: u32) -> Vec<NaiveDate> {
        let p = self.pipeline(horizon);
        self.db.rt.block_on(async {
            let mut c = replaysafe::sink::connect(&database_url()).await.unwrap();
            ledger::drop_expired_partitions(&mut c, &p).await.unwrap()
        })
    }

    /// Applies `events` (id, day) as the next batch of `proc`, through the same retry/isolation path as `run`.
    fn batch(&self, proc: &mut Proc, events: &[(&str, NaiveDate)]) -> Vec<Outcome> {
        let p = self.pipeline(30);
        let start = proc.next.unwrap_or(0);
        let items: Vec<Item> = events
            .iter()
            .enumerate()
            .map(|(i, (id, day))| {
                let value = event(id, *day);
                Item {
                    offset: start + i as i64,
                    timestamp_ms: Some(Utc::now().timestamp_millis()),
                    key: Some(id.as_bytes().to_vec()),
                    value: Some(value.as_bytes().to_vec()),
                    pending: replaysafe::engine::decide(
                        &p,
                        Some(id.as_bytes()),
                        Some(value.as_bytes()),
                        None,
                    ),
                }
            })
            .collect();
        let batch = Batch {
            topic: proc.topic.clone(),
            partition: proc.partition,
            fence: proc.fence,
            expected: proc.next,
            end: start + items.len() as i64,
            items,
        };
        let never = || false;
        let applied = self
            .db
            .rt
            .block_on(apply_batch(&mut proc.sink, &batch, &never))
            .unwrap();
        let Applied::Committed(outcomes) = applied else {
            panic!("fenced")
        };
        proc.next = Some(batch.end);
        for o in &outcomes {
            proc.tally.add(o);
        }
        outcomes
    }
}

const BEYOND: Outcome = Outcome::Quarantined(replaysafe::decode::Reason::BeyondHorizon);

/// Issue 22 item 3 and issue 19 item 3: process A's first connection cached the day's partition (it landed e1
/// there), its second connection had never seen the day; process B (horizon 5) prunes the day between their
/// batches. On the second connection the replay of e1 is `beyond-horizon` and the day is not re-created (no
/// second count); on the first, a replay of e1 and a new event of that day are `beyond-horizon` (not
/// `rejected-by-database`). Records of days inside the horizon in the same batches land or are duplicates.
#[test]
fn a_day_pruned_by_another_process_is_beyond_horizon_everywhere() {
    let h = Harness::new("hz_two");
    let d = days_ago(10);
    let today = days_ago(0);
    let mut a1 = h.open(0);
    let mut a2 = h.open(1);
    assert_eq!(h.batch(&mut a1, &[(E1, d)]), vec![Outcome::Landed]);
    assert_eq!(counter(&h.db, d), 1);
    assert!(partition_days(&h.db).contains(&d));

    assert_eq!(h.prune(5), vec![d], "process B drops the day");
    assert_eq!(pruned_below(&h.db), Some(days_ago(5)));

    // The connection that never saw the day: the replay neither re-creates the day nor lands again.
    assert_eq!(
        h.batch(&mut a2, &[(E1, d), (E3, today)]),
        vec![BEYOND, Outcome::Landed]
    );
    // The connection that cached the partition: the horizon decides, not a missing partition.
    assert_eq!(
        h.batch(&mut a1, &[(E1, d), (E2, d), (E3, today)]),
        vec![BEYOND, BEYOND, Outcome::Duplicate]
    );
    assert_eq!(counter(&h.db, d), 1, "the pruned day is counted once");
    assert_eq!(counter(&h.db, today), 1);
    assert_eq!(
        partition_days(&h.db),
        vec![today],
        "the pruned day is not re-created"
    );
    assert_eq!(ledger_rows(&h.db), 1);
    assert_eq!(
        dead_letters(&h.db),
        vec![
            ("hz_group".to_string(), 0, "beyond-horizon".to_string()),
            ("hz_group".to_string(), 1, "beyond-horizon".to_string()),
            ("hz_group".to_string(), 2, "beyond-horizon".to_string()),
        ]
    );
    let detail =
        h.db.text("SELECT detail FROM {s}.replaysafe_dead_letters ORDER BY id LIMIT 1");
    assert!(
        detail
            .as_deref()
            .unwrap_or("")
            .contains(&format!("from {}", days_ago(5))),
        "{detail:?}"
    );
    assert_eq!(
        a1.tally.line(),
        "consumed 4 = landed 1 + duplicate 1 + filtered 0 + quarantined 2 [quarantined beyond-horizon: 2]"
    );
    assert_eq!(
        a2.tally.line(),
        "consumed 2 = landed 1 + duplicate 0 + filtered 0 + quarantined 1 [quarantined beyond-horizon: 1]"
    );
}

/// A ledger partition that vanished under a connection that cached it, for a day still inside the horizon, is
/// an infrastructure condition: the batch re-reads the partitions and the horizon, re-creates the day and lands
/// the new event — it is not dead-lettered as `rejected-by-database`.
#[test]
fn a_vanished_partition_inside_the_horizon_is_recreated_not_dead_lettered() {
    let h = Harness::new("hz_gone");
    let d = days_ago(2);
    let mut a = h.open(0);
    assert_eq!(h.batch(&mut a, &[(E1, d)]), vec![Outcome::Landed]);
    h.db.execute(&format!(
        "DROP TABLE {{s}}.replaysafe_ledger_p{}",
        d.format("%Y%m%d")
    ));
    assert_eq!(h.batch(&mut a, &[(E2, d)]), vec![Outcome::Landed]);
    assert_eq!(counter(&h.db, d), 2);
    assert_eq!(partition_days(&h.db), vec![d]);
    assert_eq!(ledger_rows(&h.db), 1);
    assert!(dead_letters(&h.db).is_empty(), "{:?}", dead_letters(&h.db));
    assert_eq!(
        a.tally.line(),
        "consumed 2 = landed 2 + duplicate 0 + filtered 0 + quarantined 0"
    );
}

/// Issue 19 item 3 (the hourly check): a running `run` prunes periodically (`--prune-interval`), to the durable
/// pruned-below day — here moved forward in the horizon table as another process's prune would (the day
/// "aged" past the horizon without waiting). After its own periodic prune dropped the day, a replay of the
/// event it landed is `beyond-horizon`; the counter stays 1.
#[test]
fn a_running_process_prunes_periodically() {
    let (db, topic) = stage("hz_tick", 1);
    let d = days_ago(10);
    produce(&topic, &[rec(E1, d)]);
    let p = pipeline(&text(30), &topic, &unique("prod"), &db.schema);
    let extra = ["--prune-interval", "1", "--summary-interval", "1"];
    let mut child = spawn_run(&p, &extra, "run");
    wait_until(Duration::from_secs(60), "the event landed", || {
        counter(&db, d) == 1
    });
    assert!(partition_days(&db).contains(&d));
    // The day ages past the horizon: the durable pruned-below day moves to 5 days ago.
    db.execute(&format!(
        "UPDATE {{s}}.replaysafe_horizon SET pruned_below = '{}'",
        days_ago(5)
    ));
    wait_until(
        Duration::from_secs(60),
        "the running process dropped the day",
        || !partition_days(&db).contains(&d),
    );
    produce(&topic, &[rec(E1, d)]);
    wait_until(
        Duration::from_secs(60),
        "the replay was quarantined",
        || !dead_letters(&db).is_empty(),
    );
    assert_eq!(terminate(&mut child), Some(0));
    let out = std::fs::read_to_string(p.dir.path().join("run.out")).unwrap();
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("consumed "))
        .unwrap_or_else(|| panic!("no tally line:\n{out}"));
    assert_eq!(
        line,
        "consumed 2 = landed 1 + duplicate 0 + filtered 0 + quarantined 1 [quarantined beyond-horizon: 1]"
    );
    assert_eq!(counter(&db, d), 1);
    assert_eq!(ledger_rows(&db), 0);
    assert_eq!(pruned_below(&db), Some(days_ago(5)));
    assert_eq!(dead_letters(&db)[0].2, "beyond-horizon");
    // The periodic prune recorded the offset whose ledger row it dropped (issue 13).
    assert_eq!(pruned_offsets(&db), vec![(topic.clone(), 0, 0)]);
}

/// A claim and a prune serialize on the horizon row: a batch that starts while another process's prune holds
/// it (horizon row raised, partition dropped, not yet committed) waits, then decides with the new pruned-below
/// day — `beyond-horizon`, never an insert into the dropped partition.
#[test]
fn a_batch_waits_for_a_prune_in_progress_and_sees_its_horizon() {
    let h = Harness::new("hz_lock");
    let d = days_ago(10);
    let mut a = h.open(0);
    assert_eq!(h.batch(&mut a, &[(E1, d)]), vec![Outcome::Landed]);
    // The prune of another process, in progress.
    h.db.execute(&format!(
        "BEGIN; UPDATE {{s}}.replaysafe_horizon SET pruned_below = '{}'; DROP TABLE {{s}}.replaysafe_ledger_p{}",
        days_ago(5),
        d.format("%Y%m%d")
    ));
    let outcomes = std::thread::scope(|scope| {
        let batch = scope.spawn(|| h.batch(&mut a, &[(E2, d), (E3, days_ago(0))]));
        let schema = h.db.schema.clone();
        wait_until(
            Duration::from_secs(60),
            "the batch waits for the prune",
            || {
                let other = waiting_for_locks(&schema);
                other > 0
            },
        );
        h.db.execute("COMMIT");
        batch.join().unwrap()
    });
    assert_eq!(outcomes, vec![BEYOND, Outcome::Landed]);
    assert_eq!(counter(&h.db, d), 1);
    assert_eq!(partition_days(&h.db), vec![days_ago(0)]);
    assert_eq!(
        dead_letters(&h.db),
        vec![("hz_group".to_string(), 1, "beyond-horizon".to_string())]
    );
    assert_eq!(
        a.tally.line(),
        "consumed 3 = landed 2 + duplicate 0 + filtered 0 + quarantined 1 [quarantined beyond-horizon: 1]"
    );
}

/// Backends of this test's schema waiting for a lock (own connection: the test's is inside a transaction).
fn waiting_for_locks(schema: &str) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = replaysafe::sink::connect(&database_url()).await.unwrap();
        c.query_one(
            "SELECT count(*)::bigint FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND position($1 in query) > 0",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0)
    })
}

/// A rebuild of a window that starts below the durable horizon is refused before anything is deleted (its
/// records could only be quarantined after the window was zeroed); from the pruned-below day on it rebuilds
/// (the ten-day-old event was produced ten days ago: the window's offsets start above the pruned one).
#[test]
fn rebuild_below_the_pruned_day_is_refused() {
    let (db, topic) = stage("hz_rb", 1);
    let d = days_ago(10);
    let then = (Utc::now() - chrono::Duration::days(10)).timestamp_millis();
    produce(&topic, &[rec_at(E1, d, then), rec(E2, days_ago(1))]);
    let g = unique("g30");
    run_text(&text(30), &topic, &g, &db);
    let short = pipeline(&text(5), &topic, &g, &db.schema);
    run_caught_up(&short.path);
    assert_eq!(pruned_offsets(&db), vec![(topic.clone(), 0, 0)]);
    let rebuild = |from: NaiveDate| {
        rebuild(
            &short,
            &from.to_string(),
            &days_ago(0).to_string(),
            &unique("rb"),
            &["--i-paused-other-writers"],
        )
    };
    let refused = rebuild(d);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains(&format!("from {}", days_ago(5))),
        "{}",
        refused.stderr
    );
    assert_eq!(counter(&db, d), 1, "nothing deleted");
    assert_eq!(counter(&db, days_ago(1)), 1);
    assert_eq!(ledger_rows(&db), 1);
    let ok = rebuild(days_ago(5));
    ok.assert_ok();
    let report: serde_json::Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(
        report["accounting"].as_str().unwrap(),
        "consumed 1 = landed 1 + duplicate 0 + filtered 0 + quarantined 0",
        "{}",
        ok.stdout
    );
    assert_eq!(counter(&db, d), 1, "outside the window");
    assert_eq!(counter(&db, days_ago(1)), 1, "rebuilt");
    assert_eq!(ledger_rows(&db), 1);
    assert_eq!(partition_days(&db), vec![days_ago(1)]);
}

/// Issue 13, revised by issue 41 (item 3): a rebuild of days inside the horizon whose window (chosen by record
/// time) reaches an offset a prune recorded — the ten-day-old event was produced now, before the day-one event —
/// is not refused: the old event is outside its days (filtered, never applied) and the day-one event's ledger
/// row was never pruned. The rebuilt day is exact; the old day is not touched.
#[test]
fn rebuild_inside_the_horizon_passes_a_late_events_pruned_offset() {
    let (db, topic) = stage("hz_rbo", 1);
    let d = days_ago(10);
    produce(&topic, &[rec(E1, d), rec(E2, days_ago(1))]);
    let g = unique("g30");
    run_text(&text(30), &topic, &g, &db);
    let short = pipeline(&text(5), &topic, &g, &db.schema);
    run_caught_up(&short.path);
    assert_eq!(pruned_offsets(&db), vec![(topic.clone(), 0, 0)]);
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
        accounting.starts_with("consumed 2 = landed 1 + duplicate 0 + filtered 1 + quarantined 0"),
        "{accounting}"
    );
    assert_eq!(counter(&db, d), 1, "outside the window");
    assert_eq!(counter(&db, days_ago(1)), 1, "rebuilt once");
    assert_eq!(ledger_rows(&db), 1);
}

/// `load` makes the same per-record decision: a kcat file with a ten-day-old event lands under a 30-day horizon;
/// a 5-day horizon's load prunes the day and records offset 0 as pruned, so a load of that line is refused
/// (exit 2, nothing applied); a late copy at offset 1 is quarantined under 5 days and under 30 again.
#[test]
fn load_decides_the_durable_horizon_per_record() {
    let db = Db::fresh("hz_load");
    let topic = unique("hz_load");
    let d = days_ago(10);
    let ts = Utc::now().timestamp_millis();
    let line = |offset: i64| {
        serde_json::json!({
            "topic": topic, "partition": 0, "offset": offset, "tstype": "create", "ts": ts,
            "key": E1, "payload": event(E1, d),
        })
        .to_string()
    };
    let load = |horizon: u32, offset: i64| {
        let p = pipeline(&text(horizon), &topic, &unique("load"), &db.schema);
        let file = p.dir.path().join("records.jsonl");
        std::fs::write(&file, format!("{}\n", line(offset))).unwrap();
        replaysafe(&[
            "load",
            "--config",
            p.path.to_str().unwrap(),
            file.to_str().unwrap(),
        ])
    };
    let t = load(30, 0).assert_ok().tally();
    assert_eq!((t.consumed, t.landed), (1, 1));
    let refused = load(5, 0);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("/0: offsets 0..=0 are below"),
        "{}",
        refused.stderr
    );
    assert_eq!(pruned_offsets(&db), vec![(topic.clone(), 0, 0)]);
    let t = load(5, 1).assert_ok().tally();
    assert_eq!((t.consumed, t.quarantined), (1, 1));
    let out = load(30, 1);
    let t = out.assert_ok().tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (1, 0, 1),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("pruned below"), "{}", out.stderr);
    assert_eq!(counter(&db, d), 1);
    assert_eq!(ledger_rows(&db), 0);
    assert_eq!(pruned_below(&db), Some(days_ago(5)));
    assert_eq!(dead_letters(&db).len(), 1);
    assert_eq!(dead_letters(&db)[0].2, "beyond-horizon");
}

const P: &str = concat!(
    header!(),
    r#"[fields]
event_id = { path = "/event_id", type = "uuid" }
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

fn day(ago: u64) -> NaiveDate {
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(ago))
        .unwrap()
}

pub fn ev(n: u32, partition: i32, ago: u64) -> Rec {
    let v = format!(
        r#"{{"event_id":"5b0e4c1a-1d2e-4f60-8a7b-{n:012}","occurred_at":"{}"}}"#,
        day(ago)
    );
    Rec::json(
        partition,
        &format!("k{n}"),
        &v,
        Utc::now().timestamp_millis(),
    )
}

/// Events of 10 and 1 days ago on two partitions; a prune to a 5-day horizon drops the old day. A fresh group
/// is refused (exit 2) and its message names what to set: the group's `next_offset` in
/// `replaysafe_checkpoints` (its refused run wrote those rows at offset 0, and they win over Kafka's offsets).
/// Set as the message says, the rerun reads only the kept records: every one a duplicate, no count changes.
#[test]
fn refused_fresh_group_follows_the_message_above_the_pruned_offsets() {
    let (db, topic) = stage("n13_prune", 2);
    let recs: Vec<Rec> = (0..8)
        .map(|n| ev(n, (n % 2) as i32, if n < 4 { 10 } else { 1 }))
        .collect();
    produce(&topic, &recs);
    let text = |h: u32| P.replace("{horizon}", &h.to_string());
    let prod = pipeline(&text(30), &topic, &unique("prod"), &db.schema);
    assert_eq!(run_caught_up(&prod.path).tally().landed, 8);
    let short = pipeline(&text(5), &topic, &unique("prod2"), &db.schema);
    replaysafe(&["ledger", "prune", "--config", arg(&short.path)]).assert_ok();
    let counts0 = db.strings("SELECT day::text || '=' || n FROM {s}.daily_counts ORDER BY day");
    assert_eq!(
        counts0,
        vec![format!("{}=4", day(10)), format!("{}=4", day(1))]
    );
    // Each partition held the old day's records at offsets 0 and 1.
    let pruned = db
        .strings("SELECT partition || ':' || pruned_through FROM {s}.replaysafe_pruned ORDER BY 1");
    assert_eq!(pruned, vec!["0:1", "1:1"]);

    let fresh_group = unique("fresh");
    let fresh = pipeline(&text(5), &topic, &fresh_group, &db.schema);
    let out = try_run(&fresh.path);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("set its next_offset in replaysafe_checkpoints to at least that"),
        "the refusal says how a run gets above the pruned offsets: {}",
        out.stderr
    );
    // As the message says: the group's checkpoint rows (written by the refused run) set above the pruned offsets.
    db.execute(&format!(
        "UPDATE {{s}}.replaysafe_checkpoints c SET next_offset = p.pruned_through + 1 \
         FROM {{s}}.replaysafe_pruned p WHERE c.consumer_group = '{fresh_group}' \
         AND c.topic = p.topic AND c.partition = p.partition"
    ));
    let t = run_caught_up(&fresh.path).tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (4, 0, 4));
    let counts1 = db.strings("SELECT day::text || '=' || n FROM {s}.daily_counts ORDER BY day");
    assert_eq!(counts1, counts0, "nothing counted again");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// Issue 35.3: event days far in the future are bounded by `[ledger] future-days` (default 7): a record of a
/// later day is quarantined as `future-day` naming the day and the bound, and creates no ledger partition (1,500
/// such records created 1,500 partitions); under `--no-ddl` it no longer stops the run for good.
#[test]
fn event_days_beyond_future_days_are_quarantined_without_a_partition() {
    let (db, topic) = stage("future", 2);
    let today = chrono::Utc::now().date_naive();
    let event = |n: u32, day: chrono::NaiveDate| {
        Rec::json(
            (n % 2) as i32,
            "c",
            &format!(
                r#"{{"event_id":"{}","customer_id":"c","amount":"1","occurred_at":"{day}T10:00:00Z"}}"#,
                uuid::Uuid::from_u128(u128::from(n) + 0xf0f0_0000)
            ),
            chrono::Utc::now().timestamp_millis(),
        )
    };
    let in3 = today + chrono::Days::new(3);
    let far: Vec<Rec> = (0..40)
        .map(|n| event(n, today + chrono::Days::new(400 + u64::from(n))))
        .collect();
    let mut recs = vec![event(100, today), event(101, in3)];
    recs.extend(far);
    recs.push(event(
        102,
        chrono::NaiveDate::from_ymd_opt(2099, 1, 1).unwrap(),
    ));
    produce(&topic, &recs);
    let p = pipeline(SEED, &topic, &unique("g"), &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.landed, t.quarantined), (2, 41), "{t:?}");
    let partitions = db.i64(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = '{s}.replaysafe_ledger'::regclass",
    );
    assert_eq!(partitions, 2, "today and today + 3 only");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'future-day'"),
        41
    );
    let detail = db
        .text("SELECT detail FROM {s}.replaysafe_dead_letters WHERE detail LIKE '%2099-01-01%'")
        .unwrap();
    assert!(
        detail.contains("event day 2099-01-01") && detail.contains("future-days = 7"),
        "{detail}"
    );
    assert_eq!(counts(&db).values().sum::<i64>(), 2);

    // Without DDL (init made the partitions): a day of 2099 is quarantined, not a stop.
    let (db2, topic2) = stage("future_noddl", 2);
    produce(
        &topic2,
        &[
            event(200, today),
            event(201, chrono::NaiveDate::from_ymd_opt(2099, 6, 1).unwrap()),
            event(202, today),
        ],
    );
    let p2 = pipeline(SEED, &topic2, &unique("g"), &db2.schema);
    replaysafe(&["init", "--config", arg(&p2.path), "--days", "1"]).assert_ok();
    let out = replaysafe(&[
        "run",
        "--config",
        arg(&p2.path),
        "--until-caught-up",
        "--no-ddl",
    ]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!((t.landed, t.quarantined), (2, 1), "{t:?}");
    assert_eq!(
        db2.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'future-day'"),
        1
    );
}

/// `[ledger] future-days` is checked with `file:line`: out of range, or without `partition-by`.
#[test]
fn future_days_is_checked_in_the_file() {
    let db = Db::fresh("future_cfg");
    let topic = unique("t");
    for (text, want) in [
        (
            SEED.replacen(
                "[[projection]]",
                "[ledger]\nfuture-days = 400\n\n[[projection]]",
                1,
            ),
            "`future-days` must be between 0 and 366",
        ),
        (
            SEED.replace("partition-by = \"day\"\n", "").replacen(
                "[[projection]]",
                "[ledger]\nfuture-days = 3\n\n[[projection]]",
                1,
            ),
            "`future-days` needs `identity.partition-by`",
        ),
    ] {
        let p = pipeline(&text, &topic, "g", &db.schema);
        let out = replaysafe(&["check", "--config", arg(&p.path)]);
        assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
        assert!(out.stderr.contains(want), "{}", out.stderr);
        assert!(out.stderr.contains("pipeline.toml:"), "{}", out.stderr);
    }
}
