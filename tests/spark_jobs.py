"""Spark applications the subprocess tests run with spark-submit (or plain python).

``spark_jobs.py hang ROOT TOPIC PREFIX TIMEOUT_MS READY_DIR``: writes 4,000 rows
exactly once; once a task has sent its records it says so with a file in
READY_DIR, and task 0 then never finishes, so the driver never commits: the
test kills the driver with SIGKILL.

``spark_jobs.py connect ROOT``: a write and a read through Spark Connect
(``remote("local[2]")``), printing ``connect: N`` with the rows read back.
"""

from __future__ import annotations

import os
import sys
import time


def _rows(spark, n, partitions):
    from pyspark.sql import functions as F

    return spark.range(n, numPartitions=partitions).select(
        F.format_string("k%06d", "id").alias("key"), F.format_string("v%d", "id").alias("value"))


def hang(root: str, topic: str, prefix: str, timeout_ms: str, ready_dir: str) -> None:
    from txlog.spark.session import spark_session

    spark = spark_session("txlog-test-hang")
    df = _rows(spark, 4_000, 4)

    def stall(batches):
        from pyspark import TaskContext

        for batch in batches:
            yield batch
        ctx = TaskContext.get()
        # The rows are in the write task's hands once this generator ends; give the
        # writer a moment by yielding nothing more, then report and (task 0) hang.
        with open(os.path.join(ready_dir, f"task-{ctx.partitionId()}"), "w") as f:
            f.write(str(os.getpid()))
        if ctx.partitionId() == 0:
            time.sleep(3600)

    df.mapInArrow(stall, df.schema).write.format("txlog").mode("append") \
        .option("path", root).option("topic", topic) \
        .option("transactional.id.prefix", prefix) \
        .option("transaction.timeout.ms", timeout_ms).save()
    print("unexpected: the job committed", flush=True)


def connect(root: str) -> None:
    from pyspark.sql import SparkSession

    from txlog import Log
    from txlog.spark.java import ensure_java

    ensure_java()
    Log(root).create_topic("connected", partitions=2)
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    _rows(spark, 500, 2).write.format("txlog").mode("append").option("path", root) \
        .option("topic", "connected").save()
    back = spark.read.format("txlog").option("path", root).option("subscribe", "connected") \
        .load()
    print(f"connect: {back.count()}", flush=True)
    spark.stop()


if __name__ == "__main__":
    {"hang": hang, "connect": connect}[sys.argv[1]](*sys.argv[2:])
