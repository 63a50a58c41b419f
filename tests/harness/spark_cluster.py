"""A Spark standalone cluster on 127.0.0.1, started from the installed pyspark, for tests.

Local mode runs every task inside the driver's JVM, so it cannot show that a
job's exactly-once write holds when its tasks run in other processes that
only share the log's storage.  The smallest setup where they do is a
standalone master and one worker (``bin/spark-class
org.apache.spark.deploy.master.Master`` / ``...worker.Worker``, as Spark's own
``sbin/start-master.sh`` runs them): the worker launches each application's
executors as JVMs of their own, each with its own Python workers, and a
spark-submit driver reaches them over RPC.

Everything binds 127.0.0.1 and asks for port 0, reading the ports actually
bound from the master's log: a port chosen in advance could be taken before
the master binds it, and Spark would then silently move to the next one.
The master's REST submission server (fixed port 6066) is turned off for the
same reason.  Every process the cluster starts runs in a process group of its
own or under its work directory, and ``stop()`` ends them all and checks that
none is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import REPO, python_env

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
EXECUTOR_MEMORY = "512m"
# Every JVM here lives for seconds and does little: the C2 compiler's and the
# parallel collector's threads would only compete for two cores with the work
# itself.  Measured on 2 cores: half the CPU time and ~40% less wall time for
# the cluster test, with the same results.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_MASTER_UI_PORT = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")
_MASTER_ALIVE = "New state: ALIVE"


class ClusterError(AssertionError):
    """The cluster did not start, a job on it failed, or it left processes behind."""


def spark_home() -> Path:
    """The installed pyspark package: it is a complete SPARK_HOME (bin/, jars/)."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no output)"


def _poll(condition: Callable[[], Any], timeout: float, what: str,
          diagnose: Callable[[], str]) -> Any:
    """Return the first truthy value of ``condition()``; fail with ``diagnose()`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{diagnose()}")
        time.sleep(0.1)


def _process_group(pid: int) -> int | None:
    """The process group of a live process; None for a zombie (it only awaits its parent's
    wait, which may be a container's init that never reaps) or a process already gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name, in parentheses, may contain spaces: split after it.
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[2])


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


