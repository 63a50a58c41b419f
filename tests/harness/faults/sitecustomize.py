"""Fault injection in every Python process of a Spark application that puts this
directory on PYTHONPATH (the driver's and executors' Python workers too).

With TXLOG_TEST_MARKER_FAULTS naming a directory (tests/harness/spark_jobs.py
commit-faults): marker writes that fail.  While that directory holds a file
``mode`` reading ``always``, every marker write fails; reading ``once``, only the
first one does.  Each injected failure leaves a file ``failed-<n>`` there, so the
test can tell that it happened.

With TXLOG_TEST_ATTEMPT_FAULTS naming a directory (the standalone cluster of
tests/spark/test_spark_cluster.py): task attempts of a batch write that die or
outlive their task, as planned for a topic by a file ``plan-<topic>.json`` there
(none: the write is left alone).  ``{"task": T, "action": "exit"}``: attempt 0 of
task T sends all its records, flushes them, leaves ``sent-<topic>.json`` (its
transactional id, producer id and epoch) and ends its Python worker with
``os._exit``, a process killed after it wrote; with ``"stall"`` instead, it holds
on there, its transaction open, until Spark kills it (a slow attempt that a
speculative copy overtakes).  ``{"task": T, "action": "outlive",
"fail": "first" | "all"}``: attempt 0 of task T starts tests/harness/straggler.py
with the job it holds, to join it once it is decided (leaving ``straggler-<topic>.json``),
then fails before writing; with ``all`` every later attempt of T fails too, so the
job is aborted, with ``first`` the retry writes and the job commits.
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


_ATTEMPTS = os.environ.get("TXLOG_TEST_ATTEMPT_FAULTS")

if _ATTEMPTS:
    import json
    import pickle
    import subprocess
    import sys
    import time

    from txlog.exactly_once.shared_transaction import attempt_key
    from txlog.spark.writer import TxlogBatchWriter

    _STRAGGLER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "straggler.py")
    _original_write = TxlogBatchWriter.write

    def _plan(topic):
        try:
            with open(os.path.join(_ATTEMPTS, f"plan-{topic}.json")) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _send_then(send_all, topic, action):
        def planted(root, start, iterator, config):
            producer, records = send_all(root, start, iterator, config)
            producer.flush()  # every record in the partitions: the transaction is open
            with open(os.path.join(_ATTEMPTS, f"sent-{topic}.json"), "w") as f:
                json.dump({"transactional_id": producer.transactional_id, "records": records,
                           "producer_id": producer.producer_id, "epoch": producer.epoch}, f)
            if action == "exit":
                os._exit(17)
            deadline = time.monotonic() + 120  # until Spark kills this worker
            while time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError(f"planted: attempt 0 of {topic} stalled 120 s, never killed")
        return planted

    def _start_straggler(writer, key, topic):
        job = os.path.join(_ATTEMPTS, f"job-{topic}.pickle")
        with open(job, "wb") as f:
            pickle.dump(writer.job, f)
        with open(os.path.join(_ATTEMPTS, f"straggler-{topic}.log"), "wb") as out:
            subprocess.Popen(
                [sys.executable, _STRAGGLER, job, writer.options.path,
                 json.dumps(writer.options.storage_options), key, topic,
                 os.path.join(_ATTEMPTS, f"straggler-{topic}.json")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    def _planted_write(self, iterator):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        topic = self.options.topic
        plan = _plan(topic) if self.job is not None and ctx is not None else None
        if plan is None or ctx.partitionId() != plan["task"]:
            return _original_write(self, iterator)
        first = ctx.attemptNumber() == 0
        if plan["action"] in ("exit", "stall") and first:
            self._send_all = _send_then(self._send_all, topic, plan["action"])
        elif plan["action"] == "outlive":
            if first:
                _start_straggler(self, attempt_key(ctx.partitionId(), 0), topic)
            if first or plan["fail"] == "all":
                raise RuntimeError(f"planted: attempt {ctx.attemptNumber()} of task "
                                   f"{ctx.partitionId()} fails, its straggler goes on")
        return _original_write(self, iterator)

    TxlogBatchWriter.write = _planted_write
