"""Published kafka-python programs run on a txlog root, changed only in imports and address.

kafka-python ships its producer and consumer benchmarks (``kafka.benchmarks``); the test
extra pins kafka-python 3.0, so the copies run here are exactly those files with
``from kafka`` replaced by ``from txlog.kafka``, their ``--bootstrap-servers`` a fresh
root with no topic created beforehand.  Their stats threads print ``metrics()`` each
interval, so the records per second they print are checked against what the test counts
and times itself: the records in the topic, and the span of their timestamps.
tests/harness/ported/kafka_admin_roundtrip.py is a program that administers its own topic
and group with ``KafkaAdminClient``, run the same way.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

kafka_benchmarks = pytest.importorskip("kafka.benchmarks")

from conftest import HARNESS_DIR, python_env, run_python  # noqa: E402

from txlog import Log  # noqa: E402

RATE = re.compile(r"^(\d+) records/sec")


def ported(source: Path, tmp_path: Path) -> Path:
    """``source`` with its kafka-python imports, and nothing else, pointed at txlog.kafka."""
    text = source.read_text()
    assert re.search(r"^from kafka import", text, re.M)
    target = tmp_path / source.name
    target.write_text(re.sub(r"^from kafka\b", "from txlog.kafka", text, flags=re.M))
    return target


def benchmark(name: str) -> Path:
    return Path(kafka_benchmarks.__file__).with_name(name)


def timed_run(args: list[str], start_line: str, end_line: str
              ) -> tuple[list[str], dict[str, float]]:
    """Run ``args``, stamping each line of its output as it arrives (wall-clock seconds):
    its lines, and when ``start_line`` and ``end_line`` were seen here."""
    proc = subprocess.Popen([sys.executable, *args], env=python_env({"PYTHONUNBUFFERED": "1"}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, stamps = [], {}
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.time()
        lines.append(line.rstrip("\n"))
        for mark in (start_line, end_line):
            if line.startswith(mark) and mark not in stamps:
                stamps[mark] = now
    assert proc.wait(300) == 0, "\n".join(lines[-50:])
    return lines, stamps


def final_rate(lines: list[str]) -> int:
    """The rate the stats thread printed last: after the run, over the whole of it."""
    return [int(m.group(1)) for line in lines if (m := RATE.match(line))][-1]


# One sample as long as the stats interval, which outlasts the run: the stats thread
# prints once, after the run, and the windowed rate it prints (kafka-python's) spans the
# run from its first record.  Both are the benchmarks' own options.
ONE_WINDOW = ["--stats-interval", "30", "-c", "metrics_num_samples=1"]


def test_producer_then_consumer_benchmark_print_true_rates(tmp_path):
    root = tmp_path / "root"
    records = 100_000
    lines, seen = timed_run(
        [str(ported(benchmark("producer_performance.py"), tmp_path)), "-b", str(root),
         "-t", "bench", "--num-records", str(records), "--record-size", "100", *ONE_WINDOW],
        "-> OK!", f"{records} suceeded")
    assert f"{records} suceeded, 0 failed" in lines
    log = Log(root)  # the topic was created on first use, with the root's default partitions
    assert log.describe_topic("bench").partitions == 1
    assert log.end_offset("bench", 0) == records
    # From the first batch in storage (its file's time: kafka-python's rates count from a
    # run's first request, not from its start-up) to the end of the run as seen here.
    first_written = min(f.stat().st_mtime for f in (root / "topics" / "bench" / "0").iterdir())
    elapsed = seen[f"{records} suceeded"] - first_written
    assert abs(final_rate(lines) / (records / elapsed) - 1) <= 0.05, (lines, elapsed)

    lines, seen = timed_run(
        [str(ported(benchmark("consumer_performance.py"), tmp_path)), "-b", str(root),
         "-t", "bench", "--num-records", str(records), *ONE_WINDOW],
        "-> OK!", f"Consumed {records} records")
    elapsed = seen[f"Consumed {records} records"] - seen["-> OK!"]
    assert abs(final_rate(lines) / (records / elapsed) - 1) <= 0.05, (lines, elapsed)
    fetch_stats = next(line for line in lines if RATE.match(line))
    # The largest lag in the window: the first fetch's, behind the records read since.
    lag = re.search(r", (\d+) max record lag,", fetch_stats)
    assert lag is not None and 0 < int(lag.group(1)) < records, fetch_stats


def test_a_program_administering_its_own_topic_and_group_runs_unchanged(tmp_path):
    root = tmp_path / "root"
    records = 5_000
    done = run_python([str(ported(HARNESS_DIR / "ported" / "kafka_admin_roundtrip.py", tmp_path)),
                       str(root), str(records)], timeout=300)
    lines = done.stdout.splitlines()
    assert "topics ['orders']" in lines
    assert "group billing Stable 1 members" in lines, done.stdout
    log = Log(root)
    assert log.describe_topic("orders").partitions == 3
    ends = {p: log.end_offset("orders", p) for p in range(3)}
    assert sum(ends.values()) == records
    # The group's offsets, as the program listed them, are where it stopped: every record.
    assert {p: int(line.split()[-1]) for line in lines if line.startswith("offset orders")
            for p in [int(line.split()[2])]} == ends
    # delete_records moved each log start to the committed offset: nothing is left to read.
    assert {p: log.partition("orders", p).log_start() for p in range(3)} == ends
    for kind in ("produced", "consumed"):
        line = next(line for line in lines if line.startswith(kind))
        count, elapsed, rate = re.match(r"\w+ (\d+) records in ([\d.]+) s: (\d+)", line).groups()
        assert int(count) == records
        assert abs(int(rate) * float(elapsed) / records - 1) <= 0.05
