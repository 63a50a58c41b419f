"""The per-segment aborted index: snapshots carry no aborted history, reads below the
compacted end take it from the segments they need (docs/protocol.md section 6,
docs/format.md sections 3 and 4.2).

Expected records come from reads of the same log before compaction.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from helpers_core import segment_files
from txlog import Log
from txlog.format.snapshot_frame import is_framed, unframe
from txlog.partition import reader as reader_module
from txlog.partition.producer_state import AbortedIndex
from txlog.partition.state_manager import StateManager

SEGMENT_BYTES = 3000


def _write(log: Log, rounds: int) -> None:
    """Producer ``long`` keeps one transaction open across many of ``short``'s (and so
    across segments), aborting every other one; ``short`` aborts one in three."""
    long_txn = log.producer(transactional_id="long")
    short = log.producer(transactional_id="short")
    long_txn.init_transactions()
    short.init_transactions()
    for r in range(rounds):
        long_txn.begin_transaction()
        for j in range(6):
            long_txn.send("t", f"L{r}.{j}".encode(), partition=0)
            long_txn.flush()
            short.begin_transaction()
            short.send("t", f"S{r}.{j}".encode(), partition=0)
            short.flush()
            (short.abort_transaction if j % 3 == 1 else short.commit_transaction)()
        (long_txn.abort_transaction if r % 2 else long_txn.commit_transaction)()
    # A commit returns at its decision: closing waits for the markers behind it, so that
    # what is compacted next holds no transaction still open.
    long_txn.close()
    short.close()


def _committed(log: Log, start: int) -> list[tuple[int, bytes]]:
    table = log.read("t", 0, start)
    return list(zip(table.column("offset").to_pylist(), table.column("value").to_pylist()))


def _snapshot_of_newest_segment(root: Path) -> dict:
    newest = segment_files(root, "t", 0)[-1].read_bytes()
    length = int.from_bytes(newest[56:60], "big")
    section = newest[88:88 + length]
    return unframe(section)[0] if is_framed(section) else msgpack.unpackb(section)


def test_reads_below_the_compacted_end_filter_aborted_transactions_from_the_segments(
        tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": SEGMENT_BYTES})
    _write(log, 4)
    end = log.end_offset("t", 0)
    starts = list(range(0, end, 3))
    expected = {s: _committed(Log(tmp_path), s) for s in starts}
    assert not any(v.startswith((b"L1", b"L3")) or v.startswith(b"S0.1")
                   for _, v in expected[0])
    stale = Log(tmp_path)
    stale.partition("t", 0).state()  # its cache predates every segment
    log.compact("t", upto_lag=7)
    assert len(segment_files(tmp_path, "t", 0)) > 4
    snapshot = _snapshot_of_newest_segment(tmp_path)
    assert snapshot["v"] == 5 and snapshot["aborted"] == [] and \
        snapshot["aborted_from"] == snapshot["end"]
    fresh = Log(tmp_path)
    for s in starts:
        assert _committed(fresh, s) == expected[s], s
        assert _committed(stale, s) == expected[s], s
    # and once everything is compacted, from a process that starts cold
    log.compact("t")
    for s in starts:
        assert _committed(Log(tmp_path), s) == expected[s], s


def test_a_read_touches_only_the_segments_it_needs(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": SEGMENT_BYTES})
    _write(log, 6)
    log.compact("t")
    bases = [int(p.name[:20]) for p in segment_files(tmp_path, "t", 0)]
    read: list[int] = []
    fresh = Log(tmp_path)
    cache = fresh.partition("t", 0)._cache
    original = cache.segment_aborted
    monkeypatch.setattr(cache, "segment_aborted", lambda base: read.append(base) or
                        original(base))
    middle = bases[len(bases) // 2]
    fresh.read("t", 0, middle, middle + 3)
    # the segment holding the range, and those after it up to the marker of a transaction
    # open across its end: never the older ones, never all of them
    assert read and read[0] == middle and len(read) < len(bases) - len(bases) // 2 + 1
    assert all(b >= middle for b in read)


def test_snapshots_stay_the_same_size_however_many_transactions_aborted(
        tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": SEGMENT_BYTES})
    sizes = []
    for _ in range(3):
        _write(log, 4)
        log.compact("t")
        sizes.append(len(msgpack.packb(_snapshot_of_newest_segment(tmp_path))))
    assert max(sizes) - min(sizes) <= 16, sizes  # before: ~30 more bytes per abort


def test_logs_whose_snapshots_carry_the_whole_history_stay_readable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments written with version 2 snapshots (every aborted transaction in each), then
    version 3 ones after them, read as one log."""
    new_fields = StateManager.snapshot_fields

    def old_fields(self, state, last_base, anchor, aborted_from, full=False):
        fields = state.to_dict()
        del fields["aborted_from"]
        return {"v": 2, "topic_id": self.topic_id, "last": [last_base, anchor], **fields}

    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": SEGMENT_BYTES})
    _write(log, 3)
    monkeypatch.setattr(StateManager, "snapshot_fields", old_fields)
    log.compact("t", upto_lag=5)
    assert _snapshot_of_newest_segment(tmp_path)["v"] == 2
    monkeypatch.setattr(StateManager, "snapshot_fields", new_fields)
    _write(log, 2)
    end = log.end_offset("t", 0)
    expected = {s: _committed(Log(tmp_path), s) for s in range(0, end, 4)}
    log.compact("t")
    assert _snapshot_of_newest_segment(tmp_path)["v"] == 5
    for s, records in expected.items():
        assert _committed(Log(tmp_path), s) == records, s


def test_without_the_segments_aborted_sections_aborted_records_would_show(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule's witness: a reader that ignores the segments' aborted sections returns
    aborted records (so the tests above would fail without it)."""
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": SEGMENT_BYTES})
    _write(log, 2)
    expected = _committed(Log(tmp_path), 0)
    log.compact("t")
    monkeypatch.setattr(reader_module.Reader, "_segment_aborted",
                        lambda self, state, start, end: AbortedIndex())
    assert _committed(Log(tmp_path), 0) != expected
