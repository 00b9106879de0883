//! `replaysafe prove` (issue 12): it passes on every example pipeline (JSON counters, CDC row projection,
//! outbox) and fails — naming the boundary and showing the differing rows — on three deliberately unsafe
//! pipelines: a `sql` projection keeping the last writer per entity without a version, one writing `now()`
//! into a business column, and an identity of its own built from `_partition`/`_offset`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use replaysafe::ops::prove::{self, Boundary, Fixture, ProveOptions, Report};

use crate::common::{database_url, replaysafe_with, unique};

fn options(records: &Path, shuffles: u32) -> ProveOptions {
    ProveOptions {
        fixture: Fixture::File(records.to_path_buf()),
        database_url: database_url(),
        brokers: None,
        keep: false,
        shuffles,
        seed: 42,
        progress: false,
        interrupt: Default::default(),
    }
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/prove")
        .join(name)
}

fn boundary(r: &Report, n: u8) -> &Boundary {
    r.boundaries
        .iter()
        .find(|b| b.number == n)
        .expect("boundary")
}

/// Every boundary passes except those named `n/a`, which must be exactly `na`; no scratch schema is left.
fn assert_passes(r: &Report, na: &[u8]) {
    assert_eq!(r.boundaries.len(), 12, "{}", r.text());
    for b in &r.boundaries {
        let want = if na.contains(&b.number) {
            "n/a"
        } else {
            "pass"
        };
        assert_eq!(
            b.result,
            want,
            "boundary {} {}: {}\n{}",
            b.number,
            b.name,
            b.note,
            r.text()
        );
        assert!(b.diff.is_empty());
    }
    assert!(r.passed && r.kept.is_empty(), "{}", r.text());
    let db = crate::common::Db::fresh("prove_left");
    let left = db.i64(&format!(
        "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rsprove\\_{}\\_%'",
        r.run_id
    ));
    assert_eq!(left, 0, "scratch schemas left behind");
}

#[test]
fn prove_passes_on_the_counters_example() {
    let r = prove::prove(
        &example("counters.toml"),
        options(&example("counters.jsonl"), 4),
    )
    .unwrap();
    assert_passes(&r, &[6]);
    assert_eq!(r.records, 252);
    // The reference is what the fixture says: 240 distinct events, 11 redeliveries, 1 malformed record.
    assert!(
        boundary(&r, 1)
            .note
            .starts_with("consumed 252 = landed 240 + duplicate 11"),
        "{}",
        r.text()
    );
    // The ledger's pruned offsets refuse the replay before anything is committed (docs/replay.md "The ledger's
    // lifecycle"); without them every claimed record would be quarantined as beyond-horizon.
    let b7 = &boundary(&r, 7).note;
    assert!(
        b7.contains("the replay was refused (offsets of shop.purchases/")
            || b7.contains("quarantined all 251 claimed records as beyond-horizon"),
        "{}",
        r.text()
    );
    assert!(
        boundary(&r, 9).note.contains("COMMITs applied and"),
        "{}",
        r.text()
    );
    assert!(r.answers.contains("What identifies a change"));
}

#[test]
fn prove_passes_on_the_cdc_example() {
    let r = prove::prove(&example("cdc.toml"), options(&example("cdc.jsonl"), 4)).unwrap();
    assert_passes(&r, &[7]);
    // A resnapshot: one read per account that exists at the end (29 rows; none for the deleted ones), of its
    // current state at a new position — every one a duplicate.
    let rows = boundary(&r, 1).note.clone();
    assert!(
        boundary(&r, 6).note.starts_with(
            "29 snapshot reads of the current state at a new position: consumed 29 = landed 0 + duplicate 29"
        ),
        "{}\n{rows}",
        r.text()
    );
    assert!(
        boundary(&r, 3)
            .note
            .starts_with("crash points: 68 of 206 commits (sampled: one every 3 commits"),
        "{}",
        r.text()
    );
}

