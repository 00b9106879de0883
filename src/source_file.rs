//! `replaysafe load`: the same decode → batch → transaction → checkpoint path as `run`, fed from a file of
//! records in the format `kcat -C -J` prints instead of from the broker (benchmarks that separate broker cost,
//! replays of an exported topic).
//!
//! The file holds one JSON object per line, as kcat's `-J` envelope:
//! `{"topic":"t","partition":0,"offset":42,"tstype":"create","ts":1714003200000,"broker":1,"key":"k","payload":"…"}`
//! — `tstype`/`ts` absent when the record has no timestamp, `key`/`payload` `null` for a null key or value,
//! other members (`broker`, `headers`, …) ignored. Partitions may be interleaved; within a partition offsets
//! must ascend (gaps are fine: compaction, transaction markers).
//!
//! Checkpoints are the pipeline's (`replaysafe_checkpoints`, keyed by group, generation, and the file's
//! topic/partition): each partition met in the file is taken over (fence bumped) like an assignment in `run`,
//! records below its checkpoint are skipped, and every batch advances it in the batch's transaction. A second
//! load of the same file under the same group therefore applies nothing; under another group every record is
//! a duplicate. No Kafka offsets are committed: there is no broker.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;

use crate::apply::{apply_batch, backoff, is_transient, retry_db, Applied};
use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::run::decide;
use crate::sink::{checkpoint, ledger, schema, Batch, Item, Sink, Tally};

/// Options of one load.
#[derive(Clone)]
pub struct LoadOptions {
    /// PostgreSQL connection string, resolved.
    pub database_url: String,
    /// Consumer group for checkpoints, ledger and dead-letter rows (default: the pipeline's `group-id`).
    pub group: Option<String>,
    /// Set to stop: buffered records are applied and committed, then `load` returns an error naming the line.
    pub shutdown: Arc<AtomicBool>,
}

/// One line of `kcat -C -J` output.
#[derive(Deserialize)]
struct Envelope {
    topic: String,
    partition: i32,
    offset: i64,
    #[serde(default)]
    tstype: Option<String>,
    #[serde(default)]
    ts: Option<i64>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    payload: Option<String>,
}

struct Part {
    fence: i64,
    /// Checkpoint: next offset to apply (`None`: nothing committed yet).
    next: Option<i64>,
    /// Last offset read from the file (order check).
    last: Option<i64>,
    buffer: Vec<Item>,
}

type Tp = (String, i32);

