//! The file source (`replaysafe load`): the records of a file in the format `kcat -C -J` prints instead of the
//! broker (benchmarks that separate broker cost, replays of an exported topic).
//!
//! The file holds one JSON object per line, as kcat's `-J` envelope:
//! `{"topic":"t","partition":0,"offset":42,"tstype":"create","ts":1714003200000,"broker":1,"key":"k","payload":"…"}`
//! — `tstype`/`ts` absent when the record has no timestamp (the record time is then unknown, never 1970),
//! `key`/`payload` `null` for a null key or value (a null key is not the empty key `""`), `headers` an array of
//! names and values in order (`["trace-id","t-1","source","a","source","b","flag",null]`: duplicates kept, a
//! valueless header `null`) or kcat's name → values map; the `__debezium.oldkey` header is a primary-key change's
//! old key. `payload_error`/`key_error` (kcat could not decode the value or key) quarantine the record as
//! `undecodable-value` with kcat's message; a payload kcat inlined as an object (`-s value=avro`) stops the load
//! (the value's bytes are not in the dump). kcat copies key and value bytes unescaped, so a binary value makes a
//! line that is not UTF-8: the load stops there naming the line and the record, or with
//! `--quarantine-invalid-utf8` the whole line becomes an `undecodable-value` dead letter. Other members
//! (`broker`, …) are ignored. Partitions may be interleaved; within a partition offsets must ascend (gaps are
//! fine: compaction, transaction markers). Make dumps with `-X isolation.level=read_committed` (kcat's
//! librdkafka default): a dump holding an aborted transaction's records cannot be told apart.
//!
//! Checkpoints are the pipeline's table (`replaysafe_checkpoints`, keyed by group, generation, and the file's
//! topic/partition) under the load's group (its own by default, see `ops/load.rs`): each partition met in
//! the file is taken over (fence bumped) like an assignment in `run`, records below its checkpoint are skipped,
//! and every batch advances it in the batch's transaction. A second load of the same file under the same group
//! therefore applies nothing; under another group every record is a duplicate. A record at or past its live
//! partition's end (when the broker told it) stops the load before its batch: a checkpoint never passes the
//! end. No Kafka offsets are committed.

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::time::Duration;

use crate::config::Pipeline;
use crate::engine::{lock, Ack, NoAck, PartState, Polled, Record, Shared, Source, Tp};
use crate::error::{Error, Result};
use crate::source::kcat::{not_utf8, parse_line};

/// Records sent from the reader thread at a time.
const CHUNK: usize = 1024;

/// One record of the file, with its line number.
type Read = (usize, Record);

/// A partition met in the file.
struct Seen {
    /// The checkpoint when taken over: records below it are skipped.
    next: Option<i64>,
    /// Last offset read (order check).
    last: Option<i64>,
}

/// Records read ahead of the engine, per partition, handed out in turn. A kcat file holds long runs of one
/// partition (kcat writes what each fetch returned); handed out in file order, a flush would carry one or two
/// partitions' batches and leave the other connections idle. Interleaved, each flush carries every partition
/// read ahead, applied in parallel as in `run`. Order within a partition is the file's.
struct Window {
    queues: Vec<(Tp, VecDeque<Read>)>,
    /// The queue to take from next.
    turn: usize,
    held: usize,
    /// Records held at most: `batch.max-records` × `postgres.connections` × 5 (enough to span several of a
    /// kcat file's runs of one partition, ~10,000–15,000 records each), at least one chunk, at most 100,000.
    cap: usize,
    /// Bytes of keys and values held.
    bytes: usize,
    /// Bytes held at most: `batch.max-bytes` × `postgres.connections` (large records: memory follows their
    /// bytes, not only their count). One chunk (≤ `max-bytes` and one record) may pass it.
    cap_bytes: usize,
}

/// Bytes of a record's key and value, as `batch.max-bytes` counts them.
fn size(r: &Record) -> usize {
    r.key.as_ref().map_or(0, Vec::len) + r.value.as_ref().map_or(0, Vec::len)
}

impl Window {
    fn put(&mut self, chunk: Vec<Read>) {
        for (line, r) in chunk {
            self.held += 1;
            self.bytes += size(&r);
            match self.queues.iter_mut().find(|(tp, _)| *tp == r.tp) {
                Some((_, q)) => q.push_back((line, r)),
                None => self
                    .queues
                    .push((r.tp.clone(), VecDeque::from([(line, r)]))),
            }
        }
    }

    /// The next record, taking partitions in turn.
    fn take(&mut self) -> Option<Read> {
        let n = self.queues.len();
        for i in 0..n {
            let at = (self.turn + i) % n;
            if let Some(read) = self.queues[at].1.pop_front() {
                self.turn = (at + 1) % n;
                self.held -= 1;
                self.bytes -= size(&read.1);
                return Some(read);
            }
        }
        None
    }
}

