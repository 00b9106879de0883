//! One module per command: its clap arguments and what it does with them (`main.rs` dispatches);
//! [`resolve`] what several share.

pub mod backfill;
pub mod check;
pub mod dead_letters;
pub mod demo;
pub mod import;
pub mod init;
pub mod ledger;
pub mod load;
pub mod offsets;
pub mod outbox;
pub mod projection;
pub mod prove;
pub mod rebuild;
pub mod resolve;
pub mod run;
pub mod verify;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Sets `flag` on the first SIGINT or SIGTERM (a thread of its own).
pub fn signals(flag: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("signal runtime");
        rt.block_on(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            tracing::info!("signal received: finishing in-flight batches");
            flag.store(true, Ordering::Relaxed);
        });
    });
}
