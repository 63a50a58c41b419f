"""Producer state of one partition: what a Kafka partition leader keeps in memory.

It is a pure function of the log prefix ``[0, end_offset)``: any process can
rebuild it from a snapshot plus the headers of the batches after it, and two
processes that look at the same prefix get the same state.  A writer validates
its batch against the state of exactly the prefix before the slot it claims.

The rules are Kafka's (ProducerStateManager / ProducerAppendInfo), with
KIP-890's marker epoch: a transaction marker carries the epoch after the bump,
so a late append of the closed transaction's epoch is rejected as fenced.

Entries expire as in Kafka (``producer.id.expiration.ms``, KIP-854), but on
the log's own clock: the largest append time (the writer's clock at publish,
recorded in each header) of the prefix, so that expiry stays a function of
the prefix and every process drops the same entries at the same offset.
A producer's CreateTime never counts: a backfill may set it years back.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import crc32c
import msgpack
import numpy as np

from ..format.batch import ABORT, NO_SEQUENCE, BatchHeader, ControlRecord
from ..errors import (InvalidProducerEpochError, InvalidTxnStateError, OutOfOrderSequenceError,
                      ProducerFencedError)

NUM_BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NumBatchesToRetain
INT32_MAX = 0x7FFFFFFF
SNAPSHOT_VERSION = 1  # of to_bytes; snapshot files have their own envelope (state_manager.py)
# A topic config, fixed at creation: every process must fold the log with the same value.
PRODUCER_ID_EXPIRATION = "producer.id.expiration.ms"
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # Kafka's default (1 day)
_NEVER = 1 << 62


@dataclass(slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: list[BatchMetadata] = field(default_factory=list)
    txn_first_offset: int = -1  # first offset of the open transaction, -1 if none
    decision_id: str = ""
    transactional_id: str = ""
    last_timestamp: int = -1
    last_append: int = -1  # the log clock (largest append time) at its last batch or marker
    # Batches applied before the snapshot section that may hold this producer's older
    # entry was read: (header, control, clock), folded onto it when read (ProducerEntries).
    pending: list[tuple[BatchHeader, ControlRecord | None, int]] | None = None
    base_cutoff: int = 0  # the cutoff when it became pending: its base row counts if after

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def in_transaction(self) -> bool:
        return self.txn_first_offset >= 0

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        if header.producer_epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == header.base_sequence and b.last_seq == header.last_sequence:
                return b
        return None


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    producer_id: int
    epoch: int
    first_offset: int
    decision_id: str
    transactional_id: str


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int
    last_offset: int  # offset of the ABORT marker


class AbortedIndex:
    """Per producer, the offset ranges of its aborted transactions, searchable by offset.

    A producer's transactions in one partition never overlap and end in
    marker order, so each producer's ranges are sorted by first offset and a
    lookup is one bisection (Kafka's consumer walks its aborted list the
    same way, in offset order).
    """

    def __init__(self) -> None:
        self._firsts: dict[int, list[int]] = {}
        self._lasts: dict[int, list[int]] = {}
        self.size = 0

    def add(self, aborted: AbortedTransaction) -> None:
        self._firsts.setdefault(aborted.producer_id, []).append(aborted.first_offset)
        self._lasts.setdefault(aborted.producer_id, []).append(aborted.last_offset)
        self.size += 1

    def covers(self, producer_id: int, offset: int) -> bool:
        firsts = self._firsts.get(producer_id)
        if not firsts:
            return False
        i = bisect.bisect_right(firsts, offset) - 1
        return i >= 0 and offset <= self._lasts[producer_id][i]


def _fold(entry: ProducerEntry, header: BatchHeader, control: ControlRecord | None,
          clock: int) -> int:
    """Advance one producer's entry past its batch (the log clock then at ``clock``); the
    first offset of the transaction an ABORT marker ends, else -1."""
    if header.producer_epoch > entry.epoch:
        entry.epoch = header.producer_epoch
        entry.batches = []
    entry.last_timestamp = header.max_timestamp
    entry.last_append = clock
    aborted_first = -1
    if header.is_control:
        assert control is not None
        if control.type == ABORT and entry.in_transaction:
            aborted_first = entry.txn_first_offset
        entry.txn_first_offset = -1
        entry.decision_id = ""
    else:
        entry.batches.append(BatchMetadata(header.base_sequence, header.last_sequence,
                                           header.base_offset, header.record_count))
        del entry.batches[:-NUM_BATCHES_TO_RETAIN]
        if header.is_transactional and not entry.in_transaction:
            entry.txn_first_offset = header.base_offset
            entry.decision_id = header.decision_id
            entry.transactional_id = header.transactional_id
    return aborted_first


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


# --- the producer entries section (format.md, section 3.1) ----------------------------

ENTRIES_MAGIC = b"TXE\x01"
_ENTRIES_HEAD = struct.Struct(">4sIII")  # magic, entries, batches, transactional-id bytes
ENTRY_ROW = np.dtype([("producer_id", ">i8"), ("last_timestamp", ">i8"),
                      ("last_append", ">i8"), ("epoch", ">i4"), ("batch_start", ">u4"),
                      ("txid_start", ">u4"), ("txid_length", ">u4"), ("batch_count", "u1")])
# 41 bytes
BATCH_ROW = np.dtype([("first_seq", ">i4"), ("last_seq", ">i4"), ("record_count", ">i4"),
                      ("base_offset", ">i8")])  # 20 bytes
# Reads the entries section of the snapshot a state was loaded from (its bytes, checked
# by the state): called only when an entry the state has not decoded is needed.
EntriesLoader = Callable[[], "bytes | memoryview"]
# Makes the loader of the base section a delta snapshot names, from its checked fields.
BaseLoader = Callable[[dict[str, int]], EntriesLoader]


class _Columns:
    """The entries of a producer-state section as arrays, sorted by producer id: a lookup
    is one binary search and decodes one entry, never the others."""

    def __init__(self, rows: np.ndarray, batches: np.ndarray, txids: bytes) -> None:
        self.rows = rows
        self.batches = batches
        self.txids = txids
        self.pids = rows["producer_id"].astype(np.int64)
        self.alive = np.ones(len(rows), dtype=bool)  # cleared by expiry and by removal

    def find(self, pid: int) -> int:
        i = int(np.searchsorted(self.pids, pid))
        return i if i < len(self.pids) and self.pids[i] == pid and self.alive[i] else -1

    def entry(self, i: int) -> ProducerEntry:
        row = self.rows[i]
        start, count = int(row["batch_start"]), int(row["batch_count"])
        batches = [BatchMetadata(int(b["first_seq"]), int(b["last_seq"]), int(b["base_offset"]),
                                 int(b["record_count"]))
                   for b in self.batches[start:start + count]]
        t0 = int(row["txid_start"])
        txid = self.txids[t0:t0 + int(row["txid_length"])].decode()
        return ProducerEntry(int(row["producer_id"]), int(row["epoch"]), batches, -1, "", txid,
                             int(row["last_timestamp"]), int(row["last_append"]))

    def max_pid(self) -> int:
        return int(self.pids[-1]) if len(self.pids) else -1

    def min_append(self) -> int:
        alive = self.rows["last_append"][self.alive]
        return int(alive.min()) if len(alive) else _NEVER

    @classmethod
    def parse(cls, data: bytes | memoryview, count: int, end: int) -> _Columns:
        """Check a section (ValueError on anything inconsistent, vectorised) and wrap it."""
        data = memoryview(data)
        if len(data) < _ENTRIES_HEAD.size:
            raise ValueError("producer entries section truncated")
        magic, n, nb, nt = _ENTRIES_HEAD.unpack_from(data, 0)
        if magic != ENTRIES_MAGIC or n != count:
            raise ValueError(f"not a producer entries section of {count} entries")
        at = _ENTRIES_HEAD.size
        ends = (at + n * ENTRY_ROW.itemsize, at + n * ENTRY_ROW.itemsize + nb * BATCH_ROW.itemsize)
        if len(data) != ends[1] + nt:
            raise ValueError("producer entries section has the wrong length")
        rows = np.frombuffer(data[at:ends[0]], dtype=ENTRY_ROW)
        batches = np.frombuffer(data[ends[0]:ends[1]], dtype=BATCH_ROW)
        txids = bytes(data[ends[1]:])
        counts = rows["batch_count"].astype(np.int64)
        lengths = rows["txid_length"].astype(np.int64)
        pids = rows["producer_id"].astype(np.int64)
        if n and (pids[0] < 0 or np.any(np.diff(pids) <= 0)):
            raise ValueError("producer ids not strictly increasing and non-negative")
        if np.any(counts > NUM_BATCHES_TO_RETAIN) or \
                np.any(rows["batch_start"].astype(np.int64) != np.cumsum(counts) - counts) or \
                int(counts.sum()) != nb or \
                np.any(rows["txid_start"].astype(np.int64) != np.cumsum(lengths) - lengths) or \
                int(lengths.sum()) != nt:
            raise ValueError("producer entries do not tile their batches and ids")
        base = batches["base_offset"].astype(np.int64)
        if np.any(base < 0) or np.any(base >= end) or np.any(batches["record_count"] < 1):
            raise ValueError("a producer batch outside the prefix")
        txids.decode()  # UnicodeDecodeError is a ValueError
        return cls(rows, batches, txids)

    @staticmethod
    def encode(parts: list[tuple[np.ndarray, np.ndarray, bytes]]) -> bytes:
        """One section of the given (rows, batches, ids) parts, merged by producer id; each
        part's ``batch_start``/``txid_start`` are relative to its own arrays."""
        rows = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, ENTRY_ROW)
        bstarts, tstarts, bchunks, tchunks = [], [], [], []
        boff = toff = 0
        for prow, pbat, ptx in parts:
            bstarts.append(prow["batch_start"].astype(np.int64) + boff)
            tstarts.append(prow["txid_start"].astype(np.int64) + toff)
            bchunks.append(pbat)
            tchunks.append(np.frombuffer(ptx, dtype=np.uint8))
            boff += len(pbat)
            toff += len(ptx)
        order = np.argsort(rows["producer_id"].astype(np.int64), kind="stable")
        rows = rows[order]
        if not len(rows):
            return _ENTRIES_HEAD.pack(ENTRIES_MAGIC, 0, 0, 0)
        bstart = np.concatenate(bstarts)[order]
        tstart = np.concatenate(tstarts)[order]
        all_batches = np.concatenate(bchunks) if bchunks else np.zeros(0, BATCH_ROW)
        all_txids = np.concatenate(tchunks) if tchunks else np.zeros(0, np.uint8)
        bcount = rows["batch_count"].astype(np.int64)
        tlen = rows["txid_length"].astype(np.int64)
        batches = all_batches[_gather(bstart, bcount)]
        txids = all_txids[_gather(tstart, tlen)].tobytes()
        rows = rows.copy()
        rows["batch_start"] = np.cumsum(bcount) - bcount
        rows["txid_start"] = np.cumsum(tlen) - tlen
        return b"".join([_ENTRIES_HEAD.pack(ENTRIES_MAGIC, len(rows), len(batches), len(txids)),
                         rows.astype(ENTRY_ROW).tobytes(), batches.astype(BATCH_ROW).tobytes(),
                         txids])

    def kept(self, drop: np.ndarray) -> tuple[np.ndarray, np.ndarray, bytes]:
        """This section's live rows whose producer id is not in ``drop``, as an encode part."""
        keep = self.alive & ~np.isin(self.pids, drop)
        return self.rows[keep], self.batches, self.txids


