//! The bounded wait for the consumer group: a member that stays out of a steady group membership for longer
//! than its bound while the brokers answer fails the run (exit 1) instead of idling.
//!
//! librdkafka retries a group coordinator that does not answer without a bound of its own, and a member can stay
//! stuck there after a broker restart — `REQTMOUT GroupCoordinator` every `socket.timeout.ms`, no assignment, for
//! as long as the process runs (confluentinc/librdkafka#3082, #2944; seen once in `scripts/chaos`' broker
//! scenario). Such a worker holds nothing and consumes nothing, yet looks alive. What the member's group handler
//! is doing is read from librdkafka's statistics (STATISTICS.md: `cgrp.state`, `cgrp.join_state`, and each
//! broker's `state`), emitted every `statistics.interval.ms` ([`STATS_INTERVAL_MS`] unless the pipeline sets it;
//! `0` turns statistics and this bound off; only the group consumer emits them, see
//! `source/kafka.rs`).
//!
//! The rules:
//! - a member is *steady* when `state` is `up` and `join_state` is `steady` — or `init` under the KIP-848
//!   protocol (`group.protocol = consumer`), where a member given no partitions never leaves `init`
//!   (`rd_kafka_cgrp_consumer_handle_next_assignment`). A member with an empty assignment is steady;
//! - the unsteady stretch starts at the first unsteady sample and ends at a steady sample or at the end of this
//!   member's own rebalance callback ([`Membership::settled`]): the time our take-overs and revocations take is
//!   not the group's;
//! - it is judged only when a sample arrives (an unsteady one, at least the second of the stretch), on the
//!   samples' own clock (`ts`), and only time while at least one broker connection is `UP` counts: a Kafka outage
//!   that every member sees is waited out (librdkafka reconnects by itself) and the stretch starts again when a
//!   broker is back — what is bounded is a member stuck while Kafka answers;
//! - a member can also look steady while its group coordinator answers nothing: under the KIP-848 protocol a
//!   member keeps its join state (`steady`, or `init` without partitions) while its heartbeats time out — the
//!   session is the broker's to enforce — and under the classic protocol a JoinGroup or heartbeat can go
//!   unanswered (`REQTMOUT`) with the member believing it is in the group. So the coordinator connection is
//!   watched too: librdkafka's logical broker `GroupCoordinator` carries every group request (heartbeats every
//!   `heartbeat.interval.ms`, or the broker's `group.consumer.heartbeat.interval.ms` under KIP-848) and counts
//!   the responses it received (`rx`). A coordinator that has answered nothing for longer than the bound while
//!   a broker is up fails the run the same way (counted while the member is steady; an unsteady one is bounded
//!   by the rule above); an idle member with no partitions whose heartbeats are answered stays (it is steady,
//!   `/readyz` says "no assignment since …");
//! - the bound is `max.poll.interval.ms + session.timeout.ms` (defaults 300 s + 45 s). A healthy rebalance ends
//!   within the group's rebalance timeout, which is the members' `max.poll.interval.ms` (librdkafka sends it in
//!   JoinGroup and times the request out 3 s after it, `rdkafka_request.c`), plus a session for a member that
//!   left without a word. Members of one group should share `max.poll.interval.ms`: a member waiting on a peer's
//!   longer rebalance timeout gives up first. The exit comes at most one statistics interval after the bound.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use serde::Deserialize;

use crate::error::Error;

/// `statistics.interval.ms` of `run`'s group consumer unless the pipeline sets it, in ms.
pub const STATS_INTERVAL_MS: u64 = 5_000;

/// The part of librdkafka's statistics JSON read here (STATISTICS.md); the rest is skipped.
#[derive(Deserialize)]
struct Stats {
    /// When librdkafka made the document: its monotonic clock, in µs.
    ts: i64,
    cgrp: Option<Cgrp>,
    #[serde(default)]
    brokers: HashMap<String, Broker>,
}

#[derive(Deserialize)]
struct Cgrp {
    state: String,
    join_state: String,
    /// Partitions currently assigned to this member.
    #[serde(default)]
    assignment_size: i64,
}

/// The name of librdkafka's logical broker connection to the group coordinator (STATISTICS.md, `brokers`).
const COORDINATOR: &str = "GroupCoordinator";

#[derive(Deserialize)]
struct Broker {
    state: String,
    /// -1 for the bootstrap and logical (coordinator) connections.
    #[serde(default = "unknown_node")]
    nodeid: i32,
    /// Responses received on this connection, in all.
    #[serde(default)]
    rx: u64,
}

