"""A topic's partitions kept in shape: compaction, segment merging, retention, delete-records.

Each partition does its own work (partition/compaction.py, segment_merge.py,
retention.py); what lives here is the walk over a topic's partitions with the
topic's settings (``segment.bytes``, ``retention.ms``, ``retention.bytes``) read
once, fresh, for the whole walk.  ``Log`` and the ``Maintainer`` both call it.
"""

from __future__ import annotations

from ..errors import InvalidConfigError, OffsetOutOfRangeError
from ..partition.compaction import DEFAULT_BUFFER_BYTES, DEFAULT_MIN_BATCHES, Compacted
from ..partition.retention import Retained
from ..partition.segment_merge import Merged
from ..root.root import Root
from ..root.topics import TABLE_HOLD_RETENTION


def partitions_of(root: Root, topic: str, partitions: list[int] | None) -> list[int]:
    """``partitions`` of ``topic`` (None: all of them), each checked to exist."""
    desc = root.describe_topic(topic, refresh=True)
    if partitions is None:
        return list(range(desc.partitions))
    for p in partitions:
        root.partition(topic, p)  # an unknown partition fails here, named
    return list(partitions)


def compact(root: Root, topic: str, partitions: list[int] | None = None,
            min_batches: int = DEFAULT_MIN_BATCHES, upto_lag: int = 0,
            buffer_bytes: int = DEFAULT_BUFFER_BYTES, merge: bool = True
            ) -> dict[int, list[Compacted]]:
    """``Log.compact``: each partition's batch objects into segments, then (``merge``)
    runs of adjacent small segments merged."""
    max_bytes = root.describe_topic(topic, refresh=True).setting("segment.bytes")
    done: dict[int, list[Compacted]] = {}
    for p in partitions_of(root, topic, partitions):
        part = root.partition(topic, p)
        upto = part.end_offset() - upto_lag
        made = done[p] = []
        while (segment := part.compact(max_bytes, min_batches, upto, buffer_bytes)) is not None:
            made.append(segment)
        if merge:
            part.merge_segments(max_bytes, buffer_bytes)
    return done


def merge_segments(root: Root, topic: str, partitions: list[int] | None = None,
                   buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> dict[int, list[Merged]]:
    """``Log.merge_segments``: runs of each partition's adjacent small segments merged."""
    max_bytes = root.describe_topic(topic, refresh=True).setting("segment.bytes")
    return {p: root.partition(topic, p).merge_segments(max_bytes, buffer_bytes)
            for p in partitions_of(root, topic, partitions)}


def apply_retention(root: Root, topic: str, partitions: list[int] | None = None,
                    now_ms: int | None = None) -> dict[int, Retained]:
    """``Log.apply_retention``: the oldest segments the topic's retention allows deleted;
    with ``txlog.table.hold-retention``, none past what the topic's table covers."""
    desc = root.describe_topic(topic, refresh=True)
    held = _table_offsets(root, topic) if desc.setting(TABLE_HOLD_RETENTION) == "true" \
        else None
    return {p: root.partition(topic, p).apply_retention(
                desc.setting("retention.ms"), desc.setting("retention.bytes"), now_ms,
                None if held is None else held.get(p, 0))
            for p in partitions_of(root, topic, partitions)}


def _table_offsets(root: Root, topic: str) -> dict[int, int]:
    """The offsets the topic's table covers (none yet: nothing), for the retention hold."""
    try:
        from ..tables.readers import covered_offsets
    except ImportError as exc:
        raise InvalidConfigError(
            f"topic {topic!r} sets {TABLE_HOLD_RETENTION}=true, which needs the tables "
            f"extra (pip install 'txlog[tables]') to read its table: {exc}") from None
    return covered_offsets(root, topic)


def delete_records(root: Root, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """``Log.delete_records``: every entry checked before any log start moves, so a bad
    entry changes nothing."""
    checked = []
    for (topic, partition), offset in offsets.items():
        part = root.partition(topic, partition)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1 or \
                offset > part.end_offset():
            raise OffsetOutOfRangeError(
                f"delete-records offset {offset!r} for {topic}-{partition} must be -1 (the "
                f"log end) or 0 to its log end offset {part.end_offset()}: no log start "
                "was moved")
        checked.append(((topic, partition), part, offset))
    return {tp: part.delete_records(offset) for tp, part, offset in checked}
