"""A bounded pool of job prefixes, so that jobs without a prefix of their own re-use ids.

A Spark batch job given no ``transactional.id.prefix`` used to take a random
one: every job made new transactional ids, every attempt a new producer id,
and both accumulated until they expired (a day for producer ids, seven for
transactional ids), in the coordinator and in every partition's producer
state (issue 33).  Here such a job leases one of ``size`` prefixes of a base
(``<base>.pool-<slot>``) for its lifetime, and its attempts take ids that the
next job of the slot takes again (``attempt_key``), so InitProducerId bumps
their epochs instead of creating producers.

Each slot is a version chain, ``coordinator/pools/<base>/<slot>``, whose
newest version names the job holding it (its decision id) or none.  A job
takes a slot by publishing the next version (publish-if-absent: two drivers
cannot both take one version), when the slot is free or its holder is over:
decided, or with a lease (protocol.md 5, "the lease") older than its timeout,
the same condition under which anyone may abort it.  It frees the slot at its
end.  docs/protocol.md 5.4 argues the pool against zombies, speculation,
concurrent jobs and a driver restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import clock
from ..errors import ConcurrentTransactionsError, InvalidConfigError
from ..storage.chain import VersionChain
from ..storage.paths import pool_slot_dir
from .shared_transaction import SharedTransaction, begin_job, check_prefix, fresh_decision_id

if TYPE_CHECKING:
    from ..api.log import Log
    from ..root.root import Root
    from ..transactions.coordinator import TransactionCoordinator

# Concurrent jobs of one base before the next is refused (docs/spark.md says how to size it).
DEFAULT_POOL_SIZE = 8
MAX_POOL_SIZE = 1024


def pooled_prefix(base: str, slot: int) -> str:
    return f"{base}.pool-{slot}"


@dataclass(frozen=True)
class PoolLease:
    """The slot a job holds: small and picklable, it travels with the job to its commit."""

    base: str
    slot: int
    decision_id: str

    def release(self, root: Root) -> None:
        """Free the slot, unless another job has taken it since (this one was over)."""
        now = clock.now_ms()

        def step(version: int, value: dict[str, Any] | None) -> dict[str, Any] | None:
            if value is None or value.get("decision_id") != self.decision_id:
                return None
            return {"decision_id": "", "time_ms": now, "timeout_ms": 0}
        _chain(root, self.base, self.slot).update(step)


def start_pooled_job(log: Log, base: str, size: int,
                     timeout_ms: int) -> tuple[SharedTransaction, PoolLease]:
    """A new job on the first slot of ``base``'s pool that is free or whose holder is over.

    The slot is taken before the job begins: beginning ends what the
    slot's earlier jobs left open (``end_leftovers``), which only the slot's
    holder may do.
    """
    if not 1 <= size <= MAX_POOL_SIZE:
        raise InvalidConfigError(
            f"transactionalIdPoolSize must be from 1 to {MAX_POOL_SIZE}, not {size}")
    check_prefix(pooled_prefix(base, size - 1))
    for slot in range(size):
        decision_id = _take(log.services, base, slot, timeout_ms)
        if decision_id is not None:
            job = begin_job(log, pooled_prefix(base, slot), decision_id, timeout_ms)
            return job, PoolLease(base, slot, decision_id)
    raise ConcurrentTransactionsError(
        f"all {size} pooled prefixes of {base!r} are held by running jobs: raise "
        f"transactionalIdPoolSize above the number of jobs that write at once, or give "
        f"each concurrent job a transactional.id.prefix of its own")


def _take(root: Root, base: str, slot: int, timeout_ms: int) -> str | None:
    """The decision id of a new job holding ``slot`` now, or None if a live job holds it."""
    coordinator = root.coordinator
    decision_id = fresh_decision_id(pooled_prefix(base, slot))
    now = clock.now_ms()

    def step(version: int, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and not _over(coordinator, value, now):
            return None
        return {"decision_id": decision_id, "time_ms": now, "timeout_ms": timeout_ms}
    _, held = _chain(root, base, slot).update(step)
    return decision_id if held is not None and held["decision_id"] == decision_id else None


def _over(coordinator: TransactionCoordinator, value: dict[str, Any], now_ms: int) -> bool:
    """Whether the job recorded in a slot's version no longer needs it: none, decided, or
    with no participant alive for its timeout (counted from the slot's taking too, as the
    job renews its lease only after it took the slot)."""
    holder = value["decision_id"]
    if not holder or coordinator.decision(holder) is not None:
        return True
    alive_ms = max(value["time_ms"], coordinator.lease_ms(holder))
    return now_ms > alive_ms + value["timeout_ms"]


def _chain(root: Root, base: str, slot: int) -> VersionChain:
    return VersionChain(root.storage, pool_slot_dir(base, slot))
