"""Scale-out benchmark (issue 19): exactly-once writes and fresh reads at object-store latency.

The core is driven as the Spark batch writer drives it (txlog/spark/writer.py),
through the public API only: the driver starts one ``SharedTransaction`` per
job; each task is its own process that opens a ``Log``, keeps the job's lease
alive, joins with its own transactional producer, sends its rows with
``send_table`` in Spark-sized Arrow batches (10,000 rows, merged up to four
producer batches, each sent in a thread while the next is cut, as the writer
does) and calls ``prepare_transaction``; the driver then commits the members
once.  ``--producer-option key=value`` (repeatable) is passed to
``Producer(...)`` as the Spark writer passes its options, so the same script
measures a write path with other knobs.  ``--dataset`` (bench_datasets.py)
chooses the rows: ``incompressible`` by default (8-byte keys, 1,000-byte random
values), ``events`` or ``hex``.

**The store.**  The test suite's moto S3 endpoint (tests/harness/s3_server.py) runs
in this process.  Every request waits ``--latency-ms`` (default 25 ms, about
a regional S3's first-byte latency) before moto handles it; the waits of
concurrent requests overlap, as on S3, and no lock is held during them.
Conditional writes (``If-None-Match`` / ``If-Match``) are serialised around
moto's own check-then-store, which moto does not lock.  So are moto's other
mutations and its listings, only for moto's in-process work after the wait:
moto's key store is a plain dict, and a LIST iterating it while a DELETE or
PUT of another key changes it fails with a KeyError (500, seen in a first
run with 8 writers), which a real store never answers.  GETs and HEADs run
concurrently.  moto handles every request in Python under one GIL, so the
lock costs no parallelism the server had.

**How requests are counted.**  Server-side, per client: every process of the
benchmark opens its store with botocore's ``user_agent_extra`` set to a tag
(``txlogbench-task-3``, ``txlogbench-parquet-write``, ...), and the server
counts requests, uploaded bytes (the Content-Length of PUT and POST bodies),
conditional writes and their 412 answers (a write that lost) per tag.  A
task's figures are therefore exactly what its process sent, from opening its ``Log`` to
``prepare_transaction`` (the task does nothing else); the driver's start and
commit are untagged and not counted.  Retries made by botocore are separate
HTTP requests and are counted.  Every process's first ``Log`` of a root
probes that the store honours conditional writes (two conditional PUTs of one
name, the second refused by design, and a DELETE): that probe is counted, and
its refusal is one of the "conditional writes lost".

**What it prints** (``--mb`` MiB of ``--record-bytes`` records with 8-byte
random keys, so Kafka's partitioner spreads every task's rows over all
``--partitions``; MB here means MiB; each figure a median over ``--repeats``):

* one task's exactly-once write rate against a Parquet write of the same
  table (uncompressed, like the log) through s3fs, in a fresh process each,
  the two taking turns; the ratio; the task's requests per MB;
* bytes uploaded against the payload with 1, 8 and 32 writer processes
  (``--writers``) on the same topic layout, sharing the payload (each writes
  ``mb / writers``), all in one job; requests per MB and lost conditional
  writes;
* a fresh reader's rate (a new process: ``Log(...)`` then ``log.read`` of the
  whole partition) on a partition holding the whole payload, against
  ``pyarrow.parquet.read_table`` of the same table through s3fs;
* on local disk (fsync on), the contention figures with ``--local-writers``
  processes as bytes written (``/proc/<pid>/io`` wchar of each task process,
  from opening its Log to prepare_transaction) against the payload.

Times are taken in the task processes, from opening the ``Log`` (or the
s3fs filesystem) to the end; process start, imports and generating the
payload are outside.  Each job is checked afterwards (every record committed
once) unless ``--no-verify``.  The script prints; it does not judge.

    python benchmarks/scale_out_benchmark.py [--mb 64] [--repeats 3] [--latency-ms 25]
        [--writers 1,8,32] [--local-writers 1,16] [--producer-option batch_size=1048576]
        [--dataset incompressible]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import multiprocessing as mp
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bench_datasets import DATASETS, dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

from producer_options import producer_options  # noqa: E402
from s3_server import MotoS3, request_kind  # noqa: E402
from txlog import Log, Producer, SharedTransaction  # noqa: E402
from txlog.clients.producer import DEFAULT_COMPRESSION  # noqa: E402

MIB = 1 << 20
SPARK_BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
COALESCE_BATCHES = 4  # txlog.spark.writer merges Spark's batches up to 4 producer batches
TIMEOUT_MS = 600_000  # long enough that no job expires during a slow run
TAG = "txlogbench-"
_TAG_RE = re.compile(re.escape(TAG) + r"([A-Za-z0-9_.-]+)")


# --- the store -----------------------------------------------------------------------------


class LatentS3(MotoS3):
    """moto's S3 with a per-request latency, waits overlapping, counts per tag."""

    def __init__(self, latency_s: float) -> None:
        super().__init__()
        self.latency_s = latency_s
        self.serialise_writes = False  # replaced by the lock below, taken after the wait
        self._exclusive = threading.Lock()
        self._tally_lock = threading.Lock()
        self.tally: dict[str, Counter[str]] = {}
        # --trace-requests: every request of the tags starting with this, in order.
        self.trace_prefix: str | None = None
        self.trace: list[tuple[str, str, str]] = []

    def _handle(self, moto_app: Callable, environ: dict,
                start_response: Callable) -> Iterable[bytes]:
        if self.latency_s:
            time.sleep(self.latency_s)  # overlaps with other requests' waits
        found = _TAG_RE.search(environ.get("HTTP_USER_AGENT", ""))
        tag = found.group(1) if found else ""
        method = environ["REQUEST_METHOD"]
        kind = request_kind(method, environ.get("PATH_INFO", ""),
                            environ.get("QUERY_STRING", ""))
        writing = method in ("PUT", "POST")
        # s3fs also sends If-Match on ranged GETs (the file must not change under it):
        # only writes count as conditional here.
        conditional = writing and ("HTTP_IF_NONE_MATCH" in environ or
                                   "HTTP_IF_MATCH" in environ)
        with self._tally_lock:
            counts = self.tally.setdefault(tag, Counter())
            counts[kind] += 1
            counts["requests"] += 1
            if writing:
                counts["uploaded"] += int(environ.get("CONTENT_LENGTH") or 0)
            if conditional:
                counts["conditional"] += 1
            if self.trace_prefix is not None and tag.startswith(self.trace_prefix):
                query = environ.get("QUERY_STRING", "")
                self.trace.append((kind, environ.get("PATH_INFO", ""),
                                   f"?{query}" if query else ""))

        def answer(status: str, headers: list, *rest: Any) -> Any:
            if conditional and status.startswith("412"):
                with self._tally_lock:
                    counts["lost"] += 1
            return start_response(status, headers, *rest)

        if writing or method == "DELETE" or kind == "LIST":
            with self._exclusive:  # see the module docstring: moto's store is not thread-safe
                return super()._handle(moto_app, environ, answer)
        return super()._handle(moto_app, environ, answer)

    def take(self, prefix: str) -> Counter[str]:
        """The counts of every tag starting with ``prefix``, summed, and those tags cleared."""
        total: Counter[str] = Counter()
        with self._tally_lock:
            for tag in [t for t in self.tally if t.startswith(prefix)]:
                total.update(self.tally.pop(tag))
        return total

    def print_trace(self, whose: str) -> None:
        """Print the requests traced since ``trace_prefix`` was set, and stop tracing."""
        if self.trace_prefix is None:
            return
        print(f"{whose} {len(self.trace)} requests, in order:")
        for kind, path, query in self.trace:
            print(f"  {kind:<7} {path}{query}")
        print()
        self.trace_prefix = None

    def tagged_options(self, tag: str) -> dict[str, Any]:
        return self.storage_options | {"config_kwargs": {"user_agent_extra": TAG + tag}}


