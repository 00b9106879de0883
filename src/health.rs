//! Liveness and readiness of a `run` process, served as `/healthz` and `/readyz` beside `/metrics`
//! (served by `metrics_http`).
//!
//! The state is process-wide (like the metrics recorder): the engine loop, the batch retries, the settle of
//! a fenced batch and the group source report into it; `sink::probe::spawn_probe` checks the database in the background;
//! the HTTP handlers only read it — an HTTP request never waits on Kafka or PostgreSQL.
//!
//! Rules (thresholds are the constants below):
//! - **alive** (`/healthz` 200): the engine loop turned within [`ALIVE_WITHIN`] (it turns at least every 100 ms
//!   while idle), or it is waiting on the database with bounded retries (start-up, a batch being retried —
//!   each attempt bounded by the session timeouts; `/readyz` says so). Before the loop starts, alive for
//!   [`ALIVE_WITHIN`] after the process started.
//! - **ready** (`/readyz` 200) when all of:
//!   1. alive;
//!   2. the worker holds at least one partition (a group member without partitions — more workers than
//!      partitions, or before the first assignment — is not ready: it does no work); the line says since when
//!      (`no partitions assigned (no assignment since <UTC time>, N s ago)`) and, when the group membership is
//!      not steady or the group coordinator does not answer, what librdkafka's group handler reports
//!      ([`group_trouble`], from `source/membership.rs`);
//!   3. the last database probe succeeded and is at most [`PROBE_STALE`] old. The probe (every
//!      [`PROBE_EVERY`], bounded by [`PROBE_TIMEOUT`]) runs `UPDATE <checkpoints> SET fence = fence WHERE false`:
//!      it touches no row and takes no row lock, yet PostgreSQL checks the session can write — it fails on a
//!      read-only server or transaction (SQLSTATE 25006, a replica after failover), on missing privileges
//!      (42501), on a missing table, and when the server is unreachable;
//!   4. no partition is fenced: a batch found another owner's fence and the partition is paused until it is
//!      taken over again (the group coordinator confirmed it is still ours, or it is assigned again) or revoked;
//!   5. batches are not failing: no batch has been retried without a commit for longer than [`STUCK_AFTER`];
//!   6. Kafka does not refuse the client's credentials (a SASL authentication failure since the last time a
//!      broker answered: a rotated password);
//!   7. the schema registry is not being retried (`[source] schema-registry`: a schema fetch found it
//!      unavailable and has not succeeded since).
//!   8. the outbox relay (standalone or `run --relay`) can publish: its last round that locked rows got at
//!      least one acknowledged ([`relay_stalled`]; a broker outage fails every send).
//!
//!   Otherwise 503 with one plain-text line per failed rule, e.g. `not ready: no partitions assigned`.
//!
//! A standalone `outbox relay` ([`relay_only`]) holds no partitions: its relay loop is the heartbeat and rule 2
//! does not apply.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::model::Tp;

/// `/healthz` fails when the loop has not turned (nor retried the database) for this long.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(60);
/// Interval of the database probe.
pub const PROBE_EVERY: Duration = Duration::from_secs(5);
/// Bound of one probe (connect and statement).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// A successful probe older than this no longer counts.
pub const PROBE_STALE: Duration = Duration::from_secs(15);
/// Batches retried without a commit for this long make `/readyz` fail.
pub const STUCK_AFTER: Duration = Duration::from_secs(30);

