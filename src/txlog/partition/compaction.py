"""Compaction of one partition (retention, which deletes what compaction made, is retention.py).

Compaction copies the oldest run of batch objects after the segments into
one new segment, then deletes the batch objects it covers; retention deletes
whole segments from the log start.  Both run beside appenders and readers in
other processes without stopping them.  What makes that safe is three rules
(docs/protocol.md, section 7):

* segments are contiguous and named by their base offset, so two compactors
  of the same run race for one name and exactly one wins;
* a segment is published before any batch object it covers is deleted, and
  batch objects are deleted in offset order, every older run's first;
* retention never deletes the newest segment, whose snapshot carries the
  producer state past everything deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from .. import clock
from ..format.batch import BatchHeader, ControlRecord, decode_control, decode_header, payload_of
from .producer_state import ProducerState
from ..errors import CorruptBatchError, StorageError
from ..integers import is_int
from ..format.segment import encode_segment_head
from ..storage.contract import DEFAULT_PART_BYTES
from ..storage.paths import BATCH_SUFFIX, SNAPSHOT_SUFFIX, named_offsets, snapshots_dir
from .state_manager import ANCHOR_BYTES, StateManager
from .storage_cache import BatchRef

logger = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 1 << 30  # Kafka's segment.bytes default
DEFAULT_MIN_BATCHES = 2
# What compaction may hold of the segment it streams (an object store's upload part),
# besides the one batch being copied: not segment.bytes (docs/protocol.md, section 7).
DEFAULT_BUFFER_BYTES = DEFAULT_PART_BYTES


@dataclass(frozen=True, slots=True)
class Compacted:
    """One segment made: its offsets, how many batch objects it replaced, its size."""

    base_offset: int
    end_offset: int
    batches: int
    bytes: int


def compact(states: StateManager, max_bytes: int = DEFAULT_SEGMENT_BYTES,
            min_batches: int = DEFAULT_MIN_BATCHES, upto: int | None = None,
            buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> Compacted | None:
    """Copy the oldest run of batch objects (at most ``max_bytes``, below ``upto`` if
    given; at least ``min_batches`` of them unless ``max_bytes`` cut the run) into a
    segment.

    Returns None when there is too little to compact or another process
    compacted the same run first.  Open transactions need no care: batches
    are copied as they are, and the segment's producer state records them.
    Two passes keep memory to ``buffer_bytes`` (what the store may buffer of
    the stream) and one batch, not ``max_bytes``: the first reads headers
    only, which fixes every byte before the data section; the second streams
    the batches' bytes into the store one at a time.
    """
    if not is_int(buffer_bytes) or buffer_bytes < 1:
        raise ValueError(f"compaction buffer_bytes must be a positive integer, not "
                         f"{buffer_bytes!r}")
    state = states.state()
    start = states.cache.compacted_end(refresh=True)
    stop = state.end_offset if upto is None else min(upto, state.end_offset)
    run, controls, size, full = _first_pass(states, start, stop, state.end_offset, max_bytes)
    # A full run is compacted however few batches it has: every compaction starts
    # here, so one large batch must never hold the partition back.
    if not run or (len(run) < min_batches and not full):
        return None
    end_state = _state_at(states, start)
    if end_state is None:
        return None
    for (header, _, _), control in zip(run, controls):
        end_state.apply(header, control)
    last_header, _, last_ref = run[-1]
    # The segment's own aborted section lists the transactions aborted in it; its
    # snapshot lists none (each segment's section holds its own: reader.py).
    anchor = bytes(memoryview(states.cache.load(last_ref, ANCHOR_BYTES))[:ANCHOR_BYTES])
    # The one place every entry is rewritten (Kafka's snapshot at segment roll): the
    # deltas written after it build on this section (format.md 3.2).
    fields = states.snapshot_fields(end_state, last_header.base_offset, anchor,
                                    end_state.end_offset, full=True)
    head = encode_segment_head(states.topic_id, start, [(h, n) for h, n, _ in run],
                               end_state.end_offset, end_state.aborted, fields, clock.now_ms())
    total = len(head) + size
    if not states.storage.publish_stream_if_absent(
            states.cache.segment_path(start), _segment_chunks(states, head, run), total,
            buffer_bytes):
        return None
    end = last_header.next_offset
    retire_batches(states, end)
    logger.info("%s-%d: compacted %d batches (offsets %d to %d) into a %d-byte segment",
                states.topic, states.partition, len(run), start, end, total)
    return Compacted(start, end, len(run), total)


def _first_pass(states: StateManager, start: int, stop: int, end_offset: int, max_bytes: int
                ) -> tuple[list[tuple[BatchHeader, int, BatchRef]], list[ControlRecord | None],
                           int, bool]:
    """The run from ``start`` that compaction copies, by headers only: each batch with its
    size inline and its object, the markers' records, the run's size, and whether it
    stopped because the next batch would not fit in ``max_bytes``.  Apart from the
    second pass (_segment_chunks) because everything the head promises is fixed here,
    before a byte of the segment is written."""
    run: list[tuple[BatchHeader, int, BatchRef]] = []
    controls: list[ControlRecord | None] = []
    size = 0
    expected = start
    full = False  # the run ends because the next batch would not fit in max_bytes
    for ref in states.cache.refs(start, stop, end_offset):
        if ref.in_segment or ref.base != expected:
            break  # another compaction got ahead of this one: it has this run
        header = states.cache.header(ref.base)  # cached, or one small read: never a payload
        if header.next_offset > stop:
            break
        inline_size = header.header_length + header.payload_length  # as it lies in a segment
        if run and size + inline_size > max_bytes:
            full = True
            break
        control = None
        if header.is_control:  # a marker is tiny: its record is read (and checked) now
            url = states.cache.url(ref.path)
            control = decode_control(payload_of(states.cache.inline(ref), header, url),
                                     header, url)
        run.append((header, inline_size, ref))
        controls.append(control)
        size += inline_size
        expected = header.next_offset
    return run, controls, size, full


def _segment_chunks(states: StateManager, head: bytes,
                    run: list[tuple[BatchHeader, int, BatchRef]]) -> Iterator[bytes | pa.Buffer]:
    """The segment's bytes: ``head``, then each batch inline, read and checked one at a
    time (a large one is a map of its file, locally).  A batch whose bytes are not what
    the first pass saw stops the stream, so nothing is published: the head already
    promised its size and place."""
    yield head
    for header, inline_size, ref in run:
        data = states.cache.inline(ref)  # a claim's payload comes from its data object
        url = states.cache.url(ref.path)
        if decode_header(data, url, ref.base) != header:
            raise CorruptBatchError("batch header changed between compaction's two reads",
                                    url, ref.base)
        payload_of(data, header, url)  # damage is never copied silently
        if len(data) != inline_size:
            raise CorruptBatchError(f"batch is {len(data)} bytes inline, its header "
                                    f"promised {inline_size}", url, ref.base)
        yield data
        del data


def _state_at(states: StateManager, offset: int) -> ProducerState | None:
    """The producer state at the compacted end ``offset``: the newest segment's.

    None when the newest segment no longer ends there: another compaction (a
    second maintainer) published the segment at ``offset`` meanwhile, so this
    one would lose the race for its name anyway.
    """
    if offset == 0:
        return states.new_state()
    bases = states.cache.list_segments()
    if not bases:
        raise StorageError(f"{states.topic}-{states.partition}: no segment ends at {offset} "
                           "(every segment is gone)")
    head, state = states.segment_state(bases[-1])  # the newest is never deleted
    return state if head.end_offset == offset else None


def retire_batches(states: StateManager, below: int) -> list[str]:
    """Delete batch objects and snapshots the segments cover (offsets below ``below``).

    In offset order: a process whose cached prefix ends with a batch object
    that still exists can then be sure that no batch after it was deleted.
    Leftovers of an earlier compaction that stopped half-way go first, for
    the same reason.
    """
    deleted = []
    for base in named_offsets(states.storage.list(states.dir), BATCH_SUFFIX):
        if base >= below:
            break
        deleted.append(states.cache.batch_path(base))
        states.storage.delete(deleted[-1])
    snapshots = snapshots_dir(states.dir)
    for end in named_offsets(states.storage.list(snapshots), SNAPSHOT_SUFFIX):
        if end <= below:
            deleted.append(states.snapshot_path(end))
            states.storage.delete(deleted[-1])
    return deleted
