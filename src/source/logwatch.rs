//! A running `run` worker's watch on the log it reads (case C46 with the assignment kept): a topic deleted and
//! re-created under the same name while this member keeps its partitions.
//!
//! librdkafka (2.12) fetches by topic id (Fetch v13+, Kafka ≥ 3.1). When a metadata answer carries another id for
//! a topic it fetches, it adopts the new id and goes on fetching at the same offsets — now of the new log
//! (`rd_kafka_topic_metadata_update`, rdkafka_topic.c: "FIXME: an offset reset must be triggered"); no error or
//! offset reset reaches the application (a fetch's `UNKNOWN_TOPIC_ID` / `UNKNOWN_TOPIC_OR_PART` is handled inside
//! librdkafka), and with the default `topic.metadata.propagation.max.ms` (30 s) a topic re-created within that
//! time is never seen gone, so the group does not rebalance. librdkafka says so in one debug line of its
//! `metadata` context, `Topic T changed id from A to B`, logged on the thread that parses the metadata *before*
//! the new id is stored — so before any fetch of the new log is sent.
//!
//! The group consumer therefore enables that debug context ([`configure`]) and has its log lines delivered on a
//! queue of its own ([`LogWatch::attach`]): librdkafka calls [`LogWatch`]'s callback when a line arrives on the
//! empty queue (on the enqueuing thread, before it goes on), and the group source's poll, after taking a record
//! from librdkafka and before handing it to the engine, reads the lines that arrived ([`LogWatch::drain`]). Any
//! record of a new log was fetched after its announcement was queued, so it is seen by that poll at the latest:
//! a held partition whose checkpoint is on another topic id than the announced one stops the run (exit 7) with
//! that record not handed over — no record of the new log reaches a batch. The other lines are passed on as
//! librdkafka's log always was (warnings and errors; every line when the pipeline sets `debug` itself).
//!
//! Cost: one atomic load per poll; the metadata lines (one per partition per metadata refresh: every
//! `topic.metadata.refresh.interval.ms`, default 5 min, and after errors) are read and dropped. No request is
//! sent. A broker that fetches by topic name (before Kafka 3.1) serves a re-created topic without librdkafka
//! noticing until its next metadata refresh: there the watch stops the worker only at that refresh.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::bindings as rd;
use rdkafka::client::Client;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::ClientContext;

use crate::engine::Tp;
use crate::error::{Error, Result};

/// The librdkafka debug context whose lines announce a topic id change.
pub const DEBUG_CONTEXT: &str = "metadata";

/// The all-zero topic id: none known (a topic librdkafka has not described yet, a broker without topic ids).
const ZERO_ID: &str = "AAAAAAAAAAAAAAAAAAAAAA";

/// Adds [`DEBUG_CONTEXT`] to the client's `debug` contexts (kept when the pipeline sets its own) and lets debug
/// lines through librdkafka's log level; returns whether the pipeline asked for debug lines itself (they are then
/// passed on, [`LogWatch::new`]).
pub fn configure(config: &mut ClientConfig) -> bool {
    let own = config.get("debug").map(str::to_string);
    let contexts = match own.as_deref() {
        Some(v)
            if v.split(',')
                .any(|c| matches!(c.trim(), "all" | DEBUG_CONTEXT)) =>
        {
            v.to_string()
        }
        Some(v) if !v.trim().is_empty() => format!("{v},{DEBUG_CONTEXT}"),
        _ => DEBUG_CONTEXT.to_string(),
    };
    config.set("debug", contexts);
    config.set_log_level(RDKafkaLogLevel::Debug);
    own.is_some_and(|v| !v.trim().is_empty())
}

