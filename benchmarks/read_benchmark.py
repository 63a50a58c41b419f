"""Read benchmark: ``Log.read`` against a plain pyarrow IPC read of the same data.

The claim under test: reading 1,000,000 records of 100-byte values through
``log.read`` (checksums, producer state, read_committed filtering and the
conversion to Spark's Kafka columns included) costs less than twice what
pyarrow needs to read the same Arrow columns from one IPC file.

Both sides are timed in this process, best of ``--runs`` after one warm-up
run each, so both read from the page cache and the comparison is about CPU
work, not the disk.  ``log.read`` gets a fresh ``Log`` each run so no producer
state or header cache survives between runs.

Exit status: 0 when the ratio is below ``--max-ratio`` (2 by default), 1
otherwise.  Run ``python benchmarks/read_benchmark.py --help`` for options.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from txlog import Log, TxlogError
from txlog.format.batch import RECORD_SCHEMA

TOPIC = "bench"
VALUE_SIZE = 100
BATCH_SIZE = 8 << 20  # producer batch_size: 8 MiB, so ~68,000 records per batch object


def make_columns(records: int, seed: int) -> tuple[list[bytes], list[int]]:
    """Random 100-byte values and increasing millisecond timestamps."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=records * VALUE_SIZE, dtype=np.uint8).tobytes()
    values = [raw[i * VALUE_SIZE:(i + 1) * VALUE_SIZE] for i in range(records)]
    base = 1_700_000_000_000
    timestamps = [base + i // 1000 for i in range(records)]
    return values, timestamps


def write_log(root: str, values: list[bytes], timestamps: list[int]) -> None:
    """Produce every record (null key) through the ordinary idempotent producer."""
    log = Log(root)
    log.create_topic(TOPIC, partitions=1)
    producer = log.producer(batch_size=BATCH_SIZE, linger_ms=60_000)
    for value, ts in zip(values, timestamps, strict=True):
        producer.send(TOPIC, value, partition=0, timestamp_ms=ts)
    producer.close()


def reusable(root: str, ipc_path: str, records: int) -> bool:
    """True when ``--dir`` already holds both data sets with ``records`` records."""
    if not (os.path.exists(ipc_path) and os.path.exists(os.path.join(root, "txlog.json"))):
        return False
    try:
        return Log(root, create=False).end_offset(TOPIC, 0) == records
    except TxlogError:
        return False


def write_ipc(path: str, values: list[bytes], timestamps: list[int]) -> None:
    """The same columns, in the same schema, as one uncompressed IPC stream file."""
    n = len(values)
    table = pa.Table.from_arrays([
        pa.nulls(n, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(timestamps, pa.int64()),
        pa.array([[]] * n, RECORD_SCHEMA.field("headers").type),
    ], schema=RECORD_SCHEMA)
    with pa.OSFile(path, "wb") as sink, ipc.new_stream(sink, RECORD_SCHEMA) as writer:
        writer.write_table(table)


def read_ipc_file(path: str) -> pa.Table:
    """pyarrow's ordinary read: the bytes are copied from the file into memory."""
    with pa.OSFile(path, "rb") as source:
        return ipc.open_stream(source).read_all()


def read_ipc_mmap(path: str) -> pa.Table:
    """pyarrow over a memory map (zero-copy): for information only."""
    with pa.memory_map(path, "r") as source:
        return ipc.open_stream(source).read_all()


def read_log(root: str) -> pa.Table:
    """A fresh Log each time: nothing cached from an earlier run."""
    return Log(root, create=False).read(TOPIC, 0, 0, None)


def best_times(runs: int, readers: dict[str, tuple]) -> tuple[dict[str, float], dict]:
    """Best wall time of each reader over ``runs`` rounds, after one warm-up round.

    The readers take turns within each round, so a burst of load from other
    processes on the machine hits all of them alike rather than one reader's
    whole series.  Each reader's previous result is dropped before it runs
    again: both sides then reuse memory the allocator already holds, as a
    loop that reads batch after batch does.
    """
    results = {name: fn(*args) for name, (fn, *args) in readers.items()}  # warm-up
    best = {name: float("inf") for name in readers}
    for _ in range(runs):
        for name, (fn, *args) in readers.items():
            results[name] = None
            start = time.perf_counter()
            results[name] = fn(*args)
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="number of records (default: 1,000,000)")
    parser.add_argument("--runs", type=int, default=7,
                        help="timed runs per reader; the best is reported (default: 7)")
    parser.add_argument("--max-ratio", type=float, default=2.0,
                        help="fail when log.read / pyarrow reaches this ratio (default: 2)")
    parser.add_argument("--dir", help="directory for the data (default: a temporary one, "
                        "removed afterwards)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true",
                        help="also print a cProfile of one log.read")
    args = parser.parse_args(argv)

    workdir = args.dir or tempfile.mkdtemp(prefix="txlog-bench-")
    os.makedirs(workdir, exist_ok=True)
    root = os.path.join(workdir, "log")
    ipc_path = os.path.join(workdir, "records.arrows")
    try:
        if reusable(root, ipc_path, args.records):
            produced = "reused from --dir"  # an earlier run's data, same --records
        else:
            shutil.rmtree(root, ignore_errors=True)
            values, timestamps = make_columns(args.records, args.seed)
            start = time.perf_counter()
            write_log(root, values, timestamps)
            produced = f"produced in {time.perf_counter() - start:.1f} s"
            write_ipc(ipc_path, values, timestamps)
            del values, timestamps

        partition_dir = os.path.join(root, "topics", TOPIC, "0")
        batch_files = [e for e in os.scandir(partition_dir) if e.name.endswith(".batch")]
        batches = len(batch_files)
        log_bytes = sum(e.stat().st_size for e in batch_files)
        print(f"records: {args.records:,} x {VALUE_SIZE}-byte values, null keys")
        print(f"log: 1 partition, {batches} batch objects (producer batch_size "
              f"{BATCH_SIZE >> 20} MiB), {log_bytes / 1e6:.1f} MB, {produced}")
        print(f"ipc file: {os.path.getsize(ipc_path) / 1e6:.1f} MB")

        best, results = best_times(args.runs, {
            "ipc": (read_ipc_file, ipc_path), "mmap": (read_ipc_mmap, ipc_path),
            "log": (read_log, root)})
        ipc_s, mmap_s, log_s = best["ipc"], best["mmap"], best["log"]
        ipc_table, log_table = results.pop("ipc"), results.pop("log")
        results.clear()

        # Same records on both sides, or the timing means nothing.
        assert log_table.num_rows == ipc_table.num_rows == args.records
        assert log_table.column("value").equals(ipc_table.column("value"))
        assert log_table.column("offset").to_numpy()[-1] == args.records - 1

        del log_table, ipc_table  # profile in the same steady state as the timed runs

        ratio = log_s / ipc_s
        print(f"pyarrow.ipc read (OSFile, read_all): {ipc_s * 1000:8.1f} ms")
        print(f"pyarrow.ipc read (memory map):       {mmap_s * 1000:8.1f} ms  (information)")
        print(f"log.read (fresh Log):                {log_s * 1000:8.1f} ms")
        print(f"ratio log.read / pyarrow.ipc:        {ratio:8.2f}  (limit {args.max_ratio})")

        if args.profile or ratio >= args.max_ratio:
            read_log(root)  # returns its memory to the pool, as in the timed runs
            profiler = cProfile.Profile()
            profiler.enable()
            read_log(root)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
        return 0 if ratio < args.max_ratio else 1
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
