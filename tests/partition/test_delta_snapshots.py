"""Version 5 snapshots: between compactions a snapshot file holds only the producer entries
changed since the newest segment's full section, its base (docs/format.md 3.2)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from txlog import InvalidProducerEpochError, Log, clock
from txlog.format.batch import BatchHeader
from txlog.format.snapshot_frame import unframe
from txlog.partition.partition_log import PartitionLog
from txlog.partition.producer_state import ProducerState
from txlog.partition.state_manager import SNAPSHOT_INTERVAL, SnapshotGone
from txlog.storage.local import LocalStorage
from txlog.storage.paths import SNAPSHOT_DIR, SNAPSHOT_SUFFIX

EXPIRATION_MS = 1_000_000


class _RangeCounting(LocalStorage):
    """Records every ranged read: how a producer entries section is read."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.ranges: list[str] = []

    def read_range(self, path: str, start: int, length: int):  # noqa: ANN201
        self.ranges.append(path)
        return super().read_range(path, start, length)


class _Clock:
    def __init__(self) -> None:
        self.now = 10_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    SENT.clear()
    fake = _Clock()
    monkeypatch.setattr(clock, "now_ms", fake)
    return fake


def _open(root: Path, storage: LocalStorage | None = None) -> tuple[Log, PartitionLog]:
    log = Log(storage or LocalStorage(str(root)))
    if "t" not in log.topics():
        log.create_topic("t", 1, {"producer.id.expiration.ms": EXPIRATION_MS})
    part = log.partition("t", 0)
    # No coordinator: headers by hand, with the topic's expiry.
    return log, PartitionLog(log.storage, "t", 0, part.topic_id,
                             producer_expiration_ms=EXPIRATION_MS)


SENT: list[BatchHeader] = []  # what _send wrote, for the reference fold (_folded)


