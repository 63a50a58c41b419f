"""Helpers for the core test files: storage wrappers, an independent chain checker,
and the entry points of the child processes the multi-process tests start.

The chain checker deliberately does not use PartitionLog: it lists the batch
files itself and decodes every header and payload, so a bug in the partition's
own bookkeeping cannot hide a gap or a damaged batch from the tests.

Run as a script (``python helpers_core.py <command> ...``) it is the child
process of the concurrency, crash and producer-id tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from txlog import Log
from txlog.format.batch import (CONTROL_BIT, RECORD_SCHEMA, TRANSACTIONAL_BIT, BatchHeader,
                                decode_control, decode_header, decode_records, encode_records,
                                payload_of)
from txlog.format.segment import decode_head
from txlog.storage.contract import Storage
from txlog.storage.paths import BATCH_SUFFIX, TMP_PREFIX
from txlog.storage.schemes import open_storage

HELPER = os.path.abspath(__file__)
START_DEADLINE_S = 60.0


# --- storage wrappers ---------------------------------------------------------------


class DelegatingStorage(Storage):
    """Passes every call to an inner storage; subclasses intercept what they test."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.url = inner.url
        self.remote = inner.remote

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        return self.inner.publish_if_absent(path, data)

    def read(self, path: str) -> bytes:
        return self.inner.read(path)

    def read_prefix(self, path: str, length: int) -> bytes:
        return self.inner.read_prefix(path, length)

    def read_buffer(self, path: str) -> pa.Buffer:
        return self.inner.read_buffer(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def list(self, directory: str) -> list[str]:
        return self.inner.list(directory)

    def read_range(self, path: str, start: int, length: int) -> pa.Buffer:
        return self.inner.read_range(path, start, length)

    def make_durable(self, path: str) -> None:
        self.inner.make_durable(path)

    def delete(self, path: str) -> None:
        self.inner.delete(path)

    def list_times(self, directory: str) -> list[tuple[str, float]]:
        return self.inner.list_times(directory)


class CountingStorage(DelegatingStorage):
    """Records (method, path) of every read and listing, to prove what a computation touched."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, str]] = []

    def read(self, path: str) -> bytes:
        self.calls.append(("read", path))
        return super().read(path)

    def read_prefix(self, path: str, length: int) -> bytes:
        self.calls.append(("read_prefix", path))
        return super().read_prefix(path, length)

    def read_buffer(self, path: str) -> pa.Buffer:
        self.calls.append(("read_buffer", path))
        return super().read_buffer(path)

    def list(self, directory: str) -> list[str]:
        self.calls.append(("list", directory))
        return super().list(directory)

    def paths(self, method: str, suffix: str = BATCH_SUFFIX) -> list[str]:
        return [p for m, p in self.calls if m == method and p.endswith(suffix)]


class AmbiguousStorage(DelegatingStorage):
    """A store whose publish may fail *after* creating the object (a lost reply).

    ``create_then_fail`` paths are published and then an OSError is raised;
    ``fail_before`` paths raise without creating anything.  Each rule fires
    ``times`` times, so a retry can eventually get through.
    """

    def __init__(self, inner: Storage, match: Callable[[str], bool], times: int = 1,
                 create: bool = True) -> None:
        super().__init__(inner)
        self.match = match
        self.remaining = times
        self.create = create
        self.failed: list[str] = []
        self.attempts: list[str] = []

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        if self.match(path):
            self.attempts.append(path)
        if self.match(path) and self.remaining > 0:
            self.remaining -= 1
            self.failed.append(path)
            if self.create:
                self.inner.publish_if_absent(path, data)
            raise OSError(f"simulated timeout publishing {path}")
        return super().publish_if_absent(path, data)


# --- building and checking batches ------------------------------------------------


def data_header(producer_id: int = -1, epoch: int = -1, sequence: int = -1, count: int = 1,
                transactional: bool = False, decision_id: str = "") -> BatchHeader:
    return BatchHeader(base_offset=0, record_count=count,
                       attributes=TRANSACTIONAL_BIT if transactional else 0,
                       base_timestamp=1000, max_timestamp=1000 + count - 1,
                       producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                       decision_id=decision_id)


def records_payload(values: list[bytes | None], keys: list[bytes | None] | None = None,
                    compression: str | None = None, first_ts: int = 1000) -> bytes:
    keys = keys if keys is not None else [None] * len(values)
    table = pa.Table.from_arrays([
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([first_ts + i for i in range(len(values))], pa.int64()),
        pa.array([[] for _ in values], RECORD_SCHEMA.field("headers").type),
    ], schema=RECORD_SCHEMA)
    return encode_records(table, compression)[0]


def partition_dir(root: str | os.PathLike[str], topic: str, partition: int) -> Path:
    return Path(root) / "topics" / topic / str(partition)


def batch_files(root: str | os.PathLike[str], topic: str, partition: int) -> list[Path]:
    d = partition_dir(root, topic, partition)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.endswith(BATCH_SUFFIX))


def tmp_files(root: str | os.PathLike[str], topic: str, partition: int) -> list[Path]:
    d = partition_dir(root, topic, partition)
    return sorted(p for p in d.iterdir() if p.name.startswith(TMP_PREFIX)) if d.is_dir() else []


@dataclass(frozen=True)
class ChainBatch:
    path: Path
    header: BatchHeader
    values: list[bytes | None]  # empty for control batches
    keys: list[bytes | None]


def segment_files(root: str | os.PathLike[str], topic: str, partition: int) -> list[Path]:
    d = partition_dir(root, topic, partition) / "segments"
    return sorted(p for p in d.iterdir() if p.name.endswith(".segment")) if d.is_dir() else []


def _chain_batch(path: Path, data: bytes, base: int, root: Path | None = None) -> ChainBatch:
    header = decode_header(data, str(path), base)  # checks magic, header CRC, offset
    if root is not None and header.is_claim:  # a claim: its payload is in a data object
        assert len(data) == header.header_length, f"{path.name}: a claim is its header alone"
        with open(Path(root) / header.data_path, "rb") as f:
            f.seek(header.data_offset)
            data = data + f.read(header.payload_length)
    payload = payload_of(data, header, str(path))  # checks length and payload CRC
    if header.attributes & CONTROL_BIT:
        decode_control(payload, header, str(path))
        return ChainBatch(path, header, [], [])
    table = decode_records(payload, header, str(path))
    return ChainBatch(path, header, table.column("value").to_pylist(),
                      table.column("key").to_pylist())


def read_chain(root: str | os.PathLike[str], topic: str, partition: int) -> list[ChainBatch]:
    """Every batch of a partition, fully checked, independently of PartitionLog.

    Segments are walked batch by batch through the batch headers (not through
    the segment's index), then the batch files from where the segments end;
    batch files below that are leftovers of compaction and not part of the
    log.  Asserts that base offsets chain exactly from the log start
    (``base[k+1] == base[k] + count[k]``), that each file's name is its
    header's base offset, and that every header and payload passes its checksum.
    """
    out: list[ChainBatch] = []
    segments = segment_files(root, topic, partition)
    expected = int(segments[0].name[:-len(".segment")]) if segments else 0
    for path in segments:
        data = path.read_bytes()
        head = decode_head(data, str(path), str(path), int(path.name[:-len(".segment")]))
        assert head.base_offset == expected, f"segments broken at {path.name}"
        pos = head.data_start
        while pos < len(data):
            batch = decode_header(data[pos:pos + 1024], str(path), expected)
            size = batch.header_length + batch.payload_length
            out.append(_chain_batch(path, data[pos:pos + size], expected))
            expected = batch.next_offset
            pos += size
        assert expected == head.end_offset, f"{path.name} ends at {expected}"
    for path in batch_files(root, topic, partition):
        base = int(path.name[:-len(BATCH_SUFFIX)])
        if base < expected and segments:
            continue  # covered by a segment: a leftover of compaction
        assert base == expected, f"chain broken at {path.name}: expected base {expected}"
        out.append(_chain_batch(path, path.read_bytes(), base, Path(root)))
        expected = out[-1].header.next_offset
    return out


# --- log roots on every backend ---------------------------------------------------------


@dataclass
class Root:
    """A fresh log root on one backend, as the parent and its children open it."""

    backend: str
    url: str
    options: dict = field(default_factory=dict)
    env: dict[str, str] | None = None  # children's environment (None: inherit)

    def log(self) -> Log:
        return Log(self.url, storage_options=self.options)

    def chain(self, topic: str, partition: int, scratch: Path) -> list[ChainBatch]:
        """read_chain over a copy of the partition's batches and segments (the local root
        itself on disk)."""
        if self.backend == "file":
            return read_chain(self.url[len("file://"):], topic, partition)
        store = open_storage(self.url, self.options)
        copy = scratch / f"copy-{uuid.uuid4().hex[:8]}"
        for sub, suffix in (("", BATCH_SUFFIX), ("/segments", ".segment")):
            directory = f"topics/{topic}/{partition}{sub}"
            target = copy / "topics" / topic / (str(partition) + sub)
            target.mkdir(parents=True)
            for name in store.list(directory):
                if name.endswith(suffix):
                    (target / name).write_bytes(store.read(f"{directory}/{name}"))
        (copy / "data").mkdir()
        for name in store.list("data"):  # the payloads claims point to
            (copy / "data" / name).write_bytes(store.read(f"data/{name}"))
        return read_chain(copy, topic, partition)


# URL scheme of each object-store backend's roots (the servers are in tests/harness/s3_server.py
# and tests/harness/store_emulators.py).
STORE_SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "az"}


def make_root(backend: str, tmp_path: Path, s3_server=None) -> Root:
    """A fresh root: ``file``, ``memory``, or an object store (``s3``, ``gcs``, ``azure``)
    in a fresh bucket of ``s3_server``, that store's test server."""
    if backend == "file":
        return Root("file", f"file://{tmp_path / 'log'}")
    if backend == "memory":
        return Root("memory", f"memory://{uuid.uuid4().hex}")
    return Root(backend, f"{STORE_SCHEMES[backend]}://{s3_server.create_bucket()}/log",
                s3_server.storage_options, {**os.environ, **s3_server.env})


def wait_for(condition: Callable[[], bool], timeout: float, what: str,
             poll_s: float = 0.005) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds.

    ``poll_s``: a condition that reads a log costs milliseconds of CPU; polled every
    5 ms while a Spark JVM starts it takes a core of two from it, so waits on
    Spark poll less often.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll_s)


