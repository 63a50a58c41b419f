"""Appends to one partition by slot claiming.

Batch k lives at ``<base offset, 20 digits>.batch`` and the next batch's base
offset is ``base + record_count``.  A writer validates its batch against the
producer state of exactly the prefix before the slot it claims, then publishes
if absent; a writer that loses the slot reloads (the winner is now part of the
prefix), validates again and retries.  Offsets are therefore unique and
contiguous no matter how many processes append at once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import crc32c

from .. import clock
from ..format.batch import (ABORT, CLAIM_BIT, COMMIT, CONTROL_BIT, LOG_APPEND_TIME,
                            MAX_CLAIM_PARTS, NO_SEQUENCE, PARTS_BIT, TIMESTAMP_TYPE_BIT,
                            TRANSACTIONAL_BIT, BatchHeader, ControlRecord, encode_control,
                            Payload, encode_data_object, encode_header)
from ..errors import StorageError, TxlogError
from ..storage.contract import Storage
from ..storage.fresh_reads import publishing
from ..storage.paths import data_object_path
from .producer_state import ProducerState
from .state_manager import ANCHOR_BYTES, SnapshotGone, StateManager

if TYPE_CHECKING:  # the anchor is StateManager's to make and check; _claim only carries it
    from .state_manager import _Anchor

logger = logging.getLogger(__name__)

PUBLISH_ATTEMPTS = 5  # tries of one slot when the storage fails ambiguously
# L of docs/protocol.md, section 8: a claim is never published pointing into a
# data object whose write began longer ago than this (the payload is written
# again into a fresh object instead), so gc may delete an unreferenced data
# object once it is older than L plus a margin for clocks (gc.DEFAULT_DATA_AGE_S).
CLAIM_WINDOW_S = 600.0


class DataReference:
    """Where a batch's payload is: a data object and a position in it, and when the
    object's write began (monotonic).  Shared by the batches of one flush."""

    def __init__(self, path: str, offset: int, started: float) -> None:
        self.path = path
        self.offset = offset
        self.started = started

    def current(self, storage: Storage, payload: Payload | list[Payload]) -> tuple[str, int]:
        """The reference a claim may carry now: past the claim window, the payload (a
        multi-batch claim's parts, back to back) goes into a fresh data object of its own
        first (one more PUT, rare)."""
        if time.monotonic() - self.started > CLAIM_WINDOW_S:
            parts = payload if isinstance(payload, list) else [payload]
            self.path, self.offset, self.started = write_data_object(
                storage, [b"".join(parts)])[0]
        return self.path, self.offset


def write_data_object(storage: Storage, payloads: list[Payload]
                      ) -> list[tuple[str, int, float]]:
    """One data object holding ``payloads``: (path, offset, start time) of each.

    Durable before it returns (publish fsyncs on local disk; an object store's
    PUT is durable when acknowledged), so no claim can point at bytes that a
    crash could lose.
    """
    started = time.monotonic()
    pieces, size, offsets = encode_data_object(payloads)
    path = data_object_path(uuid.uuid4().hex)
    # One part as large as the object: one PUT on an object store, while local disk
    # writes the pieces one after another without joining them first.  The name is
    # random (128 bits), so it is never taken.
    if not storage.publish_stream_if_absent(path, pieces, size, part_bytes=size):
        raise StorageError(f"data object {path} exists already")
    return [(path, offset, started) for offset in offsets]


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    duplicate: bool = False
    log_append_time: int = -1  # the batch's timestamp on a LogAppendTime topic, else -1


