//! `replaysafe load`: the engine over the file source ([`crate::source::file`]) — the same decode → batch →
//! transaction → checkpoint path as `run`, without consuming from a broker.
//!
//! Two guards keep a load from hurting the pipeline's own consumer (issue 16):
//! - **its own group**: by default the checkpoints are written under [`default_group`] (named after the file),
//!   never the pipeline's `[kafka] group-id` — taking that one over bumps the fences of the running `run`'s
//!   partitions. Writing the pipeline's group needs `--take-over` ([`group`]);
//! - **never past a partition's end**: a checkpoint is the next offset to read, so a file whose offsets reach the
//!   live topic's end (a dump of another cluster, a topic recreated since) would move it past records that do
//!   not exist yet, and a `run` would skip them when they arrive. Before anything is applied, every partition's
//!   offsets in the file are compared with the broker's high watermark ([`check_ends`]); any at or past it is
//!   refused (exit 2). While loading, the file source refuses such a record too (a file that is not a regular
//!   file cannot be scanned first). When the broker cannot be asked, a load under its own group goes on with a
//!   warning; `--take-over` is refused.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::config::Pipeline;
use crate::engine::{Engine, Options, Tp};
use crate::error::{Error, Result};
use crate::model::Tally;
use crate::source::file::{end_of, File};
use crate::source::kafka::{consumer_config, watermarks};

/// Options of one load.
#[derive(Clone)]
pub struct LoadOptions {
    /// PostgreSQL connection string, resolved.
    pub database_url: String,
    /// Consumer group for checkpoints, ledger and dead-letter rows (`--group-id`; default [`default_group`]).
    pub group: Option<String>,
    /// `--take-over`: write the pipeline's own group's checkpoints (its `[kafka] group-id`).
    pub take_over: bool,
    /// Kafka bootstrap servers (`--brokers`, `[kafka] brokers`, `KAFKA_BROKERS`), to check the file's offsets
    /// against the live topic's end; `None` when none is configured.
    pub brokers: Option<String>,
    /// `--quarantine-invalid-utf8`: a line that is not UTF-8 is dead-lettered instead of stopping the load.
    pub quarantine_invalid_utf8: bool,
    /// Set to stop: buffered records are applied and committed, then `load` returns an error naming the file.
    pub shutdown: Arc<AtomicBool>,
}

/// The group of a load without `--group-id`: `replaysafe-load-<file stem>-<first 8 hex digits of the SHA-256 of
/// the file's absolute path>` — a rerun of the same file resumes after what it applied, another file (even one
/// with the same name elsewhere) starts from its first record.
pub fn default_group(path: &Path) -> String {
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let digest = Sha256::digest(abs.to_string_lossy().as_bytes());
    format!("replaysafe-load-{stem}-{}", &hex::encode(digest)[..8])
}

/// The group a load writes: the pipeline's with `take_over`, else `explicit`, else [`default_group`].
///
/// # Errors
/// [`Error::Usage`] when `explicit` is the pipeline's `[kafka] group-id` without `take_over`.
pub fn group(p: &Pipeline, path: &Path, explicit: Option<&str>, take_over: bool) -> Result<String> {
    let own = &p.kafka.group_id;
    match explicit {
        _ if take_over => Ok(own.clone()),
        Some(g) if g == own => Err(Error::Usage(format!(
            "--group-id `{g}` is the pipeline's [kafka] group-id: the load would take over the checkpoints (and \
             fence the partitions) of the `run` of that group. Load under a group of its own (the default, or \
             another --group-id), or pass --take-over to write that group's checkpoints deliberately (stop the \
             pipeline's `run` first)"
        ))),
        Some(g) => Ok(g.to_string()),
        None => Ok(default_group(path)),
    }
}

