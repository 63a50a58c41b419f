"""Expiry of producer entries and transactional ids, and the cost of one job.

What must hold once state expires (docs/protocol.md 2.6, 4.10): a fenced
zombie stays fenced after the partition forgot it, a backfill with old
CreateTimes is not expired while it writes, a process that knew a deleted
transactional id can neither revive it nor fork it, group offsets of the
id's next incarnation are applied, and a job's storage requests do not grow
with the jobs before it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from txlog import Log, ProducerFencedError, SharedTransaction
from txlog.errors import InvalidPidMappingError, InvalidTxnStateError, OutOfOrderSequenceError
from txlog.format.batch import TRANSACTIONAL_BIT, BatchHeader
from txlog.partition.producer_state import ProducerState
from txlog.storage import chain as chain_module
from txlog.storage.chain import VersionChain
from txlog.storage.paths import DECISION_DIR, TXN_DIR

from conftest import HARNESS_DIR
from helpers_core import DelegatingStorage, ManualClock, manual_clock

T = "t"
EXPIRY_MS = 10_000  # producer.id.expiration.ms of the test topics
TXN_EXPIRY_MS = 60_000  # transactional.id.expiration.ms given to gc


@pytest.fixture
def clock(monkeypatch) -> ManualClock:
    return manual_clock(monkeypatch)


def _log(tmp_path, name: str = "root") -> Log:
    return Log(tmp_path / name, fsync=False)


def _topic(log: Log, partitions: int = 2) -> None:
    log.create_topic(T, partitions, config={"producer.id.expiration.ms": EXPIRY_MS})


# --- producer entries -------------------------------------------------------------------------


def _header(state: ProducerState, pid: int, seq: int, append_time: int,
            create_time: int) -> BatchHeader:
    return BatchHeader(base_offset=state.end_offset, record_count=1, base_timestamp=create_time,
                       max_timestamp=create_time, producer_id=pid, producer_epoch=0,
                       base_sequence=seq, append_time=append_time)


def test_entries_expire_on_the_log_clock_and_snapshots_agree():
    state = ProducerState(expiration_ms=EXPIRY_MS)
    state.apply(_header(state, 1, 0, append_time=1_000, create_time=1_000))
    state.apply(_header(state, 2, 0, append_time=5_000, create_time=5_000))
    state.apply(_header(state, 2, 1, append_time=999 + EXPIRY_MS, create_time=0))
    assert set(state.producers) == {1, 2}  # idle a millisecond less than the expiration
    copy = ProducerState.from_bytes(state.to_bytes(), EXPIRY_MS)
    for s in (state, copy):  # a process starting from the snapshot folds alike
        s.apply(_header(s, 2, 2, append_time=1_000 + EXPIRY_MS, create_time=0))
        assert set(s.producers) == {2}  # idle exactly the expiration: gone (Kafka's >=)
    # An append time behind the clock (a writer whose clock is slow) moves nothing back.
    state.apply(_header(state, 3, 0, append_time=0, create_time=0))
    assert state.producers[3].last_append == state.clock == 1_000 + EXPIRY_MS
    # An open transaction is never expired (its marker is still to come).
    state.apply(BatchHeader(base_offset=state.end_offset, record_count=1,
                            attributes=TRANSACTIONAL_BIT, producer_id=4, producer_epoch=0,
                            base_sequence=0, decision_id="4-0", append_time=state.clock))
    state.apply(_header(state, 2, 3, append_time=state.clock + 3 * EXPIRY_MS, create_time=0))
    assert 4 in state.producers and 3 not in state.producers


def test_backfill_with_old_create_times_is_not_expired_mid_stream(tmp_path, clock):
    """A producer whose records carry CreateTimes years back keeps its entry while it
    writes: expiry counts the writer's clock at publish, never the records' timestamps."""
    log = _log(tmp_path)
    _topic(log, 1)
    backfill = log.producer(linger_ms=0)
    live = log.producer(linger_ms=0)
    year_2001 = 978_307_200_000
    for i in range(12):  # one minute of log time, six times the expiration
        clock.now_ms += EXPIRY_MS // 2
        live.send(T, b"now", partition=0).get()
        backfill.send(T, f"old-{i}".encode(), partition=0, timestamp_ms=year_2001 + i).get()
        assert backfill.producer_id in log.partition(T, 0).state().producers
    values = log.read(T, 0).column("value").to_pylist()
    assert [v for v in values if v.startswith(b"old")] == [f"old-{i}".encode() for i in range(12)]
    # The live one stops: its entry goes once the log clock passes its expiration.
    clock.now_ms += EXPIRY_MS + 1
    backfill.send(T, b"old-last", partition=0, timestamp_ms=year_2001).get()
    assert live.producer_id not in log.partition(T, 0).state().producers
    assert backfill.producer_id in log.partition(T, 0).state().producers


def test_zombie_whose_entry_expired_is_still_fenced(tmp_path, clock):
    """Kafka (KIP-890 verification) refuses a transactional write the coordinator does not
    know as ongoing.  Here: a batch of an unknown producer whose transaction is decided."""
    log = _log(tmp_path)
    _topic(log, 2)
    zombie = log.producer(transactional_id="z", linger_ms=3_600_000)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send(T, b"z0", partition=0)
    zombie.flush()
    zombie.send(T, b"z1", partition=1)  # partition 1 joins the transaction; nothing written
    zombie._transactions.settle_joins()  # the join is sent from a thread: let it land first
    # A new instance fences it: ABORT markers (epoch + 1) in both partitions.
    other = _log(tmp_path)
    successor = other.producer(transactional_id="z")
    successor.init_transactions()
    fenced_pid = zombie.producer_id
    assert other.partition(T, 1).state().producers[fenced_pid].epoch == zombie.epoch + 1
    # The log clock moves on: the fenced entry expires in partition 1.
    clock.now_ms += EXPIRY_MS + 1
    other.producer(linger_ms=0).send(T, b"tick", partition=1).get()
    assert fenced_pid not in other.partition(T, 1).state().producers
    # The zombie's first batch to partition 1 (sequence 0) must still be refused.
    with pytest.raises((ProducerFencedError, InvalidTxnStateError, OutOfOrderSequenceError)):
        zombie.flush()
        zombie.commit_transaction()
    fresh = Log(tmp_path / "root")
    assert b"z1" not in fresh.read(T, 1, isolation_level="read_uncommitted") \
        .column("value").to_pylist()
    assert fenced_pid not in fresh.partition(T, 1).state().producers


# --- transactional ids ------------------------------------------------------------------------


def _expire_and_delete(log: Log, clock: ManualClock, txn_id: str) -> None:
    clock.now_ms += TXN_EXPIRY_MS + 1
    report = log.gc(chain_age_s=0, txn_id_expiration_ms=TXN_EXPIRY_MS)
    assert report.count("transactional ids expired (Dead)") >= 1
    clock.now_ms += 10_000
    log.gc(chain_age_s=0, txn_id_expiration_ms=TXN_EXPIRY_MS)
    assert txn_id not in log.storage.list(TXN_DIR)


def _commit(producer, values: list[bytes], partition: int = 0,
            offsets: dict | None = None) -> None:
    producer.begin_transaction()
    for v in values:
        producer.send(T, v, partition=partition)
    if offsets:
        producer.send_offsets_to_transaction(offsets, "g")
    producer.commit_transaction()
    producer.flush()  # until Complete, written behind the decision (protocol.md 4.5)


def test_stale_process_cannot_revive_a_deleted_transactional_id(tmp_path, clock):
    """A process that cached the old chain acts after the id was deleted and started again,
    with the new chain at exactly the version it cached: it must be refused, and the new
    chain must stay one lineage."""
    stale_log = _log(tmp_path)
    _topic(stale_log, 1)
    stale = stale_log.producer(transactional_id="x")
    stale.init_transactions()
    _commit(stale, [b"old"])
    cached, _ = stale_log.coordinator.store.chain("x").latest()

    admin = _log(tmp_path)
    _expire_and_delete(admin, clock, "x")
    fresh = admin.producer(transactional_id="x")
    fresh.init_transactions()
    while admin.coordinator.store.chain("x").latest()[0] < cached:
        fresh.init_transactions()  # each one version more: land on the stale number
    assert admin.coordinator.store.chain("x").latest()[0] == cached
    # What the stale process reads is the new chain, not the one it cached.
    assert stale_log.coordinator.metadata("x").producer_id == fresh.producer_id

    with pytest.raises((ProducerFencedError, InvalidTxnStateError)):
        _commit(stale, [b"revived"])
    _commit(fresh, [b"new"])
    meta = Log(tmp_path / "root").coordinator.metadata("x")
    assert (meta.producer_id, meta.epoch) == (fresh.producer_id, fresh.epoch)
    assert Log(tmp_path / "root").read(T, 0).column("value").to_pylist() == [b"old", b"new"]


@pytest.mark.parametrize("deleted", [False, True], ids=["dead", "deleted"])
def test_a_producer_whose_id_expired_under_it_aborts_and_starts_again(tmp_path, clock,
                                                                      deleted):
    """Kafka's INVALID_PRODUCER_ID_MAPPING: the id expired while the producer was idle
    (still Dead, or already deleted whole).  The next transaction fails with an
    abortable error, commit raises it again, and abort starts the id again under a
    new producer id; nothing of the failed transaction is visible."""
    log = _log(tmp_path)
    _topic(log, 1)
    producer = log.producer(transactional_id="x")
    producer.init_transactions()
    _commit(producer, [b"before"])
    old = (producer.producer_id, producer.epoch)
    admin = _log(tmp_path)
    if deleted:
        _expire_and_delete(admin, clock, "x")
    else:
        clock.now_ms += TXN_EXPIRY_MS + 1
        admin.gc(chain_age_s=3600, txn_id_expiration_ms=TXN_EXPIRY_MS)
        assert admin.coordinator.metadata("x").state.value == "Dead"
    producer.begin_transaction()
    producer.send(T, b"lost", partition=0)  # joins in a thread: the error comes with the write
    with pytest.raises(InvalidPidMappingError, match="expired while producer"):
        producer.flush()
    with pytest.raises(InvalidPidMappingError):
        producer.commit_transaction()
    producer.abort_transaction()
    assert (producer.producer_id, producer.epoch) != old
    _commit(producer, [b"after"])
    assert Log(tmp_path / "root").read(T, 0).column("value").to_pylist() == [b"before", b"after"]


def test_a_producer_whose_id_expired_is_fenced_if_another_took_it(tmp_path, clock):
    """After the expiry another instance initialised the id: the old producer's abort
    must not start it again over the new one (that would fence it): it is fenced."""
    log = _log(tmp_path)
    _topic(log, 1)
    producer = log.producer(transactional_id="x")
    producer.init_transactions()
    _commit(producer, [b"before"])
    admin = _log(tmp_path)
    _expire_and_delete(admin, clock, "x")
    other = admin.producer(transactional_id="x")
    other.init_transactions()
    producer.begin_transaction()
    producer.send(T, b"lost", partition=0)  # joins in a thread: the error comes with the write
    with pytest.raises(ProducerFencedError):  # the id maps to the other instance now
        producer.flush()
    with pytest.raises(ProducerFencedError):
        producer.abort_transaction()
    _commit(other, [b"other"])
    assert Log(tmp_path / "root").read(T, 0).column("value").to_pylist() == [b"before", b"other"]


def test_restarting_an_expired_id_never_fences_a_newer_instance(tmp_path, clock):
    # The race the expected identity guards: the other instance initialises between
    # the expiry error and the abort.
    log = _log(tmp_path)
    _topic(log, 1)
    producer = log.producer(transactional_id="x")
    producer.init_transactions()
    _commit(producer, [b"before"])
    admin = _log(tmp_path)
    _expire_and_delete(admin, clock, "x")
    producer.begin_transaction()
    producer.send(T, b"lost", partition=0)  # joins in a thread: the error comes with the write
    with pytest.raises(InvalidPidMappingError):
        producer.flush()
    other = admin.producer(transactional_id="x")
    other.init_transactions()
    with pytest.raises(ProducerFencedError, match="another instance took it"):
        producer.abort_transaction()
    _commit(other, [b"other"])  # not fenced by the old producer's restart


def test_chain_publish_computed_from_a_deleted_chain_is_withdrawn(tmp_path, clock, monkeypatch):
    """The predecessor check compares bytes: a writer that read version 1 of the old chain
    and publishes version 2 after the chain restarted and reached version 1 again is
    withdrawn, even though a version 1 exists (the stall case the age rules cannot see)."""
    monkeypatch.setattr(chain_module, "VERIFY_AFTER_MS", 10**12)  # it stalled, unchecked
    log = _log(tmp_path)
    stale = VersionChain(log.storage, f"{TXN_DIR}/c")
    assert stale.publish(0, {"lineage": "old", "n": 0})
    assert stale.publish(1, {"lineage": "old", "n": 1})
    log.storage.delete_tree(f"{TXN_DIR}/c")
    other = VersionChain(log.storage, f"{TXN_DIR}/c")
    assert other.publish(0, {"lineage": "new", "n": 0})
    assert other.publish(1, {"lineage": "new", "n": 1})

    def step(version, value):
        return {"lineage": value["lineage"], "n": value["n"] + 1}

    version, value = stale.update(step)
    assert value == {"lineage": "new", "n": 2}  # recomputed from the new chain
    fresh = VersionChain(log.storage, f"{TXN_DIR}/c")
    assert fresh.latest() == (2, {"lineage": "new", "n": 2})


def test_group_offsets_of_a_restarted_transactional_id_are_applied(tmp_path, clock):
    """txn_marks remember generations: after the id's chain is deleted and starts again at
    version 0, its commits must not be taken for ones the group has seen."""
    log = _log(tmp_path)
    _topic(log, 1)
    producer = log.producer(transactional_id="x")
    producer.init_transactions()
    for i in range(3):
        _commit(producer, [f"a{i}".encode()], offsets={(T, 0): 10 + i})
    assert log.committed("g", [(T, 0)]) == {(T, 0): 12}
    _expire_and_delete(log, clock, "x")
    again = log.producer(transactional_id="x")
    again.init_transactions()
    _commit(again, [b"b0"], offsets={(T, 0): 100})
    assert Log(tmp_path / "root").committed("g", [(T, 0)]) == {(T, 0): 100}


def test_a_live_transactional_id_is_not_expired(tmp_path, clock):
    log = _log(tmp_path)
    _topic(log, 1)
    producer = log.producer(transactional_id="busy")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(T, b"open", partition=0)
    producer.flush()
    clock.now_ms += TXN_EXPIRY_MS * 3  # an Ongoing transaction is never expired as an id
    log.gc(chain_age_s=0, txn_id_expiration_ms=TXN_EXPIRY_MS)
    assert "busy" in log.storage.list(TXN_DIR)


# --- the cost of one job ----------------------------------------------------------------------


class RequestCounter(DelegatingStorage):
    """Counts every storage request, and which directories were listed."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.count = 0
        self.listed: list[str] = []

    def publish_if_absent(self, path, data):
        self.count += 1
        return super().publish_if_absent(path, data)

    def read(self, path):
        self.count += 1
        return super().read(path)

    def read_prefix(self, path, length):
        self.count += 1
        return super().read_prefix(path, length)

    def read_buffer(self, path):
        self.count += 1
        return super().read_buffer(path)

    def exists(self, path):
        self.count += 1
        return super().exists(path)

    def list(self, directory):
        self.count += 1
        self.listed.append(directory)
        return super().list(directory)

    def delete(self, path):
        self.count += 1
        super().delete(path)


