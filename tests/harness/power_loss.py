"""A disk that loses power: the real ``LocalStorage`` on a record of what is durable.

``PowerLossDisk.install`` swaps the ``os`` module that ``txlog.storage.local`` calls
for one that passes every call through to the real file system (so the code under
test runs unchanged and sees what a running machine shows) and, beside it, keeps
what a power cut may leave on a strict file system (LazyFS drops unsynced file data
this way; POSIX promises a new directory entry only once its directory is fsynced):

* a file's data is durable up to its last ``fsync``; what was written after is
  lost or cut short at a random byte at the cut;
* a directory's entries (a ``link``, a new file, a ``mkdir``, an ``unlink``,
  an ``rmdir``) are durable once the directory itself is fsynced, and only then:
  an entry made since is lost, an entry removed since comes back.

Files and directories are known by their inode, under an identity of our own that
changes when the inode is freed (inode numbers are reused), so an entry that
comes back holds the contents its own file had.

Only calls on the tree under ``base`` are recorded; others pass untouched (another
root, a thread a finished test left behind).  The cut comes before the
``cut_after + 1``-th recorded call (or when ``cut()`` is called):
that call and every later one raise ``PowerCut``, from every thread, so writers
stop dead; what was durable at that moment is kept and ``restore`` writes it into
a fresh directory for new readers.  Calls are made one at a time (a lock), which
is what lets the cut see one consistent state.  The real ``fsync`` is not called:
durability is what this record says, and skipping it keeps the runs short.
"""

from __future__ import annotations

import itertools
import os
import random
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Image = dict[str, "bytes | Image"]  # name -> file contents, or a directory's image


class PowerCut(BaseException):
    """The machine is off.  A BaseException, so no ``except Exception`` of the code
    under test treats it as a storage error to retry or to roll back from."""


class _OsCalls:
    """What ``txlog.storage.local`` sees as ``os``: calls on the disk's tree recorded, the
    rest passed on (other roots, and threads of other tests still running, untouched)."""

    def __init__(self, disk: PowerLossDisk) -> None:
        self._disk = disk

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)  # os.path, the flags, reads: as they are

    def open(self, path: str, flags: int, mode: int = 0o777) -> int:
        if not self._disk.holds(path):
            return os.open(path, flags, mode)
        return self._disk.call("open", path, lambda: self._disk.opened(os.open(path, flags,
                                                                              mode)))

    def write(self, fd: int, data: Any) -> int:
        if not self._disk.holds(fd):
            return os.write(fd, data)
        return self._disk.call("write", fd, lambda: os.write(fd, data))

    def fsync(self, fd: int) -> None:
        if not self._disk.holds(fd):
            return os.fsync(fd)
        return self._disk.call("fsync", fd, lambda: self._disk.synced(fd))

    def close(self, fd: int) -> None:
        if not self._disk.holds(fd):
            return os.close(fd)
        return self._disk.call("close", fd, lambda: self._disk.closed(fd))

    def link(self, src: str, dst: str) -> None:
        if not self._disk.holds(dst):
            return os.link(src, dst)
        return self._disk.call("link", dst, lambda: os.link(src, dst))

    def unlink(self, path: str) -> None:
        if not self._disk.holds(path):
            return os.unlink(path)
        return self._disk.call("unlink", path, lambda: self._disk.removed(path, os.unlink))

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        if not self._disk.holds(path):
            return os.mkdir(path, mode)
        return self._disk.call("mkdir", path, lambda: os.mkdir(path, mode))

    def rmdir(self, path: str) -> None:
        if not self._disk.holds(path):
            return os.rmdir(path)
        return self._disk.call("rmdir", path, lambda: self._disk.removed(path, os.rmdir))


