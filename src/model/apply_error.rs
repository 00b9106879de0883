//! Why a batch did not commit ([`ApplyError`]) and the SQLSTATE classification that decides retry or fail.

use super::batch::Outcome;
use crate::decode::Rejection;
use crate::error::Error;

/// Why a batch did not commit.
#[derive(Debug)]
pub enum ApplyError {
    /// Another owner took the partition (its fence is newer) or moved the checkpoint: nothing was written.
    Fenced {
        /// The checkpoint now stored.
        next_offset: Option<i64>,
        /// The fence now stored.
        fence: i64,
    },
    /// The connection failed or the server asked us to retry (serialization failure, deadlock, shutdown).
    /// `commit_sent` means the outcome is unknown: the COMMIT may have succeeded.
    Transient {
        /// The error.
        error: tokio_postgres::Error,
        /// Whether COMMIT had been sent.
        commit_sent: bool,
        /// With `commit_sent`: the outcomes the transaction computed, true if the COMMIT did land.
        outcomes: Option<Vec<Outcome>>,
    },
    /// PostgreSQL rejected a value ([`rejects_a_value`]: a data exception, a constraint, a program limit such
    /// as the index row size, an exception raised by a routine): replay record by record to find it.
    Data(tokio_postgres::Error),
    /// Anything else: a bug in a projection statement, a dropped table.
    Fatal(Error),
    /// One record cannot be applied (a value its row projection cannot convert): quarantine it, retry the batch.
    Record {
        /// Its offset.
        offset: i64,
        /// Why.
        rejection: Rejection,
    },
}

/// SQLSTATE 25006 `read_only_sql_transaction`: the session reached a server (or a session setting) that
/// refuses writes — what a failover to a replica looks like until the pool reconnects (case C37). Retried on a
/// new connection.
pub const READ_ONLY: &str = "25006";

/// SQLSTATE 25P03 `idle_in_transaction_session_timeout`: the server ended a session whose transaction stayed
/// idle past `postgres.idle-in-transaction-timeout-ms` (nothing of it committed). Retried on a new connection.
pub const IDLE_IN_TRANSACTION_TIMEOUT: &str = "25P03";

/// SQLSTATEs of a session that lost its prepared statements or met another client's: 26000
/// `invalid_sql_statement_name` ("prepared statement \"s3\" does not exist") and 42P05
/// `duplicate_prepared_statement` — what a connection pooler in transaction mode produces (case C45; such a pooler
/// is refused at start-up, `sink::pooler`, these are for one that changes mode under a running process).
/// Never a record's fault: retried on a new connection ([`needs_new_session`]), never dead-lettered.
pub const SESSION_LOST: [&str; 2] = ["26000", "42P05"];

/// Whether the retry of an error needs a new connection: [`READ_ONLY`] or [`SESSION_LOST`].
pub fn needs_new_session(e: &tokio_postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| c.code() == READ_ONLY || SESSION_LOST.contains(&c.code()))
}

/// Whether a SQLSTATE means "try again" (PostgreSQL manual, Appendix A "Error Codes"): classes 08 connection,
/// 40 rollback (deadlock, serialization), 53 resources, 55 lock not available, 57 operator intervention
/// (shutdown, terminated, 57014 statement timeout), [`READ_ONLY`] and [`IDLE_IN_TRANSACTION_TIMEOUT`]. The one
/// rule for batches, take-over and start-up. Class 40 (40P01 deadlock, 40001 serialization failure) means
/// PostgreSQL rolled the whole transaction back: a batch is redone as a new transaction from its first step,
/// claims included (case C36).
pub fn retryable(code: &str) -> bool {
    code == READ_ONLY
        || code == IDLE_IN_TRANSACTION_TIMEOUT
        || SESSION_LOST.contains(&code)
        || matches!(code.get(..2), Some("08" | "40" | "53" | "55" | "57"))
}

/// Whether a PostgreSQL error came from a read-only session ([`READ_ONLY`]): the connection is replaced before
/// the retry.
pub fn is_read_only(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| c.code() == READ_ONLY)
}

/// `message (SQLSTATE code)` for a server error, the client's text otherwise — for retry log lines.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Whether a SQLSTATE can come from one record's values (PostgreSQL manual, Appendix A "Error Codes"): class 22
/// data exception, 23 integrity constraint violation, 54 program limit exceeded (54000: an index row larger than
/// a B-tree page allows — a group-by or key text of some 2.7 kB), 44 `WITH CHECK OPTION` violation, and the
/// exceptions a routine raises (2F SQL routine, 38 external routine, 39 external routine invocation, P0
/// PL/pgSQL: `RAISE`, `ASSERT`) — a trigger or a function of a `sql` projection refusing a value. A batch
/// failing with one is replayed record by record, and the record that fails alone is quarantined as
/// `rejected-by-database`; one that is systematic (every record fails) is stopped by `[errors] tolerance`.
pub fn rejects_a_value(code: &str) -> bool {
    matches!(
        code.get(..2),
        Some("22" | "23" | "54" | "44" | "2F" | "38" | "39" | "P0")
    )
}

