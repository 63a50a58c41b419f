"""A transaction shared by many producers in many processes: one decision for all.

Kafka ties a transaction to one producer, which is why a Spark job (whose
tasks run in many processes) could never write to Kafka exactly once.  Here
every participant opens its own transactional producer and joins one
decision id; whoever ends the job publishes a single decision that commits
exactly the members it was handed.  This module holds the rules of such a
job, so that the Spark layer only maps Spark's calls onto them:

* the decision id is fresh for every job (``<prefix>.<random>``), so a
  decision can never be re-used by accident;
* each participant attempt has its own transactional id
  (``<prefix>-<key>``), so fencing one attempt never touches another;
* attempts that never reached the decision (failed, killed, speculative
  losers) are ended by whoever ends the job, and transactions left open by
  an earlier job with the same prefix are ended when the next one starts,
  so no partition's LSO stays stuck;
* both find those attempts through the job index,
  ``coordinator/jobs/<prefix>/<decision id>/<transactional id>``: every
  participant records itself there before it can open a transaction, and a
  job's entries go once its decision stands and its participants are ended.
  So the cost of a job is that of its own attempts and of the unfinished
  jobs of its prefix, never of every transactional id in the log;
* the metadata chain of a finished participant is deleted by the next gc
  at once (``delete_finished_attempt``), not kept for
  ``transactional.id.expiration.ms`` and a Dead floor: a job leaves its
  decision behind, not one chain per attempt (docs/protocol.md 5.3); but
  the ids of Spark's batch attempts (``attempt_key``) are the same in every
  job of a prefix and stay, so the next job bumps their epochs instead of
  creating producers (5.4, and ``id_pool`` for jobs without a prefix);
* a running participant keeps the job's lease fresh, and members of a
  shared transaction time out only when the lease has gone stale, so a job
  longer than its timeout still commits while one whose driver died is
  aborted after the timeout (docs/spark.md).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgpack

from .. import clock
from ..transactions.metadata import (COMPLETE, PREPARED, Decision, TransactionMember,
                                     TransactionMetadata, TxnState)
from ..errors import CommittedButIncompleteError, InvalidConfigError, TransactionAbortedError
from ..storage.names import validate_name
from ..storage.paths import TXN_DIR, job_dir
from ..storage.pools import shared_pool
from ..clients.producer import Producer
from ..root.root import Root

if TYPE_CHECKING:
    from ..api.log import Log
    from ..root.topics import TopicDescription

logger = logging.getLogger(__name__)

# Transactional ids and decision ids also travel in batch headers (at most
# 255 bytes there), so a prefix leaves room for what is appended to it.
MAX_PREFIX_LENGTH = 200
# Rolling a standing COMMIT forward is retried this often, waiting 0.1 s, then
# twice as long each time (about 6 s in all), before the job is told it failed.
COMPLETE_ATTEMPTS = 7
COMPLETE_FIRST_BACKOFF_S = 0.1
JOB_END_THREADS = 4  # committed jobs of a process rolled forward at once

# Roll-forwards of jobs this process committed, by decision id (``wait_completed``).
_FINISHING: dict[str, Future[None]] = {}
_FINISHING_LOCK = threading.Lock()


def _forget_if_done(decision_id: str, finishing: Future[None]) -> None:
    """A job rolled forward is forgotten; one that gave up is kept for ``wait_completed``
    (and was logged as an error)."""
    if finishing.exception() is None:
        with _FINISHING_LOCK:
            if _FINISHING.get(decision_id) is finishing:
                del _FINISHING[decision_id]


def _job_end_pool() -> ThreadPoolExecutor:
    """Threads that wait for a committed job's members and then drop its index entries;
    apart from the coordinator's roll-forward threads, on which they wait."""
    return shared_pool("txlog-job-end", JOB_END_THREADS)


def check_prefix(prefix: str) -> str:
    validate_name(prefix, "transactional.id.prefix")
    if len(prefix) > MAX_PREFIX_LENGTH:
        raise InvalidConfigError(
            f"transactional.id.prefix {prefix[:20]!r}... is {len(prefix)} characters; at most "
            f"{MAX_PREFIX_LENGTH} are allowed")
    return prefix