def combined_header(headers: list[BatchHeader], payloads: list[Payload]) -> BatchHeader:
    """The one claim header of consecutive batches of one producer (format.md, 2.7.1):
    counts and payloads summed, timestamps spanned, the first sequence, and a parts table.

    Refuses batches that one claim cannot stand for: of different producers,
    epochs, transactions or attributes, or whose sequences do not follow each
    other (the dedup window would then describe records that were never sent).
    """
    first = headers[0]
    if len(headers) > MAX_CLAIM_PARTS:
        raise ValueError(f"a claim holds at most {MAX_CLAIM_PARTS} batches, not {len(headers)}")
    sequence = first.base_sequence
    for h in headers:
        if (h.producer_id, h.producer_epoch, h.attributes, h.decision_id, h.transactional_id) \
                != (first.producer_id, first.producer_epoch, first.attributes,
                    first.decision_id, first.transactional_id):
            raise ValueError("the batches of one claim must share producer, epoch, "
                             "transaction and attributes")
        if h.base_sequence != sequence:
            raise ValueError(f"the batches of one claim must have consecutive sequences: "
                             f"{h.base_sequence} follows {sequence}")
        if sequence != NO_SEQUENCE:
            sequence = (sequence + h.record_count) & 0x7FFFFFFF
    crc = 0
    for p in payloads:
        crc = crc32c.crc32c(p, crc)
    return replace(first, record_count=sum(h.record_count for h in headers),
                   attributes=first.attributes | CLAIM_BIT | PARTS_BIT,
                   base_timestamp=min(h.base_timestamp for h in headers),
                   max_timestamp=max(h.max_timestamp for h in headers),
                   payload_length=sum(len(p) for p in payloads), payload_crc=crc,
                   parts=tuple((h.record_count, len(p))
                               for h, p in zip(headers, payloads, strict=True)))


def split_result(result: AppendResult, counts: list[int]) -> list[AppendResult]:
    """Each part's offsets within a multi-batch claim's (or the duplicate's) range."""
    out, base = [], result.base_offset
    for n in counts:
        out.append(AppendResult(base, base + n - 1, result.duplicate, result.log_append_time))
        base += n
    if base - 1 != result.last_offset:
        raise AssertionError(f"parts of {sum(counts)} records, claim of "
                             f"{result.last_offset - result.base_offset + 1}")
    return out


@dataclass(frozen=True, slots=True)
class _Slot:
    header: BatchHeader
    data: bytes
    control: ControlRecord | None = None


def _slot(header: BatchHeader, payload: Payload = b"", control: ControlRecord | None = None
          ) -> _Slot:
    """The bytes to publish, and the header as they hold it: its length counts what the
    encoding added (a claim's reference, the append time), since the cached header is
    what readers of this process locate payloads with."""
    encoded = encode_header(header)
    return _Slot(replace(header, header_length=len(encoded)), encoded + payload, control)