/// The CDC example with its last change delivered again at the same source position with another balance (a
/// ledger duplicate with another state: a recorded conflict, the version's winner the same in every order).
/// Every boundary passes; the resnapshot leaves that account out, as the source's state of it is not known.
#[test]
fn prove_passes_a_cdc_pipeline_with_a_conflict_at_an_entitys_newest_position() {
    let text = std::fs::read_to_string(example("cdc.jsonl")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let last: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    let partition = last["partition"].as_i64().unwrap();
    let next = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["partition"].as_i64() == Some(partition))
        .map(|v| v["offset"].as_i64().unwrap())
        .max()
        .unwrap()
        + 1;
    let mut payload: serde_json::Value =
        serde_json::from_str(last["payload"].as_str().unwrap()).unwrap();
    payload["after"]["balance"] = "1.00".into();
    let mut again = last.clone();
    again["offset"] = next.into();
    again["payload"] = payload.to_string().into();
    lines.push(again.to_string());
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("cdc-conflict.jsonl");
    std::fs::write(&fixture, lines.join("\n")).unwrap();
    let r = prove::prove(&example("cdc.toml"), options(&fixture, 4)).unwrap();
    assert_passes(&r, &[7]);
    assert!(boundary(&r, 1).note.contains("1 conflict"), "{}", r.text());
    assert!(
        boundary(&r, 6).note.starts_with(
            "28 snapshot reads of the current state at a new position (1 entity with two states"
        ),
        "{}",
        r.text()
    );
}

#[test]
fn prove_passes_on_the_outbox_example() {
    let r = prove::prove(
        &example("outbox.toml"),
        options(&example("counters.jsonl"), 4),
    )
    .unwrap();
    assert_passes(&r, &[6, 7]);
    assert!(
        boundary(&r, 5).note.contains("under generation"),
        "{}",
        r.text()
    );
}

/// Order status events keyed by event id (an order's changes spread over the 3 partitions): `orders` orders,
/// each with a `placed`, a `paid` and (every other one) a `shipped` event.
fn status_fixture(dir: &Path, orders: usize) -> PathBuf {
    status_fixture_with(dir, orders, &|step| step.to_string())
}

