//! Issue 13 part 2, the ledger's lifecycle: `ledger stats` against the catalog, `ledger prune` (dry run, whole
//! expired day partitions only, tombstones and conflicts, the pruned offsets recorded), the refusal of replays
//! reaching a pruned offset, and a prune while `run` runs.

use std::time::Duration;

use chrono::{Days, NaiveDate, Utc};
use serde_json::Value;

use crate::common::*;

/// A row projection (deletes by `status = 'closed'`) and a counter per day; the ledger keeps `{horizon}` days.
const LC: &str = concat!(
    header!(),
    r#"[batch]
max-records = 50
linger-ms = 20

[fields]
event_id = { path = "/event_id", type = "uuid" }
entity = { path = "/entity", type = "text" }
status = { path = "/status", type = "text" }
v = { path = "/v", type = "bigint" }
day = { path = "/occurred_at", type = "date" }

[identity]
key = ["event_id"]
partition-by = "day"

[ledger]
horizon-days = {horizon}

[[projection]]
kind = "row"
table = "accounts"
key = ["entity"]
version = "v"
columns = ["entity", "status", "v"]
delete-if = "status == 'closed'"

[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day"]
column = "n"
"#
);

fn text(horizon: u32) -> String {
    LC.replace("{horizon}", &horizon.to_string())
}

fn days_ago(n: u64) -> NaiveDate {
    Utc::now()
        .date_naive()
        .checked_sub_days(Days::new(n))
        .unwrap()
}

fn ev(n: u32, partition: i32, entity: &str, status: &str, v: i64, day: NaiveDate) -> Rec {
    let id = format!("7a1c1f4e-6a55-4c0b-9a55-{n:012}");
    let value = format!(
        r#"{{"event_id":"{id}","entity":"{entity}","status":"{status}","v":{v},"occurred_at":"{day}T12:00:00Z"}}"#
    );
    Rec::json(partition, entity, &value, Utc::now().timestamp_millis())
}

/// Four event days (10, 6, 3 and 1 days ago), four events each over two partitions; entity `e-del` is deleted
/// (a tombstone), entity `e-c` gets two states at one version (a conflict) — both on the day 10 days ago.
fn history() -> Vec<Rec> {
    let mut recs = Vec::new();
    let mut n = 0;
    for (i, ago) in [10u64, 6, 3, 1].iter().enumerate() {
        for j in 0..4i64 {
            n += 1;
            let e = format!("e-{i}-{j}");
            recs.push(ev(n, (j % 2) as i32, &e, "open", 1, days_ago(*ago)));
        }
    }
    let d = days_ago(10);
    recs.push(ev(101, 0, "e-del", "open", 1, d));
    recs.push(ev(102, 0, "e-del", "closed", 2, d));
    recs.push(ev(103, 1, "e-c", "open", 5, d));
    recs.push(ev(104, 1, "e-c", "frozen", 5, d));
    recs
}

fn partition_days(db: &Db) -> Vec<NaiveDate> {
    let mut days: Vec<NaiveDate> = db
        .strings(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = to_regclass('{s}.replaysafe_ledger')",
        )
        .iter()
        .filter_map(|n| {
            NaiveDate::parse_from_str(n.strip_prefix("replaysafe_ledger_p")?, "%Y%m%d").ok()
        })
        .collect();
    days.sort();
    days
}

/// Every counter row, every row of `accounts`, and the ledger rows — the state a prune must not change (but
/// for the ledger rows of dropped days).
fn counts(db: &Db) -> Vec<String> {
    db.strings("SELECT day::text || '=' || n FROM {s}.daily_counts ORDER BY day")
}

fn accounts(db: &Db) -> Vec<String> {
    db.strings("SELECT entity || ':' || status || ':' || v FROM {s}.accounts ORDER BY entity")
}

fn ledger_rows(db: &Db, since: NaiveDate) -> Vec<String> {
    db.query(
        "SELECT event_id::text || '@' || topic || '/' || partition || ':' || \"offset\" FROM {s}.replaysafe_ledger l \
         JOIN {s}.replaysafe_sources s ON s.id = l._source_id WHERE day >= $1 ORDER BY 1",
        &[&since],
    )
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// `(topic, partition, max offset)` of the ledger rows of days before `below`.
fn expected_pruned(db: &Db, below: NaiveDate) -> Vec<(String, i32, i64)> {
    db.query(
        "SELECT topic, partition, max(\"offset\") FROM {s}.replaysafe_ledger l JOIN {s}.replaysafe_sources s ON s.id = l._source_id WHERE day < $1 GROUP BY 1, 2 ORDER BY 1, 2",
        &[&below],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn pruned(db: &Db) -> Vec<(String, i32, i64)> {
    db.query(
        "SELECT topic, partition, pruned_through FROM {s}.replaysafe_pruned ORDER BY 1, 2",
        &[],
    )
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn pruned_below(db: &Db) -> Option<NaiveDate> {
    db.query("SELECT pruned_below FROM {s}.replaysafe_horizon", &[])
        .first()
        .and_then(|r| r.get(0))
}

fn ledger_cmd(sub: &str, p: &Pipeline, extra: &[&str]) -> Out {
    let head = ["ledger", sub, "--config", arg(&p.path)];
    replaysafe(&[&head[..], extra].concat())
}

fn json(out: &Out) -> Value {
    out.assert_ok();
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// `ledger stats` reports per day partition exactly what the catalog says (rows by count, bytes by
/// `pg_table_size` + `pg_indexes_size` = `pg_total_relation_size`), the oldest/newest day, the horizon, the
/// tombstone and the conflict, and the projected size over the horizon at the current daily rate.
#[test]
fn ledger_stats_match_the_catalog() {
    let (db, topic) = stage("lc_stats", 2);
    produce(&topic, &history());
    let p = pipeline(&text(30), &topic, &unique("prod"), &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!(t.consumed, 20);
    let s = json(&ledger_cmd("stats", &p, &["--json"]));
    let catalog = db.query(
        "SELECT c.relname::text, pg_table_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid) \
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = to_regclass('{s}.replaysafe_ledger') ORDER BY 1",
        &[],
    );
    let parts = s["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 4, "{s:#}");
    assert_eq!(catalog.len(), 4);
    let mut total = 0i64;
    for (part, row) in parts.iter().zip(&catalog) {
        let name: String = row.get(0);
        assert!(part["table"]
            .as_str()
            .unwrap()
            .ends_with(&format!("\"{name}\"")));
        let total_bytes: i64 = row.get(3);
        assert_eq!(part["heap_bytes"].as_i64().unwrap(), row.get::<_, i64>(1));
        assert_eq!(part["index_bytes"].as_i64().unwrap(), row.get::<_, i64>(2));
        assert_eq!(part["total_bytes"].as_i64().unwrap(), total_bytes);
        assert_eq!(
            row.get::<_, i64>(1) + row.get::<_, i64>(2),
            total_bytes,
            "heap + indexes = total"
        );
        let day: NaiveDate = part["day"].as_str().unwrap().parse().unwrap();
        let rows = db.query(
            "SELECT count(*)::bigint FROM {s}.replaysafe_ledger WHERE day = $1",
            &[&day],
        )[0]
        .get::<_, i64>(0);
        assert_eq!(part["rows"].as_i64().unwrap(), rows, "{day}");
        total += total_bytes;
    }
    let rows = db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_ledger");
    assert_eq!(rows, 20, "every record claimed (the conflict too)");
    assert_eq!(s["rows"].as_i64().unwrap(), rows);
    assert_eq!(s["bytes"].as_i64().unwrap(), total);
    let bpe = s["bytes_per_event"].as_f64().unwrap();
    assert!((bpe - total as f64 / rows as f64).abs() < 1e-6);
    assert_eq!(s["oldest_day"], days_ago(10).to_string());
    assert_eq!(s["newest_day"], days_ago(1).to_string());
    assert_eq!(s["horizon_days"], 30);
    assert_eq!(s["pruned_below"], days_ago(30).to_string());
    assert_eq!(s["tombstones"], 1);
    assert_eq!(s["conflicts"], 1);
    // The daily rate: the rows of the last 7 event days over the days from the oldest of them through today
    // (history: days 10..1 ago, so days 6..1 ago over 7 days).
    let recent = db.i64(&format!(
        "SELECT count(*)::bigint FROM {{s}}.replaysafe_ledger WHERE day > '{}'::date AND day < '{}'::date",
        days_ago(7),
        days_ago(0)
    ));
    assert!(recent > 0 && recent < rows, "{recent}");
    assert_eq!(s["rows_per_day"].as_f64().unwrap(), recent as f64 / 7.0);
    let projected = s["projected_bytes"].as_f64().unwrap();
    assert!(
        (projected - bpe * recent as f64 / 7.0 * 30.0).abs() < 1e-3,
        "{s:#}"
    );
    let text = ledger_cmd("stats", &p, &[]);
    text.assert_ok();
    assert!(
        text.stdout
            .contains(&format!("total: {rows} rows, {total} bytes")),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("tombstones: 1; conflicts: 1"),
        "{}",
        text.stdout
    );
}

/// `ledger prune --dry-run` changes nothing; `ledger prune` (horizon 5 days) drops only the two day partitions
/// wholly older than the horizon, records per partition the highest offset of their rows, purges the aged
/// tombstone and conflict, and leaves the counters, the row projection and the remaining ledger rows as they
/// were. A second prune finds nothing. Then a replay reaching a pruned offset — a fresh group from the earliest
/// offsets, a backfill — is refused with exit 2 naming the partition and the range, and counts nothing again;
/// production (above the pruned offsets) goes on.
#[test]
fn prune_drops_only_whole_expired_partitions_and_replays_below_it_are_refused() {
    let (db, topic) = stage("lc_prune", 2);
    produce(&topic, &history());
    let prod = unique("prod");
    let long = pipeline(&text(30), &topic, &prod, &db.schema);
    assert_eq!(run_caught_up(&long.path).tally().consumed, 20);
    // The tombstone and the conflict age past the horizon (as ten days would).
    db.execute("UPDATE {s}.accounts_tombstones SET _deleted_at = now() - interval '10 days'");
    db.execute("UPDATE {s}.replaysafe_conflicts SET detected_at = now() - interval '10 days'");
    let (counts0, accounts0) = (counts(&db), accounts(&db));
    let kept0 = ledger_rows(&db, days_ago(5));
    let expected = expected_pruned(&db, days_ago(5));
    assert_eq!(
        expected.len(),
        2,
        "both partitions had rows of the expired days"
    );
    let all_days = vec![days_ago(10), days_ago(6), days_ago(3), days_ago(1)];
    assert_eq!(partition_days(&db), all_days);

    let short = pipeline(&text(5), &topic, &prod, &db.schema);
    let report = |r: &Value| {
        let dropped: Vec<String> = r["dropped"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["day"].as_str().unwrap().to_string())
            .collect();
        let offsets: Vec<(String, i32, i64)> = r["pruned_offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let t = o["topic"].as_str().unwrap().to_string();
                (
                    t,
                    o["partition"].as_i64().unwrap() as i32,
                    o["through"].as_i64().unwrap(),
                )
            })
            .collect();
        (
            dropped,
            offsets,
            r["tombstones"][0]["purged"].clone(),
            r["conflicts"].clone(),
        )
    };
    let want = (
        vec![days_ago(10).to_string(), days_ago(6).to_string()],
        expected.clone(),
        Value::from(1),
        Value::from(1),
    );
    let dry = json(&ledger_cmd("prune", &short, &["--dry-run", "--json"]));
    assert_eq!(dry["dry_run"], true);
    assert_eq!(report(&dry), want, "{dry:#}");
    // The dry run changed nothing.
    assert_eq!(partition_days(&db), all_days);
    assert_eq!(pruned(&db), vec![]);
    assert_eq!(pruned_below(&db), Some(days_ago(30)));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.accounts_tombstones"), 1);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 1);
    assert_eq!(ledger_rows(&db, days_ago(100)).len(), 20);

    let done = json(&ledger_cmd("prune", &short, &["--json"]));
    assert_eq!(report(&done), want, "{done:#}");
    assert_eq!(partition_days(&db), vec![days_ago(3), days_ago(1)]);
    assert_eq!(pruned(&db), expected);
    assert_eq!(pruned_below(&db), Some(days_ago(5)));
    assert_eq!(db.i64("SELECT count(*) FROM {s}.accounts_tombstones"), 0);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_conflicts"), 0);
    assert_eq!(
        ledger_rows(&db, days_ago(100)),
        kept0,
        "the remaining ledger rows are intact"
    );
    assert_eq!(counts(&db), counts0, "the counters are intact");
    assert_eq!(accounts(&db), accounts0, "the row projection is intact");
    let again = json(&ledger_cmd("prune", &short, &["--json"]));
    assert_eq!(again["dropped"], Value::Array(vec![]));
    assert_eq!(pruned(&db), expected);
    let stats = ledger_cmd("stats", &short, &[]);
    assert!(
        stats.stdout.contains(&format!(
            "pruned: {topic}/0 offsets up to {}",
            expected[0].2
        )),
        "{}",
        stats.stdout
    );

    // A fresh group from the earliest offsets reaches them: refused, nothing counted again.
    let fresh = pipeline(&text(5), &topic, &unique("fresh"), &db.schema);
    let out = try_run(&fresh.path);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        expected.iter().any(|(t, n, x)| out
            .stderr
            .contains(&format!("{t}/{n}: offsets 0..={x} are below"))),
        "{}",
        out.stderr
    );
    let from = (Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let bf = backfill(&short, &from, ("--to-group", &prod), &unique("bf"), &[]);
    assert_eq!(bf.code, Some(2), "{}\n{}", bf.stdout, bf.stderr);
    for (t, n, x) in &expected {
        assert!(
            bf.stderr
                .contains(&format!("{t}/{n}: offsets 0..={x} are below")),
            "{}",
            bf.stderr
        );
    }
    assert_eq!(counts(&db), counts0);
    assert_eq!(accounts(&db), accounts0);
    assert_eq!(ledger_rows(&db, days_ago(100)), kept0);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );

    // Production, above the pruned offsets, goes on.
    produce(&topic, &[ev(201, 0, "e-new", "open", 1, days_ago(0))]);
    let t = run_caught_up(&short.path).tally();
    assert_eq!((t.consumed, t.landed), (1, 1));
    assert_eq!(
        db.i64(&format!(
            "SELECT n FROM {{s}}.daily_counts WHERE day = '{}'",
            days_ago(0)
        )),
        1
    );
}

/// `ledger prune` while `run` runs and applies: the prune's lock waits are bounded and the running batches wait
/// for it (the horizon row), so both finish; the run lands every record of days inside the horizon exactly
/// once, and what the prune dropped stays counted.
#[test]
fn prune_while_run_runs() {
    let (db, topic) = stage("lc_live", 2);
    produce(&topic, &history());
    let prod = unique("prod");
    let long = pipeline(&text(30), &topic, &prod, &db.schema);
    let mut child = spawn_run(&long, &["--summary-interval", "1"], "run");
    wait_until(Duration::from_secs(60), "the history landed", || {
        db.text("SELECT to_regclass('{s}.replaysafe_checkpoints')::text")
            .is_some()
            && db
                .i64("SELECT coalesce(sum(next_offset), 0)::bigint FROM {s}.replaysafe_checkpoints")
                == 20
    });
    let counts0 = counts(&db);
    // New records of today while the prune runs.
    let live: Vec<Rec> = (0..40)
        .map(|i| {
            ev(
                300 + i,
                (i % 2) as i32,
                &format!("live-{i}"),
                "open",
                1,
                days_ago(0),
            )
        })
        .collect();
    let producer = std::thread::spawn({
        let topic = topic.clone();
        move || {
            for chunk in live.chunks(5) {
                produce(&topic, chunk);
            }
        }
    });
    let short = pipeline(&text(5), &topic, &prod, &db.schema);
    let out = ledger_cmd("prune", &short, &[]);
    out.assert_ok();
    assert!(
        out.stdout.contains("2 partitions dropped"),
        "{}",
        out.stdout
    );
    producer.join().unwrap();
    wait_until(Duration::from_secs(60), "the live records landed", || {
        db.i64("SELECT coalesce(sum(next_offset), 0)::bigint FROM {s}.replaysafe_checkpoints") == 60
    });
    assert_eq!(terminate(&mut child), Some(0));
    let log = std::fs::read_to_string(long.dir.path().join("run.out")).unwrap();
    let line = log
        .lines()
        .rev()
        .find(|l| l.starts_with("consumed "))
        .unwrap();
    assert_eq!(
        line,
        "consumed 60 = landed 59 + duplicate 0 + stale 1 + filtered 0 + quarantined 0 [stale: 1 conflict(s)]",
        "{log}"
    );
    let mut want = counts0.clone();
    want.push(format!("{}=40", days_ago(0)));
    assert_eq!(counts(&db), want);
    assert_eq!(
        partition_days(&db),
        vec![days_ago(3), days_ago(1), days_ago(0)]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_pruned"), 2);
}

/// The prune's lock waits are bounded: a transaction reading the ledger holds the partitions it would drop;
/// `ledger prune --lock-timeout 1` gives up after a second, exits 1 naming the wait, and drops nothing and records
/// no pruned offset (only the horizon day, committed first, is raised); once the reader is gone it prunes.
#[test]
fn prune_lock_waits_are_bounded() {
    let (db, topic) = stage("lc_lock", 2);
    produce(&topic, &history());
    let prod = unique("prod");
    let long = pipeline(&text(30), &topic, &prod, &db.schema);
    assert_eq!(run_caught_up(&long.path).tally().consumed, 20);
    let all_days = partition_days(&db);
    db.execute("BEGIN; SELECT count(*) FROM {s}.replaysafe_ledger");
    let short = pipeline(&text(5), &topic, &prod, &db.schema);
    let out = ledger_cmd("prune", &short, &["--lock-timeout", "1"]);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("was not granted within 1s"),
        "{}",
        out.stderr
    );
    db.execute("COMMIT");
    assert_eq!(partition_days(&db), all_days, "nothing dropped");
    assert_eq!(pruned(&db), vec![], "no pruned offset recorded");
    assert_eq!(ledger_rows(&db, days_ago(100)).len(), 20);
    // The first transaction (the day raised) committed: claims of older days are quarantined meanwhile.
    assert_eq!(pruned_below(&db), Some(days_ago(5)));
    ledger_cmd("prune", &short, &["--lock-timeout", "1"]).assert_ok();
    assert_eq!(partition_days(&db), vec![days_ago(3), days_ago(1)]);
    assert_eq!(pruned(&db).len(), 2);
}

/// At the start of `run` and `backfill`, Kafka keeping records longer than the ledger remembers them is warned
/// about with the safe replay window; a topic whose retention is inside the horizon gets no warning.
#[test]
fn retention_longer_than_the_horizon_is_warned_about() {
    let db = Db::fresh("lc_ret");
    let forever = new_topic("lc_ret", 1); // retention.ms = -1
    let day = unique("lc_ret_day");
    create_topic(&day, 1, &[("retention.ms", "86400000")]);
    for (n, topic, warned) in [(1, &forever, true), (2, &day, false)] {
        produce(topic, &[ev(n, 0, &format!("e{n}"), "open", 1, days_ago(0))]);
        let p = pipeline(&text(5), topic, &unique("prod"), &db.schema);
        let out = run_caught_up(&p.path);
        let said = out
            .stderr
            .contains(&format!("topic {topic}: Kafka keeps records"))
            && out
                .stderr
                .contains("Safe replay window: records of the last 5 days");
        assert_eq!(said, warned, "{topic}: {}", out.stderr);
        let from = (Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
        let to = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
        let bf = backfill(&p, &from, ("--to", &to), &unique("bf"), &[]);
        bf.assert_ok();
        assert_eq!(
            bf.stderr
                .contains(&format!("topic {topic}: Kafka keeps records")),
            warned,
            "{}",
            bf.stderr
        );
    }
    assert_eq!(
        db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_ledger"),
        2
    );
}

/// Backends of this test's schema: `(holding a share lock on the horizon row's table, waiting for a lock)`.
fn horizon_locks(db: &Db) -> (i64, i64) {
    let holding = db.i64(
        "SELECT count(*)::bigint FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
         WHERE c.relname = 'replaysafe_horizon' AND c.relnamespace = to_regnamespace('{s}') \
         AND l.mode = 'RowShareLock' AND l.granted",
    );
    let waiting = db.query(
        "SELECT count(*)::bigint FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND position($1 in query) > 0",
        &[&db.schema],
    )[0]
    .get(0);
    (holding, waiting)
}

/// A prune and a batch in flight serialize on the horizon row: with `run`'s batch held inside its transaction
/// (failpoint `hold-before-db-commit`: held before its COMMIT, the horizon row share-locked, until the test has
/// seen the prune queue behind it — no timer to race on a loaded machine), `ledger prune` waits for it, then
/// prunes; the batch commits its record once, and the state is exact.
#[test]
fn prune_waits_for_the_batch_in_flight() {
    let (db, topic) = stage("lc_wait", 2);
    produce(&topic, &history());
    let prod = unique("prod");
    let long = pipeline(&text(30), &topic, &prod, &db.schema);
    assert_eq!(run_caught_up(&long.path).tally().consumed, 20);
    let counts0 = counts(&db);
    produce(&topic, &[ev(400, 1, "late", "open", 1, days_ago(0))]);
    let head = ["run", "--config", arg(&long.path)];
    let release = long.dir.path().join("release");
    let hold = format!("hold-before-db-commit=1*return({})", release.display());
    let envs = [("REPLAYSAFE_FAILPOINTS", hold.as_str())];
    let mut child = spawn(&head, &envs, long.dir.path(), "run");
    wait_until(
        Duration::from_secs(60),
        "the batch holds the horizon row",
        || horizon_locks(&db).0 > 0,
    );
    let short = pipeline(&text(5), &topic, &prod, &db.schema);
    let out = std::thread::scope(|scope| {
        let prune = scope.spawn(|| ledger_cmd("prune", &short, &[]));
        wait_until(
            Duration::from_secs(60),
            "the prune waits for the batch",
            || horizon_locks(&db).1 > 0,
        );
        std::fs::write(&release, "").unwrap();
        prune.join().unwrap()
    });
    out.assert_ok();
    assert!(
        out.stdout.contains("2 partitions dropped"),
        "{}",
        out.stdout
    );
    wait_until(Duration::from_secs(60), "the late record landed", || {
        db.i64("SELECT coalesce(sum(next_offset), 0)::bigint FROM {s}.replaysafe_checkpoints") == 21
    });
    assert_eq!(terminate(&mut child), Some(0));
    let log = std::fs::read_to_string(long.dir.path().join("run.out")).unwrap();
    let line = log
        .lines()
        .rev()
        .find(|l| l.starts_with("consumed "))
        .unwrap();
    assert!(
        line.starts_with("consumed 1 = landed 1 + duplicate 0"),
        "{log}"
    );
    let mut want = counts0;
    want.push(format!("{}=1", days_ago(0)));
    assert_eq!(counts(&db), want);
    assert_eq!(
        partition_days(&db),
        vec![days_ago(3), days_ago(1), days_ago(0)]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_pruned"), 2);
}

/// A ledger of the first layout (per row `topic`, `partition`, `consumer_group` text and `landed_at`, as
/// replaysafe ≤ issue 14 created it) is migrated in place by the next start: every delivery key stays, so a
/// replay by a fresh group is all duplicates (the counter unchanged), the provenance of each row is what the old
/// row said, a new event lands (in a new, compact day partition), and `ledger stats` / `ledger prune` read it.
#[test]
fn old_ledger_layout_is_migrated_and_keeps_its_keys() {
    let (db, topic) = stage("lc_migrate", 2);
    produce(&topic, &history());
    let p = pipeline(&text(30), &topic, &unique("prod"), &db.schema);
    assert_eq!(run_caught_up(&p.path).tally().consumed, 20);
    let origin = |db: &Db| {
        db.strings(
            "SELECT event_id || ' ' || day || ' ' || topic || ' ' || partition || ' ' || \"offset\" || ' ' || \
             consumer_group FROM {s}.replaysafe_ledger l JOIN {s}.replaysafe_sources s ON s.id = l._source_id \
             ORDER BY 1",
        )
    };
    let before = origin(&db);
    assert_eq!(before.len(), 20);
    // The same claims in the first layout, exactly as its DDL made them.
    let days = partition_days(&db);
    db.execute(
        "CREATE TABLE {s}.keep AS SELECT l.generation, l.event_id, l.day, s.topic, s.partition, l.\"offset\", \
         s.consumer_group FROM {s}.replaysafe_ledger l JOIN {s}.replaysafe_sources s ON s.id = l._source_id; \
         DROP TABLE {s}.replaysafe_ledger, {s}.replaysafe_sources; \
         CREATE TABLE {s}.replaysafe_ledger (generation text NOT NULL DEFAULT '', event_id uuid NOT NULL, \
         day date NOT NULL, topic text NOT NULL, partition integer NOT NULL, \"offset\" bigint NOT NULL, \
         consumer_group text NOT NULL, landed_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (generation, event_id, day)) PARTITION BY RANGE (day)",
    );
    for d in &days {
        db.execute(&format!(
            "CREATE TABLE {{s}}.replaysafe_ledger_p{} PARTITION OF {{s}}.replaysafe_ledger \
             FOR VALUES FROM ('{d}') TO ('{}')",
            d.format("%Y%m%d"),
            d.checked_add_days(Days::new(1)).unwrap()
        ));
    }
    db.execute(
        "INSERT INTO {s}.replaysafe_ledger (generation, event_id, day, topic, partition, \"offset\", \
         consumer_group) SELECT * FROM {s}.keep; DROP TABLE {s}.keep; \
         UPDATE {s}.replaysafe_ledger SET landed_at = now() - interval '10 days'; \
         CREATE TABLE {s}.replaysafe_ledger_rebuilding (LIKE {s}.replaysafe_ledger)",
    );
    let counts = || db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.daily_counts");
    let counted = counts();
    assert!(counted >= 19, "{counted}");
    // A fresh group replays the topic from the beginning, plus one new event of today.
    produce(&topic, &[ev(200, 1, "e-new", "open", 1, days_ago(0))]);
    let replay = pipeline(&text(30), &topic, &unique("replay"), &db.schema);
    let t = run_caught_up(&replay.path).tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (21, 1, 20), "{t:?}");
    assert_eq!(
        counts(),
        counted + 1,
        "the old keys were remembered: nothing counted twice"
    );
    let after = origin(&db);
    assert_eq!(after.len(), 21);
    assert!(before.iter().all(|r| after.contains(r)), "provenance kept");
    // The migrated sources keep their first claim's time (`ledger stats` divides by the days since).
    assert_eq!(
        db.strings(
            "SELECT (created_at < now() - interval '9 days')::text FROM {s}.replaysafe_sources \
             WHERE consumer_group LIKE 'prod%' GROUP BY 1"
        ),
        vec!["true".to_string()]
    );
    assert_eq!(
        db.i64(
            "SELECT count(*)::bigint FROM pg_attribute WHERE attrelid = '{s}.replaysafe_ledger'::regclass \
             AND attname IN ('topic', 'consumer_group', 'landed_at') AND NOT attisdropped"
        ),
        0
    );
    // An interrupted rebuild's pending rows (same columns as the ledger) are migrated alike.
    assert_eq!(
        db.strings(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = '{s}.replaysafe_ledger_rebuilding'::regclass \
             AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ),
        ["generation", "event_id", "day", "offset", "_source_id"]
    );
    let s = json(&ledger_cmd("stats", &replay, &["--json"]));
    assert_eq!(s["rows"].as_i64().unwrap(), 21, "{s:#}");
    let pruned = ledger_cmd("prune", &replay, &["--dry-run"]);
    pruned.assert_ok();
}
