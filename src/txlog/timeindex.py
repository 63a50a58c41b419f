"""Offset lookup by timestamp (Kafka's ListOffsets with a timestamp).

There is no separate time index yet: batch headers carry their max timestamp,
so the lookup reads headers until the first batch that reaches the target and
then searches inside that one batch.
"""

from __future__ import annotations

import numpy as np

from .partition import READ_COMMITTED, READ_UNCOMMITTED, PartitionLog


def offset_for_time(part: PartitionLog, timestamp_ms: int,
                    isolation_level: str = READ_COMMITTED) -> tuple[int, int] | None:
    """Earliest (offset, timestamp) with timestamp >= ``timestamp_ms`` below the read limit."""
    state = part.state()
    limit = part.last_stable_offset(state) if isolation_level == READ_COMMITTED \
        else state.end_offset
    for base in part.base_offsets(state):
        if base >= limit:
            break
        header = part.header(base)
        if header.is_control or header.max_timestamp < timestamp_ms:
            continue
        table, _ = part.read(base, min(header.next_offset, limit), READ_UNCOMMITTED)
        if table.num_rows == 0:
            continue
        micros = table.column("timestamp").cast("int64").to_numpy()
        hits = np.flatnonzero(micros >= timestamp_ms * 1000)
        if len(hits):
            i = int(hits[0])
            return int(table.column("offset")[i].as_py()), int(micros[i] // 1000)
    return None