/// [`status_fixture`] with each status written as `status(step)`.
fn status_fixture_with(dir: &Path, orders: usize, status: &dyn Fn(&str) -> String) -> PathBuf {
    let mut lines = Vec::new();
    let mut offsets = [0i64; 3];
    let mut k = 0usize;
    for step in ["placed", "paid", "shipped"] {
        for o in 0..orders {
            if step == "shipped" && o % 2 == 1 {
                continue;
            }
            let p = (k * 7 + o) % 3;
            k += 1;
            let payload = serde_json::json!({
                "event_id": uuid::Uuid::from_u64_pair(9, k as u64).to_string(),
                "order_id": format!("o-{o}"),
                "status": status(step),
            })
            .to_string();
            lines.push(serde_json::json!({
                "topic": "shop.orders", "partition": p, "offset": offsets[p], "tstype": "create",
                "ts": 1_795_996_800_000i64 + k as i64, "key": null, "payload": payload,
            }).to_string());
            offsets[p] += 1;
        }
    }
    let path = dir.join("orders.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// A pipeline over `shop.orders` with one `sql` projection (`SETUP` and `SQL`, `{s}` the schema).
fn sql_pipeline(dir: &Path, schema: &str, generation: bool, setup: &str, sql: &str) -> PathBuf {
    let text = format!(
        r#"
[kafka]
group-id = "orders"
topics = ["shop.orders"]
start = "earliest"

[postgres]
schema = "{schema}"

[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
order_id = {{ path = "/order_id", type = "text" }}
status = {{ path = "/status", type = "text" }}

[identity]
key = ["event_id"]
{}

[[projection]]
kind = "sql"
setup = "{}"
sql = "{}"
"#,
        if generation {
            "generation = \"g1\""
        } else {
            ""
        },
        setup.replace("{s}", schema),
        sql.replace("{s}", schema)
    );
    let path = dir.join("orders.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn prove_fails_on_a_last_writer_sql_projection_in_the_shuffles() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_lw");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.order_status (order_id text PRIMARY KEY, status text NOT NULL)",
        "INSERT INTO {s}.order_status (order_id, status) SELECT DISTINCT ON (order_id) order_id, status FROM landed \
         ORDER BY order_id, _offset DESC ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status",
    );
    let r = prove::prove(&p, options(&status_fixture(dir.path(), 12), 20)).unwrap();
    assert!(!r.passed, "{}", r.text());
    // Replays of the same order pass; a cross-partition interleaving ends with another last writer.
    assert_eq!(boundary(&r, 2).result, "pass", "{}", r.text());
    let b = boundary(&r, 4);
    assert_eq!(b.result, "fail", "{}", r.text());
    assert!(b.note.starts_with("shuffle "), "{}", b.note);
    let d = b
        .diff
        .iter()
        .find(|d| d.table == "order_status")
        .expect("order_status differs");
    assert!(!d.expected.is_empty() && !d.got.is_empty(), "{d:?}");
    assert!(
        d.expected[0].starts_with("order_id=o-") && d.expected[0].contains("status="),
        "{d:?}"
    );
    let text = r.text();
    assert!(
        text.contains("── 4 permitted shuffles") && text.contains("     expected  order_id=o-"),
        "{text}"
    );
    assert!(
        text.contains("FAILED: ") && text.contains("4 permitted shuffles"),
        "{text}"
    );
}

/// Issue 35.4 (found by H7): the rows a failing boundary shows are record content (`--from-topic` samples a
/// live topic). Statuses holding a terminal title sequence, a bell, a carriage return and a newline that forges
/// a report line are escaped in the text report (no control byte reaches stdout, no forged line); the JSON
/// report keeps the exact values.
#[test]
fn prove_report_escapes_control_characters_of_the_rows_it_shows() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_hostile");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.order_status (order_id text PRIMARY KEY, status text NOT NULL)",
        "INSERT INTO {s}.order_status (order_id, status) SELECT DISTINCT ON (order_id) order_id, status FROM landed \
         ORDER BY order_id, _offset DESC ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status",
    );
    let hostile =
        |step: &str| format!("{step}\u{1b}]0;owned\u{7}\r\n     got       order_id=forged");
    let fixture = status_fixture_with(dir.path(), 12, &hostile);
    let r = prove::prove(&p, options(&fixture, 20)).unwrap();
    assert!(!r.passed, "{}", r.text());
    let b = boundary(&r, 4);
    assert_eq!(b.result, "fail", "{}", r.text());
    let d = b
        .diff
        .iter()
        .find(|d| d.table == "order_status")
        .expect("order_status differs");
    assert!(
        d.got.iter().any(|g| g.contains("\u{1b}]0;owned\u{7}\r\n")),
        "the report keeps the exact values: {d:?}"
    );
    let text = r.text();
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "a control byte reached the text report:\n{text:?}"
    );
    assert!(
        !text.contains("\n     got       order_id=forged"),
        "a value forged a line:\n{text}"
    );
    assert!(
        text.contains("\\u{1b}]0;owned\\u{7}\\r\\n     got       order_id=forged"),
        "{text}"
    );
    let json = serde_json::to_string(&r).unwrap();
    let back: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        back.to_string().contains("\\u001b]0;owned\\u0007\\r\\n"),
        "{json}"
    );
}

#[test]
fn prove_fails_on_now_in_a_business_column_exit_6_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_now");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.seen (event_id uuid PRIMARY KEY, first_seen text NOT NULL)",
        "INSERT INTO {s}.seen (event_id, first_seen) SELECT event_id, clock_timestamp()::text FROM landed",
    );
    let fixture = status_fixture(dir.path(), 4);
    let args = [
        "prove",
        "--config",
        p.to_str().unwrap(),
        "--records",
        fixture.to_str().unwrap(),
        "--shuffles",
        "2",
        "--json",
    ];
    let out = replaysafe_with(&args, &[], Duration::from_secs(600));
    assert_eq!(out.code, Some(6), "{}\n{}", out.stdout, out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["passed"], false);
    let b = &json["boundaries"];
    // The replay on top of the reference writes nothing (every record a duplicate); every state built again
    // carries other times.
    assert_eq!(b[1]["result"], "pass", "{}", out.stdout);
    assert_eq!(b[2]["number"], 3);
    assert_eq!(b[2]["result"], "fail", "{}", out.stdout);
    let diff = &b[2]["diff"][0];
    assert_eq!(diff["table"], "seen", "{}", out.stdout);
    assert!(
        diff["expected"][0]
            .as_str()
            .unwrap()
            .contains("first_seen="),
        "{}",
        out.stdout
    );
    assert!(
        diff["got"][0].as_str().unwrap().contains("first_seen="),
        "{}",
        out.stdout
    );
}

