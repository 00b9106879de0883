#!/usr/bin/env python3
"""scripts/bench-scale's report: `scale_report.py WORKDIR OUT.json EVENTS TOPIC PREFIX COMMIT "1 2 4"`.

Reads what scripts/bench-scale left in WORKDIR/w<W>/ (worker logs, /usr/bin/time lines, the sampler's JSON, the
database checks), prints the table and the wait-event shares, writes OUT.json, exits 1 when a check failed."""

import json
import os
import re
import sys
from datetime import datetime

work, out, n, topic, prefix, commit, counts = sys.argv[1:8]
n = int(n)
counts = [int(c) for c in counts.split()]


def read(path):
    with open(path) as f:
        return f.read().strip()


def worker(d, i):
    t = read(f"{d}/worker{i}.time").splitlines()[-1].split()
    err = read(f"{d}/worker{i}.err")
    m = re.findall(r"throughput from first record to last checkpoint commit.*?records=(\d+) seconds=([0-9.e+-]+) rate=([0-9.e+-]+)", err)
    tally = read(f"{d}/worker{i}.out").splitlines()[-1]
    landed = int(re.search(r"landed (\d+)", tally).group(1))
    return {
        "peak_rss_mib": round(int(t[0]) / 1024, 1),
        "cpu_s": round(float(t[1]) + float(t[2]), 2),
        "records": int(m[-1][0]) if m else 0,
        "own_seconds": float(m[-1][1]) if m else None,
        "own_events_per_s": round(float(m[-1][2])) if m else None,
        "assignments": err.count("partition assigned"),
        "tally": tally,
        "landed": landed,
    }


runs = {}
for w in counts:
    d = f"{work}/w{w}"
    rows, span, batches = read(f"{d}/db.tsv").split("\t")
    rows, span, batches = int(rows), float(span), int(batches)
    s = json.load(open(f"{d}/sample.json"))
    ws = [worker(d, i) for i in range(1, w + 1)]
    left = int(re.search(r"landed (\d+)", read(f"{d}/sweep.out").splitlines()[-1]).group(1))
    total = max(s["backend_samples"], 1)
    in_tx = sum(v for k, v in s["waits"].items() if k != "ClientRead (idle)")
    in_server = sum(v for k, v in s["waits"].items() if not k.startswith("ClientRead"))
    first, settled, after, after_s = read(f"{d}/settled.tsv").split("\t")
    r = {
        "workers": w,
        "events_per_s_settled": round(int(after) / float(after_s)) if after_s and float(after_s) > 0 else None,
        "rows_after_settled": int(after),
        "settle_s": round((datetime.fromisoformat(settled.replace("Z", "+00:00")) - datetime.fromisoformat(first.replace("Z", "+00:00"))).total_seconds(), 3),
        "events_per_s": round(rows / span) if span > 0 else None,
        "span_s": span,
        "wall_s": float(read(f"{d}/wall")),
        "events_per_s_wall": round(n / float(read(f"{d}/wall"))),
        "ledger_rows_by_workers": rows,
        "left_by_workers_landed_by_sweep": left,
        "ledger_rows": rows + left,
        "batch_transactions": batches,
        "records_per_batch": round(rows / max(batches, 1), 1),
        "batch_transactions_per_s": round(batches / span, 1) if span > 0 else None,
        "checkpointed": int(read(f"{d}/checkpointed")),
        "aggregate_rows_differing": int(read(f"{d}/differing")),
        "ledger_rows_not_produced": int(read(f"{d}/foreign")),
        "worker": ws,
        "worker_cpu_s": round(sum(x["cpu_s"] for x in ws), 2),
        "max_peak_rss_mib": max(x["peak_rss_mib"] for x in ws),
        "pg_backend_cpu_s": s["backend_cpu_s"],
        "pg_aux_cpu_s": s["aux_cpu_s"],
        "wal_bytes": s["wal_bytes"],
        "wal_bytes_per_event": round(s["wal_bytes"] / n, 1),
        "wal_fpi": s["wal_fpi"],
        "wal_sync": s["wal_sync"],
        "wait_share_pct": {k: round(100 * v / total, 1) for k, v in s["waits"].items()},
        # Of the samples where a backend was inside a transaction (everything but idle between transactions).
        "in_transaction_share_pct": {k: round(100 * v / max(in_tx, 1), 1) for k, v in s["waits"].items() if k != "ClientRead (idle)"},
        # Average number of the workers' backends per sample: inside a transaction, and working in the server
        # (neither idle nor waiting for the client).
        "avg_backends_in_transaction": round(in_tx / max(s["samples"], 1), 2),
        "avg_backends_in_server": round(in_server / max(s["samples"], 1), 2),
        "walwriter_waits": s["walwriter_waits"],
        "other_active_backends": s["other_active_backends"],
        "sampler": {k: s[k] for k in ("seconds", "samples", "backend_samples", "backends")},
        "others_at_start": read(f"{d}/others"),
    }
    r["checks"] = {
        f"ledger rows = {n}": rows + left == n,
        f"checkpoints sum to {n}": r["checkpointed"] == n,
        "daily_counts/daily_totals = GROUP BY of the produced events": r["aggregate_rows_differing"] == 0,
        "no ledger row outside the produced events": r["ledger_rows_not_produced"] == 0,
        f"workers' (and the sweep's) tallies land {n}": sum(x["landed"] for x in ws) + left == n,
    }
    runs[str(w)] = r

