#!/usr/bin/env python3
"""bench/cdc.sh's report: reads `key<TAB>value` lines (the measurements) on stdin, writes the JSON result to
argv[1] and prints the table in scripts/bench's style."""

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


encodings = r["encodings"].split()
ceil = num("ceiling_eps")
res = {
    "events": int(r["events"]),
    "schema": r["schema"],
    "commit": r["commit"],
    "cpus": os.cpu_count(),
    "loadavg_at_end": r.get("load"),
    "run": {
        e: {
            "events_per_s": num(f"{e}_eps"),
            "seconds": num(f"{e}_s"),
            "peak_rss_mib": num(f"{e}_rss_mib"),
            "cpu_us_per_event": parse(r.get(f"{e}_cpu_us")),
            "tally": r.get(f"{e}_tally"),
            "checksum": r.get(f"{e}_checksum"),
            "over_ceiling": (num(f"{e}_eps") or 0) / ceil if ceil else None,
        }
        for e in encodings
    },
    "ceiling": {"events_per_s": ceil, "seconds": num("ceiling_s"), "checksum": r.get("ceiling_checksum"),
                "cpu_us_per_event": parse(r.get("ceiling_cpu_us")),
                "columns": r.get("ceiling_table_columns")},
    "peer": {"events_per_s": num("peer_eps"), "events_per_s_from_first_row": num("peer_eps_first"),
             "seconds": num("peer_s"), "note": r.get("peer_note"), "checksum": r.get("peer_checksum")},
    "version_guard": {"replaysafe": r.get("guard_replaysafe"), "peer_statement": r.get("guard_peer")},
}
sums = {e: res["run"][e]["checksum"] for e in encodings}
sums["ceiling"] = res["ceiling"]["checksum"]
if res["peer"]["checksum"] and res["peer"]["events_per_s"]:  # a failed or unfinished peer: its note says what it holds
    sums["peer"] = res["peer"]["checksum"]
res["same_final_state"] = len(set(sums.values())) == 1
res["targets"] = {f"{e} >= 0.5x ceiling": res["run"][e]["over_ceiling"] >= 0.5 for e in encodings}
res["targets"]["same final table state"] = res["same_final_state"]
if res["peer"]["events_per_s"]:
    res["targets"].update({f"{e} faster than the peer": res["run"][e]["events_per_s"] > res["peer"]["events_per_s"]
                           for e in encodings})
with open(sys.argv[1], "w") as f:
    json.dump(res, f, indent=2)
    f.write("\n")

names = {"json": "JSON schemaless", "json-schema": "JSON with schema", "avro": "Avro (registry)"}
print(f"\nCDC bench: {res['events']:,} Debezium envelopes of public.accounts ({res['events'] // 4:,} entities, "
      f"8 partitions), commit {res['commit']}, {res['cpus']} CPUs, load {res['loadavg_at_end']} -> {sys.argv[1]}\n")
print(f"{'measurement':<44} {'events/s':>10} {'peak RSS':>10} {HEADER}  note")
for i, e in enumerate(encodings):
    x = res["run"][e]
    print(f"{'7' + 'abc'[i] + '. replaysafe run, ' + names[e]:<44} {x['events_per_s']:>10,.0f} "
          f"{x['peak_rss_mib']:>6.1f} MiB {cells(x['cpu_us_per_event'])}  {x['tally']}")
print(f"{'7d. ceiling: COPY + INSERT…ON CONFLICT':<44} {ceil:>10,.0f} {'':>10} {cells(res['ceiling']['cpu_us_per_event'])}  "
      "PostgreSQL alone (DISTINCT ON (id) → accounts, same columns and key)")
peer = res["peer"]["events_per_s"]
print(f"{'7e. peer: Debezium JDBC sink (upsert)':<44} {(f'{peer:,.0f}' if peer else '—'):>10} {'':>10} {cells(None)}  "
      f"{res['peer']['note'] or ''}")
cpg = res["ceiling"]["cpu_us_per_event"]["postgres"]
if cpg:
    print("\nPostgreSQL µs/event against the ceiling's " + f"{cpg:.1f}: " + "   ".join(
        f"{names[e]} {res['run'][e]['cpu_us_per_event']['postgres'] / cpg:.2f}x" for e in encodings
        if res["run"][e]["cpu_us_per_event"]["postgres"] is not None))
print("\n" + "   ".join(f"{names[e]}/ceiling {res['run'][e]['over_ceiling']:.2f}" for e in encodings)
      + ("   " + "   ".join(f"{names[e]}/peer {res['run'][e]['events_per_s'] / peer:.2f}" for e in encodings)
         if peer else ""))
if peer and num("peer_eps_first"):
    print("   ".join(f"{names[e]}/peer-from-first-row {res['run'][e]['events_per_s'] / num('peer_eps_first'):.2f}"
                     for e in encodings) + "   (the peer's connector and task start-up excluded)")
print("final state (rows:md5 of id|owner|balance|updated_at): "
      + ", ".join(f"{k} {v}" for k, v in sums.items()))
print(f"version guard, older envelope replayed: replaysafe {res['version_guard']['replaysafe']}")
print(f"                                        peer       {res['version_guard']['peer_statement']}")
print("targets: " + ", ".join(f"{k}: {'ok' if v else 'MISSED'}" for k, v in res["targets"].items()))