/// The file source.
pub struct File {
    core: Shared,
    path: PathBuf,
    group: String,
    rx: Option<Receiver<Result<Vec<Read>>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    window: Window,
    /// The reader's error, returned once the records read before it are handed out.
    failed: Option<Error>,
    seen: HashMap<Tp, Seen>,
    /// The live topics' partition ends by partition number ([`end_of`]); a topic absent is
    /// not checked.
    ends: HashMap<String, Vec<i64>>,
    eof: bool,
    skipped: u64,
    ack: NoAck,
}

impl File {
    /// Opens `path` and starts reading it on a thread (parsing overlaps decoding and the transactions; the
    /// channel is bounded, so memory stays flat); records are decided there too. `group`: of the checkpoints;
    /// `ends`: the live partitions' ends per topic (next offset to be written), a record at or past which
    /// fails the load; `quarantine_invalid_utf8`: a line that is not UTF-8 is dead-lettered instead of stopping
    /// the load.
    ///
    /// # Errors
    /// [`Error::Usage`] when the file cannot be opened.
    pub fn open(
        core: Shared,
        path: &Path,
        group: &str,
        ends: HashMap<String, Vec<i64>>,
        quarantine_invalid_utf8: bool,
    ) -> Result<File> {
        let file = std::fs::File::open(path)
            .map_err(|e| Error::Usage(format!("cannot open {}: {e}", path.display())))?;
        let reader = std::io::BufReader::with_capacity(1 << 20, file);
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Read>>>(4);
        let pipeline = lock(&core).pipeline.clone();
        let cap = (pipeline.max_records * pipeline.postgres.connections * 5).clamp(CHUNK, 100_000);
        let cap_bytes = pipeline
            .max_bytes
            .saturating_mul(pipeline.postgres.connections);
        let reader = {
            let path = path.to_path_buf();
            std::thread::spawn(move || {
                read_file(&pipeline, (&path, quarantine_invalid_utf8), reader, &tx)
            })
        };
        let owner = group.to_string();
        Ok(File {
            core,
            path: path.to_path_buf(),
            group: group.to_string(),
            rx: Some(rx),
            reader: Some(reader),
            window: Window {
                queues: Vec::new(),
                turn: 0,
                held: 0,
                cap,
                bytes: 0,
                cap_bytes,
            },
            failed: None,
            seen: HashMap::new(),
            ends,
            eof: false,
            skipped: 0,
            ack: NoAck(Box::new(move |tp: &Tp| {
                Error::Other(format!(
                    "{}/{} was taken over by another consumer of group `{owner}` while loading; nothing of that \
                     batch was applied",
                    tp.0, tp.1
                ))
            })),
        })
    }

    /// Takes over a partition's checkpoint row (fence bumped), like an assignment in `run`.
    fn take_over(&mut self, tp: &Tp) -> Result<()> {
        let mut core = lock(&self.core);
        let a = core.take_over(&self.ack, &self.group, std::slice::from_ref(tp), false)?;
        let (next, fence) = (a[0].next, a[0].fence);
        tracing::info!(topic = %tp.0, partition = tp.1, ?next, fence, "partition taken over from the file");
        core.parts
            .insert(tp.clone(), PartState::new(fence, next.unwrap_or(0), next));
        self.seen.insert(tp.clone(), Seen { next, last: None });
        Ok(())
    }

    /// Checks one record of the file: `Some` to apply it, `None` to skip it (below the checkpoint).
    /// Fills the window from the reader: without waiting while it holds records, else up to `timeout` for
    /// the next chunk. Marks the end of the file, or keeps the reader's error for after the window.
    fn read_ahead(&mut self, timeout: Duration) {
        while self.window.held < self.window.cap && self.window.bytes < self.window.cap_bytes {
            let Some(rx) = &self.rx else {
                return;
            };
            let got = if self.window.held > 0 {
                rx.try_recv().map_err(|e| match e {
                    TryRecvError::Empty => RecvTimeoutError::Timeout,
                    TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                })
            } else {
                rx.recv_timeout(timeout)
            };
            match got {
                Ok(Ok(chunk)) => self.window.put(chunk),
                Ok(Err(e)) => {
                    self.failed = Some(e);
                    self.rx = None;
                }
                Err(RecvTimeoutError::Timeout) => return,
                Err(RecvTimeoutError::Disconnected) => {
                    self.eof = true;
                    self.rx = None;
                }
            }
        }
    }

    fn admit(&mut self, line: usize, r: Record) -> Result<Option<Record>> {
        if let Some(ends) = self.ends.get(&r.tp.0) {
            let end = end_of(ends, r.tp.1);
            if r.offset >= end {
                return Err(Error::Other(format!(
                    "{}:{line}: offset {} of {}/{} is at or past the live partition's end {end}: not a dump of the \
                     live topic; stopped before applying it (the checkpoint stays at or below the end)",
                    self.path.display(),
                    r.offset,
                    r.tp.0,
                    r.tp.1,
                )));
            }
        }
        if !self.seen.contains_key(&r.tp) {
            self.take_over(&r.tp)?;
        }
        let seen = self
            .seen
            .get_mut(&r.tp)
            .expect("a record's partition is taken over before its records come");
        if let Some(l) = seen.last.filter(|l| r.offset <= *l) {
            return Err(Error::Other(format!(
                "{}:{line}: offset {} of {}/{} does not ascend (previous {l})",
                self.path.display(),
                r.offset,
                r.tp.0,
                r.tp.1,
            )));
        }
        seen.last = Some(r.offset);
        if seen.next.is_some_and(|next| r.offset < next) {
            self.skipped += 1;
            return Ok(None);
        }
        Ok(Some(r))
    }
}

