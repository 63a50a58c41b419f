"""Commit latency (issue 19): a small transaction on local disk against one fsynced file.

What a user calls a commit, measured as a user sees it: ``begin_transaction``,
the sends, and ``commit_transaction`` returning, with one transactional
producer on a local root with fsync on (the default).  Each transaction
holds ``--records`` records (default 10) in each of ``--partitions``
partitions (default 4), 100-byte values with 8-byte keys; by default they go
in one ``send_table`` call with a ``partition`` column (``--api send`` sends
them one ``send`` at a time instead, as a Kafka user would).
``init_transactions`` runs once before, as in a long-lived producer, and is
not timed.

The yardstick, taken in the same run on the same file system and interleaved
with the commits so that drift of this shared machine hits both alike:
creating a new file of the transaction's payload size, writing it, fsyncing
it and closing it (no directory fsync).  Beside it, interleaved too, the
floor of any commit that keeps the records durable before a decision that is
durable when the call returns, as two objects: the payload written and
fsynced as one file, then a small decision file written and fsynced, then one
fsync of their directory (no Python protocol work at all).  The medians of
``--commits`` (default 200) of each, after ``--warmup`` untimed ones, and
their ratios are printed; the script does not judge them.  Beside them, counted
over the paired rounds, so untouched by the disk's speed: the commits' fsyncs
(the yardstick's own subtracted) and the chain versions of the transactional
id, per commit.

Then, unless ``--back-to-back 0``, back-to-back transactions (default 100)
of the same shape to the same partitions, with nothing in between, timed
from the first ``begin_transaction`` until the last one's Complete version is
durable (``flush`` waits for the last roll-forward): the producer's
transactions per second, the same divided by the durable floor's rate, and
the fsyncs per transaction (counted, so untouched by the disk's speed).

With ``--s3-latency-ms MS`` it measures instead, on moto's S3 server in this
process with MS added to every request (scale_out_benchmark.LatentS3, waits
overlapping): per transaction, with its records already sent and claimed
(``send_table(wait=True)``), the requests and the time of ``commit_transaction``
alone, that time in round trips (time / MS), and the requests until the
roll-forward's Complete is durable (``flush``); medians of ``--commits``.

``--producer-option key=value`` (repeatable) is passed to ``Producer(...)``.

    python benchmarks/commit_latency_benchmark.py [--commits 200] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pyarrow as pa

from producer_options import producer_options
from txlog import Log, Producer
from txlog.storage.paths import TXN_DIR

KEY_BYTES = 8
VALUE_BYTES = 100
YARDSTICK_FSYNCS = 4  # per paired round: the small file's, and the durable floor's three


def transaction_table(records: int, partitions: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = records * partitions

    def column(width: int) -> pa.Array:
        offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                       pa.py_buffer(rng.bytes(n * width))])

    return pa.table({"key": column(KEY_BYTES), "value": column(VALUE_BYTES),
                     "partition": pa.array(np.repeat(np.arange(partitions, dtype=np.int32),
                                                     records))})


def one_commit(producer: Producer, topic: str, table: pa.Table, api: str) -> float:
    started = time.perf_counter()
    producer.begin_transaction()
    if api == "send_table":
        producer.send_table(topic, table)
    else:
        keys = table.column("key").to_pylist()
        values = table.column("value").to_pylist()
        parts = table.column("partition").to_pylist()
        for key, value, part in zip(keys, values, parts, strict=True):
            producer.send(topic, value, key=key, partition=part)
    producer.commit_transaction()
    return time.perf_counter() - started


def _write_synced(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def one_file(directory: str, data: bytes, n: int) -> float:
    started = time.perf_counter()
    _write_synced(os.path.join(directory, f"f{n:06d}"), data)
    return time.perf_counter() - started


def durable_commit_floor(directory: str, data: bytes, n: int) -> float:
    """Records durable, then a decision durable with its name: two fsyncs and the
    directory's, in that order (a decision synced first could outlive the records)."""
    started = time.perf_counter()
    _write_synced(os.path.join(directory, f"d{n:06d}.data"), data)
    _write_synced(os.path.join(directory, f"d{n:06d}.decision"), b"COMMIT")
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=200,
                        help="timed commits, and as many timed file writes (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds first (default 10)")
    parser.add_argument("--records", type=int, default=10,
                        help="records per partition per transaction (default 10)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    parser.add_argument("--api", choices=("send_table", "send"), default="send_table",
                        help="how the records are sent (default send_table, one call)")
    parser.add_argument("--dir", help="parent of the scratch directory (default: the temp dir); "
                                      "must be on the disk to measure")
    parser.add_argument("--back-to-back", type=int, default=100,
                        help="transactions committed back to back after the paired rounds, "
                             "counted until the last Complete is durable (default 100; 0: none)")
    parser.add_argument("--s3-latency-ms", type=float, default=None,
                        help="measure on moto's S3 with this latency per request instead "
                             "(requests and round trips of a commit)")
    parser.add_argument("--producer-option", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to Producer(...) (repeatable; dots read as underscores)")
    args = parser.parse_args(argv)
    for name in ("commits", "records", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.back_to_back < 0:
        parser.error(f"--back-to-back must be at least 0, got {args.back_to_back}")
    config = producer_options(args.producer_option, parser,
                              reserved=("log", "transactional_id"))

    if args.s3_latency_ms is not None:
        return _on_s3(args, config)
    scratch = tempfile.mkdtemp(prefix="txlog-commit-", dir=args.dir)
    try:
        files = os.path.join(scratch, "files")
        floors = os.path.join(scratch, "floor")
        os.makedirs(files)
        os.makedirs(floors)
        log = Log(os.path.join(scratch, "log"))  # fsync on, the default
        topic = "commits"
        log.create_topic(topic, args.partitions)
        producer = log.producer(transactional_id="commit-latency", **config)
        producer.init_transactions()
        table = transaction_table(args.records, args.partitions, seed=1)
        data = os.urandom(table.column("key").nbytes + table.column("value").nbytes)
        commits, writes, floor = [], [], []
        chain = f"{TXN_DIR}/commit-latency"
        versions_before = len(log.services.storage.list(chain))
        with counting_fsyncs() as fsyncs:
            for n in range(args.warmup + args.commits):
                took_commit = one_commit(producer, topic, table, args.api)
                took_file = one_file(files, data, n)
                took_floor = durable_commit_floor(floors, data, n)
                if n >= args.warmup:
                    commits.append(took_commit)
                    writes.append(took_file)
                    floor.append(took_floor)
            producer.flush()  # the last round's roll-forward
        rounds = args.warmup + args.commits
        paired_fsyncs = (fsyncs[0] - YARDSTICK_FSYNCS * rounds) / rounds
        paired_versions = (len(log.services.storage.list(chain)) - versions_before) / rounds
        back_to_back, b2b_fsyncs = _back_to_back(producer, topic, table, args.api,
                                                 args.back_to_back)
        producer.close()
        expected = (args.warmup + args.commits + args.back_to_back) * args.records
        got = log.read(topic, 0).num_rows
        if got != expected:
            raise AssertionError(f"partition 0 holds {got} committed records, {expected} sent")
        c, f, d = statistics.median(commits), statistics.median(writes), statistics.median(floor)
        ratios = sorted(a / b for a, b in zip(commits, writes, strict=True))
        print(f"local disk, fsync on ({scratch}); {args.records} records x {args.partitions} "
              f"partitions per transaction ({len(data)} B of keys and values), {args.api}; "
              f"median of {args.commits}, after {args.warmup} warm-up rounds")
        print(f"  commit (begin_transaction, sends, commit_transaction)  "
              f"{c * 1000:7.2f} ms   (p10 {_pct(commits, 10)}, p90 {_pct(commits, 90)})")
        print(f"  one small file: create, write {len(data)} B, fsync, close  "
              f"{f * 1000:7.2f} ms   (p10 {_pct(writes, 10)}, p90 {_pct(writes, 90)})")
        print(f"  durable floor: {len(data)} B + a decision, 2 fsyncs + dir fsync  "
              f"{d * 1000:7.2f} ms   (p10 {_pct(floor, 10)}, p90 {_pct(floor, 90)})")
        print(f"  ratio of the medians                                 {c / f:7.2f}   "
              f"(median of the paired ratios {statistics.median(ratios):.2f})")
        print(f"  the durable floor against the one small file        {d / f:7.2f}")
        floor_ratios = sorted(a / b for a, b in zip(commits, floor, strict=True))
        print(f"  the commit against the durable floor                {c / d:7.2f}   "
              f"(median of the paired ratios {statistics.median(floor_ratios):.2f})")
        print(f"  per paired commit, counted: {paired_fsyncs:.1f} fsyncs, "
              f"{paired_versions:.2f} chain versions of the transactional id")
        if back_to_back:
            print(f"  back to back: {args.back_to_back} transactions until the last Complete "
                  f"is durable  {back_to_back:7.1f} tx/s   ({back_to_back * d:.3f} per "
                  f"durable floor); {b2b_fsyncs:.1f} fsyncs per transaction")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _back_to_back(producer: Producer, topic: str, table: pa.Table, api: str, count: int
                  ) -> tuple[float, float]:
    """Transactions per second of ``count`` commits in a row, until the last is complete,
    and the fsyncs per transaction: a count that this disk's changing speed leaves alone
    (every fsync of this process is counted, and only the producer's run meanwhile)."""
    if count < 1:
        return 0.0, 0.0
    with counting_fsyncs() as fsyncs:
        started = time.perf_counter()
        for _ in range(count):
            one_commit(producer, topic, table, api)
        producer.flush()  # the last transaction's roll-forward, if it runs behind the commit
        elapsed = time.perf_counter() - started
    return count / elapsed, fsyncs[0] / count


@contextmanager
def counting_fsyncs() -> Iterator[list[int]]:
    """Every ``os.fsync`` of this process meanwhile, counted in the list's one item."""
    fsyncs, fsync = [0], os.fsync

    def counted(fd: int) -> None:
        fsyncs[0] += 1
        fsync(fd)

    os.fsync = counted
    try:
        yield fsyncs
    finally:
        os.fsync = fsync


def _on_s3(args: argparse.Namespace, config: dict) -> int:
    """Requests and round trips of a commit whose records are claimed, on a latent S3."""
    from scale_out_benchmark import LatentS3

    server = LatentS3(args.s3_latency_ms / 1000).start()
    try:
        log = Log(f"s3://{server.create_bucket()}/log", storage_options=server.storage_options)
        log.create_topic("commits", args.partitions)
        producer = log.producer(transactional_id="commit-latency", **config)
        producer.init_transactions()
        table = transaction_table(args.records, args.partitions, seed=1)

        def requests() -> int:
            with server._tally_lock:
                return sum(c["requests"] for c in server.tally.values())

        commit_requests, commit_s, complete_requests = [], [], []
        for n in range(args.warmup + args.commits):
            producer.begin_transaction()
            # Claimed before the commit: an object store's default send_table leaves the
            # last data object staged for the commit (docs/clients.md), so wait here.
            producer.send_table("commits", table, wait=True)
            before = requests()
            started = time.perf_counter()
            producer.commit_transaction()
            took = time.perf_counter() - started
            at_return = requests()
            producer.flush()  # until the roll-forward's Complete is durable
            if n >= args.warmup:
                commit_requests.append(at_return - before)
                commit_s.append(took)
                complete_requests.append(requests() - before)
        producer.close()
    finally:
        server.stop()
    took_ms = statistics.median(commit_s) * 1000
    print(f"moto S3 at {args.s3_latency_ms:g} ms per request; {args.records} records x "
          f"{args.partitions} partitions per transaction, records claimed before the commit; "
          f"median of {args.commits}, after {args.warmup} warm-up rounds")
    print(f"  commit_transaction: {statistics.median(commit_requests):g} requests, "
          f"{took_ms:.1f} ms = {took_ms / args.s3_latency_ms:.2f} round trips")
    print(f"  requests until Complete is durable: {statistics.median(complete_requests):g}")
    return 0


def _pct(values: list[float], q: int) -> str:
    return f"{np.percentile(values, q) * 1000:.2f}"


if __name__ == "__main__":
    sys.exit(main())