/// The topic and new topic id of librdkafka's `Topic T changed id from A to B` line (`[thrd:…]: ` may precede
/// it), else `None`. Topic names hold no spaces (Kafka allows `[a-zA-Z0-9._-]`).
pub fn announced(line: &str) -> Option<(String, String)> {
    let (head, tail) = line.split_once(" changed id from ")?;
    let topic = head.rsplit_once("Topic ")?.1.trim();
    let to = tail.split_once(" to ")?.1.split_whitespace().next()?;
    if topic.is_empty() || topic.contains(' ') || to.is_empty() {
        return None;
    }
    Some((topic.to_string(), to.to_string()))
}

/// A held partition on another log than the one librdkafka now reads: `(partition, held topic id, held cluster
/// id, the topic id now read)`.
pub type Changed = (Tp, String, Option<String>, String);

/// The log queue handle (owned; destroyed once, by [`LogWatch::detach`] or the watch's drop).
struct Queue(*mut rd::rd_kafka_queue_t);

// SAFETY: a librdkafka queue handle may be used from any thread (librdkafka locks the queue).
unsafe impl Send for Queue {}

/// See the module docs.
pub struct LogWatch {
    queue: Mutex<Option<Queue>>,
    /// Set by librdkafka (on its own thread) when a line arrives on the empty queue.
    arrived: Arc<AtomicBool>,
    /// Partition → the topic id (and cluster id) of the checkpoint it was taken over on.
    held: Mutex<BTreeMap<Tp, (String, Option<String>)>>,
    /// The pipeline set `debug` itself: every line is passed on, not only warnings and errors.
    pass_debug: bool,
}

/// librdkafka's callback when a line arrives on the watch's empty queue: only flags it (librdkafka forbids calling
/// into the client here).
unsafe extern "C" fn line_arrived(_rk: *mut rd::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `AtomicBool` of an `Arc` the watch keeps alive while the queue exists.
    let flag = unsafe { &*(opaque as *const AtomicBool) };
    flag.store(true, Ordering::SeqCst);
}

impl LogWatch {
    /// A watch not attached yet; `pass_debug` as [`configure`] returned.
    pub fn new(pass_debug: bool) -> LogWatch {
        LogWatch {
            queue: Mutex::new(None),
            arrived: Arc::new(AtomicBool::new(false)),
            held: Mutex::new(BTreeMap::new()),
            pass_debug,
        }
    }