impl Source for File {
    fn poll(&mut self, timeout: Duration) -> Polled {
        loop {
            self.read_ahead(timeout);
            let Some((line, r)) = self.window.take() else {
                if let Some(e) = self.failed.take() {
                    return Polled::Failed(e);
                }
                return Polled::Idle;
            };
            match self.admit(line, r) {
                Ok(Some(r)) => return Polled::Record(r),
                Ok(None) => {}
                Err(e) => return Polled::Failed(e),
            }
        }
    }

    fn ack(&self) -> &dyn Ack {
        &self.ack
    }

    fn finished(&mut self, _idle_turns: u32) -> bool {
        self.eof && self.window.held == 0
    }

    fn interrupted(&self) -> Option<Error> {
        Some(Error::Other(format!(
            "interrupted while reading {}: what was read is applied and checkpointed; rerun to resume",
            self.path.display()
        )))
    }

    fn flush_on_error(&self) -> bool {
        // The records before a bad line are applied (a rerun resumes after them).
        true
    }

    fn close(&mut self) {
        // Stops the reader (its next send fails) when we stopped early.
        self.rx = None;
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        if self.skipped > 0 {
            tracing::info!(
                skipped = self.skipped,
                "records below their partition's checkpoint were skipped (applied before)"
            );
        }
    }
}

/// The reader thread: parses kcat lines, checks the topic, decides each record, and sends them in chunks of
/// [`CHUNK`] records or `batch.max-bytes` bytes of keys and values (whichever comes first; the channel holds 4);
/// the first bad line ends the stream with an error naming `file:line`.
fn read_file(
    pipeline: &Pipeline,
    (path, quarantine_invalid_utf8): (&Path, bool),
    mut reader: impl BufRead,
    tx: &SyncSender<Result<Vec<Read>>>,
) {
    let at = |n: usize| format!("{}:{n}", path.display());
    let mut line = Vec::new();
    let mut n = 0usize;
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut chunk_bytes = 0usize;
    let end = loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break Ok(()),
            Ok(_) => {}
            Err(e) => break Err(Error::Other(format!("reading {}: {e}", at(n + 1)))),
        }
        n += 1;
        let record = match std::str::from_utf8(&line) {
            Ok(text) if text.trim().is_empty() => continue,
            Ok(text) => parse_line(pipeline, text.trim(), &at(n)),
            Err(e) => not_utf8(pipeline, &line, e, (&at(n), quarantine_invalid_utf8)),
        };
        match record {
            Ok(r) => {
                chunk_bytes += size(&r);
                chunk.push((n, r));
            }
            Err(e) => break Err(e),
        }
        if chunk.len() >= CHUNK || chunk_bytes >= pipeline.max_bytes {
            chunk_bytes = 0;
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
            if tx.send(Ok(full)).is_err() {
                return;
            }
        }
    };
    if !chunk.is_empty() && tx.send(Ok(chunk)).is_err() {
        return;
    }
    if let Err(e) = end {
        let _ = tx.send(Err(e));
    }
}

/// The end of `partition` among a topic's partition ends (0 for a partition the topic does not have).
pub fn end_of(ends: &[i64], partition: i32) -> i64 {
    usize::try_from(partition)
        .ok()
        .and_then(|i| ends.get(i).copied())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(partition: i32, offset: i64, value: usize) -> Read {
        let r = Record {
            tp: ("t".to_string(), partition),
            offset,
            timestamp_ms: None,
            key: Some(b"k".to_vec()),
            value: Some(vec![b'v'; value]),
            old_key: None,
            decided: None,
        };
        (usize::try_from(offset).unwrap() + 1, r)
    }

    /// The window counts the bytes of keys and values it holds (what its `batch.max-bytes` × `connections` cap
    /// reads) and hands partitions out in turn, each in file order.
    #[test]
    fn window_counts_bytes_and_takes_partitions_in_turn() {
        let mut w = Window {
            queues: Vec::new(),
            turn: 0,
            held: 0,
            cap: 100,
            bytes: 0,
            cap_bytes: 1000,
        };
        w.put(vec![rec(0, 0, 99), rec(0, 1, 199), rec(1, 0, 299)]);
        assert_eq!((w.held, w.bytes), (3, 600));
        let mut order = Vec::new();
        while let Some((_, r)) = w.take() {
            order.push((r.tp.1, r.offset, w.bytes));
        }
        assert_eq!(order, vec![(0, 0, 500), (1, 0, 200), (0, 1, 0)]);
        assert_eq!(w.held, 0);
    }
}
