"""Streamed compaction: a segment written chunk by chunk, memory bounded by a setting.

Compaction reads the run's headers first, which fixes every byte before the
data section, then streams the batches behind them one at a time through
``Storage.publish_stream_if_absent`` (docs/protocol.md, section 7.4).  What
must hold: the object is ``encode_segment``'s byte for byte, no chunk is
larger than one batch (or the head), a name is still won by exactly one
compactor, a compactor killed at any moment leaves nothing visible and loses
nothing, and a stream of the wrong length publishes nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import REPO, python_env
from helpers_core import segment_files, tmp_files, txlog_process, wait_for
from txlog import Log, StorageError
from txlog.errors import CorruptBatchError
from txlog.format.batch import decode_header, is_data_object_path
from txlog.format.segment import (ABORTED_ENTRY, HEADER_SIZE, decode_head, encode_segment,
                                  read_aborted)
from txlog.partition.isolation import READ_UNCOMMITTED
from txlog.storage.local import LocalStorage
from txlog.storage.memory import MemoryStorage
from txlog.storage.object_store import FsspecStorage
from txlog.storage.schemes import open_storage


def _write(log: Log, topic: str, value_size: int = 3000) -> None:
    """Plain batches, committed and aborted transactions (markers), one large batch;
    uncompressed, since the buffer sizes the tests choose are counted in these bytes."""
    producer = log.producer(compression="none")
    for i in range(12):
        producer.send(topic, value=bytes([i]) * value_size, key=b"k", partition=0)
        producer.flush()
    txn = log.producer(transactional_id="stream", compression="none")
    txn.init_transactions()
    for j in range(4):
        txn.begin_transaction()
        txn.send(topic, value=f"t{j}".encode() * 500, partition=0)
        txn.flush()
        (txn.commit_transaction if j % 2 == 0 else txn.abort_transaction)()
    txn.close()  # the last abort returned at its decision: its marker lands before what follows
    producer.send(topic, value=b"L" * (value_size * 10), partition=0)  # larger than the buffer
    producer.flush()
    producer.send(topic, value=b"tail", partition=0)
    producer.flush()


def _everything(log: Log, topic: str) -> tuple[pa.Table, pa.Table]:
    return (log.read(topic, 0), log.read(topic, 0, isolation_level=READ_UNCOMMITTED))


class _Recording(LocalStorage):
    """The local backend, noting the size of every chunk a streamed publish of a segment
    hands it (producers stream their data objects too)."""

    chunks: list[int]

    def publish_stream_if_absent(self, path: str, chunks: Iterable, size: int,
                                 part_bytes: int = 0) -> bool:
        if is_data_object_path(path):
            return super().publish_stream_if_absent(path, chunks, size, part_bytes)

        def noted() -> Iterable:
            for chunk in chunks:
                self.chunks.append(len(memoryview(chunk)))
                yield chunk
        return super().publish_stream_if_absent(path, noted(), size, part_bytes)


def test_streamed_segment_equals_the_joined_encoding(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    _write(log, "t")
    part = log.partition("t", 0)
    refs = part._cache.refs(0, part.end_offset(), part.end_offset())
    inline = [bytes(memoryview(part._cache.inline(r))) for r in refs]  # what a segment holds
    made = log.compact("t", buffer_bytes=4096)[0]
    assert len(made) == 1 and made[0].batches == len(refs)
    (path,) = segment_files(tmp_path, "t", 0)
    streamed = path.read_bytes()
    head = decode_head(streamed, str(path.relative_to(tmp_path)), str(path), 0)
    snapshot = streamed[HEADER_SIZE:HEADER_SIZE + head.snapshot_length]  # framed (version 4)
    aborted = read_aborted(LocalStorage(str(tmp_path)), head, str(path))
    assert len(aborted) == 2  # both aborted transactions' markers lie in the run

    class Range:
        def __init__(self, row: np.void) -> None:
            self.producer_id, self.first_offset, self.last_offset = (int(x) for x in row)

    joined = encode_segment(head.topic_id, 0, [(decode_header(d, "x", r.base), d)
                                               for r, d in zip(refs, inline)],
                            head.end_offset, [Range(row) for row in aborted], snapshot,
                            head.created_ms)
    assert streamed == joined
    assert made[0].bytes == len(streamed)
    assert aborted.dtype == ABORTED_ENTRY


def test_a_run_larger_than_the_buffer_streams_in_chunks_of_one_batch(tmp_path: Path) -> None:
    log = Log(_Recording(str(tmp_path), fsync=False))
    log.storage.chunks = []
    log.create_topic("t", 1)
    _write(log, "t")
    before = _everything(log, "t")
    made = log.compact("t", buffer_bytes=4096)[0]
    assert len(made) == 1
    assert made[0].bytes > 10 * 4096
    sizes = log.storage.chunks
    assert len(sizes) == made[0].batches + 1  # the head, then one chunk per batch
    assert sum(sizes) == made[0].bytes
    index = log.partition("t", 0)._cache.segment_index(0)
    assert sizes[1:] == index.sizes.tolist()  # each chunk is one batch, never the run
    assert sizes[0] == index.positions[0]  # and the head all that precedes the data
    assert _everything(log, "t") == before
    assert _everything(Log(str(tmp_path)), "t") == before  # a fresh process reads it back
    assert tmp_files(tmp_path, "t", 0) == []


def test_a_bad_buffer_setting_is_named(tmp_path: Path) -> None:
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    with pytest.raises(ValueError, match="buffer_bytes.*0"):
        log.compact("t", buffer_bytes=0)


def test_a_batch_other_than_the_one_pass_one_saw_stops_the_stream(tmp_path: Path) -> None:
    """Pass 2 hands over the bytes pass 1 sized: a valid batch of the same payload but
    another place (a header that differs) must not be copied in its stead.  (Seen to
    publish a segment with the header check removed from ``_segment_chunks``.)"""
    log = Log(tmp_path, fsync=False)
    log.create_topic("t", 1)
    producer = log.producer()
    for _ in range(3):  # three batches with byte-identical payloads
        producer.send("t", value=b"same", key=b"k", partition=0, timestamp_ms=1000)
        producer.flush()
    cache = log.partition("t", 0)._cache
    real = cache.inline
    refs = {r.base: r for r in cache.refs(0, 3, 3)}
    assert cache.header(1).payload_crc == cache.header(2).payload_crc
    cache.inline = lambda ref: real(refs[2] if ref.base == 1 else ref)  # type: ignore[method-assign]
    with pytest.raises(CorruptBatchError, match="says base offset 2"):
        log.compact("t", buffer_bytes=4096)
    assert segment_files(tmp_path, "t", 0) == []
    cache.inline = real  # type: ignore[method-assign]
    assert Log(tmp_path).read("t", 0).column("offset").to_pylist() == [0, 1, 2]


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_a_stream_of_the_wrong_length_publishes_nothing(tmp_path: Path, backend: str) -> None:
    """The head was written from the promised size: any other length would be a damaged
    object under a valid name.  (Seen to fail with the check removed from LocalStorage.)"""
    store = LocalStorage(str(tmp_path)) if backend == "local" else MemoryStorage()
    for chunks in ([b"abc", b"de"], [b"abc", b"defg", b"h"]):
        with pytest.raises(StorageError, match="yielded .* bytes, 6 were promised"):
            store.publish_stream_if_absent("d/x", iter(chunks), 6)
        assert not store.exists("d/x")
    assert store.publish_stream_if_absent("d/x", iter([b"abc", b"def"]), 6)
    assert store.read("d/x") == b"abcdef"
    assert not store.publish_stream_if_absent("d/x", iter([b"zzzzzz"]), 6)
    assert store.read("d/x") == b"abcdef"
    if backend == "local":
        assert [n for n in os.listdir(tmp_path / "d") if n != "x"] == []  # no temp left


def test_two_compactors_streaming_the_same_run_make_one_segment(tmp_path: Path) -> None:
    """Both have streamed their head before either publishes: one link wins."""
    Log(tmp_path, fsync=False).create_topic("t", 1)
    _write(Log(tmp_path, fsync=False), "t")
    before = _everything(Log(tmp_path), "t")
    barrier = threading.Barrier(2, timeout=30)

    class Meeting(LocalStorage):
        def publish_stream_if_absent(self, path: str, chunks: Iterable, size: int,
                                     part_bytes: int = 0) -> bool:
            def met() -> Iterable:
                for i, chunk in enumerate(chunks):
                    yield chunk
                    if i == 0:
                        barrier.wait()
            return super().publish_stream_if_absent(path, met(), size, part_bytes)

    results: list[object] = [None, None]

    def compactor(i: int) -> None:
        results[i] = Log(Meeting(str(tmp_path))).partition("t", 0).compact(buffer_bytes=4096)

    threads = [threading.Thread(target=compactor, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1, results
    assert len(segment_files(tmp_path, "t", 0)) == 1
    assert _everything(Log(tmp_path), "t") == before
    assert tmp_files(tmp_path, "t", 0) == []


_KILLED_MID_STREAM = """
import os, signal, sys
from txlog import Log
from txlog.storage.schemes import open_storage
root, after, options = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3])
store = open_storage(root, options or None)
inner = store.publish_stream_if_absent
def killing(path, chunks, size, part_bytes):
    def stream():
        for i, chunk in enumerate(chunks):
            if i == after:
                os.kill(os.getpid(), signal.SIGKILL)
            yield chunk
    return inner(path, stream(), size, part_bytes)
