"""The Logs a Spark Python worker keeps from one task to the next.

Spark reuses a Python worker for many tasks (``spark.python.worker.reuse``,
on by default), as it reuses a Kafka producer per executor in its own Kafka
sink.  A task that opened a new ``Log`` started cold: it read the root
marker and the topic's description, claimed a block of producer ids and
loaded every partition's producer state from the newest snapshot or
segment, reading the header of each batch since.  On an object
store that is one request per batch appended since the last snapshot, per
partition and per task; a stream's micro-batch paid it again every time.

A kept ``Log`` refreshes instead: its partitions' cached states are proven
current by every refresh (docs/protocol.md 1), so a task reads only what
was appended since the worker's last task.  What a new ``Log`` would look
up again is looked up again (``Log.revalidate``): the root marker, whose
change means the root was deleted and created anew under the worker (the
kept ``Log`` is then dropped), and the topics' descriptions.
"""

from __future__ import annotations

import json
from typing import Any

from ..api.log import Log
from ..storage.lru import LruDict

KEPT_LOGS = 8  # roots per worker; the least recently used is dropped beyond that

_logs: LruDict[tuple[str, str], Log] = LruDict(KEPT_LOGS)


def worker_log(path: str, storage_options: dict[str, Any] | None, create: bool) -> Log:
    """This worker's ``Log`` of ``path`` with these options, revalidated, or a new one."""
    key = (str(path), json.dumps(storage_options or {}, sort_keys=True, default=repr))
    log = _logs.get(key)
    if log is not None and log.services.revalidate():
        return log
    log = Log(path, storage_options=storage_options, create=create)
    _logs[key] = log
    return log
