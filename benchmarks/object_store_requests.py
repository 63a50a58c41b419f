"""Object-store requests per 1,000 records: what a txlog root on S3 costs in billed requests.

An object store bills per request (PUT/LIST an order of magnitude above
GET/HEAD), so the figure that matters is requests per record, not seconds.
This starts moto's S3 server in this process (tests/harness/s3_server.py, the one the
tests use), counts every request it receives by kind, and for producer
batches of 100, 10,000 and 100,000 records:

1. writes ``--batches`` batches to a one-partition topic with an idempotent
   producer (``send_table``, one batch per call), in a fresh ``Log``;
2. reads the partition back whole (``log.read``) in another fresh ``Log``, as a
   new process would.

and prints PUT/GET/HEAD/LIST/DELETE counts per 1,000 records for each phase.
Then it builds a partition of ``--end-batches`` small batches and counts what
a fresh ``Log`` needs to find the partition's end
(``Log(root).partition(t, p).end_offset()``).

Last, it runs a stream-like job (``--micro-batches``): per micro-batch two
tasks, each joining the batch's shared transaction and writing to a
4-partition topic, once with a new ``Log`` per task and once with the
worker's kept ``Log`` (spark/worker_logs.py), and prints requests per
micro-batch.

Counting happens in the server, so it covers everything the client sends
(s3fs's own lookups and retries included).  Timing on moto says nothing about
S3's latency and is not reported.

    python benchmarks/object_store_requests.py [--batches N] [--end-batches N] [--micro-batches N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

from s3_server import MotoS3  # noqa: E402
from txlog import Log  # noqa: E402

KINDS = ("PUT", "GET", "HEAD", "LIST", "DELETE")
VALUE_SIZE = 20  # bytes: request counts depend on batches, not on bytes


def table(records: int, start: int) -> pa.Table:
    values = [b"%019d" % i + b"x" for i in range(start, start + records)]
    return pa.table({"value": pa.array(values, pa.binary())})


def counted(server: MotoS3, action) -> dict[str, int]:
    server.reset_counts()
    action()
    return {k: server.counts.get(k, 0) for k in KINDS} | \
        {k: v for k, v in server.counts.items() if k not in KINDS}


def per_thousand(counts: dict[str, int], records: int) -> str:
    return "  ".join(f"{k} {1000 * counts.get(k, 0) / records:9.3f}" for k in KINDS)


def write_and_read(server: MotoS3, batch: int, batches: int) -> None:
    root = f"s3://{server.create_bucket()}/log"
    options = server.storage_options
    Log(root, storage_options=options).create_topic("t", 1)
    total = batch * batches

    def write() -> None:
        log = Log(root, storage_options=options)
        with log.producer(batch_size=1 << 30, linger_ms=10**9) as producer:
            for b in range(batches):
                producer.send_table("t", table(batch, b * batch), partition=0)

    def read() -> None:
        got = Log(root, storage_options=options).read("t", 0)
        assert got.num_rows == total, (got.num_rows, total)

    w = counted(server, write)
    r = counted(server, read)
    print(f"batches of {batch:>7,} records, {batches} batches ({total:,} records)")
    print(f"  write, per 1,000 records: {per_thousand(w, total)}   (totals {w})")
    print(f"  read,  per 1,000 records: {per_thousand(r, total)}   (totals {r})")


def end_offset_cost(server: MotoS3, batches: int) -> None:
    """Requests a fresh process needs to learn a long partition's end offset."""
    root = f"s3://{server.create_bucket()}/log"
    options = server.storage_options
    log = Log(root, storage_options=options)
    log.create_topic("t", 1)
    started = time.monotonic()
    with log.producer(linger_ms=10**9) as producer:
        for b in range(batches):
            producer.send("t", b"%d" % b, partition=0)
            producer.flush()
    built = time.monotonic() - started
    server.recording = True
    fresh = counted(server, lambda: Log(root, storage_options=options).partition("t", 0)
                    .end_offset())
    server.recording = False
    lists = [target for kind, target in server.log if kind == "LIST"]
    server.recording = True
    tail = counted(server, lambda: Log(root, storage_options=options).read(
        "t", 0, start=batches - 10))
    server.recording = False
    tail_lists = [target for kind, target in server.log if kind == "LIST"]
    again = Log(root, storage_options=options)
    again.partition("t", 0).end_offset()
    server.reset_counts()
    again.partition("t", 0).end_offset()
    warm = {k: v for k, v in server.counts.items()}
    print(f"end offset of a partition of {batches:,} batches (built in {built:.0f} s):")
    print(f"  fresh Log: {fresh}")
    print(f"  its listings: {lists}")
    print(f"  the same Log asked again: {warm}")
    print(f"  a fresh Log reading the last 10 records: {tail}")
    print(f"  its listings: {tail_lists}")


