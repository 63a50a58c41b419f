"""Acceptance tests of the "transactions" issue: one test per protocol rule.

Each test builds the situation the rule is about (a zombie producer, a crash
between the decision and the markers, an exhausted epoch, ...) and then checks
what Kafka (KIP-98, KIP-890) promises for it, by looking at what readers get
and at the batches and metadata actually on storage.  Expected values are
always derived from what the test itself wrote.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import pytest
from helpers_core import nothing_holds_the_lso, wait_for

from txlog import (READ_UNCOMMITTED, ConcurrentTransactionsError, DecisionConflictError,
                   IllegalStateError, InvalidTransactionTimeoutError, InvalidTxnStateError, Log,
                   OutOfOrderSequenceError, Producer, ProducerFencedError, TransactionAbortedError)
from txlog.format.batch import ABORT, COMMIT, BatchHeader, decode_control, decode_header, payload_of
from txlog.transactions.coordinator import MAX_TRANSACTION_TIMEOUT_MS
from txlog.transactions.metadata import MAX_EPOCH, TransactionMetadata, TxnState

TOPIC = "events"
DEADLINE_S = 20.0


# --- helpers --------------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    wait_for(condition, deadline_s, what)


def now_ms() -> int:
    return int(time.time() * 1000)


def wait_expired(log: Log, txn_id: str) -> None:
    """Wait until the coordinator would consider ``txn_id``'s transaction expired."""
    meta = log.coordinator.metadata(txn_id)
    assert meta is not None and meta.state == TxnState.ONGOING
    wait_until(lambda: meta.expired(now_ms()), f"transaction of {txn_id} to expire",
               deadline_s=meta.timeout_ms / 1000 + DEADLINE_S)


def committed_values(log: Log, partition: int, topic: str = TOPIC) -> list[bytes]:
    return log.read(topic, partition).column("value").to_pylist()


def all_values(log: Log, partition: int, topic: str = TOPIC) -> list[bytes]:
    return log.read(topic, partition, isolation_level=READ_UNCOMMITTED).column("value").to_pylist()


@dataclasses.dataclass(frozen=True)
class RawBatch:
    header: BatchHeader
    marker: int | None  # COMMIT / ABORT for control batches
    coordinator_epoch: int | None


def raw_batches(log: Log, partition: int, topic: str = TOPIC) -> list[RawBatch]:
    """Every batch of a partition, decoded from the files (not from the producer state)."""
    part = log.partition(topic, partition)
    out: list[RawBatch] = []
    offset = 0
    while log.storage.exists(part.batch_path(offset)):
        data = log.storage.read(part.batch_path(offset))
        header = decode_header(data, "test", offset)
        marker = epoch = None
        if header.is_control:
            control = decode_control(payload_of(data, header, "test"), header, "test")
            marker, epoch = control.type, control.coordinator_epoch
        out.append(RawBatch(header, marker, epoch))
        offset = header.next_offset
    return out


def markers(log: Log, partition: int, topic: str = TOPIC) -> list[tuple[int, int, int]]:
    """(producer id, marker epoch, COMMIT/ABORT) of every control batch, in log order."""
    return [(b.header.producer_id, b.header.producer_epoch, b.marker)
            for b in raw_batches(log, partition, topic) if b.marker is not None]


def txn_producer(log: Log, txn_id: str, **config) -> Producer:
    producer = log.producer(transactional_id=txn_id, linger_ms=0, **config)
    producer.init_transactions()
    return producer


def open_txn(log: Log, txn_id: str, sends: list[tuple[int, bytes]], **config) -> Producer:
    """An initialised producer with an open transaction whose records are in the log."""
    producer = txn_producer(log, txn_id, **config)
    producer.begin_transaction()
    for partition, value in sends:
        producer.send(TOPIC, value, partition=partition)
    producer.flush()
    return producer


# --- fencing and epochs ---------------------------------------------------------------------


