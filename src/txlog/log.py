"""``Log``: one log root, its topics, and the entry points to producers and consumers."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgpack
import pyarrow as pa

from . import clock
from .admin.gc import (DEFAULT_CHAIN_AGE_S, DEFAULT_DATA_AGE_S, DEFAULT_DECISION_AGE_S,
                       DEFAULT_TEMP_AGE_S, DEFAULT_TXN_ID_EXPIRATION_MS, GcReport,
                       collect)
from .clients.columns import to_spark_table
from .clients.positions import offset_for_timestamp
from .errors import (InconsistentTopicIdError, InvalidConfigError, LogFormatError,
                     OffsetOutOfRangeError, TopicExistsError, UnknownPartitionError,
                     UnknownTopicError)
from .format.topic_ids import current_topic_id, new_topic_id, read_topic_meta, topic_id_of
from .partition.compaction import (DEFAULT_BUFFER_BYTES, DEFAULT_MIN_BATCHES,
                                   DEFAULT_SEGMENT_BYTES, Compacted)
from .partition.isolation import READ_COMMITTED
from .partition.partition_log import PartitionLog
from .partition.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, PRODUCER_ID_EXPIRATION
from .partition.retention import Retained
from .partition.segment_merge import Merged
from .storage.contract import Storage
from .storage.schemes import open_storage
from .storage.chain import VersionChain
from .storage.names import validate_name
from .storage.paths import (ROOT_MARKER, TOPICS_DIR, partition_count_path, topic_config_path,
                            topic_dir, topic_meta_path)
from .transactions.producer_ids import ProducerIdAllocator

if TYPE_CHECKING:
    from .clients.consumer import Consumer
    from .clients.producer import Producer

FORMAT_VERSION = 1
MAX_PARTITIONS = 10_000

# Topic configuration keys we honour (Kafka's names).
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
# Kafka's defaults for the keys that only compaction and retention read.
TOPIC_DEFAULTS: dict[str, Any] = {"retention.ms": 7 * 24 * 3600 * 1000, "retention.bytes": -1,
                                  "segment.bytes": DEFAULT_SEGMENT_BYTES,
                                  PRODUCER_ID_EXPIRATION: DEFAULT_PRODUCER_ID_EXPIRATION_MS}
MIN_SEGMENT_BYTES = 1024
# What ``alter_topic_config`` may change: keys that appenders do not cache.
ALTERABLE_CONFIG = ("retention.ms", "retention.bytes", "segment.bytes")


def _int_at_least(low: int) -> Any:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            return f"an integer of at least {low}"
        return None
    return check


_CONFIG_RULES = {
    "message.timestamp.type":
        lambda v: None if v in _TIMESTAMP_TYPES else f"one of {_TIMESTAMP_TYPES}",
    "max.message.bytes": _int_at_least(1),
    "retention.ms": _int_at_least(-1),  # -1: no limit by time
    "retention.bytes": _int_at_least(-1),  # -1: no limit by size
    "segment.bytes": _int_at_least(MIN_SEGMENT_BYTES),
    # Not alterable: the producer state is a fold every process must compute alike.
    PRODUCER_ID_EXPIRATION: _int_at_least(1),
}


def _check_config(topic: str, config: dict[str, Any]) -> dict[str, Any]:
    checked: dict[str, Any] = {}
    for key, value in config.items():
        rule = _CONFIG_RULES.get(key)
        if rule is None:
            raise InvalidConfigError(
                f"topic {topic!r}: unknown config {key!r} (known: {', '.join(_CONFIG_RULES)})")
        problem = rule(value)
        if problem is not None:
            raise InvalidConfigError(f"topic {topic!r}: {key} must be {problem}, not {value!r}")
        checked[key] = value
    return checked


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: int
    config: dict[str, Any] = field(default_factory=dict)
    created_ms: int = 0
    topic_id: str = ""  # this incarnation of the topic (KIP-516); see format/topic_ids.py

    def setting(self, key: str) -> Any:
        """A config value, Kafka's default where the topic sets none."""
        return self.config.get(key, TOPIC_DEFAULTS.get(key))


