"""One way to start a SparkSession for txlog: Java chosen, project defaults applied.

Tests, notebooks and examples all start Spark through ``spark_session`` so that
they run with the same settings (``spark_conf/spark-defaults.conf``) and never
fail for want of a suitable Java.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .java import ensure_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# src/txlog/spark/session.py -> repository root.  An installed (non-editable)
# copy has no repository around it: TXLOG_SPARK_DEFAULTS names the file then.
_REPO_DEFAULTS = Path(__file__).resolve().parents[3] / "spark_conf" / "spark-defaults.conf"


def defaults_path() -> Path | None:
    """The spark-defaults.conf to apply, if there is one."""
    env = os.environ.get("TXLOG_SPARK_DEFAULTS")
    if env:
        return Path(env)
    return _REPO_DEFAULTS if _REPO_DEFAULTS.is_file() else None


def read_spark_defaults(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse a spark-defaults.conf: ``key value`` per line, ``#`` comments.

    Like Spark's own reader, the key ends at the first run of whitespace (or
    ``=``/``:``, which Java properties files also accept) and the rest of the
    line, trimmed, is the value.
    """
    conf: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        for i, ch in enumerate(line):
            if ch.isspace() or ch in "=:":
                key, rest = line[:i], line[i:]
                break
        else:
            raise ValueError(f"{path}:{number}: {raw!r} has a key but no value")
        value = rest.strip()
        if value[:1] in ("=", ":"):
            value = value[1:].strip()
        conf[key] = value
    return conf


def spark_session(app_name: str, master: str | None = None, **conf: Any) -> SparkSession:
    """Start (or join) the process's SparkSession with txlog's defaults.

    ``conf`` overrides the file's values; pass Spark keys with dots as
    ``**{"spark.sql.shuffle.partitions": "2"}``.  Settings that only take
    effect at JVM start (master, UI, memory) are ignored when a session is
    already running, as with ``SparkSession.builder.getOrCreate``.
    """
    ensure_java()
    # Python workers must import txlog (format("txlog") is found by importing
    # pyspark_txlog in a worker); Spark's default, "python3" on PATH, may be
    # another interpreter than the one running this driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # imported late: txlog core works without pyspark

    path = defaults_path()
    merged: dict[str, str] = read_spark_defaults(path) if path is not None else {}
    if path is not None and _DRIVER_JAVA_OPTIONS in merged:
        merged[_DRIVER_JAVA_OPTIONS] = resolve_log4j_path(merged[_DRIVER_JAVA_OPTIONS],
                                                          Path(path).resolve().parent.parent)
    merged.update({k: _conf_value(v) for k, v in conf.items()})
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in merged.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
_LOG4J_FILE = re.compile(r"(-Dlog4j2?\.configurationFile=)(\S+)")


def resolve_log4j_path(java_options: str, root: Path) -> str:
    """``java_options`` with a relative ``-Dlog4j2.configurationFile`` made absolute under ``root``.

    spark-defaults.conf names the log4j file relative to the repository root,
    where the README's spark-submit commands run; a session started from a
    notebook or a test runs elsewhere, and log4j would then not find the file
    and fall back to Spark's INFO profile.  URLs and absolute paths stay.
    """
    def absolute(match: re.Match[str]) -> str:
        target = match.group(2)
        if ":" in target or os.path.isabs(target):
            return match.group(0)
        return match.group(1) + str(root / target)

    return _LOG4J_FILE.sub(absolute, java_options)


def _conf_value(value: Any) -> str:
    # Spark wants "true"/"false"; str(True) would give "True".
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
