"""Compaction memory benchmark: the peak RSS of compacting ~2 GB into 1 GiB segments.

The claim under test (issue 20, item 4): compaction streams its segment into
storage, so its memory is bounded by ``buffer_bytes`` and one batch, not by
``segment.bytes``; compacting 2 GB of batches into 1 GiB segments keeps the
process's peak RSS under 300 MB.

What it does:

1. Writes ``--gb`` GB (default 2) into partition 0 of topic ``m`` (segment.bytes
   ``--segment-bytes``, default Kafka's 1 GiB) with ``Log(root, fsync=False)``:
   ``Producer.send_table`` of random 64 KiB values, batches of the producer's
   default 1 MiB (one claim each, payloads in data objects).
2. For each compactor given (``--src``, a ``src`` directory to import txlog
   from; default this checkout's, and e.g. ``--src /work/main/src`` for the
   version before streaming), hard-links a copy of the written partition
   (batch objects are immutable, so the copies share their bytes), and
   compacts it in a fresh child process (``Log(root)``: fsync on), timing it.
   The child reports its own peak RSS (``VmHWM`` of /proc/self/status, which
   counts the mapped file pages it touched; the page cache behind its writes
   is not the process's) and its RSS before compacting (the interpreter,
   pyarrow and txlog).  ``os.wait4``'s ru_maxrss is not used: Linux carries
   it over from the forking parent, so it showed the benchmark's own peak.
3. Checks the compacted partition ends where the written one did, and prints
   one row per compactor.

    PYTHONPATH=src python benchmarks/compaction_memory_benchmark.py
    PYTHONPATH=src python benchmarks/compaction_memory_benchmark.py --src /work/main/src --src src
    PYTHONPATH=src python benchmarks/compaction_memory_benchmark.py --gb 0.2 --buffer-bytes 8388608

The data (about 2x ``--gb`` on disk while it runs) goes under ``--dir`` (a
fresh temporary directory by default), removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from txlog import Log

VALUE_SIZE = 64 << 10
RECORDS_PER_SEND = 256  # 16 MiB per send_table call
TOPIC = "m"

_CHILD = r"""
import inspect, json, sys, time
from txlog import Log

def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])

root, buffer_bytes = sys.argv[1], int(sys.argv[2])
log = Log(root)
part = log.partition("m", 0)
end = part.end_offset()
kwargs = {}
if "buffer_bytes" in inspect.signature(log.compact).parameters:
    kwargs["buffer_bytes"] = buffer_bytes
before = rss_kib("VmRSS")
started = time.perf_counter()
made = log.compact("m", [0], **kwargs)[0]
seconds = time.perf_counter() - started
print(json.dumps({"segments": len(made), "batches": sum(m.batches for m in made),
                  "bytes": sum(m.bytes for m in made), "seconds": seconds,
                  "rss_before_kib": before, "peak_rss_kib": rss_kib("VmHWM"), "end": end,
                  "compacted_end": made[-1].end_offset if made else 0,
                  "streaming": bool(kwargs)}))
"""


def _write(root: Path, gb: float, segment_bytes: int) -> tuple[int, int, float]:
    log = Log(root, fsync=False)
    log.create_topic(TOPIC, 1, {"segment.bytes": segment_bytes})
    producer = log.producer()
    rng = np.random.default_rng(1)
    target = int(gb * 1e9)
    written = 0
    started = time.perf_counter()
    while written < target:
        data = rng.integers(0, 256, size=RECORDS_PER_SEND * VALUE_SIZE, dtype=np.uint8)
        offsets = np.arange(0, RECORDS_PER_SEND * VALUE_SIZE + 1, VALUE_SIZE, dtype=np.int32)
        values = pa.BinaryArray.from_buffers(pa.binary(), RECORDS_PER_SEND,
                                             [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        producer.send_table(TOPIC, pa.table({"value": values}), partition=0)
        written += RECORDS_PER_SEND * VALUE_SIZE
    producer.flush()
    seconds = time.perf_counter() - started
    part = log.partition(TOPIC, 0)
    return part.end_offset(), part.stored()[2], seconds


def _compact(copy: Path, src: str, buffer_bytes: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    child = subprocess.run([sys.executable, "-c", _CHILD, str(copy), str(buffer_bytes)],
                           env=env, stdout=subprocess.PIPE)
    if child.returncode:
        raise SystemExit(f"the compactor importing {src} failed ({child.returncode})")
    return json.loads(child.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="data to write, in GB")
    parser.add_argument("--segment-bytes", type=int, default=1 << 30)
    parser.add_argument("--buffer-bytes", type=int, default=32 << 20,
                        help="compaction's buffer_bytes (where the compactor has it)")
    parser.add_argument("--src", action="append",
                        help="a src directory to import the compactor from (repeatable; "
                             "default this checkout's)")
    parser.add_argument("--dir", help="where to put the data (default a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the data")
    args = parser.parse_args()
    sources = args.src or [str(Path(__file__).resolve().parent.parent / "src")]
    base = Path(args.dir or tempfile.mkdtemp(prefix="txlog-compaction-memory-"))
    try:
        written = base / "written"
        if not (written / "txlog.json").exists():
            end, batches, seconds = _write(written, args.gb, args.segment_bytes)
            print(f"wrote {args.gb:g} GB: {batches} batch objects, offsets 0 to {end}, "
                  f"in {seconds:.1f} s (fsync off)")
        rows = []
        for i, src in enumerate(sources):
            copy = base / f"compacted-{i}"
            shutil.rmtree(copy, ignore_errors=True)
            subprocess.run(["cp", "-al", str(written), str(copy)], check=True)
            r = _compact(copy, src, args.buffer_bytes)
            assert r["compacted_end"] == r["end"], r
            rows.append((src, r))
            shutil.rmtree(copy)
        print(f"\n{'compactor (src)':40} {'streaming':>9} {'segments':>8} {'GB':>6} "
              f"{'seconds':>8} {'RSS before MB':>13} {'peak RSS MB':>11}")
        for src, r in rows:
            print(f"{src:40} {str(r['streaming']):>9} {r['segments']:>8} "
                  f"{r['bytes'] / 1e9:>6.2f} {r['seconds']:>8.1f} "
                  f"{r['rss_before_kib'] / 1024:>13.0f} {r['peak_rss_kib'] / 1024:>11.0f}")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
