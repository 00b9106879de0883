//! Kafka over SASL_SSL (issue 11): `run`, `offsets snapshot`, `backfill` and `check --connect` through the test
//! broker's SASL_SSL listener (SCRAM-SHA-512 over TLS with a self-signed CA), configured only with
//! `[kafka.properties]` as librdkafka spells them; a wrong password and a wrong CA are named, not retried.
//!
//! The listener is the one `scripts/kafka-start` adds to the broker of `KAFKA_BROKERS` (the tests produce over
//! PLAINTEXT and replaysafe reads over SASL_SSL, from the same broker). `scripts/test` exports its directory
//! `KAFKA_SASL_DIR` (`brokers`, `ca.pem`, `username`, `password`) and `KAFKA_SASL_BROKERS`. Without them the
//! tests are skipped with a message — except under `CI`, where they fail (`.ci/run` must run them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use crate::core::{counts, seed_events, SEED};

/// The SASL_SSL listener of the test broker.
struct Sasl {
    brokers: String,
    ca: PathBuf,
    username: String,
    password: String,
}

/// The listener from `KAFKA_SASL_DIR` (`KAFKA_SASL_BROKERS` wins over its `brokers` file); `None` (skipped, with
/// a message) when it is not configured outside CI.
fn sasl(test: &str) -> Option<Sasl> {
    let Some(dir) = std::env::var_os("KAFKA_SASL_DIR").map(PathBuf::from) else {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
        assert!(
            !ci,
            "{test}: KAFKA_SASL_DIR is not set under CI: scripts/test exports it from scripts/kafka-start's \
             SASL_SSL listener (KAFKA_SASL=off disables it)"
        );
        skipped(
            test,
            "no SASL_SSL listener configured (KAFKA_SASL_DIR unset; run through scripts/test, or export \
             KAFKA_SASL_DIR=<kafka-start state dir>/sasl of the broker in KAFKA_BROKERS)",
        );
        return None;
    };
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
            .trim()
            .to_string()
    };
    Some(Sasl {
        brokers: std::env::var("KAFKA_SASL_BROKERS").unwrap_or_else(|_| read("brokers")),
        ca: dir.join("ca.pem"),
        username: read("username"),
        password: read("password"),
    })
}

impl Sasl {
    /// `text` (with the `header!()` `[kafka]` table) reading from the SASL_SSL listener with `password` and the
    /// CA file `ca`: `[kafka] brokers` and the five librdkafka properties, nothing else.
    fn pipeline_text(&self, text: &str, password: &str, ca: &Path) -> String {
        let props = format!(
            "start = \"earliest\"\nbrokers = \"{}\"\n[kafka.properties]\n\"security.protocol\" = \"SASL_SSL\"\n\
             \"sasl.mechanism\" = \"SCRAM-SHA-512\"\n\"sasl.username\" = \"{}\"\n\"sasl.password\" = \"{password}\"\n\
             \"ssl.ca.location\" = \"{}\"\n",
            self.brokers,
            self.username,
            ca.display()
        );
        assert!(
            text.contains("start = \"earliest\"\n"),
            "a header!() pipeline"
        );
        text.replacen("start = \"earliest\"\n", &props, 1)
    }
}

/// The checkpoint of every partition is its end (last produced offset + 1), in PostgreSQL and in Kafka.
fn assert_at_end(
    db: &Db,
    group: &str,
    topic: &str,
    offsets: &[i64],
    recs: &[Rec],
    partitions: i32,
) {
    let committed = committed(group, topic, partitions);
    for p in 0..partitions {
        let end = recs
            .iter()
            .zip(offsets)
            .filter(|(r, _)| r.partition == p)
            .map(|(_, o)| o + 1)
            .max();
        assert_eq!(
            db.checkpoint(group, topic, p),
            end,
            "checkpoint of {topic}/{p}"
        );
        assert_eq!(
            committed[p as usize], end,
            "Kafka committed offset of {topic}/{p}"
        );
    }
}

