"""Data written once, claims kept small (docs/protocol.md 1.1, docs/format.md 2.7).

A flush writes one data object holding every partition's payloads, then
claims each partition's slot with a small object naming the bytes; readers
follow the reference with ranged reads, compaction copies the bytes into
segments, gc removes data objects nobody points into.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import crc32c
import pyarrow as pa
import pytest

from conftest import HARNESS_DIR, python_env
from helpers_core import DelegatingStorage, read_chain, wait_for
from txlog import Log
from txlog.errors import CorruptBatchError
from txlog.format.batch import (CLAIM_BIT, HEADER_READ_SIZE, MAX_CLAIM_HEADER_SIZE,
                                MAX_CLAIM_PARTS, MAX_PARTS_HEADER_SIZE, PARTS_BIT, BatchHeader,
                                check_claim, decode_header, encode_header)
from txlog.clients import sender as sender_module
from txlog.clients import transaction_manager as transaction_manager_module
from txlog.partition import appender

WRITER = HARNESS_DIR / "claims_writer.py"
VALUE = b"v" * 2000  # records large enough that every batch goes through a data object
# The layouts below are counted in payload bytes, which zstd (the default codec) would
# shrink to a few bytes for these repeated values: the producers here do not compress.
UNCOMPRESSED = {"compression": "none"}


class Counting(DelegatingStorage):
    """Counts requests by kind and path prefix, and bytes published."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.calls: list[tuple[str, str]] = []
        self.published = 0

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        self.calls.append(("publish", path))
        self.published += len(data)
        return super().publish_if_absent(path, data)

    def read(self, path: str) -> bytes:
        self.calls.append(("read", path))
        return super().read(path)

    def read_prefix(self, path: str, length: int) -> bytes:
        self.calls.append(("read", path))
        return super().read_prefix(path, length)

    def read_range(self, path: str, start: int, length: int) -> pa.Buffer:
        self.calls.append(("range", path))
        return super().read_range(path, start, length)

    def read_buffer(self, path: str) -> pa.Buffer:
        self.calls.append(("read", path))
        return super().read_buffer(path)

    def exists(self, path: str) -> bool:
        self.calls.append(("read", path))
        return super().exists(path)

    def list(self, directory: str) -> list[str]:
        self.calls.append(("list", directory))
        return super().list(directory)

    def count(self, kind: str, prefix: str = "") -> int:
        return sum(1 for k, p in self.calls if k == kind and p.startswith(prefix))


def counting_log(tmp_path: Path) -> tuple[Log, Counting]:
    store = Counting(Log(tmp_path / "log").storage)
    return Log(store), store


def test_claim_header_round_trips_and_a_claim_is_its_header_alone() -> None:
    header = BatchHeader(base_offset=7, record_count=3, attributes=CLAIM_BIT, payload_length=999,
                         payload_crc=5, decision_id="d" * 255, transactional_id="t" * 255,
                         data_path="data/" + "ab" * 16 + ".data", data_offset=4)
    raw = encode_header(header)
    assert len(raw) == 68 + 2 * 255 + 1 + 42 + 8 and MAX_CLAIM_HEADER_SIZE <= HEADER_READ_SIZE
    decoded = decode_header(raw, "x", 7)
    assert (decoded.data_path, decoded.data_offset, decoded.is_claim) == \
        (header.data_path, 4, True)
    check_claim(raw, decoded, "x")
    with pytest.raises(CorruptBatchError, match="claim is"):
        check_claim(raw + b"\0", decoded, "x")
    for bad in ("topics/t/0/x.data", "data/../txlog.json", "data/" + "g" * 32 + ".data"):
        forged = encode_header(BatchHeader(base_offset=7, record_count=3, attributes=CLAIM_BIT,
                                           data_path=bad, data_offset=4))
        with pytest.raises(CorruptBatchError, match="not a data object"):
            decode_header(forged, "x", 7)


def test_one_flush_writes_one_data_object_and_one_small_claim_per_partition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, store = counting_log(tmp_path)
    log.create_topic("t", 4)
    producer = log.producer(**UNCOMPRESSED, transactional_id="tx", batch_size=16 << 10)
    producer.init_transactions()
    producer.begin_transaction()
    table = pa.table({"value": [VALUE] * 400, "partition": [i % 4 for i in range(400)]})
    producer.send_table("t", table)  # the partitions' states are cached from here on
    monkeypatch.setattr(transaction_manager_module, "EXPIRY_CHECK_INTERVAL_S", 1e9)  # no sweep reads
    store.calls.clear()
    store.published = 0
    sent = producer.send_table("t", table)
    assert store.count("publish", "data/") == 1
    claims = store.count("publish", "topics/")
    # 13 batches of 16 KiB per partition (batch.size still sizes them), one claim each.
    assert len(sent) >= 40 and claims == 4
    # No read of a slot before claiming it (a publish that wins is the proof), only the
    # anchor check after it, and at most one refresh per partition (2 reads) per flush.
    slot_reads = [p for k, p in store.calls if k == "read" and p.endswith(".batch")]
    assert claims <= len(slot_reads) <= claims + 2 * 4
    assert store.published < 400 * len(VALUE) * 1.1
    producer.commit_transaction()
    values = [v for p in range(4) for v in log.read("t", p).column("value").to_pylist()]
    assert values == [VALUE] * 800
    for p in range(4):  # every batch of a claim at its own offsets, in order
        assert log.read("t", p).column("offset").to_pylist() == list(range(200))
    for p in range(4):
        chain = read_chain(tmp_path / "log", "t", p)  # independent walk, claims followed
        assert [b.header.is_claim for b in chain[:-1]] == [True] * (len(chain) - 1)
        assert [b.header.has_parts for b in chain[:-1]] == [True, True]
        assert all(len(b.path.read_bytes()) < 400 for b in chain)


def test_a_writer_that_loses_a_slot_claims_again_without_writing_its_data_again(
        tmp_path: Path) -> None:
    log, store = counting_log(tmp_path)
    log.create_topic("t", 1)
    other = Log(tmp_path / "log").producer(**UNCOMPRESSED)
    real_publish = store.publish_if_absent
    raced = []

    def publish(path: str, data: bytes) -> bool:
        if path.endswith(".batch") and not raced:  # another process takes the slot first
            raced.append(other.send("t", b"theirs", partition=0).get().offset)
        return real_publish(path, data)

    store.publish_if_absent = publish  # type: ignore[method-assign]
    md = log.producer(**UNCOMPRESSED).send_table("t", pa.table({"value": [VALUE] * 50}), partition=0)
    assert raced == [0] and md[0].base_offset == 1
    assert store.count("publish", "data/") == 1
    assert store.count("publish", "topics/t/0/") == 2  # the lost slot and the won one
    assert store.published < 50 * len(VALUE) * 1.05  # the payload once, not once a try
    assert log.read("t", 0).column("value").to_pylist() == [b"theirs"] + [VALUE] * 50


