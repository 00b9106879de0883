#!/usr/bin/env python3
"""The fault harness of issue 10: several `replaysafe run` workers under faults, checked against the truth.

Run through `scripts/chaos`, which starts a PRIVATE PostgreSQL cluster (initdb + pg_ctl; CHAOS_PGBIN,
CHAOS_PGDATA, CHAOS_PGLOG, CHAOS_PG_AS) and a PRIVATE Kafka broker (scripts/kafka-start with KAFKA_STATE_DIR =
CHAOS_KAFKA_STATE_DIR), builds the release binary and the Python venv, and stops both services at the end: the
postgres and broker scenarios restart those, never the shared ones.

Each scenario gets two topics (12 partitions each), two schemas and its consumer groups; two producer threads
write while the faults run:
  - JSON events: purchases (counted into daily_counts, summed into daily_totals, one outbox row each), customer
    row changes (CustomerUpdated / CustomerClosed, version-guarded `row` projection customer_state with
    tombstones), ~5% redeliveries of an earlier record (same key and bytes, a later offset), ~0.2% poison
    records. Keyed by event id, so one customer's events — and one aggregate row's updates — come from every
    partition (entities spread over partitions).
  - Debezium-shaped row changes of public.accounts (schemaless JSON converter envelope: op r/c/u/d, before/after,
    source {lsn, sequence, txId, …}, a Kafka tombstone after each delete; ~5% redeliveries, ~0.2% poison) into
    a second pipeline (`[source] format = "debezium"`, row projection `accounts`, tombstones table) run by one
    more worker per scenario, which takes the same faults as the others.

Scenarios (time shares of --minutes by WEIGHTS): kills (SIGKILL + restart >= 30 times; a backlog so that
>= 300k events at 5 minutes), zombie (SIGSTOP with a transaction open, 15 s > session.timeout.ms 10 s, SIGCONT;
an audit trigger records any checkpoint that moved backwards), postgres (24 pg_terminate_backend, every other one
of a backend executing COMMIT — a deferred trigger makes COMMIT take 20 ms so it can be caught: an uncertain
commit —, pg_ctl restart twice, 10 s default_transaction_read_only), broker (stopped 5 s, restarted on its
ports), broker-restarts (the broker restarted three times in a row, 2 s down each; then every worker must either
recover — a member holding partitions of its stable group — or exit 1 naming its consumer group, within the
membership bound of 70 s + 20 s: issue 37 item 4, librdkafka#3082), storm (workers joining/leaving every 2–5 s), two-groups (the replay under a second group id into the
same tables), c36 (8 customers on one day, batches of 20–50, 4 connections per worker: batches of different
partitions update the same aggregate rows at once; the 40P01 count is reported), lost-commit (a partition's
newest batch and its checkpoint advance rolled back behind the running worker).

Workers run with session.timeout.ms 10 s and max.poll.interval.ms 60 s: a worker that is not a steady group
member for 70 s (a group coordinator stuck after the broker restart) exits 1 and is restarted, as an orchestrator
would. After the faults the producers stop, every worker is (re)started and, while they keep running, the tables
must converge to the truth computed from what the producers wrote: lost = sum of missing counts, doubled = sum
of surplus counts (0 both), sums exact, outbox rows = purchases, rows/tombstones = each customer's and each
account's newest change, dead letters = exactly the poison records, ledger rows = unique events, Kafka committed
offsets = checkpoints (every group) within 10 s. Then SIGTERM: every running worker must exit 0 within
--shutdown-timeout with an accounting line; every accounting line of every process adds up (consumed = landed +
duplicate + stale + filtered + quarantined), and so does their sum. SQLSTATEs seen in worker logs are counted.

Reproducible from --seed: the events, the schedule of faults and which worker each hits (timing on a loaded
machine still varies). Writes chaos/results/<run>.json: per scenario `events`, `faults` (by kind),
`duration_s`, `lost`, `doubled`, `accounting_exact`, and the details behind them. Exit 0 when every scenario
has lost = doubled = 0 and accounting_exact, 1 otherwise (also when a scenario's harness step failed).
"""
import argparse
import datetime as dt
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from decimal import Decimal

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("CHAOS_BIN") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "replaysafe"
)
# The membership bound of the workers (src/source/membership.rs): max.poll.interval.ms + session.timeout.ms of
# PIPELINE, in s.
MEMBERSHIP_BOUND_S = 70
# The messages of a worker that gave up on its consumer group (the membership bound).
GAVE_UP = ("has not been a steady group member", "the group coordinator has answered none")
PARTITIONS = 12
CUSTOMERS = 400
DAYS = [dt.date(2026, 11, 20) + dt.timedelta(days=i) for i in range(6)]
HARNESS_APP = "chaos-harness"
# The ledger names its (topic, partition, group) by `_source_id` (docs/reference.md "Tables"): the ids of one partition.
SOURCES = "SELECT id FROM {s}.replaysafe_sources WHERE topic = %s AND partition = %s"


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- truth + producer


