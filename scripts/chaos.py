#!/usr/bin/env python3
"""The fault harness of issue 10: several `replaysafe run` workers under faults, checked against the truth.

Run through `scripts/chaos` (which starts the services, builds the release binary and the Python venv). Each
scenario gets its own topic (12 partitions), schema and consumer group; a producer thread writes JSON events
while the faults run:
  - purchases (counted into daily_counts, summed into daily_totals, one outbox row each),
  - customer row changes (CustomerUpdated / CustomerClosed, version-guarded `row` projection customer_state),
  - ~5% redeliveries of an earlier record (same key and bytes, a later offset) and ~0.2% poison records.
Records are keyed by event id, so one customer's events — and one aggregate row's updates — come from every
partition (entities spread over partitions).

After the faults the producer stops, every worker is (re)started and, while they keep running, the tables
must converge to the truth computed from what the producer wrote: lost = sum of missing counts, doubled = sum
of surplus counts (0 both), outbox rows = purchases, rows/tombstones = each customer's newest change, dead
letters = exactly the poison records, Kafka committed offsets = checkpoints. Then SIGTERM: every worker must
exit 0 within --shutdown-timeout with an accounting line that adds up. A trigger on the checkpoint table
records any checkpoint that moved backwards under a running worker (the harness's own lost-commit fault is
exempt by application_name).

Reproducible from --seed: the events, the schedule of faults and which worker each hits (timing on a loaded
machine still varies). Writes chaos/results/<UTC timestamp>.json: per scenario `events`, `faults` (by kind),
`duration_s`, `lost`, `doubled`, `accounting_exact`, and the details behind them. Exit 0 when every scenario
has lost = doubled = 0 and accounting_exact, 1 otherwise.
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
BIN = os.path.join(ROOT, "target", "release", "replaysafe")
PARTITIONS = 12
CUSTOMERS = 400
DAYS = [dt.date(2026, 11, 20) + dt.timedelta(days=i) for i in range(6)]
HARNESS_APP = "chaos-harness"


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

    def __init__(self, brokers, topic, seed, rate, truth):
        super().__init__(daemon=True)
        self.p = Producer({"bootstrap.servers": brokers, "linger.ms": 20, "acks": "all",
                           "message.timeout.ms": 300000, "enable.idempotence": True})
        self.topic, self.rng, self.rate, self.truth = topic, random.Random(seed), rate, truth
        self.stop = threading.Event()
        self.versions = {}
        self.recent = []

    def _event(self):
        r = self.rng
        cust = f"c{r.randrange(CUSTOMERS):04d}"
        day = r.choice(DAYS)
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


# ---------------------------------------------------------------- workers


PIPELINE = """
[kafka]
group-id = "{group}"
topics = ["{topic}"]
start = "earliest"

[kafka.properties]
"session.timeout.ms" = "10000"
"heartbeat.interval.ms" = "1000"

[postgres]
schema = "{schema}"
connections = 2

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
    raise SystemExit(f"chaos: {table} was not created within {timeout} s (see the worker logs)")


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
        """pg_terminate_backend of one worker connection; with after_commit, one whose statement is COMMIT."""
        q = ("SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s"
             + (" AND state = 'active' AND query ILIKE 'commit%%'" if after_commit else ""))
        with psycopg.connect(self.ctx.url, autocommit=True, application_name=HARNESS_APP) as c:
            deadline = time.monotonic() + (3 if after_commit else 0.5)
            while time.monotonic() < deadline:
                pids = [r[0] for r in c.execute(q, (f"chaos-{self.ctx.name}-%",)).fetchall()]
                if pids:
                    c.execute("SELECT pg_terminate_backend(%s)", (self.ctx.rng.choice(pids),))
                    self.note("pg_terminate_after_commit" if after_commit else "pg_terminate_backend")
                    return
                time.sleep(0.001)

    def zombie(self, freeze_s):
        """SIGSTOP a worker while one of its transactions is open, past the session timeout, then SIGCONT."""
        q = ("SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s "
             "AND xact_start IS NOT NULL AND state IN ('active', 'idle in transaction')")
        by_app = {f"chaos-{w.name}": w for w in self.ctx.workers}
        with psycopg.connect(self.ctx.url, autocommit=True, application_name=HARNESS_APP) as c:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                apps = [r[0] for r in c.execute(q, (f"chaos-{self.ctx.name}-%",)).fetchall()]
                ws = [by_app[a] for a in apps if a in by_app and by_app[a].alive()]
                if ws:
                    w = ws[0]
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
            newest = c.execute(f"SELECT \"offset\", event_id::text FROM {s}.replaysafe_ledger WHERE topic = %s "
                               f"AND partition = %s AND \"offset\" >= %s ORDER BY \"offset\" DESC",
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
            c.execute(f"DELETE FROM {s}.replaysafe_ledger WHERE topic = %s AND partition = %s AND \"offset\" >= %s",
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
        out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout.split()
        subprocess.run(["pg_ctlcluster", out[0], out[1], "restart"], check=True)
        self.note("pg_restart")

    def broker_restart(self, down_s):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "kafka-stop")], check=True,
                       stderr=subprocess.DEVNULL)
        time.sleep(down_s)
        env = dict(os.environ)
        env.pop("KAFKA_BROKERS", None)
        out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "kafka-start")], check=True,
                             capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
        if out.split("=", 1)[1] != self.ctx.brokers:
            raise SystemExit(f"chaos: the broker came back on {out}, not {self.ctx.brokers}")
        self.note("broker_restart")


