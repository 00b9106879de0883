//! Where replaysafe connects and what to say when it cannot: the address (`host:port`, never a password), where
//! the setting came from (the pipeline file's key, an environment variable, a flag) and the cause (connection
//! refused, DNS lookup failed, timed out, authentication failed), and the bound on start-up retries
//! (`--connect-timeout`, default [`DEFAULT_CONNECT_TIMEOUT`]).
//!
//! The command line resolves the database URL and the brokers once and notes their origin here
//! ([`note_origin`]); every connection error then names it without threading it through every call.

use std::collections::BTreeMap;
use std::error::Error as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How long start-up waits for PostgreSQL and the Kafka brokers before giving up (`--connect-timeout`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest single PostgreSQL connection attempt when the URL sets no `connect_timeout` (a host that drops
/// packets would otherwise wait for the kernel's TCP timeout, minutes).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

static CONNECT_TIMEOUT_MS: AtomicU64 = AtomicU64::new(60_000);
static ORIGINS: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

/// Sets the start-up bound for this process (`--connect-timeout SECONDS`).
pub fn set_connect_timeout(d: Duration) {
    CONNECT_TIMEOUT_MS.store(crate::units::ms(d), Ordering::Relaxed);
}

/// The start-up bound: how long the first connection to PostgreSQL (and to the brokers) is retried.
pub fn connect_timeout() -> Duration {
    Duration::from_millis(CONNECT_TIMEOUT_MS.load(Ordering::Relaxed))
}

/// The end of a start-up error once `--connect-timeout` has passed: how long was waited, and the option's value
/// (the wait runs past it by the last attempt's own bound, e.g. a connection attempt that was under way), e.g.
/// `gave up after 17 s (--connect-timeout 15)`.
pub fn gave_up(waited: Duration) -> String {
    let bound = connect_timeout();
    let secs = |d: Duration| {
        let ms = d.as_millis();
        if ms % 1000 == 0 {
            format!("{}", ms / 1000)
        } else {
            format!("{:.1}", d.as_secs_f64())
        }
    };
    format!(
        "gave up after {} s (--connect-timeout {})",
        waited.as_secs(),
        secs(bound)
    )
}

/// Records where a resolved setting (a database URL, a brokers list) came from, e.g. `DATABASE_URL
/// (environment)` or `[postgres] url in pipeline.toml:12:7`.
pub fn note_origin(value: &str, origin: impl Into<String>) {
    ORIGINS
        .lock()
        .expect("origins: a thread panicked holding this lock")
        .insert(value.to_string(), origin.into());
}

/// Where `value` came from: what [`note_origin`] recorded, else the environment variable `env` when it holds
/// exactly `value`, else "given by the caller".
pub fn origin(value: &str, env: &str) -> String {
    if let Some(o) = ORIGINS
        .lock()
        .expect("origins: a thread panicked holding this lock")
        .get(value)
    {
        return o.clone();
    }
    if std::env::var(env).is_ok_and(|v| v == value) {
        return format!("{env} (environment)");
    }
    "given by the caller".to_string()
}

/// A connection that could not be made: the message names the service, address, origin and cause.
#[derive(Debug)]
pub struct ConnectError {
    /// `cannot connect to PostgreSQL at HOST:PORT (from ORIGIN): CAUSE — detail`.
    pub message: String,
    /// Whether retrying may help (refused, DNS, timeout: yes; authentication, a missing database: no).
    pub transient: bool,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The `host:port` list of a PostgreSQL URL or key/value string (never user or password); the input unparsed
/// is never shown (it may hold the password).
pub fn pg_address(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(path) => format!("{}/.s.PGSQL.{port}", path.display()),
            }
        })
        .collect();
    if hosts.is_empty() {
        "localhost:5432 (default)".to_string()
    } else {
        hosts.join(",")
    }
}

