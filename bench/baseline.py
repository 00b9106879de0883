#!/usr/bin/env python3
"""The baseline users write today (the seed's consumer), for scripts/bench.

One PostgreSQL transaction per event: a single statement whose CTE claims the event in a ledger with
`INSERT ... ON CONFLICT DO NOTHING RETURNING` and feeds the counter upsert (daily_counts) and the sum upsert
(daily_totals) from the rows it returned; COMMIT; then the Kafka offset is committed synchronously.

usage: baseline.py BROKERS TOPIC GROUP DATABASE_URL SCHEMA LIMIT
Consumes LIMIT events (from the start of every partition) and prints one JSON object: events, seconds (from
the first record to the last offset commit), events_per_s.
"""

import json
import sys
import time

import psycopg
from confluent_kafka import Consumer, KafkaException

brokers, topic, group, url, schema, limit = sys.argv[1:7]
limit = int(limit)

DDL = f"""
DROP SCHEMA IF EXISTS "{schema}" CASCADE;
CREATE SCHEMA "{schema}";
CREATE TABLE "{schema}".ledger (event_id uuid NOT NULL, day date NOT NULL, customer_id text NOT NULL,
    amount numeric, PRIMARY KEY (event_id, day));
CREATE TABLE "{schema}".daily_counts (day date NOT NULL, customer_id text NOT NULL, n bigint NOT NULL,
    PRIMARY KEY (day, customer_id));
CREATE TABLE "{schema}".daily_totals (day date NOT NULL, customer_id text NOT NULL, total numeric NOT NULL,
    PRIMARY KEY (day, customer_id));
"""

STMT = f"""
WITH claimed AS (
    INSERT INTO "{schema}".ledger (event_id, day, customer_id, amount)
    VALUES (%s, (%s::timestamptz AT TIME ZONE 'UTC')::date, %s, %s)
    ON CONFLICT DO NOTHING
    RETURNING day, customer_id, amount
), counts AS (
    INSERT INTO "{schema}".daily_counts (day, customer_id, n)
    SELECT day, customer_id, 1 FROM claimed
    ON CONFLICT (day, customer_id) DO UPDATE SET n = daily_counts.n + 1
)
INSERT INTO "{schema}".daily_totals (day, customer_id, total)
SELECT day, customer_id, amount FROM claimed
ON CONFLICT (day, customer_id) DO UPDATE SET total = daily_totals.total + EXCLUDED.total
"""

conn = psycopg.connect(url)
with conn.cursor() as cur:
    cur.execute(DDL)
conn.commit()

consumer = Consumer(
    {
        "bootstrap.servers": brokers,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
)
consumer.subscribe([topic])
done = 0
first = None
idle_since = time.monotonic()
try:
    with conn.cursor() as cur:
        while done < limit:
            msg = consumer.poll(1.0)
            if msg is None:
                if time.monotonic() - idle_since > 60:
                    raise SystemExit(f"baseline: no record for 60 s after {done} events")
                continue
            if msg.error():
                raise KafkaException(msg.error())
            idle_since = time.monotonic()
            if first is None:
                first = time.monotonic()
            e = json.loads(msg.value())
            cur.execute(STMT, (e["event_id"], e["occurred_at"], e["customer_id"], e["amount"]), prepare=True)
            conn.commit()
            consumer.commit(message=msg, asynchronous=False)
            done += 1
finally:
    consumer.close()
    conn.close()
secs = time.monotonic() - first
print(json.dumps({"events": done, "seconds": secs, "events_per_s": done / secs}))