class Log:
    """A txlog root: a local directory, ``memory://name``, or an object-store URL.

    Opening a root that does not hold a log yet creates it (``create=False``
    refuses instead).  Every process that opens the same root sees the same
    log; there is no server.
    """

    def __init__(self, root: str | os.PathLike[str] | Storage, *,
                 storage_options: dict[str, Any] | None = None, fsync: bool = True,
                 create: bool = True) -> None:
        self.storage = open_storage(root, storage_options, fsync=fsync)
        self.root = self.storage.url
        self._check_root(create)
        self._lock = threading.Lock()
        self._topics: dict[str, TopicDescription] = {}
        # Per topic, by (topic, chain path): partitions added, config altered since creation.
        self._topic_chains: dict[tuple[str, str], VersionChain] = {}
        self._partitions: dict[tuple[str, int], PartitionLog] = {}
        self.producer_ids = ProducerIdAllocator(self.storage)
        from .transactions.coordinator import TransactionCoordinator

        self.coordinator = TransactionCoordinator(self.storage, self.producer_ids.next_id,
                                                  self.partition)

    def __repr__(self) -> str:
        return f"Log({self.root!r})"

    def _check_root(self, create: bool) -> None:
        try:
            raw = self.storage.read(ROOT_MARKER)
        except FileNotFoundError:
            if not create:
                raise LogFormatError(f"{self.root} holds no txlog ({ROOT_MARKER} is missing)")
            marker = msgpack.packb({"format_version": FORMAT_VERSION,
                                    "created_ms": clock.now_ms(),
                                    "root_id": uuid.uuid4().hex})
            self.storage.publish_if_absent(ROOT_MARKER, marker)
            raw = self.storage.read(ROOT_MARKER)
        self._root_marker = raw
        try:
            version = msgpack.unpackb(raw).get("format_version")
        except Exception as exc:
            raise LogFormatError(f"{self.root}/{ROOT_MARKER} is unreadable: {exc}") from exc
        if version != FORMAT_VERSION:
            raise LogFormatError(
                f"{self.root} has log format version {version}; this txlog reads version "
                f"{FORMAT_VERSION}")

    @property
    def services(self) -> "Log":
        return self

    def revalidate(self) -> bool:
        """Prepare a long-lived Log for a new unit of work, as if it were opened afresh.

        A process that keeps its Log between tasks (a Spark worker, spark/worker_logs.py)
        keeps the partitions' cached states, which every refresh proves still current
        (docs/protocol.md 1), but must not keep what a new Log would look up again: the
        root and the topics' descriptions (a partition added or a config altered since).
        ``txlog.json`` is read again: other bytes mean the root was deleted and
        created anew under this Log, whose caches (producer-id block included) then
        belong to a log that no longer exists, so False is returned and the caller
        opens a new Log.  True: the descriptions are dropped, and the next use of a
        topic reads them as a new Log would.
        """
        try:
            raw = self.storage.read(ROOT_MARKER)
        except FileNotFoundError:
            return False
        if raw != self._root_marker:
            return False
        with self._lock:
            self._topics.clear()
            self._topic_chains.clear()
        return True

    # --- topics ------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1,
                     config: dict[str, Any] | None = None) -> TopicDescription:
        validate_name(name, "topic")
        if not isinstance(partitions, int) or isinstance(partitions, bool) or \
                not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidConfigError(
                f"topic {name!r}: partitions must be an integer from 1 to {MAX_PARTITIONS}, "
                f"not {partitions!r}")
        checked = _check_config(name, dict(config or {}))
        if self.storage.exists(topic_meta_path(name)):
            raise TopicExistsError(f"topic {name!r} already exists in {self.root}")
        if self.storage.list(topic_dir(name)):
            # Never clear leftovers here: a concurrent creator may already own them.
            raise TopicExistsError(
                f"topic {name!r} in {self.root} still holds data of an unfinished delete; "
                f"call delete_topic({name!r}) to finish it")
        desc = TopicDescription(name, partitions, checked, clock.now_ms(),
                                new_topic_id())
        meta = msgpack.packb({"name": name, "partitions": partitions, "config": checked,
                              "created_ms": desc.created_ms, "topic_id": desc.topic_id})
        if not self.storage.publish_if_absent(topic_meta_path(name), meta):
            raise TopicExistsError(f"topic {name!r} already exists in {self.root}")
        return desc

    def topics(self) -> list[str]:
        return sorted(n for n in self.storage.list(TOPICS_DIR)
                      if self.storage.exists(topic_meta_path(n)))

    def describe_topic(self, name: str, refresh: bool = False) -> TopicDescription:
        """The topic's description, cached; ``refresh`` re-reads its partition count.

        A description is immutable except for partitions added since, which
        a cached one does not show: like a Kafka client's metadata, it is
        refreshed where growth matters (subscriptions, an unknown partition).
        """
        validate_name(name, "topic")
        with self._lock:
            cached = self._topics.get(name)
        if cached is None:
            meta = read_topic_meta(self.storage, name)
            if meta is None:
                raise UnknownTopicError(f"topic {name!r} does not exist in {self.root}")
            cached = TopicDescription(meta["name"], meta["partitions"], meta["config"],
                                      meta["created_ms"], topic_id_of(meta))
            with self._lock:
                self._drop_other_incarnations(cached)
        elif not refresh:
            return cached
        count = self._partition_count(cached)
        desc = cached if count <= cached.partitions else replace(cached, partitions=count)
        altered = self._altered_config(desc)
        if altered is not None:
            desc = replace(desc, config=altered)
        with self._lock:
            self._topics[name] = desc
        return desc

    def adopt_description(self, desc: TopicDescription) -> None:
        """Use ``desc``, read by another process a moment ago, as if this Log had read it.

        A job's driver reads the descriptions of the topics it writes once and they
        travel to its tasks (``SharedTransaction.describing``), so that a task does not
        read ``topic.json`` and the partition-count and config chains again (three
        requests on an object store).  Safe because a description is only ever used
        with its topic id, which every append checks against ``topic.json`` before it
        publishes (docs/protocol.md 1.6 and 5).  A description this Log holds already
        (read since its last ``revalidate``) is kept: it is no older.
        """
        validate_name(desc.name, "topic")
        with self._lock:
            if desc.name not in self._topics:
                self._drop_other_incarnations(desc)
                self._topics[desc.name] = desc

    def _drop_other_incarnations(self, desc: TopicDescription) -> None:
        """Forget partitions cached of another incarnation of ``desc``'s topic: they
        belong to a deleted topic (called with the lock held)."""
        for key in [k for k, part in self._partitions.items()
                    if k[0] == desc.name and part.topic_id != desc.topic_id]:
            del self._partitions[key]

    def _topic_chain(self, name: str, path: str) -> VersionChain:
        with self._lock:
            chain = self._topic_chains.get((name, path))
            if chain is None:
                chain = self._topic_chains[(name, path)] = VersionChain(self.storage, path)
            return chain

    def _latest_of(self, desc: TopicDescription, path: str) -> dict | None:
        """The newest version of one of the topic's chains, if it is this incarnation's."""
        _, value = self._topic_chain(desc.name, path).latest()
        return value if value is not None and value.get("topic_id") == desc.topic_id else None

    def _partition_count(self, desc: TopicDescription) -> int:
        """Partitions of this incarnation: the created ones, or more if some were added."""
        value = self._latest_of(desc, partition_count_path(desc.name))
        return desc.partitions if value is None else max(desc.partitions, value["count"])

    def _altered_config(self, desc: TopicDescription) -> dict[str, Any] | None:
        """The topic's config as last altered, None if never altered (``topic.json``'s holds)."""
        value = self._latest_of(desc, topic_config_path(desc.name))
        return None if value is None else dict(value["config"])

    def alter_topic_config(self, name: str, set: dict[str, Any] | None = None,
                           delete: list[str] | tuple[str, ...] = ()) -> TopicDescription:
        """Set or remove (back to Kafka's default) retention and segment settings of a
        topic (kafka-configs --alter); each change is a new version of its config chain."""
        set = dict(set or {})
        for key in [*set, *delete]:
            if key not in ALTERABLE_CONFIG:
                raise InvalidConfigError(
                    f"topic {name!r}: config {key!r} cannot be altered (alterable: "
                    f"{', '.join(ALTERABLE_CONFIG)})")
        checked = _check_config(name, set)
        desc = self.describe_topic(name, refresh=True)

        def step(version: int, value: dict | None) -> dict | None:
            if current_topic_id(self.storage, name) != desc.topic_id:
                raise UnknownTopicError(f"topic {name!r} was deleted while its config was "
                                        "being altered")
            current = desc.config if value is None or value.get("topic_id") != \
                desc.topic_id else value["config"]
            config = {k: v for k, v in {**current, **checked}.items() if k not in delete}
            return {"config": config, "topic_id": desc.topic_id}

        self._topic_chain(name, topic_config_path(name)).update(step)
        return self.describe_topic(name, refresh=True)

    def create_partitions(self, name: str, total: int) -> TopicDescription:
        """Grow topic ``name`` to ``total`` partitions (Kafka's CreatePartitions).

        Partitions are only ever added: existing ones keep their records,
        and as in Kafka, keyed records sent from now on may hash to a new
        partition.  Readers that subscribe to the topic pick the new
        partitions up when they next look (a stream at its next trigger).
        """
        desc = self.describe_topic(name, refresh=True)
        if not isinstance(total, int) or isinstance(total, bool) or \
                not desc.partitions < total <= MAX_PARTITIONS:
            raise InvalidConfigError(
                f"topic {name!r} has {desc.partitions} partitions; the new total must be an "
                f"integer from {desc.partitions + 1} to {MAX_PARTITIONS}, not {total!r} "
                "(partitions can only be added)")

        def step(version: int, value: dict | None) -> dict | None:
            if current_topic_id(self.storage, name) != desc.topic_id:
                raise UnknownTopicError(f"topic {name!r} was deleted while partitions were "
                                        "being added to it")
            count = desc.partitions if value is None or value.get("topic_id") != \
                desc.topic_id else value["count"]
            if count >= total:
                raise InvalidConfigError(
                    f"topic {name!r} already has {count} partitions (another process added "
                    f"some); the new total must be more than that, not {total}")
            return {"count": total, "topic_id": desc.topic_id}

        self._topic_chain(name, partition_count_path(name)).update(step)
        return self.describe_topic(name, refresh=True)

    def delete_topic(self, name: str) -> None:
        """Remove a topic: its description first, so no new writer starts, then its data.

        Also finishes a delete that stopped half-way (description gone, data left).
        """
        validate_name(name, "topic")
        if not self.storage.exists(topic_meta_path(name)) and \
                not self.storage.list(topic_dir(name)):
            raise UnknownTopicError(f"topic {name!r} does not exist in {self.root}")
        self.storage.delete(topic_meta_path(name))
        self.storage.delete_tree(topic_dir(name))
        with self._lock:
            self._topics.pop(name, None)
            for key in [k for k in self._topic_chains if k[0] == name]:
                del self._topic_chains[key]
            for key in [k for k in self._partitions if k[0] == name]:
                del self._partitions[key]

    def partition(self, topic: str, partition: int,
                  topic_id: str | None = None) -> PartitionLog:
        """The partition's log object (one per Log, caching its producer state).

        With ``topic_id`` (from a description or a planned offset range), the
        partition must belong to that incarnation of the topic, else
        ``InconsistentTopicIdError``: a range planned against a deleted topic is
        never read from its successor.
        """
        key = (topic, partition)
        with self._lock:
            found = self._partitions.get(key)
        if found is not None and (topic_id is None or found.topic_id == topic_id):
            return found
        if found is not None:  # perhaps this process has not noticed a re-create yet
            self._forget_topic(topic, found.topic_id)
        desc = self.describe_topic(topic)
        if topic_id is not None and desc.topic_id != topic_id:
            raise InconsistentTopicIdError(
                f"topic {topic!r} is now topic id {desc.topic_id}, not {topic_id}: it was "
                "deleted and re-created since the caller learnt about it")
        if isinstance(partition, int) and partition >= desc.partitions:
            desc = self.describe_topic(topic, refresh=True)  # perhaps added since
        if not isinstance(partition, int) or not 0 <= partition < desc.partitions:
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0 to {desc.partitions - 1}; "
                f"partition {partition!r} does not exist")
        with self._lock:
            found = self._partitions.get(key)
            if found is not None and found.topic_id != desc.topic_id:
                del self._partitions[key]
            return self._partitions.setdefault(
                key, PartitionLog(self.storage, topic, partition, desc.topic_id,
                                  self.coordinator.resolve, on_stale=self._forget_topic,
                                  producer_expiration_ms=desc.setting(PRODUCER_ID_EXPIRATION),
                                  verify=self.coordinator.verifier(
                                      desc.setting(PRODUCER_ID_EXPIRATION))))

    def _forget_topic(self, topic: str, topic_id: str) -> None:
        """Drop what this Log cached of one incarnation of ``topic`` (it is gone)."""
        with self._lock:
            desc = self._topics.get(topic)
            if desc is not None and desc.topic_id == topic_id:
                del self._topics[topic]
                for key in [k for k in self._topic_chains if k[0] == topic]:
                    del self._topic_chains[key]
            for key in [k for k, part in self._partitions.items()
                        if k[0] == topic and part.topic_id == topic_id]:
                del self._partitions[key]

    # --- offsets and reads -----------------------------------------------------------

    def end_offset(self, topic: str, partition: int) -> int:
        """Log end offset: one past the last batch written (committed or not)."""
        return self.partition(topic, partition).end_offset()

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """First offset of the earliest undecided transaction, else the log end."""
        return self.partition(topic, partition).last_stable_offset()

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
        pieces, _ = self.partition(topic, partition, topic_id).read(start, end, isolation_level)
        return to_spark_table(pieces, topic, partition, include_headers)

    def offsets_for_times(self, topic: str, partition: int, timestamp_ms: int,
                          isolation_level: str = READ_COMMITTED) -> tuple[int, int] | None:
        """Earliest (offset, timestamp) whose timestamp is >= ``timestamp_ms``, or None."""
        return offset_for_timestamp(self, topic, partition, timestamp_ms, isolation_level)

    # --- clients ----------------------------------------------------------------------

    # --- maintenance ---------------------------------------------------------------

    def _partitions_of(self, topic: str, partitions: list[int] | None) -> list[int]:
        desc = self.describe_topic(topic, refresh=True)
        if partitions is None:
            return list(range(desc.partitions))
        for p in partitions:
            self.partition(topic, p)  # an unknown partition fails here, named
        return list(partitions)

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
        max_bytes = self.describe_topic(topic, refresh=True).setting("segment.bytes")
        done: dict[int, list[Compacted]] = {}
        for p in self._partitions_of(topic, partitions):
            part = self.partition(topic, p)
            upto = part.end_offset() - upto_lag
            made = done[p] = []
            while (segment := part.compact(max_bytes, min_batches, upto, buffer_bytes)) is not None:
                made.append(segment)
            if merge:
                part.merge_segments(max_bytes, buffer_bytes)
        return done

    def merge_segments(self, topic: str, partitions: list[int] | None = None,
                       buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> dict[int, list[Merged]]:
        """Merge runs of each partition's adjacent small segments into segments of at most
        the topic's ``segment.bytes`` (docs/protocol.md 7.3); ``compact`` does it too."""
        max_bytes = self.describe_topic(topic, refresh=True).setting("segment.bytes")
        return {p: self.partition(topic, p).merge_segments(max_bytes, buffer_bytes)
                for p in self._partitions_of(topic, partitions)}

    def apply_retention(self, topic: str, partitions: list[int] | None = None,
                        now_ms: int | None = None) -> dict[int, Retained]:
        """Delete the oldest segments the topic's ``retention.ms`` and ``retention.bytes``
        allow, advancing each partition's log start offset."""
        desc = self.describe_topic(topic, refresh=True)
        return {p: self.partition(topic, p).apply_retention(
                    desc.setting("retention.ms"), desc.setting("retention.bytes"), now_ms)
                for p in self._partitions_of(topic, partitions)}

    def delete_records(self, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Move each partition's log start up to its offset (-1: its log end), as Kafka's
        DeleteRecords; returns the log starts after (Kafka's low watermarks).

        Every partition and offset is checked before any log start moves, so a
        bad entry changes nothing.  Records below a log start are refused to
        readers at once and deleted later by retention (docs/protocol.md 7.1).
        """
        checked = []
        for (topic, partition), offset in offsets.items():
            part = self.partition(topic, partition)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < -1 or \
                    offset > part.end_offset():
                raise OffsetOutOfRangeError(
                    f"delete-records offset {offset!r} for {topic}-{partition} must be -1 (the "
                    f"log end) or 0 to its log end offset {part.end_offset()}: no log start "
                    "was moved")
            checked.append(((topic, partition), part, offset))
        return {tp: part.delete_records(offset) for tp, part, offset in checked}

    def gc(self, chain_age_s: float = DEFAULT_CHAIN_AGE_S,
           decision_age_s: float = DEFAULT_DECISION_AGE_S, temp_age_s: float = DEFAULT_TEMP_AGE_S,
           now_ms: int | None = None, data_age_s: float = DEFAULT_DATA_AGE_S,
           txn_id_expiration_ms: int = DEFAULT_TXN_ID_EXPIRATION_MS) -> GcReport:
        """Remove coordinator state, compaction leftovers, temp files and data objects
        nobody needs any more, without changing what anyone reads (admin/gc.py says why
        each removal is safe); expire transactional ids idle longer than
        ``txn_id_expiration_ms``."""
        return collect(self, chain_age_s, decision_age_s, temp_age_s, now_ms, data_age_s,
                       txn_id_expiration_ms)

    def producer(self, **config: Any) -> "Producer":
        from .clients.producer import Producer

        return Producer(self, **config)

    def consumer(self, **config: Any) -> "Consumer":
        from .clients.consumer import Consumer

        return Consumer(self, **config)

    # --- transactions and groups (see transactions/) -------------------------------------

    def abort_expired_transactions(self) -> list[str]:
        """Abort every Ongoing transaction past its timeout; returns their ids."""
        return self.coordinator.abort_expired()

    def committed(self, group_id: str, partitions: list[tuple[str, int]] | None = None
                  ) -> dict[tuple[str, int], int]:
        """The group's committed offsets (only those of committed transactions)."""
        from .transactions.groups import committed_offsets

        return committed_offsets(self.storage, group_id, partitions)

    def groups(self) -> list[str]:
        """Every consumer group with committed offsets (a stream sink's groups included)."""
        from .transactions.groups import group_ids

        return group_ids(self.storage)

    def delete_group(self, group_id: str) -> None:
        """Forget a group's committed offsets (kafka-consumer-groups --delete): a new version
        of its chain marks it deleted; a later commit starts it afresh."""
        from .transactions.groups import delete_group

        delete_group(self.storage, group_id)

    def reset_offsets(self, group_id: str,
                      step: Callable[[dict[tuple[str, int], int]], dict[tuple[str, int], int]]
                      ) -> dict[tuple[str, int], int]:
        """Set some of an existing group's offsets from its current ones in one version
        (txlog groups reset-offsets); see transactions.groups.reset_offsets."""
        from .transactions.group_members import reset_offsets_if_inactive

        # Refused (GroupNotEmptyError) while the group has live members, as Kafka's tool.
        return reset_offsets_if_inactive(self.storage, group_id, step)

    def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]) -> None:
        """Plain, non-transactional offset commit for a group."""
        from .transactions.groups import commit_offsets

        commit_offsets(self.storage, group_id, offsets)
