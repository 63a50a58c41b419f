"""kafka-python 3.0's ``KafkaAdminClient`` on a txlog root.

``from txlog.kafka import KafkaAdminClient, NewTopic`` in place of ``from
kafka import ...``: topics, configs, groups and their offsets, records and
transactions are administered with the operations the CLI runs (the Root's
topic operations, the group store, the transaction coordinator), so the two
never disagree.  Results and errors have kafka-python's shapes: per-topic
error codes where it returns them, its error classes where it raises.

There is no broker, so what addresses one (``broker_ids``,
``group_coordinator_id``...) may name only node 0, the storage; what
cannot mean the same here is accepted with its meaning documented
(``replication_factor``, ``timeout_ms``) or refused by name with the reason
(replica assignments; the cluster, ACL, quota and replica methods below).
docs/clients.md, "The admin client", tables every method.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Self

from .. import clock
from ..transactions.metadata import TxnState
from .admin_groups import GroupAdmin, one_node
from .admin_topics import NODE
from .admin_types import (PartitionProducerState, ProducerState, TransactionDescription,
                          TransactionListing, TransactionState)
from .config import ADMIN_CONFIG, open_log, resolve
from .errors import TransactionalIdNotFoundError, UnsupportedVersionError, translated
from .structs import TopicPartition

_NO_ACLS = ("txlog has no ACLs: who may read or write a root is the storage's permission "
            "(docs/object_stores.md)")
_NO_REPLICAS = "txlog has no replicas, leaders or log dirs: storage replaces replication"
_NO_BROKERS = "txlog has no brokers, controller or features: processes share the storage"
_NO_USERS = "txlog has no broker to authenticate to: the storage's credentials apply"

# kafka-python 3.0's methods that cannot mean anything here, each with why.
REFUSED_METHODS: dict[str, str] = {
    "describe_acls": _NO_ACLS, "create_acls": _NO_ACLS, "delete_acls": _NO_ACLS,
    "alter_user_scram_credentials": _NO_USERS, "describe_user_scram_credentials": _NO_USERS,
    "elect_leaders": _NO_REPLICAS, "alter_partition_reassignments": _NO_REPLICAS,
    "list_partition_reassignments": _NO_REPLICAS, "alter_replica_log_dirs": _NO_REPLICAS,
    "describe_log_dirs": _NO_REPLICAS, "describe_topic_partitions": _NO_REPLICAS,
    "describe_cluster": _NO_BROKERS, "describe_metadata_quorum": _NO_BROKERS,
    "describe_features": _NO_BROKERS, "update_features": _NO_BROKERS,
    "api_versions": _NO_BROKERS, "get_broker_version_data": _NO_BROKERS,
    "list_config_resources": "only topics have configs here: list_topics() names them",
    "remove_group_members": "a member leaves by closing its consumer, or is removed once "
                            "past its session timeout",
    "abort_transaction": "abort by transactional id instead: `txlog transactions abort ID` "
                         "(a partition's producer id and epoch alone do not name one here)",
    "reset_configs": "use alter_configs with (AlterConfigOp.DELETE, None) per key",
}


def _refused(name: str, reason: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedVersionError(f"KafkaAdminClient.{name} is not supported by txlog: "
                                      f"{reason}")
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Refused: {reason}."
    return method


class KafkaAdminClient(GroupAdmin):
    """kafka-python's admin client; ``bootstrap_servers`` is the log root (a path or URL).

    Takes kafka-python's admin keys (docs/clients.md's table: those of both
    clients but allow_auto_create_topics, metrics_enabled and ssl_ciphers) and
    ``storage_options``.
    """

    def __init__(self, **configs: Any) -> None:
        self.config = resolve("KafkaAdminClient", ADMIN_CONFIG, configs)
        self._root = open_log("KafkaAdminClient", self.config["bootstrap_servers"],
                              self.config["storage_options"]).services

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to disconnect from: every call reads and writes the storage itself."""

    def list_transactions(self, broker_ids: list[int] | None = None,
                          producer_id_filters: list[int] | None = None,
                          state_filters: list[Any] | None = None,
                          duration_filter_ms: int | None = None,
                          transactional_id_pattern: str | None = None
                          ) -> dict[int, list[TransactionListing]]:
        """Every transactional id (``txlog transactions list``), under node 0; the
        filters as Kafka's: producer ids, states, open longer than ``duration_filter_ms``,
        ids matching the regular expression ``transactional_id_pattern``."""
        one_node("broker_ids", broker_ids)
        states = None if not state_filters else {TransactionState(s) for s in state_filters}
        now = clock.now_ms()
        listings = []
        with translated():
            coordinator = self._root.coordinator
            for txn_id in coordinator.transactional_ids():
                meta = coordinator.metadata(txn_id)
                if meta is None:
                    continue
                state = TransactionState(meta.state.value)
                open_ms = now - meta.txn_start_ms if meta.state is TxnState.ONGOING else -1
                if (producer_id_filters and meta.producer_id not in producer_id_filters) or \
                        (states is not None and state not in states) or \
                        (duration_filter_ms is not None and open_ms < duration_filter_ms) or \
                        (transactional_id_pattern is not None and
                         re.search(transactional_id_pattern, txn_id) is None):
                    continue
                listings.append(TransactionListing(txn_id, meta.producer_id, state))
        return {NODE: listings}

    def describe_transactions(self, transactional_ids: list[str]
                              ) -> dict[str, TransactionDescription]:
        """Each id's state, producer, timeout, open transaction's start (-1 if none) and
        partitions (``txlog transactions describe``); TransactionalIdNotFoundError for
        an unknown one."""
        out = {}
        with translated():
            for txn_id in transactional_ids:
                meta = self._root.coordinator.metadata(txn_id)
                if meta is None:
                    raise TransactionalIdNotFoundError(
                        f"transactional id {txn_id!r} does not exist in {self._root.url}")
                ongoing = meta.state is TxnState.ONGOING
                out[txn_id] = TransactionDescription(
                    NODE, TransactionState(meta.state.value), meta.producer_id, meta.epoch,
                    meta.timeout_ms, meta.txn_start_ms if ongoing else -1,
                    {TopicPartition(t, p) for t, p in meta.partitions})
        return out

    def find_hanging_transactions(self, broker_ids: list[int] | None = None,
                                  max_transaction_timeout_ms: int = 900000
                                  ) -> list[dict[str, Any]]:
        """Open transactions that hold an LSO back with no live owner (``txlog
        transactions find-hanging``): past their own timeout or forgotten by the
        coordinator, and, as kafka-python's, any open longer than
        ``max_transaction_timeout_ms`` plus 5 minutes.  One dict per transaction."""
        one_node("broker_ids", broker_ids)
        now = clock.now_ms()
        found: dict[Any, dict[str, Any]] = {}
        with translated():
            partitions = [(t, p) for t in self._root.topics()
                          for p in range(self._root.describe_topic(t, refresh=True).partitions)]
            for h in self._root.coordinator.find_hanging(
                    partitions, max_transaction_timeout_ms + 5 * 60 * 1000):
                row = found.setdefault((h.transactional_id, h.producer_id, h.epoch), {
                    "transactional_id": h.transactional_id or None,
                    "producer_id": h.producer_id, "producer_epoch": h.epoch,
                    "state": TxnState.ONGOING.value,
                    "age_ms": now - h.start_ms if h.start_ms >= 0 else -1,
                    "coordinator_id": NODE, "topic_partitions": []})
                row["topic_partitions"].append(TopicPartition(h.topic, h.partition))
        for row in found.values():
            row["topic_partitions"].sort()
        return list(found.values())

    def describe_producers(self, partitions: list[Any], broker_id: int | None = None
                           ) -> dict[Any, PartitionProducerState]:
        """Per partition every producer its state remembers (``txlog producers
        describe``); coordinator epochs are -1 (no coordinator failover here)."""
        one_node("broker_id", broker_id)
        out = {}
        with translated():
            for topic, partition in partitions:
                state = self._root.partition(topic, partition).loaded_state()
                out[TopicPartition(topic, partition)] = PartitionProducerState([
                    ProducerState(pid, entry.epoch, entry.last_seq, entry.last_timestamp, -1,
                                  entry.txn_first_offset if entry.in_transaction else -1)
                    for pid, entry in sorted(state.producers.items())])
        return out


for _name, _reason in REFUSED_METHODS.items():
    setattr(KafkaAdminClient, _name, _refused(_name, _reason))
