"""The Spark batch source and sink, through the shared SparkSession (local[2,4])."""

from __future__ import annotations

import json
import sys
import threading

import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark")

import pyspark.cloudpickle  # noqa: E402
from chispa import assert_df_equality  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import IntegerType, StructField, StructType  # noqa: E402

from conftest import LARGE  # noqa: E402
from helpers_core import nothing_holds_the_lso, wait_for  # noqa: E402
from spark_io import hanging, read, write  # noqa: E402
from txlog import Log  # noqa: E402
from txlog.clients.partitioner import partition_for_key  # noqa: E402

# Python workers cannot import this test module: ship its functions by value.
pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rows(spark, n, partitions=4):
    """n rows with string keys and values, spread over ``partitions`` Spark partitions."""
    return spark.range(n, numPartitions=partitions).select(
        F.format_string("k%07d", "id").alias("key"),
        F.format_string("value-%d", "id").alias("value"))


@pytest.fixture
def root(tmp_path):
    log = Log(tmp_path / "log")
    log.create_topic("events", partitions=4)
    return tmp_path / "log"


def test_write_then_read_100k_rows_equal_with_kafka_partitioning(spark, root):
    df = rows(spark, 100_000)
    write(df, root, topic="events")
    back = read(spark, root, subscribe="events")
    assert back.count() == 100_000
    got = back.select(F.col("key").cast("string").alias("key"),
                      F.col("value").cast("string").alias("value"))
    assert_df_equality(got, df, ignore_row_order=True, ignore_nullable=True)
    placed = back.select(F.col("key"), "partition").toArrow()
    keys = placed.column("key").to_pylist()
    parts = placed.column("partition").to_pylist()
    assert all(partition_for_key(k, 4) == p for k, p in zip(keys[::97], parts[::97], strict=True))
    offsets = back.groupBy("partition").agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"),
                                           F.count("*").alias("n")).collect()
    assert len(offsets) == 4
    for row in offsets:  # one job: every partition's records are contiguous from 0
        assert (row.lo, row.hi + 1) == (0, row.n)


def test_schema_is_spark_kafka_schema(spark, root):
    df = read(spark, root, subscribe="events", includeHeaders="true")
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>")]


def test_headers_round_trip(spark, root):
    df = spark.createDataFrame(
        [("a", "1", [("h1", b"x"), ("h2", None)]), ("b", "2", []), ("c", "3", None)],
        "key string, value string, headers array<struct<key:string,value:binary>>")
    write(df, root, topic="events")
    back = read(spark, root, subscribe="events", includeHeaders="true")
    got = {r.key.decode(): r.headers for r in back.collect()}
    assert [(h.key, h.value) for h in got["a"]] == [("h1", b"x"), ("h2", None)]
    assert got["b"] == []
    assert got["c"] in (None, [])


def test_offset_and_timestamp_options_select_subsets(spark, tmp_path):
    log = Log(tmp_path / "log")
    log.create_topic("t", partitions=2)
    with log.producer() as producer:
        for p in range(2):
            for i in range(10):
                producer.send("t", f"{p}-{i}".encode(), partition=p, timestamp_ms=1_000 * (i + 1))
    root = str(tmp_path / "log")

    def values(**options):
        options.setdefault("subscribe", "t") if "assign" not in options else None
        return sorted(r.value.decode() for r in read(spark, root, **options).collect())

    assert len(values()) == 20
    assert values(startingOffsets=json.dumps({"t": {"0": 8, "1": -2}}),
                  endingOffsets=json.dumps({"t": {"0": -1, "1": 2}})) == ["0-8", "0-9", "1-0", "1-1"]
    assert values(startingTimestamp="9000") == ["0-8", "0-9", "1-8", "1-9"]
    assert values(startingOffsetsByTimestamp=json.dumps({"t": {"0": 10_000, "1": 1}}),
                  endingOffsetsByTimestamp=json.dumps({"t": {"0": 20_000, "1": 2_500}})
                  ) == ["0-9", "1-0", "1-1"]  # an ending position is exclusive
    assert values(assign=json.dumps({"t": [1]}), endingTimestamp="3000") == ["1-0", "1-1"]


