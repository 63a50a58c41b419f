"""What users run: spark-submit applications, a killed driver, Spark Connect, the README."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from conftest import (HARNESS_DIR, REPO, SHORT_LIVED_JVM, python_env, run_python,  # noqa: E402
                      spark_submit_args)
from helpers_core import nothing_holds_the_lso, wait_for  # noqa: E402

from txlog import Log  # noqa: E402
from txlog.examples.stream_pipeline import PROGRESS_PREFIX  # noqa: E402

JOBS = HARNESS_DIR / "spark_jobs.py"


def committed_count(root: Path, topic: str, partitions: int) -> int:
    log = Log(root)
    return sum(log.read(topic, p).num_rows for p in range(partitions))


def written_count(root: Path, topic: str, partitions: int) -> int:
    log = Log(root)
    return sum(log.read(topic, p, isolation_level="read_uncommitted").num_rows
               for p in range(partitions))


def start_hanging_job(tmp_path: Path, root: Path, prefix: str, timeout_ms: int
                      ) -> subprocess.Popen:
    ready = tmp_path / "ready"
    ready.mkdir()
    proc = subprocess.Popen(
        [sys.executable, *spark_submit_args(JOBS, "hang", str(root), "events", prefix,
                                            str(timeout_ms), str(ready))],
        env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or written_count(root, "events", 4) >= 3_000,
                 180, "the job's tasks to write", poll_s=0.2)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    return proc


def kill_driver(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the driver JVM and its Python workers
    proc.wait(60)


@pytest.fixture
def root(tmp_path):
    Log(tmp_path / "log").create_topic("events", partitions=4)
    return tmp_path / "log"


def test_killed_driver_leaves_nothing_visible_and_next_job_cleans_up(spark, tmp_path, root):
    proc = start_hanging_job(tmp_path, root, "killed", 900_000)
    kill_driver(proc)
    log = Log(root)
    assert committed_count(root, "events", 4) == 0
    assert any(log.last_stable_offset("events", p) < log.end_offset("events", p)
               for p in range(4))  # the dead job's transactions hold the LSO ...
    df = spark.range(100).selectExpr("CAST(id AS STRING) AS value")
    df.write.format("txlog").mode("append").option("path", str(root)).option("topic", "events") \
        .option("transactional.id.prefix", "killed").save()
    # ... until the next job with the prefix ends them.
    assert nothing_holds_the_lso(Log(root), "events", 4)
    assert committed_count(root, "events", 4) == 100


def test_spark_connect_reads_and_writes(tmp_path):
    root = tmp_path / "log"
    # The local Connect server's JVM starts through PYSPARK_SUBMIT_ARGS: the tests'
    # short-lived JVM options (conftest.SHORT_LIVED_JVM) and no web UI.
    submit = (f"--driver-java-options '{SHORT_LIVED_JVM}' --conf spark.ui.enabled=false "
              "pyspark-shell")
    out = run_python([str(JOBS), "connect", str(root)], env={"PYSPARK_SUBMIT_ARGS": submit})
    assert "connect: 500" in out.stdout
    assert committed_count(root, "connected", 2) == 500


def readme_command(marker: str) -> str:
    """The README's fenced command that contains ``marker``."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S)
    found = [b.strip() for b in blocks if marker in b]
    assert found, f"no README command contains {marker!r}"
    return found[0]


def run_readme_example(example: str, scratch: str, where: Path
                       ) -> subprocess.CompletedProcess[str]:
    """The README's command for ``example`` as a user pastes it, on ``where`` instead of
    ``scratch``."""
    command = readme_command(example)
    # The README sets up .venv in the clone; here the current interpreter's venv is it.
    venv = Path(sys.executable).parent.parent
    command = command.replace(".venv/", f"{venv}/").replace(scratch, str(where))
    command = re.sub(r"python3 -m venv \S+ && ", "", command)
    command = re.sub(r"pip install [^&]*&& ", "", command)
    assert command.startswith(f". {venv}/bin/activate && JAVA_HOME="), command
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "JAVA_HOME"))}
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def readme_stream_run(tmp_path_factory):
    """The README's streaming command, run once for two tests (a run costs minutes on
    CI): one checks its output, the other runs the pipeline again on its directory.

    Returns the log directory, the finished run, and the committed readings right
    after it (the second test adds more to the same directory).
    """
    where = tmp_path_factory.mktemp("readme-stream") / "r"
    out = run_readme_example("stream_pipeline", "/tmp/txlog-stream", where)
    committed = committed_count(where, "readings", 4) if out.returncode == 0 else -1
    return where, out, committed


