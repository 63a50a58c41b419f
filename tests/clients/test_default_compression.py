"""Batches are compressed unless a producer is told otherwise (issue 32): the native
producer and txlog.kafka's write zstd by default, and ``none`` / ``None`` still write
uncompressed batches that read back beside compressed ones."""

from __future__ import annotations

import pytest

from txlog import Log
from txlog.kafka import KafkaProducer

from helpers_core import read_chain


def _codecs(root: str, topic: str) -> list[str | None]:
    return [b.header.compression for b in read_chain(root, topic, 0)]


@pytest.mark.parametrize("config, codec", [
    ({}, "zstd"), ({"compression": "none"}, None), ({"compression": None}, None),
    ({"compression": "lz4"}, "lz4"), ({"compression_type": "lz4"}, "lz4")])
def test_the_native_producer_compresses_with_zstd_unless_told(tmp_path, config, codec) -> None:
    log = Log(tmp_path)
    log.create_topic("t", 1)
    with log.producer(linger_ms=0, **config) as producer:
        producer.send("t", b"value", partition=0).get()
    assert _codecs(str(tmp_path), "t") == [codec]


@pytest.mark.parametrize("config, codec", [
    ({}, "zstd"), ({"compression_type": None}, None), ({"compression_type": "lz4"}, "lz4")])
def test_kafka_producer_compresses_with_zstd_unless_told(tmp_path, config, codec) -> None:
    Log(tmp_path).create_topic("t", 1)
    with KafkaProducer(bootstrap_servers=str(tmp_path), **config) as producer:
        producer.send("t", b"value", partition=0).get(timeout=10)
    assert _codecs(str(tmp_path), "t") == [codec]


def test_uncompressed_and_compressed_batches_read_back_in_one_partition(tmp_path) -> None:
    log = Log(tmp_path)
    log.create_topic("t", 1)
    for i, codec in enumerate(("none", "zstd", "lz4", "none")):
        with log.producer(linger_ms=0, compression=codec) as producer:
            producer.send("t", b"v%d" % i, key=b"k", partition=0).get()
    assert _codecs(str(tmp_path), "t") == [None, "zstd", "lz4", None]
    assert log.read("t", 0).column("value").to_pylist() == [b"v0", b"v1", b"v2", b"v3"]
