"""Producer state: Kafka's per-producer validation rules, as a pure function of headers.

The unit tests drive ProducerState with BatchHeader objects only (no disk), so a
failure points at the rules themselves.  The last tests check that a fresh
process rebuilds the state from the newest snapshot plus only the headers after
it, which is what keeps appends cheap on a long log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from txlog import InvalidProducerEpochError, Log, OutOfOrderSequenceError, ProducerFencedError
from txlog.format.batch import (ABORT, COMMIT, CONTROL_BIT, TRANSACTIONAL_BIT, BatchHeader,
                                ControlRecord)
from txlog.format.segment import HEAD_READ_SIZE, HEADER_SIZE
from txlog.partition.state_manager import SNAPSHOT_HEAD_READ, SNAPSHOT_INTERVAL
from txlog.partition.producer_state import INT32_MAX, NUM_BATCHES_TO_RETAIN, ProducerState
from txlog.storage.local import LocalStorage
from txlog.storage.paths import SNAPSHOT_DIR, SNAPSHOT_SUFFIX

from helpers_core import CountingStorage, read_chain

PID = 4242


def hdr(state: ProducerState, seq: int, count: int = 3, epoch: int = 0, pid: int = PID,
        transactional: bool = False, decision: str = "") -> BatchHeader:
    """A data batch placed at the state's current end."""
    return BatchHeader(base_offset=state.end_offset, record_count=count,
                       attributes=TRANSACTIONAL_BIT if transactional else 0,
                       base_timestamp=10, max_timestamp=20, producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, decision_id=decision)


def append(state: ProducerState, header: BatchHeader) -> None:
    """What a writer does: validate against the prefix, then extend it."""
    assert state.check_append(header) is None
    state.apply(header)


def marker(state: ProducerState, pid: int, epoch: int, kind: int) -> None:
    header = BatchHeader(base_offset=state.end_offset, record_count=1,
                         attributes=CONTROL_BIT | TRANSACTIONAL_BIT, producer_id=pid,
                         producer_epoch=epoch)
    first = state.producers[pid].txn_first_offset if pid in state.producers else -1
    state.apply(header, ControlRecord(kind, 0, first))


def test_first_batch_of_a_producer_must_have_sequence_zero() -> None:
    state = ProducerState()
    with pytest.raises(OutOfOrderSequenceError) as info:
        state.check_append(hdr(state, seq=5, epoch=2))
    message = str(info.value)
    assert f"producer {PID}" in message and "epoch 2" in message and "5" in message
    append(state, hdr(state, seq=0, epoch=2))
    assert state.producers[PID].epoch == 2 and state.producers[PID].last_seq == 2


def test_sequences_must_be_contiguous() -> None:
    state = ProducerState()
    append(state, hdr(state, seq=0, count=3))
    append(state, hdr(state, seq=3, count=2))
    for wrong in (4, 6, 100, 0 + 1):
        with pytest.raises(OutOfOrderSequenceError) as info:
            state.check_append(hdr(state, seq=wrong))
        message = str(info.value)
        assert f"producer {PID}" in message and "epoch 0" in message
        assert f"sequence {wrong}" in message and "expected 5" in message
    append(state, hdr(state, seq=5))
    assert state.end_offset == 8


def test_non_idempotent_batches_are_not_checked() -> None:
    state = ProducerState()
    header = BatchHeader(base_offset=0, record_count=2)
    assert state.check_append(header) is None
    state.apply(header)
    assert state.check_append(BatchHeader(base_offset=2, record_count=2)) is None
    assert state.producers == {}


def test_duplicates_of_the_last_five_batches_are_recognised() -> None:
    state = ProducerState()
    sent: list[BatchHeader] = []
    for i in range(8):
        h = hdr(state, seq=i * 2, count=2)
        append(state, h)
        sent.append(h)
    assert NUM_BATCHES_TO_RETAIN == 5
    for h in sent[-NUM_BATCHES_TO_RETAIN:]:
        resend = hdr(state, seq=h.base_sequence, count=h.record_count)  # placed at the end
        original = state.check_append(resend)
        assert original is not None, f"sequence {h.base_sequence} not seen as a duplicate"
        assert (original.base_offset, original.record_count) == (h.base_offset, h.record_count)
        assert original.last_offset == h.last_offset
    # The sixth-last is out of the window: Kafka rejects it as out of order.
    sixth = sent[-NUM_BATCHES_TO_RETAIN - 1]
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append(hdr(state, seq=sixth.base_sequence, count=sixth.record_count))
    # Same first sequence but a different length is not a duplicate either.
    last = sent[-1]
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append(hdr(state, seq=last.base_sequence, count=last.record_count + 1))


