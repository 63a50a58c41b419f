"""The transaction manager on its own: the state table, sequences, the fatal error and
the coordinator calls, against a memory:// log's services (no producer around it)."""

from __future__ import annotations

import time
import uuid

import pytest

import txlog.clients.transaction_manager as transaction_manager_module
from txlog import Log
from txlog.clients.transaction_manager import _TRANSITIONS, ClientState, TransactionManager
from txlog.errors import IllegalStateError, ProducerFencedError, TransactionAbortedError
from txlog.format.batch import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from txlog.transactions.metadata import TxnState

TP = ("t", 0)


@pytest.fixture
def services():  # type: ignore[no-untyped-def]
    log = Log(f"memory://{uuid.uuid4().hex}")
    log.create_topic("t", 2)
    return log.services


def transactional(services, txn_id: str = "tx") -> TransactionManager:  # type: ignore[no-untyped-def]
    manager = TransactionManager(services, txn_id, 60_000, True)
    manager.init_transactions()
    return manager


def test_the_table_allows_exactly_its_transitions(services) -> None:  # type: ignore[no-untyped-def]
    assert set(_TRANSITIONS) == set(ClientState)
    manager = TransactionManager(services, "tx", 60_000, True)
    moves = 0
    for before in ClientState:
        for after in ClientState:
            manager.state = before
            if after in _TRANSITIONS[before]:
                manager.transition(after)
                assert manager.state is after
                moves += 1
            else:
                with pytest.raises(IllegalStateError, match=f"no transition from "
                                                            f"{before.value} to {after.value}"):
                    manager.transition(after)
                assert manager.state is before
    assert moves == sum(len(to) for to in _TRANSITIONS.values())
    manager.state = ClientState.READY
    manager.close()
    with pytest.raises(IllegalStateError, match="closed"):
        manager.check_usable()


