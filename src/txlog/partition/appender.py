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
from collections.abc import Callable
from dataclasses import dataclass, replace

import crc32c

from .. import clock
from ..format.batch import (ABORT, COMMIT, CONTROL_BIT, LOG_APPEND_TIME, TIMESTAMP_TYPE_BIT,
                            TRANSACTIONAL_BIT, BatchHeader, ControlRecord, encode_control,
                            encode_header)
from ..errors import StorageError
from .producer_state import ProducerState
from .state_manager import ANCHOR_BYTES, StateManager

logger = logging.getLogger(__name__)

PUBLISH_ATTEMPTS = 5  # tries of one slot when the storage fails ambiguously


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    duplicate: bool = False
    log_append_time: int = -1  # the batch's timestamp on a LogAppendTime topic, else -1


@dataclass(frozen=True, slots=True)
class _Slot:
    header: BatchHeader
    data: bytes
    control: ControlRecord | None = None


class Appender:
    """Writes data batches and markers at the log end of the partition ``states`` caches."""

    def __init__(self, states: StateManager,
                 verify: Callable[[BatchHeader], bool] | None = None) -> None:
        self._states = states
        # Whether the coordinator knows a transactional batch's transaction as open
        # (producer_state.check_append asks it for producers this partition does not know).
        self._verify = verify

    def _claim(self, prepare: Callable[[ProducerState], "_Slot | AppendResult | None"]
               ) -> "AppendResult | None":
        """The slot-claiming loop shared by data batches and markers.

        ``prepare`` sees the state at the log end and returns either a final
        answer (a duplicate, a marker already present) or the bytes to publish
        at that end.  Losing the slot, or a storage error after which the
        object may or may not exist, both mean: reload and prepare again.
        """
        states = self._states
        failures = 0
        with states.lock:
            while True:
                state = states.state()
                step = prepare(state)
                if not isinstance(step, _Slot):
                    return step
                slot = state.end_offset
                try:
                    published = states.storage.publish_if_absent(states.cache.batch_path(slot),
                                                                 step.data)
                except OSError as exc:
                    failures += 1
                    if failures >= PUBLISH_ATTEMPTS:
                        raise StorageError(
                            f"publishing a batch at offset {slot} of {states.topic}-"
                            f"{states.partition} failed {failures} times: {exc}") from exc
                    logger.info("%s-%d: publishing a batch at offset %d failed (%s); reloading "
                                "and trying again", states.topic, states.partition, slot, exc)
                    continue
                if not published:
                    continue
                # The prefix's last object still being there proves the slot was
                # the log end (compaction deletes in offset order, after its
                # segment is published).  Else a compaction ran meanwhile: the
                # batch counts only if the log, reloaded, holds it at the slot.
                if states.still_current():
                    states.applied(step.header, step.control, step.data)
                elif not states.holds(slot, step.data[:ANCHOR_BYTES]):
                    logger.info("%s-%d: offset %d was compacted away while this batch was "
                                "published there; writing it again at the log end",
                                states.topic, states.partition, slot)
                    continue
                appended_at = step.header.max_timestamp \
                    if step.header.timestamp_type == LOG_APPEND_TIME else -1
                return AppendResult(slot, step.header.last_offset, log_append_time=appended_at)

    def append(self, header: BatchHeader, payload: bytes,
               log_append_time: bool = False) -> AppendResult:
        """Append a data batch at the log end; the header's base offset is ignored.

        A batch that duplicates one of its producer's last five is not written;
        the original's offsets are returned.
        """
        header = replace(header, payload_length=len(payload), payload_crc=crc32c.crc32c(payload))

        def prepare(state: ProducerState) -> _Slot | AppendResult:
            duplicate = state.check_append(header, self._verify)
            if duplicate is not None:
                return AppendResult(duplicate.base_offset, duplicate.last_offset, True)
            now = clock.now_ms()  # the append time producer expiry counts from
            placed = replace(header, base_offset=state.end_offset, append_time=now)
            if log_append_time:
                placed = replace(placed, attributes=placed.attributes | TIMESTAMP_TYPE_BIT,
                                 max_timestamp=now)
            return _Slot(placed, encode_header(placed) + payload)

        result = self._claim(prepare)
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
            return _Slot(header, encode_header(header) + payload, control)

        result = self._claim(prepare)
        return None if result is None else result.base_offset
