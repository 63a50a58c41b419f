"""What goes in through the producer comes out of Log.read and the consumer, exactly.

Every expectation is built from what the test itself sent and the offsets the
producer acknowledged, never from hard-coded results.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass

import pyarrow as pa
import pytest
from kafka.partitioner.default import DefaultPartitioner
from kafka.partitioner.default import murmur2 as kafka_murmur2

from txlog import InvalidConfigError, Log, OffsetOutOfRangeError
from txlog.format.batch import (COMPRESSION_CODES, CREATE_TIME, LOG_APPEND_TIME,
                                MIN_COMPRESSED_BYTES)
from txlog.clients.columns import spark_schema
from txlog.partition.isolation import READ_UNCOMMITTED
from txlog.clients.partitioner import murmur2, partition_for_key

from helpers_core import data_header, read_chain, records_payload

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Sent:
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers


def rows(table: pa.Table) -> list[tuple]:
    """(offset, key, value, timestamp ms, headers) per row, from the Spark-shaped table."""
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    headers = table.column("headers").to_pylist() if "headers" in table.column_names \
        else [None] * table.num_rows
    return [(o, k, v, us // 1000, None if h is None else [(x["key"], x["value"]) for x in h])
            for o, k, v, us, h in zip(table.column("offset").to_pylist(),
                                      table.column("key").to_pylist(),
                                      table.column("value").to_pylist(), micros, headers, strict=True)]


def expected_rows(sent: dict[int, Sent], start: int, end: int) -> list[tuple]:
    return [(o, sent[o].key, sent[o].value, sent[o].timestamp, sent[o].headers)
            for o in range(start, end)]


def random_bytes_or_none(rng: random.Random) -> bytes | None:
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.3:
        return b""
    return rng.randbytes(rng.randrange(1, 300))


def write_random_records(log: Log, topic: str, rng: random.Random, batches: int,
                         compression: str | None = None) -> tuple[dict[int, Sent], list[int]]:
    """Batches of 1-20 varied records; returns records by acked offset and batch bases."""
    producer = log.producer(linger_ms=3_600_000, compression=compression)
    sent: dict[int, Sent] = {}
    bases: list[int] = []
    for _ in range(batches):
        futures = []
        for _ in range(rng.randrange(1, 21)):
            headers: Headers = [(rng.choice(["h", "", "trace-id", "é"]),
                                 random_bytes_or_none(rng)) for _ in range(rng.randrange(4))]
            record = Sent(random_bytes_or_none(rng), random_bytes_or_none(rng),
                          rng.randrange(0, 2**41), headers)
            futures.append((record, producer.send(topic, record.value, key=record.key,
                                                  partition=0, headers=headers,
                                                  timestamp_ms=record.timestamp)))
        producer.flush()
        bases.append(futures[0][1].get().offset)
        for record, future in futures:
            md = future.get()
            assert md.offset not in sent
            sent[md.offset] = record
    return sent, bases


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_random_records_round_trip_over_many_ranges(log: Log, compression: str | None) -> None:
    rng = random.Random(f"roundtrip-{compression}")
    log.create_topic("t", 1)
    sent, bases = write_random_records(log, "t", rng, batches=25, compression=compression)
    n = len(sent)
    assert sorted(sent) == list(range(n))  # acknowledged offsets are exactly 0..n-1
    assert log.end_offset("t", 0) == n
    codecs = []
    for batch in read_chain(log.storage.root, "t", 0):
        codecs.append(batch.header.compression)
        body = sum(len(v or b"") + len(k or b"") for v, k in zip(batch.values, batch.keys))
        # Only a batch whose records encode to fewer bytes than MIN_COMPRESSED_BYTES
        # goes uncompressed, and its header says so.
        assert batch.header.compression == (compression if body >= MIN_COMPRESSED_BYTES
                                             else batch.header.compression)
        assert batch.header.compression in (compression, None)
    assert compression in codecs

    ranges = {(0, n), (0, 0), (n, n), (0, 1), (n - 1, n)}
    ranges |= {(b, b) for b in bases}  # empty ranges at batch boundaries
    ranges |= {(a, b) for a in bases[:6] for b in bases[-6:] if a <= b}
    ranges |= {(b - 1, b + 1) for b in bases if b > 0}  # straddling a boundary
    for _ in range(120):
        a = rng.randrange(n + 1)
        ranges.add((a, rng.randrange(a, n + 1)))  # mostly starting/ending inside batches
    for start, end in sorted(ranges):
        table = log.read("t", 0, start, end, include_headers=True)
        assert rows(table) == expected_rows(sent, start, end), (start, end)
    # An end beyond the log is capped at the log end; no end means the log end.
    assert rows(log.read("t", 0, 3, n + 50, include_headers=True)) == expected_rows(sent, 3, n)
    assert rows(log.read("t", 0, 5, include_headers=True)) == expected_rows(sent, 5, n)
    # A reopened log (fresh caches, state from disk) reads the same.
    again = Log(log.storage.root)
    assert rows(again.read("t", 0, include_headers=True)) == expected_rows(sent, 0, n)


def test_empty_and_null_keys_values_are_distinguished(memlog: Log) -> None:
    memlog.create_topic("t", 1)
    producer = memlog.producer(linger_ms=3_600_000)
    cases = [(None, None), (b"", b""), (None, b""), (b"", None), (b"k", None), (None, b"v")]
    for key, value in cases:
        producer.send("t", value, key=key, partition=0, headers=[("h", None), ("e", b"")])
    producer.flush()
    table = memlog.read("t", 0, include_headers=True)
    assert list(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)) == cases
    assert table.column("headers").to_pylist() == [
        [{"key": "h", "value": None}, {"key": "e", "value": b""}]] * len(cases)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_ten_mib_values(log: Log, compression: str | None) -> None:
    """A 10 MiB random value survives; a compressible one is stored compressed."""
    log.create_topic("t", 1)
    producer = log.producer(compression=compression)
    random_value = os.urandom(10 << 20)
    compressible = (b"0123456789abcdef" * 4096) * 160  # 10 MiB
    offsets = [producer.send("t", random_value, key=b"r", partition=0).get().offset,
               producer.send("t", compressible, key=b"c", partition=0).get().offset]
    table = log.read("t", 0)
    assert table.column("offset").to_pylist() == offsets == [0, 1]
    assert table.column("value").to_pylist() == [random_value, compressible]
    chain = read_chain(log.storage.root, "t", 0)
    assert [b.header.compression for b in chain] == [compression, compression]
    compressed_size = chain[1].header.payload_length  # its claim points into a data object
    if compression is None:
        assert compressed_size > len(compressible)
    else:
        assert compressed_size < len(compressible) // 10


def test_unsupported_compression_is_refused(memlog: Log) -> None:
    assert set(COMPRESSION_CODES) == {None, "none", "lz4", "zstd"}
    with pytest.raises(InvalidConfigError, match="gzip"):
        memlog.producer(compression="gzip")


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_schema_is_exactly_the_spark_schema(memlog: Log, include_headers: bool) -> None:
    memlog.create_topic("t", 1)
    memlog.create_topic("lat", 1, {"message.timestamp.type": "LogAppendTime"})
    want = spark_schema(include_headers)
    assert memlog.read("t", 0, include_headers=include_headers).schema == want  # empty topic
    producer = memlog.producer()
    for topic in ("t", "lat"):
        for i in range(5):
            producer.send(topic, b"v%d" % i, key=None if i % 2 else b"k", partition=0)
        producer.flush()
    for topic in ("t", "lat"):
        for start, end in [(0, None), (1, 3), (2, 2), (5, None)]:
            for isolation in ("read_committed", READ_UNCOMMITTED):
                table = memlog.read(topic, 0, start, end, isolation, include_headers)
                assert table.schema == want, (topic, start, end)
                assert table.schema.metadata == want.metadata
    # Batches of both timestamp types in one partition still read as one table.
    part = memlog.partition("t", 0)
    part.append(data_header(count=2), records_payload([b"x", b"y"]), log_append_time=True)
    mixed = memlog.read("t", 0, include_headers=include_headers)
    assert mixed.schema == want
    assert mixed.column("timestampType").to_pylist() == [CREATE_TIME] * 5 + [LOG_APPEND_TIME] * 2


def test_offsets_out_of_range(memlog: Log) -> None:
    memlog.create_topic("t", 1)
    memlog.producer().send("t", b"a", partition=0).get()
    with pytest.raises(OffsetOutOfRangeError, match="offset 2"):
        memlog.read("t", 0, 2)
    with pytest.raises(OffsetOutOfRangeError):
        memlog.read("t", 0, -1)
    assert memlog.read("t", 0, 1).num_rows == 0  # the log end itself is a valid position
    assert memlog.read("t", 0, 1, 0).num_rows == 0  # end before start: nothing


def test_log_append_time_overrides_producer_timestamps(memlog: Log) -> None:
    memlog.create_topic("lat", 2, {"message.timestamp.type": "LogAppendTime"})
    memlog.create_topic("ct", 1)
    producer = memlog.producer(linger_ms=3_600_000)
    before = int(time.time() * 1000)
    futures = []
    for i in range(4):
        futures.append(producer.send("lat", b"v", partition=1, timestamp_ms=1_000 + i))
        producer.send("ct", b"v", partition=0, timestamp_ms=1_000 + i)
    producer.flush()
    after = int(time.time() * 1000)
    lat = memlog.read("lat", 1)
    assert lat.column("timestampType").to_pylist() == [LOG_APPEND_TIME] * 4
    stamps = {us // 1000 for us in lat.column("timestamp").cast(pa.int64()).to_pylist()}
    assert len(stamps) == 1
    appended_at = stamps.pop()
    assert before <= appended_at <= after
    # As in Kafka, the send's metadata reports the append time, not the producer's.
    assert [f.get().timestamp for f in futures] == [appended_at] * 4
    ct = memlog.read("ct", 0)
    assert ct.column("timestampType").to_pylist() == [CREATE_TIME] * 4
    assert [us // 1000 for us in ct.column("timestamp").cast(pa.int64()).to_pylist()] == \
        [1_000, 1_001, 1_002, 1_003]
    assert memlog.describe_topic("lat").config == {"message.timestamp.type": "LogAppendTime"}


def test_offsets_for_times(memlog: Log) -> None:
    """Earliest offset whose timestamp is >= the target, checked against brute force."""
    rng = random.Random(7)
    memlog.create_topic("t", 1)
    producer = memlog.producer(linger_ms=3_600_000)
    stamps: list[int] = []
    for _ in range(12):
        for _ in range(rng.randrange(1, 8)):
            ts = rng.randrange(10_000, 20_000)  # not monotonic, as Kafka allows
            producer.send("t", b"v", partition=0, timestamp_ms=ts)
            stamps.append(ts)
        producer.flush()
    consumer = memlog.consumer()
    consumer.assign([("t", 0)])
    targets = [0, 10_000, 20_000, 19_999, max(stamps), max(stamps) + 1, *stamps[::3]]
    targets += [rng.randrange(9_000, 21_000) for _ in range(40)]
    for target in targets:
        hits = [o for o, ts in enumerate(stamps) if ts >= target]
        want = (hits[0], stamps[hits[0]]) if hits else None
        assert memlog.offsets_for_times("t", 0, target) == want, target
        found = consumer.offsets_for_times({("t", 0): target})[("t", 0)]
        assert (None if found is None else (found.offset, found.timestamp)) == want


def test_consumer_assign_seek_position_poll(memlog: Log) -> None:
    memlog.create_topic("t", 2)
    producer = memlog.producer(linger_ms=3_600_000)
    sent: dict[int, list[bytes]] = {0: [], 1: []}
    for i in range(53):
        p = i % 2
        value = b"p%d-%d" % (p, i)
        producer.send("t", value, partition=p, headers=[("i", str(i).encode())])
        sent[p].append(value)
        if i % 7 == 0:
            producer.flush()
    producer.flush()
    ends = {("t", p): len(sent[p]) for p in (0, 1)}

    consumer = memlog.consumer(auto_offset_reset="earliest")
    consumer.assign([("t", 0), ("t", 1)])
    assert consumer.assignment() == {("t", 0), ("t", 1)}
    assert consumer.end_offsets() == ends
    assert consumer.beginning_offsets() == {("t", 0): 0, ("t", 1): 0}
    assert consumer.position("t", 0) == 0

    got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    for _ in range(100):
        records = consumer.poll(max_records=6)
        assert len(records) <= 6
        if not records:
            break
        for r in records:
            got[r.partition].append((r.offset, r.value))
            assert r.headers and r.headers[0][0] == "i"
            assert r.timestamp_type == CREATE_TIME
    for p in (0, 1):
        assert got[p] == list(enumerate(sent[p]))  # each partition in offset order, complete
        assert consumer.position("t", p) == len(sent[p])
    assert consumer.poll(max_records=10) == []

    consumer.seek("t", 1, 5)
    assert consumer.position("t", 1) == 5
    records = consumer.poll(max_records=4)
    assert [(r.partition, r.offset, r.value) for r in records] == \
        [(1, o, sent[1][o]) for o in range(5, 9)]
    assert consumer.position("t", 1) == 9

    consumer.seek_to_beginning(("t", 0))
    assert consumer.position("t", 0) == 0 and consumer.position("t", 1) == 9
    consumer.seek_to_end()
    assert {tp: consumer.position(*tp) for tp in ends} == ends
    assert consumer.poll() == []
    consumer.seek_to_beginning()
    everything = []
    while batch := consumer.poll(max_records=1000):
        everything.extend(batch)
    assert sorted((r.partition, r.offset) for r in everything) == sorted(
        (p, o) for p in (0, 1) for o in range(len(sent[p])))

    latest = memlog.consumer()  # auto_offset_reset="latest": starts at the end
    latest.assign([("t", 0)])
    assert latest.position("t", 0) == ends[("t", 0)]
    producer.send("t", b"new", partition=0).get()
    assert [(r.offset, r.value) for r in latest.poll()] == [(ends[("t", 0)], b"new")]


def test_consumer_poll_round_robins_and_keeps_per_partition_order(memlog: Log) -> None:
    memlog.create_topic("t", 3)
    producer = memlog.producer(linger_ms=0)
    for i in range(30):
        producer.send("t", b"%d" % i, partition=i % 3)
    consumer = memlog.consumer(auto_offset_reset="earliest", max_poll_records=4)
    consumer.assign([("t", 0), ("t", 1), ("t", 2)])
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    while records := consumer.poll():
        assert len(records) <= 4
        for r in records:
            seen[r.partition].append(r.offset)
    assert seen == {p: list(range(10)) for p in range(3)}


class _FakeCluster:
    """Just enough of kafka-python's ClusterMetadata for DefaultPartitioner."""

    def __init__(self, topic: str, partitions: int) -> None:
        self._topic, self._partitions = topic, set(range(partitions))

    def topics(self) -> set[str]:
        return {self._topic}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._partitions

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self._partitions