/// Loads the records of `path` (kcat `-J` lines) through the pipeline and returns the tally.
///
/// # Errors
/// [`Error::Usage`] when the file cannot be opened (nothing applied); [`Error::Schema`] when the database does
/// not match the pipeline; [`Error::Other`] for a line that is not a kcat record, a topic not in
/// `[kafka] topics`, offsets not ascending within a partition, a partition taken over by another consumer, or
/// an interruption — records of earlier lines stay applied and checkpointed, so a rerun resumes; and
/// [`Error::Postgres`] for a fatal database error.
pub fn load(pipeline: Arc<Pipeline>, path: &Path, opts: LoadOptions) -> Result<Tally> {
    let file = std::fs::File::open(path)
        .map_err(|e| Error::Usage(format!("cannot open {}: {e}", path.display())))?;
    let reader = std::io::BufReader::with_capacity(1 << 20, file);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Other(format!("tokio runtime: {e}")))?;
    let group = opts
        .group
        .clone()
        .unwrap_or_else(|| pipeline.kafka.group_id.clone());
    let stop = opts.shutdown.clone();
    let give_up = move || stop.load(Ordering::Relaxed);
    let mut sinks = rt.block_on(retry_db("starting", &give_up, || async {
        let mut admin = crate::sink::connect(&opts.database_url).await?;
        schema::init(&mut admin, &pipeline).await?;
        let dropped = ledger::drop_expired_partitions(&mut admin, &pipeline).await?;
        if !dropped.is_empty() {
            tracing::info!(?dropped, "dropped ledger partitions older than the horizon");
        }
        let mut sinks = Vec::new();
        for _ in 0..pipeline.postgres.connections {
            sinks.push(
                Sink::open(pipeline.clone(), &opts.database_url)
                    .await?
                    .with_group(&group),
            );
        }
        Ok::<_, Error>(sinks)
    }))?;
    let mut loader = Loader {
        pipeline: pipeline.clone(),
        group,
        parts: HashMap::new(),
        ready: Vec::new(),
        tally: Tally::default(),
        skipped: 0,
        first_record: None,
        last_commit: None,
    };
    // A reader thread parses and decodes the file while this thread applies batches: decoding overlaps the
    // transactions. The channel is bounded (chunks of `CHUNK` records), so memory stays flat.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Read>>>(4);
    let reader = {
        let pipeline = pipeline.clone();
        let path = path.to_path_buf();
        std::thread::spawn(move || read_file(&pipeline, &path, reader, &tx))
    };
    let result: Result<()> = (|| {
        for chunk in &rx {
            if opts.shutdown.load(Ordering::Relaxed) {
                loader.flush_all(&rt, &mut sinks, &give_up)?;
                return Err(Error::Other(format!(
                    "interrupted while reading {}: what was read is applied and checkpointed; rerun to resume",
                    path.display()
                )));
            }
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => return Err(loader.stop(&rt, &mut sinks, &give_up, e)),
            };
            for Read { line, tp, item } in chunk {
                if !loader.parts.contains_key(&tp) {
                    let part = loader.take_over(&rt, &mut sinks[0], &tp, &give_up)?;
                    loader.parts.insert(tp.clone(), part);
                }
                let part = loader.parts.get_mut(&tp).expect("taken over");
                if part.last.is_some_and(|l| item.offset <= l) {
                    let e = Error::Other(format!(
                        "{}:{line}: offset {} of {}/{} does not ascend (previous {})",
                        path.display(),
                        item.offset,
                        tp.0,
                        tp.1,
                        part.last.unwrap_or_default()
                    ));
                    return Err(loader.stop(&rt, &mut sinks, &give_up, e));
                }
                part.last = Some(item.offset);
                if part.next.is_some_and(|next| item.offset < next) {
                    loader.skipped += 1;
                    continue;
                }
                loader.first_record.get_or_insert_with(Instant::now);
                part.buffer.push(item);
                if part.buffer.len() >= pipeline.max_records {
                    loader.take_batch(&tp);
                    if loader.ready.len() >= sinks.len() {
                        loader.apply_ready(&rt, &mut sinks, &give_up)?;
                    }
                }
            }
        }
        loader.flush_all(&rt, &mut sinks, &give_up)
    })();
    // Stops the reader (its next send fails) when we stopped early.
    drop(rx);
    let _ = reader.join();
    if loader.skipped > 0 {
        tracing::info!(
            skipped = loader.skipped,
            "records below their partition's checkpoint were skipped (applied before)"
        );
    }
    if let (Some(a), Some(b)) = (loader.first_record, loader.last_commit) {
        let secs = b.duration_since(a).as_secs_f64();
        tracing::info!(
            records = loader.tally.total(),
            seconds = secs,
            rate = loader.tally.total() as f64 / secs.max(1e-9),
            "throughput from first record to last checkpoint commit"
        );
    }
    tracing::info!("{}", loader.tally.line());
    result.map(|()| loader.tally)
}

/// Records sent from the reader thread at a time.
const CHUNK: usize = 1024;

/// One decoded record of the file, with its line number.
struct Read {
    line: usize,
    tp: Tp,
    item: Item,
}