def test_requests_of_a_job_do_not_grow_with_earlier_jobs(tmp_path):
    """SharedTransaction.start and commit find their attempts, orphans and leftovers by
    job and prefix: the same number of requests after 4 jobs as after 40, and no listing
    of every transactional id or decision."""
    counter = RequestCounter(Log(tmp_path / "root", fsync=False).storage)
    log = Log(counter)
    log.create_topic(T, 2)
    attempt = 0
    costs = []
    for job_no in range(40):
        counter.count, counter.listed = 0, []
        job = SharedTransaction.start(log, "etl", 60_000)
        start_cost = counter.count
        members = []
        for task in range(4):
            attempt += 1  # attempt ids keep growing, as in a long-lived application
            producer = job.join(log, f"{task}-{attempt}")
            producer.send(T, f"{job_no}-{task}".encode(), partition=task % 2)
            members.append(producer.prepare_transaction())
            producer.close()
        if job_no % 3 == 0:  # an orphan: joined and wrote, never handed over
            attempt += 1
            orphan = job.join(log, f"orphan-{attempt}")
            orphan.send(T, b"orphan", partition=0)
            orphan.flush()
        counter.count, listed = 0, counter.listed
        job.commit(log, members)
        job.wait_completed()  # its roll-forward, behind the decision, counts too
        costs.append((job_no, start_cost, counter.count))
        for directory in listed + counter.listed:
            assert directory not in (TXN_DIR, DECISION_DIR), directory
    early = [c for c in costs[3:9]]
    late = [c for c in costs[33:39]]
    # Same phase of the orphan cycle (every third job has one): compare like with like.
    for (n1, s1, c1), (n2, s2, c2) in zip(early, late):
        assert n1 % 3 == n2 % 3
        assert s2 <= s1 + 2, (costs[:9], costs[-9:])
        assert c2 <= c1 + 2, (costs[:9], costs[-9:])
    assert log.read(T, 0).column("value").to_pylist().count(b"orphan") == 0


