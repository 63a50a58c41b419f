"""EndTxn answers at its decision; markers, offsets and Complete follow behind it
(docs/protocol.md 4.5, 9.7).

The markers of one process's partitions are held back (or made to fail) by
wrapping that process's partition objects, so that what the caller sees
before the roll-forward has happened is observable without timing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import msgpack
import pytest

from helpers_core import wait_for
from txlog import Log, Producer
from txlog.exactly_once.shared_transaction import SharedTransaction
from txlog.storage.paths import TXN_DIR, job_dir
from txlog.transactions import ending
from txlog.transactions.groups import read_group
from txlog.transactions.metadata import TransactionMetadata, TxnState

TOPIC = "events"
# Decided, not complete: the roll-forward may or may not have published PrepareCommit yet.
UNFINISHED = (TxnState.ONGOING, TxnState.PREPARE_COMMIT)


@contextmanager
def markers_held(log: Log, partitions: int) -> Iterator[threading.Event]:
    """Every marker ``log``'s process writes to ``TOPIC``, and every group-offset update
    its roll-forward makes, waits until the event is set."""
    release = threading.Event()
    apply = ending.apply_transactional_offsets

    def held_apply(storage, *args, **kwargs):  # type: ignore[no-untyped-def]
        if storage is log.services.storage:
            release.wait()
        return apply(storage, *args, **kwargs)

    ending.apply_transactional_offsets = held_apply  # type: ignore[assignment]
    for p in range(partitions):
        part = log.services.partition(TOPIC, p)
        original = part.append_marker

        def held(*args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
            release.wait()
            return _original(*args, **kwargs)

        part.append_marker = held  # type: ignore[method-assign]
    try:
        yield release
    finally:
        release.set()
        ending.apply_transactional_offsets = apply  # type: ignore[assignment]
        for p in range(partitions):
            del log.services.partition(TOPIC, p).append_marker


def _producer(log: Log, partitions: int) -> Producer:
    log.create_topic(TOPIC, partitions)
    producer = log.producer(transactional_id="t")
    producer.init_transactions()
    return producer


def _commit(producer: Producer, value: bytes) -> None:
    producer.begin_transaction()
    producer.send(TOPIC, value, partition=0)
    producer.commit_transaction()


def _state(log: Log, transactional_id: str) -> TxnState:
    meta = Log(log.root).coordinator.metadata(transactional_id)
    assert meta is not None
    return meta.state


def test_commit_returns_before_the_markers_and_fetches_roll_it_forward(log: Log) -> None:
    producer = _producer(log, 2)
    with markers_held(log, 2) as release:
        producer.begin_transaction()
        producer.send(TOPIC, b"a", partition=0)
        producer.send(TOPIC, b"b", partition=1)
        producer.send_offsets_to_transaction({("in", 0): 7}, "g")
        producer.commit_transaction()  # returns although no marker can be written
        assert _state(log, "t") in UNFINISHED
        other = Log(log.root)  # another process: nothing of it is held
        assert [other.read(TOPIC, p).num_rows for p in range(2)] == [1, 1]
        # The group's offsets were not applied yet; a fetch rolls the commit forward.
        group = read_group(other.services.storage, "g")
        assert group is not None and ("in", 0) not in group.offsets and "t" in group.pending
        assert other.committed("g") == {("in", 0): 7}
        release.set()
        producer.flush()  # waits for the roll-forward (here: finds it done by the other)
    assert _state(log, "t") == TxnState.COMPLETE_COMMIT
    group = read_group(log.services.storage, "g")
    assert group is not None and "t" not in group.pending


def test_the_next_transaction_stages_while_the_last_one_completes(log: Log) -> None:
    producer = _producer(log, 1)
    with markers_held(log, 1) as release:
        _commit(producer, b"1")
        producer.begin_transaction()
        producer.send(TOPIC, b"2", partition=0)  # AddPartitionsToTxn waits behind
        producer.send(TOPIC, b"3", partition=0)
        assert _state(log, "t") in UNFINISHED  # the first one's markers wait
        release.set()
        producer.commit_transaction()
    producer.close()
    assert log.read(TOPIC, 0).column("value").to_pylist() == [b"1", b"2", b"3"]
    assert _state(log, "t") == TxnState.COMPLETE_COMMIT


def _chain(log: Log, transactional_id: str) -> list[TransactionMetadata]:
    """Every stored version of the id's chain, oldest first."""
    storage = log.services.storage
    directory = f"{TXN_DIR}/{transactional_id}"
    return [TransactionMetadata.from_dict(msgpack.unpackb(storage.read(f"{directory}/{n}")))
            for n in sorted(storage.list(directory), key=int)]


def _join_waits_for(log: Log, transactional_id: str) -> None:
    """Until the producer's next AddPartitionsToTxn waits for the roll-forward."""
    wait_for(lambda: transactional_id in log.services.coordinator.ender._successors, 30,
             "the join never waited for the roll-forward", poll_s=0.001)


