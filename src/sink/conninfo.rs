//! What a PostgreSQL connection is made from: the URL (or libpq key/value string) plus the pipeline's
//! `[postgres]` connection keys ([`crate::config::ConnectionPlan`]), merged once per connection.
//!
//! tokio-postgres' own parser knows `sslmode` disable/prefer/require only and no certificate parameters, so the
//! TLS parameters libpq defines (`sslmode` incl. verify-ca/verify-full, `sslrootcert`, `sslcert`, `sslkey`) are
//! taken out of the URL here and handed to [`super::tls`]; the rest is parsed by tokio-postgres. The command
//! line notes the pipeline's keys for the URL it resolved ([`note`]), so every connection path — `connect`,
//! the health probe, verify, rebuild, init — gets them without threading them through every call.
//!
//! The password (URL or `password-file`) never appears in an error: messages name keys and files, not values.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::config::{ConnectionPlan, SslMode};
use crate::error::{Error, Result};

/// The TLS parameters libpq defines that tokio-postgres does not parse (taken out of the URL).
const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

static NOTED: Mutex<BTreeMap<String, (ConnectionPlan, String)>> = Mutex::new(BTreeMap::new());

/// Records that connections to `url` also take `plan` (a pipeline's `[postgres]` keys, `file` its path).
pub fn note(url: &str, plan: &ConnectionPlan, file: &str) {
    NOTED
        .lock()
        .expect("noted: a thread panicked holding this lock")
        .insert(url.to_string(), (plan.clone(), file.to_string()));
}

/// The TLS settings of one connection, merged from the URL and `[postgres]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Security {
    /// The effective `sslmode` (libpq's default `prefer` when none is set).
    pub mode: SslMode,
    /// `sslrootcert`: a PEM file or `system`.
    pub rootcert: Option<String>,
    /// `sslcert` and `sslkey`.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// A connection-string parse error with its cause: tokio-postgres prints only "invalid connection string" and
/// keeps which option is wrong (`invalid value for option `port``, `unknown option `foo``) in the error's source;
/// the option's value is never printed (it may be a password).
fn parse_error(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// Parses `url`, takes its TLS parameters out, merges the noted `[postgres]` keys and reads `password-file`.
///
/// # Errors
/// [`Error::Usage`] when the URL does not parse, a parameter is set differently in the URL and in
/// `[postgres]`, both a URL password and `password-file` are set, or the password file cannot be read.
pub fn resolve(url: &str) -> Result<(tokio_postgres::Config, Security)> {
    let origin = crate::endpoint::origin(url, "DATABASE_URL");
    let (rest, params) = split_tls_params(url).map_err(|m| {
        Error::Usage(format!(
            "the database URL (from {origin}) does not parse: {m}"
        ))
    })?;
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| {
        Error::Usage(format!(
            "the database URL (from {origin}) does not parse: {}",
            parse_error(&e)
        ))
    })?;
    let noted = NOTED
        .lock()
        .expect("noted: a thread panicked holding this lock")
        .get(url)
        .cloned();
    let (plan, file) = noted.unwrap_or_default();
    let pick = |key: &str, ours: Option<String>| -> Result<Option<String>> {
        match (params.get(key), ours) {
            (Some(a), Some(b)) if *a != b => Err(Error::Usage(format!(
                "`{key}` is set both in the database URL (from {origin}) and in [postgres] of {file}, \
                 differently: set it in one place"
            ))),
            (Some(a), _) => Ok(Some(a.clone())),
            (None, b) => Ok(b),
        }
    };
    let mode = match pick("sslmode", plan.sslmode.map(|m| m.as_str().to_string()))? {
        Some(m) => SslMode::parse(&m)
            .map_err(|e| Error::Usage(format!("the database URL (from {origin}): {e}")))?,
        None => SslMode::Prefer,
    };
    let path = |p: Option<PathBuf>| p.map(|p| p.display().to_string());
    let cert = pick("sslcert", path(plan.sslcert.clone()))?;
    let key = pick("sslkey", path(plan.sslkey.clone()))?;
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
        (None, None) => None,
        _ => {
            return Err(Error::Usage(
                "a client certificate needs both `sslcert` and `sslkey`".into(),
            ))
        }
    };
    let security = Security {
        mode,
        rootcert: pick("sslrootcert", plan.sslrootcert.clone())?,
        client,
    };
    config.ssl_mode(match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    if let Some(f) = &plan.password_file {
        if config.get_password().is_some() {
            return Err(Error::Usage(format!(
                "the database URL (from {origin}) has a password and [postgres] password-file is set in \
                 {file}: keep one"
            )));
        }
        config.password(read_password(f)?);
    }
    Ok((config, security))
}