def nothing_holds_the_lso(log: Log, topic: str, partitions: int | Iterable[int]) -> bool:
    """No undecided transaction begins before the end of any of ``partitions`` (a count,
    or the partitions themselves).  The end is read first: a committed job's markers
    land behind its commit (docs/protocol.md 4.6), so the end may move between the two
    reads, and only this order compares them."""
    for p in range(partitions) if isinstance(partitions, int) else partitions:
        end = log.end_offset(topic, p)
        if log.last_stable_offset(topic, p) < end:
            return False
    return True


def child(*args: object) -> list[str]:
    """Command line running this module as a child process."""
    return [sys.executable, HELPER, *map(str, args)]


def txlog_process(root: str, *argv: str, stdin: str | None = None
                  ) -> subprocess.CompletedProcess:
    """``python -m txlog.cli --root ROOT ARGV`` as its own process, text in and out."""
    return subprocess.run([sys.executable, "-m", "txlog.cli", "--root", root, *argv],
                          input=stdin, capture_output=True, text=True, timeout=120)


def self_checking_value(size: int) -> tuple[bytes, bytes]:
    """(key, value): random bytes and their SHA-256, so a reader can verify the value."""
    value = os.urandom(size)
    return hashlib.sha256(value).digest(), value


# --- child-process entry points ---------------------------------------------------------


