"""The exactly-once sink of a stream of numbered batches (Spark's micro-batches).

A streaming engine replays a batch after a crash: it runs the batch's tasks
and its commit again, with the same batch id, and it may do so whether the
first run's commit happened or not.  Exactly once therefore needs the sink
to know, after any crash, whether batch ``n`` is already committed, and to
make "batch n is committed" true in the same decision that makes its
records visible.  Kafka's Spark sink cannot do this (one transaction per
producer), Flink's KafkaSink can only for one writer per transactional id.

Here a stream sink has a stable ``prefix`` (``transactional.id.prefix``, or
``txlog-sink-<query id>`` when none is given: ``query_prefix``) and three
parts, all under that prefix:

* each micro-batch is a ``SharedTransaction`` with a fresh decision id, whose
  members are the task attempts that wrote it;
* the *sink member* ``<prefix>-sink`` joins the same decision at commit
  time, carrying only group offsets: in group ``<prefix>-sink`` the offset
  of ``(BATCH_TOPIC, 0)`` becomes ``n + 1``, and in the query's own group
  (if any) the source offsets it read.  Offsets of a transaction are applied
  only if it commits, so "batch n is committed" and "its records are
  visible" are one fact;
* before a replayed batch writes anything, its tasks roll the sink member
  forward and read that group: a batch already committed is written again
  by nobody.

Ownership: one query owns a prefix.  The sink group records the owner's
query id (Spark's, from its checkpoint), and its batch ids are kept under a
key of that query, ``(_batch.<query id>, 0)``: a batch is skipped only when
the same query committed that batch id.  A query whose id is not the
owner's is refused before it writes anything (``SinkOwnerError``), unless it
names the owner it takes over from; a query whose checkpoint was deleted
starts at batch 0 under its new id, so it never finds its batches
"committed" by its predecessor.  A sink written before owners were recorded
(one ``(_batch, 0)`` key, no owner) is adopted, key and all, by the first
query that claims it.

Fencing: every commit re-initialises ``<prefix>-sink`` before it looks at
the group.  An earlier driver's commit that was decided is rolled forward
by that, and the batch is then found committed, its new members aborted;
one that was not yet decided is aborted (its whole shared transaction with
it), and a driver that was only slow is fenced, so it cannot commit a batch
the new run commits.  The tasks need no fence before them: what they find
is checked again by the commit, after its fence (docs/protocol.md 5.1).  A micro-batch that
fails is ended at once (``abort_batch``): its attempts' transactions are
aborted, so no partition's LSO stays held; open transactions that earlier
runs left behind are also aborted when the next batch commits.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..clients.producer import Producer
from ..errors import SinkOwnerError
from ..storage.names import validate_name
from ..transactions.metadata import TransactionMember
from ..transactions.groups import committed_offsets, set_owner
from .shared_transaction import SharedTransaction, check_prefix, end_open_jobs

if TYPE_CHECKING:
    from ..api.log import Log

logger = logging.getLogger(__name__)

# The sink group's key of the next batch id to commit is BATCH_TOPIC + "." + query id;
# sinks written before owners were recorded used BATCH_TOPIC alone.
BATCH_TOPIC = "_batch"
SINK_SUFFIX = "-sink"


# The prefix of a query's sink when it names none: QUERY_PREFIX_HEAD + its query id.
QUERY_PREFIX_HEAD = "txlog-sink-"


def query_prefix(query_id: str) -> str:
    """The sink prefix of query ``query_id`` when none is given.

    The query id is the query's identity (Spark keeps it in the checkpoint, the
    same for every restart, a new one for a new query), so the prefix stays
    with the query across restarts, however its checkpoint is spelled or
    moved, and no other query derives it: the owner is always that query.
    """
    return check_prefix(QUERY_PREFIX_HEAD + validate_name(query_id, "query id"))


def batch_key(query_id: str) -> tuple[str, int]:
    """The sink group's key holding query ``query_id``'s next batch id."""
    return (f"{BATCH_TOPIC}.{query_id}", 0)


@dataclass(frozen=True)
class SinkOwner:
    """The sink group's owner and offsets, as a claim finds them (the group's chain
    records both, transactions/groups.py); ``owner`` is None for a new sink, or one
    written before owners were recorded."""

    owner: str | None
    offsets: dict[tuple[str, int], int]

    def claimed_by(self, query_id: str) -> SinkOwner:
        """Owned by ``query_id``.  A sink that had no owner hands its batch key
        ``(_batch, 0)``, if any, over to the claimant's."""
        offsets = dict(self.offsets)
        if self.owner is None:
            legacy = offsets.pop((BATCH_TOPIC, 0), None)
            if legacy is not None:
                offsets[batch_key(query_id)] = legacy
        return SinkOwner(query_id, offsets)


