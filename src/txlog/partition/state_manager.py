"""The cached producer state of one partition, kept true to storage.

A partition's producer state (producer_state.py) is a fold over its batch
headers.  Folding from offset 0 on every call would read the whole log, so
this module keeps the fold in memory, advances it by the headers written
since, loads it from a snapshot when starting cold, and writes a snapshot
every SNAPSHOT_INTERVAL batches.  A cache is only worth having if it can
never describe another incarnation of the topic: the anchor check below is
what makes it safe (docs/protocol.md, section 1; the snapshot bytes are in
docs/format.md, section 3).  Where the batches are, and their headers, is
the storage cache's (storage_cache.py), which this state shares its lock with.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import NoReturn

import crc32c
import msgpack

from ..errors import (CorruptBatchError, InconsistentTopicIdError, OffsetOutOfRangeError,
                      StorageError, UnknownTopicError)
from ..format.batch import BatchHeader, ControlRecord
from ..format.segment import CorruptSegmentError, SegmentHead
from ..format.snapshot_frame import frame, framed_length, is_framed, unframe
from ..format.topic_ids import current_topic_id
from ..storage.contract import Storage
from ..storage.fresh_reads import read_after_publish, recent_read
from ..storage.paths import (BATCH_SUFFIX, SEGMENT_DIR, SNAPSHOT_DIR, SNAPSHOT_SUFFIX,
                             named_offsets, snapshot_path, snapshots_dir)
from ..storage.pools import lookup_pool
from .producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, ProducerState
from .storage_cache import RELOADS, StorageCache

# A batch object's header, its control record if it is a marker, and the bytes read.
_Found = tuple[BatchHeader, ControlRecord | None, bytes]

logger = logging.getLogger(__name__)

SNAPSHOT_INTERVAL = 64  # batches between producer-state snapshots
SNAPSHOTS_KEPT = 2
ANCHOR_BYTES = 8  # magic + header checksum of a batch
# 2: the topic id and the last batch's anchor; 3: ``aborted`` holds only the aborted
# transactions whose marker is at or after ``aborted_from`` (format.md, section 3)
# 4: the producer entries not in a transaction move to a section of their own, read only
# when an append needs one (format.md, sections 3 and 3.1)
# 5: the entries section says its largest producer id, and a snapshot file may be a delta:
# the entries changed since the base section of a segment that its ``base`` field names
# (format.md, section 3.2); a segment's section is always full
SNAPSHOT_FORMAT = 5
SNAPSHOT_FORMATS_READ = (2, 3, 4, 5)  # a version 2 snapshot's aborted list is complete
# A version 4 snapshot file is a frame (format/snapshot_frame.py): this much is read
# first (the fields of a few dozen open transactions), the entries only when an append
# needs one.
SNAPSHOT_HEAD_READ = 4 * 1024

# How recently the cached state must have been proven current (a refresh, or an anchor
# check after an append) for an append to try its slot without refreshing first
# (docs/protocol.md, section 1): the batches of one flush follow each other within
# it, while a writer that held a partition idle refreshes, and so cannot publish
# into a topic deleted and re-created meanwhile.
GUESS_WINDOW_S = 0.5

# Reloads a listing of every producer entry tries when the object its entries were to
# be read from keeps being compacted away under it.
ENTRY_RELOADS = 5


class SnapshotGone(FileNotFoundError):
    """The snapshot or segment a state's unread entries are in is gone (pruned, compacted
    or merged away), or a snapshot file's entries are damaged: the state must be loaded
    again from storage.  (A segment's damaged entries are a CorruptSegmentError.)"""


@dataclass(frozen=True, slots=True)
class _Anchor:
    """The last object of the cached prefix and its first bytes (magic and header checksum).

    For a segment, ``next_segment`` is its end offset: the prefix is current
    only while no segment starts there, since a compaction that began at the
    end of the prefix deletes batches without touching this segment.
    """

    base: int
    path: str
    data: bytes
    next_segment: int | None = None


class StateManager:
    """The producer state of one partition incarnation, cached, and its storage cache.

    Appends and reads of the partition share this object and its ``lock``, so
    that what one learns (a batch it published, a listing) the others see.
    The state is trusted only while its anchor shows the cache still
    describes this incarnation; ``cache`` (storage_cache.py) knows where the
    batches are.
    """

    def __init__(self, storage: Storage, topic: str, partition: int, topic_id: str,
                 on_stale: Callable[[str, str], None] | None = None,
                 producer_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
                 unwritten: bool = False) -> None:
        self.storage = storage
        self.producer_expiration_ms = producer_expiration_ms
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self._on_stale = on_stale
        self.lock = threading.RLock()
        self.cache = StorageCache(storage, topic, partition, topic_id, self.lock, self._stale)
        self.dir = self.cache.dir
        self._bad_snapshots: set[int] = set()  # snapshot files found damaged after loading
        # Where requests wait on the network: reads are worth overlapping there only.
        self._remote = bool(getattr(storage, "remote", False))
        self._drop_cache()
        # A listing of the topic's directory showed nothing of this partition: its first
        # claim takes the empty log as a guess (state_proven_after), listing nothing.
        self._unwritten = unwritten

    def reload(self) -> None:
        """Forget the cached state (its unread entries are gone): the next call loads it."""
        with self.lock:
            self._drop_cache()

    def _drop_cache(self) -> None:
        """Forget everything learnt from storage (at start, and when it was pulled away)."""
        self._state: ProducerState | None = None
        self._proven_at = float("-inf")  # monotonic time the cache was last shown current
        self._since_snapshot = 0
        # The last object of the cached state's prefix: as long as it is
        # unchanged, the cache describes this incarnation and nothing it
        # covers was compacted away.  None while the state is empty.
        self._anchor: _Anchor | None = None
        # The state is the unwritten partition's guess, not proven yet: a refresh
        # loads the partition instead of reading on from it.
        self._guessed = False
        self.cache.reset()

    # --- producer state -------------------------------------------------------

    def loaded_state(self) -> ProducerState:
        """The state with every producer entry read, for tools that list them all.

        Entries are read lazily from the snapshot or segment the state was loaded
        from, and a compaction or retention may delete that object first: the
        state is then loaded again from what replaced it, as an append does.
        """
        with self.lock:
            for _ in range(ENTRY_RELOADS - 1):
                state = self.state()
                try:
                    state.producers.load()
                    return state
                except SnapshotGone:
                    self._drop_cache()
            state = self.state()
            state.producers.load()  # gone yet again: the caller's error
            return state

    def state(self, listing: bool = False) -> ProducerState:
        """The producer state at the current log end (refreshed from storage).

        The headers past the cached end are read first and applied only once
        the cache is known to still describe this incarnation and to be
        untouched by compaction (its anchor is unchanged, or for an empty
        state, no segment exists and ``topic.json`` has our id).  A new
        incarnation can only be created after every object of the old one
        was deleted, and compaction deletes batch objects in offset order
        after publishing their segment: an anchor that still exists after
        the reads proves that the headers read are the log's own.

        ``listing``: the caller (a reader) will need the batch objects' listing
        anyway.  A cold load on an object store then takes it at once, beside
        the segments' and snapshots' listings, and reads the headers it names
        several at once instead of one after another (``_headers_listed``).
        """
        with self.lock:
            if self._guessed:  # a claim's guess that lost its slot: load what is there
                self._drop_cache()
            for _ in range(RELOADS):
                listed: list[int] | None = None
                reaches = False
                if self._state is None:
                    self._state, listed = self._load_state(listing and self._remote)
                    reaches = listed is not None and _listing_reaches(listed, self._anchor)
                state = self._state
                found = self._headers_past(state, listed, reaches)
                if not self.still_current() or not self._apply_all(found):
                    continue
                if listed is not None and reaches:
                    self.cache.adopt_batch_listing(listed, state.end_offset)
                if self._since_snapshot >= SNAPSHOT_INTERVAL and not self._write_snapshot(state):
                    continue  # its unread entries were gone: loaded again
                return state
            raise StorageError(f"{self.topic}-{self.partition}: the log kept changing under "
                               f"this process ({RELOADS} reloads in one refresh)")

    def state_proven_after(self) -> tuple[ProducerState, _Anchor | None]:
        """The state past the headers that follow the cached end, for an appender that
        proves it after its publish: returns it and the anchor that proof must find.

        ``state()`` checks the cached prefix's anchor before applying what it read;
        an appender checks the same anchor after its publish anyway (section 7 of
        docs/protocol.md, "Appending into a retired slot"), and that later check
        proves everything the earlier one would have: the anchor still in place
        then means nothing at or after it was ever deleted, so no header read
        here was a stray in a retired slot and the slot published was the end.
        Only the incarnation cannot wait for it (a publish into a re-created topic
        cannot be undone), so ``topic.json`` is read here instead, once for the
        partitions a flush claims together (docs/protocol.md 1.6).  The caller holds
        ``lock`` until that check: nothing else sees the unproven state, and on a
        failed check the cache is dropped.  No snapshot is written from it.
        """
        with self.lock:
            for _ in range(RELOADS):
                listed: list[int] | None = None
                reaches = False
                if self._state is None:
                    if self._unwritten:  # taken once, proven by the check after
                        self._unwritten, self._guessed = False, True
                        self._state, listed = self.new_state(), []
                    else:
                        self._state, listed = self._load_state(claim=True)
                    reaches = listed is not None and _listing_reaches(listed, self._anchor)
                state, proof = self._state, self._anchor
                # A cold load's listing shows where the chain ends (no 404 read): a guess
                # that the publish-if-absent and the anchor check after it prove (1.6, 1.8).
                found = self._headers_past(state, listed, reaches)
                # Shared by the flush's claims within GUESS_WINDOW_S (1.8): it bounds the
                # window to the publish; the check after the publish proves the rest.
                current = current_topic_id(self.storage, self.topic, recent_read)
                if current != self.topic_id:
                    self._stale(current)
                if not self._apply_all(found):
                    continue
                return state, proof
            raise StorageError(f"{self.topic}-{self.partition}: the log kept changing under "
                               f"this process ({RELOADS} reloads in one refresh)")

    def _headers_past(self, state: ProducerState, listed: list[int] | None = None,
                      reaches: bool = False) -> list[_Found]:
        found: list[_Found] = []
        offset = state.end_offset
        if listed is not None:
            found, ended = self._headers_listed(offset, listed, reaches)
            if ended:
                return found
            offset = found[-1][0].next_offset if found else offset
        while (item := self.cache.read_header(offset)) is not None:
            found.append(item)
            offset = item[0].next_offset
        return found

    def _headers_listed(self, offset: int, listed: list[int], reaches: bool
                        ) -> tuple[list[_Found], bool]:
        """The headers from ``offset`` on that a listing of the batch objects names, read
        several at once, in the chain's order: only those the chain reaches from
        ``offset`` (a name it skips is nothing of the log's); and whether the
        listing showed where the chain ends.

        Batch objects never change and are published in offset order, so
        these are the headers one-by-one reads would find, and the caller
        proves them the log's own after reading them, as it proves those.  When
        the chain ends at a name the listing does not hold, having followed at
        least one listed name or starting where the listing ``reaches``
        (``_listing_reaches``: it holds the loaded state's last batch), the
        listing (one request, strongly consistent) saw the log end there at
        its instant, which the caller's proof follows: no further read is
        needed to find the end, exactly as for a one-by-one reader that had
        read its last header at that instant.
        """
        wanted = [b for b in listed if b >= offset]
        fetched = dict(zip(wanted, lookup_pool().map(self.cache.read_header, wanted),
                           strict=True))
        found: list[_Found] = []
        while (item := fetched.get(offset)) is not None:
            found.append(item)
            offset = item[0].next_offset
        return found, (bool(found) or reaches) and offset not in fetched

    def _apply_all(self, found: list[tuple[BatchHeader, ControlRecord | None, bytes]]) -> bool:
        try:
            for header, control, head in found:
                self.applied(header, control, head)
        except FileNotFoundError:  # an expiry needed entries whose source is gone
            self._drop_cache()
            return False
        return True

    def believed_state(self, listing: bool = False) -> ProducerState:
        """The cached state without asking storage if it was proven current within
        GUESS_WINDOW_S (else a refresh, ``state(listing)``).

        An appender tries the slot after it first: publishing there if absent
        is itself the proof that nobody wrote the slot, and the check after
        the publish (appender.py) proves the prefix unchanged.  A stale guess
        only costs a lost publish, then a refresh.  The window bounds what the
        check after cannot undo: a publish into a topic deleted and re-created
        since the cache was last proven (the check then raises, but the object
        is in the new incarnation).
        """
        with self.lock:
            if self._state is not None and \
                    time.monotonic() - self._proven_at < GUESS_WINDOW_S:
                return self._state
            return self.state(listing)

    def maybe_snapshot(self) -> None:
        """Write a snapshot if enough batches were applied (appends that skipped the refresh)."""
        with self.lock:
            if self._state is not None and self._since_snapshot >= SNAPSHOT_INTERVAL:
                self._write_snapshot(self._state)

    @property
    def anchor(self) -> _Anchor | None:
        """The last object of the cached state's prefix (None while the state is empty):
        what ``proven_by`` must find in place to prove that state the log's own."""
        return self._anchor

    def still_current(self) -> bool:
        """Whether the cached state still describes the log (one or two small reads)."""
        return self.proven_by(self._anchor)

    def proven_by(self, anchor: _Anchor | None) -> bool:
        """Whether ``anchor`` (the cached state's, or the one ``state_proven_after``
        returned) is still in place, which proves the cached state the log's own.

        On a mismatch, ``topic.json`` decides: another topic id, or none,
        raises (the topic was deleted, perhaps re-created); the same id means
        the anchor went away for another reason (compaction, retention, or
        damage): the cache is dropped and False returned, so the caller reloads.
        """
        checked = time.monotonic()
        current: str | None | Future[str | None] = None
        if anchor is not None:
            try:
                if self.storage.read_prefix(anchor.path, ANCHOR_BYTES) == anchor.data and (
                        anchor.next_segment is None or
                        not self.storage.exists(self.cache.segment_path(anchor.next_segment))):
                    self._proven_at = checked
                    return True
            except FileNotFoundError:
                pass
        else:
            # Both cases read topic.json: on an object store, beside the listing; after a
            # claim's publish, shared with the flush's claims publishing with it (1.8).
            read = partial(current_topic_id, self.storage, self.topic, read_after_publish)
            current = lookup_pool().submit(contextvars.copy_context().run, read) \
                if self._remote else None
            if not self.cache.listed_segments():
                current = current.result() if isinstance(current, Future) else read()
                if current != self.topic_id:
                    self._stale(current)
                self._proven_at = checked
                self._guessed = False
                return True
        current = current.result() if isinstance(current, Future) else \
            current_topic_id(self.storage, self.topic)
        if current != self.topic_id:
            self._stale(current)
        compacted = bool(self.cache.listed_segments())
        (logger.debug if compacted else logger.warning)(
            "%s-%d: %s of the cached state changed or vanished (%s); reloading",
            self.topic, self.partition, anchor.path if anchor else "the empty prefix",
            "compaction or retention ran" if compacted else "although the topic is unchanged")
        self._drop_cache()
        return False

    def _stale(self, current: str | None) -> NoReturn:
        """This incarnation is gone: forget it and tell the caller clearly."""
        self._drop_cache()
        if self._on_stale is not None:
            self._on_stale(self.topic, self.topic_id)
        if current is None:
            raise UnknownTopicError(
                f"topic {self.topic!r} (topic id {self.topic_id}) was deleted by another "
                f"process since this one opened it (partition {self.partition})")
        raise InconsistentTopicIdError(
            f"topic {self.topic!r} was deleted and re-created since this process opened it "
            f"(topic id {self.topic_id}, now {current}); nothing of the old topic is applied "
            "to the new one: open the partition again to use it")

    def applied(self, header: BatchHeader, control: ControlRecord | None,
                data: bytes) -> None:
        """Advance the cached state past a batch; ``data`` holds at least its first bytes."""
        assert self._state is not None
        self._anchor = _Anchor(header.base_offset, self.cache.batch_path(header.base_offset),
                               bytes(data[:ANCHOR_BYTES]))
        self.cache.note_batch(header.base_offset)
        self.cache.note_header(header)
        if control is not None:  # decoded, so read whole and checked (or written here)
            self.cache.note_checked_marker(header.base_offset)
        self._state.apply(header, control)
        self._since_snapshot += 1

    def holds(self, base: int, anchor: bytes) -> bool:
        """Whether the log (reloaded) has, at ``base``, the batch that starts with ``anchor``.

        An appender asks after a publish whose slot may have been compacted
        away between its refresh and its publish: then its object is a stray
        that no process reads, and the batch must be written again.  A slot
        below the log start (a cache that retention or DeleteRecords passed,
        docs/protocol.md 1.6) holds nothing any more.
        """
        with self.lock:
            state = self.state()
            if base >= state.end_offset:
                return False
            try:
                ref = self.cache.ref_of(base)
                return bytes(self.cache.load(ref, ANCHOR_BYTES)) == anchor
            except (CorruptBatchError, OffsetOutOfRangeError):
                return False

    def segment_state(self, base: int) -> tuple[SegmentHead, ProducerState]:
        """A segment's header and the producer state at its end (a damaged one is an error:
        the batches it replaced are gone)."""
        head, fields = self.cache.segment_snapshot(base)
        url = self.cache.url(head.path)
        at = fields.pop("_entries_at", None) if isinstance(fields, dict) else None
        described = fields.get("entries") if isinstance(fields, dict) else None
        crc = described.get("crc") if isinstance(described, dict) else None

        def entries(position: int, length: int) -> bytes | memoryview:
            # The section follows the fields in the snapshot section (format.md 4.2).
            try:
                data = memoryview(self.storage.read_range(head.path, position, length))
            except FileNotFoundError:
                raise SnapshotGone(f"segment {url} is gone (its producer entries with it)") \
                    from None
            if len(data) != length or crc32c.crc32c(data) != crc:
                raise CorruptSegmentError("segment producer entries checksum mismatch (or "
                                          "truncated)", url, base)
            return data
        try:
            if isinstance(fields, dict) and "base" in fields:
                raise ValueError("a segment's producer entries are never a delta")
            state = self.state_from_fields(fields, head.end_offset,
                                           partial(entries, at) if at is not None else None)
            if at is not None and state.producers.unread:
                # Deltas written from this state name this section as their base.
                assert isinstance(described, dict)
                state.producers.top_as_base({
                    "segment": head.base_offset, "at": at, "end": head.end_offset,
                    **{k: described[k] for k in ("length", "crc", "count")},
                    "max_pid": described.get("max_pid", -1)})
            return head, state
        except ValueError as exc:
            raise CorruptSegmentError(f"segment snapshot unusable: {exc}",
                                      self.cache.url(head.path), base) from None

    # --- snapshots ------------------------------------------------------------

    def _snapshot_offsets(self) -> list[int]:
        return named_offsets(self.storage.list(snapshots_dir(self.dir)), SNAPSHOT_SUFFIX)

    def snapshot_path(self, offset: int) -> str:
        return snapshot_path(self.dir, offset)

    def _listings(self, listing: bool, claim: bool
                  ) -> tuple[list[int] | None, list[int], list[int]]:
        """The bases of the segments' chain and of the snapshots, as listed now, and
        with ``listing`` or ``claim`` those of the batch objects.

        A reader on an object store (``listing``) takes the three listings at once,
        one round trip (docs/protocol.md 6.1).  A claim (1.8) lists the partition's
        directory once: it names the batch objects and, as names of their own, the
        ``segments`` and ``snapshots`` directories if they hold anything (the
        storage contract's ``list``), and only a directory it names is listed next,
        so an empty or never compacted partition costs one request.  Other refreshes
        (an end offset, a local read) list the two directories and walk the headers:
        a long tail of batch objects not compacted costs them no pages.
        """
        if listing:
            pool = lookup_pool()
            batches = pool.submit(self.cache.list_batches)
            snapshots = pool.submit(self._snapshot_offsets)
            bases = self.cache.list_segments()
            return batches.result(), bases, snapshots.result()
        if not claim:
            return None, self.cache.list_segments(), self._snapshot_offsets()
        names = self.storage.list(self.dir)
        both = SEGMENT_DIR in names and SNAPSHOT_DIR in names and self._remote
        pending = lookup_pool().submit(self._snapshot_offsets) if both else None
        bases = self.cache.list_segments(None if SEGMENT_DIR in names else [])
        offsets = pending.result() if pending is not None else \
            self._snapshot_offsets() if SNAPSHOT_DIR in names else []
        return named_offsets(names, BATCH_SUFFIX), bases, offsets

    def _load_state(self, listing: bool = False, claim: bool = False
                    ) -> tuple[ProducerState, list[int] | None]:
        """The state of the newest segment or snapshot, whichever ends later; else empty;
        with ``listing`` or ``claim``, also the bases of the batch objects, listed
        meanwhile (``_listings``).

        A snapshot is only a cache: one that is damaged, of an older format,
        of another incarnation of the topic, or that does not end with the
        batch it claims to, is skipped with a warning, never trusted and never
        fatal.  A segment's state is part of the log (its batches are gone):
        damage there is an error.
        """
        self._unwritten = False  # a guess only serves a claim that comes first
        for _ in range(RELOADS):
            listed, bases, snapshot_offsets = self._listings(listing, claim)
            from_segment = None
            if bases:
                try:
                    head, state = self.segment_state(bases[-1])
                except FileNotFoundError:
                    continue
                from_segment = state, _Anchor(head.base_offset, head.path, head.anchor,
                                                      head.end_offset)
            for offset in reversed(snapshot_offsets):
                if offset <= self.cache.compacted_end():
                    break
                if offset in self._bad_snapshots:
                    continue
                loaded = self._load_snapshot_file(offset)
                if loaded is not None:
                    self._anchor = loaded[1]
                    return loaded[0], listed
            if from_segment is not None:
                self._anchor = from_segment[1]
                logger.debug("%s-%d: producer state loaded from the segment ending at %d",
                             self.topic, self.partition, self.cache.compacted_end())
                return from_segment[0], listed
            logger.debug("%s-%d: no usable producer-state snapshot; rebuilding from offset 0",
                         self.topic, self.partition)
            self._anchor = None
            return self.new_state(), listed
        raise StorageError(f"{self.topic}-{self.partition}: the segments kept changing under "
                           f"this process ({RELOADS} loads)")

    def _load_snapshot_file(self, offset: int) -> tuple[ProducerState, _Anchor] | None:
        path = self.snapshot_path(offset)
        try:
            data = self.storage.read_prefix(path, SNAPSHOT_HEAD_READ)
            whole = len(data) < SNAPSHOT_HEAD_READ
            if not whole and is_framed(data):
                if framed_length(data) > len(data):  # fields of many open transactions
                    data = self.storage.read_prefix(path, framed_length(data))
            elif not whole:
                data, whole = self.storage.read(path), True  # an older file: all of it
        except FileNotFoundError:
            return None  # pruned by another process meanwhile
        try:
            state, anchor = self._parse_snapshot(offset, data, path, whole)
        except Exception as exc:  # whatever garbage holds, it only costs a rebuild
            logger.warning("skipping producer-state snapshot %s: %s", self.cache.url(path), exc)
            return None
        logger.debug("%s-%d: producer state loaded from the snapshot at offset %d",
                     self.topic, self.partition, offset)
        return state, anchor

    def state_from_fields(self, obj: object, end: int,
                          entries: Callable[[int], bytes | memoryview] | None = None,
                          snapshot: int | None = None) -> ProducerState:
        """The state a snapshot's fields hold, refusing (ValueError) anything else.

        A version 4 or 5 snapshot's entries stay unread: ``entries(length)``
        reads them when an append first needs one (then OSError if they are
        gone), and so does a delta's base (then SnapshotGone if its segment
        is gone or changed, and the snapshot file at ``snapshot`` is skipped
        from then on).
        """
        if not isinstance(obj, dict) or obj.get("v") not in SNAPSHOT_FORMATS_READ:
            raise ValueError(f"not a version {' or '.join(map(str, SNAPSHOT_FORMATS_READ))} "
                             "snapshot")
        if obj.get("v") in (3, 4, 5) and "aborted_from" not in obj:
            raise ValueError(f"a version {obj.get('v')} snapshot without aborted_from")
        if (obj.get("v") in (4, 5)) != ("entries" in obj):
            raise ValueError("only a version 4 or 5 snapshot has an entries section")
        if obj.get("v") != 5 and "base" in obj:
            raise ValueError("only a version 5 snapshot has a base")
        if obj.get("topic_id") != self.topic_id:
            raise ValueError(f"it belongs to topic id {obj.get('topic_id')!r}, not "
                             f"{self.topic_id!r} (the topic was re-created)")
        described = obj.get("entries")
        length = described.get("length") if isinstance(described, dict) else None
        loader = None
        if entries is not None and type(length) is int:
            def loader() -> bytes | memoryview:
                return entries(length)
        state = ProducerState.from_dict(obj, self.producer_expiration_ms, loader,
                                        partial(self._base_entries, snapshot))
        if state.end_offset != end:
            raise ValueError(f"it ends at {state.end_offset}, not at {end}")
        return state

    def _base_entries(self, snapshot: int | None, base: dict[str, int]
                      ) -> Callable[[], bytes | memoryview]:
        """The loader of the segment section a delta snapshot names (format.md 3.2).

        The segment may be gone (retention, or a merge that renamed it) or
        another one under its name (a merge into its base): its checksum tells.
        Either way the delta is useless from now on; the state is loaded again,
        from an older snapshot or the newest segment."""
        path = self.cache.segment_path(base["segment"])

        def read() -> bytes | memoryview:
            try:
                data = memoryview(self.storage.read_range(path, base["at"], base["length"]))
            except FileNotFoundError:
                data = memoryview(b"")
            if len(data) != base["length"] or crc32c.crc32c(data) != base["crc"]:
                if snapshot is not None:
                    self._bad_snapshots.add(snapshot)
                raise SnapshotGone(f"the segment section {self.cache.url(path)} that a delta "
                                   "snapshot's producer entries build on is gone or changed")
            return data
        return read

    def new_state(self) -> ProducerState:
        """The state of the empty prefix, with this topic's producer expiry."""
        return ProducerState(expiration_ms=self.producer_expiration_ms)

    def snapshot_fields(self, state: ProducerState, last_base: int, anchor: bytes,
                        aborted_from: int, full: bool = False) -> bytes:
        """A snapshot, framed (format.md 3.1): its fields, then its producer entries
        section; a snapshot file holds these bytes, and so does a segment's snapshot
        section (encode_segment takes them as they are).  Its aborted list starts
        at ``aborted_from`` (or where the state's own starts, if later): the transactions
        aborted before it are in the aborted sections of segments that end at or before
        it, which is where a reader looks for them (reader.py), so no snapshot carries
        the whole history.  The fields hold the open transactions' entries only; the
        others are in the section, which readers of the log never read (format.md 3.1):
        all of them when ``full`` (a segment's), else only those changed since the
        state's base if it has one (a delta, format.md 3.2)."""
        fields, entries = state.snapshot_parts(full)
        start = max(state.aborted_from, aborted_from)
        fields["aborted"] = [a for a in fields["aborted"] if a[2] >= start]
        fields["aborted_from"] = start
        return frame({"v": SNAPSHOT_FORMAT, "topic_id": self.topic_id,
                      "last": [last_base, anchor], **fields}, entries)

    def _parse_snapshot(self, offset: int, data: bytes, path: str = "",
                        whole: bool = True) -> tuple[ProducerState, _Anchor]:
        """A snapshot file's state: a version 4 frame's fields (``data`` holds at least
        them; its entries are read when needed), or an older file's whole body (then
        ``whole``: ``data`` is the whole file)."""
        entries = None
        if is_framed(data):
            obj, start = unframe(data)
            url = self.cache.url(path)

            described = obj.get("entries") if isinstance(obj, dict) else None
            crc = described.get("crc") if isinstance(described, dict) else None

            def entries(size: int) -> bytes | memoryview:
                try:
                    data = memoryview(self.storage.read_range(path, start, size))
                except FileNotFoundError:
                    raise SnapshotGone(f"snapshot {url} was pruned (its producer entries "
                                       "with it)") from None
                if len(data) != size or crc32c.crc32c(data) != crc:
                    # Only a cache: never used again by this process, which loads anew.
                    self._bad_snapshots.add(offset)
                    logger.warning("skipping producer-state snapshot %s: its producer entries "
                                   "section is damaged (checksum mismatch or truncated)", url)
                    raise SnapshotGone(f"snapshot {url} has a damaged entries section")
                return data
        elif whole and len(data) >= 5 and \
                crc32c.crc32c(data[4:]) == int.from_bytes(data[:4], "big"):
            obj = msgpack.unpackb(data[4:])
        else:
            raise ValueError("checksum mismatch (or truncated)")
        if not isinstance(obj, dict) or (obj.get("v") in (4, 5)) != (entries is not None):
            raise ValueError("a version 4 or 5 snapshot must be framed, and only it")
        state = self.state_from_fields(obj, offset, entries, offset)
        last = obj.get("last")
        if not (isinstance(last, list) and len(last) == 2 and type(last[0]) is int
                and isinstance(last[1], bytes) and len(last[1]) == ANCHOR_BYTES):
            raise ValueError("no valid last-batch anchor")
        base, anchor = last
        found = self.cache.read_header(base) if 0 <= base < offset else None
        if found is None or found[0].next_offset != offset or found[2][:ANCHOR_BYTES] != anchor:
            raise ValueError(f"the log has no batch at {base} ending at {offset} with the "
                             "recorded checksum")
        return state, _Anchor(base, self.cache.batch_path(base), anchor)

    def _rebase(self, state: ProducerState) -> None:
        """Move ``state``'s base to the newest segment if a compaction made a newer one
        within its prefix since it was loaded (its anchor outlived the compaction), so that
        its deltas hold what changed since that segment, not since an older one
        (docs/protocol.md 2.8).  A listing per snapshot, and one read of the segment's
        head once per compaction."""
        base = state.producers.base
        if base is None or base.end >= self.cache.compacted_end(refresh=True):
            return
        bases = self.cache.list_segments()
        try:
            head, newest = self.segment_state(bases[-1])
        except (FileNotFoundError, CorruptSegmentError):
            return  # the old base serves as well; a reload will tell what happened
        if newest.producers.base is not None and base.end < head.end_offset <= state.end_offset:
            state.producers.rebase(newest.producers.base, newest.clock)

    def _write_snapshot(self, state: ProducerState) -> bool:
        """Publish a snapshot; it is only a cache, so failing to write one is harmless.

        False if the state's unread producer entries were gone (the cache is
        then dropped: the state must not be used)."""
        self._since_snapshot = 0
        anchor = self._anchor
        if anchor is None or anchor.next_segment is not None:
            return True  # nothing since the newest segment, whose own snapshot serves
        # Segments cover everything before the compacted end as this process listed it
        # (at most the true one): the list can start there.
        try:
            self._rebase(state)
            data = self.snapshot_fields(state, anchor.base, anchor.data,
                                        self.cache.compacted_end())
            # Right before publishing: a topic re-created since the refresh is
            # not ours to write into (the loader's id check covers the rest).
            if current_topic_id(self.storage, self.topic) != self.topic_id:
                return True
            self.storage.publish_if_absent(self.snapshot_path(state.end_offset), data)
            for old in self._snapshot_offsets()[:-SNAPSHOTS_KEPT]:
                self.storage.delete(self.snapshot_path(old))
        except SnapshotGone:
            self._drop_cache()  # the entries this state had not read are gone: reload
            return False
        except OSError:
            pass  # e.g. a read-only reader: it just rebuilds from the older snapshot next time
        return True


def _listing_reaches(listed: list[int], loaded: _Anchor | None) -> bool:
    """Whether a listing of the batch objects taken during a cold load holds every batch
    from the compacted end up to where the loaded state ends.

    A state loaded from a segment, or from nothing, ends at the compacted end
    (no batch before it is needed: those are in segments, or there are none).
    One loaded from a snapshot ends after its anchor batch: batches are
    published in offset order, so a listing that shows the anchor shows every
    batch before it that still exists.  The batches past the loaded end were
    applied by the refresh itself.
    """
    return loaded is None or loaded.next_segment is not None or loaded.base in listed