def test_readers_coalesce_adjacent_payloads_and_follow_compaction(tmp_path: Path) -> None:
    log = Log(tmp_path / "log")
    log.create_topic("t", 2)
    producer = log.producer(**UNCOMPRESSED, batch_size=16 << 10, data_object_bytes=1 << 30)
    table = pa.table({"value": [VALUE] * 200, "partition": [i % 2 for i in range(200)]})
    producer.send_table("t", table)
    reader, store = counting_log(tmp_path)
    store.calls.clear()
    assert reader.read("t", 0).num_rows == 100
    assert store.count("range", "data/") == 1  # 100 records, 13 claims, one ranged read
    # Compaction copies the payloads in; with the data object collected, a reader holding
    # the old claims' headers finds the batches in the segment.
    log.compact("t", min_batches=1)  # each partition's 13 batches are one claim
    removed = log.gc(data_age_s=0).removed.get("unreferenced data objects", [])
    assert len(removed) == 1 and not os.listdir(tmp_path / "log" / "data")
    assert reader.read("t", 0).column("value").to_pylist() == [VALUE] * 100
    assert Log(tmp_path / "log").read("t", 1).num_rows == 100


def test_a_missing_data_object_under_a_claim_is_damage_named_as_such(tmp_path: Path) -> None:
    log = Log(tmp_path / "log")
    log.create_topic("t", 1)
    log.producer(**UNCOMPRESSED).send_table("t", pa.table({"value": [VALUE] * 10}), partition=0)
    for name in os.listdir(tmp_path / "log" / "data"):
        os.unlink(tmp_path / "log" / "data" / name)
    with pytest.raises(CorruptBatchError, match="data object .* of this claim is missing"):
        Log(tmp_path / "log").read("t", 0)


def test_gc_removes_only_unreferenced_data_objects_older_than_the_age(tmp_path: Path) -> None:
    log = Log(tmp_path / "log")
    log.create_topic("t", 1)
    log.producer(**UNCOMPRESSED).send_table("t", pa.table({"value": [VALUE] * 10}), partition=0)
    orphan = appender.write_data_object(log.storage, [b"x" * 10_000])[0][0]  # a writer died
    data = tmp_path / "log" / "data"
    assert len(os.listdir(data)) == 2
    assert not log.gc().removed.get("unreferenced data objects")  # too young
    assert log.gc(data_age_s=0).removed["unreferenced data objects"] == [orphan]
    assert len(os.listdir(data)) == 1
    assert log.read("t", 0).num_rows == 10


def test_claims_read_compact_and_collect_on_every_backend(any_root) -> None:  # type: ignore[no-untyped-def]
    """The whole life of a data object on file://, memory:// and s3:// (ranged reads,
    compaction inlining it, gc finding its age in the store's listing)."""
    log = any_root.log()
    log.create_topic("t", 2)
    producer = log.producer(**UNCOMPRESSED, transactional_id="tx", batch_size=16 << 10)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_table("t", pa.table({"value": [VALUE] * 60,
                                        "partition": [i % 2 for i in range(60)]}))
    producer.commit_transaction()
    # The markers land behind the commit (docs/protocol.md 4.6); compaction below needs
    # each partition's marker as its second batch.
    producer.flush()
    orphan = appender.write_data_object(log.storage, [b"x" * 10_000])[0][0]
    assert [n for n, _ in log.storage.list_times("data")] and \
        all(abs(t - time.time()) < 600 for _, t in log.storage.list_times("data"))
    fresh = any_root.log()
    assert [fresh.read("t", p).num_rows for p in range(2)] == [30, 30]
    assert not log.gc().removed.get("unreferenced data objects")  # all younger than an hour
    assert log.gc(data_age_s=0).removed["unreferenced data objects"] == [orphan]
    log.compact("t")
    assert len(log.gc(data_age_s=0).removed["unreferenced data objects"]) == 1
    assert log.storage.list("data") == []
    assert [fresh.read("t", p).column("value").to_pylist() for p in range(2)] == \
        [[VALUE] * 30] * 2


def test_a_claim_never_points_into_a_data_object_older_than_the_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log(tmp_path / "log")
    log.create_topic("t", 1)
    monkeypatch.setattr(appender, "CLAIM_WINDOW_S", -1.0)  # every object is already too old
    log.producer(**UNCOMPRESSED).send_table("t", pa.table({"value": [VALUE] * 10}), partition=0)
    chain = read_chain(tmp_path / "log", "t", 0)
    assert len(os.listdir(tmp_path / "log" / "data")) == 2  # the flush's, and the rewrite
    assert log.gc(data_age_s=0).count("unreferenced data objects") == 1
    assert chain[0].header.data_path in {f"data/{n}" for n in
                                         os.listdir(tmp_path / "log" / "data")}
    assert log.read("t", 0).num_rows == 10


