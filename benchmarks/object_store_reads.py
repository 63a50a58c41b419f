"""Fresh reads of a topic's partitions at object-store latency, against Parquet (issue 32, item 4).

What a new process pays to read a topic that another process wrote: every
phase runs in a fresh process that opens a ``Log`` and reads all of a
``--partitions``-partition topic holding ``--mb`` MiB of ``--dataset``
(bench_datasets.py; incompressible by default), written once with the core's
defaults (a transactional producer's ``send_table``, as a Python user writes
it).  The phases:

* ``by-partition``: ``log.read(topic, p)`` for each partition, one after
  another, as users call it today;
* ``many``: ``log.read(topic)``, the read of all partitions in one call;
* ``threads``: one thread per partition, each calling ``log.read(topic, p)``
  (what a user who parallelises by hand gets);
* ``consumer``: a native ``Consumer`` assigned every partition, polling from the
  earliest offsets until it has every record (``poll``: records as Python objects);
* ``kafka``: ``txlog.kafka.KafkaConsumer`` assigned every partition, likewise;
* ``parquet``: ``pyarrow.parquet.read_table`` of the same table, written once
  uncompressed through s3fs, read through s3fs: the yardstick.

Each repetition runs every phase once, Parquet taking turns with the others,
and each ratio is a phase's rate over that repetition's Parquet rate; medians
over ``--repeats`` are printed.  The store is the scale-out benchmark's
``LatentS3`` (moto in this process, ``--latency-ms`` per request, waits
overlapping; scale_out_benchmark.py says how), and requests are counted in
the server per phase: all of them, from opening the ``Log`` (or the s3fs
filesystem) to the last record.  ``--trace`` prints the first repetition's
requests of each phase in order, with their paths.  Times are taken in the
child processes from opening the ``Log`` on: process start, imports and the
check of the result are outside.

    python benchmarks/object_store_reads.py [--mb 64] [--partitions 4] [--repeats 5]
        [--latency-ms 25] [--phases by-partition,many,consumer] [--trace]
"""

from __future__ import annotations

import argparse
import inspect
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scale_out_benchmark import (MIB, LatentS3, check_store_arguments, payload, record_bytes,
                                 store_arguments)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

from txlog import Log  # noqa: E402

PHASES = ("by-partition", "many", "threads", "consumer", "kafka")


# --- what each phase does (in a fresh process) ------------------------------------------------


def read_by_partition(spec: dict[str, Any]) -> int:
    log = Log(spec["root"], storage_options=spec["storage_options"], create=False)
    return sum(log.read(spec["topic"], p).num_rows for p in range(spec["partitions"]))


def read_many(spec: dict[str, Any]) -> int:
    log = Log(spec["root"], storage_options=spec["storage_options"], create=False)
    return log.read(spec["topic"]).num_rows


def read_threads(spec: dict[str, Any]) -> int:
    log = Log(spec["root"], storage_options=spec["storage_options"], create=False)
    with ThreadPoolExecutor(spec["partitions"]) as pool:
        tables = pool.map(lambda p: log.read(spec["topic"], p), range(spec["partitions"]))
        return sum(t.num_rows for t in tables)


def read_consumer(spec: dict[str, Any]) -> int:
    log = Log(spec["root"], storage_options=spec["storage_options"], create=False)
    consumer = log.consumer(auto_offset_reset="earliest")
    consumer.assign([(spec["topic"], p) for p in range(spec["partitions"])])
    got = 0
    while got < spec["records"]:
        records = consumer.poll()
        if not records:
            raise AssertionError(f"the consumer stopped at {got} of {spec['records']} records")
        got += len(records)
    return got


def read_kafka(spec: dict[str, Any]) -> int:
    from txlog.kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=spec["root"],
                             storage_options=spec["storage_options"],
                             auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([TopicPartition(spec["topic"], p) for p in range(spec["partitions"])])
    got = 0
    while got < spec["records"]:
        batch = consumer.poll(timeout_ms=0)
        if not batch:
            raise AssertionError(f"the consumer stopped at {got} of {spec['records']} records")
        got += sum(len(records) for records in batch.values())
    consumer.close()
    return got


def read_parquet(spec: dict[str, Any]) -> int:
    import pyarrow.parquet as pq
    import s3fs

    fs = s3fs.S3FileSystem(**spec["storage_options"])
    return pq.read_table(spec["path"], filesystem=fs).num_rows


READERS: dict[str, Callable[[dict[str, Any]], int]] = {
    "by-partition": read_by_partition, "many": read_many, "threads": read_threads,
    "consumer": read_consumer, "kafka": read_kafka, "parquet": read_parquet}


def _child(role: str, spec: dict[str, Any], out: Any) -> None:
    try:
        began = time.perf_counter()
        rows = READERS[role](spec)
        elapsed = time.perf_counter() - began
        if rows != spec["records"]:
            raise AssertionError(f"{role} read {rows} records, {spec['records']} written")
        out.put({"elapsed": elapsed})
    except BaseException:
        out.put({"error": traceback.format_exc()})


