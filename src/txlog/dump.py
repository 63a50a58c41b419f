"""What ``txlog dump`` shows of batch objects: Kafka's kafka-dump-log for txlog.

A dump must work on a damaged log, where the normal read path refuses: it
lists a partition's batch objects by name (not through the producer state,
which a broken chain stops) and decodes each one on its own, reporting a
failed check as a problem of that object instead of raising.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from .batch import (COMMIT, BatchHeader, ControlRecord, decode_control, decode_header,
                    decode_records, payload_of)
from .errors import CorruptBatchError
from .log import Log
from .state_manager import BATCH_SUFFIX, offset_name
from .storage import Storage


@dataclass(frozen=True)
class BatchDump:
    path: str
    size: int
    header: BatchHeader | None  # None when the header itself is unreadable
    control: ControlRecord | None = None  # the marker of a control batch
    problem: str | None = None  # the first failed check; None: every checksum is valid
    records: pa.Table | None = None

    @property
    def marker(self) -> str | None:
        if self.control is None:
            return None
        return "COMMIT" if self.control.type == COMMIT else "ABORT"

    def as_dict(self) -> dict[str, object]:
        """The batch as a JSON-ready map (header fields under Kafka's names)."""
        out: dict[str, object] = {"path": self.path, "size": self.size,
                                  "valid": self.problem is None}
        if self.problem is not None:
            out["problem"] = self.problem
        h = self.header
        if h is not None:
            out.update({
                "baseOffset": h.base_offset, "lastOffset": h.last_offset,
                "count": h.record_count, "producerId": h.producer_id,
                "producerEpoch": h.producer_epoch, "baseSequence": h.base_sequence,
                "lastSequence": h.last_sequence, "isTransactional": h.is_transactional,
                "isControl": h.is_control, "marker": self.marker,
                "timestampType": "LogAppendTime" if h.timestamp_type else "CreateTime",
                "baseTimestamp": h.base_timestamp, "maxTimestamp": h.max_timestamp,
                "compression": h.compression or "none", "transactionalId": h.transactional_id,
                "decisionId": h.decision_id, "payloadCrc": h.payload_crc})
        return out


def dump_object(storage: Storage, path: str, expected_offset: int | None = None,
                with_records: bool = False) -> BatchDump:
    """Decode one batch object, checking both checksums (and the records with ``with_records``)."""
    data = storage.read(path)
    url = f"{storage.url.rstrip('/')}/{path}"
    try:
        header = decode_header(data, url, expected_offset)
    except CorruptBatchError as exc:
        return BatchDump(path, len(data), None, problem=exc.reason)
    try:
        payload = payload_of(data, header, url)
        if header.is_control:
            return BatchDump(path, len(data), header, decode_control(payload, header, url))
        records = decode_records(payload, header, url) if with_records else None
    except CorruptBatchError as exc:
        return BatchDump(path, len(data), header, problem=exc.reason)
    return BatchDump(path, len(data), header, records=records)


def dump_partition(log: Log, topic: str, partition: int, start: int = 0,
                   max_batches: int | None = None, with_records: bool = False
                   ) -> Iterator[BatchDump]:
    """Every batch object of a partition from the one holding ``start``, in offset order."""
    log.describe_topic(topic)  # a clear error for an unknown topic
    directory = f"topics/{topic}/{partition}"
    bases = sorted(int(n[:-len(BATCH_SUFFIX)]) for n in log.storage.list(directory)
                   if n.endswith(BATCH_SUFFIX) and n[:-len(BATCH_SUFFIX)].isdigit())
    first = max((b for b in bases if b <= start), default=start)  # the batch holding start
    shown = 0
    for base in bases:
        if base < first:
            continue
        if max_batches is not None and shown >= max_batches:
            return
        name = f"{directory}/{offset_name(base, BATCH_SUFFIX)}"
        yield dump_object(log.storage, name, base, with_records)
        shown += 1
