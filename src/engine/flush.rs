//! A flush: the buffered records of several partitions cut into batches and applied on a background thread,
//! over the `postgres.connections` connections in parallel (one partition's batches in order on one
//! connection), while the engine goes on polling and decoding.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use chrono::NaiveDate;

use crate::engine::apply::{apply_batch, Applied};
use crate::engine::types::{PartState, Tp};
use crate::error::{Error, Result};
use crate::model::{Batch, Item};
use crate::sink::Sink;

/// How large one partition batch may be: `batch.max-records` and `batch.max-bytes` (keys and values,
/// [`Item::size`]). A batch holds at least one record, whatever its size.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Records, at most.
    pub records: usize,
    /// Bytes of keys and values, at most (unless one record alone is larger).
    pub bytes: usize,
}

impl Limits {
    /// The limits `pipeline` declares.
    pub fn of(pipeline: &crate::config::Pipeline) -> Limits {
        Limits {
            records: pipeline.max_records,
            bytes: pipeline.max_bytes,
        }
    }

    /// Whether a buffer of `records` holding `bytes` makes a full batch.
    pub fn full(&self, records: usize, bytes: usize) -> bool {
        records >= self.records || bytes >= self.bytes
    }
}

/// One batch of a flush, with its items' partition-by days (empty when not tracked).
pub struct Cut {
    /// The batch.
    pub batch: Batch,
    /// Partition-by day per item, or empty.
    pub days: Vec<Option<NaiveDate>>,
    /// `[source] transactions = "atomic"`: the parts of one source transaction, applied in one transaction
    /// without checkpoint steps (`batch` is then an empty placeholder); `None` for a partition's batch.
    pub tx: Option<Vec<Batch>>,
    /// With `tx`: not applied — its changes are tried in a rolled-back transaction to see whether all are
    /// already claimed ([`crate::engine::txbuf::Why::Check`]).
    pub check: bool,
}

type Results = (Vec<Sink>, Vec<(Cut, Result<Applied>)>);

/// A flush applied on a background thread; joined when the engine settles it.
pub struct Inflight {
    handle: std::thread::JoinHandle<Results>,
    started: Instant,
    /// Records in the flush's batches (a source transaction's parts included).
    pub records: usize,
}

impl Inflight {
    /// Whether the flush has finished (joining will not wait).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for the flush: the connections back, and each batch with what became of it.
    ///
    /// # Errors
    /// [`Error::Other`] when the flush thread panicked.
    pub fn join(self) -> Result<Results> {
        let waited = Instant::now();
        let r = self
            .handle
            .join()
            .map_err(|_| Error::Other("the flush thread panicked".into()))?;
        tracing::debug!(
            applied_ms = crate::units::ms(self.started.elapsed()),
            waited_ms = crate::units::ms(waited.elapsed()),
            "flush settled"
        );
        metrics::histogram!("replaysafe_flush_seconds")
            .record(self.started.elapsed().as_secs_f64());
        Ok(r)
    }
}

/// Takes the buffers of the partitions selected by `which` and cuts them into batches within `max` (records
/// and bytes), each expecting the checkpoint the previous one leaves.
pub fn cut(
    parts: &mut BTreeMap<Tp, PartState>,
    max: Limits,
    which: impl Fn(&Tp, &PartState) -> bool,
) -> Vec<Cut> {
    cut_bounded(parts, max, which, &|_| None)
}

/// As [`cut`], each partition's batches ending at most at `bound(tp)` (the lowest offset a source transaction
/// still holds, `[source] transactions = "atomic"`): records from there stay buffered; a partition with nothing
/// to cut below its bound but a checkpoint below it (transaction records applied) gets a batch without records.
pub fn cut_bounded(
    parts: &mut BTreeMap<Tp, PartState>,
    max: Limits,
    which: impl Fn(&Tp, &PartState) -> bool,
    bound: &dyn Fn(&Tp) -> Option<i64>,
) -> Vec<Cut> {
    let mut cuts = Vec::new();
    for (tp, st) in parts.iter_mut() {
        let limit = bound(tp);
        if (st.buffer.is_empty() && limit.is_none()) || !which(tp, st) {
            continue;
        }
        let (items, kept, mut days, tracked) = take_below(st, limit);
        if items.is_empty() {
            if let Some(l) = limit.filter(|l| *l > st.next.unwrap_or(st.start)) {
                cuts.push(step(tp, st.fence, st.next, l));
            }
            st.buffer = kept.0;
            st.bytes = st.buffer.iter().map(Item::size).sum();
            st.days = kept.1;
            continue;
        }
        st.buffer = kept.0;
        st.bytes = st.buffer.iter().map(Item::size).sum();
        st.days = kept.1;
        st.oldest = if st.buffer.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        let mut expected = st.next;
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            let chunk = take_batch(&mut it, max);
            let mut end = chunk.last().expect("checked non-empty just above").offset + 1;
            if let (None, Some(l)) = (it.peek(), limit) {
                // The last chunk: past the transaction records applied before the bound.
                end = end.max(l);
            }
            let chunk_days = if tracked {
                days.by_ref().take(chunk.len()).collect()
            } else {
                Vec::new()
            };
            cuts.push(Cut {
                batch: Batch {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    fence: st.fence,
                    expected,
                    end,
                    items: chunk,
                },
                days: chunk_days,
                tx: None,
                check: false,
            });
            expected = Some(end);
        }
    }
    cuts
}

