"""The sender on its own: staging, one data object and its claims per flush, futures
settled on success and failure, the error policy, and a write behind (docs/protocol.md
1.1), against a memory:// store that records and can fail its publishes."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import txlog.clients.sender as sender_module
from helpers_core import DelegatingStorage
from txlog import Log
from txlog.clients.metrics import MetricConfig
from txlog.clients.partitioner import StickyPartitioner
from txlog.clients.sender import Sender
from txlog.clients.transaction_manager import TransactionManager
from txlog.errors import OutOfOrderSequenceError, TransactionAbortedError
from txlog.format.batch import HEADER_TYPE, RECORD_SCHEMA
from txlog.storage.memory import MemoryStorage


class Recording(DelegatingStorage):
    """Records every publish; fails the next ``fail_data`` data objects before writing."""

    def __init__(self) -> None:
        super().__init__(MemoryStorage())
        self.published: list[str] = []
        self.fail_data = 0
        self.lock = threading.Lock()

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        with self.lock:
            if path.startswith("data/") and self.fail_data:
                self.fail_data -= 1
                raise OSError(f"simulated failure writing {path}")
            self.published.append(path)
        return super().publish_if_absent(path, data)

    def under(self, prefix: str) -> list[str]:
        return [p for p in self.published if p.startswith(prefix)]


class Outcomes:
    """The callbacks a batch is staged with, and what they were told."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int, int]] = []
        self.failed: list[tuple[str, BaseException]] = []

    def of(self, name: str) -> dict[str, object]:
        return {"done": lambda r: self.done.append((name, r.base_offset, r.last_offset)),
                "failed": lambda exc: self.failed.append((name, exc))}


@pytest.fixture
def store() -> Recording:
    return Recording()


@pytest.fixture
def log(store: Recording) -> Log:
    log = Log(store)
    log.create_topic("t", 2)
    return log


def make_sender(log: Log, transactional_id: str | None = None,
                data_object_bytes: int = 1 << 20) -> Sender:
    manager = TransactionManager(log.services, transactional_id, 60_000, True)
    if transactional_id is not None:
        manager.init_transactions()
        manager.begin(None)
        manager.add_partitions([("t", 0), ("t", 1)])
    return Sender(log.services, manager, StickyPartitioner(), None, data_object_bytes,
                  MetricConfig())


def records(*values: bytes) -> pa.Table:
    n = len(values)
    return pa.Table.from_arrays([pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()),
                                 pa.array([1000 + i for i in range(n)], pa.int64()),
                                 pa.array([[]] * n, HEADER_TYPE)], schema=RECORD_SCHEMA)


def stage(sender: Sender, p: int, outcomes: Outcomes, name: str, *values: bytes) -> None:
    sender.stage(("t", p), records(*values), 1000, 1000 + len(values) - 1, **outcomes.of(name))


def values(log: Log, p: int) -> list[bytes]:
    return log.read("t", p, isolation_level="read_uncommitted").column("value").to_pylist()


def test_a_small_batch_is_written_inline(log: Log, store: Recording) -> None:
    sender, outcomes = make_sender(log), Outcomes()
    stage(sender, 0, outcomes, "a", b"x", b"y")
    assert sender.staged and sender.staged_bytes > 0 and outcomes.done == []
    sender.write_staged()
    assert not sender.staged and sender.staged_bytes == 0
    assert outcomes.done == [("a", 0, 1)] and outcomes.failed == []
    assert store.under("data/") == [] and values(log, 0) == [b"x", b"y"]


def test_a_flush_writes_one_data_object_then_one_claim_per_run(log: Log, store: Recording,
                                                             monkeypatch) -> None:
    monkeypatch.setattr(sender_module, "INLINE_PAYLOAD_BYTES", 0)  # every batch in the object
    sender, outcomes = make_sender(log), Outcomes()
    stage(sender, 0, outcomes, "a", b"1", b"2")
    stage(sender, 1, outcomes, "b", b"3")
    stage(sender, 0, outcomes, "c", b"4")
    before = len(store.published)
    sender.write_staged()
    written = store.published[before:]
    # The data object first, then the claims: p0's two batches follow each other in the
    # object, so one claim covers both.
    assert written[0].startswith("data/")
    assert sorted(written[1:]) == ["topics/t/0/00000000000000000000.batch",
                                   "topics/t/1/00000000000000000000.batch"]
    assert sorted(outcomes.done) == [("a", 0, 1), ("b", 0, 0), ("c", 2, 2)]
    assert values(log, 0) == [b"1", b"2", b"4"] and values(log, 1) == [b"3"]