def _send(part: PartitionLog, pid: int, seq: int = 0, epoch: int = 3) -> None:
    header = BatchHeader(base_offset=0, record_count=1, base_timestamp=10, max_timestamp=20,
                         producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    result = part.append(header, b"x")
    if not result.duplicate:
        SENT.append(replace(header, base_offset=result.base_offset, append_time=clock.now_ms()))


def _snapshots(root: Path) -> list[Path]:
    return sorted((root / "topics" / "t" / "0" / SNAPSHOT_DIR).glob(f"*{SNAPSHOT_SUFFIX}"))


def _fields(path: Path) -> dict:
    return unframe(path.read_bytes())[0]


def _folded() -> dict:
    """Every entry, by a fold of every batch written from offset 0 (the definition)."""
    state = ProducerState(expiration_ms=EXPIRATION_MS)
    for header in SENT:
        state.apply(header)
    return dict(state.producers.items())


def _compacted_then(root: Path, old: range, new: range) -> tuple[Log, PartitionLog]:
    """A partition where producers ``old`` wrote, was compacted, then ``new`` wrote."""
    log, part = _open(root)
    for pid in old:
        _send(part, pid)
    log.compact("t")
    for pid in new:
        _send(part, pid)
    return log, part


def test_snapshots_between_compactions_hold_only_what_changed(tmp_path: Path,
                                                              ticking: _Clock) -> None:
    root = tmp_path / "log"
    # New producers, then an old one again.
    _, part = _compacted_then(root, range(1000, 1300), range(2000, 2000 + SNAPSHOT_INTERVAL - 1))
    _send(part, 1005, seq=1)
    fields = _fields(_snapshots(root)[-1])
    assert fields["v"] == 5 and fields["base"]["segment"] == 0
    assert fields["base"]["count"] == 300 and fields["entries"]["count"] == SNAPSHOT_INTERVAL
    # The delta round-trips: a fresh process loading it (and its base) holds every entry
    # a full fold holds, 1005 as changed by its second batch.
    fresh = _open(root)[1].state()
    assert dict(fresh.producers.items()) == _folded()
    assert fresh.producers[1005].last_seq == 1


def test_an_append_for_a_new_producer_id_reads_no_entries_section(tmp_path: Path,
                                                                  ticking: _Clock) -> None:
    root = tmp_path / "log"
    _compacted_then(root, range(1000, 1100), range(2000, 2000 + SNAPSHOT_INTERVAL + 2))
    assert _fields(_snapshots(root)[-1])["entries"]["max_pid"] == 2000 + SNAPSHOT_INTERVAL - 1

    counting = _RangeCounting(str(root))
    _, fresh = _open(root, counting)
    _send(fresh, 5000)  # newer than every id of the delta and of its base
    assert counting.ranges == []
    for pid in range(5001, 5001 + SNAPSHOT_INTERVAL):
        _send(fresh, pid)
    # The next delta carries the last one's entries forward (the changes since the
    # compaction, whatever the history before it): that section is read, never the base's.
    assert [Path(p).suffix for p in counting.ranges] == [SNAPSHOT_SUFFIX]
    counting.ranges.clear()
    with pytest.raises(InvalidProducerEpochError):  # an old id reads the base
        _send(fresh, 1050, epoch=2)
    assert [Path(p).suffix for p in counting.ranges] == [".segment"]  # the delta is read


def test_compaction_rewrites_every_entry_and_the_next_delta_builds_on_it(
        tmp_path: Path, ticking: _Clock) -> None:
    root = tmp_path / "log"
    log, part = _compacted_then(root, range(1000, 1100), range(2000, 2000 + SNAPSHOT_INTERVAL + 1))
    log.compact("t")
    segments = sorted((root / "topics" / "t" / "0" / "segments").iterdir())
    newest = _open(root)[1].state()
    assert len(newest.producers) == 100 + SNAPSHOT_INTERVAL + 1 == len(_folded())
    for pid in range(3000, 3000 + SNAPSHOT_INTERVAL + 1):
        _send(part, pid)
    part.state()
    fields = _fields(_snapshots(root)[-1])
    base_path = root / "topics" / "t" / "0" / "segments" / f"{fields['base']['segment']:020d}.segment"
    assert base_path == segments[-1] and fields["base"]["count"] == 100 + SNAPSHOT_INTERVAL + 1
    assert fields["entries"]["count"] == SNAPSHOT_INTERVAL


def test_base_entries_expire_as_in_a_full_fold(tmp_path: Path, ticking: _Clock) -> None:
    root = tmp_path / "log"
    log, part = _open(root)
    for pid in range(1000, 1050):
        _send(part, pid)
    ticking.now += EXPIRATION_MS // 2
    for pid in range(1050, 1100):
        _send(part, pid)
    log.compact("t")
    ticking.now += EXPIRATION_MS // 2 + 1  # the first 50 expire, the next 50 do not
    _send(part, 1010, seq=1)  # an expired producer comes back: a new entry
    for pid in range(2000, 2000 + SNAPSHOT_INTERVAL):
        _send(part, pid)
    part.state()
    assert "base" in _fields(_snapshots(root)[-1])
    expected = _folded()
    assert 1000 not in expected and 1060 in expected
    fresh = _open(root)[1]
    assert dict(fresh.state().producers.items()) == expected
    _send(fresh, 1060, seq=1)  # its base row counts
    with pytest.raises(Exception, match="sequence"):
        _send(fresh, 1020, seq=1)  # expired: it must start again at 0


def test_a_delta_whose_base_is_gone_is_skipped(tmp_path: Path, ticking: _Clock) -> None:
    """An appender whose cached state predates the newest compaction writes deltas on the
    segment it loaded; a merge then deletes that segment.  The delta is useless from then
    on: a fresh process skips it, loads the newest segment and replays the batches."""
    root = tmp_path / "log"
    # Segment 0 holds 1000..1004.
    log, part = _compacted_then(root, range(1000, 1005), range(2000, 2000 + SNAPSHOT_INTERVAL + 1))
    delta = _fields(_snapshots(root)[-1])
    base = root / "topics" / "t" / "0" / "segments" / f"{delta['base']['segment']:020d}.segment"
    assert delta["base"]["segment"] == 0 and base.exists()
    log.compact("t", upto_lag=60)
    log.compact("t", upto_lag=50)
    log.merge_segments("t")
    assert not base.exists() and _fields(_snapshots(root)[-1])["base"] == delta["base"]
    fresh = _open(root)[1]
    with pytest.raises(InvalidProducerEpochError):  # in the delta
        _send(fresh, 2005, epoch=2)
    with pytest.raises(InvalidProducerEpochError):  # in the gone base: loaded anew
        _send(fresh, 1002, epoch=2)
    assert dict(fresh.state().producers.items()) == _folded()


def test_listing_every_entry_loads_again_when_the_base_goes_after_the_load(
        tmp_path: Path, ticking: _Clock) -> None:
    """A state loaded from a delta reads its base's entries only when they are needed; a
    merge that deletes the base first leaves the cached state unable to list them
    (``txlog producers describe``, the admin client's describe_producers):
    ``loaded_state`` loads the partition again instead of failing."""
    root = tmp_path / "log"
    log, _ = _compacted_then(root, range(1000, 1005), range(2000, 2000 + SNAPSHOT_INTERVAL + 1))
    fresh = _open(root)[1]
    assert fresh.state().producers.unread  # the base's section not read yet
    log.compact("t", upto_lag=60)
    log.compact("t", upto_lag=50)
    log.merge_segments("t")
    with pytest.raises(SnapshotGone):
        fresh.state().producers.load()
    assert dict(fresh.loaded_state().producers.items()) == _folded()


def test_an_appender_whose_cache_outlived_a_compaction_builds_on_the_newer_segment(
        tmp_path: Path, ticking: _Clock) -> None:
    """Its anchor was not compacted, so it keeps its state: its next delta names the newer
    segment and holds only what changed since (by the log clock), not since its old base."""
    root = tmp_path / "log"
    log, part = _open(root)
    for pid in range(1000, 1100):
        _send(part, pid)
    log.compact("t")  # segment 0
    for pid in range(2000, 2010):
        ticking.now += 1
        _send(part, pid)
    log.compact("t", upto_lag=5)  # segment 100 holds 2000..2004; part's anchor stays
    for pid in range(3000, 3000 + SNAPSHOT_INTERVAL):
        ticking.now += 1
        _send(part, pid)
    delta = _fields(_snapshots(root)[-1])
    assert delta["base"]["segment"] == 100 and delta["base"]["count"] == 105
    # 2000..2003 are in segment 100 as they are in the state: not carried.
    assert delta["entries"]["count"] == SNAPSHOT_INTERVAL - 4
    assert dict(_open(root)[1].state().producers.items()) == _folded()