/// Loads the records of `path` (kcat `-J` lines) through the pipeline and returns the tally.
///
/// # Errors
/// [`Error::Usage`] when the file cannot be opened, `--group-id` names the pipeline's group without
/// `--take-over`, a partition's offsets in the file reach the live topic's end, or `--take-over` cannot check
/// them (nothing applied); [`Error::Schema`] when the database does not match the pipeline; [`Error::Other`] for
/// a line that is not a kcat record, a topic not in `[kafka] topics`, offsets not ascending within a partition,
/// a record at or past its partition's end, a partition taken over by another consumer, or an interruption —
/// records of earlier lines stay applied and checkpointed, so a rerun resumes; and [`Error::Postgres`] for a
/// fatal database error.
pub fn load(pipeline: Arc<Pipeline>, path: &Path, opts: LoadOptions) -> Result<Tally> {
    // Fail on a missing file before touching the database.
    std::fs::File::open(path)
        .map_err(|e| Error::Usage(format!("cannot open {}: {e}", path.display())))?;
    let group = group(&pipeline, path, opts.group.as_deref(), opts.take_over)?;
    let ends = check_ends(&pipeline, path, opts.brokers.as_deref(), opts.take_over)?;
    tracing::info!(%group, take_over = opts.take_over, "loading {}", path.display());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))?;
    let mut o = Options::new(&opts.database_url, opts.shutdown.clone());
    o.group = Some(group.clone());
    let engine = Engine::start(rt.handle(), pipeline.clone(), o)?;
    let source = File::open(
        engine.shared(),
        path,
        &group,
        ends,
        opts.quarantine_invalid_utf8,
    )?;
    let tally = engine.run(source)?;
    if tally.landed > 0 && !opts.take_over {
        tracing::info!(
            landed = tally.landed,
            "the records landed here are claimed in the pipeline's ledger: the pipeline's `run` (group `{}`) counts \
             them `duplicate` when it reads them — each record lands once",
            pipeline.kafka.group_id
        );
    }
    Ok(tally)
}

/// The partitions' ends (high watermarks: the next offset to be written) of the pipeline's topics on the live
/// broker, for the file source's per-record check; a topic missing there has none. Before that, the file (when
/// a regular file) is scanned for each partition's offset range and refused when a partition reaches its end.
///
/// # Errors
/// [`Error::Usage`] naming each topic/partition, its offsets in the file and the end; with `take_over`, also
/// when the broker cannot be asked (no brokers configured, unreachable, topic missing).
fn check_ends(
    p: &Pipeline,
    path: &Path,
    brokers: Option<&str>,
    take_over: bool,
) -> Result<HashMap<String, Vec<i64>>> {
    let ends = match brokers {
        Some(b) => live_ends(p, b),
        None => Err(
            "no Kafka brokers configured ([kafka] brokers, KAFKA_BROKERS or --brokers)".to_string(),
        ),
    };
    let ends = match ends {
        Ok(ends) => ends,
        Err(why) if take_over => {
            return Err(Error::Usage(format!(
                "--take-over writes the pipeline's checkpoints, so the offsets of {} must be checked against the live \
                 topic's end first, but {why}. Nothing was applied",
                path.display()
            )))
        }
        Err(why) => {
            tracing::warn!(
                "the offsets of {} are not checked against the live topic's end ({why}); the checkpoints are this \
                 load's own group's",
                path.display()
            );
            return Ok(HashMap::new());
        }
    };
    let missing: Vec<&str> = p
        .kafka
        .topics
        .iter()
        .filter(|t| !ends.contains_key(*t))
        .map(String::as_str)
        .collect();
    if take_over && !missing.is_empty() {
        return Err(Error::Usage(format!(
            "--take-over writes the pipeline's checkpoints, but topic(s) {} do not exist on the broker: the offsets \
             of {} cannot be checked against their end. Nothing was applied",
            missing.join(", "),
            path.display()
        )));
    }
    let Some(ranges) = scan(path) else {
        return Ok(ends);
    };
    let past: Vec<String> = ranges
        .iter()
        .filter_map(|((topic, partition), (lo, hi))| {
            let topic_ends = ends.get(topic)?;
            let end = end_of(topic_ends, *partition);
            (*hi >= end).then(|| {
                format!("{topic}/{partition}: offsets {lo} to {hi} in the file, the live partition ends at {end}")
            })
        })
        .collect();
    if past.is_empty() {
        return Ok(ends);
    }
    Err(Error::Usage(format!(
        "{} is not a dump of the live topic (another cluster's, or the topic was recreated since): {}. A checkpoint \
         there would pass records that do not exist yet and `run` would skip them when they arrive. Nothing was \
         applied",
        path.display(),
        past.join("; ")
    )))
}