def test_old_epoch_is_rejected_with_an_epoch_error() -> None:
    state = ProducerState()
    append(state, hdr(state, seq=0, epoch=3))
    with pytest.raises(InvalidProducerEpochError) as info:
        state.check_append(hdr(state, seq=3, epoch=2))
    assert not isinstance(info.value, OutOfOrderSequenceError)
    assert type(info.value) is InvalidProducerEpochError
    message = str(info.value)
    assert f"producer {PID}" in message and "epoch 2" in message and "epoch 3" in message
    assert "sequence 3" in message
    # A transactional batch of an old epoch means a newer instance took over: fenced.
    with pytest.raises(ProducerFencedError):
        state.check_append(hdr(state, seq=3, epoch=2, transactional=True, decision="d"))
    assert not issubclass(OutOfOrderSequenceError, InvalidProducerEpochError)
    assert not issubclass(InvalidProducerEpochError, OutOfOrderSequenceError)


def test_new_epoch_must_start_at_sequence_zero() -> None:
    state = ProducerState()
    append(state, hdr(state, seq=0, count=4, epoch=0))
    old = hdr(state, seq=0, count=4, epoch=0)
    with pytest.raises(OutOfOrderSequenceError) as info:
        state.check_append(hdr(state, seq=4, epoch=1))
    assert "epoch 1" in str(info.value) and "sequence 0" in str(info.value)
    append(state, hdr(state, seq=0, count=2, epoch=1))
    entry = state.producers[PID]
    assert entry.epoch == 1 and len(entry.batches) == 1
    # The old epoch's batch is no longer a duplicate: it is from a fenced epoch.
    with pytest.raises(InvalidProducerEpochError):
        state.check_append(old)


def test_sequence_wraps_after_int32_max() -> None:
    state = ProducerState()
    # Reach the top of the sequence space the way a long-lived producer would.
    append(state, hdr(state, seq=0, count=1))
    state.producers[PID].batches[-1].last_seq = INT32_MAX - 5
    state.producers[PID].batches[-1].first_seq = INT32_MAX - 5
    wrapping = hdr(state, seq=INT32_MAX - 4, count=7)  # sequences MAX-4 .. MAX, 0, 1
    assert wrapping.last_sequence == 1
    append(state, wrapping)
    assert state.producers[PID].last_seq == 1
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append(hdr(state, seq=0))
    assert state.check_append(hdr(state, seq=INT32_MAX - 4, count=7)) is not None  # duplicate
    append(state, hdr(state, seq=2, count=1))

    exact = ProducerState()
    append(exact, hdr(exact, seq=0, count=1))
    exact.producers[PID].batches[-1].first_seq = INT32_MAX
    exact.producers[PID].batches[-1].last_seq = INT32_MAX
    with pytest.raises(OutOfOrderSequenceError):
        exact.check_append(hdr(exact, seq=1))
    append(exact, hdr(exact, seq=0, count=1))  # after 2^31-1 comes 0
    assert exact.producers[PID].last_seq == 0


def test_apply_refuses_a_batch_that_is_not_at_the_end() -> None:
    state = ProducerState()
    append(state, hdr(state, seq=0))
    with pytest.raises(ValueError):
        state.apply(BatchHeader(base_offset=0, record_count=1))


def build_rich_state() -> ProducerState:
    """Several producers, an aborted and a committed transaction, one still open."""
    state = ProducerState()
    append(state, BatchHeader(base_offset=0, record_count=2))
    for i in range(7):
        append(state, hdr(state, seq=i * 3, pid=1))
    append(state, hdr(state, seq=0, pid=2, transactional=True, decision="d2"))
    append(state, hdr(state, seq=3, pid=2, transactional=True, decision="d2"))
    marker(state, 2, 1, ABORT)
    append(state, hdr(state, seq=0, pid=2, epoch=1, transactional=True, decision="d2b"))
    marker(state, 2, 2, COMMIT)
    append(state, hdr(state, seq=0, pid=3, epoch=7, transactional=True, decision="d3"))
    return state