def test_the_next_join_publishes_the_last_complete_with_its_own_version(log: Log) -> None:
    """One version instead of two between transactions (protocol.md 4.5.2), and only once
    every marker of the first is written."""
    producer = _producer(log, 2)
    events: list[str] = []  # what was written, in order, once the first commit returned
    store = log.services.coordinator.store
    update = store.update

    def recorded_update(*args, **kwargs):  # type: ignore[no-untyped-def]
        version = update(*args, **kwargs)
        events.append("join")
        return version

    with markers_held(log, 2) as release:
        # Around the held markers before the first commit: its roll-forward may reach
        # them at once, and a marker written is recorded when it returns.
        for p in range(2):
            part = log.services.partition(TOPIC, p)

            def marker(*args, _held=part.append_marker, _p=p, **kwargs
                       ):  # type: ignore[no-untyped-def]
                result = _held(*args, **kwargs)
                events.append(f"marker {_p}")
                return result

            part.append_marker = marker  # type: ignore[method-assign]
        producer.begin_transaction()
        producer.send(TOPIC, b"1", partition=0)
        producer.send(TOPIC, b"2", partition=1)
        producer.commit_transaction()
        first = _chain(log, "t")[-1]
        store.update = recorded_update  # type: ignore[method-assign]  # the first join is done
        producer.begin_transaction()
        producer.send(TOPIC, b"3", partition=1)  # its join waits for the markers
        _join_waits_for(log, "t")
        assert _chain(log, "t")[-1] == first and events == []
        release.set()
        producer.commit_transaction()
    store.update = update  # type: ignore[method-assign]
    producer.flush()
    assert sorted(events[:2]) == ["marker 0", "marker 1"] and events[2] == "join"
    versions = _chain(log, "t")
    assert [(v.state, v.decision_id) for v in versions[-3:]] == [
        (TxnState.ONGOING, first.decision_id),
        (TxnState.ONGOING, f"{first.producer_id}-{first.epoch + 1}"),
        (TxnState.COMPLETE_COMMIT, f"{first.producer_id}-{first.epoch + 1}")]
    assert versions[-2].partitions == ((TOPIC, 1),) and versions[-1].epoch == first.epoch + 2
    other = Log(log.root)
    assert [other.read(TOPIC, p).column("value").to_pylist() for p in range(2)] == [
        [b"1"], [b"2", b"3"]]
    # Both transactions' markers are in the partitions: nothing is left open.
    assert all(other.services.partition(TOPIC, p).state().open_transactions() == []
               for p in range(2))


def _lingering(log: Log, transactional_id: str) -> None:
    """Until the roll-forward of ``transactional_id`` keeps its Complete* for a join."""
    wait_for(lambda: transactional_id in log.services.coordinator.ender._lingering, 30,
             "the roll-forward never kept its Complete*", poll_s=0.001)


def _roll_forward_ended(log: Log, transactional_id: str) -> None:
    """Until this process's roll-forward of ``transactional_id`` has ended."""
    wait_for(lambda: transactional_id not in log.services.coordinator.ender._running, 30,
             "the roll-forward never ended", poll_s=0.001)


