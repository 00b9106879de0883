#!/usr/bin/env python3
"""scripts/bench-scale's sampler: `scale_sample.py DSN APPLICATION_NAME OUT.json [INTERVAL_S]`.

Every INTERVAL_S (default 0.1 s) until SIGTERM/SIGINT it samples `pg_stat_activity` and counts, over the backends
whose `application_name` is APPLICATION_NAME (the workers of one run), their state and wait event: `CPU` (active,
no wait event), `Type:Event` for a wait, `ClientRead (idle)` / `ClientRead (idle in transaction)` when the
backend waits for the worker. It also counts the active client backends of everybody else (what else was running),
the wait events of PostgreSQL's WAL writer, and the CPU time (from /proc/PID/stat, last value seen, in seconds)
of every worker backend and, as a start/end difference, of the walwriter, checkpointer and background writer.
WAL written is the difference of `pg_current_wal_lsn()` and `pg_stat_wal` between start and end: cluster-wide,
so other sessions' writes count too (reported beside the other active backends). Writes one JSON object to
OUT.json; creates OUT.json.ready once sampling has begun.
"""

import json
import os
import signal
import sys
import time
from collections import Counter

import psycopg

dsn, app, out = sys.argv[1], sys.argv[2], sys.argv[3]
interval = float(sys.argv[4]) if len(sys.argv) > 4 else 0.1
TICK = os.sysconf("SC_CLK_TCK")
AUX = ("walwriter", "checkpointer", "background writer")
stop = False


def on_signal(_sig, _frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)


def cpu_s(pid):
    """utime + stime of a process in seconds, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def wal(cur):
    cur.execute(
        "SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi, wal_bytes::bigint, wal_write, wal_sync "
        "FROM pg_stat_wal"
    )
    return cur.fetchone()


def aux_cpu(cur):
    cur.execute("SELECT pid, backend_type FROM pg_stat_activity WHERE backend_type = ANY(%s)", (list(AUX),))
    return {f"{bt} ({pid})": cpu_s(pid) or 0.0 for pid, bt in cur.fetchall()}


with psycopg.connect(dsn, autocommit=True, application_name="replaysafe-bench-scale-sampler") as conn:
    cur = conn.cursor()
    wal0, aux0, t0 = wal(cur), aux_cpu(cur), time.time()
    waits, walwriter, others = Counter(), Counter(), Counter()
    backend_cpu, samples, backend_samples, pids = {}, 0, 0, set()
    open(out + ".ready", "w").close()
    while not stop:
        cur.execute(
            "SELECT pid, application_name, state, wait_event_type, wait_event, backend_type "
            "FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        )
        samples += 1
        active_others = 0
        for pid, name, state, wtype, wevent, btype in cur.fetchall():
            if name == app:
                pids.add(pid)
                backend_samples += 1
                if state == "active" and wtype is None:
                    waits["CPU"] += 1
                elif wevent == "ClientRead":
                    waits[f"ClientRead ({state})"] += 1
                else:
                    waits[f"{wtype}:{wevent}"] += 1
                c = cpu_s(pid)
                if c is not None:
                    backend_cpu[pid] = c
            elif btype == "walwriter":
                walwriter[f"{wtype}:{wevent}" if wtype else "CPU"] += 1
            elif btype == "client backend" and state == "active" and name != "replaysafe-bench-scale-sampler":
                active_others += 1
        others[active_others] += 1
        time.sleep(interval)
    t1 = time.time()
    wal1, aux1 = wal(cur), aux_cpu(cur)
    cur.execute("SELECT pg_wal_lsn_diff(%s, %s)::bigint", (wal1[0], wal0[0]))
    wal_bytes = cur.fetchone()[0]

res = {
    "seconds": round(t1 - t0, 3),
    "samples": samples,
    "backend_samples": backend_samples,
    "backends": len(pids),
    "waits": dict(waits.most_common()),
    "walwriter_waits": dict(walwriter.most_common()),
    "other_active_backends": {str(k): v for k, v in sorted(others.items())},
    "backend_cpu_s": round(sum(backend_cpu.values()), 2),
    "aux_cpu_s": round(sum(aux1.get(k, 0.0) - v for k, v in aux0.items()), 2),
    "wal_bytes": wal_bytes,
    "wal_records": wal1[1] - wal0[1],
    "wal_fpi": wal1[2] - wal0[2],
    "wal_write": wal1[4] - wal0[4],
    "wal_sync": wal1[5] - wal0[5],
}
with open(out, "w") as f:
    json.dump(res, f, indent=1)
