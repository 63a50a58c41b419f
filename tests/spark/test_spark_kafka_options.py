"""Spark's Kafka options and the event-time column, through the shared SparkSession."""

from __future__ import annotations

import json
import sys
import time

import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark")

import pyspark.cloudpickle  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from conftest import run_python  # noqa: E402
from spark_io import read, write  # noqa: E402
from txlog import Log  # noqa: E402

pyspark.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BASE_MS = 1_700_000_000_000


def rows(spark, n, partitions=2):
    return spark.range(n, numPartitions=partitions).select(
        F.format_string("k%05d", "id").alias("key"), F.format_string("value-%d", "id").alias("value"))


@pytest.fixture
def root(tmp_path):
    Log(tmp_path / "log").create_topic("events", partitions=2)
    return tmp_path / "log"


def dumped_batches(root, partition):
    done = run_python(["-m", "txlog.cli", "--root", str(root), "dump", "events", str(partition),
                       "--json"])
    return [d for d in map(json.loads, done.stdout.splitlines()) if d.get("kind") == "batch"]


def test_kafka_compression_type_zstd_writes_zstd_batches(spark, root):
    write(rows(spark, 2_000), root, topic="events", **{"kafka.compression.type": "zstd",
                                                       "kafka.batch.size": "16384"})
    # Markers are never compressed; neither is a batch too small for a codec to pay
    # (docs/format.md 2.4): the tail of one of Spark's input batches may be one.
    batches = [b for p in range(2) for b in dumped_batches(root, p) if not b["isControl"]]
    # kafka.batch.size is honoured too: 2,000 records of ~40 bytes make several 16 KiB batches.
    assert len(batches) > 2
    assert {b["compression"] for b in batches if b["count"] >= 200} == {"zstd"}
    assert {b["compression"] for b in batches} <= {"zstd", "none"}
    assert sum(b["count"] for b in batches) == 2_000
    assert read(spark, root, subscribe="events").count() == 2_000


@pytest.mark.parametrize("option, value", [
    ("kafka.key.serializer", "org.apache.kafka.common.serialization.StringSerializer"),
    ("kafka.value.serializer", "org.apache.kafka.common.serialization.StringSerializer"),
    ("kafka.partitioner.class", "com.example.MyPartitioner"),
    ("kafka.interceptor.classes", "com.example.Audit"),
    ("kafka.transactional.id", "etl"),
    ("kafka.compression.type", "gzip"),
    ("kafka.enable.idempotence", "false"),
])
def test_refused_write_option_fails_before_anything_is_written(spark, root, option, value):
    with pytest.raises(Exception, match=f"option '{option}'"):
        write(rows(spark, 100), root, topic="events", **{option: value})
    log = Log(root)
    assert [log.end_offset("events", p) for p in (0, 1)] == [0, 0]
    assert log.coordinator.transactional_ids() == []


@pytest.mark.parametrize("option", ["kafka.key.deserializer", "kafka.value.deserializer",
                                    "kafka.enable.auto.commit", "kafka.interceptor.classes",
                                    "kafka.auto.offset.reset"])
def test_refused_read_option_is_named(spark, root, option):
    with pytest.raises(Exception, match=f"option '{option}'"):
        read(spark, root, subscribe="events", **{option: "x"}).collect()


def test_refused_stream_write_option_fails_before_anything_is_written(spark, root, tmp_path):
    write(rows(spark, 10), root, topic="events")
    Log(root).create_topic("out", partitions=1)
    stream = (spark.readStream.format("txlog").option("path", str(root))
              .option("subscribe", "events").option("startingOffsets", "earliest").load()
              .select("key", "value").writeStream.format("txlog")
              .option("path", str(root)).option("topic", "out")
              .option("transactional.id.prefix", "refused")
              .option("checkpointLocation", str(tmp_path / "ck"))
              .option("kafka.value.serializer", "x"))
    with pytest.raises(Exception, match="option 'kafka.value.serializer'"):
        query = stream.start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    assert Log(root).end_offset("out", 0) == 0


