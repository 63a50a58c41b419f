"""Soak: does one more job cost the same after thousands of jobs as after the first?

    python benchmarks/soak_benchmark.py [--jobs N] [--micro-batches M] [--window W]
        [--root DIR] [--plot soak.png] [--txn-id-expiration-ms MS]
        [--producer-id-expiration-ms MS] [--s3] [--pace-ms MS] [--keyed] [--fsync]
        [--idempotent]

Drives the core the way the Spark writers do (issue 20), in one process:

* a batch job is one ``SharedTransaction`` with ``--attempts`` task attempts
  (default 8), run as the Spark batch writer runs a job without a prefix: it
  leases a pooled prefix, each attempt joins under the id the writer gives it
  (re-used by the slot's next job) and writes ``--records`` records to one
  partition; the driver commits the members it was handed and frees the slot;
* a micro-batch is one batch of a ``StreamSink`` (two attempts), committed
  with its batch id;
* every ``--maintain-every`` jobs (default 50), compaction and gc run as an
  operator would run them (``gc(chain_age_s=0)``, with the expirations given);
* with ``--keyed``, every task writes every partition (as a Spark job with
  keys does); with ``--idempotent``, a job is instead one run of a short-lived
  idempotent producer (a cron job or CLI: one new producer id per run) that
  writes every partition, and there are no micro-batches.

Load-independent counts come first (docs: the issue's "flat bytes"): on the
local backend (``--fsync`` as in production), every storage call is counted,
split into what the jobs write and what maintenance writes.  Per window and
per job: storage operations, bytes written, objects created and deleted, for
jobs and maintenance apart, with wall time beside; at the end, last window
against the second.

For each window of ``--window`` jobs (default 1,000) it prints: job p50 and
p95 and micro-batch p50 (ms), the time a fresh ``Log`` (no caches: what a
new process pays) needs to compute every partition's LSO, the largest
producer state a snapshot would carry (bytes), objects per partition
directory (largest), objects under ``coordinator/``, and the largest
snapshot fields alone (what a fresh reader reads, bytes).  With matplotlib
installed it draws them to ``--plot``; without, it says so and skips it.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import msgpack  # noqa: E402

from txlog import Log, SharedTransaction, StreamSink  # noqa: E402
from txlog.exactly_once.id_pool import DEFAULT_POOL_SIZE, start_pooled_job  # noqa: E402
from txlog.exactly_once.shared_transaction import attempt_key  # noqa: E402
from txlog.admin.gc import MIN_DEAD_AGE_S  # noqa: E402
from txlog.storage.contract import DEFAULT_PART_BYTES  # noqa: E402
from txlog.storage.local import LocalStorage  # noqa: E402

TOPIC = "soak"
TIMEOUT_MS = 60_000


def _files(root: str, *parts: str, storage_options: dict | None = None) -> int:
    """Objects under ``root/parts``: a local directory walked, or an object-store prefix
    listed through fsspec."""
    if "://" not in root:
        return sum(len(files) for _, _, files in os.walk(Path(root, *parts)))
    import fsspec

    fs, path = fsspec.core.url_to_fs("/".join([root.rstrip("/"), *parts]),
                                     **(storage_options or {}))
    return len(fs.find(path)) if fs.exists(path) else 0


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


class CountingStorage(LocalStorage):
    """The local backend, counting what every call costs, by ``phase`` ("jobs",
    "maintenance", or None: not counted): operations per method, bytes written,
    objects created and deleted.  None of it depends on the machine's load."""

    def __init__(self, root: str, fsync: bool) -> None:
        super().__init__(root, fsync=fsync)
        self.phase: str | None = None
        self.counts: dict[str, Counter] = {"jobs": Counter(), "maintenance": Counter()}

    def _count(self, **kinds: int) -> None:
        if self.phase is not None:
            self.counts[self.phase].update(kinds)

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        done = super().publish_if_absent(path, data)
        self._count(ops=1, written=len(data) if done else 0, created=int(done))
        return done

    def publish_stream_if_absent(self, path: str, chunks, size: int,  # noqa: ANN001
                                 part_bytes: int = DEFAULT_PART_BYTES) -> bool:
        done = super().publish_stream_if_absent(path, chunks, size, part_bytes)
        self._count(ops=1, written=size if done else 0, created=int(done))
        return done

    def delete(self, path: str) -> None:
        super().delete(path)
        self._count(ops=1, deleted=1)


