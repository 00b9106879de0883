//! TLS to PostgreSQL with OpenSSL (`postgres-openssl`, maintained with tokio-postgres itself).
//!
//! Why OpenSSL: librdkafka already links it (the rdkafka `ssl` feature), so one TLS library and one set of
//! build prerequisites (`libssl-dev`) serve both PostgreSQL and Kafka; it is the library libpq uses, so
//! certificates and keys that work with `psql` work here, and its verification messages ("unable to get local
//! issuer certificate", "Hostname mismatch") are the ones operators know. The libpq semantics followed (PostgreSQL
//! manual, "SSL Support" § Protection Provided in Different Modes):
//!
//! | `sslmode` | TLS | certificate chain | host name |
//! |---|---|---|---|
//! | `disable` | no | – | – |
//! | `prefer` (default) | when offered | not checked* | no |
//! | `require` | required | not checked* | no |
//! | `verify-ca` | required | must chain to `sslrootcert` | no |
//! | `verify-full` | required | must chain to `sslrootcert` | must match the host connected to |
//!
//! \* as in libpq, an explicit `sslrootcert` makes `prefer`/`require` check the chain (as `verify-ca`).
//! `sslrootcert` is a PEM file (only its CAs are trusted) or `system` (the system's trusted CAs); for the verify
//! modes without it, `~/.postgresql/root.crt` is used when it exists, else the connection is refused with a
//! message saying so. `sslcert`/`sslkey` present a client certificate (`cert` authentication); the key file
//! must not be readable by group or others (0600; 0640 when owned by root), as libpq requires.

use std::path::{Path, PathBuf};

use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use postgres_openssl::MakeTlsConnector;

use super::conninfo::Security;
use crate::config::SslMode;
use crate::error::{Error, Result};

/// The connector for one connection's [`Security`]; `None` for `sslmode=disable`, where no TLS is spoken and,
/// as in libpq, `sslrootcert`/`sslcert`/`sslkey` are not read (building a connector loads the system's CA
/// store, ≈ 40 ms of CPU per connection).
///
/// # Errors
/// [`Error::Usage`] naming the file and the key when a CA file, certificate or key cannot be read or used, a key
/// file is readable by others, or a verify mode has no CA to verify with.
pub fn connector(s: &Security) -> Result<Option<MakeTlsConnector>> {
    if s.mode == SslMode::Disable {
        return Ok(None);
    }
    let setup =
        |what: String| move |e: openssl::error::ErrorStack| Error::Usage(format!("{what}: {e}"));
    let mut b = SslConnector::builder(SslMethod::tls_client())
        .map_err(setup("TLS setup (OpenSSL)".into()))?;
    let verify = match (s.mode, trust_anchor(s)?) {
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(Error::Usage(format!(
                "sslmode={} needs the CA certificate that signed the server's: set sslrootcert (a PEM file, or \
                 `system` for the system's trusted CAs) in the URL or in [postgres]",
                s.mode.as_str()
            )))
        }
        (_, None) => false,
        (_, Some(Anchor::System)) => true,
        (_, Some(Anchor::File(path))) => {
            b.set_cert_store(ca_store(&path)?);
            true
        }
    };
    b.set_verify(match verify {
        true => SslVerifyMode::PEER,
        false => SslVerifyMode::NONE,
    });
    if let Some((cert, key)) = &s.client {
        check_key_permissions(key)?;
        b.set_certificate_chain_file(cert)
            .map_err(setup(format!("sslcert {}", cert.display())))?;
        b.set_private_key_file(key, SslFiletype::PEM)
            .map_err(setup(format!(
                "sslkey {} (the key of sslcert {})",
                key.display(),
                cert.display()
            )))?;
        b.check_private_key().map_err(setup(format!(
            "sslkey {} does not match sslcert {}",
            key.display(),
            cert.display()
        )))?;
    }
    let mut connector = MakeTlsConnector::new(b.build());
    let full = s.mode == SslMode::VerifyFull;
    connector.set_callback(move |c, _| {
        c.set_verify_hostname(full);
        Ok(())
    });
    Ok(Some(connector))
}

enum Anchor {
    System,
    File(PathBuf),
}

/// The CAs to verify with: `sslrootcert`, else `~/.postgresql/root.crt` for the verify modes when it exists.
fn trust_anchor(s: &Security) -> Result<Option<Anchor>> {
    Ok(match s.rootcert.as_deref() {
        Some("system") => Some(Anchor::System),
        Some(p) => Some(Anchor::File(PathBuf::from(p))),
        None if matches!(s.mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".postgresql/root.crt"))
                .filter(|p| p.is_file())
                .map(Anchor::File)
        }
        None => None,
    })
}

/// A store holding only the certificates of the PEM file `path`.
fn ca_store(path: &Path) -> Result<openssl::x509::store::X509Store> {
    let bad = |m: String| Error::Usage(format!("sslrootcert {}: {m}", path.display()));
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let certs = X509::stack_from_pem(&pem).map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in the file".into()));
    }
    let mut store = X509StoreBuilder::new().map_err(|e| bad(e.to_string()))?;
    for c in certs {
        store.add_cert(c).map_err(|e| bad(e.to_string()))?;
    }
    Ok(store.build())
}

/// libpq's rule (`fe-secure-openssl.c`): a private key with any group or other permission is refused; owned by
/// root, group read is allowed (0640). The owner's own bits are not checked (0700 is accepted, as by libpq).
fn check_key_permissions(key: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(key)
        .map_err(|e| Error::Usage(format!("sslkey {}: {e}", key.display())))?;
    let mode = meta.mode() & 0o777;
    let forbidden = if meta.uid() == 0 { 0o037 } else { 0o077 };
    if mode & forbidden != 0 {
        return Err(Error::Usage(format!(
            "sslkey {} has permissions {mode:04o}: a private key must not be readable by others, nor by its \
             group unless owned by root, nor writable by either (chmod 0600)",
            key.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `disable` builds no connector and reads no TLS file (as libpq); any other mode reads them and names the
    /// one it cannot use.
    #[test]
    fn disable_reads_no_tls_file() {
        let security = |mode| Security {
            mode,
            rootcert: Some("/nonexistent/root.crt".into()),
            client: Some(("/nonexistent/c.crt".into(), "/nonexistent/c.key".into())),
        };
        assert!(connector(&security(SslMode::Disable)).unwrap().is_none());
        for mode in [SslMode::Prefer, SslMode::Require, SslMode::VerifyFull] {
            let e = connector(&security(mode))
                .err()
                .expect("refused")
                .to_string();
            assert!(e.contains("/nonexistent/"), "{e}");
        }
    }
}
