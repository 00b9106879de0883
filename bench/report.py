#!/usr/bin/env python3
"""scripts/bench's report: reads `key<TAB>value` lines (the measurements) on stdin, writes the JSON result to
argv[1] and prints the table."""

import json
import os
import sys

from cpu import HEADER, cells, parse

r = dict(line.rstrip("\n").split("\t", 1) for line in sys.stdin if "\t" in line)


def num(k):
    try:
        return float(r[k])
    except (KeyError, ValueError):
        return None


def cpu(p):
    return parse(r.get(f"{p}_cpu_us"))


def run_part(p):
    return {
        "events_per_s": num(f"{p}_eps"),
        "cpu_us_per_event": cpu(p),
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
    "baseline": {"events_per_s": num("baseline_eps"), "events": int(r["baseline_events"]), "cpu_us_per_event": cpu("baseline")},
    "ceiling": {
        "events_per_s": num("ceiling_eps"),
        "seconds": num("ceiling_s"),
        "day_partitions": num("ceiling_days"),
        "cpu_us_per_event": cpu("ceiling"),
    },
    "ceiling_one_aggregate": {"events_per_s": num("ceiling1_eps"), "seconds": num("ceiling1_s")},
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
ceil1 = res["ceiling_one_aggregate"]["events_per_s"]
res["ratios"]["first_over_ceiling_one_aggregate"] = first / ceil1 if ceil1 else None
peak = max(res[p]["peak_rss_mib"] for p in ("first_pass", "replay", "file", "backfill"))
ledger = res["ledger_bytes_per_event"]
# Issue 15's targets (ratios from this one run): (name, measured, target text, met).
TARGETS = [
    ("first/ceiling", res["ratios"]["first_over_ceiling"], ">= 0.7", res["ratios"]["first_over_ceiling"] >= 0.7),
    ("first/baseline", res["ratios"]["first_over_baseline"], ">= 100", res["ratios"]["first_over_baseline"] >= 100),
    ("replay/first", res["ratios"]["replay_over_first"], ">= 2", res["ratios"]["replay_over_first"] >= 2),
    ("load/first", res["ratios"]["file_over_first"], ">= 1", res["ratios"]["file_over_first"] >= 1),
    ("backfill/first", res["ratios"]["backfill_over_first"], ">= 1", res["ratios"]["backfill_over_first"] >= 1),
    ("peak RSS MiB", peak, "< 150", peak < 150),
    ("ledger bytes/event", ledger, "<= 100", ledger is not None and ledger <= 100),
    (
        "replay aggregate rows changed",
        replay["aggregate_rows_written"] + replay["aggregate_rows_differing"],
        "== 0",
        replay["aggregate_rows_written"] == 0 and replay["aggregate_rows_differing"] == 0,
    ),
]
res["targets"] = {f"{n} {t}": {"measured": v, "pass": ok} for n, v, t, ok in TARGETS}
out = sys.argv[1]
with open(out, "w") as f:
    json.dump(res, f, indent=2)
    f.write("\n")


def mib(v):
    return f"{v:.1f} MiB" if v is not None else ""


print(f"\nreplaysafe benchmark: {res['events']:,} events, 8 partitions, commit {res['commit']}, {res['cpus']} CPUs -> {out}\n")
print(f"{'measurement':<44} {'events/s':>10} {'peak RSS':>10} {HEADER}  note")
rows = [
    ("1. replaysafe run, first pass", first, mib(res["first_pass"]["peak_rss_mib"]), res["first_pass"]["tally"]),
    (
        "2. replay, fresh group (all duplicates)",
        replay["events_per_s"],
        mib(replay["peak_rss_mib"]),
        f"aggregate rows written {replay['aggregate_rows_written']}, differing {replay['aggregate_rows_differing']}",
    ),
    ("3. baseline: 1 transaction per event", base, "", f"Python confluent-kafka + psycopg, first {res['baseline']['events']:,} events"),
    (
        "4. ceiling: COPY + upsert per projection",
        ceil,
        "",
        f"PostgreSQL alone: day-partitioned ledger ({res['ceiling']['day_partitions'] or 0:.0f} days), count + sum ON CONFLICT",
    ),
    ("4b. old ceiling: one aggregate, unpartitioned", ceil1, "", "(event_id, day, customer_id) → daily_counts, plain INSERT"),
    ("5. replaysafe load, kcat file (no broker)", res["file"]["events_per_s"], mib(res["file"]["peak_rss_mib"]), res["file"]["tally"]),
    ("6. replaysafe backfill, whole topic", res["backfill"]["events_per_s"], mib(res["backfill"]["peak_rss_mib"]), res["backfill"]["tally"]),
]
parts = [res["first_pass"], replay, res["baseline"], res["ceiling"], {}, res["file"], res["backfill"]]


for (name, eps, rss, note), part in zip(rows, parts):
    cols = cells(part.get("cpu_us_per_event"))
    print(f"{name:<44} {eps:>10,.0f} {rss:>10} {cols}  {note}")
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
print(f"replaysafe/old one-aggregate ceiling {ra['first_over_ceiling_one_aggregate']:.2f}")
cpg = res["ceiling"]["cpu_us_per_event"]["postgres"]
if cpg:
    print("PostgreSQL µs/event against the ceiling's " + f"{cpg:.1f}: " + "   ".join(
        f"{n} {res[k]['cpu_us_per_event']['postgres'] / cpg:.2f}x" for n, k in
        (("first", "first_pass"), ("replay", "replay"), ("load", "file"), ("backfill", "backfill"))
        if res[k]["cpu_us_per_event"]["postgres"] is not None))
print(f"\n{'target':<34} {'measured':>10} {'wanted':>8}  result")
for n, v, t, ok in TARGETS:
    shown = "" if v is None else (f"{v:,.2f}" if isinstance(v, float) else f"{v:,}")
    print(f"{n:<34} {shown:>10} {t:>8}  {'PASS' if ok else 'FAIL'}")
