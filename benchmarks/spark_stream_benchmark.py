"""Spark streaming benchmark: txlog -> txlog exactly once against Parquet files -> Parquet files.

One SparkSession (local[2]), the same ``--rows`` records (8-byte keys,
100-byte values) in a txlog topic of 4 partitions and in ``--batches``
Parquet files of equal size.  Both queries run the same projection with
Trigger.AvailableNow and the same micro-batch size (``maxOffsetsPerTrigger``
= rows / batches against ``maxFilesPerTrigger`` = 1), into a txlog topic
(exactly once, a transaction per micro-batch) and into a Parquet file sink.
They take turns over ``--runs`` runs, each on fresh output and checkpoint.
Printed: the sustained rate of each (records per second over the whole
query), their ratio, and the per-micro-batch latency (Spark's
``triggerExecution`` duration, p50 and p95), where each query's time went
(``addBatch``, the rest of its micro-batches, the time outside them), and the
CPU seconds each query used in the JVM and in the processes it started,
Python's among them (``cpu_seconds``; on a machine with two cores a query is
mostly CPU-bound, and CPU does not move with the disk's phases as wall time
does).  A third
query measures the floor of PySpark's Python streaming API itself: a Python
source yielding the columns the query writes (key, value) from memory into a
Python sink that drops them, same micro-batches.  txlog's source yields all
seven of Spark's Kafka columns (a Python source is not told which the query
uses); a floor yielding all seven measured the same (benchmarks/README.md).

Then the end-to-end latency of txlog -> txlog: a producer appends at a
steady ``--live-rate`` records per second for ``--live-seconds``, the query
runs with a processing-time trigger, and a watcher sees each sink record
become visible under read_committed; the latency of a record is that moment
minus its append time in the source (carried in the key).  p50 and p95.
The same for the floor: a Python source whose records arrive at the same
rate, into a sink that drops them; a record's latency is its micro-batch's
commit on the driver minus its arrival (after a short warm-up run).  Each
live query's micro-batches are printed beside it: how many, their records,
Spark's phases at the median.

Goal (issue 7): the txlog query's rate at least Parquet's (ratio >= 1).
The script prints the figures; it does not judge them.

txlog's bytecode is compiled before Spark starts (``cache_bytecode``), as a
user's install has it.  ``--no-bytecode-cache`` leaves that out: with txlog's
``__pycache__`` directories deleted first and PYTHONDONTWRITEBYTECODE set, as
in this workplace, every Python process compiles txlog again, as every run
before this option did.

Run: ``python benchmarks/spark_stream_benchmark.py [--rows N] [--runs K]
[--no-bytecode-cache]``.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import shutil
import statistics
import struct
import tempfile
import threading
import time
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from txlog import Log

PARTITIONS = 4


def source_table(first: int, n: int) -> pa.Table:
    """Records ``first`` to ``first + n``: big-endian 8-byte keys, 100-byte values."""
    keys = np.arange(first, first + n, dtype=">u8").tobytes()
    return pa.table({"key": fixed_width(keys, 8, n), "value": fixed_width(b"v" * (100 * n), 100, n)})


def fixed_width(data: bytes, width: int, n: int) -> pa.Array:
    offsets = np.arange(0, width * (n + 1), width, dtype=np.int32)
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()),
                                                        pa.py_buffer(data)])


def key_times(keys: pa.ChunkedArray) -> np.ndarray:
    """The append times (float seconds) carried in 8-byte keys."""
    arr = keys.combine_chunks()
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    return data.view(">f8").astype(float)


def floor_source(batches: int, per_batch: int):
    """The floor of PySpark's Python streaming API: a source that yields the key and value
    columns from memory and a sink that drops them, with the same micro-batches (no
    storage)."""
    from pyspark.sql.datasource import (DataSourceStreamArrowWriter, DataSourceStreamReader,
                                        InputPartition, WriterCommitMessage)
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class FloorReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def initialOffset(self):
            return {"batch": 0}

        def prepareForTriggerAvailableNow(self):
            pass

        def latestOffset(self, start, limit):
            return {"batch": min(start["batch"] + 1, batches)}

        def partitions(self, start, end):
            return [InputPartition(i) for i in range(PARTITIONS)] \
                if end["batch"] > start["batch"] else []

        def read(self, partition):
            n = per_batch // PARTITIONS
            table = source_table(partition.value * n, n)
            yield from table.to_batches()

    class FloorWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    return _stream_source("floor", FloorReader, FloorWriter)


def _stream_source(name: str, reader: type, writer: type) -> type:
    """A Python streaming data source ``name`` of key and value columns, read by
    ``reader()`` and written by ``writer()`` (the floors' reader and sink)."""
    from pyspark.sql.datasource import DataSource

    class Source(DataSource):
        @classmethod
        def name(cls):
            return name

        def schema(self):
            return "key binary, value binary"

        def streamReader(self, schema):
            return reader()

        def streamWriter(self, schema, overwrite):
            return writer()

    return Source


def floor_live_source(rate: int, t0: float, seconds: int, out_dir: str):
    """The end-to-end latency floor of PySpark's Python streaming API: a source whose
    records "arrive" at ``rate`` per second from ``t0`` (offset i at t0 + i / rate), a
    sink that drops them, and the driver's commit writing each record's latency (commit
    time minus arrival) to ``out_dir``: what txlog's live run measures, with no storage."""
    from pyspark.sql.datasource import (DataSourceStreamArrowWriter, DataSourceStreamReader,
                                        InputPartition, WriterCommitMessage)

    total = rate * seconds

    class Times(WriterCommitMessage):
        def __init__(self, times: np.ndarray) -> None:
            self.times = times

    class LiveReader(DataSourceStreamReader):
        def initialOffset(self):
            return {"n": 0}

        def latestOffset(self, start, limit):
            return {"n": max(min(int((time.time() - t0) * rate), total), 0)}

        def partitions(self, start, end):
            lo, hi = start["n"], end["n"]
            step = max(-(-(hi - lo) // PARTITIONS), 1)
            return [InputPartition((a, min(a + step, hi))) for a in range(lo, hi, step)]

        def read(self, partition):
            lo, hi = partition.value
            arrived = t0 + np.arange(lo, hi, dtype=np.float64) / rate
            yield pa.record_batch([fixed_width(arrived.astype(">f8").tobytes(), 8, hi - lo),
                                   fixed_width(b"x" * (100 * (hi - lo)), 100, hi - lo)],
                                  names=["key", "value"])

    class LiveWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):
            times = [key_times(pa.chunked_array([b.column("key")])) for b in iterator]
            return Times(np.concatenate(times) if times else np.zeros(0))

        def commit(self, messages, batchId):
            now = time.time()
            times = [m.times for m in messages if m is not None]
            if times:
                np.save(os.path.join(out_dir, f"batch-{batchId}.npy"), now - np.concatenate(times))

        def abort(self, messages, batchId):
            pass

    return _stream_source("floor-live", LiveReader, LiveWriter)


def floor_live_latency(spark, scratch: str, rate: int, seconds: int) -> None:
    """The same measurement as ``live_latency`` through the Python floor source and sink,
    after a short run of its own (its first micro-batch starts Python workers cold and
    takes seconds; txlog's live run comes after txlog's warm queries)."""
    for run, length in (("warm-up", 5), ("measured", seconds)):
        out_dir = os.path.join(scratch, f"floor-live-{run}")
        os.makedirs(out_dir)
        # The arrivals start once the query surely runs, so that none waits for its start.
        spark.dataSource.register(floor_live_source(rate, time.time() + 5.0, length, out_dir))
        query = spark.readStream.format("floor-live").load().writeStream \
            .format("floor-live").trigger(processingTime="0 seconds") \
            .option("checkpointLocation", os.path.join(scratch, f"ck-floor-live-{run}")).start()
        time.sleep(length + 7.0)  # the arrivals start 5 s from now and run for ``length``
        query.stop()
    print(f"floor's live query: {live_batches(query)}")
    latencies = np.concatenate([np.load(os.path.join(out_dir, name))
                                for name in os.listdir(out_dir)] or [np.zeros(0)]).tolist()
    print(f"floor of the Python streaming API, same rate: p50 {percentile(latencies, 50):.3f} s, "
          f"p95 {percentile(latencies, 95):.3f} s over {len(latencies)} records "
          "(commit time on the driver)")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def cache_bytecode() -> None:
    """Compile txlog's modules to their ``__pycache__`` beside the source, once.

    Spark starts Python processes that import txlog: a stream's source runs in a
    new one for each query.  A user's Python reads txlog's bytecode from a cache
    (pip compiles a wheel's modules as it installs them; an editable install's
    first import writes them), but where PYTHONDONTWRITEBYTECODE is set nothing
    writes it, and every such process compiles txlog's modules again: 0.1 to
    0.2 s on the development machine, which the floor's source, pickled by
    value with this script, never pays.  Python checks each cached file against
    its source, so an edited module is compiled again.
    """
    import txlog

    compileall.compile_dir(os.path.dirname(txlog.__file__), quiet=1)
    spec = importlib.util.find_spec("pyspark_txlog")
    if spec is not None and spec.origin is not None:
        compileall.compile_file(spec.origin, quiet=1)


def live_batches(query) -> str:
    """A live query's micro-batches with input: how many, their records and their
    phases at the median (what the end-to-end latency is made of)."""
    with_input = [p for p in query.recentProgress if p["numInputRows"] > 0]
    if not with_input:
        return "no micro-batch with input"

    phases = ", ".join(
        f"{phase} {statistics.median(batch_phase(query, phase)) * 1000:.0f} ms"
        for phase in ("triggerExecution", "addBatch", "walCommit", "commitOffsets"))
    records = statistics.median(p["numInputRows"] for p in with_input)
    return (f"{len(with_input)} micro-batches (of the last {len(query.recentProgress)} "
            f"Spark keeps), {records:,.0f} records each; medians: {phases}")


class Run(NamedTuple):
    """One query's run: its time, its micro-batches' latencies, and where its time went:
    the micro-batches' addBatch (tasks and the sink's commit), the rest of them (Spark's
    checkpoint, planning), and what lies outside them (starting the source's Python
    process, the end); and the CPU seconds it used (``cpu_seconds``: the JVM's own, then
    the processes the JVM started)."""

    elapsed: float
    batches: list[float]
    parts: tuple[float, float, float]
    cpu: tuple[float, float]


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by the JVM under this process, and by every process it
    started (Linux's ``/proc``).

    The second figure counts Spark's Python daemons and workers, a stream
    query's driver-side Python processes, and the shell commands Hadoop's
    local file system runs for the checkpoint (about a second per query of the
    Parquet stream, which starts no Python), whether they still run or have
    been reaped: the kernel adds a reaped child's time to its parent's.  It is
    not split further, because a query's source process exits with the query
    and is reaped during the next one.  CPU time, unlike wall time, does not
    move with the disk's phases, and it tells work apart from waiting on a
    busy machine.
    """
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, tuple[str, int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = (stat[stat.index("(") + 1:stat.rindex(")")],
                             int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))
    jvms = [pid for pid in children.get(os.getpid(), []) if times[pid][0] == "java"]
    if len(jvms) != 1:
        raise RuntimeError(f"expected Spark's JVM as this process's one java child, found {jvms}")
    jvm = jvms[0]
    started, todo = times[jvm][2], list(children.get(jvm, []))
    while todo:
        pid = todo.pop()
        started += times[pid][1] + times[pid][2]
        todo.extend(children.get(pid, []))
    return times[jvm][1] / tick, started / tick


def txlog_stream(spark, root: str, per_batch: int, out: str, prefix: str, checkpoint: str):
    """The txlog -> txlog query, topic ``in`` to ``out``, ``per_batch`` records a
    micro-batch, exactly once under ``prefix`` (the DataStreamWriter, not started)."""
    return spark.readStream.format("txlog").option("path", root) \
        .option("subscribe", "in").option("startingOffsets", "earliest") \
        .option("maxOffsetsPerTrigger", str(per_batch)).load() \
        .select("key", "value").writeStream.format("txlog").option("path", root) \
        .option("topic", out).option("transactional.id.prefix", prefix) \
        .option("checkpointLocation", checkpoint)


def batch_latencies(query) -> list[float]:
    return batch_phase(query, "triggerExecution")


def batch_phase(query, phase: str) -> list[float]:
    """Seconds each micro-batch with input spent in one of Spark's phases (``addBatch``:
    the tasks and the sink's commit; ``walCommit``, ``commitOffsets``: its checkpoint)."""
    return [p["durationMs"].get(phase, 0) / 1000 for p in query.recentProgress
            if p["numInputRows"] > 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--live-rate", type=int, default=20_000)
    parser.add_argument("--live-seconds", type=int, default=20)
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="do not compile txlog's bytecode first (cache_bytecode)")
    args = parser.parse_args()
    if not args.no_bytecode_cache:
        cache_bytecode()

    from pyspark.sql import functions as F

    from txlog.spark.session import spark_session

    spark = spark_session("txlog-stream-benchmark", master="local[2]")
    scratch = args.dir or tempfile.mkdtemp(prefix="txlog-stream-bench-")
    os.makedirs(scratch, exist_ok=True)
    root = os.path.join(scratch, "log")
    log = Log(root)
    log.create_topic("in", partitions=PARTITIONS)
    per_batch = args.rows // args.batches
    files = os.path.join(scratch, "parquet-in")
    os.makedirs(files)
    with log.producer() as producer:
        for b in range(args.batches):
            table = source_table(b * per_batch, per_batch)
            producer.send_table("in", table)
            pq.write_table(table, os.path.join(files, f"part-{b:05d}.parquet"))
    rows = per_batch * args.batches
    print(f"{rows} records, 8-byte keys, 100-byte values, {args.batches} micro-batches, "
          f"local[2]; scratch {scratch}\n")

    counter = iter(range(1_000_000))

    def txlog_query():
        n = next(counter)
        log.create_topic(f"out{n}", partitions=PARTITIONS)
        return txlog_stream(spark, root, per_batch, f"out{n}", f"bench{n}",
                            os.path.join(scratch, f"ck-txlog-{n}"))

    def parquet_query():
        n = next(counter)
        return spark.readStream.schema("key binary, value binary") \
            .option("maxFilesPerTrigger", 1).parquet(files).select("key", "value") \
            .writeStream.format("parquet").option("path", os.path.join(scratch, f"pq-{n}")) \
            .option("checkpointLocation", os.path.join(scratch, f"ck-pq-{n}"))

    def run(make) -> Run:
        cpu = cpu_seconds()
        start = time.perf_counter()
        query = make().trigger(availableNow=True).start()
        query.awaitTermination()
        elapsed = time.perf_counter() - start
        jvm, started = (after - before for after, before in zip(cpu_seconds(), cpu, strict=True))
        batches, added = batch_latencies(query), batch_phase(query, "addBatch")
        return Run(elapsed, batches, (sum(added), sum(batches) - sum(added),
                                      elapsed - sum(batches)), (jvm, started))

    spark.dataSource.register(floor_source(args.batches, per_batch))

    def floor_query():
        n = next(counter)
        return spark.readStream.format("floor").load().writeStream.format("floor") \
            .option("checkpointLocation", os.path.join(scratch, f"ck-floor-{n}"))

    queries = {"txlog": txlog_query, "parquet": parquet_query, "py-floor": floor_query}
    for make in queries.values():
        run(make)  # warm-up: JIT, page cache, Python workers
    results: dict[str, list[Run]] = {name: [] for name in queries}
    for _ in range(args.runs):
        for name, make in queries.items():
            results[name].append(run(make))
    rates = {}
    for name, runs in results.items():
        times = [r.elapsed for r in runs]
        lat = [x for r in runs for x in r.batches]
        rates[name] = rows / statistics.median(times)
        print(f"{name:>8}: median {statistics.median(times):6.2f} s for the query "
              f"(min {min(times):.2f}, max {max(times):.2f}), {rates[name]:,.0f} records/s; "
              f"micro-batch p50 {percentile(lat, 50):.3f} s, p95 {percentile(lat, 95):.3f} s")
    ratios = sorted(r2.elapsed / r1.elapsed for r1, r2 in
                    zip(results["txlog"], results["parquet"], strict=True))
    print(f"rate txlog / parquet: median {statistics.median(ratios):.3f} "
          f"(min {ratios[0]:.3f}, max {ratios[-1]:.3f})")
    floor = sorted(r2.elapsed / r1.elapsed for r1, r2 in
                   zip(results["txlog"], results["py-floor"], strict=True))
    print(f"rate txlog / Python data source floor: median {statistics.median(floor):.3f} "
          f"(min {floor[0]:.3f}, max {floor[-1]:.3f})")
    for name, runs in results.items():
        parts = [statistics.median(r.parts[i] for r in runs) for i in range(3)]
        print(f"{name:>8}: medians per query: addBatch {parts[0]:.2f} s, the rest of the "
              f"micro-batches {parts[1]:.2f} s, outside them {parts[2]:.2f} s")
    for name, runs in results.items():
        jvm, started = (statistics.median(r.cpu[i] for r in runs) for i in range(2))
        print(f"{name:>8}: CPU seconds per query (medians): the JVM {jvm:.2f}, the processes it "
              f"started (Python's among them) {started:.2f}")
    print()

    live_latency(spark, log, root, scratch, args.live_rate, args.live_seconds, F)
    floor_live_latency(spark, scratch, args.live_rate, args.live_seconds)
    spark.stop()
    if not args.dir:  # about 750 MB of logs, files and checkpoints otherwise stay behind
        shutil.rmtree(scratch, ignore_errors=True)


def live_latency(spark, log: Log, root: str, scratch: str, rate: int, seconds: int, F) -> None:
    """Append at ``rate`` records/s; time each record from its append to its sink commit."""
    log.create_topic("live", partitions=PARTITIONS)
    log.create_topic("live-out", partitions=PARTITIONS)
    query = spark.readStream.format("txlog").option("path", root).option("subscribe", "live") \
        .option("startingOffsets", "earliest").load() \
        .select(F.col("value").alias("value"),
                F.col("key")).writeStream.format("txlog").option("path", root) \
        .option("topic", "live-out").option("transactional.id.prefix", "live") \
        .option("checkpointLocation", os.path.join(scratch, "ck-live")) \
        .trigger(processingTime="0 seconds").start()
    stop = threading.Event()
    latencies: list[float] = []

    def watch() -> None:
        reader = Log(root)
        positions = [0] * PARTITIONS
        while not stop.is_set() or len(latencies) < sent[0]:
            now = time.time()
            for p in range(PARTITIONS):
                table = reader.read("live-out", p, start=positions[p])
                positions[p] += 0 if table.num_rows == 0 else \
                    table.column("offset")[-1].as_py() + 1 - positions[p]
                if table.num_rows:
                    latencies.extend((now - key_times(table.column("key"))).tolist())
            time.sleep(0.02)
            if stop.is_set() and time.time() - stopped[0] > 60:
                break

    sent, stopped = [0], [0.0]
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    producer = log.producer(linger_ms=5)
    tick = 0.05
    deadline = time.time() + seconds
    while time.time() < deadline:
        started = time.time()
        n = max(int(rate * tick), 1)
        keys = fixed_width(struct.pack(">d", started) * n, 8, n)
        producer.send_table("live", pa.table({"key": keys,
                                              "value": fixed_width(b"x" * (100 * n), 100, n)}))
        sent[0] += n
        time.sleep(max(tick - (time.time() - started), 0))
    producer.close()
    stopped[0] = time.time()
    stop.set()
    watcher.join()
    query.stop()
    print(f"txlog's live query: {live_batches(query)}")
    print(f"end to end (append -> visible in the sink, read_committed), {rate} records/s for "
          f"{seconds} s: p50 {percentile(latencies, 50):.3f} s, p95 "
          f"{percentile(latencies, 95):.3f} s over {len(latencies)} records "
          f"(watcher polls every 20 ms)")


if __name__ == "__main__":
    main()
