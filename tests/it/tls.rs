//! PostgreSQL over TLS and secrets (issue 11), against the local cluster configured by `scripts/pg-setup`'s TLS
//! test kit (`PGSSL_TEST_DIR`, default /var/lib/postgresql/replaysafe-tls): a test CA, a server certificate for
//! `localhost` only, the role `replaysafe_cert` that logs in with its client certificate only (`hostssl … cert`,
//! `hostnossl … reject`), the role `replaysafe_pw` with password authentication (`replaysafe-pw-test`). A
//! private cluster with `ssl = off` (initdb in a temp dir) plays the server without TLS.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// The TLS test kit's directory; panics telling how to make it.
fn kit() -> PathBuf {
    let dir = PathBuf::from(
        std::env::var("PGSSL_TEST_DIR")
            .unwrap_or_else(|_| "/var/lib/postgresql/replaysafe-tls".into()),
    );
    assert!(
        dir.join("ca.crt").is_file() && dir.join("client.key").is_file(),
        "no TLS test kit in {} (run scripts/pg-setup)",
        dir.display()
    );
    dir
}

fn file(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

const PW: &str = "replaysafe-pw-test";

/// One counter per customer; `{conn}` is replaced by the test's `[postgres]` connection keys.
const PIPE: &str = r#"[kafka]
group-id = "{group}"
topics = ["{topic}"]
start = "earliest"
[postgres]
schema = "{schema}"
{conn}
[batch]
max-records = 10
linger-ms = 20

[fields]
event_id = { path = "/event_id", type = "text" }
customer_id = { path = "/customer_id", type = "text" }
day = { path = "/day", type = "date" }

[identity]
key = ["event_id"]
partition-by = "day"

[ledger]
horizon-days = 30

[[projection]]
kind = "counter"
table = "per_customer"
group-by = ["day", "customer_id"]
column = "n"
"#;

fn tls_pipeline(conn: &str, topic: &str, group: &str, db: &Db) -> Pipeline {
    pipeline(&PIPE.replace("{conn}", conn), topic, group, &db.schema)
}

/// `replaysafe ARGS` with `DATABASE_URL` (and more) overridden.
fn with_env(args: &[&str], envs: &[(&str, &str)]) -> Out {
    replaysafe_with(args, envs, Duration::from_secs(120))
}

fn tables(db: &Db) -> i64 {
    db.i64(&format!(
        "SELECT count(*) FROM pg_tables WHERE schemaname = '{}'",
        db.schema
    ))
}

#[test]
fn verify_full_with_the_ca_and_a_client_certificate_runs_a_pipeline_end_to_end() {
    let kit = kit();
    let (db, topic) = stage("tls_full", 3);
    db.execute("GRANT ALL ON SCHEMA {s} TO replaysafe_cert");
    let group = unique("g");
    // The keys from the environment (${…} expansion): nothing deployment-specific in the file.
    let conn = "url = \"postgresql://replaysafe_cert@localhost:5432/postgres\"\n\
                sslmode = \"verify-full\"\n\
                sslrootcert = \"${PGSSL_TEST_DIR}/ca.crt\"\n\
                sslcert = \"${PGSSL_TEST_DIR}/client.crt\"\n\
                sslkey = \"${PGSSL_TEST_DIR}/client.key\"";
    let p = tls_pipeline(conn, &topic, &group, &db);
    let env = [("PGSSL_TEST_DIR", kit.to_str().unwrap())];
    let day = chrono::Utc::now().date_naive();
    let recs: Vec<Rec> = (0..12)
        .map(|i| {
            let v = format!(
                r#"{{"event_id":"e{i}","customer_id":"c{}","day":"{day}"}}"#,
                i % 4
            );
            Rec::json(i % 3, &format!("k{i}"), &v, 1_700_000_000_000)
        })
        .collect();
    produce(&topic, &recs);
    let v = format!(r#"{{"event_id":"e0","customer_id":"c0","day":"{day}"}}"#);
    let redelivered = Rec::json(2, "k0", &v, 1);
    produce(&topic, &[redelivered]);

    let check = with_env(&["check", "--config", arg(&p.path)], &env);
    check.assert_ok();
    assert!(
        check.stdout.contains(&format!(
            "postgres localhost:5432 as replaysafe_cert, database postgres (from [postgres] url in {}): \
             sslmode=verify-full, CA {}, client certificate {} (key {}); no password",
            p.path.display(),
            file(&kit, "ca.crt"),
            file(&kit, "client.crt"),
            file(&kit, "client.key")
        )),
        "{}",
        check.stdout
    );
    println!("check of a TLS pipeline prints:\n{}", check.stdout);
    with_env(&["init", "--config", arg(&p.path)], &env).assert_ok();
    let out = try_run_with(&p.path, &env, Duration::from_secs(120));
    out.assert_ok();
    let t = out.tally();
    assert_eq!((t.consumed, t.landed, t.duplicate), (13, 12, 1));
    assert_eq!(
        db.strings("SELECT customer_id || '=' || n FROM {s}.per_customer ORDER BY 1"),
        ["c0=3", "c1=3", "c2=3", "c3=3"]
    );
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 12);
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(4));
    assert_eq!(db.checkpoint(&group, &topic, 1), Some(4));
    assert_eq!(db.checkpoint(&group, &topic, 2), Some(5));
    // `verify snapshot` (its own URL resolution) goes through the same TLS settings.
    let snap = p.dir.path().join("snap.json");
    let args = [
        "verify",
        "snapshot",
        "--config",
        arg(&p.path),
        "--table",
        "per_customer",
    ];
    with_env(&[&args[..], &["-o", arg(&snap)]].concat(), &env).assert_ok();
    assert!(std::fs::read_to_string(&snap).unwrap().contains("c3"));
    // The tables are the certificate role's: the run logged in as replaysafe_cert, which only `hostssl … cert`
    // admits.
    assert_eq!(
        db.text("SELECT tableowner::text FROM pg_tables WHERE tablename = 'per_customer'")
            .as_deref(),
        Some("replaysafe_cert")
    );
}

