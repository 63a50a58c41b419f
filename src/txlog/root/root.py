"""``Root``: one log root's services, what every layer between the user and storage needs.

The clients, the exactly-once jobs and the admin tools are handed a Root (by
``txlog.api.log.Log``, or by whoever opened one) and reach storage, the coordinator,
producer ids, topics and partitions through it.  Nothing here knows about the layers
above: data walks down from a client through a Root, never back up into a Log.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from functools import partial
from dataclasses import replace
from typing import Any

import msgpack

from .. import clock
from ..errors import (InconsistentTopicIdError, LogFormatError, TopicExistsError,
                      UnknownPartitionError, UnknownTopicError)
from ..format.topic_ids import current_topic_id, new_topic_id, read_topic_meta, topic_id_of
from ..partition.partition_log import PartitionLog
from ..partition.producer_state import PRODUCER_ID_EXPIRATION
from ..storage.contract import Storage
from ..storage.schemes import open_storage
from ..storage.chain import VersionChain
from ..storage.names import validate_name
from ..storage.pools import lookup_pool
from ..storage.paths import (ROOT_CONFIG_DIR, ROOT_MARKER, TOPICS_DIR, partition_count_path,
                             topic_config_path, topic_dir, topic_meta_path)
from ..transactions.coordinator import TransactionCoordinator
from ..transactions.producer_ids import ProducerIdAllocator
from .root_config import AUTO_CREATE, RootConfig, check_root_alteration
from .topics import (PartitionCount, TopicConfig, TopicDescription, check_alteration,
                     check_growth, check_new_topic)
from .value_schema import check_value_config

FORMAT_VERSION = 1


class Root:
    """The services of one root, opened as ``Log`` opens it (the Log's arguments).

    One per Log: its caches (topic descriptions, partitions with their producer
    states, the producer-id block) are this process's view of the root.
    """

    def __init__(self, root: str | os.PathLike[str] | Storage, *,
                 storage_options: dict[str, Any] | None = None, fsync: bool = True,
                 create: bool = True) -> None:
        self.storage = open_storage(root, storage_options, fsync=fsync)
        self.url = self.storage.url
        self._root_marker = self._check_root(create)
        self._lock = threading.Lock()
        self._topics: dict[str, TopicDescription] = {}
        # Per topic, by (topic, chain path): partitions added, config altered since creation.
        self._topic_chains: dict[tuple[str, str], VersionChain] = {}
        self._partitions: dict[tuple[str, int], PartitionLog] = {}
        # Per topic, the partitions its directory's last listing showed holding objects
        # (and those opened since): a partition opened outside them guesses it is empty.
        self._written: dict[str, set[int]] = {}
        self._config_chain = VersionChain(self.storage, ROOT_CONFIG_DIR)
        self._config: RootConfig | None = None  # the root's settings, once read
        self.producer_ids = ProducerIdAllocator(self.storage)
        self.coordinator = TransactionCoordinator(self.storage, self.producer_ids.next_id,
                                                  self.partition)

    def __repr__(self) -> str:
        return f"Root({self.url!r})"

    def _check_root(self, create: bool) -> bytes:
        """The root marker's bytes, written first if ``create`` and there is none."""
        try:
            raw = self.storage.read(ROOT_MARKER)
        except FileNotFoundError:
            if not create:
                raise LogFormatError(f"{self.url} holds no txlog ({ROOT_MARKER} is missing)") from None
            marker = msgpack.packb({"format_version": FORMAT_VERSION,
                                    "created_ms": clock.now_ms(),
                                    "root_id": uuid.uuid4().hex})
            self.storage.publish_if_absent(ROOT_MARKER, marker)
            raw = self.storage.read(ROOT_MARKER)
        try:
            version = msgpack.unpackb(raw).get("format_version")
        except Exception as exc:
            raise LogFormatError(f"{self.url}/{ROOT_MARKER} is unreadable: {exc}") from exc
        if version != FORMAT_VERSION:
            raise LogFormatError(
                f"{self.url} has log format version {version}; this txlog reads version "
                f"{FORMAT_VERSION}")
        return raw

    def revalidate(self) -> bool:
        """Prepare a long-lived root for a new unit of work, as if it were opened afresh.

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
            self._written.clear()
            self._config = None
        return True

    # --- the root's settings (root_config.py) ----------------------------------------

    def root_config(self, refresh: bool = False) -> RootConfig:
        """The root's settings, cached; ``refresh`` reads the chain's newest version."""
        with self._lock:
            cached = self._config
        if cached is not None and not refresh:
            return cached
        config = RootConfig.current(self._config_chain.latest()[1])
        with self._lock:
            self._config = config
        return config

    def alter_root_config(self, set: dict[str, Any] | None = None,
                          delete: list[str] | tuple[str, ...] = ()) -> RootConfig:
        """Set or remove (back to Kafka's default) the root's settings; each change is a
        new version of its config chain, decided against the newest."""
        checked = check_root_alteration(dict(set or {}), delete)
        _, value = self._config_chain.update(
            lambda version, value: RootConfig.current(value).altered(checked, delete).encode())
        config = RootConfig.current(value)
        with self._lock:
            self._config = config
        return config

    # --- topics ------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1,
                     config: dict[str, Any] | None = None,
                     validate_only: bool = False) -> TopicDescription:
        """Create a topic; ``validate_only``: make every check (an admin client's
        validate_only) and return the description it would have, creating nothing."""
        validate_name(name, "topic")
        checked = check_new_topic(name, partitions, config)
        if self.storage.exists(topic_meta_path(name)):
            raise TopicExistsError(f"topic {name!r} already exists in {self.url}")
        if self.storage.list(topic_dir(name)):
            # Never clear leftovers here: a concurrent creator may already own them.
            raise TopicExistsError(
                f"topic {name!r} in {self.url} still holds data of an unfinished delete; "
                f"call delete_topic({name!r}) to finish it")
        desc = TopicDescription(name, partitions, checked, clock.now_ms(),
                                new_topic_id())
        if validate_only:
            return desc
        meta = msgpack.packb({"name": name, "partitions": partitions, "config": checked,
                              "created_ms": desc.created_ms, "topic_id": desc.topic_id})
        if not self.storage.publish_if_absent(topic_meta_path(name), meta):
            raise TopicExistsError(f"topic {name!r} already exists in {self.url}")
        return desc

    def ensure_topic(self, name: str, override: tuple[str, bool] | None = None,
                     partitions: int | None = None) -> TopicDescription:
        """The topic's description, the topic created first if it does not exist and may be
        created on use, as a Kafka broker creates it when a client asks for it.

        The root decides (``auto.create.topics.enable``, read afresh at each miss), unless
        ``override`` names a client's setting and its value: False never creates
        (kafka-python's ``allow_auto_create_topics``), True always does (Spark's
        ``createTopics``).  A creation has ``partitions``, else the root's
        ``num.partitions``.  Processes creating the same topic at once all get the one
        that won the publish of ``topic.json`` (docs/protocol.md 1.7).
        """
        try:
            return self.describe_topic(name)
        except UnknownTopicError:
            pass
        config = self.root_config(refresh=True)
        setting, allowed = override or (AUTO_CREATE, config.auto_create)
        if not allowed:
            where = " on this root" if override is None else ""
            raise UnknownTopicError(
                f"topic {name!r} does not exist in {self.url} and {setting} is false{where}; "
                "create the topic first (txlog topics create)")
        try:
            return self.create_topic(name, partitions or config.num_partitions)
        except TopicExistsError as exc:
            try:  # another process created it first: that is the topic
                return self.describe_topic(name)
            except UnknownTopicError:
                raise exc from None  # the leftovers of an unfinished delete

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
        if cached is not None and not refresh:
            return cached
        chains = self._chain_reads(name)
        if cached is None:
            meta = read_topic_meta(self.storage, name)
            if meta is None:
                raise UnknownTopicError(f"topic {name!r} does not exist in {self.url}")
            cached = TopicDescription(meta["name"], meta["partitions"], meta["config"],
                                      meta["created_ms"], topic_id_of(meta))
            with self._lock:
                self._drop_other_incarnations(cached)
        counted, configured = chains()
        added = PartitionCount.latest(cached, counted)
        desc = cached if added is None or added.count <= cached.partitions else \
            replace(cached, partitions=added.count)
        altered = TopicConfig.latest(desc, configured)
        if altered is not None:
            desc = replace(desc, config=altered.config)
        with self._lock:
            self._topics[name] = desc
        return desc

    def _chain_reads(self, name: str) -> Callable[[], list[dict | None]]:
        """A call returning the newest versions of the topic's partition-count and config
        chains, after one listing of the topic's directory (on an object store begun
        here, beside the read of ``topic.json``: it does not depend on it).

        A chain the listing does not name has no version and is not listed itself
        (the chains it names are read at once on an object store); the partitions it
        does not name held no object at its instant, which a new partition object
        takes as a guess of an empty log (``partition``, docs/protocol.md 1.8)."""
        where = topic_dir(name)
        remote = getattr(self.storage, "remote", False)
        listing = lookup_pool().submit(self.storage.list, where) if remote else None
        paths = (partition_count_path(name), topic_config_path(name))

        def newest() -> list[dict | None]:
            names = self._topic_listed(
                name, listing.result() if listing is not None else self.storage.list(where))
            reads = [partial(self._latest, name, path) if path.rsplit("/", 1)[1] in names
                     else _no_version for path in paths]
            if not remote:
                return [read() for read in reads]
            return [f.result() for f in [lookup_pool().submit(read) for read in reads]]
        return newest

    def _topic_listed(self, name: str, names: list[str]) -> set[str]:
        """Note which partitions a listing of the topic's directory showed holding objects;
        returns its names."""
        with self._lock:
            self._written[name] = {int(n) for n in names if n.isdigit()}
        return set(names)

    def adopt_description(self, desc: TopicDescription) -> None:
        """Use ``desc``, read by another process a moment ago, as if this root had read it.

        A job's driver reads the descriptions of the topics it writes once and they
        travel to its tasks (``SharedTransaction.describing``), so that a task does not
        read ``topic.json`` and the partition-count and config chains again (three
        requests on an object store).  Safe because a description is only ever used
        with its topic id, which every append checks against ``topic.json`` before it
        publishes (docs/protocol.md 1.6 and 5).  A description this root holds already
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

    def _latest(self, name: str, path: str) -> dict | None:
        """The newest version of one of the topic's chains (of whichever incarnation)."""
        return self._topic_chain(name, path).latest()[1]

    def _update_chain(self, desc: TopicDescription, path: str, doing: str,
                      step: Callable[[dict | None], dict[str, Any]]) -> TopicDescription:
        """Publish ``step``'s next version of one of the topic's chains, unless the topic
        was deleted meanwhile; the description after it."""
        def guarded(version: int, value: dict | None) -> dict | None:
            if current_topic_id(self.storage, desc.name) != desc.topic_id:
                raise UnknownTopicError(f"topic {desc.name!r} was deleted while {doing}")
            return step(value)

        self._topic_chain(desc.name, path).update(guarded)
        return self.describe_topic(desc.name, refresh=True)

    def alter_topic_config(self, name: str, set: dict[str, Any] | None = None,
                           delete: list[str] | tuple[str, ...] = ()) -> TopicDescription:
        """Set or remove (back to Kafka's default) retention and segment settings of a
        topic (kafka-configs --alter); each change is a new version of its config chain."""
        set = dict(set or {})
        checked = check_alteration(name, set, delete)
        desc = self.describe_topic(name, refresh=True)
        return self._update_chain(
            desc, topic_config_path(name), "its config was being altered",
            lambda value: _whole(name, TopicConfig.current(desc, value).altered(checked, delete)))

    def create_partitions(self, name: str, total: int) -> TopicDescription:
        """Grow topic ``name`` to ``total`` partitions (Kafka's CreatePartitions).

        Partitions are only ever added: existing ones keep their records,
        and as in Kafka, keyed records sent from now on may hash to a new
        partition.  Readers that subscribe to the topic pick the new
        partitions up when they next look (a stream at its next trigger).
        """
        desc = self.describe_topic(name, refresh=True)
        check_growth(desc, total)
        return self._update_chain(
            desc, partition_count_path(name), "partitions were being added to it",
            lambda value: PartitionCount.current(desc, value).grown_to(name, total).encode())

    def delete_topic(self, name: str) -> None:
        """Remove a topic: its description first, so no new writer starts, then its data.

        Also finishes a delete that stopped half-way (description gone, data left).
        """
        validate_name(name, "topic")
        if not self.storage.exists(topic_meta_path(name)) and \
                not self.storage.list(topic_dir(name)):
            raise UnknownTopicError(f"topic {name!r} does not exist in {self.url}")
        self.storage.delete(topic_meta_path(name))
        self.storage.delete_tree(topic_dir(name))
        with self._lock:
            self._topics.pop(name, None)
            self._written.pop(name, None)
            for chain_key in [k for k in self._topic_chains if k[0] == name]:
                del self._topic_chains[chain_key]
            for key in [k for k in self._partitions if k[0] == name]:
                del self._partitions[key]

    # --- partitions ------------------------------------------------------------------

    def partition(self, topic: str, partition: int,
                  topic_id: str | None = None) -> PartitionLog:
        """The partition's log object (one per root, caching its producer state).

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
            found = self._partitions.get(key)
            if found is not None:
                return found
            written = self._written.get(topic)
            unwritten = written is not None and partition not in written
            if written is not None:
                written.add(partition)  # the guess is taken once
            found = self._partitions[key] = PartitionLog(
                self.storage, topic, partition, desc.topic_id, self.coordinator.resolve,
                on_stale=self._forget_topic,
                producer_expiration_ms=desc.setting(PRODUCER_ID_EXPIRATION),
                verify=self.coordinator.verifier(desc.setting(PRODUCER_ID_EXPIRATION)),
                unwritten=unwritten)
            return found

    def _forget_topic(self, topic: str, topic_id: str) -> None:
        """Drop what this root cached of one incarnation of ``topic`` (it is gone)."""
        with self._lock:
            desc = self._topics.get(topic)
            if desc is not None and desc.topic_id == topic_id:
                del self._topics[topic]
                self._written.pop(topic, None)
                for chain_key in [k for k in self._topic_chains if k[0] == topic]:
                    del self._topic_chains[chain_key]
            for key in [k for k, part in self._partitions.items()
                        if k[0] == topic and part.topic_id == topic_id]:
                del self._partitions[key]


def _no_version() -> None:
    """The newest version of a chain that a listing showed holds none."""
    return None


def _whole(name: str, config: TopicConfig) -> dict[str, Any]:
    """An altered config's next version, once the keys that must go together do
    (txlog.value.format and its schema): each key alone was checked before."""
    check_value_config(name, config.config)
    return config.encode()