store.publish_stream_if_absent = killing
Log(store).compact("t", buffer_bytes=int(sys.argv[4]))
"""


def _kill_mid_stream(root: str, after: int, options: dict | None, buffer_bytes: int) -> None:
    done = subprocess.run([sys.executable, "-c", _KILLED_MID_STREAM, root, str(after),
                           repr(options), str(buffer_bytes)],
                          env=python_env(), cwd=REPO, timeout=120, capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()


@pytest.mark.parametrize("after", [1, 9, 17])
def test_a_compactor_killed_mid_stream_leaves_no_segment(tmp_path: Path, after: int) -> None:
    log = Log(tmp_path)
    log.create_topic("t", 1)
    _write(log, "t")
    before = _everything(log, "t")
    _kill_mid_stream(str(tmp_path), after, None, 4096)
    assert segment_files(tmp_path, "t", 0) == []
    temp = sorted((tmp_path / "topics" / "t" / "0" / "segments").glob(".tmp-*"))
    assert len(temp) == 1  # the partial segment, under a name nothing lists
    assert _everything(Log(tmp_path), "t") == before
    removed = LocalStorage(str(tmp_path)).remove_temp_files(0)
    assert removed == ["topics/t/0/segments/" + temp[0].name]
    assert len(Log(tmp_path).compact("t")[0]) == 1  # the next compaction does the run
    assert _everything(Log(tmp_path), "t") == before


# --- S3: a multipart upload completed with If-None-Match: * ------------------------------

MiB = 1 << 20


def _uploads(s3_server, bucket: str) -> list[dict]:
    return s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def _chunks(total: int, piece: int, fill: int) -> list[bytes]:
    return [bytes([fill]) * min(piece, total - i) for i in range(0, total, piece)]


def test_s3_streamed_publish_is_multipart_and_exclusive(s3_server, s3_root) -> None:
    store = open_storage(s3_root, s3_server.storage_options)
    assert isinstance(store, FsspecStorage)
    bucket = s3_root[len("s3://"):].split("/", 1)[0]
    size = 11 * MiB + 123
    store.check_conditional_writes()  # the probe's requests go before the counting
    s3_server.reset_counts()
    s3_server.recording = True
    try:
        assert store.publish_stream_if_absent("seg/a", iter(_chunks(size, 300_000, 1)), size,
                                              part_bytes=MiB)  # raised to S3's 5 MiB
        posts = [k for k, _ in s3_server.log]
    finally:
        s3_server.recording = False
    assert posts.count("PUT") == 3 and posts.count("POST") == 2  # 3 parts; create, complete
    assert store.read("seg/a") == bytes([1]) * size
    # The loser of the race: its parts are uploaded, its completion refused, its upload gone.
    assert not store.publish_stream_if_absent("seg/a", iter(_chunks(size, MiB, 2)), size)
    assert store.read("seg/a") == bytes([1]) * size
    assert _uploads(s3_server, bucket) == []
    # The wrong length publishes nothing and leaves no upload behind.
    with pytest.raises(StorageError, match="were promised"):
        store.publish_stream_if_absent("seg/b", iter(_chunks(size - 1, MiB, 3)), size)
    assert not store.exists("seg/b")
    assert _uploads(s3_server, bucket) == []
    # A stream that fails half-way (a damaged batch) publishes nothing either.

    def failing():
        yield bytes(6 * MiB)
        raise RuntimeError("damaged batch")
    with pytest.raises(RuntimeError, match="damaged"):
        store.publish_stream_if_absent("seg/c", failing(), size)
    assert not store.exists("seg/c") and _uploads(s3_server, bucket) == []
    # At most one part: one conditional PUT, as publish_if_absent.
    assert store.publish_stream_if_absent("seg/d", iter([b"ab", b"c"]), 3)
    assert not store.publish_stream_if_absent("seg/d", iter([b"xyz"]), 3)
    assert store.read("seg/d") == b"abc"


def test_s3_racing_streamed_publishes_make_one_object(s3_server, s3_root) -> None:
    """Both uploads are complete before either asks to complete: exactly one wins."""
    barrier = threading.Barrier(2, timeout=60)
    size = 6 * MiB
    results: list[object] = [None, None]

    def racer(i: int) -> None:
        store = open_storage(s3_root, s3_server.storage_options)

        def chunks():
            yield from _chunks(size, MiB, 10 + i)
            barrier.wait()
        results[i] = store.publish_stream_if_absent("seg/race", chunks(), size)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [False, True]  # type: ignore[type-var]
    winner = results.index(True)
    store = open_storage(s3_root, s3_server.storage_options)
    assert store.read("seg/race") == bytes([10 + winner]) * size
    assert _uploads(s3_server, s3_root[len("s3://"):].split("/", 1)[0]) == []


def test_s3_compaction_streams_and_a_kill_leaves_only_an_upload_gc_aborts(
        s3_server, s3_root) -> None:
    log = Log(s3_root, storage_options=s3_server.storage_options)
    log.create_topic("t", 1)
    producer = log.producer(compression="none")
    for i in range(14):  # 12.3 MiB uncompressed: three parts of S3's minimum 5 MiB
        producer.send("t", value=bytes([i]) * (900 << 10), partition=0)
        producer.flush()
    before = _everything(log, "t")
    bucket = s3_root[len("s3://"):].split("/", 1)[0]
    options = dict(s3_server.storage_options)
    _kill_mid_stream(s3_root, 8, options, 1)  # after 7 batches (6.2 MiB): one part uploaded
    fresh = Log(s3_root, storage_options=options)
    assert fresh.partition("t", 0).stored()[0] == 0  # no segment
    assert _everything(fresh, "t") == before
    assert len(_uploads(s3_server, bucket)) == 1
    store = open_storage(s3_root, options)
    # (moto dates every upload 2010-11-10, so the age rule that spares a young upload,
    # which may be a live publish, cannot be seen here: AWS gives the real time.)
    (removed,) = store.remove_temp_files(0)
    assert removed.startswith("topics/t/0/segments/")
    assert _uploads(s3_server, bucket) == []
    made = fresh.compact("t", buffer_bytes=1)[0]  # parts of 5 MiB whatever is asked
    assert len(made) == 1 and made[0].bytes > 14 * (900 << 10)
    assert _everything(Log(s3_root, storage_options=options), "t") == before


# --- many compactors, SIGKILLed at arbitrary moments --------------------------------------

_COMPACTOR = """
import os, signal, sys, time
from txlog import Log
from txlog.storage.local import LocalStorage
root, go, left = sys.argv[1], sys.argv[2], [int(sys.argv[3])]
store = LocalStorage(root)
def step():  # SIGKILL at the given storage call or streamed chunk; 0 never
    left[0] -= 1
    if left[0] == 0:
        os.kill(os.getpid(), signal.SIGKILL)
