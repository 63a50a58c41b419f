"""Bulk sends of Arrow tables: the same records, partitions, order and guarantees as
``send`` one record at a time, without a Python call per record."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from txlog import InvalidConfigError, Log
from txlog.format.batch import HEADER_TYPE
from txlog.clients.partitioner import partition_for_key, partitions_for_keys
from txlog.storage.local import LocalStorage

from helpers_core import read_chain
from test_unknown_publish_outcomes import OutcomeUnknownStorage


def _random_keys(n: int, seed: int) -> list[bytes | None]:
    rng = random.Random(seed)
    return [None if rng.random() < 0.03 else rng.randbytes(rng.randrange(0, 41))
            for _ in range(n)]


@pytest.mark.parametrize("num_partitions", [1, 2, 3, 4, 7, 16, 1000])
def test_vectorised_partitioner_equals_the_scalar_one(num_partitions: int) -> None:
    keys = _random_keys(5000, num_partitions)
    expected = [-1 if k is None else partition_for_key(k, num_partitions) for k in keys]
    assert partitions_for_keys(pa.array(keys, pa.binary()), num_partitions).tolist() == expected
    # Chunked, sliced and large/string variants of the same keys.
    chunked = pa.chunked_array([pa.array(keys[:1234], pa.binary()),
                                pa.array(keys[1234:], pa.large_binary()).cast(pa.binary())])
    assert partitions_for_keys(chunked, num_partitions).tolist() == expected
    sliced = pa.array(keys, pa.large_binary()).slice(100, 900)
    assert partitions_for_keys(sliced, num_partitions).tolist() == expected[100:1000]
    texts = ["k%d" % i for i in range(300)]
    assert partitions_for_keys(pa.array(texts), num_partitions).tolist() == [
        partition_for_key(t.encode(), num_partitions) for t in texts]
    # Keys all of one length take another path (no sort by length): every tail size,
    # and a slice whose first key is not at the start of the data buffer.
    rng = random.Random(num_partitions)
    for width in range(10):
        same = [rng.randbytes(width) for _ in range(500)]
        assert partitions_for_keys(pa.array(same, pa.binary()).slice(7), num_partitions
                                   ).tolist() == [partition_for_key(k, num_partitions)
                                                  for k in same[7:]], width


def test_vectorised_partitioner_is_much_faster_than_the_scalar_loop() -> None:
    rng = np.random.default_rng(3)
    keys = [bytes(row) for row in rng.integers(0, 256, size=(200_000, 8), dtype=np.uint8)]
    column = pa.array(keys, pa.binary())
    start = time.perf_counter()
    vectorised = partitions_for_keys(column, 4)
    fast = time.perf_counter() - start
    start = time.perf_counter()
    scalar = [partition_for_key(k, 4) for k in keys]
    slow = time.perf_counter() - start
    assert vectorised.tolist() == scalar
    print(f"\n200k 8-byte keys: vectorised {fast * 1e3:.1f} ms, scalar {slow * 1e3:.1f} ms "
          f"({slow / fast:.0f}x)")


def _table(n: int, seed: int = 0, keyed: bool = True) -> pa.Table:
    rng = random.Random(seed)
    keys = [rng.randbytes(rng.randrange(1, 12)) if keyed and rng.random() > 0.2 else None
            for _ in range(n)]
    values = [None if i % 17 == 5 else f"value-{seed}-{i}".encode() for i in range(n)]
    headers = [[{"key": "h", "value": b"%d" % i}] if i % 3 == 0 else [] for i in range(n)]
    return pa.table({
        "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.binary()),
        "headers": pa.array(headers, HEADER_TYPE),
        "timestamp": pa.array([1_700_000_000_000 + i for i in range(n)],
                              pa.timestamp("ms", tz="UTC")),
    })


def _rows(log: Log, topic: str, partitions: int, **read) -> dict[int, list[tuple]]:
    out = {}
    for p in range(partitions):
        t = log.read(topic, p, include_headers=True, **read)
        out[p] = list(zip(t.column("key").to_pylist(), t.column("value").to_pylist(),
                          t.column("timestamp").to_pylist(), t.column("headers").to_pylist(),
                          t.column("offset").to_pylist(), strict=True))
    return out


def test_round_trip_partitions_and_order(log: Log) -> None:
    log.create_topic("t", 4)
    table = _table(3000)
    producer = log.producer(batch_size=4096)
    before = producer.send("t", b"sent-first", key=b"k1")  # pending when the table arrives
    sent = producer.send_table("t", table)
    assert before.get().offset == 0
    rows = _rows(log, "t", 4)
    # Every row exactly once; keyed rows where Kafka's partitioner puts them; per
    # partition, rows keep their input order and come after the earlier send().
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    seen = []
    for p, records in rows.items():
        if p == partition_for_key(b"k1", 4):
            assert records[0][1] == b"sent-first"
            records = records[1:]
        positions = []
        for key, value, ts, headers, offset in records:
            i = int(ts.timestamp() * 1000) - 1_700_000_000_000
            assert (keys[i], values[i]) == (key, value)
            assert headers == ([{"key": "h", "value": b"%d" % i}] if i % 3 == 0 else [])
            if key is not None:
                assert p == partition_for_key(key, 4)
            positions.append(i)
        assert positions == sorted(positions)
        seen += positions
    assert sorted(seen) == list(range(3000))
    # Batches are cut by batch_size, and the returned ranges are exactly what was written.
    # (A claim of several batches holds each of them as a part, format.md 2.7.1.)
    written = {(base, base + n - 1, p) for p in range(4) for b in read_chain(log.root, "t", p)
               for base, n in _part_ranges(b.header)}
    assert {(b.base_offset, b.last_offset, b.partition) for b in sent} <= written
    assert sum(b.last_offset - b.base_offset + 1 for b in sent) == 3000
    assert len(sent) > 8
    # Unkeyed rows were spread batch by batch, not all sent to one partition.
    unkeyed = {p for p, records in rows.items() for r in records if r[0] is None}
    assert len(unkeyed) > 1


def test_explicit_partitions_strings_and_errors(memlog: Log) -> None:
    memlog.create_topic("t", 3)
    producer = memlog.producer()
    table = pa.table({"value": ["a", "b", "c"], "key": ["x", None, "z"],
                      "partition": pa.array([2, None, 0], pa.int32())})
    sent = producer.send_table("t", table)
    assert memlog.read("t", 2).column("value").to_pylist()[:1] == [b"a"]
    assert b"c" in memlog.read("t", 0).column("value").to_pylist()
    assert sum(b.last_offset - b.base_offset + 1 for b in sent) == 3
    end = memlog.end_offset("t", 1)
    assert producer.send_table("t", pa.table({"value": [b"all"]}), partition=1) == [(1, end, end)]
    with pytest.raises(InvalidConfigError, match="partition 3"):
        producer.send_table("t", pa.table({"value": [b"v"], "partition": [3]}))
    with pytest.raises(InvalidConfigError, match="partition -2"):
        producer.send_table("t", pa.table({"value": [b"v"], "partition": [-2]}))
    with pytest.raises(InvalidConfigError, match="partition 5"):
        producer.send_table("t", pa.table({"value": [b"v"]}), partition=5)
    with pytest.raises(InvalidConfigError, match="no 'value' column"):
        producer.send_table("t", pa.table({"key": [b"v"]}))
    with pytest.raises(InvalidConfigError, match="'value' must be binary or string"):
        producer.send_table("t", pa.table({"value": [1]}))
    with pytest.raises(InvalidConfigError, match="'timestamp'"):
        producer.send_table("t", pa.table({"value": [b"v"], "timestamp": ["now"]}))
    with pytest.raises(InvalidConfigError, match="unknown column"):
        producer.send_table("t", pa.table({"value": [b"v"], "extra": [1]}))


def test_max_message_bytes_and_log_append_time(memlog: Log) -> None:
    memlog.create_topic("small", 1, config={"max.message.bytes": 2000})
    producer = memlog.producer()
    # Random bytes: the limit is on the batch as stored, which zstd (the default) would
    # shrink well under it for a repeated byte.
    with pytest.raises(InvalidConfigError, match="max.message.bytes"):
        producer.send_table("small", pa.table({"value": [random.Random(5).randbytes(5000)]}))
    assert producer.send_table("small", pa.table({"value": [b"ok"]})) == [(0, 0, 0)]
    memlog.create_topic("appended", 1, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    producer.send_table("appended", pa.table({"value": [b"a", b"b"], "timestamp": [5, 6]}))
    table = memlog.read("appended", 0)
    assert set(table.column("timestampType").to_pylist()) == {1}
    assert all(ts.timestamp() * 1000 >= before - 1 for ts in table.column("timestamp").to_pylist())


def test_transactional_send_table_commit_and_abort(log: Log) -> None:
    log.create_topic("t", 3)
    producer = log.producer(transactional_id="bulk")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_table("t", _table(500, seed=1))
    assert sum(log.read("t", p).num_rows for p in range(3)) == 0  # not visible yet
    producer.commit_transaction()
    committed = sum(log.read("t", p).num_rows for p in range(3))
    assert committed == 500
    producer.begin_transaction()
    producer.send_table("t", _table(300, seed=2))
    producer.abort_transaction()
    assert sum(log.read("t", p).num_rows for p in range(3)) == 500
    uncommitted = sum(log.read("t", p, isolation_level="read_uncommitted").num_rows
                      for p in range(3))
    assert uncommitted == 800


@pytest.mark.parametrize("kind", ["oserror", "runtime", "keyboard"])
def test_outcome_unknown_batch_in_a_bulk_send(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "log"
    log = Log(OutcomeUnknownStorage(LocalStorage(str(root)), kind))
    log.create_topic("t", 1)
    producer = log.producer()
    raised = {"oserror": OSError, "runtime": RuntimeError, "keyboard": KeyboardInterrupt}[kind]
    with pytest.raises(raised):
        producer.send_table("t", pa.table({"value": [b"a0", b"a1", b"a2"]}))
    # Same record count: must not be mistaken for a duplicate of the batch that landed.
    assert producer.send_table("t", pa.table({"value": [b"b0", b"b1", b"b2"]})) == [(0, 3, 5)]
    values = [v for batch in read_chain(root, "t", 0) for v in batch.values]
    assert values == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]


def _part_ranges(header) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    """(base offset, record count) of each batch a batch object holds."""
    counts = [c for c, _ in header.parts] or [header.record_count]
    bases = [header.base_offset + sum(counts[:i]) for i in range(len(counts))]
    return list(zip(bases, counts))


def test_record_size_metrics_count_the_largest_key_and_value_of_each_batch(memlog: Log
                                                                          ) -> None:
    """``send_table`` hands each batch its largest record from the sizes it cut the
    batches by: the figure must be what ``send``'s path counts (key and value bytes, a
    null one as 0), batch by batch, whatever order the partitions put the rows in."""
    memlog.create_topic("m", 2)
    table = pa.table({"key": [None, b"kk", b"k", None],
                      "value": [b"v" * 50, b"v" * 7, None, b"v" * 3],
                      "headers": pa.array([[{"key": "h" * 100, "value": b"x"}], [], [], []],
                                          HEADER_TYPE),
                      "partition": pa.array([1, 0, 0, 1], pa.int32())})
    with memlog.producer(linger_ms=0) as producer:
        producer.send_table("m", table)
        figures = producer.metrics()["producer-metrics"]
    assert figures["record-size-max"] == 50
    assert figures["record-size-avg"] == pytest.approx((50 + 9) / 2)  # one per batch