@dataclass(frozen=True)
class SharedTransaction:
    """Identity of one job's transaction: small and picklable, it travels to every task."""

    prefix: str
    decision_id: str
    timeout_ms: int
    # When the driver renewed the lease (its clock), -1 if it did not: a task that starts
    # within a quarter of the timeout of it need not read the lease (protocol.md 5).
    lease_ms: int = -1
    # The topics the job writes, as the driver described them (``describing``): a task
    # takes them instead of reading each description again (protocol.md 5).
    topics: tuple[TopicDescription, ...] = ()

    @classmethod
    def start(cls, log: Log, prefix: str, timeout_ms: int) -> SharedTransaction:
        """A new job: a fresh decision id; leftovers of earlier jobs of ``prefix`` are ended."""
        return begin_job(log, prefix, fresh_decision_id(prefix), timeout_ms)

    def describing(self, log: Log, topics: Iterable[str]) -> SharedTransaction:
        """This job, carrying the current descriptions of ``topics`` to its tasks."""
        return replace(self, topics=tuple(log.services.describe_topic(t, refresh=True)
                                              for t in topics))

    def transactional_id(self, key: str) -> str:
        return f"{self.prefix}-{key}"

    def enlist(self, log: Log, transactional_id: str) -> None:
        """Record a participant in the job index, before it can open a transaction: whoever
        ends the job or its prefix then finds every participant that may hold an LSO."""
        path = f"{job_dir(self.prefix, self.decision_id)}/{transactional_id}"
        log.services.storage.publish_if_absent(path, msgpack.packb({"time_ms": clock.now_ms()}))

    def join(self, log: Log, key: str, **producer_config: object) -> Producer:
        """A transactional producer for participant ``key``, inside this job's transaction."""
        self.enlist(log, self.transactional_id(key))
        for desc in self.topics:
            log.services.adopt_description(desc)
        config: dict[str, Any] = dict(producer_config)  # checked by Producer, by name
        producer = Producer(log, transactional_id=self.transactional_id(key),
                            transaction_timeout_ms=self.timeout_ms, **config)
        producer.init_transactions()
        producer.begin_transaction(self.decision_id)
        return producer

    @contextmanager
    def keep_alive(self, log: Log) -> Iterator[None]:
        """Renew the job's lease while the body runs (a participant at work)."""
        coordinator = log.services.coordinator
        stop = threading.Event()
        interval = max(self.timeout_ms / 4000, 0.05)
        # A lease renewed less than one interval ago (by the driver's start, or another
        # task) is left alone and renewed one interval after that renewal: the lease is
        # then never older than two intervals, half the timeout (protocol.md 5).  The
        # driver's renewal, which travelled here with the job, is such a renewal, so a
        # task starting within an interval of it needs no read to know it.
        renewed_ms = self.lease_ms
        if renewed_ms < 0 or not 0 <= clock.now_ms() - renewed_ms < interval * 1000:
            renewed_ms = coordinator.renew_lease(
                self.decision_id, unless_younger_than_ms=int(interval * 1000))
        first = min(interval, max(0.0, interval - (clock.now_ms() - renewed_ms) / 1000))

        def renew() -> None:
            wait = first
            while not stop.wait(wait):
                wait = interval
                try:
                    coordinator.renew_lease(self.decision_id)
                except Exception:  # a missed renewal only shortens the lease
                    logger.warning("renewing the lease of %s failed", self.decision_id,
                                   exc_info=True)

        thread = threading.Thread(target=renew, name=f"txlog-lease-{self.decision_id}",
                                  daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def commit(self, log: Log, members: list[TransactionMember]) -> Decision:
        """Commit exactly ``members``; raises unless every one of them is committed.

        Returns once the COMMIT decision is durable: from then on the records
        are committed, whatever fails afterwards.  Every member is rolled
        forward at once behind it (markers, group offsets, Complete*), then
        the job's index entries go; a failure there is retried with backoff
        rather than reported as a failed job, which a user would run again
        and so duplicate.  ``wait_completed`` waits for it and raises what
        stopped it (CommittedButIncompleteError, which says the records are
        committed); a process killed meanwhile leaves it to whoever meets the
        transaction next (docs/protocol.md 4.5).
        """
        root = log.services
        try:
            decision, completion = root.coordinator.decide_shared_transaction(
                self.decision_id, members, True)
        except TransactionAbortedError:
            raise  # DecisionConflictError among them: nothing is committed
        except Exception:
            if not self._commit_stands(root, members):
                raise  # undecided, or unknowable: the caller's failure, as before
            standing = root.coordinator.decision(self.decision_id)
            assert standing is not None
            decision, completion = standing, None
        if not decision.commit:
            raise TransactionAbortedError(
                f"job transaction {self.decision_id!r} was aborted before it could commit "
                f"({decision.reason or 'aborted'})")
        self._fence_orphans(root, members)
        finishing = _job_end_pool().submit(self._finish, root, members, completion)
        with _FINISHING_LOCK:
            _FINISHING[self.decision_id] = finishing
        finishing.add_done_callback(partial(_forget_if_done, self.decision_id))
        return decision

    def _fence_orphans(self, root: Root, members: list[TransactionMember]) -> None:
        """End the job's attempts that are not members (speculation losers, failed
        attempts) before the commit returns: one still running then meets its ABORT
        markers, at the epoch after its own, wherever it joined, and never lands a batch
        once the job is over (protocol.md 5, "The job index").  Rare; the listing is the
        commit's one request beyond the decision."""
        named = {m.transactional_id for m in members}
        for txn_id in root.storage.list(job_dir(self.prefix, self.decision_id)):
            if txn_id not in named:
                root.coordinator.complete(txn_id, only_decision=self.decision_id)

    def wait_completed(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for this process's roll-forward of the committed job;
        raises CommittedButIncompleteError if it gave up.  False if still running."""
        with _FINISHING_LOCK:
            finishing = _FINISHING.get(self.decision_id)
        if finishing is None:
            return True
        done, _ = wait([finishing], timeout)
        if not done:
            return False
        with _FINISHING_LOCK:
            if _FINISHING.get(self.decision_id) is finishing:
                del _FINISHING[self.decision_id]
        finishing.result()
        return True

    def _finish(self, root: Root, members: list[TransactionMember],
                completion: Future[None] | None) -> None:
        """Behind a standing COMMIT: every member complete, then the job's index entries."""
        delay = COMPLETE_FIRST_BACKOFF_S
        for attempt in range(1, COMPLETE_ATTEMPTS + 1):
            try:
                if completion is not None and attempt == 1:
                    completion.result()
                else:
                    for m in members:
                        root.coordinator.complete(m.transactional_id,
                                                  only_decision=self.decision_id)
                _end_job(root, self.prefix, self.decision_id, None)
                return
            except Exception as exc:
                if attempt == COMPLETE_ATTEMPTS:
                    logger.error("job transaction %s is committed, but completing it failed "
                                 "%d times: %s", self.decision_id, attempt, exc)
                    raise CommittedButIncompleteError(
                        f"the job's records are COMMITTED and must not be written again: the "
                        f"COMMIT decision of job transaction {self.decision_id!r} stands, but "
                        f"completing it failed {attempt} times ({type(exc).__name__}: {exc}). "
                        "Readers see them once any process rolls the transaction forward "
                        "(a read_committed reader, a producer of the partition, `txlog "
                        "transactions abort-expired`, the next job of the prefix).",
                        self.decision_id) from exc
                logger.warning("job transaction %s is committed; completing it failed (%s), "
                               "retrying in %.1f s", self.decision_id, exc, delay)
                time.sleep(delay)
                delay *= 2

    def _commit_stands(self, root: Root, members: list[TransactionMember]) -> bool:
        try:
            decision = root.coordinator.decision(self.decision_id)
        except Exception:
            return False
        return decision is not None and \
            all(decision.commits(m.producer_id, m.epoch) for m in members)

    def abort(self, log: Log, members: list[TransactionMember]) -> Decision:
        """Abort the job (a no-op answer if its commit already stands)."""
        root = log.services
        decision = root.coordinator.end_shared_transaction(self.decision_id, members, False)
        _end_job(root, self.prefix, self.decision_id, None)
        return decision

    def end_orphans(self, log: Log) -> None:
        """Roll forward every open transaction of this job that was not handed over.

        The decision stands by now, and it does not name them, so they end
        aborted.  The job's index entries go with them.
        """
        _end_job(log.services, self.prefix, self.decision_id, None)

    def end_leftovers(self, log: Log) -> None:
        """Abort transactions an earlier job of this prefix left open (its driver died).

        Two jobs must not share a prefix at the same time, as two Kafka
        producers must not share a transactional id: the newer one fences
        the older.
        """
        end_open_jobs(log.services, self.prefix, "left open by an earlier job of its prefix",
                      keep=self.decision_id)


def fresh_decision_id(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex}"


def begin_job(log: Log, prefix: str, decision_id: str, timeout_ms: int) -> SharedTransaction:
    """Job ``decision_id`` of ``prefix`` begun: leftovers of the prefix's earlier jobs are
    ended and the lease is renewed (``SharedTransaction.start``, or a pooled prefix's
    job, id_pool.py, whose decision id was recorded in the pool before)."""
    check_prefix(prefix)
    job = SharedTransaction(prefix, decision_id, timeout_ms)
    job.end_leftovers(log)
    return replace(job, lease_ms=log.services.coordinator.renew_lease(decision_id))


def attempt_key(partition: int, attempt: int) -> str:
    """The participant key of a Spark task attempt, the same in every job of a prefix.

    Within a stage attempt no two attempts of a task share it (Spark numbers
    them, speculative copies included), and across jobs it is re-used, so a
    prefix's ids stay as many as its jobs' attempts: InitProducerId bumps the
    epoch of the id's producer instead of creating one (protocol.md 5.4).
    """
    return f"r{partition}-{attempt}"


# Transactional ids keyed by ``attempt_key``: their chains stay between jobs.
_REUSED_ID = re.compile(r"-r\d+-\d+\Z")


def _end_job(root: Root, prefix: str, decision_id: str, reason: str | None) -> list[str]:
    """End the participants of one job found in the index, then drop its entries.

    With ``reason``, an undecided job is aborted first (its open attempts,
    and the decision itself: a job the caller declares dead takes no more
    data); without, the job's decision must stand already (its ender calls
    this after deciding), and open attempts are only rolled forward.  The
    entries are deleted only once the decision stands: an attempt that joins
    later is then refused data by the partitions (a decided transaction
    takes none) and rolled forward by whoever meets it, and it indexes
    itself again, so the next job of the prefix ends it.
    """
    coordinator = root.coordinator
    directory = job_dir(prefix, decision_id)
    participants = root.storage.list(directory)
    ended = []
    for txn_id in participants:
        meta = coordinator.metadata(txn_id)
        if meta is None or meta.decision_id != decision_id or \
                meta.state not in (TxnState.ONGOING, *PREPARED, TxnState.PREPARE_EPOCH_FENCE):
            continue
        # Prepared: another process (a partition's sweep) is rolling it forward, perhaps
        # with markers still to write.  Finish it here too (every step is idempotent), so
        # that when the end returns every marker is in place: an orphan still running
        # must meet its fence, not a partition that knows it at the epoch before
        # (docs/protocol.md 5, "The job index").
        if reason is None or meta.state != TxnState.ONGOING:
            coordinator.complete(txn_id, only_decision=decision_id)
        else:
            logger.info("ending %s, %s (decision %s)", txn_id, reason, decision_id)
            coordinator.abort_open(txn_id, reason)
            ended.append(txn_id)
    if reason is not None:
        coordinator.abort_decision(decision_id, reason)
    if coordinator.decision(decision_id) is not None:
        for txn_id in participants:
            root.storage.delete(f"{directory}/{txn_id}")
        root.storage.delete(directory)
    return ended


def delete_finished_attempt(root: Root, transactional_id: str) -> list[str]:
    """Delete the whole metadata chain of a shared transaction's participant whose
    transaction is finished; returns the paths deleted (docs/protocol.md 5.3).

    Kafka keeps an idle id for ``transactional.id.expiration.ms`` because a
    live producer may begin its next transaction on it.  A participant of a
    shared transaction cannot: once it prepared its producer is
    uninitialised (protocol.md 5) and must run InitProducerId first, which
    starts a deleted id afresh; and the job's decision, which stays for
    ``decision_age_s``, is what a late end call or a zombie reads, not the
    chain.  So gc deletes it without a Dead tombstone and its floor, when:

    * the two newest versions are Prepare* and then Complete* of one shared
      decision: the transaction is finished (every marker written), and a
      chain that moved on (an id re-used by the next job, as Spark's
      streaming writer does with ``<partition>-<attempt number>``) is left
      alone; a plain producer's chain (its decision is its own) is too;
    * the id is not one the batch writer re-uses from job to job (``attempt_key``):
      deleting it would give its next job's attempt a new producer id, and every
      partition it writes an entry more, until producer ids expire; it stays until
      ``transactional.id.expiration.ms`` as Kafka keeps an idle id;
    * the Prepare* version carried no group offsets: a chain restarted
      without a tombstone takes the restarting process's clock as its
      incarnation, which only the Dead rule (4.10) orders after a deleted
      chain's group marks (``txn_marks``), so an id that committed offsets
      (a stream sink's member) is left to expiry.

    Only the versions listed are deleted, oldest first and the Complete one
    last, so until the end the chain reads as finished; a process that read
    it and publishes the next version either lands before the Complete one
    goes (its version stays, the newest of the same lineage) or finds its
    predecessor gone and reads the chain again (storage/chain.py checks the
    predecessor's bytes).
    """
    storage = root.storage
    directory = f"{TXN_DIR}/{validate_name(transactional_id, 'transactional id')}"
    if _REUSED_ID.search(transactional_id):
        return []
    names = sorted(n for n in storage.list(directory) if n.isdigit())
    if len(names) < 2 or int(names[-2]) + 1 != int(names[-1]):
        return []  # a lone version (trimmed): its offsets cannot be seen, keep it
    try:
        newest = TransactionMetadata.from_dict(msgpack.unpackb(
            storage.read(f"{directory}/{names[-1]}"), strict_map_key=False))
        before = TransactionMetadata.from_dict(msgpack.unpackb(
            storage.read(f"{directory}/{names[-2]}"), strict_map_key=False))
    except FileNotFoundError:
        return []  # being deleted or trimmed by someone else
    if newest.state not in COMPLETE or before.state not in PREPARED or \
            newest.decision_id != before.decision_id or not before.is_shared or \
            before.pending_offsets:
        return []
    deleted = []
    for name in names:
        storage.delete(f"{directory}/{name}")
        deleted.append(f"{directory}/{name}")
    storage.delete(directory)
    root.coordinator.forget(transactional_id)
    return deleted


def end_open_jobs(root: Root, prefix: str, reason: str, keep: str | None = None) -> list[str]:
    """End every unfinished job of ``prefix`` (but decision ``keep``'s); returns the
    transactional ids of the attempts it aborted.

    Undecided ones are aborted (a shared one whole), decided ones rolled
    forward.  Only the caller knows that no live job of the prefix needs
    them: the next job of a prefix (its predecessors are dead or fenced), or
    a stream sink's owner whose micro-batch failed (its batches run one at a
    time, and no other query writes under its prefix).  The jobs come from
    the prefix's index: the cost is that of the unfinished jobs, not of the log.
    """
    ended = []
    for decision_id in root.storage.list(job_dir(prefix)):
        if decision_id != keep:
            ended += _end_job(root, prefix, decision_id, reason)
    return ended
