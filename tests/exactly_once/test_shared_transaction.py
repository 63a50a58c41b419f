"""Tests of txlog.exactly_once.shared_transaction.SharedTransaction and decision leases, without Spark.

A shared transaction is what makes a Spark job exactly once: many producers
(tasks) join one decision, and whoever ends the job commits exactly the
members it was handed.  These tests drive that protocol directly, with a
controllable clock for the timeout rules, so each side of the lease rule is
checked deterministically.
"""

from __future__ import annotations

import pytest

import txlog.exactly_once.shared_transaction as shared_module
from helpers_core import CountingStorage, ManualClock, manual_clock, nothing_holds_the_lso, wait_for
from txlog import READ_COMMITTED, READ_UNCOMMITTED, Log
from txlog.errors import (CommittedButIncompleteError, DecisionConflictError,
                          TransactionAbortedError, TxlogError)
from txlog.exactly_once.shared_transaction import MAX_PREFIX_LENGTH, SharedTransaction, check_prefix
from txlog.storage.paths import (partition_count_path, topic_config_path, topic_dir,
                                 topic_meta_path)
from txlog.storage.schemes import open_storage
from txlog.transactions.metadata import TxnState

T = "t"
TIMEOUT_MS = 10_000


@pytest.fixture
def clock(monkeypatch) -> ManualClock:
    return manual_clock(monkeypatch)


@pytest.fixture
def topic_log(memlog: Log) -> Log:
    memlog.create_topic(T, 3)
    return memlog


def write(job: SharedTransaction, log: Log, key: str, partition: int, values: list[str]):
    """One participant: join, write ``values`` to ``partition``, prepare; returns its member."""
    producer = job.join(log, key)
    for v in values:
        producer.send(T, v.encode(), partition=partition)
    member = producer.prepare_transaction()
    producer.close()
    return member


def join_and_write(job: SharedTransaction, log: Log, key: str, partition: int,
                   values: list[str]):
    """A participant that wrote but never prepared (a task killed mid-write): still open."""
    producer = job.join(log, key)
    for v in values:
        producer.send(T, v.encode(), partition=partition)
    producer.flush()
    return producer


def visible(log: Log, partition: int, isolation: str = READ_COMMITTED) -> list[str]:
    table = log.read(T, partition, 0, None, isolation)
    return [v.decode() for v in table.column("value").to_pylist()]


def stable_everywhere(log: Log) -> bool:
    """No partition's LSO is held back by an open transaction."""
    return nothing_holds_the_lso(log, T, 3)


def ongoing(log: Log, prefix: str) -> list[str]:
    return [t for t in log.coordinator.transactional_ids()
            if t.startswith(prefix) and log.coordinator.metadata(t).state == TxnState.ONGOING]


# --- commit, abort, orphans -----------------------------------------------------------------


def test_commit_makes_every_member_visible_at_once_and_ends_orphans(topic_log: Log) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    m0 = write(job, log, "0-0", 0, ["a0", "a1"])
    m1 = write(job, log, "1-0", 1, ["b0"])
    # A failed first attempt of task 2 (its message never reached the driver) and its
    # successful retry: only the retry is a member.
    orphan = join_and_write(job, log, "2-0", 2, ["lost"])
    m2 = write(job, log, "2-1", 2, ["c0", "c1", "c2"])

    for p in range(3):
        assert visible(log, p) == []  # nothing before the decision
    assert visible(log, 2, READ_UNCOMMITTED) == ["lost", "c0", "c1", "c2"]

    decision = job.commit(log, [m0, m1, m2])
    assert decision.commit
    assert visible(log, 0) == ["a0", "a1"]
    assert visible(log, 1) == ["b0"]
    assert visible(log, 2) == ["c0", "c1", "c2"]
    assert "job-2-0" not in ongoing(log, "job-")  # the orphan ended before commit returned
    assert stable_everywhere(log)
    assert job.wait_completed()  # the members' roll-forward, behind the decision
    assert ongoing(log, "job-") == []
    orphan.close()