#[test]
fn run_lands_everything_through_sasl_ssl() {
    let Some(s) = sasl("run_lands_everything_through_sasl_ssl") else {
        return;
    };
    let (db, topic) = stage("sasl_run", 3);
    let (recs, truth) = seed_events(600, 3);
    let offsets = produce(&topic, &recs);
    let group = unique("sasl");
    let text = s.pipeline_text(SEED, &s.password, &s.ca);
    let p = pipeline(&text, &topic, &group, &db.schema);
    let out = run_caught_up(&p.path);
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate),
        (600, 600, 0),
        "{out:?}"
    );
    assert_eq!(counts(&db), truth, "projection rows");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);
    assert_at_end(&db, &group, &topic, &offsets, &recs, 3);
    // The password is in the pipeline file only: never in what replaysafe printed.
    output_without(&out, &s.password);
    // check --connect through SASL_SSL: how it connects, the topic found, no password.
    let check = replaysafe(&["check", "--config", arg(&p.path), "--connect"]);
    check.assert_ok();
    let line = format!(
        "broker {} (SASL_SSL, SCRAM-SHA-512 as `{}`, CA {}):\ncluster id ",
        s.brokers,
        s.username,
        s.ca.display()
    );
    assert!(check.stdout.contains(&line), "{check:?}");
    let found = format!("\nok      topic {topic} (topic id ");
    assert!(check.stdout.contains(&found), "{check:?}");
    output_without(&check, &s.password);
    // A second run through SASL_SSL reads nothing again.
    let again = run_caught_up(&p.path).tally();
    assert_eq!((again.consumed, again.landed), (0, 0));
}

#[test]
fn offsets_snapshot_and_backfill_through_sasl_ssl() {
    let Some(s) = sasl("offsets_snapshot_and_backfill_through_sasl_ssl") else {
        return;
    };
    let (db, topic) = stage("sasl_bf", 3);
    let (recs, truth) = seed_events(600, 3);
    let offsets = produce(&topic, &recs);
    let prod = unique("prod");
    // Production dropped the refunds by mistake (a filter); the fix comes with a backfill.
    let buggy = SEED.replace(
        "[identity]",
        "[[filter]]\nname = \"no-refunds\"\ndrop-if = \"amount < 0.0\"\n\n[identity]",
    );
    let p_buggy = pipeline(
        &s.pipeline_text(&buggy, &s.password, &s.ca),
        &topic,
        &prod,
        &db.schema,
    );
    let t = run_caught_up(&p_buggy.path).tally();
    assert!(t.filtered > 0 && t.landed + t.filtered == 600, "{t:?}");
    let p = pipeline(
        &s.pipeline_text(SEED, &s.password, &s.ca),
        &topic,
        &prod,
        &db.schema,
    );
    let dir = p.dir.path();
    // offsets snapshot through SASL_SSL: the production group's positions, every partition at its end.
    let stop = dir.join("stop.json");
    offsets_snapshot(&p, &prod, &stop).assert_ok();
    let snap: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stop).unwrap()).unwrap();
    let next: BTreeMap<i64, i64> = snap["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["partition"].as_i64().unwrap(),
                e["next_offset"].as_i64().unwrap(),
            )
        })
        .collect();
    for part in 0..3 {
        assert_eq!(
            Some(next[&(part as i64)]),
            db.checkpoint(&prod, &topic, part),
            "snapshot of partition {part}: {snap}"
        );
    }
    // backfill through SASL_SSL up to a time (its plan, the retention check's admin client, the scan past the
    // stop): lands exactly the refunds the bug dropped.
    let report = dir.join("report.json");
    let bf = unique("bf");
    let out = backfill(
        &p,
        "2024-04-25",
        ("--to", "2024-05-01"),
        &bf,
        &["-o", arg(&report)],
    );
    out.assert_ok();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let accounting = r["accounting"].as_str().unwrap_or_default();
    let expected = format!(
        "consumed 600 = landed {} + duplicate {} + filtered 0 + quarantined 0",
        t.filtered, t.landed
    );
    assert!(accounting.starts_with(&expected), "{accounting}\n{out:?}");
    let notes = r["retention"].to_string();
    assert!(
        !notes.contains("failed"),
        "every side client connected: {notes}"
    );
    assert_eq!(counts(&db), truth, "projection rows after the backfill");
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);
    for part in 0..3 {
        let end = recs
            .iter()
            .zip(&offsets)
            .filter(|(r, _)| r.partition == part)
            .map(|(_, o)| o + 1)
            .max();
        assert_eq!(
            db.checkpoint(&bf, &topic, part),
            end,
            "backfill checkpoint of {part}"
        );
    }
    assert!(!out.stdout.contains(&s.password) && !out.stderr.contains(&s.password));
}

