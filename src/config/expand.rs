//! `${NAME}` expansion: keys that may carry a secret or a deployment-specific value take it from the
//! environment, so no secret has to sit in the pipeline file (README "Connecting to production", "Secrets").
//!
//! Expanded keys (and no others: SQL, CEL and identifiers are never expanded): `[postgres]` `url`, `sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`, `password-file`; `[kafka]` `brokers`; every string value of
//! `[kafka.properties]` (e.g. `"sasl.password" = "${KAFKA_PASSWORD}"`).
//!
//! Syntax: `${NAME}` with `NAME` = `[A-Za-z_][A-Za-z0-9_]*` is replaced by the variable's value, verbatim;
//! `$$` is a literal `$`; any other `$` is kept as written. An unset variable is a configuration error naming
//! `file:line:column` and the variable — never the value of anything.

use std::ops::Range;

use super::Source;
use crate::error::Result;

/// `text` (the value of the key at `span`) with every `${NAME}` replaced by the environment variable `NAME`.
///
/// # Errors
/// [`crate::error::Error::Config`] at `span` when a variable is unset (or not valid Unicode), or a `${` is not
/// closed by a valid name and `}`.
pub fn expand(src: &Source, text: &str, span: Range<usize>) -> Result<String> {
    expand_with(text, |name| std::env::var(name).ok()).map_err(|m| src.error(span, m))
}

/// [`expand`] over a lookup function (tests); the error is the message alone.
pub fn expand_with(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(body) = tail.strip_prefix("${") {
            let end = body.find('}').ok_or_else(|| {
                "`${` is not closed by `}` (write `$${` for a literal `${`)".to_string()
            })?;
            let name = &body[..end];
            if !valid_name(name) {
                return Err(format!(
                    "`${{{name}}}` is not a valid environment variable reference (letters, digits, `_`; \
                     write `$$` for a literal `$`)"
                ));
            }
            let value = lookup(name).ok_or_else(|| {
                format!("environment variable `{name}` is not set (referenced as `${{{name}}}`)")
            })?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "PW").then(|| "s3cr$t".to_string())
    }

    #[test]
    fn expands_escapes_and_refuses() {
        assert_eq!(expand_with("a${PW}b", env).unwrap(), "as3cr$tb");
        assert_eq!(expand_with("$$${PW}$x", env).unwrap(), "$s3cr$t$x");
        assert_eq!(expand_with("no vars", env).unwrap(), "no vars");
        let e = expand_with("x${NOPE}", env).unwrap_err();
        assert!(e.contains("`NOPE` is not set"), "{e}");
        assert!(expand_with("${PW", env).unwrap_err().contains("not closed"));
        assert!(expand_with("${1X}", env)
            .unwrap_err()
            .contains("not a valid"));
    }

    #[test]
    fn the_documented_keys_are_expanded() {
        let home = std::env::var("HOME").expect("HOME is set");
        let text = r#"[kafka]
brokers = "${HOME}:9092"
group-id = "g"
topics = ["t"]
[kafka.properties]
"client.id" = "c-${HOME}"
[postgres]
url = "postgresql://u@h/${HOME}"
sslmode = "verify-full"
sslrootcert = "${HOME}/ca.pem"
sslcert = "${HOME}/c.crt"
sslkey = "${HOME}/c.key"
password-file = "${HOME}/pw"
[fields]
event_id = { path = "/event_id", type = "text" }
[identity]
key = ["event_id"]
[[projection]]
kind = "counter"
table = "c"
group-by = ["event_id"]
column = "n"
"#;
        let p = crate::config::parse("p.toml", text).unwrap();
        assert_eq!(p.kafka.brokers, Some(format!("{home}:9092")));
        assert!(p
            .kafka
            .properties
            .contains(&("client.id".to_string(), format!("c-{home}"))));
        assert_eq!(p.postgres.url, Some(format!("postgresql://u@h/{home}")));
        let c = &p.postgres.connection;
        assert_eq!(c.sslmode, Some(crate::config::SslMode::VerifyFull));
        assert_eq!(c.sslrootcert, Some(format!("{home}/ca.pem")));
        assert_eq!(c.sslkey, Some(format!("{home}/c.key").into()));
        assert_eq!(c.password_file, Some(format!("{home}/pw").into()));
        let e = crate::config::parse("p.toml", &text.replace("${HOME}/pw", "${NOPE_X}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.toml:13:17: environment variable `NOPE_X` is not set"),
            "{e}"
        );
    }
}
