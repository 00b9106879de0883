//! Issue 35.2: no secret reaches the output. Each error path that handles a credential — a schema registry with
//! credentials in its URL (unreachable, answering 401 and 500 with the secret in its body), misspelled and
//! Java-style secret `[kafka.properties]` keys, a `${…}` inside a password, PostgreSQL URLs whose password
//! does not help, brokers given as a URL with a password — is run at log level `trace` (`REPLAYSAFE_LOG`), and
//! stdout and stderr are searched for every secret string: none may appear, nor a raw escape byte from a
//! server's answer.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use base64::Engine as _;

use crate::common::*;
use crate::registry::orders;

/// Every log line of every crate: what an operator debugging a failure would turn on.
const TRACE: (&str, &str) = ("REPLAYSAFE_LOG", "trace");

/// Runs `replaysafe args…` with `envs` (and `TRACE`), expects exit `code`, and asserts that neither stdout nor
/// stderr holds any of `secrets` or an ESC byte; returns stderr.
fn run_clean(args: &[&str], envs: &[(&str, &str)], code: i32, secrets: &[&str]) -> String {
    let mut all = vec![TRACE];
    all.extend_from_slice(envs);
    let out = replaysafe_with(args, &all, Duration::from_secs(120));
    let text = format!("{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.code, Some(code), "{args:?}: {text}");
    for s in secrets {
        assert!(
            !text.contains(s),
            "{args:?}: the secret `{s}` was printed:\n{text}"
        );
    }
    assert!(
        !text.contains('\u{1b}'),
        "{args:?}: a raw ESC byte was printed:\n{text}"
    );
    out.stderr
}

/// A one-record topic whose value is an Avro frame (schema id 1), and the ORDERS pipeline reading it through a
/// registry given by `registry` (the inside of `schema-registry = { … }`).
fn framed_pipeline(prefix: &str, registry: &str) -> (Db, Pipeline) {
    let db = Db::fresh(prefix);
    let topic = new_topic(prefix, 1);
    let rec = Rec {
        partition: 0,
        key: Some(b"k".to_vec()),
        value: Some(vec![0u8, 0, 0, 0, 1, 2, b'a']),
        timestamp_ms: None,
    };
    produce(&topic, &[rec]);
    let source = format!(
        "\n[source]\nformat = \"json\"\nencoding = \"avro\"\nschema-registry = {{ {registry} }}\n"
    );
    let p = orders(&topic, &unique("g"), &db, &source);
    (db, p)
}

/// A real HTTP server on a free loopback port answering every request with `status` and `body`, for `n`
/// requests at most (its thread ends then, or when the test process does).
fn http_server(status: &'static str, body: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(200) {
            let Ok(mut s) = stream else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(answer.as_bytes());
        }
    });
    port
}