#[test]
fn prove_fails_on_an_offset_identity_on_a_rebuilt_topic() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_off");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        true,
        "CREATE TABLE IF NOT EXISTS {s}.events (part int, off bigint, order_id text, status text, PRIMARY KEY (part, off))",
        "INSERT INTO {s}.events SELECT _partition, _offset, order_id, status FROM landed ON CONFLICT DO NOTHING",
    );
    let r = prove::prove(&p, options(&status_fixture(dir.path(), 6), 2)).unwrap();
    assert!(!r.passed, "{}", r.text());
    for n in [2, 3, 4, 8, 9] {
        assert_eq!(boundary(&r, n).result, "pass", "{}", r.text());
    }
    let b = boundary(&r, 5);
    assert_eq!(b.result, "fail", "{}", r.text());
    let d = b
        .diff
        .iter()
        .find(|d| d.table == "events")
        .expect("events differs");
    assert_eq!(d.counts, (15, 15));
    assert!(
        d.got[0].starts_with("part=") && d.got[0].contains("off="),
        "{d:?}"
    );
}

/// Bad input is refused before anything is created, exit 2, naming what and where: a record of a topic the
/// pipeline does not consume, a malformed kcat line, an empty fixture, a `sql` projection naming another schema.
#[test]
fn prove_refuses_bad_input_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_bad");
    let ok_sql = "INSERT INTO {s}.t SELECT order_id FROM landed ON CONFLICT DO NOTHING";
    let setup = "CREATE TABLE IF NOT EXISTS {s}.t (order_id text PRIMARY KEY)";
    let p = sql_pipeline(dir.path(), &schema, false, setup, ok_sql);
    let good = status_fixture(dir.path(), 2);
    let line = std::fs::read_to_string(&good).unwrap();
    let first = line.lines().next().unwrap().to_string();
    let cases = [
        (
            "foreign.jsonl",
            first.replace("shop.orders", "shop.refunds"),
            "shop.refunds",
        ),
        (
            "malformed.jsonl",
            format!("{first}\n{{\"topic\": "),
            "malformed.jsonl:2",
        ),
        ("empty.jsonl", String::new(), "no records"),
    ];
    for (name, text, says) in cases {
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        let args = [
            "prove",
            "--config",
            p.to_str().unwrap(),
            "--records",
            f.to_str().unwrap(),
        ];
        let out = replaysafe_with(&args, &[], Duration::from_secs(120));
        assert_eq!(out.code, Some(2), "{name}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{name}: {}", out.stderr);
    }
    // A `sql` projection that also writes into another schema of the database would escape the scratch schema.
    let other = unique("prove_other");
    let db = crate::common::Db::fresh(&other);
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        setup,
        &format!(
            "{ok_sql}; INSERT INTO {}.audit SELECT order_id FROM landed",
            db.schema
        ),
    );
    let args = [
        "prove",
        "--config",
        p.to_str().unwrap(),
        "--records",
        good.to_str().unwrap(),
    ];
    let out = replaysafe_with(&args, &[], Duration::from_secs(120));
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("names the schema `{}`", db.schema)),
        "{}",
        out.stderr
    );
    let left = db.i64(&format!(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{}'",
        db.schema
    ));
    assert_eq!(left, 0, "nothing was created in the other schema");
}