def test_transaction_bookkeeping() -> None:
    state = build_rich_state()
    assert [(a.producer_id, a.first_offset) for a in state.aborted] == [(2, 23)]
    assert state.aborted[0].last_offset == 29
    open_txns = state.open_transactions()
    assert [(t.producer_id, t.epoch, t.decision_id) for t in open_txns] == [(3, 7, "d3")]
    assert open_txns[0].first_offset == state.end_offset - 3


def test_snapshot_round_trip_is_exact() -> None:
    state = build_rich_state()
    data = state.to_bytes()
    restored = ProducerState.from_bytes(data)
    assert restored.end_offset == state.end_offset
    assert restored.producers == state.producers
    assert restored.aborted == state.aborted
    assert restored.to_bytes() == data
    # The restored state validates exactly like the original.
    nxt = hdr(restored, seq=21, pid=1)
    assert restored.check_append(nxt) is None and state.check_append(nxt) is None
    dup = hdr(restored, seq=18, pid=1)
    assert restored.check_append(dup) == state.check_append(dup)
    copy = state.copy()
    append(copy, hdr(copy, seq=21, pid=1))
    assert state.producers[1].last_seq == 20  # the copy is independent
    with pytest.raises(ValueError):
        ProducerState.from_bytes(b"\x81\xa1v\x63")  # {"v": 99}


def _fill(root: Path, batches: int) -> Log:
    log = Log(root)
    log.create_topic("t", 1)
    producer = log.producer(linger_ms=0)
    for i in range(batches):
        producer.send("t", b"v%d" % i, partition=0).get()
    return log


def _state_from_all_headers(root: Path) -> ProducerState:
    state = ProducerState()
    for batch in read_chain(root, "t", 0):
        state.apply(batch.header)
    return state


def _snapshots(root: Path) -> list[Path]:
    return sorted((root / "topics" / "t" / "0" / SNAPSHOT_DIR).glob(f"*{SNAPSHOT_SUFFIX}"))


def test_fresh_state_reads_only_batches_after_the_last_snapshot(tmp_path: Path) -> None:
    root = tmp_path / "log"
    total = 2 * SNAPSHOT_INTERVAL + 10
    _fill(root, total)
    snaps = _snapshots(root)
    assert snaps, "a writer past SNAPSHOT_INTERVAL batches should have left a snapshot"
    latest = int(snaps[-1].name[:-len(SNAPSHOT_SUFFIX)])
    after = [b.header.base_offset for b in read_chain(root, "t", 0)
             if b.header.base_offset >= latest]
    assert 0 < len(after) < total

    counting = CountingStorage(LocalStorage(str(root)))
    state = Log(counting).partition("t", 0).state()
    read = [int(Path(p).name.split(".")[0]) for p in counting.paths("read_prefix")]
    # The batch the snapshot says it ends with (tying the snapshot to this log),
    # each batch after the snapshot once, the probe that finds the log end, and
    # the check that the batch the cache ended with is still there (so what was
    # read after it belongs to the same incarnation of the topic).
    assert read == [latest - 1] + after + [total, latest - 1]
    assert counting.paths("read_buffer") == [] and counting.paths("read") == []
    assert state.to_bytes() == _state_from_all_headers(root).to_bytes()


