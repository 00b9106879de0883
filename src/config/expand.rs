//! `${NAME}` expansion: keys that may carry a secret or a deployment-specific value take it from the environment,
//! so no secret has to sit in the pipeline file (docs/operations.md "Connecting to production", "Secrets").
//!
//! Expanded keys (and no others: SQL, CEL and identifiers are never expanded): `[postgres]` `url`, `sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`, `password-file`; `[kafka]` `brokers`; every string value of
//! `[kafka.properties]` (e.g. `"sasl.password" = "${KAFKA_PASSWORD}"`).
//!
//! Syntax: `${NAME}` with `NAME` = `[A-Za-z_][A-Za-z0-9_]*` is replaced by the variable's value, verbatim;
//! `$$` is a literal `$`; any other `$` is kept as written. An unset variable is a configuration error naming
//! `file:line:column` and the variable — never the value of anything. In a secret ([`Secrecy`]: a password, a
//! secret librdkafka property, the password of a URL) a `${…}` may be part of the secret itself: the error names
//! the variable only when the reference is the whole secret (`password = "${REG_PASSWORD}"`), and never echoes
//! the text of an invalid one.

use std::ops::Range;

use super::Source;
use crate::error::Result;

/// Which part of a value may be a secret, for the errors of its expansion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secrecy {
    /// Not a secret (paths, modes, host names): errors name what they refer to.
    Public,
    /// The whole value is a secret (a password, a secret librdkafka property or one librdkafka does not know).
    Secret,
    /// A URL: its userinfo's password and `password=` parameters are secret ([`secret_ranges`]).
    Url,
}

/// `text` (the value of the key at `span`, not a secret) with every `${NAME}` replaced by the environment
/// variable `NAME`.
///
/// # Errors
/// [`crate::error::Error::Config`] at `span` when a variable is unset (or not valid Unicode), or a `${` is not
/// closed by a valid name and `}`.
pub fn expand(src: &Source, text: &str, span: Range<usize>) -> Result<String> {
    expand_as(src, text, span, Secrecy::Public)
}

/// [`expand`] of a value that may hold a secret (`secrecy`): its errors never show the secret's text.
///
/// # Errors
/// As [`expand`].
pub fn expand_as(src: &Source, text: &str, span: Range<usize>, secrecy: Secrecy) -> Result<String> {
    expand_with(text, secrecy, |name| std::env::var(name).ok()).map_err(|m| src.error(span, m))
}

/// The byte ranges of `text` that hold a secret under `secrecy`: all of it, or a URL's password (after the
/// userinfo's first `:` up to its last `@`) and the values of `password=` parameters.
pub fn secret_ranges(text: &str, secrecy: Secrecy) -> Vec<Range<usize>> {
    match secrecy {
        Secrecy::Public => Vec::new(),
        Secrecy::Secret => std::iter::once(0..text.len()).collect(),
        Secrecy::Url => {
            let mut out = Vec::new();
            if let Some(start) = text.find("://").map(|i| i + 3) {
                let end = text[start..]
                    .find(char::is_whitespace)
                    .map_or(text.len(), |e| start + e);
                if let Some(at) = text[start..end].rfind('@').map(|a| start + a) {
                    if let Some(colon) = text[start..at].find(':').map(|c| start + c) {
                        out.push(colon + 1..at);
                    }
                }
            }
            let lower = text.to_ascii_lowercase();
            let mut from = 0;
            while let Some(i) = lower[from..].find("password=").map(|i| from + i + 9) {
                let end = text[i..]
                    .find(|c: char| c == '&' || c.is_whitespace())
                    .map_or(text.len(), |e| i + e);
                out.push(i..end);
                from = end.max(i);
            }
            out
        }
    }
}

/// [`expand`] over a lookup function (tests); the error is the message alone.
pub fn expand_with(
    text: &str,
    secrecy: Secrecy,
    lookup: impl Fn(&str) -> Option<String>,
) -> std::result::Result<String, String> {
    let secrets = secret_ranges(text, secrecy);
    // A reference inside a secret but not the whole of it may be part of the secret: its text is not shown.
    let hidden = |at: Range<usize>| {
        secrets
            .iter()
            .any(|s| s.start < at.end && at.start < s.end && *s != at)
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        let at = text.len() - rest.len() + i;
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
            let hide = hidden(at..at + end + 3);
            if hide && !valid_name(name) {
                return Err(
                    "a `${…}` in this secret value is not a valid environment variable reference (its text is \
                     not shown; write `$$` for a literal `$`)"
                        .to_string(),
                );
            }
            if !valid_name(name) {
                return Err(format!(
                    "`${{{name}}}` is not a valid environment variable reference (letters, digits, `_`; \
                     write `$$` for a literal `$`)"
                ));
            }
            let value = lookup(name).ok_or_else(|| match hide {
                true => "a `${NAME}` in this secret value names an environment variable that is not set (the \
                         name is not shown: it may be part of the secret; write `$${` for a literal `${`)"
                    .to_string(),
                false => {
                    format!("environment variable `{name}` is not set (referenced as `${{{name}}}`)")
                }
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
        let public = |t: &str| expand_with(t, Secrecy::Public, env);
        assert_eq!(public("a${PW}b").unwrap(), "as3cr$tb");
        assert_eq!(public("$$${PW}$x").unwrap(), "$s3cr$t$x");
        assert_eq!(public("no vars").unwrap(), "no vars");
        let e = public("x${NOPE}").unwrap_err();
        assert!(e.contains("`NOPE` is not set"), "{e}");
        assert!(public("${PW").unwrap_err().contains("not closed"));
        assert!(public("${1X}").unwrap_err().contains("not a valid"));
    }

    /// A `${…}` inside a secret may be part of it: named only when it is the whole secret.
    #[test]
    fn secrets_are_not_echoed_in_expansion_errors() {
        for (text, secrecy, hidden) in [
            ("pa${ss!w}rd", Secrecy::Secret, "ss!w"),
            ("pa${SsWord}x", Secrecy::Secret, "SsWord"),
            ("postgresql://u:p${Wd1}x@h/db", Secrecy::Url, "Wd1"),
            ("http://u:p${w-d}@h", Secrecy::Url, "w-d"),
            ("postgresql://h/db?password=a${Bc}d", Secrecy::Url, "Bc"),
        ] {
            let e = expand_with(text, secrecy, env).unwrap_err();
            assert!(
                !e.contains(hidden) && e.contains("secret value"),
                "{text}: {e}"
            );
        }
        for (text, secrecy) in [
            ("${NOPE}", Secrecy::Secret),
            ("postgresql://u:${NOPE}@h/db", Secrecy::Url),
            ("postgresql://u@${NOPE}/db", Secrecy::Url),
            ("${NOPE}", Secrecy::Url),
        ] {
            let e = expand_with(text, secrecy, env).unwrap_err();
            assert!(e.contains("`NOPE` is not set"), "{text}: {e}");
        }
        assert_eq!(
            expand_with("http://u:${PW}@h", Secrecy::Url, env).unwrap(),
            "http://u:s3cr$t@h"
        );
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
