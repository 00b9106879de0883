#!/usr/bin/env python3
"""scripts/bench's report: reads `key<TAB>value` lines (the measurements) on stdin, writes the JSON result to
argv[1] and prints the table."""

import json
import os
import sys

r = dict(line.rstrip("\n").split("\t", 1) for line in sys.stdin if "\t" in line)


def num(k):
    try:
        return float(r[k])
    except (KeyError, ValueError):
        return None


def run_part(p):
    return {
        "events_per_s": num(f"{p}_eps"),
        "seconds": num(f"{p}_s"),
        "wall_s": num(f"{p}_wall_s"),
        "peak_rss_mib": num(f"{p}_rss_mib"),
        "tally": r.get(f"{p}_tally"),
    }


res = {
    "events": int(r["events"]),
    "topic": r["topic"],
    "schema": r["schema"],
    "commit": r["commit"],
    "cpus": os.cpu_count(),
    "first_pass": run_part("first"),
    "replay": dict(
        run_part("replay"),
        aggregate_rows_written=int(r["replay_aggregate_rows_written"]),
        aggregate_rows_differing=int(r["replay_aggregate_rows_differing"]),
    ),
    "baseline": {"events_per_s": num("baseline_eps"), "events": int(r["baseline_events"])},
    "ceiling": {"events_per_s": num("ceiling_eps"), "seconds": num("ceiling_s")},
    "file": run_part("file"),
    "backfill": run_part("backfill"),
    "ledger_bytes_per_event": num("ledger_bytes_per_event"),
}
first = res["first_pass"]["events_per_s"]
base = res["baseline"]["events_per_s"]
ceil = res["ceiling"]["events_per_s"]
replay = res["replay"]
res["ratios"] = {
    "first_over_baseline": first / base,
    "first_over_ceiling": first / ceil,
    "replay_over_first": replay["events_per_s"] / first,
    "file_over_first": res["file"]["events_per_s"] / first,
    "backfill_over_first": res["backfill"]["events_per_s"] / first,
}
target = min(100000.0, 0.5 * ceil)
peak = max(res[p]["peak_rss_mib"] for p in ("first_pass", "replay", "file", "backfill"))
# The first-pass target: min(100,000 events/s, 0.5 x the ceiling measured in the same run).
res["first_pass_target_events_per_s"] = target
res["targets"] = {
    "first pass >= min(100k/s, 0.5x ceiling)": first >= target,
    "first pass >= 30x baseline": first / base >= 30,
    "replay >= 1.5x first pass": res["ratios"]["replay_over_first"] >= 1.5,
    "peak RSS < 200 MiB": peak < 200,
    "load >= run": res["ratios"]["file_over_first"] >= 1.0,
    "backfill >= run": res["ratios"]["backfill_over_first"] >= 1.0,
    "replay changed 0 aggregate rows": replay["aggregate_rows_written"] == 0 and replay["aggregate_rows_differing"] == 0,
}
out = sys.argv[1]
with open(out, "w") as f:
    json.dump(res, f, indent=2)
    f.write("\n")


def mib(v):
    return f"{v:.1f} MiB" if v is not None else ""


print(f"\nreplaysafe benchmark: {res['events']:,} events, 8 partitions, commit {res['commit']}, {res['cpus']} CPUs -> {out}\n")
print(f"{'measurement':<44} {'events/s':>10} {'peak RSS':>10}  note")
rows = [
    ("1. replaysafe run, first pass", first, mib(res["first_pass"]["peak_rss_mib"]), res["first_pass"]["tally"]),
    (
        "2. replay, fresh group (all duplicates)",
        replay["events_per_s"],
        mib(replay["peak_rss_mib"]),
        f"aggregate rows written {replay['aggregate_rows_written']}, differing {replay['aggregate_rows_differing']}",
    ),
    ("3. baseline: 1 transaction per event", base, "", f"Python confluent-kafka + psycopg, first {res['baseline']['events']:,} events"),
    ("4. ceiling: COPY + INSERT…SELECT GROUP BY", ceil, "", "PostgreSQL alone (event_id, day, customer_id → daily_counts)"),
    ("5. replaysafe load, kcat file (no broker)", res["file"]["events_per_s"], mib(res["file"]["peak_rss_mib"]), res["file"]["tally"]),
    ("6. replaysafe backfill, whole topic", res["backfill"]["events_per_s"], mib(res["backfill"]["peak_rss_mib"]), res["backfill"]["tally"]),
]
for name, eps, rss, note in rows:
    print(f"{name:<44} {eps:>10,.0f} {rss:>10}  {note}")
ra = res["ratios"]
print(
    f"\nreplaysafe/baseline {ra['first_over_baseline']:.1f}x   replaysafe/ceiling {ra['first_over_ceiling']:.2f}   "
    f"replay/first {ra['replay_over_first']:.2f}   ledger bytes/event {res['ledger_bytes_per_event']}"
)
print(
    f"same records, one engine: run {first:,.0f}   load {res['file']['events_per_s']:,.0f}   "
    f"backfill {res['backfill']['events_per_s']:,.0f} events/s   (load/run {ra['file_over_first']:.2f}, "
    f"backfill/run {ra['backfill_over_first']:.2f})"
)
print(f"first-pass target: {target:,.0f} events/s (min of 100,000 and 0.5 x ceiling)")
print("targets: " + ", ".join(f"{k}: {'ok' if v else 'MISSED'}" for k, v in res["targets"].items()))
