"""The rows the benchmarks that compare with Parquet write (issue 32, item 6).

A byte or time ratio against Parquet depends on the data as much as on the
writer: repeated hex compresses to almost nothing, random bytes not at all.
So each such benchmark takes ``--dataset`` and every figure names its data:

* ``incompressible``: 8-byte keys and 1,000-byte random values, where no codec
  helps and the write path's own cost shows;
* ``events``: JSON click events (~250 bytes) with seeded random fields, the
  kind of record a log mostly holds, where codecs differ;
* ``hex``: the Spark benchmark's earlier rows (a 100-byte value, mostly one
  byte repeated), kept so that figures stay comparable with earlier runs.

Every generator is seeded and vectorised (numpy and Arrow compute, no Python
loop per record), so that building 10M rows costs little beside the run.
Each returns a table of ``key``, ``value`` (binary) and ``timestamp`` (int64
ms): what ``Producer.send_table`` takes and what a Parquet file of the same
rows holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DATASETS = ("incompressible", "events", "hex")
# 2020-09-13T12:26:40Z: a fixed start, so that a seed gives the same bytes on every run.
START_MS = 1_600_000_000_000
EVENT_NAMES = ("view", "click", "add_to_cart", "purchase", "search")
AGENTS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/120.0.0.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) Version/17.1 Mobile Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
)
_HEX_PAIRS = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2")


def _hex(rng: np.random.Generator, n: int, chars: int) -> pa.Array:
    """``n`` random lowercase hex strings of ``chars`` characters."""
    pairs = _HEX_PAIRS[rng.integers(0, 256, size=(n, chars // 2), dtype=np.uint8)]
    return pa.array(np.ascontiguousarray(pairs).view(f"S{chars}").ravel()).cast(pa.string())


def _pages() -> pa.Array:
    """About 500 paths, a site's worth: 20 sections of 25 pages."""
    sections = ("home", "search", "cart", "checkout", "account", "help", "blog", "deals",
                "shoes", "shirts", "bags", "watches", "books", "games", "music", "garden",
                "kitchen", "toys", "sports", "beauty")
    return pa.array([f"/{s}/item-{i:03d}" for s in sections for i in range(25)])


def _timestamps(rng: np.random.Generator, n: int) -> np.ndarray:
    """Millisecond timestamps rising by about 37 ms a record (1 to 73 ms)."""
    return START_MS + np.cumsum(rng.integers(1, 74, size=n, dtype=np.int64))


def _price(rng: np.random.Generator, n: int) -> pa.Array:
    """``,"price":D.CC`` on about one record in five, else empty."""
    cents = rng.integers(99, 50_000, size=n)
    text = pc.binary_join_element_wise(
        ',"price":', pc.cast(pa.array(cents // 100), pa.string()), ".",
        pc.utf8_lpad(pc.cast(pa.array(cents % 100), pa.string()), 2, "0"), "")
    return pc.if_else(pa.array(rng.random(n) < 0.2), text, "")


def events(n: int, seed: int = 0) -> pa.Table:
    """``n`` JSON events keyed ``user-<user_id>``, ~250 bytes a value."""
    rng = np.random.default_rng(seed)
    user = pc.cast(pa.array(rng.integers(0, 50_000, size=n)), pa.string())
    ts = _timestamps(rng, n)
    names, agents = pa.array(EVENT_NAMES), pa.array(AGENTS)
    pages = _pages()
    value = pc.binary_join_element_wise(
        '{"event_id":"', _hex(rng, n, 32),
        '","user_id":', user,
        ',"event":"', names.take(pa.array(rng.integers(0, len(EVENT_NAMES), size=n))),
        '","page":"', pages.take(pa.array(rng.integers(0, len(pages), size=n))),
        '","ts":', pc.cast(pa.array(ts), pa.string()),
        _price(rng, n),
        ',"agent":"', agents.take(pa.array(rng.integers(0, len(AGENTS), size=n))),
        '","session":"', _hex(rng, n, 16), '"}', "")
    key = pc.binary_join_element_wise("user-", user, "")
    return _table(key.cast(pa.binary()), value.cast(pa.binary()), ts)


def incompressible(n: int, seed: int = 0) -> pa.Table:
    """8-byte random keys and 1,000-byte random values."""
    rng = np.random.default_rng(seed)
    return _table(_fixed(rng.bytes(8 * n), 8, n), _fixed(rng.bytes(1000 * n), 1000, n),
                  _timestamps(rng, n))


def hex_values(n: int, seed: int = 0) -> pa.Table:
    """The Spark benchmark's earlier rows, byte for byte with seed 0: the row number as an
    8-byte big-endian key, and a 100-byte value of that key then ``unhex("ab")`` repeated
    92 times (highly compressible).  Seed ``s`` numbers the rows from ``s * n``, so that
    writers with different seeds write different values."""
    rng = np.random.default_rng(seed)
    keys = np.arange(seed * n, (seed + 1) * n, dtype=">u8").view(np.uint8).reshape(n, 8)
    values = np.concatenate([keys, np.full((n, 92), 0xAB, np.uint8)], axis=1)
    return _table(_fixed(keys.tobytes(), 8, n), _fixed(values.tobytes(), 100, n),
                  _timestamps(rng, n))


def _fixed(data: bytes, width: int, n: int) -> pa.Array:
    offsets = pa.py_buffer(np.arange(0, (n + 1) * width, width, dtype=np.int32).tobytes())
    return pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(data)])


def _table(key: pa.Array, value: pa.Array, ts: np.ndarray) -> pa.Table:
    return pa.table({"key": key, "value": value, "timestamp": pa.array(ts, pa.int64())})


GENERATORS: dict[str, Callable[[int, int], pa.Table]] = {
    "incompressible": incompressible, "events": events, "hex": hex_values}


def dataset(name: str, n: int, seed: int = 0) -> pa.Table:
    """The ``n`` rows of the dataset called ``name`` (one of DATASETS)."""
    return GENERATORS[name](n, seed)
