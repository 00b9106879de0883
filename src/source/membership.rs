//! The bounded wait for the consumer group: a member that stays out of a steady group membership for longer
//! than [`Membership::bound`] fails the run (exit 1) instead of idling.
//!
//! librdkafka retries a group coordinator that does not answer without a bound of its own, and a member can stay
//! stuck there after a broker restart — `REQTMOUT GroupCoordinator` every `socket.timeout.ms`, no assignment, for
//! as long as the process runs (confluentinc/librdkafka#3082, #2944; seen once in `scripts/chaos`' broker
//! scenario). Such a worker holds nothing and consumes nothing, yet looks alive. What the member's group handler
//! is doing is read from librdkafka's statistics (STATISTICS.md, `cgrp.state` and `cgrp.join_state`), emitted
//! every `statistics.interval.ms` ([`STATS_INTERVAL_MS`] unless the pipeline sets it; `0` turns statistics and
//! this bound off).
//!
//! A member is *steady* when `state` is `up` and `join_state` is `steady` — a member with an empty assignment
//! (more members than partitions) is steady too. Every other pair is a join, a rebalance or a coordinator search
//! in progress. A healthy rebalance ends within the group's rebalance timeout, which is the members'
//! `max.poll.interval.ms` (librdkafka sends it in JoinGroup and times the request out 3 s after it,
//! `rdkafka_request.c`), plus a session for a member that left without a word: hence the bound
//! `max.poll.interval.ms + session.timeout.ms` (defaults 300 s + 45 s). Members of one group should share
//! `max.poll.interval.ms`: a member waiting on a slower peer's longer rebalance timeout would give up first.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use serde::Deserialize;

use crate::error::Error;

/// `statistics.interval.ms` set on `run`'s consumer unless the pipeline sets it, in ms.
pub const STATS_INTERVAL_MS: u64 = 5_000;

/// The part of librdkafka's statistics JSON read here (STATISTICS.md, "cgrp"); the rest is skipped.
#[derive(Deserialize)]
struct Stats {
    cgrp: Option<Cgrp>,
}

#[derive(Deserialize)]
struct Cgrp {
    state: String,
    join_state: String,
}

/// Since when, and in which states, the member has not been steady.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unsteady {
    since: Instant,
    state: String,
    join_state: String,
}

