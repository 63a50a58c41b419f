"""Admission control of the stream reader: how far one micro-batch may read.

Spark asks a source for the end of the next micro-batch under a read limit.
The limits and their rules follow Spark's Kafka source: a row budget is
shared among partitions in proportion to their backlog (so a partition far
behind catches up faster, and none is starved: a partition with any backlog
gets at least one record; unlike Kafka's, the shares add up to the whole
budget), a minimum backlog delays a trigger until it is
reached or ``maxTriggerDelay`` has passed.  A byte budget is shared the same
way and converted to offsets with the batch sizes in the batch headers, so
it is exact to a batch.
"""

from __future__ import annotations

import math
from ..root.root import Root

TopicPartition = tuple[str, int]
Positions = dict[TopicPartition, int]


def backlog(start: Positions, end: Positions) -> dict[TopicPartition, int]:
    """Records between ``start`` and ``end`` per partition (only those with some)."""
    return {tp: e - start[tp] for tp, e in end.items() if e > start[tp]}


def _shares(budget: int, sizes: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """``budget`` split in proportion to ``sizes``; a share under one is rounded up."""
    total = sum(sizes.values())
    out = {}
    for tp, size in sizes.items():
        share = budget * size / total
        out[tp] = math.ceil(share) if share < 1 else math.floor(share)
    return out


def limit_rows(start: Positions, end: Positions, max_rows: int) -> Positions:
    """``end`` moved back so that ``max_rows`` offsets are read in all (more only where a
    starved partition's share was rounded up to one)."""
    sizes = backlog(start, end)
    total = sum(sizes.values())
    if total <= max_rows:
        return dict(end)
    shares = _shares(max_rows, sizes)
    # Rounding every share down leaves up to one offset per partition unread; Spark's
    # Kafka source leaves it to a later micro-batch, so that Trigger.AvailableNow over
    # k times maxOffsetsPerTrigger runs k + 1 micro-batches, the last one of a few
    # records.  The largest remainders take the offsets back, within their backlog.
    left = max_rows - sum(shares.values())
    by_remainder = sorted(shares, key=lambda tp: max_rows * sizes[tp] % total, reverse=True)
    for tp in by_remainder:
        if left <= 0:
            break
        if shares[tp] < sizes[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: min(e, start[tp] + shares[tp]) if tp in shares else e for tp, e in end.items()}


def limit_bytes(root: Root, start: Positions, end: Positions, max_bytes: int) -> Positions:
    """``end`` moved back so that the batches read hold about ``max_bytes`` in all."""
    sizes = backlog(start, end)
    if not sizes:
        return dict(end)
    shares = _shares(max_bytes, sizes)
    out = dict(end)
    for tp, share in shares.items():
        out[tp] = _offset_after_bytes(root, tp, start[tp], end[tp], share)
    return out


def _offset_after_bytes(root: Root, tp: TopicPartition, start: int, end: int, budget: int) -> int:
    """The end of the whole batches from ``start`` that fit ``budget`` bytes (at least one
    record: a first batch larger than the budget is read in proportion)."""
    part = root.partition(*tp)
    used, pos = 0, start
    for ref in part.batch_refs(start, end):
        header = part.header(ref.base)
        first = max(header.base_offset, pos)
        last = min(header.next_offset, end)
        # Only the part of the batch from ``pos`` counts (a range may start mid-batch).
        size = header.payload_length * (last - first) // max(header.record_count, 1)
        if used + size > budget:
            if pos == start:
                fit = budget * (last - first) // max(size, 1)
                return min(start + max(fit, 1), end)
            return pos
        used += size
        pos = last
    return pos  # never past end: each step stops at min(batch end, end)