# --- the payload and the Spark writer's way of sending it ------------------------------------


def payload(name: str, records: int, seed: int) -> pa.Table:
    """The dataset's keys and values (what the Spark benchmark's DataFrame holds)."""
    return dataset(name, records, seed).select(["key", "value"])


def record_bytes(name: str) -> int:
    """Key and value bytes of an average record of the dataset (from 10,000 of them)."""
    sample = payload(name, 10_000, 0)
    total = sum(pc.sum(pc.binary_length(sample.column(c))).as_py() for c in ("key", "value"))
    return round(total / sample.num_rows)


def _coalesced(batches: Iterable[pa.RecordBatch], target: int) -> Iterator[pa.Table]:
    """Spark's batches gathered up to ``target`` bytes as chunks of one table, as
    txlog.spark.writer does."""
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        held.append(batch)
        size += batch.nbytes
        if size >= target:
            yield pa.Table.from_batches(held)
            held, size = [], 0
    if held:
        yield pa.Table.from_batches(held)


def send_like_spark(producer: Producer, topic: str, table: pa.Table) -> None:
    """The Spark writer's task loop: send one merged batch in a thread while cutting the next."""
    batches = table.to_batches(max_chunksize=SPARK_BATCH_ROWS)
    send = producer.send_table
    if "wait" in inspect.signature(send).parameters:
        # Data objects (issue 19): the writer stages each send until a data object's
        # worth has gathered; prepare_transaction writes the rest.
        send = functools.partial(send, wait=False)
    with ThreadPoolExecutor(1, thread_name_prefix="txlog-send") as sender:
        sending: Future[Any] | None = None
        for batch in _coalesced(batches, COALESCE_BATCHES * producer.batch_size):
            if sending is not None:
                sending.result()
            sending = sender.submit(send, topic, batch)
        if sending is not None:
            sending.result()


