"""Spark batch pipeline: read a txlog topic, transform it, write another topic exactly once.

1. If the input topic ``orders`` is empty, a generator fills it with JSON
   orders (keyed by customer, some of them in an aborted transaction, which
   no read_committed reader may see).
2. Spark reads every committed order, keeps the paid ones and writes them,
   enriched, to ``paid-orders``, as one transaction over all its tasks.
3. The output is read back and checked: each paid order exactly once, each
   in the partition Kafka's partitioner gives its customer.

Run with spark-submit (``spark-submit src/txlog/examples/batch_pipeline.py DIR``)
or ``python -m txlog.examples.batch_pipeline DIR``.  Running it again on the
same directory writes the output a second time, in a second transaction: a
batch job has no memory of earlier runs (the streaming pipeline has).
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlog import Log
from txlog.clients.partitioner import partitions_for_keys

ORDERS, PAID = "orders", "paid-orders"
PARTITIONS = 4


def orders_table(first: int, count: int, customer: str | None = None) -> pa.Table:
    """``count`` JSON orders keyed by customer, built column-wise (no loop per order)."""
    ids = np.arange(first, first + count)

    def text(numbers: np.ndarray) -> pa.Array:
        return pa.array(numbers).cast(pa.string())

    customers = (pc.binary_join_element_wise("c", text(ids % 37), "") if customer is None
                 else pa.array(np.full(count, customer)))
    paid = pc.if_else(pa.array((ids % 3 != 0) | (customer is not None)), "true", "false")
    values = pc.binary_join_element_wise(
        '{"order": ', text(ids), ', "customer": "', customers, '", "amount": ', text(ids % 100),
        ', "paid": ', paid, "}", "")
    return pa.table({"key": customers, "value": values})


def generate(log: Log, count: int) -> int:
    """Fill ``orders`` unless it holds data; returns how many committed orders it holds."""
    if ORDERS not in log.topics():
        log.create_topic(ORDERS, partitions=PARTITIONS)
    if any(log.end_offset(ORDERS, p) for p in range(PARTITIONS)):
        return sum(log.read(ORDERS, p).num_rows for p in range(PARTITIONS))
    with log.producer() as producer:
        producer.send_table(ORDERS, orders_table(0, count))
    ghost = log.producer(transactional_id="orders-generator")
    ghost.init_transactions()
    ghost.begin_transaction()
    # Never committed: no read_committed reader may see these.
    ghost.send_table(ORDERS, orders_table(count, 100, customer="ghost"))
    ghost.abort_transaction()
    return count


def run(root: str, count: int) -> int:
    from pyspark.sql import functions as F

    from txlog.spark.session import spark_session

    log = Log(root)
    orders = generate(log, count)
    if PAID not in log.topics():
        log.create_topic(PAID, partitions=PARTITIONS)
    before = sum(log.read(PAID, p).num_rows for p in range(PARTITIONS))
    spark = spark_session("txlog-batch-pipeline")
    schema = "order long, customer string, amount int, paid boolean"
    source = spark.read.format("txlog").option("path", root).option("subscribe", ORDERS).load()
    parsed = source.select("key", F.from_json(F.col("value").cast("string"), schema).alias("o"))
    paid = parsed.where("o.paid").select(
        "key",
        F.to_json(F.struct("o.order", "o.customer", "o.amount",
                           (F.col("o.amount") * 1.2).alias("gross"))).alias("value"))
    expected = paid.count()
    paid.write.format("txlog").mode("append").option("path", root).option("topic", PAID) \
        .option("transactional.id.prefix", "paid-orders-job").save()
    out = spark.read.format("txlog").option("path", root).option("subscribe", PAID).load()
    written = out.count() - before
    distinct = out.select(F.get_json_object(F.col("value").cast("string"), "$.order")) \
        .distinct().count()
    ghosts = out.where(F.col("key") == F.lit(b"ghost")).count()
    placed = out.select("key", "partition").toArrow()
    misplaced = int(np.count_nonzero(
        partitions_for_keys(placed.column("key"), PARTITIONS)
        != placed.column("partition").to_numpy()))
    spark.stop()
    print(f"orders (committed): {orders}; paid: {expected}; written now: {written}; "
          f"distinct paid orders in {PAID}: {distinct}; aborted orders seen: {ghosts}; "
          f"outside their customer's partition: {misplaced}")
    ok = written == expected and distinct == expected and ghosts == 0 and misplaced == 0
    print("exactly once: OK" if ok else "exactly once: FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", help="log directory (default: a temporary one)")
    parser.add_argument("--orders", type=int, default=100_000, help="orders to generate")
    args = parser.parse_args(argv)
    root = args.root or tempfile.mkdtemp(prefix="txlog-batch-")
    return run(root, args.orders)


if __name__ == "__main__":
    sys.exit(main())
