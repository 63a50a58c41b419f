"""Bytes stored: txlog with each codec against Parquet (snappy) for the same rows.

For each dataset (bench_datasets.py) the same table is written once per codec by a
producer's ``send_table`` into a fresh log of ``--partitions`` partitions, and
once by ``pyarrow.parquet.write_table`` with snappy, Spark's default codec
(Spark-free, so that the figure is the file format's, not Spark's).  Bytes
stored are every file under the log's directory (data, index, transaction and
metadata files) against the Parquet file's; time is the write, median of
``--runs``.  Issue 32's bytes criterion: the default codec's ratio on
``events`` at most 1.0.

Run: ``python benchmarks/bytes_benchmark.py [--rows N] [--dataset NAME ...]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
from bench_datasets import DATASETS, dataset

from txlog import Log

CODECS = ("none", "lz4", "zstd")


def stored_bytes(path: str) -> int:
    """Every byte under ``path``: what a store bills and a reader may fetch."""
    return sum(os.path.getsize(os.path.join(top, name))
               for top, _, names in os.walk(path) for name in names)


def txlog_write(table: pa.Table, path: str, codec: str, partitions: int) -> float:
    log = Log(path)
    log.create_topic("bench", partitions=partitions)
    start = time.perf_counter()
    with log.producer(compression=codec) as producer:
        producer.send_table("bench", table)
        producer.flush()
    return time.perf_counter() - start


def parquet_write(table: pa.Table, path: str) -> float:
    start = time.perf_counter()
    pq.write_table(table, path, compression="snappy")
    return time.perf_counter() - start


def measure(table: pa.Table, scratch: str, runs: int, partitions: int
            ) -> dict[str, tuple[int, float]]:
    """``{writer: (bytes, median seconds)}`` for Parquet and each codec."""
    found: dict[str, tuple[int, float]] = {}
    for writer in ("parquet", *CODECS):
        times, size = [], 0
        for run in range(runs):
            path = os.path.join(scratch, f"{writer}-{run}")
            if writer == "parquet":
                times.append(parquet_write(table, path))
            else:
                times.append(txlog_write(table, path, writer, partitions))
            size = stored_bytes(path) if writer != "parquet" else os.path.getsize(path)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        found[writer] = (size, statistics.median(times))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--dataset", choices=DATASETS, action="append",
                        help="repeatable; default: every dataset")
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="txlog-bytes-", dir=args.dir)
    print(f"{args.rows} rows, {args.partitions} partitions, median of {args.runs} writes")
    print(f"{'dataset':>14} {'writer':>12} {'bytes':>13} {'x parquet':>10} {'seconds':>9}")
    try:
        for name in args.dataset or DATASETS:
            table = dataset(name, args.rows)
            found = measure(table, scratch, args.runs, args.partitions)
            parquet = found["parquet"][0]
            for writer, (size, seconds) in found.items():
                label = "parquet" if writer == "parquet" else f"txlog {writer}"
                print(f"{name:>14} {label:>12} {size:>13,} {size / parquet:>10.3f} "
                      f"{seconds:>9.3f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