def _wchar() -> int | None:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


# --- what runs in the child processes ---------------------------------------------------------


def _child(role: str, spec: dict[str, Any], ready: Any, start: Any, out: Any) -> None:
    try:
        table = payload(spec["dataset"], spec["records"], spec["seed"])
        ready.put(spec["index"])
        start.wait()
        before = _wchar()
        began = time.perf_counter()
        result: dict[str, Any] = {"index": spec["index"]}
        if role == "task":
            log = Log(spec["root"], storage_options=spec["storage_options"])
            job: SharedTransaction = spec["job"]
            with job.keep_alive(log):
                producer = job.join(log, f"task-{spec['index']}", **spec["producer_config"])
                send_like_spark(producer, spec["topic"], table)
                result["member"] = producer.prepare_transaction()
        elif role == "parquet-write":
            import pyarrow.parquet as pq
            import s3fs

            fs = s3fs.S3FileSystem(**spec["storage_options"])
            pq.write_table(table, spec["path"], filesystem=fs, compression="none")
        elif role == "reader":
            log = Log(spec["root"], storage_options=spec["storage_options"])
            got = log.read(spec["topic"], 0)
            if got.num_rows != spec["records"]:
                raise AssertionError(f"read {got.num_rows} records, {spec['records']} written")
        elif role == "parquet-read":
            import pyarrow.parquet as pq
            import s3fs

            fs = s3fs.S3FileSystem(**spec["storage_options"])
            got = pq.read_table(spec["path"], filesystem=fs)
            if got.num_rows != spec["records"]:
                raise AssertionError(f"read {got.num_rows} rows, {spec['records']} written")
        else:
            raise ValueError(role)
        result["elapsed"] = time.perf_counter() - began
        after = _wchar()
        result["wchar"] = None if before is None or after is None else after - before
        out.put(result)
    except BaseException:
        ready.put(spec["index"])  # never leave the parent waiting
        out.put({"index": spec["index"], "error": traceback.format_exc()})


def run_children(role: str, specs: list[dict[str, Any]],
                 before_start: Callable[[], object] = lambda: None) -> list[dict[str, Any]]:
    """Start one process per spec, let them all begin at once, return their results."""
    ctx = mp.get_context("spawn")  # the server's threads make fork unsafe
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_child, args=(role, spec, ready, start, out), daemon=True)
             for spec in specs]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)
    before_start()
    start.set()
    results = [out.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(procs)} {role} processes failed; the first:\n"
                           f"{errors[0]}")
    return sorted(results, key=lambda r: r["index"])


