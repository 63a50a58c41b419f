"""What the native producer's settings accept: its table, the check its constructor runs,
and the defaults that depend on the store a Log is on.

``Producer.__init__`` keeps its defaults in its signature and calls
``check_producer_settings`` with what it was given, before it uses any of it.
The default codec is defined here, where the Spark and Kafka options take it
without importing the producer (a Spark reader's process has no use for it).
The settings whose best value depends on what a request to the store costs
default to None there, and ``store_defaults`` fills them in from the
storage's ``remote`` (each request a network round trip): the one place that
says what suits local disk and what suits an object store.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from ..errors import InvalidConfigError
from ..format.batch import compression_attribute
from .metrics import METRIC_SETTINGS
from .settings import Setting, Settings, at_least, name_of

# Kafka's producer does not compress by default; txlog does, because what a log costs is
# the bytes it keeps in storage: on JSON events zstd stores about 0.6x Parquet's bytes
# (lz4 about 1.05x, none about 2.9x: benchmarks/bytes_benchmark.py) in about the same
# time.  None and "none" still write uncompressed batches.
DEFAULT_COMPRESSION: Final = "zstd"

if TYPE_CHECKING:
    from ..storage.contract import Storage


@dataclass(frozen=True)
class StoreDefaults:
    """The producer settings that suit one kind of store, where the caller gives none."""

    # Bytes of one partition's records per batch (Kafka's batch.size); one claim covers
    # up to 16 consecutive batches of a flush (format.md 2.7.1).
    batch_size: int
    # Payload gathered (over all partitions) into one data object before it is written;
    # flush(), a commit and future.get() write what there is sooner.
    data_object_bytes: int
    # Whether send_table returns only once its data objects and claims are written
    # (wait=True), or leaves the last, partly filled object staged and writes a full
    # one behind while the caller goes on (protocol.md 1.1).
    send_table_waits: bool


# Local disk: a data object or a claim costs a file and an fsync, cheap beside its
# bytes, so batches and objects stay small (a producer holds up to two objects) and
# send_table answers with every batch written, as it always has.
LOCAL_DEFAULTS = StoreDefaults(batch_size=1 << 20, data_object_bytes=8 << 20,
                               send_table_waits=True)
# An object store: every data object and every claim is a request that waits a round
# trip (25 ms or more), and each flush costs at least a claim per partition it touches.
# So data objects of 32 MiB (Kafka's buffer.memory, also 32 MiB): a quarter of the
# flushes of 8 MiB objects; batches of 4 MiB, so that one claim covers a partition's
# share of a flush (16 batches of 1 MiB did not: a second claim and its check); and
# sends that do not wait, so that the next object is encoded while the last one
# travels (benchmarks/README.md, "Object stores with the core's defaults").
OBJECT_STORE_DEFAULTS = StoreDefaults(batch_size=4 << 20, data_object_bytes=32 << 20,
                                      send_table_waits=False)


def store_defaults(storage: Storage, batch_size: int | None = None,
                   data_object_bytes: int | None = None) -> StoreDefaults:
    """The settings for ``storage``: those given, and for each left as None the default
    that suits it (an object store's where each request is a network round trip,
    ``Storage.remote``; local disk's and memory's otherwise).  The one rule for them,
    so that whoever needs a producer's batch size before the producer exists (the Spark
    writer's merging of its input) finds the producer's."""
    defaults = OBJECT_STORE_DEFAULTS if storage.remote else LOCAL_DEFAULTS
    if batch_size is None and data_object_bytes is None:
        return defaults
    return replace(defaults,
                   batch_size=defaults.batch_size if batch_size is None else batch_size,
                   data_object_bytes=defaults.data_object_bytes if data_object_bytes is None
                   else data_object_bytes)



def _codec(name: str, value: Any) -> Any:
    compression_attribute(value)  # the batch format's own refusal of a codec it lacks
    return value


PRODUCER_SETTINGS = Settings(
    Setting("compression", _codec),
    # True has always passed as 1 for batch_size, and as 1 ms for linger_ms.
    Setting("batch_size", at_least(1, "{name} must be a positive integer, not {value!r}",
                                   allow_bool=True)),
    Setting("data_object_bytes", at_least(1, "{name} must be a positive integer, not {value!r}")),
    Setting("linger_ms", at_least(0, "{name} must be >= 0, not {value!r}", types=(int, float),
                                  allow_bool=True)),
    Setting("transactional_id", name_of("transactional id")),
    *METRIC_SETTINGS,
)


def check_producer_settings(*, compression: str | None, compression_type: str | None,
                            batch_size: Any, data_object_bytes: Any, linger_ms: Any,
                            transactional_id: Any, enable_idempotence: bool,
                            metrics_num_samples: Any, metrics_sample_window_ms: Any
                            ) -> str | None:
    """Raise for the first setting ``Producer.__init__`` cannot take; return the codec,
    ``compression_type`` (kafka-python's name for the same option) winning when given.
    A ``batch_size`` or ``data_object_bytes`` of None is the store's default
    (``store_defaults``)."""
    if compression_type is not None:
        compression = compression_type
    given = {name: value for name, value in (("batch_size", batch_size),
                                             ("data_object_bytes", data_object_bytes))
             if value is not None}
    PRODUCER_SETTINGS.check(compression=compression, linger_ms=linger_ms,
                            transactional_id=transactional_id,
                            metrics_num_samples=metrics_num_samples,
                            metrics_sample_window_ms=metrics_sample_window_ms, **given)
    if transactional_id is not None and not enable_idempotence:
        raise InvalidConfigError("a transactional producer needs enable_idempotence=True")
    return compression
