//! `[source] transactions`, `transaction-timeout-ms`, `transaction-buffer-bytes`: Debezium source transactions
//! applied atomically (opt-in; docs/cdc.md "Source transactions").

use std::time::Duration;

use super::fields::Format;
use super::raw::RawSource;
use super::source::Source;
use crate::error::Result;

/// Default `transaction-timeout-ms`: a BEGIN whose END (or whose last change) has not arrived after this long is
/// applied as it is.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Default `transaction-buffer-bytes`: the bytes (keys + values) of buffered, unapplied transactions.
pub const DEFAULT_BUFFER_BYTES: u64 = 64 * 1024 * 1024;

/// `[source] transactions = "atomic"`, validated.
#[derive(Debug, Clone)]
pub struct TxPlan {
    /// How long an open transaction is held at most, from its first record seen.
    pub timeout: Duration,
    /// Bytes of buffered records (keys + values) above which the oldest open transaction is applied as it is.
    pub buffer_bytes: usize,
}

/// Validates the transaction keys of `[source]`: `Some` for `transactions = "atomic"` (Debezium only), `None` for
/// `"none"` (the default); the two other keys only with `"atomic"`.
///
/// # Errors
/// [`crate::error::Error::Config`] naming the key's `file:line:column`.
pub fn plan(src: &Source, raw: Option<&RawSource>, format: Format) -> Result<Option<TxPlan>> {
    let Some(raw) = raw else { return Ok(None) };
    let atomic = match &raw.transactions {
        None => false,
        Some(t) => match t.get_ref().as_str() {
            "none" => false,
            "atomic" if format == Format::Debezium => true,
            "atomic" => {
                return Err(src.error(
                    t.span(),
                    "`transactions = \"atomic\"` applies to format = \"debezium\" (it reads Debezium's transaction metadata)",
                ))
            }
            other => {
                return Err(src.error(
                    t.span(),
                    format!("`transactions` must be \"none\" or \"atomic\", not `{other}`"),
                ))
            }
        },
    };
    for (key, v) in [
        ("transaction-timeout-ms", &raw.transaction_timeout_ms),
        ("transaction-buffer-bytes", &raw.transaction_buffer_bytes),
    ] {
        match v {
            Some(s) if !atomic => {
                return Err(src.error(
                    s.span(),
                    format!("`{key}` applies to transactions = \"atomic\""),
                ))
            }
            Some(s) if *s.get_ref() <= 0 => {
                return Err(src.error(s.span(), format!("`{key}` must be a positive whole number")))
            }
            _ => {}
        }
    }
    if !atomic {
        return Ok(None);
    }
    let get = |v: &Option<toml::Spanned<i64>>, d: u64| {
        v.as_ref().map_or(d, |s| crate::units::count(*s.get_ref()))
    };
    Ok(Some(TxPlan {
        timeout: Duration::from_millis(get(&raw.transaction_timeout_ms, DEFAULT_TIMEOUT_MS)),
        buffer_bytes: crate::units::len(get(&raw.transaction_buffer_bytes, DEFAULT_BUFFER_BYTES)),
    }))
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    const HEAD: &str = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n";

    fn with(source: &str) -> std::result::Result<crate::config::Pipeline, String> {
        parse("p.toml", &format!("{HEAD}[source]\n{source}\n")).map_err(|e| e.to_string())
    }

    #[test]
    fn atomic_reads_its_keys_and_defaults() {
        let p =
            with("format = \"debezium\"\ntransactions = \"atomic\"\ntransaction-timeout-ms = 250")
                .unwrap();
        let t = p.transactions.unwrap();
        assert_eq!(t.timeout.as_millis(), 250);
        assert_eq!(t.buffer_bytes as u64, super::DEFAULT_BUFFER_BYTES);
        assert!(with("format = \"debezium\"")
            .unwrap()
            .transactions
            .is_none());
        assert!(with("format = \"debezium\"\ntransactions = \"none\"")
            .unwrap()
            .transactions
            .is_none());
    }

    #[test]
    fn bad_transaction_keys_name_the_key_and_place() {
        let e = with("format = \"debezium\"\ntransactions = \"yes\"").unwrap_err();
        assert!(
            e.contains("p.toml:6:16") && e.contains("\"none\" or \"atomic\", not `yes`"),
            "{e}"
        );
        let e = with("format = \"json\"\ntransactions = \"atomic\"\n[fields]\nx = { path = \"/x\", type = \"text\" }")
            .unwrap_err();
        assert!(e.contains("applies to format = \"debezium\""), "{e}");
        let e = with("format = \"debezium\"\ntransaction-timeout-ms = 5").unwrap_err();
        assert!(
            e.contains("`transaction-timeout-ms` applies to transactions = \"atomic\""),
            "{e}"
        );
        let e =
            with("format = \"debezium\"\ntransactions = \"atomic\"\ntransaction-buffer-bytes = 0")
                .unwrap_err();
        assert!(
            e.contains("`transaction-buffer-bytes` must be a positive whole number"),
            "{e}"
        );
    }
}