/// SIGINT during `prove` drops the scratch schemas made so far and exits 1.
#[test]
fn prove_interrupted_drops_its_scratch_schemas_and_exits_1() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_int");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.t (order_id text PRIMARY KEY)",
        "INSERT INTO {s}.t SELECT order_id FROM landed ON CONFLICT DO NOTHING",
    );
    let fixture = status_fixture(dir.path(), 12);
    let mut child = std::process::Command::new(crate::common::bin())
        .args(["prove", "--config", p.to_str().unwrap(), "--records"])
        .arg(&fixture)
        .env("DATABASE_URL", database_url())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let id = loop {
        let l = lines.next().expect("prove logs its run id").unwrap();
        if let Some(rest) = l.split("scratch schemas rsprove_").nth(1) {
            break rest.split('_').next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let db = crate::common::Db::fresh("prove_int_watch");
    let count =
        format!("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rsprove\\_{id}\\_%'");
    // Interrupt once the crash boundary's schema (the second) exists, mid-run.
    for _ in 0..600 {
        if db.i64(&count) >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(db.i64(&count) >= 2, "prove made no scratch schemas");
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let mut code = None;
    for _ in 0..1200 {
        if let Some(s) = child.try_wait().unwrap() {
            code = s.code();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if code.is_none() {
        let _ = child.kill();
    }
    assert_eq!(code, Some(1), "exit code of an interrupted prove");
    assert_eq!(db.i64(&count), 0, "scratch schemas left after SIGINT");
}

/// On `--brokers`, the scratch topics are deleted at the end (and the groups are this run's own).
#[test]
fn prove_on_brokers_deletes_its_scratch_topics() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_brk");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.t (order_id text PRIMARY KEY)",
        "INSERT INTO {s}.t SELECT order_id FROM landed ON CONFLICT DO NOTHING",
    );
    let mut o = options(&status_fixture(dir.path(), 2), 1);
    o.brokers = Some(crate::common::brokers());
    let r = prove::prove(&p, o).unwrap();
    assert_passes(&r, &[6, 7]);
    assert!(r.kept_topics.is_empty());
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", crate::common::brokers())
        .create()
        .unwrap();
    let md = c.fetch_metadata(None, Duration::from_secs(10)).unwrap();
    let left: Vec<&str> = md
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|t| t.ends_with(&format!(".prove-{}", r.run_id)))
        .collect();
    assert!(left.is_empty(), "scratch topics left: {left:?}");
}

/// A pipeline as production runs it — `manage-schema = false` and SASL in `[kafka.properties]` (left out on the
/// mock cluster) — proved twice at once against the same database: both pass on their own scratch schemas and
/// leave none.
#[test]
fn prove_twice_at_once_with_sasl_properties_and_unmanaged_schema() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_two");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.t (order_id text PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {s}.t SELECT order_id, count(*) FROM landed GROUP BY order_id ON CONFLICT (order_id) DO UPDATE SET n = t.n + EXCLUDED.n",
    );
    let text = std::fs::read_to_string(&p).unwrap().replace(
        "[postgres]\n",
        "[postgres]\nmanage-schema = false\n",
    ) + "\n[kafka.properties]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"PLAIN\"\n\"sasl.username\" = \"u\"\n\"sasl.password\" = \"p\"\n";
    std::fs::write(&p, text).unwrap();
    let fixture = status_fixture(dir.path(), 3);
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let (p, o) = (p.clone(), options(&fixture, 1));
            std::thread::spawn(move || prove::prove(&p, o))
        })
        .collect();
    let reports: Vec<Report> = runs
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    assert_ne!(reports[0].run_id, reports[1].run_id);
    for r in &reports {
        assert_passes(r, &[6, 7]);
        // 3 orders: o-0 and o-2 shipped (3 events each), o-1 not (2): the counts as the fixture says.
        assert!(
            boundary(r, 1)
                .note
                .starts_with("consumed 8 = landed 8 + duplicate 0"),
            "{}",
            r.text()
        );
    }
}

/// `--brokers` on a SASL_SSL cluster: prove's own producer, admin and offset committer take the pipeline's
/// `[kafka.properties]` security settings like its consumers; the boundaries pass and the topics are deleted.
#[test]
fn prove_on_sasl_brokers_uses_the_pipelines_security_properties() {
    let Some(dir) = std::env::var_os("KAFKA_SASL_DIR").map(PathBuf::from) else {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
        assert!(
            !ci,
            "KAFKA_SASL_DIR is not set under CI (scripts/test exports it)"
        );
        crate::common::skipped(
            "prove_on_sasl_brokers_uses_the_pipelines_security_properties",
            "KAFKA_SASL_DIR unset (no SASL_SSL listener)",
        );
        return;
    };
    let read = |n: &str| {
        std::fs::read_to_string(dir.join(n))
            .unwrap()
            .trim()
            .to_string()
    };
    let brokers = std::env::var("KAFKA_SASL_BROKERS").unwrap_or_else(|_| read("brokers"));
    let tmp = tempfile::tempdir().unwrap();
    let schema = unique("prove_sasl");
    let p = sql_pipeline(
        tmp.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.t (order_id text PRIMARY KEY)",
        "INSERT INTO {s}.t SELECT order_id FROM landed ON CONFLICT DO NOTHING",
    );
    let text = std::fs::read_to_string(&p).unwrap()
        + &format!(
            "\n[kafka.properties]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"SCRAM-SHA-512\"\n\
             \"sasl.username\" = \"{}\"\n\"sasl.password\" = \"{}\"\n\"ssl.ca.location\" = \"{}\"\n",
            read("username"),
            read("password"),
            dir.join("ca.pem").display()
        );
    std::fs::write(&p, text).unwrap();
    let mut o = options(&status_fixture(tmp.path(), 2), 1);
    o.brokers = Some(brokers);
    let r = prove::prove(&p, o).unwrap();
    assert_passes(&r, &[6, 7]);
    assert!(
        boundary(&r, 1)
            .note
            .starts_with("consumed 5 = landed 5 + duplicate 0"),
        "{}",
        r.text()
    );
    assert!(r.kept_topics.is_empty());
}