/// The watchdog of one group member: fed by the statistics callback, asked by the poll loop.
#[derive(Debug)]
pub struct Membership {
    /// `max.poll.interval.ms + session.timeout.ms`; `None` when statistics are off.
    bound: Option<Duration>,
    unsteady: Mutex<Option<Unsteady>>,
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
        let bound = Duration::from_millis(
            ms("max.poll.interval.ms", 300_000) + ms("session.timeout.ms", 45_000),
        );
        Membership {
            bound: stats_on.then_some(bound),
            unsteady: Mutex::new(None),
        }
    }

    /// How long the member may stay out of a steady membership; `None` when statistics are off.
    pub fn bound(&self) -> Option<Duration> {
        self.bound
    }

    /// Reads one statistics document (`stats_raw`'s bytes) taken at `now`. A document without a `cgrp` object or
    /// that does not parse changes nothing.
    pub fn observe(&self, json: &[u8], now: Instant) {
        let Ok(Stats { cgrp: Some(g) }) = serde_json::from_slice::<Stats>(json) else {
            return;
        };
        let mut unsteady = self.unsteady.lock().unwrap_or_else(|e| e.into_inner());
        if g.state == "up" && g.join_state == "steady" {
            *unsteady = None;
            return;
        }
        match unsteady.as_mut() {
            Some(u) => {
                u.state = g.state;
                u.join_state = g.join_state;
            }
            None => {
                *unsteady = Some(Unsteady {
                    since: now,
                    state: g.state,
                    join_state: g.join_state,
                })
            }
        }
    }

    /// `Some` error once the member has not been steady for longer than the bound at `now`.
    pub fn overdue(&self, group: &str, now: Instant) -> Option<Error> {
        let bound = self.bound?;
        let unsteady = self.unsteady.lock().unwrap_or_else(|e| e.into_inner());
        let u = unsteady.as_ref()?;
        let waited = now.saturating_duration_since(u.since);
        (waited > bound).then(|| {
            Error::Other(format!(
                "consumer group {group}: this member has not been a steady group member for {} s (librdkafka \
                 group state `{}`, join state `{}`), longer than max.poll.interval.ms + session.timeout.ms = {} s: \
                 the group coordinator does not answer or a rebalance never completes (a librdkafka client can \
                 stay stuck after a broker restart, confluentinc/librdkafka#3082); exiting so that a restart \
                 joins the group afresh — what was applied is in the PostgreSQL checkpoints",
                waited.as_secs(),
                u.state,
                u.join_state,
                bound.as_secs()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(state: &str, join: &str) -> Vec<u8> {
        format!(
            r#"{{"name":"c#consumer-1","type":"consumer","brokers":{{"b":{{"state":"UP"}}}},
               "cgrp":{{"state":"{state}","stateage":1,"join_state":"{join}","rebalance_age":2,
               "rebalance_cnt":1,"rebalance_reason":"","assignment_size":0}}}}"#
        )
        .into_bytes()
    }

    fn config(pairs: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in pairs {
            c.set(*k, *v);
        }
        c
    }

    #[test]
    fn the_bound_is_the_rebalance_timeout_plus_a_session_and_off_without_statistics() {
        let on = [("statistics.interval.ms", "5000")];
        assert_eq!(
            Membership::new(&config(&on)).bound(),
            Some(Duration::from_secs(345))
        );
        let short = config(&[
            ("statistics.interval.ms", "1000"),
            ("max.poll.interval.ms", "10000"),
            ("session.timeout.ms", "6000"),
        ]);
        assert_eq!(
            Membership::new(&short).bound(),
            Some(Duration::from_secs(16))
        );
        assert_eq!(Membership::new(&config(&[])).bound(), None);
        let off = [("statistics.interval.ms", "0")];
        assert_eq!(Membership::new(&config(&off)).bound(), None);
    }

    #[test]
    fn only_an_unbroken_unsteady_stretch_longer_than_the_bound_fails() {
        let m = Membership::new(&config(&[
            ("statistics.interval.ms", "1000"),
            ("max.poll.interval.ms", "10000"),
            ("session.timeout.ms", "6000"),
        ]));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        m.observe(&stats("up", "wait-join"), at(0));
        m.observe(&stats("up", "wait-sync"), at(10));
        assert!(
            m.overdue("g", at(16)).is_none(),
            "at the bound, not past it"
        );
        // Steady again: the clock starts over.
        m.observe(&stats("up", "steady"), at(12));
        m.observe(&stats("query-coord", "init"), at(20));
        assert!(m.overdue("g", at(30)).is_none());
        m.observe(&stats("wait-coord", "init"), at(30));
        let e = m.overdue("g", at(37)).expect("17 s unsteady > 16 s");
        let text = e.to_string();
        assert!(
            text.contains("consumer group g")
                && text.contains("for 17 s")
                && text.contains("state `wait-coord`, join state `init`")
                && text.contains("= 16 s"),
            "{text}"
        );
        assert_eq!(e.exit_code(), crate::error::EXIT_FAILURE);
        // A document without a group or that does not parse changes nothing.
        m.observe(br#"{"name":"x","type":"consumer"}"#, at(38));
        m.observe(b"{not json", at(38));
        assert!(m.overdue("g", at(38)).is_some());
        m.observe(&stats("up", "steady"), at(39));
        assert!(m.overdue("g", at(100)).is_none());
    }

    #[test]
    fn an_idle_member_with_no_partitions_is_steady() {
        let m = Membership::new(&config(&[("statistics.interval.ms", "1000")]));
        let t0 = Instant::now();
        m.observe(&stats("up", "steady"), t0);
        assert!(m.overdue("g", t0 + Duration::from_secs(3600)).is_none());
    }
}
