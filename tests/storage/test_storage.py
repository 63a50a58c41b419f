"""The storage primitive every other guarantee rests on: publish-if-absent.

If publishing were not exclusive, two writers could both claim an offset; if a
temp file were listed, a reader could see half a batch; if a path could climb
out of the root, a user-supplied name could overwrite anything.  These tests pin
each of those down for the local and the in-memory backend.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from txlog import Log, StorageError, UnsupportedStorageError
from txlog.storage.contract import Storage
from txlog.storage.local import LocalStorage
from txlog.storage.memory import MemoryStorage
from txlog.storage.paths import TMP_PREFIX
from txlog.storage.schemes import open_storage


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path) -> Storage:
    if request.param == "local":
        return LocalStorage(str(tmp_path / "root"))
    return MemoryStorage()


def test_publish_if_absent_is_exclusive(store: Storage) -> None:
    assert store.publish_if_absent("a/b/obj", b"first") is True
    assert store.publish_if_absent("a/b/obj", b"second, longer content") is False
    assert store.read("a/b/obj") == b"first"
    assert store.exists("a/b/obj")


def test_concurrent_publishers_have_exactly_one_winner(store: Storage) -> None:
    """Many threads race for each name; one wins, and its bytes are what is stored."""
    names = [f"race/{i:03d}" for i in range(20)]
    wins: dict[str, list[bytes]] = {n: [] for n in names}
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def contend(me: int) -> None:
        barrier.wait()
        for name in names:
            data = f"{name} from {me}".encode() * (me + 1)
            if store.publish_if_absent(name, data):
                with lock:
                    wins[name].append(data)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in names:
        assert len(wins[name]) == 1, f"{name}: {len(wins[name])} winners"
        assert store.read(name) == wins[name][0]
    assert sorted(store.list("race")) == [n.split("/")[1] for n in names]


def test_read_read_prefix_list_delete(store: Storage) -> None:
    data = bytes(range(256)) * 4
    assert store.publish_if_absent("d/x/one", data)
    assert store.publish_if_absent("d/x/two", b"")
    assert store.publish_if_absent("d/y/deep/three", b"3")
    assert store.read("d/x/one") == data
    assert bytes(store.read_buffer("d/x/one")) == data
    assert store.read_prefix("d/x/one", 10) == data[:10]
    assert store.read_prefix("d/x/one", len(data) + 100) == data  # shorter object: all of it
    assert store.read("d/x/two") == b""
    assert sorted(store.list("d")) == ["x", "y"]
    assert sorted(store.list("d/x")) == ["one", "two"]
    assert store.list("d/y") == ["deep"]
    assert store.list("nowhere") == []
    assert "d" in store.list("")

    with pytest.raises(FileNotFoundError):
        store.read("d/x/missing")
    with pytest.raises(FileNotFoundError):
        store.read_prefix("d/x/missing", 4)
    assert not store.exists("d/x/missing")

    store.delete("d/x/one")
    assert not store.exists("d/x/one")
    assert store.list("d/x") == ["two"]
    store.delete("d/x/one")  # deleting what is gone is not an error

    store.delete_tree("d")
    assert store.list("d") == []
    assert not store.exists("d/y/deep/three")
    # The name is free again once deleted.
    assert store.publish_if_absent("d/x/one", b"again")
    assert store.read("d/x/one") == b"again"


@pytest.mark.parametrize("start,length", [(0, 10), (5, 2 << 20), ((3 << 20) - 5, 100),
                                          (4 << 20, 10), (100, 2 << 20), (7, 0)])
def test_read_range_gives_exactly_the_bytes_asked_for(store: Storage, start: int,
                                                      length: int) -> None:
    # Both sides of the local backend's copy/map threshold, and ranges running past the end.
    data = os.urandom(3 << 20)
    assert store.publish_if_absent("seg/x", data)
    assert store.read_range("seg/x", start, length).to_pybytes() == data[start:start + length]


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "a/../../b", "a/./b", "a//b",
                                 "", "a/", "..", "."])
def test_paths_escaping_the_root_are_refused(store: Storage, bad: str) -> None:
    with pytest.raises(StorageError, match="invalid storage path"):
        store.publish_if_absent(bad, b"x")
    for call in (lambda: store.read(bad), lambda: store.read_prefix(bad, 1),
                 lambda: store.exists(bad), lambda: store.delete(bad)):
        with pytest.raises(StorageError, match="invalid storage path"):
            call()


def test_local_publish_never_escapes_root(tmp_path: Path) -> None:
    store = LocalStorage(str(tmp_path / "root"))
    with pytest.raises(StorageError):
        store.publish_if_absent("../outside", b"x")
    assert not (tmp_path / "outside").exists()


def test_local_temp_files_are_never_listed(tmp_path: Path, monkeypatch) -> None:
    """Neither a leftover temp file nor one of a publish in flight shows up in list()."""
    store = LocalStorage(str(tmp_path / "root"))
    assert store.publish_if_absent("dir/keep", b"k")
    leftover = tmp_path / "root" / "dir" / f"{TMP_PREFIX}crashed"
    leftover.write_bytes(b"half a batch")
    assert store.list("dir") == ["keep"]

    seen_during_publish: list[list[str]] = []
    on_disk_during_publish: list[list[str]] = []
    real_link = os.link

    def spying_link(src, dst, *args, **kwargs):
        # The temp file is complete and on disk at this point, but not yet published.
        on_disk_during_publish.append(sorted(os.listdir(tmp_path / "root" / "dir")))
        seen_during_publish.append(store.list("dir"))
        return real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", spying_link)
    assert store.publish_if_absent("dir/new", b"n")
    monkeypatch.undo()
    in_flight = [n for n in on_disk_during_publish[0]
                 if n.startswith(TMP_PREFIX) and n != leftover.name]
    assert len(in_flight) == 1, "the publish should have used a temp file"
    assert seen_during_publish == [["keep"]]
    assert sorted(store.list("dir")) == ["keep", "new"]
    # The publish cleans up its own temp file.
    assert sorted(os.listdir(tmp_path / "root" / "dir")) == sorted(["keep", "new",
                                                                      leftover.name])


def test_local_failed_publish_leaves_no_temp_file(tmp_path: Path, monkeypatch) -> None:
    """A write that fails (disk full) must not leave its temp file behind to fill the disk."""
    store = LocalStorage(str(tmp_path / "root"))
    assert store.publish_if_absent("dir/a", b"a")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        store.publish_if_absent("dir/b", b"b" * 1000)
    monkeypatch.undo()
    assert os.listdir(tmp_path / "root" / "dir") == ["a"]
    assert not store.exists("dir/b")
    assert store.publish_if_absent("dir/b", b"b")


def test_local_temp_name_in_use_is_skipped_not_overwritten(tmp_path: Path) -> None:
    """A temp name is a process's prefix and a counter: a file already holding the next
    name (a clash, or a crashed writer's leftover) is left alone and the publish goes on
    under a fresh prefix."""
    from txlog.storage import local

    store = LocalStorage(str(tmp_path / "root"))
    assert store.publish_if_absent("dir/a", b"a")
    names = local._TEMP_NAMES
    taken = names.next()
    follows = f"{taken.rsplit('-', 1)[0]}-{int(taken.rsplit('-', 1)[1]) + 1}"
    squatter = tmp_path / "root" / "dir" / follows
    squatter.write_bytes(b"someone else's half-written object")
    assert store.publish_if_absent("dir/b", b"b")
    assert store.read("dir/b") == b"b"
    assert squatter.read_bytes() == b"someone else's half-written object"
    assert not names.next().startswith(taken.rsplit("-", 1)[0] + "-")  # a fresh prefix


def test_a_forked_child_draws_temp_names_of_its_own(tmp_path: Path) -> None:
    from txlog.storage import local

    parent = local._TEMP_NAMES.next()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next name and leave at once
        os.write(write_end, local._TEMP_NAMES.next().encode())
        os._exit(0)
    os.close(write_end)
    child = os.read(read_end, 200).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    assert child.startswith(TMP_PREFIX)
    assert child.rsplit("-", 1)[0] != parent.rsplit("-", 1)[0]


def test_local_publish_survives_reopen(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    assert LocalStorage(root).publish_if_absent("p/q", b"durable")
    reopened = LocalStorage(root)
    assert reopened.read("p/q") == b"durable"
    assert reopened.publish_if_absent("p/q", b"other") is False


@pytest.mark.parametrize("url", ["hdfs://namenode:8020/logs", "webhdfs://nn/logs",
                                 "viewfs://cluster/logs", "HDFS://nn/x"])
def test_open_storage_refuses_hdfs(url: str) -> None:
    with pytest.raises(UnsupportedStorageError, match="HDFS") as info:
        open_storage(url)
    assert url in str(info.value)
    with pytest.raises(UnsupportedStorageError):
        Log(url)


@pytest.mark.parametrize("url,protocol", [("ftp://host/logs", "ftp"), ("http://x/y", "http"),
                                          ("zip://a.zip", "zip"), ("nonsense://z", "nonsense")])
def test_open_storage_refuses_unknown_protocols(url: str, protocol: str) -> None:
    with pytest.raises(UnsupportedStorageError) as info:
        open_storage(url)
    message = str(info.value)
    assert repr(protocol) in message and "exclusive" in message


def test_open_storage_picks_backends(tmp_path: Path) -> None:
    assert isinstance(open_storage(str(tmp_path / "a")), LocalStorage)
    assert isinstance(open_storage(tmp_path / "b"), LocalStorage)
    via_url = open_storage(f"file://{tmp_path / 'c'}")
    assert isinstance(via_url, LocalStorage) and via_url.root == str(tmp_path / "c")
    first, again = open_storage("memory://shared-name-t"), open_storage("memory://shared-name-t")
    assert isinstance(first, MemoryStorage) and first is again
    # The store's url reopens the same store (Log(log.root) must see the same log).
    assert first.url == "memory://shared-name-t" and open_storage(first.url) is first
    assert open_storage("memory://other-name-t") is not first
    mem = MemoryStorage()
    assert open_storage(mem) is mem