class Truth:
    """What the producer wrote: unique events by id, poison coordinates, row changes per customer."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events = {}  # event_id -> dict (first delivery)
        self.sent = 0  # records acknowledged by the broker (incl. redeliveries and poison)
        self.poison = set()  # (partition, offset)
        self.failed = 0

    def counts(self):
        c, s = {}, {}
        for e in self.events.values():
            if e["event_type"] != "Purchase":
                continue
            k = (e["occurred_at"][:10], e["customer_id"])
            c[k] = c.get(k, 0) + 1
            s[k] = s.get(k, Decimal(0)) + Decimal(e["amount"])
        return c, s

    def rows(self):
        newest = {}
        for e in self.events.values():
            if not e["event_type"].startswith("Customer"):
                continue
            cur = newest.get(e["customer_id"])
            if cur is None or e["version"] > cur["version"]:
                newest[e["customer_id"]] = e
        return newest


class EventProducer(threading.Thread):
    """Writes events at `rate` per second until stopped; every acknowledged record goes into `truth`."""

    def __init__(self, brokers, topic, seed, rate, truth, customers=CUSTOMERS, days=DAYS):
        super().__init__(daemon=True)
        self.p = Producer({"bootstrap.servers": brokers, "linger.ms": 20, "acks": "all",
                           "message.timeout.ms": 300000, "enable.idempotence": True})
        self.topic, self.rng, self.rate, self.truth = topic, random.Random(seed), rate, truth
        self.customers, self.days = customers, days
        self.stop = threading.Event()
        self.versions = {}
        self.recent = []

    def backlog(self, n):
        """Writes n records as fast as the broker takes them (before the workers start), then flushes."""
        for _ in range(n):
            while True:
                try:
                    self.send_one()
                    break
                except BufferError:
                    self.p.poll(0.05)
            self.p.poll(0)
        self.p.flush(300)

    def _event(self):
        r = self.rng
        cust = f"c{r.randrange(self.customers):04d}"
        day = r.choice(self.days)
        ts = dt.datetime.combine(day, dt.time(r.randrange(24), r.randrange(60), r.randrange(60)))
        e = {"event_id": str(uuid.UUID(int=r.getrandbits(128), version=4)), "customer_id": cust,
             "occurred_at": ts.isoformat() + "Z", "amount": f"{r.randrange(-500, 10000) / 100:.2f}"}
        if r.random() < 0.1:
            v = self.versions.get(cust, 0) + 1
            self.versions[cust] = v
            e.update(event_type="CustomerClosed" if r.random() < 0.15 else "CustomerUpdated", version=v)
        else:
            e.update(event_type="Purchase", version=0)
        return e

    def _deliver(self, payload):
        def cb(err, msg):
            with self.truth.lock:
                if err is not None:
                    self.truth.failed += 1
                    return
                self.truth.sent += 1
                if payload is None:
                    self.truth.poison.add((msg.partition(), msg.offset()))
                else:
                    self.truth.events.setdefault(payload["event_id"], payload)
        return cb

    def send_one(self):
        r = self.rng
        x = r.random()
        if x < 0.002:
            key = str(uuid.UUID(int=r.getrandbits(128)))
            self.p.produce(self.topic, key=key, value=b'{"event_id": "trunc', on_delivery=self._deliver(None))
            return
        if x < 0.052 and self.recent:
            e = r.choice(self.recent)  # a redelivery: same key, same bytes, later offset
        else:
            e = self._event()
            self.recent.append(e)
            if len(self.recent) > 5000:
                self.recent.pop(0)
        self.p.produce(self.topic, key=e["event_id"], value=json.dumps(e).encode(), on_delivery=self._deliver(e))

    def run(self):
        tick = 0.05
        while not self.stop.is_set():
            t0 = time.monotonic()
            for _ in range(max(1, int(self.rate * tick))):
                while True:
                    try:
                        self.send_one()
                        break
                    except BufferError:
                        self.p.poll(0.05)
            self.p.poll(0)
            time.sleep(max(0.0, tick - (time.monotonic() - t0)))
        self.p.flush(300)


class CdcTruth:
    """What the Debezium-shaped producer wrote: each change by (id, lsn), poison coordinates."""

    def __init__(self):
        self.lock = threading.Lock()
        self.changes = {}  # (id, lsn) -> (op, after)
        self.sent = 0
        self.poison = set()
        self.failed = 0

    def rows(self):
        """id -> the newest change's `after` (None when the newest change is a delete)."""
        newest = {}
        for (i, lsn), (op, after) in self.changes.items():
            if i not in newest or lsn > newest[i][0]:
                newest[i] = (lsn, after)
        return {i: after for i, (lsn, after) in newest.items()}


class CdcProducer(EventProducer):
    """Debezium-shaped row changes of `public.accounts` (the schemaless JSON converter's envelope, key
    {"id": N}, so one row's changes stay on one partition in source order): an initial snapshot (op r, one
    snapshot LSN) of the first ids, then creates, updates and deletes (before = key only, default replica
    identity, followed by a Kafka tombstone), ~5% redeliveries and ~0.2% poison records."""

    ACCOUNTS = 300

    def __init__(self, brokers, topic, seed, rate, truth):
        super().__init__(brokers, topic, seed, rate, truth)
        self.lsn, self.tx, self.live = 1_000_000, 5000, {}

    def _envelope(self, op, i, after, snapshot="false"):
        self.lsn += 8 + self.rng.randrange(200)
        self.tx += 1
        seq = f'[null,"{self.lsn}"]' if op == "r" else f'["{self.lsn - 36}","{self.lsn}"]'
        before = {"id": i, "owner": None, "balance": None} if op == "d" else None
        return {"before": before, "after": after, "op": op, "ts_ms": 1796000000000 + self.tx,
                "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "chaos",
                           "ts_ms": 1796000000000 + self.tx, "snapshot": snapshot, "db": "chaos",
                           "sequence": seq, "schema": "public", "table": "accounts", "txId": self.tx,
                           "lsn": self.lsn, "xmin": None}, "transaction": None}

    def _cdc_deliver(self, change):
        def cb(err, msg):
            with self.truth.lock:
                if err is not None:
                    self.truth.failed += 1
                    return
                self.truth.sent += 1
                if change == "poison":
                    self.truth.poison.add((msg.partition(), msg.offset()))
                elif change is not None:
                    self.truth.changes.setdefault(change[0], change[1])
        return cb

    def _produce(self, key, value, change):
        self.p.produce(self.topic, key=key, value=value, on_delivery=self._cdc_deliver(change))

    def snapshot(self, n):
        for i in range(n):
            after = {"id": i, "owner": f"o{self.rng.randrange(1000)}", "balance": self.rng.randrange(10**6)}
            env = self._envelope("r", i, after, snapshot="last" if i == n - 1 else "true")
            self.live[i] = True
            self._send(i, env)
        self.lsn += 1000

    def _send(self, i, env):
        key, value = json.dumps({"id": i}).encode(), json.dumps(env).encode()
        self.recent.append((key, value))
        if len(self.recent) > 2000:
            self.recent.pop(0)
        self._produce(key, value, ((i, env["source"]["lsn"]), (env["op"], env["after"])))

    def send_one(self):
        r = self.rng
        x = r.random()
        if x < 0.002:
            self._produce(json.dumps({"id": r.randrange(10**6)}).encode(), b'{"op": "c", "af', "poison")
            return
        if x < 0.052 and self.recent:
            key, value = r.choice(self.recent)  # a redelivery (connector restart): same bytes, later offset
            self._produce(key, value, None)
            return
        i = r.randrange(self.ACCOUNTS)
        if self.live.get(i) and r.random() < 0.1:
            self.live[i] = False
            self._send(i, self._envelope("d", i, None))
            self._produce(json.dumps({"id": i}).encode(), None, None)  # Debezium's tombstone after a delete
            return
        op = "u" if self.live.get(i) else "c"
        self.live[i] = True
        self._send(i, self._envelope(op, i, {"id": i, "owner": f"o{r.randrange(1000)}",
                                             "balance": r.randrange(-10**6, 10**7)}))


# ---------------------------------------------------------------- workers


