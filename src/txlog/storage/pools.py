"""Process-wide thread pools for work that mostly waits on storage requests.

Reads ahead, a transaction's markers, a flush's claims and a data object
written behind each overlap requests that do not depend on each other.  One
pool per kind, made on first use and kept for the process, so that a
process's many producers and readers share a bounded number of threads.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_POOLS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def shared_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """The pool ``name`` (its threads' name prefix), with ``threads`` threads."""
    with _LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            pool = _POOLS[name] = ThreadPoolExecutor(threads, thread_name_prefix=name)
        return pool
