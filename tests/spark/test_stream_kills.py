"""The exactly-once test of the streaming pipeline: SIGKILL its driver at least 10 times.

See stream_kill_harness.py; run it directly with ``--kills`` and ``--records``
for longer runs.  The at-least-once run shows that the check catches
duplicates, so a pass of the exactly-once run means something; it needs
showing once, not in every CI run, so it runs with TXLOG_LARGE=1, as does the
run with the log on S3.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

import stream_kill_harness as harness  # noqa: E402
from conftest import LARGE  # noqa: E402
from txlog.examples.stream_pipeline import exactly_once  # noqa: E402


def test_exactly_once_survives_repeated_driver_kills(tmp_path):
    # 10,000 readings (about 100 transactions, a fifth aborted, spread over the
    # kills) give every restart input to read and leave the check thousands of
    # committed readings to match; more only lengthens the run (the JVM starts
    # dominate it).  The harness's command line runs larger ones.
    report = harness.run(str(tmp_path / "log"), kills=10, records=10_000,
                         delivery="exactly_once", seed=20261123,
                         log_path=str(tmp_path / "spark.log"))
    assert report["kills"] == 10
    assert report["final run exit code"] == 0, (tmp_path / "spark.log").read_text()[-5000:]
    assert report["committed readings"] > 5_000
    assert exactly_once(report), report


@LARGE
def test_exactly_once_survives_driver_kills_on_s3(tmp_path, s3_server, monkeypatch):
    # The same pipeline with its log on S3 (moto's server in this process), smaller:
    # every storage call is an HTTP request, and the JVM starts dominate anyway.  It
    # takes about 95 s on two cores, which the suite's 15 minutes cannot hold next to
    # the file:// run above, so it runs with TXLOG_LARGE=1.
    # The driver, its Python workers and this process reach the store through the
    # AWS environment variables; Spark's checkpoint stays on local disk.
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    report = harness.run(s3_server.root(), kills=3, records=2_000, delivery="exactly_once",
                         seed=20261124, log_path=str(tmp_path / "spark.log"),
                         checkpoint=str(tmp_path / "checkpoint"))
    assert report["kills"] == 3
    assert report["final run exit code"] == 0, (tmp_path / "spark.log").read_text()[-5000:]
    assert report["committed readings"] > 1_000
    assert exactly_once(report), report


@LARGE
def test_the_same_kills_duplicate_records_at_least_once(tmp_path):
    report = harness.run(str(tmp_path / "log"), kills=5, records=5_000,
                         delivery="at_least_once", seed=7, stop_at_first_duplicate=True,
                         log_path=str(tmp_path / "spark.log"), every_kill_after_a_write=True)
    assert report["duplicated"] > 0, report
    assert report["missing"] == 0  # at least once: nothing lost either
    assert not exactly_once(report)