def test_thirty_two_writers_killed_at_random_lose_nothing_and_gc_keeps_what_claims_need(
        tmp_path: Path) -> None:
    """32 writer processes (half transactional, every third transaction aborted, half of
    those sending tables with data objects written behind; half idempotent) append to 2 partitions through data objects and claims; some are
    SIGKILLed at random moments, while a reader reads everything over and over (every
    claim it meets must name bytes that exist).  Then: the chain has no gap (independent walk), no
    value twice, every acknowledged value visible, nothing aborted visible, each
    transaction all or nothing, each idempotent writer's records in order; gc removes
    every data object no claim names and nothing a claim names; after compaction and
    gc every data object is gone and the reads are the same."""
    large = os.environ.get("TXLOG_LARGE") == "1"
    writers, seconds, killed = (64, 20.0, 16) if large else (32, 3.0, 8)
    root = tmp_path / "log"
    Log(root).create_topic("t", 2)
    go = tmp_path / "go"
    env = python_env()
    procs = []
    for w in range(writers):
        mode = ("txn", "idem", "table", "idem")[w % 4]
        procs.append(subprocess.Popen(
            [sys.executable, str(WRITER), str(root), str(w), mode, str(tmp_path / f"ack-{w}"),
             str(go), str(seconds)], stderr=subprocess.PIPE, env=env))
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    victims = rng.sample(range(writers), killed)
    kill_at = sorted((rng.uniform(0.2, seconds), v) for v in victims)
    # Kills count from the moment every writer is at the start line (imports take
    # seconds on a loaded machine: a kill before that would test nothing).
    wait_for(lambda: all((tmp_path / f"ack-{w}.ready").exists() or procs[w].poll() is not None
                         for w in range(writers)), 240, "the writers to start")
    # A reader beside the writers: whatever claim it finds must name bytes that are there.
    stop = threading.Event()
    reader_errors: list[BaseException] = []
    reads = [0]

    def read_while_writing() -> None:
        reader = Log(root)
        while not stop.is_set():
            try:
                for p in range(2):
                    reader.read("t", p, 0, isolation_level="read_uncommitted")
                reads[0] += 1
            except Exception as exc:  # noqa: BLE001 - reported below
                reader_errors.append(exc)
                return

    go.write_text("go")
    started = time.monotonic()
    reading = threading.Thread(target=read_while_writing)
    reading.start()
    try:
        for at, victim in kill_at:
            time.sleep(max(0.0, started + at - time.monotonic()))
            procs[victim].send_signal(signal.SIGKILL)
        for w, proc in enumerate(procs):
            _, err = proc.communicate(timeout=300)
            if w in victims:
                continue
            assert proc.returncode == 0, f"seed {seed}: writer {w} failed:\n{err.decode()}"
    finally:
        stop.set()
        reading.join()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not reader_errors, f"seed {seed}: a reader beside the writers failed: " \
        f"{reader_errors[0]!r}"
    assert reads[0] > 0
    log = Log(root)
    for w in range(0, writers, 2):  # end what the killed left open (fence and abort)
        log.producer(**UNCOMPRESSED, transactional_id=f"w{w}").init_transactions()

    acked: set[str] = set()
    for w in range(writers):
        path = tmp_path / f"ack-{w}"
        if path.exists():
            for line in path.read_text().splitlines():
                acked.update(json.loads(line))
    assert len(acked) > writers * 10, f"seed {seed}: too little was written to prove anything"

    def visible() -> dict[int, list[str]]:
        out = {}
        for p in range(2):
            values = log.read("t", p).column("value").to_pylist()
            out[p] = [v.split(b"|", 1)[0].decode() + "|" for v in values]
        return out

    seen = visible()
    for p in range(2):
        chain = read_chain(root, "t", p)  # no gap: offsets chain from 0, every checksum
        assert chain and chain[-1].header.next_offset == log.end_offset("t", p)
    everything = seen[0] + seen[1]
    assert len(everything) == len(set(everything)), f"seed {seed}: a value is visible twice"
    assert acked <= set(everything), f"seed {seed}: acknowledged records lost: " \
        f"{sorted(acked - set(everything))[:5]}"
    assert not [v for v in everything if v.endswith(".a|")], f"seed {seed}: aborted visible"
    transactions: dict[str, int] = {}
    for v in everything:
        if ".t" in v:
            transactions[v.rsplit(".r", 1)[0]] = transactions.get(v.rsplit(".r", 1)[0], 0) + 1
    from claims_writer import RECORDS
    assert set(transactions.values()) <= {RECORDS}, f"seed {seed}: a transaction in part"
    for p in range(2):
        per_writer: dict[str, list[int]] = {}
        for v in seen[p]:
            if ".s" in v:
                w, n = v[:-3].split(".s")
                per_writer.setdefault(w, []).append(int(n))
        for w, ns in per_writer.items():
            assert ns == sorted(ns), f"seed {seed}: writer {w} out of order in partition {p}"

    def claimed() -> set[str]:
        return {b.header.data_path for p in range(2) for b in read_chain(root, "t", p)
                if b.header.is_claim and b.path.suffix == ".batch"}  # segments hold payloads

    data = root / "data"
    names = claimed()
    # temp_age_s=0 too: a writer killed while writing a data object leaves its temp file
    log.gc(data_age_s=0, temp_age_s=0)
    assert {f"data/{n}" for n in os.listdir(data)} == names, f"seed {seed}"
    assert visible() == seen
    log.compact("t")
    log.gc(data_age_s=0, temp_age_s=0)
    assert os.listdir(data) == [] and claimed() == set()
    assert visible() == seen


def test_data_object_bytes_bounds_what_a_producer_stages(memlog: Log) -> None:
    from txlog.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="data_object_bytes"):
        memlog.producer(**UNCOMPRESSED, data_object_bytes=0)
    memlog.create_topic("t", 2)
    producer = memlog.producer(**UNCOMPRESSED, batch_size=8 << 10, data_object_bytes=64 << 10)
    for i in range(200):
        producer.send("t", VALUE, partition=i % 2)
        # one batch over, at most
        assert producer._sender.staged_bytes < (64 << 10) + (8 << 10) + 4096
    producer.flush()
    assert producer._sender.staged_bytes == 0
    assert len(memlog.storage.list("data")) >= 5  # 400 KB in objects of about 64 KiB
    assert [memlog.read("t", p).num_rows for p in range(2)] == [100, 100]


