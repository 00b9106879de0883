//! Fault injection that works in the release binary, driven by `replaysafe prove` (src/ops/prove/): the
//! "uncertain commit" — a batch transaction's COMMIT is sent, then the connection is cut before the reply
//! reaches the engine. Every `every`-th COMMIT of the engine is handled so, alternately with the COMMIT applied
//! (the server committed, the reply was lost) and not applied (the server rolled back): the engine sees a
//! connection error after `COMMIT` ([`crate::model::ApplyError::Transient`] with `commit_sent`) and goes through
//! its unknown-commit path (`engine::retry::drive`: retried with the same keys, the checkpoint —
//! for a source transaction, its claims — tells whether the first attempt landed, `engine::retry::conclude`). The connection is cut for real (`pg_terminate_backend` of the
//! session's own backend), so the retry reconnects as after a real failure.
//!
//! The crash between the database commit and the Kafka commit is `engine::Options::crash_after_batches`.
//! With no fault set (`Options::fault = None`, every command but `prove`) nothing here runs.

use std::sync::atomic::{AtomicU64, Ordering};

/// The uncertain-commit hook, shared by every connection of one engine.
#[derive(Debug)]
pub struct Fault {
    every: u64,
    commits: AtomicU64,
    applied: AtomicU64,
    lost: AtomicU64,
}

impl Fault {
    /// Loses the reply of every `every`-th COMMIT (1 = every one), alternately applied and not applied.
    pub fn uncertain_commits(every: u64) -> Fault {
        Fault {
            every: every.max(1),
            commits: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        }
    }

    /// Called by the sink just before it sends a batch's COMMIT: `None` to commit normally, `Some(true)` to
    /// commit and then cut the connection (reply lost), `Some(false)` to roll back and cut it (COMMIT lost).
    pub fn at_commit(&self) -> Option<bool> {
        let n = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if n % self.every != 0 {
            return None;
        }
        let k = (n / self.every) % 2 == 1;
        if k {
            self.applied.fetch_add(1, Ordering::Relaxed);
        } else {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
        Some(k)
    }

    /// How many COMMIT replies were lost: (the COMMIT applied, the COMMIT not applied).
    pub fn fired(&self) -> (u64, u64) {
        (
            self.applied.load(Ordering::Relaxed),
            self.lost.load(Ordering::Relaxed),
        )
    }
}

/// Cuts `client`'s connection for real (`pg_terminate_backend(pg_backend_pid())`, SQLSTATE 57P01) and returns the
/// error the session sees: what the engine meets when the connection drops after COMMIT was sent. Called by the
/// sink after it committed or rolled back as [`Fault::at_commit`] said.
pub async fn cut(client: &tokio_postgres::Client) -> Option<tokio_postgres::Error> {
    client
        .batch_execute("SELECT pg_terminate_backend(pg_backend_pid())")
        .await
        .err()
}

/// Test builds (`REPLAYSAFE_FAILPOINTS=hold-before-db-commit=1*return(/path/to/file)`): a batch transaction
/// holds before its COMMIT, every lock it took still held, until the file `release` exists — so a test can
/// queue another session behind it without racing a timer (`hold-before-write-start`, the same between a
/// member's take-over of its partitions and the write of their starts). On entering the hold it writes `<release>.held`, so a
/// test can wait for the batch to be held. Bounded: after 120 s the batch goes on anyway.
#[cfg(feature = "failpoints")]
pub fn hold_until(release: &std::path::Path) {
    let mut held = release.as_os_str().to_owned();
    held.push(".held");
    let _ = std::fs::write(held, "");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !release.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
