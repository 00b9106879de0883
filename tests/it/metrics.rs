//! `/metrics` by Prometheus's conventions (issue 43): every family has `# HELP` and `# TYPE`, names follow the
//! naming doc, every series carries the `pipeline` and `group` labels, and the values of a run that applied
//! known records are right; the docs' table and the Grafana dashboard (`dashboards/replaysafe.json`) name
//! exactly the families the process exports.

use std::collections::BTreeSet;

use chrono::Utc;
use prometheus_parse::Value;
use replaysafe::metrics_http::{Kind, FAMILIES};

use crate::common::*;

const PIPELINE: &str = concat!(
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
[ledger]
horizon-days = 30
[[projection]]
kind = "row"
table = "accounts"
key = ["entity"]
version = "v"
columns = ["entity", "v"]
"#
);

/// The names the process describes ([`FAMILIES`]).
fn families() -> BTreeSet<&'static str> {
    FAMILIES.iter().map(|f| f.0).collect()
}

/// A JSON event `n` of `entity` at version `v`, occurred today (inside the 30-day horizon).
fn event(n: u32, partition: i32, entity: &str, v: i64) -> Rec {
    let value = format!(
        r#"{{"event_id":"5b0e4c1a-1d2e-4f60-8a7b-{n:012}","entity":"{entity}","v":{v},"occurred_at":"{}"}}"#,
        Utc::now().date_naive()
    );
    Rec::json(
        partition,
        &format!("k{n}"),
        &value,
        Utc::now().timestamp_millis(),
    )
}

/// 6 events landed over two partitions (each entity's versions rising on one partition: none stale), 2 of them sent again (duplicates), 1 filtered by `no-tests`, 1 without
/// an event id (quarantined `missing-field`).
fn records() -> Vec<Rec> {
    let mut recs: Vec<Rec> = (0..6)
        .map(|n| event(n, (n % 2) as i32, ["a", "b"][n as usize % 2], i64::from(n)))
        .collect();
    recs.push(event(0, 0, "a", 0));
    recs.push(event(1, 1, "b", 1));
    recs.push(event(7, 0, "test", 1));
    recs.push(Rec::json(
        1,
        "k8",
        r#"{"entity":"d","v":1,"occurred_at":"2026-01-01"}"#,
        Utc::now().timestamp_millis(),
    ));
    recs
}

/// Checks the text by the exposition format and the naming conventions; returns the families it holds.
fn check_conventions(body: &str, group: &str) -> BTreeSet<String> {
    let scrape = parse_scrape(body);
    let mut seen = BTreeSet::new();
    for s in &scrape.samples {
        let base = ["_sum", "_count"]
            .iter()
            .find_map(|suf| s.metric.strip_suffix(suf))
            .filter(|b| FAMILIES.iter().any(|f| f.0 == *b && f.1 == Kind::Histogram))
            .unwrap_or(&s.metric);
        let (_, kind, _) = FAMILIES
            .iter()
            .find(|f| f.0 == base)
            .unwrap_or_else(|| panic!("{} is not described in FAMILIES:\n{body}", s.metric));
        let typed = match (&s.value, kind) {
            (Value::Counter(_), Kind::Counter) | (Value::Gauge(_), Kind::Gauge) => true,
            (Value::Histogram(b), Kind::Histogram) => !b.is_empty(),
            // `_sum` and `_count` of a histogram: the parser leaves them untyped.
            (Value::Untyped(_), Kind::Histogram) => s.metric != base,
            _ => false,
        };
        assert!(
            typed,
            "{} has the TYPE of a {kind:?}: {:?}\n{body}",
            s.metric, s.value
        );
        assert_eq!(s.labels.get("pipeline"), Some("pipeline"), "{}", s.metric);
        assert_eq!(s.labels.get("group"), Some(group), "{}", s.metric);
        seen.insert(base.to_string());
    }
    for name in &seen {
        assert!(
            scrape.docs.get(name).is_some_and(|h| !h.trim().is_empty()),
            "# HELP {name}:\n{body}"
        );
        let kind = FAMILIES.iter().find(|f| f.0 == name).unwrap().1;
        let ty = format!("# TYPE {name} {}", format!("{kind:?}").to_lowercase());
        assert!(body.lines().any(|l| l == ty), "{ty}:\n{body}");
        named_by_the_conventions(name, kind);
    }
    seen
}

