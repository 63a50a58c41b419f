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
S3's latency and is not reported by those sections.

**The write against Parquet** (``--write-mb``, issue 32): a Python user's write
with the core's defaults (a ``Log``, a transactional producer, one
``send_table`` of the whole table, the flush a commit begins with, then the
commit), against ``pyarrow.parquet.write_table`` of the same table through
s3fs, on moto with ``--latency-ms`` added to every request (the scale-out
benchmark's store, its waits overlapping).  Each side runs in a fresh process
of its own, the two taking turns, ``--repeats`` times; the table is
``--dataset`` (bench_datasets.py, incompressible by default) and both sides
write it with their default codec (zstd for txlog, snappy for Parquet).  It
prints each side's rate, the ratio (each run's pair, and their median), and
the txlog task's requests per phase, counted at the server by the time they
arrive, split at the instants the task marks between its phases:

* ``open``: ``Log(root)`` (the root's metadata, the probe's remembered verdict);
* ``init``: the producer, ``init_transactions`` and ``begin_transaction``;
* ``send``: ``send_table`` (AddPartitionsToTxn, data objects written by it or behind);
* ``flush``: ``flush()``, what ``commit_transaction`` writes before deciding
  (the task ends here: "from opening the Log to prepare");
* ``commit``: ``commit_transaction`` (reported apart, outside the task's figures).

    python benchmarks/object_store_requests.py [--batches N] [--end-batches N] [--micro-batches N]
        [--only counts|write] [--write-mb 64] [--latency-ms 25] [--repeats 5]
        [--dataset incompressible] [--producer-option KEY=VALUE]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
from bench_datasets import DATASETS, dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

from producer_options import producer_options  # noqa: E402
from s3_server import MotoS3  # noqa: E402
from scale_out_benchmark import TAG, LatentS3  # noqa: E402
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


# --- a Python user's write against Parquet's, at object-store latency (issue 32) ------------

MIB = 1 << 20
WRITE_PHASES = ("open", "init", "send", "flush", "commit")
TASK_PHASES = WRITE_PHASES[:-1]  # from opening the Log to the prepare (the flush)


class TimedS3(LatentS3):
    """The scale-out benchmark's latent moto, keeping when each tagged request arrived
    (``time.monotonic``, one clock for every process on Linux), so that a child's
    requests can be split at the instants it marks between its phases."""

    def __init__(self, latency_s: float) -> None:
        super().__init__(latency_s)
        self.arrivals: list[tuple[float, str, str, str]] = []  # (time, tag, kind, path)
        self._arrivals_lock = threading.Lock()

    def _handle(self, moto_app: Callable, environ: dict,
                start_response: Callable) -> Iterable[bytes]:
        arrived = time.monotonic()
        agent = environ.get("HTTP_USER_AGENT", "")
        if TAG in agent:
            from s3_server import request_kind

            path, query = environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")
            kind = request_kind(environ["REQUEST_METHOD"], path, query)
            tag = agent.split(TAG, 1)[1].split()[0]
            with self._arrivals_lock:
                self.arrivals.append((arrived, tag, kind, f"{path}?{query}" if query else path))
        return super()._handle(moto_app, environ, start_response)

    def arrived(self, tag: str) -> list[tuple[float, str, str]]:
        """(time, kind, path) of every request of ``tag``, which are forgotten here."""
        with self._arrivals_lock:
            mine = [(t, k, p) for t, g, k, p in self.arrivals if g == tag]
            self.arrivals = [a for a in self.arrivals if a[1] != tag]
        return mine


def write_task(spec: dict[str, Any], out: Any) -> None:
    """A Python user's transactional write of the whole table (a child process): the
    instants between phases, and the time from opening the Log to the end of the flush."""
    try:
        # Imported before the clock starts, as Parquet's side does: a process pays for
        # s3fs's import (about 0.25 s) once, and neither write should be timed with it.
        import s3fs  # noqa: F401

        table = dataset(spec["dataset"], spec["records"], spec["seed"])
        marks = [time.monotonic()]
        log = Log(spec["root"], storage_options=spec["storage_options"], create=False)
        marks.append(time.monotonic())
        producer = log.producer(transactional_id=f"user-{uuid.uuid4().hex[:8]}",
                                **spec["producer_config"])
        producer.init_transactions()
        producer.begin_transaction()
        marks.append(time.monotonic())
        producer.send_table(spec["topic"], table)
        marks.append(time.monotonic())
        producer.flush()
        marks.append(time.monotonic())
        producer.commit_transaction()
        marks.append(time.monotonic())
        producer.close()
        out.put({"marks": marks, "elapsed": marks[4] - marks[0]})
    except BaseException:
        out.put({"error": traceback.format_exc()})


def parquet_task(spec: dict[str, Any], out: Any) -> None:
    """``pyarrow.parquet.write_table`` of the same table through s3fs (a child process)."""
    try:
        import pyarrow.parquet as pq
        import s3fs

        table = dataset(spec["dataset"], spec["records"], spec["seed"])
        began = time.monotonic()
        fs = s3fs.S3FileSystem(**spec["storage_options"])
        pq.write_table(table, spec["path"], filesystem=fs)
        out.put({"elapsed": time.monotonic() - began})
    except BaseException:
        out.put({"error": traceback.format_exc()})


def in_child(target: Callable[[dict[str, Any], Any], None], spec: dict[str, Any]
             ) -> dict[str, Any]:
    """``target(spec, queue)`` in a fresh process (spawned: the server's threads make
    fork unsafe); its result, or its traceback raised."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(spec, out), daemon=True)
    proc.start()
    result = out.get(timeout=1800)
    proc.join()
    if "error" in result:
        raise RuntimeError(f"{target.__name__} failed:\n{result['error']}")
    return result


def phase_of(at: float, marks: list[float]) -> str:
    """The phase in which a request that arrived at ``at`` was sent (a data object written
    behind counts where its request went out; the close after the commit with it)."""
    return next((phase for phase, end in zip(WRITE_PHASES, marks[1:], strict=True)
                 if at < end), WRITE_PHASES[-1])


def phase_counts(arrivals: list[tuple[float, str, str]], marks: list[float]
                 ) -> dict[str, Counter]:
    """The requests of each phase, by kind."""
    counts: dict[str, Counter] = {phase: Counter() for phase in WRITE_PHASES}
    for at, kind, _ in arrivals:
        counts[phase_of(at, marks)][kind] += 1
    return counts


def write_vs_parquet(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--repeats`` pairs of a Python user's write and Parquet's, each side in a fresh
    process, on moto at ``--latency-ms``; prints the figures and returns each pair's."""
    server = TimedS3(args.latency_ms / 1000).start()
    try:
        bucket = server.create_bucket()
        root = f"s3://{bucket}/log"
        setup = Log(root, storage_options=server.storage_options)  # uncounted: the probe
        sample = dataset(args.dataset, 1000, 0)
        row_bytes = sum(c.nbytes for c in sample.columns) / sample.num_rows
        records = int(args.write_mb * MIB // row_bytes)
        pairs = []
        for r in range(args.repeats):
            topic = f"w{r}"
            setup.create_topic(topic, args.partitions)
            spec = {"dataset": args.dataset, "records": records, "seed": r, "root": root,
                    "topic": topic, "producer_config": args.producer_config}
            ours = in_child(write_task, spec | {
                "storage_options": server.tagged_options("user")})
            theirs = in_child(parquet_task, spec | {
                "path": f"{bucket}/parquet/w{r}.parquet",
                "storage_options": server.tagged_options("parquet")})
            arrivals = server.arrived("user")
            if args.trace_requests and r == 0:
                print(f"the first write's {len(arrivals)} requests, in order:")
                for at, kind, path in sorted(arrivals):
                    print(f"  {phase_of(at, ours['marks']):<7} {kind:<7} {path}")
            pairs.append({"txlog": ours["elapsed"], "parquet": theirs["elapsed"],
                          "phases": phase_counts(arrivals, ours["marks"]),
                          "parquet_requests": len(server.arrived("parquet"))})
            server.take("")
        print_write_vs_parquet(args, records * row_bytes / MIB, pairs)
        return pairs
    finally:
        server.stop()


def print_write_vs_parquet(args: argparse.Namespace, mb: float,
                           pairs: list[dict[str, Any]]) -> None:
    ratios = [p["parquet"] / p["txlog"] for p in pairs]
    task = [sum(sum(p["phases"][ph].values()) for ph in TASK_PHASES) for p in pairs]
    print(f"== a Python user's write of {mb:.1f} MiB of {args.dataset} into "
          f"{args.partitions} partitions, S3 (moto) at {args.latency_ms:g} ms per request, "
          f"{len(pairs)} pairs; producer options {args.producer_config or '(defaults)'}")
    for side, label in (("txlog", "txlog (Log .. flush)"), ("parquet", "Parquet through s3fs")):
        seconds = [p[side] for p in pairs]
        print(f"  {label:<22} {statistics.median(mb / s for s in seconds):8.2f} MB/s   "
              f"runs {', '.join(f'{s:.2f} s' for s in seconds)}")
    print(f"  ratio txlog/Parquet    {statistics.median(ratios):8.3f}        "
          f"runs {', '.join(f'{x:.3f}' for x in ratios)}")
    print(f"  task requests          {statistics.median(task):8.0f}        runs "
          f"{', '.join(str(t) for t in task)}; Parquet's "
          f"{statistics.median(p['parquet_requests'] for p in pairs):.0f}")
    for phase in WRITE_PHASES:
        counts = [p["phases"][phase] for p in pairs]
        kinds = sorted(set().union(*counts))
        print(f"    {phase:<8} {statistics.median(sum(c.values()) for c in counts):5.0f}   "
              + ", ".join(f"{k} {statistics.median(c[k] for c in counts):g}" for k in kinds)
              + ("   (after prepare: not in the task's count)" if phase == "commit" else ""))


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
    parser.add_argument("--only", choices=("counts", "write"),
                        help="run one part only: the request counts above, or the write "
                             "against Parquet")
    parser.add_argument("--write-mb", type=int, default=64,
                        help="MiB a Python user writes, against Parquet (default 64; 0 skips)")
    parser.add_argument("--latency-ms", type=float, default=25.0,
                        help="latency added to every request of the write (default 25)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="pairs of writes, txlog's and Parquet's (default 5)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of the written topic (default 4)")
    parser.add_argument("--dataset", choices=DATASETS, default="incompressible",
                        help="the rows written (bench_datasets.py; default incompressible)")
    parser.add_argument("--producer-option", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to the writer's producer (repeatable); none: the core's "
                             "defaults")
    parser.add_argument("--trace-requests", action="store_true",
                        help="print the first write's requests in order, with phase and path")
    args = parser.parse_args(argv)
    args.producer_config = producer_options(args.producer_option, parser,
                                            reserved=("log", "transactional_id"))
    if args.write_mb < 0 or args.repeats < 1 or args.partitions < 1 or args.latency_ms < 0:
        parser.error("--write-mb and --latency-ms must not be negative, --repeats and "
                     "--partitions must be at least 1")
    if args.batches < 1:
        parser.error("--batches must be at least 1")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if any(s < 1 for s in sizes):
        parser.error("--sizes must be positive")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    if args.only != "counts" and args.write_mb:
        write_vs_parquet(args)
    if args.only == "write":
        return 0
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
