//! `connection.url` (pgjdbc's `jdbc:postgresql://host:port/database?properties`, pgjdbc documentation
//! "Connecting to the Database") with the connector's user and password → the pipeline's `[postgres] url` and
//! `password-file`. A password is never copied: the pipeline reads it from a file (`${…}` names where).

use super::Notes;

/// The environment variable the generated `password-file` names when the connector's password is not itself
/// read from a file.
pub const PASSWORD_FILE_VAR: &str = "REPLAYSAFE_DB_PASSWORD_FILE";

/// The database part of the pipeline.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Database {
    /// `[postgres] url` (`postgresql://user@host:port/db?sslmode=…`), never holding a password.
    pub url: String,
    /// `[postgres] password-file`, when the connector has a password.
    pub password_file: Option<String>,
    /// The schema the connector writes its tables to when the URL says (`currentSchema`).
    pub schema: Option<String>,
}

/// Where a Connect value comes from: written as is, or through a config provider (`${provider:path:key}`, KIP-297).
#[derive(Debug, PartialEq, Eq)]
pub enum Value<'a> {
    /// The value itself.
    Literal(&'a str),
    /// `${env:NAME}` (`EnvVarConfigProvider`).
    Env(&'a str),
    /// `${directory:DIR:FILE}` (`DirectoryConfigProvider`): the contents of DIR/FILE.
    Directory(&'a str, &'a str),
    /// Any other provider (`${file:PATH:KEY}`, a vault's …): provider and the rest.
    Provider(&'a str, &'a str),
}

/// Reads a Connect value: a whole `${provider:…}` reference, else the literal.
pub fn value(s: &str) -> Value<'_> {
    let Some(inner) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}')) else {
        return Value::Literal(s);
    };
    let Some((provider, rest)) = inner.split_once(':') else {
        return Value::Literal(s);
    };
    match provider {
        "env" => Value::Env(rest.rsplit(':').next().unwrap_or(rest)),
        "directory" => match rest.rsplit_once(':') {
            Some((dir, file)) => Value::Directory(dir, file),
            None => Value::Provider(provider, rest),
        },
        _ => Value::Provider(provider, rest),
    }
}

