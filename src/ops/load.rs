//! `replaysafe load`: the engine over the file source ([`crate::source::file`]) — the same decode → batch →
//! transaction → checkpoint path as `run`, without a broker.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::config::Pipeline;
use crate::engine::{Engine, Options};
use crate::error::{Error, Result};
use crate::sink::Tally;
use crate::source::file::File;

/// Options of one load.
#[derive(Clone)]
pub struct LoadOptions {
    /// PostgreSQL connection string, resolved.
    pub database_url: String,
    /// Consumer group for checkpoints, ledger and dead-letter rows (default: the pipeline's `group-id`).
    pub group: Option<String>,
    /// Set to stop: buffered records are applied and committed, then `load` returns an error naming the file.
    pub shutdown: Arc<AtomicBool>,
}

/// Loads the records of `path` (kcat `-J` lines) through the pipeline and returns the tally.
///
/// # Errors
/// [`Error::Usage`] when the file cannot be opened (nothing applied); [`Error::Schema`] when the database does
/// not match the pipeline; [`Error::Other`] for a line that is not a kcat record, a topic not in
/// `[kafka] topics`, offsets not ascending within a partition, a partition taken over by another consumer, or
/// an interruption — records of earlier lines stay applied and checkpointed, so a rerun resumes; and
/// [`Error::Postgres`] for a fatal database error.
pub fn load(pipeline: Arc<Pipeline>, path: &Path, opts: LoadOptions) -> Result<Tally> {
    // Fail on a missing file before touching the database.
    std::fs::File::open(path)
        .map_err(|e| Error::Usage(format!("cannot open {}: {e}", path.display())))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))?;
    let group = opts
        .group
        .clone()
        .unwrap_or_else(|| pipeline.kafka.group_id.clone());
    let mut o = Options::new(&opts.database_url, opts.shutdown.clone());
    o.group = Some(group.clone());
    let engine = Engine::start(rt.handle(), pipeline.clone(), o)?;
    let source = File::open(engine.shared(), path, &group)?;
    engine.run(source)
}