    /// Routes the log lines of `client` (created with `log.queue`, as the `rdkafka` crate does) to the watch's own
    /// queue. Lines logged before this went to the main queue.
    ///
    /// # Errors
    /// [`Error::Other`] when librdkafka refuses the log queue.
    pub fn attach<C: ClientContext>(&self, client: &Client<C>) -> Result<()> {
        let rk = client.native_ptr();
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.is_some() {
            return Ok(());
        }
        let opaque = Arc::as_ptr(&self.arrived) as *mut c_void;
        // SAFETY: `rk` is a live client (borrowed); the queue is destroyed by `detach` (before the client) or the drop; the
        // callback's `opaque` lives as long as `self.arrived`, which outlives the queue.
        unsafe {
            let q = rd::rd_kafka_queue_new(rk);
            rd::rd_kafka_queue_cb_event_enable(q, Some(line_arrived), opaque);
            let err = rd::rd_kafka_set_log_queue(rk, q);
            if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                rd::rd_kafka_queue_destroy(q);
                return Err(Error::Other(format!(
                    "librdkafka refused a log queue for the topic-id watch ({err:?})"
                )));
            }
            *queue = Some(Queue(q));
        }
        // Lines may have arrived before the callback was set.
        self.arrived.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Gives `client`'s log lines back to its main queue and destroys the watch's queue (what is left on it is
    /// passed on first). Before the client closes.
    pub fn detach<C: ClientContext>(
        &self,
        client: &Client<C>,
        pass: &dyn Fn(RDKafkaLogLevel, &str, &str),
    ) {
        let rk = client.native_ptr();
        let taken = self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(q) = taken {
            // SAFETY: `rk` is live (borrowed; the caller closes it afterwards); the queue is ours and destroyed once.
            unsafe {
                rd::rd_kafka_set_log_queue(rk, std::ptr::null_mut());
                self.read(q.0, pass);
                rd::rd_kafka_queue_destroy(q.0);
            }
        }
    }

    /// Whether lines arrived since the last [`LogWatch::drain`] (one atomic load).
    pub fn arrived(&self) -> bool {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Reads the lines that arrived: each is passed on to `pass` (warnings and errors; all with the pipeline's own
    /// `debug`). Returns the held partitions whose checkpoint's topic id
    /// differs from an id announced now for their topic.
    pub fn drain(&self, pass: &dyn Fn(RDKafkaLogLevel, &str, &str)) -> Vec<Changed> {
        self.arrived.store(false, Ordering::SeqCst);
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let Some(q) = queue.as_ref() else {
            return Vec::new();
        };
        // SAFETY: the queue is live while its mutex is held.
        let announced = unsafe { self.read(q.0, pass) };
        drop(queue);
        // Tests: a watch that misses librdkafka's announcement (the out-of-range path must still name the log).
        fail::fail_point!("logwatch-blind", |_| Vec::new());
        if announced.is_empty() {
            return Vec::new();
        }
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (topic, id) in announced {
            tracing::debug!(%topic, topic_id = %id, "librdkafka reads the topic under this id now");
            for (tp, (was, cluster)) in
                held.range((topic.clone(), i32::MIN)..=(topic.clone(), i32::MAX))
            {
                if *was != id {
                    out.push((tp.clone(), was.clone(), cluster.clone(), id.clone()));
                }
            }
        }
        out
    }

    /// Reads every line on queue `q`, passing them on; returns the topic id announcements, in order.
    ///
    /// # Safety
    /// `q` is a live queue handle.
    unsafe fn read(
        &self,
        q: *mut rd::rd_kafka_queue_t,
        pass: &dyn Fn(RDKafkaLogLevel, &str, &str),
    ) -> Vec<(String, String)> {
        let mut ids = Vec::new();
        loop {
            // SAFETY: as the caller promises; each event is destroyed after its strings were copied.
            let ev = unsafe { rd::rd_kafka_queue_poll(q, 0) };
            if ev.is_null() {
                break;
            }
            let (mut fac, mut text, mut level): (*const c_char, *const c_char, c_int) =
                (std::ptr::null(), std::ptr::null(), 7);
            // SAFETY: `ev` is live until destroyed below; the strings belong to it.
            let line = unsafe {
                (rd::rd_kafka_event_log(ev, &mut fac, &mut text, &mut level) == 0).then(|| {
                    let s = |p: *const c_char| match p.is_null() {
                        true => String::new(),
                        false => CStr::from_ptr(p).to_string_lossy().into_owned(),
                    };
                    (s(fac), s(text))
                })
            };
            // SAFETY: the event is ours, destroyed once.
            unsafe { rd::rd_kafka_event_destroy(ev) };
            let Some((fac, text)) = line else {
                continue;
            };
            if level >= 7 {
                if let Some((topic, id)) = announced(&text).filter(|(_, id)| id != ZERO_ID) {
                    ids.push((topic, id));
                }
            }
            if level <= 4 || self.pass_debug {
                pass(log_level(level), &fac, &text);
            }
        }
        ids
    }

    /// Records that `tp` is held on a checkpoint of topic id `topic_id` (cluster `cluster_id`); without a topic id
    /// (a broker without ids) nothing is compared for it.
    pub fn hold(&self, tp: &Tp, topic_id: Option<&str>, cluster_id: Option<&str>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        match topic_id {
            Some(id) => {
                held.insert(tp.clone(), (id.to_string(), cluster_id.map(str::to_string)));
            }
            None => {
                held.remove(tp);
            }
        }
    }

    /// The partitions held whose checkpoint's topic id is not `ids`' id of their topic (a topic the broker did
    /// not describe is not compared).
    pub fn differ(&self, ids: &crate::source::kafka::LogIds) -> Vec<Changed> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter()
            .filter_map(|(tp, (was, cluster))| {
                let now = ids.topic(&tp.0)?;
                (now != was).then(|| (tp.clone(), was.clone(), cluster.clone(), now.to_string()))
            })
            .collect()
    }

    /// The topics of the partitions held with a topic id.
    pub fn held_topics(&self) -> Vec<String> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut t: Vec<String> = held.keys().map(|tp| tp.0.clone()).collect();
        t.dedup();
        t
    }
}

impl Drop for LogWatch {
    fn drop(&mut self) {
        // Not detached (the client is gone already): only the queue handle is released.
        if let Some(q) = self
            .queue
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            // SAFETY: the queue is ours and destroyed once; it holds only log events.
            unsafe { rd::rd_kafka_queue_destroy(q.0) };
        }
    }
}

