"""Tests of txlog.exactly_once.id_pool, without Spark: pooled prefixes for jobs that name none.

Each job below is what Spark's batch writer does with no transactional.id.prefix:
lease a slot of the topic's pool, let its task attempts join under
``attempt_key(partition, attempt number)``, commit, free the slot.
"""

from __future__ import annotations

import pytest

from helpers_core import ManualClock, manual_clock, nothing_holds_the_lso
from txlog import READ_COMMITTED, READ_UNCOMMITTED, Log
from txlog.errors import ConcurrentTransactionsError, InvalidConfigError, TxlogError
from txlog.exactly_once.id_pool import PoolLease, start_pooled_job
from txlog.exactly_once.shared_transaction import SharedTransaction, attempt_key
from txlog.transactions.metadata import MAX_EPOCH, TxnState

T = "t"
BASE = "spark-t"
TIMEOUT_MS = 10_000


@pytest.fixture
def topic_log(memlog: Log) -> Log:
    memlog.create_topic(T, 3)
    return memlog


def attempt(job: SharedTransaction, log: Log, partition: int, number: int,
            values: list[str], prepare: bool = True):
    """Task ``partition``'s attempt ``number``: writes ``values``; prepared (its member
    returned) or left open (a killed attempt whose worker runs on: the producer)."""
    producer = job.join(log, attempt_key(partition, number))
    for v in values:
        producer.send(T, v.encode(), partition=partition)
    if not prepare:
        producer.flush()
        return producer
    member = producer.prepare_transaction()
    producer.close()
    return member


def run_job(log: Log, n: int, retried: bool = False, size: int = 4) -> None:
    """One job of three tasks; with ``retried``, task 1's first attempt fails after writing
    and its retry (attempt 1) is the member."""
    job, lease = start_pooled_job(log, BASE, size, TIMEOUT_MS)
    members = [attempt(job, log, 0, 0, [f"{n}a"]), attempt(job, log, 2, 0, [f"{n}c"])]
    if retried:
        attempt(job, log, 1, 0, [f"{n}lost"], prepare=False).close()
        members.append(attempt(job, log, 1, 1, [f"{n}b"]))
    else:
        members.append(attempt(job, log, 1, 0, [f"{n}b"]))
    job.commit(log, members)
    lease.release(log.services)


def visible(log: Log, partition: int, isolation: str = READ_COMMITTED) -> list[str]:
    table = log.read(T, partition, 0, None, isolation)
    return [v.decode() for v in table.column("value").to_pylist()]


def pooled_ids(log: Log) -> list[str]:
    return [t for t in log.coordinator.transactional_ids() if t.startswith(f"{BASE}.pool-")]


def producer_entries(log: Log) -> int:
    return sum(len(log.partition(T, p).state().producers) for p in range(3))


def test_ids_and_producers_stay_bounded_over_many_jobs_with_retries(topic_log: Log) -> None:
    """Jobs one after another take the same slot and the same ids: InitProducerId bumps
    the epoch of each id's producer, so neither chains nor producer-state entries grow
    with the jobs, retries and gc included.  Fails with gc deleting the re-used ids'
    chains (a new producer id for every job after a gc)."""
    log = topic_log
    for n in range(24):
        run_job(log, n, retried=n % 3 == 1)
        if n % 4 == 3:
            log.gc(chain_age_s=0, decision_age_s=0, temp_age_s=0, data_age_s=0)
        if n == 7:
            ids, entries = sorted(pooled_ids(log)), producer_entries(log)
    assert sorted(pooled_ids(log)) == ids == [f"{BASE}.pool-0-{attempt_key(p, a)}"
                                              for p, a in ((0, 0), (1, 0), (1, 1), (2, 0))]
    assert producer_entries(log) == entries == 4
    assert [visible(log, p)[-1] for p in range(3)] == ["23a", "23b", "23c"]
    assert all(len(visible(log, p)) == 24 for p in range(3))
    assert all(log.coordinator.metadata(t).state in (TxnState.COMPLETE_COMMIT,
                                                     TxnState.COMPLETE_ABORT)
               for t in ids)


def test_two_concurrent_jobs_on_one_topic_both_commit(topic_log: Log) -> None:
    """A second job started while the first runs takes the next slot: no id is shared,
    and neither ends the other's transactions.  Fails if a job could take a slot its
    holder still needs (both on slot 0: the second aborts the first)."""
    log = topic_log
    first, first_lease = start_pooled_job(log, BASE, 4, TIMEOUT_MS)
    a = attempt(first, log, 0, 0, ["first"])
    second, second_lease = start_pooled_job(log, BASE, 4, TIMEOUT_MS)
    assert (first_lease.slot, second_lease.slot) == (0, 1)
    b = attempt(second, log, 0, 0, ["second"])
    second.commit(log, [b])
    first.commit(log, [a])
    assert sorted(visible(log, 0)) == ["first", "second"]
    for lease in (first_lease, second_lease):
        lease.release(log.services)
    assert start_pooled_job(log, BASE, 4, TIMEOUT_MS)[1].slot == 0  # both freed


