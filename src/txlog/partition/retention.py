"""Retention of one partition: moving the log start forward and deleting whole segments.

Kafka's rules, by time (``retention.ms``) and by size (``retention.bytes``),
applied to segments only: batch objects are never deleted by retention, so a
partition is compacted before retention can shorten it.  The newest segment
always stays, since its snapshot carries the producer state past everything
deleted (docs/protocol.md, section 7; compaction.py has the other rules).

DeleteRecords (``delete_records``) moves the log start without deleting
anything: it records the new start (a ``.start`` object beside the segments,
docs/format.md 4.8), readers below it get OffsetOutOfRangeError, and
retention later deletes the segments that lie wholly below it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .. import clock
from ..errors import OffsetOutOfRangeError
from ..integers import is_int
from ..format.log_start import LogStartRecord, encode_log_start
from ..format.segment import SegmentHead
from ..format.topic_ids import current_topic_id
from ..storage.paths import log_start_path
from .compaction import retire_batches
from .state_manager import StateManager
from .storage_cache import SegmentPiece

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Retained:
    """What retention removed from one partition."""

    segments_deleted: int
    bytes_deleted: int
    log_start: int


def apply_retention(states: StateManager, retention_ms: int = -1, retention_bytes: int = -1,
                    now_ms: int | None = None, held_from: int | None = None) -> Retained:
    """Delete the oldest segments that retention allows (Kafka's rules, whole segments).

    A segment goes when its newest record is older than ``retention_ms``, or
    while the partition without it still holds ``retention_bytes`` or more;
    -1 disables a rule.  A segment that ends at or below the log start
    recorded by delete-records goes whatever the rules say.  The newest
    segment always stays, and so does every segment that ends past
    ``held_from`` (records a reader, the topic's table, has not taken yet).
    """
    now_ms = clock.now_ms() if now_ms is None else now_ms
    cache = states.cache
    with states.lock:
        cache.list_segments()
        pieces = cache.pieces()
        hidden = cache.hidden_segments()
        recorded = cache.recorded_starts()  # the same listing as the pieces
    heads = []
    for piece in pieces:
        try:
            heads.append((piece, cache.segment_head(piece.start)))
        except FileNotFoundError:
            continue  # deleted by another retention or merge since the listing
    start = max(pieces[0].start if pieces else 0, recorded[-1] if recorded else 0)
    doomed = []
    if len(heads) >= 2 and (retention_ms >= 0 or retention_bytes >= 0 or recorded):
        doomed = _doomed(states, heads, start, retention_ms, retention_bytes, now_ms,
                         held_from)
    _delete_below(states, doomed, hidden, recorded)
    log_start = cache.log_start()  # listed again: another retention may have run meanwhile
    if doomed:
        logger.info("%s-%d: retention deleted %d segments; log start offset now %d",
                    states.topic, states.partition, len(doomed), log_start)
    return Retained(len(doomed), sum(h.total_length for _, h in doomed), log_start)


def _doomed(states: StateManager, heads: list[tuple[SegmentPiece, SegmentHead]], start: int,
            retention_ms: int, retention_bytes: int, now_ms: int, held_from: int | None
            ) -> list[tuple[SegmentPiece, SegmentHead]]:
    """The oldest segments that the rules or the log ``start`` let go, oldest first, up
    to the first that must stay (never the newest).  It only reads: deciding is kept
    apart from the deleting, whose order is what keeps the log start from moving back."""
    cache = states.cache
    tail_bytes = cache.tail_sizes(states.state().end_offset)[1]
    total = sum(h.total_length for _, h in heads) + tail_bytes
    doomed = []
    for piece, head in heads[:-1]:
        assert piece.end is not None  # pieces() fills every end in
        by_start = piece.end <= start
        if not by_start and held_from is not None and piece.end > held_from:
            break
        by_size = retention_bytes >= 0 and total - head.total_length >= retention_bytes
        by_time = False
        if retention_ms >= 0 and not (by_start or by_size):
            try:
                newest = cache.time_index(piece.start).newest
            except FileNotFoundError:  # another retention (oldest first) deleted it
                total -= head.total_length
                continue
            newest = head.created_ms if newest is None else newest
            by_time = newest < now_ms - retention_ms
        if not (by_start or by_size or by_time):
            break
        doomed.append((piece, head))
        total -= head.total_length
    return doomed


def _delete_below(states: StateManager, doomed: list[tuple[SegmentPiece, SegmentHead]],
                  hidden: list[tuple[int, int, str]], recorded: list[int]) -> None:
    """Delete the ``doomed`` segments, and what lies below them, in the order that keeps
    the log start from moving back: the new start recorded first, then the batch
    objects and snapshots, the segments, the hidden segments below the cut, and last
    the ``recorded`` starts that the largest one makes meaningless."""
    largest = recorded[-1] if recorded else 0
    if doomed:
        cut = doomed[-1][0].end
        assert cut is not None  # pieces() fills every end in
        if cut > largest:
            # The new log start is recorded before anything goes, so that a merge or a
            # compaction that publishes late below it cannot move the log start back
            # (docs/protocol.md 7.3).
            record = LogStartRecord(cut, states.topic_id, clock.now_ms())
            states.storage.publish_if_absent(log_start_path(states.dir, cut),
                                             encode_log_start(record))
            largest = cut
        retire_batches(states, cut)
        for _, head in doomed:
            states.storage.delete(head.path)
        for _, end, path in hidden:  # covered by another segment, and below the log start
            if end <= cut:
                states.storage.delete(path)
    # Records below the largest one no longer say anything (the largest is the log
    # start and is never deleted, so the log start cannot move back).
    for offset in recorded:
        if offset < largest:
            states.storage.delete(log_start_path(states.dir, offset))


def delete_records(states: StateManager, offset: int) -> int:
    """Move the log start up to ``offset`` (Kafka's DeleteRecords); -1 means the log end.

    Nothing is deleted here: the new start is recorded, every read below it
    is refused from then on, and retention deletes the segments wholly below
    it.  An offset at or below the current log start changes nothing.
    Returns the log start after the call (Kafka's low watermark).
    """
    name = f"{states.topic}-{states.partition}"
    if not is_int(offset) or offset < -1:
        raise OffsetOutOfRangeError(
            f"delete-records offset {offset!r} for {name} must be -1 (the log end) or a "
            "non-negative int")
    end = states.state().end_offset
    current = states.cache.log_start()
    if offset == -1:
        offset = end
    if offset > end:
        raise OffsetOutOfRangeError(
            f"delete-records offset {offset} for {name} is beyond its log end offset {end} "
            f"(log start {current}): nothing was deleted")
    if offset <= current:
        return current
    # A record is bound to this incarnation: one that a process which opened the topic
    # before a delete and re-create would write into the new one is refused here (the
    # window left is the same as a single append's, docs/protocol.md section 1).
    topic_id = current_topic_id(states.storage, states.topic)
    if topic_id != states.topic_id:
        states._stale(topic_id)  # raises UnknownTopicError or InconsistentTopicIdError
    record = LogStartRecord(offset, states.topic_id, clock.now_ms())
    states.storage.publish_if_absent(log_start_path(states.dir, offset), encode_log_start(record))
    log_start = states.cache.log_start()
    logger.info("%s: log start offset moved to %d (delete-records)", name, log_start)
    return log_start
