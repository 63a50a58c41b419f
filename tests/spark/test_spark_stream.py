"""The Spark streaming source and sink, through the shared SparkSession (local[2,4]).

Queries run with Trigger.AvailableNow (drain what is there, stop) or with
processAllAvailable(), so no test waits on a clock.  Expected records are
derived from what the test's producers had acknowledged.
"""

from __future__ import annotations

import sys

import pytest

pyspark = pytest.importorskip("pyspark")

import pyspark.cloudpickle  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,  # noqa: E402
                                              ReadMinRows)

from helpers_core import nothing_holds_the_lso  # noqa: E402
from txlog import Log  # noqa: E402
import txlog.clock  # noqa: E402
from txlog.spark.options import ReadOptions  # noqa: E402
from txlog.spark.reader import spark_schema  # noqa: E402
from txlog.spark.stream_reader import TxlogStreamReader  # noqa: E402

pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def root(tmp_path):
    log = Log(tmp_path / "log")
    log.create_topic("src", partitions=2)
    log.create_topic("dst", partitions=2)
    return tmp_path / "log"


def produce_plain(log: Log, values: list[str], topic: str = "src") -> None:
    producer = log.producer(linger_ms=3_600_000)
    for v in values:
        producer.send(topic, v.encode(), key=v.encode())
    producer.flush()
    producer.close()