fn unknown_node() -> i32 {
    -1
}

/// The current unsteady stretch.
#[derive(Debug)]
struct Unsteady {
    /// The document time (`ts`, µs) since when Kafka answered and the member was not steady.
    since: i64,
    state: String,
    join_state: String,
    /// Set by the sample that found the stretch longer than the bound with a broker up.
    overdue: Option<Duration>,
    /// The wait was logged ([`Membership::notice`]): once per stretch.
    told: bool,
}

/// An unsteady stretch this long while Kafka answers is logged once, saying what the member waits for (a
/// restart after `kill -9` waits up to a session for the previous member's partitions).
pub const WAIT_NOTICE: Duration = Duration::from_secs(10);

/// The current stretch without a response from the group coordinator.
#[derive(Debug)]
struct Silent {
    /// The document time (`ts`, µs) since when the coordinator's `rx` has not moved while Kafka answered.
    since: i64,
    rx: u64,
    assigned: i64,
    /// Set by the sample that found the stretch longer than the bound.
    overdue: Option<Duration>,
}

/// The watchdog of one group member: fed by the statistics callback and the rebalance callback, asked by the
/// poll loop.
#[derive(Debug)]
pub struct Membership {
    /// `max.poll.interval.ms + session.timeout.ms`; `None` when statistics are off.
    bound: Option<Duration>,
    /// `group.protocol = consumer` (KIP-848).
    kip848: bool,
    /// `group.id`, `session.timeout.ms` and `max.poll.interval.ms` (ms), named by the wait's log line.
    group: String,
    session_ms: u64,
    poll_ms: u64,
    unsteady: Mutex<Option<Unsteady>>,
    silent: Mutex<Option<Silent>>,
    /// librdkafka's reason when Kafka refused this client's credentials since a broker last answered
    /// ([`Membership::refused`]): that time counts toward the bound (it is no outage every member sees).
    refused: Mutex<Option<String>>,
}

