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
* a running participant keeps the job's lease fresh, and members of a
  shared transaction time out only when the lease has gone stale, so a job
  longer than its timeout still commits while one whose driver died is
  aborted after the timeout (docs/spark.md).
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..transactions.coordinator import Decision, TransactionMember, TxnState
from ..errors import InvalidConfigError, TransactionAbortedError
from ..storage.names import validate_name

if TYPE_CHECKING:
    from ..log import Log
    from ..clients.producer import Producer

logger = logging.getLogger(__name__)

# Transactional ids and decision ids also travel in batch headers (at most
# 255 bytes there), so a prefix leaves room for what is appended to it.
MAX_PREFIX_LENGTH = 200


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

    @classmethod
    def start(cls, log: Log, prefix: str, timeout_ms: int) -> SharedTransaction:
        """A new job: a fresh decision id; leftovers of earlier jobs of ``prefix`` are ended."""
        check_prefix(prefix)
        job = cls(prefix, f"{prefix}.{uuid.uuid4().hex}", timeout_ms)
        job.end_leftovers(log)
        log.coordinator.renew_lease(job.decision_id)
        return job

    def transactional_id(self, key: str) -> str:
        return f"{self.prefix}-{key}"

    def join(self, log: Log, key: str, **producer_config: object) -> Producer:
        """A transactional producer for participant ``key``, inside this job's transaction."""
        producer = log.producer(transactional_id=self.transactional_id(key),
                                transaction_timeout_ms=self.timeout_ms, **producer_config)
        producer.init_transactions()
        producer.begin_transaction(self.decision_id)
        return producer

    @contextmanager
    def keep_alive(self, log: Log) -> Iterator[None]:
        """Renew the job's lease while the body runs (a participant at work)."""
        stop = threading.Event()
        interval = max(self.timeout_ms / 4000, 0.05)

        def renew() -> None:
            while not stop.wait(interval):
                try:
                    log.coordinator.renew_lease(self.decision_id)
                except Exception:  # a missed renewal only shortens the lease
                    logger.warning("renewing the lease of %s failed", self.decision_id,
                                   exc_info=True)

        log.coordinator.renew_lease(self.decision_id)
        thread = threading.Thread(target=renew, name=f"txlog-lease-{self.decision_id}",
                                  daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def commit(self, log: Log, members: list[TransactionMember]) -> Decision:
        """Commit exactly ``members``; raises unless every one of them is committed."""
        decision = log.coordinator.end_shared_transaction(self.decision_id, members, True)
        self.end_orphans(log)
        if not decision.commit:
            raise TransactionAbortedError(
                f"job transaction {self.decision_id!r} was aborted before it could commit "
                f"({decision.reason or 'aborted'})")
        return decision

    def abort(self, log: Log, members: list[TransactionMember]) -> Decision:
        """Abort the job (a no-op answer if its commit already stands)."""
        decision = log.coordinator.end_shared_transaction(self.decision_id, members, False)
        self.end_orphans(log)
        return decision

    def _own_ids(self, log: Log) -> list[str]:
        head = f"{self.prefix}-"
        return [t for t in log.coordinator.transactional_ids() if t.startswith(head)]

    def end_orphans(self, log: Log) -> None:
        """Roll forward every open transaction of this job that was not handed over.

        The decision stands by now, and it does not name them, so they end
        aborted.
        """
        for txn_id in self._own_ids(log):
            meta = log.coordinator.metadata(txn_id)
            if meta is not None and meta.state == TxnState.ONGOING and \
                    meta.decision_id == self.decision_id:
                log.coordinator.complete(txn_id, only_decision=self.decision_id)

    def end_leftovers(self, log: Log) -> None:
        """Abort transactions an earlier job of this prefix left open (its driver died).

        Two jobs must not share a prefix at the same time, as two Kafka
        producers must not share a transactional id: the newer one fences
        the older.
        """
        mine = re.compile(re.escape(self.prefix) + r"\.[0-9a-f]{32}")
        for txn_id in self._own_ids(log):
            meta = log.coordinator.metadata(txn_id)
            # The decision id's shape, not the transactional id's, says whose it is:
            # "etl-" also starts the ids of a job with prefix "etl-2".
            if meta is not None and meta.state == TxnState.ONGOING and \
                    meta.decision_id != self.decision_id and mine.fullmatch(meta.decision_id):
                logger.info("aborting %s, left open by an earlier job (decision %s)", txn_id,
                            meta.decision_id)
                log.coordinator.abort_open(txn_id, "left open by an earlier job of its prefix")

