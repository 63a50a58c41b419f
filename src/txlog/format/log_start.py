"""The record of a log start offset moved by DeleteRecords (docs/format.md, section 4.8).

Its name carries the offset, and the name is all a reader needs: the largest
offset named is the recorded log start.  The msgpack body says which topic
incarnation it was written for and when, for ``txlog verify`` and for people.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

LOG_START_VERSION = 1


@dataclass(frozen=True, slots=True)
class LogStartRecord:
    """One recorded move of a partition's log start."""

    offset: int
    topic_id: str
    time_ms: int


def encode_log_start(record: LogStartRecord) -> bytes:
    return msgpack.packb({"v": LOG_START_VERSION, "offset": record.offset,
                          "topic_id": record.topic_id, "time_ms": record.time_ms})


def decode_log_start(data: bytes, url: str) -> LogStartRecord:
    """The record's fields; ValueError naming the object when they are not a version 1 record."""
    try:
        raw = msgpack.unpackb(data)
        if raw.get("v") != LOG_START_VERSION:
            raise ValueError(f"version {raw.get('v')!r}, not {LOG_START_VERSION}")
        record = LogStartRecord(raw["offset"], raw["topic_id"], raw["time_ms"])
        if not (isinstance(record.offset, int) and isinstance(record.topic_id, str)
                and isinstance(record.time_ms, int)):
            raise ValueError("a field has the wrong type")
        return record
    except Exception as exc:  # msgpack raises several unrelated types
        raise ValueError(f"{url}: not a log start record ({exc})") from None
