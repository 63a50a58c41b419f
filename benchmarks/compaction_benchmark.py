"""Compaction benchmark: a compacted 1M-record partition against a 10k-record one.

The claim under test: after ``Log.compact`` merges a partition of 1,000,000
records written as 10,000 batch objects, opening a fresh ``Log`` to find the
partition's last stable offset, and reading its last 100 records, cost about
the same as in a partition of 10,000 records (100 batch objects).

What it does:

1. Writes, with ``Log(root, fsync=False)`` for speed, partition A (topic
   ``big``: 10,000 batches of 100 records) and partition B (topic ``small``:
   100 batches of 100), 8-byte random keys and 100-byte random values, through
   ``Producer.send_table`` with a ``batch_size`` that cuts exactly 100 records.
   The ``mixed`` variant (topics ``mixed-big``/``mixed-small``) writes the same
   volumes as transactions of 10 batches, every tenth one aborted, and leaves
   one transaction open at the end, so the LSO stops before the log end.
2. Times, on fresh ``Log`` objects (no cache carried over), median of
   ``--reps`` repetitions with the partitions taking turns:
   * ``lso``: ``Log(root).partition(t, 0).last_stable_offset()``;
   * ``read cold``: ``Log(root).read(t, 0, lso - 100)``, the offset
     known beforehand (a consumer resuming near the end);
   * ``read warm``: the same read on a Log that has just computed the LSO.
   and counts the storage calls one repetition makes.
3. Compacts A with ``Log.compact`` (a normal, fsyncing ``Log``; the topic's
   ``segment.bytes``: Kafka's 1 GiB by default, ``--segment-bytes`` to
   change), printing the objects under the partition before and after.
4. Times the same operations again and prints A/B ratios.

    PYTHONPATH=src python benchmarks/compaction_benchmark.py            # both variants
    PYTHONPATH=src python benchmarks/compaction_benchmark.py --variant plain --reps 50
    PYTHONPATH=src python benchmarks/compaction_benchmark.py --profile  # cProfile of A and B
    PYTHONPATH=src python benchmarks/compaction_benchmark.py --dir /tmp/cb   # kept, reused
    PYTHONPATH=src python benchmarks/compaction_benchmark.py --dir /tmp/cb --once lso big
    PYTHONPATH=src python benchmarks/compaction_benchmark.py --dir /tmp/cb --once read big \
        --start 999900

``--once OP TOPIC`` runs one operation on an existing ``--dir`` and exits,
for timing whole processes with an outside tool.  A ``--dir`` is kept, and a
second run on it reuses the data (and skips the "before" half once the big
partition is compacted).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from txlog import Log
from txlog.clients.accumulator import RECORD_OVERHEAD
from txlog.storage.local import LocalStorage

KEY_SIZE = 8
VALUE_SIZE = 100
RECORDS_PER_BATCH = 100
# send_table cuts a batch every batch_size bytes of its size estimate: exactly 100 records.
BATCH_SIZE = RECORDS_PER_BATCH * (RECORD_OVERHEAD + KEY_SIZE + VALUE_SIZE)
BIG_BATCHES = 10_000
SMALL_BATCHES = 100
TAIL = 100  # records read at the end
TXN_BATCHES = 10  # batches per transaction in the mixed variant
ABORT_EVERY = 10  # every tenth transaction is aborted
VARIANTS = {"plain": ("big", "small"), "mixed": ("mixed-big", "mixed-small")}
STORAGE_CALLS = ("read", "read_prefix", "read_buffer", "read_range", "exists", "list",
                 "publish_if_absent", "delete")


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)

    def column(width: int) -> pa.Array:
        data = rng.integers(0, 256, size=rows * width, dtype=np.uint8)
        offsets = np.arange(0, rows * width + 1, width, dtype=np.int32)
        return pa.BinaryArray.from_buffers(pa.binary(), rows,
                                           [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    return pa.table({"key": column(KEY_SIZE), "value": column(VALUE_SIZE)})


def _write_plain(log: Log, topic: str, batches: int) -> None:
    log.create_topic(topic, 1)
    producer = log.producer(batch_size=BATCH_SIZE, linger_ms=3_600_000)
    sent = 0
    for i in range(0, batches, 100):  # 100 batches per send_table call
        n = min(100, batches - i)
        sent += len(producer.send_table(topic, _table(n * RECORDS_PER_BATCH, seed=i),
                                        partition=0))
    assert sent == batches, (sent, batches)


def _write_mixed(log: Log, topic: str, batches: int) -> None:
    """Transactions of TXN_BATCHES batches, every ABORT_EVERY-th aborted (not the last),
    then one more transaction left open by a second producer."""
    log.create_topic(topic, 1)
    producer = log.producer(batch_size=BATCH_SIZE, linger_ms=3_600_000,
                            transactional_id=f"{topic}-writer")
    producer.init_transactions()
    for t in range(batches // TXN_BATCHES):
        producer.begin_transaction()
        producer.send_table(topic, _table(TXN_BATCHES * RECORDS_PER_BATCH, seed=t),
                            partition=0)
        if t % ABORT_EVERY == ABORT_EVERY // 2:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
    hanging = log.producer(batch_size=BATCH_SIZE, linger_ms=3_600_000,
                           transactional_id=f"{topic}-open", transaction_timeout_ms=900_000)
    hanging.init_transactions()
    hanging.begin_transaction()
    hanging.send_table(topic, _table(RECORDS_PER_BATCH, seed=-1 % 2**32), partition=0)
    # Never ended: the LSO stays at this transaction's first offset.


def _objects(root: str, topic: str) -> tuple[Counter, int]:
    """Objects under the partition directory by suffix, and their bytes."""
    kinds: Counter = Counter()
    total = 0
    for directory, _, names in os.walk(os.path.join(root, "topics", topic, "0")):
        for name in names:
            kinds[os.path.splitext(name)[1] or name] += 1
            total += os.path.getsize(os.path.join(directory, name))
    return kinds, total


def _describe(kinds: Counter, total: int) -> str:
    parts = ", ".join(f"{n:,} {k}" for k, n in sorted(kinds.items()))
    return f"{sum(kinds.values()):,} objects ({parts}), {total / 1e6:,.1f} MB"


class _CountingStorage(LocalStorage):
    """The local backend, counting calls per method (to see what an operation costs)."""

    def __init__(self, root: str) -> None:
        super().__init__(root, fsync=False)
        self.calls: Counter = Counter()
        self.bytes = 0

    def __getattribute__(self, name: str):  # noqa: ANN204
        attr = object.__getattribute__(self, name)
        if name in STORAGE_CALLS:
            calls = object.__getattribute__(self, "calls")

            def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                calls[name] += 1
                out = attr(*args, **kwargs)
                if isinstance(out, (bytes, pa.Buffer)):
                    self.bytes += len(out) if isinstance(out, bytes) else out.size
                return out

            return counted
        return attr


# --- the operations ---------------------------------------------------------------------


def op_lso(root: str | LocalStorage, topic: str, start: int) -> int:
    return Log(root).partition(topic, 0).last_stable_offset()


def op_read_cold(root: str | LocalStorage, topic: str, start: int) -> int:
    return Log(root).read(topic, 0, start).num_rows


OPS: dict[str, Callable[[str | LocalStorage, str, int], int]] = {
    "lso": op_lso, "read cold": op_read_cold}


def _time_warm_read(root: str, topic: str, start: int) -> tuple[float, int]:
    log = Log(root)
    log.partition(topic, 0).last_stable_offset()
    t0 = time.perf_counter()
    table = log.read(topic, 0, start)
    return time.perf_counter() - t0, table.num_rows


def _start_of(root: str, topic: str) -> int:
    return Log(root).partition(topic, 0).last_stable_offset() - TAIL


def fingerprint(root: str, topic: str) -> dict[str, object]:
    """What a reader sees of the partition: offsets, the tail, the visible record counts."""
    log = Log(root)
    part = log.partition(topic, 0)
    lso, end = part.last_stable_offset(), part.end_offset()
    tail = log.read(topic, 0, lso - TAIL)
    committed = log.read(topic, 0, part.log_start())
    uncommitted = log.read(topic, 0, part.log_start(), isolation_level="read_uncommitted")
    return {"lso": lso, "end": end, "log start": part.log_start(),
            "tail offsets": tail.column("offset").to_pylist(),
            "tail values": hashlib.sha256(b"".join(tail.column("value").to_pylist())).hexdigest(),
            "read_committed rows": committed.num_rows,
            "read_uncommitted rows": uncommitted.num_rows}


def measure(root: str, topics: list[str], reps: int) -> dict[str, dict[str, float]]:
    """Median seconds per operation and topic; the topics take turns in each repetition."""
    starts = {t: _start_of(root, t) for t in topics}
    samples: dict[str, dict[str, list[float]]] = {t: {op: [] for op in [*OPS, "read warm"]}
                                                 for t in topics}
    rows: dict[str, int] = {}
    for rep in range(reps + 1):  # the first round warms the page cache and is not counted
        for topic in topics:
            for name, op in OPS.items():
                t0 = time.perf_counter()
                out = op(root, topic, starts[topic])
                elapsed = time.perf_counter() - t0
                if name == "read cold":
                    rows[topic] = out
                if rep:
                    samples[topic][name].append(elapsed)
            elapsed, _ = _time_warm_read(root, topic, starts[topic])
            if rep:
                samples[topic]["read warm"].append(elapsed)
    for topic in topics:
        assert rows[topic] > 0, f"{topic}: the tail read returned nothing"
    return {t: {op: statistics.median(v) for op, v in ops.items()} for t, ops in samples.items()}


def storage_calls(root: str, topic: str) -> dict[str, tuple[Counter, int]]:
    """The storage calls (and bytes read) of one repetition of each operation."""
    start = _start_of(root, topic)
    out = {}
    for name, op in OPS.items():
        storage = _CountingStorage(root)
        op(storage, topic, start)
        out[name] = (storage.calls, storage.bytes)
    storage = _CountingStorage(root)
    part = Log(storage).partition(topic, 0)
    part.last_stable_offset()
    storage.calls.clear()
    storage.bytes = 0
    part.read(start)
    out["read warm"] = (storage.calls, storage.bytes)
    return out


def profile(root: str, topic: str, lines: int) -> None:
    start = _start_of(root, topic)
    for name, op in OPS.items():
        op(root, topic, start)  # warm the page cache
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            op(root, topic, start)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(lines)
        print(f"\n--- cProfile, {topic}, {name}, 20 calls (cumulative) ---")
        print(text.getvalue())


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def report(title: str, medians: dict[str, dict[str, float]], big: str, small: str,
           calls: dict[str, dict[str, tuple[Counter, int]]]) -> None:
    print(f"\n{title}")
    print(f"  {'operation':<10} {big:>14} {small:>14} {'ratio':>7}   storage calls "
          f"{big} | {small}")
    for op in medians[big]:
        a, b = medians[big][op], medians[small][op]
        ca, ba = calls[big][op]
        cb, bb = calls[small][op]
        print(f"  {op:<10} {_ms(a):>14} {_ms(b):>14} {a / b:7.2f}   "
              f"{sum(ca.values())} ({ba / 1e3:,.0f} kB) | {sum(cb.values())} ({bb / 1e3:,.0f} kB)")
    for op in medians[big]:
        for topic in (big, small):
            counter, _ = calls[topic][op]
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counter.items()))
            print(f"    {op} {topic}: {detail}")


def run_variant(root: str, variant: str, args: argparse.Namespace) -> None:
    big, small = VARIANTS[variant]
    writer = _write_mixed if variant == "mixed" else _write_plain
    setup = Log(root, fsync=False)
    if big not in setup.topics():
        t0 = time.perf_counter()
        config = {} if args.segment_bytes is None else {"segment.bytes": args.segment_bytes}
        writer(setup, small, SMALL_BATCHES)
        writer(setup, big, BIG_BATCHES)
        if config:
            setup.alter_topic_config(big, set=config)
        print(f"[{variant}] wrote {big} and {small} in {time.perf_counter() - t0:.1f} s "
              "(fsync off)")
    print(f"[{variant}] segment.bytes of {big}: "
          f"{Log(root).describe_topic(big, refresh=True).setting('segment.bytes'):,}")
    before = _objects(root, big)
    print(f"[{variant}] {big} before compaction: {_describe(*before)}")
    print(f"[{variant}] {small}: {_describe(*_objects(root, small))}")
    compacted = Log(root).partition(big, 0).compacted_end() > 0
    seen = None
    if not compacted:
        seen = fingerprint(root, big)
        medians = measure(root, [big, small], args.reps)
        calls = {t: storage_calls(root, t) for t in (big, small)}
        report(f"[{variant}] before compaction, medians of {args.reps}", medians, big, small,
               calls)
        if args.profile:
            profile(root, big, args.profile_lines)
        t0 = time.perf_counter()
        made = Log(root).compact(big)[0]
        elapsed = time.perf_counter() - t0
        print(f"\n[{variant}] compacted {big} in {elapsed:.2f} s (fsync on): "
              + "; ".join(f"offsets {c.base_offset}-{c.end_offset}, {c.batches:,} batches, "
                          f"{c.bytes / 1e6:,.1f} MB" for c in made))
    after = _objects(root, big)
    print(f"[{variant}] {big} after compaction: {_describe(*after)}")
    now = fingerprint(root, big)
    print(f"[{variant}] {big}: LSO {now['lso']:,}, log end {now['end']:,}, "
          f"{now['read_committed rows']:,} records visible under read_committed, "
          f"{now['read_uncommitted rows']:,} under read_uncommitted")
    if seen is not None:
        assert now == seen, f"compaction changed what readers see: {seen} -> {now}"
        print(f"[{variant}] readers see the same offsets, tail and counts as before compaction")
    medians = measure(root, [big, small], args.reps)
    calls = {t: storage_calls(root, t) for t in (big, small)}
    report(f"[{variant}] after compaction, medians of {args.reps}", medians, big, small, calls)
    if args.profile:
        profile(root, big, args.profile_lines)
        profile(root, small, args.profile_lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="log root to use and keep (default: a temporary one)")
    parser.add_argument("--variant", choices=[*VARIANTS, "both"], default="both")
    parser.add_argument("--reps", type=int, default=50, help="repetitions (default 50)")
    parser.add_argument("--segment-bytes", type=int, default=None,
                        help="segment.bytes of the big topic (default: 1 GiB, Kafka's)")
    parser.add_argument("--profile", action="store_true", help="print cProfiles")
    parser.add_argument("--profile-lines", type=int, default=30)
    parser.add_argument("--once", nargs=2, metavar=("OP", "TOPIC"),
                        help="run one operation (lso or read) on --dir and exit")
    parser.add_argument("--start", type=int, default=None,
                        help="with --once read: the offset to read from (default: LSO - 100, "
                             "found first in the same process)")
    args = parser.parse_args()
    if args.once:
        op, topic = args.once
        root = args.dir
        start = 0 if op != "read" else args.start if args.start is not None else \
            _start_of(root, topic)
        OPS["read cold" if op == "read" else "lso"](root, topic, start)
        return 0
    root = args.dir or tempfile.mkdtemp(prefix="txlog-compaction-")
    print(f"root {root}; {os.cpu_count()} cores; Python {sys.version.split()[0]}, "
          f"pyarrow {pa.__version__}")
    try:
        for variant in VARIANTS if args.variant == "both" else [args.variant]:
            run_variant(root, variant, args)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