def _counted_reads() -> None:
    for name in ("read", "read_prefix", "read_buffer", "read_range", "exists", "list",
                 "list_times"):
        def counted(self, *args, _name=name, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            self._count(ops=1, reads=1)
            return getattr(LocalStorage, _name)(self, *args, **kwargs)
        setattr(CountingStorage, name, counted)


_counted_reads()


def _partition_of(task: int, r: int, partitions: int, keyed: bool) -> int:
    """Keyed: record r of every task goes to partition r (every task writes every
    partition); else a task writes one partition."""
    return (task + r) % partitions if keyed else task % partitions


def run_tasks(log: Log, job: SharedTransaction, attempts: int, records: int, partitions: int,
              next_attempt: int, keyed: bool) -> tuple[list, int]:
    """One job's task attempts, each joining ``job`` under the id the Spark batch writer
    gives it (``attempt_key``: the task's partition and attempt number, re-used by the
    next job of the same pooled prefix): the members to commit, and the attempts so far."""
    members = []
    for task in range(attempts):
        next_attempt += 1
        producer = job.join(log, attempt_key(task, 0))
        for r in range(records):
            producer.send(TOPIC, b"x" * 100, key=b"k%d" % r if keyed else None,
                          partition=_partition_of(task, r, partitions, keyed))
        members.append(producer.prepare_transaction())
        producer.close()
    return members, next_attempt


def batch_job(log: Log, attempts: int, records: int, partitions: int, next_attempt: int,
              keyed: bool = False) -> int:
    """A batch job as the Spark writer runs one without a prefix: a pooled prefix leased
    for the job (exactly_once/id_pool.py), its tasks, the commit, the lease freed."""
    job, lease = start_pooled_job(log, "batch", DEFAULT_POOL_SIZE, TIMEOUT_MS)
    members, next_attempt = run_tasks(log, job, attempts, records, partitions, next_attempt,
                                      keyed)
    job.commit(log, members)
    lease.release(log.services)
    return next_attempt


def idempotent_run(log: Log, records: int, partitions: int) -> None:
    """One run of a short-lived idempotent producer: a new producer id, every partition."""
    producer = log.producer(linger_ms=0)
    for r in range(records * partitions):
        producer.send(TOPIC, b"x" * 100, key=b"k%d" % r, partition=r % partitions)
    producer.flush()
    producer.close()


def micro_batch(log: Log, sink: StreamSink, batch_id: int, records: int, partitions: int,
                next_attempt: int) -> int:
    job = sink.begin_batch()
    members = []
    for task in range(2):
        next_attempt += 1
        producer = job.join(log, f"s{task}-{next_attempt}")
        for _ in range(records):
            producer.send(TOPIC, b"y" * 100, partition=(batch_id + task) % partitions)
        members.append(producer.prepare_transaction())
        producer.close()
    sink.commit_batch(log, job, batch_id, members)
    return next_attempt


def fresh_lso_ms(root: str, partitions: int, storage_options: dict | None) -> float:
    start = time.perf_counter()
    fresh = Log(root, fsync=False, storage_options=storage_options)
    for p in range(partitions):
        fresh.last_stable_offset(TOPIC, p)
    return (time.perf_counter() - start) * 1000


def largest_state(log: Log, partitions: int) -> tuple[int, int]:
    """The largest full snapshot a partition's state makes (fields and every producer
    entry, as a segment holds them), and the largest fields alone (what a reader of the
    log reads: format.md 3.1)."""
    sizes = []
    for p in range(partitions):
        fields, entries = log.partition(TOPIC, p).loaded_state().snapshot_parts(full=True)
        packed = len(msgpack.packb(fields))
        sizes.append((packed + len(entries), packed))
    return max(s[0] for s in sizes), max(s[1] for s in sizes)


COUNTED = ("ops", "reads", "written", "created", "deleted")


def _print_counts(window: tuple[int, dict[str, Counter], float], jobs: int) -> None:
    """Per job over the window: what the jobs and what maintenance cost, and wall time."""
    n, counts, wall = window
    print(f"  counts/job to {n}: " + "; ".join(
        f"{phase} " + " ".join(f"{k} {counts[phase][k] / jobs:,.1f}" for k in COUNTED)
        for phase in ("jobs", "maintenance")) + f"; wall {wall / jobs * 1000:.1f} ms/job",
        flush=True)


def _compare_counts(second: tuple[int, dict[str, Counter], float],
                    last: tuple[int, dict[str, Counter], float]) -> None:
    """The flat-bytes criterion: last window against the second, per kind and phase."""
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.3f}x" if b else ("1.000x" if not a else "inf")

    for phase in ("jobs", "maintenance"):
        print(f"last window / second window, {phase}: " + ", ".join(
            f"{k} {ratio(last[1][phase][k], second[1][phase][k])}" for k in COUNTED))
    print(f"last window / second window, wall: {ratio(last[2], second[2])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--micro-batches", type=int, default=None,
                        help="micro-batches, one after each job while any remain (default: --jobs)")
    parser.add_argument("--attempts", type=int, default=8)
    parser.add_argument("--records", type=int, default=4, help="records per attempt")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--maintain-every", type=int, default=50)
    parser.add_argument("--pace-ms", type=float, default=0.0,
                        help="start a job (and its micro-batch) at most every this many ms: "
                             "a steady arrival rate, so that what the expirations keep (ids "
                             "and producers of the last N seconds) is the same in every "
                             "window; 0 runs them back to back (default)")
    parser.add_argument("--txn-id-expiration-ms", type=int, default=7 * 24 * 3600 * 1000)
    parser.add_argument("--producer-id-expiration-ms", type=int, default=86_400_000)
    parser.add_argument("--root", help="log root (default: a temporary directory, removed)")
    parser.add_argument("--s3", action="store_true",
                        help="put the log on S3: the test suite's moto server, in a process "
                             "of its own (shorten the expirations: moto lists by scanning "
                             "its whole bucket)")
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    parser.add_argument("--keyed", action="store_true",
                        help="every task writes every partition (records are keyed)")
    parser.add_argument("--idempotent", action="store_true",
                        help="a job is one run of a new idempotent producer (no transactions, "
                             "no micro-batches)")
    parser.add_argument("--fsync", action="store_true", help="fsync every publish (local)")
    args = parser.parse_args(argv)
    micro_batches = args.jobs if args.micro_batches is None else args.micro_batches
    if args.idempotent:
        micro_batches = 0

    tmp = None if args.root or args.s3 else tempfile.mkdtemp(prefix="txlog-soak-")
    options = None
    moto = None
    if args.s3:
        harness = Path(__file__).resolve().parent.parent / "tests" / "harness"
        sys.path.insert(0, str(harness))
        from s3_server import MotoS3

        # In a process of its own: moto's ~3 ms of Python per request would otherwise
        # share this process's GIL, and the run would measure the two taking turns.
        moto = subprocess.Popen([sys.executable, str(harness / "s3_server.py")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        server = MotoS3.serving_at(moto.stdout.readline().strip())
        root, options = server.root(), server.storage_options
    else:
        root = args.root or str(Path(tmp) / "log")
    counting = None if args.s3 else CountingStorage(root, args.fsync)
    log = Log(counting if counting is not None else root, fsync=False,
              storage_options=options)
    log.create_topic(TOPIC, args.partitions,
                     {"producer.id.expiration.ms": args.producer_id_expiration_ms})
    sink = StreamSink("stream", TIMEOUT_MS, query_id="soak-query")
    sink.fence(log)
    print(f"root {root}: {args.jobs} jobs of {args.attempts} attempts, {micro_batches} "
          f"micro-batches, maintenance every {args.maintain_every} jobs, "
          f"transactional.id.expiration.ms {args.txn_id_expiration_ms}, "
          f"producer.id.expiration.ms {args.producer_id_expiration_ms}, gc's decision_age_s "
          f"{args.txn_id_expiration_ms / 1000:g} (shared decisions), MIN_DEAD_AGE_S "
          f"{MIN_DEAD_AGE_S:g}; finished job attempts deleted by gc at once; "
          + (f"a job every {args.pace_ms:g} ms at most" if args.pace_ms > 0
             else "jobs back to back"))
    header = ("jobs", "job p50 ms", "job p95 ms", "mb p50 ms", "fresh LSO ms",
              "largest state B", "objects/partition", "coordinator objects",
              "largest fields B")
    print(" | ".join(header))
    rows = []
    counted: list[tuple[int, dict[str, Counter], float]] = []  # per window, and wall s
    window_started = time.perf_counter()
    job_ms: list[float] = []
    mb_ms: list[float] = []
    attempt = 0
    started = next_start = time.perf_counter()
    for n in range(1, args.jobs + 1):
        if args.pace_ms > 0:  # no catching up in bursts: a late job only moves the next one
            time.sleep(max(0.0, next_start - time.perf_counter()))
            next_start = time.perf_counter() + args.pace_ms / 1000
        t0 = time.perf_counter()
        if counting is not None:
            counting.phase = "jobs"
        if args.idempotent:
            idempotent_run(log, args.records, args.partitions)
        else:
            attempt = batch_job(log, args.attempts, args.records, args.partitions, attempt,
                                args.keyed)
        job_ms.append((time.perf_counter() - t0) * 1000)
        if n <= micro_batches:
            t0 = time.perf_counter()
            attempt = micro_batch(log, sink, n - 1, args.records, args.partitions, attempt)
            mb_ms.append((time.perf_counter() - t0) * 1000)
        if counting is not None:
            counting.phase = "maintenance"
        if n % args.maintain_every == 0:
            log.compact(TOPIC)
            # Shared decisions are kept for decision_age_s (Kafka's transactional.id
            # expiration, by default): shortened with the ids' expiration.
            log.gc(chain_age_s=0, temp_age_s=0, txn_id_expiration_ms=args.txn_id_expiration_ms,
                   decision_age_s=args.txn_id_expiration_ms / 1000)
        if counting is not None:
            counting.phase = None
        if n % args.window == 0:
            if counting is not None:
                counted.append((n, {k: Counter(v) for k, v in counting.counts.items()},
                                time.perf_counter() - window_started))
                for c in counting.counts.values():
                    c.clear()
                _print_counts(counted[-1], args.window)
            state_bytes, fields_bytes = largest_state(log, args.partitions)
            row = (n, statistics.median(job_ms), _pct(job_ms, 0.95),
                   statistics.median(mb_ms) if mb_ms else float("nan"),
                   fresh_lso_ms(root, args.partitions, options), state_bytes,
                   max(_files(root, "topics", TOPIC, str(p), storage_options=options)
                       for p in range(args.partitions)),
                   _files(root, "coordinator", storage_options=options), fields_bytes)
            rows.append(row)
            print(f"{row[0]} | {row[1]:.1f} | {row[2]:.1f} | {row[3]:.1f} | {row[4]:.1f} | "
                  f"{row[5]} | {row[6]} | {row[7]} | {row[8]}", flush=True)
            job_ms, mb_ms = [], []
            window_started = time.perf_counter()
    print(f"total {time.perf_counter() - started:.0f} s")
    if len(counted) >= 3:
        _compare_counts(counted[1], counted[-1])
    if len(rows) >= 3:
        second, last = rows[1], rows[-1]
        print("last window / second window: " + ", ".join(
            f"{name} {last[i] / second[i]:.2f}x" for i, name in
            ((1, "job p50"), (3, "micro-batch p50"), (4, "fresh LSO"), (5, "largest state"))))
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is not installed: no plot")
        else:
            fig, axes = plt.subplots(2, 2, figsize=(10, 7))
            x = [r[0] for r in rows]
            for ax, (cols, title) in zip(axes.flat, [((1, 2, 3), "ms per job / micro-batch"),
                                                     ((4,), "fresh-process LSO, ms"),
                                                     ((5, 8), "largest producer state, bytes"),
                                                     ((6, 7), "objects")]):
                for c in cols:
                    ax.plot(x, [r[c] for r in rows], marker="o", label=header[c])
                ax.set_title(title)
                ax.set_xlabel("jobs")
                ax.set_ylim(bottom=0)
                ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(args.plot)
            print(f"plot: {args.plot}")
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    if moto is not None:
        moto.stdin.close()
        moto.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
