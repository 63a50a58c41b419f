"""Where a txlog -> txlog micro-batch spends its time, step by step, in the driver and tasks.

The query of ``spark_stream_benchmark.py`` (``--rows`` records of 8-byte keys
and 100-byte values, 4 partitions, ``Trigger.AvailableNow`` in ``--batches``
micro-batches, exactly once), run ``--runs`` times after a warm-up, with the
timing hooks of ``step_hooks/sitecustomize.py`` in every Python process of
the session.  Printed per micro-batch: each step's calls and its median and
total time (a task's steps run in two waves on ``local[2]``: four tasks on two
cores), then the storage's publishes by kind.  ``writer.input`` is a task's
wait for Spark's rows, which a Python sink that drops its batches waits as
well; what follows it in a task, and the commit on the driver, is txlog's.

Run: ``python benchmarks/stream_steps.py [--rows N] [--batches B] [--runs K]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import runpy
import statistics
import tempfile
import time

HOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_hooks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    scratch = args.dir or tempfile.mkdtemp(prefix="txlog-steps-")
    traces = os.path.join(scratch, "steps")
    os.makedirs(traces, exist_ok=True)
    # Before the JVM starts: Spark's Python processes inherit the driver's environment.
    os.environ["TXLOG_STEP_TRACE"] = traces
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (HOOKS, os.environ.get("PYTHONPATH")) if p)
    runpy.run_path(os.path.join(HOOKS, "sitecustomize.py"))  # this process started without

    from spark_stream_benchmark import PARTITIONS, source_table, txlog_stream

    from txlog import Log
    from txlog.spark.session import spark_session

    spark = spark_session("txlog-stream-steps", master="local[2]")
    root = os.path.join(scratch, "log")
    log = Log(root)
    log.create_topic("in", partitions=PARTITIONS)
    per_batch = args.rows // args.batches
    with log.producer() as producer:
        for b in range(args.batches):
            producer.send_table("in", source_table(b * per_batch, per_batch))
    measured_from = 0.0
    for n in range(args.runs + 1):
        if n == 1:
            measured_from = time.time()
        log.create_topic(f"out{n}", partitions=PARTITIONS)
        query = txlog_stream(spark, root, per_batch, f"out{n}", f"steps{n}",
                             os.path.join(scratch, f"ck{n}")).trigger(availableNow=True).start()
        query.awaitTermination()
    spark.stop()
    report(traces, measured_from, args.runs * args.batches)


def report(traces: str, since: float, micro_batches: int) -> None:
    steps: dict[str, list[float]] = collections.defaultdict(list)
    publishes: collections.Counter[str] = collections.Counter()
    publish_ms: collections.Counter[str] = collections.Counter()
    for name in os.listdir(traces):
        with open(os.path.join(traces, name)) as lines:
            for line in lines:
                start, end, _thread, step, *detail = line.split(" ", 4)
                if float(start) < since:
                    continue
                took = (float(end) - float(start)) * 1000
                steps[step].append(took)
                if step.startswith("storage.publish"):
                    kind = re.sub(r"\d+", "N", re.sub(r"[0-9a-f]{16,}", "H",
                                                      detail[0].strip() if detail else ""))
                    publishes[kind] += 1
                    publish_ms[kind] += took
    print(f"{micro_batches} micro-batches; per micro-batch:\n")
    print(f"{'step':36s} {'calls':>6s} {'median ms':>10s} {'total ms':>9s}")
    for step, times in sorted(steps.items(), key=lambda kv: -sum(kv[1])):
        print(f"{step:36s} {len(times) / micro_batches:6.1f} {statistics.median(times):10.2f} "
              f"{sum(times) / micro_batches:9.1f}")
    print(f"\n{'durable objects published':60s} {'per batch':>9s} {'ms':>7s}")
    for kind, count in publishes.most_common():
        print(f"{kind[-60:]:60s} {count / micro_batches:9.1f} {publish_ms[kind] / micro_batches:7.1f}")


if __name__ == "__main__":
    main()