/// The reader thread: parses kcat lines, checks the topic, decodes and filters each record, and sends them in
/// chunks; the first bad line ends the stream with an error naming `file:line`.
fn read_file(
    pipeline: &Pipeline,
    path: &Path,
    mut reader: impl BufRead,
    tx: &std::sync::mpsc::SyncSender<Result<Vec<Read>>>,
) {
    let at = |n: usize| format!("{}:{n}", path.display());
    let mut line = String::new();
    let mut n = 0usize;
    let mut chunk = Vec::with_capacity(CHUNK);
    let end = loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break Ok(()),
            Ok(_) => {}
            Err(e) => break Err(Error::Other(format!("reading {}: {e}", at(n + 1)))),
        }
        n += 1;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let env: Envelope = match serde_json::from_str(text) {
            Ok(env) => env,
            Err(e) => {
                break Err(Error::Other(format!(
                    "{}: not a kcat -J record (topic, partition, offset, key, payload): {e}",
                    at(n)
                )))
            }
        };
        if !pipeline.kafka.topics.contains(&env.topic) {
            break Err(Error::Other(format!(
                "{}: topic `{}` is not in the pipeline's [kafka] topics",
                at(n),
                env.topic
            )));
        }
        let value = env.payload.map(String::into_bytes);
        let key = env.key.map(String::into_bytes);
        // kcat -J does not carry headers (a primary-key change's old key then comes from nowhere).
        let pending = decide(pipeline, key.as_deref(), value.as_deref(), None);
        let timestamp_ms = match env.tstype.as_deref() {
            Some("create" | "logappend") | None => env.ts,
            Some(_) => None,
        };
        chunk.push(Read {
            line: n,
            tp: (env.topic, env.partition),
            item: Item {
                offset: env.offset,
                timestamp_ms,
                key,
                value,
                pending,
            },
        });
        if chunk.len() >= CHUNK
            && tx
                .send(Ok(std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK))))
                .is_err()
        {
            return;
        }
    };
    if !chunk.is_empty() && tx.send(Ok(chunk)).is_err() {
        return;
    }
    if let Err(e) = end {
        let _ = tx.send(Err(e));
    }
}

struct Loader {
    pipeline: Arc<Pipeline>,
    group: String,
    parts: HashMap<Tp, Part>,
    /// Batches cut and waiting to be applied (in file order within a partition).
    ready: Vec<Batch>,
    tally: Tally,
    skipped: u64,
    first_record: Option<Instant>,
    last_commit: Option<Instant>,
}

impl Loader {
    /// Takes over a partition's checkpoint row (fence bumped), like an assignment in `run`.
    fn take_over(
        &self,
        rt: &tokio::runtime::Runtime,
        sink: &mut Sink,
        tp: &Tp,
        give_up: &(dyn Fn() -> bool + Sync),
    ) -> Result<Part> {
        let stmt = checkpoint::acquire_checkpoint(&self.pipeline);
        let generation = self
            .pipeline
            .identity
            .generation
            .clone()
            .unwrap_or_default();
        let group = &self.group;
        let (next, fence) = rt.block_on(async {
            let mut attempt = 0u32;
            loop {
                let result: Result<(Option<i64>, i64)> = async {
                    if sink.is_closed() {
                        sink.reconnect().await?;
                    }
                    let row = sink
                        .client()
                        .query_one(&stmt, &[group, &tp.0, &tp.1, &generation])
                        .await?;
                    Ok((row.get(0), row.get(1)))
                }
                .await;
                match result {
                    Err(e) if is_transient(&e) && !give_up() => {
                        attempt += 1;
                        tracing::warn!(
                            attempt,
                            "taking over a partition: database unavailable, retrying: {e}"
                        );
                        tokio::time::sleep(backoff(attempt)).await;
                    }
                    other => break other,
                }
            }
        })?;
        tracing::info!(topic = %tp.0, partition = tp.1, ?next, fence, "partition taken over from the file");
        Ok(Part {
            fence,
            next,
            last: None,
            buffer: Vec::new(),
        })
    }