@dataclass
class StandaloneCluster:
    """One master and ``workers`` workers; ``submit`` runs an application on them.

    ``env`` is added to the environment of the daemons, the executors they
    launch and every driver: that is where a store's credentials or endpoint
    go when the log is not a local directory.  Worker ``i`` binds 127.0.0.``i+1``
    (Linux routes all of 127/8 to loopback): Spark places a speculative copy of a
    task only on a host that runs no attempt of it, so two workers on one address
    would never run one.
    """

    base: Path
    cores: int = 2  # per worker
    memory: str = "1g"
    workers: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    master_url: str = ""
    web_ui: str = ""
    _daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def work_dir(self) -> Path:
        """SPARK_WORKER_DIR: each executor runs (and logs) in ``app-*/<id>/`` under it."""
        return self.base / "work"

    def environment(self, host: str = "127.0.0.1") -> dict[str, str]:
        """What every process of the cluster sees: this checkout's txlog, Java, loopback only
        (``host``: the address a worker, and the executors it launches, bind)."""
        conf_dir = self.base / "conf"  # empty: no spark-env.sh or defaults from elsewhere
        conf_dir.mkdir(parents=True, exist_ok=True)
        env = python_env(dict(self.env))
        env.update({
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": host,
            "SPARK_WORKER_DIR": str(self.work_dir),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_DAEMON_JAVA_OPTS": SHORT_LIVED_JVM,  # the master and the worker
        })
        return env

    def _spawn(self, name: str, *args: str, host: str = "127.0.0.1") -> subprocess.Popen[bytes]:
        out = open(self.base / f"{name}.log", "wb")
        try:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args], env=self.environment(host),
                cwd=self.base, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            out.close()
        self._daemons[name] = proc
        return proc

    def _log(self, name: str) -> str:
        try:
            return (self.base / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def _from_log(self, name: str, pattern: re.Pattern[str]) -> str | None:
        proc = self._daemons[name]
        if proc.poll() is not None:
            raise ClusterError(f"the {name} exited with {proc.returncode}\n{self.diagnostics()}")
        match = pattern.search(self._log(name))
        return match.group(1) if match else None

    def _worker_names(self) -> list[str]:
        return ["worker", *(f"worker-{i + 1}" for i in range(1, self.workers))]

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once the master counts their cores."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(exist_ok=True)
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master",
                        "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")
            self.master_url = _poll(lambda: self._from_log("master", _MASTER_URL),
                                    START_TIMEOUT_S, "the master to bind", self.diagnostics)
            ui_port = _poll(lambda: self._from_log("master", _MASTER_UI_PORT),
                            START_TIMEOUT_S, "the master's web UI", self.diagnostics)
            self.web_ui = f"http://127.0.0.1:{ui_port}"
            _poll(lambda: _MASTER_ALIVE in self._log("master"), START_TIMEOUT_S,
                  "the master to become ALIVE", self.diagnostics)
            for i, name in enumerate(self._worker_names()):
                host = f"127.0.0.{i + 1}"
                self._spawn(name, "org.apache.spark.deploy.worker.Worker",
                            "--host", host, "--webui-port", "0", "--cores", str(self.cores),
                            "--memory", self.memory, "--work-dir", str(self.work_dir),
                            self.master_url, host=host)
            _poll(self._worker_registered, START_TIMEOUT_S,
                  "the workers to register with the master", self.diagnostics)
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's ``/json/``): workers, cores, applications."""
        # No proxy: an http_proxy in the environment must not capture a loopback request.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.web_ui}/json/", timeout=10) as response:
            return json.load(response)

    def _worker_registered(self) -> bool:
        for name in self._worker_names():
            worker = self._daemons[name]
            if worker.poll() is not None:
                raise ClusterError(f"the {name} exited with {worker.returncode}\n"
                                   f"{self.diagnostics()}")
        try:
            state = self.state()
        except OSError:
            return False
        return state.get("aliveworkers") == self.workers and \
            state.get("cores") == self.cores * self.workers

    def submit(self, script: str | os.PathLike[str], *args: str,
               conf: Mapping[str, str] | None = None, timeout: float = 300
               ) -> subprocess.CompletedProcess[str]:
        """``spark-submit --master spark://...`` of ``script args`` (client mode), run to its end.

        The project's spark-defaults.conf applies, as in the README; the
        executor gets ``EXECUTOR_MEMORY``, and driver and executor the JVM
        options of ``SHORT_LIVED_JVM``; ``conf`` overrides either.  A non-zero
        exit raises with the driver's and the executors' output.
        """
        settings = {"spark.executor.memory": EXECUTOR_MEMORY,
                    "spark.driver.extraJavaOptions": SHORT_LIVED_JVM,
                    "spark.executor.extraJavaOptions": SHORT_LIVED_JVM, **(conf or {})}
        command = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url,
                   "--properties-file", str(REPO / "spark_conf" / "spark-defaults.conf")]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        command += [str(script), *args]
        proc = subprocess.Popen(command, env=self.environment(), cwd=self.base,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver JVM and its Python workers
            out, err = proc.communicate()
            raise ClusterError(f"spark-submit {script} ran over {timeout}s\nstdout:\n{out[-3000:]}"
                               f"\nstderr:\n{err[-3000:]}\n{self.diagnostics()}") from None
        done = subprocess.CompletedProcess(command, proc.returncode, out, err)
        if done.returncode != 0:
            raise ClusterError(f"spark-submit {script} exited {done.returncode}\nstdout:\n"
                               f"{out[-3000:]}\nstderr:\n{err[-5000:]}\n{self.diagnostics()}")
        return done

    def diagnostics(self) -> str:
        """The daemons' logs and every executor's stderr, for failure messages."""
        parts = [f"--- {name} log:\n{_tail(self.base / f'{name}.log')}" for name in self._daemons]
        for stderr in sorted(self.work_dir.glob("app-*/*/stderr")):
            parts.append(f"--- executor {stderr.parent.parent.name}/{stderr.parent.name}:\n"
                         f"{_tail(stderr)}")
        return "\n".join(parts)

    def processes(self) -> list[int]:
        """Live processes of this cluster: the daemons' groups (executor JVMs are in the
        worker's) and anything running under the work directory (Python workers, which
        pyspark's daemon moves to a group of its own)."""
        groups = {proc.pid for proc in self._daemons.values()}
        work = str(self.work_dir.resolve())
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            group = _process_group(pid)
            if group is None:
                continue
            cwd = _cwd(pid)
            if group in groups or (cwd is not None and (cwd == work or cwd.startswith(work + "/"))):
                found.append(pid)
        return found

    def stop(self, check: bool = True) -> None:
        """SIGTERM the workers (they stop their executors), then the master; SIGKILL the rest.

        With ``check``, raise if any of the cluster's processes outlives the kill.
        """
        for name in (*self._worker_names(), "master"):
            proc = self._daemons.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self._daemons.values():
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        if check:
            _poll(lambda: not self.processes(), STOP_TIMEOUT_S, "the cluster's processes to end",
                  lambda: f"still running: {self.processes()}")


@contextmanager
def standalone_cluster(base: Path, env: Mapping[str, str] | None = None, cores: int = 2,
                       memory: str = "1g", workers: int = 1) -> Iterator[StandaloneCluster]:
    """A started cluster for the ``with`` block; stopped (and checked empty) after it."""
    cluster = StandaloneCluster(base, cores=cores, memory=memory, env=dict(env or {}),
                                workers=workers).start()
    try:
        yield cluster
    finally:
        cluster.stop()