/// Classifies a PostgreSQL error by SQLSTATE ([`retryable`]; [`rejects_a_value`] data errors; the rest fatal).
pub fn classify(e: tokio_postgres::Error, commit_sent: bool) -> ApplyError {
    let Some(code) = e.code().map(|c| c.code().to_string()) else {
        // No SQLSTATE: I/O error or closed connection.
        return ApplyError::Transient {
            error: e,
            commit_sent,
            outcomes: None,
        };
    };
    if retryable(&code) {
        return ApplyError::Transient {
            error: e,
            commit_sent,
            outcomes: None,
        };
    }
    if code == "42501" {
        // A grant the runtime role lacks (a projection table without INSERT …): named with the way to list them.
        ApplyError::Fatal(explain_missing(Error::Postgres(e)))
    } else if rejects_a_value(&code) {
        ApplyError::Data(e)
    } else {
        ApplyError::Fatal(Error::Postgres(e))
    }
}

/// An [`Error`] met while applying: a PostgreSQL error classified as by [`classify`] (before COMMIT), anything
/// else fatal.
pub fn from_error(e: Error) -> ApplyError {
    match e {
        Error::Postgres(pg) => classify(pg, false),
        other => ApplyError::Fatal(other),
    }
}

/// Turns a refusal for lack of privilege (SQLSTATE 42501) met while checking the database without DDL into
/// [`Error::Privilege`] pointing at `check --database`, which lists every grant the role lacks.
pub fn explain_missing(e: Error) -> Error {
    match &e {
        Error::Postgres(pg) if pg.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
            Error::Privilege(format!(
                "{}: the role of the connection lacks a privilege the pipeline needs; `replaysafe check --config \
                 FILE --database` lists every one with the GRANT that gives it (docs/operations.md \"Privileges\")",
                describe(pg)
            ))
        }
        _ => e,
    }
}

/// Counts one retried database attempt: `replaysafe_db_retries_total{sqlstate}`, the server's SQLSTATE, or
/// `connection` when the server sent none (a lost or refused connection, a timeout).
pub fn db_retry(e: Option<&tokio_postgres::Error>) {
    let code = e
        .and_then(|e| e.code())
        .map_or_else(|| "connection".to_string(), |c| c.code().to_string());
    metrics::counter!("replaysafe_db_retries_total", "sqlstate" => code).increment(1);
}

#[cfg(test)]
mod tests {
    use super::{rejects_a_value, retryable, READ_ONLY};

    #[test]
    fn sqlstates_of_a_value() {
        // Bad value, unique violation, index row too large, check option, RAISE, ASSERT, external routine.
        for code in [
            "22P02", "23505", "54000", "44000", "P0001", "P0004", "38001", "2F005",
        ] {
            assert!(rejects_a_value(code), "{code}");
        }
        // Undefined table/column, insufficient privilege, syntax, deadlock, internal error.
        for code in ["42P01", "42703", "42501", "42601", "40P01", "XX000"] {
            assert!(!rejects_a_value(code), "{code}");
        }
    }

    #[test]
    fn retryable_sqlstates() {
        // Deadlock, serialization failure, admin shutdown, terminated connection, lock timeout, read-only.
        for code in [
            "40P01", "40001", "57P01", "08006", "55P03", "53300", READ_ONLY, "57014", "25P03",
        ] {
            assert!(retryable(code), "{code}");
        }
        // What PgBouncer answers: 08P01 ("server conn crashed?", query_wait_timeout, "pgbouncer cannot connect to
        // server"), 53300 ("no more connections allowed"), 57P01 (RECONNECT/shutdown), and a transaction pooler's
        // lost or colliding prepared statements (26000, 42P05): retried, never a record's fault.
        for code in ["08P01", "53300", "57P01", "26000", "42P05"] {
            assert!(retryable(code) && !rejects_a_value(code), "{code}");
        }
        // Unique violation, bad value, undefined table, syntax, another class-25 state (no active transaction).
        for code in ["23505", "22P02", "42P01", "42601", "25001"] {
            assert!(!retryable(code), "{code}");
        }
    }
}
