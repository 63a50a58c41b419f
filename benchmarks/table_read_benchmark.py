"""Reading a topic through its table: ``read_table`` against ``spark.read.parquet``, in one run.

Builds a topic of ``--rows`` rows of ``--dataset`` (bench_datasets.py) written
by a transactional producer in ``--syncs`` committed transactions, the table
synced after each (each sync timed: the first ten against the last ten, issue
35's sync-cost goal; with ``--upkeep-every N`` compacted and expired after
every Nth sync, the topic's partitions compacted before them, as ``txlog
maintain`` passes do) and compacted once at the
end, then a tail of ``--tail`` of the rows (a fraction) committed past the
newest snapshot.  Spark then writes the topic's records (read once
through ``format("txlog")``) as Parquet, and the two reads are timed into the
``noop`` sink, taking turns (spark_batch_benchmark.paired: a warm-up, then the
median of ``--runs``):

* ``txlog.spark.read_table``: Spark's Parquet scan of the table's files, and
  ``format("txlog")`` for the tail;
* ``spark.read.parquet`` of the same records written by Spark.

Issue 35's goal: read_table within 1.3x of spark.read.parquet on 10M rows
whose table was built by at least 1,000 syncs and then maintained, with a 1%
tail.  The script prints the figures, the table's files and the bytes of the
topic, the table and Spark's Parquet; it does not judge them.

Run: ``python benchmarks/table_read_benchmark.py [--rows N] [--syncs S] [--tail F]
[--runs K] [--dataset NAME] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from bench_datasets import DATASETS, dataset
from spark_batch_benchmark import paired, timed

from txlog import Log

TOPIC = "bench"
PARTITIONS = 4


def build(path: str, name: str, rows: int, syncs: int, tail: float, upkeep: int) -> int:
    """The topic and its table, synced after each of ``syncs`` transactions and then
    maintained (one compaction, as a ``txlog maintain`` pass after the last sync; with
    ``upkeep`` N, also the topic's and the table's compaction and the table's expiry after
    every Nth sync, untimed); returns
    the number of rows synced.  Prints each sync's cost early and late in the history."""
    from txlog.tables.expiry import expire_table
    from txlog.tables.sync import sync_table
    from txlog.tables.upkeep import compact_table

    log = Log(path)
    log.create_topic(TOPIC, partitions=PARTITIONS)
    records = dataset(name, rows)
    synced = rows - int(rows * tail)
    producer = log.producer(transactional_id="bench")
    producer.init_transactions()
    bounds = [synced * i // syncs for i in range(syncs + 1)] + [rows]
    started = time.perf_counter()
    costs = []
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if hi > lo:
            producer.begin_transaction()
            producer.send_table(TOPIC, records.slice(lo, hi - lo))
            producer.commit_transaction()
        if i < syncs:
            costs.append(timed(lambda: sync_table(log.services, TOPIC)))
            if upkeep and (i + 1) % upkeep == 0:
                log.compact(TOPIC)
                compact_table(log.services, TOPIC)
                expire_table(log.services, TOPIC)
    producer.close()
    print(f"built in {time.perf_counter() - started:.1f} s: {synced} rows in {syncs} syncs, "
          f"a tail of {rows - synced}")
    window = min(10, len(costs))
    early, late = statistics.median(costs[:window]), statistics.median(costs[-window:])
    print(f"one sync, median of syncs 1-{window}: {early * 1000:.1f} ms; of the last "
          f"{window} (history of {syncs}): {late * 1000:.1f} ms; ratio {late / early:.2f}")
    compacted = timed(lambda: compact_table(log.services, TOPIC))
    print(f"maintained: one compaction in {compacted:.1f} s")
    return synced


def _bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(top, n)) for top, _, names in os.walk(path)
               for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--syncs", type=int, default=100)
    parser.add_argument("--tail", type=float, default=0.01, help="the fraction past the table")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dataset", choices=DATASETS, default="events")
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    parser.add_argument("--upkeep-every", type=int, default=0, metavar="N",
                        help="compact the topic, then compact and expire the table, after every Nth sync "
                        "(0: never)")
    args = parser.parse_args()

    from txlog.spark import read_table
    from txlog.spark.session import spark_session
    from txlog.tables.sync import describe_table

    scratch = args.dir or tempfile.mkdtemp(prefix="txlog-table-bench-")
    log_path, parquet_path = os.path.join(scratch, "log"), os.path.join(scratch, "parquet")
    build(log_path, args.dataset, args.rows, args.syncs, args.tail, args.upkeep_every)
    described = describe_table(Log(log_path).services, TOPIC)
    spark = spark_session("txlog-table-benchmark", master="local[2]")
    spark.read.format("txlog").option("path", log_path).option("subscribe", TOPIC).load() \
        .write.parquet(parquet_path)
    table_bytes = _bytes(os.path.join(log_path, "tables"))
    topic_bytes = _bytes(log_path) - table_bytes  # the root's objects besides the table's
    print(f"{args.rows} rows of {args.dataset}, local[2]; scratch {scratch}")
    named = sum(os.path.getsize(f.removeprefix("file://")) for f in described.files)
    print(f"table: {len(described.files)} data files, {described.records} records\n"
          f"{'bytes, topic':>34}: {topic_bytes:>13,}\n{'table (all files)':>34}: "
          f"{table_bytes:>13,}\n{'data files the snapshot names':>34}: {named:>13,}\n"
          f"{'parquet written by Spark':>34}: {_bytes(parquet_path):>13,}\n")

    def through_table() -> None:
        read_table(spark, log_path, TOPIC).write.format("noop").mode("overwrite").save()

    def parquet() -> None:
        spark.read.parquet(parquet_path).write.format("noop").mode("overwrite").save()

    paired("read_table", through_table, "spark.read.parquet", parquet, args.runs)
    spark.stop()
    if not args.dir:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
