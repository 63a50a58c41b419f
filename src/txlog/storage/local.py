"""Local files: a POSIX directory as a txlog root."""

from __future__ import annotations

import itertools
import os
import secrets
import time
from collections.abc import Iterable

import pyarrow as pa

from ..errors import StorageError
from .contract import DEFAULT_PART_BYTES, Storage, check_relative, length_mismatch
from .paths import TMP_PREFIX

MMAP_MIN_BYTES = 1 << 20  # smaller objects are read into memory rather than mapped


class _TempNames:
    """Names for temp files: a random prefix per process and a counter.

    A uuid4 per publish was a getrandom call (and the GIL given up around it) on
    every publish. The names need only differ between publishes that may run at
    once; a forked child draws a prefix of its own, and a clash that happens
    anyway only costs one retry (the temp file is created exclusively).
    """

    def __init__(self) -> None:
        self._renew()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._prefix = f"{TMP_PREFIX}{secrets.token_hex(8)}-"
        self._count = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._count)}"

    def clashed(self) -> None:
        self._renew()


_TEMP_NAMES = _TempNames()


class LocalStorage(Storage):
    """POSIX directory: temp file, fsync, ``link`` (exclusive), fsync the directory.

    ``os.link`` fails with EEXIST when the target exists, which makes the
    publish exclusive, and the target appears only with its full contents.
    """

    def __init__(self, root: str, fsync: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.url = self.root
        self.fsync = fsync  # directories, the root included, appear with the first publish
        self._durable_dirs: dict[str, int] = {}  # path -> inode made durable (_makedirs)

    def _abs(self, path: str) -> str:
        check_relative(path)
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
        """Make ``directory`` and its entry in its parent durable, up to the root's own.

        A directory that exists may not be durable yet: another writer made it and
        has not fsynced its parent (or died before it could), and a publish into it
        would then be lost with it at a power cut although it returned.  So its
        parent is fsynced whoever made it, once per directory and storage
        (docs/format.md, section 9), and again if it was removed and made anew
        (another inode).  Directories above the root are the user's.
        """
        try:
            inode: int | None = os.stat(directory).st_ino
        except FileNotFoundError:
            inode = None
        if inode is not None and (self._durable_dirs.get(directory) == inode
                                  or len(directory) < len(self.root)):
            return
        parent = os.path.dirname(directory)
        self._makedirs(parent)
        try:
            os.mkdir(directory)
        except FileExistsError:
            pass
        inode = os.stat(directory).st_ino  # before the fsync, which then covers its entry
        self._fsync_dir(parent)
        self._durable_dirs[directory] = inode

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        return self._publish_chunks(path, (data,), None)

    def publish_stream_if_absent(self, path: str, chunks: Iterable[bytes | pa.Buffer],
                                 size: int, part_bytes: int = DEFAULT_PART_BYTES) -> bool:
        """Each chunk goes to the temp file as it comes (the page cache holds the
        rest): memory is one chunk, whatever ``size`` is."""
        return self._publish_chunks(path, chunks, size)

    def _publish_chunks(self, path: str, chunks: Iterable[bytes | pa.Buffer],
                        size: int | None) -> bool:
        final = self._abs(path)
        directory = os.path.dirname(final)
        if os.path.exists(final):
            return False
        self._makedirs(directory)
        while True:
            tmp = os.path.join(directory, _TEMP_NAMES.next())
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                _TEMP_NAMES.clashed()
        try:
            try:
                total = 0
                for chunk in chunks:
                    view = memoryview(chunk).cast("B")
                    total += len(view)
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
                    del view
                if size is not None and total != size:
                    raise StorageError(length_mismatch(path, total, size))
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

    def make_durable(self, path: str) -> None:
        # Its publisher fsynced the file and the directories above before the link;
        # only the link may still be unsynced.
        self._fsync_dir(os.path.dirname(self._abs(path)))

    # Reads open the file with os.open and read with os.pread: ``open(path, "rb")`` adds
    # an fstat, an ioctl and an lseek to every read, and the appender and the
    # coordinator read small objects several times a transaction, each system call
    # giving up the GIL to the publishing threads around it. A published file never
    # changes (it appears whole, by link), so its size is read once.

    def read(self, path: str) -> bytes:
        return _read_file(self._abs(path), 0, None)

    def read_prefix(self, path: str, length: int) -> bytes:
        return _read_file(self._abs(path), 0, length)

    def read_buffer(self, path: str) -> pa.Buffer:
        # Large objects are memory-mapped: no copy, and the buffer stays valid
        # even if the file is deleted meanwhile.  Setting up a map costs more
        # than copying a small file, so those are simply read.
        full = self._abs(path)
        fd = os.open(full, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < MMAP_MIN_BYTES:
                return pa.py_buffer(_pread(fd, 0, size))
        finally:
            os.close(fd)
        with pa.memory_map(full, "r") as mm:
            return mm.read_buffer()

    def read_range(self, path: str, start: int, length: int) -> pa.Buffer:
        full = self._abs(path)
        if length < MMAP_MIN_BYTES:
            return pa.py_buffer(_read_file(full, start, length))
        with pa.memory_map(full, "r") as mm:
            mm.seek(min(start, mm.size()))
            return mm.read_buffer(length)  # a view of the map: no copy

    def exists(self, path: str) -> bool:
        return os.path.exists(self._abs(path))

    def remove_temp_files(self, older_than_s: float) -> list[str]:
        """Safe at any time: a temp name is used by one publish call only (_TempNames), and
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

    def list_times(self, directory: str) -> list[tuple[str, float]]:
        out = []
        try:
            with os.scandir(self._abs(directory)) as entries:
                for entry in entries:
                    if entry.name.startswith(TMP_PREFIX):
                        continue
                    try:
                        out.append((entry.name, entry.stat().st_mtime))
                    except FileNotFoundError:
                        continue
        except (FileNotFoundError, NotADirectoryError):
            return []
        return out

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


def _read_file(full: str, start: int, length: int | None) -> bytes:
    """``length`` bytes of the file from ``start`` (to its end for None): fewer only at
    the end of the file."""
    fd = os.open(full, os.O_RDONLY)
    try:
        return _pread(fd, start, os.fstat(fd).st_size - start if length is None else length)
    finally:
        os.close(fd)


def _pread(fd: int, start: int, length: int) -> bytes:
    """Up to ``length`` bytes from ``start``: fewer only at the end of the file."""
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, start)
        if not chunk:
            break
        chunks.append(chunk)
        start += len(chunk)
        length -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