def test_a_lost_data_object_fails_its_batches_and_takes_a_new_id(log: Log, store: Recording,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(sender_module, "INLINE_PAYLOAD_BYTES", 0)
    sender, outcomes = make_sender(log), Outcomes()
    manager = sender._transactions
    first_id = manager.producer_id
    stage(sender, 0, outcomes, "a", b"1")
    stage(sender, 1, outcomes, "b", b"2")
    store.fail_data = 1
    with pytest.raises(OSError, match="simulated"):
        sender.write_staged()
    assert [name for name, _ in outcomes.failed] == ["a", "b"] and outcomes.done == []
    assert manager.needs_new_id and manager.fatal is None  # not a fatal error: a new id
    stage(sender, 0, outcomes, "c", b"3")
    sender.write_staged()
    assert manager.producer_id != first_id and outcomes.done == [("c", 0, 0)]


def test_a_transactional_batch_that_fails_poisons_the_transaction(log: Log, store: Recording,
                                                                monkeypatch) -> None:
    monkeypatch.setattr(sender_module, "INLINE_PAYLOAD_BYTES", 0)
    sender, outcomes = make_sender(log, "tx"), Outcomes()
    stage(sender, 0, outcomes, "a", b"1")
    store.fail_data = 1
    with pytest.raises(OSError):
        sender.write_staged()
    fatal = sender._transactions.fatal
    assert isinstance(fatal, TransactionAbortedError) and "may or may not" in str(fatal)
    assert isinstance(fatal.__cause__, OSError)


def test_a_definitive_rejection_gives_its_sequence_back(log: Log) -> None:
    sender, outcomes = make_sender(log), Outcomes()
    manager = sender._transactions
    stage(sender, 0, outcomes, "a", b"1")
    sender.write_staged()
    manager.sequences[("t", 0)] = 5  # the next batch leaves a gap: refused before publishing
    stage(sender, 0, outcomes, "gap", b"2")
    stage(sender, 1, outcomes, "other", b"3")  # another partition is not held back
    with pytest.raises(OutOfOrderSequenceError):
        sender.write_staged()
    assert [name for name, _ in outcomes.failed] == ["gap"]
    assert ("other", 0, 0) in outcomes.done
    assert manager.sequences[("t", 0)] == 5 and not manager.needs_new_id
    assert manager.fatal is None
    manager.sequences[("t", 0)] = 1
    stage(sender, 0, outcomes, "b", b"4")
    sender.write_staged()
    assert values(log, 0) == [b"1", b"4"]


def test_a_full_object_is_written_behind_and_settled_by_the_next_write(log: Log,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(sender_module, "INLINE_PAYLOAD_BYTES", 0)
    sender, outcomes = make_sender(log, data_object_bytes=1), Outcomes()
    stage(sender, 0, outcomes, "a", b"1")
    sender.write_if_full(behind=True)
    assert sender.behind is not None and not sender.staged
    stage(sender, 1, outcomes, "b", b"2")  # staged while the first is on its way
    assert outcomes.done == []  # settled only in the caller's thread
    sender.write_staged()
    assert sender.behind is None and outcomes.done == [("a", 0, 0), ("b", 0, 0)]


def test_a_failed_write_behind_fails_its_partitions_later_batches(log: Log, store: Recording,
                                                                 monkeypatch) -> None:
    monkeypatch.setattr(sender_module, "INLINE_PAYLOAD_BYTES", 0)
    sender, outcomes = make_sender(log), Outcomes()
    stage(sender, 0, outcomes, "a", b"1")
    store.fail_data = 1
    sender.write_behind()
    stage(sender, 0, outcomes, "a-later", b"2")  # follows a's sequence
    stage(sender, 1, outcomes, "b", b"3")
    with pytest.raises(OSError, match="simulated"):
        sender.write_staged()
    assert [name for name, _ in outcomes.failed] == ["a", "a-later"]
    assert outcomes.done == [("b", 0, 0)] and values(log, 0) == []


def test_fail_staged_drops_everything_staged(log: Log) -> None:
    sender, outcomes = make_sender(log), Outcomes()
    stage(sender, 0, outcomes, "a", b"1")
    stage(sender, 1, outcomes, "b", b"2")
    aborted = TransactionAbortedError("aborted")
    sender.fail_staged(aborted)
    assert outcomes.failed == [("a", aborted), ("b", aborted)]
    assert not sender.staged and sender.staged_bytes == 0
    sender.write_staged()  # nothing left to write
    assert values(log, 0) == [] and outcomes.done == []