def test_min_partitions_and_max_records_split_ranges(spark, root):
    write(rows(spark, 10_000, partitions=1), root, topic="events")
    assert read(spark, root, subscribe="events").rdd.getNumPartitions() == 4
    split = read(spark, root, subscribe="events", minPartitions="10")
    assert split.rdd.getNumPartitions() >= 10
    assert split.count() == 10_000
    capped = read(spark, root, subscribe="events", maxRecordsPerPartition="1000")
    assert capped.rdd.getNumPartitions() >= 10
    assert capped.select("partition", "offset").distinct().count() == 10_000


def test_filters_prune_and_stay_correct(spark, root):
    write(rows(spark, 4_000), root, topic="events")
    df = read(spark, root, subscribe="events")
    picked = df.where((F.col("partition") == 1) & (F.col("offset") >= 5) & (F.col("offset") < 9))
    assert sorted(r.offset for r in picked.collect()) == [5, 6, 7, 8]
    assert df.where(F.col("topic") == "other").count() == 0
    assert df.where(F.col("offset").isin(0, 2)).count() == 8
    # Spark pushes `<>` as Not(EqualTo): a filter with no attribute, left to Spark.
    assert df.where(F.col("partition") != 1).count() == 4_000 - df.where(F.col("partition") == 1).count()
    assert df.where(F.col("timestamp") >= F.current_timestamp() + F.expr("INTERVAL 1 DAY")).count() == 0


def test_reads_work_unpruned_with_filter_pushdown_disabled(spark, root):
    write(rows(spark, 1_000), root, topic="events")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        df = read(spark, root, subscribe="events")
        assert df.where(F.col("partition") == 1).count() == \
            Log(root).read("events", 1).num_rows > 0
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def bad_partition_after(batches_first, first_attempt_only):
    """A mapInArrow function adding a ``partition`` column that turns bad part-way through.

    Rows get a null partition (the Kafka partitioner places them) until
    batch ``batches_first``, whose first row asks for partition 99: the
    writer has then appended the earlier batches, and the task fails on the
    bad row, a partial write.  Later attempts are clean if
    ``first_attempt_only``.
    """

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        failing = not first_attempt_only or TaskContext.get().attemptNumber() == 0
        for i, batch in enumerate(batches):
            parts = [None] * batch.num_rows
            if failing and i == batches_first:
                parts[0] = 99
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(parts, pa.int32())],
                names=[*batch.schema.names, "partition"])

    return run


def with_partition(df):
    return StructType([*df.schema.fields, StructField("partition", IntegerType())])


def test_task_failing_after_partial_write_is_retried_exactly_once(spark, root):
    df = rows(spark, 20_000, partitions=2)
    flaky = df.mapInArrow(bad_partition_after(5, True), with_partition(df))
    # Small Arrow batches so that each task writes some records before it fails.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        # Small log batches and data objects too, or the writer would merge the task's
        # input into one send, and stage it all until the (failing) end of the task.
        write(flaky, root, topic="events", **{"batch.size": "4096", "dataObjectBytes": "16k"})
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    committed = read(spark, root, subscribe="events")
    assert committed.count() == 20_000
    assert committed.select("key").distinct().count() == 20_000
    everything = read(spark, root, subscribe="events", **{"isolation.level": "read_uncommitted"})
    # The failed attempts' records, aborted: all they sent but what was still staged below
    # dataObjectBytes when they failed.
    assert everything.count() >= 20_000 + 2 * 4_000
    log = Log(root)
    assert nothing_holds_the_lso(log, "events", 4)
    assert hanging(log) == []


