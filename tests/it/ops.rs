//! Operator friction (issue 16): connection errors that name the address, its origin and the cause within
//! `--connect-timeout`; `/metrics` of an idle instance listing every README series; backfill loose ends.

use std::time::Duration;

use crate::core::SEED;
use crate::common::*;

const PASSWORD: &str = "hunter2-not-shown";

fn schema_tables(db: &Db) -> i64 {
    db.query(
        "SELECT count(*)::bigint FROM information_schema.tables WHERE table_schema = $1",
        &[&db.schema],
    )[0]
    .get(0)
}

/// `replaysafe <args> --connect-timeout 2` with `envs`; the harness kills it after 60 s (a hang fails the test).
fn bounded(args: &[&str], envs: &[(&str, &str)]) -> Out {
    let args = [args, &["--connect-timeout", "2"]].concat();
    replaysafe_with(&args, envs, Duration::from_secs(60))
}

fn assert_names(out: &Out, what: &[&str]) {
    assert_eq!(out.code, Some(1), "exit 1 (runtime failure)\n{}", out.stderr);
    for w in what {
        assert!(out.stderr.contains(w), "stderr names `{w}`:\n{}", out.stderr);
    }
    assert!(
        !out.stderr.contains(PASSWORD) && !out.stdout.contains(PASSWORD),
        "the password never reaches the output:\n{}",
        out.stderr
    );
}

/// A database port nobody listens on: `run`, `backfill` and `offsets snapshot` exit 1 within the bound, naming
/// `host:port`, where the URL came from (environment or the file's key) and "connection refused", never the
/// password; nothing is created.
#[test]
fn wrong_database_port_is_named_with_its_origin_and_cause() {
    let (db, topic) = stage("conn_db", 1);
    let p = pipeline(SEED, &topic, &unique("g"), &db.schema);
    let bad = format!("postgresql://postgres:{PASSWORD}@127.0.0.1:1/postgres?sslmode=disable");
    let env = [("DATABASE_URL", bad.as_str())];
    let run = bounded(&["run", "--config", arg(&p.path), "--until-caught-up"], &env);
    assert_names(
        &run,
        &["127.0.0.1:1", "DATABASE_URL", "connection refused", "--connect-timeout"],
    );
    let bf = bounded(
        &[
            "backfill", "--config", arg(&p.path), "--from", "2024-04-25", "--to", "2024-05-01",
            "--group-id", "bf-conn",
        ],
        &env,
    );
    assert_names(&bf, &["127.0.0.1:1", "DATABASE_URL", "connection refused"]);
    // The URL from the pipeline file: the origin is its key and file.
    let text = SEED.replace("[postgres]", &format!("[postgres]\nurl = \"{bad}\""));
    let p2 = pipeline(&text, &topic, &unique("g"), &db.schema);
    let run = bounded(&["run", "--config", arg(&p2.path), "--until-caught-up"], &[]);
    assert_names(&run, &["127.0.0.1:1", "[postgres] url in", "connection refused"]);
    assert_eq!(schema_tables(&db), 0, "nothing was created");
}

/// Brokers nobody listens on: `run`, `backfill` and `offsets snapshot` exit 1 within the bound, naming the
/// brokers, where they came from (environment, `--brokers`) and "connection refused" — the cause once, never a
/// SASL password of `[kafka.properties]`; `run` creates no table (the brokers are checked first).
#[test]
fn wrong_broker_is_named_with_its_origin_and_cause() {
    let (db, topic) = stage("conn_kafka", 1);
    let text = format!(
        "{SEED}\n[kafka.properties]\n\"sasl.username\" = \"u\"\n\"sasl.password\" = \"{PASSWORD}\"\n"
    );
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    let env = [("KAFKA_BROKERS", "127.0.0.1:1")];
    let run = bounded(&["run", "--config", arg(&p.path), "--until-caught-up"], &env);
    assert_names(
        &run,
        &["127.0.0.1:1", "KAFKA_BROKERS", "connection refused", "--connect-timeout"],
    );
    assert!(
        run.stderr.matches("BrokerTransportFailure").count() <= 1,
        "the cause chain says it once:\n{}",
        run.stderr
    );
    assert_eq!(schema_tables(&db), 0, "run created nothing before the brokers answered");
    let flag = bounded(
        &["run", "--config", arg(&p.path), "--until-caught-up", "--brokers", "127.0.0.1:2"],
        &[],
    );
    assert_names(&flag, &["127.0.0.1:2", "--brokers", "connection refused"]);
    let dir = p.dir.path().join("stop.json");
    let snap = bounded(
        &["offsets", "snapshot", "--config", arg(&p.path), "--group", "g", "-o", arg(&dir)],
        &env,
    );
    assert_names(&snap, &["127.0.0.1:1", "KAFKA_BROKERS", "connection refused"]);
    assert!(!dir.exists(), "no stop file written");
    let bf = bounded(
        &[
            "backfill", "--config", arg(&p.path), "--from", "2024-04-25", "--to", "2024-05-01",
            "--group-id", "bf-conn",
        ],
        &env,
    );
    assert_names(&bf, &["127.0.0.1:1", "KAFKA_BROKERS", "connection refused"]);
    assert_eq!(schema_tables(&db), 0);
}

