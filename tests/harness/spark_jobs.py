"""Spark applications the subprocess tests run with spark-submit (or plain python).

``spark_jobs.py hang ROOT TOPIC PREFIX TIMEOUT_MS READY_DIR``: writes 4,000 rows
exactly once; once a task has sent its records it says so with a file in
READY_DIR, and task 0 then never finishes, so the driver never commits: the
test kills the driver with SIGKILL.

``spark_jobs.py connect ROOT``: a write and a read through Spark Connect
(``remote("local[2]")``), printing ``connect: N`` with the rows read back.

``spark_jobs.py cluster ROOT TOPIC ROWS MARKERS OPTIONS_JSON ATTEMPTS_ROOT PIPELINE_ROOT``: made
for a standalone cluster (tests/harness/spark_cluster.py), where task attempts run in
executor JVMs.  One application, so that its executors start once:

1. writes ROWS rows exactly once from two tasks, the first attempt of task 0
   failing after it has appended part of its rows, then reads the topic back
   committed and uncommitted, printing ``retried: {json}`` with the counts and,
   per task attempt, the JVM that ran it (also left as a file in MARKERS).
   OPTIONS_JSON holds extra options for every read and write (a store's
   credentials);
2. with ATTEMPTS_ROOT (a root with topics ``killed``, ``outlived-commit`` and
   ``outlived-abort``, 4 partitions each): three pooled jobs (no prefix) of 4,000
   rows from two tasks, with task attempts that die or outlive their task as
   tests/harness/faults/sitecustomize.py plans them (TXLOG_TEST_ATTEMPT_FAULTS, set
   by the cluster): in ``killed`` task 0's first attempt ends its Python worker
   after it wrote; in ``outlived-*`` task 1's first attempt leaves a straggler that
   joins the job once it is decided, and the job commits (its retry writes) or is
   aborted (every attempt of task 1 fails).  Prints ``attempts: {json}``: per topic,
   the job's error (None if it committed) and what the planted attempt left;
3. runs the batch pipeline example (``txlog.examples.batch_pipeline``, its
   command-line entry point) on PIPELINE_ROOT with 2,000 orders, which prints
   ``exactly once: OK`` and stops the session.

``spark_jobs.py speculation ROOT TOPIC ROWS MARKERS OPTIONS_JSON``: made for a
standalone cluster of two workers on two addresses, submitted with speculation on:
ROWS rows exactly once from two tasks, the first attempt of task 0 holding on after
it wrote (as the test plans it: tests/harness/faults/sitecustomize.py) until Spark
kills it for the speculative copy that won.  Prints
``speculated: {json}`` (as ``retried`` does, with each attempt's executor host).

``spark_jobs.py sink-safety ROOT SCRATCH``: the sink's safety scenarios in one
application (one JVM start), each printing ``<scenario>: {json}``: two queries with
one prefix (``two-queries``), a deleted checkpoint restarted with startingOffsets
latest and earliest (``reset-latest``, ``reset-earliest``), a micro-batch that
fails in every attempt after writing (``failing-batch``), then batch writes whose
marker writes fail once (``once``) and on every try until the test lets them work
(``always``), made to fail by
tests/harness/faults/sitecustomize.py (on PYTHONPATH, so in every Python worker too, with
TXLOG_TEST_MARKER_FAULTS naming a scratch directory).

``spark_jobs.py foreach-batch ROOT CHECKPOINT KILL_BATCH MARKER``: a stream of topic
``fe-in`` whose foreachBatch writes each micro-batch to ``fe-out`` with txnAppId and
txnVersion = the batch id.  Right after the write of batch KILL_BATCH returns it
leaves MARKER and SIGKILLs its own process group (the driver and its JVM), before
Spark records the batch as done; run it in a session of its own.  With MARKER
present it runs to the end (Trigger.AvailableNow): the restart (``foreach_batch_query``).
"""

from __future__ import annotations

