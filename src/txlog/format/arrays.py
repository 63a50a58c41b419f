"""Arrow arrays of counts and constants, derived from one cached range.

The read path derives whole columns (offsets, repeated timestamps, Spark's
constant columns) with Arrow kernels over a slice of a cached ``0..n-1``
array, whose allocations come from Arrow's pool and reuse memory; fresh
numpy arrays of this size cost more in page faults than in arithmetic.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_COUNTING: dict[pa.DataType, pa.Array] = {}


def counting(type_: pa.DataType, n: int) -> pa.Array:
    """0, 1, ..., n-1 as a slice of a cached array."""
    cached = _COUNTING.get(type_)
    if cached is None or len(cached) < n:
        size = max(n, 1 << 16, 2 * len(cached) if cached is not None else 0)
        cached = _COUNTING[type_] = pa.array(np.arange(size, dtype=type_.to_pandas_dtype()))
    return cached.slice(0, n)


def repeat(type_: pa.DataType, value: int, n: int) -> pa.Array:
    """``value`` n times (an Arrow kernel over the cached range, not a Python list)."""
    return pc.add(pc.multiply(counting(type_, n), pa.scalar(0, type_)), pa.scalar(value, type_))