/// `check --database` over `url` (as `DATABASE_URL`); the pipeline file sets no connection key.
fn check_database(url: &str, db: &Db) -> Out {
    let p = tls_pipeline("", "t", "g", db);
    with_env(
        &["check", "--config", arg(&p.path), "--database"],
        &[("DATABASE_URL", url), ("REPLAYSAFE_LOG", "debug")],
    )
}

fn cert_url(host: &str, params: &str) -> String {
    format!("postgresql://replaysafe_cert@{host}:5432/postgres?{params}")
}

#[test]
fn a_url_with_libpq_tls_parameters_connects_and_a_wrong_ca_or_host_is_named() {
    let kit = kit();
    let db = Db::fresh("tls_url");
    let client = format!(
        "sslcert={}&sslkey={}",
        file(&kit, "client.crt"),
        file(&kit, "client.key")
    );
    let ok = cert_url(
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}&{client}",
            file(&kit, "ca.crt")
        ),
    );
    let out = check_database(&ok, &db);
    assert!(
        out.stdout.contains("database (read only"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );

    // A CA that did not sign the server's certificate.
    let wrong_ca = cert_url(
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}&{client}",
            file(&kit, "other-ca.crt")
        ),
    );
    let out = check_database(&wrong_ca, &db);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("TLS certificate verify failed")
            && out.stderr.contains("not signed by a CA in sslrootcert")
            && (out
                .stderr
                .contains("self-signed certificate in certificate chain")
                || out
                    .stderr
                    .contains("unable to get local issuer certificate"))
            && out.stderr.contains("localhost:5432"),
        "{}",
        out.stderr
    );

    // The certificate names `localhost`, not 127.0.0.1: verify-full refuses, verify-ca (chain only) accepts.
    let ip = format!("sslrootcert={}&{client}", file(&kit, "ca.crt"));
    let out = check_database(
        &cert_url("127.0.0.1", &format!("sslmode=verify-full&{ip}")),
        &db,
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("TLS host name mismatch")
            && out.stderr.contains("IP address mismatch")
            && out.stderr.contains("127.0.0.1:5432"),
        "{}",
        out.stderr
    );
    let out = check_database(
        &cert_url("127.0.0.1", &format!("sslmode=verify-ca&{ip}")),
        &db,
    );
    assert!(
        out.stdout.contains("database (read only"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );

    // As in libpq, `require` with an explicit sslrootcert checks the chain (not the host name).
    let require = |ca: &str| {
        let q = format!("sslmode=require&sslrootcert={}&{client}", file(&kit, ca));
        check_database(&cert_url("127.0.0.1", &q), &db)
    };
    let out = require("other-ca.crt");
    assert!(
        out.stderr.contains("not signed by a CA in sslrootcert"),
        "{}",
        out.stderr
    );
    let out = require("ca.crt");
    assert!(
        out.stdout.contains("database (read only"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );

    // `system`: the system's trusted CAs, which do not include the test CA.
    let system = cert_url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert=system&{client}"),
    );
    let out = check_database(&system, &db);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("TLS certificate verify failed"),
        "{}",
        out.stderr
    );

    // A verify mode without a CA is refused before connecting.
    let out = check_database(
        &cert_url("localhost", &format!("sslmode=verify-full&{client}")),
        &db,
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("set sslrootcert"), "{}", out.stderr);
    assert_eq!(tables(&db), 0, "nothing was created");
}

