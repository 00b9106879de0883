//! Operator friction (issue 16): connection errors that name the address, its origin and the cause within
//! `--connect-timeout`; `/metrics` of an idle instance listing every series of docs/operations.md; backfill loose ends.

use std::time::Duration;

use crate::common::*;
use crate::core::{seed_events, SEED};

const PASSWORD: &str = "hunter2-not-shown";

fn schema_tables(db: &Db) -> i64 {
    db.query(
        "SELECT count(*)::bigint FROM information_schema.tables WHERE table_schema = $1",
        &[&db.schema],
    )[0]
    .get(0)
}

/// `replaysafe <args> --connect-timeout 5` with `envs`; the harness kills it after 60 s (a hang fails the test).
/// 5 s, not less: the check of the working party (the broker, or the database) must pass within it on a loaded
/// machine before the broken one is tried.
fn bounded(args: &[&str], envs: &[(&str, &str)]) -> Out {
    let args = [args, &["--connect-timeout", "5"]].concat();
    replaysafe_with(&args, envs, Duration::from_secs(60))
}

fn assert_names(out: &Out, what: &[&str]) {
    assert_eq!(
        out.code,
        Some(1),
        "exit 1 (runtime failure)\n{}",
        out.stderr
    );
    for w in what {
        assert!(
            out.stderr.contains(w),
            "stderr names `{w}`:\n{}",
            out.stderr
        );
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
    let run = bounded(
        &["run", "--config", arg(&p.path), "--until-caught-up"],
        &env,
    );
    assert_names(
        &run,
        &[
            "127.0.0.1:1",
            "DATABASE_URL",
            "connection refused",
            "--connect-timeout",
        ],
    );
    let bf = bounded(
        &[
            "backfill",
            "--config",
            arg(&p.path),
            "--from",
            "2024-04-25",
            "--to",
            "2024-05-01",
            "--group-id",
            "bf-conn",
        ],
        &env,
    );
    assert_names(&bf, &["127.0.0.1:1", "DATABASE_URL", "connection refused"]);
    // The URL from the pipeline file: the origin is its key and file.
    let text = SEED.replace("[postgres]", &format!("[postgres]\nurl = \"{bad}\""));
    let p2 = pipeline(&text, &topic, &unique("g"), &db.schema);
    let run = bounded(
        &["run", "--config", arg(&p2.path), "--until-caught-up"],
        &[],
    );
    assert_names(
        &run,
        &["127.0.0.1:1", "[postgres] url in", "connection refused"],
    );
    // `load` (start-up retries) and `verify snapshot` (one attempt) name it too.
    let file = p.dir.path().join("records.jsonl");
    std::fs::write(&file, "").unwrap();
    let load = bounded(&["load", "--config", arg(&p.path), arg(&file)], &env);
    assert_names(
        &load,
        &["127.0.0.1:1", "DATABASE_URL", "connection refused"],
    );
    let out = p.dir.path().join("snap.json");
    let args = [
        "verify",
        "snapshot",
        "--config",
        arg(&p.path),
        "--table",
        "daily_counts",
    ];
    let verify = bounded(&[&args[..], &["-o", arg(&out)]].concat(), &env);
    assert_names(
        &verify,
        &["127.0.0.1:1", "DATABASE_URL", "connection refused"],
    );
    // A host that does not resolve; a database that does not exist (not retried).
    let run_with = |url: &str| {
        let args = ["run", "--config", arg(&p.path), "--until-caught-up"];
        bounded(&args, &[("DATABASE_URL", url)])
    };
    let dns = format!("postgresql://postgres:{PASSWORD}@no-such-host.invalid:5432/postgres");
    let run = run_with(&dns);
    assert_names(&run, &["no-such-host.invalid:5432", "DNS lookup failed"]);
    let good = database_url();
    let at = good
        .rfind("/postgres")
        .expect("DATABASE_URL names the postgres database");
    let nodb = format!("{}/no_such_database_rs{}", &good[..at], &good[at + 9..]);
    let run = run_with(&nodb);
    assert_names(
        &run,
        &["DATABASE_URL", "no such database", "no_such_database_rs"],
    );
    assert!(
        !run.stderr.contains("retrying"),
        "not retried:\n{}",
        run.stderr
    );
    // A role that does not exist: authentication failed (SQLSTATE 28000), not retried.
    let norole = good.replacen("//postgres", "//no_such_role_rs", 1);
    assert_ne!(norole, good, "DATABASE_URL names the postgres role");
    let run = run_with(&norole);
    assert_names(
        &run,
        &["DATABASE_URL", "authentication failed", "no_such_role_rs"],
    );
    assert!(
        !run.stderr.contains("retrying"),
        "not retried:\n{}",
        run.stderr
    );
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
    let run = bounded(
        &["run", "--config", arg(&p.path), "--until-caught-up"],
        &env,
    );
    assert_names(
        &run,
        &[
            "127.0.0.1:1",
            "KAFKA_BROKERS",
            "connection refused",
            "--connect-timeout",
        ],
    );
    assert!(
        run.stderr.matches("BrokerTransportFailure").count() <= 1,
        "the cause chain says it once:\n{}",
        run.stderr
    );
    assert_eq!(
        schema_tables(&db),
        0,
        "run created nothing before the brokers answered"
    );
    let flag = bounded(
        &[
            "run",
            "--config",
            arg(&p.path),
            "--until-caught-up",
            "--brokers",
            "127.0.0.1:2",
        ],
        &[],
    );
    assert_names(&flag, &["127.0.0.1:2", "--brokers", "connection refused"]);
    let dir = p.dir.path().join("stop.json");
    let snap = bounded(
        &[
            "offsets",
            "snapshot",
            "--config",
            arg(&p.path),
            "--group",
            "g",
            "-o",
            arg(&dir),
        ],
        &env,
    );
    assert_names(
        &snap,
        &["127.0.0.1:1", "KAFKA_BROKERS", "connection refused"],
    );
    assert!(!dir.exists(), "no stop file written");
    let bf = bounded(
        &[
            "backfill",
            "--config",
            arg(&p.path),
            "--from",
            "2024-04-25",
            "--to",
            "2024-05-01",
            "--group-id",
            "bf-conn",
        ],
        &env,
    );
    assert_names(&bf, &["127.0.0.1:1", "KAFKA_BROKERS", "connection refused"]);
    let dns = [("KAFKA_BROKERS", "no-such-host.invalid:9092")];
    let args = ["run", "--config", arg(&p.path), "--until-caught-up"];
    let run = bounded(&args, &dns);
    let named = [
        "no-such-host.invalid:9092",
        "KAFKA_BROKERS",
        "DNS lookup failed",
    ];
    assert_names(&run, &named);
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

/// The series names of the metrics table of docs/operations.md (rows starting with "| `replaysafe_" in
/// "Metrics and health").
pub(crate) fn readme_series() -> Vec<String> {
    let readme = include_str!("../../docs/operations.md");
    let section = readme
        .split("## Metrics and health")
        .nth(1)
        .and_then(|s| s.split("\n#").next())
        .expect("docs/operations.md has a section \"Metrics and health\"");
    let names: Vec<String> = section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("| `replaysafe_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|n| format!("replaysafe_{n}"))
        .collect();
    assert!(
        names.len() >= 9,
        "the metrics table of docs/operations.md parsed: {names:?}"
    );
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
            "docs/operations.md lists {name}; /metrics of an idle instance lacks it:\n{body}"
        );
    }
    assert!(
        body.contains("# TYPE replaysafe_flush_seconds histogram"),
        "flush_seconds is a histogram:\n{body}"
    );
    let flush = parse_scrape(body)
        .samples
        .into_iter()
        .find(|s| s.metric == "replaysafe_flush_seconds")
        .map(|s| s.value);
    let Some(prometheus_parse::Value::Histogram(buckets)) = flush else {
        panic!("flush_seconds has buckets:\n{body}")
    };
    assert!(
        buckets.iter().any(|b| b.less_than == 0.1 && b.count == 0.0)
            && buckets
                .iter()
                .any(|b| b.less_than == f64::INFINITY && b.count == 0.0),
        "flush_seconds buckets at 0 (0.1 and +Inf): {buckets:?}"
    );
    for (name, labels) in [
        (
            "replaysafe_records_total",
            &[("outcome", "filtered"), ("rule", "no-tests")][..],
        ),
        (
            "replaysafe_records_total",
            &[("outcome", "quarantined"), ("reason", "missing-field")][..],
        ),
        (
            "replaysafe_conflicts_total",
            &[("projection", "accounts")][..],
        ),
        ("replaysafe_batches_total", &[][..]),
    ] {
        assert_eq!(
            sample(body, name, labels),
            Some(0.0),
            "{name} {labels:?} registered at zero:\n{body}"
        );
    }
    assert!(
        sample(body, "replaysafe_consumer_lag", &[("topic", topic)]).is_some(),
        "the lag gauge of {topic}:\n{body}"
    );
}

/// An idle fresh instance (an empty topic) serves every series docs/operations.md lists — at zero — and a histogram
/// with `_bucket` lines for the flush time; so does the same instance restarted (nothing applied in between).
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
    assert_eq!(
        db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_ledger"),
        0
    );
    assert_eq!(db.i64("SELECT count(*)::bigint FROM {s}.accounts"), 0);
}