/// Percent-encodes everything of `s` but RFC 3986's unreserved characters (for a URL's user name).
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-decodes `s` (pgjdbc decodes its URL's property values); a malformed escape is kept as written.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The pipeline's database from `connection.url` (at `url_key`) and the connector's user and password keys.
///
/// # Errors
/// The problem, for a URL that is not PostgreSQL's (`jdbc:postgresql:`) or a `sslmode` replaysafe does not know.
pub fn database(
    url: &str,
    user: Option<(&str, &str)>,
    password: Option<(&str, &str)>,
    notes: &mut Notes,
) -> std::result::Result<Database, String> {
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower
        .starts_with("jdbc:postgresql:")
        .then(|| &url["jdbc:postgresql:".len()..])
    else {
        let scheme: String = url
            .split(':')
            .take(2)
            .collect::<Vec<_>>()
            .join(":")
            .chars()
            .take(40)
            .collect();
        return Err(format!(
            "a `{scheme}:` URL: replaysafe writes to PostgreSQL only — point it at the PostgreSQL database \
             (jdbc:postgresql://host:port/database), or leave connection.url out to take DATABASE_URL at run time"
        ));
    };
    let (hosts, path_query) = match rest.strip_prefix("//") {
        Some(r) => {
            let end = r.find(['/', '?']).unwrap_or(r.len());
            (&r[..end], &r[end..])
        }
        None => ("", rest),
    };
    let (path, query) = path_query.split_once('?').unwrap_or((path_query, ""));
    let database = path.trim_start_matches('/');
    let mut params = Vec::new();
    let mut url_user = None;
    let mut url_password = None;
    let mut schema = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v);
        match k {
            "user" => url_user = Some(v),
            "password" => url_password = Some(v),
            "sslmode" => {
                let mode = match v.as_str() {
                    "disable" | "prefer" | "require" | "verify-ca" | "verify-full" => v.clone(),
                    "allow" => {
                        notes.differs(
                            "connection.url",
                            "sslmode=allow is written prefer (TLS when the server offers it): replaysafe has no \
                             `allow`, which is never safer than prefer",
                        );
                        "prefer".to_string()
                    }
                    other => return Err(format!("sslmode `{other}` is not one of PostgreSQL's")),
                };
                params.retain(|(p, _): &(String, String)| p != "sslmode");
                params.push(("sslmode".to_string(), mode));
            }
            "ssl" if v.eq_ignore_ascii_case("true") => {
                // pgjdbc: ssl=true without sslmode verifies the certificate and the host name.
                if !query.split('&').any(|p| p.starts_with("sslmode=")) {
                    params.push(("sslmode".to_string(), "verify-full".to_string()));
                }
            }
            "ssl" => {}
            "sslrootcert" | "sslcert" | "sslkey" => {
                if k != "sslrootcert" {
                    notes.differs(
                        "connection.url",
                        &format!(
                            "{k}: replaysafe reads PEM files (pgjdbc also takes DER and PKCS-8 keys): convert the \
                             file if it is not PEM"
                        ),
                    );
                }
                params.push((k.to_string(), v));
            }
            "ApplicationName" => params.push(("application_name".to_string(), v)),
            "connectTimeout" => params.push(("connect_timeout".to_string(), v)),
            "currentSchema" => schema = v.split(',').next().map(|s| s.trim().to_string()),
            other => notes.not_carried(
                "connection.url",
                &format!(
                    "the pgjdbc property `{other}` has no equivalent in replaysafe's connection"
                ),
            ),
        }
    }
    let host_part = if hosts.is_empty() { "localhost" } else { hosts };
    let user = match (user, url_user) {
        (Some((key, u)), _) => Some(user_part(key, u, notes)),
        (None, Some(u)) => Some(encode(&u)),
        (None, None) => None,
    };
    let password_file = match (password, url_password) {
        (Some((key, p)), _) => password_part(key, p, notes),
        (None, Some(p)) if !p.is_empty() => {
            notes.secret(
                "connection.url",
                &format!(
                    "the URL's password is not copied: the pipeline reads it from the file ${{{PASSWORD_FILE_VAR}}} \
                     names (first line); set {PASSWORD_FILE_VAR} before check and run"
                ),
            );
            Some(format!("${{{PASSWORD_FILE_VAR}}}"))
        }
        _ => None,
    };
    let mut out = String::from("postgresql://");
    if let Some(u) = &user {
        out.push_str(u);
        out.push('@');
    }
    out.push_str(host_part);
    out.push('/');
    out.push_str(&encode_path(database));
    if !params.is_empty() {
        out.push('?');
        out.push_str(
            &params
                .iter()
                .map(|(k, v)| format!("{k}={}", encode(v)))
                .collect::<Vec<_>>()
                .join("&"),
        );
    }
    Ok(Database {
        url: out,
        password_file,
        schema,
    })
}

/// A database name for the URL's path (`$` would read as a `${…}` reference).
fn encode_path(db: &str) -> String {
    encode(&decode(db))
}

/// The URL's user from `connection.user` / `connection.username` (not a secret): written out, or `${NAME}` for a
/// value read from the environment.
fn user_part(key: &str, u: &str, notes: &mut Notes) -> String {
    match value(u) {
        Value::Literal(l) => encode(l),
        Value::Env(name) => format!("${{{name}}}"),
        Value::Directory(..) | Value::Provider(..) => {
            notes.not_carried(
                key,
                "read through a config provider replaysafe cannot read: the URL takes the user from \
                 ${REPLAYSAFE_DB_USER} (set it before check and run)",
            );
            "${REPLAYSAFE_DB_USER}".to_string()
        }
    }
}

/// `password-file` for `connection.password`.
fn password_part(key: &str, p: &str, notes: &mut Notes) -> Option<String> {
    secret_file(key, p, PASSWORD_FILE_VAR, notes)
}

