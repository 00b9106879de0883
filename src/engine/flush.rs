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
use crate::sink::{Batch, Item, Sink};

/// One batch of a flush, with its items' partition-by days (empty when not tracked).
pub struct Cut {
    /// The batch.
    pub batch: Batch,
    /// Partition-by day per item, or empty.
    pub days: Vec<Option<NaiveDate>>,
    /// `[source] transactions = "atomic"`: the parts of one source transaction, applied in one transaction
    /// without checkpoint steps (`batch` is then an empty placeholder); `None` for a partition's batch.
    pub tx: Option<Vec<Batch>>,
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
            applied_ms = self.started.elapsed().as_millis() as u64,
            waited_ms = waited.elapsed().as_millis() as u64,
            "flush settled"
        );
        metrics::histogram!("replaysafe_flush_seconds")
            .record(self.started.elapsed().as_secs_f64());
        Ok(r)
    }
}

/// Takes the buffers of the partitions selected by `which` and cuts them into batches of at most `max`
/// records, each expecting the checkpoint the previous one leaves.
pub fn cut(
    parts: &mut BTreeMap<Tp, PartState>,
    max: usize,
    which: impl Fn(&Tp, &PartState) -> bool,
) -> Vec<Cut> {
    cut_bounded(parts, max, which, &|_| None)
}

/// As [`cut`], each partition's batches ending at most at `bound(tp)` (the lowest offset a source transaction
/// still holds, `[source] transactions = "atomic"`): records from there stay buffered; a partition with nothing
/// to cut below its bound but a checkpoint below it (transaction records applied) gets a batch without records.
pub fn cut_bounded(
    parts: &mut BTreeMap<Tp, PartState>,
    max: usize,
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
            st.days = kept.1;
            continue;
        }
        st.buffer = kept.0;
        st.days = kept.1;
        st.oldest = if st.buffer.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        let mut expected = st.next;
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            let chunk: Vec<Item> = it.by_ref().take(max).collect();
            let mut end = chunk.last().expect("non-empty").offset + 1;
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
        .map(|c| c.batch.items.len() + c.tx.iter().flatten().map(|b| b.items.len()).sum::<usize>())
        .sum();
    let mut lanes: Vec<Vec<Cut>> = (0..n).map(|_| Vec::new()).collect();
    for c in cuts {
        let lane = (c.batch.partition as usize + c.batch.topic.len()) % n;
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
            Some(parts) => crate::engine::apply::apply_transaction(sink, parts, give_up).await,
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
    use crate::sink::Pending;

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

        let cuts = cut(&mut parts, 2, |_, _| true);
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
        let cuts = cut(&mut parts, 100, |tp, _| tp.1 == 1);
        assert_eq!(cuts.len(), 1);
        assert_eq!(cuts[0].batch.partition, 1);
        assert_eq!(parts[&("t".to_string(), 0)].buffered(), 1);
        assert_eq!(parts[&("t".to_string(), 1)].buffered(), 0);
    }
}