class HeldDataObjects(DelegatingStorage):
    """Each data object's write waits for ``release``, then fails with ``fail`` if set."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail: BaseException | None = None
        self.writing = 0  # data objects being written now

    def publish_stream_if_absent(self, path, chunks, size, part_bytes=1 << 30):  # type: ignore[no-untyped-def]
        if not path.startswith("data/"):
            return super().publish_stream_if_absent(path, chunks, size, part_bytes=part_bytes)
        self.writing += 1
        try:
            self.started.set()
            assert self.release.wait(60), "the test never released the data object"
            if self.fail is not None:
                raise self.fail
            return super().publish_stream_if_absent(path, chunks, size, part_bytes=part_bytes)
        finally:
            self.writing -= 1


def _held_log(tmp_path: Path) -> tuple[Log, HeldDataObjects]:
    store = HeldDataObjects(Log(tmp_path / "log").storage)
    log = Log(store)
    log.create_topic("t", 2)
    return log, store


def _rows(first: int, n: int) -> pa.Table:
    return pa.table({"value": [VALUE + b"%d" % i for i in range(first, first + n)],
                     "partition": [i % 2 for i in range(first, first + n)]})


def test_a_full_data_object_is_written_behind_while_the_caller_stages_the_next(
        tmp_path: Path) -> None:
    """protocol.md 1.1: send_table(wait=False) returns while its full data object is
    still being written; the next write, the flush, waits for it and keeps the order."""
    log, store = _held_log(tmp_path)
    producer = log.producer(**UNCOMPRESSED, transactional_id="tx", batch_size=8 << 10,
                            data_object_bytes=40 << 10)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_table("t", _rows(0, 30), wait=False)  # 60 KB: one object's worth is full
    assert store.started.wait(10) and not store.release.is_set()
    assert producer._sender.behind is not None and producer._sender.staged  # the rest is staging
    producer.send_table("t", _rows(30, 2), wait=False)  # staging goes on meanwhile
    store.release.set()
    producer.commit_transaction()
    for p in range(2):
        assert log.read("t", p).column("value").to_pylist() == \
            [VALUE + b"%d" % i for i in range(p, 32, 2)]


def test_a_failed_write_behind_fails_its_partitions_later_batches_and_is_raised_next(
        tmp_path: Path) -> None:
    """The failure of a write behind is raised by the producer's next call; the
    batches staged meanwhile for the failed partitions fail too (their sequences follow
    the failed ones), so an idempotent producer goes on without a gap or a duplicate."""
    log, store = _held_log(tmp_path)
    producer = log.producer(**UNCOMPRESSED, batch_size=8 << 10, data_object_bytes=40 << 10)
    sent = producer.send_table("t", _rows(0, 30), wait=False)
    assert store.started.wait(10)
    store.fail = OSError("the disk is full")
    later = producer.send_table("t", _rows(30, 2), wait=False)  # staged behind it
    assert producer._sender.staged
    store.release.set()
    with pytest.raises(OSError, match="the disk is full"):
        producer.flush()
    assert sent == [] and later == [] and not producer._sender.staged
    store.fail = None
    producer.send_table("t", _rows(100, 10))  # waits: written before it returns
    producer.flush()
    for p in range(2):
        values = log.read("t", p).column("value").to_pylist()
        assert len(values) == len(set(values))
        assert [int(v[len(VALUE):]) for v in values] == \
            [i for i in range(100, 110) if i % 2 == p], values  # a batch that failed is gone
    assert producer.producer_id != -1


def test_the_flush_that_raises_a_failed_write_behind_still_writes_the_other_partitions(
        tmp_path: Path) -> None:
    """As in one flush, a failure stops its own partition's later batches, not the
    others': a batch staged for another partition behind the failed write is written."""
    log, store = _held_log(tmp_path)
    producer = log.producer(**UNCOMPRESSED, batch_size=8 << 10, data_object_bytes=40 << 10)
    values = [VALUE + b"%d" % i for i in range(30)]
    producer.send_table("t", pa.table({"value": values}), partition=0, wait=False)
    assert store.started.wait(10)
    store.fail = OSError("the disk is full")
    other = producer.send_table("t", pa.table({"value": [b"small"]}), partition=1, wait=False)
    store.release.set()
    with pytest.raises(OSError, match="the disk is full"):
        producer.flush()
    assert log.read("t", 0).num_rows == 0
    assert log.read("t", 1).column("value").to_pylist() == [b"small"]
    assert [(b.partition, b.base_offset) for b in other] == [(1, 0)]