def _gather(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Indexes ``starts[i] .. starts[i] + counts[i]`` for every i, concatenated (no loop)."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    firsts = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return firsts + np.arange(total, dtype=np.int64)


def _entries_part(entries: list[ProducerEntry]) -> tuple[np.ndarray, np.ndarray, bytes]:
    """Decoded entries as an encode part (a loop over the entries a process touched)."""
    rows = np.zeros(len(entries), dtype=ENTRY_ROW)
    batches = [b for e in entries for b in e.batches]
    txids = [e.transactional_id.encode() for e in entries]
    rows["producer_id"] = [e.producer_id for e in entries]
    rows["last_timestamp"] = [e.last_timestamp for e in entries]
    rows["last_append"] = [e.last_append for e in entries]
    rows["epoch"] = [e.epoch for e in entries]
    counts = np.array([len(e.batches) for e in entries], dtype=np.int64)
    lengths = np.array([len(t) for t in txids], dtype=np.int64)
    rows["batch_count"] = counts
    rows["batch_start"] = np.cumsum(counts) - counts
    rows["txid_length"] = lengths
    rows["txid_start"] = np.cumsum(lengths) - lengths
    brows = np.zeros(len(batches), dtype=BATCH_ROW)
    brows["first_seq"] = [b.first_seq for b in batches]
    brows["last_seq"] = [b.last_seq for b in batches]
    brows["record_count"] = [b.record_count for b in batches]
    brows["base_offset"] = [b.base_offset for b in batches]
    return rows, brows, b"".join(txids)


class _Base:
    """The producer entries section of the segment a state's entries were last written in
    full (format.md 3.2): a delta snapshot's entries are the changes since it.

    Read only when an entry that may be in it is needed.  Its rows are never
    expired in place: a row counts only while its last append is after the
    state's cutoff (``take`` and ``part`` check it), which is the entry's fate
    in a full fold, since a full fold drops exactly the entries idle for the
    expiration at every step and the clock never runs backwards.  So an expiry
    never reads it, and neither does an append for a producer id above
    ``max_pid``.
    """

    def __init__(self, loader: EntriesLoader, count: int, max_pid: int, end: int,
                 descriptor: dict[str, int]) -> None:
        self.loader, self.count, self.max_pid, self.end = loader, count, max_pid, end
        self.descriptor = descriptor  # how a delta snapshot names it (its "base" field)
        self.columns: _Columns | None = None
        self.hidden: set[int] = set()  # ids taken, superseded or dropped before it was read

    def may_hold(self, pid: int) -> bool:
        """Whether ``pid`` may have a row here, without reading the section."""
        if pid > self.max_pid:
            return False
        if self.columns is None:
            return pid not in self.hidden
        return self.columns.find(pid) >= 0

    def read(self) -> _Columns:
        if self.columns is None:
            columns = _Columns.parse(self.loader(), self.count, self.end)
            if self.hidden:
                columns.alive &= ~np.isin(columns.pids, np.fromiter(self.hidden, np.int64))
                self.hidden.clear()
            self.columns = columns
        return self.columns

    def hide(self, pids: np.ndarray) -> None:
        """Rows of these ids no longer count: a newer layer holds them, or they went."""
        if self.columns is None:
            self.hidden.update(int(p) for p in pids)
        else:
            self.columns.alive &= ~np.isin(self.columns.pids, pids)

    def take(self, pid: int, cutoff: int) -> ProducerEntry | None:
        """The row of ``pid`` decoded, if it counts at ``cutoff``; either way it is hidden
        from now on (the caller keeps the entry, or its producer starts anew)."""
        if not self.may_hold(pid):
            return None
        columns = self.read()
        i = columns.find(pid)
        if i < 0:
            return None
        columns.alive[i] = False
        if int(columns.rows["last_append"][i]) <= cutoff:
            return None
        return columns.entry(i)

    def part(self, cutoff: int) -> tuple[np.ndarray, np.ndarray, bytes]:
        """The rows that count at ``cutoff``, as an encode part."""
        columns = self.read()
        keep = columns.alive & (columns.rows["last_append"].astype(np.int64) > cutoff)
        return columns.rows[keep], columns.batches, columns.txids


class ProducerEntries:
    """The producer entries of a state: a mapping by producer id, decoded on demand.

    Three layers, newest first: the decoded entries (``_hot``: every open
    transaction's among them), the *top* section (a delta snapshot's changes,
    or a full section of a state with no base), and the *base* section
    (``_Base``: the newest segment's, read when loaded from that segment or
    named by a delta).  A row of a lower layer counts only if no upper layer
    holds its producer.  A section is read through its loader only when an
    entry that may be in it is needed: by an append's checks (``get``), an
    expiry that may drop some of the top's, or a new snapshot.  A batch applied
    before then, by a producer the state has not decoded, starts a *pending*
    entry that records the batches applied (``ProducerEntry.pending``): a
    section entry is never in a transaction, so the pending entry alone knows
    everything about the producer's transaction, and when the section is read
    the recorded batches are folded onto the section's entry, giving exactly
    the entry a full fold would have (docs/protocol.md, section 1.2).
    """

    def __init__(self) -> None:
        self._hot: dict[int, ProducerEntry] = {}
        self._columns: _Columns | None = None
        self._loader: EntriesLoader | None = None
        self._count = 0  # entries in the unread top section
        self._min_append = _NEVER  # the oldest last append in the unread top section
        self._max_pid = _NEVER  # the largest producer id in it (unknown: _NEVER)
        self._end = 0
        self._removed: set[int] = set()  # ids removed before the top section was read
        self.base: _Base | None = None
        # Entries last appended at or before it have expired (the state's clock minus the
        # expiration, after its last batch): what a base row is checked against.
        self.cutoff = -_NEVER

    def attach(self, loader: EntriesLoader, count: int, min_append: int, end: int,
               max_pid: int = _NEVER) -> None:
        """Back this mapping with an unread top section of ``count`` entries."""
        self._loader, self._count, self._min_append, self._end = loader, count, min_append, end
        self._max_pid = max_pid

    def attach_base(self, base: _Base) -> None:
        """Put ``base`` under the top section; the decoded entries hide its rows."""
        self.base = base
        base.hide(np.fromiter(self._hot, np.int64, len(self._hot)))

    def top_as_base(self, descriptor: dict[str, int]) -> None:
        """Make the unread top section the base (a state loaded from a segment, whose
        section ``descriptor`` names for the deltas written from this state)."""
        assert self._loader is not None and self.base is None
        base = _Base(self._loader, self._count, self._max_pid, self._end, descriptor)
        self._loader, self._count, self._min_append, self._max_pid = None, 0, _NEVER, _NEVER
        self.attach_base(base)

    def rebase(self, base: _Base, since: int) -> None:
        """Build the next deltas on ``base``, a newer segment's section that ends within
        this state's prefix, its clock ``since``: the top and the decoded entries keep
        only what was appended at or after it (the others are in ``base`` as they are
        here, pending ones folded, since the clock orders the log; an open transaction
        stays whatever its age)."""
        self._load_top()
        if self._columns is not None:
            self._columns.alive &= self._columns.rows["last_append"].astype(np.int64) >= since
        self._hot = {pid: e for pid, e in self._hot.items()
                     if e.in_transaction or e.last_append >= since}
        self.base = base
        hidden = [np.fromiter(self._hot, np.int64, len(self._hot))]
        if self._columns is not None:
            hidden.append(self._columns.pids[self._columns.alive])
        base.hide(np.concatenate(hidden))

    @property
    def unread(self) -> bool:
        """Whether some entries are still only in an unread section."""
        return self._loader is not None or (self.base is not None and self.base.columns is None)

    def load(self) -> None:
        """Read and check every section (OSError if an object is gone, ValueError if
        damaged)."""
        self._load_top()
        if self.base is not None:
            self.base.read()

    def _load_top(self) -> None:
        if self._loader is None:
            return
        columns = _Columns.parse(self._loader(), self._count, self._end)
        if self._removed:
            columns.alive &= ~np.isin(columns.pids, np.fromiter(self._removed, np.int64))
            self._removed.clear()
        self._columns, self._loader, self._count = columns, None, 0
        if self.base is not None:
            self.base.hide(columns.pids)
        for entry in list(self._hot.values()):
            if entry.pending is not None and columns.find(entry.producer_id) >= 0:
                self._resolve(entry)

    def _resolve(self, entry: ProducerEntry) -> ProducerEntry:
        """Fold a pending entry's batches onto the stored entry of its producer."""
        pid = entry.producer_id
        if self._loader is not None and pid <= self._max_pid and pid not in self._removed:
            self._load_top()  # resolves the entry if the top holds it
            if entry.pending is None:
                return self._hot[pid]
        pending, entry.pending = entry.pending, None
        base = self._take(pid, entry.base_cutoff)
        if base is None or pending is None:
            return entry
        for header, control, clock in pending:
            _fold(base, header, control, clock)
        self._hot[pid] = base
        return base

    def _take(self, pid: int, cutoff: int) -> ProducerEntry | None:
        """The stored entry of ``pid`` decoded (and from now on kept decoded), if any."""
        columns = self._columns
        if columns is not None:
            i = columns.find(pid)
            if i >= 0:
                columns.alive[i] = False
                return columns.entry(i)
        if self.base is not None:
            return self.base.take(pid, cutoff)
        return None

    def get(self, pid: int, default: ProducerEntry | None = None) -> ProducerEntry | None:
        entry = self._hot.get(pid)
        if entry is not None:
            return self._resolve(entry) if entry.pending is not None else entry
        if self._loader is not None and pid <= self._max_pid and pid not in self._removed:
            self._load_top()
        entry = self._take(pid, self.cutoff)
        if entry is None:
            return default
        self._hot[pid] = entry
        return entry

    def peek(self, pid: int) -> tuple[ProducerEntry | None, bool]:
        """The entry of ``pid`` without reading a section, and whether one may hold it."""
        entry = self._hot.get(pid)
        if entry is not None:
            return entry, False
        if self._loader is not None:
            if pid <= self._max_pid and pid not in self._removed:
                return None, True
        elif self._columns is not None and self._columns.find(pid) >= 0:
            return self.get(pid), False
        base = self.base
        if base is None:
            return None, False
        if base.columns is None:
            return None, base.may_hold(pid)
        return self.get(pid), False

    def __getitem__(self, pid: int) -> ProducerEntry:
        entry = self.get(pid)
        if entry is None:
            raise KeyError(pid)
        return entry

    def __setitem__(self, pid: int, entry: ProducerEntry) -> None:
        self._hot[pid] = entry

    def __delitem__(self, pid: int) -> None:
        self.discard(pid)

    def discard(self, pid: int) -> None:
        self._hot.pop(pid, None)
        if self._loader is not None:
            self._removed.add(pid)
        elif self._columns is not None:
            i = self._columns.find(pid)
            if i >= 0:
                self._columns.alive[i] = False
        if self.base is not None:
            self.base.hide(np.array([pid], np.int64))

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, int) and self.get(pid) is not None

    def decoded_ids(self) -> dict[int, ProducerEntry]:
        return self._hot

    def decoded(self) -> list[ProducerEntry]:
        """The entries decoded so far (every entry with an open transaction among them)."""
        return list(self._hot.values())

    def _resolved(self) -> None:
        """Every pending entry folded onto its stored one (reads what may hold them)."""
        for entry in list(self._hot.values()):
            if entry.pending is not None:
                self._resolve(entry)

    def _all(self) -> dict[int, ProducerEntry]:
        self.load()
        self._resolved()
        for columns, keep in self._stored():
            for i in np.flatnonzero(keep):
                self._hot[int(columns.pids[i])] = columns.entry(int(i))
            columns.alive[keep] = False
        return self._hot

    def _stored(self) -> list[tuple[_Columns, np.ndarray]]:
        """The read sections with the rows of theirs that count (upper layers hidden)."""
        found = []
        if self._columns is not None:
            found.append((self._columns, self._columns.alive.copy()))
        if self.base is not None and self.base.columns is not None:
            base = self.base.columns
            found.append((base, base.alive & (base.rows["last_append"].astype(np.int64)
                                              > self.cutoff)))
        return found

    def items(self):  # noqa: ANN201 - a dict view
        """Every entry, decoded (tools and tests; nothing on a data path)."""
        return self._all().items()

    def values(self):  # noqa: ANN201
        return self._all().values()

    def keys(self):  # noqa: ANN201
        return self._all().keys()

    def __iter__(self):  # noqa: ANN204
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ProducerEntries):
            other = other._all()
        return isinstance(other, dict) and self._all() == other

    __hash__ = None  # type: ignore[assignment]

    def ready_for_expiry(self, cutoff: int) -> None:
        """Read the top section if an expiry at ``cutoff`` may drop some of its entries
        (so that applying a batch, after its publish, reads nothing)."""
        if self._loader is not None and self._min_append <= cutoff:
            self._load_top()

    def expire(self, cutoff: int) -> int:
        """Drop entries idle since ``cutoff`` or before; the oldest last append left (of
        the decoded entries and the top section: the base's rows expire by ``cutoff``)."""
        self.ready_for_expiry(cutoff)
        due = self._min_append if self._loader is not None else _NEVER
        for pid in [pid for pid, e in self._hot.items()
                    if not e.in_transaction and e.last_append <= cutoff]:
            self.discard(pid)
        for e in self._hot.values():
            if not e.in_transaction:
                due = min(due, e.last_append)
        columns = self._columns
        if columns is not None:
            columns.alive &= columns.rows["last_append"].astype(np.int64) > cutoff
            due = min(due, columns.min_append())
        return due

    def encode(self, full: bool) -> tuple[list[ProducerEntry], bytes, int, int, int]:
        """(open-transaction entries, the section of the others, its entry count, their
        oldest last append, their largest producer id).

        With a base and not ``full``, the section is a delta: only the entries
        changed since the base (format.md 3.2), and the base stays unread.
        Otherwise it holds every entry.  Afterwards (unless a full section was
        asked of a state with a base, which is left as it was) the state holds
        the new section as its top, decoded as arrays, and only the open
        transactions' entries as objects: what a process touched since is
        folded into arrays once per snapshot, not kept decoded."""
        self._load_top()
        if full:
            self.load()
        self._resolved()
        opened = [e for e in self._hot.values() if e.in_transaction]
        closed = [e for e in self._hot.values() if not e.in_transaction]
        parts = [_entries_part(closed)]
        if self._columns is not None:
            parts.append(self._columns.kept(np.fromiter(self._hot, np.int64, len(self._hot))))
        if full and self.base is not None:
            parts.append(self.base.part(self.cutoff))
        data = _Columns.encode(parts)
        count = _ENTRIES_HEAD.unpack_from(data, 0)[1]
        columns = _Columns.parse(data, count, 1 << 62)
        if not (full and self.base is not None):
            self._columns = columns
            self._hot = {e.producer_id: e for e in opened}
        return opened, data, count, columns.min_append(), columns.max_pid()


