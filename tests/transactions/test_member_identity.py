"""Who a producer is after its transaction ends, and what members of shared ones may do.

These pin down fixes found in review: a producer must never take over the
identity of a newer instance, and a member of a shared transaction must not be
able to commit (or go on) alone.
"""

from __future__ import annotations

import pytest

from txlog import IllegalStateError, Log, ProducerFencedError


def test_old_instance_never_adopts_newer_identity(log: Log, monkeypatch) -> None:
    """Another process finishes A's decided transaction and a new instance starts meanwhile."""
    log.create_topic("t", 1)
    a = log.producer(transactional_id="job")
    a.init_transactions()
    a.begin_transaction()
    a.send("t", b"a1", partition=0)
    a.flush()

    other = Log(log.root)
    original_complete = type(log.coordinator.ender).complete
    raced = {}

    def complete_after_race(self, transactional_id, only_decision=None):
        if not raced:
            raced["done"] = True
            other.coordinator.complete(transactional_id)  # roll forward elsewhere
            raced["new"] = other.coordinator.init_producer_id(transactional_id, 60_000)
        return original_complete(self, transactional_id, only_decision)

    monkeypatch.setattr(type(log.coordinator.ender), "complete", complete_after_race)
    a.commit_transaction()  # its decision stands: the records are committed
    a.flush()  # its roll-forward, where the race happens (behind the decision)
    assert log.read("t", 0).column("value").to_pylist() == [b"a1"]
    assert (a.producer_id, a.epoch) != raced["new"]
    with pytest.raises(ProducerFencedError):
        a.begin_transaction()
        a.send("t", b"zombie", partition=0)
        a.flush()
    assert log.read("t", 0, isolation_level="read_uncommitted").column(
        "value").to_pylist() == [b"a1"]


def test_shared_member_cannot_commit_alone(log: Log) -> None:
    log.create_topic("t", 2)
    members = []
    for i in range(2):
        p = log.producer(transactional_id=f"task-{i}")
        p.init_transactions()
        p.begin_transaction(decision_id="job-7")
        p.send("t", f"r{i}".encode(), partition=i)
        members.append(p)
    with pytest.raises(IllegalStateError, match="end_shared_transaction"):
        members[0].commit_transaction()
    handed = [p.prepare_transaction() for p in members]
    decision = log.coordinator.end_shared_transaction("job-7", handed, commit=True)
    assert decision.commit
    assert [log.read("t", i).column("value").to_pylist() for i in range(2)] == [[b"r0"], [b"r1"]]
    # A member is single-use: its id's epoch moved on when the coordinator ended it.
    with pytest.raises(IllegalStateError, match="init_transactions"):
        members[0].begin_transaction(decision_id="job-8")
    members[0].init_transactions()
    members[0].begin_transaction(decision_id="job-8")
    members[0].send("t", b"next", partition=0)
    log.coordinator.end_shared_transaction("job-8", [members[0].prepare_transaction()], True)
    assert log.read("t", 0).column("value").to_pylist() == [b"r0", b"next"]


def test_idempotent_producer_moves_to_a_new_id_after_ambiguous_storage_failure(
        log: Log, monkeypatch) -> None:
    """A batch whose publish outcome is unknown must not have its sequence reused.

    The producer stays usable under a fresh producer id (Kafka's epoch bump),
    so nothing it sends later can be mistaken for a duplicate of that batch.
    """
    from txlog import StorageError
    from txlog.storage.local import LocalStorage

    log.create_topic("t", 1)
    producer = log.producer(linger_ms=0)
    producer.send("t", b"ok", partition=0).get()
    first_id = producer.producer_id

    def broken(self, path, data):
        raise OSError("simulated: connection reset after sending the object")

    monkeypatch.setattr(LocalStorage, "publish_if_absent", broken)
    with pytest.raises(StorageError):
        producer.send("t", b"unknown-outcome", partition=0)
    monkeypatch.undo()
    md = producer.send("t", b"must-not-reuse-the-sequence", partition=0).get()
    assert producer.producer_id != first_id
    assert md.offset == 1
    assert log.read("t", 0).column("value").to_pylist() == [b"ok", b"must-not-reuse-the-sequence"]
