"""Merging adjacent small segments (partition/segment_merge.py, docs/protocol.md 7.3).

Each test builds a partition with many small segments (compaction run a few
offsets at a time), records everything a reader can ask of it, changes the
segments underneath (a merge, racing mergers, a late compactor, retention,
a crash) and asks again.  The multi-process loop with SIGKILLs is
test_maintenance_loop.py (Log.compact merges there).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import SRC
from helpers_core import DelegatingStorage
from test_compaction import _mixed, _table
from txlog import Log
from txlog.admin.verify import verify_partition
from txlog.errors import OffsetOutOfRangeError
from txlog.format.segment import encode_merged_head
from txlog.partition.isolation import READ_UNCOMMITTED
from txlog.partition.segment_merge import _read_input
from txlog.storage.local import LocalStorage
from txlog.storage.paths import merged_segment_path

MAX = 64_000  # segment.bytes: every segment made below is far smaller


def _segments(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "topics" / "t" / "0" / "segments").glob("*.segment"))


def _log(root: Path) -> Log:
    log = Log(root, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": MAX})
    _mixed(log, "t")  # data, committed and aborted transactions, one left open
    return log


def _small_segments(log: Log, step: int = 3, upto: int | None = None) -> None:
    part = log.partition("t", 0)
    end = part.end_offset() if upto is None else upto
    for stop in range(step, end + 1, step):
        part.compact(MAX, 1, stop)


def _from(table: pa.Table, offset: int) -> pa.Table:
    return table.filter(pc.greater_equal(table["offset"], offset))


def _view(log: Log) -> list[object]:
    """Everything a reader asks: bounds, both isolation levels from several starts,
    and an offset for the time of every record."""
    part = log.partition("t", 0)
    start = part.log_start()
    everything = _table(part, start, READ_UNCOMMITTED)
    times = sorted({int(t.timestamp() * 1000) for t in everything.column("timestamp").to_pylist()})
    return [start, part.last_stable_offset(), part.end_offset(), everything,
            *(_table(part, s) for s in range(start, part.end_offset(), 5)),
            *(log.offsets_for_times("t", 0, ts) for ts in [0, *times, times[-1] + 1])]


def test_a_merged_log_reads_as_before(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _small_segments(log)
    before = _view(log)
    plain = _segments(tmp_path)
    assert len(plain) > 10
    merged = log.partition("t", 0).merge_segments(MAX)
    assert merged and merged[0].base_offset == 0
    after = _segments(tmp_path)
    assert len(after) <= 3 and any("-" in name for name in after)
    assert after[-1] == plain[-1]  # the newest segment is never merged
    assert _view(log) == before
    assert _view(Log(tmp_path)) == before  # a fresh process: state from the newest segment
    report = verify_partition(log.services, "t", 0)  # every section checked against a replay
    assert report.problems == [] and report.segments == len(after)
    # appending and compacting go on from the merged log
    producer = log.producer()
    producer.send("t", value=b"later", partition=0)
    producer.flush()
    log.compact("t")
    assert _table(Log(tmp_path).partition("t", 0), 0, READ_UNCOMMITTED
                  ).column("value").to_pylist()[-1] == b"later"


def test_a_merge_streams_its_segment_in_pieces_of_the_buffer(tmp_path: Path) -> None:
    # The merged segment goes through the streamed publish in ranged reads of about
    # buffer_bytes (one batch at least), never the run joined in memory; its bytes are
    # the inputs' head and data sections joined.
    log = _log(tmp_path)
    _small_segments(log)
    before = _view(log)
    states = log.partition("t", 0)._states
    cache = states.cache
    cache.list_segments()
    heads = [cache.segment_head(p.start) for p in cache.pieces()[:-1]]
    largest_batch = max(int(cache.segment_index(h.base_offset).sizes.max()) for h in heads)
    chunks: list[int] = []
    inner = states.storage.publish_stream_if_absent

    def spy(path, pieces, size, part_bytes):
        def counted():
            for piece in pieces:
                chunks.append(len(memoryview(piece)))
                yield piece
        return inner(path, counted(), size, part_bytes)

    states.storage.publish_stream_if_absent = spy
    buffer = 2 * largest_batch
    made = log.partition("t", 0).merge_segments(MAX, buffer_bytes=buffer)
    assert made and len(chunks) > len(heads)  # more pieces than inputs: none sent whole
    assert max(chunks[1:]) <= buffer  # after the head, no piece above the buffer
    assert sum(chunks) == made[0].bytes
    assert _view(log) == before and _view(Log(tmp_path)) == before


def test_segments_stay_few_under_many_small_compactions(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1, {"segment.bytes": MAX})
    producer = log.producer(compression="none")
    counts = []
    for i in range(48):
        for j in range(2):
            producer.send("t", value=f"{i}.{j}".encode(), partition=0)
            producer.flush()
        log.compact("t")  # one small segment per call, then merging
        counts.append(len(_segments(tmp_path)))
    # Without merging there would be 48; with it, their number follows the logarithm of
    # the partition's bytes (each merge at least doubles the segment it grows).
    assert max(counts) <= 8, counts
    values = _table(Log(tmp_path).partition("t", 0), 0).column("value").to_pylist()
    assert values == [f"{i}.{j}".encode() for i in range(48) for j in range(2)]


def test_retention_and_delete_records_on_merged_segments(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _small_segments(log, upto=30)
    log.partition("t", 0).merge_segments(MAX)
    _small_segments(log)  # more small segments after the merged one
    names = _segments(tmp_path)
    merged = next(n for n in names if "-" in n)
    merged_end = int(merged.split("-")[1][:20])
    full = _table(log.partition("t", 0), 0, READ_UNCOMMITTED)
    # delete-records inside the merged segment: reads below refused, the segment stays
    log.delete_records({("t", 0): 10})
    assert merged in _segments(tmp_path)
    assert log.apply_retention("t")[0].segments_deleted == 0
    part = Log(tmp_path).partition("t", 0)
    assert part.log_start() == 10
    with pytest.raises(OffsetOutOfRangeError):
        part.read(5)
    # at its end: retention deletes the whole merged segment, nothing after it
    log.delete_records({("t", 0): merged_end})
    done = log.apply_retention("t")[0]
    assert done.segments_deleted == 1 and merged not in _segments(tmp_path)
    assert done.log_start == merged_end
    part = Log(tmp_path).partition("t", 0)
    assert _table(part, merged_end, READ_UNCOMMITTED) == _from(full, merged_end)


def test_a_reader_holding_an_old_listing_reads_on_while_segments_merge(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _small_segments(log)
    reader = Log(tmp_path).partition("t", 0)
    before = _view(Log(tmp_path))
    refs = reader.batch_refs(0)  # stretches of the plain segments the merge retires
    loaded = [bytes(reader._cache.load(r)) for r in refs]
    assert all(r.in_segment for r in refs[:-10])
    log.partition("t", 0).merge_segments(MAX)
    assert [bytes(reader._cache.load(r)) for r in refs] == loaded  # followed into the merge
    assert _table(reader, 0, READ_UNCOMMITTED) == before[3]
    assert _table(reader, 17) == _table(Log(tmp_path).partition("t", 0), 17)


class _BeforeMergedPublish(DelegatingStorage):
    """Runs ``action`` once, right before the first publish of a merged (or, with
    ``plain``, a plain) segment: the interleavings of docs/protocol.md 7.3."""

    def __init__(self, inner, action, plain: bool = False) -> None:
        super().__init__(inner)
        self.action = action
        self.plain = plain

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        if self.action is not None and path.endswith(".segment") and \
                ("-" in path.rsplit("/", 1)[-1]) != self.plain:
            action, self.action = self.action, None
            action()
        return super().publish_if_absent(path, data)


class _MergeBeforeRead(DelegatingStorage):
    """Runs ``action`` once, right before the first read of ``path``."""

    def __init__(self, inner, path: str, action) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.path, self.action = path, action

    def _before(self, path: str) -> None:
        if self.action is not None and path == self.path:
            action, self.action = self.action, None
            action()

    def read_prefix(self, path: str, length: int) -> bytes:
        self._before(path)
        return super().read_prefix(path, length)

    def read_range(self, path: str, start: int, length: int):  # type: ignore[no-untyped-def]
        self._before(path)
        return super().read_range(path, start, length)


def test_a_batch_followed_into_a_segment_merged_away_meanwhile_is_found_in_the_merge(
        tmp_path: Path) -> None:
    # A reader that follows a batch into its segment lists the segments, then reads the
    # segment's header and index.  A merge that deleted the segment in between made that
    # read raise FileNotFoundError out of the reader (seen once in the maintenance loop:
    # a consumer stopped at offset 0).  Now it lists again and finds the merged segment.
    log = _log(tmp_path)
    _small_segments(log)
    first = _segments(tmp_path)[0]
    merged: list[object] = []

    def merge() -> None:
        merged.extend(Log(tmp_path).partition("t", 0).merge_segments(MAX))
    storage = _MergeBeforeRead(LocalStorage(str(tmp_path)),
                               f"topics/t/0/segments/{first}", merge)
    cache = Log(storage).partition("t", 0)._states.cache
    ref = cache.relocate(0)
    assert merged, "the merge did not happen"
    assert first not in _segments(tmp_path) and ref.base == 0 and ref.path != \
        f"topics/t/0/segments/{first}"
    assert cache.load(ref)  # the bytes are there


def test_two_mergers_of_one_run_make_one_merged_segment(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _small_segments(log)
    before = _view(log)
    rival = Log(tmp_path)
    made = []
    storage = _BeforeMergedPublish(LocalStorage(str(tmp_path)),
                                   lambda: made.extend(rival.partition("t", 0).merge_segments(MAX)))
    mine = Log(storage).partition("t", 0).merge_segments(MAX)
    assert len(made) == 1 and mine == []  # the same name: exactly one publish wins
    assert [n for n in _segments(tmp_path) if "-" in n] == \
        [f"{made[0].base_offset:020d}-{made[0].end_offset:020d}.segment"]
    assert _view(Log(tmp_path)) == before


def test_overlapping_merges_read_from_both(tmp_path: Path) -> None:
    # Two mergers from different listings (retention ran between them) may publish
    # overlapping ranges and each delete its own inputs.  The chain reads the first
    # wholly and the second past it.  Seen to fail ("batch file is missing") with a
    # chain that drops every segment starting inside an earlier one.
    log = _log(tmp_path)
    _small_segments(log, step=6)
    before = _view(log)
    states = log.partition("t", 0)._states
    cache = states.cache
    cache.list_segments()
    pieces = cache.pieces()
    assert len(pieces) >= 7

    def publish(i: int, j: int) -> str:
        heads = [cache.segment_head(p.start) for p in pieces[i:j + 1]]
        inputs = [_read_input(states, h) for h in heads]
        snap = bytes(states.storage.read_range(heads[-1].path, 88, heads[-1].snapshot_length))
        path = merged_segment_path(states.dir, heads[0].base_offset, heads[-1].end_offset)
        body = encode_merged_head(inputs, snap, heads[-1].snapshot_crc) + b"".join(
            bytes(states.storage.read_range(h.path, h.data_start, h.data_length))
            for h in heads)
        assert states.storage.publish_if_absent(path, body)
        return path

    publish(0, 2)
    publish(1, 4)
    for p in pieces[1:5]:  # the second merger's inputs go; the first's plain one stays
        states.storage.delete(p.path)
    assert _view(Log(tmp_path)) == before
    log.partition("t", 0).merge_segments(MAX)
    log.compact("t")
    assert _view(Log(tmp_path)) == before


def test_a_compactor_publishing_late_into_a_merged_range_loses_nothing(tmp_path: Path) -> None:
    # A compactor checks that no segment ends past the compacted end, reads its run and
    # publishes <C>.segment; meanwhile others compacted from C and merged, deleting the
    # first <C>.segment, so the late one is published, longer than anything else, and
    # it retires the batch objects it copied.  Its segment holds the log's own bytes:
    # the chain reads the part past everything else from it.  Seen to fail ("batch file
    # is missing") with a chain that never reads the header of a plain segment starting
    # inside a merged one.
    log = _log(tmp_path)
    before = _view(log)
    rival = Log(tmp_path)

    def others() -> None:
        _small_segments(rival, upto=12)  # [0, 3), [3, 6), ... [9, 12)
        assert rival.partition("t", 0).merge_segments(MAX)
    storage = _BeforeMergedPublish(LocalStorage(str(tmp_path)), others, plain=True)
    late = Log(storage).partition("t", 0).compact(MAX, 1)
    assert late is not None and late.end_offset > 12, "the late publish did not happen"
    assert "00000000000000000000.segment" in _segments(tmp_path)
    assert _view(Log(tmp_path)) == before
    assert _view(rival) == before
    log.compact("t")  # compaction and merging go on past the late segment
    assert _view(Log(tmp_path)) == before


def test_a_merge_published_late_below_the_log_start_does_not_move_it_back(
        tmp_path: Path) -> None:
    # Retention deletes the oldest segment while a merger that read it is about to
    # publish: the merge lands with a base below the new log start.  Retention recorded
    # that log start first, so it stays.  Seen to fail (the log start moved back to 0)
    # with retention's record removed.
    log = _log(tmp_path)
    _small_segments(log)
    cache = log.partition("t", 0)._states.cache
    cache.list_segments()
    second = cache.pieces()[1].start
    rival = Log(tmp_path)
    full = _table(rival.partition("t", 0), 0, READ_UNCOMMITTED)
    part = rival.partition("t", 0)
    heads = part._cache.segment_heads()
    keep = sum(h.total_length for h in heads[1:]) + part.stored()[3]

    def drop_first() -> None:  # retention.bytes that deletes exactly the oldest segment
        assert rival.partition("t", 0).apply_retention(-1, keep).segments_deleted == 1
    storage = _BeforeMergedPublish(LocalStorage(str(tmp_path)), drop_first)
    made = Log(storage).partition("t", 0).merge_segments(MAX)
    assert made and made[0].base_offset == 0, "the late merge did not happen"
    fresh = Log(tmp_path).partition("t", 0)
    assert fresh.log_start() == second
    with pytest.raises(OffsetOutOfRangeError):
        fresh.read(0)
    assert _table(fresh, second, READ_UNCOMMITTED) == _from(full, second)


class _Crash(Exception):
    pass


class _CrashAfter(DelegatingStorage):
    """Fails the ``n``-th publish or delete and every call after it: a process killed
    there (nothing after that point happens)."""

    def __init__(self, inner, n: int) -> None:
        super().__init__(inner)
        self.left = n

    def _step(self) -> None:
        if self.left <= 0:
            raise _Crash()
        self.left -= 1

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        self._step()
        return super().publish_if_absent(path, data)

    def delete(self, path: str) -> None:
        self._step()
        super().delete(path)


def test_a_merger_killed_at_any_step_leaves_a_readable_log(tmp_path: Path) -> None:
    base = tmp_path / "base"
    log = _log(base)
    _small_segments(log, step=5)
    before = _view(log)
    crashed = 0
    for n in range(100):
        root = tmp_path / f"crash{n}"
        shutil.copytree(base, root)
        try:
            Log(_CrashAfter(LocalStorage(str(root)), n)).partition("t", 0).merge_segments(MAX)
        except _Crash:
            crashed += 1
        else:
            break
        assert _view(Log(root)) == before, f"killed before step {n}"
        Log(root).compact("t")  # the next maintainer finishes the job
        assert _view(Log(root)) == before, f"killed before step {n}, then merged"
        assert len(_segments(root)) <= 3
        shutil.rmtree(root)
    assert crashed > 5


_MERGER = """
import sys, time
from txlog import Log
from txlog.storage.local import LocalStorage
delete = LocalStorage.delete
def slow_delete(self, path):  # a request per delete, as on an object store
    time.sleep(0.01)
    delete(self, path)