def micro_batch_requests(server: MotoS3, kept: bool, micro_batches: int,
                         partitions: int = 4, records: int = 2000) -> list[int]:
    """Requests of each micro-batch of a stream-like job in a new root: two tasks, each
    joining the batch's shared transaction and writing ``records`` keyed records, with a
    new ``Log`` per task (how the Spark writer ran before) or the worker's kept one
    (spark/worker_logs.py, what it runs now).  The driver's commit is not counted."""
    import numpy as np

    from txlog.exactly_once.shared_transaction import SharedTransaction
    from txlog.spark.worker_logs import worker_log

    rng = np.random.default_rng(0)
    table = pa.table({"key": pa.array([rng.bytes(8) for _ in range(records)], pa.binary()),
                      "value": pa.array([b"v" * 100] * records, pa.binary())})
    options = server.storage_options
    root = f"s3://{server.create_bucket()}/log"
    driver = Log(root, storage_options=options)
    driver.create_topic("t", partitions)
    counts = []
    for b in range(micro_batches):
        job = SharedTransaction.start(driver, "q", 60_000)
        server.reset_counts()
        members = []
        for task in range(2):
            log = worker_log(root, options, create=False) if kept else \
                Log(root, storage_options=options, create=False)
            with job.keep_alive(log):
                producer = job.join(log, f"{b}-{task}")
                try:
                    producer.send_table("t", table, wait=False)
                    members.append(producer.prepare_transaction())
                finally:
                    producer.close()
        counts.append(sum(server.counts.values()))
        job.commit(driver, members)
    written = sum(driver.read("t", p).num_rows for p in range(partitions))
    if written != 2 * records * micro_batches:
        raise AssertionError(f"read {written} records, {2 * records * micro_batches} written")
    return counts


def micro_batch_tasks(server: MotoS3, micro_batches: int) -> None:
    import numpy as np

    for kept in (False, True):
        counts = micro_batch_requests(server, kept, micro_batches)
        every = max(1, micro_batches // 10)
        where = "the worker's kept Log" if kept else "a new Log per task"
        print(f"micro-batches of two tasks, {where}: median {int(np.median(counts))} "
              f"requests, max {max(counts)}; every {every}th: {counts[::every]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20,
                        help="batches written per batch size (default 20)")
    parser.add_argument("--sizes", default="100,10000,100000",
                        help="records per batch, comma-separated (default 100,10000,100000)")
    parser.add_argument("--end-batches", type=int, default=2500,
                        help="batches in the partition whose end a fresh Log looks up "
                             "(default 2500: three listing pages); 0 skips it")
    parser.add_argument("--micro-batches", type=int, default=100,
                        help="micro-batches of the stream-like job, with a new Log per task "
                             "and with the worker's (default 100); 0 skips it")
    args = parser.parse_args(argv)
    if args.batches < 1:
        parser.error("--batches must be at least 1")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if any(s < 1 for s in sizes):
        parser.error("--sizes must be positive")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    server = MotoS3().start()
    try:
        for size in sizes:
            write_and_read(server, size, args.batches)
        if args.end_batches:
            end_offset_cost(server, args.end_batches)
        if args.micro_batches:
            micro_batch_tasks(server, args.micro_batches)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