# ---------------------------------------------------------------- one scenario


class Scenario:
    def __init__(self, name, args, run_id, rng):
        self.name, self.args, self.rng = name, args, rng
        self.url, self.brokers = os.environ["DATABASE_URL"], os.environ["KAFKA_BROKERS"]
        self.topic = f"chaos.{run_id}.{name}"
        self.schema = f"chaos_{run_id}_{name.replace('-', '_')}"
        self.group = f"chaos-{run_id}-{name}"
        self.logdir = os.path.join(args.workdir, name)
        os.makedirs(self.logdir, exist_ok=True)
        self.truth = Truth()
        self.workers, self.producer = [], None

    def config(self, group, max_records):
        path = os.path.join(self.logdir, f"{group}.{max_records}.toml")
        with open(path, "w") as f:
            f.write(PIPELINE.format(group=group, topic=self.topic, schema=self.schema, max_records=max_records))
        return path

    def add_workers(self, n, group=None, max_records=500):
        cfg = self.config(group or self.group, max_records)
        made = []
        for i in range(n):
            w = Worker(f"{self.name}-w{len(self.workers) + 1}", cfg, self.url, self.logdir)
            self.workers.append(w)
            made.append(w)
            w.start()
        return made

    def setup(self, workers):
        admin = AdminClient({"bootstrap.servers": self.brokers})
        for f in admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)]).values():
            f.result(30)
        self.producer = EventProducer(self.brokers, self.topic, self.rng.randrange(2**32), self.args.rate,
                                      self.truth)
        self.producer.start()
        # batch sizes from 5000 down to 20 across the workers (1 is too slow to keep up with the producer)
        sizes = [5000, 500, 20] + [500] * workers
        for i in range(workers):
            self.add_workers(1, max_records=sizes[i])
        wait_table(self.url, f"{self.schema}.replaysafe_checkpoints")
        with psycopg.connect(self.url, autocommit=True, application_name=HARNESS_APP) as c:
            c.execute(AUDIT.format(s=self.schema, app=HARNESS_APP))

    def quiesce(self):
        """Producer off, every worker running, then wait (bounded) until the tables equal the truth."""
        self.producer.stop.set()
        self.producer.join()
        for w in self.workers:
            if not w.alive() and not w.stopped:
                log(f"{w.name} had exited (rc {w.proc.returncode}); restarted")
                w.start()
        deadline = time.monotonic() + self.args.converge_s
        while True:
            v = self.verify()
            if (v["lost"] == 0 and v["doubled"] == 0 and v["rows_wrong"] == 0 and v["outbox_wrong"] == 0
                    and v["dead_letters_wrong"] == 0) or time.monotonic() > deadline:
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
            "checkpoint_regressions": audit,
        }

    def offsets_match(self):
        """Kafka committed offsets equal the checkpoints within 10 s of quiet."""
        deadline = time.monotonic() + 10
        cons = Consumer({"bootstrap.servers": self.brokers, "group.id": self.group})
        try:
            while True:
                committed = {tp.partition: tp.offset for tp in
                             cons.committed([TopicPartition(self.topic, p) for p in range(PARTITIONS)], timeout=10)}
                with psycopg.connect(self.url, autocommit=True, application_name=HARNESS_APP) as c:
                    ck = {p: n for p, n in c.execute(
                        f"SELECT partition, next_offset FROM {self.schema}.replaysafe_checkpoints "
                        f"WHERE consumer_group = %s AND topic = %s", (self.group, self.topic))}
                diff = {p: (committed.get(p), ck.get(p)) for p in range(PARTITIONS) if committed.get(p) != ck.get(p)}
                if not diff or time.monotonic() > deadline:
                    return {str(p): v for p, v in diff.items()}
                time.sleep(1)
        finally:
            cons.close()

    def shutdown(self):
        """SIGTERM every worker; each must exit 0 within the shutdown timeout with an accounting line that adds
        up."""
        for w in self.workers:
            w.signal(signal.SIGTERM)
            w.stopped = True
        exits, bad_lines = {}, []
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                rc = w.proc.wait(self.args.shutdown_timeout)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                rc = "timeout"
            exits[w.name] = rc
            last = open(w.logs[-1]).read()
            lines = re.findall(r"consumed (\d+) = landed (\d+) \+ duplicate (\d+)(?: \+ stale (\d+))? "
                               r"\+ filtered (\d+) \+ quarantined (\d+)", last)
            if not lines:
                bad_lines.append(f"{w.name}: no accounting line")
            for ln in lines:
                n = [int(x or 0) for x in ln]
                if n[0] != sum(n[1:]):
                    bad_lines.append(f"{w.name}: {ln}")
        return exits, bad_lines


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
        action()


