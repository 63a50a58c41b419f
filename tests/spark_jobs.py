"""Spark applications the subprocess tests run with spark-submit (or plain python).

``spark_jobs.py hang ROOT TOPIC PREFIX TIMEOUT_MS READY_DIR``: writes 4,000 rows
exactly once; once a task has sent its records it says so with a file in
READY_DIR, and task 0 then never finishes, so the driver never commits: the
test kills the driver with SIGKILL.

``spark_jobs.py connect ROOT``: a write and a read through Spark Connect
(``remote("local[2]")``), printing ``connect: N`` with the rows read back.

``spark_jobs.py cluster ROOT TOPIC ROWS MARKERS OPTIONS_JSON PIPELINE_ROOT``: made
for a standalone cluster (tests/spark_cluster.py), where task attempts run in
executor JVMs.  One application, so that its executors start once:

1. writes ROWS rows exactly once from two tasks, the first attempt of task 0
   failing after it has appended part of its rows, then reads the topic back
   committed and uncommitted, printing ``retried: {json}`` with the counts and,
   per task attempt, the JVM that ran it (also left as a file in MARKERS).
   OPTIONS_JSON holds extra options for every read and write (a store's
   credentials);
2. runs the batch pipeline example (``txlog.examples.batch_pipeline``, its
   command-line entry point) on PIPELINE_ROOT with 2,000 orders, which prints
   ``exactly once: OK`` and stops the session.
"""

from __future__ import annotations

import json
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


def _serving_jvm() -> tuple[int | None, bool]:
    """(pid, is an executor) of the JVM this Python worker serves: its nearest ``java``
    ancestor, and whether that runs Spark's executor backend rather than a driver."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the parent
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        if os.path.basename(argv[0]) == b"java":
            return pid, b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv
    return None, False


def retried(root: str, topic: str, rows: str, markers: str, options_json: str) -> None:
    """Part 1 of ``cluster``: leaves the session running for part 2."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, StructField, StructType

    from txlog.spark.session import spark_session

    options: dict[str, str] = json.loads(options_json)
    spark = spark_session("txlog-test-retried")
    # Small Arrow batches, so that a task appends some of its rows before it fails.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    df = _rows(spark, int(rows), 2)
    schema = StructType([*df.schema.fields, StructField("partition", IntegerType())])

    def fail_first_attempt_of_task_0(batches):
        """Pass rows through with a null partition (the partitioner places them); task 0's
        first attempt asks for partition 99 in its fourth batch, which the writer rejects
        after it has sent the first three: a failure after a partial write."""
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        failing = ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        jvm, executor = _serving_jvm()
        with open(os.path.join(markers, f"{ctx.partitionId()}-{ctx.attemptNumber()}"), "w") as f:
            json.dump({"partition": ctx.partitionId(), "attempt": ctx.attemptNumber(),
                       "jvm": jvm, "executor": executor, "python": os.getpid(),
                       "failing": failing}, f)
        for i, batch in enumerate(batches):
            parts = [None] * batch.num_rows
            if failing and i == 3:
                parts[0] = 99
            yield pa.RecordBatch.from_arrays([*batch.columns, pa.array(parts, pa.int32())],
                                             names=[*batch.schema.names, "partition"])

    writer = df.mapInArrow(fail_first_attempt_of_task_0, schema).write.format("txlog") \
        .mode("append").option("path", root).option("topic", topic) \
        .option("transactional.id.prefix", "retried").option("batch.size", "4096")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()

    def read(isolation: str):
        reader = spark.read.format("txlog").option("path", root).option("subscribe", topic) \
            .option("isolation.level", isolation)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    key = F.col("key").cast("string")
    committed = read("read_committed").agg(
        F.count("*").alias("committed"), F.count_distinct(key).alias("distinct_keys"),
        F.count_if(~key.between("k000000", f"k{int(rows) - 1:06d}")).alias("keys_outside"),
    ).first().asDict()
    result = {
        "master": spark.sparkContext.master,
        "driver_jvm": spark.sparkContext._jvm.ProcessHandle.current().pid(),
        **committed,
        "uncommitted": read("read_uncommitted").count(),
        "attempts": [json.loads(open(os.path.join(markers, name)).read())
                     for name in sorted(os.listdir(markers))],
    }
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    print(f"retried: {json.dumps(result)}", flush=True)


def cluster(root: str, topic: str, rows: str, markers: str, options_json: str,
            pipeline_root: str) -> int:
    from txlog.examples import batch_pipeline

    retried(root, topic, rows, markers, options_json)
    return batch_pipeline.main([pipeline_root, "--orders", "2000"])


if __name__ == "__main__":
    sys.exit({"hang": hang, "connect": connect, "cluster": cluster}[sys.argv[1]](*sys.argv[2:]))
