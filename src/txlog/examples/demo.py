"""Demo pipeline on a local log directory: produce, transform exactly once, consume.

1. Several idempotent producers write order events to ``orders`` (4 partitions).
2. A consume-transform-produce loop reads ``orders`` with read_committed and
   writes per-customer totals to ``totals`` in transactions that also commit
   the consumer group's offsets; every third transaction is aborted and redone,
   so aborted output exists in the log but is never visible.
3. A read_committed consumer reads ``totals`` and checks that each order was
   counted exactly once.

Run: ``python -m txlog.examples.demo [LOG_DIR]`` (a temporary directory by default).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter

from txlog import Log

ORDERS, TOTALS, GROUP = "orders", "totals", "totals-builder"


def produce_orders(log: Log, count: int) -> int:
    producers = [log.producer(linger_ms=50) for _ in range(3)]
    for i in range(count):
        customer = f"c{i % 17}"
        order = {"order": i, "customer": customer, "amount": i % 100}
        producers[i % 3].send(ORDERS, json.dumps(order).encode(), key=customer.encode())
    for p in producers:
        p.close()
    return count


def transform(log: Log, chunk: int) -> tuple[int, int]:
    """Consume orders, write totals per chunk in a transaction with the offsets."""
    consumer = log.consumer(group_id=GROUP, auto_offset_reset="earliest")
    partitions = [(ORDERS, p) for p in range(log.describe_topic(ORDERS).partitions)]
    consumer.assign(partitions)
    producer = log.producer(transactional_id="totals-builder-0")
    producer.init_transactions()
    committed = aborted = 0
    attempt = 0
    while True:
        start = {tp: consumer.position(*tp) for tp in partitions}
        records = consumer.poll(chunk)
        if not records:
            break
        attempt += 1
        producer.begin_transaction()
        sums: Counter[str] = Counter()
        for r in records:
            assert r.value is not None  # produce_orders gives every order a value
            order = json.loads(r.value)
            sums[order["customer"]] += 1
        for customer, n in sorted(sums.items()):
            producer.send(TOTALS, json.dumps({"customer": customer, "orders": n}).encode(),
                          key=customer.encode())
        if attempt % 3 == 0:
            producer.abort_transaction()  # simulate a failure: output and offsets discarded
            aborted += 1
            for tp, offset in start.items():
                consumer.seek(*tp, offset)
            continue
        producer.send_offsets_to_transaction(
            {tp: consumer.position(*tp) for tp in partitions}, GROUP)
        producer.commit_transaction()
        committed += 1
    producer.close()
    return committed, aborted


def check(log: Log, expected: int) -> dict[str, int]:
    consumer = log.consumer(auto_offset_reset="earliest")
    consumer.assign([(TOTALS, p) for p in range(log.describe_topic(TOTALS).partitions)])
    counted: Counter[str] = Counter()
    while batch := consumer.poll(10_000):
        for r in batch:
            assert r.value is not None  # every total has a value
            row = json.loads(r.value)
            counted[row["customer"]] += row["orders"]
    total = sum(counted.values())
    if total != expected:
        raise SystemExit(f"FAILED: {total} orders counted, {expected} produced")
    return dict(counted)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", nargs="?", help="log directory (default: a new temp dir)")
    parser.add_argument("--orders", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=2_000)
    args = parser.parse_args(argv)
    root = args.log_dir or tempfile.mkdtemp(prefix="txlog-demo-")
    log = Log(root)
    for topic in (ORDERS, TOTALS):
        if topic not in log.topics():
            log.create_topic(topic, partitions=4)
    t0 = time.perf_counter()
    before = sum(log.read(ORDERS, p, isolation_level="read_uncommitted").num_rows
                 for p in range(4))
    produced = produce_orders(log, args.orders)
    committed, aborted = transform(log, args.chunk)
    counted = check(log, before + produced)
    elapsed = time.perf_counter() - t0
    print(f"log: {root}")
    print(f"orders produced: {produced} (log now holds {before + produced})")
    print(f"transactions: {committed} committed, {aborted} aborted")
    print(f"group {GROUP!r} offsets: "
          f"{dict(sorted((f'{t}-{p}', o) for (t, p), o in log.committed(GROUP).items()))}")
    print(f"customers: {len(counted)}, orders counted exactly once: {sum(counted.values())}")
    for p in range(4):
        end, lso = log.end_offset(TOTALS, p), log.last_stable_offset(TOTALS, p)
        visible = log.read(TOTALS, p).num_rows
        print(f"  {TOTALS}-{p}: log end {end}, LSO {lso}, visible records {visible}")
    print(f"done in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
