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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

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


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class ProducerState:
    """State after the prefix ``[0, end_offset)`` of one partition."""

    def __init__(self, end_offset: int = 0,
                 expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.end_offset = end_offset
        self.producers: dict[int, ProducerEntry] = {}
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
        pid, epoch, seq = header.producer_id, header.producer_epoch, header.base_sequence
        entry = self.producers.get(pid)
        if entry is None:
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
            return None
        duplicate = entry.find_duplicate(header)
        if duplicate is not None:
            return duplicate
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
            entry = self.producers.get(pid)
            if entry is None:
                entry = self.producers[pid] = ProducerEntry(pid, header.producer_epoch)
            if header.producer_epoch > entry.epoch:
                entry.epoch = header.producer_epoch
                entry.batches = []
            entry.last_timestamp = header.max_timestamp
            # Batches written before headers carried the append time count by their
            # largest timestamp (format.md 2.1); the clock never runs backwards.
            self.clock = max(self.clock, header.append_time if header.append_time >= 0
                             else header.max_timestamp)
            entry.last_append = self.clock
            if header.is_control:
                assert control is not None
                if control.type == ABORT and entry.in_transaction:
                    self.aborted.append(
                        AbortedTransaction(pid, entry.txn_first_offset, header.base_offset))
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
            if not entry.in_transaction:
                self._next_expiry = min(self._next_expiry,
                                        entry.last_append + self.expiration_ms)
        elif header.append_time >= 0:
            self.clock = max(self.clock, header.append_time)
        self.end_offset = header.next_offset
        if self.clock >= self._next_expiry:
            self._expire()

    def _expire(self) -> None:
        """Drop entries idle for the expiration or longer (Kafka's removeExpiredProducers).

        An entry with an open transaction stays, as in Kafka: the transaction
        still needs its marker, and the LSO its first offset.
        """
        cutoff = self.clock - self.expiration_ms
        due = _NEVER
        for pid in [pid for pid, e in self.producers.items()
                    if not e.in_transaction and e.last_append <= cutoff]:
            del self.producers[pid]
        for e in self.producers.values():
            if not e.in_transaction:
                due = min(due, e.last_append + self.expiration_ms)
        self._next_expiry = due

    # --- derived views --------------------------------------------------------

    def open_transactions(self) -> list[OpenTransaction]:
        return sorted(
            (OpenTransaction(e.producer_id, e.epoch, e.txn_first_offset, e.decision_id,
                             e.transactional_id)
             for e in self.producers.values() if e.in_transaction),
            key=lambda t: t.first_offset)

    # --- snapshots ------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The state as msgpack-ready fields (the body of a snapshot, format.md section 3)."""
        producers = [
            [e.producer_id, e.epoch, e.txn_first_offset, e.decision_id, e.transactional_id,
             e.last_timestamp, [[b.first_seq, b.last_seq, b.base_offset, b.record_count]
                                for b in e.batches]]
            for _, e in sorted(self.producers.items())]
        aborted = [[a.producer_id, a.first_offset, a.last_offset] for a in self.aborted]
        # The expiry clock and each entry's last append time travel beside the
        # entries, so snapshots of older code (without them) still parse.
        appended = [[e.producer_id, e.last_append] for _, e in sorted(self.producers.items())]
        return {"end": self.end_offset, "producers": producers, "aborted": aborted,
                "aborted_from": self.aborted_from, "clock": self.clock, "appended": appended}

    @classmethod
    def from_dict(cls, obj: Any,
                  expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> ProducerState:
        """Rebuild a state, refusing (ValueError) anything that is not one.

        Snapshots are only a cache and may be damaged in ways a checksum
        does not catch (a valid checksum over garbage): every field is
        checked for type and range, so garbage is rejected, not trusted.
        """
        if not isinstance(obj, dict):
            raise ValueError("producer state is not a map")
        end = _int(obj.get("end"), "end")
        if end < 0:
            raise ValueError("negative end offset")
        state = cls(end, expiration_ms)
        producers, aborted = obj.get("producers"), obj.get("aborted")
        if not isinstance(producers, list) or not isinstance(aborted, list):
            raise ValueError("producers and aborted must be arrays")
        for item in producers:
            if not isinstance(item, list) or len(item) != 7:
                raise ValueError("a producer entry must have 7 fields")
            pid, epoch, txn_first, decision, txn_id, last_ts, batches = item
            pid, epoch, txn_first, last_ts = (_int(v, "producer field")
                                              for v in (pid, epoch, txn_first, last_ts))
            if not isinstance(decision, str) or not isinstance(txn_id, str) or \
                    not isinstance(batches, list) or len(batches) > NUM_BATCHES_TO_RETAIN:
                raise ValueError(f"malformed entry of producer {pid}")
            if pid in state.producers or pid < 0 or txn_first >= end:
                raise ValueError(f"inconsistent entry of producer {pid}")
            metas = []
            for b in batches:
                if not isinstance(b, list) or len(b) != 4:
                    raise ValueError(f"malformed batch of producer {pid}")
                meta = BatchMetadata(*(_int(v, "batch field") for v in b))
                if not 0 <= meta.base_offset < end or meta.record_count < 1:
                    raise ValueError(f"batch of producer {pid} outside the prefix")
                metas.append(meta)
            state.producers[pid] = ProducerEntry(pid, epoch, metas, txn_first, decision, txn_id,
                                                 last_ts)
        state.aborted_from = _int(obj.get("aborted_from", 0), "aborted_from")
        if not 0 <= state.aborted_from <= end:
            raise ValueError("aborted_from outside the prefix")
        for item in aborted:
            if not isinstance(item, list) or len(item) != 3:
                raise ValueError("malformed aborted transaction")
            txn = AbortedTransaction(*(_int(v, "aborted field") for v in item))
            if not 0 <= txn.first_offset <= txn.last_offset < end:
                raise ValueError("aborted transaction outside the prefix")
            state.aborted.append(txn)
        state._load_expiry(obj)
        return state

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


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{what} must be an integer, not {type(value).__name__}")
    return value