# --- under SIGKILL ----------------------------------------------------------------------------


def test_expiry_under_sigkill_keeps_every_commit_and_fences_zombies(tmp_path):
    """Writers on a pool of ids, zombies that stall past their timeout and the producer
    expiration, a maintainer expiring and deleting ids, all SIGKILLed at random moments
    (tests/harness/expiry_kill_harness.py).  With the partition's verification of unknown
    producers removed, seed 3 lands a zombie's batch after its transaction ended, which
    then hangs the partition's LSO and hides later commits."""
    run = subprocess.run([sys.executable, str(HARNESS_DIR / "expiry_kill_harness.py"),
                          "--root", str(tmp_path / "log"), "--seed", "3", "--seconds", "9"],
                         capture_output=True, text=True, timeout=300)
    print(run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.rstrip().endswith("OK")


def test_finished_jobs_deleted_at_once_under_sigkill_keep_every_commit(tmp_path):
    """Shared-transaction jobs on attempt ids re-used by every job (Spark's streaming
    naming), each job's end deleting its attempts' chains at once (protocol.md 5.3),
    zombies flushing after their job ended (half of them after the partitions forgot
    them), gc expiring and deleting ids: writers and maintainer SIGKILLed at random
    moments (tests/harness/expiry_kill_harness.py --shared).  Every committed attempt is read
    once, nothing aborted or failed is visible, no zombie batch is in the log at all."""
    run = subprocess.run([sys.executable, str(HARNESS_DIR / "expiry_kill_harness.py"),
                          "--root", str(tmp_path / "log"), "--seed", "5", "--seconds", "6",
                          "--shared"],
                         capture_output=True, text=True, timeout=300)
    print(run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.rstrip().endswith("OK")
    assert "zombies fenced before their flush" in run.stdout