/// The cause of a failed PostgreSQL connection in a few words, and whether retrying may help.
pub fn pg_cause(e: &tokio_postgres::Error) -> (&'static str, bool) {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        return match &code[..2] {
            "28" => ("authentication failed", false),
            "3D" => ("no such database", false),
            "53" | "57" => ("the server is not accepting connections", true),
            _ => ("the server refused the session", false),
        };
    }
    if let Some(cause) = tls_cause(&describe_chain(e)) {
        return cause;
    }
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io_cause(io);
        }
        source = s.source();
    }
    let text = e.to_string();
    if text.contains("timeout") || text.contains("timed out") {
        ("timed out", true)
    } else {
        ("connection failed", true)
    }
}

/// A TLS failure named from the client's error text (OpenSSL's verify result, tokio-postgres' refusal); never
/// retried: the same certificates fail the same way.
fn tls_cause(chain: &str) -> Option<(&'static str, bool)> {
    let text = chain.to_lowercase();
    let cause = if text.contains("server does not support tls") {
        "TLS is required (sslmode) but the server does not offer it"
    } else if text.contains("hostname mismatch") || text.contains("ip address mismatch") {
        "TLS host name mismatch: the server's certificate does not name the host connected to (sslmode=verify-full)"
    } else if text.contains("certificate verify failed")
        && [
            "local issuer",
            "self-signed",
            "self signed",
            "unable to get issuer",
        ]
        .iter()
        .any(|r| text.contains(r))
    {
        "TLS certificate verify failed: the server's certificate is not signed by a CA in sslrootcert"
    } else if text.contains("certificate verify failed") {
        "TLS certificate verify failed (OpenSSL's reason at the end)"
    } else if text.contains("ssl routines") || text.contains("tlsv1 alert") {
        "TLS handshake failed"
    } else {
        return None;
    };
    Some((cause, false))
}

fn io_cause(io: &std::io::Error) -> (&'static str, bool) {
    use std::io::ErrorKind as K;
    let text = io.to_string().to_lowercase();
    match io.kind() {
        K::ConnectionRefused => ("connection refused", true),
        K::TimedOut => ("timed out", true),
        K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof => {
            ("connection closed by the server", true)
        }
        _ if text.contains("lookup")
            || text.contains("resolve")
            || text.contains("name or service") =>
        {
            ("DNS lookup failed", true)
        }
        _ if text.contains("timed out") => ("timed out", true),
        _ => ("connection failed", true),
    }
}

/// The error for a failed PostgreSQL connection to `config`.
pub fn pg_error(
    config: &tokio_postgres::Config,
    url: &str,
    e: &tokio_postgres::Error,
) -> ConnectError {
    let (cause, transient) = pg_cause(e);
    let user = config
        .get_user()
        .map(|u| format!(" as {u}"))
        .unwrap_or_default();
    ConnectError {
        message: format!(
            "cannot connect to PostgreSQL at {}{user} (from {}): {cause} — {}",
            pg_address(config),
            origin(url, "DATABASE_URL"),
            describe_chain(e)
        ),
        transient,
    }
}

/// The server's message and SQLSTATE, or the client's error and its causes (each once).
pub fn describe_chain(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// What stands in for a password in a printed URL.
pub const MASK: &str = "***";

/// `text` with the password of every URL in it masked (`scheme://user:secret@host` → `scheme://user:***@host`),
/// and the value of every `password=` query parameter (`?password=secret` → `?password=***`): for any message
/// that may hold a URL — the schema registry's, a brokers list, a database URL. Over-masks rather than under:
/// the userinfo ends at the last `@` before the next white space or quote, so a password holding an unescaped
/// `/` or `?` is still masked.
pub fn mask_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
            .unwrap_or(tail.len());
        let (url, after) = tail.split_at(end);
        out.push_str(&mask_one(url));
        rest = after;
    }
    out.push_str(rest);
    mask_password_params(&out)
}

/// One URL after its `scheme://`: the password of its userinfo masked.
fn mask_one(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_string();
    };
    match url[..at].find(':') {
        Some(colon) => format!("{}{MASK}{}", &url[..=colon], &url[at..]),
        None => url.to_string(),
    }
}

