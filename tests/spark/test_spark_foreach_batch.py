"""Spark users' exactly-once and progress surface with sinks other than txlog's own.

* ``txnAppId``/``txnVersion``: a foreachBatch writer whose driver is killed
  between its write's commit and Spark's bookkeeping writes every batch once
  (the first run is a spark-submit in its own session, SIGKILLed by its own
  foreachBatch function; the restart runs in the shared session).
* ``groupId`` on a stream read: the query's progress and lag show in ``txlog
  groups describe`` (the CLI, as a process) while the sink is Parquet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("pyspark")

import spark_jobs  # noqa: E402
from conftest import HARNESS_DIR, python_env, spark_submit_args  # noqa: E402
from txlog import Log  # noqa: E402

JOBS = HARNESS_DIR / "spark_jobs.py"


def produce(log: Log, topic: str, values: list[str]) -> None:
    producer = log.producer(linger_ms=3_600_000)
    for i, v in enumerate(values):
        producer.send(topic, v.encode(), key=v.encode(), partition=i % 2)
    producer.flush()
    producer.close()


def committed_values(log: Log, topic: str) -> list[str]:
    return [v.decode() for p in range(2)
            for v in log.read(topic, p).column("value").to_pylist()]


def test_foreach_batch_killed_after_its_write_writes_every_batch_once(spark, tmp_path):
    root, checkpoint, marker = str(tmp_path / "log"), str(tmp_path / "ck"), str(tmp_path / "killed")
    log = Log(root)
    log.create_topic("fe-in", partitions=2)
    log.create_topic("fe-out", partitions=2)
    source = [f"r{i}" for i in range(200)]
    produce(log, "fe-in", source)  # 5 micro-batches of 40 (maxOffsetsPerTrigger)

    # Its own session: the foreachBatch function kills its process group.
    first = subprocess.run([sys.executable, *spark_submit_args(JOBS, "foreach-batch", root,
                                                               checkpoint, "2", marker)],
                           env=python_env(), start_new_session=True, capture_output=True,
                           text=True, timeout=300)
    assert os.path.exists(marker), first.stdout[-3000:] + first.stderr[-3000:]
    assert first.returncode == -signal.SIGKILL
    # Killed between the write's commit and Spark's bookkeeping of batch 2.
    assert os.path.exists(f"{checkpoint}/offsets/2")
    assert not os.path.exists(f"{checkpoint}/commits/2")
    assert len(committed_values(Log(root), "fe-out")) == 3 * 40

    # The restart replays batch 2 with txnVersion 2: committed, so skipped.
    spark_jobs.foreach_batch_query(spark, root, checkpoint, 2, marker).awaitTermination()
    out = Counter(committed_values(Log(root), "fe-out"))
    assert sorted(v for v, n in out.items() if n > 1) == [], "written more than once"
    assert sorted(out) == sorted(source)
    assert Log(root).committed("txn-fe-app-sink") == {("_batch.fe-app", 0): 5}


def describe(root: str, group: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "txlog.cli", "--root", root, "groups",
                           "describe", group, "--json"], env=python_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_a_stream_read_shows_its_lag_in_its_group_with_a_parquet_sink(spark, tmp_path):
    root = str(tmp_path / "log")
    log = Log(root)
    log.create_topic("lag-in", partitions=2)
    produce(log, "lag-in", [f"a{i}" for i in range(100)])
    query = spark.readStream.format("txlog").option("path", root) \
        .option("subscribe", "lag-in").option("startingOffsets", "earliest") \
        .option("groupId", "dashboard").load() \
        .selectExpr("CAST(value AS STRING) AS value") \
        .writeStream.format("parquet").option("path", str(tmp_path / "out")) \
        .option("checkpointLocation", str(tmp_path / "ck")) \
        .trigger(processingTime="100 milliseconds").start()
    try:
        query.processAllAvailable()  # batch 0: offsets 0-50 of each partition
        produce(log, "lag-in", [f"b{i}" for i in range(60)])
        # Spark tells the source that batch 0 is committed when it plans batch 1.
        query.processAllAvailable()
    finally:
        query.stop()
    assert spark.read.parquet(str(tmp_path / "out")).count() == 160
    rows = describe(root, "dashboard")
    assert [(r["topic"], r["partition"], r["committed_offset"], r["log_end_offset"], r["lag"])
            for r in rows] == [("lag-in", 0, 50, 80, 30), ("lag-in", 1, 50, 80, 30)]


def test_the_readers_commit_records_spark_s_end_in_its_group(tmp_path):
    """Without Spark: what Spark's commit(end) does to the group (and nothing without one)."""
    from txlog.spark.options import ReadOptions
    from txlog.spark.reader import arrow_schema, spark_schema
    from txlog.spark.stream_reader import TxlogStreamReader

    root = str(tmp_path / "log")
    Log(root).create_topic("t", partitions=2)

    def reader(**extra: str) -> TxlogStreamReader:
        options = ReadOptions.parse({"path": root, "subscribe": "t", **extra}, streaming=True)
        return TxlogStreamReader(options, arrow_schema(options, spark_schema(False)))

    reader().commit({"t": {"0": 3, "1": 4}})
    assert Log(root).groups() == []
    with_group = reader(groupId="g")
    with_group.commit({"t": {"0": 3, "1": 4}})
    with_group.commit({"t": {"0": 5, "1": 4}})
    assert Log(root).committed("g") == {("t", 0): 5, ("t", 1): 4}
