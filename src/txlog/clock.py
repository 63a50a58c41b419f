"""The one clock: wall-clock milliseconds, read in one replaceable place.

Every time txlog writes or compares (record and batch timestamps, transaction
start and update times, expiry, retention, gc ages, topic creation) comes
from ``now_ms``, and every caller looks it up here at call time
(``clock.now_ms()``), so a test or an embedding application moves time for
the whole library by replacing this one function, as Kafka injects its
``Time``.  ``monotonic_ms`` measures intervals inside one process only (it
never reaches storage).
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return int(time.time() * 1000)


def monotonic_ms() -> int:
    """Milliseconds of a clock that never goes back; meaningful only as differences."""
    return int(time.monotonic() * 1000)