PIPELINE = """
[kafka]
group-id = "{group}"
topics = ["{topic}"]
start = "earliest"

[kafka.properties]
"session.timeout.ms" = "10000"
"heartbeat.interval.ms" = "1000"
"max.poll.interval.ms" = "60000"

[postgres]
schema = "{schema}"
connections = {connections}

[batch]
max-records = {max_records}
linger-ms = 100

[fields]
event_id = {{ path = "/event_id", type = "uuid" }}
event_type = {{ path = "/event_type", type = "text" }}
day = {{ path = "/occurred_at", type = "date" }}
customer_id = {{ path = "/customer_id", type = "text" }}
amount = {{ path = "/amount", type = "numeric" }}
version = {{ path = "/version", type = "bigint" }}

[identity]
key = ["event_id"]
partition-by = "day"

[[projection]]
kind = "row"
table = "customer_state"
filter = "event_type.startsWith('Customer')"
key = ["customer_id"]
version = "version"
columns = ["customer_id", "amount", "version"]
delete-if = "event_type == 'CustomerClosed'"

[[projection]]
kind = "counter"
table = "daily_counts"
filter = "event_type == 'Purchase'"
group-by = ["day", "customer_id"]
column = "n"

[[projection]]
kind = "sum"
table = "daily_totals"
filter = "event_type == 'Purchase'"
group-by = ["day", "customer_id"]
add = {{ total = "amount" }}

[[projection]]
kind = "outbox"
table = "outbox"
filter = "event_type == 'Purchase'"
payload = ["event_id", "customer_id", "amount"]
"""

CDC_PIPELINE = """
[kafka]
group-id = "{group}"
topics = ["{topic}"]
start = "earliest"

[kafka.properties]
"session.timeout.ms" = "10000"
"heartbeat.interval.ms" = "1000"
"max.poll.interval.ms" = "60000"

[source]
format = "debezium"

[postgres]
schema = "{schema}"
connections = 2

[batch]
max-records = {max_records}
linger-ms = 100

[[projection]]
kind = "row"
table = "accounts"
source-table = "public.accounts"
key = ["id"]
columns = {{ id = "bigint", owner = "text", balance = "bigint" }}
tombstones = "table"
"""


class Worker:
    """One `replaysafe run` process; its stderr goes to a log file per start."""

    def __init__(self, name, config, database_url, logdir):
        self.name, self.config, self.logdir = name, config, logdir
        sep = "&" if "?" in database_url else "?"
        self.url = f"{database_url}{sep}application_name=chaos-{name}"
        self.proc, self.starts, self.logs, self.stopped = None, 0, [], False

    def start(self):
        self.starts += 1
        path = os.path.join(self.logdir, f"{self.name}.{self.starts}.log")
        self.logs.append(path)
        env = dict(os.environ, DATABASE_URL=self.url, REPLAYSAFE_LOG="info,tokio_postgres=warn")
        self.proc = subprocess.Popen([BIN, "run", "--config", self.config, "--summary-interval", "5"],
                                     stdout=subprocess.DEVNULL, stderr=open(path, "w"), env=env)
        self.stopped = False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.proc.pid, sig)
            return True
        return False


def wait_table(url, table, timeout=120):
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True, application_name=HARNESS_APP) as c:
        while time.monotonic() < deadline:
            if c.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:
                return
            time.sleep(0.5)
    raise RuntimeError(f"chaos: {table} was not created within {timeout} s (see the worker logs)")


def wait_leaders(admin, topics, timeout=60):
    """Waits (bounded) until every partition of the new topics has a leader: a worker started earlier can get
    NotLeaderForPartition from its take-over's metadata request and exit 1 (a deployment's topics exist
    before its workers; see the report of issue 10)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=10).topics
        if all(t in md and md[t].error is None and len(md[t].partitions) == PARTITIONS
               and all(p.leader >= 0 and p.error is None for p in md[t].partitions.values()) for t in topics):
            return
        time.sleep(0.5)
    raise RuntimeError(f"chaos: topics {topics} have no leader for every partition after {timeout} s")


AUDIT = """
CREATE TABLE IF NOT EXISTS {s}.chaos_audit (at timestamptz DEFAULT now(), consumer_group text, topic text,
  partition int, old_next bigint, new_next bigint, old_fence bigint, new_fence bigint, app text);