/// The process-wide health state.
struct State {
    epoch: Instant,
    /// Milliseconds since `epoch` of the last loop turn or database retry (0: none yet).
    beat_ms: AtomicU64,
    /// Partitions held by the engine (updated every turn).
    held: AtomicUsize,
    fenced: Mutex<BTreeSet<Tp>>,
    /// When batches started failing (retried without a commit since), with the last error.
    failing: Mutex<Option<(Instant, String)>>,
    /// The last probe: when, and its error if it failed.
    probe: Mutex<Option<(Instant, Option<String>)>>,
    /// A standalone `outbox relay`: no partitions to hold.
    relay_only: AtomicBool,
    /// Kafka refuses the client's credentials: librdkafka's reason.
    kafka_refused: Mutex<Option<String>>,
    /// Since when the worker has held no partition (set by the first [`beat`] that reports none).
    unassigned: Mutex<Option<(Instant, chrono::DateTime<chrono::Utc>)>>,
    /// What the group membership watchdog reports while the member is not steady or its coordinator is silent.
    group: Mutex<Option<String>>,
    /// The outbox relay's last round locked rows and published none: since when, and why.
    relay_stalled: Mutex<Option<(Instant, String)>>,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| State {
        epoch: Instant::now(),
        beat_ms: AtomicU64::new(0),
        held: AtomicUsize::new(0),
        fenced: Mutex::new(BTreeSet::new()),
        failing: Mutex::new(None),
        probe: Mutex::new(None),
        relay_only: AtomicBool::new(false),
        kafka_refused: Mutex::new(None),
        unassigned: Mutex::new(None),
        group: Mutex::new(None),
        relay_stalled: Mutex::new(None),
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts the clock (call at process start, before the engine starts).
pub fn init() {
    let _ = state();
}

/// This process is a standalone `outbox relay`: readiness does not ask for partitions, and the relay loop's
/// turns ([`relay_turned`]) are its heartbeat.
pub fn relay_only() {
    state().relay_only.store(true, Ordering::Relaxed);
}

/// The relay loop turned: a heartbeat in a standalone `outbox relay` only (beside `run`, the engine loop alone
/// says whether the process is alive).
pub fn relay_turned() {
    if state().relay_only.load(Ordering::Relaxed) {
        beat(None);
    }
}

/// The outbox relay's round locked rows and got none acknowledged (`Some(why)`: the first failure), or
/// published something (`None`). Rule 7 of `/readyz`.
pub fn relay_stalled(why: Option<String>) {
    let mut r = lock(&state().relay_stalled);
    match why {
        Some(w) => {
            let since = r.as_ref().map_or_else(Instant::now, |(at, _)| *at);
            *r = Some((since, w));
        }
        None => *r = None,
    }
}

/// The engine loop turned (or a database retry is under way); `held`: partitions held, when known.
pub fn beat(held: Option<usize>) {
    let s = state();
    let ms = u64::try_from(s.epoch.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    s.beat_ms.store(ms, Ordering::Relaxed);
    if let Some(n) = held {
        s.held.store(n, Ordering::Relaxed);
        let mut since = lock(&s.unassigned);
        match n {
            0 => {
                since.get_or_insert_with(|| (Instant::now(), chrono::Utc::now()));
            }
            _ => *since = None,
        }
    }
}

/// The group membership watchdog's view (`Some`: the member is not a steady group member, or its group
/// coordinator has not answered for a while — librdkafka's group and join state in words), or `None`.
pub fn group_trouble(text: Option<String>) {
    *lock(&state().group) = text;
}

/// A batch of `tp` was fenced: the partition is paused until it is taken over again or given up.
pub fn fenced(tp: &Tp) {
    lock(&state().fenced).insert(tp.clone());
}

/// `tps` were taken over or given up: no longer fenced.
pub fn unfenced(tps: &[Tp]) {
    let mut f = lock(&state().fenced);
    for tp in tps {
        f.remove(tp);
    }
}

/// A batch attempt failed and is retried (`detail`: the error). Also a heartbeat.
pub fn retrying(detail: &str) {
    beat(None);
    let mut f = lock(&state().failing);
    match f.as_mut() {
        Some((_, last)) => *last = detail.to_string(),
        None => *f = Some((Instant::now(), detail.to_string())),
    }
}

/// A batch committed: batches are not failing.
pub fn committed() {
    *lock(&state().failing) = None;
}

/// Kafka refused the client's credentials (`Some`: librdkafka's reason, which names no secret), or a broker
/// answers again (`None`).
pub fn kafka_refused(reason: Option<&str>) {
    *lock(&state().kafka_refused) = reason.map(str::to_string);
}

/// The database probe (`sink::probe`) ran: `Some` its error when it failed.
pub fn probed(error: Option<String>) {
    *lock(&state().probe) = Some((Instant::now(), error));
}

/// What the rules look at, as ages (time since) rather than instants.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Since the last loop turn or database retry (since start before the first).
    pub since_beat: Duration,
    /// Partitions held.
    pub held: usize,
    /// The last probe: its age and its error, if it failed; `None`: not probed yet.
    pub probe: Option<(Duration, Option<String>)>,
    /// Fenced partitions.
    pub fenced: Vec<Tp>,
    /// Batches failing: for how long, and the last error.
    pub failing: Option<(Duration, String)>,
    /// A standalone `outbox relay` (no partitions to hold).
    pub relay_only: bool,
    /// Kafka refuses the client's credentials: the reason.
    pub kafka_refused: Option<String>,
    /// No partition held: for how long, and since when (UTC, RFC 3339).
    pub unassigned: Option<(Duration, String)>,
    /// The group membership watchdog's view ([`group_trouble`]).
    pub group: Option<String>,
    /// The schema registry is being retried: its last error.
    pub registry: Option<String>,
    /// The outbox relay publishes nothing: for how long, and the first failure of its last round.
    pub relay_stalled: Option<(Duration, String)>,
}

fn snapshot() -> Snapshot {
    let s = state();
    let beat = s.epoch + Duration::from_millis(s.beat_ms.load(Ordering::Relaxed));
    // A schema fetch being retried is a turn of the loop too: it waits on the registry, bounded.
    let registry = crate::decode::registry::retrying();
    let since_beat = registry
        .as_ref()
        .map_or(beat.elapsed(), |(at, _)| beat.elapsed().min(at.elapsed()));
    Snapshot {
        since_beat,
        held: s.held.load(Ordering::Relaxed),
        probe: lock(&s.probe)
            .as_ref()
            .map(|(at, e)| (at.elapsed(), e.clone())),
        fenced: lock(&s.fenced).iter().cloned().collect(),
        failing: lock(&s.failing)
            .as_ref()
            .map(|(at, e)| (at.elapsed(), e.clone())),
        relay_only: s.relay_only.load(Ordering::Relaxed),
        kafka_refused: lock(&s.kafka_refused).clone(),
        unassigned: lock(&s.unassigned).as_ref().map(|(at, utc)| {
            (
                at.elapsed(),
                utc.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            )
        }),
        group: lock(&s.group).clone(),
        registry: registry.map(|(_, e)| e),
        relay_stalled: lock(&s.relay_stalled)
            .as_ref()
            .map(|(at, e)| (at.elapsed(), e.clone())),
    }
}

/// `/healthz`: `Ok` with a short text, or `Err` with the reason.
///
/// # Errors
/// The reason the process is not alive.
pub fn alive() -> Result<String, String> {
    judge_alive(&snapshot())
}

/// `/readyz`: `Ok` with a short text, or `Err` with every failed rule (module docs), one a line.
///
/// # Errors
/// The reasons the worker is not ready.
pub fn ready() -> Result<String, String> {
    judge_ready(&snapshot())
}

/// The liveness rule over `s` (module docs).
///
/// # Errors
/// The reason the process is not alive.
pub fn judge_alive(s: &Snapshot) -> Result<String, String> {
    if s.since_beat <= ALIVE_WITHIN {
        Ok("ok".into())
    } else {
        Err(format!(
            "the engine loop has not turned for {} s",
            s.since_beat.as_secs()
        ))
    }
}

/// The readiness rules over `s` (module docs).
///
/// # Errors
/// The reasons the worker is not ready, one a line.
pub fn judge_ready(s: &Snapshot) -> Result<String, String> {
    let mut why = Vec::new();
    if let Err(e) = judge_alive(s) {
        why.push(e);
    }
    if s.held == 0 && !s.relay_only {
        let mut line = "no partitions assigned".to_string();
        if let Some((age, at)) = &s.unassigned {
            line.push_str(&format!(
                " (no assignment since {at}, {} s ago)",
                age.as_secs()
            ));
        }
        if let Some(g) = &s.group {
            line.push_str(&format!("; {g}"));
        }
        why.push(line);
    }
    match &s.probe {
        None => why.push("database not checked yet".to_string()),
        Some((_, Some(e))) => why.push(format!("database not writable: {e}")),
        Some((age, None)) if *age > PROBE_STALE => {
            why.push(format!("database last checked {} s ago", age.as_secs()))
        }
        Some(_) => {}
    }
    for (topic, partition) in &s.fenced {
        why.push(format!(
            "partition {topic}/{partition} fenced (another owner holds its checkpoint); paused until it is taken over again or given up"
        ));
    }
    if let Some((age, last)) = &s.failing {
        if *age > STUCK_AFTER {
            why.push(format!("batches failing for {} s: {last}", age.as_secs()));
        }
    }
    if let Some(reason) = &s.kafka_refused {
        why.push(format!(
            "Kafka refuses this client's credentials ({reason}): check the sasl.* keys of [kafka.properties]"
        ));
    }
    if let Some(e) = &s.registry {
        why.push(format!("schema registry unavailable, retrying: {e}"));
    }
    if let Some((age, last)) = &s.relay_stalled {
        why.push(format!(
            "outbox relay published nothing for {} s: {last}",
            age.as_secs()
        ));
    }
    if why.is_empty() && s.relay_only {
        Ok("ready: outbox relay".into())
    } else if why.is_empty() {
        Ok(format!("ready: {} partitions", s.held))
    } else {
        Err(why.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_state() -> Snapshot {
        Snapshot {
            since_beat: Duration::from_millis(50),
            held: 2,
            probe: Some((Duration::from_secs(1), None)),
            fenced: Vec::new(),
            failing: None,
            relay_only: false,
            kafka_refused: None,
            unassigned: None,
            group: None,
            registry: None,
            relay_stalled: None,
        }
    }

    /// A worker without partitions says since when, and what the group handler reports when it is in trouble.
    #[test]
    fn no_assignment_says_since_when_and_why() {
        let idle = Snapshot {
            held: 0,
            unassigned: Some((Duration::from_secs(42), "2026-12-02T06:45:10Z".into())),
            ..ready_state()
        };
        assert_eq!(
            judge_ready(&idle),
            Err(
                "no partitions assigned (no assignment since 2026-12-02T06:45:10Z, 42 s ago)"
                    .into()
            )
        );
        let stuck = Snapshot {
            group: Some("the group coordinator has not answered for 61 s".into()),
            ..idle
        };
        assert_eq!(
            judge_ready(&stuck),
            Err("no partitions assigned (no assignment since 2026-12-02T06:45:10Z, 42 s ago); the group \
                 coordinator has not answered for 61 s"
                .into())
        );
    }

    /// [`beat`] starts the clock at the first report of no partition and stops it at the next held one.
    #[test]
    fn the_unassigned_clock_starts_at_the_first_empty_beat() {
        beat(Some(0));
        let first = snapshot().unassigned.expect("set").1;
        beat(Some(0));
        assert_eq!(snapshot().unassigned.expect("kept").1, first);
        beat(Some(3));
        assert!(snapshot().unassigned.is_none());
    }

    #[test]
    fn registry_retries_are_not_ready() {
        let retrying = Snapshot {
            registry: Some("connection refused".into()),
            ..ready_state()
        };
        let why = judge_ready(&retrying).unwrap_err();
        assert!(
            why.contains("schema registry unavailable, retrying: connection refused"),
            "{why}"
        );
    }

    #[test]
    fn a_relay_that_cannot_publish_is_not_ready() {
        let stalled = Snapshot {
            relay_only: true,
            held: 0,
            relay_stalled: Some((
                Duration::from_secs(12),
                "row 7: broker transport failure".into(),
            )),
            ..ready_state()
        };
        let why = judge_ready(&stalled).unwrap_err();
        assert!(
            why.contains("outbox relay published nothing for 12 s: row 7"),
            "{why}"
        );
    }

    #[test]
    fn refused_credentials_are_named() {
        let refused = Snapshot {
            kafka_refused: Some("SASL authentication error: Authentication failed".into()),
            ..ready_state()
        };
        let why = judge_ready(&refused).unwrap_err();
        assert!(
            why.contains("Kafka refuses this client's credentials (SASL authentication error"),
            "{why}"
        );
    }

    /// A standalone `outbox relay` holds no partitions and is ready; its other rules still apply.
    #[test]
    fn a_relay_alone_needs_no_partitions() {
        let relay = Snapshot {
            held: 0,
            relay_only: true,
            ..ready_state()
        };
        assert_eq!(judge_ready(&relay), Ok("ready: outbox relay".into()));
        let unprobed = Snapshot {
            probe: None,
            ..relay.clone()
        };
        assert_eq!(
            judge_ready(&unprobed),
            Err("database not checked yet".into())
        );
        let worker = Snapshot {
            relay_only: false,
            ..relay
        };
        assert_eq!(judge_ready(&worker), Err("no partitions assigned".into()));
    }

    #[test]
    fn ready_when_every_rule_holds() {
        assert_eq!(
            judge_ready(&ready_state()),
            Ok("ready: 2 partitions".into())
        );
        assert_eq!(judge_alive(&ready_state()), Ok("ok".into()));
    }

    #[test]
    fn each_rule_fails_alone_with_its_reason() {
        type Change = fn(&mut Snapshot);
        let cases: Vec<(Change, &str)> = vec![
            (|s| s.held = 0, "no partitions assigned"),
            (|s| s.probe = None, "database not checked yet"),
            (
                |s| s.probe = Some((Duration::ZERO, Some("read-only (SQLSTATE 25006)".into()))),
                "database not writable: read-only (SQLSTATE 25006)",
            ),
            (
                |s| s.probe = Some((PROBE_STALE + Duration::from_secs(1), None)),
                "database last checked 16 s ago",
            ),
            (
                |s| s.fenced = vec![("t".into(), 3)],
                "partition t/3 fenced (another owner holds its checkpoint); paused until it is taken over again or given up",
            ),
            (
                |s| s.failing = Some((STUCK_AFTER + Duration::from_secs(1), "boom".into())),
                "batches failing for 31 s: boom",
            ),
            (
                |s| s.since_beat = ALIVE_WITHIN + Duration::from_secs(1),
                "the engine loop has not turned for 61 s",
            ),
        ];
        for (change, reason) in cases {
            let mut s = ready_state();
            change(&mut s);
            assert_eq!(judge_ready(&s), Err(reason.to_string()));
        }
    }

    #[test]
    fn thresholds_are_exclusive_and_failing_briefly_is_ready() {
        let mut s = ready_state();
        s.failing = Some((STUCK_AFTER, "retrying".into()));
        s.since_beat = ALIVE_WITHIN;
        s.probe = Some((PROBE_STALE, None));
        assert!(judge_ready(&s).is_ok());
        s.held = 0;
        s.since_beat = ALIVE_WITHIN + Duration::from_millis(1);
        assert_eq!(
            judge_ready(&s),
            Err("the engine loop has not turned for 60 s\nno partitions assigned".into())
        );
        assert!(judge_alive(&s).is_err());
    }
}