/// A `password-file` value for the secret at `key`: the provider's file itself for `${directory:DIR:FILE}`, else
/// `${var}` (the file that variable names) — the value is never copied; `None` for an empty secret.
pub(super) fn secret_file(key: &str, p: &str, var: &str, notes: &mut Notes) -> Option<String> {
    let set = format!("the pipeline reads it from the file ${{{var}}} names (first line); set {var} before check and run");
    match value(p) {
        Value::Literal("") => return None,
        Value::Literal(_) => notes.secret(key, &format!("not copied (a secret): {set}")),
        Value::Directory(dir, file) => return Some(format!("{}/{file}", dir.trim_end_matches('/'))),
        Value::Env(name) => notes.secret(
            key,
            &format!("the connector reads it from the environment variable {name}: write it to a file; {set}"),
        ),
        Value::Provider(provider, _) => notes.secret(
            key,
            &format!("the connector reads it through its `{provider}` config provider: {set}"),
        ),
    }
    Some(format!("${{{var}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(url: &str, user: Option<&str>, password: Option<&str>) -> (Database, Notes) {
        let mut notes = Notes::default();
        let d = database(
            url,
            user.map(|u| ("connection.username", u)),
            password.map(|p| ("connection.password", p)),
            &mut notes,
        )
        .unwrap();
        (d, notes)
    }

    #[test]
    fn a_password_never_reaches_the_url() {
        let (d, notes) = db(
            "jdbc:postgresql://postgres:5432/inventory?user=postgresuser&password=postgrespw",
            None,
            None,
        );
        assert_eq!(d.url, "postgresql://postgresuser@postgres:5432/inventory");
        assert_eq!(
            d.password_file.as_deref(),
            Some("${REPLAYSAFE_DB_PASSWORD_FILE}")
        );
        assert!(!format!("{d:?}{notes:?}").contains("postgrespw"));
        let (d, notes) = db(
            "jdbc:postgresql://localhost/db",
            Some("pguser"),
            Some("pgpassword"),
        );
        assert_eq!(d.url, "postgresql://pguser@localhost/db");
        assert_eq!(
            d.password_file.as_deref(),
            Some("${REPLAYSAFE_DB_PASSWORD_FILE}")
        );
        assert!(!format!("{d:?}{notes:?}").contains("pgpassword"));
    }

    #[test]
    fn config_providers_map_to_files_and_variables() {
        let (d, _) = db(
            "jdbc:postgresql://h/db",
            Some("${env:PGUSER}"),
            Some("${directory:/run/secrets:pg-password}"),
        );
        assert_eq!(d.url, "postgresql://${PGUSER}@h/db");
        assert_eq!(d.password_file.as_deref(), Some("/run/secrets/pg-password"));
        let (d, notes) = db(
            "jdbc:postgresql://h/db",
            Some("a b$"),
            Some("${file:/etc/s.properties:pw}"),
        );
        assert_eq!(d.url, "postgresql://a%20b%24@h/db");
        assert_eq!(
            d.password_file.as_deref(),
            Some("${REPLAYSAFE_DB_PASSWORD_FILE}")
        );
        assert!(format!("{notes:?}").contains("`file` config provider"));
    }

    #[test]
    fn pgjdbc_properties_become_libpq_parameters() {
        let (d, notes) = db(
            "jdbc:postgresql://h1:5432,h2:5433/app?ssl=true&sslrootcert=/ca.pem&currentSchema=sales&ApplicationName=x&prepareThreshold=0",
            None,
            None,
        );
        assert_eq!(
            d.url,
            "postgresql://h1:5432,h2:5433/app?sslmode=verify-full&sslrootcert=%2Fca.pem&application_name=x"
        );
        assert_eq!(d.schema.as_deref(), Some("sales"));
        assert!(format!("{notes:?}").contains("prepareThreshold"));
        let (d, _) = db("jdbc:postgresql:app?sslmode=disable", None, None);
        assert_eq!(d.url, "postgresql://localhost/app?sslmode=disable");
    }

    #[test]
    fn other_databases_are_refused_without_their_url() {
        let mut notes = Notes::default();
        let e = database("jdbc:sqlite:test.db", None, None, &mut notes).unwrap_err();
        assert!(
            e.starts_with("a `jdbc:sqlite:` URL: replaysafe writes to PostgreSQL only"),
            "{e}"
        );
        let e = database("jdbc:mysql://u:secret@h/db", None, None, &mut notes).unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }
}