def test_an_orphan_another_process_is_rolling_forward_is_marked_before_the_end_returns(
        topic_log: Log) -> None:
    """A partition's sweep in another process took the orphan to PrepareAbort and had not
    written its markers yet when the job ended.  The end must finish it rather than pass
    it by: else the orphan, still running, flushes into a partition that knows its
    producer at the epoch before and its batch lands after its job ended (seen in
    expiry_kill_harness.py --shared, where attempt ids are re-used as Spark's are)."""
    from txlog.errors import InvalidTxnStateError, ProducerFencedError

    log = topic_log
    first = SharedTransaction.start(log, "job", TIMEOUT_MS)
    first.commit(log, [write(first, log, "z", 1, ["old"])])  # partition 1 knows z's producer
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    member = write(job, log, "0", 0, ["a"])
    orphan = job.join(log, "z", linger_ms=10**9)
    orphan.send(T, b"x", partition=0)
    orphan.flush()
    orphan.send(T, b"late", partition=1)  # joined partition 1; waits in the buffer
    orphan._transactions.settle_joins()  # the join is sent from a thread: let it land first
    log.coordinator.end_shared_transaction(job.decision_id, [member], True)
    other = Log(log.storage)  # the sweep: PrepareAbort published, no marker yet
    txn_id = orphan.transactional_id
    version, meta = other.coordinator.store.latest(txn_id)
    assert meta.state == TxnState.ONGOING and meta.decision_id == job.decision_id
    assert other.coordinator.store.publish(version + 1, meta.transition(TxnState.PREPARE_ABORT))
    job.end_orphans(log)
    with pytest.raises((ProducerFencedError, InvalidTxnStateError)):
        orphan.flush()
    assert "late" not in visible(log, 1, READ_UNCOMMITTED)
    assert visible(log, 0) == ["a"] and visible(log, 1) == ["old"]


def test_commit_abort_and_commit_again_are_safe_in_any_order(topic_log: Log) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    members = [write(job, log, "0-0", 0, ["a"]), write(job, log, "1-0", 1, ["b"])]
    job.commit(log, members)
    job.commit(log, members)  # a retried commit is answered by the standing decision
    assert job.abort(log, members).commit  # Spark may call abort after commit: no-op
    assert visible(log, 0) == ["a"] and visible(log, 1) == ["b"]


def test_commit_after_abort_raises_and_leaves_nothing_visible(topic_log: Log) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    members = [write(job, log, "0-0", 0, ["a"]), write(job, log, "1-0", 1, ["b"])]
    assert not job.abort(log, members).commit
    with pytest.raises(DecisionConflictError, match="already stands as an ABORT"):
        job.commit(log, members)
    assert visible(log, 0) == [] and visible(log, 1) == []
    assert visible(log, 0, READ_UNCOMMITTED) == ["a"]
    assert stable_everywhere(log)


def test_commit_of_fewer_members_then_of_more_refuses_the_late_member(topic_log: Log) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    m0 = write(job, log, "0-0", 0, ["a"])
    m1 = write(job, log, "1-0", 1, ["b"])
    job.commit(log, [m0])
    with pytest.raises(DecisionConflictError, match="1-0"):
        job.commit(log, [m0, m1])
    assert visible(log, 0) == ["a"] and visible(log, 1) == []
    assert stable_everywhere(log)


def test_next_job_of_a_prefix_ends_what_a_dead_job_left_open(topic_log: Log) -> None:
    log = topic_log
    dead = SharedTransaction.start(log, "etl", TIMEOUT_MS)
    write(dead, log, "0-0", 0, ["old-prepared"])  # prepared, but the driver died
    join_and_write(dead, log, "1-0", 1, ["old-open"])  # still writing when it died
    other = SharedTransaction.start(log, "other", TIMEOUT_MS)
    kept = join_and_write(other, log, "0-0", 2, ["other-open"])
    assert sorted(ongoing(log, "etl-")) == ["etl-0-0", "etl-1-0"]
    assert not stable_everywhere(log)

    job = SharedTransaction.start(log, "etl", TIMEOUT_MS)
    assert ongoing(log, "etl-") == []
    assert ongoing(log, "other-") == ["other-0-0"]  # another prefix is not touched
    assert nothing_holds_the_lso(log, T, 2)

    job.commit(log, [write(job, log, "0-0", 0, ["new"])])
    assert visible(log, 0) == ["new"]
    assert visible(log, 1) == []
    kept.close()


def test_a_prefix_never_ends_the_open_transactions_of_a_longer_prefix(topic_log: Log) -> None:
    """Prefix "etl" must not take "etl-2-..." (a job of prefix "etl-2") for its own."""
    log = topic_log
    other = SharedTransaction.start(log, "etl-2", TIMEOUT_MS)
    running = write(other, log, "0-0", 0, ["other"])
    dotted = SharedTransaction.start(log, "etl.2", TIMEOUT_MS)
    running_dotted = write(dotted, log, "0-0", 1, ["dotted"])
    SharedTransaction.start(log, "etl", TIMEOUT_MS)
    assert ongoing(log, "etl-2-") == ["etl-2-0-0"]
    other.commit(log, [running])
    dotted.commit(log, [running_dotted])
    assert visible(log, 0) == ["other"] and visible(log, 1) == ["dotted"]


