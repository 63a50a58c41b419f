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
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

if not sys.platform.startswith("linux"):  # the harness reads /proc to find its processes
    pytest.skip("the cluster harness needs Linux", allow_module_level=True)

from conftest import HARNESS_DIR, LARGE  # noqa: E402
from helpers_core import nothing_holds_the_lso  # noqa: E402
from spark_cluster import StandaloneCluster, standalone_cluster  # noqa: E402
from spark_io import hanging  # noqa: E402
from spark_jobs import ATTEMPT_PLANS  # noqa: E402

from txlog import READ_UNCOMMITTED, Log  # noqa: E402
from txlog.transactions.metadata import TxnState  # noqa: E402

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
def attempt_faults(tmp_path_factory) -> Path:
    """Where the application's planted attempts are planned and leave their traces
    (tests/harness/faults/sitecustomize.py, on the cluster's PYTHONPATH)."""
    return tmp_path_factory.mktemp("attempt-faults")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, store, attempt_faults) -> StandaloneCluster:
    with standalone_cluster(tmp_path_factory.mktemp("cluster"),
                            env=faulty(store, attempt_faults)) as started:
        yield started


def faulty(store: Store, attempt_faults: Path) -> dict[str, str]:
    """The store's environment, with the planted attempts' hook in every Python process."""
    return {**store.env, "PYTHONPATH": str(HARNESS_DIR / "faults"),
            "TXLOG_TEST_ATTEMPT_FAULTS": str(attempt_faults)}


def test_cluster_has_one_worker_with_its_cores(cluster):
    state = cluster.state()
    assert state["status"] == "ALIVE"
    assert [(w["host"], w["state"], w["cores"]) for w in state["workers"]] == [
        ("127.0.0.1", "ALIVE", 2)]


@dataclass(frozen=True)
class Application:
    """What the cluster application of spark_jobs.py (``cluster``) printed."""

    retried: dict[str, Any]  # its first part: the write with a failed attempt, read back
    attempts: dict[str, Any]  # its second: per topic, the pooled job's planted attempt
    stdout: str
    stderr: str  # the driver's log, where Spark reports failed task attempts


@pytest.fixture(scope="module")
def application(cluster, store, tmp_path_factory) -> Application:
    """One spark-submit for both tests below: an application's executors take ~10 s to start."""
    store.log("retried").create_topic("events", partitions=4)
    for topic in ATTEMPT_PLANS:
        store.log("attempts").create_topic(topic, partitions=4)
    markers = tmp_path_factory.mktemp("attempts")
    out = cluster.submit(JOBS, "cluster", store.log_root("retried"), "events", str(ROWS),
                         str(markers), json.dumps(store.spark_options),
                         store.log_root("attempts"), store.log_root("pipeline"), conf=APP_CONF)
    return Application(printed(out.stdout, "retried"), printed(out.stdout, "attempts"),
                       out.stdout, out.stderr)


def printed(stdout: str, name: str) -> dict[str, Any]:
    """The JSON an application printed as ``<name>: {...}``."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"{name}: ")]
    assert lines, stdout[-3000:]
    return json.loads(lines[-1].removeprefix(f"{name}: "))


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
    assert nothing_holds_the_lso(log, "events", 4)
    assert hanging(log) == []


def test_batch_pipeline_example_on_the_cluster(store, application):
    """The example's own entry point (what spark-submit of batch_pipeline.py runs), on the
    cluster's executors, after the job above in the same application."""
    assert "exactly once: OK" in application.stdout, application.stdout[-3000:]
    log = store.log("pipeline")
    paid = sum(log.read("paid-orders", p).num_rows for p in range(4))
    assert paid == 2000 - len(range(0, 2000, 3))  # every order not divisible by 3 is paid
    assert hanging(log) == []


# --- pooled attempts that die or outlive their task (issue 33) -----------------------------

ATTEMPT_ROWS = 4_000  # spark_jobs.py attempts: per job, from two tasks


def keys(log: Log, topic: str, isolation: str = "read_committed") -> list[bytes]:
    return sorted(k for p in range(4)
                  for k in log.read(topic, p, isolation_level=isolation).column("key").to_pylist())


def ongoing(log: Log, prefix: str) -> list[str]:
    """The chains of ``prefix``'s attempts that stand Ongoing, as stored (not rolled forward)."""
    return [t for t in log.coordinator.transactional_ids()
            if t.startswith(f"{prefix}-") and log.coordinator.metadata(t).state == TxnState.ONGOING]


def test_a_killed_pooled_attempt_is_fenced_and_its_retry_writes_each_row_once(store,
                                                                              application):
    """The job names no prefix, so it leases a slot of the topic's pool.  Task 0's first
    attempt sends its 2,000 rows, flushes them and its Python worker dies (os._exit):
    its transaction is open in the partitions.  Spark retries the task in the same job,
    on the same slot, under the id of attempt 1.  Each row is committed once; the dead
    attempt's transaction ends aborted, at a later epoch of its producer (fenced: a
    worker of it still running could send nothing more).  Fails with attempt ids that
    ignore the attempt number (``attempt_key``): the retry then takes the dead
    attempt's id and its InitProducerId aborts the job it shares."""
    result = application.attempts["killed"]
    assert result["error"] is None
    dead = result["planted"]
    assert dead["transactional_id"] == "spark-killed.pool-0-r0-0" and dead["records"] > 0
    log = store.log("attempts")
    assert hanging(log) == []
    assert keys(log, "killed") == [b"k%06d" % i for i in range(ATTEMPT_ROWS)]
    assert len(keys(log, "killed", READ_UNCOMMITTED)) == ATTEMPT_ROWS + dead["records"]
    fenced = log.coordinator.metadata(dead["transactional_id"])
    assert fenced.state == TxnState.COMPLETE_ABORT
    assert fenced.producer_id == dead["producer_id"] and fenced.epoch > dead["epoch"]
    retry = log.coordinator.metadata("spark-killed.pool-0-r0-1")
    assert retry.state == TxnState.COMPLETE_COMMIT
    assert nothing_holds_the_lso(log, "killed", 4)