type Taken = (
    Vec<Item>,
    (Vec<Item>, Vec<Option<NaiveDate>>),
    std::vec::IntoIter<Option<NaiveDate>>,
    bool,
);

/// A partition's buffered items below `limit` (all without one) and their days; the rest kept.
fn take_below(st: &mut PartState, limit: Option<i64>) -> Taken {
    let items = std::mem::take(&mut st.buffer);
    let days = std::mem::take(&mut st.days);
    let tracked = !days.is_empty();
    let n = limit.map_or(items.len(), |l| items.partition_point(|i| i.offset < l));
    let (mut items, mut days) = (items, days);
    let rest = items.split_off(n);
    let rest_days = if tracked {
        days.split_off(n)
    } else {
        Vec::new()
    };
    (items, (rest, rest_days), days.into_iter(), tracked)
}

/// The next batch of `items`: records while within `max` (records and bytes), at least one.
fn take_batch(
    items: &mut std::iter::Peekable<impl Iterator<Item = Item>>,
    max: Limits,
) -> Vec<Item> {
    let mut chunk = Vec::new();
    let mut bytes = 0;
    while chunk.len() < max.records {
        let Some(next) = items.peek() else {
            break;
        };
        let size = next.size();
        if !chunk.is_empty() && bytes + size > max.bytes {
            break;
        }
        bytes += size;
        chunk.push(items.next().expect("peeked just above"));
    }
    chunk
}

/// A batch without records moving `tp`'s checkpoint from `from` (`None`: none yet) to `to`.
pub fn step(tp: &Tp, fence: i64, from: Option<i64>, to: i64) -> Cut {
    Cut {
        batch: Batch {
            topic: tp.0.clone(),
            partition: tp.1,
            fence,
            expected: from,
            end: to,
            items: Vec::new(),
        },
        days: Vec::new(),
        tx: None,
        check: false,
    }
}

/// Starts applying `cuts` on a background thread over `sinks` (partition → connection by hash). A fenced
/// partition skips its own later batches only; an error stops the lane (the run ends with it, and the skipped
/// batches were never committed).
pub fn launch(
    rt: &tokio::runtime::Handle,
    mut sinks: Vec<Sink>,
    cuts: Vec<Cut>,
    stop: Arc<AtomicBool>,
) -> Inflight {
    let n = sinks.len();
    let records = cuts
        .iter()
        .filter(|c| !c.check)
        .map(|c| c.batch.items.len() + c.tx.iter().flatten().map(|b| b.items.len()).sum::<usize>())
        .sum();
    let mut lanes: Vec<Vec<Cut>> = (0..n).map(|_| Vec::new()).collect();
    for c in cuts {
        let lane = (c.batch.partition.unsigned_abs() as usize + c.batch.topic.len()) % n;
        lanes[lane].push(c);
    }
    tracing::debug!(
        batches = lanes.iter().map(Vec::len).sum::<usize>(),
        lanes = lanes.iter().filter(|l| !l.is_empty()).count(),
        records,
        "flush launched"
    );
    let rt = rt.clone();
    let started = Instant::now();
    let handle = std::thread::spawn(move || {
        let give_up = move || stop.load(Ordering::Relaxed);
        let results = rt.block_on(async {
            let futs = sinks
                .iter_mut()
                .zip(lanes)
                .map(|(sink, lane)| apply_lane(sink, lane, &give_up));
            futures::future::join_all(futs).await
        });
        (sinks, results.into_iter().flatten().collect())
    });
    Inflight {
        handle,
        started,
        records,
    }
}

