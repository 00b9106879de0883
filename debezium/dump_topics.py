#!/usr/bin/env python3
"""Dump Kafka topics as JSON lines: {"topic","partition","offset","key","value"} with key/value parsed as JSON
(null for a null key/value; a string when it is not JSON).

Usage: dump_topics.py BROKERS TOPIC_OR_PREFIX... [--prefix] [--idle SECONDS]
  With --prefix every topic whose name starts with one of the arguments is dumped (sorted by name).
  Reads each partition from the beginning to its high watermark as of the start, in offset order.
Needs the PyPI confluent-kafka wheel (python3 -m venv .connect/venv && .connect/venv/bin/pip install confluent-kafka).
"""
import json
import sys

from confluent_kafka import Consumer, TopicPartition


def parse(b):
    if b is None:
        return None
    s = b.decode("utf-8")
    try:
        return json.loads(s)
    except ValueError:
        return s


def main(argv):
    prefix = "--prefix" in argv
    args = [a for a in argv if a != "--prefix"]
    brokers, names = args[0], args[1:]
    c = Consumer({"bootstrap.servers": brokers, "group.id": "dump-topics", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    md = c.list_topics(timeout=10)
    if prefix:
        topics = sorted(t for t in md.topics if any(t.startswith(p) for p in names))
    else:
        topics = names
    for t in topics:
        for p in sorted(md.topics[t].partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
            if hi <= lo:
                continue
            c.assign([TopicPartition(t, p, lo)])
            while True:
                m = c.poll(10)
                if m is None:
                    raise SystemExit(f"timed out reading {t}[{p}] at {lo}..{hi}")
                if m.error():
                    raise SystemExit(str(m.error()))
                print(json.dumps({"topic": t, "partition": p, "offset": m.offset(),
                                  "key": parse(m.key()), "value": parse(m.value())},
                                 separators=(",", ":")))
                if m.offset() + 1 >= hi:
                    break
    c.close()


if __name__ == "__main__":
    main(sys.argv[1:])
