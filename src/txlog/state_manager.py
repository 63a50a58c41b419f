"""The cached producer state of one partition, kept true to storage.

A partition's producer state (producer_state.py) is a fold over its batch
headers.  Folding from offset 0 on every call would read the whole log, so
this module keeps the fold in memory, advances it by the headers written
since, loads it from a snapshot when starting cold, and writes a snapshot
every SNAPSHOT_INTERVAL batches.  A cache is only worth having if it can
never describe another incarnation of the topic: the anchor check below is
what makes it safe (docs/protocol.md, section 1; the snapshot bytes are in
docs/format.md, section 3).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import crc32c
import msgpack

from .batch import HEADER_READ_SIZE, BatchHeader, ControlRecord, decode_control, decode_header, \
    payload_of
from .errors import CorruptBatchError, InconsistentTopicIdError, StorageError, UnknownTopicError
from .producer_state import ProducerState
from .storage import Storage
from .topic_ids import current_topic_id

logger = logging.getLogger(__name__)

OFFSET_DIGITS = 20
BATCH_SUFFIX = ".batch"
SNAPSHOT_DIR = "snapshots"
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_INTERVAL = 64  # batches between producer-state snapshots
SNAPSHOTS_KEPT = 2
ANCHOR_BYTES = 8  # magic + header checksum of a batch
SNAPSHOT_FORMAT = 2  # 2: the topic id and the last batch's anchor (format.md, section 3)
RELOADS = 5  # cache reloads in one refresh before giving up (storage keeps changing under us)


def offset_name(offset: int, suffix: str) -> str:
    return f"{offset:0{OFFSET_DIGITS}d}{suffix}"


def _named_offsets(names: list[str], suffix: str) -> list[int]:
    """Offsets of the ``<offset><suffix>`` names, sorted (anything else there is not ours)."""
    return sorted(int(n[:-len(suffix)]) for n in names
                  if n.endswith(suffix) and n[:-len(suffix)].isdigit())


class StateManager:
    """Producer state, batch headers and base offsets of one partition incarnation, cached.

    Appends and reads of the partition share this object and its ``lock``,
    so that what one learns (a batch it published, a listing) the others see.
    """

    def __init__(self, storage: Storage, topic: str, partition: int, topic_id: str,
                 on_stale: Callable[[str, str], None] | None = None) -> None:
        self.storage = storage
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.dir = f"topics/{topic}/{partition}"
        self._on_stale = on_stale
        self.lock = threading.RLock()
        self._drop_cache()

    def _drop_cache(self) -> None:
        """Forget everything learnt from storage (at start, and when it was pulled away)."""
        self._state: ProducerState | None = None
        self._since_snapshot = 0
        # Known base offsets, sorted; complete from 0 to the state's end once listed.
        self._bases: list[int] = []
        self._bases_complete = False
        self._headers: dict[int, BatchHeader] = {}
        # Base offset and first bytes (magic and header checksum) of the last
        # batch of the cached state: as long as that object is unchanged, the
        # cache describes this incarnation.  None while the state is empty.
        self._anchor: tuple[int, bytes] | None = None

    # --- paths and headers ----------------------------------------------------

    def batch_path(self, offset: int) -> str:
        return f"{self.dir}/{offset_name(offset, BATCH_SUFFIX)}"

    def url(self, path: str) -> str:
        """``path`` as a full URL, for error messages that name the object."""
        return f"{self.storage.url.rstrip('/')}/{path}"

    def read_header(self, offset: int
                    ) -> tuple[BatchHeader, ControlRecord | None, bytes] | None:
        """Header (and control record) of a batch, with the bytes read; None if absent."""
        path = self.batch_path(offset)
        try:
            head = self.storage.read_prefix(path, HEADER_READ_SIZE)
        except FileNotFoundError:
            return None
        header = decode_header(head, self.url(path), offset)
        control = None
        if header.is_control:
            control = decode_control(payload_of(head, header, self.url(path)), header,
                                     self.url(path))
        return header, control, head

    def header(self, offset: int) -> BatchHeader:
        """Header of the batch based at ``offset`` (cached: batches never change)."""
        cached = self._headers.get(offset)
        if cached is None:
            found = self.read_header(offset)
            if found is None:
                raise CorruptBatchError("batch file is missing from the log",
                                        self.url(self.batch_path(offset)), offset)
            cached = self._headers[offset] = found[0]
        return cached

    # --- producer state -------------------------------------------------------

    def state(self) -> ProducerState:
        """The producer state at the current log end (refreshed from storage).

        The headers past the cached end are read first and applied only once
        the cache is known to still describe this incarnation (its anchor is
        unchanged, or for an empty state, ``topic.json`` has our id).  A new
        incarnation can only be created after every object of the old one
        was deleted, so an anchor that still exists after the reads proves
        that the headers read came from the same incarnation.
        """
        with self.lock:
            for _ in range(RELOADS):
                if self._state is None:
                    self._state = self._load_snapshot()
                state = self._state
                found = []
                offset = state.end_offset
                while (item := self.read_header(offset)) is not None:
                    found.append(item)
                    offset = item[0].next_offset
                if not self.still_current():
                    continue
                for header, control, head in found:
                    self.applied(header, control, head)
                if self._since_snapshot >= SNAPSHOT_INTERVAL:
                    self._write_snapshot(state)
                return state
            raise StorageError(f"{self.topic}-{self.partition}: the log kept changing under "
                               f"this process ({RELOADS} reloads in one refresh)")

    def still_current(self) -> bool:
        """Whether the cached state still describes this incarnation (one small read).

        On a mismatch, ``topic.json`` decides: another topic id, or none,
        raises (the topic was deleted, perhaps re-created); the same id means
        the anchor went away for another reason (damage): the cache is
        dropped and False returned, so the caller reloads.
        """
        if self._anchor is not None:
            base, expected = self._anchor
            try:
                if self.storage.read_prefix(self.batch_path(base), ANCHOR_BYTES) == expected:
                    return True
            except FileNotFoundError:
                pass
        current = current_topic_id(self.storage, self.topic)
        if current != self.topic_id:
            self._stale(current)
        if self._anchor is None:
            return True
        logger.warning("%s-%d: batch %d of the cached state changed or vanished although the "
                       "topic is unchanged; reloading", self.topic, self.partition,
                       self._anchor[0])
        self._drop_cache()
        return False

    def _stale(self, current: str | None) -> None:
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
        self._anchor = (header.base_offset, bytes(data[:ANCHOR_BYTES]))
        self._note_base(header.base_offset)
        self._state.apply(header, control)
        self._since_snapshot += 1

    # --- base offsets ---------------------------------------------------------

    def _note_base(self, base: int) -> None:
        if not self._bases or base > self._bases[-1]:
            self._bases.append(base)

    def base_offsets(self, state: ProducerState) -> list[int]:
        """All base offsets below the state's end (one listing, then probes)."""
        with self.lock:
            if not self._bases_complete:
                listed = _named_offsets(self.storage.list(self.dir), BATCH_SUFFIX)
                merged = sorted(set(listed) | set(self._bases))
                self._bases = [b for b in merged if b < state.end_offset]
                self._bases_complete = True
            return self._bases  # callers only read; appends only ever extend it

    # --- snapshots ------------------------------------------------------------

    def _snapshot_offsets(self) -> list[int]:
        return _named_offsets(self.storage.list(f"{self.dir}/{SNAPSHOT_DIR}"), SNAPSHOT_SUFFIX)

    def _snapshot_path(self, offset: int) -> str:
        return f"{self.dir}/{SNAPSHOT_DIR}/{offset_name(offset, SNAPSHOT_SUFFIX)}"

    def _load_snapshot(self) -> ProducerState:
        """The newest usable snapshot's state, else the empty state.

        A snapshot is only a cache: one that is damaged, of an older format,
        of another incarnation of the topic, or that does not end with the
        batch it claims to, is skipped with a warning, never trusted and never
        fatal.
        """
        self._anchor = None
        for offset in reversed(self._snapshot_offsets()):
            path = self._snapshot_path(offset)
            try:
                data = self.storage.read(path)
            except FileNotFoundError:
                continue  # pruned by another process meanwhile
            try:
                state, anchor = self._parse_snapshot(offset, data)
            except Exception as exc:  # whatever garbage holds, it only costs a rebuild
                logger.warning("skipping producer-state snapshot %s: %s", self.url(path), exc)
                continue
            self._anchor = anchor
            logger.debug("%s-%d: producer state loaded from the snapshot at offset %d",
                         self.topic, self.partition, offset)
            return state
        logger.debug("%s-%d: no usable producer-state snapshot; rebuilding from offset 0",
                     self.topic, self.partition)
        return ProducerState()

    def _parse_snapshot(self, offset: int, data: bytes) -> tuple[ProducerState, tuple[int, bytes]]:
        if len(data) < 5 or crc32c.crc32c(data[4:]) != int.from_bytes(data[:4], "big"):
            raise ValueError("checksum mismatch (or truncated)")
        obj = msgpack.unpackb(data[4:])
        if not isinstance(obj, dict) or obj.get("v") != SNAPSHOT_FORMAT:
            raise ValueError(f"not a version {SNAPSHOT_FORMAT} snapshot")
        if obj.get("topic_id") != self.topic_id:
            raise ValueError(f"it belongs to topic id {obj.get('topic_id')!r}, not "
                             f"{self.topic_id!r} (the topic was re-created)")
        state = ProducerState.from_dict(obj)
        if state.end_offset != offset:
            raise ValueError(f"it ends at {state.end_offset}, not at its name's offset")
        last = obj.get("last")
        if not (isinstance(last, list) and len(last) == 2 and type(last[0]) is int
                and isinstance(last[1], bytes) and len(last[1]) == ANCHOR_BYTES):
            raise ValueError("no valid last-batch anchor")
        base, anchor = last
        found = self.read_header(base) if 0 <= base < offset else None
        if found is None or found[0].next_offset != offset or found[2][:ANCHOR_BYTES] != anchor:
            raise ValueError(f"the log has no batch at {base} ending at {offset} with the "
                             "recorded checksum")
        return state, (base, anchor)

    def _write_snapshot(self, state: ProducerState) -> None:
        """Publish a snapshot; it is only a cache, so failing to write one is harmless."""
        self._since_snapshot = 0
        if self._anchor is None:
            return
        base, anchor = self._anchor
        body = msgpack.packb({"v": SNAPSHOT_FORMAT, "topic_id": self.topic_id,
                              "last": [base, anchor], **state.to_dict()})
        data = crc32c.crc32c(body).to_bytes(4, "big") + body
        try:
            # Right before publishing: a topic re-created since the refresh is
            # not ours to write into (the loader's id check covers the rest).
            if current_topic_id(self.storage, self.topic) != self.topic_id:
                return
            self.storage.publish_if_absent(self._snapshot_path(state.end_offset), data)
            for old in self._snapshot_offsets()[:-SNAPSHOTS_KEPT]:
                self.storage.delete(self._snapshot_path(old))
        except OSError:
            pass  # e.g. a read-only reader: it just rebuilds from the older snapshot next time
