//! `replaysafe offsets`: another group's positions read without joining it; a group started on the log the
//! brokers serve now.

use std::path::PathBuf;

use clap::Subcommand;
use replaysafe::error::Error;
use replaysafe::{config, ops};

use crate::cmd::resolve::{brokers, database_url, parse_time, write_json};

#[derive(Subcommand)]
pub enum OffsetsCommand {
    /// Write the group's positions per partition as JSON (checkpoints in PostgreSQL win over Kafka's).
    Snapshot {
        /// The pipeline file (its topics and database).
        #[arg(short, long)]
        config: PathBuf,
        /// The group to read.
        #[arg(long)]
        group: String,
        /// Output file (default: stdout).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
        /// Write the file also when the group has no position on any partition (by default that is refused
        /// with exit 2: a misspelled group, most likely).
        #[arg(long)]
        allow_empty: bool,
    },
    /// Start the group's partitions explicitly on the log the brokers serve now (after a topic was re-created,
    /// or a failover to another cluster: `run` exits 7): each checkpoint is replaced (the old one kept in
    /// replaysafe_checkpoints_retired) with the chosen offset and the broker's topic id and cluster id.
    Start {
        /// The pipeline file (its topics, group and database).
        #[arg(short, long)]
        config: PathBuf,
        /// Only this topic (default: every topic of the pipeline).
        #[arg(long)]
        topic: Option<String>,
        /// Only this partition (with --topic).
        #[arg(long)]
        partition: Option<i32>,
        #[command(flatten)]
        from: StartFrom,
        /// The group whose checkpoints move (default: the pipeline's group-id).
        #[arg(long)]
        group: Option<String>,
        /// Kafka bootstrap servers; overrides the file and KAFKA_BROKERS.
        #[arg(long)]
        brokers: Option<String>,
    },
}

/// `offsets start`'s choice of position (exactly one).
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct StartFrom {
    /// From each partition's log start.
    #[arg(long)]
    pub from_earliest: bool,
    /// From the first record at or after this time (RFC 3339 or YYYY-MM-DD), by Kafka's timestamp index.
    #[arg(long)]
    pub from_time: Option<String>,
    /// From this offset (one partition: with --topic and --partition).
    #[arg(long)]
    pub from_offset: Option<i64>,
    /// From MirrorMaker 2's translated offsets of the group, read from `<ALIAS>.checkpoints.internal` on these
    /// brokers (ALIAS: the source cluster's alias in the MirrorMaker 2 configuration).
    #[arg(long, value_name = "ALIAS")]
    pub from_mm2: Option<String>,
}

/// Writes the snapshot, or starts the partitions and prints one line per checkpoint replaced.
///
/// # Errors
/// The pipeline file's errors, the brokers' and the database's; `offsets start`'s refusals.
pub fn run(command: OffsetsCommand) -> anyhow::Result<()> {
    match command {
        OffsetsCommand::Snapshot {
            config,
            group,
            output,
            brokers: flag,
            allow_empty,
        } => {
            let p = config::load(&config)?;
            let snap = ops::offsets::snapshot(&p, &brokers(&p, flag)?, &database_url(&p)?, &group)?;
            if let Some(why) = snap.unknown_group().filter(|_| !allow_empty) {
                return Err(Error::Usage(why).into());
            }
            write_json(&snap, output.as_ref())
        }
        OffsetsCommand::Start {
            config,
            topic,
            partition,
            from,
            group,
            brokers: flag,
        } => {
            let p = config::load(&config)?;
            let from = match from {
                f if f.from_earliest => ops::start_at::From::Earliest,
                StartFrom {
                    from_time: Some(t), ..
                } => ops::start_at::From::Time(parse_time(&t)?),
                StartFrom {
                    from_offset: Some(n),
                    ..
                } => ops::start_at::From::Offset(n),
                StartFrom {
                    from_mm2: Some(a), ..
                } => ops::start_at::From::Mm2(a),
                _ => unreachable!("clap requires one of the --from-* options"),
            };
            let opts = ops::start_at::StartOptions {
                group: group.unwrap_or_else(|| p.kafka.group_id.clone()),
                topic,
                partition,
                from,
            };
            for m in ops::start_at::start(&p, &brokers(&p, flag)?, &database_url(&p)?, &opts)? {
                println!("{}", m.line);
            }
            Ok(())
        }
    }
}