@dataclass(frozen=True)
class StreamSink:
    """A stream's exactly-once sink: small and picklable, it travels to every task.

    ``query_id`` is the stable identity of the query across restarts (Spark's
    query id, kept in its checkpoint); ``take_over_from`` names an owner this
    query may replace (an explicit take-over).
    """

    prefix: str
    timeout_ms: int
    query_id: str
    take_over_from: str | None = None

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        validate_name(self.query_id, "query id")

    @property
    def sink_id(self) -> str:
        """The sink member's transactional id, and the group recording committed batches."""
        return f"{self.prefix}{SINK_SUFFIX}"

    def claim(self, log: Log) -> None:
        """Make this query the prefix's owner, or raise SinkOwnerError before anything is written.

        The claim is one version of the sink group's chain, so it is ordered
        with every commit's offsets and every other claim: of two queries
        claiming at once, one wins and the other is refused.
        """
        def step(owner: str | None, offsets: dict[tuple[str, int], int]
                 ) -> tuple[str, dict[tuple[str, int], int]] | None:
            current = SinkOwner(owner, offsets)
            if current.owner == self.query_id:
                return None
            if current.owner is not None and current.owner != self.take_over_from:
                raise self._owned_by(current.owner)
            claimed = current.claimed_by(self.query_id)
            return self.query_id, claimed.offsets

        set_owner(log.services.storage, self.sink_id, step)

    def _owned_by(self, owner: str) -> SinkOwnerError:
        return SinkOwnerError(
            f"transactional.id.prefix {self.prefix!r} is owned by {owner} (a streaming query's "
            f"id, or a txnAppId); this writer is {self.query_id}, and nothing of it was "
            f"written. Two writers must not share a prefix (each would take the other's batch "
            f"ids or versions as its own): give this one its own transactional.id.prefix. "
            f"If this is a streaming query whose predecessor {owner} is gone for good (its "
            f"checkpoint was deleted or replaced), take the prefix over explicitly with option "
            f"takeOverFrom={owner}: every batch of this query is then written, including "
            f"records {owner} wrote already if this query reads them "
            "again.", self.prefix, owner, self.query_id)

    def fence(self, log: Log) -> None:
        """Claim the prefix and take over the sink from any earlier run now, rather than
        at the next commit (see the module's docstring)."""
        self.claim(log)
        self._sink_producer(log).close()

    def begin_batch(self) -> SharedTransaction:
        """A fresh transaction for the next batch's tasks to join (its id travels to them).

        No lease yet: Spark also builds a writer for each commit, whose fresh
        decision is never used, and a lease only matters once a task has
        joined, which renews it while it works (``keep_alive``).
        """
        return SharedTransaction(self.prefix, f"{self.prefix}.{uuid.uuid4().hex}",
                                 self.timeout_ms)

    def next_batch(self, log: Log) -> int:
        """The lowest batch id this query has not committed yet (0 for a new query).

        A commit whose decision stands but whose completion was cut short is
        rolled forward first, so its batch counts as committed.
        """
        root = log.services
        root.coordinator.complete(self.sink_id)
        key = batch_key(self.query_id)
        return committed_offsets(root.storage, self.sink_id, [key]).get(key, 0)

    def is_committed(self, log: Log, batch_id: int) -> bool:
        return batch_id < self.next_batch(log)

    def commit_batch(self, log: Log, job: SharedTransaction, batch_id: int,
                     members: list[TransactionMember],
                     group_offsets: dict[str, dict[tuple[str, int], int]] | None = None,
                     claimed: bool = False) -> bool:
        """Commit batch ``batch_id``: ``members`` and the batch id, in one decision.

        Returns False, and aborts ``members``, when the batch was committed
        before (a replay whose tasks wrote anyway).  Raises SinkOwnerError,
        and aborts ``members``, when another query owns the prefix by now.
        ``claimed``: the caller has just claimed the prefix for this commit
        (the writer Spark built for it), which stands for the check here.
        Safe to call again.
        """
        try:
            # Before the sink producer's init, which would fence the owner's.  A claim
            # that finds this query the owner only reads; one that finds no owner (the
            # group was deleted) takes the prefix again, as a new query would.
            if not claimed:
                self.claim(log)
        except SinkOwnerError:
            if members:
                job.abort(log, members)
            raise
        producer = self._sink_producer(log)
        try:
            if self.is_committed(log, batch_id):
                if members:
                    job.abort(log, members)
                return False
            job.enlist(log, self.sink_id)
            producer.begin_transaction(job.decision_id)
            producer.send_offsets_to_transaction({batch_key(self.query_id): batch_id + 1},
                                                 self.sink_id)
            for group, offsets in (group_offsets or {}).items():
                if offsets:
                    producer.send_offsets_to_transaction(offsets, group)
            sink_member = producer.prepare_transaction()
        finally:
            producer.close()
        job.commit(log, [*members, sink_member])
        try:
            job.end_leftovers(log)
        except Exception:  # the batch is committed; the next commit ends them again
            logger.warning("ending transactions earlier runs of %s left open failed",
                           self.prefix, exc_info=True)
        return True

    def abort_batch(self, log: Log, job: SharedTransaction | None,
                    members: list[TransactionMember]) -> None:
        """End a failed micro-batch: its decision (if known) and every attempt still open.

        Spark's abort may know no member (every task failed) and never knows
        the decision the tasks joined, so the owner ends every open job
        transaction of its prefix: its micro-batches run one at a time and no
        other query writes under its prefix, so all of them belong to the
        failed batch or to dead runs.  A batch whose COMMIT stands is rolled
        forward instead (an ABORT request never overrides a decision).
        """
        self.claim(log)
        if job is not None:
            job.abort(log, members)
        end_open_jobs(log.services, self.prefix, "its micro-batch failed")

    def _sink_producer(self, log: Log) -> Producer:
        producer = Producer(log, transactional_id=self.sink_id,
                            transaction_timeout_ms=self.timeout_ms)
        producer.init_transactions()
        return producer
