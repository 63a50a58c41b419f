"""``KafkaConsumer``: kafka-python's consumer over the native one.

Reads go through the native ``Consumer.fetch``, the same path as
``Consumer.poll``: each partition is read as the reader's Arrow pieces, and
only then turned into kafka-python's ``ConsumerRecord``s, column by column
(sizes with Arrow kernels, values with one ``to_pylist`` per column), with
the deserializers applied per record as kafka-python applies them.

Group membership (``subscribe`` with a ``group_id``) goes through one
object, ``self._member``, the core's group member made by ``_join_group``:
its ``poll()``, ``assignment()``, ``metadata()``, ``commit()`` and
``close()`` are every call this class makes for the group, so the rules
(generations, heartbeats, assignors, fencing) live in the core only.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..clients.assignors import ASSIGNORS
from ..clients.consumer import Consumer
from ..clients.membership import RootMember
from ..clients.positions import end_expired_transactions
from ..clients.transaction_manager import EXPIRY_CHECK_INTERVAL_S
from ..errors import UnknownTopicError
from ..integers import is_int
from ..partition.isolation import READ_COMMITTED
from ..root.root import Root
from ..transactions.stable_offsets import stable_offsets
from .config import CONSUMER_CONFIG, Codec, codec, open_log, resolve
from .errors import (IllegalStateError, KafkaConfigurationError, KafkaError, translated,
                     translating)
from .structs import (ConsumerGroupMetadata, ConsumerRebalanceListener, ConsumerRecord,
                      MemberState, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition,
                      plain_offsets)

if TYPE_CHECKING:
    from ..partition.reader import Piece

logger = logging.getLogger(__name__)



def _assignor_names(strategy: Any) -> tuple[str, ...]:
    """kafka-python names assignors by class (``RangePartitionAssignor``) or
    instance; each carries Kafka's protocol ``name``, which is what the core's
    assignors are chosen by.  Plain names are accepted too."""
    if strategy is None:
        return ("range", "roundrobin")  # kafka-python's default order
    if isinstance(strategy, str):
        strategy = (strategy,)
    names = []
    for item in strategy:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if not isinstance(name, str):
            raise KafkaConfigurationError(
                "partition_assignment_strategy: each entry must be an assignor name "
                f"({', '.join(ASSIGNORS)}) or an assignor class with a name, not {item!r}")
        names.append(name)
    return tuple(names)


def _join_group(root: Root, group_id: str, topics: list[str], config: dict[str, Any],
                listener: Any) -> RootMember:
    """The group member that ``subscribe`` with a ``group_id`` works through:
    the core's membership (join, heartbeats, assignors, generation fencing)."""
    return RootMember(
        root, group_id, topics,
        assignors=_assignor_names(config["partition_assignment_strategy"]),
        session_timeout_ms=config["session_timeout_ms"],
        heartbeat_interval_ms=config["heartbeat_interval_ms"],
        max_poll_interval_ms=config["max_poll_interval_ms"],
        group_instance_id=config["group_instance_id"],
        client_id=config["client_id"] or "txlog", listener=listener)


class _Listener:
    """Hands group membership's (topic, partition) lists to the user's listener as
    TopicPartitions, committing consumed offsets before a revocation as Kafka's
    auto-commit does."""

    def __init__(self, consumer: KafkaConsumer, user: ConsumerRebalanceListener | None) -> None:
        self._consumer = consumer
        self._user = user

    def on_partitions_revoked(self, revoked: list[tuple[str, int]]) -> None:
        self._consumer._maybe_auto_commit(force=True)
        if self._user is not None:
            self._user.on_partitions_revoked([TopicPartition(*tp) for tp in revoked])

    def on_partitions_assigned(self, assigned: list[tuple[str, int]]) -> None:
        if self._user is not None:
            self._user.on_partitions_assigned([TopicPartition(*tp) for tp in assigned])


