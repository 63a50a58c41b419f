"""Shared fixtures: a fresh log per test, on disk or in memory; one SparkSession for all."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from txlog import Log

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


@pytest.fixture
def log(tmp_path) -> Log:
    """A log in a fresh directory (the real local backend, with fsync)."""
    return Log(tmp_path / "log")


@pytest.fixture
def memlog() -> Log:
    """A log on the in-memory backend, for protocol tests that need no disk."""
    return Log(f"memory://{uuid.uuid4().hex}")


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the whole run: starting one costs ~10 s here.

    Session-scoped fixtures are created on first use, so a run of the core
    tests never starts a JVM.  ``local[2,4]``: two threads, and up to four
    attempts per task, because plain ``local[N]`` never retries a failed task
    and retry behaviour is part of what the Spark tests check.
    """
    pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[test]'")
    from txlog.spark.session import spark_session

    session = spark_session(
        "txlog-tests", master="local[2,4]",
        **{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


def run_python(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300,
               check: bool = True, cwd: str | os.PathLike[str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with this interpreter (the venv's), this checkout's sources
    first on PYTHONPATH and a JAVA_HOME Spark accepts.

    Spark programs started this way (``-m``, scripts, or ``spark-submit``
    through ``spark_submit``) see the same code and Java as the tests.
    """
    from txlog.spark.java import find_java_home

    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC)] + [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if "JAVA_HOME" not in (env or {}):
        home = str(find_java_home())
        full_env["JAVA_HOME"] = home
        full_env["PATH"] = os.pathsep.join([os.path.join(home, "bin"), full_env.get("PATH", "")])
    # Spark's python workers and spark-submit's driver use this interpreter too.
    full_env.setdefault("PYSPARK_PYTHON", sys.executable)
    full_env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    done = subprocess.run([sys.executable, *args], env=full_env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{args} exited {done.returncode}\nstdout:\n{done.stdout[-4000:]}"
                             f"\nstderr:\n{done.stderr[-4000:]}")
    return done


def spark_submit(script: str | os.PathLike[str], *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    """``spark-submit script args`` through run_python (the venv's pyspark launcher)."""
    pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[test]'")
    launcher = ("import sys; from pyspark.find_spark_home import _find_spark_home; "
                "import os; home = _find_spark_home(); "
                "os.execv(os.path.join(home, 'bin', 'spark-submit'), "
                "['spark-submit'] + sys.argv[1:])")
    return run_python(["-c", launcher, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                       str(script), *args], **kwargs)