def _check_first_batch(header: BatchHeader,
                       verify: Callable[[BatchHeader], bool] | None) -> None:
    """Refuse a batch of a producer this partition does not know (new, or its entry
    expired): with no entry to compare against, only the coordinator (``verify``) can
    tell a fenced transactional producer, and the sequence must start again at 0."""
    pid, epoch, seq = header.producer_id, header.producer_epoch, header.base_sequence
    if header.is_transactional and verify is not None and not verify(header):
        raise ProducerFencedError(
            f"producer {pid} epoch {epoch} (transactional id "
            f"{header.transactional_id!r}, batch sequence {seq}) writes to transaction "
            f"{header.decision_id!r}, which its coordinator does not know as open: the "
            "producer was fenced or its transaction ended (this partition no longer "
            "knows the producer: its entry expired, or it never wrote here)")
    if seq != 0:
        raise OutOfOrderSequenceError(
            f"producer {pid} epoch {epoch} is unknown to this partition, so its first "
            f"batch must have sequence 0, not {seq}")


def _check_next_batch(entry: ProducerEntry, header: BatchHeader) -> None:
    """Refuse a batch that is not a duplicate but does not follow ``entry``, its
    producer's last one here: an older epoch (fenced), a change inside an open
    transaction, or a sequence gap (checked against the entry's last sequence, or 0
    for a new epoch)."""
    pid, epoch, seq = header.producer_id, header.producer_epoch, header.base_sequence
    if epoch < entry.epoch:
        error = ProducerFencedError if header.is_transactional else InvalidProducerEpochError
        raise error(
            f"producer {pid} epoch {epoch} (batch sequence {seq}) is older than epoch "
            f"{entry.epoch} already in this partition (a newer instance took over, or its "
            "transaction was already ended)")
    if entry.in_transaction:
        if epoch > entry.epoch:
            raise InvalidTxnStateError(
                f"producer {pid} wrote epoch {epoch} while its transaction of epoch "
                f"{entry.epoch} is still open in this partition")
        if not header.is_transactional:
            raise InvalidTxnStateError(
                f"producer {pid} sent a non-transactional batch during its open transaction")
        if header.decision_id != entry.decision_id:
            raise InvalidTxnStateError(
                f"producer {pid} changed decision id from {entry.decision_id!r} to "
                f"{header.decision_id!r} inside one transaction")
    if epoch > entry.epoch:
        if seq != 0:
            raise OutOfOrderSequenceError(
                f"producer {pid}: first batch of new epoch {epoch} must have sequence 0, "
                f"not {seq}")
    else:
        last = entry.last_seq
        if last == NO_SEQUENCE and seq != 0:
            raise OutOfOrderSequenceError(
                f"producer {pid} epoch {epoch}: expected sequence 0, got {seq}")
        if last != NO_SEQUENCE and not _in_sequence(last, seq):
            raise OutOfOrderSequenceError(
                f"producer {pid} epoch {epoch}: out-of-order sequence {seq}, expected "
                f"{(last + 1) & INT32_MAX}")