class _CommitFuture:
    """What ``commit_async`` returns: kafka-python's future, already done."""

    def __init__(self, value: Any, exception: BaseException | None) -> None:
        self.is_done = True
        self.value = value
        self.exception = exception

    def succeeded(self) -> bool:
        return self.exception is None

    def failed(self) -> bool:
        return self.exception is not None

    def retriable(self) -> bool:
        return bool(getattr(self.exception, "retriable", False))

    def add_callback(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> _CommitFuture:
        if self.exception is None:
            f(*args, self.value, **kwargs)
        return self

    def add_errback(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> _CommitFuture:
        if self.exception is not None:
            f(*args, self.exception, **kwargs)
        return self

    def add_both(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> _CommitFuture:
        return self.add_callback(f, *args, **kwargs).add_errback(f, *args, **kwargs)


def _check_tp(partition: Any) -> TopicPartition:
    if not isinstance(partition, TopicPartition):
        raise TypeError("partition must be a TopicPartition namedtuple")
    return partition


class KafkaConsumer:
    """kafka-python's ``KafkaConsumer`` on a txlog root (``bootstrap_servers``).

    docs/clients.md lists what each configuration key means here and what
    differs from Kafka.  Like kafka-python's, one instance is for one thread.
    """

    def __init__(self, *topics: str, **configs: Any) -> None:
        config = resolve("KafkaConsumer", CONSUMER_CONFIG, configs)
        aliases = {"smallest": "earliest", "largest": "latest"}
        config["auto_offset_reset"] = aliases.get(config["auto_offset_reset"],
                                                  config["auto_offset_reset"])
        if config["group_instance_id"] is not None and config["group_id"] is None:
            raise KafkaConfigurationError("group_instance_id requires group_id")
        if config["enable_auto_commit"] and config["group_id"] is None:
            logger.warning("group_id is None: disabling auto-commit.")
            config["enable_auto_commit"] = False
        self.config = config
        self._key_deserializer = codec(config["key_deserializer"], "deserialize",
                                       "key_deserializer")
        self._value_deserializer = codec(config["value_deserializer"], "deserialize",
                                         "value_deserializer")
        log = open_log("KafkaConsumer", config["bootstrap_servers"], config["storage_options"])
        self._root = log.services
        with translated():
            self._core = Consumer(log, isolation_level=config["isolation_level"],
                                  group_id=config["group_id"],
                                  auto_offset_reset=config["auto_offset_reset"],
                                  max_poll_records=config["max_poll_records"],
                                  metrics_num_samples=config["metrics_num_samples"],
                                  metrics_sample_window_ms=config["metrics_sample_window_ms"],
                                  metric_group_prefix=config["metric_group_prefix"])
        self._paused: set[TopicPartition] = set()
        self._subscription: set[str] | None = None
        self._pattern: re.Pattern[str] | None = None
        self._user_assigned = False
        self._member: Any = None  # group membership, when subscribed with a group_id
        self._metadata_checked = 0.0
        self._expiry_checked = 0.0
        self._next_auto_commit = time.monotonic() + config["auto_commit_interval_ms"] / 1000
        self._iterator: Any = None
        self._consumer_timeout = float("inf")
        self._closed = False
        if topics:
            self.subscribe(topics=list(topics))

    # --- assignment and subscription ------------------------------------------------------

    @translating
    def assign(self, partitions: list[TopicPartition]) -> None:
        """Read exactly these partitions (no group rebalancing), replacing the assignment."""
        if self._subscription is not None:
            raise IllegalStateError("Subscription to topics, partitions and pattern are "
                                    "mutually exclusive")
        if not partitions:
            self.unsubscribe()
            return
        self._maybe_auto_commit(force=True)
        wanted = [_check_tp(tp) for tp in partitions]
        for topic in dict.fromkeys(tp.topic for tp in wanted):
            self._ensure_topic(topic)
        self._set_assignment(wanted)
        self._user_assigned = True

    def _ensure_topic(self, topic: str) -> None:
        """Create ``topic`` if it is missing and both this consumer and the root allow it, as
        a Kafka consumer's metadata request has the broker create it; else raise that it is
        unknown, naming the setting that forbade it."""
        self._root.ensure_topic(topic, None if self.config["allow_auto_create_topics"]
                                else ("allow_auto_create_topics", False))

    def _set_assignment(self, partitions: list[TopicPartition]) -> None:
        self._core.assign([(tp.topic, tp.partition) for tp in partitions])
        self._paused &= set(partitions)
        self._iterator = None

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(t, p) for t, p in self._core.assignment()}

    @translating
    def subscribe(self, topics: list[str] | tuple[str, ...] = (), pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Follow topics (or a pattern).  With a group_id the partitions are shared with
        the group's other members; without one, this consumer reads every partition."""
        if self._user_assigned:
            raise IllegalStateError("Subscription to topics, partitions and pattern are "
                                    "mutually exclusive")
        if bool(topics) == (pattern is not None):
            raise ValueError("You must choose topics or pattern, but not both")
        if listener is not None and not isinstance(listener, ConsumerRebalanceListener):
            raise TypeError("listener must be a ConsumerRebalanceListener")
        if isinstance(topics, str):
            topics = [topics]
        self._pattern = re.compile(pattern) if pattern is not None else None
        for topic in dict.fromkeys(topics if pattern is None else ()):
            try:
                self._ensure_topic(topic)
            except UnknownTopicError:
                if self.config["group_id"] is None:
                    raise
                # A group's member waits for the topic to appear, as a Kafka member does.
        self._subscription = set(topics) if pattern is None else set()
        self._refresh_subscription(force=True)
        if self.config["group_id"] is not None:
            if self._member is not None:
                self._member.close()
                self._member = None
            try:
                self._member = _join_group(self._root, self.config["group_id"],
                                           sorted(self._subscription), self.config,
                                           _Listener(self, listener))
            except BaseException:
                self._subscription = self._pattern = None
                raise
            self._set_assignment([])

    def subscription(self) -> set[str] | None:
        return None if self._subscription is None else set(self._subscription)

    @translating
    def unsubscribe(self) -> None:
        self._maybe_auto_commit(force=True)
        if self._member is not None:
            self._member.close()
            self._member = None
        self._subscription = None
        self._pattern = None
        self._user_assigned = False
        self._set_assignment([])

    def _refresh_subscription(self, force: bool = False) -> None:
        """A subscription's topics and partitions, looked up again every metadata_max_age_ms
        (new partitions and, for a pattern, new topics)."""
        if self._subscription is None:
            return
        now = time.monotonic()
        if not force and now - self._metadata_checked < self.config["metadata_max_age_ms"] / 1000:
            return
        self._metadata_checked = now
        if self._pattern is not None:
            self._subscription = {t for t in self._root.topics() if self._pattern.match(t)}
        if self._member is not None or self.config["group_id"] is not None:
            return  # the group's assignment decides
        wanted = [TopicPartition(t, p) for t in sorted(self._subscription)
                  for p in range(self._root.describe_topic(t, refresh=True).partitions)]
        if set(wanted) != self.assignment():
            self._set_assignment(wanted)

    def _sync_group(self) -> None:
        """Heartbeat and rebalance through the member; take on what it owns now."""
        if self._member is None:
            return
        generation, started = self._member.generation, time.perf_counter()
        self._member.poll()
        if self._member.generation != generation:  # joined, or followed a rebalance
            self._core.sensors.rebalances.record((time.perf_counter() - started) * 1000)
        owned = {TopicPartition(t, p) for t, p in self._member.assignment()}
        if owned != self.assignment():
            self._set_assignment(sorted(owned))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group identity to pass to ``KafkaProducer.send_offsets_to_transaction``."""
        if self.config["group_id"] is None:
            return ConsumerGroupMetadata(group_id=None)
        if self._member is None:
            return ConsumerGroupMetadata(group_id=self.config["group_id"])
        meta = self._member.metadata()
        return ConsumerGroupMetadata(meta.group_id, meta.generation_id, meta.member_id,
                                     meta.group_instance_id, MemberState.STABLE)

    # --- topics ---------------------------------------------------------------------------

    @translating
    def topics(self) -> set[str]:
        return set(self._root.topics())

    @translating
    def partitions_for_topic(self, topic: str) -> set[int]:
        if topic not in self._root.topics():
            return set()
        return set(range(self._root.describe_topic(topic, refresh=True).partitions))

    # --- positions ------------------------------------------------------------------------

    @translating
    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        tp = _check_tp(partition)
        if tp not in self.assignment():
            raise IllegalStateError("Partition is not assigned")
        return self._core.position(tp.topic, tp.partition)

    def highwater(self, partition: TopicPartition) -> int | None:
        """The partition's log end offset now (kafka-python: the last one a fetch saw)."""
        tp = _check_tp(partition)
        if tp not in self.assignment():
            raise IllegalStateError("Partition is not assigned")
        with translated():
            return self._root.partition(tp.topic, tp.partition).end_offset()

    @translating
    def seek(self, partition: TopicPartition, offset: int) -> None:
        tp = _check_tp(partition)
        if not is_int(offset) or offset < 0:
            raise ValueError("Offset must be int >= 0")
        if tp not in self.assignment():
            raise ValueError("Unassigned partition")
        self._core.seek(tp.topic, tp.partition, offset)
        self._iterator = None

    def _seek_targets(self, partitions: tuple[TopicPartition, ...]) -> list[tuple[str, int]]:
        if not all(isinstance(p, TopicPartition) for p in partitions):
            raise TypeError("partitions must be TopicPartition namedtuples")
        assigned = self.assignment()
        if not partitions:
            if not assigned:
                raise ValueError("No partitions are currently assigned")
            partitions = tuple(sorted(assigned))
        for p in partitions:
            if p not in assigned:
                raise ValueError(f"Unassigned partition: {p}")
        self._iterator = None
        return [(p.topic, p.partition) for p in partitions]

    @translating
    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._core.seek_to_beginning(*self._seek_targets(partitions))

    @translating
    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._core.seek_to_end(*self._seek_targets(partitions))

    @translating
    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of these partitions until ``resume``."""
        if not all(isinstance(p, TopicPartition) for p in partitions):
            raise TypeError("partitions must be TopicPartition namedtuples")
        assigned = self.assignment()
        for p in partitions:
            if p not in assigned:
                raise IllegalStateError(f"No current assignment for partition {p}")
        self._paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        if not all(isinstance(p, TopicPartition) for p in partitions):
            raise TypeError("partitions must be TopicPartition namedtuples")
        self._paused.difference_update(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    # --- offsets --------------------------------------------------------------------------

    @translating
    def beginning_offsets(self, partitions: list[TopicPartition],
                          timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        if not partitions:
            return {}
        found = self._core.beginning_offsets([(tp[0], tp[1]) for tp in partitions])
        return {TopicPartition(*tp): o for tp, o in found.items()}

    @translating
    def end_offsets(self, partitions: list[TopicPartition],
                    timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        """The LSO under read_committed, the log end offset otherwise (as Kafka)."""
        if not partitions:
            return {}
        found = self._core.end_offsets([(tp[0], tp[1]) for tp in partitions])
        return {TopicPartition(*tp): o for tp, o in found.items()}

    @translating
    def offsets_for_times(self, timestamps: dict[TopicPartition, int],
                          timeout_ms: int | None = None
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"The target time for partition {tp} is {ts}. The target "
                                 "time cannot be negative.")
        found = self._core.offsets_for_times({(tp[0], tp[1]): int(ts)
                                              for tp, ts in timestamps.items()})
        return {TopicPartition(*tp): None if hit is None else
                OffsetAndTimestamp(hit.offset, hit.timestamp, -1)
                for tp, hit in found.items()}

    def _require_group(self) -> str:
        group_id = self.config["group_id"]
        if group_id is None:
            raise IllegalStateError("Requires group_id")
        return group_id

    @translating
    def committed(self, partition: TopicPartition, metadata: bool = False,
                  timeout_ms: int | None = None) -> int | OffsetAndMetadata | None:
        """The group's committed offset for the partition, or None."""
        group_id = self._require_group()
        tp = _check_tp(partition)
        offset = stable_offsets(self._root.coordinator, group_id, [(tp.topic, tp.partition)]).get(
            (tp.topic, tp.partition))
        if offset is None:
            return None
        return OffsetAndMetadata(offset, "", -1) if metadata else offset

    def _consumed(self) -> dict[tuple[str, int], int]:
        return self._core.known_positions()

    @translating
    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata] | None = None,
               timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` (default: the position of every assigned partition read from)."""
        self._require_group()
        native = self._consumed() if offsets is None else plain_offsets(offsets, "commit")
        if not native:
            return
        if self._member is None:
            self._core.commit(native)
            return
        started = time.perf_counter()
        self._member.commit(native)
        self._core.sensors.commits.record((time.perf_counter() - started) * 1000)

    def commit_async(self, offsets: dict[TopicPartition, OffsetAndMetadata] | None = None,
                     callback: Callable[[Any, Any], Any] | None = None) -> _CommitFuture:
        """Commit as ``commit`` does, before returning, then call ``callback(offsets,
        response)`` with the error, if any, as the response."""
        self._require_group()
        if offsets is None:
            offsets = {TopicPartition(*tp): OffsetAndMetadata(o, "", -1)
                       for tp, o in self._consumed().items()}
        callback = callback or self.config["default_offset_commit_callback"]
        try:
            self.commit(offsets)
        except KafkaError as exc:
            if callback is not None:
                callback(offsets, exc)
            return _CommitFuture(None, exc)
        if callback is not None:
            callback(offsets, None)
        return _CommitFuture(offsets, None)

    def _maybe_auto_commit(self, force: bool = False) -> None:
        """enable_auto_commit: commit what has been consumed every auto_commit_interval_ms
        (from poll), and before the assignment changes or the consumer closes."""
        if not self.config["enable_auto_commit"] or self.config["group_id"] is None:
            return
        now = time.monotonic()
        if not force and now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config["auto_commit_interval_ms"] / 1000
        self.commit()

    # --- polling --------------------------------------------------------------------------

    @translating
    def poll(self, timeout_ms: float = 0, max_records: int | None = None,
             update_offsets: bool = True) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records of the assigned, unpaused partitions, waiting up to ``timeout_ms``."""
        if timeout_ms < 0:
            raise ValueError("Timeout must not be negative")
        if max_records is None:
            max_records = self.config["max_poll_records"]
        if not is_int(max_records):
            raise TypeError("max_records must be an integer")
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if self._closed:
            raise IllegalStateError("KafkaConsumer is closed")
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = self.config["retry_backoff_ms"] / 1000
        while True:
            records = self._poll_once(max_records, update_offsets)
            if records:
                return records
            left = deadline - time.monotonic()
            if left <= 0:
                return {}
            time.sleep(min(left, backoff))  # storage has no long poll: look again soon

    def _poll_once(self, max_records: int, update_offsets: bool
                   ) -> dict[TopicPartition, list[ConsumerRecord]]:
        self._sync_group()
        self._maybe_auto_commit()
        self._refresh_subscription()
        fetchable = [tp for tp in self._core.assignment() if tp not in self._paused]
        if not fetchable:
            return {}
        self._end_expired_transactions(fetchable)
        starts = {tp: self._core.position(*tp) for tp in fetchable}
        fetched = self._core.fetch(max_records, fetchable)
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        try:
            for (topic, partition), pieces in fetched.items():
                out[TopicPartition(topic, partition)] = self._records(topic, partition, pieces)
        except BaseException:
            # A deserializer failed: nothing of this poll is handed out, so every
            # position goes back (a record that cannot be read stays where it is,
            # as in Kafka, until the program seeks past it).
            for tp in fetched:
                self._core.seek(*tp, starts[tp])
            raise
        if not update_offsets:
            for tp in fetched:
                self._core.seek(*tp, starts[tp])
        return out

    def _end_expired_transactions(self, partitions: list[tuple[str, int]]) -> None:
        """Under read_committed, end the expired transactions that hold these partitions.

        Kafka's transaction coordinator aborts a dead producer's transaction
        once its timeout passes, and read_committed consumers then move on.
        txlog has no coordinator process, so readers share that duty
        (docs/protocol.md 4.9), at most once a second; it costs no request
        while nothing undecided holds a partition.
        """
        if self.config["isolation_level"] != READ_COMMITTED:
            return
        now = time.monotonic()
        if now - self._expiry_checked < EXPIRY_CHECK_INTERVAL_S:
            return
        self._expiry_checked = now
        end_expired_transactions(self._root, partitions)

    def _records(self, topic: str, partition: int, pieces: list[Piece]) -> list[ConsumerRecord]:
        """kafka-python's records from the reader's pieces, a column at a time."""
        out: list[ConsumerRecord] = []
        for piece in pieces:
            out.extend(_piece_records(topic, partition, piece, self._key_deserializer,
                                      self._value_deserializer))
        return out

    # --- iteration ------------------------------------------------------------------------

    def __iter__(self) -> KafkaConsumer:
        return self

    def __next__(self) -> ConsumerRecord:
        if self._closed:
            raise StopIteration("KafkaConsumer closed")
        if self.config["consumer_timeout_ms"] >= 0:
            self._consumer_timeout = time.monotonic() + self.config["consumer_timeout_ms"] / 1000
        while time.monotonic() < self._consumer_timeout:
            if self._iterator is None:
                self._iterator = self._message_generator()
            try:
                return next(self._iterator)
            except StopIteration:
                self._iterator = None
        raise StopIteration()

    def _message_generator(self) -> Any:
        """One poll's records, the position moving past each as it is handed out, so that a
        commit after breaking out of the loop commits only what was seen."""
        timeout_ms = 1000 * max(0.0, self._consumer_timeout - time.monotonic())
        # An assign() or seek() drops this generator; a pause() stops it here.
        for tp, records in self.poll(timeout_ms=timeout_ms, update_offsets=False).items():
            for record in records:
                if tp in self._paused:
                    break
                self._core.seek(tp.topic, tp.partition, record.offset + 1)
                yield record

    # --- closing --------------------------------------------------------------------------

    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
        """Commit consumed offsets if auto-commit is on (and ``autocommit``), leave the
        group, and release the deserializers."""
        if self._closed:
            return
        self._closed = True
        try:
            with translated():
                if autocommit:
                    self._maybe_auto_commit(force=True)
                if self._member is not None:
                    self._member.close()
                    self._member = None
        finally:
            self._core.close()
            for de in (self.config["key_deserializer"], self.config["value_deserializer"]):
                closer = getattr(de, "close", None)
                if callable(closer):
                    closer()

    def __enter__(self) -> KafkaConsumer:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        # As kafka-python: no auto-commit when the block failed, since the record
        # being processed may not have been handled.
        self.close(autocommit=exc_type is None)

    def bootstrap_connected(self) -> bool:
        return True

    def metrics(self, raw: bool = False) -> dict[Any, Any] | None:
        """kafka-python's fetch-manager and coordinator groups (clients/metrics.py); None
        with ``metrics_enabled=False``, as kafka-python."""
        return self._core.metrics(raw) if self.config["metrics_enabled"] else None


def _headers(column: pa.ChunkedArray | pa.Array, n: int) -> tuple[list[list], list[int]]:
    """Each record's headers as kafka-python's ``[(key, value), ...]``, and its
    serialized_header_size (UTF-8 key bytes plus value bytes; -1 without headers).

    Built from the flattened key and value columns: one ``to_pylist`` each,
    then one slice per record; no dict per header.
    """
    headers = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
    if not counts.any():
        return [[] for _ in range(n)], [-1] * n
    flat = pc.list_flatten(headers)
    keys, values = pc.struct_field(flat, [0]), pc.struct_field(flat, [1])
    sizes = (pc.binary_length(keys).to_numpy(zero_copy_only=False)
             + pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False))
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    summed = np.bincount(parents, weights=sizes, minlength=n).astype(np.int64)
    pairs = list(zip(keys.to_pylist(), values.to_pylist()))
    ends = np.cumsum(counts).tolist()
    starts = [0] + ends[:-1]
    return ([pairs[a:b] for a, b in zip(starts, ends)],
            np.where(counts > 0, summed, -1).tolist())


def _deserialized(de: Codec, what: str, topic: str, partition: int, offsets: list[int],
                  headers: list[list], data: list[Any]) -> list[Any]:
    """``de`` over a column; its error keeps its type (a ported program may catch it)
    and gains a note naming the record."""
    try:
        return list(map(de, repeat(topic), headers, data))
    except Exception as exc:
        for offset, hs, item in zip(offsets, headers, data):
            try:
                de(topic, hs, item)
            except Exception:
                exc.add_note(f"deserializing the {what} of {topic}-{partition} at offset "
                             f"{offset}")
                break
        raise


def _piece_records(topic: str, partition: int, piece: Piece, key_de: Codec | None,
                   value_de: Codec | None) -> list[ConsumerRecord]:
    records = piece.records
    n = records.num_rows
    keys_col, values_col = records.column("key"), records.column("value")
    key_sizes = pc.fill_null(pc.binary_length(keys_col), -1).to_pylist()
    value_sizes = pc.fill_null(pc.binary_length(values_col), -1).to_pylist()
    headers, header_sizes = _headers(records.column("headers"), n)
    keys, values = keys_col.to_pylist(), values_col.to_pylist()
    offsets = piece.offsets.to_pylist()
    if key_de is not None:
        keys = _deserialized(key_de, "key", topic, partition, offsets, headers, keys)
    if value_de is not None:
        values = _deserialized(value_de, "value", topic, partition, offsets, headers, values)
    return list(map(ConsumerRecord, repeat(topic, n), repeat(partition, n), repeat(-1, n),
                    offsets, piece.timestamps.to_pylist(),
                    repeat(piece.timestamp_type, n), keys, values, headers, repeat(None, n),
                    key_sizes, value_sizes, header_sizes))