async fn apply_lane(
    sink: &mut Sink,
    lane: Vec<Cut>,
    give_up: &(dyn Fn() -> bool + Sync),
) -> Vec<(Cut, Result<Applied>)> {
    let mut out = Vec::with_capacity(lane.len());
    // A partition fenced or rewound skips its own later batches only; an error stops the lane (the run ends
    // with it, and the skipped batches were never committed).
    let mut stopped: Vec<Tp> = Vec::new();
    let mut failed = false;
    for c in lane {
        let tp = (c.batch.topic.clone(), c.batch.partition);
        if failed || stopped.contains(&tp) {
            out.push((c, Ok(Applied::Skipped)));
            continue;
        }
        let r = match &c.tx {
            Some(parts) if c.check => Ok(crate::engine::txapply::check(sink, parts).await),
            Some(parts) => crate::engine::txapply::apply_transaction(sink, parts, give_up).await,
            None => apply_batch(sink, &c.batch, give_up).await,
        };
        match &r {
            Ok(Applied::Committed(_) | Applied::Skipped) => {}
            Ok(Applied::Fenced | Applied::Rewound(_)) => stopped.push(tp),
            Err(_) => failed = true,
        }
        out.push((c, r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Pending;

    fn item(offset: i64) -> Item {
        Item {
            offset,
            timestamp_ms: None,
            key: None,
            value: None,
            pending: Pending::Filtered("t".into()),
        }
    }

    #[test]
    fn cut_chains_expected_checkpoints_and_splits_days_with_items() {
        let mut parts = BTreeMap::new();
        let mut a = PartState::new(7, 10, Some(10));
        let d = NaiveDate::from_ymd_opt(2024, 4, 25);
        for o in [10, 11, 13, 14, 15] {
            a.buffer.push(item(o));
            a.days.push(if o == 13 { None } else { d });
        }
        a.oldest = Some(Instant::now());
        parts.insert(("t".to_string(), 0), a);
        let mut b = PartState::new(3, 0, None);
        b.buffer.push(item(0));
        parts.insert(("t".to_string(), 1), b);
        parts.insert(("t".to_string(), 2), PartState::new(1, 0, None));

        let max = Limits {
            records: 2,
            bytes: usize::MAX,
        };
        let cuts = cut(&mut parts, max, |_, _| true);
        let shape: Vec<(i32, i64, Option<i64>, i64, usize, usize)> = cuts
            .iter()
            .map(|c| {
                let b = &c.batch;
                (
                    b.partition,
                    b.fence,
                    b.expected,
                    b.end,
                    b.items.len(),
                    c.days.len(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, 7, Some(10), 12, 2, 2),
                (0, 7, Some(12), 15, 2, 2),
                (0, 7, Some(15), 16, 1, 1),
                (1, 3, None, 1, 1, 0),
            ]
        );
        assert_eq!(cuts[1].days, vec![None, d]);
        assert!(parts
            .values()
            .all(|p| p.buffer.is_empty() && p.days.is_empty() && p.oldest.is_none()));
    }

    #[test]
    fn cut_leaves_unselected_partitions_buffered() {
        let mut parts = BTreeMap::new();
        for p in 0..2 {
            let mut st = PartState::new(1, 0, Some(0));
            st.buffer.push(item(0));
            parts.insert(("t".to_string(), p), st);
        }
        let max = Limits {
            records: 100,
            bytes: usize::MAX,
        };
        let cuts = cut(&mut parts, max, |tp, _| tp.1 == 1);
        assert_eq!(cuts.len(), 1);
        assert_eq!(cuts[0].batch.partition, 1);
        assert_eq!(parts[&("t".to_string(), 0)].buffered(), 1);
        assert_eq!(parts[&("t".to_string(), 1)].buffered(), 0);
    }

    /// `batch.max-bytes`: a batch ends before the record that would take it past the byte limit, a record larger
    /// than the limit is a batch of its own, and the record limit still applies; the bytes left buffered are
    /// counted again.
    #[test]
    fn cut_splits_batches_by_bytes_of_keys_and_values() {
        let sized = |offset: i64, key: usize, value: usize| Item {
            key: Some(vec![b'k'; key]),
            value: Some(vec![b'v'; value]),
            ..item(offset)
        };
        let mut parts = BTreeMap::new();
        let mut a = PartState::new(1, 0, Some(0));
        // sizes 40, 40, 30 | 250 | 10, 10, 10 | 10 (records limit 3)
        for (o, k, v) in [
            (0, 10, 30),
            (1, 0, 40),
            (2, 5, 25),
            (3, 50, 200),
            (4, 0, 10),
            (5, 0, 10),
            (6, 0, 10),
            (7, 0, 10),
        ] {
            let it = sized(o, k, v);
            a.bytes += it.size();
            a.buffer.push(it);
        }
        assert_eq!(a.buffered_bytes(), 400);
        parts.insert(("t".to_string(), 0), a);
        let max = Limits {
            records: 3,
            bytes: 110,
        };
        assert!(max.full(3, 0) && max.full(0, 110) && !max.full(2, 109));
        let cuts = cut(&mut parts, max, |_, _| true);
        let shape: Vec<(Option<i64>, i64, Vec<i64>)> = cuts
            .iter()
            .map(|c| {
                let b = &c.batch;
                (
                    b.expected,
                    b.end,
                    b.items.iter().map(|i| i.offset).collect(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (Some(0), 3, vec![0, 1, 2]),
                (Some(3), 4, vec![3]),
                (Some(4), 7, vec![4, 5, 6]),
                (Some(7), 8, vec![7]),
            ]
        );
        assert_eq!(parts[&("t".to_string(), 0)].buffered_bytes(), 0);
    }
}