# --- the measurements ---------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, config: dict[str, Any]) -> None:
        self.args = args
        self.config = config
        self.record_bytes = record_bytes(args.dataset)
        self.records = args.mb * MIB // self.record_bytes
        self.payload_bytes = self.records * self.record_bytes
        self.server: LatentS3 | None = None

    def specs(self, writers: int, root: str, options: Callable[[int], dict | None],
              topic: str, job: SharedTransaction | None, seed: int) -> list[dict[str, Any]]:
        cuts = np.linspace(0, self.records, writers + 1).astype(int)
        return [{"index": i, "records": int(cuts[i + 1] - cuts[i]),
                 "dataset": self.args.dataset, "seed": seed * 1000 + i,
                 "root": root, "storage_options": options(i), "topic": topic, "job": job,
                 "producer_config": self.config} for i in range(writers)]

    def job(self, root: str, driver_options: dict | None, writers: int, partitions: int,
            seed: int, count: Callable[[], Counter[str]] | None = None
            ) -> tuple[list[dict[str, Any]], Counter[str]]:
        """One Spark-like job of ``writers`` tasks into a new topic; returns results and counts."""
        driver = Log(root, storage_options=driver_options)
        topic = f"t{uuid.uuid4().hex[:8]}"
        driver.create_topic(topic, partitions)
        job = SharedTransaction.start(driver, f"bench{uuid.uuid4().hex[:8]}", TIMEOUT_MS) \
            .describing(driver, [topic])  # as the Spark writer's driver does
        server = self.server
        options: Callable[[int], dict | None] = (
            (lambda i: server.tagged_options(f"task-{i}")) if driver_options is not None and
            server is not None else (lambda i: None))
        if server is not None:
            server.take("task-")
        results = run_children("task", self.specs(writers, root, options, topic, job, seed))
        counts = server.take("task-") if server is not None and driver_options is not None \
            else Counter()
        job.commit(driver, [r["member"] for r in results])
        if self.args.verify:
            self.verify(driver, topic, partitions)
        return [r | {"topic": topic} for r in results], counts

    def verify(self, log: Log, topic: str, partitions: int) -> None:
        tables = [log.read(topic, p) for p in range(partitions)]
        # Values, not keys: every dataset's values are distinct, not the events' keys.
        values = pa.concat_arrays([t.column("value").combine_chunks() for t in tables])
        if len(values) != self.records or len(values.unique()) != self.records:
            raise AssertionError(f"{topic}: {len(values)} records committed "
                                 f"({len(values.unique())} distinct values), {self.records} sent")

    # --- object store --------------------------------------------------------------------

    def object_store(self) -> None:
        a = self.args
        server = self.server = LatentS3(a.latency_ms / 1000).start()
        try:
            bucket = server.create_bucket()
            root = f"s3://{bucket}/log"
            driver_options = server.storage_options
            Log(root, storage_options=driver_options)  # the root's first objects, uncounted
            print(f"== object store: moto S3 at {a.latency_ms:g} ms per request (waits "
                  f"overlapping), {a.mb} MiB payload of {self.records:,} records of "
                  f"{a.dataset} (~{self.record_bytes} B), {a.partitions} partitions, median of "
                  f"{a.repeats}")
            print(f"   producer options: {self.config or '(defaults)'}\n")
            self.write_vs_parquet(root, driver_options, bucket)
            for writers in a.writers:
                if writers != 1:
                    self.contention_s3(root, driver_options, writers)
            self.reader_vs_parquet(root, driver_options, bucket)
        finally:
            server.stop()
            self.server = None

    def write_vs_parquet(self, root: str, driver_options: dict, bucket: str) -> None:
        server = self.server
        assert server is not None
        ours, theirs, ratios, counts_seen, pq_counts = [], [], [], [], []
        for r in range(self.args.repeats):
            if self.args.trace_requests and r == 0:
                server.trace_prefix, server.trace = "task-", []
            results, counts = self.job(root, driver_options, 1, self.args.partitions, seed=r)
            server.print_trace("the task's")
            ours.append(self.payload_bytes / results[0]["elapsed"] / MIB)
            counts_seen.append(counts)
            spec = self.specs(1, root, lambda i: server.tagged_options("parquet-write"),
                              "", None, seed=r)[0] | {"path": f"{bucket}/parquet/w{r}.parquet"}
            server.take("parquet-write")
            pq_result = run_children("parquet-write", [spec])[0]
            pq_counts.append(server.take("parquet-write"))
            theirs.append(self.payload_bytes / pq_result["elapsed"] / MIB)
            ratios.append(ours[-1] / theirs[-1])
        requests = [c["requests"] for c in counts_seen]
        med_req = statistics.median(requests)
        print("one task, exactly-once write (Log opened .. prepare_transaction):")
        print(f"  txlog                 {_med(ours):9.2f} MB/s   runs {_runs(ours)}")
        print(f"  Parquet through s3fs  {_med(theirs):9.2f} MB/s   runs {_runs(theirs)}")
        print(f"  ratio txlog/Parquet   {_med(ratios):9.4f}       runs {_runs(ratios, 4)}")
        print(f"  task requests         {med_req:9.0f}        = "
              f"{med_req / (self.payload_bytes / MIB):.2f} per MB   {_kinds(counts_seen[0])}")
        print(f"  Parquet requests      {statistics.median(c['requests'] for c in pq_counts):9.0f}"
              f"        {_kinds(pq_counts[0])}")
        self.contention_line("S3", 1, [c["uploaded"] for c in counts_seen], counts_seen)
        print()

    def contention_s3(self, root: str, driver_options: dict, writers: int) -> None:
        uploaded, counts_seen = [], []
        for r in range(self.args.repeats):
            _, counts = self.job(root, driver_options, writers, self.args.partitions,
                                 seed=100 + r)
            uploaded.append(counts["uploaded"])
            counts_seen.append(counts)
        self.contention_line("S3", writers, uploaded, counts_seen)
        print()

    def contention_line(self, where: str, writers: int, written: list[int],
                        counts_seen: list[Counter[str]] | None = None) -> None:
        share = [w / self.payload_bytes for w in written]
        what = "uploaded" if where == "S3" else "written (wchar)"
        line = (f"{where}: {writers:>2} writer process{'es' if writers > 1 else ''}, bytes "
                f"{what} / payload  {_med(share):7.3f}   runs {_runs(share, 3)}")
        if counts_seen:
            per_mb = [c["requests"] / (self.payload_bytes / MIB) for c in counts_seen]
            lost = sum(c["lost"] for c in counts_seen)
            tried = sum(c["conditional"] for c in counts_seen)
            line += (f"\n      requests per MB {_med(per_mb):.2f}; conditional writes lost "
                     f"{lost} of {tried} ({lost / max(tried, 1):.0%})")
        print(line)

    def reader_vs_parquet(self, root: str, driver_options: dict, bucket: str) -> None:
        server = self.server
        assert server is not None
        # One task writes the whole payload into a 1-partition topic (not measured).
        results, _ = self.job(root, driver_options, 1, 1, seed=999)
        topic = results[0]["topic"]
        path = f"{bucket}/parquet/read.parquet"
        spec = self.specs(1, root, lambda i: server.tagged_options("parquet-write"), topic,
                          None, seed=999)[0]
        run_children("parquet-write", [spec | {"path": path}])
        ours, theirs, ratios, counts_seen, pq_counts = [], [], [], [], []
        for _ in range(self.args.repeats):
            server.take("")
            result = run_children("reader", [spec | {
                "storage_options": server.tagged_options("reader")}])[0]
            counts_seen.append(server.take("reader"))
            ours.append(self.payload_bytes / result["elapsed"] / MIB)
            result = run_children("parquet-read", [spec | {
                "path": path, "storage_options": server.tagged_options("parquet-read")}])[0]
            pq_counts.append(server.take("parquet-read"))
            theirs.append(self.payload_bytes / result["elapsed"] / MIB)
            ratios.append(ours[-1] / theirs[-1])
        print(f"fresh reader of one partition of {self.args.mb} MiB (Log opened .. log.read):")
        print(f"  txlog                 {_med(ours):9.2f} MB/s   runs {_runs(ours)}   "
              f"requests {statistics.median(c['requests'] for c in counts_seen):.0f} "
              f"{_kinds(counts_seen[0])}")
        print(f"  Parquet through s3fs  {_med(theirs):9.2f} MB/s   runs {_runs(theirs)}   "
              f"requests {statistics.median(c['requests'] for c in pq_counts):.0f} "
              f"{_kinds(pq_counts[0])}")
        print(f"  ratio txlog/Parquet   {_med(ratios):9.4f}       runs {_runs(ratios, 4)}\n")

    # --- local disk ------------------------------------------------------------------------

    def local_disk(self) -> None:
        a = self.args
        base = tempfile.mkdtemp(prefix="txlog-scale-", dir=a.dir)
        try:
            print(f"== local disk ({base}, fsync on), {a.mb} MiB payload of {a.dataset}, "
                  f"{a.partitions} partitions, median of {a.repeats}")
            for writers in a.local_writers:
                written, times = [], []
                for r in range(a.repeats):
                    root = os.path.join(base, f"w{writers}-{r}")
                    results, _ = self.job(root, None, writers, a.partitions, seed=200 + r)
                    if any(x["wchar"] is None for x in results):
                        print("  /proc/<pid>/io is not readable here: no local-disk figures")
                        return
                    written.append(sum(x["wchar"] for x in results))
                    times.append(max(x["elapsed"] for x in results))
                    shutil.rmtree(root, ignore_errors=True)
                self.contention_line("disk", writers, written)
                print(f"      slowest task {_med(times):.2f} s (median)")
        finally:
            shutil.rmtree(base, ignore_errors=True)