def sc_kills(ctx, f, secs):
    every(ctx, secs, secs / 36, secs / 30, f.kill_restart)


def sc_zombie(ctx, f, secs):
    third = secs / 3
    time.sleep(third)
    f.zombie(freeze_s=15)
    time.sleep(max(0.0, secs - third - 15))


def sc_postgres(ctx, f, secs):
    slot = secs / 4
    every(ctx, slot, slot / 12, slot / 10, f.terminate_backend)
    every(ctx, slot, slot / 12, slot / 10, lambda: f.terminate_backend(after_commit=True))
    f.pg_restart()
    f.read_only(10)
    time.sleep(max(0.0, slot - 10))
    f.pg_restart()
    time.sleep(slot)


def sc_broker(ctx, f, secs):
    time.sleep(secs / 3)
    f.broker_restart(down_s=5)
    time.sleep(max(0.0, secs * 2 / 3 - 5))


def sc_storm(ctx, f, secs):
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
    every(ctx, min(60, secs), 2, 5, churn)
    time.sleep(max(0.0, secs - 60))


def sc_two_groups(ctx, f, secs):
    time.sleep(secs / 4)
    ctx.add_workers(2, group=ctx.group + "-replay")
    f.note("second_group", 1)
    time.sleep(secs * 3 / 4)


def sc_lost_commit(ctx, f, secs):
    every(ctx, secs, 2, 4, f.lost_commit)


SCENARIOS = {
    "kills": sc_kills, "zombie": sc_zombie, "postgres": sc_postgres, "broker": sc_broker,
    "storm": sc_storm, "two-groups": sc_two_groups, "lost-commit": sc_lost_commit,
}


def run_scenario(name, args, run_id, rng, secs):
    ctx = Scenario(name, args, run_id, rng)
    f = Faults(ctx)
    log(f"{name}: {args.workers} workers, {PARTITIONS} partitions, {secs:.0f} s of faults, topic {ctx.topic}")
    t0 = time.monotonic()
    try:
        ctx.setup(args.workers)
        SCENARIOS[name](ctx, f, secs)
        v = ctx.quiesce()
        offsets = ctx.offsets_match()
        exits, bad_lines = ctx.shutdown()
    finally:
        if ctx.producer:
            ctx.producer.stop.set()
        for w in ctx.workers:
            w.signal(signal.SIGCONT)
            w.signal(signal.SIGKILL)
    ok_exits = all(rc == 0 for rc in exits.values())
    accounting = (v["ledger_rows"] == v["unique_events"] and v["dead_letters_wrong"] == 0 and not bad_lines
                  and ok_exits and not offsets and v["checkpoint_regressions"] == 0)
    res = {
        "events": ctx.truth.sent, "unique_events": v["unique_events"], "faults": f.count,
        "duration_s": round(time.monotonic() - t0, 1), "lost": v["lost"], "doubled": v["doubled"],
        "accounting_exact": accounting and v["sums_wrong"] == 0 and v["rows_wrong"] == 0 and v["outbox_wrong"] == 0,
        "details": dict(v, exits=exits, accounting_lines_wrong=bad_lines, offsets_not_committed=offsets,
                        produce_failed=ctx.truth.failed, worker_starts=sum(w.starts for w in ctx.workers),
                        logs=ctx.logdir, schema=ctx.schema),
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
    ap.add_argument("--converge-s", type=int, default=120, help="bound on the wait for the truth after faults")
    ap.add_argument("--shutdown-timeout", type=int, default=30)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    args.workdir = args.workdir or os.path.join(ROOT, "chaos", "runs", run_id)
    names = [n for n in args.scenarios.split(",") if n]
    for n in names:
        if n not in SCENARIOS:
            ap.error(f"unknown scenario {n!r} (known: {', '.join(SCENARIOS)})")
    secs = args.minutes * 60 / len(names)
    log(f"seed {seed}; logs in {args.workdir}")
    results = {"seed": seed, "minutes": args.minutes, "rate": args.rate, "scenarios": {}}
    for n in names:
        results["scenarios"][n] = run_scenario(n, args, run_id.lower(), random.Random(rng.randrange(2**32)), secs)
    os.makedirs(os.path.join(ROOT, "chaos", "results"), exist_ok=True)
    out = os.path.join(ROOT, "chaos", "results", f"{run_id}.json")
    with open(out, "w") as fh:
        json.dump(results, fh, indent=2, default=str)
    passed = all(r["lost"] == 0 and r["doubled"] == 0 and r["accounting_exact"]
                 for r in results["scenarios"].values())
    print(json.dumps({n: {k: r[k] for k in ("events", "faults", "duration_s", "lost", "doubled", "accounting_exact")}
                      for n, r in results["scenarios"].items()}, indent=2))
    log(f"{'PASSED' if passed else 'FAILED'}; results in {out}")
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
