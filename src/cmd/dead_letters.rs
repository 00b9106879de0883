//! `replaysafe dead-letters list | replay`: the pipeline's unresolved dead letters (quarantined records).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Subcommand;
use replaysafe::config;

use crate::cmd::resolve::database_url;
use crate::cmd::signals;

#[derive(Subcommand)]
pub enum DeadLettersCommand {
    /// Print the unresolved dead letters of the selection (topic, partition, offset, reason, detail; tab
    /// separated, control characters escaped), then a count per reason on stderr.
    List {
        #[command(flatten)]
        select: DeadLetterSelect,
        /// At most this many rows.
        #[arg(long, default_value_t = 1000)]
        limit: i64,
        /// `text`: one tab-separated line per dead letter, control characters and backslashes escaped (`\n`,
        /// `\t`, `\\`, `\u{1b}`); `json`: one JSON object per line (JSON Lines) with the stored key and value in
        /// base64.
        #[arg(long, value_enum, default_value_t = ListFormat::Text)]
        format: ListFormat,
    },
    /// Re-decode the stored records with the current pipeline file and apply them through the batch
    /// transaction (ledger claims, projections); the ones that land (or are duplicates, stale, filtered) are
    /// marked resolved in the same transaction, the others stay unresolved with their new reason. Prints the
    /// accounting line; exit 0 even when some stay unresolved (the line says how many).
    Replay {
        #[command(flatten)]
        select: DeadLetterSelect,
        /// The consumer group written in the ledger rows claimed (default: the pipeline's group-id).
        #[arg(long)]
        group_id: Option<String>,
    },
}

/// The output of `dead-letters list`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ListFormat {
    /// Tab-separated lines, control characters escaped (for people).
    Text,
    /// One JSON object per line, key and value in base64 (for scripts).
    Json,
}

/// Which unresolved dead letters of the pipeline's generation a `dead-letters` command works on.
#[derive(clap::Args)]
pub struct DeadLetterSelect {
    /// The pipeline file (its database, generation and — for replay — fields, filters and projections).
    #[arg(short, long)]
    pub config: PathBuf,
    /// Only this reason (e.g. missing-field, invalid-field, invalid-json, filter-error).
    #[arg(long)]
    pub reason: Option<String>,
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this partition (needs --topic).
    #[arg(long)]
    pub partition: Option<i32>,
}

impl DeadLetterSelect {
    /// The pipeline, its database and the selection.
    ///
    /// # Errors
    /// The pipeline file's errors; no database.
    pub fn resolve(
        self,
    ) -> anyhow::Result<(
        Arc<config::Pipeline>,
        String,
        replaysafe::ops::dead_letters::Selection,
    )> {
        let p = Arc::new(config::load(&self.config)?);
        let url = database_url(&p)?;
        let sel = replaysafe::ops::dead_letters::Selection {
            reason: self.reason,
            topic: self.topic,
            partition: self.partition,
        };
        Ok((p, url, sel))
    }
}

/// Lists the selected dead letters, or re-applies them and prints the accounting line.
///
/// # Errors
/// The pipeline file's and the database's errors; what stopped a replay.
pub fn run(command: DeadLettersCommand) -> anyhow::Result<()> {
    use replaysafe::ops::dead_letters as dl;
    match command {
        DeadLettersCommand::List {
            select,
            limit,
            format,
        } => {
            let (p, url, sel) = select.resolve()?;
            let rows = dl::list(&p, &url, &sel, limit)?;
            for r in &rows {
                match format {
                    ListFormat::Text => println!("{}", r.text_line()),
                    ListFormat::Json => println!("{}", r.json()),
                }
            }
            let per_reason = dl::count(&p, &url, &sel)?;
            let total: i64 = per_reason.values().sum();
            let shown = match replaysafe::units::bigint_len(rows.len()) {
                n if n < total => format!(", the first {n} listed (--limit {limit})"),
                _ => String::new(),
            };
            eprintln!("{total} unresolved dead letter(s){shown}: {per_reason:?}");
            Ok(())
        }
        DeadLettersCommand::Replay { select, group_id } => {
            let (p, url, sel) = select.resolve()?;
            let shutdown = Arc::new(AtomicBool::new(false));
            signals(shutdown.clone());
            let out = dl::replay(p, &url, &sel, group_id.as_deref(), shutdown)
                .context("dead-letters replay failed")?;
            println!("{}", out.line());
            Ok(())
        }
    }
}