base = runs[str(counts[0])]["events_per_s"] or 1
base_settled = runs[str(counts[0])]["events_per_s_settled"] or 1
for r in runs.values():
    r["speedup_vs_first"] = round((r["events_per_s"] or 0) / base, 2)
    r["settled_speedup_vs_first"] = round((r["events_per_s_settled"] or 0) / base_settled, 2)
res = {"events": n, "partitions": 16, "topic": topic, "schemas": prefix + "_w*", "commit": commit, "runs": runs}
with open(out, "w") as f:
    json.dump(res, f, indent=1)

print(f"scaling, {n} seed events, 16 partitions, one consumer group per worker count (commit {commit})")
hdr = ("workers", "events/s", "x", "settled events/s", "x", "settle s", "wall s", "RSS MiB max", "rs CPU s", "PG backend CPU s", "PG wal/ckpt/bgw CPU s",
       "WAL MiB", "WAL B/ev", "batches", "rec/batch", "left", "exact")
print(" | ".join(hdr))
for w, r in runs.items():
    print(" | ".join(str(x) for x in (
        w, r["events_per_s"], r["speedup_vs_first"], r["events_per_s_settled"], r["settled_speedup_vs_first"],
        r["settle_s"], r["wall_s"], r["max_peak_rss_mib"], r["worker_cpu_s"],
        r["pg_backend_cpu_s"], r["pg_aux_cpu_s"], round(r["wal_bytes"] / 2**20, 1), r["wal_bytes_per_event"],
        r["batch_transactions"], r["records_per_batch"], r["left_by_workers_landed_by_sweep"], "yes" if all(r["checks"].values()) else "NO")))
keys = sorted({k for r in runs.values() for k in r["in_transaction_share_pct"]},
              key=lambda k: -max(r["in_transaction_share_pct"].get(k, 0) for r in runs.values()))
print("\nworkers' backends inside a transaction, % of pg_stat_activity samples (every 100 ms)")
print("state / wait event | " + " | ".join(f"{w} worker(s)" for w in runs))
for k in keys:
    print(f"{k} | " + " | ".join(str(r["in_transaction_share_pct"].get(k, 0.0)) for r in runs.values()))
print("idle between transactions, % of all samples | " + " | ".join(str(r["wait_share_pct"].get("ClientRead (idle)", 0.0)) for r in runs.values()))
print("backends (postgres.connections + 1 per worker) | " + " | ".join(str(r["sampler"]["backends"]) for r in runs.values()))
print("avg backends in a transaction | " + " | ".join(str(r["avg_backends_in_transaction"]) for r in runs.values()))
print("avg backends working in the server | " + " | ".join(str(r["avg_backends_in_server"]) for r in runs.values()))
print("WAL writer: " + "; ".join(f"{w}: {r['walwriter_waits']}" for w, r in runs.items()))
print("\nper worker: records, own events/s, peak RSS MiB, CPU s, partition assignments")
for w, r in runs.items():
    print(f"{w}: " + "; ".join(f'{x["records"]} @ {x["own_events_per_s"]}/s, {x["peak_rss_mib"]} MiB, {x["cpu_s"]} s, {x["assignments"]} assigned' for x in r["worker"]))
print("\nother active client backends per sample (count: samples), and the top processes at each start")
for w, r in runs.items():
    print(f'{w}: {r["other_active_backends"]} — {r["others_at_start"]}')
for w, r in runs.items():
    if r["left_by_workers_landed_by_sweep"]:
        print(f'NOTE: {w} workers exited 0 with {r["left_by_workers_landed_by_sweep"]} records of the group unconsumed '
              "(an --until-caught-up worker finished between an eager revocation and its next assignment); "
              "a sweeping worker landed them")
failed = [f"{w} workers: {c}" for w, r in runs.items() for c, ok in r["checks"].items() if not ok]
for f in failed:
    print(f"CHECK FAILED: {f}")
print(f"\nwritten to {out}")
sys.exit(1 if failed else 0)