#[test]
fn the_certificate_role_needs_its_client_certificate() {
    let kit = kit();
    let db = Db::fresh("tls_cert");
    let ca = format!("sslmode=verify-full&sslrootcert={}", file(&kit, "ca.crt"));
    let with = format!(
        "{ca}&sslcert={}&sslkey={}",
        file(&kit, "client.crt"),
        file(&kit, "client.key")
    );
    let out = check_database(&cert_url("localhost", &with), &db);
    assert!(
        out.stdout.contains("database (read only"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    let out = check_database(&cert_url("localhost", &ca), &db);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("authentication failed")
            && out.stderr.contains("certificate")
            && out.stderr.contains("replaysafe_cert"),
        "{}",
        out.stderr
    );
    // A private key readable by others is refused, as libpq does.
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client.key");
    std::fs::copy(kit.join("client.key"), &key).unwrap();
    Command::new("chmod")
        .arg("0644")
        .arg(&key)
        .status()
        .unwrap();
    let loose = format!(
        "{ca}&sslcert={}&sslkey={}",
        file(&kit, "client.crt"),
        key.display()
    );
    let out = check_database(&cert_url("localhost", &loose), &db);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("must not be readable by others"),
        "{}",
        out.stderr
    );
}

/// A private PostgreSQL cluster with `ssl = off` on `port`, stopped (immediately) on drop.
struct PlainServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl PlainServer {
    fn start() -> PlainServer {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .unwrap()
            .map(|e| e.unwrap().path().join("bin"))
            .filter(|b| b.join("initdb").is_file())
            .max()
            .expect("PostgreSQL server binaries under /usr/lib/postgresql");
        let dir = tempfile::tempdir().unwrap();
        Command::new("chown")
            .arg("postgres")
            .arg(dir.path())
            .status()
            .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = dir.path().join("data");
        let as_pg = |args: &[&str]| {
            let out = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        as_pg(&[
            bin.join("initdb").to_str().unwrap(),
            "-D",
            data.to_str().unwrap(),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
        ]);
        let opts = format!(
            "-p {port} -c ssl=off -c listen_addresses=localhost -k {}",
            dir.path().display()
        );
        as_pg(&[
            bin.join("pg_ctl").to_str().unwrap(),
            "-D",
            data.to_str().unwrap(),
            "-o",
            &opts,
            "-l",
            dir.path().join("log").to_str().unwrap(),
            "-w",
            "start",
        ]);
        PlainServer { dir, bin, port }
    }
}

impl Drop for PlainServer {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

#[test]
fn require_refuses_a_server_without_tls_and_prefer_falls_back() {
    let server = PlainServer::start();
    let db = Db::fresh("tls_plain");
    let url = |mode: &str| {
        format!(
            "postgresql://postgres@localhost:{}/postgres?sslmode={mode}",
            server.port
        )
    };
    for mode in ["require", "verify-full"] {
        let mut u = url(mode);
        if mode == "verify-full" {
            u.push_str(&format!("&sslrootcert={}", file(&kit(), "ca.crt")));
        }
        let out = check_database(&u, &db);
        assert_eq!(out.code, Some(1), "{mode}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("TLS is required (sslmode) but the server does not offer it"),
            "{mode}: {}",
            out.stderr
        );
    }
    let out = check_database(&url("prefer"), &db);
    assert!(
        out.stdout.contains("database (read only"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
}

#[test]
fn secrets_never_appear_in_logs_check_output_or_connection_errors() {
    let (db, topic) = stage("secrets", 1);
    let group = unique("g");
    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("pg-password");
    let wrong = "Wr0ng-s3cret-9d1f";
    std::fs::write(&pw_file, format!("{wrong}\n")).unwrap();
    let conn = "url = \"postgresql://replaysafe_pw@localhost:5432/postgres?sslmode=require\"\n\
                password-file = \"${PW_FILE}\"";
    let p = tls_pipeline(conn, &topic, &group, &db);
    let env = [
        ("PW_FILE", pw_file.to_str().unwrap()),
        ("REPLAYSAFE_LOG", "trace"),
    ];
    let all = |o: &Out| format!("{}\n{}", o.stdout, o.stderr);

    // A wrong password: the run fails, naming the cause, never the password.
    let out = with_env(
        &["run", "--config", arg(&p.path), "--until-caught-up"],
        &env,
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("authentication failed"),
        "{}",
        out.stderr
    );
    assert!(!all(&out).contains(wrong), "{}", all(&out));
    assert_eq!(tables(&db), 0);
    let out = with_env(&["check", "--config", arg(&p.path), "--database"], &env);
    assert!(
        out.stderr.contains("authentication failed"),
        "{}",
        out.stderr
    );
    assert!(!all(&out).contains(wrong), "{}", all(&out));

    // The right password from the file: check connects and says where the password comes from.
    std::fs::write(&pw_file, format!("{PW}\n")).unwrap();
    let out = with_env(&["check", "--config", arg(&p.path), "--database"], &env);
    assert!(out.stdout.contains("database (read only"), "{}", all(&out));
    assert!(
        out.stdout.contains(&format!(
            "password from password-file {}",
            pw_file.display()
        )),
        "{}",
        out.stdout
    );
    assert!(!all(&out).contains(PW), "{}", all(&out));

    // A password in the URL (here from the environment), a refused port and a wrong password: never shown.
    for url in [
        format!("postgresql://replaysafe_pw:{wrong}@localhost:1/postgres?sslmode=disable"),
        format!("postgresql://replaysafe_pw:{wrong}@localhost:5432/postgres?sslmode=require"),
        format!("host=localhost port=1 user=replaysafe_pw password={wrong} sslmode=prefer"),
    ] {
        let plain = tls_pipeline("", &topic, &group, &db);
        let args = [
            "run",
            "--config",
            arg(&plain.path),
            "--until-caught-up",
            // The broker check comes first and must pass within it on a loaded machine.
            "--connect-timeout",
            "5",
        ];
        let env = [("DATABASE_URL", url.as_str()), ("REPLAYSAFE_LOG", "trace")];
        let out = with_env(&args, &env);
        assert_eq!(out.code, Some(1), "{}", out.stderr);
        assert!(
            out.stderr.contains("cannot connect to PostgreSQL"),
            "{}",
            out.stderr
        );
        assert!(!all(&out).contains(wrong), "{}", all(&out));
        let out = with_env(&["check", "--config", arg(&plain.path)], &env);
        out.assert_ok();
        assert!(
            out.stdout.contains("password in the URL (not shown)"),
            "{}",
            out.stdout
        );
        assert!(!all(&out).contains(wrong), "{}", all(&out));
    }
}

#[test]
fn an_unset_variable_is_a_config_error_naming_file_line_and_variable() {
    let db = Db::fresh("secrets_unset");
    let p = tls_pipeline(
        "password-file = \"${REPLAYSAFE_NO_SUCH_VAR}\"",
        "t",
        "g",
        &db,
    );
    let out = with_env(&["check", "--config", arg(&p.path)], &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("{}:7:", p.path.display()))
            && out
                .stderr
                .contains("environment variable `REPLAYSAFE_NO_SUCH_VAR` is not set"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_health_probe_connects_through_the_pipelines_tls_settings() {
    let kit = kit();
    let (db, topic) = stage("tls_probe", 1);
    db.execute("GRANT ALL ON SCHEMA {s} TO replaysafe_cert");
    let group = unique("g");
    let conn = format!(
        "url = \"postgresql://replaysafe_cert@localhost:5432/postgres\"\n\
         sslmode = \"verify-full\"\nsslrootcert = \"{}\"\nsslcert = \"{}\"\nsslkey = \"{}\"",
        file(&kit, "ca.crt"),
        file(&kit, "client.crt"),
        file(&kit, "client.key")
    );
    let p = tls_pipeline(&conn, &topic, &group, &db);
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let args = ["run", "--config", arg(&p.path), "--metrics-addr", &addr];
    let mut child = spawn(&args, &[], p.dir.path(), "run");
    // Ready needs a partition and a successful probe (a `replaysafe_cert` login: TLS with its certificate).
    let body = crate::health::wait_for(&addr, "/readyz", "ready", |c, _| c == 200);
    assert!(body.contains("ready: 1 partition"), "{body}");
    assert_eq!(terminate(&mut child), Some(0));
    assert_eq!(db.checkpoint(&group, &topic, 0), Some(0));
}

#[test]
fn check_refuses_tls_files_and_a_password_file_it_cannot_use() {
    let kit = kit();
    let db = Db::fresh("tls_check");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem");
    let cases = [
        (
            format!(
                "sslmode = \"verify-full\"\nsslrootcert = \"{}\"",
                missing.display()
            ),
            format!("sslrootcert {}", missing.display()),
        ),
        (
            format!(
                "sslcert = \"{}\"\nsslkey = \"{}\"",
                file(&kit, "ca.crt"),
                file(&kit, "client.key")
            ),
            "(the key of sslcert".to_string(),
        ),
        (
            format!("password-file = \"{}\"", missing.display()),
            format!("cannot read [postgres] password-file {}", missing.display()),
        ),
    ];
    for (conn, said) in cases {
        let conn = format!("url = \"postgresql://postgres@localhost:5432/postgres\"\n{conn}");
        let p = tls_pipeline(&conn, "t", "g", &db);
        let out = with_env(&["check", "--config", arg(&p.path)], &[]);
        assert_eq!(out.code, Some(2), "{conn}: {}", out.stderr);
        assert!(out.stderr.contains(&said), "{conn}: {}", out.stderr);
    }
}