def test_timestamp_column_becomes_create_time(spark, root):
    # Epoch milliseconds, some with sub-second parts, one null (the time of the write).
    df = spark.range(50, numPartitions=2).select(
        F.format_string("k%d", "id").alias("key"), F.format_string("v%d", "id").alias("value"),
        F.when(F.col("id") == 7, F.lit(None))
         .otherwise(F.timestamp_millis(F.lit(BASE_MS) + F.col("id") * 1_234_567)).alias("timestamp"))
    before = int(time.time() * 1000)
    write(df, root, topic="events")
    after = int(time.time() * 1000)
    back = read(spark, root, subscribe="events").select(
        F.col("key").cast("string").alias("key"), "timestamp", "timestampType",
        F.unix_millis("timestamp").alias("ms"))
    got = {r.key: r for r in back.collect()}
    expected = {r.key: r.timestamp for r in df.select("key", "timestamp").collect()}
    assert set(got) == set(expected)
    assert {r.timestampType for r in got.values()} == {0}  # CreateTime
    for key, ts in expected.items():
        if ts is None:
            assert before <= got[key].ms <= after
        else:
            assert got[key].timestamp == ts
    # The core stored the same milliseconds (not the write time).
    stored = [t for p in (0, 1) for t in
              Log(root).read("events", p).column("timestamp")
              .cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()]
    assert sorted(BASE_MS + i * 1_234_567 for i in range(50) if i != 7) == \
        sorted(t for t in stored if t < before)


def test_timestamp_before_1970_fails_and_writes_nothing(spark, root):
    df = spark.range(10, numPartitions=1).select(
        F.format_string("v%d", "id").alias("value"),
        F.timestamp_millis(F.lit(-5_000) + F.col("id") * 1_000).alias("timestamp"))
    with pytest.raises(Exception, match="column 'timestamp' holds"):
        write(df, root, topic="events")
    assert read(spark, root, subscribe="events").count() == 0


def test_timestamp_column_of_another_type_is_refused(spark, root):
    df = spark.range(3).select(F.lit("v").alias("value"), F.col("id").alias("timestamp"))
    with pytest.raises(Exception, match="column 'timestamp' has type bigint"):
        write(df, root, topic="events")
    assert Log(root).end_offset("events", 0) == 0


def test_producer_settings_reach_the_producer():
    from txlog.clients.producer import DEFAULT_BATCH_SIZE
    from txlog.spark.options import WriteOptions
    from txlog.spark.writer import TxlogBatchWriter

    def config(**options):
        opts = WriteOptions.parse({"path": "/p", "topic": "t", **options}, streaming=False)
        return TxlogBatchWriter(opts, None)._producer_config()

    # Sizes not given are the core's, for the store the task opens (test_store_defaults.py).
    assert config() == {"compression": "zstd"}
    assert config(**{"kafka.compression.type": "lz4", "kafka.linger.ms": "50",
                     "kafka.batch.size": "65536"}) == \
        {"compression": "lz4", "batch_size": 65536, "linger_ms": 50}
    # max.request.size bounds the batch, whether batch.size is given or left at its default.
    assert config(**{"kafka.max.request.size": "4096"})["batch_size"] == 4096
    assert config(**{"kafka.max.request.size": str(DEFAULT_BATCH_SIZE * 2)})["batch_size"] == \
        DEFAULT_BATCH_SIZE
    assert config(**{"batch.size": "64k", "kafka.max.request.size": "16384"})["batch_size"] == \
        16384


def test_record_larger_than_max_request_size_fails_and_writes_nothing(spark, root):
    df = spark.createDataFrame([("k", "v" * 10), ("k", "v" * 3_000)], "key string, value string")
    with pytest.raises(Exception, match=r"record of 3001 bytes .* kafka.max.request.size \(2048\)"):
        write(df, root, topic="events", **{"kafka.max.request.size": "2048"})
    assert read(spark, root, subscribe="events").count() == 0
    write(df, root, topic="events", **{"kafka.max.request.size": "4096"})
    assert read(spark, root, subscribe="events").count() == 2


def test_record_sizes_count_key_value_and_headers():
    import pyarrow as pa
    from txlog.errors import InvalidConfigError
    from txlog.spark.writer import _check_record_sizes

    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    table = pa.table({
        "key": pa.array([b"ab", None, b"c"]),
        "value": pa.array([b"x" * 10, b"y" * 5, None]),
        "headers": pa.array([[{"key": "h", "value": b"123"}], None,
                             [{"key": "hh", "value": b"1"}, {"key": "k", "value": None}]],
                            headers)})
    _check_record_sizes(table, 16)  # 2 + 10 + 1 + 3
    with pytest.raises(InvalidConfigError, match="record of 16 bytes"):
        _check_record_sizes(table, 15)
    _check_record_sizes(pa.table({"value": pa.array([], pa.binary())}), 1)