def counted(name):
    inner = getattr(store, name)
    def call(*args, **kwargs):
        step()
        return inner(*args, **kwargs)
    setattr(store, name, call)
for name in ("publish_if_absent", "read", "read_prefix", "read_buffer", "read_range",
             "exists", "list", "list_times", "delete"):
    counted(name)
publish_stream = store.publish_stream_if_absent
def streamed(path, chunks, size, part_bytes):
    def each():
        for chunk in chunks:
            step()
            yield chunk
    return publish_stream(path, each(), size, part_bytes)
store.publish_stream_if_absent = streamed
log = Log(store)
open(f"{go}.ready.{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
log.compact("t", buffer_bytes=4096)
"""


def test_compactors_killed_at_random_moments_lose_nothing(tmp_path: Path) -> None:
    """Rounds of appends, each compacted by three processes at once, two of them killed
    at a random storage call (before, inside or after their stream, or half-way through
    retiring batch objects): every committed record stays readable once, in order,
    no aborted one shows, and the segments left are whole."""
    import random

    rng = random.Random(20)
    log = Log(tmp_path)
    log.create_topic("t", 1, {"segment.bytes": 120_000})
    plain = log.producer()
    txn = log.producer(transactional_id="kills")
    txn.init_transactions()
    expected: list[bytes] = []
    killed = 0
    for round_ in range(3):
        for i in range(16):
            value = f"{round_}.{i}.".encode() + os.urandom(16_000)
            plain.send("t", value=value, partition=0)
            plain.flush()
            expected.append(value)
        for outcome in ("commit", "abort"):
            txn.begin_transaction()
            value = f"{round_}.{outcome}".encode()
            txn.send("t", value=value, partition=0)
            txn.flush()
            if outcome == "commit":
                txn.commit_transaction()
                expected.append(value)
            else:
                txn.abort_transaction()
        go = tmp_path / f"go-{round_}"
        # The victims die at a storage call or streamed chunk picked at random, so the
        # kill lands inside the compaction however fast this machine runs it. Even a
        # compactor with nothing left to do makes about 60 calls, so the first victim
        # always dies; the winner makes about 160, so the second may die retiring.
        stops = [rng.randint(1, 55), rng.randint(1, 160), 0]
        children = [subprocess.Popen([sys.executable, "-c", _COMPACTOR, str(tmp_path),
                                      str(go), str(stop)], env=python_env(), cwd=REPO,
                                     stderr=subprocess.PIPE) for stop in stops]
        wait_for(lambda: len(list(tmp_path.glob(f"go-{round_}.ready.*"))) == 3, 60,
                 "the compactors to start")
        go.touch()
        for c in children:
            _, err = c.communicate(timeout=120)
            assert c.returncode in (0, -signal.SIGKILL), err.decode()
        assert children[2].returncode == 0
        killed += sum(c.returncode == -signal.SIGKILL for c in children)
        fresh = Log(tmp_path)
        assert fresh.read("t", 0).column("value").to_pylist() == expected
        offsets = fresh.read("t", 0, isolation_level=READ_UNCOMMITTED).column("offset")
        assert offsets.to_pylist() == sorted(set(offsets.to_pylist()))
        for path in segment_files(tmp_path, "t", 0):  # whole: header and index check out
            base = int(path.name.split(".")[0])
            fresh.partition("t", 0)._cache.segment_index(base)
    assert killed >= 3
    LocalStorage(str(tmp_path)).remove_temp_files(0)
    Log(tmp_path).compact("t")
    assert Log(tmp_path).read("t", 0).column("value").to_pylist() == expected
    assert not list(tmp_path.rglob(".tmp-*"))


def test_cli_takes_the_buffer_setting(tmp_path: Path) -> None:
    root = str(tmp_path / "log")
    log = Log(root)
    log.create_topic("t", 1)
    _write(log, "t")
    before = _everything(log, "t")
    done = txlog_process(root, "compact", "t", "--buffer-bytes", "4096", "--json")
    assert done.returncode == 0, done.stderr
    assert '"segments_made": 1' in done.stdout
    assert _everything(Log(root), "t") == before
    _write(log, "t")
    again = txlog_process(root, "maintain", "--once", "--json",
                          "--compaction-buffer-bytes", "4096")
    assert again.returncode == 0, again.stderr
    assert '"segments_made": 1' in again.stdout