/// Credentials in the registry URL, against a closed port: every retry warning and the final error name the
/// registry with the password masked; nothing of the record applied.
#[test]
fn a_registry_url_password_is_masked_in_every_retry_and_the_final_error() {
    let secret = "RS-SECRET-URLPW-1";
    let (db, p) = framed_pipeline(
        "secreg1",
        &format!("url = \"http://reguser:{secret}@127.0.0.1:1/apis/ccompat/v7\""),
    );
    let config = arg(&p.path);
    let args = [
        "run",
        "--config",
        config,
        "--until-caught-up",
        "--connect-timeout",
        "3",
    ];
    let stderr = run_clean(&args, &[], 1, &[secret]);
    assert!(
        stderr.contains(
            "schema registry http://reguser:***@127.0.0.1:1/apis/ccompat/v7: gave up after"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("schema registry unavailable, retrying"),
        "{stderr}"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// A registry refusing the credentials (HTTP 401) with an answer that echoes the password, the basic token and
/// terminal escapes: the refusal names the status, the answer is shown bounded and escaped, no credential.
#[test]
fn a_registry_answer_holding_the_credentials_is_not_echoed() {
    let password = "RS-SECRET-PW-2";
    let token = base64::engine::general_purpose::STANDARD.encode(format!("reguser:{password}"));
    let body = format!(
        "{{\"error_code\":40101,\"message\":\"bad password {password} (Basic {token})\u{1b}[2J\u{1b}]0;owned\u{7}\\n{}\"}}",
        "x".repeat(400)
    );
    let port = http_server("401 Unauthorized", body);
    let (db, p) = framed_pipeline(
        "secreg2",
        &format!(
            "url = \"http://127.0.0.1:{port}/apis/ccompat/v7\", username = \"reguser\", password = \"{password}\""
        ),
    );
    let config = arg(&p.path);
    let args = [
        "run",
        "--config",
        config,
        "--until-caught-up",
        "--connect-timeout",
        "5",
    ];
    let stderr = run_clean(&args, &[], 1, &[password, &token]);
    assert!(
        stderr.contains("HTTP 401 (credentials refused)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad password ***"),
        "the answer is shown, scrubbed: {stderr}"
    );
    assert!(
        !stderr.contains(&"x".repeat(300)),
        "the answer is bounded: {stderr}"
    );
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// A registry failing (HTTP 500) whose answer holds the URL's password percent-decoded: retried until
/// `--connect-timeout`, every warning and the final error without it.
#[test]
fn a_failing_registry_echoing_the_url_password_is_scrubbed() {
    let decoded = "pw@RS-SECRET-URLPW-3";
    let encoded = "pw%40RS-SECRET-URLPW-3";
    let body = format!(
        "{{\"error_code\":50001,\"message\":\"internal: user reguser password {decoded}\"}}"
    );
    let port = http_server("500 Internal Server Error", body);
    let (db, p) = framed_pipeline(
        "secreg3",
        &format!("url = \"http://reguser:{encoded}@127.0.0.1:{port}/apis/ccompat/v7\""),
    );
    let config = arg(&p.path);
    let args = [
        "run",
        "--config",
        config,
        "--until-caught-up",
        "--connect-timeout",
        "3",
    ];
    let stderr = run_clean(&args, &[], 1, &[decoded, "RS-SECRET-URLPW-3"]);
    assert!(stderr.contains("HTTP 500"), "{stderr}");
    assert!(stderr.contains("gave up after"), "{stderr}");
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters"),
        0
    );
}

/// The ORDERS pipeline with `props` as its `[kafka.properties]` (TOML lines).
fn with_properties(db: &Db, props: &str) -> Pipeline {
    let p = orders("t", "g", db, "");
    let text = std::fs::read_to_string(&p.path).expect("pipeline");
    let text = text.replacen(
        "\n[batch]",
        &format!("\n[kafka.properties]\n{props}\n[batch]"),
        1,
    );
    assert!(text.contains("[kafka.properties]"), "{text}");
    std::fs::write(&p.path, text).expect("write");
    p
}

/// A misspelled secret key (`sasl.pasword`), a Java client's (`basic.auth.user.info`) and a misspelled OAuth
/// secret are refused by name (exit 2) without their values, by every command that reads the file.
#[test]
fn misspelled_and_java_style_secret_keys_are_refused_without_their_value() {
    let db = Db::fresh("secprop");
    for (key, value, extra) in [
        ("sasl.pasword", "RS-SECRET-PROP-1", ""),
        ("basic.auth.user.info", "reguser:RS-SECRET-PROP-2", ""),
        ("sasl.oauthbearer.client.secrett", "RS-SECRET-PROP-3", ""),
        // Known and secret, refused by librdkafka when the client is built: its message is scrubbed.
        (
            "ssl.key.pem",
            "RS-SECRET-PROP-4",
            "\"security.protocol\" = \"SSL\"\n",
        ),
    ] {
        let p = with_properties(&db, &format!("{extra}\"{key}\" = \"{value}\""));
        let config = arg(&p.path);
        for args in [
            vec!["check", "--config", config],
            vec!["run", "--config", config, "--until-caught-up"],
        ] {
            let stderr = run_clean(&args, &[], 2, &[value]);
            assert!(
                stderr.contains("kafka.properties") || stderr.contains(&format!("`{key}`")),
                "{key}: {stderr}"
            );
        }
    }
}

/// A `${…}` inside a password is part of the password, perhaps: the error names neither its text nor the
/// rest of the password — in the registry's `password`, a PostgreSQL URL and a secret librdkafka property; nor
/// does the type error of a password written as a number.
#[test]
fn a_reference_inside_a_password_is_not_echoed() {
    let db = Db::fresh("secbrace");
    let (_, reg) = framed_pipeline(
        "secbrace_r",
        "url = \"http://127.0.0.1:1\", username = \"u\", password = \"RS-a${RS_SECRET_BRACE_1}b\"",
    );
    let pg = orders("t", "g", &db, "");
    let text = std::fs::read_to_string(&pg.path).expect("pipeline");
    let url = "postgresql://postgres:RS-c${RS-SECRET-BRACE-2}d@localhost:5432/postgres";
    let text = text.replacen("[postgres]\n", &format!("[postgres]\nurl = \"{url}\"\n"), 1);
    std::fs::write(&pg.path, text).expect("write");
    let prop = with_properties(&db, "\"sasl.password\" = \"RS-e${RS_SECRET_BRACE_3}f\"");
    // A password written as a TOML number is refused by its type, not quoted.
    let (_, number) = framed_pipeline(
        "secbrace_n",
        "url = \"http://127.0.0.1:1\", username = \"u\", password = 918273645",
    );
    for (p, secrets, says) in [
        (&reg, ["RS_SECRET_BRACE_1", "RS-a"], "secret value"),
        (&pg, ["RS-SECRET-BRACE-2", "RS-c"], "secret value"),
        (&prop, ["RS_SECRET_BRACE_3", "RS-e"], "secret value"),
        (
            &number,
            ["918273645", "918273645"],
            "invalid type: integer, expected a string",
        ),
    ] {
        let config = arg(&p.path);
        let stderr = run_clean(&["check", "--config", config], &[], 2, &secrets);
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// PostgreSQL URLs whose password cannot help — a closed port, a database that does not exist, the password as
/// a query parameter, a URL that does not parse — in `DATABASE_URL` and in `[postgres] url`, for `run` and
/// `check --database`.
#[test]
fn postgres_passwords_never_reach_the_output() {
    let db = Db::fresh("secpg");
    let p = orders("t", "g", &db, "");
    let config = arg(&p.path);
    for (url, secret) in [
        ("postgresql://postgres:RS-SECRET-PG-1@127.0.0.1:1/postgres?sslmode=disable", "RS-SECRET-PG-1"),
        ("postgresql://postgres:RS-SECRET-PG-2@localhost:5432/rs_no_such_db?sslmode=disable", "RS-SECRET-PG-2"),
        ("postgresql://localhost:5432/rs_no_such_db?user=postgres&password=RS-SECRET-PG-3&sslmode=disable", "RS-SECRET-PG-3"),
        ("postgresq://postgres:RS-SECRET-PG-4@localhost/postgres", "RS-SECRET-PG-4"),
    ] {
        let env = [("DATABASE_URL", url)];
        for args in [
            vec!["run", "--config", config, "--until-caught-up", "--connect-timeout", "2"],
            vec!["check", "--config", config, "--database", "--connect-timeout", "2"],
        ] {
            let out = replaysafe_with(&args, &[TRACE, env[0]], Duration::from_secs(120));
            let text = format!("{}\n{}", out.stdout, out.stderr);
            assert!(matches!(out.code, Some(1 | 2)), "{url}: {text}");
            assert!(!text.contains(secret), "{url}: the password was printed:\n{text}");
        }
    }
}

/// Brokers given as URLs with a password (`sasl_ssl://user:password@host:port`): the connection error and
/// librdkafka's own log lines name the broker with the password masked.
#[test]
fn a_broker_url_password_is_masked() {
    let db = Db::fresh("seckafka");
    let p = orders(&new_topic("seckafka", 1), "g", &db, "");
    let config = arg(&p.path);
    let brokers = "sasl_ssl://kuser:RS-SECRET-KAFKA-1@127.0.0.1:1";
    for args in [
        vec![
            "run",
            "--config",
            config,
            "--until-caught-up",
            "--connect-timeout",
            "3",
            "--brokers",
            brokers,
        ],
        vec![
            "check",
            "--config",
            config,
            "--connect",
            "--connect-timeout",
            "3",
            "--brokers",
            brokers,
        ],
    ] {
        let out = replaysafe_with(&args, &[TRACE], Duration::from_secs(120));
        let text = format!("{}\n{}", out.stdout, out.stderr);
        assert_eq!(out.code, Some(1), "{text}");
        assert!(
            !text.contains("RS-SECRET-KAFKA-1"),
            "the password was printed:\n{text}"
        );
    }
}

const SECRET: &str = "S3crXt-b11";

pub const PIPE: &str = r#"[kafka]
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