class ProducerState:
    """State after the prefix ``[0, end_offset)`` of one partition."""

    def __init__(self, end_offset: int = 0,
                 expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.end_offset = end_offset
        self.producers = ProducerEntries()
        self.aborted: list[AbortedTransaction] = []
        # ``aborted`` lists every aborted transaction whose ABORT marker is at or after
        # this offset; those before it are in the segments' aborted sections (a state
        # loaded from a version 3 snapshot, format.md section 3).
        self.aborted_from = 0
        self.expiration_ms = expiration_ms
        self.clock = -1  # the largest append time of the prefix (ms), -1 before any
        self._next_expiry = _NEVER  # the clock at which some entry may be due

    def copy(self) -> ProducerState:
        return ProducerState.from_bytes(self.to_bytes(), self.expiration_ms)

    # --- validation ---------------------------------------------------------

    def check_append(self, header: BatchHeader,
                     verify: Callable[[BatchHeader], bool] | None = None
                     ) -> BatchMetadata | None:
        """Validate a data batch about to be written at ``end_offset``.

        Returns the original batch when ``header`` duplicates one of the
        producer's last five batches (then nothing must be written); raises
        when the batch must be rejected; returns None when it may be written.

        ``verify`` tells whether the coordinator knows a batch's transaction
        as open, with this producer id and epoch (Kafka's partition
        verification, KIP-890).  It is asked only for a transactional
        producer this partition does not know: a new one, or one whose entry
        expired, and with it the epoch that fenced it.  So a fenced zombie is
        refused although the entry that fenced it is gone.
        """
        if not header.is_idempotent:
            return None
        entry = self.producers.get(header.producer_id)
        if entry is None:
            _check_first_batch(header, verify)
            return None
        duplicate = entry.find_duplicate(header)
        if duplicate is not None:
            return duplicate
        _check_next_batch(entry, header)
        return None

    def marker_needed(self, producer_id: int, marker_epoch: int) -> bool:
        """False when this partition already holds this marker or anything newer.

        Markers carry the bumped epoch, so an entry at that epoch or later means
        the marker was written already: writing it twice would change nothing.
        """
        entry = self.producers.get(producer_id)
        return entry is None or entry.epoch < marker_epoch

    # --- replay ---------------------------------------------------------------

    def apply(self, header: BatchHeader, control: ControlRecord | None = None) -> None:
        """Advance past one batch (already validated when it was written)."""
        if header.base_offset != self.end_offset:
            raise ValueError(
                f"batch at {header.base_offset} applied to state ending at {self.end_offset}")
        pid = header.producer_id
        if header.is_idempotent:
            # Batches written before headers carried the append time count by their
            # largest timestamp (format.md 2.1); the clock never runs backwards.
            self.clock = max(self.clock, header.append_time if header.append_time >= 0
                             else header.max_timestamp)
            entry, maybe_unread = self.producers.peek(pid)
            if entry is None:
                entry = self.producers[pid] = ProducerEntry(pid, header.producer_epoch)
                if maybe_unread:
                    entry.pending = []
                    entry.base_cutoff = self.producers.cutoff
            if entry.pending is not None:
                entry.pending.append((header, control, self.clock))
            aborted_first = _fold(entry, header, control, self.clock)
            if aborted_first >= 0:
                self.aborted.append(AbortedTransaction(pid, aborted_first, header.base_offset))
            if not entry.in_transaction:
                self._next_expiry = min(self._next_expiry,
                                        entry.last_append + self.expiration_ms)
        elif header.append_time >= 0:
            self.clock = max(self.clock, header.append_time)
        self.end_offset = header.next_offset
        if self.clock >= self._next_expiry:
            self._expire()
        self.producers.cutoff = self.clock - self.expiration_ms

    def ready(self, header: BatchHeader) -> None:
        """Read what applying ``header`` will need, before it is published: the top
        section's entries, if the expiry it makes due may drop some (applying never
        reads the base: its rows expire by the cutoff, ProducerEntries)."""
        clock = max(self.clock, header.append_time if header.append_time >= 0
                    else header.max_timestamp)
        if header.is_idempotent and clock >= self._next_expiry:
            self.producers.ready_for_expiry(clock - self.expiration_ms)

    def _expire(self) -> None:
        """Drop entries idle for the expiration or longer (Kafka's removeExpiredProducers).

        An entry with an open transaction stays, as in Kafka: the transaction
        still needs its marker, and the LSO its first offset.
        """
        oldest = self.producers.expire(self.clock - self.expiration_ms)
        self._next_expiry = oldest + self.expiration_ms if oldest < _NEVER else _NEVER

    # --- derived views --------------------------------------------------------

    def open_transactions(self) -> list[OpenTransaction]:
        return sorted(
            (OpenTransaction(e.producer_id, e.epoch, e.txn_first_offset, e.decision_id,
                             e.transactional_id)
             for e in self.producers.decoded() if e.in_transaction),
            key=lambda t: t.first_offset)

    # --- snapshots ------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The state as msgpack-ready fields (the body of a snapshot, format.md section 3)."""
        producers = [_entry_fields(e) for _, e in sorted(self.producers.items())]
        aborted = [[a.producer_id, a.first_offset, a.last_offset] for a in self.aborted]
        # The expiry clock and each entry's last append time travel beside the
        # entries, so snapshots of older code (without them) still parse.
        appended = [[e.producer_id, e.last_append] for _, e in sorted(self.producers.items())]
        return {"end": self.end_offset, "producers": producers, "aborted": aborted,
                "aborted_from": self.aborted_from, "clock": self.clock, "appended": appended}

    def snapshot_parts(self, full: bool = False) -> tuple[dict[str, Any], bytes]:
        """The state as a version 5 snapshot: msgpack-ready fields holding what a reader
        of the log needs (the open transactions, the aborted list, the clock), and the
        producer entries section that only an append's checks read (format.md 3.1).

        Unless ``full``, a state with a base (the segment it was loaded from, or
        the one its delta snapshot named) writes a delta: the entries changed
        since the base, and a ``base`` field naming it (format.md 3.2)."""
        delta = not full and self.producers.base is not None
        opened, data, count, min_append, max_pid = self.producers.encode(full)
        fields = {
            "end": self.end_offset, "clock": self.clock,
            "aborted": [[a.producer_id, a.first_offset, a.last_offset] for a in self.aborted],
            "aborted_from": self.aborted_from,
            "open": [_entry_fields(e) + [e.last_append] for e in opened],
            "entries": {"count": count, "length": len(data), "crc": crc32c.crc32c(data),
                        "min_append": min_append if min_append < _NEVER else -1,
                        "max_pid": max_pid}}
        if delta:
            assert self.producers.base is not None
            fields["base"] = dict(self.producers.base.descriptor)
        return fields, data

    @classmethod
    def _from_parts(cls, obj: dict, end: int, expiration_ms: int,
                    entries: EntriesLoader | None, base: BaseLoader | None) -> ProducerState:
        """A version 4 or 5 state: its open entries decoded, the others left unread."""
        state = cls(end, expiration_ms)
        described, opened = obj.get("entries"), obj.get("open")
        if not isinstance(described, dict) or not isinstance(opened, list):
            raise ValueError("entries must be a map and open an array")
        count, length, crc, min_append = (_int(described.get(k), f"entries {k}") for k in
                                          ("count", "length", "crc", "min_append"))
        max_pid = _int(described.get("max_pid", _NEVER), "entries max_pid")
        for item in opened:
            if not isinstance(item, list) or len(item) != 8:
                raise ValueError("an open producer entry must have 8 fields")
            entry = _entry_from(item[:7], end)
            entry.last_append = _int(item[7], "append time")
            if not entry.in_transaction or entry.producer_id in state.producers.decoded_ids():
                raise ValueError(f"inconsistent open entry of producer {entry.producer_id}")
            state.producers[entry.producer_id] = entry
        if count < 0 or length < 0:
            raise ValueError("negative entries count or length")
        if count:
            if entries is None:
                raise ValueError("a version 4 state without its entries section")
            load = entries

            def checked() -> bytes | memoryview:
                data = load()
                if len(data) != length or crc32c.crc32c(data) != crc:
                    raise ValueError("producer entries section checksum mismatch (or truncated)")
                return data

            state.producers.attach(checked, count, min_append if min_append >= 0 else _NEVER,
                                   end, max_pid)
        if "base" in obj:
            state.producers.attach_base(_base_from(obj["base"], end, base))
        state._aborted_from_fields(obj)
        state.clock = _int(obj.get("clock"), "clock")
        state.producers.cutoff = state.clock - expiration_ms
        due = min((e.last_append for e in state.producers.decoded() if not e.in_transaction),
                  default=_NEVER)
        if count:
            due = min(due, min_append if min_append >= 0 else _NEVER)
        state._next_expiry = due + expiration_ms if due < _NEVER else _NEVER
        return state

    @classmethod
    def from_dict(cls, obj: Any, expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
                  entries: EntriesLoader | None = None,
                  base: BaseLoader | None = None) -> ProducerState:
        """Rebuild a state, refusing (ValueError) anything that is not one.

        Snapshots are only a cache and may be damaged in ways a checksum
        does not catch (a valid checksum over garbage): every field is
        checked for type and range, so garbage is rejected, not trusted.
        ``base`` reads the section a delta's ``base`` field names.
        """
        if not isinstance(obj, dict):
            raise ValueError("producer state is not a map")
        end = _int(obj.get("end"), "end")
        if end < 0:
            raise ValueError("negative end offset")
        if "entries" in obj:
            return cls._from_parts(obj, end, expiration_ms, entries, base)
        state = cls(end, expiration_ms)
        producers, aborted = obj.get("producers"), obj.get("aborted")
        if not isinstance(producers, list) or not isinstance(aborted, list):
            raise ValueError("producers and aborted must be arrays")
        for item in producers:
            entry = _entry_from(item, end)
            if entry.producer_id in state.producers.decoded_ids():
                raise ValueError(f"inconsistent entry of producer {entry.producer_id}")
            state.producers[entry.producer_id] = entry
        state._aborted_from_fields(obj)
        state._load_expiry(obj)
        return state

    def _aborted_from_fields(self, obj: dict) -> None:
        aborted = obj.get("aborted")
        if not isinstance(aborted, list):
            raise ValueError("aborted must be an array")
        end = self.end_offset
        self.aborted_from = _int(obj.get("aborted_from", 0), "aborted_from")
        if not 0 <= self.aborted_from <= end:
            raise ValueError("aborted_from outside the prefix")
        for item in aborted:
            if not isinstance(item, list) or len(item) != 3:
                raise ValueError("malformed aborted transaction")
            txn = AbortedTransaction(*(_int(v, "aborted field") for v in item))
            if not 0 <= txn.first_offset <= txn.last_offset < end:
                raise ValueError("aborted transaction outside the prefix")
            self.aborted.append(txn)

    def _load_expiry(self, obj: dict) -> None:
        """The expiry clock and append times; a snapshot without them (older code) counts
        each entry's largest timestamp, as a batch header without an append time does."""
        clock, appended = obj.get("clock"), obj.get("appended")
        last = {e.producer_id: e.last_timestamp for e in self.producers.values()}
        if appended is not None:
            if not isinstance(appended, list):
                raise ValueError("appended must be an array")
            for item in appended:
                if not isinstance(item, list) or len(item) != 2:
                    raise ValueError("malformed append time")
                pid, at = (_int(v, "append time field") for v in item)
                if pid not in last:
                    raise ValueError(f"append time of unknown producer {pid}")
                last[pid] = at
        self.clock = _int(clock, "clock") if clock is not None else max(last.values(), default=-1)
        for pid, at in last.items():
            self.producers[pid].last_append = at
        self.producers.cutoff = self.clock - self.expiration_ms
        self._next_expiry = _NEVER
        for e in self.producers.values():
            if not e.in_transaction:
                self._next_expiry = min(self._next_expiry, e.last_append + self.expiration_ms)

    def to_bytes(self) -> bytes:
        return msgpack.packb({"v": SNAPSHOT_VERSION, **self.to_dict()})

    @classmethod
    def from_bytes(cls, data: bytes,
                   expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> ProducerState:
        obj = msgpack.unpackb(data)
        if not isinstance(obj, dict) or obj.get("v") != SNAPSHOT_VERSION:
            raise ValueError("unknown producer-state snapshot version")
        return cls.from_dict(obj, expiration_ms)


def _entry_fields(e: ProducerEntry) -> list:
    return [e.producer_id, e.epoch, e.txn_first_offset, e.decision_id, e.transactional_id,
            e.last_timestamp, [[b.first_seq, b.last_seq, b.base_offset, b.record_count]
                               for b in e.batches]]


def _entry_from(item: Any, end: int) -> ProducerEntry:
    """One entry of a snapshot's msgpack fields, checked (ValueError)."""
    if not isinstance(item, list) or len(item) != 7:
        raise ValueError("a producer entry must have 7 fields")
    pid, epoch, txn_first, decision, txn_id, last_ts, batches = item
    pid, epoch, txn_first, last_ts = (_int(v, "producer field")
                                      for v in (pid, epoch, txn_first, last_ts))
    if not isinstance(decision, str) or not isinstance(txn_id, str) or \
            not isinstance(batches, list) or len(batches) > NUM_BATCHES_TO_RETAIN:
        raise ValueError(f"malformed entry of producer {pid}")
    if pid < 0 or txn_first >= end:
        raise ValueError(f"inconsistent entry of producer {pid}")
    metas = []
    for b in batches:
        if not isinstance(b, list) or len(b) != 4:
            raise ValueError(f"malformed batch of producer {pid}")
        meta = BatchMetadata(*(_int(v, "batch field") for v in b))
        if not 0 <= meta.base_offset < end or meta.record_count < 1:
            raise ValueError(f"batch of producer {pid} outside the prefix")
        metas.append(meta)
    return ProducerEntry(pid, epoch, metas, txn_first, decision, txn_id, last_ts)


BASE_FIELDS = ("segment", "at", "length", "crc", "count", "max_pid", "end")


def _base_from(described: Any, end: int, base: BaseLoader | None) -> _Base:
    """The base section a delta's ``base`` field names (format.md 3.2), checked, unread."""
    if not isinstance(described, dict) or set(described) != set(BASE_FIELDS):
        raise ValueError(f"base must be a map of {', '.join(BASE_FIELDS)}")
    fields = {k: _int(described[k], f"base {k}") for k in BASE_FIELDS}
    if min(fields["segment"], fields["at"], fields["length"], fields["count"]) < 0 or \
            not fields["segment"] < fields["end"] <= end:
        raise ValueError("base names no section before the snapshot's end")
    if base is None:
        raise ValueError("a delta snapshot, but nothing to read its base with")
    max_pid = fields["max_pid"] if fields["max_pid"] >= 0 or not fields["count"] else _NEVER
    return _Base(base(fields), fields["count"], max_pid, fields["end"], fields)


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{what} must be an integer, not {type(value).__name__}")
    return value