/// One line saying how connections to `url` are made, for `replaysafe check`: address, user, database, TLS
/// mode and files, where the password comes from — never the password itself. The password file is read and
/// the TLS files loaded ([`super::tls::connector`]), so that `check` refuses what a connection would; nothing
/// connects.
///
/// # Errors
/// As [`resolve`] and [`super::tls::connector`].
pub fn summary(url: &str) -> Result<String> {
    let (config, s) = resolve(url)?;
    super::tls::connector(&s)?;
    let mut tls = format!("sslmode={}", s.mode.as_str());
    let verifies = matches!(s.mode, SslMode::VerifyCa | SslMode::VerifyFull)
        || (s.mode != SslMode::Disable && s.rootcert.is_some());
    match (&s.rootcert, verifies) {
        (Some(r), true) => tls.push_str(&format!(", CA {r}")),
        (None, true) => tls.push_str(", CA ~/.postgresql/root.crt"),
        _ => {}
    }
    if let Some((c, k)) = &s.client {
        tls.push_str(&format!(
            ", client certificate {} (key {})",
            c.display(),
            k.display()
        ));
    }
    let noted = NOTED
        .lock()
        .expect("noted: a thread panicked holding this lock")
        .get(url)
        .cloned();
    let password = match (
        noted.and_then(|(p, _)| p.password_file),
        config.get_password(),
    ) {
        (Some(f), _) => format!("password from password-file {}", f.display()),
        (None, Some(_)) => "password in the URL (not shown)".to_string(),
        (None, None) => "no password".to_string(),
    };
    Ok(format!(
        "postgres {}{}{} (from {}): {tls}; {password}",
        crate::endpoint::pg_address(&config),
        config
            .get_user()
            .map(|u| format!(" as {u}"))
            .unwrap_or_default(),
        config
            .get_dbname()
            .map(|d| format!(", database {d}"))
            .unwrap_or_default(),
        crate::endpoint::origin(url, "DATABASE_URL"),
    ))
}

/// Reads `[postgres] password-file` as a connection would, for `replaysafe check` when no database URL is known
/// yet; the password is dropped unread by anyone.
///
/// # Errors
/// [`Error::Usage`] when the file cannot be read or its first line is empty.
pub fn check_password_file(path: &std::path::Path) -> Result<()> {
    read_password(path).map(drop)
}

/// The first line of `path` (without its line end).
fn read_password(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Usage(format!(
            "cannot read [postgres] password-file {}: {e}",
            path.display()
        ))
    })?;
    let line = text.lines().next().unwrap_or("");
    if line.is_empty() {
        return Err(Error::Usage(format!(
            "[postgres] password-file {} is empty (its first line is the password)",
            path.display()
        )));
    }
    Ok(line.to_string())
}

/// `url` without its TLS parameters, and those parameters (decoded).
fn split_tls_params(url: &str) -> std::result::Result<(String, BTreeMap<String, String>), String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        check_one_at(url)?;
        return Ok(split_url(url));
    }
    let pairs = key_values(url)?;
    let mut params = BTreeMap::new();
    let mut rest = Vec::new();
    for (k, v) in pairs {
        if TLS_KEYS.contains(&k.as_str()) {
            params.insert(k, v);
        } else {
            let quoted = v.replace('\\', "\\\\").replace('\'', "\\'");
            rest.push(format!("{k}='{quoted}'"));
        }
    }
    Ok((rest.join(" "), params))
}

/// Refuses a URL with an `@` after the one ending the credentials (before the query): tokio-postgres ends the
/// credentials at the first `@`, so a password holding a raw `@` would spill its tail into the host or database
/// name, which messages print. The message names no part of the URL.
///
/// A `?` before that first `@` is refused too: the query would be split off inside the password, so its
/// `sslmode` would not be taken out and the connection would silently fall back to `prefer`.
fn check_one_at(url: &str) -> std::result::Result<(), String> {
    if url
        .split_once('@')
        .is_some_and(|(creds, _)| creds.contains('?'))
    {
        return Err(
            "a `?` before the `@` that ends the user name and password: percent-encode `?` in \
                    them as `%3F` (and `@` in a query value as `%40`)"
                .to_string(),
        );
    }
    let after = url.split_once('@').map_or("", |(_, rest)| rest);
    let before_query = after.split_once('?').map_or(after, |(b, _)| b);
    match before_query.contains('@') {
        true => Err(
            "more than one `@` before the query: percent-encode `@` in the user name, password or \
                     database name as `%40` (or use [postgres] password-file)"
                .to_string(),
        ),
        false => Ok(()),
    }
}