def test_a_join_after_the_markers_still_folds_the_last_complete(
        log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next transaction begins after every marker of the last one is written (a
    producer that does other work between its transactions): the roll-forward kept the
    Complete* version for it, so the chain still takes one version between the two."""
    monkeypatch.setattr(ending, "COMPLETE_LINGER_S", 60.0)  # the join always comes within
    producer = _producer(log, 2)
    _commit(producer, b"1")
    first = _chain(log, "t")[-1]
    _lingering(log, "t")
    other = Log(log.root)
    assert other.services.partition(TOPIC, 0).state().open_transactions() == []  # marked
    assert _chain(log, "t")[-1] == first  # and nothing published after the markers
    _commit(producer, b"2")
    _lingering(log, "t")
    producer.flush()  # ends the wait: Complete* of the second is published now
    versions = _chain(log, "t")
    assert [(v.state, v.decision_id) for v in versions[-3:]] == [
        (TxnState.ONGOING, first.decision_id),
        (TxnState.ONGOING, f"{first.producer_id}-{first.epoch + 1}"),
        (TxnState.COMPLETE_COMMIT, f"{first.producer_id}-{first.epoch + 1}")]
    assert other.read(TOPIC, 0).column("value").to_pylist() == [b"1", b"2"]


@pytest.mark.parametrize("ending_call", ["flush", "close", "complete"])
def test_whoever_waits_for_the_roll_forward_ends_its_wait_for_a_join(
        log: Log, monkeypatch: pytest.MonkeyPatch, ending_call: str) -> None:
    """flush(), close() and this process's complete() wait for the roll-forward, which
    publishes its Complete* at once instead of keeping it for a join that may not come."""
    monkeypatch.setattr(ending, "COMPLETE_LINGER_S", 60.0)
    producer = _producer(log, 1)
    _commit(producer, b"1")
    _lingering(log, "t")
    started = time.monotonic()
    if ending_call == "complete":
        log.coordinator.complete("t")
    else:
        getattr(producer, ending_call)()
    assert time.monotonic() - started < 30, f"{ending_call}() waited the linger out"
    assert _state(log, "t") == TxnState.COMPLETE_COMMIT


def test_a_roll_forward_no_join_takes_over_publishes_its_complete(log: Log) -> None:
    """With the default linger and no next transaction, Complete* is published by the
    roll-forward itself once the wait runs out, without anyone asking."""
    producer = _producer(log, 1)
    _commit(producer, b"1")
    _roll_forward_ended(log, "t")
    assert _state(log, "t") == TxnState.COMPLETE_COMMIT
    producer.close()


def test_a_roll_forward_in_the_callers_thread_publishes_its_complete_at_once(
        log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the roll-forward behind EndTxn waits for a join: one that flush() runs again
    in the producer's own thread, after the background one failed, has nobody to wait
    for (the producer is busy in it) and publishes Complete* at once."""
    monkeypatch.setattr(ending, "COMPLETE_LINGER_S", 60.0)
    producer = _producer(log, 1)
    part = log.services.partition(TOPIC, 0)

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("marker write failed")

    part.append_marker = failing  # type: ignore[method-assign]
    _commit(producer, b"x")
    _roll_forward_ended(log, "t")  # the background roll-forward fails on the marker
    del part.append_marker
    started = time.monotonic()
    producer.flush()  # completes it again here: the marker, then Complete*
    assert time.monotonic() - started < 30, "flush() waited for a join in its own thread"
    assert _state(log, "t") == TxnState.COMPLETE_COMMIT
    producer.close()


def test_a_join_that_fails_holding_the_last_complete_publishes_it(log: Log) -> None:
    """The roll-forward left its Complete* to the join; the join failed before publishing
    anything, so it publishes that Complete* itself before raising."""
    producer = _producer(log, 1)
    store = log.services.coordinator.store
    update = store.update

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("chain write failed")

    with markers_held(log, 1) as release:
        _commit(producer, b"1")
        producer.begin_transaction()
        store.update = failing  # type: ignore[method-assign]
        producer.send(TOPIC, b"2", partition=0)
        _join_waits_for(log, "t")
        release.set()
        with pytest.raises(OSError, match="chain write failed"):
            producer.commit_transaction()
    store.update = update  # type: ignore[method-assign]
    assert _state(log, "t") == TxnState.COMPLETE_COMMIT
    producer.abort_transaction()
    _commit(producer, b"3")
    producer.close()
    assert log.read(TOPIC, 0).column("value").to_pylist() == [b"1", b"3"]


def test_a_failed_roll_forward_is_raised_to_the_producer(log: Log) -> None:
    producer = _producer(log, 1)
    part = log.services.partition(TOPIC, 0)

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("marker write failed")

    part.append_marker = failing  # type: ignore[method-assign]
    _commit(producer, b"x")  # the decision stands: committed
    assert Log(log.root).read(TOPIC, 0).num_rows == 1
    with pytest.raises(OSError, match="marker write failed"):
        producer.flush()
    producer.begin_transaction()
    producer.send(TOPIC, b"y", partition=0)
    with pytest.raises(OSError, match="marker write failed"):  # its AddPartitionsToTxn
        producer.commit_transaction()  # waited for the first one's completion, which failed
    del part.append_marker
    producer.abort_transaction()  # completes the first one, then aborts (nothing joined)
    _commit(producer, b"z")
    producer.close()
    assert log.read(TOPIC, 0).column("value").to_pylist() == [b"x", b"z"]


def test_close_waits_within_its_timeout_and_leaves_the_rest_running(log: Log) -> None:
    producer = _producer(log, 1)
    with markers_held(log, 1) as release:
        _commit(producer, b"x")
        producer.close(timeout=0)
        assert _state(log, "t") in UNFINISHED
        release.set()
        log.coordinator.complete("t")  # waits for this process's roll-forward
    assert _state(log, "t") == TxnState.COMPLETE_COMMIT


def test_a_shared_commit_returns_at_its_decision(log: Log) -> None:
    log.create_topic(TOPIC, 2)
    job = SharedTransaction.start(log, "job", 60_000)
    with markers_held(log, 2) as release:
        members = []
        for p in range(2):
            producer = job.join(log, str(p))
            producer.send(TOPIC, f"{p}".encode(), partition=p)
            members.append(producer.prepare_transaction())
            producer.close()
        job.commit(log, members)
        assert all(_state(log, m.transactional_id) in UNFINISHED for m in members)
        assert job.wait_completed(timeout=0) is False
        assert [Log(log.root).read(TOPIC, p).num_rows for p in range(2)] == [1, 1]
        release.set()
        assert job.wait_completed() is True
    assert {_state(log, m.transactional_id) for m in members} == {TxnState.COMPLETE_COMMIT}
    assert log.services.storage.list(job_dir("job")) == []
