//! `[postgres]` timeouts: every wait on PostgreSQL is bounded (PostgreSQL manual, "Client Connection Defaults":
//! `lock_timeout`, `statement_timeout`, `idle_in_transaction_session_timeout`). Pinned on every replaysafe
//! session ([`crate::sink::connect_with`]).

use std::time::Duration;

use toml::Spanned;

use super::raw::RawPostgres;
use super::source::Source;
use crate::error::Result;

/// Default `postgres.lock-timeout-ms`: a take-over (fence bump) or a batch waits this long for a row lock held by
/// another session (a frozen previous owner) before giving up with SQLSTATE 55P03 and retrying later.
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 5_000;
/// Default `postgres.statement-timeout-ms`: one statement (a batch's claim, projection, checkpoint) at most.
pub const DEFAULT_STATEMENT_TIMEOUT_MS: u64 = 60_000;
/// Default `postgres.idle-in-transaction-timeout-ms`: PostgreSQL ends a session whose transaction stays open
/// and idle this long (a frozen, `SIGSTOP`ped owner), well before a 45 s `session.timeout.ms` hands its
/// partitions to another member, so the new owner's take-over is not blocked by it for long.
pub const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS: u64 = 20_000;
/// The largest value PostgreSQL accepts for these settings (milliseconds, a 32-bit integer).
pub const MAX_TIMEOUT_MS: u64 = i32::MAX as u64;

/// The timeouts pinned on every replaysafe session, validated (each in 1 ..= [`MAX_TIMEOUT_MS`] ms, the lock
/// timeout below the statement timeout, since a lock wait counts toward the statement's time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `lock_timeout`: longest wait for any lock (row, table, advisory).
    pub lock: Duration,
    /// `statement_timeout`: longest run of one statement (SQLSTATE 57014 when exceeded).
    pub statement: Duration,
    /// `idle_in_transaction_session_timeout`: a session idle inside a transaction this long is ended by the
    /// server (SQLSTATE 25P03), releasing its locks.
    pub idle_in_transaction: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            lock: Duration::from_millis(DEFAULT_LOCK_TIMEOUT_MS),
            statement: Duration::from_millis(DEFAULT_STATEMENT_TIMEOUT_MS),
            idle_in_transaction: Duration::from_millis(DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS),
        }
    }
}

impl Timeouts {
    /// The `SET` statements that pin them on a session (values in ms, integers only).
    pub fn settings(&self) -> String {
        format!(
            "SET lock_timeout = {}; SET statement_timeout = {}; SET idle_in_transaction_session_timeout = {}",
            self.lock.as_millis(),
            self.statement.as_millis(),
            self.idle_in_transaction.as_millis()
        )
    }
}

fn millis(src: &Source, v: &Option<Spanned<i64>>, key: &str, default: u64) -> Result<u64> {
    match v {
        None => Ok(default),
        Some(s) if (1..=crate::units::bigint(MAX_TIMEOUT_MS)).contains(s.get_ref()) => {
            Ok(crate::units::count(*s.get_ref()))
        }
        Some(s) => Err(src.error(
            s.span(),
            format!(
                "`{key}` must be a whole number of milliseconds between 1 and {MAX_TIMEOUT_MS}"
            ),
        )),
    }
}

/// Validates the `[postgres]` timeouts.
///
/// # Errors
/// [`crate::error::Error::Config`] (`file:line:column`) for a value out of range, or a `lock-timeout-ms` not
/// below `statement-timeout-ms`.
pub fn timeouts(src: &Source, raw: &RawPostgres) -> Result<Timeouts> {
    let lock = millis(
        src,
        &raw.lock_timeout_ms,
        "lock-timeout-ms",
        DEFAULT_LOCK_TIMEOUT_MS,
    )?;
    let statement = millis(
        src,
        &raw.statement_timeout_ms,
        "statement-timeout-ms",
        DEFAULT_STATEMENT_TIMEOUT_MS,
    )?;
    let idle = millis(
        src,
        &raw.idle_in_transaction_timeout_ms,
        "idle-in-transaction-timeout-ms",
        DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    )?;
    if lock >= statement {
        let span = raw
            .lock_timeout_ms
            .as_ref()
            .or(raw.statement_timeout_ms.as_ref())
            .map(|s| s.span())
            .unwrap_or(0..0);
        return Err(src.error(
            span,
            format!(
                "`lock-timeout-ms` ({lock}) must be below `statement-timeout-ms` ({statement}): a lock wait counts \
                 toward the statement's time, so the lock timeout would never fire"
            ),
        ));
    }
    Ok(Timeouts {
        lock: Duration::from_millis(lock),
        statement: Duration::from_millis(statement),
        idle_in_transaction: Duration::from_millis(idle),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    const BASE: &str = "[kafka]\ngroup-id = \"g\"\ntopics = [\"t\"]\n[fields]\nevent_id = { path = \"/event_id\", type = \"uuid\" }\n[identity]\nkey = [\"event_id\"]\n[postgres]\n";

    fn parse(extra: &str) -> Result<Timeouts> {
        crate::config::parse("p.toml", &format!("{BASE}{extra}")).map(|p| p.postgres.timeouts)
    }

    #[test]
    fn defaults_fit_a_45_second_session_timeout() {
        let t = parse("").unwrap();
        assert_eq!(t, Timeouts::default());
        assert!(t.idle_in_transaction < Duration::from_secs(45));
        assert_eq!(
            t.settings(),
            "SET lock_timeout = 5000; SET statement_timeout = 60000; \
             SET idle_in_transaction_session_timeout = 20000"
        );
    }

    #[test]
    fn values_are_read_and_validated_with_their_location() {
        let t = parse("lock-timeout-ms = 100\nstatement-timeout-ms = 200\nidle-in-transaction-timeout-ms = 300\n")
            .unwrap();
        assert_eq!(t.lock, Duration::from_millis(100));
        assert_eq!(t.statement, Duration::from_millis(200));
        assert_eq!(t.idle_in_transaction, Duration::from_millis(300));
        for (extra, line, needle) in [
            ("lock-timeout-ms = 0\n", 9, "`lock-timeout-ms` must be"),
            (
                "statement-timeout-ms = 2147483648\n",
                9,
                "`statement-timeout-ms` must be",
            ),
            (
                "idle-in-transaction-timeout-ms = -5\n",
                9,
                "`idle-in-transaction-timeout-ms`",
            ),
            (
                "connections = 2\nlock-timeout-ms = 60000\n",
                10,
                "must be below `statement-timeout-ms`",
            ),
        ] {
            match parse(extra) {
                Err(Error::Config { location, message }) => {
                    assert_eq!(
                        location.split(':').nth(1),
                        Some(&*line.to_string()),
                        "{extra}"
                    );
                    assert!(message.contains(needle), "{message}");
                }
                other => panic!("{extra}: {other:?}"),
            }
        }
    }
}
