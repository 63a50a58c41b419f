"""``Log``: the user's front door to one log root.

A ``Log`` composes a ``Root`` (``services``: storage, the coordinator, producer ids,
topics and partitions) and adds what only a user asks for: producers and consumers,
reads as Spark's Kafka columns, maintenance and group administration.  The layers
below are handed ``log.services``, never the Log, so every import and every call
points down from here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from ..admin import upkeep
from ..admin.gc import (DEFAULT_CHAIN_AGE_S, DEFAULT_DATA_AGE_S, DEFAULT_DECISION_AGE_S,
                        DEFAULT_TEMP_AGE_S, DEFAULT_TXN_ID_EXPIRATION_MS, GcReport,
                        collect)
from ..clients.columns import to_spark_table
from ..clients.consumer import Consumer
from ..clients.positions import offset_for_timestamp
from ..clients.producer import Producer
from ..partition.compaction import DEFAULT_BUFFER_BYTES, DEFAULT_MIN_BATCHES, Compacted
from ..partition.isolation import READ_COMMITTED
from ..partition.partition_log import PartitionLog
from ..partition.retention import Retained
from ..partition.segment_merge import Merged
from ..root.root import Root
from ..root.root_config import RootConfig
from ..root.topics import TopicDescription
from ..storage.contract import Storage
from ..transactions import groups as group_offsets
from ..transactions.coordinator import TransactionCoordinator
from ..transactions.group_members import reset_offsets_if_inactive
from ..transactions.stable_offsets import stable_offsets
from ..transactions.producer_ids import ProducerIdAllocator


class Log:
    """A txlog root: a local directory, ``memory://name``, or an object-store URL.

    Opening a root that does not hold a log yet creates it (``create=False``
    refuses instead).  Every process that opens the same root sees the same
    log; there is no server.
    """

    def __init__(self, root: str | os.PathLike[str] | Storage, *,
                 storage_options: dict[str, Any] | None = None, fsync: bool = True,
                 create: bool = True) -> None:
        self.services = Root(root, storage_options=storage_options, fsync=fsync, create=create)
        # The services users, the CLI and tests reach by their old names; the layers
        # below are handed ``services`` and never use these.
        self.root: str = self.services.url
        self.storage: Storage = self.services.storage
        self.coordinator: TransactionCoordinator = self.services.coordinator
        self.producer_ids: ProducerIdAllocator = self.services.producer_ids

    def __repr__(self) -> str:
        return f"Log({self.root!r})"

    def revalidate(self) -> bool:
        """Prepare a long-lived Log for a new unit of work, as if it were opened afresh
        (``Root.revalidate``); False: the root was created anew, open a new Log."""
        return self.services.revalidate()

    # --- topics and partitions (the Root's) ---------------------------------------------

    def create_topic(self, name: str, partitions: int = 1,
                     config: dict[str, Any] | None = None) -> TopicDescription:
        return self.services.create_topic(name, partitions, config)

    def topics(self) -> list[str]:
        return self.services.topics()

    def describe_topic(self, name: str, refresh: bool = False) -> TopicDescription:
        """The topic's description, cached; ``refresh`` re-reads its partition count."""
        return self.services.describe_topic(name, refresh)

    def adopt_description(self, desc: TopicDescription) -> None:
        """Use ``desc``, read by another process a moment ago, as if this Log had read it."""
        self.services.adopt_description(desc)

    def alter_topic_config(self, name: str, set: dict[str, Any] | None = None,
                           delete: list[str] | tuple[str, ...] = ()) -> TopicDescription:
        """Set or remove (back to Kafka's default) retention and segment settings of a
        topic (kafka-configs --alter); each change is a new version of its config chain."""
        return self.services.alter_topic_config(name, set, delete)

    def describe_root_config(self) -> RootConfig:
        """The root's settings (``auto.create.topics.enable``, ``num.partitions``), as a
        Kafka broker's: Kafka's default where the root sets none."""
        return self.services.root_config(refresh=True)

    def alter_root_config(self, set: dict[str, Any] | None = None,
                          delete: list[str] | tuple[str, ...] = ()) -> RootConfig:
        """Set or remove (back to Kafka's default) the root's settings: whether a topic is
        created on first use, and with how many partitions (docs/clients.md)."""
        return self.services.alter_root_config(set, delete)

    def create_partitions(self, name: str, total: int) -> TopicDescription:
        """Grow topic ``name`` to ``total`` partitions (Kafka's CreatePartitions)."""
        return self.services.create_partitions(name, total)

    def delete_topic(self, name: str) -> None:
        """Remove a topic: its description first, so no new writer starts, then its data."""
        self.services.delete_topic(name)

    def partition(self, topic: str, partition: int,
                  topic_id: str | None = None) -> PartitionLog:
        """The partition's log object (one per Log, caching its producer state)."""
        return self.services.partition(topic, partition, topic_id)

    # --- offsets and reads -----------------------------------------------------------

    def end_offset(self, topic: str, partition: int) -> int:
        """Log end offset: one past the last batch written (committed or not)."""
        return self.services.partition(topic, partition).end_offset()

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """First offset of the earliest undecided transaction, else the log end."""
        return self.services.partition(topic, partition).last_stable_offset()

    def read(self, topic: str, partition: int, start: int = 0, end: int | None = None,
             isolation_level: str = READ_COMMITTED, include_headers: bool = False,
             topic_id: str | None = None) -> pa.Table:
        """Records in ``[start, end)`` as an Arrow table with Spark's Kafka columns.

        Vectorised: batches are memory-mapped and sliced, never looped over per
        record.  ``end`` defaults to, and is capped at, the last stable offset
        (read_committed) or the log end (read_uncommitted).  With ``topic_id``,
        only that incarnation of the topic is read (``InconsistentTopicIdError``
        otherwise).
        """
        part = self.services.partition(topic, partition, topic_id)
        pieces, _ = part.read(start, end, isolation_level)
        return to_spark_table(pieces, topic, partition, include_headers)

    def offsets_for_times(self, topic: str, partition: int, timestamp_ms: int,
                          isolation_level: str = READ_COMMITTED) -> tuple[int, int] | None:
        """Earliest (offset, timestamp) whose timestamp is >= ``timestamp_ms``, or None."""
        return offset_for_timestamp(self.services, topic, partition, timestamp_ms,
                                    isolation_level)

    # --- maintenance (admin/upkeep.py, admin/gc.py) -------------------------------------

    def compact(self, topic: str, partitions: list[int] | None = None,
                min_batches: int = DEFAULT_MIN_BATCHES, upto_lag: int = 0,
                buffer_bytes: int = DEFAULT_BUFFER_BYTES, merge: bool = True
                ) -> dict[int, list[Compacted]]:
        """Merge each partition's batch objects into segments of at most the topic's
        ``segment.bytes``, leaving the newest ``upto_lag`` offsets as batch objects; then,
        with ``merge``, merge runs of adjacent small segments (docs/protocol.md 7.3).

        Each segment is streamed into storage: memory is about ``buffer_bytes`` (an
        object store's upload part, at least 5 MiB on S3) and one batch, not
        ``segment.bytes``."""
        return upkeep.compact(self.services, topic, partitions, min_batches, upto_lag,
                              buffer_bytes, merge)

    def merge_segments(self, topic: str, partitions: list[int] | None = None,
                       buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> dict[int, list[Merged]]:
        """Merge runs of each partition's adjacent small segments into segments of at most
        the topic's ``segment.bytes`` (docs/protocol.md 7.3); ``compact`` does it too."""
        return upkeep.merge_segments(self.services, topic, partitions, buffer_bytes)

    def apply_retention(self, topic: str, partitions: list[int] | None = None,
                        now_ms: int | None = None) -> dict[int, Retained]:
        """Delete the oldest segments the topic's ``retention.ms`` and ``retention.bytes``
        allow, advancing each partition's log start offset."""
        return upkeep.apply_retention(self.services, topic, partitions, now_ms)

    def delete_records(self, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Move each partition's log start up to its offset (-1: its log end), as Kafka's
        DeleteRecords; returns the log starts after (Kafka's low watermarks).

        Every partition and offset is checked before any log start moves, so a
        bad entry changes nothing.  Records below a log start are refused to
        readers at once and deleted later by retention (docs/protocol.md 7.1).
        """
        return upkeep.delete_records(self.services, offsets)

    def gc(self, chain_age_s: float = DEFAULT_CHAIN_AGE_S,
           decision_age_s: float = DEFAULT_DECISION_AGE_S, temp_age_s: float = DEFAULT_TEMP_AGE_S,
           now_ms: int | None = None, data_age_s: float = DEFAULT_DATA_AGE_S,
           txn_id_expiration_ms: int = DEFAULT_TXN_ID_EXPIRATION_MS) -> GcReport:
        """Remove coordinator state, compaction leftovers, temp files and data objects
        nobody needs any more, without changing what anyone reads (admin/gc.py says why
        each removal is safe); expire transactional ids idle longer than
        ``txn_id_expiration_ms``."""
        return collect(self.services, chain_age_s, decision_age_s, temp_age_s, now_ms,
                       data_age_s, txn_id_expiration_ms)

    # --- clients ----------------------------------------------------------------------

    # Quoted although annotations are lazy: the public signatures (tests/compat) record
    # these two return annotations as the quoted strings they have always been.
    def producer(self, **config: Any) -> "Producer":  # noqa: UP037
        return Producer(self, **config)

    def consumer(self, **config: Any) -> "Consumer":  # noqa: UP037
        return Consumer(self, **config)

    # --- transactions and groups (see transactions/) -------------------------------------

    def abort_expired_transactions(self) -> list[str]:
        """Abort every Ongoing transaction past its timeout; returns their ids."""
        return self.services.coordinator.abort_expired()

    def committed(self, group_id: str, partitions: list[tuple[str, int]] | None = None
                  ) -> dict[tuple[str, int], int]:
        """The group's committed offsets (only those of committed transactions)."""
        return stable_offsets(self.services.coordinator, group_id, partitions)

    def groups(self) -> list[str]:
        """Every consumer group with committed offsets (a stream sink's groups included)."""
        return group_offsets.group_ids(self.services.storage)

    def delete_group(self, group_id: str) -> None:
        """Forget a group's committed offsets (kafka-consumer-groups --delete): a new version
        of its chain marks it deleted; a later commit starts it afresh."""
        group_offsets.delete_group(self.services.storage, group_id)

    def reset_offsets(self, group_id: str,
                      step: Callable[[dict[tuple[str, int], int]], dict[tuple[str, int], int]]
                      ) -> dict[tuple[str, int], int]:
        """Set some of an existing group's offsets from its current ones in one version
        (txlog groups reset-offsets); see transactions.groups.reset_offsets."""
        # Refused (GroupNotEmptyError) while the group has live members, as Kafka's tool.
        return reset_offsets_if_inactive(self.services.storage, group_id, step)

    def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]) -> None:
        """Plain, non-transactional offset commit for a group."""
        group_offsets.commit_offsets(self.services.storage, group_id, offsets)
