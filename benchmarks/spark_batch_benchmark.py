"""Spark batch benchmark: txlog's source and sink against Parquet's, in one run.

One SparkSession (local[2]) and one cached DataFrame of ``--rows`` rows of
``--dataset`` (bench_datasets.py: ``events`` by default, ``incompressible``, or
``hex``, the 8-byte keys and 100-byte values of earlier runs).  Each figure is the median of ``--runs``
timed runs after a warm-up, the two sides of a comparison taking turns, so
that drift of this shared machine hits both alike:

* write: txlog exactly_once vs ``df.write.parquet``;
* write: txlog exactly_once vs txlog at_least_once (the cost of the job's
  transaction);
* read: txlog vs ``spark.read.parquet``, each into the ``noop`` sink;
* read: read_committed vs read_uncommitted on a log where 10% of the
  records belong to aborted transactions;
* the floor of PySpark's Python data source API itself: txlog's write vs a
  Python writer that drops its Arrow batches, and txlog's read vs a Python
  reader that yields the same columns from memory.  What txlog adds is the
  distance to these; the rest is the cost of moving Arrow batches between
  the JVM and Python workers, which no Python source avoids.

Goals (issue 6): exactly-once write at least as fast as Parquet's (ratio <= 1),
at most 3% over at-least-once, read within 1.25x of Parquet's, read_committed
within 5% of read_uncommitted.  The script prints the figures and ratios; it
does not judge them.

Bytes stored by the log and by Parquet, each written once with its defaults, are printed
beside the read figures.

Run: ``python benchmarks/spark_batch_benchmark.py [--rows N] [--runs K] [--dataset NAME]
[--pairs NAME ...]``; ``--pairs`` runs only the pairs named (default: all of PAIRS).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import bench_datasets
from bench_datasets import DATASETS, dataset

from txlog import Log

PARTITIONS = 4
# The pairs, in the order they run: exactly-once write against Parquet's and against
# at-least-once, read against Parquet's, read_committed against read_uncommitted, and
# write and read against the Python data source floors.
PAIRS = ("write", "at-least-once", "read", "aborted", "floor-write", "floor-read")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired(name_a: str, a: Callable[[], object], name_b: str, b: Callable[[], object],
           runs: int) -> tuple[float, float]:
    a()
    b()  # warm-up: JIT, page cache, Python workers
    ta, tb = [], []
    for _ in range(runs):
        ta.append(timed(a))
        tb.append(timed(b))
    ma, mb = statistics.median(ta), statistics.median(tb)
    ratios = sorted(x / y for x, y in zip(ta, tb, strict=True))
    print(f"{name_a:>34}: median {ma:7.3f} s  (min {min(ta):.3f}, max {max(ta):.3f})")
    print(f"{name_b:>34}: median {mb:7.3f} s  (min {min(tb):.3f}, max {max(tb):.3f})")
    print(f"{'ratio':>34}: median {statistics.median(ratios):7.3f}  "
          f"(min {ratios[0]:.3f}, max {ratios[-1]:.3f})\n")
    return ma, mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    parser.add_argument("--dataset", choices=DATASETS, default="events")
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=PAIRS)
    parser.add_argument("--driver-memory", default="6g",
                        help="the driver JVM's heap, which caches the rows (default 6g)")
    args = parser.parse_args()
    pairs = set(args.pairs)

    from pyspark import cloudpickle

    from txlog.spark.session import spark_session

    # The floor reader builds the dataset's rows in the workers, where benchmarks/ is not
    # on the path: the generators travel with it.
    cloudpickle.register_pickle_by_value(bench_datasets)
    # The cached rows live in the driver's JVM (local mode): 1M incompressible rows are
    # 1 GB, beyond Spark's default heap of 1 GiB.
    spark = spark_session("txlog-batch-benchmark", master="local[2]",
                          **{"spark.driver.memory": args.driver_memory})
    scratch = args.dir or tempfile.mkdtemp(prefix="txlog-bench-")
    os.makedirs(scratch, exist_ok=True)
    df = _dataframe(spark, args.dataset, args.rows).cache()
    df.count()
    print(f"{args.rows} rows of {args.dataset}, local[2]; scratch {scratch}\n")

    counter = iter(range(1_000_000))

    def fresh(kind: str) -> str:
        path = os.path.join(scratch, f"{kind}-{next(counter)}")
        if kind == "txlog":
            Log(path).create_topic("bench", partitions=PARTITIONS)
        return path

    def txlog_write(guarantee: str) -> Callable[[], object]:
        def run() -> None:
            df.write.format("txlog").mode("append").option("path", fresh("txlog")) \
                .option("topic", "bench").option("deliveryGuarantee", guarantee).save()
        return run

    def parquet_write() -> None:
        df.write.parquet(fresh("parquet"))

    print("== write ==")
    if "write" in pairs:
        paired("txlog exactly_once", txlog_write("exactly_once"), "parquet", parquet_write,
               args.runs)
    if "at-least-once" in pairs:
        paired("txlog exactly_once", txlog_write("exactly_once"), "txlog at_least_once",
               txlog_write("at_least_once"), args.runs)

    print("== read (into noop) ==")
    log_path = fresh("txlog")
    df.write.format("txlog").mode("append").option("path", log_path).option("topic", "bench") \
        .save()
    parquet_path = fresh("parquet")
    df.write.parquet(parquet_path)

    def txlog_read(path: str, isolation: str) -> Callable[[], object]:
        def run() -> None:
            spark.read.format("txlog").option("path", path).option("subscribe", "bench") \
                .option("isolation.level", isolation).load() \
                .write.format("noop").mode("overwrite").save()
        return run

    def parquet_read() -> None:
        spark.read.parquet(parquet_path).write.format("noop").mode("overwrite").save()

    txlog_bytes, parquet_bytes = _stored_bytes(log_path), _stored_bytes(parquet_path)
    print(f"{'bytes stored, txlog':>34}: {txlog_bytes:>13,}\n{'parquet':>34}: {parquet_bytes:>13,}"
          f"\n{'ratio':>34}: {txlog_bytes / parquet_bytes:7.3f}\n")
    if "read" in pairs:
        paired("txlog read_committed", txlog_read(log_path, "read_committed"), "parquet",
               parquet_read, args.runs)
    if "aborted" in pairs:
        _aborted_pair(df, args.rows, fresh("txlog"), txlog_read, args.runs)

    print("== against the Python data source floor ==")
    spark.dataSource.register(_FloorSource)
    if "floor-write" in pairs:
        paired("txlog exactly_once write", txlog_write("exactly_once"), "dropping Python writer",
               lambda: df.write.format("floor").mode("append").save(), args.runs)
    rows_per_partition = args.rows // PARTITIONS
    if "floor-read" in pairs:
        paired("txlog read_committed", txlog_read(log_path, "read_committed"),
               "in-memory Python reader",
               lambda: spark.read.format("floor").option("rows", rows_per_partition)
               .option("dataset", args.dataset).load()
               .write.format("noop").mode("overwrite").save(), args.runs)
    spark.stop()
    if not args.dir:
        shutil.rmtree(scratch, ignore_errors=True)


def _aborted_pair(df: object, rows: int, mixed: str,
                  txlog_read: Callable[[str, str], Callable[[], object]], runs: int) -> None:
    print("== read_committed vs read_uncommitted, 10% aborted ==")
    # Aborted records between committed ones: a committed job, an aborted one
    # (a ninth of the rows, so 10% of the total), another committed job.
    half = df.limit(rows // 2)  # type: ignore[attr-defined]
    half.write.format("txlog").mode("append").option("path", mixed).option("topic", "bench") \
        .save()
    _write_aborted(df.limit(rows // 9), mixed)  # type: ignore[attr-defined]
    half.write.format("txlog").mode("append").option("path", mixed).option("topic", "bench") \
        .save()
    paired("read_committed", txlog_read(mixed, "read_committed"), "read_uncommitted",
           txlog_read(mixed, "read_uncommitted"), runs)


def _dataframe(spark: object, name: str, rows: int) -> object:
    """The rows to write, in two Spark partitions: ``hex`` built by Spark itself as in
    earlier runs, the other datasets generated in the Python workers, half the rows each
    (seeds 0 and 1).  A driver-side ``createDataFrame`` of the whole table ran the
    driver's JVM out of heap at 1M rows of ``incompressible`` (1 GB)."""
    from pyspark.sql import functions as F

    if name == "hex":
        return spark.range(rows, numPartitions=2).select(  # type: ignore[attr-defined]
            F.unhex(F.lpad(F.hex("id"), 16, "0")).alias("key"),
            F.unhex(F.concat(F.lpad(F.hex("id"), 16, "0"), F.repeat(F.lit("ab"), 92)))
            .alias("value"))
    halves = (rows - rows // 2, rows // 2)

    def generate(batches):  # one per Spark partition: the ids 0 and 1 are the seeds
        for batch in batches:
            for seed in batch.column("id").to_pylist():
                table = dataset(name, halves[seed], seed=seed).select(["key", "value"])
                yield from table.to_batches(max_chunksize=1 << 16)

    return spark.range(2, numPartitions=2).mapInArrow(  # type: ignore[attr-defined]
        generate, "key binary, value binary")


def _stored_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(top, name))
               for top, _, names in os.walk(path) for name in names)


