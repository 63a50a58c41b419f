"""Topic ids: every incarnation of a topic has its own (Kafka's KIP-516).

A topic deleted and re-created under the same name is a different log.
Anything derived from one incarnation (cached producer state, snapshots,
producer sequences, offset ranges planned by a Spark driver) carries the
incarnation's id and is checked against ``topic.json`` before it is applied,
so a process that knew the old topic can never mix it with the new one.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import msgpack

from ..storage.contract import Storage
from ..storage.fresh_reads import fresh_read
from ..storage.paths import topic_meta_path


def new_topic_id() -> str:
    return uuid.uuid4().hex


def topic_id_of(meta: dict[str, Any]) -> str:
    """The topic id recorded in ``topic.json``.

    Topics created before ids existed have none; theirs is derived from the
    name and creation time, so every process computes the same one and a
    re-created topic (a later ``created_ms``) still gets a different one.
    """
    found = meta.get("topic_id")
    if isinstance(found, str) and found:
        return found
    seed = f"txlog-topic/{meta['name']}/{meta['created_ms']}".encode()
    return hashlib.sha256(seed).hexdigest()[:32]


def read_topic_meta(storage: Storage, topic: str,
                    read: Callable[[Storage, str], bytes] = fresh_read
                    ) -> dict[str, Any] | None:
    """``topic.json`` of ``topic``, or None when the topic does not exist; ``read``: how
    it is shared with the partitions checking it at the same moment (fresh_reads.py:
    ``fresh_read``, or within a flush ``recent_read`` before a claim's publish and
    ``read_after_publish`` after it)."""
    try:
        raw = read(storage, topic_meta_path(topic))
    except FileNotFoundError:
        return None
    meta = msgpack.unpackb(raw)
    if not isinstance(meta, dict):
        raise ValueError(f"topic.json of {topic!r} is not a map")
    return meta


def current_topic_id(storage: Storage, topic: str,
                     read: Callable[[Storage, str], bytes] = fresh_read) -> str | None:
    meta = read_topic_meta(storage, topic, read)
    return None if meta is None else topic_id_of(meta)