class HeldClaims(DelegatingStorage):
    """Claims (publishes under ``topics/``) wait for ``release`` while ``hold`` is set;
    those under ``failing`` fail with ``fail`` if set.  Data objects are counted."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.hold = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.failing = "topics/"
        self.fail: BaseException | None = None
        self.failures_left = -1  # how many publishes ``fail`` fails; -1: every one
        self.data_objects = 0

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        if path.startswith("topics/") and self.hold.is_set():
            self.holding.set()
            assert self.release.wait(60), "the test never released the claims"
        if path.startswith(self.failing) and self.fail is not None and self.failures_left:
            self.failures_left -= 1
            raise self.fail
        return super().publish_if_absent(path, data)

    def publish_stream_if_absent(self, path, chunks, size, part_bytes=1 << 30):  # type: ignore[no-untyped-def]
        published = super().publish_stream_if_absent(path, chunks, size, part_bytes=part_bytes)
        self.data_objects += path.startswith("data/")
        return published


def _held_claims_log(tmp_path: Path) -> tuple[Log, HeldClaims]:
    store = HeldClaims(Log(tmp_path / "log").storage)
    log = Log(store)
    log.create_topic("t", 2)
    return log, store


def test_the_next_data_object_is_written_while_the_one_behind_claims(tmp_path: Path) -> None:
    """protocol.md 1.1: a flush's data object goes up while the flush behind it is still
    claiming (on an object store, its PUT no longer waits for the other's claims), and its
    claims come after those: each partition keeps the send order."""
    log, store = _held_claims_log(tmp_path)
    producer = log.producer(**UNCOMPRESSED, transactional_id="tx", batch_size=8 << 10,
                            data_object_bytes=40 << 10)
    producer.init_transactions()
    producer.begin_transaction()
    store.hold.set()
    producer.send_table("t", _rows(0, 30), wait=False)  # an object's worth goes behind
    assert store.holding.wait(10) and store.data_objects == 1
    second = threading.Thread(target=producer.send_table, args=("t", _rows(30, 30)),
                              kwargs={"wait": False})
    second.start()  # fills the next object: written behind while the first's claims wait
    try:
        wait_for(lambda: store.data_objects == 2, 10,
                 "the second data object, while the first flush's claims are held")
    finally:
        store.release.set()
        second.join(30)
    producer.commit_transaction()
    for p in range(2):
        assert log.read("t", p).column("value").to_pylist() == \
            [VALUE + b"%d" % i for i in range(p, 60, 2)]


class FirstDataObjectHeld(DelegatingStorage):
    """The data object holding record 0 (the first flush's) waits for ``release``; the
    others go through.  Found by its bytes, not by which write comes first: the two
    flushes' writes run on pool threads, and the second's can start first."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner)
        self.release = threading.Event()
        self.data_objects = 0
        self._counting = threading.Lock()  # the two writes may come at once

    def publish_stream_if_absent(self, path, chunks, size, part_bytes=1 << 30):  # type: ignore[no-untyped-def]
        if path.startswith("data/"):
            chunks = [bytes(chunk) for chunk in chunks]
            with self._counting:
                self.data_objects += 1
            # Uncompressed, a value is VALUE then its number: only record 0's has b"v0".
            if any(VALUE[-1:] + b"0" in chunk for chunk in chunks):
                assert self.release.wait(60), "the test never released the data object"
        return super().publish_stream_if_absent(path, chunks, size, part_bytes=part_bytes)


def _flushing(producer, late: pa.Table | None = None
              ) -> tuple[threading.Thread, list[BaseException]]:
    """A thread that sends ``late`` (staged, not waited for) and flushes; what the flush
    raised is kept for the test's thread to assert."""
    raised: list[BaseException] = []

    def flush() -> None:
        if late is not None:
            producer.send_table("t", late, wait=False)
        try:
            producer.flush()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=flush)
    thread.start()
    return thread, raised


def test_the_next_flushs_claims_wait_for_the_one_behind_even_when_its_object_is_up_first(
        tmp_path: Path) -> None:
    """The second flush's data object can be up before the first's: its claims still
    wait for the first flush's, or they would take the partitions' slots ahead of
    them, out of sequence order."""
    store = FirstDataObjectHeld(Log(tmp_path / "log").storage)
    log = Log(store)
    log.create_topic("t", 2)
    producer = log.producer(**UNCOMPRESSED, transactional_id="tx", batch_size=8 << 10,
                            data_object_bytes=40 << 10)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_table("t", _rows(0, 30), wait=False)
    second, raised = _flushing(producer)
    try:
        wait_for(lambda: store.data_objects == 2, 10, "the second flush's data object")
        time.sleep(0.2)  # room for claims that would not wait (none may come)
        for p in range(2):
            assert log.read("t", p, isolation_level="read_uncommitted").num_rows == 0
    finally:
        store.release.set()
        second.join(30)
    assert raised == []
    producer.commit_transaction()
    for p in range(2):
        assert log.read("t", p).column("value").to_pylist() == \
            [VALUE + b"%d" % i for i in range(p, 30, 2)]


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_claim_failed_behind_stops_its_partition_in_the_flush_written_meanwhile(
        tmp_path: Path, idempotent: bool) -> None:
    """The flush written while the one behind claims has its data object up already; a
    partition whose claim behind failed is not claimed from it (its batches follow the
    failed one's: without sequences, nothing else would stop them), another partition
    is, and the failure is raised once."""
    log, store = _held_claims_log(tmp_path)
    producer = log.producer(**UNCOMPRESSED, batch_size=8 << 10, data_object_bytes=40 << 10,
                            enable_idempotence=idempotent)
    store.hold.set()
    first = producer.send_table("t", _rows(0, 30), partition=0, wait=False)
    assert store.holding.wait(10)
    late = pa.table({"value": [VALUE + b"%d" % i for i in range(50, 56)],
                     "partition": [1, 1, 1, 1, 0, 0]})
    second, raised = _flushing(producer, late)
    wait_for(lambda: store.data_objects == 2, 10, "the second flush's data object")
    # The claim behind fails for good (every try of its slot); later publishes would pass.
    store.failing, store.fail = "topics/t/0/", OSError("partition 0's disk is full")
    store.failures_left = appender.PUBLISH_ATTEMPTS
    store.hold.clear()
    store.release.set()
    second.join(30)
    assert len(raised) == 1 and "partition 0's disk is full" in \
        f"{raised[0]} {raised[0].__cause__}" and first == []
    assert log.read("t", 0).num_rows == 0
    assert log.read("t", 1).column("value").to_pylist() == \
        [VALUE + b"%d" % i for i in range(50, 54)]
    assert not producer._sender.staged and producer._sender.behind is None
    store.fail = None
    producer.send_table("t", _rows(100, 4))  # no gap, nothing twice
    for p in range(2):
        values = [int(v[len(VALUE):]) for v in log.read("t", p).column("value").to_pylist()]
        assert values == [*([] if p == 0 else range(50, 54)), *range(100 + p, 104, 2)]


def test_closing_a_producer_in_a_transaction_lets_its_write_behind_finish(
        tmp_path: Path) -> None:
    """A Spark task that fails closes its producer without deciding anything: the data
    object behind is finished (here, it fails) before close returns, raising nothing, so
    no write of this task runs on under the next task of a reused worker."""
    log, store = _held_log(tmp_path)
    producer = log.producer(**UNCOMPRESSED, transactional_id="tx", batch_size=8 << 10,
                            data_object_bytes=40 << 10)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_table("t", _rows(0, 30), wait=False)
    assert store.started.wait(10) and store.writing == 1
    store.fail = OSError("the disk is full")
    store.release.set()
    producer.close()
    assert store.writing == 0 and producer._sender.behind is None


# --- claims of several batches (format.md 2.7.1, protocol.md 1.1) ---------------------------


def _parts_claim(parts: tuple[tuple[int, int], ...], **extra: object) -> BatchHeader:
    count, length = sum(c for c, _ in parts), sum(n for _, n in parts)
    fields: dict = {"base_offset": 7, "record_count": count,
                    "attributes": CLAIM_BIT | PARTS_BIT, "payload_length": length,
                    "payload_crc": 5, "data_path": "data/" + "ab" * 16 + ".data",
                    "data_offset": 4, "append_time": 1234, "parts": parts} | extra
    return BatchHeader(**fields)


def test_a_claim_of_several_batches_round_trips_and_its_header_fits_one_read() -> None:
    parts = tuple((i + 1, 1000 * (i + 1)) for i in range(MAX_CLAIM_PARTS))
    header = _parts_claim(parts, decision_id="d" * 255, transactional_id="t" * 255)
    raw = encode_header(header)
    assert len(raw) <= MAX_PARTS_HEADER_SIZE <= HEADER_READ_SIZE
    decoded = decode_header(raw, "x", 7)
    assert (decoded.parts, decoded.append_time, decoded.has_parts) == (parts, 1234, True)
    # A reader from before the parts table takes the same append time (the table comes
    # after it, in the trailing bytes it ignores).
    assert raw[len(raw) - 1 - 8 * len(parts) - 8:len(raw) - 1 - 8 * len(parts)] == \
        (1234).to_bytes(8, "big")
    for bad in (((3, 10), (0, 20)), ((3, 10),), ((3, 10), (4, 20), (1, 1))):
        forged = bytearray(encode_header(_parts_claim(((3, 10), (4, 20)))))
        table = bytes([len(bad)]) + b"".join(
            c.to_bytes(4, "big") + n.to_bytes(4, "big") for c, n in bad)
        forged = forged[:-17] + table
        forged[8:10] = len(forged).to_bytes(2, "big")
        forged[4:8] = crc32c.crc32c(bytes(forged[8:])).to_bytes(4, "big")
        with pytest.raises(CorruptBatchError, match="parts table"):
            decode_header(bytes(forged), "x", 7)


def test_claims_of_several_batches_read_back_compact_and_keep_old_batches_readable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old single-batch claims and inline batches, then multi-batch claims, in one log:
    all read back equal before and after compaction copies them into a segment."""
    log = Log(tmp_path / "log")
    log.create_topic("t", 1)
    producer = log.producer(**UNCOMPRESSED, batch_size=16 << 10, data_object_bytes=1 << 30)
    monkeypatch.setattr(sender_module, "MAX_CLAIM_PARTS", 1)  # as written before
    old = [VALUE + b"%d" % i for i in range(60)]
    producer.send_table("t", pa.table({"value": old}), partition=0)
    producer.send("t", b"small", partition=0).get()  # inline
    monkeypatch.undo()
    new = [VALUE + b"n%d" % i for i in range(90)]  # 12 batches: one claim
    sent = producer.send_table("t", pa.table({"value": new}), partition=0)
    assert len(sent) > 4 and [s.base_offset for s in sent][0] == 61
    assert [s.base_offset for s in sent[1:]] == [s.last_offset + 1 for s in sent[:-1]]
    chain = read_chain(tmp_path / "log", "t", 0)
    kinds = [(b.header.is_claim, b.header.has_parts) for b in chain]
    # Old claims, b"small" inline, then one claim of the new batches (and a small last
    # one inline).
    first_new = kinds.index((True, True))
    assert kinds.count((True, True)) == 1 and kinds[first_new - 1] == (False, False)
    assert kinds[:first_new - 1].count((True, False)) >= 7
    expected = old + [b"small"] + new
    fresh = Log(tmp_path / "log")
    assert fresh.read("t", 0).column("value").to_pylist() == expected
    assert fresh.read("t", 0, 70, 75).column("value").to_pylist() == expected[70:75]  # mid-claim
    assert fresh.read("t", 0, 70).column("offset").to_pylist() == list(range(70, 151))
    log.compact("t", min_batches=1)
    assert not list((tmp_path / "log" / "topics" / "t" / "0").glob("*.batch"))
    log.gc(data_age_s=0)
    assert not os.listdir(tmp_path / "log" / "data")
    assert Log(tmp_path / "log").read("t", 0).column("value").to_pylist() == expected
    assert fresh.read("t", 0, 100).column("value").to_pylist() == expected[100:]
    segment_chain = read_chain(tmp_path / "log", "t", 0)
    in_segment = [b.header.base_offset for b in segment_chain if b.header.has_parts]
    assert in_segment == [61] and all(b.path.name.endswith(".segment") for b in segment_chain)


def test_a_retried_claim_of_several_batches_is_a_duplicate_whole(tmp_path: Path) -> None:
    """The claim's first try lands but its publish reports an error (outcome unknown):
    the retry finds it in the log as one duplicate and returns its offsets, nothing twice."""
    log, store = counting_log(tmp_path)
    log.create_topic("t", 1)
    real_publish = store.publish_if_absent
    failed = []

    def publish(path: str, data: bytes) -> bool:
        landed = real_publish(path, data)
        if path.endswith(".batch") and not failed:
            failed.append(path)
            raise OSError("connection reset after the write")
        return landed

    store.publish_if_absent = publish  # type: ignore[method-assign]
    producer = log.producer(**UNCOMPRESSED, batch_size=16 << 10, data_object_bytes=1 << 30)
    values = [VALUE + b"%d" % i for i in range(50)]
    sent = producer.send_table("t", pa.table({"value": values}), partition=0)
    assert len(failed) == 1 and sent[0].base_offset == 0 and sent[-1].last_offset == 49
    assert store.count("publish", "data/") == 1
    assert log.read("t", 0).column("value").to_pylist() == values
    chain = read_chain(tmp_path / "log", "t", 0)  # the claim once (a small last batch inline)
    assert chain[0].header.has_parts and len(chain) <= 2
    # The retry found its first try in the log (a duplicate): it published nothing again.
    assert store.count("publish", "topics/t/0/") == len(chain)
    # The same claim published again by a retry of the appender is refused as a duplicate
    # (its sequence range is one entry of the producer's dedup window).
    part = log.partition("t", 0)
    header = part.header(0)
    state = part.state()
    assert state.producers[header.producer_id].find_duplicate(header) is not None


def test_a_lost_slot_moves_only_the_claim_of_several_batches(tmp_path: Path) -> None:
    log, store = counting_log(tmp_path)
    log.create_topic("t", 1)
    other = Log(tmp_path / "log").producer(**UNCOMPRESSED)
    real_publish = store.publish_if_absent
    raced = []

    def publish(path: str, data: bytes) -> bool:
        if path.endswith(".batch") and len(raced) < 2:  # others take the slot, twice
            raced.append(other.send("t", b"theirs", partition=0).get().offset)
        return real_publish(path, data)

    store.publish_if_absent = publish  # type: ignore[method-assign]
    values = [VALUE + b"%d" % i for i in range(50)]
    md = log.producer(**UNCOMPRESSED, batch_size=16 << 10).send_table("t", pa.table({"value": values}),
                                                      partition=0)
    assert raced == [0, 1] and md[0].base_offset == 2 and md[-1].last_offset == 51
    assert store.count("publish", "data/") == 1
    claims = [p for k, p in store.calls if k == "publish" and p.startswith("topics/t/0/")]
    # Two lost slots and the won one, each the same claim of every large batch (then the
    # small last batch, inline).
    assert [int(p[-26:-6]) for p in claims[:3]] == [0, 1, 2] and len(claims) <= 4
    assert read_chain(tmp_path / "log", "t", 0)[2].header.has_parts
    assert store.published < 50 * len(VALUE) * 1.1  # the payload once (and Arrow's framing)
    assert log.read("t", 0).column("value").to_pylist() == [b"theirs"] * 2 + values


def test_batches_staged_across_sends_make_one_claim_per_partition(tmp_path: Path) -> None:
    """Sends that stage batches of every partition in turn (the Spark writer's way) still
    give each partition one claim: the data object holds each partition's payloads back to
    back, so one claim's byte range is exactly its batches."""
    log, store = counting_log(tmp_path)
    log.create_topic("t", 3)
    producer = log.producer(**UNCOMPRESSED, batch_size=16 << 10, data_object_bytes=1 << 30)
    chunks = [[VALUE + b"%d-%d" % (c, i) for i in range(60)] for c in range(3)]
    for chunk in chunks:
        producer.send_table("t", pa.table({"value": chunk,
                                           "partition": [i % 3 for i in range(60)]}),
                            wait=False)
    producer.flush()
    assert store.count("publish", "data/") == 1
    assert [store.count("publish", f"topics/t/{p}/") for p in range(3)] == [1, 1, 1]
    for p in range(3):
        want = [v for chunk in chunks for i, v in enumerate(chunk) if i % 3 == p]
        assert Log(tmp_path / "log").read("t", p).column("value").to_pylist() == want


def test_the_expiry_sweep_after_an_append_costs_no_request_for_the_own_transaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """protocol.md 4.9: a producer's sweep after its own claims reads the state those
    claims proved and skips its own live transaction, so while nobody else's transaction
    is open there it asks neither the partition nor the coordinator anything."""
    monkeypatch.setattr(transaction_manager_module, "EXPIRY_CHECK_INTERVAL_S", 0.0)  # sweep every time
    log, store = counting_log(tmp_path)
    log.create_topic("t", 2)
    producer = log.producer(**UNCOMPRESSED, transactional_id="tx", batch_size=16 << 10)
    producer.init_transactions()
    producer.begin_transaction()
    table = pa.table({"value": [VALUE] * 40, "partition": [i % 2 for i in range(40)]})
    producer.send_table("t", table)  # the partitions now know the producer
    asked = []
    for name in ("latest", "decision", "resolve"):  # every read of the coordinator's state
        real = getattr(log.coordinator.store, name)
        monkeypatch.setattr(log.coordinator.store, name,
                            lambda *a, _real=real, _name=name, **k: asked.append(_name) or
                            _real(*a, **k))
    store.calls.clear()
    producer.send_table("t", table)
    assert asked == []  # no coordinator state read for the sweep (nor for verification)
    # The refresh (the slot's 404; the incarnation from topic.json, not the anchor: the
    # anchor is checked once, after the claim, protocol.md 1.6); the sweep adds no
    # refresh of its own.
    assert store.count("read", "topics/t/0/0") == 2
    assert store.count("publish", "topics/t/") == 2  # one claim per partition
    producer.commit_transaction()
    assert sum(log.read("t", p).num_rows for p in range(2)) == 80


def test_partitions_claimed_at_once_share_one_verification(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """protocol.md 2.6.1: the first claims of a transaction in four partitions ask the
    coordinator once (the id's metadata and the decision), not once per partition."""
    monkeypatch.setattr(transaction_manager_module, "EXPIRY_CHECK_INTERVAL_S", 1e9)  # no sweep reads
    log, store = counting_log(tmp_path)
    log.create_topic("t", 4)
    producer = log.producer(**UNCOMPRESSED, transactional_id="tx", batch_size=16 << 10)
    producer.init_transactions()
    checks = []
    real = log.coordinator.is_open
    monkeypatch.setattr(log.coordinator, "is_open",
                        lambda header: checks.append(header.decision_id) or real(header))
    table = pa.table({"value": [VALUE] * 40, "partition": [i % 4 for i in range(40)]})
    producer.begin_transaction()
    producer.send_table("t", table)
    producer.flush()
    assert len(checks) == 1
    # A pass lasts one flush: the next flush's first claims (new partitions for the
    # transaction, so the partitions do not know the producer yet) check again.
    log.create_partitions("t", 8)
    producer.send_table("t", pa.table({"value": [VALUE] * 8,
                                       "partition": [4 + i % 4 for i in range(8)]}))
    producer.flush()
    assert len(checks) == 2
    producer.commit_transaction()
    assert sum(log.read("t", p).num_rows for p in range(8)) == 48


def test_one_tasks_requests_from_opening_its_log_to_prepare(tmp_path: Path) -> None:
    """issue 19, the requests of one Spark-style task (scale_out_benchmark.py counts the
    same on S3): the driver starts the job; the task opens its own Log, keeps the lease
    alive, joins, writes one flush into 4 empty partitions and prepares.  Pinned: the
    lease the driver just renewed is not even read (its time came with the job,
    protocol.md 5), no chain reads the
    version after one it just listed or published itself (4.1), one KIP-890 verification
    for the 4 partitions (2.6.1), and the total."""
    from txlog.exactly_once.shared_transaction import SharedTransaction

    root = tmp_path / "log"
    driver = Log(root)
    driver.create_topic("t", 4)
    job = SharedTransaction.start(driver, "job", 60_000)
    store = Counting(Log(root).storage)
    task = Log(store)
    table = pa.table({"value": [VALUE] * 4, "partition": [0, 1, 2, 3]})
    with job.keep_alive(task):
        producer = job.join(task, "task-0", batch_size=16 << 10)
        producer.send_table("t", table)
        producer.prepare_transaction()  # one flush: one data object, four claims
    lease = [(k, p) for k, p in store.calls if p.startswith("coordinator/leases/")]
    assert lease == []
    txn = [(k, p.rsplit("/", 1)[1]) for k, p in store.calls
           if p.startswith("coordinator/transactions/job-task-0")]
    # then the KIP-890 verification, once for the flush's 4 partitions (2.6.1)
    assert txn == [("list", "job-task-0"), ("publish", "00000000000000000000"),
                   ("publish", "00000000000000000001"), ("read", "00000000000000000000"),
                   ("read", "00000000000000000002")], txn
    # The KIP-890 verification's, and the late-joiner rule's two on opening: before the
    # publish (no transaction opened under a decided job) and after it (decided in between:
    # ended at once) (protocol.md 4.4).
    assert store.count("read", "coordinator/decisions/") == 3
    # Besides topic.json: 11 to open and join (12 on an object store: the probe's
    # verdict), the topic's directory listed once among them (its chains not listed,
    # its partitions seen empty, 1.8), the verification's 2, and per partition 2: the
    # batch (a flush this small goes inline, without a data object) and its segments
    # listed after it (1.6), nothing listed or read before it (1.8); topic.json once for
    # the description, once before the flush's claims (shared, 1.8) and once per
    # partition after its claim unless shared (1.4: timing decides).
    topic_json = store.count("read", "topics/t/topic.json")
    assert len(store.calls) - topic_json == 11 + 2 + 4 * 2, \
        "\n".join(map(str, store.calls))
    lists = [p for k, p in store.calls if k == "list" and p.startswith("topics/")]
    assert lists[0] == "topics/t" and \
        sorted(lists[1:]) == [f"topics/t/{p}/segments" for p in range(4)], lists
    first_claim = next(i for i, (k, p) in enumerate(store.calls)
                       if k == "publish" and p.endswith(".batch"))
    assert store.calls[:first_claim].count(("read", "topics/t/topic.json")) == 2
    assert 1 + 1 + 1 <= topic_json <= 1 + 1 + 4
    job.commit(driver, [producer._transactions.member()])
    assert sum(driver.read("t", p).num_rows for p in range(4)) == 4


def test_a_roll_forwards_markers_share_one_read_of_topic_json(tmp_path: Path) -> None:
    """A commit's markers, written at once, read ``topic.json`` once before their
    publishes, as a flush's claims do (docs/protocol.md 1.8).  Each marker read it on its
    own before (3 reads for 4 markers in the run that showed it: two happened to overlap,
    which ``fresh_read`` already shares)."""
    log, store = counting_log(tmp_path)
    log.create_topic("t", 4)
    producer = log.producer(transactional_id="markers", **UNCOMPRESSED)
    producer.init_transactions()
    for _ in range(2):  # the second transaction's partitions are loaded: no cold loads
        producer.begin_transaction()
        producer.send_table("t", pa.table({"value": [VALUE] * 4, "partition": [0, 1, 2, 3]}))
        before = len(store.calls)
        producer.commit_transaction()
        producer.flush()  # until the roll-forward has written every marker
    rolled = store.calls[before:]
    assert sum(1 for k, p in rolled if k == "publish" and p.endswith(".batch")) == 4, rolled
    assert rolled.count(("read", "topics/t/topic.json")) == 1, rolled
    assert sum(log.read("t", p).num_rows for p in range(4)) == 8
    producer.close()


def _request_name(kind: str, target: str) -> str:
    """A request at the test S3 server as ``KIND path``, the bucket and root left out (a
    listing named by its prefix)."""
    from urllib.parse import parse_qs

    if kind == "LIST":
        path = parse_qs(target.split("?", 1)[1])["prefix"][0].rstrip("/")
    else:
        path = target.split("/", 1)[1]
    path = path.split("/", 1)[1]
    return f"{kind} data" if path.startswith("data/") else f"{kind} {path}"


def test_a_users_write_into_four_empty_partitions_on_s3_requests_per_phase(
        s3_server, s3_root) -> None:
    """issue 32 (benchmarks/object_store_requests.py --only write counts the same at 25 ms):
    a transactional producer with the store's defaults writes two data objects' worth into
    4 empty partitions of a topic it has not described yet, two partitions per flush
    (data objects made small here: 64 KiB, not 32 MiB).  Pinned per phase, from opening
    the Log to the flush a commit begins with: the topic's directory listed once (its
    chains not listed, its partitions seen empty: no partition listed before its claim,
    no slot read, docs/protocol.md 1.8), ``topic.json`` read once before the claims of
    each flush, then per partition its claim and the proof after it (its segments and
    ``topic.json``, which claims proving at once may share, 1.4)."""
    options = s3_server.storage_options
    Log(s3_root, storage_options=options).create_topic("t", 4)
    table = pa.table({"value": [os.urandom(1000) for _ in range(128)],
                      "partition": [i // 32 for i in range(128)]})
    s3_server.recording = True
    phases: dict[str, list[str]] = {}

    def phase(name: str) -> None:
        phases[name] = sorted(_request_name(k, t) for k, t in s3_server.log)
        s3_server.reset_counts()

    try:
        s3_server.reset_counts()
        log = Log(s3_root, storage_options=options, create=False)
        phase("open")
        producer = log.producer(transactional_id="user", data_object_bytes=64 << 10,
                                batch_size=16 << 10)
        producer.init_transactions()
        producer.begin_transaction()
        phase("init")
        producer.send_table("t", table)
        producer.flush()  # writes behind may straddle send and flush: counted together
        phase("send and flush")
    finally:
        s3_server.recording = False
    assert phases["open"] == ["GET txlog.json"]
    # (A new process also reads the conditional-write probe's remembered verdict, 1.3:
    # this one remembers it from creating the topic.)
    assert phases["init"] == [
        "LIST coordinator/producer-ids", "LIST coordinator/transactions/user",
        "PUT coordinator/producer-ids/00000000000000000000",
        "PUT coordinator/transactions/user/00000000000000000000"]
    sent = Counter(phases["send and flush"])
    # Timing decides two kinds: claims proving at once share their topic.json read after
    # the publish (1.4); a flush more than a second after AddPartitionsToTxn checks the
    # chain's cached version first (storage/chain.py, VERIFY_AFTER_MS).
    after = sent.pop("GET topics/t/topic.json") - 1 - 2  # the description, once per flush
    confirms = sent.pop("GET coordinator/transactions/user/00000000000000000001", 0)
    assert 2 <= after <= 4 and confirms <= 2, phases["send and flush"]
    assert sent == Counter({
        "LIST topics/t": 1,  # the description: no chain, no partition listed
        "PUT coordinator/transactions/user/00000000000000000001": 1,  # AddPartitionsToTxn
        "GET coordinator/transactions/user/00000000000000000000": 1,  # its predecessor
        "PUT data": 2,
        # per flush, the KIP-890 verification: the chain's next version, the decision
        "GET coordinator/transactions/user/00000000000000000002": 2,
        "GET coordinator/decisions/0-0": 2,
        **{f"PUT topics/t/{p}/00000000000000000000.batch": 1 for p in range(4)},
        **{f"LIST topics/t/{p}/segments": 1 for p in range(4)},
    }), phases["send and flush"]
    total = sum(len(v) for v in phases.values())
    assert total == 1 + 4 + 20 + after + confirms and total + 1 <= 32  # + 1: the probe
    producer.commit_transaction()
    producer.close()
    got = Log(s3_root, storage_options=options).read("t", 0)
    assert got.column("value").to_pylist() == table.column("value").to_pylist()[:32]