/// How many tables the test's schema holds.
fn tables(db: &Db) -> i64 {
    db.query(
        "SELECT count(*) FROM pg_tables WHERE schemaname = $1",
        &[&db.schema],
    )[0]
    .get(0)
}

/// The command's output (stdout and stderr), which must never hold `secret`.
fn output_without(out: &Out, secret: &str) -> String {
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(
        !all.contains(secret),
        "the password leaked into the output:\n{all}"
    );
    all
}

#[test]
fn a_wrong_password_is_an_authentication_error_at_once_and_never_printed() {
    let Some(s) = sasl("a_wrong_password_is_an_authentication_error_at_once_and_never_printed")
    else {
        return;
    };
    let (db, topic) = stage("sasl_pw", 2);
    produce(&topic, &seed_events(20, 2).0);
    let wrong = "Wr0ng-hunter2-pw";
    let text = s.pipeline_text(SEED, wrong, &s.ca);
    let p = pipeline(&text, &topic, &unique("sasl"), &db.schema);
    // Authentication is not retried: with --connect-timeout 600 a retried failure would outlast the limit.
    let long = Duration::from_secs(120);
    let cfg = arg(&p.path);
    let run = replaysafe_with(
        &[
            "run",
            "--config",
            cfg,
            "--until-caught-up",
            "--connect-timeout",
            "600",
        ],
        &[],
        long,
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    let all = output_without(&run, wrong);
    assert!(
        all.contains(&format!(
            "cannot connect to the Kafka brokers {}",
            s.brokers
        )) && all.contains("authentication failed")
            && all.contains("SCRAM-SHA-512"),
        "{all}"
    );
    assert_eq!(
        tables(&db),
        0,
        "refused before the database: no table created"
    );
    for args in [
        vec![
            "check",
            "--config",
            cfg,
            "--connect",
            "--connect-timeout",
            "600",
        ],
        vec![
            "offsets",
            "snapshot",
            "--config",
            cfg,
            "--group",
            "g",
            "--connect-timeout",
            "600",
        ],
    ] {
        let out = replaysafe_with(&args, &[], long);
        assert_ne!(out.code, Some(0), "{args:?}: {out:?}");
        let all = output_without(&out, wrong);
        assert!(all.contains("authentication failed"), "{args:?}: {all}");
    }
}

#[test]
fn a_wrong_ca_is_named_as_a_tls_error() {
    let Some(s) = sasl("a_wrong_ca_is_named_as_a_tls_error") else {
        return;
    };
    let (db, topic) = stage("sasl_ca", 1);
    produce(&topic, &seed_events(10, 1).0);
    // Another self-signed CA: the broker's certificate does not chain to it.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=not the test CA",
        ])
        .arg("-keyout")
        .arg(dir.path().join("other-ca.key"))
        .arg("-out")
        .arg(&other)
        .output()
        .expect("openssl (scripts/kafka-start needs it too)");
    assert!(made.status.success(), "{made:?}");
    let text = s.pipeline_text(SEED, &s.password, &other);
    let p = pipeline(&text, &topic, &unique("sasl"), &db.schema);
    let run = replaysafe_with(
        &[
            "run",
            "--config",
            arg(&p.path),
            "--until-caught-up",
            "--connect-timeout",
            "600",
        ],
        &[],
        Duration::from_secs(120),
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    let all = output_without(&run, &s.password);
    assert!(
        all.contains("TLS handshake failed")
            && all.contains("certificate")
            && all.contains("ssl.ca.location")
            && !all.contains("authentication failed"),
        "{all}"
    );
    assert_eq!(
        tables(&db),
        0,
        "refused before the database: no table created"
    );
}