CREATE OR REPLACE FUNCTION {s}.chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.generation = OLD.generation AND NEW.next_offset < OLD.next_offset
     AND current_setting('application_name') <> '{app}' THEN
    INSERT INTO {s}.chaos_audit (consumer_group, topic, partition, old_next, new_next, old_fence, new_fence, app)
    VALUES (NEW.consumer_group, NEW.topic, NEW.partition, OLD.next_offset, NEW.next_offset, OLD.fence, NEW.fence,
            current_setting('application_name'));
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS chaos_audit ON {s}.replaysafe_checkpoints;
CREATE TRIGGER chaos_audit BEFORE UPDATE ON {s}.replaysafe_checkpoints FOR EACH ROW EXECUTE FUNCTION {s}.chaos_audit();
"""


# ---------------------------------------------------------------- faults


class Faults:
    """The fault kinds; each call injects one and counts it under its kind."""

    def __init__(self, ctx):
        self.ctx, self.count = ctx, {}

    def note(self, kind, n=1):
        self.count[kind] = self.count.get(kind, 0) + n

    def kill_restart(self):
        w = self.ctx.rng.choice(self.ctx.workers)
        if w.signal(signal.SIGKILL):
            w.proc.wait()
            self.note("sigkill")
        w.start()

    def terminate_backend(self, after_commit=False):
        """pg_terminate_backend of one worker connection; with after_commit, one whose statement is COMMIT (the
        client sent COMMIT and may never learn whether it happened: an uncertain commit), polled for up to 5 s."""
        q = ("SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s"
             + (" AND state = 'active' AND query ILIKE 'commit%%'" if after_commit else ""))
        with psycopg.connect(self.ctx.url, autocommit=True, application_name=HARNESS_APP) as c:
            deadline = time.monotonic() + (5 if after_commit else 2)
            while time.monotonic() < deadline:
                pids = [r[0] for r in c.execute(q, (f"chaos-{self.ctx.name}-%",)).fetchall()]
                if pids:
                    c.execute("SELECT pg_terminate_backend(%s)", (self.ctx.rng.choice(pids),))
                    self.note("pg_terminate_after_commit" if after_commit else "pg_terminate_backend")
                    return True
                time.sleep(0.0005)
        return False

    def zombie(self, freeze_s):
        """SIGSTOP a worker while one of its transactions is open, past the session timeout, then SIGCONT."""
        q = ("SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s "
             "AND xact_start IS NOT NULL AND state IN ('active', 'idle in transaction')")
        by_app = {f"chaos-{w.name}": w for w in self.ctx.workers}
        with psycopg.connect(self.ctx.url, autocommit=True, application_name=HARNESS_APP) as c:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                self.ctx.revive()
                apps = [r[0] for r in c.execute(q, (f"chaos-{self.ctx.name}-%",)).fetchall()]
                ws = [by_app[a] for a in apps if a in by_app and by_app[a].alive()]
                json_ws = [w for w in ws if "-w" in w.name]  # a JSON worker: its group has others to take over
                if json_ws or (ws and time.monotonic() > deadline - 10):
                    w = (json_ws or ws)[0]
                    w.signal(signal.SIGSTOP)
                    log(f"zombie: {w.name} frozen for {freeze_s} s with a transaction open")
                    time.sleep(freeze_s)
                    w.signal(signal.SIGCONT)
                    self.note("zombie_sigstop")
                    return
                time.sleep(0.002)

    def lost_commit(self):
        """What a failover to an asynchronous replica does: the newest batch of one partition (ledger claims,
        their effects on every projection, dead letters) and its checkpoint advance vanish behind the running
        worker's back. The harness knows each event's effects from the truth."""
        ctx, s = self.ctx, self.ctx.schema
        part = ctx.rng.randrange(PARTITIONS)
        with psycopg.connect(ctx.url, application_name=HARNESS_APP) as c:
            row = c.execute(f"SELECT next_offset FROM {s}.replaysafe_checkpoints WHERE consumer_group = %s "
                            f"AND topic = %s AND partition = %s FOR UPDATE", (ctx.group, ctx.topic, part)).fetchone()
            if not row or row[0] is None or row[0] < 2:
                return
            # The newest ledger rows of the partition, newest first, while they are purchases (a row
            # projection's state cannot be rolled back from the truth alone): those go back.
            newest = c.execute(f"SELECT \"offset\", event_id::text FROM {s}.replaysafe_ledger WHERE _source_id IN "
                               f"({SOURCES.format(s=s)}) AND \"offset\" >= %s ORDER BY \"offset\" DESC",
                               (ctx.topic, part, row[0] - 40)).fetchall()
            back, evs = row[0], []
            with ctx.truth.lock:
                for off, eid in newest:
                    e = ctx.truth.events.get(eid)
                    if e is None or e["event_type"] != "Purchase":
                        break
                    back, evs = off, evs + [e]
            if not evs:
                c.rollback()
                return
            c.execute(f"DELETE FROM {s}.replaysafe_ledger WHERE _source_id IN ({SOURCES.format(s=s)}) "
                      f"AND \"offset\" >= %s",
                      (ctx.topic, part, back))
            for e in evs:
                k = (e["occurred_at"][:10], e["customer_id"])
                c.execute(f"UPDATE {s}.daily_counts SET n = n - 1 WHERE day = %s AND customer_id = %s", k)
                c.execute(f"UPDATE {s}.daily_totals SET total = total - %s WHERE day = %s AND customer_id = %s",
                          (Decimal(e["amount"]),) + k)
                c.execute(f"DELETE FROM {s}.outbox WHERE payload->>'event_id' = %s", (e["event_id"],))
            c.execute(f"DELETE FROM {s}.replaysafe_dead_letters WHERE topic = %s AND partition = %s "
                      f"AND \"offset\" >= %s", (ctx.topic, part, back))
            c.execute(f"UPDATE {s}.replaysafe_checkpoints SET next_offset = %s WHERE consumer_group = %s "
                      f"AND topic = %s AND partition = %s", (back, ctx.group, ctx.topic, part))
            c.commit()
            self.note("lost_commit")

    def read_only(self, seconds):
        with psycopg.connect(self.ctx.url, autocommit=True, application_name=HARNESS_APP) as c:
            c.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            c.execute("SELECT pg_reload_conf()")
            try:
                time.sleep(seconds)
            finally:
                c.execute("ALTER SYSTEM RESET default_transaction_read_only")
                c.execute("SELECT pg_reload_conf()")
        self.note("pg_read_only")

    def pg_restart(self):
        """`pg_ctl restart -m fast` of the harness's private cluster (scripts/chaos started it): every
        connection is cut, the server is down for a few seconds."""
        run_as = os.environ.get("CHAOS_PG_AS", "").split()
        subprocess.run(run_as + [os.path.join(os.environ["CHAOS_PGBIN"], "pg_ctl"), "-D", os.environ["CHAOS_PGDATA"],
                                 "-l", os.environ["CHAOS_PGLOG"], "-m", "fast", "-w", "-t", "60", "restart"],
                       check=True, stdout=subprocess.DEVNULL)
        self.note("pg_restart")

    def broker_restart(self, down_s):
        """Stops the harness's private broker (KAFKA_STATE_DIR), waits down_s, starts it again on the same
        ports."""
        env = dict(os.environ, KAFKA_STATE_DIR=os.environ["CHAOS_KAFKA_STATE_DIR"])
        env.pop("KAFKA_BROKERS", None)
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "kafka-stop")], check=True,
                       stderr=subprocess.DEVNULL, env=env)
        time.sleep(down_s)
        out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "kafka-start")], check=True,
                             capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
        if out.split("=", 1)[1] != self.ctx.brokers:
            raise RuntimeError(f"chaos: the broker came back on {out}, not {self.ctx.brokers}")
        self.note("broker_restart")


# ---------------------------------------------------------------- one scenario


COMMIT_DELAY = """
CREATE OR REPLACE FUNCTION {s}.chaos_commit_delay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.02); RETURN NULL; END $$;
DROP TRIGGER IF EXISTS chaos_commit_delay ON {s}.replaysafe_checkpoints;
CREATE CONSTRAINT TRIGGER chaos_commit_delay AFTER INSERT OR UPDATE ON {s}.replaysafe_checkpoints
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.chaos_commit_delay();
"""


class Scenario:
    """One scenario's topics (JSON events + Debezium-shaped changes), schemas, groups, producers and workers."""

    def __init__(self, name, args, run_id, rng):
        self.name, self.args, self.rng = name, args, rng
        self.url, self.brokers = os.environ["DATABASE_URL"], os.environ["KAFKA_BROKERS"]
        self.topic = f"chaos.{run_id}.{name}"
        self.schema = f"chaos_{run_id}_{name.replace('-', '_')}"
        self.group = f"chaos-{run_id}-{name}"
        self.cdc_topic, self.cdc_schema, self.cdc_group = self.topic + ".cdc", self.schema + "_cdc", self.group + "-cdc"
        self.logdir = os.path.join(args.workdir, name)
        os.makedirs(self.logdir, exist_ok=True)
        self.truth, self.cdc_truth = Truth(), CdcTruth()
        self.workers, self.producer, self.cdc_producer = [], None, None
        self.groups = [self.group]
        self.crashed = []  # worker processes that had exited by themselves when the faults ended
        self.checks_failed = []  # a scenario's own checks that failed (they fail the scenario)

    def config(self, group, max_records, connections=2):
        path = os.path.join(self.logdir, f"{group}.{max_records}.toml")
        with open(path, "w") as f:
            f.write(PIPELINE.format(group=group, topic=self.topic, schema=self.schema, max_records=max_records,
                                    connections=connections))
        return path

    def add_workers(self, n, group=None, max_records=500, connections=2):
        cfg = self.config(group or self.group, max_records, connections)
        if (group or self.group) not in self.groups:
            self.groups.append(group)
        return [self._start(cfg) for _ in range(n)]

    def add_cdc_worker(self, max_records=200):
        path = os.path.join(self.logdir, "cdc.toml")
        with open(path, "w") as f:
            f.write(CDC_PIPELINE.format(group=self.cdc_group, topic=self.cdc_topic, schema=self.cdc_schema,
                                        max_records=max_records))
        return self._start(path, "cdc")

    def _start(self, cfg, kind="w"):
        w = Worker(f"{self.name}-{kind}{len(self.workers) + 1}", cfg, self.url, self.logdir)
        self.workers.append(w)
        w.start()
        return w

    def setup(self, workers, backlog=0, customers=CUSTOMERS, days=DAYS, sizes=(5000, 500, 20), connections=2):
        admin = AdminClient({"bootstrap.servers": self.brokers})
        for f in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (self.topic, self.cdc_topic)]).values():
            f.result(30)
        wait_leaders(admin, (self.topic, self.cdc_topic))
        self.producer = EventProducer(self.brokers, self.topic, self.rng.randrange(2**32), self.args.rate,
                                      self.truth, customers=customers, days=days)
        self.cdc_producer = CdcProducer(self.brokers, self.cdc_topic, self.rng.randrange(2**32),
                                        max(10, self.args.rate // 10), self.cdc_truth)
        if backlog:
            t0 = time.monotonic()
            self.producer.backlog(backlog)
            log(f"{self.name}: backlog of {backlog} records written in {time.monotonic() - t0:.1f} s")
        self.cdc_producer.snapshot(100)
        self.producer.start()
        self.cdc_producer.start()
        # batch sizes from 5000 down to 20 across the workers (1 is too slow to keep up with the producer)
        sizes = list(sizes) + [500] * workers
        for i in range(workers):
            self.add_workers(1, max_records=sizes[i], connections=connections)
        self.add_cdc_worker()
        for s in (self.schema, self.cdc_schema):
            wait_table(self.url, f"{s}.replaysafe_checkpoints")
        with psycopg.connect(self.url, autocommit=True, application_name=HARNESS_APP) as c:
            for s in (self.schema, self.cdc_schema):
                c.execute(AUDIT.format(s=s, app=HARNESS_APP))
        time.sleep(3)
        self.revive()  # a worker that exited at start (NotLeaderForPartition on a new topic) runs the scenario

    def revive(self):
        """Restarts (as an orchestrator would) every worker that exited by itself; recorded in `crashed`, with
        the reason when it gave up on its consumer group (the membership bound, src/source/membership.rs)."""
        for w in self.workers:
            if w.proc is not None and not w.alive() and not w.stopped:
                with open(w.logs[-1], errors="replace") as f:
                    text = f.read()
                    gave_up = any(m in text for m in GAVE_UP)
                why = " (not a steady group member)" if gave_up else ""
                log(f"{w.name} had exited (rc {w.proc.returncode}){why}; restarted")
                self.crashed.append(f"{os.path.basename(w.logs[-1])}: rc {w.proc.returncode}{why}")
                w.start()

    def delay_commits(self):
        """Every batch COMMIT of this scenario sleeps 20 ms in a deferred trigger, so that a backend can be
        caught (and terminated) while it executes COMMIT."""
        with psycopg.connect(self.url, autocommit=True, application_name=HARNESS_APP) as c:
            for s in (self.schema, self.cdc_schema):
                c.execute(COMMIT_DELAY.format(s=s))

    def quiesce(self):
        """Producer off, every worker running, then wait (bounded) until the tables equal the truth."""
        for p in (self.producer, self.cdc_producer):
            p.stop.set()
        for p in (self.producer, self.cdc_producer):
            p.join()
        for w in self.workers:
            if not w.alive() and not w.stopped:
                log(f"{w.name} had exited (rc {w.proc.returncode}); restarted")
                self.crashed.append(f"{os.path.basename(w.logs[-1])}: rc {w.proc.returncode}")
                w.start()
        start = time.monotonic()
        last, progress_at = None, start
        while True:
            # A worker that gave up on its group (not a steady member for max.poll.interval.ms +
            # session.timeout.ms = 70 s: a coordinator stuck after the broker restart) exits 1; restart it.
            self.revive()
            v = self.verify()
            seen = (v["ledger_rows"], v["cdc"]["ledger_rows"])
            if seen != last:
                last, progress_at = seen, time.monotonic()
            # bounded: --converge-s without progress (ledger rows not growing), 15 minutes in all
            deadline = min(progress_at + self.args.converge_s, start + 900)
            if (v["lost"] == 0 and v["doubled"] == 0 and v["rows_wrong"] == 0 and v["outbox_wrong"] == 0
                    and v["dead_letters_wrong"] == 0 and v["cdc"]["rows_wrong"] == 0
                    and v["cdc"]["tombstones_wrong"] == 0 and v["cdc"]["dead_letters_wrong"] == 0
                    and v["sums_wrong"] == 0) or time.monotonic() > deadline:
                return v
            time.sleep(2)

    def verify(self):
        c_truth, s_truth = self.truth.counts()
        rows_truth = self.truth.rows()
        s = self.schema
        with psycopg.connect(self.url, autocommit=True, application_name=HARNESS_APP) as c:
            got_c = {(str(d), cu): n for d, cu, n in c.execute(f"SELECT day, customer_id, n FROM {s}.daily_counts")}
            got_s = {(str(d), cu): t for d, cu, t in c.execute(f"SELECT day, customer_id, total FROM {s}.daily_totals")}
            got_rows = {cu: (a, v) for cu, a, v in c.execute(f"SELECT customer_id, amount, version FROM {s}.customer_state")}
            tomb = {cu: v for cu, v in c.execute(f"SELECT customer_id, _version[1] FROM {s}.customer_state_tombstones")}
            outbox = c.execute(f"SELECT count(*), count(DISTINCT payload->>'event_id') FROM {s}.outbox").fetchone()
            dls = {(p, o) for p, o in c.execute(f"SELECT partition, \"offset\" FROM {s}.replaysafe_dead_letters "
                                                f"WHERE topic = %s", (self.topic,))}
            ledger = c.execute(f"SELECT count(*) FROM {s}.replaysafe_ledger").fetchone()[0]
            audit = c.execute(f"SELECT count(*) FROM {s}.chaos_audit").fetchone()[0]
        lost = sum(max(0, n - got_c.get(k, 0)) for k, n in c_truth.items())
        doubled = sum(max(0, n - c_truth.get(k, 0)) for k, n in got_c.items())
        sums_wrong = sum(1 for k, t in s_truth.items() if Decimal(got_s.get(k, 0)) != t)
        rows_wrong = 0
        for cu, e in rows_truth.items():
            if e["event_type"] == "CustomerClosed":
                rows_wrong += int(cu in got_rows or tomb.get(cu) != e["version"])
            else:
                rows_wrong += int(got_rows.get(cu) != (Decimal(e["amount"]), e["version"]))
        purchases = sum(1 for e in self.truth.events.values() if e["event_type"] == "Purchase")
        return {
            "lost": lost, "doubled": doubled, "sums_wrong": sums_wrong, "rows_wrong": rows_wrong,
            "outbox_wrong": abs(outbox[0] - purchases) + (outbox[0] - outbox[1]),
            "dead_letters_wrong": len(dls ^ self.truth.poison),
            "ledger_rows": ledger, "unique_events": len(self.truth.events), "poison": len(self.truth.poison),
            "checkpoint_regressions": audit, "cdc": self.verify_cdc(),
        }

    def verify_cdc(self):
        """The Debezium row projection against the truth: each account's newest change (row or tombstone)."""
        truth = self.cdc_truth.rows()
        s = self.cdc_schema
        with psycopg.connect(self.url, autocommit=True, application_name=HARNESS_APP) as c:
            rows = {i: (o, b) for i, o, b in c.execute(f"SELECT id, owner, balance FROM {s}.accounts")}
            tomb = {i for (i,) in c.execute(f"SELECT id FROM {s}.accounts_tombstones")}
            dls = {(p, o) for p, o in c.execute(f"SELECT partition, \"offset\" FROM {s}.replaysafe_dead_letters "
                                                f"WHERE topic = %s", (self.cdc_topic,))}
            ledger = c.execute(f"SELECT count(*) FROM {s}.replaysafe_ledger").fetchone()[0]
            audit = c.execute(f"SELECT count(*) FROM {s}.chaos_audit").fetchone()[0]
        rows_wrong = sum(1 for i, a in truth.items() if a is not None and rows.get(i) != (a["owner"], a["balance"]))
        rows_wrong += sum(1 for i in rows if truth.get(i) is None)
        deleted = {i for i, a in truth.items() if a is None}
        return {"changes": len(self.cdc_truth.changes), "events": self.cdc_truth.sent, "rows": len(rows),
                "tombstones": len(tomb), "deleted": len(deleted), "rows_wrong": rows_wrong,
                "tombstones_wrong": len(deleted - tomb), "dead_letters_wrong": len(dls ^ self.cdc_truth.poison),
                "poison": len(self.cdc_truth.poison), "ledger_rows": ledger, "checkpoint_regressions": audit}

    def recovered_or_gave_up(self, bound_s):
        """Waits (at most bound_s) until every worker has either recovered — its group is stable and has as many
        members holding partitions as it has running workers — or exited 1 naming its consumer group (GAVE_UP).
        Returns how long that took, or records in checks_failed what was not so at the bound."""
        t0 = time.monotonic()
        admin = AdminClient({"bootstrap.servers": self.brokers})
        groups = {self.group: [w for w in self.workers if "-cdc" not in w.name],
                  self.cdc_group: [w for w in self.workers if "-cdc" in w.name]}
        while True:
            wrong = []
            for w in self.workers:
                if w.proc is not None and not w.alive() and not w.stopped:
                    with open(w.logs[-1], errors="replace") as f:
                        text = f.read()
                    if w.proc.returncode != 1 or not any(m in text for m in GAVE_UP):
                        wrong.append(f"{w.name} exited {w.proc.returncode} without giving up on its group")
            for g, members in groups.items():
                running = sum(1 for w in members if w.alive())
                try:
                    d = admin.describe_consumer_groups([g], request_timeout=10)[g].result()
                    holding = sum(1 for m in d.members if m.assignment and m.assignment.topic_partitions)
                    state = str(d.state)
                except Exception as e:  # the broker still loading the group: not recovered yet
                    holding, state = -1, repr(e)
                if running and not ("STABLE" in state and holding == running):
                    wrong.append(f"group {g}: {running} workers running, {holding} members holding partitions, "
                                 f"state {state}")
            took = time.monotonic() - t0
            if not wrong:
                return took
            if took > bound_s:
                self.checks_failed.extend(wrong)
                return took
            time.sleep(1)

    def offsets_match(self):
        """Kafka committed offsets equal the checkpoints within 10 s of quiet, for every group of the scenario."""
        diff = {}
        for group, topic, schema in ([(g, self.topic, self.schema) for g in self.groups]
                                     + [(self.cdc_group, self.cdc_topic, self.cdc_schema)]):
            diff.update({f"{group}/{p}": v for p, v in self._offsets_match(group, topic, schema).items()})
        return diff

    def _offsets_match(self, group, topic, schema):
        deadline = time.monotonic() + 10
        cons = Consumer({"bootstrap.servers": self.brokers, "group.id": group})
        try:
            while True:
                committed = {tp.partition: tp.offset for tp in
                             cons.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)}
                with psycopg.connect(self.url, autocommit=True, application_name=HARNESS_APP) as c:
                    ck = {p: n for p, n in c.execute(
                        f"SELECT partition, next_offset FROM {schema}.replaysafe_checkpoints "
                        f"WHERE consumer_group = %s AND topic = %s", (group, topic))}
                diff = {p: (committed.get(p), ck.get(p)) for p in range(PARTITIONS) if committed.get(p) != ck.get(p)}
                if not diff or time.monotonic() > deadline:
                    return {str(p): v for p, v in diff.items()}
                time.sleep(1)
        finally:
            cons.close()

    def shutdown(self):
        """SIGTERM every running worker; each must exit 0 within the shutdown timeout with an accounting line
        that adds up. Returns the exit codes, the wrong lines, and the sum of the last accounting line of every
        process that wrote one (consumed = landed + duplicate + stale + filtered + quarantined over all)."""
        running = [w for w in self.workers if w.alive()]
        for w in running:
            w.signal(signal.SIGTERM)
        exits, bad_lines = {}, []
        for w in running:
            try:
                rc = w.proc.wait(self.args.shutdown_timeout)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                rc = "timeout"
            exits[w.name] = rc
            if not accounting_lines(w.logs[-1]):
                bad_lines.append(f"{w.name}: no accounting line in {w.logs[-1]}")
        total = [0] * 6
        for w in self.workers:
            for path in w.logs:
                lines = accounting_lines(path)
                for n in lines:
                    if n[0] != sum(n[1:]):
                        bad_lines.append(f"{os.path.basename(path)}: {n}")
                if lines:
                    total = [t + x for t, x in zip(total, lines[-1])]
        return exits, bad_lines, total


def accounting_lines(path):
    """[consumed, landed, duplicate, stale, filtered, quarantined] of every accounting line in a worker log."""
    text = open(path, errors="replace").read()
    return [[int(x or 0) for x in ln] for ln in re.findall(
        r"consumed (\d+) = landed (\d+) \+ duplicate (\d+)(?: \+ stale (\d+))? "
        r"\+ filtered (\d+) \+ quarantined (\d+)", text)]


def sqlstates(logdir):
    """How often each retried/failed SQLSTATE of interest (40P01 deadlock, 40001, 25006 read-only, 57P01,
    55P03 lock timeout, 25P03 idle-in-transaction timeout) appears in the scenario's worker logs."""
    found = {}
    for name in os.listdir(logdir):
        if name.endswith(".log"):
            for m in re.findall(r"\b(40P01|40001|25006|57P01|55P03|25P03|57014)\b",
                                open(os.path.join(logdir, name), errors="replace").read()):
                found[m] = found.get(m, 0) + 1
    return found


# ---------------------------------------------------------------- the scenarios


def every(ctx, seconds, lo, hi, action):
    """Calls action() at random intervals in [lo, hi] s until `seconds` have passed."""
    end = time.monotonic() + seconds
    while True:
        wait = ctx.rng.uniform(lo, hi)
        if time.monotonic() + wait > end:
            time.sleep(max(0.0, end - time.monotonic()))
            return
        time.sleep(wait)
        ctx.revive()
        action()


def sc_kills(ctx, f, secs):
    """SIGKILL + restart of a random worker, >= 30 times, over a backlog plus continuous production."""
    every(ctx, secs, secs / 42, secs / 36, f.kill_restart)


def sc_zombie(ctx, f, secs):
    """SIGSTOP a worker with its batch transaction open for 15 s (> session.timeout.ms 10 s), then SIGCONT."""
    third = secs / 3
    time.sleep(third)
    f.zombie(freeze_s=15)
    time.sleep(max(0.0, secs - third - 15))


def sc_postgres(ctx, f, secs):
    """24 pg_terminate_backend (every other one of a backend executing COMMIT), pg_ctl restart, 10 s
    read-only (default_transaction_read_only + reload: SQLSTATE 25006), pg_ctl restart."""
    ctx.delay_commits()
    phase = max(10.0, secs * 0.4)
    for i in range(24):
        time.sleep(phase / 24)
        if not (i % 2 and f.terminate_backend(after_commit=True)):
            f.terminate_backend()
    f.pg_restart()
    time.sleep(2)
    f.read_only(10)
    time.sleep(2)
    f.pg_restart()
    time.sleep(max(0.0, secs - phase - 14))


def sc_broker(ctx, f, secs):
    """The broker stopped for 5 s and started again mid-run."""
    time.sleep(secs / 3)
    f.broker_restart(down_s=5)
    time.sleep(max(0.0, secs * 2 / 3 - 5))


def sc_broker_restarts(ctx, f, secs):
    """The broker restarted three times in a row (2 s down, 3 s up between); then every worker recovers or exits 1
    naming its consumer group within the membership bound (plus 20 s: a statistics interval, a rebalance)."""
    time.sleep(min(10.0, secs / 4))
    for _ in range(3):
        f.broker_restart(down_s=2)
        time.sleep(3)
    took = ctx.recovered_or_gave_up(MEMBERSHIP_BOUND_S + 20)
    f.note("recovered_within_s", round(took))
    log(f"broker-restarts: every worker recovered or gave up {took:.1f} s after the last restart")


def sc_storm(ctx, f, secs):
    """Workers joining and leaving (SIGTERM, sometimes SIGKILL) every 2-5 s."""
    extra = []

    def churn():
        if extra and ctx.rng.random() < 0.5:
            w = extra.pop(ctx.rng.randrange(len(extra)))
            w.signal(signal.SIGTERM if ctx.rng.random() < 0.7 else signal.SIGKILL)
            w.proc.wait()
            w.stopped = True
            f.note("worker_left")
        else:
            extra.extend(ctx.add_workers(1))
            f.note("worker_joined")
    every(ctx, secs, 2, 5, churn)


def sc_two_groups(ctx, f, secs):
    """A second consumer group (the replay under another group id) writing the same tables."""
    time.sleep(secs / 4)
    ctx.add_workers(2, group=ctx.group + "-replay")
    f.note("second_group", 1)
    time.sleep(secs * 3 / 4)


def sc_c36(ctx, f, secs):
    """C36: few customers on one day, keyed by event id (every customer on every partition), batches of
    20-50 records and 4 connections per worker: batches of different partitions update the same aggregate rows
    at once, in whatever order their records came. No fault is injected; the 40P01 count is in the details."""
    time.sleep(secs)


def sc_lost_commit(ctx, f, secs):
    """The newest batch of a partition and its checkpoint advance rolled back behind the running worker."""
    every(ctx, secs, 2, 4, f.lost_commit)


SCENARIOS = {
    "kills": sc_kills, "zombie": sc_zombie, "postgres": sc_postgres, "broker": sc_broker,
    "broker-restarts": sc_broker_restarts,
    "storm": sc_storm, "two-groups": sc_two_groups, "c36": sc_c36, "lost-commit": sc_lost_commit,
}
# Shares of --minutes: kills needs time for >= 30 kills, the storm a minute at 5 minutes, postgres its restarts.
WEIGHTS = {"kills": 2.0, "storm": 2.2, "postgres": 1.5}
# Setup per scenario: kills gets a backlog (>= 300k events at 5 minutes), c36 a contended load.
SETUP = {
    "c36": dict(customers=40, days=DAYS[:1], sizes=(100, 500, 2000), connections=4),
}


def required_faults(name, minutes):
    """The faults a scenario must have injected (kind -> at least), else it fails: a fault that never happened
    proves nothing."""
    return {
        "kills": {"sigkill": 30 if minutes >= 5 else 10}, "zombie": {"zombie_sigstop": 1},
        "postgres": {"pg_terminate": 20, "pg_terminate_after_commit": 1, "pg_restart": 2, "pg_read_only": 1},
        "broker": {"broker_restart": 1}, "broker-restarts": {"broker_restart": 3}, "storm": {"worker_joined": 2, "worker_left": 1},
        "two-groups": {"second_group": 1}, "c36": {}, "lost-commit": {"lost_commit": 1},
    }[name]


def run_scenario(name, args, run_id, rng, secs):
    ctx = Scenario(name, args, run_id, rng)
    f = Faults(ctx)
    kw = dict(SETUP.get(name, {}))
    if name == "kills":
        target = int(300000 * min(1.0, args.minutes / 5))
        kw["backlog"] = max(0, target - int(args.rate * secs * 0.9))
    log(f"{name}: {args.workers} workers, {PARTITIONS} partitions, {secs:.0f} s of faults, topic {ctx.topic}")
    t0 = time.monotonic()
    exits, bad_lines, total, offsets = {}, ["harness failed before shutdown"], [0] * 6, {"harness": "failed"}
    v = None
    try:
        ctx.setup(args.workers, **kw)
        SCENARIOS[name](ctx, f, secs)
        v = ctx.quiesce()
        offsets = ctx.offsets_match()
        exits, bad_lines, total = ctx.shutdown()
    finally:
        for p in (ctx.producer, ctx.cdc_producer):
            if p:
                p.stop.set()
        for w in ctx.workers:
            w.signal(signal.SIGCONT)
            w.signal(signal.SIGKILL)
    cdc = v["cdc"]
    ok_exits = all(rc == 0 for rc in exits.values())
    accounting = (v["ledger_rows"] == v["unique_events"] and v["dead_letters_wrong"] == 0 and not bad_lines
                  and not ctx.checks_failed
                  and ok_exits and not offsets and v["checkpoint_regressions"] == 0 and total[0] == sum(total[1:])
                  and cdc["rows_wrong"] == 0 and cdc["tombstones_wrong"] == 0 and cdc["dead_letters_wrong"] == 0
                  and cdc["checkpoint_regressions"] == 0)
    got = dict(f.count, pg_terminate=f.count.get("pg_terminate_backend", 0)
               + f.count.get("pg_terminate_after_commit", 0))
    missing = {k: (got.get(k, 0), n) for k, n in required_faults(name, args.minutes).items() if got.get(k, 0) < n}
    res = {
        "events": ctx.truth.sent + ctx.cdc_truth.sent, "unique_events": v["unique_events"] + cdc["changes"],
        "faults": f.count, "duration_s": round(time.monotonic() - t0, 1), "lost": v["lost"], "doubled": v["doubled"],
        "accounting_exact": accounting and v["sums_wrong"] == 0 and v["rows_wrong"] == 0 and v["outbox_wrong"] == 0,
        "faults_as_planned": not missing,
        "details": dict(v, json_events=ctx.truth.sent, faults_missing=missing, workers_exited_early=ctx.crashed, exits=exits, accounting_lines_wrong=bad_lines,
                        accounting_total=dict(zip(("consumed", "landed", "duplicate", "stale", "filtered",
                                                   "quarantined"), total)),
                        offsets_not_committed=offsets, checks_failed=ctx.checks_failed, sqlstates_in_logs=sqlstates(ctx.logdir),
                        produce_failed=ctx.truth.failed + ctx.cdc_truth.failed, fault_s=round(secs, 1),
                        worker_starts=sum(w.starts for w in ctx.workers), logs=ctx.logdir, schema=ctx.schema),
    }
    log(f"{name}: {json.dumps({k: res[k] for k in ('events', 'faults', 'lost', 'doubled', 'accounting_exact')})}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    ap.add_argument("--minutes", type=float, default=5.0, help="total minutes of faults over all scenarios")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--rate", type=int, default=2500, help="events/s the producer writes while faults run")
    ap.add_argument("--converge-s", type=int, default=90,
                    help="after the faults, how long to wait for the truth without progress (ledger not growing)")
    ap.add_argument("--shutdown-timeout", type=int, default=30)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--run-id", default=None, help="the run's name (default: the UTC time)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    run_id = args.run_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    args.workdir = args.workdir or os.path.join(ROOT, "chaos", "runs", run_id)
    names = [n for n in args.scenarios.split(",") if n]
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n!r} (known: {', '.join(SCENARIOS)})")
    units = sum(WEIGHTS.get(n, 1.0) for n in names)
    log(f"seed {seed}; logs in {args.workdir}")
    results = {"seed": seed, "minutes": args.minutes, "rate": args.rate, "scenarios": {}}
    for n in names:
        secs = args.minutes * 60 * WEIGHTS.get(n, 1.0) / units
        try:
            results["scenarios"][n] = run_scenario(n, args, run_id.lower(), random.Random(rng.randrange(2**32)),
                                                   secs)
        except Exception as e:  # a harness or service failure fails the scenario; the others still run
            log(f"{n}: FAILED with {e!r}")
            results["scenarios"][n] = {"events": None, "faults": {}, "duration_s": None, "lost": None,
                                       "doubled": None, "accounting_exact": False, "faults_as_planned": False,
                                       "error": repr(e)}
    os.makedirs(os.path.join(ROOT, "chaos", "results"), exist_ok=True)
    out = os.path.join(ROOT, "chaos", "results", f"{run_id}.json")
    with open(out, "w") as fh:
        json.dump(results, fh, indent=2, default=str)
    passed = all(r["lost"] == 0 and r["doubled"] == 0 and r["accounting_exact"] and r.get("faults_as_planned")
                 for r in results["scenarios"].values())
    print(json.dumps({n: {k: r[k] for k in ("events", "faults", "duration_s", "lost", "doubled", "accounting_exact",
                                            "faults_as_planned")}
                      for n, r in results["scenarios"].items()}, indent=2))
    log(f"{'PASSED' if passed else 'FAILED'}; results in {out}")
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
