"""Retention of one partition: deleting whole segments from the log start.

Kafka's rules, by time (``retention.ms``) and by size (``retention.bytes``),
applied to segments only: batch objects are never deleted by retention, so a
partition is compacted before retention can shorten it.  The newest segment
always stays, since its snapshot carries the producer state past everything
deleted (docs/protocol.md, section 7; compaction.py has the other rules).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .. import clock
from .compaction import retire_batches
from .state_manager import StateManager

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Retained:
    """What retention removed from one partition."""

    segments_deleted: int
    bytes_deleted: int
    log_start: int


def apply_retention(states: StateManager, retention_ms: int = -1, retention_bytes: int = -1,
                    now_ms: int | None = None) -> Retained:
    """Delete the oldest segments that retention allows (Kafka's rules, whole segments).

    A segment goes when its newest record is older than ``retention_ms``, or
    while the partition without it still holds ``retention_bytes`` or more;
    -1 disables a rule.  The newest segment always stays.
    """
    now_ms = clock.now_ms() if now_ms is None else now_ms
    heads = states.cache.segment_heads()
    if len(heads) < 2 or (retention_ms < 0 and retention_bytes < 0):
        return Retained(0, 0, heads[0].base_offset if heads else 0)
    tail_bytes = states.cache.tail_sizes(states.state().end_offset)[1]
    total = sum(h.total_length for h in heads) + tail_bytes
    doomed = []
    for head in heads[:-1]:
        by_size = retention_bytes >= 0 and total - head.total_length >= retention_bytes
        newest = states.cache.time_index(head.base_offset).newest
        newest = head.created_ms if newest is None else newest
        by_time = retention_ms >= 0 and newest < now_ms - retention_ms
        if not (by_size or by_time):
            break
        doomed.append(head)
        total -= head.total_length
    if doomed:
        retire_batches(states, doomed[-1].end_offset)
    for head in doomed:
        states.storage.delete(head.path)
    log_start = states.cache.log_start()
    if doomed:
        logger.info("%s-%d: retention deleted %d segments; log start offset now %d",
                    states.topic, states.partition, len(doomed), log_start)
    return Retained(len(doomed), sum(h.total_length for h in doomed), log_start)