def test_dead_jobs_decision_is_an_abort_so_its_late_commit_fails(topic_log: Log) -> None:
    log = topic_log
    dead = SharedTransaction.start(log, "etl", TIMEOUT_MS)
    member = write(dead, log, "0-0", 0, ["old"])
    SharedTransaction.start(log, "etl", TIMEOUT_MS)
    # The "dead" driver was only slow: its commit must not report success.
    with pytest.raises(TransactionAbortedError):
        dead.commit(log, [member])
    assert visible(log, 0) == []


@pytest.mark.parametrize("prefix, problem", [
    ("", "transactional.id.prefix"),
    ("has space", "transactional.id.prefix"),
    ("a/b", "transactional.id.prefix"),
    ("x" * (MAX_PREFIX_LENGTH + 1), f"at most {MAX_PREFIX_LENGTH}"),
])
def test_bad_prefixes_are_refused_naming_the_option(memlog: Log, prefix: str,
                                                    problem: str) -> None:
    with pytest.raises(TxlogError, match=problem):
        SharedTransaction.start(memlog, prefix, TIMEOUT_MS)
    assert memlog.coordinator.transactional_ids() == []


def test_longest_prefix_fits_in_batch_headers(topic_log: Log) -> None:
    prefix = check_prefix("p" * MAX_PREFIX_LENGTH)
    job = SharedTransaction.start(topic_log, prefix, TIMEOUT_MS)
    job.commit(topic_log, [write(job, topic_log, "123-4", 0, ["v"])])
    assert visible(topic_log, 0) == ["v"]


# --- the lease rule -------------------------------------------------------------------------


def test_lease_keeps_an_early_prepared_member_alive_past_its_timeout(topic_log: Log,
                                                                     clock: ManualClock) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "long", TIMEOUT_MS)
    early = write(job, log, "0-0", 0, ["early"])
    for _ in range(5):  # the rest of the job runs for 5 timeouts, renewing the lease
        clock.now_ms += TIMEOUT_MS - 1
        log.coordinator.renew_lease(job.decision_id)
        assert log.coordinator.abort_expired() == []
        assert log.coordinator.abort_expired_in(T, 0) == []
    late = write(job, log, "1-0", 1, ["late"])
    job.commit(log, [early, late])
    assert visible(log, 0) == ["early"] and visible(log, 1) == ["late"]


def test_keep_alive_leaves_a_fresh_lease_and_renews_a_stale_one(topic_log: Log,
                                                                clock: ManualClock) -> None:
    """protocol.md 5, the lease: a task entering keep_alive within a quarter of the timeout
    of the last renewal publishes nothing (its first renewal comes a quarter after that
    renewal); past a quarter it renews at once, so the lease never ages past half."""
    log = topic_log
    timeout_ms = 600_000  # a quarter is 150 s of real time: the renewal thread stays idle
    job = SharedTransaction.start(log, "lease", timeout_ms)
    started_ms = log.coordinator.lease_ms(job.decision_id)
    clock.now_ms += 1_000
    with job.keep_alive(log):
        assert log.coordinator.lease_ms(job.decision_id) == started_ms
    assert log.coordinator.store.lease(job.decision_id).latest()[0] == 0  # nothing published
    # Found a millisecond short of a quarter old: renewed a millisecond later, by the
    # renewal thread (not a quarter later, which would let the lease age past half).
    clock.now_ms = started_ms + timeout_ms // 4 - 1
    with job.keep_alive(log):
        wait_for(lambda: log.coordinator.lease_ms(job.decision_id) == clock.now_ms,
                 timeout=10, what="the first renewal")
    clock.now_ms += timeout_ms // 4
    with job.keep_alive(log):
        assert log.coordinator.lease_ms(job.decision_id) == clock.now_ms