/// A JSON pipeline with a filter rule, a row projection and a counter: every label kind `/metrics` registers.
const METRICS_PIPELINE: &str = concat!(
    header!(),
    r#"[fields]
event_id = { path = "/event_id", type = "uuid" }
entity = { path = "/entity", type = "text" }
v = { path = "/v", type = "bigint" }
day = { path = "/occurred_at", type = "date" }
[[filter]]
name = "no-tests"
drop-if = "entity == 'test'"
[identity]
key = ["event_id"]
partition-by = "day"
[[projection]]
kind = "row"
table = "accounts"
key = ["entity"]
version = "v"
columns = ["entity", "v"]
[[projection]]
kind = "counter"
table = "daily_counts"
group-by = ["day"]
column = "n"
"#
);

/// The series names of README's metrics table (rows starting with "| `replaysafe_" in "Metrics and health").
fn readme_series() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("### Metrics and health")
        .nth(1)
        .and_then(|s| s.split("\n#").next())
        .expect("README has a section \"Metrics and health\"");
    let names: Vec<String> = section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("| `replaysafe_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|n| format!("replaysafe_{n}"))
        .collect();
    assert!(names.len() >= 9, "README's metrics table parsed: {names:?}");
    names
}

/// Scrapes `/metrics` of an idle instance until the lag gauge (set once a partition is held) is there.
fn idle_scrape(addr: &str) -> String {
    crate::health::wait_for(addr, "/readyz", "ready (partitions held)", |c, _| c == 200);
    crate::health::wait_for(addr, "/metrics", "the lag gauge", |c, b| {
        c == 200 && b.contains("replaysafe_consumer_lag{")
    })
}

fn assert_every_series(body: &str, topic: &str) {
    for name in readme_series() {
        assert!(
            body.lines().any(|l| l.starts_with(&name)),
            "README lists {name}; /metrics of an idle instance lacks it:\n{body}"
        );
    }
    assert!(
        body.contains("# TYPE replaysafe_flush_seconds histogram")
            && body.contains("replaysafe_flush_seconds_bucket{le=\"0.1\"} 0")
            && body.contains("replaysafe_flush_seconds_bucket{le=\"+Inf\"} 0"),
        "flush_seconds is a histogram with buckets:\n{body}"
    );
    for line in [
        "replaysafe_records_total{outcome=\"filtered\",rule=\"no-tests\"} 0",
        "replaysafe_records_total{outcome=\"quarantined\",reason=\"missing-field\"} 0",
        "replaysafe_conflicts_total{projection=\"accounts\"} 0",
        "replaysafe_batches_total 0",
    ] {
        assert!(body.contains(line), "{line} registered at zero:\n{body}");
    }
    assert!(body.contains(&format!("replaysafe_consumer_lag{{topic=\"{topic}\"")));
}

/// An idle fresh instance (an empty topic) serves every series README lists — at zero — and a histogram with
/// `_bucket` lines for the flush time; so does the same instance restarted (nothing applied in between).
#[test]
fn metrics_of_an_idle_instance_list_every_readme_series() {
    let (db, topic) = stage("metrics_idle", 2);
    let p = pipeline(METRICS_PIPELINE, &topic, &unique("g"), &db.schema);
    for name in ["first", "restarted"] {
        let addr = crate::health::free_addr();
        let mut child = spawn_run(&p, &["--metrics-addr", &addr], name);
        let body = idle_scrape(&addr);
        assert_eq!(terminate(&mut child), Some(0));
        assert_every_series(&body, &topic);
    }
    assert_eq!(db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_ledger"), 0);
    assert_eq!(db.i64("SELECT count(*)::bigint FROM {s}.accounts"), 0);
}
