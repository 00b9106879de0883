"""Writes cdc.jsonl: Debezium change events (schemaless JSON converter) of public.accounts as kcat -J lines —
creates, updates, deletes and re-creates of N accounts on 3 partitions keyed by id, ~5% re-sent after a
connector restart (same source position, later offset).
usage: python3 gen_cdc.py CHANGES SEED > cdc.jsonl"""
import json, random, sys
n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
rnd = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 11)
offsets = [0, 0, 0]
live = {}
lsn = 1000
sent = []
base_ms = 1795996800000 - 6 * 86400000
def emit(key, value, part, ts):
    print(json.dumps({"topic": "app.public.accounts", "partition": part, "offset": offsets[part], "tstype": "create",
                      "ts": ts, "broker": 1, "key": key, "payload": value}))
    offsets[part] += 1
for i in range(n):
    lsn += rnd.randint(40, 400)
    ident = rnd.randint(1, 30)
    if ident in live and rnd.random() < 0.12:
        op, before, after = "d", live.pop(ident), None
    elif ident in live:
        op, before = "u", None
        after = dict(live[ident], balance="%d.%02d" % (rnd.randint(0, 9999), rnd.randint(0, 99)),
                     updated_at=base_ms + lsn)
        live[ident] = after
    else:
        op, before = "c", None
        after = {"id": ident, "owner": rnd.choice(["ada", "bob", "cyd", "dee"]), "balance": "0.00",
                 "updated_at": base_ms + lsn}
        live[ident] = after
    ts = base_ms + lsn
    value = json.dumps({"before": before, "after": after, "op": op, "ts_ms": ts,
                        "source": {"connector": "postgresql", "name": "app", "db": "app", "schema": "public",
                                   "table": "accounts", "snapshot": "false", "txId": lsn // 10, "lsn": lsn,
                                   "ts_ms": ts, "sequence": json.dumps([str(lsn - 36), str(lsn)])}})
    key = json.dumps({"id": ident})
    part = ident % 3
    emit(key, value, part, ts)
    sent.append((key, value, part, ts))
    if rnd.random() < 0.05:
        emit(*rnd.choice(sent[-5:]))