impl Membership {
    /// The watchdog for a consumer configured with `config` (librdkafka defaults for what it does not set).
    pub fn new(config: &ClientConfig) -> Membership {
        let ms = |key: &str, default: u64| {
            config
                .get(key)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(default)
        };
        let stats_on = ms("statistics.interval.ms", 0) > 0;
        let (poll_ms, session_ms) = (
            ms("max.poll.interval.ms", 300_000),
            ms("session.timeout.ms", 45_000),
        );
        let bound = Duration::from_millis(poll_ms + session_ms);
        let kip848 = config
            .get("group.protocol")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("consumer"));
        Membership {
            bound: stats_on.then_some(bound),
            kip848,
            group: config.get("group.id").unwrap_or_default().to_string(),
            session_ms,
            poll_ms,
            unsteady: Mutex::new(None),
            silent: Mutex::new(None),
            refused: Mutex::new(None),
        }
    }

    /// How long the member may stay out of a steady membership; `None` when statistics are off.
    pub fn bound(&self) -> Option<Duration> {
        self.bound
    }

    fn stretch(&self) -> std::sync::MutexGuard<'_, Option<Unsteady>> {
        self.unsteady.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn silence(&self) -> std::sync::MutexGuard<'_, Option<Silent>> {
        self.silent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows the coordinator connection's responses (`rx`; `None`: no coordinator connection yet) at `ts`;
    /// `counts`: a broker is up (or refuses our credentials) and the member is steady. Returns for how long it
    /// has been silent.
    fn watch_coordinator(&self, ts: i64, rx: Option<u64>, assigned: i64, counts: bool) -> Duration {
        let mut silent = self.silence();
        let Some(rx) = rx else {
            *silent = None;
            return Duration::ZERO;
        };
        match silent.as_mut() {
            Some(s) if counts && s.rx == rx => {
                s.assigned = assigned;
                let waited = Duration::from_micros(crate::units::count(ts.saturating_sub(s.since)));
                if self.bound.is_some_and(|b| waited > b) {
                    s.overdue = Some(waited);
                }
                waited
            }
            // A response arrived, or no broker is up (an outage every member sees): the stretch starts again.
            _ => {
                *silent = Some(Silent {
                    since: ts,
                    rx,
                    assigned,
                    overdue: None,
                });
                Duration::ZERO
            }
        }
    }

    /// Kafka refused this client's credentials (librdkafka's `error_cb` with `_AUTHENTICATION`: a rotated or
    /// wrong SASL password): until a broker answers again, time without a broker up counts toward the bound —
    /// this is not an outage that every member sees and waits out, it lasts until the process gets new
    /// credentials. Also named by `/readyz`.
    pub fn refused(&self, reason: &str) {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
        crate::health::kafka_refused(Some(reason));
    }

    fn refusal(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// This member's rebalance callback finished: an unsteady stretch so far is not counted.
    pub fn settled(&self) {
        *self.stretch() = None;
    }

    /// Reads one statistics document (`stats_raw`'s bytes). Its own time (`ts`, when librdkafka made it) is the
    /// clock, not the time it is delivered: documents queued while the poll loop was busy keep their times. A
    /// document without `ts` or a `cgrp` object, or that does not parse, changes nothing.
    pub fn observe(&self, json: &[u8]) {
        let Ok(Stats {
            ts,
            cgrp: Some(g),
            brokers,
        }) = serde_json::from_slice::<Stats>(json)
        else {
            return;
        };
        let steady =
            g.state == "up" && (g.join_state == "steady" || self.kip848 && g.join_state == "init");
        let kafka_answers = brokers.values().any(|b| b.nodeid >= 0 && b.state == "UP");
        if kafka_answers && self.refusal().is_some() {
            *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
            crate::health::kafka_refused(None);
        }
        // Time counts while Kafka answers, or while it refuses our credentials.
        let counts = kafka_answers || self.refusal().is_some();
        let rx = match coordinator_silent() {
            true => Some(0),
            false => brokers.get(COORDINATOR).map(|b| b.rx),
        };
        // The silence rule is for a member that believes it is in the group; an unsteady one is bounded by its
        // stretch (a coordinator holding a JoinGroup back while the group waits for a peer answers nothing too).
        let quiet = self.watch_coordinator(ts, rx, g.assignment_size, counts && steady);
        let mut stretch = self.stretch();
        if steady {
            *stretch = None;
            drop(stretch);
            crate::health::group_trouble(trouble(quiet, None, &g));
            return;
        }
        match stretch.as_mut() {
            // While no broker is up, Kafka is down for every member: that time is not counted.
            Some(u) if !counts => {
                u.since = ts;
                u.overdue = None;
            }
            Some(u) => {
                let waited = Duration::from_micros(crate::units::count(ts.saturating_sub(u.since)));
                if self.bound.is_some_and(|b| waited > b) {
                    u.overdue = Some(waited);
                }
            }
            None => {
                *stretch = Some(Unsteady {
                    since: ts,
                    state: String::new(),
                    join_state: String::new(),
                    overdue: None,
                    told: false,
                })
            }
        }
        if let Some(u) = stretch.as_mut() {
            u.state = g.state.clone();
            u.join_state = g.join_state.clone();
            if let Some(line) = self.notice(u, ts) {
                tracing::info!("{line}");
            }
        }
        let unsteady = stretch
            .as_ref()
            .map(|u| Duration::from_micros(crate::units::count(ts.saturating_sub(u.since))));
        drop(stretch);
        crate::health::group_trouble(trouble(quiet, unsteady, &g));
    }

    /// The log line of a wait for the group: `Some` once per unsteady stretch, at the first sample that finds it
    /// [`WAIT_NOTICE`] or longer (time while Kafka answers; `ts` in µs on the samples' clock). Says what the member
    /// waits for — typically a previous member (the same worker killed with `kill -9`, a crash) that left the group
    /// without a word and keeps its partitions until its session expires (`session.timeout.ms`, Kafka's
    /// consumer configs), or a peer's rebalance (`max.poll.interval.ms`) — and when the wait gives up.
    fn notice(&self, u: &mut Unsteady, ts: i64) -> Option<String> {
        let waited = Duration::from_micros(crate::units::count(ts.saturating_sub(u.since)));
        if u.told || waited < WAIT_NOTICE {
            return None;
        }
        u.told = true;
        let limit = self.bound.map_or(String::new(), |b| {
            format!("; exits 1 if it is still waiting after {} s", b.as_secs())
        });
        Some(format!(
            "consumer group {}: waiting {} s to be given partitions (librdkafka group state `{}`, join state `{}`): \
             a previous member that stopped without leaving the group (kill -9, a crash, a cut network) keeps its \
             partitions until its session expires (session.timeout.ms = {} ms), or a member's rebalance is still \
             running (max.poll.interval.ms = {} ms){limit}",
            self.group,
            waited.as_secs(),
            u.state,
            u.join_state,
            self.session_ms,
            self.poll_ms
        ))
    }

    /// `Some` error once a sample found the member unsteady, or its group coordinator silent, for longer than
    /// the bound while Kafka answers.
    pub fn overdue(&self, group: &str) -> Option<Error> {
        let bound = self.bound?;
        let unsteady = self
            .stretch()
            .as_ref()
            .and_then(|u| Some((u.overdue?, u.state.clone(), u.join_state.clone())));
        let silent = self
            .silence()
            .as_ref()
            .and_then(|s| Some((s.overdue?, s.assigned)));
        if let Some(reason) = self.refusal() {
            // Refused credentials silence the coordinator too: the refusal is the reason to name.
            let waited = unsteady.as_ref().map(|u| u.0).max(silent.map(|s| s.0))?;
            return Some(Error::Other(format!(
                "consumer group {group}: Kafka has refused this client's credentials for {:.1} s ({reason}), \
                 longer than max.poll.interval.ms + session.timeout.ms = {:.1} s: check the sasl.* keys of \
                 [kafka.properties] (a rotated password?); exiting so that a restart with the right credentials \
                 resumes — what was applied is in the PostgreSQL checkpoints",
                waited.as_secs_f64(),
                bound.as_secs_f64()
            )));
        }
        let Some((waited, state, join_state)) = unsteady else {
            let (waited, assigned) = silent?;
            return Some(silent_error(group, waited, assigned, bound));
        };
        Some(Error::Other(format!(
            "consumer group {group}: this member has not been a steady group member for {:.1} s (librdkafka group \
             state `{state}`, join state `{join_state}`) while the brokers answer, longer than max.poll.interval.ms + \
             session.timeout.ms = {:.1} s: the group coordinator does not answer this member or a rebalance never \
             completes (a librdkafka client can stay stuck after a broker restart, confluentinc/librdkafka#3082; or \
             a member of the group with a longer max.poll.interval.ms stopped polling); exiting so that a restart \
             joins the group afresh — what was applied is in the PostgreSQL checkpoints",
            waited.as_secs_f64(),
            bound.as_secs_f64()
        )))
    }
}

