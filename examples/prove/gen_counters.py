"""Writes counters.jsonl: N purchase/refund events (kcat -J lines) for 6 customers over 6 days on 3 partitions
keyed by customer, ~5% redelivered (the same event again later), one malformed record.
usage: python3 gen_counters.py N SEED [today] > counters.jsonl
(`today`: the six days before today, UTC — for pipelines with a short ledger horizon, e.g. examples/demo.toml)"""
import json, random, sys, uuid
n = int(sys.argv[1]) if len(sys.argv) > 1 else 240
rnd = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
customers = ["c-ada", "c-bob", "c-cyd", "c-dee", "c-eve", "c-fay"]
offsets = [0, 0, 0]
base = 1795996800  # 2026-11-30T00:00:00Z
if len(sys.argv) > 3 and sys.argv[3] == "today":
    import time
    base = int(time.time()) // 86400 * 86400
sent = []
def emit(key, payload, ts):
    p = customers.index(key) % 3 if key in customers else 0
    print(json.dumps({"topic": "shop.purchases", "partition": p, "offset": offsets[p], "tstype": "create",
                      "ts": ts * 1000, "broker": 1, "key": key, "payload": payload}))
    offsets[p] += 1
for i in range(n):
    c = rnd.choice(customers)
    refund = rnd.random() < 0.1
    cents = rnd.randint(100, 9000) * (-1 if refund else 1)
    ts = base - 6 * 86400 + (i * 6 * 86400) // n + rnd.randint(0, 600)
    ev = {"event_id": str(uuid.UUID(int=rnd.getrandbits(128))), "event_type": "refund" if refund else "purchase",
          "customer_id": c, "amount": "%d.%02d" % (abs(cents) // 100 * (1 if cents > 0 else -1), abs(cents) % 100),
          "occurred_at": __import__("datetime").datetime.fromtimestamp(ts, __import__("datetime").timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if cents < 0:
        ev["amount"] = "-%d.%02d" % (abs(cents) // 100, abs(cents) % 100)
    payload = json.dumps(ev)
    emit(c, payload, ts)
    sent.append((c, payload, ts))
    if rnd.random() < 0.05:
        emit(*rnd.choice(sent))
    if i == n // 2:
        emit("c-ada", '{"event_id": "truncated', ts)
