"""Compaction into segments and retention, within one process (no Spark).

The multi-process loop (appenders, readers, compaction, retention and gc at
once) is in test_maintenance_loop.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from helpers_core import DelegatingStorage, read_chain, segment_files
from txlog import Log
from txlog.errors import CorruptBatchError, OffsetOutOfRangeError
from txlog.clients.columns import to_spark_table
from txlog.partition.isolation import READ_COMMITTED, READ_UNCOMMITTED
from txlog.partition.partition_log import PartitionLog
from txlog.format.segment import CorruptSegmentError
from txlog.storage.local import LocalStorage


# The segment and buffer sizes these tests choose are counted in uncompressed batches.
UNCOMPRESSED = "none"


def _fill(log: Log, topic: str, batches: int, partition: int = 0, prefix: str = "v") -> None:
    producer = log.producer(compression=UNCOMPRESSED)
    for i in range(batches):
        producer.send(topic, value=f"{prefix}{i}".encode(), key=b"k", partition=partition)
        producer.flush()


def _mixed(log: Log, topic: str) -> None:
    """Plain batches, committed and aborted transactions, and one left open."""
    _fill(log, topic, 20)
    txn = log.producer(transactional_id="mixed", compression=UNCOMPRESSED)
    txn.init_transactions()
    for j in range(6):
        txn.begin_transaction()
        for i in range(3):
            txn.send(topic, value=f"t{j}.{i}".encode(), partition=0)
            txn.flush()
        (txn.commit_transaction if j % 2 == 0 else txn.abort_transaction)()
    _fill(log, topic, 10, prefix="w")
    txn.begin_transaction()
    txn.send(topic, value=b"open", partition=0)
    txn.flush()
    _fill(log, topic, 5, prefix="x")


def _table(part: PartitionLog, start: int, isolation_level: str = READ_COMMITTED) -> pa.Table:
    """What ``Log.read`` answers: the partition's pieces in Kafka's record columns."""
    pieces, _ = part.read(start, None, isolation_level)
    return to_spark_table(pieces, part.topic, part.partition, include_headers=False)


def _everything(log: Log, topic: str, partition: int = 0) -> tuple[pa.Table, pa.Table, int]:
    part = log.partition(topic, partition)
    start = part.log_start()
    return (_table(part, start), _table(part, start, isolation_level=READ_UNCOMMITTED),
            part.last_stable_offset())


def _objects(root: Path, topic: str = "t", partition: int = 0) -> int:
    return sum(len(files) for _, _, files in os.walk(root / "topics" / topic / str(partition)))


def test_compaction_changes_nothing_readers_see(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": 8000})
    _mixed(log, "t")
    before = _everything(log, "t")
    objects_before = _objects(tmp_path)
    made = log.compact("t")[0]
    assert len(made) > 3 and made[0].base_offset == 0
    assert [m.base_offset for m in made[1:]] == [m.end_offset for m in made[:-1]]
    assert _everything(log, "t") == before
    fresh = Log(tmp_path)  # the state comes from the newest segment's snapshot
    assert _everything(fresh, "t") == before
    assert fresh.partition("t", 0).end_offset() == made[-1].end_offset
    assert _objects(tmp_path) < objects_before / 4
    chain = read_chain(tmp_path, "t", 0)  # independent walk through segments and batches
    assert chain[-1].header.next_offset == made[-1].end_offset
    # the open transaction holds the LSO in the fresh process too, and is still open
    assert before[2] < made[-1].end_offset


def test_idempotence_and_transactions_carry_across_segments(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    _mixed(log, "t")
    log.compact("t")
    fresh = Log(tmp_path)
    txn = fresh.producer(transactional_id="mixed")
    txn.init_transactions()  # fences and aborts the open transaction recorded in the segment
    committed, _, lso = _everything(fresh, "t")
    assert lso == fresh.partition("t", 0).end_offset()
    assert b"open" not in committed.column("value").to_pylist()
    values = committed.column("value").to_pylist()
    assert values.count(b"t0.0") == 1 and b"t1.0" not in values
    # A retry of the last batch of an idempotent producer is still recognised as a duplicate
    # after its state moved into a segment.
    part = log.partition("t", 0)
    state = part.state()
    entry = next(e for e in state.producers.values() if e.batches and not e.transactional_id)
    last = entry.batches[-1]
    header = part.header(last.base_offset)
    assert fresh.partition("t", 0).state().check_append(header).base_offset == last.base_offset


def test_a_reader_holding_an_old_listing_finds_every_offset(tmp_path: Path) -> None:
    old = Log(tmp_path, fsync=False)
    old.create_topic("t", 1, {"segment.bytes": 4000})
    _fill(old, "t", 60)
    before = _table(old.partition("t", 0), 0)  # lists and caches every batch object
    Log(tmp_path).compact("t")
    assert not list((tmp_path / "topics/t/0").glob("*.batch"))
    part = old.partition("t", 0)
    for start in (0, 17, 59):
        assert _table(part, start) == before.slice(start)
    assert part.header(30).base_offset == 30


def test_a_writer_with_a_stale_state_never_reuses_an_offset(tmp_path: Path) -> None:
    writer_log = Log(tmp_path, fsync=False)
    writer_log.create_topic("t", 1)
    writer = writer_log.producer()
    _fill(writer_log, "t", 30)
    Log(tmp_path).compact("t")  # everything the writer's cache relies on is gone
    offsets = []
    for i in range(5):
        offsets.append(writer.send("t", value=f"late{i}".encode(), partition=0).get().offset)
        writer.flush()
    assert offsets == [30, 31, 32, 33, 34]
    values = [v for b in read_chain(tmp_path, "t", 0) for v in b.values]
    assert values == [f"v{i}".encode() for i in range(30)] + [f"late{i}".encode()
                                                               for i in range(5)]


class _CompactBeforeBatchPublish(DelegatingStorage):
    """Runs a compaction of everything in another Log right before the first publish of
    a batch object: the writer then publishes into an offset compaction just retired."""

    def __init__(self, inner, other: Log) -> None:
        super().__init__(inner)
        self.other = other
        self.armed = False
        self.strays: list[str] = []

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        if self.armed and path.endswith(".batch"):
            self.armed = False
            rival = self.other.producer()
            rival.send("t", value=b"rival", partition=0)
            rival.flush()
            self.other.compact("t")
            published = super().publish_if_absent(path, data)
            if published:
                self.strays.append(path)
            return published
        return super().publish_if_absent(path, data)


def test_a_batch_published_into_a_compacted_slot_is_written_again(tmp_path: Path) -> None:
    # Shown to catch the bug: with the appender's post-publish check removed, the
    # writer is told offset 10, which is the rival's record in the segment.
    Log(tmp_path).create_topic("t", 1)
    storage = _CompactBeforeBatchPublish(LocalStorage(str(tmp_path)), Log(tmp_path))
    log = Log(storage)
    _fill(log, "t", 10)
    storage.armed = True
    producer = log.producer()
    sent = producer.send("t", value=b"mine", partition=0)
    producer.flush()
    assert storage.strays, "the scenario did not happen: no publish into a retired slot"
    offset = sent.get().offset
    values = [v for b in read_chain(tmp_path, "t", 0) for v in b.values]
    assert values[10] == b"rival" and values.count(b"mine") == 1
    assert values[offset] == b"mine"
    assert _table(Log(tmp_path).partition("t", 0), 0).column("value").to_pylist() == values


def test_a_stray_past_the_cached_end_is_never_taken_for_the_log(tmp_path: Path) -> None:
    """protocol.md 1.6: an appender reads the headers past its cached end and checks its
    anchor only after its publish.  A stray (a late writer's publish into a slot
    compaction retired) can lie past that end; read and applied, it makes the slot after
    it look free.  The check after the publish must be of the anchor the state had
    before that read (here gone with the compacted batches), not of the stray: shown to
    catch it, with ``proven_by(proof)`` replaced by ``still_current()`` the writer is
    told offset 2, a retired slot, and its record is lost."""
    writer_log = Log(tmp_path, fsync=False)
    writer_log.create_topic("t", 1)
    writer = writer_log.producer()
    writer.send("t", value=b"v0", partition=0)
    writer.flush()  # the writer's cache ends at 1, anchored on batch 0
    rival = Log(tmp_path).producer()
    for value in (b"r1", b"r2"):
        rival.send("t", value=value, partition=0)
        rival.flush()
    stray = tmp_path / "topics" / "t" / "0" / f"{1:020d}.batch"
    late = stray.read_bytes()
    Log(tmp_path).compact("t")  # batches 0 to 2 into a segment, their files deleted
    assert not stray.exists()
    stray.write_bytes(late)  # a late writer's publish into the retired slot 1
    sent = writer.send("t", value=b"mine", partition=0)
    writer.flush()
    values = _table(Log(tmp_path).partition("t", 0), 0).column("value").to_pylist()
    assert values == [b"v0", b"r1", b"r2", b"mine"]
    assert sent.get().offset == 3


def test_a_writer_whose_cache_the_log_start_passed_appends_at_the_end(tmp_path: Path) -> None:
    """protocol.md 1.6: a writer's first try publishes at its cached end and checks after;
    when DeleteRecords (or retention) moved the log start past that slot, the slot holds
    nothing any more and the batch goes to the end (it raised OffsetOutOfRangeError,
    found by test_maintenance_loop)."""
    writer_log = Log(tmp_path, fsync=False)
    writer_log.create_topic("t", 1, {"segment.bytes": 1024})  # a segment per batch
    writer = writer_log.producer()
    writer.send("t", value=b"v0", partition=0)
    writer.flush()  # cached end 1
    other = Log(tmp_path)
    _fill(other, "t", 20, prefix="r")
    other.compact("t")
    other.delete_records({("t", 0): 15})
    assert other.apply_retention("t")[0].log_start == 15  # the segments below 15 are gone
    sent = writer.send("t", value=b"mine", partition=0)
    writer.flush()
    assert sent.get().offset == 21
    values = _table(Log(tmp_path).partition("t", 0), 15).column("value").to_pylist()
    assert values[-1] == b"mine" and values.count(b"mine") == 1


def test_retention_deletes_whole_segments_and_moves_the_log_start(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": 5000})
    _fill(log, "t", 100)
    log.compact("t")
    segments = segment_files(tmp_path, "t", 0)
    log.alter_topic_config("t", {"retention.bytes": 20000})
    result = log.apply_retention("t")[0]
    left = segment_files(tmp_path, "t", 0)
    assert result.segments_deleted == len(segments) - len(left) > 0
    assert result.log_start == int(left[0].name[:20]) > 0
    part = Log(tmp_path).partition("t", 0)
    assert part.log_start() == result.log_start
    with pytest.raises(OffsetOutOfRangeError, match=f"valid: {result.log_start} to 100"):
        part.read(0)
    assert _table(part, result.log_start).num_rows == 100 - result.log_start
    # the newest segment always stays: it carries the producer state past what went
    log.alter_topic_config("t", {"retention.bytes": 0})
    assert log.apply_retention("t")[0].log_start == int(left[-1].name[:20])
    assert segment_files(tmp_path, "t", 0) == left[-1:]
    assert Log(tmp_path).partition("t", 0).end_offset() == 100


def test_retention_by_time_uses_the_newest_record_of_each_segment(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": 5000})
    producer = log.producer()
    for i in range(60):
        producer.send("t", value=b"x", partition=0, timestamp_ms=1_000 * i)
        producer.flush()
    log.compact("t")
    heads = [log.partition("t", 0)._cache.segment_head(int(p.name[:20]))
             for p in segment_files(tmp_path, "t", 0)]
    # Records are 1 s apart: keeping 20 s at t=59 s leaves the segments reaching 39 s.
    kept = log.partition("t", 0).apply_retention(retention_ms=20_000, now_ms=59_000)
    first_kept = next(h for h in heads if 1_000 * (h.end_offset - 1) >= 39_000)
    assert kept.log_start == first_kept.base_offset
    assert log.apply_retention("t", now_ms=59_000)[0].segments_deleted == 0  # 7 days default


def test_consumers_reset_by_auto_offset_reset_after_retention(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": 5000, "retention.bytes": 20000})
    _fill(log, "t", 100)
    log.compact("t")
    start = log.apply_retention("t")[0].log_start
    earliest = log.consumer(auto_offset_reset="earliest")
    earliest.assign([("t", 0)])
    assert earliest.beginning_offsets() == {("t", 0): start}
    earliest.seek("t", 0, 3)
    assert earliest.poll(5)[0].offset == start
    latest = log.consumer(auto_offset_reset="latest")
    latest.assign([("t", 0)])
    latest.seek("t", 0, 3)
    assert latest.poll() == [] and latest.position("t", 0) == 100
    strict = log.consumer(auto_offset_reset="none")
    strict.assign([("t", 0)])
    strict.seek("t", 0, 3)
    with pytest.raises(OffsetOutOfRangeError, match="offset 3"):
        strict.poll()


def test_offsets_for_times_and_chunked_reads_across_segments(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": 4000})
    producer = log.producer()
    for i in range(50):
        producer.send("t", value=f"{i}".encode(), partition=0, timestamp_ms=10_000 + 10 * i)
        producer.flush()
    expected = {ts: log.offsets_for_times("t", 0, ts) for ts in (0, 10_005, 10_250, 10_490, 99_999)}
    log.compact("t", upto_lag=7)
    fresh = Log(tmp_path)
    assert {ts: fresh.offsets_for_times("t", 0, ts) for ts in expected} == expected
    assert expected[10_250] == (25, 10_250)
    from txlog.spark.planning import OffsetRange, read_range
    topic_id = fresh.describe_topic("t").topic_id
    batches = list(read_range(fresh.services, OffsetRange("t", 0, topic_id, 3, 47), chunk_rows=6))
    assert pa.Table.from_batches(batches).column("offset").to_pylist() == list(range(3, 47))


def test_damaged_segment_is_an_error_naming_the_file(tmp_path: Path, caplog) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    _fill(log, "t", 10)
    log.compact("t")
    path = segment_files(tmp_path, "t", 0)[0]
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # inside the last batch's payload
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBatchError, match="payload checksum") as info:
        Log(tmp_path).partition("t", 0).read(0)
    assert path.name in str(info.value)
    data[20] ^= 0xFF  # the header's end offset
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSegmentError, match="segment header checksum") as info:
        Log(tmp_path).partition("t", 0).end_offset()
    assert path.name in str(info.value)


def test_a_batch_larger_than_a_segment_never_holds_compaction_back(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": 3000})
    producer = log.producer(compression=UNCOMPRESSED)
    producer.send("t", b"x" * 2500, partition=0)  # alone it nearly fills a segment
    producer.flush()
    _fill(log, "t", 6)
    made = log.compact("t")[0]
    assert made[0].base_offset == 0 and made[0].batches == 1  # full, though below min_batches
    assert log.partition("t", 0).compacted_end() == 7
    assert _table(log.partition("t", 0), 0).num_rows == 7


def test_compaction_retention_and_gc_on_every_backend(every_root, tmp_path: Path) -> None:
    any_root = every_root
    log = any_root.log()
    log.create_topic("t", 1, {"segment.bytes": 4000})
    _mixed(log, "t")
    before = _everything(log, "t")
    log.compact("t", upto_lag=5)
    log.gc(chain_age_s=0)
    assert _everything(log, "t") == before
    fresh = any_root.log() if any_root.backend != "memory" else log
    assert _everything(fresh, "t") == before
    chain = any_root.chain("t", 0, tmp_path)  # an independent walk of what is stored
    assert chain[-1].header.next_offset == fresh.partition("t", 0).end_offset()
    log.alter_topic_config("t", {"retention.bytes": 8000})
    start = log.apply_retention("t")[0].log_start
    assert 0 < start == any_root.log().partition("t", 0).log_start()
    with pytest.raises(OffsetOutOfRangeError):
        any_root.log().partition("t", 0).read(0)


def test_a_base_lost_from_the_cache_is_listed_again_not_skipped(tmp_path: Path) -> None:
    """A long-lived process whose cached list of batch objects lost a base: the known
    header before the gap gives it away, so the list is taken again.  Without that
    check the read skips the batch's records and every compaction stops at the gap."""
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    _fill(log, "t", 12)
    part = log.partition("t", 0)
    before = _table(part, 0)
    cache = part._cache
    assert len(cache._bases) == 12 and cache._bases_complete  # headers known, list complete
    cache._bases.remove(5)
    assert _table(part, 0) == before
    assert [(c.base_offset, c.end_offset) for c in log.compact("t", min_batches=12)[0]] \
        == [(0, 12)]