def test_a_full_pool_refuses_the_next_job_naming_the_option(topic_log: Log) -> None:
    log = topic_log
    start_pooled_job(log, BASE, 2, TIMEOUT_MS)
    start_pooled_job(log, BASE, 2, TIMEOUT_MS)
    with pytest.raises(ConcurrentTransactionsError, match="transactionalIdPoolSize"):
        start_pooled_job(log, BASE, 2, TIMEOUT_MS)
    with pytest.raises(InvalidConfigError, match="transactionalIdPoolSize"):
        start_pooled_job(log, BASE, 0, TIMEOUT_MS)


def test_a_killed_attempts_zombie_is_fenced_by_its_retry_and_the_next_job_on_the_slot(
        topic_log: Log) -> None:
    """Task 0's attempt 0 is killed after writing; its worker runs on.  The retry
    (attempt 1, same slot) commits; the zombie's next send fails.  The next job on the
    slot re-uses the zombie's id: its InitProducerId bumps the epoch of the same
    producer and the zombie stays fenced.  Each record is read once."""
    log = topic_log
    job, lease = start_pooled_job(log, BASE, 4, TIMEOUT_MS)
    zombie = attempt(job, log, 0, 0, ["x"], prepare=False)
    job.commit(log, [attempt(job, log, 0, 1, ["x"])])
    lease.release(log.services)
    with pytest.raises(TxlogError):
        zombie.send(T, b"late", partition=0)
        zombie.flush()
    tid = f"{BASE}.pool-0-{attempt_key(0, 0)}"
    before = log.coordinator.metadata(tid)
    again, again_lease = start_pooled_job(log, BASE, 4, TIMEOUT_MS)
    assert again_lease.slot == 0
    producer = again.join(log, attempt_key(0, 0))
    assert producer.producer_id == before.producer_id and producer.epoch > before.epoch
    producer.send(T, b"y", partition=0)
    again.commit(log, [producer.prepare_transaction()])
    producer.close()
    with pytest.raises(TxlogError):
        zombie.send(T, b"later", partition=0)
        zombie.flush()
    zombie.close()
    assert visible(log, 0) == ["x", "y"]
    assert "late" not in visible(log, 0, READ_UNCOMMITTED)
    assert "later" not in visible(log, 0, READ_UNCOMMITTED)


def test_a_dead_drivers_slot_is_taken_after_its_timeout_and_its_job_ended(
        topic_log: Log, monkeypatch) -> None:
    """A driver died holding slot 0 with an attempt open.  Within the timeout the next
    job takes slot 1 (the dead one might be alive); past it, slot 0 again, and its start
    aborts what the dead job left open.  Fails if a stale holder were never passed
    (slot 0 stays taken) or if a live one were (the second job takes slot 0 at once)."""
    clock: ManualClock = manual_clock(monkeypatch)
    log = topic_log
    dead, _ = start_pooled_job(log, BASE, 4, TIMEOUT_MS)
    attempt(dead, log, 2, 0, ["dead"], prepare=False).close()
    clock.now_ms += TIMEOUT_MS // 2
    live, live_lease = start_pooled_job(log, BASE, 4, TIMEOUT_MS)
    assert live_lease.slot == 1
    clock.now_ms += TIMEOUT_MS
    later, later_lease = start_pooled_job(log, BASE, 4, TIMEOUT_MS)
    assert later_lease.slot == 0
    assert nothing_holds_the_lso(log, T, [2])  # the dead job's attempt ended
    later.commit(log, [attempt(later, log, 2, 0, ["later"])])
    assert visible(log, 2) == ["later"]


def test_a_lease_releases_only_its_own_job(topic_log: Log) -> None:
    log = topic_log
    job, lease = start_pooled_job(log, BASE, 1, TIMEOUT_MS)
    job.abort(log, [])  # decided: the slot is over, another job may take it
    taker, taker_lease = start_pooled_job(log, BASE, 1, TIMEOUT_MS)
    lease.release(log.services)  # the first job's late release leaves the new holder alone
    with pytest.raises(ConcurrentTransactionsError):
        start_pooled_job(log, BASE, 1, TIMEOUT_MS)
    assert isinstance(taker_lease, PoolLease) and taker_lease.slot == 0


def test_an_exhausted_epoch_takes_a_new_producer_id_and_is_counted(topic_log: Log) -> None:
    """Kafka's rule: an identity at the last epoch continues under a new producer id."""
    log = topic_log
    run_job(log, 0)
    tid = f"{BASE}.pool-0-{attempt_key(0, 0)}"
    store = log.coordinator.store
    log.coordinator.complete(tid)  # the commit returned at its decision: finish it first
    version, meta = store.latest(tid)
    assert store.publish(version + 1, meta.bumped(meta.producer_id, MAX_EPOCH - 1, "test"))
    counted = store.epochs_exhausted
    job, lease = start_pooled_job(log, BASE, 4, TIMEOUT_MS)
    producer = job.join(log, attempt_key(0, 0))
    assert producer.producer_id != meta.producer_id and producer.epoch == 0
    assert store.epochs_exhausted == counted + 1
    producer.send(T, b"after", partition=0)
    job.commit(log, [producer.prepare_transaction()])
    producer.close()
    assert visible(log, 0) == ["0a", "after"]