def test_failed_job_is_invisible_to_read_committed_only(spark, root):
    df = rows(spark, 5_000, partitions=2)
    broken = df.mapInArrow(bad_partition_after(3, False), with_partition(df))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        with pytest.raises(Exception, match="asks for partition 99"):
            write(broken, root, topic="events", **{"batch.size": "4096",
                                                  "dataObjectBytes": "16k"})
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert read(spark, root, subscribe="events").count() == 0
    assert read(spark, root, subscribe="events",
                **{"isolation.level": "read_uncommitted"}).count() >= 1_500
    log = Log(root)
    assert nothing_holds_the_lso(log, "events", 4)


def hold_partition_1_until(flag):
    """A mapInArrow function: partition 0 passes its rows on, partition 1 drops its rows and
    finishes only once file ``flag`` exists (so the test acts after task 0 wrote)."""

    def run(batches):
        import os
        import time

        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 0:
            yield from batches
            return
        for _ in batches:
            pass
        deadline = time.monotonic() + 120
        while not os.path.exists(flag):
            assert time.monotonic() < deadline, f"{flag} never appeared"
            time.sleep(0.01)

    return run


def test_job_whose_commit_fails_leaves_nothing_and_next_job_is_clean(spark, root, tmp_path):
    df = rows(spark, 2_000, partitions=2)
    flag = tmp_path / "go"
    log = Log(root)

    def abort_job_once_task_0_wrote() -> None:
        # An operator aborts the job (`txlog transactions abort`) after task 0 wrote its
        # 1000 records and before the driver commits: the driver's commit must fail.
        try:
            wait_for(lambda: sum(log.read("events", p, isolation_level="read_uncommitted")
                                 .num_rows for p in range(4)) == 1_000, 120, "task 0's records")
            for txn_id in log.coordinator.transactional_ids():
                if txn_id.startswith("doomed-"):
                    log.coordinator.abort_open(txn_id, "aborted by an operator")
        finally:
            flag.touch()

    operator = threading.Thread(target=abort_job_once_task_0_wrote)
    operator.start()
    try:
        with pytest.raises(Exception, match="already stands as an ABORT"):
            write(df.mapInArrow(hold_partition_1_until(str(flag)), df.schema), root,
                  topic="events", **{"transactional.id.prefix": "doomed"})
    finally:
        operator.join()
    assert read(spark, root, subscribe="events").count() == 0
    log = Log(root)
    assert nothing_holds_the_lso(log, "events", 4)
    assert hanging(log) == []
    write(rows(spark, 100), root, topic="events", **{"transactional.id.prefix": "doomed"})
    assert read(spark, root, subscribe="events").count() == 100


def test_job_longer_than_its_timeout_commits_while_aborters_run(spark, root):
    def slow(batches):
        import time

        from pyspark import TaskContext

        for batch in batches:
            yield batch
        if TaskContext.get().partitionId() == 1:
            time.sleep(6)  # three transaction timeouts after the other task prepared

    df = rows(spark, 2_000, partitions=2)
    stop = threading.Event()
    aborted: list[str] = []

    def aborter() -> None:  # what every writer and reader of the log does now and then
        log = Log(root)
        while not stop.wait(0.2):
            aborted.extend(log.abort_expired_transactions())

    thread = threading.Thread(target=aborter)
    thread.start()
    try:
        write(df.mapInArrow(slow, df.schema), root, topic="events",
              **{"transaction.timeout.ms": "2000"})
    finally:
        stop.set()
        thread.join()
    assert aborted == []
    assert read(spark, root, subscribe="events").count() == 2_000