class PowerLossDisk:
    """Durable state of the tree under ``base``; whatever exists there at the start is
    taken as durable (the test's own directory)."""

    def __init__(self, base: str | Path, seed: int, cut_after: int | None = None) -> None:
        self.base = os.path.abspath(base)
        self.rng = random.Random(seed)
        self.cut_after = cut_after
        self.calls = 0
        self.is_cut = False
        # Runs before each recorded call, outside the lock (op, path or fd): a test's hook
        # to interleave another writer at an exact point.
        self.before: Callable[[str, Any], None] | None = None
        # A mutant's switch: a file's fsync does nothing, as if its line were removed.
        self.file_fsyncs_lost = False
        self._lock = threading.RLock()
        self._ids: dict[tuple[int, int], int] = {}  # live inode -> our identity
        self._identities = itertools.count()
        self._fds: dict[int, tuple[int, bool]] = {}  # fd -> (identity, is a directory)
        self._data: dict[int, bytes] = {}  # a file's contents at its last fsync
        self._entries: dict[int, dict[str, tuple[int, bool]]] = {}  # a directory's, at its fsync
        self._base = self._id(os.lstat(self.base))
        self._snapshot_tree(self.base)
        self.image: Image | None = None  # what the cut kept

    def install(self, monkeypatch: Any) -> None:
        import txlog.storage.local as local

        monkeypatch.setattr(local, "os", _OsCalls(self))

    # --- the recorded calls ------------------------------------------------------------

    def call(self, op: str, target: Any, run: Callable[[], Any]) -> Any:
        if self.before is not None and not self.is_cut:
            self.before(op, target)
        with self._lock:
            if not self.is_cut and self.cut_after is not None and self.calls >= self.cut_after:
                self._cut()
            if self.is_cut:
                raise PowerCut(f"{op} {target}: the power is off")
            self.calls += 1
            return run()

    def cut(self) -> None:
        """Cut the power now (if it is still on)."""
        with self._lock:
            if not self.is_cut:
                self._cut()

    def holds(self, where: str | int) -> bool:
        """Whether a path is in the disk's tree, or an fd was opened there."""
        if isinstance(where, int):
            return where in self._fds
        return where == self.base or where.startswith(self.base + os.sep)

    def opened(self, fd: int) -> int:
        st = os.fstat(fd)
        self._fds[fd] = (self._id(st), stat.S_ISDIR(st.st_mode))
        return fd

    def synced(self, fd: int) -> None:
        ident, is_dir = self._fds[fd]
        if is_dir:
            self._entries[ident] = self._listing(fd)
        elif not self.file_fsyncs_lost:
            with open(f"/proc/self/fd/{fd}", "rb") as f:  # the fd may be write-only
                self._data[ident] = f.read()

    def closed(self, fd: int) -> None:
        del self._fds[fd]
        os.close(fd)

    def removed(self, path: str, remove: Callable[[str], None]) -> None:
        st = os.lstat(path)
        remove(path)
        if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1:
            self._ids.pop((st.st_dev, st.st_ino), None)  # the inode may be reused: a new file

    # --- durable state -----------------------------------------------------------------

    def _id(self, st: os.stat_result) -> int:
        key = (st.st_dev, st.st_ino)
        if key not in self._ids:
            self._ids[key] = next(self._identities)
        return self._ids[key]

    def _listing(self, directory: int | str) -> dict[str, tuple[int, bool]]:
        out = {}
        for name in os.listdir(directory):
            if isinstance(directory, int):
                st = os.stat(name, dir_fd=directory, follow_symlinks=False)
            else:
                st = os.lstat(os.path.join(directory, name))
            out[name] = (self._id(st), stat.S_ISDIR(st.st_mode))
        return out

    def _snapshot_tree(self, directory: str) -> None:
        """Everything under ``directory`` as durable (the state before the writers)."""
        listing = self._listing(directory)
        self._entries[self._id(os.lstat(directory))] = listing
        for name, (ident, is_dir) in listing.items():
            path = os.path.join(directory, name)
            if is_dir:
                self._snapshot_tree(path)
            else:
                self._data[ident] = Path(path).read_bytes()

    def _live_paths(self) -> dict[int, str]:
        paths = {}
        for directory, _, names in os.walk(self.base):
            for name in names:
                path = os.path.join(directory, name)
                st = os.lstat(path)
                ident = self._ids.get((st.st_dev, st.st_ino))
                if ident is not None:
                    paths[ident] = path
        return paths

    def _cut(self) -> None:
        self.is_cut = True
        self.image = self._kept(self._base, self._live_paths())

    def _kept(self, directory: int, live: dict[int, str]) -> Image:
        out: Image = {}
        for name, (ident, is_dir) in self._entries.get(directory, {}).items():
            out[name] = self._kept(ident, live) if is_dir else self._contents(ident, live)
        return out

    def _contents(self, ident: int, live: dict[int, str]) -> bytes:
        """The synced bytes, then a random part of what was written after them (never all
        of it: an unsynced write is lost, or cut short)."""
        synced = self._data.get(ident, b"")
        now = Path(live[ident]).read_bytes() if ident in live else synced
        if ident in self._data and not now.startswith(synced):
            return synced  # rewritten in place since its fsync: the old bytes stand
        unsynced = len(now) - len(synced)
        if unsynced <= 0:
            return synced
        return now[:len(synced) + self.rng.randrange(unsynced)]

    def restore(self, target: str | Path) -> Path:
        """Write what the cut kept into ``target`` (created), the image of ``base``."""
        if self.image is None:
            raise RuntimeError("the power was never cut")
        target = Path(target)
        _write_image(target, self.image)
        return target

    def files_kept(self) -> int:
        return _count_files(self.image or {})


def _write_image(directory: Path, image: Image) -> None:
    directory.mkdir(parents=True)
    for name, item in image.items():
        if isinstance(item, dict):
            _write_image(directory / name, item)
        else:
            (directory / name).write_bytes(item)


def _count_files(image: Image) -> int:
    return sum(_count_files(v) if isinstance(v, dict) else 1 for v in image.values())
