"""Timing hooks for ``stream_steps.py``, in every Python process of its queries.

This directory is on the PYTHONPATH of the Spark session that script starts,
so Python runs this file first in the driver's helper processes and in every
worker.  It does nothing unless TXLOG_STEP_TRACE names a directory; then each
hooked call appends one line to ``<dir>/<pid>.steps``: start and end (epoch
seconds), thread, step, detail.  The hooks wrap the txlog functions a
streaming micro-batch runs through, and the local storage's calls.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_DIR = os.environ.get("TXLOG_STEP_TRACE")
_lock = threading.Lock()
_out: Any = None


def record(start: float, end: float, step: str, detail: str = "") -> None:
    global _out
    with _lock:
        if _out is None:
            _out = open(os.path.join(_DIR or ".", f"{os.getpid()}.steps"), "a", buffering=1)
        _out.write(f"{start:.6f} {end:.6f} {threading.current_thread().name.replace(' ', '_')} "
                   f"{step} {detail}\n")


def _timed(fn: Callable, step: str, detail: Callable[..., str] | None) -> Callable:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            record(start, time.time(), step, detail(*args) if detail else "")
    return timed


def _hook(owner: Any, name: str, step: str, detail: Callable[..., str] | None = None) -> None:
    raw = owner.__dict__[name]
    if isinstance(raw, classmethod):
        setattr(owner, name, classmethod(_timed(raw.__func__, step, detail)))
    else:
        setattr(owner, name, _timed(raw, step, detail))


def _install() -> None:
    from txlog.clients import producer, sender
    from txlog.exactly_once import shared_transaction, stream_sink
    from txlog.spark import stream_reader, writer
    from txlog.storage import local

    for name in ("create", "write", "commit"):
        _hook(writer.TxlogStreamWriter, name, f"writer.{name}")
    for name in ("send_table", "prepare_transaction", "init_transactions",
                 "send_offsets_to_transaction"):
        _hook(producer.Producer, name, f"producer.{name}")
    for name in ("commit_batch", "claim", "is_committed", "_sink_producer"):
        _hook(stream_sink.StreamSink, name, f"sink.{name}")
    for name in ("join", "enlist", "commit"):
        _hook(shared_transaction.SharedTransaction, name, f"job.{name}")
    for name in ("latestOffset", "partitions"):
        _hook(stream_reader.TxlogStreamReader, name, f"source.{name}")
    for name in ("publish_if_absent", "publish_stream_if_absent", "read", "read_prefix",
                 "read_range", "list", "delete"):
        _hook(local.LocalStorage, name, f"storage.{name}", lambda self, path, *rest: path)
    encode = sender.encode_records
    sender.encode_records = _timed(encode, "encode", lambda table, codec: str(table.num_rows))

    read = stream_reader.TxlogStreamReader.read

    def read_all(self: Any, partition: Any) -> Iterator[Any]:
        # Spark takes each batch between two steps of the generator: the time is the
        # task's whole read, its hand-over to the JVM included.
        start = time.time()
        yield from read(self, partition)
        record(start, time.time(), "source.read")
    stream_reader.TxlogStreamReader.read = read_all  # type: ignore[method-assign]

    coalesced = writer._coalesced

    def waited(batches: Iterator[Any], target: int) -> Iterator[Any]:
        # Time spent waiting for Spark's rows, the floor's share of a task (a Python sink
        # that drops its batches waits as long).
        gathered = coalesced(batches, target)
        while True:
            start = time.time()
            table = next(gathered, None)
            record(start, time.time(), "writer.input", "" if table is None else
                   str(table.num_rows))
            if table is None:
                return
            yield table
    writer._coalesced = waited


if _DIR:
    _install()
