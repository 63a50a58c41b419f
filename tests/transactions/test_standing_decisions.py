"""Ending a shared transaction must never report as committed a member that the
standing decision does not commit.
"""

from __future__ import annotations

import pytest

from helpers_core import nothing_holds_the_lso
from txlog import DecisionConflictError, Log
from txlog.errors import InvalidTxnStateError


def _shared(log: Log, decision_id: str, prefix: str, n: int,
            send: bool = True) -> tuple[list, list[bytes]]:
    members, values = [], []
    for i in range(n):
        producer = log.producer(transactional_id=f"{prefix}-{i}", linger_ms=0)
        producer.init_transactions()
        producer.begin_transaction(decision_id=decision_id)
        value = f"{prefix}/{i}".encode()
        if send:
            producer.send("t", value, partition=i % 3)
        else:
            producer.send_offsets_to_transaction({("t", i % 3): 0}, f"{prefix}-group")
        values.append(value)
        members.append(producer.prepare_transaction())
    return members, values


def _visible(log: Log) -> set[bytes]:
    return {v for p in range(3) for v in log.read("t", p).column("value").to_pylist()}


def test_shared_commit_never_reports_members_the_decision_does_not_commit(log: Log) -> None:
    log.create_topic("t", 3)
    members, values = _shared(log, "job-x", "task", 3)
    first = log.coordinator.end_shared_transaction("job-x", members[:2], commit=True)
    assert first.commit
    # A driver retrying with the fuller message list must not hear "committed".
    with pytest.raises(DecisionConflictError) as info:
        log.coordinator.end_shared_transaction("job-x", members, commit=True)
    assert info.value.not_committed == [members[2].transactional_id]
    assert "job-x" in str(info.value) and members[2].transactional_id in str(info.value)
    assert members[0].transactional_id not in str(info.value)
    assert _visible(log) == set(values[:2])
    # Spark calls abort after a failed commit: the standing decision, unchanged.
    assert log.coordinator.end_shared_transaction("job-x", members, commit=False) == first

    # A later job re-using the decision id writes nothing: its transaction is decided
    # before it begins, so its first AddPartitionsToTxn is refused before it opens
    # anything (protocol.md 4.4; the partitions would refuse its data too, 2.6).
    later = log.producer(transactional_id="later-0", linger_ms=0)
    later.init_transactions()
    later.begin_transaction(decision_id="job-x")
    with pytest.raises(InvalidTxnStateError, match="job-x.*already decided"):
        later.send("t", b"later/0", partition=0).get()
    # Nor can it record group offsets under it (AddOffsetsToTxn joins the same way).
    with pytest.raises(InvalidTxnStateError, match="already decided"):
        _shared(log, "job-x", "silent", 1, send=False)
    assert _visible(log) == set(values[:2])
    # Their transactions were completed (aborted), so they hold no LSO back.
    assert nothing_holds_the_lso(log, "t", 3)


def test_commit_meeting_a_standing_abort_raises(log: Log) -> None:
    log.create_topic("t", 3)
    members, _ = _shared(log, "job-y", "task", 2)
    aborted = log.coordinator.end_shared_transaction("job-y", members, commit=False)
    assert not aborted.commit
    with pytest.raises(DecisionConflictError, match="job-y"):
        log.coordinator.end_shared_transaction("job-y", members, commit=True)
    assert log.coordinator.end_shared_transaction("job-y", members, commit=False) == aborted
    assert _visible(log) == set()
