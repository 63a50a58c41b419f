"""Snapshot expiry: old snapshots, the files only they named, and old pointer versions.

One age bound (the table's ``history.expire.max-snapshot-age-ms``, an hour
by default) says how long a reader may hold what it loaded, and how long a
writer may take between writing a file and committing it (less: the commit
window, layout.py).  So expiry removes

* every snapshot but the newest whose successor was committed more than the
  bound ago: until then a reader may still hold it as the newest;
* every snapshot but the newest ``txlog.expire.max-snapshots`` (20 by
  default), however young: each append writes the whole metadata, every
  snapshot included, and copies it a few times (benchmarks/README.md), so a
  table holding an hour of syncs would make each sync slower the more often
  it runs.  The files such a snapshot names may still be held by a reader, so
  a *retired record* listing them is published before the snapshot leaves
  the metadata, and keeps them for the bound from its own creation;
* every pointer version whose successor is older than the bound, with the
  metadata file it named: a reader that read the pointer read it then;
* every other file of the table (data files, manifests, manifest lists,
  metadata files) that no retained snapshot or pointer version names and
  that is older than the bound and that no retired record younger than the
  bound lists: an orphan of a writer that died or lost its commit, never a
  file of a writer still inside its commit window.

docs/tables.md ("Upkeep") argues each.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import msgpack
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update.snapshot import ExpireSnapshots

from .. import clock
from ..errors import CommitFailedError, InvalidConfigError
from ..root.root import Root
from ..storage.paths import table_dir, table_pointer_dir, table_retired_dir, version_path
from .catalog import RootCatalog, table_identifier
from .layout import (COMMIT_WINDOW_S, DEFAULT_MAX_SNAPSHOTS, DEFAULT_MAX_SNAPSHOT_AGE_MS,
                     MAX_SNAPSHOT_AGE_KEY, MAX_SNAPSHOTS_KEY, int_property)
from .sync import MAX_ATTEMPTS

_FILE_DIRS = ("data", "metadata")


@dataclass(frozen=True)
class Expired:
    """What one expiry removed: snapshot ids, files and pointer versions (root paths)."""

    topic: str
    snapshots: tuple[int, ...] = ()
    files: tuple[str, ...] = ()
    pointer_versions: tuple[str, ...] = ()


def expire_table(root: Root, topic: str, age_s: float | None = None,
                 now_ms: int | None = None) -> Expired:
    """Expire the topic's table by the age bound (``age_s``, else the table's property);
    ``now_ms`` stands for the present (tests)."""
    catalog = RootCatalog(root.storage)
    now_ms = clock.now_ms() if now_ms is None else now_ms
    for _ in range(MAX_ATTEMPTS):
        table = catalog.load_table(table_identifier(topic))
        age_ms = age_s * 1000 if age_s is not None else \
            int_property(table, MAX_SNAPSHOT_AGE_KEY, DEFAULT_MAX_SNAPSHOT_AGE_MS)
        if age_ms <= COMMIT_WINDOW_S * 1000:  # the bound alone keeps writers' files
            source = "age_s" if age_s is not None else f"table property {MAX_SNAPSHOT_AGE_KEY}"
            raise InvalidConfigError(
                f"the expiry age of topic {topic!r}'s table ({source}: {age_ms:g} ms) must "
                f"exceed the writers' commit window of {COMMIT_WINDOW_S * 1000:.0f} ms: a "
                "sync's files not committed yet would be taken for orphans")
        cutoff_ms = now_ms - age_ms
        # Listed before the retained files are read: a file written after this listing is
        # no candidate, and one written before it is named by the metadata read below, or
        # is an orphan, or belongs to a writer still inside its commit window (younger).
        old = {f"{table_dir(topic)}/{d}/{name}" for d in _FILE_DIRS
               for name, created in root.storage.list_times(f"{table_dir(topic)}/{d}")
               if created * 1000 < cutoff_ms}
        keep = max(int_property(table, MAX_SNAPSHOTS_KEY, DEFAULT_MAX_SNAPSHOTS), 1)
        gone, young = expired_snapshots(table, cutoff_ms, keep)
        if gone:
            if young:  # durable before the snapshots leave the metadata
                _retire(root, topic, sorted(_files_of(catalog, table, young)))
            try:
                table = _commit_expiry(root, table, gone)
            except CommitFailedException:
                continue  # another writer committed first: from its metadata, again
        versions, remaining = _trim_pointer(root, topic, cutoff_ms, keep)
        # Listed after the metadata above was loaded: a record that expiry's commit
        # depended on was published before that commit, so before this load.
        records, retired = _retired(root, topic, cutoff_ms)
        needed = _named_files(catalog, table) | \
            _metadata_of(root, table_pointer_dir(topic), remaining)
        files = sorted(old - needed - retired)
        for path in files + records:
            root.storage.delete(path)
        return Expired(topic, tuple(gone), tuple(files), tuple(versions))
    raise CommitFailedError(f"the expiry of topic {topic!r}'s table gave up after "
                            f"{MAX_ATTEMPTS} commits lost to other writers")


def expired_snapshots(table: Table, cutoff_ms: float, keep: int
                      ) -> tuple[list[int], list[Snapshot]]:
    """The snapshots to expire: those whose successor was committed before ``cutoff_ms``,
    and all but the newest ``keep``; never the current one.  Second, those of them a
    reader may still hold (their successor is younger): their files need a record."""
    current = table.current_snapshot()
    ordered = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)
    gone, young = _by_age_and_count([s.timestamp_ms for s in ordered], cutoff_ms, keep)
    kept = None if current is None else current.snapshot_id
    return ([ordered[i].snapshot_id for i in gone if ordered[i].snapshot_id != kept],
            [ordered[i] for i in young if ordered[i].snapshot_id != kept])


def _by_age_and_count(created_ms: list[float], cutoff_ms: float, keep: int
                      ) -> tuple[list[int], list[int]]:
    """The one rule for snapshots and pointer versions alike.  Of ``created_ms`` (their
    creation times, oldest first), the indexes of those expiry removes: each whose
    successor was created before ``cutoff_ms``, and all but the newest ``keep``; never the
    newest.  Second, those of them whose successor is younger: a reader may still hold
    them, so what they name needs a retired record."""
    gone, young = [], []
    for i, successor in enumerate(created_ms[1:]):
        if successor < cutoff_ms:
            gone.append(i)
        elif i < len(created_ms) - keep:
            gone.append(i)
            young.append(i)
    return gone, young


def _retire(root: Root, topic: str, names: list[str]) -> None:
    """Publish the record of ``names``, files a reader may still hold that nothing will
    name: its creation time starts the bound for them (a record of files still named
    elsewhere only keeps them longer)."""
    path = f"{table_retired_dir(topic)}/{uuid.uuid4().hex}"
    root.storage.publish_if_absent(path, msgpack.packb(names))


def _retired(root: Root, topic: str, cutoff_ms: float) -> tuple[list[str], set[str]]:
    """The records older than the bound (they protect nothing now), and the files the
    younger ones list."""
    directory = table_retired_dir(topic)
    old, kept = [], set()
    for name, created in root.storage.list_times(directory):
        path = f"{directory}/{name}"
        if created * 1000 < cutoff_ms:
            old.append(path)
            continue
        try:
            kept.update(msgpack.unpackb(root.storage.read(path)))
        except FileNotFoundError:
            continue  # deleted by another expiry, which found it old: so is it now
    return old, kept


def _commit_expiry(root: Root, table: Table, snapshot_ids: list[int]) -> Table:
    catalog = RootCatalog(root.storage, pinned=table.metadata_location)
    pinned = catalog.pinned_table(table)
    tx = pinned.transaction()
    ExpireSnapshots(tx).by_ids(snapshot_ids).commit()
    return tx.commit_transaction()


def _named_files(catalog: RootCatalog, table: Table) -> set[str]:
    """Every data file, manifest and manifest list a snapshot of ``table`` names."""
    return _files_of(catalog, table, table.snapshots())


def _files_of(catalog: RootCatalog, table: Table, snapshots: list[Snapshot]) -> set[str]:
    """Every data file, manifest and manifest list ``snapshots`` (of ``table``) name."""
    named: set[str] = set()
    for snapshot in snapshots:
        named.add(catalog.relative(snapshot.manifest_list))
        for manifest in snapshot.manifests(table.io):
            path = catalog.relative(manifest.manifest_path)
            if path in named:
                continue  # an earlier snapshot's too: its entries are in already
            named.add(path)
            named.update(catalog.relative(e.data_file.file_path)
                         for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    return named


def _trim_pointer(root: Root, topic: str, cutoff_ms: float, keep: int
                  ) -> tuple[list[str], list[int]]:
    """Pointer versions deleted, oldest first: those whose successor is older than
    ``cutoff_ms``, and all but the newest ``keep`` (a new catalog lists them all); the
    newest always stays.  Second, the versions the listing left: one published since
    names a metadata file written since, which this expiry does not delete.

    A committer that read version v publishes v + 1 only if absent, so deleting v once
    v + 1 exists never lets a commit through.  A reader that read v may still read the
    metadata file it names, so for versions whose successor is young that file goes into
    a retired record first."""
    directory = table_pointer_dir(topic)
    times = sorted((int(n), t) for n, t in root.storage.list_times(directory) if n.isdigit())
    gone_at, young_at = _by_age_and_count([t * 1000 for _, t in times], cutoff_ms, keep)
    doomed, young = [times[i][0] for i in gone_at], [times[i][0] for i in young_at]
    if young:
        _retire(root, topic, sorted(_metadata_of(root, directory, young)))
    deleted = []
    for version in doomed:
        path = version_path(directory, version)
        root.storage.delete(path)
        deleted.append(path)
    gone = set(doomed)
    return deleted, [v for v, _ in times if v not in gone]


def _metadata_of(root: Root, directory: str, versions: list[int]) -> set[str]:
    """The metadata files pointer ``versions`` name (one deleted meanwhile: skipped, its
    deleter took care of it)."""
    named = set()
    for version in versions:
        try:
            value = msgpack.unpackb(root.storage.read(version_path(directory, version)))
        except FileNotFoundError:
            continue
        named.add(value["metadata"])
    return named