def _wait_go(go_file: str) -> None:
    wait_for(lambda: os.path.exists(go_file), START_DEADLINE_S, f"start signal {go_file}")


def _append_worker(root: str, topic: str, partition: str, batches: str, per_batch: str,
                   worker: str, result: str, go_file: str) -> None:
    """Append ``batches`` batches of ``per_batch`` records to one partition.

    Writes [[value, offset], ...] of every acknowledged record, in send order,
    to ``result`` (via rename, so the parent never reads half a file).
    """
    log = Log(root)
    producer = log.producer(linger_ms=3_600_000)
    _wait_go(go_file)
    acked: list[tuple[str, int]] = []
    for b in range(int(batches)):
        futures = []
        for r in range(int(per_batch)):
            value = f"w{worker}-b{b}-r{r}"
            futures.append((value, producer.send(topic, value.encode(),
                                                 partition=int(partition))))
        producer.flush()
        acked.extend((v, f.get().offset) for v, f in futures)
    _write_result(result, {"producer_id": producer.producer_id, "acked": acked})


def _keyed_worker(root: str, topic: str, records: str, worker: str, result: str,
                  go_file: str) -> None:
    """Send keyed records one batch each; the producer's partitioner picks the partition."""
    import random

    rng = random.Random(int(worker))
    log = Log(root)
    producer = log.producer(linger_ms=0)
    _wait_go(go_file)
    acked = []
    for i in range(int(records)):
        key = rng.randbytes(rng.randrange(1, 24))
        value = f"w{worker}-{i}"
        md = producer.send(topic, value.encode(), key=key).get()
        acked.append((key.hex(), value, md.partition, md.offset))
    _write_result(result, {"acked": acked})


