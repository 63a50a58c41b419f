"""Which backend opens a root: local paths, and a registry from URL scheme to opener."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..errors import UnsupportedStorageError
from .contract import Storage
from .local import LocalStorage
from .memory import open_memory
from .object_store import open_object_store
from .s3 import open_s3
from .secrets import refuse_credentials_in_url

Opener = Callable[[str, dict[str, Any] | None], Storage]


def _refuse_hdfs(url: str, storage_options: dict[str, Any] | None) -> Storage:
    raise UnsupportedStorageError(
        f"{url}: HDFS cannot create a file only if it is absent through fsspec/pyarrow, "
        "so it cannot hold a txlog root")


# The object stores whose conditional create txlog relies on, reached through fsspec.
_OBJECT_STORES: dict[str, Opener] = {
    "s3": open_s3, "s3a": open_s3,
    "gs": open_object_store, "gcs": open_object_store,
    "abfs": open_object_store, "abfss": open_object_store, "az": open_object_store}
OPENERS: dict[str, Opener] = {
    "memory": open_memory, **_OBJECT_STORES,
    "hdfs": _refuse_hdfs, "viewfs": _refuse_hdfs, "webhdfs": _refuse_hdfs}


def open_storage(url: str | os.PathLike[str] | Storage, storage_options: dict[str, Any] | None = None,
                 fsync: bool = True) -> Storage:
    """Pick the backend for a root given as a path or a URL.

    ``memory://name`` gives a process-local store shared by every Log opened
    with the same name (for tests).  Object-store URLs take their endpoint,
    region and credentials from ``storage_options`` (the fsspec backend's
    constructor arguments) or from the backend's usual environment variables.
    """
    if isinstance(url, Storage):
        return url
    url = os.fspath(url)
    if "://" not in url or url.startswith("file://"):
        return LocalStorage(url.removeprefix("file://"), fsync=fsync)
    scheme = url.split("://", 1)[0].lower()
    if scheme != "memory":  # a memory:// name reaches no store: nothing to leak
        refuse_credentials_in_url(url, scheme)
    opener = OPENERS.get(scheme)
    if opener is None:
        raise UnsupportedStorageError(
            f"{url}: protocol {scheme!r} is not known to support exclusive creation "
            f"(supported: local paths, memory://, {', '.join(sorted(_OBJECT_STORES))})")
    return opener(url, storage_options)


def normalised_url(url: str) -> str:
    """Root ``url`` spelled one way, so two spellings of one root compare equal: a local
    path absolute, as ``open_storage`` opens it (``file://`` dropped); a URL with its
    scheme in lower case and no trailing slash."""
    url = url.strip()
    if "://" not in url or url.startswith("file://"):
        return os.path.abspath(url.removeprefix("file://"))
    scheme, rest = url.split("://", 1)
    return f"{scheme.lower()}://{rest.rstrip('/')}"