import json
import os
import shutil
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
        .option("transactional.id.prefix", "retried").option("batch.size", "4096") \
        .option("dataObjectBytes", "16k")  # written as it goes, so the failure follows writes
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()
    result = _read_back(spark, root, topic, int(rows), markers, options)
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    print(f"retried: {json.dumps(result)}", flush=True)


def _read_back(spark, root: str, topic: str, rows: int, markers: str,
               options: dict[str, str]) -> dict:
    """The topic read back through Spark, committed and uncommitted, and the attempts'
    markers: what ``retried`` and ``speculation`` print."""
    from pyspark.sql import functions as F

    def read(isolation: str):
        reader = spark.read.format("txlog").option("path", root).option("subscribe", topic) \
            .option("isolation.level", isolation)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    key = F.col("key").cast("string")
    committed = read("read_committed").agg(
        F.count("*").alias("committed"), F.count_distinct(key).alias("distinct_keys"),
        F.count_if(~key.between("k000000", f"k{rows - 1:06d}")).alias("keys_outside"),
    ).first().asDict()
    return {
        "master": spark.sparkContext.master,
        "driver_jvm": spark.sparkContext._jvm.ProcessHandle.current().pid(),
        **committed,
        "uncommitted": read("read_uncommitted").count(),
        "attempts": [json.loads(open(os.path.join(markers, name)).read())
                     for name in sorted(os.listdir(markers))],
    }


