"""Records per second of ``Producer.send_table`` against ``send`` one record at a time.

1M rows with 8-byte keys and 100-byte values into a 4-partition topic on the
local backend (fsync off, as the other benchmarks), default batch size.

    PYTHONPATH=src python benchmarks/send_table_benchmark.py [rows]
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from txlog import Log


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 256, size=rows * 8, dtype=np.uint8)
    values = rng.integers(0, 256, size=rows * 100, dtype=np.uint8)

    def column(data: np.ndarray, width: int) -> pa.Array:
        offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
        return pa.BinaryArray.from_buffers(pa.binary(), rows, [None, offsets.buffers()[1],
                                                                pa.py_buffer(data)])

    return pa.table({"key": column(keys, 8), "value": column(values, 100)})


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    table = _table(rows)
    with tempfile.TemporaryDirectory() as root:
        log = Log(root, fsync=False)
        log.create_topic("bulk", 4)
        producer = log.producer()
        start = time.perf_counter()
        sent = producer.send_table("bulk", table)
        bulk = time.perf_counter() - start
        assert sum(b.last_offset - b.base_offset + 1 for b in sent) == rows
        print(f"send_table: {rows:,} rows in {bulk:.2f} s = {rows / bulk:,.0f} records/s "
              f"({len(sent)} batches)")

        log.create_topic("single", 4)
        producer = log.producer(linger_ms=3_600_000)
        sample = min(rows, 200_000)
        keys = table.column("key").to_pylist()[:sample]
        values = table.column("value").to_pylist()[:sample]
        start = time.perf_counter()
        for key, value in zip(keys, values, strict=True):
            producer.send("single", value, key=key)
        producer.flush()
        single = time.perf_counter() - start
        print(f"send: {sample:,} rows in {single:.2f} s = {sample / single:,.0f} records/s")


if __name__ == "__main__":
    main()
