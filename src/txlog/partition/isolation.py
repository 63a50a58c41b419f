"""Isolation levels: how far a reader may read (the LSO or the log end).

Every reader's cap is decided here, so that read_committed means the same
for the core read, the consumer, the ``txlog`` command and Spark.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidConfigError

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)


def check_isolation_level(isolation_level: str, name: str = "isolation level") -> str:
    """``isolation_level`` if it is one; ``name`` is how the caller's user spells the setting."""
    if isolation_level not in ISOLATION_LEVELS:
        raise InvalidConfigError(f"{name} must be one of {', '.join(ISOLATION_LEVELS)}, "
                                 f"not {isolation_level!r}")
    return isolation_level


def visible_end(isolation_level: str, log_end: int, stable: Callable[[], int]) -> int:
    """How far a reader at ``isolation_level`` may read: the LSO or the log end.

    Every reader's cap is decided here, so that read_committed means the same
    for the core read, the consumer, the ``txlog`` command and Spark.  The
    LSO comes as a callable because working it out may ask the coordinator
    about open transactions, which a read_uncommitted reader never needs.
    """
    check_isolation_level(isolation_level)
    return stable() if isolation_level == READ_COMMITTED else log_end
