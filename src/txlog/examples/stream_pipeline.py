"""Spark streaming pipeline: txlog -> transform -> txlog, exactly once, checkpointed.

A generator writes readings to topic ``readings`` in transactions, some of
which it aborts.  A Structured Streaming query reads the committed ones,
converts each to an alert line, and writes it to ``alerts`` in the partition
its reading came from, one transaction per micro-batch, with the offsets it
read recorded in consumer group ``alerts-query`` in the same transaction.
When the input is drained, both topics are read back and compared: every
committed reading must have exactly one alert, in order within its
partition, and no aborted reading may have one.

Run it with spark-submit or ``python -m txlog.examples.stream_pipeline DIR``.
Killing it at any moment and running it again on the same directory (it
resumes from DIR/checkpoint) keeps that property; tests/harness/stream_kill_harness.py
does exactly that, with SIGKILL, many times over.

``--generate N`` feeds N readings while the query runs (the default); with
``--generate 0`` the query only processes what is there.  ``--forever``
keeps the query running until it is killed (the kill harness uses it);
otherwise the query stops once the input is drained and the check runs.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
import random
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlog import Log

SOURCE, SINK = "readings", "alerts"
PARTITIONS = 4
PREFIX = "alerts-query"  # the sink's transactional.id.prefix: stable across restarts
GROUP = "alerts-query"  # where the query's progress shows (txlog groups describe)


def readings(first: int, count: int) -> pa.Table:
    """``count`` readings ``sensor-<k>:<n>`` keyed by sensor, built column-wise."""
    ids = np.arange(first, first + count)
    sensors = pc.binary_join_element_wise("sensor-", pa.array(ids % 13).cast(pa.string()), "")
    values = pc.binary_join_element_wise(sensors, ":", pa.array(ids).cast(pa.string()), "")
    return pa.table({"key": sensors, "value": values})


def alert_of(values: pa.Array) -> pa.Array:
    """The transform, as the query applies it, for checking (``ALERT <reading>``)."""
    return pc.binary_join_element_wise("ALERT ", pc.utf8_upper(values.cast(pa.string())), "")


def setup(log: Log) -> None:
    for topic in (SOURCE, SINK):
        if topic not in log.topics():
            try:
                log.create_topic(topic, partitions=PARTITIONS)
            except Exception:
                if topic not in log.topics():
                    raise


def generate(root: str, count: int, seed: int = 1, pace_s: float = 0.02) -> None:
    """Write ``count`` readings in transactions of 1 to 200, about one in five aborted.

    Reading numbers continue after those of earlier runs (the source's offsets
    so far), so every reading, and so every alert, is unique in the log.
    """
    log = Log(root)
    setup(log)
    rng = random.Random(seed)
    producer = log.producer(transactional_id="readings-generator")
    producer.init_transactions()
    first = sum(log.end_offset(SOURCE, p) for p in range(PARTITIONS))
    done = 0
    while done < count:
        n = min(rng.randint(1, 200), count - done)
        producer.begin_transaction()
        producer.send_table(SOURCE, readings(first + done, n))
        if rng.random() < 0.2:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
        done += n
        time.sleep(pace_s)  # a steady trickle, so micro-batches meet open transactions
    producer.close()


def query(spark, root: str, checkpoint: str, delivery: str, max_offsets: int | None):
    from pyspark.sql import functions as F

    source = spark.readStream.format("txlog").option("path", root) \
        .option("subscribe", SOURCE).option("startingOffsets", "earliest")
    if max_offsets:
        source = source.option("maxOffsetsPerTrigger", str(max_offsets))
    alerts = source.load().select(
        "key", "partition",
        F.concat(F.lit("ALERT "), F.upper(F.col("value").cast("string"))).alias("value"))
    sink = alerts.writeStream.format("txlog").option("path", root).option("topic", SINK) \
        .option("checkpointLocation", checkpoint).option("deliveryGuarantee", delivery)
    if delivery == "exactly_once":
        sink = sink.option("transactional.id.prefix", PREFIX).option("groupId", GROUP)
    return sink


PROGRESS_PREFIX = "batch "  # how a progress line starts (the README test counts the others)


def progress_line(progress: dict) -> str:
    """One line for one micro-batch, from Spark's own progress report of it.

    Records in is what the batch read; out is what the sink wrote (committed
    with the batch, exactly once); LSO is the sum over partitions of the
    input's end as the batch saw it (read_committed: its last stable offsets);
    lag is how far the batch's end offsets were behind it.
    """
    source = progress["sources"][0]
    end = sum(sum(parts.values()) for parts in (source.get("endOffset") or {}).values())
    latest = sum(sum(parts.values()) for parts in (source.get("latestOffset") or {}).values())
    out = progress.get("sink", {}).get("numOutputRows", -1)
    return (f"{PROGRESS_PREFIX}{progress['batchId']}: {progress['numInputRows']} readings in, "
            f"{out} alerts out, input LSO {latest}, lag {max(latest - end, 0)}")


class ProgressPrinter:
    """Prints each executed micro-batch once, from ``query.recentProgress``.

    Polled by the thread that runs the query rather than pushed by a
    StreamingQueryListener: listener events arrive asynchronously and could
    still be on their way when the summary prints, while ``recentProgress`` is
    complete once the query has stopped.  Batch ids continue across restarts
    (same checkpoint), so one printer serves every query of a run.
    """

    def __init__(self) -> None:
        self._shown: set[int] = set()
        self.read_upto = 0  # the highest end offsets (summed) of a batch shown


    def show(self, running) -> None:
        for entry in running.recentProgress:
            progress = json.loads(entry.json)
            # Idle reports (no batch ran) have no addBatch time.
            if progress["batchId"] in self._shown or "addBatch" not in progress["durationMs"]:
                continue
            self._shown.add(progress["batchId"])
            end = progress["sources"][0].get("endOffset") or {}
            self.read_upto = max(self.read_upto,
                                 sum(sum(parts.values()) for parts in end.values()))
            print(progress_line(progress), flush=True)

    def catch_up(self, running, target: int, poll_s: float = 0.5) -> None:
        """Print progress until a batch has read up to ``target`` (summed offsets).

        What ``processAllAvailable`` waits for once the input stops growing,
        but with the progress lines printed as the batches run.  A query that
        fails raises here; one stopped by someone else ends the wait.
        """
        self.show(running)
        while self.read_upto < target:
            if running.awaitTermination(poll_s):
                break
            self.show(running)

    def follow(self, running, poll_s: float = 0.5) -> None:
        """Print progress until ``running`` terminates (raises what ended it)."""
        try:
            while not running.awaitTermination(poll_s):
                self.show(running)
        finally:
            self.show(running)


def check(root: str) -> dict[str, int]:
    """Compare the sink with the transform of the committed source, partition by partition."""
    log = Log(root)
    report = {"committed readings": 0, "alerts": 0, "missing": 0, "duplicated": 0,
              "unexpected": 0, "partitions out of order": 0}
    for p in range(PARTITIONS):
        expected = alert_of(log.read(SOURCE, p).column("value")).to_pylist()
        got = log.read(SINK, p).column("value").cast(pa.string()).to_pylist()
        report["committed readings"] += len(expected)
        report["alerts"] += len(got)
        want, have = Counter(expected), Counter(got)
        surplus = have - want  # once: a Counter difference walks both counters
        report["missing"] += sum((want - have).values())
        report["duplicated"] += sum(c for v, c in surplus.items() if v in want)
        report["unexpected"] += sum(c for v, c in surplus.items() if v not in want)
        firsts = list(dict.fromkeys(v for v in got if v in want))
        if firsts != [v for v in expected if v in have]:
            report["partitions out of order"] += 1
    return report


def exactly_once(report: dict[str, int]) -> bool:
    return report["alerts"] == report["committed readings"] and not any(
        report[k] for k in ("missing", "duplicated", "unexpected", "partitions out of order"))


def run(args: argparse.Namespace) -> int:
    from txlog.spark.session import spark_session

    root = args.root
    log = Log(root)
    setup(log)
    checkpoint = args.checkpoint or os.path.join(root, "checkpoint")
    feeder = None
    if args.generate:
        feeder = threading.Thread(target=generate, args=(root, args.generate), daemon=True)
        feeder.start()
    spark = spark_session("txlog-stream-pipeline")
    sink = query(spark, root, checkpoint, args.delivery, args.max_offsets_per_trigger)
    printer = ProgressPrinter()
    if args.forever:
        printer.follow(sink.trigger(processingTime=f"{args.trigger_ms} milliseconds").start())
        return 1  # only a failure ends a query that runs forever
    if feeder is not None:
        running = sink.trigger(processingTime=f"{args.trigger_ms} milliseconds").start()
        while feeder.is_alive():
            feeder.join(0.5)
            printer.show(running)
        # The input is complete: wait for the query to read all of it.
        printer.catch_up(running, sum(log.last_stable_offset(SOURCE, p)
                                      for p in range(PARTITIONS)))
        running.stop()
        printer.show(running)
    # Whatever is left (everything, with --generate 0): drain it and stop.
    printer.follow(sink.trigger(availableNow=True).start())
    spark.stop()
    report = check(root)
    print("; ".join(f"{k}: {v}" for k, v in report.items()))
    lag = {tp: log.last_stable_offset(*tp) - o for tp, o in log.committed(GROUP).items()}
    if args.delivery == "exactly_once":
        print(f"group {GROUP}: committed offsets cover the input, lag {sum(lag.values())}")
    ok = exactly_once(report)
    print("exactly once: OK" if ok else "exactly once: FAILED")
    return 0 if ok else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", nargs="?", help="log directory (default: a temporary one)")
    p.add_argument("--generate", type=int, default=20_000, metavar="N",
                   help="readings to feed while the query runs (0: none; default 20000)")
    p.add_argument("--checkpoint", help="checkpoint directory (default: ROOT/checkpoint)")
    p.add_argument("--trigger-ms", type=int, default=500, help="micro-batch interval")
    p.add_argument("--max-offsets-per-trigger", type=int, default=5_000, metavar="N",
                   help="offsets per micro-batch at most (0: no limit)")
    p.add_argument("--delivery", choices=["exactly_once", "at_least_once"],
                   default="exactly_once", help="the sink's deliveryGuarantee")
    p.add_argument("--forever", action="store_true",
                   help="run until killed (no generator, no check)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.root = args.root or tempfile.mkdtemp(prefix="txlog-stream-")
    if args.forever:
        args.generate = 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