def test_an_idempotent_manager_has_an_id_a_transactional_one_waits_for_init(services) -> None:  # type: ignore[no-untyped-def]
    plain = TransactionManager(services, None, 60_000, True)
    assert plain.state is ClientState.READY and plain.producer_id >= 0 and plain.epoch == 0
    other = TransactionManager(services, None, 60_000, True)
    assert other.producer_id != plain.producer_id
    none = TransactionManager(services, None, 60_000, False)
    assert (none.producer_id, none.epoch) == (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    waiting = TransactionManager(services, "tx", 60_000, True)
    assert waiting.state is ClientState.UNINITIALIZED
    with pytest.raises(IllegalStateError, match="call init_transactions"):
        waiting.check_can_send("send()")
    waiting.init_transactions()
    assert waiting.state is ClientState.READY and waiting.producer_id >= 0
    with pytest.raises(IllegalStateError, match="outside a transaction"):
        waiting.check_can_send("send()")
    with pytest.raises(IllegalStateError, match="no transactional_id"):
        plain.begin(None)


def test_sequences_advance_per_partition_and_wrap(services) -> None:  # type: ignore[no-untyped-def]
    manager = TransactionManager(services, None, 60_000, True)
    assert manager.take_sequence(TP, 3) == 0
    assert manager.take_sequence(TP, 2) == 3
    assert manager.take_sequence(("t", 1), 4) == 0
    assert manager.take_sequence(TP, 1) == 5
    manager.sequences[TP] = 0x7FFFFFFF - 1
    assert manager.take_sequence(TP, 3) == 0x7FFFFFFF - 1
    assert manager.take_sequence(TP, 1) == 1  # wrapped, as Kafka's sequences do


def test_a_definitive_rejection_rolls_the_sequence_back(services) -> None:  # type: ignore[no-untyped-def]
    manager = TransactionManager(services, None, 60_000, True)
    manager.take_sequence(TP, 5)
    rejected = manager.take_sequence(TP, 5)
    manager.take_sequence(TP, 5)  # staged after it: it did not land either
    manager.rewind(TP, rejected)
    assert manager.take_sequence(TP, 1) == rejected
    manager.rewind(("t", 1), 7)  # no batch of this partition: nothing to roll back
    assert ("t", 1) not in manager.sequences


def test_an_unknown_outcome_takes_a_new_id_before_the_next_batch(services) -> None:  # type: ignore[no-untyped-def]
    manager = TransactionManager(services, None, 60_000, True)
    manager.take_sequence(TP, 5)
    first_id = manager.producer_id
    manager.outcome_unknown()
    manager.rewind(TP, 0)  # the batch may have landed: its sequence is never reused
    assert manager.needs_new_id and manager.sequences == {}
    manager.renew_id()
    assert manager.producer_id != first_id and manager.epoch == 0
    assert not manager.needs_new_id
    assert manager.take_sequence(TP, 1) == 0


def test_a_fatal_error_poisons_until_init(services) -> None:  # type: ignore[no-untyped-def]
    manager = transactional(services)
    manager.begin(None)
    error = TransactionAbortedError("a batch failed")
    manager.poison(error)
    for check in (manager.check_usable, lambda: manager.check_can_send("send()"),
                  lambda: manager.check_in_transaction("x"), manager.check_can_commit):
        with pytest.raises(TransactionAbortedError) as raised:
            check()
        assert raised.value is error
    manager.check_can_abort()  # only a fence stops an abort
    manager.abort()
    assert manager.fatal is None and manager.state is ClientState.READY
    manager.poison(error)
    manager.init_transactions()
    manager.check_usable()


def test_joining_and_ending_go_through_the_coordinator(services) -> None:  # type: ignore[no-untyped-def]
    manager = transactional(services)
    pid, epoch = manager.producer_id, manager.epoch
    manager.begin(None)
    assert manager.decision_id == manager.plain_decision_id()
    assert manager.new_partitions([TP, ("t", 1)]) == [TP, ("t", 1)]
    manager.add_partitions([TP])  # sent from a thread, settled before any write
    assert manager.new_partitions([TP, ("t", 1)]) == [("t", 1)]
    manager.settle_joins()
    meta = services.coordinator.metadata("tx")
    assert meta.state == TxnState.ONGOING and meta.partitions == (TP,)
    manager.take_sequence(TP, 1)
    manager.end(commit=True)
    assert manager.state is ClientState.READY and manager.sequences == {}
    assert (manager.producer_id, manager.epoch) == (pid, epoch + 1)  # a marker closed the epoch
    assert manager.settle_completion()  # the roll-forward behind the decision
    assert services.coordinator.metadata("tx").state == TxnState.COMPLETE_COMMIT
    manager.begin(None)
    manager.end(commit=False)  # nothing joined: nothing to decide, the epoch stays
    assert manager.epoch == epoch + 1
    plain = TransactionManager(services, None, 60_000, True)
    assert plain.new_partitions([TP]) == []  # no transaction to join


def test_a_newer_instance_fences_the_older_one(services) -> None:  # type: ignore[no-untyped-def]
    old = transactional(services)
    old.begin(None)
    transactional(services)  # InitProducerId again: the old epoch is fenced
    old.add_partitions([TP])
    with pytest.raises(ProducerFencedError):  # learnt where the join is settled
        old.settle_joins()
    assert isinstance(old.fatal, ProducerFencedError)
    with pytest.raises(ProducerFencedError):
        old.check_can_abort()


def test_a_shared_transaction_cannot_be_committed_by_one_member(services) -> None:  # type: ignore[no-untyped-def]
    manager = transactional(services)
    manager.begin("job-1")
    with pytest.raises(IllegalStateError, match="member of shared transaction 'job-1'"):
        manager.check_can_commit()
    member = manager.prepare()
    assert manager.state is ClientState.PREPARED
    assert (member.transactional_id, member.decision_id) == ("tx", "job-1")
    with pytest.raises(IllegalStateError, match="init_transactions"):
        manager.begin(None)


def test_the_expiry_sweep_runs_at_most_once_an_interval(services, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    manager = TransactionManager(services, None, 60_000, True)
    swept: list[tuple[str, int]] = []
    real = services.coordinator.abort_expired_in

    def counting(topic, partition, **kwargs):  # type: ignore[no-untyped-def]
        swept.append((topic, partition))
        assert kwargs["own"] == (manager.producer_id, manager.epoch)
        return real(topic, partition, **kwargs)

    monkeypatch.setattr(services.coordinator, "abort_expired_in", counting)
    # Longer than the test, shorter than the monotonic clock's reading (a partition never
    # swept counts as swept at 0).
    monkeypatch.setattr(transaction_manager_module, "EXPIRY_CHECK_INTERVAL_S",
                        time.monotonic() / 2)
    for _ in range(3):
        manager.abort_expired_in(TP)
    manager.abort_expired_in(("t", 1))
    assert swept == [TP, ("t", 1)]
    monkeypatch.setattr(transaction_manager_module, "EXPIRY_CHECK_INTERVAL_S", 0.0)
    manager.abort_expired_in(TP)
    assert swept == [TP, ("t", 1), TP]