@pytest.mark.parametrize("example, scratch", [("stream_pipeline", "/tmp/txlog-stream"),
                                               ("batch_pipeline", "/tmp/txlog-batch")])
def test_readme_spark_submit_of_the_examples(request, tmp_path, example, scratch):
    """The README's commands as a user pastes them (the streaming one is the main job)."""
    if example == "stream_pipeline":
        _, out, committed = request.getfixturevalue("readme_stream_run")
    else:
        out = run_readme_example(example, scratch, tmp_path / "r")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "exactly once: OK" in out.stdout
    # A first run that reads well: Spark at WARN (spark_conf/log4j2.properties), one
    # line per micro-batch, and at most 25 other lines, the summary included.
    lines = (out.stdout + out.stderr).splitlines()
    progress = [line for line in lines if line.startswith(PROGRESS_PREFIX)]
    rest = [line for line in lines if not line.startswith(PROGRESS_PREFIX)]
    assert len(rest) <= 25, "\n".join(rest)
    assert not [line for line in rest if " INFO " in line], "\n".join(rest)
    if example == "stream_pipeline":
        assert progress, out.stdout
        batches = [int(re.match(r"batch (\d+):", line).group(1)) for line in progress]
        assert batches == sorted(set(batches)), progress  # one line per micro-batch
        # Every committed reading went through some micro-batch, and was alerted.
        assert sum(int(re.search(r"(\d+) readings in", line).group(1))
                   for line in progress) == committed
        assert re.search(r"lag 0$", progress[-1]), progress


def test_stream_pipeline_with_python_m_runs_again_on_the_same_directory(readme_stream_run):
    """The README's promise: run it again and it resumes from its checkpoint, exactly once.

    The first run is the README's spark-submit one (shared with the test above, which
    checks it said exactly once: OK); the second is ``python -m`` on its directory.
    """
    where, first, first_committed = readme_stream_run
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    root = str(where)
    out = run_python(["-m", "txlog.examples.stream_pipeline", root, "--generate", "1500"],
                     timeout=600)
    assert "exactly once: OK" in out.stdout, out.stdout[-2000:]
    log = Log(root)
    assert log.committed("alerts-query")  # the query's progress, in its group
    alerts = sum(log.read("alerts", p).num_rows for p in range(4))
    readings = sum(log.read("readings", p).num_rows for p in range(4))
    # Both runs' committed readings, each alerted once: a second run that re-read
    # the first run's input (no resume) would have alerted those twice.
    assert alerts == readings > first_committed > 0


def test_a_dead_drivers_job_is_aborted_by_a_spark_reader_once_its_timeout_passes(
        spark, tmp_path, root):
    proc = start_hanging_job(tmp_path, root, "dead", 5_000)
    kill_driver(proc)
    log = Log(root)
    held = [p for p in range(4) if log.last_stable_offset("events", p) < log.end_offset("events", p)]
    assert held  # the dead job's prepared transactions hold the LSO
    tps = [("events", p) for p in held]
    # The hanging task renewed the job's lease until the kill: not expired yet.
    assert log.coordinator.find_hanging(tps) == []
    # Wait, reading only, until the timeout has passed for every transaction holding it.
    wait_for(lambda: len(log.coordinator.find_hanging(tps)) >= len(held), 60,
             "the dead job's transactions to outlive their timeout", poll_s=0.2)
    # No writer runs: one read_committed Spark read ends them, and reads nothing of them.
    read = spark.read.format("txlog").option("path", str(root)).option("subscribe", "events")
    assert read.load().count() == 0
    log = Log(root)
    for p in range(4):
        assert log.last_stable_offset("events", p) == log.end_offset("events", p)
    assert committed_count(root, "events", 4) == 0