def run_child(role: str, spec: dict[str, Any]) -> float:
    """Seconds the phase took in a fresh process."""
    ctx = mp.get_context("spawn")  # the server's threads make fork unsafe
    out = ctx.Queue()
    proc = ctx.Process(target=_child, args=(role, spec, out), daemon=True)
    proc.start()
    result = out.get(timeout=3600)
    proc.join()
    if "error" in result:
        raise RuntimeError(f"the {role} phase failed:\n{result['error']}")
    return result["elapsed"]


# --- the run ----------------------------------------------------------------------------------


def many_supported() -> bool:
    """Whether this txlog reads many partitions in one ``Log.read`` call (not before
    issue 32): a run on older code leaves the phase out."""
    return inspect.signature(Log.read).parameters["partition"].default is not \
        inspect.Parameter.empty


def write_once(server: LatentS3, args: argparse.Namespace, records: int
               ) -> tuple[str, str, str]:
    """The topic (core defaults, one transaction) and the Parquet file; neither counted."""
    bucket = server.create_bucket()
    root = f"s3://{bucket}/log"
    table = payload(args.dataset, records, 0)
    log = Log(root, storage_options=server.storage_options)
    topic = f"t{uuid.uuid4().hex[:8]}"
    log.create_topic(topic, args.partitions)
    with log.producer(transactional_id=f"writer-{topic}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_table(topic, table)
        producer.commit_transaction()
    import pyarrow.parquet as pq
    import s3fs

    path = f"{bucket}/parquet/read.parquet"
    pq.write_table(table, path, filesystem=s3fs.S3FileSystem(**server.storage_options),
                   compression="none")
    return root, topic, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    store_arguments(parser, repeats=5)
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated, of {', '.join(PHASES)} (default all)")
    parser.add_argument("--trace", action="store_true",
                        help="print every request of each phase's first run, in order")
    args = parser.parse_args(argv)
    check_store_arguments(args, parser)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        parser.error(f"unknown phases {unknown}; choose from {', '.join(PHASES)}")
    if "many" in phases and not many_supported():
        print("(Log.read takes one partition here: the many phase is left out)")
        phases.remove("many")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    per_record = record_bytes(args.dataset)
    records = args.mb * MIB // per_record
    payload_mb = records * per_record / MIB
    server = LatentS3(args.latency_ms / 1000).start()
    try:
        root, topic, path = write_once(server, args, records)
        print(f"== fresh reads: moto S3 at {args.latency_ms:g} ms per request, {payload_mb:.1f} "
              f"MiB of {records:,} {args.dataset} records (~{per_record} B) in "
              f"{args.partitions} partitions, written with the core's defaults; "
              f"median of {args.repeats}\n")
        spec = {"root": root, "topic": topic, "path": path, "records": records,
                "partitions": args.partitions}
        rates: dict[str, list[float]] = {p: [] for p in [*phases, "parquet"]}
        ratios: dict[str, list[float]] = {p: [] for p in phases}
        counts: dict[str, list[Counter[str]]] = {p: [] for p in rates}
        for r in range(args.repeats):
            for role in ["parquet", *phases]:
                server.take("")
                if args.trace and r == 0:
                    server.trace_prefix, server.trace = role, []
                elapsed = run_child(role, spec | {
                    "storage_options": server.tagged_options(role)})
                counts[role].append(server.take(role))
                rates[role].append(payload_mb / elapsed)
                server.print_trace(f"the {role} phase's")
            for role in phases:
                ratios[role].append(rates[role][-1] / rates["parquet"][-1])
        report(phases, rates, ratios, counts)
    finally:
        server.stop()
    return 0


def report(phases: list[str], rates: dict[str, list[float]], ratios: dict[str, list[float]],
           counts: dict[str, list[Counter[str]]]) -> None:
    print(f"{'phase':<14} {'MB/s':>8} {'ratio to Parquet':>17}  requests (median; kinds of the "
          "first run)   runs of the ratio")
    for role in [*phases, "parquet"]:
        requests = statistics.median(c["requests"] for c in counts[role])
        ratio = f"{statistics.median(ratios[role]):17.3f}" if role in ratios else " " * 17
        runs = ", ".join(f"{x:.3f}" for x in ratios.get(role, []))
        print(f"{role:<14} {statistics.median(rates[role]):8.2f} {ratio}  {requests:5.0f} "
              f"{_kinds(counts[role][0]):<34} {runs}")


def _kinds(counts: Counter[str]) -> str:
    kinds = [k for k in ("PUT", "GET", "HEAD", "LIST", "DELETE", "POST") if counts.get(k)]
    return "(" + ", ".join(f"{k} {counts[k]}" for k in kinds) + ")"


if __name__ == "__main__":
    sys.exit(main())
