"""Smoke runs of the write-path benchmarks (commit latency, scale-out, bytes) at tiny sizes: they
must keep running as the write path changes under them (their figures are read from full
runs, not here)."""

from __future__ import annotations

from conftest import REPO, run_python

BENCH = REPO / "benchmarks"


def test_commit_latency_benchmark_runs(tmp_path):
    done = run_python([str(BENCH / "commit_latency_benchmark.py"), "--commits", "3",
                       "--warmup", "1", "--dir", str(tmp_path)], cwd=REPO, timeout=120)
    assert "ratio of the medians" in done.stdout
    # Back to back by default: every transaction makes its claims and decision durable.
    fsyncs = float(done.stdout.split(" fsyncs per transaction")[0].rsplit(" ", 1)[1])
    assert fsyncs >= 4 + 1


def test_scale_out_benchmark_runs_on_local_disk(tmp_path):
    done = run_python([str(BENCH / "scale_out_benchmark.py"), "--only", "local", "--mb", "1",
                       "--partitions", "2", "--local-writers", "1", "--repeats", "1",
                       "--producer-option", "batch_size=65536", "--dir", str(tmp_path)],
                      cwd=REPO, timeout=120)
    assert "bytes written (wchar) / payload" in done.stdout


def test_scale_out_benchmark_names_an_unknown_producer_option():
    done = run_python([str(BENCH / "scale_out_benchmark.py"), "--producer-option",
                       "no_such_knob=1"], cwd=REPO, timeout=60, check=False)
    assert done.returncode == 2 and "no_such_knob" in done.stderr


def test_bytes_benchmark_runs_every_dataset_and_codec(tmp_path):
    done = run_python([str(BENCH / "bytes_benchmark.py"), "--rows", "200", "--runs", "1",
                       "--partitions", "2", "--dir", str(tmp_path)], cwd=REPO, timeout=120)
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert {(r[0], " ".join(r[1:-3])) for r in rows} == {
        (d, w) for d in ("incompressible", "events", "hex")
        for w in ("parquet", "txlog none", "txlog lz4", "txlog zstd")}
    assert all(int(r[-3].replace(",", "")) > 0 for r in rows)


def test_scale_out_benchmark_takes_a_dataset(tmp_path):
    done = run_python([str(BENCH / "scale_out_benchmark.py"), "--only", "local", "--mb", "1",
                       "--partitions", "2", "--local-writers", "1", "--repeats", "1",
                       "--dataset", "events", "--dir", str(tmp_path)], cwd=REPO, timeout=120)
    assert "payload of events" in done.stdout
