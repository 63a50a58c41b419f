"""The exactly-once sink of a stream of numbered batches (Spark's micro-batches).

A streaming engine replays a batch after a crash: it runs the batch's tasks
and its commit again, with the same batch id, and it may do so whether the
first run's commit happened or not.  Exactly once therefore needs the sink
to know, after any crash, whether batch ``n`` is already committed, and to
make "batch n is committed" true in the same decision that makes its
records visible.  Kafka's Spark sink cannot do this (one transaction per
producer), Flink's KafkaSink can only for one writer per transactional id.

Here a stream sink has a stable ``prefix`` (``transactional.id.prefix``) and
three parts, all under that prefix:

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

Fencing: every run of the query re-initialises ``<prefix>-sink`` before its
tasks look at the group.  An earlier driver's commit that was decided is
rolled forward by that; one that was not yet decided is aborted (its whole
shared transaction with it), and a driver that was only slow is fenced, so
it cannot commit a batch the new run writes again.  Open transactions that
earlier runs left behind are aborted when the next batch commits, so no
partition's LSO stays held.  Two queries must not share a prefix at the same
time, as two Kafka producers must not share a transactional id.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..transactions.coordinator import TransactionMember
from ..transactions.groups import committed_offsets
from .shared_transaction import SharedTransaction, check_prefix

if TYPE_CHECKING:
    from ..log import Log
    from ..clients.producer import Producer

# The key under which the sink group records the next batch id to commit.
BATCH_TOPIC = "_batch"
SINK_SUFFIX = "-sink"


@dataclass(frozen=True)
class StreamSink:
    """A stream's exactly-once sink: small and picklable, it travels to every task."""

    prefix: str
    timeout_ms: int

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @property
    def sink_id(self) -> str:
        """The sink member's transactional id, and the group recording committed batches."""
        return f"{self.prefix}{SINK_SUFFIX}"

    def fence(self, log: Log) -> None:
        """Take over the sink from any earlier run (see the module's docstring)."""
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
        """The lowest batch id not committed yet (0 for a new sink).

        A commit whose decision stands but whose completion was cut short is
        rolled forward first, so its batch counts as committed.
        """
        log.coordinator.complete(self.sink_id)
        done = committed_offsets(log.storage, self.sink_id, [(BATCH_TOPIC, 0)])
        return done.get((BATCH_TOPIC, 0), 0)

    def is_committed(self, log: Log, batch_id: int) -> bool:
        return batch_id < self.next_batch(log)

    def commit_batch(self, log: Log, job: SharedTransaction, batch_id: int,
                     members: list[TransactionMember],
                     group_offsets: dict[str, dict[tuple[str, int], int]] | None = None
                     ) -> bool:
        """Commit batch ``batch_id``: ``members`` and the batch id, in one decision.

        Returns False, and aborts ``members``, when the batch was committed
        before (a replay whose tasks wrote anyway).  Safe to call again.
        """
        producer = self._sink_producer(log)
        try:
            if self.is_committed(log, batch_id):
                if members:
                    job.abort(log, members)
                return False
            producer.begin_transaction(job.decision_id)
            producer.send_offsets_to_transaction({(BATCH_TOPIC, 0): batch_id + 1}, self.sink_id)
            for group, offsets in (group_offsets or {}).items():
                if offsets:
                    producer.send_offsets_to_transaction(offsets, group)
            sink_member = producer.prepare_transaction()
        finally:
            producer.close()
        job.commit(log, [*members, sink_member])
        job.end_leftovers(log)
        return True

    def abort_batch(self, log: Log, job: SharedTransaction,
                    members: list[TransactionMember]) -> None:
        """Abort a batch's transaction (a no-op answer if its commit already stands)."""
        job.abort(log, members)

    def _sink_producer(self, log: Log) -> Producer:
        producer = log.producer(transactional_id=self.sink_id,
                                transaction_timeout_ms=self.timeout_ms)
        producer.init_transactions()
        return producer