def test_a_batch_object_missing_from_storage_is_a_hole_named_by_its_offset(tmp_path: Path
                                                                         ) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    _fill(log, "t", 6)
    part = log.partition("t", 0)
    _table(part, 0)
    os.remove(tmp_path / part.batch_path(3))
    part._cache._bases.remove(3)  # as a listing after the loss would find it
    with pytest.raises(CorruptBatchError, match="missing") as hole:
        _table(part, 0)
    assert hole.value.offset == 3 and hole.value.path.endswith(part.batch_path(3))


def test_a_listing_for_an_older_state_keeps_the_bases_applied_since(tmp_path: Path) -> None:
    """A reader's state taken, then this process's producer appends (noting the new
    base), then the reader's refs list the batch objects up to its older log end: the
    base noted meanwhile must stay, or the next append leaves the list a gap."""
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    _fill(log, "t", 4)
    part = log.partition("t", 0)
    cache = part._cache
    reader_end = part._states.state().end_offset
    _fill(log, "t", 1, prefix="w")  # applied by this process after the reader's state
    cache._bases_complete = False  # as after another process's compaction
    cache.refs(0, reader_end, reader_end)
    _fill(log, "t", 1, prefix="x")
    assert cache._bases == list(range(6)) and cache._gap(cache._bases) is None
