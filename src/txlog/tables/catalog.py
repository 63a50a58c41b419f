"""The txlog root as an Iceberg catalog: a topic's table pointer is a version chain.

An Iceberg catalog's one duty is to move a table's current-metadata pointer
atomically, and only from the metadata the writer started from.  A txlog
root already has that primitive: a version chain (storage/chain.py), whose
version ``v + 1`` is published only if absent and only while version ``v``
is still there byte for byte.  So the pointer of topic ``t``'s table is the
chain ``tables/<t>/pointer``, each version naming one metadata file; every
file of the table is published with ``publish_if_absent`` too (durable on
local disk, never overwritten): metadata files here, manifests through
``StorageFileIO``, data files by the sync.  Two maintainers committing at
once cannot both move the pointer off the same version (docs/tables.md, "The
catalog").

pyiceberg is imported here, never by ``import txlog``: the ``tables`` extra.
Only what a sync and the readers need is implemented; the namespace and
view operations of the ``Catalog`` interface refuse with a clear message.
"""

from __future__ import annotations

import io
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyarrow.fs import FileSystem, FSSpecHandler, PyFileSystem
from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io import FileIO, OutputStream
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.table import CommitTableResponse, Table, Transaction
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder

from ..errors import StorageError
from ..storage.chain import VersionChain
from ..storage.contract import Storage
from ..storage.object_store import FsspecStorage
from ..storage.paths import TABLES_DIR, table_dir, table_pointer_dir

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import PropertiesUpdateSummary
    from pyiceberg.schema import Schema
    from pyiceberg.table.update import TableRequirement, TableUpdate
    from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties
else:
    from pyiceberg.typedef import EMPTY_DICT

# Every table of a root sits in this one namespace: ("topics", <topic>).
NAMESPACE = "topics"

# The pointer chains known to this process, per storage object: each catalog made for a
# sync shares them, so a chain is listed once and then only probed for its next version
# (storage/chain.py), however many snapshots the table has had.
_POINTERS: weakref.WeakKeyDictionary[Storage, dict[str, VersionChain]] = \
    weakref.WeakKeyDictionary()
_POINTERS_LOCK = threading.Lock()


def table_identifier(topic: str) -> tuple[str, str]:
    return (NAMESPACE, topic)


class _Publishing(io.BytesIO):
    """An output stream whose bytes are published (if absent) when it is closed, and
    never after an error inside its ``with`` block."""

    def __init__(self, storage: Storage, path: str) -> None:
        super().__init__()
        self._storage, self._path, self._failed = storage, path, False

    def __exit__(self, *exc: Any) -> None:
        self._failed = exc[0] is not None
        super().__exit__(*exc)

    def close(self) -> None:
        if self.closed:
            return
        data = self.getvalue()
        super().close()
        if not self._failed and not self._storage.publish_if_absent(self._path, data):
            raise FileExistsError(f"{self._path} exists already")


class _PublishedOutput(PyArrowFile):
    """pyiceberg's Arrow file, but created through the root's storage: durable when its
    stream closes (fsynced on local disk), and never overwriting another writer's file."""

    def __init__(self, inner: PyArrowFile, storage: Storage, path: str) -> None:
        super().__init__(inner.location, inner._path, inner._filesystem, inner._buffer_size)
        self._storage, self._root_path = storage, path

    def create(self, overwrite: bool = False) -> OutputStream:
        return _Publishing(self._storage, self._root_path)


class StorageFileIO(PyArrowFileIO):
    """pyiceberg's Arrow file IO for reading; its writes (manifests, manifest lists) go
    through the root's storage, as every other object of a root does."""

    def __init__(self, storage: Storage, relative: Callable[[str], str],
                 properties: Properties = EMPTY_DICT) -> None:
        super().__init__(properties)
        self._storage, self._relative = storage, relative

    def new_output(self, location: str) -> PyArrowFile:
        return _PublishedOutput(super().new_output(location), self._storage,
                                self._relative(location))

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> FileSystem:
        """An object-store root's files are read through the root's own fsspec filesystem
        (its endpoint and credentials), not one pyiceberg would build from properties."""
        if isinstance(self._storage, FsspecStorage) and \
                self._storage.url.startswith(f"{scheme}://"):
            return PyFileSystem(FSSpecHandler(self._storage.fs))
        return super()._initialize_fs(scheme, netloc)


