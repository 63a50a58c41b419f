"""What the native producer's settings accept: its table, and the check its constructor runs.

``Producer.__init__`` keeps its defaults in its signature and calls
``check_producer_settings`` with what it was given, before it uses any of it.
The default codec is defined here, where the Spark and Kafka options take it
without importing the producer (a Spark reader's process has no use for it).
"""

from __future__ import annotations

from typing import Any, Final

from ..errors import InvalidConfigError
from ..format.batch import compression_attribute
from .metrics import METRIC_SETTINGS
from .settings import Setting, Settings, at_least, name_of

# Kafka's producer does not compress by default; txlog does, because what a log costs is
# the bytes it keeps in storage: on JSON events zstd stores about 0.6x Parquet's bytes
# (lz4 about 1.05x, none about 2.9x: benchmarks/bytes_benchmark.py) in about the same
# time.  None and "none" still write uncompressed batches.
DEFAULT_COMPRESSION: Final = "zstd"


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
    ``compression_type`` (kafka-python's name for the same option) winning when given."""
    if compression_type is not None:
        compression = compression_type
    PRODUCER_SETTINGS.check(compression=compression, batch_size=batch_size,
                            data_object_bytes=data_object_bytes, linger_ms=linger_ms,
                            transactional_id=transactional_id,
                            metrics_num_samples=metrics_num_samples,
                            metrics_sample_window_ms=metrics_sample_window_ms)
    if transactional_id is not None and not enable_idempotence:
        raise InvalidConfigError("a transactional producer needs enable_idempotence=True")
    return compression