def test_a_task_starting_soon_after_the_driver_reads_no_lease(topic_log: Log,
                                                              clock: ManualClock) -> None:
    """The driver's renewal travels with the job: a task within a quarter of the timeout
    of it knows the lease is fresh without its LIST and GET; a later one, or a job whose
    driver renewed nothing (a stream's batch), reads it as before."""
    log = topic_log
    job = SharedTransaction.start(log, "lease", 600_000)
    assert job.lease_ms == log.coordinator.lease_ms(job.decision_id)
    reads = []
    renew = log.coordinator.renew_lease
    log.coordinator.renew_lease = lambda *a, **k: reads.append(a) or renew(*a, **k)
    clock.now_ms += 1_000
    with job.keep_alive(log):
        pass
    assert reads == []
    clock.now_ms += 150_000  # a quarter since the driver's renewal
    with job.keep_alive(log):
        pass
    assert len(reads) == 1
    unleased = SharedTransaction(job.prefix, job.decision_id, job.timeout_ms)
    with unleased.keep_alive(log):
        pass
    assert len(reads) == 2


def _task_log(driver: Log) -> tuple[Log, CountingStorage]:
    """A task's own Log of the driver's root (another process's, as far as caches go)."""
    storage = CountingStorage(open_storage(driver.root))
    return Log(storage), storage


def _description_reads(storage: CountingStorage) -> list[tuple[str, str]]:
    looked_up = (topic_meta_path(T), partition_count_path(T), topic_config_path(T))
    return [(m, p) for m, p in storage.calls
            if p.startswith(looked_up) or (m, p) == ("list", topic_dir(T))]


def test_a_task_takes_the_topic_descriptions_its_driver_read(topic_log: Log) -> None:
    """The driver's descriptions travel with the job: a task lists nothing of the topic
    and reads topic.json only for its appends' checks (protocol.md 1.6), where a task of
    a job without them first describes the topic itself: its directory listed (naming no
    chain, so no chain is listed, 1.8) and topic.json read (each task writes an empty
    partition, whose checks are alike)."""
    driver = topic_log
    plain = SharedTransaction.start(driver, "plain", TIMEOUT_MS)
    described = SharedTransaction.start(driver, "described", TIMEOUT_MS).describing(driver, [T])
    assert described.topics == (driver.describe_topic(T),)
    reads = {}
    for partition, job in enumerate((plain, described), start=1):
        log, storage = _task_log(driver)
        job.commit(driver, [write(job, log, "0", partition, [job.prefix])])
        reads[job.prefix] = _description_reads(storage)
    assert ("list", topic_dir(T)) in reads["plain"], reads
    assert set(reads["described"]) == {("read", topic_meta_path(T))}, reads
    assert len(reads["described"]) == reads["plain"].count(("read", topic_meta_path(T))) - 1
    assert visible(driver, 1) == ["plain"] and visible(driver, 2) == ["described"]


def test_a_description_from_the_driver_never_writes_into_the_topic_created_anew(
        topic_log: Log) -> None:
    """The topic deleted and created again between the driver's description and the
    task: the task's partitions are bound to the described topic id, which the check
    before its publish finds gone, so nothing reaches the new topic."""
    driver = topic_log
    job = SharedTransaction.start(driver, "job", TIMEOUT_MS).describing(driver, [T])
    driver.delete_topic(T)
    driver.create_topic(T, 3)
    log, _ = _task_log(driver)
    with pytest.raises(TxlogError, match="deleted"):
        write(job, log, "0", 1, ["stale"])
    assert all(driver.read(T, p, 0, None, READ_UNCOMMITTED).num_rows == 0 for p in range(3))


def test_a_partition_added_since_the_driver_described_the_topic_is_written(
        topic_log: Log) -> None:
    """As a Kafka producer with older metadata: a record sent to a partition the
    description does not know makes the producer look again, and it lands there."""
    driver = topic_log
    job = SharedTransaction.start(driver, "job", TIMEOUT_MS).describing(driver, [T])
    driver.create_partitions(T, 4)
    log, _ = _task_log(driver)
    job.commit(driver, [write(job, log, "0", 3, ["new"])])
    assert visible(driver, 3) == ["new"]


def test_without_renewal_a_shared_transaction_is_aborted_after_its_timeout(
        topic_log: Log, clock: ManualClock) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "dead", TIMEOUT_MS)
    m0 = write(job, log, "0-0", 0, ["a"])
    m1 = write(job, log, "1-0", 1, ["b"])
    clock.now_ms += TIMEOUT_MS  # exactly the timeout: not yet
    assert log.coordinator.abort_expired() == []
    clock.now_ms += 1
    assert sorted(log.coordinator.abort_expired()) == ["dead-0-0", "dead-1-0"]
    assert stable_everywhere(log)
    with pytest.raises(DecisionConflictError, match="transaction timed out"):
        job.commit(log, [m0, m1])
    assert visible(log, 0) == [] and visible(log, 1) == []


