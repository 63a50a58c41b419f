"""Expired transactions are aborted by other producers writing to the partition.

Without a coordinator timer, a dead producer's open transaction would hold the
LSO back forever unless the processes that use the partition take over that
duty; this checks that an ordinary producer does.
"""

from __future__ import annotations

import time

import pytest
from helpers_core import wait_for

from txlog import Log, ProducerFencedError


def test_other_producer_aborts_expired_transaction(log: Log, monkeypatch) -> None:
    import txlog.producer as producer_module

    monkeypatch.setattr(producer_module, "EXPIRY_CHECK_INTERVAL_S", 0.0)
    log.create_topic("t", 1)
    stuck = log.producer(transactional_id="dead-one", transaction_timeout_ms=200)
    stuck.init_transactions()
    stuck.begin_transaction()
    stuck.send("t", b"never-visible", partition=0)
    stuck.flush()
    first = log.partition("t", 0).state().open_transactions()[0].first_offset
    assert log.last_stable_offset("t", 0) == first

    meta = log.coordinator.metadata("dead-one")
    assert meta is not None
    wait_for(lambda: time.time() * 1000 > meta.txn_start_ms + meta.timeout_ms, 5,
             "the transaction to expire")

    other = log.producer()  # plain idempotent producer of another id
    other.send("t", b"later", partition=0).get()

    assert log.coordinator.metadata("dead-one").state.value == "CompleteAbort"
    assert log.last_stable_offset("t", 0) == log.end_offset("t", 0)
    assert [v for v in log.read("t", 0).column("value").to_pylist()] == [b"later"]
    with pytest.raises(ProducerFencedError):
        stuck.commit_transaction()


def test_unexpired_transaction_is_left_alone(log: Log, monkeypatch) -> None:
    import txlog.producer as producer_module

    monkeypatch.setattr(producer_module, "EXPIRY_CHECK_INTERVAL_S", 0.0)
    log.create_topic("t", 1)
    busy = log.producer(transactional_id="busy", transaction_timeout_ms=600_000)
    busy.init_transactions()
    busy.begin_transaction()
    busy.send("t", b"pending", partition=0).get()
    log.producer().send("t", b"other", partition=0).get()
    assert log.coordinator.metadata("busy").state.value == "Ongoing"
    busy.commit_transaction()
    assert log.read("t", 0).column("value").to_pylist() == [b"pending", b"other"]
