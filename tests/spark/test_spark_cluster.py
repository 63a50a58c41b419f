"""Exactly-once on a real cluster: a standalone master and worker on 127.0.0.1.

The other Spark tests run in local mode, where tasks share the driver's JVM.
Here the driver is a spark-submit process and the tasks run in an executor
JVM that the worker launched, with Python workers of its own: driver and
tasks meet only in the log's storage.  One cluster and one application serve
the module, because each start costs seconds of the ~60 s it may take.

The log lives on S3 (the test endpoint, tests/harness/s3_server.py), as a cluster's
would: the ``store`` fixture gives its root URL, the storage options this
process opens it with, the options every Spark read and write gets, and the
environment of the cluster and its drivers (changing that fixture alone moves
the tests to another store).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("pyspark")

if not sys.platform.startswith("linux"):  # the harness reads /proc to find its processes
    pytest.skip("the cluster harness needs Linux", allow_module_level=True)

from conftest import HARNESS_DIR  # noqa: E402
from spark_cluster import StandaloneCluster, standalone_cluster  # noqa: E402
from spark_io import hanging  # noqa: E402

from txlog import Log  # noqa: E402

JOBS = HARNESS_DIR / "spark_jobs.py"
ROWS = 10_000
# One executor takes the worker's two cores; a second executor JVM would add
# ~15 s of CPU to a 2-core machine.  Four attempts per task is Spark's default
# on a cluster, stated because the test depends on a retry.
APP_CONF = {"spark.task.maxFailures": "4"}


@dataclass(frozen=True)
class Store:
    """Where the cluster's jobs keep their logs, and what it takes to reach it."""

    root: str
    storage_options: dict[str, object] = field(default_factory=dict)  # Log(..., storage_options)
    spark_options: dict[str, str] = field(default_factory=dict)  # .option(k, v) on reads, writes
    env: dict[str, str] = field(default_factory=dict)  # the cluster's and drivers' environment

    def log_root(self, name: str) -> str:
        """A fresh log's URL under the store's root."""
        return f"{self.root.rstrip('/')}/{name}"

    def log(self, name: str) -> Log:
        """That log, opened from this process as the tests' checks need it."""
        return Log(self.log_root(name), storage_options=self.storage_options)


@pytest.fixture(scope="module")
def store(s3_server) -> Store:
    """A bucket on the test S3 endpoint (moto, tests/harness/s3_server.py): the driver and the
    executor JVMs' Python workers reach it as a cluster reaches S3.  The retried job
    passes the endpoint and credentials as ``txlog.storage.*`` options; the batch
    pipeline example opens its root with no options, so the cluster's environment
    carries them too (the AWS variables botocore reads)."""
    options = s3_server.storage_options
    spark_options = {"txlog.storage.endpoint_url": options["endpoint_url"],
                     "txlog.storage.key": options["key"],
                     "txlog.storage.secret": options["secret"],
                     "txlog.storage.client_kwargs.region_name":
                         options["client_kwargs"]["region_name"]}
    return Store(root=f"s3://{s3_server.create_bucket()}/cluster", storage_options=options,
                 spark_options=spark_options, env=s3_server.env)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, store) -> StandaloneCluster:
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), env=store.env) as started:
        yield started


def test_cluster_has_one_worker_with_its_cores(cluster):
    state = cluster.state()
    assert state["status"] == "ALIVE"
    assert [(w["host"], w["state"], w["cores"]) for w in state["workers"]] == [
        ("127.0.0.1", "ALIVE", 2)]


@dataclass(frozen=True)
class Application:
    """What the cluster application of spark_jobs.py (``cluster``) printed."""

    retried: dict[str, Any]  # its first part: the write with a failed attempt, read back
    stdout: str
    stderr: str  # the driver's log, where Spark reports failed task attempts


@pytest.fixture(scope="module")
def application(cluster, store, tmp_path_factory) -> Application:
    """One spark-submit for both tests below: an application's executors take ~10 s to start."""
    store.log("retried").create_topic("events", partitions=4)
    markers = tmp_path_factory.mktemp("attempts")
    out = cluster.submit(JOBS, "cluster", store.log_root("retried"), "events", str(ROWS),
                         str(markers), json.dumps(store.spark_options),
                         store.log_root("pipeline"), conf=APP_CONF)
    lines = [line for line in out.stdout.splitlines() if line.startswith("retried: ")]
    assert lines, out.stdout[-3000:]
    return Application(json.loads(lines[-1].removeprefix("retried: ")), out.stdout, out.stderr)


def test_task_retried_after_partial_write_on_executors_is_exactly_once(cluster, store,
                                                                        application):
    result = application.retried
    assert result["master"] == cluster.master_url
    attempts = {(a["partition"], a["attempt"]): a for a in result["attempts"]}
    assert set(attempts) == {(0, 0), (0, 1), (1, 0)}  # task 0 failed once and was retried
    assert attempts[(0, 0)]["failing"] and not attempts[(0, 1)]["failing"]
    assert "asks for partition 99" in application.stderr  # the failure was the planted one
    for attempt in attempts.values():  # every attempt ran in an executor JVM, not the driver's
        assert attempt["executor"], attempt
        assert attempt["jvm"] != result["driver_jvm"]

    # Spark's view, on the cluster: every row once; the failed attempt's partial
    # write is in the log, aborted (of its three batches of 1,000, what its data
    # objects had written when it failed: the staged rest never reaches the log).
    assert (result["committed"], result["distinct_keys"], result["keys_outside"]) == (ROWS, ROWS, 0)
    assert result["uncommitted"] > ROWS

    # The log's own view, from this process.
    log = store.log("retried")
    keys = [k for p in range(4) for k in log.read("events", p).column("key").to_pylist()]
    assert sorted(keys) == [b"k%06d" % i for i in range(ROWS)]
    for p in range(4):
        assert log.last_stable_offset("events", p) == log.end_offset("events", p)
    assert hanging(log) == []


def test_batch_pipeline_example_on_the_cluster(store, application):
    """The example's own entry point (what spark-submit of batch_pipeline.py runs), on the
    cluster's executors, after the job above in the same application."""
    assert "exactly once: OK" in application.stdout, application.stdout[-3000:]
    log = store.log("pipeline")
    paid = sum(log.read("paid-orders", p).num_rows for p in range(4))
    assert paid == 2000 - len(range(0, 2000, 3))  # every order not divisible by 3 is paid
    assert hanging(log) == []