/// `password=VALUE` (a URL's query parameter, libpq's key/value form) → `password=***`; the value ends at `&`,
/// white space or the end.
fn mask_password_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.to_ascii_lowercase().find("password=") {
        let (head, tail) = rest.split_at(i + "password=".len());
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '&' || c.is_whitespace())
            .unwrap_or(tail.len());
        if end > 0 {
            out.push_str(MASK);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// The cause of a failed TLS connection when the broker's certificate is not trusted: not retried, like a refused
/// password (a wrong `ssl.ca.location` does not fix itself).
pub const KAFKA_UNTRUSTED: &str =
    "TLS handshake failed: the broker's certificate could not be verified \
                                   (check ssl.ca.location)";

/// A client whose `security.protocol` does not match the broker listener's (not an authentication failure).
pub const KAFKA_PROTOCOL_MISMATCH: &str = "security.protocol does not match the broker's listener (a TLS or \
                                           SASL_SSL client on a PLAINTEXT listener, or the other way round)";

/// The cause of a failed broker connection from librdkafka's error reasons (its error callback), in a few words.
/// The broker name each reason starts with (`sasl_ssl://host:port/bootstrap: `) is not looked at.
pub fn kafka_cause(reasons: &[String]) -> &'static str {
    let all = reasons
        .iter()
        .map(|r| match r.split_once(": ") {
            Some((head, rest)) if head.contains('/') && !head.contains(' ') => rest,
            _ => r.as_str(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase();
    if all.contains("connection refused") {
        "connection refused"
    } else if all.contains("plaintext broker listener")
        || all.contains("connecting to a ssl listener")
        || all.contains("incorrect security.protocol")
        || all.contains("is not configured for sasl")
    {
        // librdkafka's own diagnosis of a client and a listener speaking different protocols (TLS to a
        // PLAINTEXT listener, or plain bytes to a TLS/SASL_SSL one): no credential was even asked for.
        KAFKA_PROTOCOL_MISMATCH
    } else if all.contains("failed to resolve") || all.contains("name or service not known") {
        "DNS lookup failed"
    } else if all.contains("certificate verify failed") || all.contains("could not be verified") {
        KAFKA_UNTRUSTED
    } else if all.contains("authentication") || all.contains("sasl") {
        "authentication failed"
    } else if all.contains("ssl") || all.contains("handshake") {
        "TLS handshake failed"
    } else if all.contains("timed out") || reasons.is_empty() {
        "timed out (no answer from any broker)"
    } else {
        "connection failed"
    }
}

/// The error for brokers that did not answer; `gave_up`: how long start-up waited (the final error).
pub fn kafka_error(brokers: &str, reasons: &[String], gave_up: Option<Duration>) -> ConnectError {
    let cause = kafka_cause(reasons);
    let detail = reasons
        .last()
        .map(|r| format!(" — {r}"))
        .unwrap_or_default();
    let waited = gave_up
        .map(|d| format!(", {}", self::gave_up(d)))
        .unwrap_or_default();
    ConnectError {
        message: format!(
            "cannot connect to the Kafka brokers {} (from {}): {cause}{waited}{}",
            mask_urls(brokers),
            origin(brokers, "KAFKA_BROKERS"),
            mask_urls(&detail),
        ),
        transient: cause != "authentication failed"
            && cause != KAFKA_UNTRUSTED
            && cause != KAFKA_PROTOCOL_MISMATCH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_never_shows_the_password() {
        let c: tokio_postgres::Config = "postgresql://u:hunter2@db.example:6543/x".parse().unwrap();
        assert_eq!(pg_address(&c), "db.example:6543");
        let c: tokio_postgres::Config = "host=a,b port=1,2 password=hunter2".parse().unwrap();
        assert_eq!(pg_address(&c), "a:1,b:2");
    }

    #[test]
    fn urls_are_masked() {
        let m = |s: &str| mask_urls(s);
        assert_eq!(
            m("GET http://u:hunter2@reg:8081/x: refused"),
            "GET http://u:***@reg:8081/x: refused"
        );
        assert_eq!(m("http://reg:8081/x"), "http://reg:8081/x");
        assert_eq!(m("http://u@reg/x"), "http://u@reg/x");
        assert_eq!(m("a https://u:p/w?d@h/ b"), "a https://u:***@h/ b");
        assert_eq!(
            m("postgresql://h/db?user=u&password=hunter2&sslmode=disable"),
            "postgresql://h/db?user=u&password=***&sslmode=disable"
        );
        assert_eq!(
            m("host=h password=hunter2 user=u"),
            "host=h password=*** user=u"
        );
        assert_eq!(m("`sasl_ssl://u:pw@b:9092`"), "`sasl_ssl://u:***@b:9092`");
    }

    #[test]
    fn kafka_causes() {
        let r = |s: &str| vec![s.to_string()];
        assert_eq!(
            kafka_cause(&r(
                "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"
            )),
            "connection refused"
        );
        assert_eq!(
            kafka_cause(&r(
                "x:9092/bootstrap: Failed to resolve 'x:9092': Name or service not known"
            )),
            "DNS lookup failed"
        );
        assert_eq!(kafka_cause(&[]), "timed out (no answer from any broker)");
        // The broker name `sasl_ssl://…` is no cause: a wrong CA is a TLS failure, a wrong password an
        // authentication failure (librdkafka's messages, seen against the test kit's SASL_SSL listener).
        let ca = "sasl_ssl://127.0.0.1:51525/bootstrap: error:0A000086:SSL routines::certificate verify failed \
                  (after 6ms in state SSL_HANDSHAKE)";
        assert_eq!(kafka_cause(&r(ca)), KAFKA_UNTRUSTED);
        assert!(!kafka_error("b:1", &r(ca), None).transient);
        let pw = "sasl_ssl://127.0.0.1:51525/bootstrap: SASL authentication error: Authentication failed during \
                  authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512";
        assert_eq!(kafka_cause(&r(pw)), "authentication failed");
        // A SASL_SSL client on a PLAINTEXT listener, and a plain client on a TLS one: a protocol mismatch, not a
        // refused credential (librdkafka 2.x's messages; the test kit's two listeners).
        let tls_on_plain = "sasl_ssl://127.0.0.1:52509/bootstrap: SSL handshake failed: Disconnected: SSL \
                            connection closed by peer: connecting to a PLAINTEXT broker listener? (after 7ms in \
                            state SSL_HANDSHAKE)";
        assert_eq!(kafka_cause(&r(tls_on_plain)), KAFKA_PROTOCOL_MISMATCH);
        assert!(!kafka_error("b:1", &r(tls_on_plain), None).transient);
        let plain_on_tls = "127.0.0.1:44103/bootstrap: Disconnected while requesting ApiVersion: might be caused \
                            by incorrect security.protocol configuration (connecting to a SSL listener?) or broker \
                            version is < 0.10 (see api.version.request)";
        assert_eq!(kafka_cause(&r(plain_on_tls)), KAFKA_PROTOCOL_MISMATCH);
        let sasl_on_plain =
            "[thrd:app]: Configuration property `sasl.mechanism` set to `SCRAM-SHA-512` but \
                             `security.protocol` is not configured for SASL: recommend setting \
                             `security.protocol` to SASL_SSL or SASL_PLAINTEXT";
        assert_eq!(kafka_cause(&r(sasl_on_plain)), KAFKA_PROTOCOL_MISMATCH);
        let slow =
            "sasl_ssl://127.0.0.1:51525/bootstrap: Connection setup timed out in state CONNECT";
        assert_eq!(
            kafka_cause(&r(slow)),
            "timed out (no answer from any broker)"
        );
    }

    #[test]
    fn tls_causes() {
        let c = |s: &str| tls_cause(s).map(|c| c.0).unwrap_or("none");
        assert!(c("error performing TLS handshake: error:0A000086:SSL routines:tls_post_process_server_certificate:certificate verify failed: Hostname mismatch").contains("host name mismatch"));
        assert!(c("error performing TLS handshake: ...certificate verify failed: unable to get local issuer certificate").contains("not signed by a CA"));
        assert!(
            c("error performing TLS handshake: server does not support TLS")
                .contains("does not offer")
        );
        assert!(c("...certificate verify failed: certificate has expired").ends_with("at the end)"));
        assert_eq!(c("connection refused"), "none");
    }
}
