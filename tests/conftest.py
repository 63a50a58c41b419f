"""Shared fixtures: a fresh log per test, on disk or in memory; one SparkSession per worker."""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from txlog import Log

# gcsfs 2026.x asks GCS's gRPC control plane for each bucket's layout, which the test
# GCS emulator does not serve: every request would first wait 60 s for that call.  The
# switch is read when gcsfs is imported, hence here (store_emulators.py explains).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
# The harness scripts the tests run as processes, and their helper modules (on sys.path through
# pyproject.toml's pythonpath).
HARNESS_DIR = REPO / "tests" / "harness"


# Runs too long for CI's budget (the whole suite under 15 minutes on 2 cores):
# the larger stress runs, and harness demonstrations that only need showing once.
LARGE = pytest.mark.skipif(not os.environ.get("TXLOG_LARGE"),
                           reason="a large run: set TXLOG_LARGE=1 to run it")


def pytest_configure(config: pytest.Config) -> None:
    """Compile txlog's bytecode, and the harness's, once before any test starts a process.

    Many tests run txlog in child processes: the CLI, the crash and Jepsen harnesses,
    Spark's Python workers, spark-submit.  A user's Python caches the bytecode at the
    first import; where PYTHONDONTWRITEBYTECODE is set (as on the development machine)
    nothing does, and every child compiled each module it imports again: in the CLI,
    crash and Jepsen tests, 196 children spent 42 s of CPU compiling txlog.  Python
    checks each cached file against its source, so an edited module is compiled anew;
    the caches are in .gitignore.
    """
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller did this
        return
    for directory in (SRC / "txlog", HARNESS_DIR):
        compileall.compile_dir(directory, quiet=1)
    compileall.compile_file(SRC / "pyspark_txlog.py", quiet=1)


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
    """One SparkSession for each test process (each pytest-xdist worker has its own):
    starting one costs ~10 s here.

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


def python_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child that must see what the tests see:
    this checkout's sources first on PYTHONPATH, a JAVA_HOME Spark accepts,
    and this interpreter (the venv's) for Spark's driver and Python workers.
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
    full_env.setdefault("PYSPARK_PYTHON", sys.executable)
    full_env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return full_env


def run_python(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300,
               check: bool = True, cwd: str | os.PathLike[str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with this interpreter in ``python_env(env)``."""
    done = subprocess.run([sys.executable, *args], env=python_env(env), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{args} exited {done.returncode}\nstdout:\n{done.stdout[-4000:]}"
                             f"\nstderr:\n{done.stderr[-4000:]}")
    return done


def spark_submit_args(script: str | os.PathLike[str], *args: str) -> list[str]:
    """Arguments to this interpreter that run ``spark-submit script args``.

    It goes through the installed pyspark's own launcher, with the
    project's spark_conf and the tests' master (``local[2,4]``: failed tasks
    are retried, as on a cluster).
    """
    pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[test]'")
    launcher = ("import os, sys; from pyspark.find_spark_home import _find_spark_home; "
                "os.execv(os.path.join(_find_spark_home(), 'bin', 'spark-submit'), "
                "['spark-submit'] + sys.argv[1:])")
    # The defaults file names the log4j file relative to the repository root;
    # this absolute twin lets a test run from any directory.
    log4j = f"-Dlog4j2.configurationFile={REPO / 'spark_conf' / 'log4j2.properties'}"
    return ["-c", launcher, "--master", "local[2,4]", "--properties-file",
            str(REPO / "spark_conf" / "spark-defaults.conf"), "--driver-java-options",
            f"{log4j} {SHORT_LIVED_JVM}", str(script), *args]


# A test's driver JVM (in local mode the executor too) lives for seconds to a minute
# and handles little data: the C2 compiler's and the parallel collector's threads
# would mostly compete with the work for CI's two cores.  Measured on this machine
# (loaded), a spark-submit of a small job: ~19.5 s without, ~12 s with.  Only
# compilation and collection change, nothing a test checks; the README's commands
# (test_spark_submit.py runs them as written) keep the JVM's defaults.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_submit(script: str | os.PathLike[str], *args: str,
                 **kwargs) -> subprocess.CompletedProcess[str]:
    """``spark-submit script args``, run to its end through run_python."""
    return run_python(spark_submit_args(script, *args), **kwargs)


# --- object stores ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 on a free local port for the whole run (see s3_server.py), started on first use."""
    pytest.importorskip("moto.server", reason="needs the test extra: pip install -e '.[test]'")
    pytest.importorskip("s3fs", reason="needs the s3 extra: pip install -e '.[s3]'")
    from s3_server import MotoS3

    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server on a free local port for the whole run (see store_emulators.py).

    Skips, with the reason, where it cannot start; pytest keeps a session
    fixture's skip, so a run tries once."""
    from store_emulators import EmulatorUnavailable, FakeGcs

    try:
        server = FakeGcs(tmp_path_factory.mktemp("gcs")).start()
    except EmulatorUnavailable as exc:
        pytest.skip(f"no GCS emulator: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    """Azurite's blob service on a free local port for the whole run, installed with npm on
    first use (see store_emulators.py); skips, with the reason, where it cannot start."""
    from store_emulators import Azurite, EmulatorUnavailable

    try:
        server = Azurite(tmp_path_factory.mktemp("azurite")).start()
    except EmulatorUnavailable as exc:
        pytest.skip(f"no Azure emulator: {exc}")
    yield server
    server.stop()


OBJECT_STORES = ["s3", "gcs", "azure"]  # each store's server fixture is <name>_server


@pytest.fixture(params=OBJECT_STORES)
def store_server(request):
    """The test server of each object store in turn (s3_server, gcs_server, azure_server)."""
    return request.getfixturevalue(f"{request.param}_server")


MEMORY_IS_ONE_PROCESS = pytest.mark.skip(
    reason="memory:// is a dictionary inside one process: other processes cannot share it "
           "(test_threads_with_separate_logs_on_one_root covers memory:// with threads)")


def _root(request: pytest.FixtureRequest, tmp_path: Path):
    from helpers_core import make_root

    server = (request.getfixturevalue(f"{request.param}_server")
              if request.param in OBJECT_STORES else None)
    return make_root(request.param, tmp_path, server)


@pytest.fixture(params=["file", pytest.param("memory", marks=MEMORY_IS_ONE_PROCESS), "s3"])
def proc_root(request, tmp_path):
    """A root on each backend for tests whose writers are separate processes."""
    return _root(request, tmp_path)


@pytest.fixture(params=["file", "memory", "s3"])
def any_root(request, tmp_path):
    """A root on each backend (helpers_core.Root)."""
    return _root(request, tmp_path)


@pytest.fixture(params=["file", "memory", *OBJECT_STORES])
def every_root(request, tmp_path):
    """any_root, and GCS and Azure (their emulators) too: for in-process tests cheap enough
    to run on five backends."""
    return _root(request, tmp_path)


@pytest.fixture
def s3_root(s3_server) -> str:
    """A fresh bucket on the test S3 endpoint; the log root is a prefix inside it."""
    return f"s3://{s3_server.create_bucket()}/log"