def test_damaged_snapshot_falls_back_to_an_older_one(tmp_path: Path) -> None:
    """A snapshot is only a cache: a bad one costs reads, never correctness."""
    root = tmp_path / "log"
    _fill(root, 2 * SNAPSHOT_INTERVAL + 5)
    snaps = _snapshots(root)
    assert len(snaps) >= 2
    older = int(snaps[-2].name[:-len(SNAPSHOT_SUFFIX)])
    damaged = bytearray(snaps[-1].read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    snaps[-1].write_bytes(bytes(damaged))

    counting = CountingStorage(LocalStorage(str(root)))
    state = Log(counting).partition("t", 0).state()
    first_read = int(Path(counting.paths("read_prefix")[0]).name.split(".")[0])
    assert first_read == older - 1  # the last batch of the older snapshot: it is used
    assert state.to_bytes() == _state_from_all_headers(root).to_bytes()


def test_aborted_index_agrees_with_a_linear_scan() -> None:
    """The bisecting index must answer exactly as checking every aborted range would."""
    import random

    from txlog.partition.producer_state import AbortedIndex, AbortedTransaction

    rng = random.Random(5)
    index = AbortedIndex()
    ranges: list[AbortedTransaction] = []
    next_free = {pid: 0 for pid in range(4)}
    for _ in range(300):  # each producer's transactions follow each other, as in a log
        pid = rng.randrange(4)
        first = next_free[pid] + rng.randrange(0, 20)
        last = first + rng.randrange(1, 15)
        next_free[pid] = last + 1
        if rng.random() < 0.5:
            aborted = AbortedTransaction(pid, first, last)
            ranges.append(aborted)
            index.add(aborted)
    assert index.size == len(ranges)
    for pid in range(5):
        for offset in range(max(next_free.values()) + 5):
            expected = any(a.producer_id == pid and a.first_offset <= offset <= a.last_offset
                           for a in ranges)
            assert index.covers(pid, offset) == expected, (pid, offset)


# --- snapshot version 4: the producer entries read only when an append needs one ---------


def _unread(state: ProducerState) -> tuple[ProducerState, list[int]]:
    """``state`` through a version 4 snapshot, with a loader that counts its reads."""
    fields, data = state.snapshot_parts()
    reads: list[int] = []

    def load() -> bytes:
        reads.append(len(data))
        return data

    return ProducerState.from_dict(fields, entries=load), reads


def test_v4_state_decodes_its_entries_only_when_an_append_needs_one() -> None:
    state = build_rich_state()
    full = state.to_dict()
    restored, reads = _unread(state)
    assert [t.producer_id for t in restored.open_transactions()] == [3]  # from the fields
    assert restored.end_offset == state.end_offset and restored.aborted == state.aborted
    assert reads == []
    dup = hdr(restored, seq=18, pid=1)
    assert restored.check_append(dup) == state.check_append(dup)  # one entry decoded
    assert len(reads) == 1
    assert restored.to_dict() == full  # every entry, as the full fold had it
    assert len(reads) == 1


def test_v4_batches_applied_before_the_entries_are_read_fold_onto_them() -> None:
    """A reader folds headers without the section; the entries it then reads are exact."""
    state = build_rich_state()
    restored, reads = _unread(state)
    steps = []
    for make in (lambda: hdr(state, seq=21, pid=1),
                 lambda: hdr(state, seq=0, pid=2, epoch=2, transactional=True, decision="d2c")):
        steps.append(make())
        state.apply(steps[-1])
        restored.apply(steps[-1])
    abort = BatchHeader(base_offset=state.end_offset, record_count=1,
                        attributes=CONTROL_BIT | TRANSACTIONAL_BIT, producer_id=2,
                        producer_epoch=3)
    control = ControlRecord(ABORT, 0, steps[1].base_offset)
    state.apply(abort, control)
    restored.apply(abort, control)
    later = hdr(state, seq=0, pid=9)
    state.apply(later)
    restored.apply(later)
    assert reads == []  # nothing so far needed an entry
    assert restored.open_transactions() == state.open_transactions()
    assert restored.aborted == state.aborted
    assert restored.to_dict() == state.to_dict() and len(reads) == 1


def test_v4_an_old_epoch_known_only_from_the_unread_section_is_fenced() -> None:
    state = build_rich_state()  # producer 2 is at epoch 2 (its last marker), in the section
    restored, reads = _unread(state)
    zombie = hdr(restored, seq=2, pid=2, epoch=1, transactional=True, decision="d2b")
    with pytest.raises(ProducerFencedError, match="older than epoch 2"):
        restored.check_append(zombie)
    assert len(reads) == 1
    plain = hdr(restored, seq=0, pid=1, epoch=0)
    with pytest.raises(OutOfOrderSequenceError):  # producer 1 is at sequence 20
        restored.check_append(plain)


def test_v4_section_decoding_refuses_damage() -> None:
    fields, data = build_rich_state().snapshot_parts()
    assert data[:4] == b"TXE\x01" and fields["entries"]["count"] == 2  # producers 1 and 2
    for bad in (data[:-1], data[:20] + bytes([data[20] ^ 1]) + data[21:]):
        damaged = ProducerState.from_dict(fields, entries=lambda bad=bad: bad)
        with pytest.raises(ValueError, match="checksum"):
            damaged.producers.get(1)
    with pytest.raises(ValueError, match="without its entries section"):
        ProducerState.from_dict(fields)


class _RangeCounting(CountingStorage):
    """Counts the bytes of every prefix and ranged read."""

    def __init__(self, inner: LocalStorage) -> None:
        super().__init__(inner)
        self.ranges: list[tuple[str, int, int]] = []
        self.prefix_bytes: dict[str, int] = {}

    def read_prefix(self, path: str, length: int) -> bytes:
        data = super().read_prefix(path, length)
        self.prefix_bytes[path] = self.prefix_bytes.get(path, 0) + len(data)
        return data

    def read_range(self, path: str, start: int, length: int):  # noqa: ANN201
        self.ranges.append((path, start, length))
        return super().read_range(path, start, length)


def test_v4_a_fresh_lso_reads_no_producer_entries_and_an_append_reads_them_once(
        tmp_path: Path) -> None:
    from txlog.partition.partition_log import PartitionLog

    root = tmp_path / "log"
    log = Log(root, fsync=False)
    log.create_topic("t", 1)
    topic_id = log.partition("t", 0).topic_id
    part = PartitionLog(log.storage, "t", 0, topic_id)  # no coordinator: headers by hand

    def batch(pid: int, epoch: int = 3, seq: int = 0, transactional: bool = False) -> None:
        part.append(BatchHeader(base_offset=0, record_count=1, base_timestamp=10, max_timestamp=20,
                                producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                attributes=TRANSACTIONAL_BIT if transactional else 0,
                                decision_id="d" if transactional else ""), b"x")

    for pid in range(1000, 1400):  # 400 entries: a section of ~25 KB
        batch(pid)
    batch(7, transactional=True)
    opened = part.end_offset() - 1
    log.compact("t")
    for pid in range(2000, 2000 + 2 * SNAPSHOT_INTERVAL + 2):  # and snapshot files after it
        batch(pid)
    part.state()
    snaps = _snapshots(root)
    # A delta of the 128 producers since the compaction (~8 KB), not the ~25 KB before it.
    assert snaps and 2 * SNAPSHOT_HEAD_READ > snaps[-1].stat().st_size > SNAPSHOT_HEAD_READ
    segment = "topics/t/0/segments/00000000000000000000.segment"

    counting = _RangeCounting(LocalStorage(str(root)))
    fresh = Log(counting)
    assert fresh.last_stable_offset("t", 0) == opened
    assert counting.ranges == []  # no producer entry section was read
    # Bounded prefixes (the fields and what follows them in one read), never the ~25 KB
    # of entries after them, and nothing decoded from those bytes.
    read = {Path(p).suffix: n for p, n in counting.prefix_bytes.items()}
    assert read[SNAPSHOT_SUFFIX] <= SNAPSHOT_HEAD_READ < snaps[-1].stat().st_size, read
    assert read[".segment"] <= HEAD_READ_SIZE + HEADER_SIZE, read  # head, then its header

    zombie = PartitionLog(counting, "t", 0, topic_id)
    with pytest.raises(InvalidProducerEpochError):
        zombie.append(BatchHeader(base_offset=0, record_count=1, producer_id=1005, producer_epoch=2), b"x")
    # The delta's section (it may hold 1005: its ids go up to 2129), then the base's.
    assert [p for p, _, _ in counting.ranges] == [str(snaps[-1].relative_to(root)), segment]
    again = zombie.append(BatchHeader(base_offset=0, record_count=1, base_timestamp=10, max_timestamp=20,
                                      producer_id=1010, producer_epoch=3, base_sequence=0),
                          b"x")
    assert again.duplicate and len(counting.ranges) == 2  # decoded from the same reads


def test_v4_reads_version_3_snapshot_files(tmp_path: Path) -> None:
    """A snapshot file written before version 4 (whole msgpack, one checksum) still loads."""
    import crc32c
    import msgpack

    root = tmp_path / "log"
    _fill(root, SNAPSHOT_INTERVAL + 5)
    snap = _snapshots(root)[-1]
    end = int(snap.name[:-len(SNAPSHOT_SUFFIX)])
    full = _state_from_all_headers(root)
    prefix = ProducerState()
    for b in read_chain(root, "t", 0):
        if b.header.base_offset < end:
            prefix.apply(b.header)
            last = b
    fields = {"v": 3, "topic_id": Log(root).partition("t", 0).topic_id,
              "last": [last.header.base_offset, snap.parent.parent.joinpath(
                  last.path.name).read_bytes()[:8]], **prefix.to_dict()}
    fields["aborted_from"] = 0
    body = msgpack.packb(fields)
    snap.write_bytes(crc32c.crc32c(body).to_bytes(4, "big") + body)
    counting = CountingStorage(LocalStorage(str(root)))
    state = Log(counting).partition("t", 0).state()
    assert counting.paths("read_prefix")[0].endswith(f"{last.header.base_offset:020d}.batch")
    assert state.to_dict() == full.to_dict()


@pytest.mark.parametrize("loss", ["pruned", "damaged"])
def test_v4_an_append_whose_unread_entries_went_away_loads_the_state_again(
        tmp_path: Path, loss: str, caplog: pytest.LogCaptureFixture) -> None:
    """The snapshot a process loaded its fields from is pruned (or its entries section is
    damaged) before an append needs an entry: the process loads again, and the producer's
    last batch is still recognised as a duplicate."""
    import logging
    from dataclasses import replace

    root = tmp_path / "log"
    _fill(root, SNAPSHOT_INTERVAL + 5)
    snap = _snapshots(root)[-1]
    last = read_chain(root, "t", 0)[-1].header
    part = Log(root).partition("t", 0)
    assert part.state().producers.unread  # fields only, so far
    if loss == "pruned":
        snap.unlink()
    else:
        data = bytearray(snap.read_bytes())
        data[-3] ^= 0xFF  # inside the entries section
        snap.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="txlog.partition.state_manager"):
        again = part.append(replace(last, base_offset=0), b"x")
    assert again.duplicate and again.base_offset == last.base_offset
    assert (loss == "damaged") == any("entries section is damaged" in r.getMessage()
                                      for r in caplog.records)


