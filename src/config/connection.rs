//! `[postgres]` connection security keys: `sslmode`, `sslrootcert`, `sslcert`, `sslkey` (spelled as libpq spells
//! them, PostgreSQL manual "Database Connection Control Functions" § Parameter Key Words) and `password-file`.
//! Each may also come from the URL (`?sslmode=verify-full&sslrootcert=…`); the connection merges both
//! (`crate::sink::conninfo`). Values go through `${NAME}` expansion ([`super::expand`]).

use std::path::PathBuf;

use toml::Spanned;

use super::raw::RawPostgres;
use super::Source;
use crate::error::Result;

/// libpq's `sslmode`, the subset replaysafe implements (`allow` is not: it is never safer than `prefer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, no certificate check (libpq's default).
    Prefer,
    /// TLS or no connection; the certificate is not checked (unless `sslrootcert` is set: then as `VerifyCa`,
    /// as libpq does).
    Require,
    /// TLS; the server's certificate must chain to `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    /// Parses libpq's spelling.
    ///
    /// # Errors
    /// The message naming the accepted values.
    pub fn parse(s: &str) -> std::result::Result<SslMode, String> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(format!(
                "`sslmode` must be disable, prefer, require, verify-ca or verify-full, not `{s}`"
            ))
            }
        })
    }

    /// libpq's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The connection security settings of `[postgres]` (all optional; the URL may set the same parameters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionPlan {
    /// `sslmode`.
    pub sslmode: Option<SslMode>,
    /// `sslrootcert`: a PEM file of trusted CA certificates, or `system` (the system's trusted CAs).
    pub sslrootcert: Option<String>,
    /// `sslcert`: the client certificate (PEM), for `cert` authentication.
    pub sslcert: Option<PathBuf>,
    /// `sslkey`: the client certificate's private key (PEM, permissions 0600 or stricter).
    pub sslkey: Option<PathBuf>,
    /// `password-file`: a file whose first line is the password (read at every connection, so a rotated
    /// password is picked up by new connections).
    pub password_file: Option<PathBuf>,
}

/// Validates the connection keys of `[postgres]` (after `${NAME}` expansion).
///
/// # Errors
/// [`crate::error::Error::Config`] at the key for a bad `sslmode`, an empty path, `sslcert` without `sslkey` (or
/// the reverse) or an unset variable.
pub fn connection(src: &Source, raw: &RawPostgres) -> Result<ConnectionPlan> {
    let text = |v: &Option<Spanned<String>>| -> Result<Option<(String, std::ops::Range<usize>)>> {
        match v {
            None => Ok(None),
            Some(s) => {
                let value = super::expand::expand(src, s.get_ref(), s.span())?;
                if value.trim().is_empty() {
                    return Err(src.error(s.span(), "the value is empty"));
                }
                Ok(Some((value, s.span())))
            }
        }
    };
    let sslmode = match text(&raw.sslmode)? {
        Some((v, span)) => Some(SslMode::parse(&v).map_err(|m| src.error(span, m))?),
        None => None,
    };
    let sslcert = text(&raw.sslcert)?;
    let sslkey = text(&raw.sslkey)?;
    if let (Some((_, span)), None) | (None, Some((_, span))) = (&sslcert, &sslkey) {
        return Err(src.error(
            span.clone(),
            "a client certificate needs both `sslcert` and `sslkey`",
        ));
    }
    Ok(ConnectionPlan {
        sslmode,
        sslrootcert: text(&raw.sslrootcert)?.map(|(v, _)| v),
        sslcert: sslcert.map(|(v, _)| PathBuf::from(v)),
        sslkey: sslkey.map(|(v, _)| PathBuf::from(v)),
        password_file: text(&raw.password_file)?.map(|(v, _)| PathBuf::from(v)),
    })
}