class RootCatalog(MetastoreCatalog):
    """The tables of one txlog root, their pointers moved by the root's exclusive publishes.

    ``pinned``: a sync's catalog refuses every commit that is not based on
    that metadata file, the one whose offsets the sync started from.  A
    writer whose commit lost the race may not re-apply its files on the new
    snapshot (pyiceberg's retry would: its records were read from the old
    offsets, so they would be appended twice).

    ``deadline`` (monotonic seconds): a commit after it is refused, its files
    being older than the writer's commit window (layout.COMMIT_WINDOW_S), so
    that expiry, which takes older unnamed files for orphans, never deletes a
    file a commit is about to name.
    """

    deadline: float | None = None

    def __init__(self, storage: Storage, pinned: str | None = None) -> None:
        super().__init__("txlog")
        self.storage = storage
        self.pinned = pinned
        with _POINTERS_LOCK:
            self._chains = _POINTERS.setdefault(storage, {})

    # --- locations ---------------------------------------------------------------------

    def location(self, path: str) -> str:
        """The URL of ``path`` under the root, as Iceberg metadata names its files."""
        return f"{self.storage.url.rstrip('/')}/{path}"

    def relative(self, location: str) -> str:
        """``location`` as a path under the root; refused if it lies outside it."""
        prefix = self.storage.url.rstrip("/") + "/"
        if not location.startswith(prefix):
            raise StorageError(f"{location!r} is not under the root {self.storage.url!r}")
        return location[len(prefix):]

    def _load_file_io(self, properties: Properties = EMPTY_DICT, location: str | None = None
                      ) -> FileIO:
        return StorageFileIO(self.storage, self.relative, {**self.properties, **properties})

    def _topic(self, identifier: str | Identifier) -> str:
        name = self.identifier_to_tuple(identifier)
        if len(name) != 2 or name[0] != NAMESPACE:
            raise NoSuchTableError(f"a txlog root's tables are ('{NAMESPACE}', <topic>), "
                                   f"not {name}")
        return name[1]

    def _chain(self, topic: str) -> VersionChain:
        with _POINTERS_LOCK:
            chain = self._chains.get(topic)
            if chain is None:
                chain = self._chains[topic] = VersionChain(self.storage,
                                                           table_pointer_dir(topic))
            return chain

    # --- the pointer -------------------------------------------------------------------

    def head(self, topic: str) -> tuple[int, str | None]:
        """(chain version, metadata location) of the table now; (-1, None): no table."""
        version, value = self._chain(topic).latest()
        return version, None if value is None else self.location(value["metadata"])

    def _read_metadata(self, location: str) -> TableMetadata:
        return TableMetadataUtil.parse_raw(self.storage.read(self.relative(location)).decode("utf-8"))

    def _publish_metadata(self, metadata: TableMetadata, location: str) -> None:
        if not self.storage.publish_if_absent(self.relative(location),
                                              metadata.model_dump_json().encode("utf-8")):
            raise CommitFailedException(f"metadata file {location} exists already")

    def load_table(self, identifier: str | Identifier) -> Table:
        topic = self._topic(identifier)
        _, location = self.head(topic)
        if location is None:
            raise NoSuchTableError(f"topic {topic!r} has no table under {table_dir(topic)}")
        metadata = self._read_metadata(location)
        return Table(table_identifier(topic), metadata, location,
                     self._load_file_io(metadata.properties, location), self)

    def table_exists(self, identifier: str | Identifier) -> bool:
        return self.head(self._topic(identifier))[1] is not None

    def create_table(self, identifier: str | Identifier, schema: Schema | pa.Schema,
                     location: str | None = None,
                     partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
                     sort_order: SortOrder = UNSORTED_SORT_ORDER,
                     properties: Properties = EMPTY_DICT) -> Table:
        """The table's first metadata file and pointer version 0; TableAlreadyExistsError
        if another process created it first (its metadata file is then withdrawn)."""
        topic = self._topic(identifier)
        staged = self._create_staged_table(identifier, schema,
                                           location or self.location(table_dir(topic)),
                                           partition_spec, sort_order, properties)
        self._publish_metadata(staged.metadata, staged.metadata_location)
        if not self._chain(topic).publish(0, {"metadata": self.relative(staged.metadata_location)}):
            self.storage.delete(self.relative(staged.metadata_location))
            raise TableAlreadyExistsError(f"topic {topic!r} has a table already")
        return self.load_table(identifier)

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        """Publish the next pointer version onto the metadata ``table`` was loaded from.

        CommitFailedException, with nothing left behind, when the pointer has
        moved since (or, pinned, when ``table`` is not the pinned metadata).
        """
        topic = self._topic(table.name())
        if self.pinned is not None and table.metadata_location != self.pinned:
            raise CommitFailedException(
                f"table of {topic!r}: this commit was computed from {self.pinned} and may not "
                f"be re-applied onto {table.metadata_location}")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise CommitFailedException(f"table of {topic!r}: the commit window of the files "
                                        "it names has passed; writing them again")
        version, location = self.head(topic)
        if location != table.metadata_location:
            raise CommitFailedException(
                f"table of {topic!r} moved on from {table.metadata_location} to {location}")
        staged = self._update_and_stage_table(table, table.name(), requirements, updates)
        self._publish_metadata(staged.metadata, staged.metadata_location)
        if not self._chain(topic).publish(version + 1,
                                          {"metadata": self.relative(staged.metadata_location)}):
            self.storage.delete(self.relative(staged.metadata_location))
            raise CommitFailedException(f"table of {topic!r}: another commit moved its pointer "
                                        f"past version {version} first")
        return CommitTableResponse.model_validate(
            {"metadata": staged.metadata, "metadata-location": staged.metadata_location})

    def pinned_table(self, table: Table) -> Table:
        """``table`` committed through this catalog (pinned, with a deadline, as the
        caller set them), its transactions reading their staged metadata cheaply."""
        return _PinnedTable(table.name(), table.metadata, table.metadata_location, table.io,
                            self)

    # --- what a root's catalog does not do ----------------------------------------------

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError("a txlog root's catalog only holds one table per topic "
                                  "(created by `txlog tables sync`): no namespaces, views, "
                                  "renames or registrations")

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        if self.identifier_to_tuple(namespace) != (NAMESPACE,):
            return []
        return [table_identifier(t) for t in self.storage.list(TABLES_DIR)
                if self.head(t)[1] is not None]

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        return [(NAMESPACE,)] if not self.identifier_to_tuple(namespace) else []

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        return {}

    register_table = drop_table = rename_table = create_namespace = drop_namespace = _refuse
    list_views = drop_view = view_exists = load_view = register_view = _refuse

    def update_namespace_properties(self, namespace: str | Identifier,
                                    removals: set[str] | None = None,
                                    updates: Properties = EMPTY_DICT) -> PropertiesUpdateSummary:
        return self._refuse()


class _ViewOnceTransaction(Transaction):
    """pyiceberg's transaction, building its view of the metadata with the staged updates
    once per set of updates.  pyiceberg builds it (a deep copy of the whole metadata) at
    every read, 20 in one sync: a sync's main cost, and one that grows with the
    snapshots the metadata keeps (issue 35's sync-cost goal; benchmarks/README.md).  The
    view is a copy the table's own metadata never shares, and pyiceberg's updates
    replace models rather than change them, so the readers may share it."""

    _view: tuple[TableMetadata, tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        view = self._view
        if view is None or view[0] is not self._table.metadata or view[1] is not self._updates:
            view = self._view = (self._table.metadata, self._updates, super().table_metadata)
        return view[2]


class _PinnedTable(Table):
    def transaction(self) -> Transaction:
        return _ViewOnceTransaction(self)
