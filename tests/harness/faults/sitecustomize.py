"""Fault injection for tests/harness/spark_jobs.py commit-faults: marker writes that fail.

Put on PYTHONPATH only for that application, so that every Python process
Spark starts (the driver's workers, where a batch job commits) loads it.
With TXLOG_TEST_MARKER_FAULTS naming a directory: while that directory holds
a file ``mode`` reading ``always``, every marker write fails; reading
``once``, only the first one does.  Each injected failure leaves a file
``failed-<n>`` there, so the test can tell that it happened.
"""

import os

_DIR = os.environ.get("TXLOG_TEST_MARKER_FAULTS")

if _DIR:
    import uuid

    from txlog.partition.partition_log import PartitionLog

    _original = PartitionLog.append_marker

    def _failing_append_marker(self, *args, **kwargs):
        try:
            with open(os.path.join(_DIR, "mode")) as f:
                mode = f.read().strip()
        except FileNotFoundError:
            mode = ""
        fail = mode == "always"
        if mode == "once":
            try:
                os.close(os.open(os.path.join(_DIR, "once-taken"), os.O_CREAT | os.O_EXCL))
                fail = True
            except FileExistsError:
                pass
        if fail:
            open(os.path.join(_DIR, f"failed-{uuid.uuid4().hex}"), "w").close()
            raise OSError("injected by tests/harness/faults/sitecustomize.py: "
                          "the marker write failed")
        return _original(self, *args, **kwargs)

    PartitionLog.append_marker = _failing_append_marker
