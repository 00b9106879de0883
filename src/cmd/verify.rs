//! `replaysafe verify snapshot | diff | compare`: check that an aggregate changed by exactly what a backfill
//! reported; compare a table another consumer writes with a projection.

use std::path::PathBuf;

use clap::Subcommand;
use replaysafe::ops::{self, backfill::Report};

use crate::cmd::resolve::{brokers, read_json, write_json};

#[derive(Subcommand)]
pub enum VerifyCommand {
    /// Save a counter or sum projection's rows and the ledger's claims per day and consumer group.
    Snapshot {
        /// The pipeline file.
        #[arg(short, long)]
        config: PathBuf,
        /// The counter or sum projection's table.
        #[arg(long)]
        table: String,
        /// The value column to compare (needed when a sum projection has several).
        #[arg(long)]
        column: Option<String>,
        /// Only rows matching this SQL condition (run read-only), e.g. "day between '2026-07-01' and '2026-07-06'".
        #[arg(long = "where")]
        filter: Option<String>,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Compare the table now with a snapshot: per day, the change must equal what the backfill landed plus what
    /// other consumer groups claimed in the ledger since the snapshot.
    Diff {
        /// The snapshot taken before the backfill.
        #[arg(long)]
        before: PathBuf,
        /// The backfill report.
        #[arg(long)]
        expect: PathBuf,
    },
    /// Compare a table your own consumer writes with the shadow pipeline's counter or sum projection, per
    /// group-by key from the later of the two first days on: every row that differs, the totals, and whether each difference
    /// is the redeliveries of its events (the same delivery key at other offsets, read back from the topic up to
    /// the checkpoints and looked up in the ledger). Exit 0 when they agree, 1 when rows differ, 2 when the
    /// table cannot be compared (docs/switching.md "From a hand-made consumer: shadow, compare, switch").
    Compare {
        /// The shadow pipeline file.
        #[arg(short, long)]
        config: PathBuf,
        /// The shadow pipeline's counter or sum projection (its table or name).
        #[arg(long)]
        table: String,
        /// Your table, `schema.table`. It has the projection's
        /// group-by columns and value column, named alike.
        #[arg(long = "with")]
        with: String,
        /// The value column to compare (needed when a sum projection has several).
        #[arg(long)]
        column: Option<String>,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
    },
}

/// Saves a snapshot, or compares the table with one and a backfill report.
///
/// # Errors
/// The pipeline file's and the database's errors; a day or row the report does not explain.
pub fn run(command: VerifyCommand) -> anyhow::Result<()> {
    match command {
        VerifyCommand::Snapshot {
            config,
            table,
            column,
            filter,
            output,
        } => {
            let snap =
                ops::verify::snapshot(&config, &table, column.as_deref(), filter.as_deref())?;
            write_json(&snap, Some(&output))
        }
        VerifyCommand::Compare {
            config,
            table,
            with,
            column,
            brokers: flag,
        } => {
            let p = replaysafe::config::load(&config)?;
            let opts = ops::verify::CompareOptions {
                table,
                column,
                with,
                brokers: brokers(&p, flag)?,
            };
            let out = ops::verify::compare(&p, &opts)?;
            print!("{}", out.table);
            match out.differ.is_empty() {
                true => Ok(()),
                false => Err(anyhow::anyhow!(
                    "{} row(s) differ between the table and the projection ({} explained by redeliveries)",
                    out.differ.len(),
                    out.differ.iter().filter(|d| d.explained).count()
                )),
            }
        }
        VerifyCommand::Diff { before, expect } => {
            let before = ops::verify::read_snapshot(&before)?;
            let report: Report = read_json(&expect)?;
            let out = ops::verify::diff(&before, &report)?;
            print!("{}", out.table);
            if out.days.is_empty() && out.rows.is_empty() {
                let rows = match out.rows_exact {
                    true => "and every row ",
                    false => "(each row within its day's claims: see the rows line) ",
                };
                println!(
                    "verified: every day {rows}changed by exactly what the backfill landed and the other groups \
                     claimed"
                );
                Ok(())
            } else {
                let days: Vec<&str> = out.days.iter().map(|m| m.day.as_str()).collect();
                let rows: Vec<String> = out
                    .rows
                    .iter()
                    .take(10)
                    .map(|m| replaysafe::printable::escape_controls(&m.key).into_owned())
                    .collect();
                let more = out.rows.len().saturating_sub(10);
                Err(anyhow::anyhow!(
                    "{} day(s) and {} row(s) not explained by the backfill report and the other groups' ledger \
                     claims: days {}; rows {}{}",
                    out.days.len(),
                    out.rows.len(),
                    days.join(", "),
                    if rows.is_empty() { "(none)".to_string() } else { rows.join(", ") },
                    if more > 0 { format!(" and {more} more") } else { String::new() }
                ))
            }
        }
    }
}
