//! Connection poolers between replaysafe and PostgreSQL (issue 40 item 1, case C45; docs/operations.md "Behind a connection
//! pooler").
//!
//! replaysafe keeps state on each session: the statements a batch needs, prepared once per connection (named,
//! server-side), the temporary table `landed`, and its pinned settings ([`super::SESSION_SETTINGS`], the
//! timeouts). A pooler in *session* mode (PgBouncer `pool_mode = session`) gives a client one server session
//! for its whole connection and resets it (`server_reset_query`, `DISCARD ALL`) before the next client: to
//! replaysafe that is a direct connection. A pooler in *transaction* or *statement* mode hands the server
//! session to another client after every transaction: the prepared statements and `landed` are then missing
//! (SQLSTATE 26000, 42P01) or collide with another client's (42P05), and the pinned settings apply to other
//! clients. replaysafe does not run that way: [`refuse_transaction_pooling`] finds such a pooler at the first
//! connection of a process to a URL, before any setting is made, and refuses with the way out.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};

use crate::error::{Error, Result};

/// How long the probe's second look at its first connection's backend waits before the other connection's
/// transaction ends: a direct session answers a `SELECT` at once; behind a transaction pooler whose servers are
/// all busy it waits for one (the other connection holds one of them).
pub const PROBE_HOLD: Duration = Duration::from_secs(2);

/// The longest the probe's second look may take in all ([`PROBE_HOLD`] included): a server slower than that to
/// answer a `SELECT` is an error naming it.
pub const PROBE_WAIT: Duration = Duration::from_secs(30);

/// URLs this process probed and found without a transaction pooler.
static PROBED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// What one probe saw: the backend pid of connection A, of connection B inside an open transaction, then of A
/// again (while B's transaction is open, or once it ended when A found no server within [`PROBE_HOLD`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// A's backend before B's transaction.
    pub first: i32,
    /// B's backend, its transaction open.
    pub other: i32,
    /// A's backend again.
    pub again: i32,
}

impl Probe {
    /// Whether two transactions of one connection ran on different server sessions (or one connection was
    /// given the server session of another): never so for a direct connection or a session pooler.
    pub fn pooled(&self) -> bool {
        self.other == self.first || self.again != self.first
    }
}

/// Refuses a connection pooler in transaction or statement mode in front of `url`, once per process and URL:
/// two connections without any setting (`connect(config)`), A reads its backend pid, B opens a transaction and
/// reads its own, A reads its own again — A's session moved (or B got it) only behind such a pooler ([`Probe`]).
///
/// # Errors
/// [`Error::Usage`] (exit 2) naming the address and the way out (session pooling or a direct connection); a
/// connection error as [`super::connect_with`].
pub(super) async fn refuse_transaction_pooling<F, Fut>(
    url: &str,
    address: &str,
    connect: F,
) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Client>>,
{
    if probed(url) {
        return Ok(());
    }
    let (a, b) = (connect().await?, connect().await?);
    let probe = match probe(&a, &b).await {
        Ok(p) => p,
        // PgBouncer in statement mode refuses transaction blocks.
        Err(e) if e.to_string().contains("transaction blocks not allowed") => {
            return Err(refusal(
                address,
                "statement pooling refused a transaction block",
            ));
        }
        Err(e) => return Err(e),
    };
    if probe.pooled() {
        let seen = format!(
            "one connection's statements ran on server sessions (backend pids) {} and {}, another connection's \
             transaction on {}",
            probe.first, probe.again, probe.other
        );
        return Err(refusal(address, &seen));
    }
    // Noted only once answered: a server down at the first attempt is probed again at the next.
    PROBED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(url.to_string());
    Ok(())
}

/// Whether this process already probed `url`.
fn probed(url: &str) -> bool {
    let guard = PROBED.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_ref().is_some_and(|s| s.contains(url))
}

/// The probe's three reads (simple-protocol queries: no prepared statement, one round trip each).
async fn probe(a: &Client, b: &Client) -> Result<Probe> {
    let first = backend(a).await?;
    b.batch_execute("BEGIN").await?;
    let other = backend(b).await?;
    let look = backend(a);
    tokio::pin!(look);
    let held = tokio::time::timeout(PROBE_HOLD, &mut look).await;
    b.batch_execute("ROLLBACK").await?;
    let again = match held {
        Ok(r) => r?,
        Err(_) => tokio::time::timeout(PROBE_WAIT - PROBE_HOLD, look)
            .await
            .map_err(|_| {
                Error::Other(format!(
                    "PostgreSQL did not answer `SELECT pg_backend_pid()` within {}s (the connection-pooler \
                     probe, docs/operations.md \"Behind a connection pooler\")",
                    PROBE_WAIT.as_secs()
                ))
            })??,
    };
    Ok(Probe {
        first,
        other,
        again,
    })
}

/// `pg_backend_pid()` of the server session that answers `c`'s next statement.
async fn backend(c: &Client) -> Result<i32> {
    let rows = c.simple_query("SELECT pg_catalog.pg_backend_pid()").await?;
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .ok_or_else(|| Error::Other("pg_backend_pid() returned no row".into()))
}

fn refusal(address: &str, seen: &str) -> Error {
    Error::Usage(format!(
        "PostgreSQL at {address} is behind a connection pooler in transaction or statement pooling mode ({seen}). \
         replaysafe keeps state on its session — prepared statements, the temporary table `landed`, its pinned \
         settings (search_path, timeouts) — which such a pooler hands to other clients between transactions. \
         Connect through a session pool (PgBouncer `pool_mode = session`) or to PostgreSQL directly (docs/operations.md \
         \"Behind a connection pooler\")"
    ))
}

#[cfg(test)]
mod tests {
    use super::Probe;

    #[test]
    fn a_session_that_stays_and_is_not_shared_is_not_pooled() {
        let direct = Probe {
            first: 10,
            other: 11,
            again: 10,
        };
        assert!(!direct.pooled());
        for pooled in [
            // B was given A's server session (PgBouncer reuses the last released server first).
            Probe {
                first: 10,
                other: 10,
                again: 11,
            },
            // A's next statement ran elsewhere.
            Probe {
                first: 10,
                other: 11,
                again: 12,
            },
        ] {
            assert!(pooled.pooled(), "{pooled:?}");
        }
    }
}