/// Writes a kcat `-J` file of `recs`, each partition's records at offsets from 0 (a dump of a topic that
/// held nothing else).
fn dump(path: &Path, topic: &str, recs: &[Rec]) {
    let mut next = BTreeMap::new();
    let lines: Vec<String> = recs
        .iter()
        .map(|r| {
            let o = next.entry(r.partition).or_insert(0i64);
            *o += 1;
            crate::file_source::kcat_line(topic, r.partition, *o - 1, r)
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn load_checks_the_live_end_through_sasl_ssl() {
    let Some(s) = sasl("load_checks_the_live_end_through_sasl_ssl") else {
        return;
    };
    let (db, topic) = stage("sasl_load", 3);
    let (live, truth) = seed_events(30, 3);
    produce(&topic, &live);
    let group = unique("prod");
    let p = pipeline(
        &s.pipeline_text(SEED, &s.password, &s.ca),
        &topic,
        &group,
        &db.schema,
    );
    let load =
        |file: &Path| replaysafe(&["load", "--config", arg(&p.path), "--take-over", arg(file)]);
    // A dump reaching past the live end (15 records per partition, the topic holds 10): the broker, asked
    // through SASL_SSL, says where each partition ends; nothing applied.
    let foreign = p.dir.path().join("foreign.jsonl");
    dump(&foreign, &topic, &seed_events(45, 3).0);
    let out = load(&foreign);
    assert_eq!(out.code, Some(2), "{out:?}");
    for part in 0..3 {
        let says =
            format!("{topic}/{part}: offsets 0 to 14 in the file, the live partition ends at 10");
        assert!(out.stderr.contains(&says), "{says}\n{}", out.stderr);
    }
    assert_eq!(tables(&db), 0, "refused before anything was created");
    // The live topic's dump: checked against the end through SASL_SSL, applied under the pipeline's group.
    let file = p.dir.path().join("live.jsonl");
    dump(&file, &topic, &live);
    let out = load(&file);
    out.assert_ok();
    let t = out.tally();
    assert_eq!((t.consumed, t.landed), (30, 30), "{out:?}");
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 30);
    for part in 0..3 {
        assert_eq!(db.checkpoint(&group, &topic, part), Some(10));
    }
    output_without(&out, &s.password);
}

/// The outbox relay through the SASL_SSL listener, configured by the same `[kafka.properties]`: every row
/// published once (read back over PLAINTEXT), marked, the password never printed.
#[test]
fn outbox_relay_publishes_through_sasl_ssl() {
    let Some(s) = sasl("outbox_relay_publishes_through_sasl_ssl") else {
        return;
    };
    let (db, topic) = stage("sasl_relay", 2);
    let out = unique("sasl_relay_out");
    create_topic(&out, 2, &[]);
    let recs: Vec<Rec> = (0..40)
        .map(|i| {
            let v = format!(r#"{{"id":"r-{i}","k":"k-{}"}}"#, i % 4);
            Rec::json(i % 2, &format!("k-{}", i % 4), &v, 1_782_000_000_000)
        })
        .collect();
    produce(&topic, &recs);
    let text = format!(
        "{}[fields]\nid = {{ path = \"/id\", type = \"text\" }}\nk = {{ path = \"/k\", type = \"text\" }}\n\
         [identity]\nkey = [\"id\"]\n[[projection]]\nkind = \"outbox\"\ntable = \"outbox\"\nkey = [\"k\"]\n\
         [outbox]\ntopic = \"{out}\"\n",
        header!()
    );
    let p = pipeline(
        &s.pipeline_text(&text, &s.password, &s.ca),
        &topic,
        &unique("g"),
        &db.schema,
    );
    run_caught_up(&p.path);
    let relay = replaysafe(&["outbox", "relay", "--config", arg(&p.path), "--until-empty"]);
    relay.assert_ok();
    output_without(&relay, &s.password);
    let msgs = crate::relay::read_topic(&out);
    assert_eq!(msgs.len(), 40);
    let headers: std::collections::BTreeSet<_> =
        msgs.iter().filter_map(|m| m.delivery.clone()).collect();
    assert_eq!(headers.len(), 40);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.outbox WHERE published_at IS NOT NULL"),
        40
    );
}

/// Issue 35.5: a SASL_SSL client pointed at the PLAINTEXT listener (and a PLAINTEXT client with `sasl.*` set
/// pointed at the SASL_SSL one) is a protocol mismatch, named as such at once — not "authentication failed".
#[test]
fn a_protocol_that_does_not_match_the_listener_is_named() {
    let Some(s) = sasl("a_protocol_that_does_not_match_the_listener_is_named") else {
        return;
    };
    let (db, topic) = stage("sasl_proto", 1);
    let on_plain = s.pipeline_text(SEED, &s.password, &s.ca).replace(
        &format!("brokers = \"{}\"", s.brokers),
        &format!("brokers = \"{}\"", brokers()),
    );
    let plain_on_tls = s.pipeline_text(SEED, &s.password, &s.ca).replace(
        "\"security.protocol\" = \"SASL_SSL\"",
        "\"security.protocol\" = \"PLAINTEXT\"",
    );
    for text in [on_plain, plain_on_tls] {
        let p = pipeline(&text, &topic, &unique("sasl"), &db.schema);
        let out = replaysafe_with(
            &[
                "check",
                "--config",
                arg(&p.path),
                "--connect",
                "--connect-timeout",
                "600",
            ],
            &[],
            Duration::from_secs(120),
        );
        assert_ne!(out.code, Some(0), "{out:?}");
        let all = output_without(&out, &s.password);
        assert!(
            all.contains("security.protocol does not match the broker's listener")
                && !all.contains("authentication failed"),
            "{all}"
        );
    }
    assert_eq!(tables(&db), 0);
}

/// Runs one of the broker's Java tools (`org.apache.kafka.tools.ConfigCommand` …) from the lib folder beside
/// `KAFKA_SASL_DIR` (the broker's state directory), over the PLAINTEXT listener; panics with its output on failure.
fn kafka_tool(class: &str, args: &[&str]) {
    let dir = PathBuf::from(std::env::var("KAFKA_SASL_DIR").expect("KAFKA_SASL_DIR"));
    let state = dir.parent().expect("state dir");
    let out = std::process::Command::new("java")
        .args(["-Xmx256m", "-XX:TieredStopAtLevel=1"])
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            state.join("tools-log4j2.properties").display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", state.join("lib").display()))
        .arg(class)
        .args(["--bootstrap-server", &brokers()])
        .args(args)
        .output()
        .expect("java");
    assert!(
        out.status.success(),
        "{class} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Cuts the TCP connections process `pid` holds to local port `port` (`ss -K`, iproute2; needs root, as the
/// tests run under CI): the client sees its broker connections closed and reconnects.
fn cut_connections(pid: u32, port: &str) {
    let list = std::process::Command::new("ss")
        .args([
            "-tnpH",
            "dst",
            "127.0.0.1",
            "dport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .expect("ss (iproute2)");
    let text = String::from_utf8_lossy(&list.stdout);
    let mine: Vec<String> = text
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(3)?
                .rsplit(':')
                .next()
                .map(str::to_string)
        })
        .collect();
    assert!(
        !mine.is_empty(),
        "no connection of {pid} to :{port}:\n{text}"
    );
    for local in mine {
        let out = std::process::Command::new("ss")
            .args(["-K", "src", "127.0.0.1", "sport", "=", &format!(":{local}")])
            .output()
            .expect("ss -K");
        assert!(
            out.status.success(),
            "ss -K: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Issue 35.5: credentials refused while running (the user's password rotated under a running worker) are
/// bounded like a member stuck outside its group — the worker exits 1 within `max.poll.interval.ms +
/// session.timeout.ms` naming the refusal, instead of retrying for good — and the passwords are never printed;
/// what it applied before stays.
#[test]
fn credentials_refused_while_running_end_the_run_within_the_bound() {
    let Some(s) = sasl("credentials_refused_while_running_end_the_run_within_the_bound") else {
        return;
    };
    const CONFIG: &str = "org.apache.kafka.tools.ConfigCommand";
    let user = unique("rot").to_lowercase();
    let (old, new) = ("Rot-0ld-hunter2-pw", "Rot-N3w-hunter2-pw");
    let scram = |pw: &str| format!("SCRAM-SHA-512=[iterations=4096,password={pw}]");
    let alter_user = |cfg: &str| {
        kafka_tool(
            CONFIG,
            &[
                "--entity-type",
                "users",
                "--entity-name",
                &user,
                "--alter",
                "--add-config",
                cfg,
            ],
        )
    };
    alter_user(&scram(old));
    let (db, topic) = stage("sasl_rot", 2);
    let (recs, truth) = seed_events(40, 2);
    produce(&topic, &recs);
    let mine = Sasl {
        brokers: s.brokers.clone(),
        ca: s.ca.clone(),
        username: user.clone(),
        password: old.to_string(),
    };
    let text = mine.pipeline_text(SEED, old, &mine.ca).replacen(
        "[kafka.properties]\n",
        "[kafka.properties]\n\"statistics.interval.ms\" = \"1000\"\n\"session.timeout.ms\" = \"6000\"\n\
         \"max.poll.interval.ms\" = \"10000\"\n",
        1,
    );
    let group = unique("sasl");
    let p = pipeline(&text, &topic, &group, &db.schema);
    let mut child = spawn_run(&p, &[], "run");
    wait_until(Duration::from_secs(60), "the seed events applied", || {
        db.i64("SELECT (to_regclass('{s}.daily_counts') IS NOT NULL)::int::bigint") == 1
            && counts(&db) == truth
    });
    alter_user(&scram(new));
    // The worker's connections to the SASL_SSL listener cut (as a broker restart or a network blip would):
    // it reconnects, and the broker refuses the old password.
    let port = s.brokers.rsplit(':').next().unwrap().to_string();
    cut_connections(child.id(), &port);
    let started = std::time::Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let err = std::fs::read_to_string(p.dir.path().join("run.err")).unwrap_or_default();
            let tail: String = err
                .chars()
                .rev()
                .take(6000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            panic!("the worker still runs 60 s after its password changed:\n{tail}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    kafka_tool(
        CONFIG,
        &[
            "--entity-type",
            "users",
            "--entity-name",
            &user,
            "--alter",
            "--delete-config",
            "SCRAM-SHA-512",
        ],
    );
    let err = std::fs::read_to_string(p.dir.path().join("run.err")).unwrap();
    let out = std::fs::read_to_string(p.dir.path().join("run.out")).unwrap();
    let all = format!("{out}\n{err}");
    assert!(
        !all.contains(old) && !all.contains(new),
        "a password leaked:\n{all}"
    );
    assert_eq!(code, Some(1), "{all}");
    assert!(all.contains("refused this client's credentials"), "{all}");
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 40);
}
