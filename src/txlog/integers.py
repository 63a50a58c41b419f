"""What counts as an integer where txlog takes one from a caller.

Python's ``bool`` is a subclass of ``int``, so ``isinstance(True, int)`` holds
and a flag passed by mistake where a count, offset or size belongs would slip
through as 1 or 0.  Every check that means "an int, not a bool" asks here.
"""

from __future__ import annotations

from typing import Any, TypeGuard


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)
