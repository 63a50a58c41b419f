"""Merging adjacent small segments of one partition into one (docs/protocol.md 7.3).

Compaction makes one segment per run of batch objects, so a partition
compacted every few minutes gathers thousands of small segments: each costs
a listing entry, a header read for a cold process and a request per read
that crosses it.  A merge copies a run of adjacent segments, sections and
batches, into one segment named by its whole range
(``segments/<base>-<end>.segment``), then deletes the segments that range
covers.  Storage changes only by publish-if-absent and whole-object
deletes, as everywhere else; the rules that make it safe beside readers,
compactors, retention and other mergers are:

* every segment in storage holds the log's own bytes for its range, so the
  listing may read any offset from any segment that covers it (the chain,
  storage_cache.py, takes the one with the smallest base);
* a segment is deleted only after a published segment covers its whole
  range (here), or when it ends at or below a recorded log start (retention);
* the newest segment is never merged: it carries the producer state where
  compaction continues, and its name is what compaction's race is about.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c
import pyarrow as pa

from ..format.batch import decode_header, payload_of
from ..format.segment import (HEADER_SIZE, CorruptSegmentError, MergeInput, SegmentHead,
                              encode_merged_head, read_aborted)
from ..storage.paths import merged_segment_path, segments_dir
from .compaction import DEFAULT_BUFFER_BYTES
from .state_manager import StateManager
from .storage_cache import SegmentPiece

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Merged:
    """One merged segment made: its range, how many segments it replaced, its size."""

    base_offset: int
    end_offset: int
    segments: int
    bytes: int


def choose_run(pieces: list[SegmentPiece], heads: list[SegmentHead], max_bytes: int
               ) -> tuple[int, int] | None:
    """The first run ``[i, j]`` of adjacent pieces worth merging, or None.

    A run holds at least two whole segments (a piece that starts past its
    segment's base is left to retention), each smaller than half of
    ``max_bytes`` (segment.bytes), together at most ``max_bytes``, and its
    first segment is no larger than the rest of the run together: so a byte
    is copied again only when the segment holding it at least doubles, and
    the segments of a partition shrink geometrically from old to new (their
    number grows with the logarithm of its bytes, not with its compactions).
    The newest piece is never part of a run (the caller leaves it out).
    """
    sizes = [h.total_length for h in heads]
    small = [p.start == p.base and p.end == h.end_offset and s < max_bytes / 2
             for p, h, s in zip(pieces, heads, sizes)]
    for i in range(len(pieces)):
        if not small[i]:
            continue
        j, total = i, sizes[i]
        while j + 1 < len(pieces) and small[j + 1] and \
                heads[j].end_offset == heads[j + 1].base_offset and \
                total + sizes[j + 1] <= max_bytes:
            j += 1
            total += sizes[j]
        if j > i and total - sizes[i] >= sizes[i]:
            return i, j
    return None


def merge_segments(states: StateManager, max_bytes: int,
                   buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> Merged | None:
    """Merge the first run of small adjacent segments (``choose_run``) into one segment,
    streamed as compaction streams its segments: about ``buffer_bytes`` and one batch
    in memory, not the run.

    Returns None when there is nothing to merge, or when another merger
    published the same run first (its name is the run's range) or a segment
    of the run vanished meanwhile (retention, another merge): the next call
    decides from a new listing.
    """
    cache = states.cache
    with states.lock:
        cache.list_segments()
        pieces = cache.pieces()
        hidden = cache.hidden_segments()
    retire_hidden(states, pieces, hidden)
    pieces = pieces[:-1]  # never the newest
    try:
        heads = [cache.segment_head(p.start) for p in pieces]
    except FileNotFoundError:
        return None
    run = choose_run(pieces, heads, max_bytes)
    if run is None:
        return None
    i, j = run
    try:
        inputs = [_read_input(states, heads[k]) for k in range(i, j + 1)]
        newest = heads[j]
        snapshot = bytes(states.storage.read_range(newest.path, HEADER_SIZE,
                                                   newest.snapshot_length))
    except FileNotFoundError:
        return None
    if crc32c.crc32c(snapshot) != newest.snapshot_crc:
        raise CorruptSegmentError("segment snapshot checksum mismatch (or truncated)",
                                  cache.url(newest.path), newest.base_offset)
    base, end = heads[i].base_offset, newest.end_offset
    head = encode_merged_head(inputs, snapshot, newest.snapshot_crc)
    size = len(head) + sum(inp.head.data_length for inp in inputs)
    path = merged_segment_path(states.dir, base, end)
    try:
        if not states.storage.publish_stream_if_absent(
                path, merged_chunks(states, head, inputs, buffer_bytes), size, buffer_bytes):
            return None
    except FileNotFoundError:
        return None  # an input went meanwhile (retention, another merge): nothing published
    retire_covered(states, base, end, path)
    logger.info("%s-%d: merged %d segments (offsets %d to %d) into a %d-byte segment",
                states.topic, states.partition, j - i + 1, base, end, size)
    return Merged(base, end, j - i + 1, size)


def merged_chunks(states: StateManager, head: bytes, inputs: list[MergeInput],
                  buffer_bytes: int) -> Iterator[bytes | pa.Buffer]:
    """The merged segment's bytes: ``head``, then each input's batches, read in ranged
    reads of about ``buffer_bytes`` (one batch at least) and checked before they are
    passed on, so damage stops the publish instead of being copied."""
    yield head
    for inp in inputs:
        h, index = inp.head, inp.index
        url = states.cache.url(h.path)
        bases, positions, sizes = (index.bases.tolist(), index.positions.tolist(),
                                   index.sizes.tolist())
        i = 0
        while i < len(bases):
            j, total = i + 1, sizes[i]
            while j < len(bases) and total + sizes[j] <= buffer_bytes:
                total += sizes[j]
                j += 1
            data = states.storage.read_range(h.path, positions[i], total)
            if len(data) != total:
                raise CorruptSegmentError("segment data truncated", url, h.base_offset)
            view = memoryview(data)
            for k in range(i, j):  # per batch, not per record
                batch = view[positions[k] - positions[i]:positions[k] - positions[i] + sizes[k]]
                payload_of(batch, decode_header(batch, url, bases[k]), url)
            yield data
            i = j


def _read_input(states: StateManager, head: SegmentHead) -> MergeInput:
    """A segment's sections (its batches are read and checked as they are streamed)."""
    cache = states.cache
    url = cache.url(head.path)
    index = cache.segment_index(head.base_offset)
    times = cache.time_index(head.base_offset)
    if cache.segment_head(head.base_offset).path != head.path:
        raise FileNotFoundError(head.path)  # the listing changed under us: decide again
    return MergeInput(head, read_aborted(states.storage, head, url), index, times)


def retire_covered(states: StateManager, base: int, end: int, keep: str) -> list[str]:
    """Delete every segment but ``keep`` whose whole range lies in ``[base, end)``, lowest
    first; ``keep`` covers that range and was published before this is called."""
    cache = states.cache
    seg_dir = segments_dir(states.dir)
    deleted = []
    for b, e, name in cache.listed_segments():
        path = f"{seg_dir}/{name}"
        if path == keep or b < base or b >= end:
            continue
        if e is None:
            try:
                e = cache.head_of(path, b).end_offset
            except FileNotFoundError:
                continue
        if e <= end:
            states.storage.delete(path)
            deleted.append(path)
    return deleted


def retire_hidden(states: StateManager, pieces: list[SegmentPiece],
                  hidden: list[tuple[int, int, str]]) -> list[str]:
    """Delete the hidden segments (of one listing) that one piece's segment covers wholly:
    the inputs of a merge killed before it deleted them, or a late duplicate.

    Hidden and visible are the same in every listing that holds both (the
    chain's order), so two processes never delete each other's cover.
    """
    deleted: list[str] = []
    if not hidden:
        return deleted
    covers = []
    for p in pieces:  # each segment's own end (a piece's may be the next one's start)
        try:
            covers.append((p.base, states.cache.head_of(p.path, p.base).end_offset, p.path))
        except FileNotFoundError:
            continue
    for base, end, path in hidden:
        if any(b <= base and end <= e and other != path for b, e, other in covers):
            states.storage.delete(path)
            deleted.append(path)
    return deleted


def merge_all(states: StateManager, max_bytes: int, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
              limit: int = 1000) -> list[Merged]:
    """Merge until nothing is left to merge (at most ``limit`` merges in one call)."""
    done: list[Merged] = []
    while len(done) < limit and \
            (made := merge_segments(states, max_bytes, buffer_bytes)) is not None:
        done.append(made)
    return done