def stream(spark, root, **options):
    reader = spark.readStream.format("txlog").option("path", str(root)) \
        .option("subscribe", "src").option("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def copy_upper(df, root, checkpoint, **options):
    """The test pipeline: upper-case the values into topic dst, exactly once."""
    writer = df.selectExpr("key", "upper(cast(value as string)) as value").writeStream \
        .format("txlog").option("path", str(root)).option("topic", "dst") \
        .option("transactional.id.prefix", "copy").option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


def sink_values(spark, root, topic="dst") -> list[str]:
    df = spark.read.format("txlog").option("path", str(root)).option("subscribe", topic).load()
    return sorted(r.v for r in df.select(F.col("value").cast("string").alias("v")).collect())


def run_available_now(writer) -> list[dict]:
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    assert query.exception() is None
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def test_stream_copies_exactly_the_committed_records(spark, root, tmp_path):
    log = Log(root)
    producer = log.producer(transactional_id="gen")
    producer.init_transactions()
    committed = []
    for i in range(12):
        producer.begin_transaction()
        batch = [f"t{i}-{j}" for j in range(7)]
        for v in batch:
            producer.send("src", v.encode(), key=v.encode())
        if i % 3 == 1:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed += batch
    # A transaction left open while the query runs holds back what follows it (the LSO).
    producer.begin_transaction()
    for v in ("open-0", "open-1"):
        producer.send("src", v.encode(), key=v.encode(), partition=0).get()
    plain = log.producer()
    plain.send("src", b"plain-0", partition=0).get()  # behind the open transaction
    plain.send("src", b"plain-1", partition=1).get()  # not behind it
    held = ["open-0", "open-1", "plain-0"]
    committed.append("plain-1")

    progress = run_available_now(copy_upper(stream(spark, root, maxOffsetsPerTrigger="20"),
                                            root, tmp_path / "ck"))
    assert len(progress) > 3  # the limit cut the backlog into several micro-batches
    assert sink_values(spark, root) == sorted(v.upper() for v in committed)
    producer.commit_transaction()
    progress += run_available_now(copy_upper(stream(spark, root), root, tmp_path / "ck"))
    committed += held
    assert sink_values(spark, root) == sorted(v.upper() for v in committed)
    # The sink recorded every micro-batch it committed, and left nothing open.
    # (under the query's own id: docs/spark.md, "One query owns a prefix").
    assert log.committed("copy-sink") == {(f"_batch.{progress[-1]['id']}", 0):
                                          progress[-1]["batchId"] + 1}
    assert nothing_holds_the_lso(log, "dst", 2)


def test_restart_from_the_checkpoint_neither_loses_nor_repeats(spark, root, tmp_path):
    log = Log(root)
    produce_plain(log, [f"a{i}" for i in range(30)])
    run_available_now(copy_upper(stream(spark, root), root, tmp_path / "ck"))
    produce_plain(log, [f"b{i}" for i in range(30)])
    log.create_partitions("src", 3)  # a partition added between the runs is read too
    producer = log.producer()
    producer.send("src", b"c-new", partition=2).get()
    run_available_now(copy_upper(stream(spark, root), root, tmp_path / "ck",
                                 groupId="copy-readers"))
    expected = [f"A{i}" for i in range(30)] + [f"B{i}" for i in range(30)] + ["C-NEW"]
    assert sink_values(spark, root) == sorted(expected)
    # The query's progress in its group, committed with the sink's transaction.
    assert log.committed("copy-readers") == {("src", p): log.end_offset("src", p)
                                             for p in range(3)}


def test_running_query_picks_up_new_records_and_partitions(spark, root, tmp_path):
    log = Log(root)
    produce_plain(log, ["x1", "x2"])
    query = copy_upper(stream(spark, root), root, tmp_path / "ck") \
        .trigger(processingTime="100 milliseconds").start()
    try:
        query.processAllAvailable()
        assert sink_values(spark, root) == ["X1", "X2"]
        log.create_partitions("src", 4)
        producer = log.producer()
        producer.send("src", b"y3", partition=3).get()
        producer.send("src", b"y0", partition=0).get()
        query.processAllAvailable()
        assert sink_values(spark, root) == ["X1", "X2", "Y0", "Y3"]
    finally:
        query.stop()
    assert query.exception() is None


def test_starting_offsets_latest_skips_what_was_there(spark, root, tmp_path):
    log = Log(root)
    produce_plain(log, ["old"])
    query = copy_upper(stream(spark, root, startingOffsets="latest"), root, tmp_path / "ck") \
        .trigger(processingTime="100 milliseconds").start()
    try:
        query.processAllAvailable()
        produce_plain(log, ["new"])
        query.processAllAvailable()
    finally:
        query.stop()
    assert sink_values(spark, root) == ["NEW"]


def test_max_offsets_per_trigger_gives_the_batch_sizes(spark, root, tmp_path):
    log = Log(root)
    producer = log.producer(linger_ms=3_600_000)
    for i in range(60):
        producer.send("src", b"v", partition=0)
    for i in range(40):
        producer.send("src", b"v", partition=1)
    producer.flush()
    progress = run_available_now(
        copy_upper(stream(spark, root, maxOffsetsPerTrigger="25"), root, tmp_path / "ck"))
    assert [p["numInputRows"] for p in progress] == [25, 25, 25, 25]
    first = progress[0]["sources"][0]["endOffset"]
    assert '"0": 15' in first and '"1": 10' in first  # shared in proportion 60:40


def test_max_bytes_per_trigger_cuts_by_batch(spark, root, tmp_path):
    log = Log(root)
    # Uncompressed: zstd would size the batches by their timestamps' bytes, a few apart,
    # and the limit below is twice the first batch's size exactly.
    producer = log.producer(linger_ms=3_600_000, compression="none")
    for batch in range(8):
        for i in range(10):
            producer.send("src", bytes(1000), partition=0)
        producer.flush()
    batch_bytes = log.partition("src", 0).header(0).payload_length
    progress = run_available_now(copy_upper(
        stream(spark, root, maxBytesPerTrigger=str(2 * batch_bytes)), root, tmp_path / "ck"))
    assert [p["numInputRows"] for p in progress] == [20, 20, 20, 20]


# --- the driver-side reader, called as Spark calls it -----------------------------------------


def driver_reader(root, **options) -> TxlogStreamReader:
    opts = ReadOptions.parse({"path": str(root), "subscribe": "src", **options}, streaming=True)
    return TxlogStreamReader(opts, to_arrow_schema(spark_schema(False), timezone="UTC"))


def test_initial_offset_is_asked_twice_and_agrees(root):
    log = Log(root)
    reader = driver_reader(root)  # startingOffsets defaults to latest
    first = reader.initialOffset()
    produce_plain(log, ["between"])
    assert reader.initialOffset() == first == {"src": {"0": 0, "1": 0}}


def test_min_offsets_per_trigger_waits_for_enough_or_for_the_delay(root, monkeypatch):
    log = Log(root)
    clock = [1_000_000]
    monkeypatch.setattr(txlog.clock, "monotonic_ms", lambda: clock[0])
    reader = driver_reader(root, startingOffsets="earliest", minOffsetsPerTrigger="10",
                           maxTriggerDelay="5s")
    start = reader.initialOffset()
    assert isinstance(reader.getDefaultReadLimit(), ReadMinRows)
    produce_plain(log, [f"v{i}" for i in range(6)])
    limit = reader.getDefaultReadLimit()
    assert reader.latestOffset(start, limit) == start  # 6 < 10: wait
    clock[0] += 4_999
    assert reader.latestOffset(start, limit) == start
    clock[0] += 2  # the delay passed: read what there is
    end = reader.latestOffset(start, limit)
    assert sum(sum(p.values()) for p in end.values()) == 6
    produce_plain(log, [f"w{i}" for i in range(10)])
    assert sum(sum(p.values()) for p in reader.latestOffset(end, limit).values()) == 16
    # Trigger.Once and friends pass ReadAllAvailable: the source's own limits do not apply.
    produce_plain(log, ["z"])
    assert reader.latestOffset(start, ReadAllAvailable()) == reader.reportLatestOffset()


def test_available_now_never_reads_past_its_target(root):
    log = Log(root)
    produce_plain(log, [f"v{i}" for i in range(10)])
    reader = driver_reader(root, startingOffsets="earliest", maxOffsetsPerTrigger="4")
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    target = reader.reportLatestOffset()
    produce_plain(log, [f"late{i}" for i in range(10)])
    log.create_partitions("src", 3)
    produce_plain(log, ["new-partition"])
    offsets, ends = start, []
    while True:
        nxt = reader.latestOffset(offsets, ReadMaxRows(4))
        if nxt == offsets:
            break
        ends.append(nxt)
        offsets = nxt
    assert ends[-1] == {**target, "src": {**target["src"], "2": 0}}
    assert len(ends) == 3  # 10 records, at most 4 per batch
    # A limit Spark passes wins over the option's value (4) for its kind; shares round down.
    assert 4 < sum(sum(p.values()) for p in reader.latestOffset(start, ReadMaxRows(7)).values()) \
        <= 7


def test_new_topics_matching_the_pattern_are_read_from_their_beginning(root):
    log = Log(root)
    produce_plain(log, ["a"])
    opts = ReadOptions.parse({"path": str(root), "subscribePattern": "s.*",
                              "startingOffsets": "earliest"}, streaming=True)
    reader = TxlogStreamReader(opts, to_arrow_schema(spark_schema(False), timezone="UTC"))
    start = reader.initialOffset()
    assert set(start) == {"src"}
    log.create_topic("src-late", partitions=1)
    log.create_topic("other", partitions=1)
    produce_plain(log, ["x", "y"], topic="src-late")
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["src-late"] == {"0": 2} and "other" not in end
    [partition] = [p for p in reader.partitions(start, end)
                   if p.ranges[0].topic == "src-late"]
    assert (partition.ranges[0].start, partition.ranges[0].end) == (0, 2)


@pytest.mark.parametrize("sweep", [True, False])
def test_the_driver_ends_expired_transactions_unless_told_not_to(root, monkeypatch, sweep):
    import txlog.clock as clock_module

    log = Log(root)
    produce_plain(log, ["a"])
    stuck = log.producer(transactional_id="dead-writer", transaction_timeout_ms=1_000)
    stuck.init_transactions()
    stuck.begin_transaction()
    stuck.send("src", b"never", partition=0).get()  # its producer dies here
    produce_plain(log, ["b"])
    options = {} if sweep else {"abortExpiredTransactions": "false"}
    reader = driver_reader(root, startingOffsets="earliest", **options)
    assert reader.reportLatestOffset()["src"]["0"] < log.end_offset("src", 0)
    later = clock_module.now_ms() + 1_001
    monkeypatch.setattr(clock_module, "now_ms", lambda: later)
    held = reader.reportLatestOffset()["src"]["0"] < Log(root).end_offset("src", 0)
    assert held != sweep


def test_lost_offsets_fail_or_are_skipped_by_option(root):
    log = Log(root)
    produce_plain(log, ["a", "b"])
    reader = driver_reader(root, startingOffsets="earliest")
    beyond = {"src": {"0": 1000, "1": 0}}
    with pytest.raises(Exception, match="failOnDataLoss"):
        reader.latestOffset(beyond, ReadAllAvailable())
    lenient = driver_reader(root, startingOffsets="earliest", failOnDataLoss="false")
    end = lenient.latestOffset(beyond, ReadAllAvailable())
    assert end == lenient.reportLatestOffset()


def test_stream_writes_refuse_complete_mode(spark, root, tmp_path):
    """Refused when the query starts, before anything is written."""
    df = stream(spark, root)
    counts = df.groupBy("key").count().select(F.col("key").alias("value"))
    complete = counts.writeStream.format("txlog").outputMode("complete") \
        .option("path", str(root)).option("topic", "dst") \
        .option("transactional.id.prefix", "p") \
        .option("checkpointLocation", str(tmp_path / "b")).start()
    with pytest.raises(Exception, match="outputMode 'append'"):
        complete.awaitTermination()
    assert Log(root).end_offset("dst", 0) == Log(root).end_offset("dst", 1) == 0


def test_a_checkpoint_set_only_in_the_session_conf_is_asked_for_as_an_option(spark, root,
                                                                           tmp_path):
    """Spark does not pass spark.sql.streaming.checkpointLocation to data sources; the sink
    needs the checkpoint to know its query, so it asks for the option by name."""
    produce_plain(Log(root), ["x"])
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "conf-ck"))
    try:
        query = stream(spark, root).select("value").writeStream.format("txlog") \
            .option("path", str(root)).option("topic", "dst") \
            .option("transactional.id.prefix", "conf-only").queryName("conf_only") \
            .trigger(availableNow=True).start()
        with pytest.raises(Exception, match="option 'checkpointLocation'.*conf_only"):
            query.awaitTermination()
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    assert Log(root).end_offset("dst", 0) == Log(root).end_offset("dst", 1) == 0
