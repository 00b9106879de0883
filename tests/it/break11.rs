//! Adversarial checks of the issue-11 work (connectivity and secrets): malformed database URLs whose password
//! would spill into the messages replaysafe prints. Each drives the real binary; nothing may be created.

use std::time::Duration;

use crate::common::*;

const SECRET: &str = "S3crXt-b11";

const PIPE: &str = r#"[kafka]
group-id = "{group}"
topics = ["{topic}"]
start = "earliest"
[postgres]
schema = "{schema}"
[fields]
event_id = { path = "/event_id", type = "text" }
day = { path = "/day", type = "date" }
[identity]
key = ["event_id"]
partition-by = "day"
[ledger]
horizon-days = 30
[[projection]]
kind = "counter"
table = "per_day"
group-by = ["day"]
column = "n"
"#;

fn tables(db: &Db) -> i64 {
    db.i64(&format!(
        "SELECT count(*) FROM pg_tables WHERE schemaname = '{}'",
        db.schema
    ))
}

/// `check` and `run` with `DATABASE_URL = url`: both refused (exit 2), the secret in no output, no table made.
fn refused_without_the_secret(url: &str, db: &Db, topic: &str, says: &str) {
    let p = pipeline(PIPE, topic, &unique("g"), &db.schema);
    let env = [("DATABASE_URL", url), ("REPLAYSAFE_LOG", "trace")];
    for args in [
        vec!["check", "--config", arg(&p.path)],
        vec![
            "run",
            "--config",
            arg(&p.path),
            "--until-caught-up",
            // The broker check comes first and must pass within it on a loaded machine.
            "--connect-timeout",
            "10",
        ],
    ] {
        let out = replaysafe_with(&args, &env, Duration::from_secs(60));
        let all = format!("{}\n{}", out.stdout, out.stderr);
        assert!(!all.contains(SECRET), "{args:?} shows the password:\n{all}");
        assert_eq!(out.code, Some(2), "{args:?}:\n{all}");
        assert!(out.stderr.contains(says), "{args:?}:\n{all}");
    }
    assert_eq!(tables(db), 0);
}

/// A raw `@` in a URL password: tokio-postgres ends the credentials at the first `@`, so the password's tail
/// became the host (`check` printed `postgres S3crXt-b11@localhost:5432 …`, connection errors the address).
#[test]
fn a_raw_at_sign_in_a_url_password_is_refused_without_showing_it() {
    let (db, topic) = stage("b11_at", 1);
    for url in [
        format!("postgresql://u:ab@{SECRET}@localhost:1/postgres?sslmode=disable"),
        format!("postgresql://u:ab@c:/x{SECRET}@localhost:1/postgres"),
    ] {
        refused_without_the_secret(&url, &db, &topic, "percent-encode `@`");
    }
}

/// An unquoted space in a key/value password: the word after it was named in the parse error.
#[test]
fn an_unquoted_space_in_a_key_value_password_is_refused_without_showing_it() {
    let (db, topic) = stage("b11_kv", 1);
    let url = format!("host=localhost port=1 user=u password=ab {SECRET} sslmode=disable");
    refused_without_the_secret(&url, &db, &topic, "single-quote a value");
}

/// A mistyped scheme makes the whole URL one key/value word, which the parse errors named.
#[test]
fn a_mistyped_url_scheme_is_refused_without_showing_the_url() {
    let (db, topic) = stage("b11_scheme", 1);
    for (url, says) in [
        (
            format!("postgresq://u:{SECRET}@localhost/postgres"),
            "the first word",
        ),
        (
            format!("postgres:/u:{SECRET}@localhost/db?a='x"),
            "no closing quote",
        ),
        (
            format!("postgre://u:{SECRET}@localhost/db?a=b c"),
            "not followed by `=`",
        ),
    ] {
        refused_without_the_secret(&url, &db, &topic, says);
    }
}

