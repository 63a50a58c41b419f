"""Reading several partitions of a topic at once.

On an object store a partition's read begins with requests of its own (its
listings, the headers they name, the proof that its state is current) before
any data, each a round trip.  Read one partition after another, a topic pays
them once per partition; read together, they overlap, and so do the
partitions' data reads.  ``Log.read`` of many partitions and the consumer's
fetch both come here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from ..errors import InvalidConfigError
from ..integers import is_int
from ..partition.partition_log import PartitionLog
from ..root.root import Root
from ..storage.pools import partition_pool

_T = TypeVar("_T")


def each_partition(parts: Sequence[PartitionLog], work: Callable[[PartitionLog], _T]
                   ) -> list[_T]:
    """``work`` for each partition, at once when the storage waits on the network (in
    order; the first failure in that order is raised)."""
    if len(parts) < 2 or not any(getattr(p.storage, "remote", False) for p in parts):
        return [work(p) for p in parts]
    return list(partition_pool().map(work, parts))


def chosen_partitions(root: Root, topic: str, partition: int | Sequence[int] | None,
                      topic_id: str | None) -> list[PartitionLog]:
    """The partitions a read names: one, a list (each once, in its order), or every
    partition of the topic now (None), all checked before anything is read."""
    if partition is None:
        numbers: list[int] = list(range(root.describe_topic(topic, refresh=True).partitions))
    elif is_int(partition):
        numbers = [partition]
    elif isinstance(partition, Sequence) and not isinstance(partition, (str, bytes)):
        numbers = list(partition)
        twice = sorted({p for p in numbers if numbers.count(p) > 1})
        if twice:
            raise InvalidConfigError(f"partition {twice[0]} is listed twice in {numbers}")
    else:
        raise InvalidConfigError(f"partition must be an int, a list of ints or None, "
                                 f"not {partition!r}")
    return [root.partition(topic, p, topic_id) for p in numbers]


def per_partition(value: int | Mapping[int, int] | None, default: int | None,
                  parts: Sequence[PartitionLog], name: str) -> list[int | None]:
    """One offset for every partition, or a dict by partition (a partition it leaves
    out gets ``default``); a key naming no partition read is refused."""
    if not isinstance(value, Mapping):
        return [value for _ in parts]
    read = {p.partition for p in parts}
    extra = sorted(k for k in value if k not in read)
    if extra:
        raise InvalidConfigError(f"{name} names partition {extra[0]}, which this read does "
                                 f"not read (it reads {sorted(read)})")
    return [value.get(p.partition, default) for p in parts]