/// Prometheus's naming doc (<https://prometheus.io/docs/practices/naming/>): `snake_case` with the
/// application's prefix, `_total` on counters only, base units (seconds, bytes) as the last word, no other unit.
fn named_by_the_conventions(name: &str, kind: Kind) {
    assert!(
        name.starts_with("replaysafe_")
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
        "{name}: snake_case under replaysafe_"
    );
    assert_eq!(
        kind == Kind::Counter,
        name.ends_with("_total"),
        "{name}: _total on counters only"
    );
    let words: Vec<&str> = name.trim_end_matches("_total").split('_').collect();
    for bad in [
        "ms",
        "millis",
        "milliseconds",
        "minutes",
        "hours",
        "kb",
        "mb",
        "kilobytes",
        "megabytes",
    ] {
        assert!(!words.contains(&bad), "{name}: {bad} is not a base unit");
    }
    for unit in ["seconds", "bytes"] {
        if let Some(i) = words.iter().position(|w| *w == unit) {
            assert_eq!(i, words.len() - 1, "{name}: the unit {unit} ends the name");
        }
    }
}

/// A pipeline applies known records (landed, duplicates, a filtered and a quarantined one over two
/// partitions); its `/metrics` parses as the exposition format, every family has HELP and TYPE and the
/// `pipeline`/`group` labels, and the figures are the run's: outcomes, lag 0, the ledger's rows (after
/// `ANALYZE`) and bytes, the horizon and pruned-below days as the database holds them, the dead letter by reason.
#[test]
fn metrics_follow_the_conventions_and_count_a_known_run() {
    let (db, topic) = stage("metrics_conv", 2);
    let group = unique("g");
    let p = pipeline(PIPELINE, &topic, &group, &db.schema);
    produce(&topic, &records());
    let addr = crate::health::free_addr();
    let mut child = spawn_run(&p, &["--metrics-addr", &addr], "run");
    wait_until(
        std::time::Duration::from_secs(60),
        "every record applied",
        || {
            db.query(
                "SELECT to_regclass($1) IS NOT NULL",
                &[&format!("\"{}\".replaysafe_dead_letters", db.schema)],
            )[0]
            .get::<_, bool>(0)
                && db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_ledger") == 6
                && db.i64("SELECT count(*)::bigint FROM {s}.replaysafe_dead_letters") == 1
        },
    );
    db.execute("ANALYZE {s}.replaysafe_ledger");
    let g = group.as_str();
    // pg_total_relation_size of the ledger's partitions now (the gauge must reach it; vacuum may grow it).
    let bytes = || {
        db.query(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::float8 FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)",
            &[&format!("\"{}\".replaysafe_ledger", db.schema)],
        )[0]
        .get::<_, f64>(0)
    };
    let ready = |b: &str| {
        sample(b, "replaysafe_records_total", &[("outcome", "landed")]) == Some(6.0)
            && sample(b, "replaysafe_ledger_rows", &[]) == Some(6.0)
            && sample(b, "replaysafe_ledger_bytes", &[]).is_some_and(|n| n > 0.0 && n == bytes())
            && sample(b, "replaysafe_dead_letters", &[("reason", "missing-field")]) == Some(1.0)
            && [0, 1].iter().all(|part| {
                let part = part.to_string();
                let tp = [("topic", topic.as_str()), ("partition", &part)];
                sample(b, "replaysafe_consumer_lag", &tp) == Some(0.0)
            })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let body = loop {
        let body = crate::health::get(&addr, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        if ready(&body) {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run's figures within 60 s; last /metrics:\n{body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert_eq!(terminate(&mut child), Some(0));

    let seen = check_conventions(&body, g);
    let all: BTreeSet<String> = families().iter().map(|s| s.to_string()).collect();
    assert_eq!(seen, all, "/metrics serves every described family");
    let got = |name: &str, labels: &[(&str, &str)]| sample(&body, name, labels);
    assert_eq!(
        got("replaysafe_records_total", &[("outcome", "duplicate")]),
        Some(2.0)
    );
    assert_eq!(
        got(
            "replaysafe_records_total",
            &[("outcome", "filtered"), ("rule", "no-tests")]
        ),
        Some(1.0)
    );
    assert_eq!(
        got(
            "replaysafe_records_total",
            &[("outcome", "quarantined"), ("reason", "missing-field")]
        ),
        Some(1.0)
    );
    assert_eq!(
        got("replaysafe_dead_letters", &[("reason", "oversize")]),
        Some(0.0)
    );
    assert_eq!(
        got("replaysafe_conflicts_total", &[("projection", "accounts")]),
        Some(0.0)
    );
    assert_eq!(
        got("replaysafe_db_retries_total", &[("sqlstate", "connection")]),
        Some(0.0)
    );
    assert_eq!(got("replaysafe_transactions_open", &[]), Some(0.0));
    assert!(got("replaysafe_batches_total", &[]).is_some_and(|n| n >= 1.0));
    let days = db.query(
        "SELECT EXTRACT(epoch FROM greatest(h.pruned_below, (now() AT TIME ZONE 'UTC')::date - 30))::float8, \
         coalesce(EXTRACT(epoch FROM h.pruned_below), 0)::float8 FROM {s}.replaysafe_horizon h",
        &[],
    );
    assert_eq!(
        got("replaysafe_horizon_timestamp_seconds", &[]),
        Some(days[0].get::<_, f64>(0))
    );
    assert_eq!(
        got("replaysafe_pruned_below_timestamp_seconds", &[]),
        Some(days[0].get::<_, f64>(1))
    );
    assert_eq!(
        got("replaysafe_records_total", &[("outcome", "stale")]),
        Some(0.0)
    );
    assert_eq!(
        db.i64(
            "SELECT count(*)::bigint FROM {s}.accounts WHERE (entity, v) IN (('a', 4), ('b', 5))"
        ),
        2
    );
}

/// The metrics table of docs/operations.md lists exactly the described families, each with its type.
#[test]
fn the_docs_table_lists_every_described_family() {
    let docs: BTreeSet<String> = crate::ops::readme_series().into_iter().collect();
    let all: BTreeSet<String> = families().iter().map(|s| s.to_string()).collect();
    assert_eq!(
        docs, all,
        "docs/operations.md \"Metrics and health\" vs FAMILIES"
    );
    let text = include_str!("../../docs/operations.md");
    for (name, kind, _) in FAMILIES {
        let row = format!("| `{name}` | {}", format!("{kind:?}").to_lowercase());
        assert!(
            text.contains(&row),
            "the docs' row of {name} starts with `{row}`"
        );
    }
}

/// Every `expr` of a JSON value, recursively.
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

/// The Grafana dashboard's queries name only families the process exports (a histogram's `_bucket`, `_sum`
/// and `_count` count as it), each query names one, and the panels the docs promise are there.
#[test]
fn the_dashboard_queries_only_exported_metrics() {
    let text = include_str!("../../dashboards/replaysafe.json");
    let dash: serde_json::Value =
        serde_json::from_str(text).expect("dashboards/replaysafe.json is JSON");
    let mut all = Vec::new();
    exprs(&dash, &mut all);
    assert!(all.len() >= 7, "queries: {all:?}");
    let mut used = BTreeSet::new();
    for e in &all {
        let mut names = Vec::new();
        let mut rest = e.as_str();
        while let Some(i) = rest.find("replaysafe_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.push(&tail[..end]);
            rest = &tail[end..];
        }
        assert!(
            !names.is_empty(),
            "a query naming no replaysafe metric: {e}"
        );
        for n in names {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .filter(|b| FAMILIES.iter().any(|f| f.0 == *b && f.1 == Kind::Histogram))
                .unwrap_or(n);
            assert!(
                families().contains(base),
                "the dashboard queries {n}, not exported: {e}"
            );
            used.insert(base.to_string());
        }
    }
    for must in [
        "replaysafe_records_total",
        "replaysafe_consumer_lag",
        "replaysafe_flush_seconds",
        "replaysafe_db_retries_total",
        "replaysafe_dead_letters",
        "replaysafe_conflicts_total",
        "replaysafe_horizon_timestamp_seconds",
    ] {
        assert!(used.contains(must), "the dashboard shows {must}");
    }
}