def _write_aborted(df: object, path: str) -> None:
    """Write ``df`` in a job whose transaction is aborted (as a failed job's would be)."""
    from txlog.exactly_once.shared_transaction import SharedTransaction

    log = Log(path)
    job = SharedTransaction.start(log, "bench-aborted", 900_000)
    table = df.toArrow()  # type: ignore[attr-defined]
    producer = job.join(log, "0")
    producer.send_table("bench", table)
    job.abort(log, [producer.prepare_transaction()])


def _floor_classes() -> type:
    """A Python data source doing no work of its own (defined here, pickled by value)."""
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                        InputPartition, WriterCommitMessage)

    from txlog.spark.reader import spark_schema

    class Reader(DataSourceReader):
        def __init__(self, rows: int, name: str) -> None:
            self.rows, self.name = rows, name

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(p) for p in range(PARTITIONS)]

        def read(self, partition: InputPartition):  # the columns of a txlog read
            import numpy as np
            import pyarrow as pa

            n = self.rows
            rows = dataset(self.name, n, seed=partition.value)
            table = pa.table({
                "key": rows.column("key"), "value": rows.column("value"),
                "topic": pa.array(["bench"] * n),
                "partition": pa.array(np.full(n, partition.value, np.int32)),
                "offset": pa.array(np.arange(n, dtype=np.int64)),
                "timestamp": pa.array(np.zeros(n, np.int64)).cast(pa.timestamp("us", "UTC")),
                "timestampType": pa.array(np.zeros(n, np.int32))})
            yield from table.to_batches(max_chunksize=1 << 16)

    class Writer(DataSourceArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "floor"

        def schema(self):
            return spark_schema(False)

        def reader(self, schema):
            return Reader(int(self.options["rows"]), self.options["dataset"])

        def writer(self, schema, overwrite):
            return Writer()

    return FloorSource


_FloorSource = _floor_classes()


if __name__ == "__main__":
    main()