class Appender:
    """Writes data batches and markers at the log end of the partition ``states`` caches."""

    def __init__(self, states: StateManager,
                 verify: Callable[[BatchHeader], bool] | None = None) -> None:
        self._states = states
        # Whether the coordinator knows a transactional batch's transaction as open
        # (producer_state.check_append asks it for producers this partition does not know).
        self._verify = verify

    def _claim(self, prepare: Callable[[ProducerState], _Slot | AppendResult | None],
               continuing: bool = False) -> AppendResult | None:
        """The slot-claiming loop shared by data batches, claims and markers.

        ``prepare`` sees the state at the log end and returns either a final
        answer (a duplicate, a marker already present) or the bytes to publish
        at that end.  Losing the slot, or a storage error after which the
        object may or may not exist, both mean: reload and prepare again.

        With ``continuing`` (the caller's previous append to this partition
        has just returned: the next batch of one flush), the first try goes
        by the cached state without reading storage: a publish that succeeds
        proves the slot was free, and the anchor check after it proves the
        prefix it was validated against is the log's.  A final answer or a
        refusal from the cached state proves nothing (the topic may have been
        re-created under it), so it is asked again of a refreshed state.
        """
        states = self._states
        failures = 0
        first = True
        with states.lock:
            while True:
                state, proof = self._try_state(first, continuing)
                guessed, first = first, False
                try:
                    step = prepare(state)
                    if isinstance(step, _Slot):
                        # What applying the batch will read is read before it is published
                        # (an expiry): afterwards a read could fail with the batch in the log.
                        # A producer id above every id of a section never reads it.
                        state.ready(step.header)
                except TxlogError:
                    if guessed:
                        continue
                    raise
                except SnapshotGone:  # the state's unread producer entries went away
                    states.reload()
                    continue
                if not isinstance(step, _Slot):
                    if guessed:
                        continue
                    return step
                slot = state.end_offset
                try:
                    with publishing():  # a read after its flush's publishes waits (1.8)
                        published = states.storage.publish_if_absent(
                            states.cache.batch_path(slot), step.data)
                except OSError as exc:
                    failures += 1
                    self._publish_failed(slot, failures, exc)
                    continue
                if published:
                    # The prefix's last object still being there proves the slot was
                    # the log end (compaction deletes in offset order, after its
                    # segment is published).
                    result = self._settled(slot, step, states.proven_by(proof))
                    if result is not None:
                        return result

    def _try_state(self, first: bool, continuing: bool) -> tuple[ProducerState, _Anchor | None]:
        """The state one try of _claim prepares against, and ``proof``: the anchor the
        check after the publish must find.  Apart from the loop because it is where the
        tries differ (docs/protocol.md 1.6): a refreshed or believed state's proof is its
        own; for a first try that read past the cached end unchecked, the one the state
        had before that read (state_proven_after).  Tries after a lost slot, an error or
        an unproven answer refresh first.
        """
        states = self._states
        if not first:
            return states.state(), states.anchor
        if continuing:
            return states.believed_state(), states.anchor
        return states.state_proven_after()

    def _publish_failed(self, slot: int, failures: int, exc: OSError) -> None:
        """After a publish that failed ambiguously (the object may or may not exist): give
        up once it failed PUBLISH_ATTEMPTS times, else log and let _claim reload and
        try again, which finds out which it was."""
        states = self._states
        if failures >= PUBLISH_ATTEMPTS:
            raise StorageError(
                f"publishing a batch at offset {slot} of {states.topic}-"
                f"{states.partition} failed {failures} times: {exc}") from exc
        logger.info("%s-%d: publishing a batch at offset %d failed (%s); reloading "
                    "and trying again", states.topic, states.partition, slot, exc)

    def _settled(self, slot: int, step: _Slot, proven: bool) -> AppendResult | None:
        """The result of a batch that won ``slot``, or None if it must be written again.

        Winning the slot is not enough when ``proven`` is false: a compaction
        ran meanwhile, so the batch counts only if the log, reloaded, holds it
        at the slot (else its object is a stray past a compacted-away end).
        """
        states = self._states
        if proven:
            states.applied(step.header, step.control, step.data)
        elif not states.holds(slot, step.data[:ANCHOR_BYTES]):
            logger.info("%s-%d: offset %d was compacted away while this batch was "
                        "published there; writing it again at the log end",
                        states.topic, states.partition, slot)
            return None
        states.maybe_snapshot()
        appended_at = step.header.max_timestamp \
            if step.header.timestamp_type == LOG_APPEND_TIME else -1
        return AppendResult(slot, step.header.last_offset, log_append_time=appended_at)

    def _place(self, state: ProducerState, header: BatchHeader,
               log_append_time: bool) -> BatchHeader | AppendResult:
        """The header placed at the state's end (a duplicate's original offsets instead),
        stamped with the append time producer expiry counts from."""
        duplicate = state.check_append(header, self._verify)
        if duplicate is not None:
            return AppendResult(duplicate.base_offset, duplicate.last_offset, True)
        now = clock.now_ms()
        placed = replace(header, base_offset=state.end_offset, append_time=now)
        if log_append_time:
            placed = replace(placed, attributes=placed.attributes | TIMESTAMP_TYPE_BIT,
                             max_timestamp=now)
        return placed

    def append(self, header: BatchHeader, payload: Payload,
               log_append_time: bool = False, continuing: bool = False) -> AppendResult:
        """Append a data batch at the log end; the header's base offset is ignored.

        A batch that duplicates one of its producer's last five is not written;
        the original's offsets are returned.
        """
        header = replace(header, payload_length=len(payload), payload_crc=crc32c.crc32c(payload))

        def prepare(state: ProducerState) -> _Slot | AppendResult:
            placed = self._place(state, header, log_append_time)
            if isinstance(placed, AppendResult):
                return placed
            return _slot(placed, payload)

        result = self._claim(prepare, continuing)
        assert result is not None
        return result

    def append_claim(self, header: BatchHeader, payload: Payload, reference: DataReference,
                     log_append_time: bool = False, continuing: bool = False) -> AppendResult:
        """Append a data batch whose payload is already in a data object: only the small
        claim (header and reference) is published here, and retried if the slot is lost.

        ``payload`` is the batch's payload as written into the data object; it
        is checksummed into the header, and written again only if the claim
        window of the data object has passed (DataReference.current).
        """
        header = replace(header, attributes=header.attributes | CLAIM_BIT,
                         payload_length=len(payload), payload_crc=crc32c.crc32c(payload))
        return self._append_referenced(header, payload, reference, log_append_time, continuing)

    def append_claims(self, headers: list[BatchHeader], payloads: list[Payload],
                      reference: DataReference, log_append_time: bool = False,
                      continuing: bool = False) -> list[AppendResult]:
        """Append consecutive batches of one producer, whose payloads lie back to back in
        one data object from ``reference``, with one claim (docs/protocol.md, 1.1).

        The claim is one batch of the log: one slot, one header whose record
        count and sequence range span every part, one entry in the producer's
        dedup window; so a retried claim is recognised as a duplicate whole, and
        a lost slot costs one small claim again.  Returns each part's offsets.
        """
        if len(headers) != len(payloads) or not headers:
            raise ValueError("append_claims needs one payload per header")
        if len(headers) == 1:
            return [self.append_claim(headers[0], payloads[0], reference, log_append_time,
                                      continuing)]
        result = self._append_referenced(combined_header(headers, payloads), payloads,
                                         reference, log_append_time, continuing)
        return split_result(result, [h.record_count for h in headers])

    def _append_referenced(self, header: BatchHeader, payload: Payload | list[Payload],
                           reference: DataReference, log_append_time: bool,
                           continuing: bool) -> AppendResult:
        """Claim the next slot for ``header``, whose payload (one, or parts back to back)
        lies in the data object ``reference`` names (rewritten there if its claim window
        passed: DataReference.current)."""
        storage = self._states.storage

        def prepare(state: ProducerState) -> _Slot | AppendResult:
            placed = self._place(state, header, log_append_time)
            if isinstance(placed, AppendResult):
                return placed
            path, offset = reference.current(storage, payload)
            return _slot(replace(placed, data_path=path, data_offset=offset))

        result = self._claim(prepare, continuing)
        assert result is not None
        return result

    def append_marker(self, producer_id: int, marker_epoch: int, commit: bool,
                      coordinator_epoch: int = 0, decision_id: str = "",
                      transactional_id: str = "") -> int | None:
        """Write a COMMIT/ABORT marker unless this partition already has it.

        Returns the marker's offset, or None when it was already there.
        """
        def prepare(state: ProducerState) -> _Slot | None:
            if not state.marker_needed(producer_id, marker_epoch):
                return None
            entry = state.producers.get(producer_id)
            control = ControlRecord(COMMIT if commit else ABORT, coordinator_epoch,
                                    entry.txn_first_offset if entry is not None else -1)
            payload = encode_control(control)
            now = clock.now_ms()
            header = BatchHeader(
                base_offset=state.end_offset, record_count=1,
                attributes=CONTROL_BIT | TRANSACTIONAL_BIT, base_timestamp=now,
                max_timestamp=now, producer_id=producer_id, producer_epoch=marker_epoch,
                decision_id=decision_id, transactional_id=transactional_id,
                payload_length=len(payload), payload_crc=crc32c.crc32c(payload),
                append_time=now)
            return _slot(header, payload, control)

        result = self._claim(prepare)
        return None if result is None else result.base_offset
