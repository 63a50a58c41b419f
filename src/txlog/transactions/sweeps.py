"""Sweeps over many transactions: timeouts, hanging transactions, expired ids.

Nothing here is asked by a producer about its own transaction: these are
the coordinator's timers (Kafka's abortTimedOutTransactions and
transactional-id expiration), run by whichever process sweeps (a reader
held back by an LSO, a producer after its append, gc, the command line), and
the whole-chain deletion of ids Dead for long enough (docs/protocol.md,
4.9 and 4.10).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgpack

from .. import clock
from ..partition.producer_state import OpenTransaction, ProducerState
from .ending import COORDINATOR_LOGGER, TransactionEnder
from .metadata import IDLE, TransactionMetadata, TxnState as S
from .store import CoordinatorStore

if TYPE_CHECKING:
    from ..partition.partition_log import PartitionLog

logger = logging.getLogger(COORDINATOR_LOGGER)


@dataclass(frozen=True)
class HangingTransaction:
    """An undecided transaction open in a partition, holding its LSO back; ``reason`` says
    why nobody will end it, or is empty while its producer still may."""

    topic: str
    partition: int
    first_offset: int
    producer_id: int
    epoch: int
    transactional_id: str
    decision_id: str
    start_ms: int  # -1 when no coordinator state is left
    reason: str


class Sweeps:
    """The timers of ``TransactionCoordinator`` (its public methods of the same names)."""

    def __init__(self, store: CoordinatorStore, ender: TransactionEnder,
                 partition: Callable[[str, int], PartitionLog]) -> None:
        self.store = store
        self.ender = ender
        self._partition = partition

    def abort_if_expired(self, transactional_id: str) -> bool:
        meta = self.store.metadata(transactional_id)
        if meta is None or not self.store.expired(meta, clock.now_ms()):
            return False
        self.ender.fence_and_abort(transactional_id, "transaction timed out", only=meta)
        # True only if it ended aborted: a commit decision may have come first.
        decision = self.store.decision(meta.decision_id)
        aborted = decision is not None and \
            not decision.commits(meta.txn_producer_id, meta.txn_epoch)
        if aborted:
            # Its producer stalled or died mid-transaction: its records will never be read.
            logger.info("aborted transaction %r of %r (producer %d epoch %d): ongoing for "
                        "longer than its timeout of %d ms", meta.decision_id, transactional_id,
                        meta.txn_producer_id, meta.txn_epoch, meta.timeout_ms)
        return aborted

    def abort_expired(self) -> list[str]:
        aborted = []
        for txn_id in self.store.transactional_ids():
            if self.abort_if_expired(txn_id):
                aborted.append(txn_id)
            else:
                self.ender.complete(txn_id)
        return aborted

    def abort_expired_in(self, topic: str, partition: int, state: ProducerState | None = None,
                         own: tuple[int, int] | None = None) -> list[str]:
        if state is None:
            state = self._partition(topic, partition).state()
        aborted = []
        for txn in state.open_transactions():
            if not txn.transactional_id or (txn.producer_id, txn.epoch) == own:
                continue
            if self.store.resolve(txn) is not None:
                self.ender.complete(txn.transactional_id, only_decision=txn.decision_id)
            elif self.abort_if_expired(txn.transactional_id):
                aborted.append(txn.transactional_id)
        return aborted

    def find_hanging(self, partitions: list[tuple[str, int]], older_than_ms: int | None = None,
                     now_ms: int | None = None) -> list[HangingTransaction]:
        return [t for t in self.undecided(partitions, older_than_ms, now_ms) if t.reason]

    def undecided(self, partitions: list[tuple[str, int]], older_than_ms: int | None = None,
                  now_ms: int | None = None) -> list[HangingTransaction]:
        now = clock.now_ms() if now_ms is None else now_ms
        found = []
        for topic, partition in partitions:
            for txn in self._partition(topic, partition).state().open_transactions():
                if self.store.resolve(txn) is not None:
                    continue  # decided: its markers are only late, it holds no LSO
                meta = self.store.metadata(txn.transactional_id) \
                    if txn.transactional_id else None
                found.append(HangingTransaction(
                    topic, partition, txn.first_offset, txn.producer_id, txn.epoch,
                    txn.transactional_id, txn.decision_id,
                    meta.txn_start_ms if meta is not None else -1,
                    self._why_hanging(txn, meta, now, older_than_ms) or ""))
        return found

    def _why_hanging(self, txn: OpenTransaction, meta: TransactionMetadata | None, now: int,
                     older_than_ms: int | None) -> str | None:
        """Why nothing will end the undecided ``txn`` by itself; None if something will."""
        if meta is None or meta.state != S.ONGOING or \
                (meta.txn_producer_id, meta.txn_epoch) != (txn.producer_id, txn.epoch):
            return "no coordinator state describes it"
        if self.store.expired(meta, now):
            return f"open past its timeout of {meta.timeout_ms} ms"
        if older_than_ms is not None and now - meta.txn_start_ms > older_than_ms:
            return f"open longer than {older_than_ms} ms"
        return None

    def expire_transactional_ids(self, max_idle_ms: int) -> list[str]:
        return [txn_id for txn_id in self.store.transactional_ids()
                if self.expire_idle(txn_id, max_idle_ms)]

    def expire_idle(self, transactional_id: str, max_idle_ms: int) -> bool:
        def step(meta: TransactionMetadata | None) -> TransactionMetadata | None:
            if meta is None:
                return None
            idle = clock.now_ms() - meta.update_ms
            if meta.state not in IDLE or idle <= max_idle_ms:
                return None
            return meta.dead()

        before, _ = self.store.chain(transactional_id).latest()
        return self.store.update(transactional_id, step) != before

    def delete_dead(self, transactional_id: str, dead_before_ms: int) -> list[str]:
        """See ``TransactionCoordinator.delete_dead``."""
        directory, names = self.store.stored_versions(transactional_id)
        if not names:
            return []
        try:
            newest = msgpack.unpackb(self.store.storage.read(f"{directory}/{names[-1]}"),
                                     strict_map_key=False)
        except FileNotFoundError:
            return []
        if newest.get("state") != S.DEAD.value or newest.get("update_ms", 0) >= dead_before_ms:
            return []
        return self.store.delete_chain(transactional_id, directory, names)