def test_bad_options_are_named_before_anything_is_written(spark, root):
    df = rows(spark, 10)
    cases = [
        (lambda: read(spark, root).collect(), "subscribe"),
        (lambda: read(spark, root, subscribe="events", assign='{"events":[0]}').collect(), "assign"),
        (lambda: read(spark, root, subscribe="events", startingOffsets="{bad").collect(),
         "startingOffsets"),
        (lambda: read(spark, root, subscribe="events", **{"isolation.level": "dirty"}).collect(),
         "isolation.level"),
        (lambda: read(spark, root, subscribe="nope").collect(), "nope"),
        (lambda: spark.read.format("txlog").option("subscribe", "events").load().collect(), "path"),
        (lambda: write(df, root, topic="nope", createTopics="false"), "nope"),
        (lambda: write(df.select("key"), root, topic="events"), "value"),
        (lambda: write(df.select("key", F.lit(1).alias("value")), root, topic="events"), "value"),
        (lambda: write(df, root, topic="events", deliveryGuarantee="maybe"), "deliveryGuarantee"),
        (lambda: write(df, root), "topic"),
    ]
    for action, needle in cases:
        with pytest.raises(Exception, match=needle):
            action()
    assert Log(root).end_offset("events", 0) == 0


def test_overwrite_mode_is_refused(spark, root):
    with pytest.raises(Exception, match="append"):
        rows(spark, 10).write.format("txlog").mode("overwrite").option("path", str(root)) \
            .option("topic", "events").save()


def test_at_least_once_writes_without_transactions(spark, root):
    write(rows(spark, 1_000), root, topic="events", deliveryGuarantee="at_least_once")
    assert read(spark, root, subscribe="events").count() == 1_000
    log = Log(root)
    assert log.coordinator.transactional_ids() == []


def test_topic_column_and_create_topics(spark, tmp_path):
    root = tmp_path / "fresh"
    df = spark.createDataFrame([("a", "x"), ("b", "y"), ("a", "z")], "topic string, value string")
    write(df, root, createTopics="true", numPartitions="3")
    log = Log(root)
    assert log.describe_topic("a").partitions == 3
    assert read(spark, root, subscribePattern="[ab]").count() == 3
    assert sorted(r.value for r in read(spark, root, subscribe="a").collect()) == [b"x", b"z"]


def test_read_arrow_batches_match_core_read(spark, root):
    write(rows(spark, 3_000), root, topic="events")
    log = Log(root)
    core = pa.concat_tables([log.read("events", p) for p in range(4)])
    spark_rows = read(spark, root, subscribe="events").toArrow()
    assert spark_rows.num_rows == core.num_rows
    assert sorted(spark_rows.column("value").to_pylist()) == sorted(core.column("value").to_pylist())


def test_reads_of_a_compacted_topic_start_at_its_log_start(spark, tmp_path):
    root = tmp_path / "log"
    log = Log(root, fsync=False)
    log.create_topic("events", 1, {"segment.bytes": 4096, "retention.bytes": 16384})
    producer = log.producer()
    for i in range(60):
        producer.send("events", f"v{i}".encode(), partition=0)
        producer.flush()
    log.compact("events", upto_lag=10)
    start = log.apply_retention("events")[0].log_start
    assert 0 < start < 50
    values = [r.value for r in read(spark, root, subscribe="events").orderBy("offset").collect()]
    assert values == [f"v{i}".encode() for i in range(start, 60)]
    assert read(spark, root, subscribe="events", minPartitions="3").count() == 60 - start
    with pytest.raises(Exception, match=f"starting offset 0 of events-0 is outside the readable "
                                        f"offsets {start} to 60"):
        read(spark, root, subscribe="events",
             startingOffsets=json.dumps({"events": {"0": 0}})).collect()
    lenient = read(spark, root, subscribe="events", failOnDataLoss="false",
                   startingOffsets=json.dumps({"events": {"0": 0}}))
    assert lenient.count() == 60 - start


