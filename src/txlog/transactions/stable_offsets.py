"""Offset fetches that never return offsets older than a committed transaction's.

Since EndTxn returns at its decision (docs/protocol.md 4.5), a transaction's
group offsets are applied a moment later, by its roll-forward.  A fetch in
that window must not answer with the offsets from before it: a member that
takes over the partitions would start from them and process records again.
Kafka's ``require_stable`` offset fetch (KIP-447) waits for such a
transaction; here the fetch finds it among the group's pending transactional
sends (every transactional offset send registers there before its decision,
groups.py) and rolls it forward itself, then reads the group again
(docs/protocol.md 9.7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .groups import TopicPartition, read_group
from .metadata import PREPARED, TxnState as S

if TYPE_CHECKING:
    from .coordinator import TransactionCoordinator

_UNFINISHED = frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE, *PREPARED})


def stable_offsets(coordinator: TransactionCoordinator, group_id: str,
                   partitions: list[TopicPartition] | None = None
                   ) -> dict[TopicPartition, int]:
    """The group's committed offsets (of ``partitions``, or all), with every transaction
    that committed offsets for them before this call applied first.

    A pending send whose transaction is still undecided is left alone: its offsets
    are not committed, and whether it commits after this read began is a race the
    fetch may lose.  One whose transaction is decided but unfinished is rolled
    forward.  One seen finished is only re-read: a commit clears its registration
    in the version that applies its offsets, so the next read of the group has
    them, and a registration still there then belonged to an abort.
    """
    wanted = None if partitions is None else {tuple(tp) for tp in partitions}
    settled: set[tuple[str, tuple[int, int, int]]] = set()
    while True:
        group = read_group(coordinator.storage, group_id)
        again = False
        for tid, send in ([] if group is None else group.pending.items()):
            if (tid, send.key) in settled or \
                    (wanted is not None and not wanted.intersection(send.partitions)):
                continue
            meta = coordinator.metadata(tid)
            if meta is not None and meta.state in _UNFINISHED and \
                    (meta.txn_producer_id, meta.txn_epoch) == send.writer:
                if meta.state == S.ONGOING and coordinator.decision(meta.decision_id) is None:
                    continue  # undecided: nothing of it is committed
                coordinator.complete(tid, only_decision=meta.decision_id)
            settled.add((tid, send.key))
            again = True
        if not again:
            offsets = {} if group is None or group.deleted else group.offsets
            if wanted is None:
                return dict(offsets)
            return {tp: offsets[tp] for tp in wanted if tp in offsets}
