"""Process-wide thread pools for work that mostly waits on storage requests.

Reads ahead, a transaction's markers, a flush's claims and a data object
written behind each overlap requests that do not depend on each other.  One
pool per kind, made on first use and kept for the process, so that a
process's many producers and readers share a bounded number of threads.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

# Reads in flight at once for one reader: ranged GETs ahead of the one being assembled.
READ_THREADS = 8
# The small reads of a refresh in flight at once: as many as s3fs keeps connections
# (botocore's default, 10), so that a cold partition's headers take as few waves as can be.
LOOKUP_THREADS = 10
# Partitions of one read of several worked on at once (each waits on its reads).
PARTITION_THREADS = 8

_POOLS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def shared_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """The pool ``name`` (its threads' name prefix), with ``threads`` threads."""
    with _LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            pool = _POOLS[name] = ThreadPoolExecutor(threads, thread_name_prefix=name)
        return pool


def read_pool() -> ThreadPoolExecutor:
    """Threads that load a read's batches: ranged reads ahead, and the batch objects a
    read must read whole first.  They wait on storage (and on a partition's lock, to
    follow a batch compaction moved) and never submit to a pool."""
    return shared_pool("txlog-read", READ_THREADS)


def partition_pool() -> ThreadPoolExecutor:
    """Threads that each work on one partition of a read of several (its requests before
    the data, then its data): they submit reads to ``read_pool``, never the other way."""
    return shared_pool("txlog-partition", PARTITION_THREADS)


def lookup_pool() -> ThreadPoolExecutor:
    """Threads for the small reads a refresh makes at once (listings, batch headers,
    ``topic.json``, version chains) while its caller may hold a partition's lock: they
    take no partition's lock and submit nothing, so that wait is never on a thread stuck
    behind it (a read-ahead thread can wait for that lock, to follow a moved batch)."""
    return shared_pool("txlog-lookup", LOOKUP_THREADS)