/// Issue 34: order events v1..v4 of `orders` orders, each version on another of 4 partitions ((o + v) % 4), each
/// partition newest version first — later versions arrive first across partitions: (partition, JSON payload).
fn versioned_lines(orders: usize) -> Vec<(i32, String)> {
    let steps = ["placed", "paid", "packed", "shipped"];
    let mut per: Vec<Vec<(usize, usize)>> = vec![Vec::new(); 4];
    for o in 0..orders {
        for v in 1..=4 {
            per[(o + v) % 4].push((o, v));
        }
    }
    let mut out = Vec::new();
    for (p, evs) in per.iter_mut().enumerate() {
        evs.sort_by_key(|&(o, v)| (std::cmp::Reverse(v), o));
        for &(o, v) in evs.iter() {
            let id = uuid::Uuid::from_u64_pair(340, (o * 10 + v) as u64);
            let payload = serde_json::json!({
                "event_id": id.to_string(), "order_id": format!("o-{o}"), "status": steps[v - 1],
                "version": v, "occurred_at": "2026-11-20T10:00:00Z",
            })
            .to_string();
            out.push((p as i32, payload));
        }
    }
    out
}

/// A kcat `-J` fixture of [`versioned_lines`] on `shop.orders`.
fn versioned_fixture(dir: &Path, orders: usize) -> PathBuf {
    let mut offsets = [0i64; 4];
    let lines: Vec<String> = versioned_lines(orders)
        .into_iter()
        .map(|(p, payload)| {
            let o = offsets[p as usize];
            offsets[p as usize] += 1;
            serde_json::json!({
                "topic": "shop.orders", "partition": p, "offset": o, "tstype": "create",
                "ts": 1_795_996_800_000i64 + o, "key": null, "payload": payload,
            })
            .to_string()
        })
        .collect();
    let path = dir.join("versioned.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// A row projection of orders by `version` beside a counter per (day, status) and an outbox, over `topic`.
fn counter_beside_row(dir: &Path, schema: &str, topic: &str) -> PathBuf {
    let text = format!(
        r#"
[kafka]
group-id = "orders"
topics = ["{topic}"]
start = "earliest"

[postgres]
schema = "{schema}"

[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
order_id = {{ path = "/order_id", type = "text" }}
status = {{ path = "/status", type = "text" }}
version = {{ path = "/version", type = "bigint" }}
day = {{ path = "/occurred_at", type = "date" }}

[identity]
key = ["event_id"]

[[projection]]
kind = "row"
table = "orders"
key = ["order_id"]
version = "version"
columns = ["order_id", "status", "version"]

[[projection]]
kind = "counter"
table = "status_counts"
group-by = ["day", "status"]
column = "n"

[[projection]]
kind = "outbox"
table = "outbox"
payload = ["event_id", "order_id", "status", "version"]
key = ["order_id"]
"#
    );
    let path = dir.join("versioned.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Issue 34: a counter (and an outbox) beside a row projection, versions arriving out of order across
/// partitions: every boundary passes — stale records reach the counter and the outbox, so the tables do not
/// depend on which partition's batch commits first — the batching boundary (sizes 1, 7, 5000, random cuts) and
/// the second reference into a fresh schema included.
#[test]
fn prove_passes_a_counter_beside_a_row_projection_with_versions_out_of_order() {
    let dir = tempfile::tempdir().unwrap();
    let p = counter_beside_row(dir.path(), &unique("prove_ver"), "shop.orders");
    let r = prove::prove(&p, options(&versioned_fixture(dir.path(), 12), 4)).unwrap();
    assert_passes(&r, &[6, 7]);
    assert_eq!(r.records, 48);
    // 48 events, every one claimed: landed or stale, none a duplicate.
    let b1 = &boundary(&r, 1).note;
    assert!(b1.starts_with("consumed 48 = landed "), "{}", r.text());
    assert!(b1.contains(" + duplicate 0"), "{}", r.text());
    let b10 = boundary(&r, 10);
    assert_eq!(b10.name, "batch boundaries");
    assert!(
        b10.note.starts_with(
            "batch size 1, batch size 7, batch size 5000, random cuts (chunks of 1–2, seed 42)"
        ),
        "{}",
        r.text()
    );
    assert_eq!(b10.runs, 4);
    assert_eq!(boundary(&r, 11).name, "again, into a fresh schema");
    assert_eq!(boundary(&r, 12).name, "accounting");
}

/// Issue 34 item 5: a `sql` projection that records batch sizes fails the batching boundary, naming the batch
/// size whose state differs.
#[test]
fn prove_fails_a_batch_dependent_projection_on_the_batching_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let schema = unique("prove_bat");
    let p = sql_pipeline(
        dir.path(),
        &schema,
        false,
        "CREATE TABLE IF NOT EXISTS {s}.batch_sizes (n bigint PRIMARY KEY, times int NOT NULL)",
        "INSERT INTO {s}.batch_sizes SELECT count(*), 1 FROM landed \
         ON CONFLICT (n) DO UPDATE SET times = batch_sizes.times + 1",
    );
    let r = prove::prove(&p, options(&status_fixture(dir.path(), 12), 1)).unwrap();
    assert!(!r.passed, "{}", r.text());
    let b = boundary(&r, 10);
    assert_eq!(b.result, "fail", "{}", r.text());
    assert!(b.note.starts_with("batch size "), "{}", b.note);
    assert!(b.diff.iter().any(|d| d.table == "batch_sizes"), "{b:?}");
}

/// `prove --from-topic` on the real broker (it failed on every pipeline with `Local: Unknown group`): the
/// fixture is the topic's records — all of them, from every partition, also when a partition holds fewer than
/// its share — and every boundary passes.
#[test]
fn prove_from_topic_samples_a_live_topic_on_the_real_broker() {
    use crate::common::{new_topic, produce, Rec};
    let dir = tempfile::tempdir().unwrap();
    let topic = new_topic("prove_live", 4);
    let recs: Vec<Rec> = versioned_lines(6)
        .into_iter()
        .map(|(p, payload)| Rec::json(p, "k", &payload, 1_795_996_800_000))
        .collect();
    produce(&topic, &recs);
    let p = counter_beside_row(dir.path(), &unique("prove_live"), &topic);
    let mut o = options(Path::new("unused"), 2);
    o.fixture = Fixture::Topic {
        brokers: crate::common::brokers(),
        topic: topic.clone(),
        max: 1000,
    };
    let r = prove::prove(&p, o).unwrap();
    assert_passes(&r, &[6, 7]);
    assert_eq!((r.records, r.partitions), (24, 4), "{}", r.text());
    assert!(
        boundary(&r, 1).note.starts_with("consumed 24 = landed "),
        "{}",
        r.text()
    );
    // The CLI says the same, exit 0.
    let args = [
        "prove",
        "--config",
        p.to_str().unwrap(),
        "--from-topic",
        &topic,
        "--max",
        "8",
        "--shuffles",
        "1",
        "--json",
    ];
    let brokers = crate::common::brokers();
    let out = replaysafe_with(
        &args,
        &[("KAFKA_BROKERS", &brokers)],
        Duration::from_secs(600),
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["passed"], true, "{}", out.stdout);
    // --max 8 over 4 partitions: 2 of each.
    assert_eq!(json["records"], 8, "{}", out.stdout);
}

/// A conflict (the same order and version with another status) and a record older than the ledger horizon in
/// the fixture: `prove` used to fail boundaries 3, 4, 8–11 on them although the tables were the same — the
/// conflict row's `table_name` spells the scratch schema, and the horizon's dead-letter detail said whether a
/// prune had run yet. Both are the same in every run now, and every boundary passes.
#[test]
fn prove_passes_conflicts_and_beyond_horizon_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let base = counter_beside_row(dir.path(), &unique("prove_cfl"), "shop.orders");
    let text = std::fs::read_to_string(&base).unwrap().replace(
        "key = [\"event_id\"]\n",
        "key = [\"event_id\"]\npartition-by = \"day\"\n\n[ledger]\nhorizon-days = 30\n",
    );
    let path = dir.path().join("conflicts.toml");
    std::fs::write(&path, text).unwrap();
    let today = chrono::Utc::now().date_naive();
    let mut lines = versioned_lines(6);
    for (_, payload) in &mut lines {
        *payload = payload.replace("2026-11-20", &today.to_string());
    }
    let extra = |n: u64, order: &str, status: &str, version: u64, day: chrono::NaiveDate| {
        serde_json::json!({
            "event_id": uuid::Uuid::from_u64_pair(341, n).to_string(), "order_id": order, "status": status,
            "version": version, "occurred_at": format!("{day}T10:00:00Z"),
        })
        .to_string()
    };
    // Order o-100 at version 1 twice, with two statuses, on one partition (the order every permitted delivery
    // keeps): a conflict row naming the table. Across partitions which state is stored first still depends on
    // the arrival order (docs/guarantees.md "The four answers").
    lines.push((0, extra(1, "o-100", "placed", 1, today)));
    lines.push((0, extra(3, "o-100", "cancelled", 1, today)));
    lines.push((
        3,
        extra(2, "o-2", "placed", 1, today - chrono::Days::new(400)),
    ));
    let mut offsets = [0i64; 4];
    let kcat: Vec<String> = lines
        .into_iter()
        .map(|(p, payload)| {
            let o = offsets[p as usize];
            offsets[p as usize] += 1;
            serde_json::json!({
                "topic": "shop.orders", "partition": p, "offset": o, "tstype": "create",
                "ts": chrono::Utc::now().timestamp_millis() + o, "key": null, "payload": payload,
            })
            .to_string()
        })
        .collect();
    let fixture = dir.path().join("conflicts.jsonl");
    std::fs::write(&fixture, kcat.join("\n")).unwrap();
    let r = prove::prove(&path, options(&fixture, 4)).unwrap();
    assert_passes(&r, &[6]);
    let b1 = &boundary(&r, 1).note;
    assert!(b1.contains("conflict"), "{}", r.text());
    assert!(b1.contains("quarantined 1"), "{}", r.text());
}

/// The two shapes of issue 34's follow-up in one fixture, each beside versions arriving out of order: order o-200's
/// v1 twice with the same state under two event ids (one partition: which copy is first is fixed) with its v2 on
/// another partition, and order o-201's v1 with two states on two partitions, its v2 on a third. The row
/// projection remembers what it claimed per version, so the copy is a duplicate for the row and the counter (it
/// lands for the outbox only, which gets every event id) and the two states a conflict (one row, the same
/// winner) in every order the boundaries try: every boundary passes.
#[test]
fn prove_passes_same_state_copies_and_equal_version_conflicts_across_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let p = counter_beside_row(dir.path(), &unique("prove_mem"), "shop.orders");
    let ev = |n: u64, order: &str, status: &str, version: u64| {
        serde_json::json!({
            "event_id": uuid::Uuid::from_u64_pair(342, n).to_string(), "order_id": order, "status": status,
            "version": version, "occurred_at": "2026-11-20T10:00:00Z",
        })
        .to_string()
    };
    let mut lines = versioned_lines(2);
    lines.extend([
        (1, ev(3, "o-200", "paid", 2)),
        (0, ev(1, "o-200", "placed", 1)),
        (0, ev(2, "o-200", "placed", 1)),
        (3, ev(6, "o-201", "paid", 2)),
        (1, ev(4, "o-201", "placed", 1)),
        (2, ev(5, "o-201", "cancelled", 1)),
    ]);
    let mut offsets = [0i64; 4];
    let kcat: Vec<String> = lines
        .into_iter()
        .map(|(p, payload)| {
            let o = offsets[p as usize];
            offsets[p as usize] += 1;
            serde_json::json!({
                "topic": "shop.orders", "partition": p, "offset": o, "tstype": "create",
                "ts": 1_795_996_800_000i64 + o, "key": null, "payload": payload,
            })
            .to_string()
        })
        .collect();
    let fixture = dir.path().join("memory.jsonl");
    std::fs::write(&fixture, kcat.join("\n")).unwrap();
    let r = prove::prove(&p, options(&fixture, 4)).unwrap();
    assert_passes(&r, &[6, 7]);
    assert_eq!(r.records, 14);
    let b1 = &boundary(&r, 1).note;
    assert!(b1.contains(" + duplicate 0 + "), "{}", r.text());
    assert!(b1.contains("1 conflict"), "{}", r.text());
}
