"""The one storage primitive txlog builds on: publish-if-absent.

Every durable change is the creation of a new immutable object whose name is
its place in a sequence.  A backend only has to create an object atomically
and exclusively; everything else (offsets, transactions, group offsets) is
optimistic concurrency on top of that.

Paths given to a backend are relative to the log root and always use ``/``.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Iterable

import pyarrow as pa

from ..errors import StorageError

# What a streamed publish may buffer (an object store's multipart part): compaction's
# default memory bound, whatever segment.bytes is (partition/compaction.py).
DEFAULT_PART_BYTES = 32 << 20


def check_relative(path: str) -> None:
    """Refuse a path that could reach outside the root (absolute, ``..``) or that names
    one object two ways (empty or ``.`` components)."""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid storage path {path!r}: must be relative, without '.' or '..'")



class Storage(ABC):
    """A flat namespace of immutable objects under one root."""

    url: str
    # Each request waits on a network round trip: worth overlapping several (readers
    # fetch ahead), and worth fewer, larger writes (the producer's defaults for such a
    # store, clients/producer_settings.py); local and in-memory requests are cheaper
    # than a thread hand-off.
    remote: bool = False

    @abstractmethod
    def publish_if_absent(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists.

        Returns False when another writer got there first.  Readers never see a
        partially written object under ``path``.
        """

    def publish_stream_if_absent(self, path: str, chunks: Iterable[bytes | pa.Buffer],
                                 size: int, part_bytes: int = DEFAULT_PART_BYTES) -> bool:
        """``publish_if_absent`` of the concatenation of ``chunks``, ``size`` bytes in all,
        without holding them all at once where the backend allows (compaction
        streams a segment of up to segment.bytes through this).

        Readers never see the object before it is whole, exactly as with
        ``publish_if_absent``.  A stream that yields other than ``size`` bytes
        publishes nothing (StorageError): the object's header was written from
        ``size``, so any other length would be a damaged object under a valid
        name.  An exception raised by ``chunks`` publishes nothing either and
        propagates.  ``part_bytes`` is what a backend may buffer (an object
        store's part); this default joins the chunks and publishes once.
        """
        data = joined_chunks(path, chunks, size)
        return self.publish_if_absent(path, data)

    @abstractmethod
    def read(self, path: str) -> bytes:
        """Whole object; FileNotFoundError if absent."""

    @abstractmethod
    def read_prefix(self, path: str, length: int) -> bytes:
        """The first ``length`` bytes (fewer if the object is shorter)."""

    def read_buffer(self, path: str) -> pa.Buffer:
        """Whole object as an Arrow buffer (zero-copy where the backend allows)."""
        return pa.py_buffer(self.read(path))

    def read_range(self, path: str, start: int, length: int) -> pa.Buffer:
        """Bytes ``[start, start + length)`` of an object (fewer past its end), as a buffer.

        Segments hold many batches: a read of a few of them fetches only their
        bytes (an object store's ranged GET), never the whole segment.
        """
        return pa.py_buffer(self.read(path)[start:start + length])

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def list(self, directory: str) -> list[str]:
        """Names (not paths) directly under ``directory``; [] if it does not exist.

        A sub-directory that holds an object is named too (an empty one may be):
        a partition's cold load relies on it to skip listing an absent
        ``segments`` or ``snapshots`` (docs/protocol.md 1.8).  Temporary files of
        in-flight publishes are never listed.
        """

    def make_durable(self, path: str) -> None:
        """Make sure the existing object ``path``, which another writer may have published
        a moment ago, is durable before the caller acts on it.

        A publish is durable when it returns, but others can see the object a little
        earlier: on local disk, between its ``link`` and its directory's fsync.  An
        object store's object is durable once visible, so this default does nothing.
        """
        return None

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove an object (or an empty directory); a missing one is not an error."""

    def list_times(self, directory: str) -> builtins.list[tuple[str, float]]:
        """Names directly under ``directory`` with the time each object was created, in
        seconds since the epoch (the store's clock): gc of data objects goes by age."""
        raise NotImplementedError(f"{type(self).__name__} cannot tell objects' ages")

    def remove_temp_files(self, older_than_s: float) -> builtins.list[str]:
        """Remove temp files of publishes that died, older than ``older_than_s``.

        Only backends that write a temp name first have any: the local one, and
        S3, whose streamed publishes are multipart uploads until completed;
        other object stores publish with one conditional request.
        """
        return []

    def delete_tree(self, directory: str) -> None:
        """Remove everything under ``directory``, deepest first."""
        for name in self.list(directory):
            child = f"{directory}/{name}"
            self.delete_tree(child)
            self.delete(child)
        self.delete(directory)


def length_mismatch(path: str, got: int, size: int) -> str:
    return (f"stream for {path!r} yielded {got} bytes, {size} were promised: nothing "
            "published")


def joined_chunks(path: str, chunks: Iterable[bytes | pa.Buffer], size: int) -> bytes:
    """The chunks as one bytes object, checked to be ``size`` long (the backends that
    cannot stream: memory://, and object stores without multipart uploads here)."""
    data = b"".join(memoryview(c).cast("B") for c in chunks)
    if len(data) != size:
        raise StorageError(length_mismatch(path, len(data), size))
    return data
