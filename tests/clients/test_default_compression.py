"""Batches are compressed unless a producer is told otherwise (issue 32): the native
producer and txlog.kafka's write zstd by default, and ``none`` / ``None`` still write
uncompressed batches that read back beside compressed ones.  A batch too small for a
codec to pay (format.batch.MIN_COMPRESSED_BYTES) is written uncompressed, and its
header says so."""

from __future__ import annotations

import pyarrow as pa
import pytest

from txlog import Log
from txlog.format.batch import MIN_COMPRESSED_BYTES
from txlog.kafka import KafkaProducer

from helpers_core import read_chain


# A value that makes a batch of one record large enough to compress.
VALUE = b"0123456789abcdef" * (MIN_COMPRESSED_BYTES // 16)


def _codecs(root: str, topic: str) -> list[str | None]:
    return [b.header.compression for b in read_chain(root, topic, 0)]


@pytest.mark.parametrize("config, codec", [
    ({}, "zstd"), ({"compression": "none"}, None), ({"compression": None}, None),
    ({"compression": "lz4"}, "lz4"), ({"compression_type": "lz4"}, "lz4")])
def test_the_native_producer_compresses_with_zstd_unless_told(tmp_path, config, codec) -> None:
    log = Log(tmp_path)
    log.create_topic("t", 1)
    with log.producer(linger_ms=0, **config) as producer:
        producer.send("t", VALUE, partition=0).get()
    assert _codecs(str(tmp_path), "t") == [codec]


@pytest.mark.parametrize("config, codec", [
    ({}, "zstd"), ({"compression_type": None}, None), ({"compression_type": "lz4"}, "lz4")])
def test_kafka_producer_compresses_with_zstd_unless_told(tmp_path, config, codec) -> None:
    Log(tmp_path).create_topic("t", 1)
    with KafkaProducer(bootstrap_servers=str(tmp_path), **config) as producer:
        producer.send("t", VALUE, partition=0).get(timeout=10)
    assert _codecs(str(tmp_path), "t") == [codec]


def test_uncompressed_and_compressed_batches_read_back_in_one_partition(tmp_path) -> None:
    log = Log(tmp_path)
    log.create_topic("t", 1)
    for i, codec in enumerate(("none", "zstd", "lz4", "none")):
        with log.producer(linger_ms=0, compression=codec) as producer:
            producer.send("t", b"v%d" % i + VALUE, key=b"k", partition=0).get()
    assert _codecs(str(tmp_path), "t") == [None, "zstd", "lz4", None]
    assert log.read("t", 0).column("value").to_pylist() == [
        b"v0" + VALUE, b"v1" + VALUE, b"v2" + VALUE, b"v3" + VALUE]


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_batch_too_small_to_compress_is_written_and_labelled_uncompressed(tmp_path, codec
                                                                            ) -> None:
    """Compressing a small body costs a fixed time per batch and saves next to nothing; its
    header's codec bits say what the payload holds, so they say none."""
    log = Log(tmp_path)
    log.create_topic("t", 1)
    small, large = b"x" * 100, VALUE
    with log.producer(linger_ms=0, compression=codec) as producer:
        producer.send("t", small, partition=0).get()
        producer.send("t", large, partition=0).get()
        producer.send_table("t", pa.table({"value": [small] * 3}), partition=0)
    assert _codecs(str(tmp_path), "t") == [None, codec, None]
    assert log.read("t", 0).column("value").to_pylist() == [small, large, small, small, small]