def _alloc_ids(root: str, count: str, result: str, go_file: str) -> None:
    log = Log(root)
    _wait_go(go_file)
    ids = [log.producer_ids.next_id() for _ in range(int(count))]
    _write_result(result, {"ids": ids})


def _crash_loop(root: str, topic: str, value_size: str, per_batch: str) -> None:
    """Append large self-checking batches to partition 0 until killed."""
    log = Log(root)
    producer = log.producer(linger_ms=3_600_000, batch_size=1 << 40)
    while True:
        for _ in range(int(per_batch)):
            key, value = self_checking_value(int(value_size))
            producer.send(topic, value, key=key, partition=0)
        producer.flush()


def _crash_at(root: str, topic: str, point: str, value_size: str, batches_before: str) -> None:
    """Publish ``batches_before`` batches, then SIGKILL itself inside the next publish.

    ``point`` is where: ``mid-write`` (half the temp file written),
    ``before-link`` (temp file complete and fsynced, not yet linked) or
    ``after-link`` (linked, temp name not yet removed).  The patches apply to
    this child process only.
    """
    import txlog.clients.sender as sender_module
    import txlog.storage.local as storage_module

    # Batches inline (no data object): the kill lands in the publish of a batch object
    # itself.  The claim path's kills are test_claims.py's.
    sender_module.INLINE_PAYLOAD_BYTES = 1 << 40
    log = Log(root)
    producer = log.producer(linger_ms=3_600_000, batch_size=1 << 40)
    armed = {"on": False}
    real_link, real_write = os.link, os.write

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def link(src, dst, *a, **k):  # type: ignore[no-untyped-def]
        if armed["on"] and str(dst).endswith(BATCH_SUFFIX):
            if point == "before-link":
                die()
            if point == "after-link":
                real_link(src, dst, *a, **k)
                die()
        return real_link(src, dst, *a, **k)

    def write(fd, data):  # type: ignore[no-untyped-def]
        if armed["on"] and point == "mid-write" and len(data) > 1024:
            real_write(fd, bytes(memoryview(data)[:len(data) // 2]))
            os.fsync(fd)
            die()
        return real_write(fd, data)

    storage_module.os.link = link  # type: ignore[attr-defined]
    storage_module.os.write = write  # type: ignore[attr-defined]
    for i in range(int(batches_before) + 1):
        if i == int(batches_before):
            armed["on"] = True
        key, value = self_checking_value(int(value_size))
        producer.send(topic, value, key=key, partition=0)
        producer.flush()
    sys.exit(3)  # the kill did not happen: the parent treats this as a failure


def _outcome(action: Callable[[], object]) -> dict[str, object]:
    """What an action returned, or the type and message of what it raised."""
    try:
        return {"ok": action()}
    except Exception as exc:  # the test judges every outcome, errors included
        return {"error": type(exc).__name__, "message": str(exc)}


def _stale_holder(root: str, role: str, ready: str, go_file: str, result: str) -> None:
    """Hold topic ``t`` open across a delete + re-create done by the parent.

    Before ``ready``: ``snapshotter`` appends SNAPSHOT_INTERVAL single-record
    batches, so its lazy snapshot is due at its next state refresh;
    ``writer`` appends one batch and leaves one record pending;
    ``reader`` reads everything read_committed.  After ``go`` each acts
    twice on the (now re-created) topic and reports what happened.
    """
    from txlog.partition.state_manager import SNAPSHOT_INTERVAL

    log = Log(root)
    outcomes: list[dict[str, object]] = []
    if role == "snapshotter":
        producer = log.producer(linger_ms=0)
        for i in range(SNAPSHOT_INTERVAL):
            producer.send("t", f"old-s-{i}".encode(), partition=0).get()
        Path(ready).write_text("ready")
        _wait_go(go_file)
        for attempt in range(2):
            outcomes.append(_outcome(lambda a=attempt: producer.send(
                "t", f"s-after-{a}".encode(), partition=0).get().offset))
    elif role == "writer":
        producer = log.producer(linger_ms=3_600_000)
        producer.send("t", b"old-w-0", partition=0).get()
        pending = producer.send("t", b"w-pending", partition=0)
        Path(ready).write_text("ready")
        _wait_go(go_file)
        outcomes.append(_outcome(lambda: pending.get().offset))
        outcomes.append(_outcome(lambda: producer.send("t", b"w-after", partition=0).get().offset))
    elif role == "reader":
        before = log.read("t", 0).column("value").to_pylist()
        # Whole or not at all: the parent reads it as soon as the name exists.
        Path(ready + ".tmp").write_text(json.dumps([v.decode() for v in before]))
        os.replace(ready + ".tmp", ready)
        _wait_go(go_file)
        for _ in range(2):
            outcomes.append(_outcome(lambda: [v.decode() for v in
                                              log.read("t", 0).column("value").to_pylist()]))
    else:
        raise SystemExit(f"unknown role {role!r}")
    _write_result(result, {"outcomes": outcomes})


def _write_result(path: str, obj: object) -> None:
    tmp = path + ".part"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


COMMANDS: dict[str, Callable[..., None]] = {
    "append": _append_worker,
    "keyed": _keyed_worker,
    "alloc-ids": _alloc_ids,
    "crash-loop": _crash_loop,
    "crash-at": _crash_at,
    "stale-holder": _stale_holder,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])


class Crash(BaseException):
    """A driver dying at a chosen point (BaseException: nothing may swallow it)."""


@contextmanager
def crash_after_the_decision(monkeypatch, decision_id: str) -> Iterator[None]:
    """The body's process dies once ``decision_id`` is published, before anything rolls it
    forward (markers, group offsets, Complete*); expects that death, then revives."""
    import pytest  # here: the child processes this module also runs need no pytest

    from txlog.transactions.ending import TransactionEnder

    original = TransactionEnder.complete
    original_roll_forward = TransactionEnder.roll_forward

    def dies_after_the_decision(self, transactional_id, only_decision=None):
        if self.store.decision(decision_id) is not None:
            raise Crash()
        return original(self, transactional_id, only_decision)

    def dies_before_rolling_forward(self, transactional_id, decided):
        # EndTxn starts the roll-forward in a thread right after its decision:
        # dying there is dying between the decision and the markers.
        if decided == decision_id:
            raise Crash()
        return original_roll_forward(self, transactional_id, decided)

    monkeypatch.setattr(TransactionEnder, "complete", dies_after_the_decision)
    monkeypatch.setattr(TransactionEnder, "roll_forward", dies_before_rolling_forward)
    try:
        with pytest.raises(Crash):
            yield
    finally:
        monkeypatch.setattr(TransactionEnder, "complete", original)
        monkeypatch.setattr(TransactionEnder, "roll_forward", original_roll_forward)


class ManualClock:
    """txlog's clock (txlog.clock.now_ms), moved by the test (milliseconds)."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def manual_clock(monkeypatch, now_ms: int = 1_700_000_000_000) -> ManualClock:
    """Put a ManualClock in place of txlog's clock for one test."""
    import txlog.clock

    c = ManualClock(now_ms)
    monkeypatch.setattr(txlog.clock, "now_ms", c)
    return c


def fill_one_record_per_batch(log: Log, topic: str, batches: int, partition: int = 0) -> None:
    """One record per batch, record i at timestamp 1,000 * i."""
    with log.producer() as producer:
        for i in range(batches):
            producer.send(topic, value=f"v{i}".encode(), partition=partition,
                          timestamp_ms=1_000 * i)
            producer.flush()


class StillClock:
    """``clock.monotonic_ms`` held still, moved only by a test (``now`` in ms): the
    client metrics' windows then begin and end exactly where the test says."""

    def __init__(self, now: int = 5_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    @classmethod
    def installed(cls, monkeypatch) -> StillClock:
        from txlog import clock

        still = cls()
        monkeypatch.setattr(clock, "monotonic_ms", still)
        return still
