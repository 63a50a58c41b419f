"""Idempotent appends: a retry after an ambiguous failure never duplicates a batch.

A publish can fail after the object was created (a timeout, a lost reply).  The
writer cannot tell, so it retries; the partition's producer state must then
recognise the batch by producer id, epoch and sequence and answer with the
original offsets.  Out-of-order and stale-epoch batches must be refused with
distinct errors that say which producer, epoch and sequence were wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from txlog import InvalidProducerEpochError, Log, OutOfOrderSequenceError, StorageError
from txlog.partition.appender import PUBLISH_ATTEMPTS
from txlog.partition.partition_log import PartitionLog
from txlog.partition.state_manager import SNAPSHOT_INTERVAL
from txlog.storage.local import LocalStorage
from txlog.storage.paths import BATCH_SUFFIX

from helpers_core import AmbiguousStorage, data_header, read_chain, records_payload


def is_batch(path: str) -> bool:
    return path.endswith(BATCH_SUFFIX)


def make_log(tmp_path: Path, storage=None) -> tuple[Log, PartitionLog]:
    log = Log(storage if storage is not None else LocalStorage(str(tmp_path / "log")))
    if "t" not in log.topics():
        log.create_topic("t", 1)
    return log, log.partition("t", 0)


def values_on_disk(tmp_path: Path) -> list[bytes | None]:
    return [v for batch in read_chain(tmp_path / "log", "t", 0) for v in batch.values]


def test_resending_the_same_batch_returns_the_original_offsets(tmp_path: Path) -> None:
    log, part = make_log(tmp_path)
    other = data_header(producer_id=77, epoch=0, sequence=0, count=2)
    part.append(other, records_payload([b"o1", b"o2"]))
    mine = data_header(producer_id=5, epoch=3, sequence=0, count=3)
    payload = records_payload([b"a", b"b", b"c"])
    first = part.append(mine, payload)
    assert (first.base_offset, first.last_offset, first.duplicate) == (2, 4, False)
    # Another producer appends in between; the retry must still be recognised.
    part.append(data_header(producer_id=77, epoch=0, sequence=2, count=1),
                records_payload([b"o3"]))
    again = part.append(mine, payload)
    assert again.duplicate and (again.base_offset, again.last_offset) == (2, 4)
    # So must a retry from a different process, which rebuilds the state from disk.
    fresh_part = Log(tmp_path / "log").partition("t", 0)
    from_disk = fresh_part.append(mine, payload)
    assert from_disk.duplicate and (from_disk.base_offset, from_disk.last_offset) == (2, 4)
    assert values_on_disk(tmp_path) == [b"o1", b"o2", b"a", b"b", b"c", b"o3"]
    assert part.end_offset() == fresh_part.end_offset() == 6


def test_producer_send_survives_a_publish_that_created_the_object_then_failed(
        tmp_path: Path) -> None:
    storage = AmbiguousStorage(LocalStorage(str(tmp_path / "log")), is_batch, times=1)
    log, _ = make_log(tmp_path, storage)
    producer = log.producer(linger_ms=3_600_000)
    futures = [producer.send("t", b"v%d" % i, partition=0) for i in range(4)]
    producer.flush()
    assert len(storage.failed) == 1, "the simulated ambiguous failure did not happen"
    assert len(storage.attempts) == 1, "the retry must not publish a second copy"
    assert [f.get().offset for f in futures] == [0, 1, 2, 3]
    assert values_on_disk(tmp_path) == [b"v0", b"v1", b"v2", b"v3"]
    # The producer's sequence moved on: its next batch is accepted right after.
    assert producer.send("t", b"next", partition=0).get().offset == 4
    assert values_on_disk(tmp_path)[-1] == b"next"
    assert len(read_chain(tmp_path / "log", "t", 0)) == 2


class RacingAmbiguousStorage(AmbiguousStorage):
    """Creates the batch, lets another writer append behind it, then reports failure."""

    def __init__(self, inner, other_root: Path) -> None:
        super().__init__(inner, is_batch, times=1)
        self.other_root = other_root

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        if self.match(path) and self.remaining > 0:
            self.remaining -= 1
            self.failed.append(path)
            assert self.inner.publish_if_absent(path, data)
            Log(self.other_root).producer().send("t", b"intruder", partition=0).get()
            raise OSError("simulated timeout")
        return super().publish_if_absent(path, data)


def test_ambiguous_failure_with_a_concurrent_writer_in_between(tmp_path: Path) -> None:
    storage = RacingAmbiguousStorage(LocalStorage(str(tmp_path / "log")), tmp_path / "log")
    log, _ = make_log(tmp_path, storage)
    producer = log.producer(linger_ms=3_600_000)
    futures = [producer.send("t", b"mine%d" % i, partition=0) for i in range(2)]
    producer.flush()
    assert storage.failed
    assert [f.get().offset for f in futures] == [0, 1]
    assert values_on_disk(tmp_path) == [b"mine0", b"mine1", b"intruder"]
    assert producer.send("t", b"after", partition=0).get().offset == 3


def test_publish_failing_before_creating_is_retried(tmp_path: Path) -> None:
    storage = AmbiguousStorage(LocalStorage(str(tmp_path / "log")), is_batch, times=2,
                               create=False)
    log, _ = make_log(tmp_path, storage)
    md = log.producer().send("t", b"x", partition=0).get()
    assert md.offset == 0 and len(storage.failed) == 2
    assert values_on_disk(tmp_path) == [b"x"]


def test_persistent_storage_failure_is_reported(tmp_path: Path) -> None:
    storage = AmbiguousStorage(LocalStorage(str(tmp_path / "log")), is_batch, times=10**6,
                               create=False)
    log, _ = make_log(tmp_path, storage)
    future = log.producer(linger_ms=3_600_000).send("t", b"x", partition=0)
    with pytest.raises(StorageError, match=r"offset 0 of t-0 failed") as info:
        future.get()
    assert len(storage.failed) == PUBLISH_ATTEMPTS
    assert isinstance(info.value.__cause__, OSError)
    assert future.failed() and isinstance(future.exception(), StorageError)
    assert read_chain(tmp_path / "log", "t", 0) == []


def test_out_of_order_sequence_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    log, part = make_log(tmp_path)
    part.append(data_header(producer_id=9, epoch=2, sequence=0, count=2),
                records_payload([b"a", b"b"]))
    with pytest.raises(OutOfOrderSequenceError) as info:
        part.append(data_header(producer_id=9, epoch=2, sequence=5, count=1),
                    records_payload([b"c"]))
    message = str(info.value)
    assert "producer 9" in message and "epoch 2" in message and "sequence 5" in message
    assert "expected 2" in message
    with pytest.raises(OutOfOrderSequenceError, match="producer 10"):
        part.append(data_header(producer_id=10, epoch=0, sequence=1, count=1),
                    records_payload([b"c"]))
    assert values_on_disk(tmp_path) == [b"a", b"b"]


def test_stale_epoch_is_refused_with_its_own_error(tmp_path: Path) -> None:
    log, part = make_log(tmp_path)
    part.append(data_header(producer_id=9, epoch=4, sequence=0), records_payload([b"a"]))
    with pytest.raises(InvalidProducerEpochError) as info:
        part.append(data_header(producer_id=9, epoch=3, sequence=1), records_payload([b"b"]))
    assert not isinstance(info.value, OutOfOrderSequenceError)
    message = str(info.value)
    assert "producer 9" in message and "epoch 3" in message and "sequence 1" in message
    assert values_on_disk(tmp_path) == [b"a"]


def test_new_epoch_starts_at_sequence_zero(tmp_path: Path) -> None:
    log, part = make_log(tmp_path)
    part.append(data_header(producer_id=9, epoch=0, sequence=0, count=3),
                records_payload([b"a", b"b", b"c"]))
    with pytest.raises(OutOfOrderSequenceError, match="epoch 1"):
        part.append(data_header(producer_id=9, epoch=1, sequence=3), records_payload([b"d"]))
    result = part.append(data_header(producer_id=9, epoch=1, sequence=0),
                         records_payload([b"d"]))
    assert (result.base_offset, result.duplicate) == (3, False)
    assert values_on_disk(tmp_path) == [b"a", b"b", b"c", b"d"]


def test_duplicate_window_is_the_last_five_batches(tmp_path: Path) -> None:
    log, part = make_log(tmp_path)
    headers = []
    for i in range(7):
        h = data_header(producer_id=3, epoch=0, sequence=i, count=1)
        part.append(h, records_payload([b"%d" % i]))
        headers.append(h)
    for offset in range(2, 7):  # the last five are answered from the window
        result = part.append(headers[offset], records_payload([b"%d" % offset]))
        assert result.duplicate and result.base_offset == offset
    with pytest.raises(OutOfOrderSequenceError, match="sequence 1"):
        part.append(headers[1], records_payload([b"1"]))  # sixth-last: out of order
    assert len(read_chain(tmp_path / "log", "t", 0)) == 7


def test_duplicate_detection_survives_snapshots(tmp_path: Path) -> None:
    """The window lives in the snapshot: a fresh process past a snapshot still sees it."""
    log, part = make_log(tmp_path)
    producer = log.producer(linger_ms=0)
    for i in range(SNAPSHOT_INTERVAL + 6):
        producer.send("t", b"%d" % i, partition=0)
    last = read_chain(tmp_path / "log", "t", 0)[-1]
    assert list((tmp_path / "log" / "topics" / "t" / "0" / "snapshots").iterdir())
    fresh = Log(tmp_path / "log").partition("t", 0)
    result = fresh.append(last.header, records_payload(last.values))
    assert result.duplicate and result.base_offset == last.header.base_offset
    assert fresh.end_offset() == SNAPSHOT_INTERVAL + 6


def test_producers_get_distinct_ids_and_per_partition_sequences(tmp_path: Path) -> None:
    log = Log(tmp_path / "log")
    log.create_topic("t", 2)
    a, b = log.producer(linger_ms=0), log.producer(linger_ms=0)
    assert a.producer_id != b.producer_id and a.epoch == b.epoch == 0
    for i in range(3):
        a.send("t", b"a", partition=0)
        a.send("t", b"a", partition=1)
        b.send("t", b"b", partition=0)
    for p in (0, 1):
        by_producer: dict[int, list[int]] = {}
        for batch in read_chain(tmp_path / "log", "t", p):
            by_producer.setdefault(batch.header.producer_id, []).append(
                batch.header.base_sequence)
        assert by_producer[a.producer_id] == [0, 1, 2]
        if p == 0:
            assert by_producer[b.producer_id] == [0, 1, 2]