def test_jobs_in_reused_workers_see_partitions_topics_and_roots_made_since(spark, tmp_path):
    """A Python worker keeps its Log from task to task (spark/worker_logs.py); each job
    still sees what a newly opened Log would: partitions added, a topic deleted and
    created anew, the whole root deleted and created anew."""
    root = tmp_path / "log"
    Log(root).create_topic("events", partitions=2)
    write(rows(spark, 2_000), root, topic="events")
    Log(root).create_partitions("events", 4)
    write(rows(spark, 2_000), root, topic="events")
    counts = {r.partition: r["count"] for r in
              read(spark, root, subscribe="events").groupBy("partition").count().collect()}
    assert sorted(counts) == [0, 1, 2, 3] and sum(counts.values()) == 4_000

    log = Log(root)
    log.delete_topic("events")
    log.create_topic("events", partitions=3)
    write(rows(spark, 1_000), root, topic="events")
    assert read(spark, root, subscribe="events").count() == 1_000

    import shutil
    shutil.rmtree(root)
    Log(root).create_topic("events", partitions=2)
    with Log(root).producer() as producer:  # takes the new root's first producer ids
        producer.send("events", b"first", partition=0)
    write(rows(spark, 1_000), root, topic="events", deliveryGuarantee="at_least_once")
    back = read(spark, root, subscribe="events")
    assert back.count() == 1_001
    assert back.select("value").distinct().count() == 1_001


def fail_first_attempt_of_task_0(batches):
    """A mapInArrow function: task 0's first attempt fails after passing its rows on (the
    writer joined the job and may have sent them), so Spark retries it."""
    from pyspark import TaskContext

    yield from batches
    ctx = TaskContext.get()
    if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        raise RuntimeError("task 0's first attempt fails on purpose")


@pytest.mark.parametrize("jobs", [3, pytest.param(200, marks=LARGE)], ids=["3", "200"])
@pytest.mark.parametrize("options", [{"transactional.id.prefix": "etl"}, {}],
                         ids=["prefix", "pooled"])
def test_many_jobs_with_retried_tasks_leave_ids_and_producers_bounded(spark, root, options,
                                                                      jobs):
    """Every job has task 0 retried, and every task writes every partition (keyed rows).
    The jobs re-use their attempts' ids, so neither the coordinator's chains nor the
    partitions' producer entries grow past one per attempt id (gc between jobs keeps
    them).  Fails with the attempt keyed by taskAttemptId (a new id, and producer, per
    attempt)."""
    df = rows(spark, 400, partitions=2)
    retried = df.mapInArrow(fail_first_attempt_of_task_0, df.schema)
    log = Log(root)

    def counts():
        ids = [t for t in log.coordinator.transactional_ids() if t.startswith(("spark-", "etl"))]
        return sorted(ids), sum(len(log.partition("events", p).state().producers)
                                for p in range(4))

    seen = []
    for _ in range(jobs):
        write(retried, root, topic="events", **options)
        # The job returned at its decision: roll it forward (as the next reader or writer
        # would) before gc and the counts, so that every job is counted at the same point.
        assert hanging(log) == []
        # The writer's own roll-forward may still be publishing a chain's Complete version,
        # in the process that committed: gc trims a chain only under a writer that has not
        # stalled for chain_age_s (admin/gc.py _trim_chain).  At 0 it took the predecessor
        # from under that publish, whose check then withdrew it and emptied the chain: a
        # new producer id, 4 entries more, every few dozen jobs.
        log.gc(chain_age_s=5, decision_age_s=0)
        ids, entries = counts()
        seen.append((tuple(ids), entries))
    # Task 0's two attempts and task 1's, the same three ids in every job.  The attempts
    # that succeed write every partition; the failed one's records reach the partitions
    # only when its writer sent them before the failure (the task races its sender), and
    # its producer's entries then stay as the others' do: at most one entry per id and
    # partition, however many jobs ran.
    assert len({ids for ids, _ in seen}) == 1 and len(ids) == 3, seen
    assert all(2 * 4 <= n <= 3 * 4 for _, n in seen), [n for _, n in seen]
    assert read(spark, root, subscribe="events").count() == jobs * 400
    assert hanging(log) == []
