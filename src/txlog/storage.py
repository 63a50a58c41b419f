"""The one storage primitive txlog builds on: publish-if-absent.

Every durable change is the creation of a new immutable object whose name is
its place in a sequence.  A backend only has to create an object atomically
and exclusively; everything else (offsets, transactions, group offsets) is
optimistic concurrency on top of that.

Paths given to a backend are relative to the log root and always use ``/``.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from typing import Any

import pyarrow as pa

from .errors import StorageError, UnsupportedStorageError

TMP_PREFIX = ".tmp-"
MMAP_MIN_BYTES = 1 << 20  # smaller objects are read into memory rather than mapped


def _check_relative(path: str) -> None:
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid storage path {path!r}: must be relative, without '.' or '..'")


class Storage(ABC):
    """A flat namespace of immutable objects under one root."""

    url: str

    @abstractmethod
    def publish_if_absent(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists.

        Returns False when another writer got there first.  Readers never see a
        partially written object under ``path``.
        """

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

        Temporary files of in-flight publishes are never listed.
        """

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove an object (or an empty directory); a missing one is not an error."""

    def remove_temp_files(self, older_than_s: float) -> list[str]:
        """Remove temp files of publishes that died, older than ``older_than_s``.

        Only backends that write a temp name first have any (the local one);
        object stores publish with one conditional request.
        """
        return []

    def delete_tree(self, directory: str) -> None:
        """Remove everything under ``directory``, deepest first."""
        for name in self.list(directory):
            child = f"{directory}/{name}"
            self.delete_tree(child)
            self.delete(child)
        self.delete(directory)