def test_v4_a_refresh_whose_snapshot_was_pruned_meanwhile_returns_a_usable_state(
        tmp_path: Path) -> None:
    """A process holding a state loaded from a snapshot that another process pruned writes
    its own snapshot on a refresh: reading the entries fails, and the refresh loads again
    rather than return the state it just dropped (seen in the Jepsen harness as an
    assertion after a publish)."""
    root = tmp_path / "log"
    _fill(root, SNAPSHOT_INTERVAL + 5)
    loaded_from = _snapshots(root)[-1]
    held = Log(root).partition("t", 0)
    assert held.state().producers.unread
    other = Log(root).producer(linger_ms=0)
    for i in range(2 * SNAPSHOT_INTERVAL + 2):
        other.send("t", b"o%d" % i, partition=0).get()
    assert not loaded_from.exists()  # pruned by the other process's snapshots
    state = held.state()
    assert state is held.state()  # the cached state, not a dropped one
    assert state.to_dict() == _state_from_all_headers(root).to_dict()


def test_v4_damaged_entries_of_a_segment_are_an_error_naming_it(tmp_path: Path) -> None:
    """A segment's state is part of the log (its batches are gone): damage in its entries
    section is refused clearly when an append first needs an entry, not guessed around."""
    from dataclasses import replace

    from txlog.errors import CorruptBatchError
    from txlog.format.segment import read_head

    root = tmp_path / "log"
    log = _fill(root, 10)
    log.compact("t")
    last = read_chain(root, "t", 0)[-1].header
    [segment] = sorted((root / "topics" / "t" / "0" / "segments").glob("*.segment"))
    _, fields = read_head(LocalStorage(str(root)), str(segment.relative_to(root)), "", 0)
    data = bytearray(segment.read_bytes())
    data[fields["_entries_at"] + 20] ^= 0xFF
    segment.chmod(0o644)
    segment.write_bytes(bytes(data))
    part = Log(root).partition("t", 0)
    assert part.last_stable_offset() == last.next_offset  # readers need no entry
    with pytest.raises(CorruptBatchError, match="producer entries checksum") as info:
        part.append(replace(last, base_offset=0), b"x")
    assert segment.name in str(info.value)