/// The error of a member whose group coordinator answered none of its requests for `waited` (> `bound`) while it
/// held `assigned` partitions.
fn silent_error(group: &str, waited: Duration, assigned: i64, bound: Duration) -> Error {
    Error::Other(format!(
        "consumer group {group}: the group coordinator has answered none of this member's requests for {:.1} s \
         ({assigned} partitions assigned) while the brokers answer, longer than max.poll.interval.ms + \
         session.timeout.ms = {:.1} s: a group coordinator that never came back after a broker restart \
         (confluentinc/librdkafka#3082, #2944); exiting so that a restart joins the group afresh — what was \
         applied is in the PostgreSQL checkpoints",
        waited.as_secs_f64(),
        bound.as_secs_f64()
    ))
}

/// Test builds (`REPLAYSAFE_FAILPOINTS=coordinator-silent=return`): the coordinator's responses are not seen, as
/// from a coordinator that never answers again (librdkafka#3082), while the brokers and the group go on.
fn coordinator_silent() -> bool {
    fail::fail_point!("coordinator-silent", |_| true);
    false
}

/// What `/readyz` says about the group membership: `None` while it is steady and the coordinator answered within
/// the last [`QUIET_SHOWN`].
fn trouble(quiet: Duration, unsteady: Option<Duration>, g: &Cgrp) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(u) = unsteady {
        parts.push(format!(
            "not a steady group member for {} s (librdkafka group state `{}`, join state `{}`)",
            u.as_secs(),
            g.state,
            g.join_state
        ));
    }
    if quiet > QUIET_SHOWN {
        parts.push(format!(
            "the group coordinator has not answered for {} s",
            quiet.as_secs()
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// A coordinator silent for longer than this is named by `/readyz` (heartbeats are answered every few seconds).
const QUIET_SHOWN: Duration = Duration::from_secs(15);

#[cfg(test)]
mod tests {
    use super::*;

    /// A statistics document as librdkafka 2.12 writes it (trimmed), made at `secs` on its clock: one broker
    /// connection (`nodeid` 1) in `broker_state`, the bootstrap and coordinator connections beside it; the
    /// coordinator has answered `secs` requests so far (it answers between any two samples).
    fn stats(state: &str, join: &str, broker_state: &str, secs: i64) -> Vec<u8> {
        stats_rx(state, join, broker_state, secs, secs, 0)
    }

    /// [`stats`] with the coordinator's response count `rx` and `assigned` partitions.
    fn stats_rx(
        state: &str,
        join: &str,
        broker_state: &str,
        secs: i64,
        rx: i64,
        assigned: i64,
    ) -> Vec<u8> {
        let ts = secs * 1_000_000;
        format!(
            r#"{{"name":"c#consumer-1","type":"consumer","ts":{ts},
               "brokers":{{"127.0.0.1:9092/bootstrap":{{"name":"127.0.0.1:9092/bootstrap","nodeid":-1,"state":"UP"}},
                 "GroupCoordinator":{{"name":"GroupCoordinator","nodeid":-1,"state":"UP","rx":{rx}}},
                 "127.0.0.1:9092/1":{{"name":"127.0.0.1:9092/1","nodeid":1,"state":"{broker_state}"}}}},
               "topics":{{}},
               "cgrp":{{"state":"{state}","stateage":1,"join_state":"{join}","rebalance_age":2,
               "rebalance_cnt":1,"rebalance_reason":"","assignment_size":{assigned}}}}}"#
        )
        .into_bytes()
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "a test's statistics fixture, never connected"
    )]
    fn config(pairs: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in pairs {
            c.set(*k, *v);
        }
        c
    }

    /// Bound 16 s.
    fn short(extra: &[(&str, &str)]) -> Membership {
        let mut pairs = vec![
            ("statistics.interval.ms", "1000"),
            ("max.poll.interval.ms", "10000"),
            ("session.timeout.ms", "6000"),
        ];
        pairs.extend_from_slice(extra);
        Membership::new(&config(&pairs))
    }

    #[test]
    fn the_bound_is_the_rebalance_timeout_plus_a_session_and_off_without_statistics() {
        let on = [("statistics.interval.ms", "5000")];
        assert_eq!(
            Membership::new(&config(&on)).bound(),
            Some(Duration::from_secs(345))
        );
        assert_eq!(short(&[]).bound(), Some(Duration::from_secs(16)));
        assert_eq!(Membership::new(&config(&[])).bound(), None);
        let off = [("statistics.interval.ms", "0")];
        let m = Membership::new(&config(&off));
        assert_eq!(m.bound(), None);
        m.observe(&stats("wait-coord", "init", "UP", 0));
        m.observe(&stats("wait-coord", "init", "UP", 3600));
        assert!(m.overdue("g").is_none());
    }

    #[test]
    fn only_an_unbroken_unsteady_stretch_longer_than_the_bound_fails_and_only_at_a_sample() {
        let m = short(&[]);
        m.observe(&stats("up", "wait-join", "UP", 0));
        m.observe(&stats("up", "wait-sync", "UP", 16));
        assert!(m.overdue("g").is_none(), "at the bound, not past it");
        // Steady again: the clock starts over.
        m.observe(&stats("up", "steady", "UP", 17));
        m.observe(&stats("query-coord", "init", "UP", 20));
        m.observe(&stats("query-coord", "init", "UP", 30));
        assert!(m.overdue("g").is_none());
        m.observe(&stats("wait-coord", "init", "UP", 37));
        let e = m.overdue("g").expect("17 s unsteady > 16 s");
        let text = e.to_string();
        assert!(
            text.contains("consumer group g")
                && text.contains("for 17.0 s")
                && text.contains("state `wait-coord`, join state `init`")
                && text.contains("= 16.0 s"),
            "{text}"
        );
        assert_eq!(e.exit_code(), crate::error::EXIT_FAILURE);
        // A document without a time or a group, or that does not parse, changes nothing.
        m.observe(br#"{"name":"x","type":"consumer","ts":38000000}"#);
        m.observe(br#"{"name":"x","cgrp":{"state":"up","join_state":"steady"}}"#);
        m.observe(b"{not json");
        assert!(m.overdue("g").is_some());
        m.observe(&stats("up", "steady", "UP", 39));
        assert!(m.overdue("g").is_none());
    }

    #[test]
    fn a_wait_for_the_group_is_logged_once_per_stretch_after_ten_seconds() {
        let m = short(&[("group.id", "orders")]);
        let told = |m: &Membership| m.stretch().as_ref().is_some_and(|u| u.told);
        m.observe(&stats("up", "wait-join", "UP", 0));
        m.observe(&stats("up", "wait-join", "UP", 9));
        assert!(!told(&m), "not yet: 9 s");
        let mut u = Unsteady {
            since: 0,
            state: "up".into(),
            join_state: "wait-join".into(),
            overdue: None,
            told: false,
        };
        let line = m.notice(&mut u, 10_000_000).expect("logged at 10 s");
        assert_eq!(
            line,
            "consumer group orders: waiting 10 s to be given partitions (librdkafka group state `up`, join state \
             `wait-join`): a previous member that stopped without leaving the group (kill -9, a crash, a cut \
             network) keeps its partitions until its session expires (session.timeout.ms = 6000 ms), or a \
             member's rebalance is still running (max.poll.interval.ms = 10000 ms); exits 1 if it is still \
             waiting after 16 s"
        );
        assert_eq!(m.notice(&mut u, 12_000_000), None, "once per stretch");
        m.observe(&stats("up", "wait-sync", "UP", 10));
        assert!(told(&m), "the stretch's sample at 10 s logs it");
        m.observe(&stats("up", "steady", "UP", 11));
        m.observe(&stats("up", "wait-join", "UP", 12));
        assert!(!told(&m), "a new stretch is told again");
        // Time while no broker is up is not waited for the group.
        let m = short(&[]);
        m.observe(&stats("up", "wait-join", "DOWN", 0));
        m.observe(&stats("up", "wait-join", "DOWN", 30));
        assert!(!told(&m));
    }

    #[test]
    fn a_single_sample_of_a_rebalance_is_not_a_stretch() {
        // One unsteady sample, then none for a long time (a long statistics interval): no verdict without a
        // second unsteady sample.
        let m = short(&[]);
        m.observe(&stats("up", "wait-join", "UP", 0));
        assert!(m.overdue("g").is_none());
        m.observe(&stats("up", "steady", "UP", 120));
        assert!(m.overdue("g").is_none());
    }

    #[test]
    fn the_documents_own_time_is_the_clock() {
        // Two documents made 2 s apart and delivered late, together: 2 s, not the delivery delay.
        let m = short(&[]);
        m.observe(&stats("up", "wait-join", "UP", 100));
        m.observe(&stats("up", "wait-join", "UP", 102));
        assert!(m.overdue("g").is_none());
    }

    #[test]
    fn our_own_callbacks_do_not_count() {
        let m = short(&[]);
        m.observe(&stats("up", "wait-assign-call", "UP", 0));
        // The take-over in the assign callback took 20 s; it ends, then the member is steady.
        m.settled();
        m.observe(&stats("up", "wait-assign-call", "UP", 20));
        assert!(m.overdue("g").is_none());
    }

    #[test]
    fn an_outage_every_member_sees_is_waited_out_and_not_counted() {
        let m = short(&[]);
        m.observe(&stats("query-coord", "init", "DOWN", 0));
        m.observe(&stats("query-coord", "init", "CONNECT", 300));
        assert!(m.overdue("g").is_none(), "no broker up: Kafka is down");
        // Kafka is back; the member rejoins as usual: the outage is not part of its stretch.
        m.observe(&stats("wait-coord", "init", "UP", 305));
        m.observe(&stats("up", "wait-join", "UP", 315));
        assert!(m.overdue("g").is_none());
        // Still not in its group 17 s after Kafka came back.
        m.observe(&stats("up", "wait-join", "UP", 322));
        assert!(m.overdue("g").is_some());
    }

    #[test]
    fn refused_credentials_count_toward_the_bound_until_a_broker_answers() {
        let m = short(&[]);
        m.refused("SASL authentication error: Authentication failed due to invalid credentials");
        m.observe(&stats("query-coord", "init", "DOWN", 0));
        m.observe(&stats("query-coord", "init", "AUTH_HANDSHAKE", 10));
        assert!(m.overdue("g").is_none());
        m.observe(&stats("query-coord", "init", "DOWN", 17));
        let e = m
            .overdue("g")
            .expect("refused for longer than the bound")
            .to_string();
        assert!(
            e.contains("refused this client's credentials for 17.0 s"),
            "{e}"
        );
        // Steady while refused (the session not timed out yet): the silent coordinator is named as the refusal.
        let m = short(&[]);
        m.refused("SASL authentication error");
        m.observe(&stats_rx("up", "steady", "DOWN", 0, 7, 1));
        m.observe(&stats_rx("up", "steady", "DOWN", 17, 7, 1));
        let e = m
            .overdue("g")
            .expect("refused and silent for 17 s")
            .to_string();
        assert!(
            e.contains("refused this client's credentials for 17.0 s"),
            "{e}"
        );
        // A broker answers again (new credentials): the refusal is over, an outage is waited out again.
        let m = short(&[]);
        m.refused("SASL authentication error");
        m.observe(&stats("query-coord", "init", "DOWN", 0));
        m.observe(&stats("wait-coord", "init", "UP", 5));
        m.observe(&stats("query-coord", "init", "DOWN", 10));
        m.observe(&stats("query-coord", "init", "DOWN", 40));
        assert!(m.overdue("g").is_none(), "a plain outage again");
    }

    /// The state of librdkafka#3082 / #2944: the member believes it is in the group (steady, or KIP-848's `init`
    /// without partitions) but its coordinator answers nothing (`REQTMOUT GroupCoordinator`): bounded like an
    /// unsteady member, named with its assignment; a response starts the clock again, an outage is waited out.
    #[test]
    fn a_steady_member_whose_coordinator_answers_nothing_is_bounded() {
        for (protocol, join) in [("classic", "steady"), ("consumer", "init")] {
            let m = short(&[("group.protocol", protocol)]);
            m.observe(&stats_rx("up", join, "UP", 0, 7, 0));
            m.observe(&stats_rx("up", join, "UP", 16, 7, 0));
            assert!(m.overdue("g").is_none(), "{protocol}: at the bound");
            m.observe(&stats_rx("up", join, "UP", 17, 7, 0));
            let e = m.overdue("g").expect("silent for 17 s > 16 s").to_string();
            assert!(
                e.contains("consumer group g: the group coordinator has answered none")
                    && e.contains("for 17.0 s (0 partitions assigned)")
                    && e.contains("= 16.0 s"),
                "{e}"
            );
            // One response: the member is fine again.
            m.observe(&stats_rx("up", join, "UP", 18, 8, 0));
            assert!(m.overdue("g").is_none());
        }
        // No broker up: an outage every member sees, not counted.
        let m = short(&[]);
        m.observe(&stats_rx("up", "steady", "DOWN", 0, 7, 2));
        m.observe(&stats_rx("up", "steady", "DOWN", 300, 7, 2));
        m.observe(&stats_rx("up", "steady", "UP", 310, 7, 2));
        assert!(m.overdue("g").is_none());
        m.observe(&stats_rx("up", "steady", "UP", 327, 7, 2));
        let e = m
            .overdue("g")
            .expect("17 s after Kafka came back")
            .to_string();
        assert!(e.contains("(2 partitions assigned)"), "{e}");
        // Unsteady (a JoinGroup held back while the group waits for a peer): the unsteady rule alone, with its
        // own message.
        let m = short(&[]);
        m.observe(&stats_rx("up", "steady", "UP", 0, 7, 0));
        m.observe(&stats_rx("up", "wait-join", "UP", 10, 7, 0));
        m.observe(&stats_rx("up", "wait-join", "UP", 20, 7, 0));
        assert!(m.overdue("g").is_none(), "unsteady for 10 s only");
        m.observe(&stats_rx("up", "wait-join", "UP", 27, 7, 0));
        let e = m.overdue("g").expect("unsteady for 17 s").to_string();
        assert!(
            e.contains("has not been a steady group member for 17.0 s"),
            "{e}"
        );
    }

    #[test]
    fn an_idle_member_with_no_partitions_is_steady_under_either_protocol() {
        let classic = short(&[]);
        classic.observe(&stats("up", "steady", "UP", 0));
        classic.observe(&stats("up", "steady", "UP", 3600));
        assert!(classic.overdue("g").is_none());
        // KIP-848: a member given no partitions stays in `init`.
        let kip848 = short(&[("group.protocol", "consumer")]);
        kip848.observe(&stats("up", "init", "UP", 0));
        kip848.observe(&stats("up", "init", "UP", 3600));
        assert!(kip848.overdue("g").is_none());
        // Under the classic protocol `init` is a member that has not joined.
        classic.observe(&stats("up", "init", "UP", 0));
        classic.observe(&stats("up", "init", "UP", 3600));
        assert!(classic.overdue("g").is_some());
    }
}