def _med(values: list[float]) -> float:
    return statistics.median(values)


def _runs(values: list[float], digits: int = 2) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def _kinds(counts: Counter[str]) -> str:
    kinds = [k for k in ("PUT", "GET", "HEAD", "LIST", "DELETE", "POST") if counts.get(k)]
    return "(" + ", ".join(f"{k} {counts[k]}" for k in kinds) + ")"


def _counts(raw: str, parser: argparse.ArgumentParser, flag: str) -> list[int]:
    try:
        values = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        parser.error(f"{flag} takes comma-separated integers, got {raw!r}")
    if any(v < 1 for v in values):
        parser.error(f"{flag} takes positive integers, got {raw!r}")
    return values


def store_arguments(parser: argparse.ArgumentParser, repeats: int) -> None:
    """The payload, topic and store options this benchmark shares with
    object_store_reads.py (checked by ``check_store_arguments``)."""
    parser.add_argument("--mb", type=int, default=64,
                        help="payload in MiB for every figure (default 64, the issue's size)")
    parser.add_argument("--dataset", choices=DATASETS, default="incompressible",
                        help="the rows written (bench_datasets.py; default incompressible)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--latency-ms", type=float, default=25.0,
                        help="latency added to every S3 request (default 25)")
    parser.add_argument("--repeats", type=int, default=repeats,
                        help=f"runs of every measurement; medians are printed (default {repeats})")