fn split_url(url: &str) -> (String, BTreeMap<String, String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), BTreeMap::new());
    };
    let mut params = BTreeMap::new();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(k);
        if TLS_KEYS.contains(&k.as_str()) {
            params.insert(k, percent_decode(v));
        } else {
            kept.push(pair);
        }
    }
    match kept.is_empty() {
        true => (base.to_string(), params),
        false => (format!("{base}?{}", kept.join("&")), params),
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push(hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// libpq's `key=value` form: values plain or single-quoted, `\` escaping the next character.
fn key_values(s: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            // The word may be the tail of an unquoted value (a password with a space): never shown.
            return Err(match out.last() {
                Some((prev, _)) => format!(
                    "a word after the value of {} is not followed by `=` (single-quote a value holding \
                     spaces: key='…')",
                    shown_key(prev)
                ),
                None => "the first word is not followed by `=` (not a postgres:// or postgresql:// URL, \
                         nor libpq's key=value form)"
                    .to_string(),
            });
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => {
                        return Err(format!(
                            "the value of {} has no closing quote",
                            shown_key(&key)
                        ))
                    }
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                match c {
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
        }
        out.push((key, value));
    }
}

/// A key for a parse error: named when it is a parameter name (letters, digits, `_`), else not shown — a
/// mistyped URL (`postgresq://user:password@…`) is read as one key and holds the password.
fn shown_key(key: &str) -> String {
    match !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        true => format!("`{key}`"),
        false => "a key that is not a parameter name (not shown)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_that_does_not_parse_names_the_option_and_never_its_value() {
        for (url, option) in [
            ("postgresql://u:s3cret@h:notaport/db", "`port`"),
            (
                "postgresql://u:s3cret@h/db?connect_timeout=x",
                "`connect_timeout`",
            ),
            (
                "postgresql://u:s3cret@h/db?bogus=1",
                "unknown option `bogus`",
            ),
            ("host=h password=s3cret port=x", "`port`"),
        ] {
            let Err(Error::Usage(m)) = resolve(url) else {
                panic!("{url} parsed");
            };
            assert!(m.contains(option), "{url}: {m}");
            assert!(!m.contains("s3cret"), "{url}: {m}");
        }
    }

    #[test]
    fn url_tls_params_are_taken_out() {
        let (rest, p) = split_tls_params(
            "postgresql://u:pw@db:5432/x?sslmode=verify-full&application_name=a&sslrootcert=%2Fca%20dir%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgresql://u:pw@db:5432/x?application_name=a");
        assert_eq!(p["sslmode"], "verify-full");
        assert_eq!(p["sslrootcert"], "/ca dir/ca.pem");
        let (rest, p) = split_tls_params("postgres://db/x?sslmode=require").unwrap();
        assert_eq!(rest, "postgres://db/x");
        assert_eq!(p["sslmode"], "require");
    }

    #[test]
    fn key_value_tls_params_are_taken_out() {
        let (rest, p) = split_tls_params(
            r"host=db password='it\'s' sslmode=verify-ca sslkey='/k dir/k.pem' user = u",
        )
        .unwrap();
        assert!(
            rest.contains("host='db'") && rest.contains("user='u'"),
            "{rest}"
        );
        assert_eq!(p["sslmode"], "verify-ca");
        assert_eq!(p["sslkey"], "/k dir/k.pem");
        let c: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(c.get_user(), Some("u"));
        assert_eq!(c.get_password(), Some(&b"it's"[..]));
    }

    #[test]
    fn url_and_pipeline_merge_and_conflicts_are_refused() {
        let url = "postgresql://u@h/x?sslmode=verify-full";
        let plan = ConnectionPlan {
            sslrootcert: Some("/ca.pem".into()),
            ..Default::default()
        };
        note(url, &plan, "p.toml");
        let (c, s) = resolve(url).unwrap();
        assert_eq!(s.mode, SslMode::VerifyFull);
        assert_eq!(s.rootcert.as_deref(), Some("/ca.pem"));
        assert_eq!(c.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        let url2 = "postgresql://u@h/x?sslmode=require";
        let plan2 = ConnectionPlan {
            sslmode: Some(SslMode::VerifyCa),
            ..Default::default()
        };
        note(url2, &plan2, "p.toml");
        let e = resolve(url2).unwrap_err().to_string();
        assert!(e.contains("`sslmode` is set both"), "{e}");
    }

    #[test]
    fn password_file_never_leaks_and_conflicts_with_a_url_password() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pw");
        std::fs::write(&f, "hunter2\n").unwrap();
        let plan = ConnectionPlan {
            password_file: Some(f),
            ..Default::default()
        };
        note("postgresql://u@h/x", &plan, "p.toml");
        let (c, _) = resolve("postgresql://u@h/x").unwrap();
        assert_eq!(c.get_password(), Some(&b"hunter2"[..]));
        note("postgresql://u:other@h/x", &plan, "p.toml");
        let e = resolve("postgresql://u:other@h/x").unwrap_err().to_string();
        assert!(
            e.contains("keep one") && !e.contains("other@") && !e.contains("hunter2"),
            "{e}"
        );
    }
}