LocalStorage.delete = slow_delete
part = Log(sys.argv[1]).partition("t", 0)
part.state()
print("ready", flush=True)
sys.stdin.readline()
part.merge_segments(int(sys.argv[2]))
print("done", flush=True)
"""


def test_a_merger_sigkilled_at_random_moments_leaves_a_readable_log(tmp_path: Path) -> None:
    # Real processes, SIGKILLed a random time after they were told to merge (spread over
    # how long a merge takes); each time every read must be as before, and the next
    # merge must finish the job.
    base = tmp_path / "base"
    log = _log(base)
    _small_segments(log, step=2)
    before = _view(log)
    timing = tmp_path / "timing"
    shutil.copytree(base, timing)
    part = Log(timing).partition("t", 0)
    part.state()  # as the child, which says "ready" here
    started = time.monotonic()
    part.merge_segments(MAX)
    took = time.monotonic() - started + 0.01 * len(_segments(base))  # the child's deletes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), os.environ.get("PYTHONPATH", "")])}
    rng = random.Random(5)
    outcomes = []
    for n in range(8):
        root = tmp_path / f"kill{n}"
        shutil.copytree(base, root)
        child = subprocess.Popen([sys.executable, "-c", _MERGER, str(root), str(MAX)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                 text=True)
        assert child.stdout.readline().strip() == "ready"
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(rng.uniform(0, took))
        child.kill()
        child.wait()
        outcomes.append(len(_segments(root)))
        assert _view(Log(root)) == before, f"killed run {n}"
        Log(root).compact("t")
        assert _view(Log(root)) == before and len(_segments(root)) <= 3
    print("segments left by each killed merger:", outcomes)
    assert any(o > 3 for o in outcomes), "no merger was killed before it finished"