def test_key_partitioning_matches_kafka_python() -> None:
    rng = random.Random(2024)
    kafka_partitioner = DefaultPartitioner()
    keys = [b"", b"a", b"ab", b"abc", b"abcd"] + [rng.randbytes(rng.randrange(0, 64))
                                                  for _ in range(3000)]
    for key in keys:
        assert murmur2(key) == kafka_murmur2(key) & 0xFFFFFFFF, key
    for partitions in (1, 2, 3, 7, 12, 100, 1000):
        cluster = _FakeCluster("t", partitions)
        for key in keys:
            assert partition_for_key(key, partitions) == kafka_partitioner.partition(
                "t", key, key, None, None, cluster), (key, partitions)


def test_producer_sends_keys_where_kafka_would(memlog: Log) -> None:
    rng = random.Random(99)
    memlog.create_topic("t", 7)
    cluster = _FakeCluster("t", 7)
    kafka_partitioner = DefaultPartitioner()
    producer = memlog.producer(linger_ms=3_600_000)
    sent = []
    for _ in range(300):
        key = rng.randbytes(rng.randrange(1, 20))
        sent.append((key, producer.send("t", b"v", key=key)))
    producer.flush()
    for key, future in sent:
        md = future.get()
        assert md.partition == kafka_partitioner.partition("t", key, key, None, None, cluster)
        assert memlog.read("t", md.partition, md.offset, md.offset + 1).column(
            "key").to_pylist() == [key]


def test_null_keys_stick_to_one_partition_per_batch(memlog: Log) -> None:
    memlog.create_topic("t", 4)
    producer = memlog.producer(linger_ms=3_600_000)
    used = []
    for _ in range(12):
        futures = [producer.send("t", b"v") for _ in range(10)]
        producer.flush()
        partitions = {f.get().partition for f in futures}
        assert len(partitions) == 1, "null-key records of one batch must share a partition"
        used.append(partitions.pop())
    # After a batch is sent the sticky choice moves on (KIP-480), spreading the load.
    assert all(a != b for a, b in zip(used, used[1:]))