/// librdkafka's syslog level as the `rdkafka` crate's.
fn log_level(level: c_int) -> RDKafkaLogLevel {
    match level {
        0 => RDKafkaLogLevel::Emerg,
        1 => RDKafkaLogLevel::Alert,
        2 => RDKafkaLogLevel::Critical,
        3 => RDKafkaLogLevel::Error,
        4 => RDKafkaLogLevel::Warning,
        5 => RDKafkaLogLevel::Notice,
        6 => RDKafkaLogLevel::Info,
        _ => RDKafkaLogLevel::Debug,
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "the tests' configurations are never connected"
)]
mod tests {
    use super::*;

    /// librdkafka 2.12's line (rdkafka_topic.c, `rd_kafka_topic_metadata_update`), with and without the thread
    /// name librdkafka puts in front.
    #[test]
    fn an_id_change_is_read_from_librdkafkas_line() {
        let line =
            "[thrd:main]: Topic shop.order-events_2 changed id from oFjsT4klRsGi9QK6TCbscg to \
                    pLG6WoUmT9mUr4sARdYLtQ";
        assert_eq!(
            announced(line),
            Some((
                "shop.order-events_2".to_string(),
                "pLG6WoUmT9mUr4sARdYLtQ".to_string()
            ))
        );
        assert_eq!(
            announced("Topic t changed id from AAAAAAAAAAAAAAAAAAAAAA to B"),
            Some(("t".into(), "B".into()))
        );
        assert_eq!(announced("Topic t [0] Leader 1 Epoch 0"), None);
        assert_eq!(announced("Topic  changed id from A to B"), None);
    }

    #[test]
    fn debug_contexts_are_added_to_the_pipelines_own() {
        let mut c = ClientConfig::new();
        assert!(!configure(&mut c));
        assert_eq!(c.get("debug"), Some("metadata"));
        let mut c = ClientConfig::new();
        c.set("debug", "cgrp,fetch");
        assert!(configure(&mut c));
        assert_eq!(c.get("debug"), Some("cgrp,fetch,metadata"));
        let mut c = ClientConfig::new();
        c.set("debug", "all");
        assert!(configure(&mut c));
        assert_eq!(c.get("debug"), Some("all"));
    }

    #[test]
    fn held_partitions_on_another_id_differ() {
        let w = LogWatch::new(false);
        let t = |p: i32| ("t".to_string(), p);
        w.hold(&t(0), Some("A"), Some("C"));
        w.hold(&t(1), Some("B"), Some("C"));
        w.hold(&("u".to_string(), 0), None, Some("C"));
        let ids = crate::source::kafka::LogIds {
            cluster: Some("C".into()),
            topics: [("t".to_string(), "B".to_string())].into(),
        };
        assert_eq!(
            w.differ(&ids),
            vec![(
                t(0),
                "A".to_string(),
                Some("C".to_string()),
                "B".to_string()
            )]
        );
        assert_eq!(w.held_topics(), vec!["t".to_string()]);
    }
}
