"""Where the coordinator's state is stored: metadata chains, decisions and leases.

One chain of ``TransactionMetadata`` versions per transactional id
(``coordinator/transactions/<id>/``), one decision object per transaction
(``coordinator/decisions/<id>``) and one lease chain per shared transaction
(``coordinator/leases/<decision id>/``).  A process keeps the chains and
decisions it touched cached: a chain checks its cache against storage
(storage/chain.py), and a decision never changes once published.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgpack

from .. import clock
from ..partition.producer_state import OpenTransaction
from ..storage.chain import VersionChain
from ..storage.lru import LruDict
from ..storage.names import validate_name
from ..storage.paths import DECISION_DIR, LEASE_DIR, TXN_DIR
from .metadata import MAX_EPOCH, Decision, Lease, TransactionMetadata

if TYPE_CHECKING:
    from ..storage.contract import Storage

CACHED_CHAINS = 4096  # transactional ids (and decisions) whose chains a process keeps cached

MetadataStep = Callable[[TransactionMetadata | None], TransactionMetadata | None]


class CoordinatorStore:
    """The stored state of one root's transactions, as one process sees it.

    ``next_producer_id`` hands out a fresh producer id (producer_ids.py), for
    an identity whose epochs are exhausted.
    """

    def __init__(self, storage: Storage, next_producer_id: Callable[[], int]) -> None:
        self.storage = storage
        self._next_producer_id = next_producer_id
        # Per transactional id or decision this process touched: bounded, since a
        # process may live through many jobs (storage/lru.py); a dropped entry is read again.
        self.chains: LruDict[str, VersionChain] = LruDict(CACHED_CHAINS)
        self._decisions: LruDict[str, Decision] = LruDict(CACHED_CHAINS)
        # Identities whose epochs ran out here, so that a new producer id was taken (as
        # Kafka does): an id re-used by every job of a pooled prefix gets there after
        # about 16,000 of its transactions.
        self.epochs_exhausted = 0

    # --- metadata chains ----------------------------------------------------------------------

    def chain(self, transactional_id: str) -> VersionChain:
        chain = self.chains.get(transactional_id)
        if chain is None:
            validate_name(transactional_id, "transactional id")
            chain = self.chains.setdefault(
                transactional_id, VersionChain(self.storage, f"{TXN_DIR}/{transactional_id}"))
        return chain

    def metadata(self, transactional_id: str) -> TransactionMetadata | None:
        """Latest metadata of a transactional id (None if it never existed)."""
        return self.latest(transactional_id)[1]

    def latest(self, transactional_id: str) -> tuple[int, TransactionMetadata | None]:
        version, value = self.chain(transactional_id).latest()
        return version, None if value is None else TransactionMetadata.from_dict(value)

    def publish(self, version: int, meta: TransactionMetadata) -> bool:
        return self.chain(meta.transactional_id).publish(version, meta.to_dict())

    def update(self, transactional_id: str, step: MetadataStep,
               guess_own_head: bool = False) -> int:
        """Publish the version ``step`` computes from the newest (storage/chain.py's
        ``update``); returns the version that ended the loop."""
        def chain_step(version: int, value: dict | None) -> dict | None:
            new = step(None if value is None else TransactionMetadata.from_dict(value))
            return None if new is None else new.to_dict()

        return self.chain(transactional_id).update(chain_step, guess_own_head=guess_own_head)[0]

    def transactional_ids(self) -> list[str]:
        return sorted(self.storage.list(TXN_DIR))

    def forget(self, transactional_id: str) -> None:
        self.chains.pop(transactional_id, None)

    def stored_versions(self, transactional_id: str) -> tuple[str, list[str]]:
        """The chain's directory and the names of its versions in storage, oldest first
        (one listing, not the cached chain: for deleting it whole)."""
        directory = f"{TXN_DIR}/{validate_name(transactional_id, 'transactional id')}"
        return directory, sorted(n for n in self.storage.list(directory) if n.isdigit())

    def delete_chain(self, transactional_id: str, directory: str, names: list[str]
                     ) -> list[str]:
        """Delete the versions ``names`` oldest first, then the directory, and forget the
        cached chain; returns the paths deleted (docs/protocol.md, 4.10)."""
        deleted = []
        for name in names:
            self.storage.delete(f"{directory}/{name}")
            deleted.append(f"{directory}/{name}")
        self.storage.delete(directory)
        self.forget(transactional_id)
        return deleted

    def new_producer_id(self) -> int:
        return self._next_producer_id()

    def next_identity(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """The identity after a bump; a new producer id once the epoch is exhausted."""
        if epoch + 1 >= MAX_EPOCH:
            self.epochs_exhausted += 1
            return self._next_producer_id(), 0
        return producer_id, epoch + 1

    # --- decisions ---------------------------------------------------------------------------

    def decision(self, decision_id: str) -> Decision | None:
        found = self._decisions.get(decision_id)
        if found is not None:
            return found
        path = f"{DECISION_DIR}/{decision_id}"
        try:
            raw = msgpack.unpackb(self.storage.read(path))
        except FileNotFoundError:
            return None
        # Its publisher may not have made it durable yet (on local disk: linked, its
        # directory not fsynced): what this process does on it (markers, a roll-forward,
        # records returned as committed) must not outlive it at a power cut (protocol.md 4.6).
        self.storage.make_durable(path)
        found = Decision.from_value(raw)
        self._decisions[decision_id] = found  # decisions never change once published
        return found

    def decide(self, decision_id: str, commit: bool, members: list[tuple[int, int]],
               reason: str) -> Decision:
        """Publish the decision unless one exists; returns whichever decision stands."""
        validate_name(decision_id, "decision id")
        taken = Decision.taken(commit, members, reason)
        if self.storage.publish_if_absent(f"{DECISION_DIR}/{decision_id}",
                                          msgpack.packb(taken.to_value())):
            self._decisions[decision_id] = taken  # durable: its publish returned
            return taken
        decision = self.decision(decision_id)
        assert decision is not None
        return decision

    def resolve(self, txn: OpenTransaction) -> bool | None:
        """Outcome of a transaction still open in a partition: None while undecided."""
        if not txn.decision_id:
            return None
        decision = self.decision(txn.decision_id)
        if decision is None:
            return None
        return decision.commits(txn.producer_id, txn.epoch)

    # --- leases of shared transactions --------------------------------------------------------

    def lease(self, decision_id: str) -> VersionChain:
        key = f"lease:{decision_id}"
        chain = self.chains.get(key)
        if chain is None:
            validate_name(decision_id, "decision id")
            chain = self.chains.setdefault(key, VersionChain(self.storage,
                                                             f"{LEASE_DIR}/{decision_id}"))
        return chain

    def renew_lease(self, decision_id: str, unless_younger_than_ms: int = 0) -> int:
        """Renew the lease now (see ``TransactionCoordinator.renew_lease``); returns its time."""
        validate_name(decision_id, "decision id")
        now = clock.now_ms()

        def step(version: int, value: dict | None) -> dict | None:
            if value is None:
                return Lease(now).to_value()
            renewed = Lease.from_value(value).renewed(now, unless_younger_than_ms)
            return None if renewed is None else renewed.to_value()
        _, value = self.lease(decision_id).update(step)
        return -1 if value is None else int(Lease.from_value(value).time_ms)

    def lease_ms(self, decision_id: str) -> int:
        """When the lease of ``decision_id`` was last renewed (-1: never)."""
        _, value = self.lease(decision_id).latest()
        return -1 if value is None else Lease.from_value(value).time_ms

    def expired(self, meta: TransactionMetadata, now_ms: int) -> bool:
        """Past its timeout; a member of a shared transaction counted from its lease."""
        if not meta.expired(now_ms):
            return False  # the lease can only make it younger
        lease = self.lease_ms(meta.decision_id) if meta.is_shared else -1
        return meta.expired(now_ms, lease)
