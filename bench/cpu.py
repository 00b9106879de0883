#!/usr/bin/env python3
"""CPU per event for the benches (/work/shared/BENCH.md "CPU per event, beside events/s"), read from /proc.

    bench/cpu.py snapshot
        prints `<postgres ticks> <broker ticks>`: user + system clock ticks (`getconf CLK_TCK` per second) so far of
        every local PostgreSQL process (comm `postgres`) plus what the postmaster collected from its exited children
        (cutime + cstime: backends that ended between two snapshots are counted), and of every Kafka broker
        (a JVM whose command line runs `kafka.Kafka`). `-1` for a party not running on this machine.
    bench/cpu.py per-event BEFORE AFTER EVENTS [REPLAYSAFE_SECONDS]
        BEFORE and AFTER are two snapshots; prints `<replaysafe µs> <postgres µs> <broker µs>` per event
        (REPLAYSAFE_SECONDS: user + system seconds of the replaysafe process, e.g. `/usr/bin/time -f '%U %S'`
        summed; `-` when the pass has none, as a ceiling). `-` for a party not measured.
"""

import os
import sys

HZ = os.sysconf("SC_CLK_TCK")


def stat(pid):
    """(comm, ppid, utime + stime, cutime + cstime) of a process, in ticks; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    comm = s[s.index("(") + 1 : s.rindex(")")]
    rest = s[s.rindex(")") + 2 :].split()
    # Fields after the comm, 0-based: 1 ppid, 11 utime, 12 stime, 13 cutime, 14 cstime (proc(5)).
    return comm, int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def snapshot():
    pg, broker, pg_seen, broker_seen = 0, 0, False, False
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = stat(d)
            if st:
                procs[int(d)] = st
    for pid, (comm, ppid, own, children) in procs.items():
        if comm == "postgres":
            pg_seen = True
            pg += own
            parent = procs.get(ppid)
            if parent is None or parent[0] != "postgres":  # the postmaster: its reaped backends' CPU too
                pg += children
        elif comm == "java" and " kafka.Kafka " in f" {cmdline(pid)} ":
            broker_seen = True
            broker += own
    return (pg if pg_seen else -1), (broker if broker_seen else -1)


def per_event(before, after, events, rs_seconds):
    b, a = [int(x) for x in before.split()], [int(x) for x in after.split()]
    out = ["-" if rs_seconds in (None, "-") else f"{float(rs_seconds) * 1e6 / events:.2f}"]
    for x, y in zip(b, a):
        out.append("-" if x < 0 or y < 0 else f"{(y - x) / HZ * 1e6 / events:.2f}")
    return " ".join(out)


PARTIES = ("replaysafe", "postgres", "broker")
HEADER = f"{'CPU µs/event: rs':>17} {'pg':>6} {'broker':>6}"


def parse(text):
    """`per-event`'s output (None: not measured) as {party: µs per event or None}."""
    vals = (text or "- - -").split()
    return {k: (None if v == "-" else float(v)) for k, v in zip(PARTIES, vals)}


def cells(c):
    """The report's three CPU columns (under HEADER) of a parse() result; blank where not measured."""
    c = c or {}
    return " ".join(f"{'' if c.get(k) is None else format(c[k], '.1f'):>{w}}" for k, w in zip(PARTIES, (17, 6, 6)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["snapshot"]:
        print(*snapshot())
    elif sys.argv[1:2] == ["per-event"] and len(sys.argv) in (5, 6):
        print(per_event(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) == 6 else None))
    else:
        sys.exit(__doc__)