def test_a_readers_timeout_check_also_respects_the_lease(topic_log: Log,
                                                         clock: ManualClock) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    member = write(job, log, "0-0", 0, ["a"])
    clock.now_ms += 3 * TIMEOUT_MS
    log.coordinator.renew_lease(job.decision_id)
    clock.now_ms += TIMEOUT_MS // 2
    consumer = log.consumer(abort_expired_transactions=True, auto_offset_reset="earliest")
    consumer.assign([(T, 0)])
    assert consumer.poll() == []
    assert ongoing(log, "job-") == ["job-0-0"]  # held back by the LSO, not aborted
    clock.now_ms += TIMEOUT_MS
    assert consumer.poll() == []
    assert ongoing(log, "job-") == []  # the reader aborted it: the LSO moved
    assert stable_everywhere(log)
    with pytest.raises(DecisionConflictError):
        job.commit(log, [member])


def test_a_plain_transaction_ignores_leases(topic_log: Log, clock: ManualClock) -> None:
    """Only shared transactions have leases: a lease named like a plain
    transaction's own decision id must not keep it alive."""
    log = topic_log
    producer = log.producer(transactional_id="plain", transaction_timeout_ms=TIMEOUT_MS)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(T, b"x", partition=0)
    producer.flush()
    meta = log.coordinator.metadata("plain")
    assert not meta.is_shared
    clock.now_ms += 2 * TIMEOUT_MS
    log.coordinator.renew_lease(meta.decision_id)
    assert log.coordinator.abort_expired() == ["plain"]
    assert stable_everywhere(log)


# --- a COMMIT that stands is never reported as a failure --------------------------------------


@pytest.fixture
def failing_markers(monkeypatch):
    """Marker writes fail the first ``left[0]`` times (-1: always), as a store error would."""
    from txlog.partition.partition_log import PartitionLog

    monkeypatch.setattr(shared_module, "COMPLETE_FIRST_BACKOFF_S", 0.001)
    left = [0]
    original = PartitionLog.append_marker

    def append_marker(self, *args, **kwargs):
        if left[0] != 0:
            left[0] -= 1
            raise OSError("injected: the store refused the marker write")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PartitionLog, "append_marker", append_marker)
    return left


def test_a_commit_whose_marker_write_fails_once_is_retried_and_succeeds(
        topic_log: Log, failing_markers) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    members = [write(job, log, "0-0", 0, ["a"]), write(job, log, "1-0", 1, ["b"])]
    failing_markers[0] = 1
    assert job.commit(log, members).commit  # at the decision; the markers follow behind
    assert job.wait_completed()
    assert failing_markers[0] == 0  # the failure did happen
    assert visible(log, 0) == ["a"] and visible(log, 1) == ["b"]
    assert stable_everywhere(log) and ongoing(log, "job") == []


def test_a_commit_whose_markers_keep_failing_says_the_records_are_committed(
        topic_log: Log, failing_markers) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    members = [write(job, log, "0-0", 0, ["a"]), write(job, log, "1-0", 1, ["b"])]
    failing_markers[0] = -1
    assert job.commit(log, members).commit  # at the decision; the markers follow behind
    with pytest.raises(CommittedButIncompleteError) as raised:
        job.wait_completed()
    first_line = str(raised.value).splitlines()[0]
    assert "COMMITTED" in first_line and "must not be written again" in first_line
    # Readers see the records already: the decision is the commit point.
    assert visible(log, 0) == ["a"] and visible(log, 1) == ["b"]
    failing_markers[0] = 0
    assert job.abort(log, members).commit  # Spark's abort after the failed commit rolls it on
    assert stable_everywhere(log) and ongoing(log, "job") == []


def test_a_commit_that_fails_before_its_decision_still_fails(topic_log: Log,
                                                             monkeypatch) -> None:
    log = topic_log
    job = SharedTransaction.start(log, "job", TIMEOUT_MS)
    members = [write(job, log, "0-0", 0, ["a"])]

    def refuse(*args, **kwargs):
        raise OSError("injected: the decision could not be written")

    monkeypatch.setattr(log.coordinator.store, "decide", refuse)
    with pytest.raises(OSError, match="decision could not be written"):
        job.commit(log, members)
    assert visible(log, 0) == []


# --- a finished job's attempts are deleted at once (protocol.md 5.3) -------------------------

