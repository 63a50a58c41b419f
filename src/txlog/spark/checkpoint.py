"""What a txlog sink reads from the query's checkpoint: its query id, a micro-batch's source offsets.

Spark writes ``<checkpointLocation>/metadata`` when a query first starts,
``{"id": "<uuid>"}``: the query's identity across restarts (a fresh one
after the checkpoint is deleted).  The sink records it as the owner of its
``transactional.id.prefix`` (txlog.exactly_once.stream_sink).

Spark writes ``<checkpointLocation>/offsets/<batch id>`` before it runs the
batch: a version line (``v1``), a line of batch metadata, then one line per
source with that source's end offset as JSON (``-`` for a source without
one).  The txlog source's offsets are ``{"topic": {"partition": offset}}``,
the shape Spark's Kafka source uses too, so the lines of that shape are the
positions the batch read up to: what a consumer group of the query should
show once the batch is committed.
"""

from __future__ import annotations

import json

import fsspec

from ..errors import InvalidConfigError
from ..integers import is_int

TopicPartition = tuple[str, int]


def query_id(checkpoint: str) -> str:
    """The query id Spark keeps in the checkpoint's metadata file."""
    path = f"{checkpoint.rstrip('/')}/metadata"
    try:
        with fsspec.open(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise InvalidConfigError(
            f"option checkpointLocation: {path} does not exist; the txlog sink reads the "
            "query's id there (Spark writes it when the query starts): is checkpointLocation "
            "the query's own?") from None
    try:
        found = json.loads(text.splitlines()[0])["id"]
    except (IndexError, ValueError, KeyError, TypeError):
        found = None
    if not isinstance(found, str) or not found:
        raise InvalidConfigError(f"{path} is not a Spark query metadata file (no query id)")
    return found


def source_offsets(checkpoint: str, batch_id: int) -> dict[TopicPartition, int]:
    """End offsets of every Kafka-shaped source of micro-batch ``batch_id``."""
    path = f"{checkpoint.rstrip('/')}/offsets/{batch_id}"
    try:
        with fsspec.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise InvalidConfigError(
            f"option groupId: the query's offset log has no entry for micro-batch {batch_id} "
            f"({path}); is checkpointLocation the query's own?") from None
    if not lines or not lines[0].startswith("v"):
        raise InvalidConfigError(f"{path} is not a Spark offset log entry (no version line)")
    offsets: dict[TopicPartition, int] = {}
    for line in lines[2:]:
        offsets.update(_kafka_shaped(line))
    return offsets


def _kafka_shaped(line: str) -> dict[TopicPartition, int]:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    out = {}
    for topic, parts in value.items():
        if not isinstance(parts, dict):
            return {}
        for partition, offset in parts.items():
            if not (isinstance(partition, str) and partition.isdigit() and is_int(offset)
                    and offset >= 0):
                return {}
            out[(topic, int(partition))] = offset
    return out
