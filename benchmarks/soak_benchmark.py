"""Soak: does one more job cost the same after thousands of jobs as after the first?

    python benchmarks/soak_benchmark.py [--jobs N] [--micro-batches M] [--window W]
        [--root DIR] [--plot soak.png] [--txn-id-expiration-ms MS]
        [--producer-id-expiration-ms MS] [--s3] [--pace-ms MS]

Drives the core the way the Spark writers do (issue 20), in one process:

* a batch job is one ``SharedTransaction`` with ``--attempts`` task attempts
  (default 8), each joining with a fresh attempt id (ids keep growing, as in
  a long-lived application) and writing ``--records`` records to one
  partition; the driver commits the members it was handed;
* a micro-batch is one batch of a ``StreamSink`` (two attempts), committed
  with its batch id;
* every ``--maintain-every`` jobs (default 50), compaction and gc run as an
  operator would run them (``gc(chain_age_s=0)``, with the expirations given).

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
from txlog.admin.gc import MIN_DEAD_AGE_S  # noqa: E402

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


def batch_job(log: Log, attempts: int, records: int, partitions: int, next_attempt: int) -> int:
    job = SharedTransaction.start(log, "batch", TIMEOUT_MS)
    members = []
    for task in range(attempts):
        next_attempt += 1
        producer = job.join(log, f"{task}-{next_attempt}")
        for r in range(records):
            producer.send(TOPIC, b"x" * 100, partition=task % partitions)
        members.append(producer.prepare_transaction())
        producer.close()
    job.commit(log, members)
    return next_attempt


def micro_batch(log: Log, sink: StreamSink, batch_id: int, records: int, partitions: int,
                next_attempt: int) -> int:
    job = sink.begin_batch()
    members = []
    for task in range(2):
        next_attempt += 1
        producer = job.join(log, f"s{task}-{next_attempt}")
        for r in range(records):
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
    """The largest snapshot a partition's state makes (fields and producer entries, as a
    snapshot file holds them), and the largest fields alone (what a reader of the log
    reads: format.md 3.1)."""
    sizes = []
    for p in range(partitions):
        fields, entries = log.partition(TOPIC, p).state().snapshot_parts()
        packed = len(msgpack.packb(fields))
        sizes.append((packed + len(entries), packed))
    return max(s[0] for s in sizes), max(s[1] for s in sizes)


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
    args = parser.parse_args(argv)
    micro_batches = args.jobs if args.micro_batches is None else args.micro_batches

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
    log = Log(root, fsync=False, storage_options=options)
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
    job_ms: list[float] = []
    mb_ms: list[float] = []
    attempt = 0
    started = next_start = time.perf_counter()
    for n in range(1, args.jobs + 1):
        if args.pace_ms > 0:  # no catching up in bursts: a late job only moves the next one
            time.sleep(max(0.0, next_start - time.perf_counter()))
            next_start = time.perf_counter() + args.pace_ms / 1000
        t0 = time.perf_counter()
        attempt = batch_job(log, args.attempts, args.records, args.partitions, attempt)
        job_ms.append((time.perf_counter() - t0) * 1000)
        if n <= micro_batches:
            t0 = time.perf_counter()
            attempt = micro_batch(log, sink, n - 1, args.records, args.partitions, attempt)
            mb_ms.append((time.perf_counter() - t0) * 1000)
        if n % args.maintain_every == 0:
            log.compact(TOPIC)
            # Shared decisions are kept for decision_age_s (Kafka's transactional.id
            # expiration, by default): shortened with the ids' expiration.
            log.gc(chain_age_s=0, temp_age_s=0, txn_id_expiration_ms=args.txn_id_expiration_ms,
                   decision_age_s=args.txn_id_expiration_ms / 1000)
        if n % args.window == 0:
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
    print(f"total {time.perf_counter() - started:.0f} s")
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