class LocalStorage(Storage):
    """POSIX directory: temp file, fsync, ``link`` (exclusive), fsync the directory.

    ``os.link`` fails with EEXIST when the target exists, which makes the
    publish exclusive, and the target appears only with its full contents.
    """

    def __init__(self, root: str, fsync: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        self.fsync = fsync  # directories, the root included, appear with the first publish

    def _abs(self, path: str) -> str:
        _check_relative(path)
        return os.path.join(self.root, *path.split("/"))

    def _fsync_dir(self, directory: str) -> None:
        if not self.fsync:
            return
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _makedirs(self, directory: str) -> None:
        if os.path.isdir(directory):
            return
        parent = os.path.dirname(directory)
        self._makedirs(parent)
        try:
            os.mkdir(directory)
        except FileExistsError:
            return
        self._fsync_dir(parent)

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        final = self._abs(path)
        directory = os.path.dirname(final)
        if os.path.exists(final):
            return False
        self._makedirs(directory)
        tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            os.unlink(tmp)  # a failed write (disk full) must not leave its temp file behind
            raise
        try:
            os.link(tmp, final)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        self._fsync_dir(directory)
        return True

    def read(self, path: str) -> bytes:
        with open(self._abs(path), "rb") as f:
            return f.read()

    def read_prefix(self, path: str, length: int) -> bytes:
        with open(self._abs(path), "rb") as f:
            return f.read(length)

    def read_buffer(self, path: str) -> pa.Buffer:
        # Large objects are memory-mapped: no copy, and the buffer stays valid
        # even if the file is deleted meanwhile.  Setting up a map costs more
        # than copying a small file, so those are simply read.
        with open(self._abs(path), "rb") as f:
            if os.fstat(f.fileno()).st_size < MMAP_MIN_BYTES:
                return pa.py_buffer(f.read())
            with pa.memory_map(f.name, "r") as mm:
                return mm.read_buffer()

    def read_range(self, path: str, start: int, length: int) -> pa.Buffer:
        with open(self._abs(path), "rb") as f:
            if length < MMAP_MIN_BYTES:
                f.seek(start)
                return pa.py_buffer(f.read(length))
            with pa.memory_map(f.name, "r") as mm:
                mm.seek(min(start, mm.size()))
                return mm.read_buffer(length)  # a view of the map: no copy

    def exists(self, path: str) -> bool:
        return os.path.exists(self._abs(path))

    def remove_temp_files(self, older_than_s: float) -> list[str]:
        """Safe at any time: a temp name is random, used by one publish call only, and
        never read; removing one under a writer stalled that long makes its link fail,
        an error its caller treats as an outcome-unknown publish and retries."""
        cutoff = time.time() - older_than_s
        removed = []
        for directory, _, names in os.walk(self.root):
            for name in names:
                if not name.startswith(TMP_PREFIX):
                    continue
                full = os.path.join(directory, name)
                try:
                    if os.lstat(full).st_mtime < cutoff:
                        os.unlink(full)
                        removed.append(os.path.relpath(full, self.root).replace(os.sep, "/"))
                except FileNotFoundError:
                    pass  # its publish finished (or another gc) meanwhile
        return sorted(removed)

    def list(self, directory: str) -> list[str]:
        try:
            names = os.listdir(self._abs(directory)) if directory else os.listdir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [n for n in names if not n.startswith(TMP_PREFIX)]

    def delete(self, path: str) -> None:
        full = self._abs(path)
        try:
            os.unlink(full)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            try:
                os.rmdir(full)
            except OSError:
                pass


class MemoryStorage(Storage):
    """A dict behind a lock: unit tests of the protocol without touching disk."""

    def __init__(self) -> None:
        self.url = f"memory://{uuid.uuid4().hex}"
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        _check_relative(path)
        with self._lock:
            if path in self._objects:
                return False
            self._objects[path] = bytes(data)
            return True

    def read(self, path: str) -> bytes:
        _check_relative(path)  # refuse the same paths LocalStorage refuses
        with self._lock:
            try:
                return self._objects[path]
            except KeyError:
                raise FileNotFoundError(path) from None

    def read_prefix(self, path: str, length: int) -> bytes:
        return self.read(path)[:length]

    def exists(self, path: str) -> bool:
        _check_relative(path)
        with self._lock:
            return path in self._objects

    def list(self, directory: str) -> list[str]:
        prefix = directory.rstrip("/") + "/" if directory else ""
        with self._lock:
            keys = [k[len(prefix):] for k in self._objects if k.startswith(prefix)]
        return sorted({k.split("/", 1)[0] for k in keys})

    def delete(self, path: str) -> None:
        _check_relative(path)
        with self._lock:
            self._objects.pop(path, None)


class FsspecStorage(Storage):
    """Object stores reached through fsspec, publishing with exclusive mode ``"xb"``.

    S3 (If-None-Match), GCS (ifGenerationMatch=0) and Azure honour ``"xb"``
    atomically.  fsspec's local and in-memory filesystems do not, which is why
    local paths go to LocalStorage instead.
    """

    def __init__(self, fs: Any, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url

    def _abs(self, path: str) -> str:
        _check_relative(path)
        return f"{self.root}/{path}"

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        if not data:
            # s3fs's empty exclusive put is not exclusive: never publish empty objects.
            raise StorageError(f"refusing to publish an empty object at {path!r}")
        try:
            with self.fs.open(self._abs(path), "xb") as f:
                f.write(data)
        except FileExistsError:
            return False
        return True

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(self._abs(path))

    def read_prefix(self, path: str, length: int) -> bytes:
        return self.fs.cat_file(self._abs(path), start=0, end=length)

    def read_range(self, path: str, start: int, length: int) -> pa.Buffer:
        return pa.py_buffer(self.fs.cat_file(self._abs(path), start=start, end=start + length))

    def exists(self, path: str) -> bool:
        return self.fs.exists(self._abs(path))

    def list(self, directory: str) -> list[str]:
        try:
            entries = self.fs.ls(self._abs(directory) if directory else self.root, detail=False)
        except FileNotFoundError:
            return []
        names = [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]
        return [n for n in names if not n.startswith(TMP_PREFIX)]

    def delete(self, path: str) -> None:
        try:
            self.fs.rm(self._abs(path), recursive=True)
        except FileNotFoundError:
            pass


_EXCLUSIVE_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "az", "abfss"}
_memory_roots: dict[str, MemoryStorage] = {}
_memory_lock = threading.Lock()


def open_storage(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
                 fsync: bool = True) -> Storage:
    """Pick the backend for a root given as a path or a URL.

    ``memory://name`` gives a process-local store shared by every Log opened
    with the same name (for tests).
    """
    if isinstance(url, Storage):
        return url
    url = os.fspath(url)
    if "://" not in url or url.startswith("file://"):
        local = url[len("file://"):] if url.startswith("file://") else url
        return LocalStorage(local, fsync=fsync)
    protocol = url.split("://", 1)[0].lower()
    if protocol == "memory":
        with _memory_lock:
            store = _memory_roots.get(url)
            if store is None:
                store = _memory_roots[url] = MemoryStorage()
                store.url = url  # so that Log(log.root) reopens this same store
            return store
    if protocol in ("hdfs", "viewfs", "webhdfs"):
        raise UnsupportedStorageError(
            f"{url}: HDFS cannot create a file only if it is absent through fsspec/pyarrow, "
            "so it cannot hold a txlog root")
    if protocol not in _EXCLUSIVE_PROTOCOLS:
        raise UnsupportedStorageError(
            f"{url}: protocol {protocol!r} is not known to support exclusive creation "
            f"(supported: local paths, memory://, {', '.join(sorted(_EXCLUSIVE_PROTOCOLS))})")
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return FsspecStorage(fs, root, url)
