"""Producer-id allocation: blocks of ids claimed with publish-if-absent.

Block ``k`` owns ids ``[k * BLOCK_SIZE, (k + 1) * BLOCK_SIZE)``.  Claiming a
block is publishing ``coordinator/producer-ids/<k, 20 digits>``; only one
process can publish a given k, so ids are unique across processes without any
further coordination.  Ids a process does not hand out before it exits are
simply never used.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

import msgpack

from .. import clock
from ..storage.contract import Storage
from ..storage.paths import BLOCK_DIR, block_path

BLOCK_SIZE = 1000


class ProducerIdAllocator:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._lock = threading.Lock()
        self._next = 0
        self._limit = 0  # exclusive; next == limit means: claim a new block

    def _claim_block(self) -> int:
        names = self.storage.list(BLOCK_DIR)
        block = max((int(n) for n in names if n.isdigit()), default=-1) + 1
        owner = msgpack.packb({"owner": uuid.uuid4().hex, "host": socket.gethostname(),
                               "pid": os.getpid(), "time_ms": clock.now_ms()})
        while not self.storage.publish_if_absent(block_path(block), owner):
            block += 1
        return block

    def next_id(self) -> int:
        with self._lock:
            if self._next >= self._limit:
                block = self._claim_block()
                self._next, self._limit = block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE
            pid = self._next
            self._next += 1
            return pid