def test_gc_deletes_a_finished_jobs_attempt_chains_at_once_and_zombies_stay_out(
        topic_log: Log) -> None:
    """gc deletes the chains of a finished job's attempts at once (no expiration, no
    Dead floor): a job leaves its decision, not one chain per attempt.  An orphan that
    wakes up afterwards can neither write nor revive its id, a late retry of the
    commit still answers from the decision, and the same key joins a later job afresh."""
    log = topic_log
    job = SharedTransaction.start(log, "etl", TIMEOUT_MS)
    members = [write(job, log, f"{p}-1", p, [f"a{p}"]) for p in range(2)]
    orphan = join_and_write(job, log, "2-1", 2, ["orphan"])
    orphan.send(T, b"late", partition=2)  # buffered: the zombie's batch after the end
    orphan._transactions.settle_joins()  # its AddPartitionsToTxn (sent from a thread) first
    job.commit(log, members)
    job.wait_completed()  # the members' Complete versions, behind the decision
    report = log.gc()
    assert report.count("transactional id chains (finished job attempts)") > 0
    assert [t for t in log.coordinator.transactional_ids() if t.startswith("etl-")] == []
    assert log.coordinator.decision(job.decision_id).commit  # the decision stays
    with pytest.raises(TxlogError):
        orphan.flush()
    with pytest.raises(TxlogError):
        orphan.send(T, b"later", partition=1)
        orphan.flush()
    assert [t for t in log.coordinator.transactional_ids() if t.startswith("etl-")] == []
    assert visible(log, 2, READ_UNCOMMITTED) == ["orphan"]  # aborted, and nothing after
    again = SharedTransaction.start(log, "etl", TIMEOUT_MS)
    job.commit(log, members)  # a late retry of the first commit: still committed, once
    again.commit(log, [write(again, log, "0-1", 0, ["b0"])])
    assert [visible(log, p) for p in range(3)] == [["a0", "b0"], ["a1"], []]
    assert stable_everywhere(log)


def test_gc_never_deletes_the_chain_of_an_attempt_id_a_running_job_re_uses(
        topic_log: Log) -> None:
    """Spark's streaming writer re-uses ``<partition>-<attempt number>`` every
    micro-batch: gc meets the id running in the next job, on top of the finished
    versions of the last one.  Only a chain whose newest versions are its finished
    transaction may go: the running attempt keeps its metadata and commits.  Fails with
    the rule's "finished" condition removed (its metadata is deleted under it)."""
    log = topic_log
    first = SharedTransaction.start(log, "s", TIMEOUT_MS)
    first.commit(log, [write(first, log, "0-0", 0, ["first"])])
    second = SharedTransaction.start(log, "s", TIMEOUT_MS)
    producer = second.join(log, "0-0")
    producer.send(T, b"second", partition=0)
    producer.flush()
    log.gc()
    assert log.coordinator.metadata("s-0-0").state == TxnState.ONGOING
    second.commit(log, [producer.prepare_transaction()])
    assert visible(log, 0) == ["first", "second"]
    assert stable_everywhere(log)


@pytest.mark.parametrize("commit", [True, False])
def test_an_attempt_joining_a_decided_job_leaves_nothing_open(topic_log: Log,
                                                              commit: bool) -> None:
    """A killed task's worker or a late speculative loser joins after the job was decided
    and its index listed.  Its send fails, no partition changes, and after gc with every
    age at 0 no chain of the job is Ongoing.  Fails without `_join`'s check of a standing
    decision on opening (the id goes Ongoing under the decided job and stays so)."""
    log = topic_log
    job = SharedTransaction.start(log, "late", TIMEOUT_MS)
    member = write(job, log, "0-0-0", 0, ["a"])
    (job.commit if commit else job.abort)(log, [member])
    job.wait_completed()  # the markers land behind the decision; count ends after them
    ends = [log.partition(T, p).end_offset() for p in range(3)]
    straggler = job.join(log, "1-0-1")
    with pytest.raises(TxlogError):  # refused by the coordinator, or else the partition
        straggler.send(T, b"late", partition=1)
        straggler.flush()
    straggler.close()
    assert [log.partition(T, p).end_offset() for p in range(3)] == ends
    log.gc(chain_age_s=0, decision_age_s=0, temp_age_s=0, data_age_s=0,
           txn_id_expiration_ms=0)
    assert ongoing(log, "late") == []
    assert visible(log, 0) == (["a"] if commit else [])
    assert stable_everywhere(log)