@pytest.mark.parametrize("topic", ["outlived-commit", "outlived-abort"])
def test_an_attempt_outliving_its_task_is_refused_by_the_decided_job_and_leaves_nothing_open(
        store, application, topic):
    """Task 1's first attempt leaves a process that goes on after the task failed
    (tests/harness/straggler.py, as a killed task's worker runs on): once the job is
    decided (its retry wrote and the job committed; or every attempt failed and Spark
    aborted it), the straggler joins it under the first attempt's pooled id and sends.
    The send fails, no partition changes, and after gc with every age at 0 no chain of
    the job is Ongoing.  Spark's twin of test_an_attempt_joining_a_decided_job_leaves_
    nothing_open (tests/exactly_once/test_shared_transaction.py).  Fails without
    `_join`'s check of a standing decision for an id that is not Ongoing (the
    straggler's id goes Ongoing under the decided job and stays so)."""
    commit = topic == "outlived-commit"
    result = application.attempts[topic]
    straggler = result["planted"]
    if commit:
        assert result["error"] is None
    else:
        assert "planted: attempt 3 of task 1 fails" in result["error"]
    assert straggler["commit"] == commit
    assert straggler["transactional_id"] == f"spark-{topic}.pool-0-r1-0"
    assert straggler["error"] is not None
    assert straggler["after"] == straggler["before"]
    log = store.log("attempts")
    log.gc(chain_age_s=0, decision_age_s=0, temp_age_s=0, data_age_s=0)
    assert ongoing(log, straggler["prefix"]) == []
    assert [[log.end_offset(topic, p), log.read(topic, p, isolation_level=READ_UNCOMMITTED)
             .num_rows] for p in range(4)] == straggler["after"]  # nor any time since
    assert keys(log, topic) == ([b"k%06d" % i for i in range(ATTEMPT_ROWS)] if commit else [])
    assert hanging(log) == []


# --- speculation on two workers ------------------------------------------------------------

# Speculate as soon as one of the job's two tasks is done and the other has run half as
# long again; "efficiency" off, so that a task is judged by its run time alone.  Both
# executors (one core each) must be up before the job, or task 0 could hold the only one.
SPECULATION = {"spark.speculation": "true", "spark.speculation.interval": "100ms",
               "spark.speculation.quantile": "0.5", "spark.speculation.multiplier": "1.5",
               "spark.speculation.minTaskRuntime": "100ms",
               "spark.speculation.efficiency.enabled": "false", "spark.cores.max": "2",
               "spark.scheduler.minRegisteredResourcesRatio": "1.0",
               "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s"}


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, store, attempt_faults) -> StandaloneCluster:
    """A cluster of its own: two workers of one core, on 127.0.0.1 and 127.0.0.2 (Spark
    runs a speculative copy only on a host without an attempt of its task)."""
    with standalone_cluster(tmp_path_factory.mktemp("two-workers"), cores=1, workers=2,
                            env=faulty(store, attempt_faults)) as started:
        yield started


@LARGE
def test_speculative_copies_on_two_workers_write_each_row_once_and_losers_leave_nothing_open(
        two_workers, store, attempt_faults, tmp_path):
    """Task 0's first attempt writes its rows and then holds on, its transaction open (the
    planted ``stall`` of tests/harness/faults/sitecustomize.py); Spark runs a speculative
    copy on the other worker, which wins, and kills the first.  Every row is committed
    once, the loser's records are in the log aborted, and nothing is left open, before
    gc or after.  Fails with attempt ids that ignore the attempt number: the copy then
    fences the loser under one id and the job is aborted."""
    assert sorted(w["host"] for w in two_workers.state()["workers"]) == ["127.0.0.1",
                                                                         "127.0.0.2"]
    store.log("speculated").create_topic("speculated", partitions=4)
    (attempt_faults / "plan-speculated.json").write_text('{"task": 0, "action": "stall"}')
    markers = tmp_path / "attempts"
    markers.mkdir()
    out = two_workers.submit(JOBS, "speculation", store.log_root("speculated"), "speculated",
                             str(ROWS), str(markers), json.dumps(store.spark_options),
                             conf={**APP_CONF, **SPECULATION})
    result = printed(out.stdout, "speculated")
    hosts = {(a["partition"], a["attempt"]): a["host"] for a in result["attempts"]}
    assert set(hosts) == {(0, 0), (0, 1), (1, 0)}  # task 0 ran twice: the copy
    assert hosts[(0, 0)] != hosts[(0, 1)] and None not in hosts.values()
    assert (result["committed"], result["distinct_keys"], result["keys_outside"]) == (ROWS, ROWS, 0)
    loser = json.loads((attempt_faults / "sent-speculated.json").read_text())
    assert loser["transactional_id"] == "spark-speculated.pool-0-r0-0"
    assert result["uncommitted"] == ROWS + loser["records"]  # the loser's rows, aborted
    log = store.log("speculated")
    assert hanging(log) == []
    assert nothing_holds_the_lso(log, "speculated", 4)
    log.gc(chain_age_s=0, decision_age_s=0, temp_age_s=0, data_age_s=0)
    assert ongoing(log, "spark-speculated.pool-0") == []
