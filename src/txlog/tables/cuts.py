"""Consistent cuts: one end offset per partition that never splits a transaction.

A snapshot of a topic's table holds, per partition, the read_committed records
below an offset (its cut).  Per-partition last stable offsets, read one after
another, are not such cuts: a transaction may be decided between reading one
partition's LSO and another's, and even within one partition the LSO may fall
between two batches of a committed transaction interleaved with an undecided
one.  docs/tables.md ("The cut rule") argues the rule below; in short:

1. Every partition's state is read (phase 1); then the transactions met in
   them are resolved.  ``committed_before`` is the set known committed at that
   moment: closed by a COMMIT marker in a phase-1 state, or open there and
   resolved as committed.  Each was decided before the moment, and every batch
   of a transaction is written before its decision (protocol.md 4.5).
2. Every state is read again (phase 2).  Each batch of the unsynced range is
   plain, aborted, of a transaction in ``committed_before`` (whose batches are
   then all below every phase-2 end), or of anything else: "undecided", which
   the cut must stay below.
3. A fixed point lowers the cuts: a committed transaction not wholly below the
   cut in every partition where it has batches is pushed wholly above it
   (every cut lowered to its first batch there), until nothing moves.

Batches are walked by their headers (cached from the state refreshes for
batch objects; a segment's are read from it): a loop per batch, never per
record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..format.batch import BatchHeader
from ..partition.partition_log import PartitionLog
from ..partition.producer_state import OpenTransaction, ProducerState

# Resolves a transaction open in a partition: True committed, False aborted, None undecided.
Resolver = Callable[[OpenTransaction], "bool | None"]


def txn_key(header: BatchHeader) -> str:
    """What one transaction's batches share in every partition: its decision id (a shared
    transaction's members share their job's), or the producer and epoch of a batch
    written before headers carried one."""
    return header.decision_id or f"{header.producer_id}/{header.producer_epoch}"


@dataclass
class PartitionSpans:
    """Where the transactions of one partition's unsynced range ``[start, end)`` lie."""

    partition: int
    start: int
    end: int
    committed: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> [first, end)
    undecided: int | None = None  # first offset of a batch the cut must stay below


def transactional_batches(part: PartitionLog, state: ProducerState, start: int
                          ) -> Iterator[tuple[BatchHeader, bool, OpenTransaction | None]]:
    """Each live transactional data batch of ``[start, state's end)``: its header, whether
    it is aborted, and the open transaction it belongs to in ``state`` (None: closed)."""
    end = state.end_offset
    if end <= start:
        return
    aborted = part.aborted_check(state, start, end)
    opened = {t.producer_id: t for t in state.open_transactions()}
    for ref in part.batch_refs(start, end, state):
        header = part.header(ref.base)
        if header.is_control or not header.is_transactional:
            continue
        txn = opened.get(header.producer_id)
        if txn is not None and header.base_offset < txn.first_offset:
            txn = None
        yield header, aborted(header.producer_id, header.base_offset), txn


def committed_before(parts: list[PartitionLog], states: list[ProducerState],
                     starts: list[int], resolve: Resolver) -> set[str]:
    """Phase 1's result: the transactions of these states decided as committed by now
    (the caller read every state before calling)."""
    known: set[str] = set()
    opened: dict[str, OpenTransaction] = {}
    for part, state, start in zip(parts, states, starts):
        for header, aborted, txn in transactional_batches(part, state, start):
            if aborted:
                continue
            if txn is None:
                known.add(txn_key(header))  # its COMMIT marker is in this state
            else:
                opened.setdefault(txn_key(header), txn)
    known.update(key for key, txn in opened.items() if resolve(txn) is True)
    return known


def spans_of(part: PartitionLog, state: ProducerState, start: int, committed: set[str]
             ) -> PartitionSpans:
    """Phase 2 for one partition: its committed transactions' spans and its first batch
    of anything not known committed before this state was read."""
    spans = PartitionSpans(part.partition, start, state.end_offset)
    for header, aborted, _ in transactional_batches(part, state, start):
        if aborted:
            continue
        key = txn_key(header)
        base = max(header.base_offset, start)
        if key in committed:
            first, end = spans.committed.get(key, (base, header.next_offset))
            spans.committed[key] = (min(first, base), max(end, header.next_offset))
        elif spans.undecided is None:
            spans.undecided = base
    return spans


def consistent_cuts(spans: list[PartitionSpans]) -> dict[int, int]:
    """The highest cuts, each at most its partition's end and below its undecided batches,
    such that every committed transaction lies wholly below the cuts or wholly above them
    in every partition where it has batches."""
    cuts = {s.partition: s.end if s.undecided is None else s.undecided for s in spans}
    where: dict[str, list[tuple[int, int, int]]] = {}
    for s in spans:
        for key, (first, end) in s.committed.items():
            where.setdefault(key, []).append((s.partition, first, end))
    moved = True
    while moved:
        moved = False
        for places in where.values():
            if all(end <= cuts[p] for p, _, end in places):
                continue
            for p, first, _ in places:
                if cuts[p] > first:
                    cuts[p] = first
                    moved = True
    return cuts