/// `(consumed, landed)` of the last `consumed N = landed a …` line in `text`.
fn accounting(text: &str) -> (u64, u64) {
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("consumed ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no accounting line in:\n{text}"));
    let num = |after: &str| -> u64 {
        line.split(after)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap()
            .parse()
            .unwrap()
    };
    (
        line.split_whitespace().next().unwrap().parse().unwrap(),
        num("landed "),
    )
}

/// Whether the broker knows `group` (committed offsets or members): listed and not `Dead`.
fn group_listed(group: &str) -> bool {
    use rdkafka::consumer::Consumer;
    let c = consumer(&[]);
    let list = c
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .unwrap();
    list.groups()
        .iter()
        .any(|g| g.name() == group && g.state() != "Dead")
}

/// A backfill interrupted by SIGINT prints its progress summary (what this session applied, what is left per
/// partition) matching the ledger; the rerun resumes, and its report's accounting line and per-day figures
/// cover the same records (this session, labelled), whose sum with the first session's is every ledger row; the
/// backfill group leaves nothing in Kafka (no committed offsets, not listed) unless `--keep-group`.
#[test]
fn backfill_interrupted_and_resumed_reports_agree_and_leave_no_group() {
    let (db, topic) = stage("bf_resume", 3);
    let (recs, truth) = seed_events(900, 3);
    produce(&topic, &recs);
    let text = SEED.replace("max-records = 200", "max-records = 20");
    let p = pipeline(&text, &topic, &unique("prod"), &db.schema);
    let group = unique("bf");
    let report = p.dir.path().join("report.json");
    let args = [
        "backfill",
        "--config",
        arg(&p.path),
        "--from",
        "2024-04-25",
        "--to",
        "2024-05-01",
        "--group-id",
        &group,
        "-o",
        arg(&report),
    ];
    // Session 1: from the fourth batch on each commit waits 1 s; SIGINT once a checkpoint moved.
    let slow = [(
        "REPLAYSAFE_FAILPOINTS",
        "before-db-commit=3*off->sleep(1000)",
    )];
    let mut child = spawn(&args, &slow, p.dir.path(), "first");
    let table = format!("\"{}\".replaysafe_checkpoints", db.schema);
    wait_until(
        Duration::from_secs(60),
        "a backfill batch committed",
        || {
            let exists =
                db.query("SELECT to_regclass($1) IS NOT NULL", &[&table])[0].get::<_, bool>(0);
            exists
            && db.i64(&format!(
                "SELECT coalesce(max(next_offset), 0)::bigint FROM {table} WHERE consumer_group = '{group}'"
            )) > 0
        },
    );
    unsafe_kill(child.id(), "INT");
    let code = child.wait().unwrap().code();
    let stderr = std::fs::read_to_string(p.dir.path().join("first.err")).unwrap();
    assert_eq!(code, Some(1), "interrupted: exit 1\n{stderr}");
    let ledger1 = db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_ledger");
    assert!(ledger1 < 900, "interrupted before the end: {ledger1}");
    assert!(
        stderr.contains("backfill interrupted: this session"),
        "a progress summary:\n{stderr}"
    );
    let (consumed1, landed1) = accounting(stderr.split("backfill interrupted").nth(1).unwrap());
    assert_eq!(
        landed1 as i64, ledger1,
        "the summary's landed = ledger rows:\n{stderr}"
    );
    assert_eq!(consumed1, landed1);
    assert!(
        stderr.contains(" left"),
        "what is left per partition:\n{stderr}"
    );
    assert!(
        !group_listed(&group),
        "no group in Kafka after the interrupted session"
    );

    // Session 2: resumes; its report covers this session, labelled, and agrees with itself.
    let second = replaysafe(&args);
    second.assert_ok();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let (consumed2, landed2) = accounting(r["accounting"].as_str().unwrap());
    let days = r["per_day"].as_object().unwrap();
    let sum = |k: &str| days.values().map(|d| d[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(
        sum("landed"),
        landed2,
        "per-day landed = accounting landed: {r}"
    );
    let all = ["landed", "duplicate", "stale", "filtered", "quarantined"].map(sum);
    assert_eq!(
        all.iter().sum::<u64>(),
        consumed2,
        "per-day total = consumed: {r}"
    );
    let planned: i64 = r["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["stop_offset"].as_i64().unwrap() - x["start_offset"].as_i64().unwrap())
        .sum();
    assert_eq!(
        planned as u64, consumed2,
        "the partitions' offsets are this session's: {r}"
    );
    assert!(
        r["counts"].as_str().unwrap().contains("this session"),
        "labelled: {r}"
    );
    assert_eq!(landed1 + landed2, 900);
    assert_eq!(
        db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_ledger"),
        900
    );
    assert_eq!(crate::core::counts(&db), truth);
    assert_eq!(
        committed(&group, &topic, 3),
        vec![None; 3],
        "no offsets committed"
    );
    assert!(
        !group_listed(&group),
        "no group in Kafka after the backfill"
    );

    // --keep-group: the offsets stay committed at the stop (every record a duplicate under a new group).
    let kept = unique("bf");
    let out = backfill(
        &p,
        "2024-04-25",
        ("--to", "2024-05-01"),
        &kept,
        &["--keep-group"],
    );
    out.assert_ok();
    let stops: Vec<Option<i64>> = (0..3).map(|_| Some(300)).collect();
    assert_eq!(committed(&kept, &topic, 3), stops);
    assert!(group_listed(&kept));
}

/// A topic that does not exist is a clear error (exit 2), not a silent wait.
#[test]
fn a_missing_topic_exits_2() {
    let db = Db::fresh("notopic");
    let p = pipeline(SEED, &unique("no_such_topic"), &unique("g"), &db.schema);
    let out = try_run_with(&p.path, &[], Duration::from_secs(60));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("does not exist"), "{}", out.stderr);
}
