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
    /// PostgreSQL rejected a value (SQLSTATE class 22 or 23): replay record by record to find it.
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

/// Classifies a PostgreSQL error by SQLSTATE class (PostgreSQL manual, Appendix A "Error Codes").
pub fn classify(e: tokio_postgres::Error, commit_sent: bool) -> ApplyError {
    let Some(code) = e.code().map(|c| c.code().to_string()) else {
        // No SQLSTATE: I/O error or closed connection.
        return ApplyError::Transient {
            error: e,
            commit_sent,
            outcomes: None,
        };
    };
    match &code[..2] {
        "08" | "53" | "57" | "40" | "55" => ApplyError::Transient {
            error: e,
            commit_sent,
            outcomes: None,
        },
        "22" | "23" => ApplyError::Data(e),
        _ => ApplyError::Fatal(Error::Postgres(e)),
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