    /// Cuts the partition's buffer into a ready batch continuing from the previous one.
    fn take_batch(&mut self, tp: &Tp) {
        let part = self.parts.get_mut(tp).expect("partition");
        if part.buffer.is_empty() {
            return;
        }
        let items = std::mem::take(&mut part.buffer);
        let end = items.last().expect("non-empty").offset + 1;
        // `expected` continues from the last batch cut for this partition, applied or not.
        let expected = self
            .ready
            .iter()
            .rev()
            .find(|b| b.topic == tp.0 && b.partition == tp.1)
            .map(|b| Some(b.end))
            .unwrap_or(part.next);
        self.ready.push(Batch {
            topic: tp.0.clone(),
            partition: tp.1,
            fence: part.fence,
            expected,
            end,
            items,
        });
    }

    /// Applies what is buffered (the records before a bad line), then returns `e` — or the error that
    /// prevented applying them.
    fn stop(
        &mut self,
        rt: &tokio::runtime::Runtime,
        sinks: &mut [Sink],
        give_up: &(dyn Fn() -> bool + Sync),
        e: Error,
    ) -> Error {
        match self.flush_all(rt, sinks, give_up) {
            Ok(()) => e,
            Err(f) => f,
        }
    }

    fn flush_all(
        &mut self,
        rt: &tokio::runtime::Runtime,
        sinks: &mut [Sink],
        give_up: &(dyn Fn() -> bool + Sync),
    ) -> Result<()> {
        let tps: Vec<Tp> = self.parts.keys().cloned().collect();
        for tp in &tps {
            self.take_batch(tp);
        }
        self.apply_ready(rt, sinks, give_up)
    }

    /// Applies the ready batches, partitions spread over the connections (one partition's batches in order on
    /// one connection), and records their outcomes.
    fn apply_ready(
        &mut self,
        rt: &tokio::runtime::Runtime,
        sinks: &mut [Sink],
        give_up: &(dyn Fn() -> bool + Sync),
    ) -> Result<()> {
        let ready = std::mem::take(&mut self.ready);
        if ready.is_empty() {
            return Ok(());
        }
        let mut by_part: BTreeMap<Tp, Vec<Batch>> = BTreeMap::new();
        for b in ready {
            by_part
                .entry((b.topic.clone(), b.partition))
                .or_default()
                .push(b);
        }
        let mut lanes: Vec<Vec<Batch>> = (0..sinks.len()).map(|_| Vec::new()).collect();
        for (i, (_, batches)) in by_part.into_iter().enumerate() {
            lanes[i % sinks.len()].extend(batches);
        }
        let results: Vec<Vec<(Batch, Result<Applied>)>> = rt.block_on(async {
            let futs = sinks.iter_mut().zip(lanes).map(|(sink, lane)| async move {
                let mut out = Vec::new();
                let mut failed = false;
                for b in lane {
                    if failed {
                        out.push((
                            b,
                            Err(Error::Other("not applied: an earlier batch failed".into())),
                        ));
                        continue;
                    }
                    let r = apply_batch(sink, &b, give_up).await;
                    failed = !matches!(r, Ok(Applied::Committed(_)));
                    out.push((b, r));
                }
                out
            });
            futures::future::join_all(futs).await
        });
        let mut first_err = None;
        for (batch, r) in results.into_iter().flatten() {
            match r {
                Ok(Applied::Committed(outcomes)) => {
                    for o in &outcomes {
                        self.tally.add(o);
                    }
                    if let Some(p) = self.parts.get_mut(&(batch.topic.clone(), batch.partition)) {
                        p.next = Some(batch.end);
                    }
                    self.last_commit = Some(Instant::now());
                }
                Ok(Applied::Fenced) => {
                    first_err.get_or_insert(Error::Other(format!(
                        "{}/{} was taken over by another consumer of group `{}` while loading; nothing of that \
                         batch was applied",
                        batch.topic, batch.partition, self.group
                    )));
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