def _executor_host() -> str | None:
    """The host the executor serving this Python worker registered with (``--hostname``)."""
    jvm, executor = _serving_jvm()
    if not executor:
        return None
    with open(f"/proc/{jvm}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    return argv[argv.index("--hostname") + 1]


def speculation(root: str, topic: str, rows: str, markers: str, options_json: str) -> None:
    """ROWS rows exactly once from two tasks, with speculation on (the submit's conf): the
    first attempt of task 0 writes its rows and then holds on (planned by the test:
    tests/harness/faults/sitecustomize.py, ``stall``), so that Spark runs a speculative
    copy (attempt 1, on the other worker's host), which wins; Spark then kills the first.
    Prints ``speculated: {json}`` as ``retried`` prints ``retried``."""
    from txlog.spark.session import spark_session

    options: dict[str, str] = json.loads(options_json)
    spark = spark_session("txlog-test-speculation")
    df = _rows(spark, int(rows), 2)

    def mark_attempt(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        with open(os.path.join(markers, f"{ctx.partitionId()}-{ctx.attemptNumber()}"), "w") as f:
            json.dump({"partition": ctx.partitionId(), "attempt": ctx.attemptNumber(),
                       "host": _executor_host()}, f)
        yield from batches

    writer = df.mapInArrow(mark_attempt, df.schema).write.format("txlog") \
        .mode("append").option("path", root).option("topic", topic)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()
    print(f"speculated: {json.dumps(_read_back(spark, root, topic, int(rows), markers, options))}",
          flush=True)
    spark.stop()


# What tests/harness/faults/sitecustomize.py does to one task of each job of ``attempts``.
ATTEMPT_PLANS = {"killed": {"task": 0, "action": "exit"},
                 "outlived-commit": {"task": 1, "action": "outlive", "fail": "first"},
                 "outlived-abort": {"task": 1, "action": "outlive", "fail": "all"}}


def attempts(root: str, options_json: str) -> None:
    """Part 2 of ``cluster``: pooled jobs whose planted attempts die or outlive their task."""
    from txlog.spark.session import spark_session

    spark = spark_session("txlog-test-retried")  # the running one
    faults = os.environ["TXLOG_TEST_ATTEMPT_FAULTS"]
    results = {}
    for topic, plan in ATTEMPT_PLANS.items():
        with open(os.path.join(faults, f"plan-{topic}.json"), "w") as f:
            json.dump(plan, f)
        writer = _rows(spark, 4_000, 2).write.format("txlog").mode("append") \
            .option("path", root).option("topic", topic)
        for key, value in json.loads(options_json).items():
            writer = writer.option(key, value)
        error = None
        try:
            writer.save()
        except Exception as exc:  # the aborted job: its message is checked by the test
            error = _error_text(exc)
        left = os.path.join(faults, f"{'sent' if plan['action'] == 'exit' else 'straggler'}"
                                    f"-{topic}.json")
        _wait_for_file(left, os.path.join(faults, f"straggler-{topic}.log"))
        with open(left) as f:
            results[topic] = {"error": error, "planted": json.load(f)}
    print(f"attempts: {json.dumps(results)}", flush=True)


def _wait_for_file(path: str, log: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            tail = open(log).read()[-3000:] if os.path.exists(log) else "(no log)"
            raise SystemExit(f"{path} did not appear in {timeout_s}s\n{tail}")
        time.sleep(0.05)


def cluster(root: str, topic: str, rows: str, markers: str, options_json: str,
            attempts_root: str, pipeline_root: str) -> int:
    from txlog.examples import batch_pipeline

    retried(root, topic, rows, markers, options_json)
    attempts(attempts_root, options_json)
    return batch_pipeline.main([pipeline_root, "--orders", "2000"])


# --- the stream sink's safety --------------------------------------------------------------


def _produce(log, topic: str, values: list[str]) -> None:
    producer = log.producer(linger_ms=3_600_000)
    for v in values:
        producer.send(topic, v.encode(), key=v.encode())
    producer.flush()
    producer.close()


def _committed_values(log, topic: str) -> list[str]:
    out: list[str] = []
    for p in range(log.describe_topic(topic).partitions):
        out += [v.decode() for v in log.read(topic, p).column("value").to_pylist()]
    return sorted(out)


def _copy(spark, root: str, source: str, sink: str, prefix: str, checkpoint: str,
          reading: dict[str, str] | None = None, writing: dict[str, str] | None = None):
    """A stream copying ``source`` into ``sink`` exactly once, as a user writes it."""
    reader = spark.readStream.format("txlog").option("path", root).option("subscribe", source)
    for key, value in {"startingOffsets": "earliest", **(reading or {})}.items():
        reader = reader.option(key, value)
    writer = reader.load().select("key", "value").writeStream.format("txlog") \
        .option("path", root).option("topic", sink).option("transactional.id.prefix", prefix) \
        .option("checkpointLocation", checkpoint)
    for key, value in (writing or {}).items():
        writer = writer.option(key, value)
    return writer


def _error_text(exc: BaseException) -> str:
    return str(exc)


def two_queries(spark, log, root: str, scratch: str) -> dict:
    """Query A runs; query B starts with A's prefix and another checkpoint; A goes on."""
    for topic in ("a-in", "b-in", "two-out"):
        log.create_topic(topic, partitions=2)
    _produce(log, "a-in", [f"a{i}" for i in range(200)])
    _produce(log, "b-in", [f"b{i}" for i in range(200)])
    a = _copy(spark, root, "a-in", "two-out", "shared", f"{scratch}/ck-a",
              reading={"maxOffsetsPerTrigger": "50"}).trigger(processingTime="200 milliseconds") \
        .start()
    a.processAllAvailable()
    b = _copy(spark, root, "b-in", "two-out", "shared", f"{scratch}/ck-b",
              reading={"maxOffsetsPerTrigger": "50"}).trigger(processingTime="200 milliseconds") \
        .start()
    try:
        b.processAllAvailable()
        b_error = None
    except Exception as exc:  # noqa: BLE001 - the error is the result
        b_error = _error_text(exc)
    b.stop()
    _produce(log, "a-in", [f"a{i}" for i in range(200, 400)])
    a.processAllAvailable()
    a_error = a.exception()
    a.stop()
    return {"a_query": str(a.id), "b_query": str(b.id), "b_error": b_error,
            "a_error": None if a_error is None else str(a_error),
            "out": _committed_values(log, "two-out")}


def reset(spark, log, root: str, scratch: str, starting: str) -> dict:
    """A query's checkpoint is deleted and the query restarted with the same prefix."""
    source, sink, prefix = f"r-{starting}-in", f"r-{starting}-out", f"reset-{starting}"
    checkpoint = f"{scratch}/ck-{starting}"
    for topic in (source, sink):
        log.create_topic(topic, partitions=2)
    _produce(log, source, [f"old{i}" for i in range(100)])
    first = _copy(spark, root, source, sink, prefix, checkpoint,
                  reading={"maxOffsetsPerTrigger": "25"}).trigger(availableNow=True).start()
    first.awaitTermination()
    shutil.rmtree(checkpoint)
    new: list[str] = []
    if starting == "earliest":
        new = [f"new{i}" for i in range(60)]
        _produce(log, source, new)

    def run(**writing: str) -> tuple[str, str | None, list[str]]:
        query = _copy(spark, root, source, sink, prefix, checkpoint,
                      reading={"startingOffsets": starting}, writing=writing) \
            .trigger(processingTime="200 milliseconds").start()
        produced: list[str] = []
        try:
            query.processAllAvailable()
            if starting == "latest":  # records that arrive while the new query runs
                for r in range(3):
                    batch = [f"new{r}-{i}" for i in range(20)]
                    _produce(log, source, batch)
                    produced += batch
                    query.processAllAvailable()
            error = None
        except Exception as exc:  # noqa: BLE001 - the error is the result
            error = _error_text(exc)
        query.stop()
        return str(query.id), error, produced

    out_before = _committed_values(log, sink)
    query_id, refused, produced = run()
    out_after_refusal = _committed_values(log, sink)
    taken_over = None
    if refused is not None:
        _, taken_over, produced = run(takeOverFrom=str(first.id))
    return {"first_query": str(first.id), "new_query": query_id, "refused": refused,
            "take_over_error": taken_over, "old": [f"old{i}" for i in range(100)],
            "new": new + produced, "written_while_refused":
                len(out_after_refusal) - len(out_before), "out": _committed_values(log, sink)}


def failing_batch(spark, log, root: str, scratch: str) -> dict:
    """Every attempt of a micro-batch's task writes part of its rows, then fails."""
    log.create_topic("fb-in", partitions=1)
    log.create_topic("fb-out", partitions=2)
    _produce(log, "fb-in", [f"v{i}" for i in range(300)] + ["poison"])
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        query = spark.readStream.format("txlog").option("path", root) \
            .option("subscribe", "fb-in").option("startingOffsets", "earliest").load() \
            .selectExpr("key", "value",
                        "CASE WHEN CAST(value AS STRING) = 'poison' THEN 99 END AS partition") \
            .writeStream.format("txlog").option("path", root).option("topic", "fb-out") \
            .option("transactional.id.prefix", "failing").option("batch.size", "1024") \
            .option("dataObjectBytes", "4k") \
            .option("checkpointLocation", f"{scratch}/ck-failing") \
            .trigger(availableNow=True).start()
        try:
            query.awaitTermination()
            error = None
        except Exception as exc:  # noqa: BLE001 - the error is the result
            error = _error_text(exc)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    # What a read_committed reader meets right after the query failed, with no timeout
    # passed and no later micro-batch.
    fresh = type(log)(root)
    partitions = [(fresh.last_stable_offset("fb-out", p), fresh.end_offset("fb-out", p))
                  for p in range(2)]
    written = sum(fresh.read("fb-out", p, isolation_level="read_uncommitted").num_rows
                  for p in range(2))
    other = fresh.producer(transactional_id="other-writer")
    other.init_transactions()
    other.begin_transaction()
    for i in range(10):
        other.send("fb-out", f"other{i}".encode(), partition=i % 2)
    other.commit_transaction()
    other.close()
    return {"error": error, "written": written, "lso_and_end": partitions,
            "visible": _committed_values(type(log)(root), "fb-out")}


def sink_safety(root: str, scratch: str) -> None:
    from txlog import Log
    from txlog.spark.session import spark_session

    spark = spark_session("txlog-test-sink-safety")
    log = Log(root)
    scenarios = {
        "two-queries": lambda: two_queries(spark, log, root, scratch),
        "reset-latest": lambda: reset(spark, log, root, scratch, "latest"),
        "reset-earliest": lambda: reset(spark, log, root, scratch, "earliest"),
        "failing-batch": lambda: failing_batch(spark, log, root, scratch),
    }
    for name, scenario in scenarios.items():
        print(f"{name}: {json.dumps(scenario())}", flush=True)
    commit_faults(spark, log, root)
    spark.stop()


def commit_faults(spark, log, root: str) -> None:
    """Batch jobs whose commit meets failing marker writes
    (tests/harness/faults/sitecustomize.py)."""
    from txlog import Log

    faults = os.environ["TXLOG_TEST_MARKER_FAULTS"]
    for mode in ("once", "always"):
        topic = f"faults-{mode}"
        log.create_topic(topic, partitions=2)
        with open(os.path.join(faults, "mode"), "w") as f:
            f.write(mode)
        try:
            _rows(spark, 1_000, 2).write.format("txlog").mode("append").option("path", root) \
                .option("topic", topic).option("transactional.id.prefix", f"faults-{mode}") \
                .save()
            error = None
        except Exception as exc:  # noqa: BLE001 - the error is the result
            error = _error_text(exc)
        # The job returned at its COMMIT decision; its markers are written behind it, by
        # the Python worker that committed.  Let them fail (once; or twice, so retried)
        # before marker writes work again.
        _wait_for_marker_failures(faults, 1 if mode == "once" else 2)
        os.remove(os.path.join(faults, "mode"))  # marker writes work again
        fresh = Log(root)
        for transactional_id in fresh.coordinator.transactional_ids():
            if transactional_id.startswith(f"faults-{mode}"):  # as the next writer would
                fresh.coordinator.complete(transactional_id)
        failed = sorted(n for n in os.listdir(faults) if n.startswith("failed-"))
        # A read_committed Spark read, after the job and with marker writes working.
        count = spark.read.format("txlog").option("path", root).option("subscribe", topic) \
            .load().count()
        print(f"{mode}: " + json.dumps({
            "error": error, "marker_failures": len(failed), "read": count,
            "lso_and_end": [(fresh.last_stable_offset(topic, p), fresh.end_offset(topic, p))
                            for p in range(2)]}), flush=True)
        for name in failed:
            os.remove(os.path.join(faults, name))


def _wait_for_marker_failures(faults: str, at_least: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(n.startswith("failed-") for n in os.listdir(faults)) < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {at_least} marker writes failed in {timeout_s} s")
        time.sleep(0.05)


# --- idempotent writes inside foreachBatch ---------------------------------------------------

FE_APP = "fe-app"


def write_versioned(root: str, kill_batch: int, marker: str):
    """The foreachBatch function: an idempotent batch write, then (once) the driver's death."""
    def write(batch_df, batch_id: int) -> None:
        batch_df.select("key", "value").write.format("txlog").mode("append") \
            .option("path", root).option("topic", "fe-out") \
            .option("txnAppId", FE_APP).option("txnVersion", str(batch_id)).save()
        if batch_id == kill_batch and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(batch_id))
            import signal

            os.killpg(os.getpgrp(), signal.SIGKILL)
    return write


def foreach_batch_query(spark, root: str, checkpoint: str, kill_batch: int, marker: str):
    return spark.readStream.format("txlog").option("path", root).option("subscribe", "fe-in") \
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "40").load() \
        .writeStream.foreachBatch(write_versioned(root, kill_batch, marker)) \
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()


def foreach_batch(root: str, checkpoint: str, kill_batch: str, marker: str) -> None:
    from txlog.spark.session import spark_session

    spark = spark_session("txlog-test-foreach-batch")
    foreach_batch_query(spark, root, checkpoint, int(kill_batch), marker).awaitTermination()
    print("unexpected: the query ended without being killed", flush=True)
    spark.stop()


if __name__ == "__main__":
    sys.exit({"hang": hang, "connect": connect, "cluster": cluster, "speculation": speculation,
              "sink-safety": sink_safety, "foreach-batch": foreach_batch}[sys.argv[1]](*sys.argv[2:]))