/// libpq checks only the group and other bits of a client key: an owner-executable key (0700, e.g. copied from a
/// secrets volume) was refused as "readable by others"; a group-writable one stays refused.
#[test]
fn a_client_key_is_judged_by_its_group_and_other_bits_only() {
    let kit = std::path::PathBuf::from(
        std::env::var("PGSSL_TEST_DIR")
            .unwrap_or_else(|_| "/var/lib/postgresql/replaysafe-tls".into()),
    );
    let db = Db::fresh("b11_key");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client.key");
    std::fs::copy(kit.join("client.key"), &key).unwrap();
    let url = format!(
        "postgresql://replaysafe_cert@localhost:5432/postgres?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        kit.join("ca.crt").display(),
        kit.join("client.crt").display(),
        key.display()
    );
    let p = pipeline(PIPE, "t", "g", &db.schema);
    let check = |mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        let env = [("DATABASE_URL", url.as_str())];
        replaysafe_with(
            &["check", "--config", arg(&p.path)],
            &env,
            Duration::from_secs(60),
        )
    };
    let out = check(0o700);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains(&format!(
            "client certificate {}",
            kit.join("client.crt").display()
        )),
        "{}",
        out.stdout
    );
    for mode in [0o660, 0o604] {
        let out = check(mode);
        assert_eq!(out.code, Some(2), "{mode:o}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!("permissions {mode:04o}")),
            "{}",
            out.stderr
        );
    }
    assert_eq!(tables(&db), 0);
}

/// A raw `?` in a URL password split the query off inside the password: `sslmode=require` was not taken out
/// and `check` said `sslmode=prefer` (a silent downgrade: the password could go to a server without TLS).
#[test]
fn a_raw_question_mark_in_a_url_password_does_not_drop_sslmode() {
    let (db, topic) = stage("b11_qm", 1);
    let url = format!("postgresql://u:ab?{SECRET}@localhost:1/postgres?sslmode=require");
    refused_without_the_secret(&url, &db, &topic, "percent-encode `?`");
}

/// kcat lines with both `payload_error` and `key_error`, or `key_error` alone: every error kcat reported is in
/// the dead letter under the member's own name (the detail said `value_error`, a member kcat never writes, and
/// dropped the key's error when both were set).
#[test]
fn kcat_payload_and_key_errors_are_all_kept_under_their_names() {
    let db = Db::fresh("b11_kcat");
    // Never created: the load is not checked against a live end.
    let topic = unique("b11.kcat");
    let p = pipeline(PIPE, &topic, &unique("g"), &db.schema);
    let ev = r#""{\"event_id\":\"e1\",\"day\":\"2026-11-29\"}""#;
    let file = p.dir.path().join("dump.jsonl");
    std::fs::write(
        &file,
        format!(
            "{{\"topic\":\"{topic}\",\"partition\":0,\"offset\":0,\"key\":null,\"payload\":null,\
             \"payload_error\":\"val err\",\"key_error\":\"key err\"}}\n\
             {{\"topic\":\"{topic}\",\"partition\":0,\"offset\":1,\"key\":\"k\",\"payload\":{ev},\
             \"key_error\":\"bad key\"}}\n\
             {{\"topic\":\"{topic}\",\"partition\":0,\"offset\":2,\"key\":\"k\",\"payload\":{ev},\
             \"payload_error\":null,\"key_error\":null}}\n"
        ),
    )
    .unwrap();
    let out = replaysafe(&["load", "--config", arg(&p.path), arg(&file)]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.quarantined),
        (3, 1, 2),
        "{}",
        out.stdout
    );
    let dl = db.query(
        "SELECT \"offset\", reason, detail FROM {s}.replaysafe_dead_letters ORDER BY 1",
        &[],
    );
    let dl: Vec<(i64, String, String)> =
        dl.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(dl.len(), 2, "{dl:?}");
    assert!(dl.iter().all(|d| d.1 == "undecodable-value"), "{dl:?}");
    assert!(
        dl[0]
            .2
            .contains("kcat's payload_error in the dump): val err")
            && dl[0].2.contains("kcat's key_error in the dump): key err"),
        "{dl:?}"
    );
    assert!(
        dl[1].2.contains("kcat's key_error in the dump): bad key"),
        "{dl:?}"
    );
    assert!(!dl.iter().any(|d| d.2.contains("value_error")), "{dl:?}");
    assert_eq!(db.i64("SELECT n FROM {s}.per_day"), 1);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 1);
}
