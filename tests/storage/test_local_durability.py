"""What a power cut keeps of the local backend's publishes (power_loss.py's record of fsyncs).

A publish that returned must survive the cut whoever made the directories on its
path: two writers (two ``LocalStorage``s, as two processes) publishing into a
directory one of them is still creating is the case the test pins down.
"""

from __future__ import annotations

import pytest

from power_loss import PowerCut, PowerLossDisk
from txlog.storage.local import LocalStorage


@pytest.fixture
def disk(tmp_path, monkeypatch) -> PowerLossDisk:
    (tmp_path / "disk").mkdir()
    disk = PowerLossDisk(tmp_path / "disk", seed=0)
    disk.install(monkeypatch)
    return disk


def test_a_returned_publish_survives_the_cut(disk: PowerLossDisk, tmp_path) -> None:
    store = LocalStorage(str(tmp_path / "disk" / "root"))
    assert store.publish_if_absent("a/b/obj", b"kept")
    disk.cut()
    kept = disk.restore(tmp_path / "kept")
    assert (kept / "root" / "a" / "b" / "obj").read_bytes() == b"kept"


def test_a_publish_into_a_directory_another_writer_has_not_synced_survives(
        disk: PowerLossDisk, tmp_path) -> None:
    """Writer A has made ``topics/t`` but not yet fsynced ``topics`` when writer B publishes
    into ``topics/t`` and returns; then the power goes.  B's object must be kept, so B
    may not take the directory's existence for its durability."""
    root = tmp_path / "disk" / "root"
    a, b = LocalStorage(str(root)), LocalStorage(str(root))

    def between_mkdir_and_its_parents_fsync(op: str, target: object) -> None:
        if op == "open" and target == str(root / "topics"):  # A's fsync of the parent
            disk.before = None
            assert b.publish_if_absent("topics/t/b", b"from b")
            disk.cut()

    disk.before = between_mkdir_and_its_parents_fsync
    with pytest.raises(PowerCut):
        a.publish_if_absent("topics/t/a", b"from a")
    kept = disk.restore(tmp_path / "kept")
    assert (kept / "root" / "topics" / "t" / "b").read_bytes() == b"from b"
    assert not (kept / "root" / "topics" / "t" / "a").exists()  # A never returned


def test_an_entry_without_its_directory_fsync_is_lost(disk: PowerLossDisk, tmp_path,
                                                      monkeypatch) -> None:
    """The record itself: a link whose directory was not fsynced does not survive."""
    store = LocalStorage(str(tmp_path / "disk" / "root"))
    assert store.publish_if_absent("d/first", b"1")
    monkeypatch.setattr(store, "_fsync_dir", lambda directory: None)
    assert store.publish_if_absent("d/second", b"2")
    disk.cut()
    kept = disk.restore(tmp_path / "kept")
    assert sorted(p.name for p in (kept / "root" / "d").iterdir()) == ["first"]