def test_new_instance_fences_the_old_one_whose_data_never_becomes_visible(log: Log) -> None:
    """InitProducerId fences the older instance (KIP-98 zombie fencing).

    The old instance's open transaction is aborted, and every later call of
    the old instance (send to a new or to a known partition, commit) raises
    ProducerFencedError; none of its records is ever returned to a
    read_committed reader, while the new instance works normally.
    """
    log.create_topic(TOPIC, 3)
    old = open_txn(log, "app", [(0, b"old-0"), (1, b"old-1")])
    old_pid, old_epoch = old.producer_id, old.epoch

    new = txn_producer(log, "app")
    assert (new.producer_id, new.epoch) > (old_pid, old_epoch)
    meta = log.coordinator.metadata("app")
    assert meta.state == TxnState.EMPTY and (meta.producer_id, meta.epoch) == (new.producer_id,
                                                                               new.epoch)
    # The old transaction was aborted in both of its partitions.
    for p in (0, 1):
        assert (old_pid, old_epoch + 1, ABORT) in markers(log, p)

    with pytest.raises(ProducerFencedError):  # AddPartitionsToTxn for a new partition
        old.send(TOPIC, b"old-2", partition=2)
    with pytest.raises(ProducerFencedError):
        old.commit_transaction()
    # A send to a partition it had already added reaches the partition check itself.
    zombie = log.producer(transactional_id="app", linger_ms=0)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send(TOPIC, b"zombie-0", partition=0)
    newest = txn_producer(log, "app")
    with pytest.raises(ProducerFencedError):
        zombie.send(TOPIC, b"zombie-late", partition=0)
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()

    newest.begin_transaction()
    newest.send(TOPIC, b"new-0", partition=0)
    newest.commit_transaction()
    assert committed_values(log, 0) == [b"new-0"]
    assert committed_values(log, 1) == []
    assert committed_values(log, 2) == []
    # The fenced records are in the log (read_uncommitted), just never committed.
    assert set(all_values(log, 0)) == {b"old-0", b"zombie-0", b"new-0"}


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_each_transaction_ends_with_a_bumped_epoch_carried_by_its_markers(
        log: Log, commit: bool) -> None:
    """KIP-890: EndTxn bumps the epoch; the markers carry the bumped epoch.

    The metadata ends in Complete* at epoch + 1, the producer continues with
    that epoch, and every partition of the transaction holds one marker of
    the right type with epoch + 1.
    """
    log.create_topic(TOPIC, 2)
    producer = open_txn(log, "bump", [(0, b"a"), (1, b"b")])
    pid, epoch = producer.producer_id, producer.epoch
    if commit:
        producer.commit_transaction()
    else:
        producer.abort_transaction()
    producer.flush()  # the roll-forward behind the decision (docs/protocol.md 4.5)

    meta = log.coordinator.metadata("bump")
    assert meta.state == (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
    assert (meta.producer_id, meta.epoch) == (pid, epoch + 1)
    assert (producer.producer_id, producer.epoch) == (pid, epoch + 1)
    for p in (0, 1):
        assert markers(log, p) == [(pid, epoch + 1, COMMIT if commit else ABORT)]
    assert committed_values(log, 0) == ([b"a"] if commit else [])

    # The next transaction runs at the bumped epoch and ends one higher again.
    producer.begin_transaction()
    producer.send(TOPIC, b"c", partition=0)
    producer.commit_transaction()
    producer.flush()
    assert markers(log, 0)[-1] == (pid, epoch + 2, COMMIT)
    assert log.coordinator.metadata("bump").epoch == epoch + 2


def test_late_zombie_append_with_the_old_epoch_is_rejected(log: Log) -> None:
    """After the marker, a batch with the transaction's epoch is fenced.

    A zombie (or a delayed retry) of the closed transaction appends with the
    old epoch, either a new sequence or an exact copy of an old batch: the
    partition refuses both and the log does not change.
    """
    log.create_topic(TOPIC, 1)
    producer = open_txn(log, "zombie", [(0, b"x"), (0, b"y")])
    producer.commit_transaction()
    producer.flush()  # the markers, written behind the decision
    part = log.partition(TOPIC, 0)
    old = next(b.header for b in raw_batches(log, 0) if not b.header.is_control)
    assert old.is_transactional and old.producer_epoch == producer.epoch - 1
    end = part.end_offset()
    payload = log.storage.read(part.batch_path(old.base_offset))[old.header_length:]

    for header in (
            dataclasses.replace(old, base_sequence=old.last_sequence + 1),  # continues
            old,  # a retry of the very same batch
    ):
        with pytest.raises(ProducerFencedError):
            part.append(header, payload)
    assert part.end_offset() == end
    assert committed_values(log, 0) == [b"x", b"y"]


def test_out_of_order_sequence_inside_a_transaction_is_rejected(log: Log) -> None:
    """Within an epoch a batch must continue the sequence (or be an exact retry).

    A gap or an overlap is OutOfOrderSequence and writes nothing; a retry of
    the last batch is answered with the original offsets (idempotence).
    """
    log.create_topic(TOPIC, 1)
    producer = open_txn(log, "seq", [(0, b"r0")])
    producer.send(TOPIC, b"r1", partition=0)
    producer.send(TOPIC, b"r2", partition=0)
    producer.flush()
    part = log.partition(TOPIC, 0)
    data_batches = [b.header for b in raw_batches(log, 0)]
    last = data_batches[-1]
    payload = log.storage.read(part.batch_path(last.base_offset))[last.header_length:]
    end = part.end_offset()

    assert [(h.base_sequence, h.record_count) for h in data_batches] == [(0, 1), (1, 1), (2, 1)]
    for base_sequence, count in [(last.last_sequence + 2, 1),  # a gap
                                 (last.base_sequence, 2),  # overlaps the last batch
                                 (0, 2)]:  # rewinds (and is no copy of a retained batch)
        header = dataclasses.replace(last, base_sequence=base_sequence, record_count=count)
        with pytest.raises(OutOfOrderSequenceError):
            part.append(header, payload)
    assert part.end_offset() == end

    # Exact retries of retained batches are answered with the original offsets.
    for original in (data_batches[0], last):
        retry = part.append(original, payload)
        assert retry.duplicate
        assert (retry.base_offset, retry.last_offset) == (original.base_offset,
                                                          original.last_offset)
    assert part.end_offset() == end
    producer.commit_transaction()
    assert committed_values(log, 0) == [b"r0", b"r1", b"r2"]


def test_epoch_exhaustion_rotates_to_a_new_producer_id(log: Log) -> None:
    """An epoch that cannot be bumped any more moves the id to a new producer id.

    Set up via the metadata chain: an id at epoch MAX_EPOCH - 2.  InitProducerId
    hands out MAX_EPOCH - 1, the last usable epoch; ending that transaction
    writes markers with MAX_EPOCH and continues under a fresh producer id at
    epoch 0.  An InitProducerId at MAX_EPOCH - 1 rotates as well.
    """
    log.create_topic(TOPIC, 1)
    first = txn_producer(log, "old-timer")
    chain = log.coordinator.store.chain("old-timer")
    version, value = chain.latest()
    near = dataclasses.replace(TransactionMetadata.from_dict(value), epoch=MAX_EPOCH - 2)
    assert chain.publish(version + 1, near.to_dict())

    producer = txn_producer(log, "old-timer")
    pid = producer.producer_id
    assert (pid, producer.epoch) == (first.producer_id, MAX_EPOCH - 1)
    producer.begin_transaction()
    producer.send(TOPIC, b"last-of-the-epochs", partition=0)
    producer.commit_transaction()
    assert markers(log, 0) == [(pid, MAX_EPOCH, COMMIT)]
    assert producer.producer_id != pid and producer.epoch == 0
    meta = log.coordinator.metadata("old-timer")
    assert (meta.producer_id, meta.epoch, meta.state) == (producer.producer_id, 0,
                                                         TxnState.COMPLETE_COMMIT)

    producer.begin_transaction()
    producer.send(TOPIC, b"first-of-the-new-id", partition=0)
    producer.commit_transaction()
    producer.flush()  # its Complete, behind the decision, before the chain is edited below
    assert committed_values(log, 0) == [b"last-of-the-epochs", b"first-of-the-new-id"]

    # InitProducerId itself rotates when the current epoch is the last usable one.
    version, value = chain.latest()
    exhausted = dataclasses.replace(TransactionMetadata.from_dict(value), epoch=MAX_EPOCH - 1)
    assert chain.publish(version + 1, exhausted.to_dict())
    rotated = txn_producer(log, "old-timer")
    assert rotated.producer_id not in (pid, producer.producer_id) and rotated.epoch == 0

    # Fencing an open transaction at the last usable epoch: the ABORT markers
    # take MAX_EPOCH and the successor continues under another producer id.
    version, value = chain.latest()
    near = dataclasses.replace(TransactionMetadata.from_dict(value), epoch=MAX_EPOCH - 2)
    assert chain.publish(version + 1, near.to_dict())
    doomed = open_txn(log, "old-timer", [(0, b"fenced-at-the-edge")])
    assert doomed.epoch == MAX_EPOCH - 1
    successor = txn_producer(log, "old-timer")
    assert successor.producer_id != doomed.producer_id
    assert markers(log, 0)[-1] == (doomed.producer_id, MAX_EPOCH, ABORT)
    with pytest.raises(ProducerFencedError):
        doomed.commit_transaction()
    assert committed_values(log, 0) == [b"last-of-the-epochs", b"first-of-the-new-id"]


# --- the state machine -------------------------------------------------------------------------

# Kafka's TransactionState.validPreviousStates (TransactionMetadata.scala, KIP-98),
# written out here on its own so that the test does not check the table against itself.
KAFKA_VALID_PREVIOUS = {
    "Empty": {"Empty", "CompleteCommit", "CompleteAbort"},
    "Ongoing": {"Ongoing", "Empty", "CompleteCommit", "CompleteAbort"},
    "PrepareCommit": {"Ongoing"},
    "PrepareAbort": {"Ongoing", "PrepareEpochFence"},
    "CompleteCommit": {"PrepareCommit"},
    "CompleteAbort": {"PrepareAbort"},
    "Dead": {"Empty", "CompleteCommit", "CompleteAbort"},
    "PrepareEpochFence": {"Ongoing"},
}
ALL_STATES = sorted(KAFKA_VALID_PREVIOUS)


def test_state_names_are_kafkas() -> None:
    """The coordinator knows exactly Kafka's eight states (so the table below is complete)."""
    assert sorted(s.value for s in TxnState) == ALL_STATES


@pytest.mark.parametrize("source", ALL_STATES)
@pytest.mark.parametrize("target", ALL_STATES)
def test_state_transitions_follow_kafkas_table(source: str, target: str) -> None:
    """Every (from, to) pair: allowed exactly when Kafka's table allows it."""
    meta = TransactionMetadata("t", 1, 3, TxnState(source), 1000, update_ms=0)
    if source in KAFKA_VALID_PREVIOUS[target]:
        nxt = meta.transition(TxnState(target))
        assert nxt.state == TxnState(target) and nxt.update_ms > 0
        assert (nxt.producer_id, nxt.epoch) == (1, 3)
    else:
        with pytest.raises(InvalidTxnStateError):
            meta.transition(TxnState(target))


def test_end_without_an_open_transaction_is_an_invalid_state(log: Log) -> None:
    """EndTxn on an id with no Ongoing transaction is refused, not silently accepted."""
    log.create_topic(TOPIC, 1)
    producer = open_txn(log, "twice", [(0, b"v")])
    member = producer._transactions.member()
    producer.commit_transaction()
    producer.flush()  # the roll-forward behind the decision, which bumps the epoch
    # The same (producer id, epoch) asking again is now stale: its epoch was bumped.
    with pytest.raises(ProducerFencedError):
        log.coordinator.end_transaction(member, commit=True)
    fresh = dataclasses.replace(member, epoch=producer.epoch)
    with pytest.raises(InvalidTxnStateError):  # current epoch, but nothing open to end
        log.coordinator.end_transaction(fresh, commit=False)
    assert markers(log, 0) == [(producer.producer_id, producer.epoch, COMMIT)]


# --- timeouts ----------------------------------------------------------------------------------


def test_expired_transaction_is_aborted_by_abort_expired(log: Log) -> None:
    """An Ongoing transaction older than its timeout is fenced and aborted.

    Not before: abort_expired leaves a young transaction alone.  After the
    timeout it publishes ABORT, writes the markers, fences the producer, and
    the LSO moves past the transaction.
    """
    log.create_topic(TOPIC, 2)
    producer = open_txn(log, "slow", [(0, b"s0"), (1, b"s1")], transaction_timeout_ms=1000)
    pid, epoch = producer.producer_id, producer.epoch
    meta = log.coordinator.metadata("slow")
    if now_ms() < meta.txn_start_ms + meta.timeout_ms - 300:  # surely young still
        assert log.abort_expired_transactions() == []
        assert log.coordinator.metadata("slow").state == TxnState.ONGOING
    wait_expired(log, "slow")
    assert log.last_stable_offset(TOPIC, 0) == 0

    assert log.abort_expired_transactions() == ["slow"]
    decision = log.coordinator.decision(meta.decision_id)
    assert decision is not None and not decision.commit
    assert log.coordinator.metadata("slow").state == TxnState.COMPLETE_ABORT
    for p in (0, 1):
        assert markers(log, p) == [(pid, epoch + 1, ABORT)]
        assert nothing_holds_the_lso(log, TOPIC, [p])
        assert committed_values(log, p) == []
    with pytest.raises(ProducerFencedError):
        producer.commit_transaction()
    assert log.abort_expired_transactions() == []  # nothing left to do, markers not repeated
    assert markers(log, 0) == [(pid, epoch + 1, ABORT)]


def test_producer_that_finds_its_own_transaction_expired_aborts_it(log: Log) -> None:
    """A producer adding a partition to its expired transaction aborts it and is fenced."""
    log.create_topic(TOPIC, 2)
    producer = open_txn(log, "late", [(0, b"l0")], transaction_timeout_ms=800)
    wait_expired(log, "late")
    with pytest.raises(ProducerFencedError):
        producer.send(TOPIC, b"l1", partition=1)
    meta = log.coordinator.metadata("late")
    assert meta.state == TxnState.COMPLETE_ABORT
    assert [m[2] for m in markers(log, 0)] == [ABORT]
    assert committed_values(log, 0) == [] and all_values(log, 1) == []


def test_consumer_with_abort_expired_unblocks_the_lso(log: Log) -> None:
    """Consumer(abort_expired_transactions=True) aborts what holds its partition back."""
    log.create_topic(TOPIC, 1)
    # Long enough that the other producer (which aborts expired transactions in
    # partitions it writes, at most once a second) surely finds it young.
    open_txn(log, "stuck", [(0, b"never")], transaction_timeout_ms=1500)
    other = txn_producer(log, "fine")
    other.begin_transaction()
    other.send(TOPIC, b"fine", partition=0)
    other.commit_transaction()

    plain = log.consumer(auto_offset_reset="earliest")
    plain.assign([(TOPIC, 0)])
    assert plain.poll() == []  # the open transaction at offset 0 holds everything back
    wait_expired(log, "stuck")
    assert plain.poll() == []  # a plain reader never aborts anything
    assert log.coordinator.metadata("stuck").state == TxnState.ONGOING

    aborting = log.consumer(auto_offset_reset="earliest", abort_expired_transactions=True)
    aborting.assign([(TOPIC, 0)])
    assert [r.value for r in aborting.poll()] == [b"fine"]
    assert log.coordinator.metadata("stuck").state == TxnState.COMPLETE_ABORT


def test_invalid_transaction_timeout_is_rejected(log: Log) -> None:
    """transaction_timeout_ms must be an int in 1..transaction.max.timeout.ms (Kafka)."""
    for bad in (0, -1, MAX_TRANSACTION_TIMEOUT_MS + 1, 1.5, True, "100"):
        producer = log.producer(transactional_id="tmo", transaction_timeout_ms=bad)
        with pytest.raises(InvalidTransactionTimeoutError):
            producer.init_transactions()
    assert log.coordinator.metadata("tmo") is None  # nothing was registered
    for good in (1, MAX_TRANSACTION_TIMEOUT_MS):
        producer = log.producer(transactional_id="tmo", transaction_timeout_ms=good)
        producer.init_transactions()
        assert log.coordinator.metadata("tmo").timeout_ms == good


def test_idle_transactional_id_expires_and_restarts_with_a_new_producer_id(log: Log) -> None:
    """expire_transactional_ids: idle ids go Dead; the next init starts a new producer id.

    An id with an Ongoing transaction is never expired, whatever its age.
    """
    log.create_topic(TOPIC, 1)
    idle = txn_producer(log, "idle")
    idle.begin_transaction()
    idle.send(TOPIC, b"i", partition=0)
    idle.commit_transaction()
    idle.flush()  # Complete, behind the decision
    busy = open_txn(log, "busy", [(0, b"b")])
    done_ms = log.coordinator.metadata("idle").update_ms
    wait_until(lambda: now_ms() > max(done_ms, log.coordinator.metadata("busy").update_ms),
               "the clock to move past the last updates")

    assert log.coordinator.expire_transactional_ids(max_idle_ms=60_000) == []
    assert log.coordinator.expire_transactional_ids(max_idle_ms=0) == ["idle"]
    assert log.coordinator.metadata("idle").state == TxnState.DEAD
    assert log.coordinator.metadata("busy").state == TxnState.ONGOING

    reborn = txn_producer(log, "idle")
    assert reborn.producer_id != idle.producer_id and reborn.epoch == 0
    with pytest.raises(ProducerFencedError):
        idle.begin_transaction()
        idle.send(TOPIC, b"zombie", partition=0)
    busy.commit_transaction()
    assert committed_values(log, 0) == [b"i", b"b"]


def test_another_producer_aborts_an_expired_transaction(log: Log, monkeypatch) -> None:
    """With no coordinator timer, producers writing to a partition abort expired
    transactions that hold its LSO back: a dead producer cannot stall readers."""
    import txlog.clients.transaction_manager as transaction_manager_module

    monkeypatch.setattr(transaction_manager_module, "EXPIRY_CHECK_INTERVAL_S", 0.0)
    log.create_topic(TOPIC, 1)
    stuck = open_txn(log, "dead-one", [(0, b"never-visible")], transaction_timeout_ms=200)
    first = log.partition(TOPIC, 0).state().open_transactions()[0].first_offset
    assert log.last_stable_offset(TOPIC, 0) == first
    wait_expired(log, "dead-one")

    log.producer().send(TOPIC, b"later", partition=0).get()  # a plain idempotent producer

    assert log.coordinator.metadata("dead-one").state == TxnState.COMPLETE_ABORT
    assert nothing_holds_the_lso(log, TOPIC, [0])
    assert committed_values(log, 0) == [b"later"]
    with pytest.raises(ProducerFencedError):
        stuck.commit_transaction()


def test_another_producer_leaves_a_live_transaction_alone(log: Log, monkeypatch) -> None:
    import txlog.clients.transaction_manager as transaction_manager_module

    monkeypatch.setattr(transaction_manager_module, "EXPIRY_CHECK_INTERVAL_S", 0.0)
    log.create_topic(TOPIC, 1)
    busy = open_txn(log, "busy", [(0, b"pending")], transaction_timeout_ms=600_000)
    log.producer().send(TOPIC, b"other", partition=0).get()
    assert log.coordinator.metadata("busy").state == TxnState.ONGOING
    busy.commit_transaction()
    assert committed_values(log, 0) == [b"pending", b"other"]


# --- decisions, markers, recovery -----------------------------------------------------------------


def _crash_after_decision(log: Log, commit: bool, crash_point: str
                          ) -> tuple[TransactionMetadata, list[bytes]]:
    """A transaction over three partitions whose process died after the commit point.

    ``after_decision``: the decision object exists, nothing else (no marker,
    metadata Ongoing).  ``after_first_marker``: the roll-forward had begun
    (the markers go to all partitions at once, those of partitions 0 and 2
    landed; the metadata is still Ongoing, as a plain producer's transaction
    has no Prepare* version, protocol.md 4.2) and died writing partition 1's.
    """
    log.create_topic(TOPIC, 3)
    sends = [(0, b"d0"), (1, b"d1"), (2, b"d2"), (0, b"d0b")]
    producer = open_txn(log, "crashy", sends)
    meta = log.coordinator.metadata("crashy")
    log.coordinator.store.decide(meta.decision_id, commit,
                                 [(producer.producer_id, producer.epoch)], "test: crash")
    if crash_point == "after_first_marker":
        def die(*args, **kwargs):
            raise OSError("the process dies here")

        log.partition(TOPIC, 1).append_marker = die
        with pytest.raises(OSError):
            log.coordinator.complete("crashy")
        assert log.coordinator.metadata("crashy").state == TxnState.ONGOING
    return meta, [v for _, v in sends]


@pytest.mark.parametrize("crash_point", ["after_decision", "after_first_marker"])
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
@pytest.mark.parametrize("finisher", ["complete", "init_transactions", "abort_expired"])
def test_decided_transaction_is_seen_in_all_partitions_and_rolled_forward(
        log: Log, commit: bool, finisher: str, crash_point: str) -> None:
    """The decision object is the commit point; markers are only the roll-forward.

    Right after the decision (no marker, or markers in some partitions only)
    another process's reader already sees the outcome in every partition at
    once and the LSO is not held back.  Then any process finishing the
    transaction (complete(), a new instance's init_transactions,
    abort_expired's sweep) writes exactly the missing markers, once each,
    and what readers see does not change.
    """
    meta, values = _crash_after_decision(log, commit, crash_point)
    kind = COMMIT if commit else ABORT
    expected_markers = [(meta.txn_producer_id, meta.txn_epoch + 1, kind)]
    assert [markers(log, p) for p in range(3)] == (
        [expected_markers, [], expected_markers] if crash_point == "after_first_marker"
        else [[]] * 3)
    other = Log(log.root)  # another process: its own caches, the same files

    def seen(reader: Log) -> list[list[bytes]]:
        return [committed_values(reader, p) for p in range(3)]

    expected = [[v for v in values if v.startswith(f"d{p}".encode())] for p in range(3)] \
        if commit else [[], [], []]
    assert seen(other) == expected
    assert nothing_holds_the_lso(other, TOPIC, 3)

    if finisher == "complete":
        Log(log.root).coordinator.complete("crashy")
    elif finisher == "init_transactions":
        successor = txn_producer(Log(log.root), "crashy")
        assert successor.epoch == meta.epoch + 2  # marker epoch + 1
    else:
        assert Log(log.root).abort_expired_transactions() == []  # not expired, just finished
    for p in range(3):
        assert markers(log, p) == expected_markers
    final = log.coordinator.metadata("crashy")
    if finisher != "init_transactions":
        assert final.state == (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
    assert seen(other) == expected and seen(Log(log.root)) == expected


def test_duplicate_marker_changes_nothing(log: Log) -> None:
    """A second marker for the same transaction (any type) is not written.

    Recovery may run in several processes at once; append_marker must report
    "already there" (None) and leave the partition byte-for-byte unchanged.
    """
    log.create_topic(TOPIC, 1)
    producer = open_txn(log, "dup", [(0, b"v")])
    pid, epoch = producer.producer_id, producer.epoch
    producer.commit_transaction()
    producer.flush()  # its own roll-forward first
    part = log.partition(TOPIC, 0)
    before = [(b.header, b.marker) for b in raw_batches(log, 0)]
    for kind in (True, False):
        assert part.append_marker(pid, epoch + 1, kind) is None
        assert Log(log.root).partition(TOPIC, 0).append_marker(pid, epoch + 1, kind) is None
    assert Log(log.root).coordinator.complete("dup").state == TxnState.COMPLETE_COMMIT
    assert [(b.header, b.marker) for b in raw_batches(log, 0)] == before
    assert committed_values(log, 0) == [b"v"]


def test_no_record_can_join_a_transaction_after_its_decision(log: Log, monkeypatch) -> None:
    """A commit whose roll-forward failed must not leave the transaction open to writes.

    The decision is published, then completing it fails (a storage error) in
    the roll-forward behind the commit.  The producer's next transaction runs
    under the next epoch and so the next decision id, and its first
    AddPartitionsToTxn completes the first transaction before it joins: records
    written after the commit point are never committed with it, and an abort of
    the next transaction aborts only them.  A request under the committed
    decision itself is refused.
    """
    log.create_topic(TOPIC, 2)
    producer = open_txn(log, "flaky", [(0, b"first")])
    coordinator = log.coordinator
    member = producer._transactions.member()
    real_complete = coordinator.ender.complete
    calls = []

    def failing_complete(txn_id, only_decision=None):
        calls.append(txn_id)
        if len(calls) == 1:
            raise OSError("storage hiccup after the decision")
        return real_complete(txn_id, only_decision)

    monkeypatch.setattr(coordinator.ender, "complete", failing_complete)
    producer.commit_transaction()  # returns at the decision
    decision = coordinator.decision(member.decision_id)
    assert decision is not None and decision.commit
    producer.begin_transaction()
    producer.send(TOPIC, b"after-the-commit-point", partition=1)
    producer.abort_transaction()
    assert calls[0] == "flaky" and len(calls) >= 2  # failed behind, then completed again
    monkeypatch.setattr(coordinator.ender, "complete", real_complete)
    with pytest.raises((InvalidTxnStateError, ProducerFencedError,
                        ConcurrentTransactionsError)):
        coordinator.add_partitions(member, [(TOPIC, 1)])
    assert markers(log, 0)[-1][2] == COMMIT
    again = txn_producer(log, "flaky")
    again.begin_transaction()
    again.send(TOPIC, b"second", partition=1)
    again.abort_transaction()
    assert committed_values(log, 0) == [b"first"] and committed_values(log, 1) == []


# --- readers ------------------------------------------------------------------------------------


def test_lso_is_stuck_at_the_first_offset_of_an_open_transaction(log: Log) -> None:
    """read_committed stops at the earliest undecided transaction, then moves on.

    Committed data written after the open transaction started is held back
    until that transaction is decided; an abort releases it too (LSO = end).
    """
    log.create_topic(TOPIC, 1)
    writer = txn_producer(log, "writer")
    writer.begin_transaction()
    writer.send(TOPIC, b"before", partition=0)
    writer.commit_transaction()
    writer.flush()  # its marker, behind the decision
    first_open = log.end_offset(TOPIC, 0)

    blocker = open_txn(log, "blocker", [(0, b"open-1")])
    writer.begin_transaction()
    writer.send(TOPIC, b"after", partition=0)
    writer.commit_transaction()
    blocker.send(TOPIC, b"open-2", partition=0)
    blocker.flush()

    assert log.last_stable_offset(TOPIC, 0) == first_open < log.end_offset(TOPIC, 0)
    assert committed_values(log, 0) == [b"before"]
    consumer = log.consumer(auto_offset_reset="earliest")
    consumer.assign([(TOPIC, 0)])
    assert [r.value for r in consumer.poll()] == [b"before"]
    assert consumer.position(TOPIC, 0) == first_open
    assert consumer.end_offsets() == {(TOPIC, 0): first_open}

    blocker.abort_transaction()
    blocker.flush()  # its marker, behind the decision
    assert nothing_holds_the_lso(log, TOPIC, [0])
    assert [r.value for r in consumer.poll()] == [b"after"]
    assert committed_values(log, 0) == [b"before", b"after"]


def test_read_uncommitted_sees_everything_except_control_batches(log: Log) -> None:
    """read_uncommitted: every data record up to the log end, in offset order.

    Committed, aborted, still-open and non-transactional records all show;
    only the markers' offsets are missing.
    """
    log.create_topic(TOPIC, 1)
    plain = log.producer(linger_ms=0)
    txn = txn_producer(log, "mixed")
    written: dict[int, bytes] = {}
    for kind, value in [("plain", b"p0"), ("commit", b"c0"), ("abort", b"a0"),
                        ("plain", b"p1"), ("open", b"o0")]:
        if kind == "plain":
            written[plain.send(TOPIC, value, partition=0).get().offset] = value
            continue
        txn.begin_transaction()
        written[txn.send(TOPIC, value, partition=0).get().offset] = value
        if kind == "commit":
            txn.commit_transaction()
        elif kind == "abort":
            txn.abort_transaction()
    txn.flush()  # the last one's marker, behind its decision
    control_offsets = {b.header.base_offset for b in raw_batches(log, 0) if b.header.is_control}
    assert len(control_offsets) == 2

    table = log.read(TOPIC, 0, isolation_level=READ_UNCOMMITTED)
    got = dict(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True))
    assert got == written
    assert sorted(got) == table.column("offset").to_pylist()
    assert not control_offsets & set(got)
    assert set(got) | control_offsets == set(range(log.end_offset(TOPIC, 0)))
    assert committed_values(log, 0) == [b"p0", b"c0", b"p1"]  # the open one holds the LSO


# --- group offsets ------------------------------------------------------------------------------


def test_transactional_offsets_become_visible_only_on_commit(log: Log) -> None:
    """send_offsets_to_transaction: the group's offsets move only if the transaction commits."""
    log.create_topic(TOPIC, 1)
    log.create_topic("input", 2)
    producer = txn_producer(log, "etl")
    offsets = {("input", 0): 7, ("input", 1): 3}

    producer.begin_transaction()
    producer.send(TOPIC, b"out-1", partition=0)
    producer.send_offsets_to_transaction(offsets, "etl-group")
    assert log.committed("etl-group") == {}  # pending while the transaction is open
    producer.abort_transaction()
    assert log.committed("etl-group") == {}

    producer.begin_transaction()
    producer.send(TOPIC, b"out-2", partition=0)
    producer.send_offsets_to_transaction(offsets, "etl-group")
    producer.send_offsets_to_transaction({("input", 1): 4}, "etl-group")  # later wins
    assert log.committed("etl-group") == {}
    producer.commit_transaction()
    assert log.committed("etl-group") == {("input", 0): 7, ("input", 1): 4}
    assert log.committed("etl-group", [("input", 1)]) == {("input", 1): 4}
    consumer = log.consumer(group_id="etl-group")
    consumer.assign([("input", 0), ("input", 1)])
    assert consumer.committed("input", 0) == 7 and consumer.position("input", 1) == 4
    assert committed_values(log, 0) == [b"out-2"]

    # An offsets-only transaction (no records) commits its offsets as well.
    producer.begin_transaction()
    producer.send_offsets_to_transaction({("input", 0): 9}, "etl-group")
    producer.commit_transaction()
    assert log.committed("etl-group")[("input", 0)] == 9


def test_plain_offset_commit(log: Log) -> None:
    """commit_offsets outside transactions: immediately visible, merged per partition."""
    log.create_topic("input", 3)
    assert log.committed("plain-group") == {}
    log.commit_offsets("plain-group", {("input", 0): 5, ("input", 1): 2})
    log.commit_offsets("plain-group", {("input", 1): 6})
    assert log.committed("plain-group") == {("input", 0): 5, ("input", 1): 6}
    assert Log(log.root).committed("plain-group", [("input", 1), ("input", 2)]) == {
        ("input", 1): 6}
    consumer = log.consumer(group_id="plain-group")
    consumer.assign([("input", 2)])
    consumer.seek("input", 2, 11)
    consumer.commit()
    assert log.committed("plain-group") == {("input", 0): 5, ("input", 1): 6, ("input", 2): 11}
    assert log.committed("other-group") == {}


# --- multi-producer transactions -----------------------------------------------------------------


def _shared(log: Log, decision_id: str, n: int, partitions: int = 3):
    """``n`` producers in one shared transaction; returns (producers, members, values)."""
    producers, members, values = [], [], []
    for i in range(n):
        producer = txn_producer(log, f"{decision_id}-task-{i}")
        producer.begin_transaction(decision_id=decision_id)
        value = f"{decision_id}/{i}".encode()
        producer.send(TOPIC, value, partition=i % partitions)
        producers.append(producer)
        values.append(value)
        members.append(producer.prepare_transaction())
    return producers, members, values


def _visible(log: Log, partitions: int = 3) -> set[bytes]:
    return {v for p in range(partitions) for v in committed_values(log, p)}


def test_shared_transaction_commits_all_members_at_once(log: Log) -> None:
    """One decision for several producers: all members become visible together."""
    log.create_topic(TOPIC, 3)
    _, members, values = _shared(log, "job-1", 3)
    assert _visible(log) == set()
    assert all(log.last_stable_offset(TOPIC, p) == 0 for p in range(3))
    decision = log.coordinator.end_shared_transaction("job-1", members, commit=True)
    assert decision.commit and decision.members == {(m.producer_id, m.epoch) for m in members}
    assert _visible(log) == set(values)
    for i, m in enumerate(members):
        assert markers(log, i) == [(m.producer_id, m.epoch + 1, COMMIT)]
        assert log.coordinator.metadata(m.transactional_id).state == TxnState.COMPLETE_COMMIT


def test_shared_transaction_abort_hides_every_member(log: Log) -> None:
    log.create_topic(TOPIC, 3)
    _, members, _ = _shared(log, "job-2", 3)
    decision = log.coordinator.end_shared_transaction("job-2", members, commit=False)
    assert not decision.commit
    assert _visible(log) == set()
    for i, m in enumerate(members):
        assert markers(log, i) == [(m.producer_id, m.epoch + 1, ABORT)]
        assert nothing_holds_the_lso(log, TOPIC, [i])


def test_shared_transaction_member_not_listed_is_aborted(log: Log) -> None:
    """A producer that carries the decision id but is not in the member list is aborted.

    (A speculative or retried task's orphan.)  Readers treat it as aborted as
    soon as the decision exists, before any marker of its own, so it does not
    hold the LSO; the sweep then writes its ABORT marker.
    """
    log.create_topic(TOPIC, 3)
    _, members, values = _shared(log, "job-3", 3)
    listed, orphan = members[:2], members[2]
    log.coordinator.end_shared_transaction("job-3", listed, commit=True)
    assert _visible(log) == set(values[:2])
    assert markers(log, 2) == []
    assert nothing_holds_the_lso(log, TOPIC, [2])

    assert log.abort_expired_transactions() == []  # not expired: just rolled forward
    assert markers(log, 2) == [(orphan.producer_id, orphan.epoch + 1, ABORT)]
    assert log.coordinator.metadata(orphan.transactional_id).state == TxnState.COMPLETE_ABORT
    assert _visible(log) == set(values[:2])


def test_a_guessed_update_that_refuses_is_decided_on_a_fresh_read(log: Log) -> None:
    """protocol.md 4.1: AddPartitionsToTxn applies its step to the version this process
    published itself without reading the next one; only a winning publish confirms that
    guess.  Here the guess says "already in the transaction, nothing to change" while
    another process has fenced the producer: the fresh read must answer PRODUCER_FENCED
    (trusting the guess's answer, the fence is taken for a decision of its own)."""
    log.create_topic(TOPIC, 2)
    old = open_txn(log, "app", [(0, b"old-0")])
    txn_producer(Log(log.root), "app")  # a new instance, in another process's Log
    with pytest.raises(ProducerFencedError):
        log.coordinator.add_partitions(old._transactions.member(), [(TOPIC, 0)])
    assert b"old-0" not in log.read(TOPIC, 0).column("value").to_pylist()


def test_fencing_one_member_aborts_the_shared_transaction(log: Log) -> None:
    """A retried task's init_transactions aborts the shared transaction it was part of.

    txlog deviates from DESIGN.md on purpose here: there is one commit point,
    so aborting one member means aborting the decision; a later EndTxn(COMMIT)
    learns that the transaction was aborted.
    """
    log.create_topic(TOPIC, 3)
    _, members, _ = _shared(log, "job-4", 3)
    txn_producer(log, members[1].transactional_id)  # the retry of task 1
    with pytest.raises(DecisionConflictError, match="already stands as an ABORT") as info:
        log.coordinator.end_shared_transaction("job-4", members, commit=True)
    assert info.value.not_committed == [m.transactional_id for m in members]
    assert _visible(log) == set()
    assert log.abort_expired_transactions() == []
    for i in range(3):
        assert [m[2] for m in markers(log, i)] == [ABORT]


def test_end_shared_transaction_is_idempotent_and_order_insensitive(log: Log) -> None:
    """Spark may call commit then abort (or anything twice): the first decision stands.

    Repeats return the standing decision and write no further markers, and
    the member order does not matter.
    """
    log.create_topic(TOPIC, 3)
    _, members, values = _shared(log, "job-5", 3)
    first = log.coordinator.end_shared_transaction("job-5", members, commit=True)
    ends = [log.end_offset(TOPIC, p) for p in range(3)]
    again = Log(log.root).coordinator.end_shared_transaction("job-5", members[::-1],
                                                             commit=False)
    assert again.commit and again.members == first.members
    assert log.coordinator.end_shared_transaction("job-5", members, commit=True) == first
    assert [log.end_offset(TOPIC, p) for p in range(3)] == ends
    assert _visible(log) == set(values)

    _, members6, _ = _shared(log, "job-6", 2)
    aborted = log.coordinator.end_shared_transaction("job-6", members6[::-1], commit=False)
    assert not aborted.commit
    with pytest.raises(DecisionConflictError):  # a commit after the abort is told so
        log.coordinator.end_shared_transaction("job-6", members6, commit=True)
    assert log.coordinator.end_shared_transaction("job-6", members6, commit=False) == aborted
    assert _visible(log) == set(values)

    with pytest.raises(InvalidTxnStateError):  # a member of another decision
        log.coordinator.end_shared_transaction("job-6", members, commit=True)


# --- a killed producer ---------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    from txlog import Log
    log = Log(sys.argv[1])
    producer = log.producer(transactional_id="victim", transaction_timeout_ms=int(sys.argv[2]),
                            linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("events", b"victim-0", partition=0)
    producer.send("events", b"victim-1", partition=1)
    producer.flush()
    print("sent", flush=True)
    sys.stdin.read()  # hang here until killed
""")


def test_killed_producer_transaction_is_aborted_once_it_times_out(log: Log) -> None:
    """SIGKILL mid-transaction: the LSO stays stuck until the timeout, then advances.

    A committed record written after the victim's records is held back while
    the dead transaction is open, is released once a reader aborts the
    expired transaction, and the victim's records are never returned.
    """
    log.create_topic(TOPIC, 2)
    # The survivor below would abort the victim if it were already expired.
    child = subprocess.Popen([sys.executable, "-c", CHILD, log.root, "2500"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()  # blocks until the child has sent (or died)
        assert line.strip() == "sent", f"child failed: {line!r}"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=DEADLINE_S)
    assert child.returncode == -signal.SIGKILL

    survivor = txn_producer(log, "survivor")
    survivor.begin_transaction()
    survivor.send(TOPIC, b"survivor", partition=0)
    survivor.commit_transaction()
    assert log.last_stable_offset(TOPIC, 0) == 0 and log.last_stable_offset(TOPIC, 1) == 0
    assert committed_values(log, 0) == [] and all_values(log, 1) == [b"victim-1"]

    wait_expired(log, "victim")
    consumer = log.consumer(auto_offset_reset="earliest", abort_expired_transactions=True)
    consumer.assign([(TOPIC, 0), (TOPIC, 1)])
    got = []
    wait_until(lambda: got.extend(consumer.poll()) or
               all(consumer.position(TOPIC, p) == log.end_offset(TOPIC, p) for p in (0, 1)),
               "the consumer to read to the end of both partitions")
    assert [r.value for r in got] == [b"survivor"]
    for p in (0, 1):
        assert nothing_holds_the_lso(log, TOPIC, [p])
        assert [m[2] for m in markers(log, p) if m[0] != survivor.producer_id] == [ABORT]
    assert log.coordinator.metadata("victim").state == TxnState.COMPLETE_ABORT


def test_transactional_producer_misuse_is_refused(log: Log) -> None:
    """Calls out of order are IllegalState, and a transaction needs a transactional id."""
    log.create_topic(TOPIC, 1)
    producer = log.producer(transactional_id="careful")
    with pytest.raises(IllegalStateError):
        producer.begin_transaction()  # before init_transactions
    producer.init_transactions()
    with pytest.raises(IllegalStateError):
        producer.send(TOPIC, b"x", partition=0)  # outside a transaction
    with pytest.raises(IllegalStateError):
        producer.commit_transaction()
    producer.begin_transaction()
    with pytest.raises(IllegalStateError):
        producer.begin_transaction()
    with pytest.raises(IllegalStateError):
        log.producer().begin_transaction()

    # A batch the partition refuses makes the transaction abortable, never committable.
    bad = txn_producer(log, "careful-2")
    bad.begin_transaction()
    bad.send(TOPIC, b"ok", partition=0)
    bad._transactions.sequences[(TOPIC, 0)] = 5  # the next batch leaves a sequence gap
    with pytest.raises(OutOfOrderSequenceError):
        bad.send(TOPIC, b"gap", partition=0)
    with pytest.raises(OutOfOrderSequenceError):
        bad.commit_transaction()
    bad.abort_transaction()
    bad.flush()
    assert all_values(log, 0) == [b"ok"] and committed_values(log, 0) == []
    assert [m[2] for m in markers(log, 0)] == [ABORT]


# --- races between enders, fencers and aborters ---------------------------------------------


def test_commit_overtaken_by_a_new_instance_leaves_the_old_one_fenced(log: Log,
                                                                      monkeypatch) -> None:
    """EndTxn publishes COMMIT; before it finishes, a new instance inits (another process).

    The new instance rolls the commit forward and takes the id over.  The old
    producer's commit still succeeded (the decision stands) but it must come
    out of it fenced -- not holding the new instance's epoch, which would let
    two instances write as one.
    """
    log.create_topic(TOPIC, 2)
    old = open_txn(log, "race", [(0, b"committed-by-old")])
    coordinator = log.coordinator
    real_complete = coordinator.ender.complete
    successor = []

    def complete_after_takeover(txn_id, only_decision=None):
        if not successor:  # right after the decision: the new instance starts
            successor.append(txn_producer(Log(log.root), "race"))
        return real_complete(txn_id, only_decision)

    monkeypatch.setattr(coordinator.ender, "complete", complete_after_takeover)
    old.commit_transaction()
    old.flush()  # its roll-forward, where the new instance starts (behind the decision)
    monkeypatch.setattr(coordinator.ender, "complete", real_complete)
    new = successor[0]
    assert committed_values(log, 0) == [b"committed-by-old"]
    assert (old.producer_id, old.epoch) != (new.producer_id, new.epoch)

    with pytest.raises(ProducerFencedError):
        old.begin_transaction()
        old.send(TOPIC, b"zombie", partition=1)
        old.flush()
    new.begin_transaction()
    new.send(TOPIC, b"new", partition=1)
    new.commit_transaction()
    assert committed_values(log, 1) == [b"new"]


def test_stale_expiry_check_does_not_abort_the_next_transaction(log: Log, monkeypatch) -> None:
    """An aborter that saw transaction T1 expired must not abort its successor T2.

    Interleaving: the aborter reads T1 (expired); T1's producer commits it
    (its decision comes first) and starts T2; then the aborter acts.  Kafka's
    coordinator aborts a timed-out transaction only if the producer id and
    epoch still match; a young T2 must survive and commit.
    """
    log.create_topic(TOPIC, 1)
    producer = open_txn(log, "busy", [(0, b"t1")], transaction_timeout_ms=800)
    wait_expired(log, "busy")
    stale = log.coordinator.metadata("busy")
    producer.commit_transaction()  # T1 commits after all: its decision came first
    producer.begin_transaction()
    producer.send(TOPIC, b"t2", partition=0)
    producer.flush()

    aborter = Log(log.root).coordinator
    monkeypatch.setattr(aborter, "metadata", lambda txn_id: stale)  # what it had read
    assert aborter.abort_if_expired("busy") is False
    assert log.coordinator.metadata("busy").state == TxnState.ONGOING
    producer.commit_transaction()
    assert committed_values(log, 0) == [b"t1", b"t2"]


def test_commit_decision_beats_a_later_timeout_abort(log: Log) -> None:
    """Committer and aborter race on one decision object: whoever publishes first wins.

    Here the commit decision is published (the committer then stalls), the
    transaction expires, and the timeout sweep runs: it must roll the commit
    forward -- and not report the transaction as aborted.
    """
    log.create_topic(TOPIC, 2)
    producer = open_txn(log, "photo-finish", [(0, b"p0"), (1, b"p1")],
                        transaction_timeout_ms=800)
    meta = log.coordinator.metadata("photo-finish")
    log.coordinator.store.decide(meta.decision_id, True,
                                 [(producer.producer_id, producer.epoch)],
                                 "test: committer stalls after the decision")
    wait_expired(log, "photo-finish")
    assert log.abort_expired_transactions() == []
    assert log.coordinator.metadata("photo-finish").state == TxnState.COMPLETE_COMMIT
    for p in (0, 1):
        assert markers(log, p) == [(producer.producer_id, producer.epoch + 1, COMMIT)]
    assert committed_values(log, 0) == [b"p0"] and committed_values(log, 1) == [b"p1"]


def test_concurrent_init_producer_id_leaves_exactly_one_live_instance(log: Log) -> None:
    """Several processes start the same transactional id at once: one survives.

    Every instance gets a distinct (producer id, epoch); only the newest one
    can run a transaction, every other is fenced.
    """
    import threading

    log.create_topic(TOPIC, 1)
    instances = [Log(log.root).producer(transactional_id="herd", linger_ms=0)
                 for _ in range(4)]
    barrier = threading.Barrier(len(instances))
    errors = []

    def start(producer) -> None:
        barrier.wait()
        try:
            producer.init_transactions()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(p,)) for p in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert errors == [] and not any(t.is_alive() for t in threads)
    identities = [(p.producer_id, p.epoch) for p in instances]
    assert len(set(identities)) == len(instances)
    meta = log.coordinator.metadata("herd")
    live = [p for p in instances if (p.producer_id, p.epoch) == (meta.producer_id, meta.epoch)]
    assert len(live) == 1
    for p in instances:
        p.begin_transaction()
        if p is live[0]:
            p.send(TOPIC, b"winner", partition=0)
            p.commit_transaction()
        else:
            with pytest.raises(ProducerFencedError):
                p.send(TOPIC, b"loser", partition=0)
    assert committed_values(log, 0) == [b"winner"]


def test_commit_racing_the_timeout_sweep_has_one_consistent_outcome(log: Log) -> None:
    """A committer and a timeout-aborter in parallel: exactly one wins, everywhere.

    Whatever the interleaving, commit_transaction returns normally exactly
    when the records are committed in both partitions; otherwise it raises
    and no record is visible.  Nothing stays open.
    """
    import threading

    log.create_topic(TOPIC, 2)
    outcomes = set()
    for round_ in range(8):
        producer = open_txn(log, f"racer-{round_}", [(0, f"r{round_}".encode()),
                                                     (1, f"r{round_}".encode())],
                            transaction_timeout_ms=250)
        wait_expired(log, f"racer-{round_}")
        sweeper = Log(log.root)
        barrier = threading.Barrier(2)
        result = {}

        def commit() -> None:
            barrier.wait()
            try:
                producer.commit_transaction()
                result["commit"] = "ok"
            except (ProducerFencedError, TransactionAbortedError) as exc:
                result["commit"] = type(exc).__name__

        def sweep() -> None:
            barrier.wait()
            result["sweep"] = sweeper.abort_expired_transactions()

        threads = [threading.Thread(target=commit), threading.Thread(target=sweep)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE_S)
        value = f"r{round_}".encode()
        visible = [value in committed_values(log, p) for p in (0, 1)]
        assert visible in ([True, True], [False, False])
        assert (result["commit"] == "ok") == visible[0], result
        assert (f"racer-{round_}" in result["sweep"]) == (not visible[0]), result
        assert nothing_holds_the_lso(log, TOPIC, 2)
        outcomes.add(visible[0])
    print(f"outcomes seen: {sorted(outcomes)}")


def test_the_producer_state_table_allows_only_its_transitions(memlog: Log) -> None:
    from txlog.clients.transaction_manager import _TRANSITIONS, ClientState

    assert set(_TRANSITIONS) == set(ClientState)
    assert _TRANSITIONS[ClientState.CLOSED] == frozenset()  # closed is for good
    assert all(ClientState.CLOSED in to for state, to in _TRANSITIONS.items()
               if state is not ClientState.CLOSED)
    memlog.create_topic("t", 1)
    producer = memlog.producer(transactional_id="table")
    assert producer._transactions.state is ClientState.UNINITIALIZED
    producer.init_transactions()
    producer.begin_transaction()
    assert producer._transactions.state is ClientState.IN_TRANSACTION
    with pytest.raises(IllegalStateError, match="no transition from Ready to Prepared"):
        producer._transactions.state = ClientState.READY
        producer._transactions.transition(ClientState.PREPARED)
    producer._transactions.state = ClientState.IN_TRANSACTION
    producer.send("t", b"v", partition=0)
    producer.prepare_transaction()
    assert producer._transactions.state is ClientState.PREPARED
    with pytest.raises(IllegalStateError, match="init_transactions"):
        producer.begin_transaction()
    producer.close()
    assert producer._transactions.state is ClientState.CLOSED