/// Each pipeline topic's partition ends on the broker, by partition number; a topic missing there is left out
/// (its offsets cannot be checked). `Err`: why the broker could not be asked.
fn live_ends(
    p: &Pipeline,
    brokers: &str,
) -> std::result::Result<HashMap<String, Vec<i64>>, String> {
    let mut config = consumer_config(p, brokers, &[]);
    config.remove("group.id");
    let brokers = crate::endpoint::mask_urls(brokers);
    let client: BaseConsumer = config
        .create()
        .map_err(|e| format!("the Kafka client: {e}"))?;
    let mut out = HashMap::new();
    for topic in &p.kafka.topics {
        let md = client
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map_err(|e| format!("the broker {brokers} did not answer: {e}"))?;
        let Some(t) = md
            .topics()
            .first()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
        else {
            tracing::warn!(%topic, "topic not found on {brokers}: its offsets in the file are not checked");
            continue;
        };
        let n = t.partitions().iter().map(|p| p.id()).max().unwrap_or(-1) + 1;
        let mut ends = vec![0; usize::try_from(n).unwrap_or(0)];
        for part in t.partitions() {
            let (_, high) = watermarks(&client, topic, part.id(), Duration::from_secs(10))
                .map_err(|e| format!("the end of {topic}/{}: {e}", part.id()))?;
            ends[usize::try_from(part.id()).unwrap_or(0)] = high;
        }
        out.insert(topic.clone(), ends);
    }
    if out.is_empty() {
        return Err(format!("none of the pipeline's topics exists on {brokers}"));
    }
    Ok(out)
}

/// The offsets of one kcat line, and nothing else.
#[derive(Deserialize)]
struct Position {
    topic: String,
    partition: i32,
    offset: i64,
}

/// Each partition's lowest and highest offset in `path` — `None` when it is not a regular file (a pipe can be
/// read once). Stops at the first line that is not a kcat record (the load reports it there).
fn scan(path: &Path) -> Option<BTreeMap<Tp, (i64, i64)>> {
    let file = std::fs::File::open(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut ranges: BTreeMap<Tp, (i64, i64)> = BTreeMap::new();
    for line in std::io::BufReader::with_capacity(1 << 20, file).lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let Ok(pos) = serde_json::from_str::<Position>(&line) else {
            break;
        };
        let r = ranges
            .entry((pos.topic, pos.partition))
            .or_insert((pos.offset, pos.offset));
        r.0 = r.0.min(pos.offset);
        r.1 = r.1.max(pos.offset);
    }
    Some(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline() -> Pipeline {
        crate::config::parse(
            "p.toml",
            "[kafka]\ngroup-id = \"prod\"\ntopics = [\"t\"]\n[fields]\nid = { path = \"/id\", type = \"text\" }\n\
             [identity]\nkey = [\"id\"]\n[[projection]]\nkind = \"counter\"\ntable = \"c\"\ngroup-by = [\"id\"]\n",
        )
        .unwrap()
    }

    #[test]
    fn a_load_writes_its_own_group_unless_told_to_take_over() {
        let p = pipeline();
        let file = Path::new("/data/dumps/orders.jsonl");
        let own = group(&p, file, None, false).unwrap();
        assert!(own.starts_with("replaysafe-load-orders-"), "{own}");
        assert_eq!(own.len(), "replaysafe-load-orders-".len() + 8);
        // Same path, same group (a rerun resumes); another path with the same name, another group.
        assert_eq!(group(&p, file, None, false).unwrap(), own);
        assert_ne!(default_group(Path::new("/other/orders.jsonl")), own);
        assert_eq!(group(&p, file, Some("mine"), false).unwrap(), "mine");
        assert_eq!(group(&p, file, None, true).unwrap(), "prod");
        let refused = group(&p, file, Some("prod"), false).unwrap_err();
        assert!(
            matches!(&refused, Error::Usage(m) if m.contains("--take-over")),
            "{refused}"
        );
    }

    #[test]
    fn scan_gives_each_partitions_offset_range_up_to_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.jsonl");
        let line = |p: i32, o: i64| {
            format!(r#"{{"topic":"t","partition":{p},"offset":{o},"key":null,"payload":"x"}}"#)
        };
        let text = [
            line(0, 4),
            line(1, 0),
            String::new(),
            line(0, 9),
            "not json".into(),
            line(0, 99),
        ]
        .join("\n");
        std::fs::write(&path, text).unwrap();
        let ranges = scan(&path).unwrap();
        assert_eq!(
            ranges.into_iter().collect::<Vec<_>>(),
            vec![
                (("t".to_string(), 0), (4, 9)),
                (("t".to_string(), 1), (0, 0))
            ]
        );
        assert_eq!(end_of(&[10, 20], 1), 20);
        assert_eq!(
            end_of(&[10, 20], 2),
            0,
            "a partition the live topic does not have"
        );
        assert_eq!(end_of(&[10, 20], -1), 0);
    }
}