def check_store_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    for name in ("mb", "partitions", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.latency_ms < 0:
        parser.error(f"--latency-ms must not be negative, got {args.latency_ms}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    store_arguments(parser, repeats=3)
    parser.add_argument("--writers", default="1,8,32",
                        help="writer processes per job on S3, comma-separated (default 1,8,32)")
    parser.add_argument("--local-writers", default="1,16",
                        help="writer processes per job on local disk (default 1,16)")
    parser.add_argument("--only", choices=("s3", "local"), help="run one half only")
    parser.add_argument("--dir", help="parent of the local-disk roots (default: the temp dir)")
    parser.add_argument("--producer-option", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to Producer(...) in every task, e.g. batch_size=4194304 "
                             "(repeatable; dots read as underscores)")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip reading every job back to check each record is committed once")
    parser.add_argument("--trace-requests", action="store_true",
                        help="print every request of the first one-task write, in order, with "
                             "its kind and path (to see where a task's requests go)")
    args = parser.parse_args(argv)
    check_store_arguments(args, parser)
    args.writers = _counts(args.writers, parser, "--writers")
    args.local_writers = _counts(args.local_writers, parser, "--local-writers")
    # what the Spark writer passes by default
    config = producer_options(args.producer_option, parser,
                              base={"compression": DEFAULT_COMPRESSION})
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    bench = Bench(args, config)
    started = time.monotonic()
    if args.only in (None, "s3"):
        bench.object_store()
    if args.only in (None, "local"):
        bench.local_disk()
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
