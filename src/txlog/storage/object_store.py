"""Object stores reached through fsspec (S3, GCS, Azure): publishes with the store's own
conditional create, and the probe that refuses a store that ignores the condition.

What only S3 does (multipart streamed publishes) is storage/s3.py's.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from ..errors import StorageError, UnsupportedStorageError
from .contract import DEFAULT_PART_BYTES, Storage, check_relative, joined_chunks
from .paths import PROBE_DIR, TMP_PREFIX
from .secrets import is_secret_option, redact, redacted_options, register_secrets

logger = logging.getLogger(__name__)



class StorageRequestError(StorageError, OSError):
    """A request to an object store failed.

    It is an OSError so that a partition append treats a failed publish as
    outcome-unknown (the object may or may not exist) and reloads before
    trying again.  The message names the operation, the object, the store's
    error code and HTTP status, with every known secret removed; the store
    client's own exception is not chained, because some carry request
    details (signed headers) in their attributes.
    """

    def __init__(self, message: str, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def _response_of(exc: BaseException) -> tuple[int | None, str | None]:
    """HTTP status and error code of a store client's error, looking through its causes.

    s3fs turns botocore's ClientError into an OSError whose cause keeps the
    response; gcsfs and azure-core errors carry a status code directly.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict) and ("Error" in response or "ResponseMetadata" in response):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return status, response.get("Error", {}).get("Code")
        status = getattr(current, "status_code", None)
        if isinstance(status, int):
            return status, getattr(current, "error_code", None)
        status = getattr(current, "code", None)
        if isinstance(status, int) and not isinstance(current, OSError):
            return status, None
        current = current.__cause__ or current.__context__
    return None, None


def fs_package(fs: Any) -> str:
    """The package of an fsspec filesystem (s3fs, gcsfs, adlfs): what its client can do."""
    return type(fs).__module__.split(".")[0]


# fsspec backends whose pipe_file(mode="create") is the store's atomic conditional create.
_NATIVE_CREATE_PACKAGES = frozenset({"s3fs", "gcsfs", "adlfs"})
CONFLICT_ATTEMPTS = 8  # tries of one publish the store answered 409 ConditionalRequestConflict
_probe_lock = threading.Lock()
_probe_results: dict[str, str | None] = {}  # per root: None = conditional writes work, else why not
# Environment variables that choose the endpoint a client talks to (part of a store's identity).
_ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST",
                 "AZURE_STORAGE_ACCOUNT_NAME")
# Storage options (at any depth, e.g. s3fs's client_kwargs) that choose the store reached.
_ENDPOINT_OPTIONS = frozenset({"endpoint_url", "endpoint", "account_url", "account_name",
                               "region_name", "region", "project"})


def _endpoint_options(options: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """The options among ``options`` that choose the store, as sorted (path, value) pairs."""
    found = []
    for name, value in options.items():
        if isinstance(value, dict):
            found += _endpoint_options(value, f"{prefix}{name}.")
        elif name in _ENDPOINT_OPTIONS and not is_secret_option(name):
            found.append((f"{prefix}{name}", str(value)))
    return sorted(found)


PROBE_VERDICT_PREFIX = "verified-"  # a passed probe remembered per store and day (protocol.md 1.3)


class FsspecStorage(Storage):
    """Object stores reached through fsspec, publishing with the store's conditional create.

    S3 (If-None-Match: *), GCS (ifGenerationMatch=0) and Azure (If-None-Match: *)
    apply the condition atomically; s3fs, gcsfs and adlfs send it from
    ``pipe_file(mode="create")``, other backends from a file opened ``"xb"``.
    fsspec's local and in-memory filesystems do not apply it, which is why
    local paths go to LocalStorage instead.  Some S3-compatible stores accept
    the condition and ignore it; the first publish of each process on a root
    therefore runs a probe (see ``check_conditional_writes``).
    """

    remote = True

    def __init__(self, fs: Any, root: str, url: str,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self._shown_options = redacted_options(dict(storage_options or {}))
        # The store's own conditional create, one request for txlog's object sizes:
        # s3fs's pipe_file(mode="create") is a PutObject with If-None-Match: * (and
        # aborts a multipart upload whose completion is refused, where a file opened
        # "xb" leaves it behind); gcsfs's is one upload with ifGenerationMatch=0 (with
        # gcsfs 2026.10 a second file opened "xb" replaced the first on the test
        # suite's GCS emulator, where pipe_file was refused); adlfs's is a Put Blob
        # with If-None-Match: * (its "xb" file stages a block and commits it: two
        # requests).  fsspec's generic
        # pipe_file(mode="create") checks and then writes, which is not exclusive:
        # any other backend opens "xb".
        self._native_create = fs_package(fs) in _NATIVE_CREATE_PACKAGES
        # The probe's verdict is per store, and the same URL may name two stores
        # (another endpoint); the options tell them apart (kept as a digest only).
        digest = hashlib.sha256(repr(sorted((storage_options or {}).items(), key=str))
                                .encode()).hexdigest()[:16]
        self._probe_key = f"{url}#{digest}"
        # What a remembered verdict must name to be trusted (protocol.md 1.3).
        # The URL may carry credentials: its scheme and fsspec's root stand for it.  Only
        # what picks the store counts (not timeouts, user agents or credentials), so that
        # the tasks of one job share a verdict whatever else their options say.
        self._store_identity = repr((
            url.split("://", 1)[0].lower(), self.root, fs_package(fs),
            getattr(fs, "endpoint_url", None), _endpoint_options(storage_options or {}),
            sorted((k, os.environ[k]) for k in _ENDPOINT_ENV if os.environ.get(k))))

    def __repr__(self) -> str:
        return f"FsspecStorage({self.url!r}, storage_options={self._shown_options!r})"

    def _abs(self, path: str) -> str:
        check_relative(path)
        return f"{self.root}/{path}"

    def _error(self, action: str, path: str, exc: BaseException) -> StorageRequestError:
        status, code = _response_of(exc)
        what = " ".join(str(x) for x in (code, f"(HTTP {status})" if status else None) if x)
        detail = redact(str(exc)) or type(exc).__name__
        return StorageRequestError(
            f"{action} {self.url}/{path} failed: {what + ': ' if what else ''}"
            f"{type(exc).__name__}: {detail}", code, status)

    def _not_found(self, path: str) -> FileNotFoundError:
        return FileNotFoundError(f"{self.url}/{path}")

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        if not data:
            # s3fs's empty exclusive put is not exclusive: never publish empty objects.
            raise StorageError(f"refusing to publish an empty object at {path!r}")
        self._abs(path)  # a bad path is refused before any request
        self.check_conditional_writes()
        return self._put_if_absent(path, data)

    def _put_if_absent(self, path: str, data: bytes) -> bool:
        """One conditional create; False when the name is taken.

        A retried request (s3fs and botocore retry timeouts and 5xx) that meets
        its own earlier attempt is answered "taken" too.  Callers handle that as
        a lost race against an identical object, which is safe: the object is a
        valid one, and an appender that reloads finds its batch there as a
        duplicate of its own.
        """
        full = self._abs(path)

        def create() -> None:
            if self._native_create:
                self.fs.pipe_file(full, data, mode="create")
            else:
                with self.fs.open(full, "xb") as f:
                    f.write(data)
        return self._created_unless_taken(create, "publishing", path)

    def _created_unless_taken(self, create: Callable[[], Any], doing: str, path: str) -> bool:
        """Run one conditional create: True if it made the object, False if the name was
        taken (412, or the store's "already exists"); S3's ConditionalRequestConflict
        (another conditional write of the name was in flight, ours was not applied) is
        retried with jittered backoff, since the answer to a retry is definite."""
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                create()
                return True
            except FileExistsError:
                return False
            except Exception as exc:
                status, code = _response_of(exc)
                if status == 412 or code in ("PreconditionFailed", "BlobAlreadyExists"):
                    return False
                if code == "ConditionalRequestConflict" and attempt + 1 < CONFLICT_ATTEMPTS:
                    time.sleep(random.uniform(0.5, 1.0) * min(0.5, 0.01 * 2 ** attempt))
                    continue
                raise self._error(doing, path, exc) from None
        raise AssertionError("unreachable")  # the loop returns or raises

    def publish_stream_if_absent(self, path: str, chunks: Iterable[bytes | pa.Buffer],
                                 size: int, part_bytes: int = DEFAULT_PART_BYTES) -> bool:
        if size <= 0:
            raise StorageError(f"refusing to publish an empty object at {path!r}")
        self._abs(path)
        self.check_conditional_writes()
        return self._publish_stream(path, chunks, size, part_bytes)

    def _publish_stream(self, path: str, chunks: Iterable[bytes | pa.Buffer], size: int,
                        part_bytes: int) -> bool:
        """A checked streamed publish: one conditional PUT of the joined chunks (GCS and
        Azure here: memory is then the whole object, docs/protocol.md section 7; S3Storage
        streams)."""
        return self._put_if_absent(path, joined_chunks(path, chunks, size))

    def check_conditional_writes(self) -> None:
        """Refuse a store that does not honour create-if-absent; once per root per process.

        Publishes a probe object under a fresh name twice: the second publish
        must be refused.  A store that accepts it ignores the condition, and
        every guarantee of the log would silently be lost on it.  The probe
        object is deleted afterwards.  A pass is remembered in the store for
        the UTC day, naming the store it was made on, so that the other
        processes of a job pay one GET instead of three requests
        (docs/protocol.md 1.3); a refusal is never remembered.
        """
        if self._probe_key in _probe_results:
            refusal = _probe_results[self._probe_key]
            if refusal is not None:
                raise UnsupportedStorageError(refusal)
            return
        with _probe_lock:
            if self._probe_key not in _probe_results:
                _probe_results[self._probe_key] = \
                    None if self._verdict_remembered() else self._probe()
        self.check_conditional_writes()

    def _verdict_path(self, day: int | None = None) -> str:
        """Where a passed probe is remembered: one object per store identity and UTC day,
        so that a store is probed again, by one process, at least once a day."""
        if day is None:
            day = int(time.time() // 86400)
        digest = hashlib.sha256(self._store_identity.encode()).hexdigest()[:32]
        return f"{PROBE_DIR}/{PROBE_VERDICT_PREFIX}{digest}-{day}"

    def _verdict_remembered(self) -> bool:
        """Whether a process passed the probe on this store today (one GET): the verdict
        object exists and names this very store (URL, client, endpoint options)."""
        try:
            raw = self.read(self._verdict_path())
        except FileNotFoundError:
            return False
        except OSError as exc:  # the probe itself then says whether the store works
            logger.debug("%s: reading the probe verdict failed: %s", self.url, exc)
            return False
        try:
            verdict = json.loads(raw)
        except ValueError:
            return False
        return isinstance(verdict, dict) and verdict.get("store") == self._store_identity \
            and verdict.get("conditional_writes") is True

    def _remember_verdict(self) -> None:
        """Publish today's verdict after a passed probe (best effort: a failure costs
        later processes a probe of their own, nothing else)."""
        verdict = json.dumps({"store": self._store_identity, "conditional_writes": True,
                              "verified_ms": int(time.time() * 1000)}).encode()
        path = self._verdict_path()
        try:
            self._put_if_absent(path, verdict)
        except OSError as exc:
            logger.debug("%s: could not remember the probe verdict at %s: %s", self.url,
                         path, exc)

    def _probe(self) -> str | None:
        probe = f"{PROBE_DIR}/{uuid.uuid4().hex}"
        first = self._put_if_absent(probe, b"txlog conditional-write probe 1")
        second = False
        if first:
            try:
                second = self._put_if_absent(probe, b"txlog conditional-write probe 2")
            finally:
                try:
                    self.delete(probe)
                except OSError as exc:  # an inert object in a directory nothing lists
                    logger.warning("could not delete the probe object %s/%s: %s", self.url,
                                   probe, exc)
        if not first:
            return (f"{self.url}: the store answered that a brand-new object name "
                    f"({probe}) already exists, so it cannot tell a free name from a taken "
                    f"one; txlog needs create-if-absent and cannot use this store")
        if second:
            return (f"{self.url}: the store ignores conditional writes (If-None-Match: * "
                    f"or its equivalent): a second create of {probe} replaced the first "
                    f"instead of being refused. Two writers could then both claim the same "
                    f"offset, so txlog refuses this root. Use a store that implements "
                    f"conditional writes (AWS S3, GCS, Azure Blob, or a compatible store "
                    f"that documents If-None-Match support)")
        logger.debug("%s: conditional writes work (probe %s)", self.url, probe)
        self._remember_verdict()
        return None

    def read(self, path: str) -> bytes:
        # start=0 makes it one ranged GET; without a range s3fs asks for the
        # size first (a HEAD per read) to decide on a parallel download.
        try:
            return self.fs.cat_file(self._abs(path), start=0)
        except FileNotFoundError:
            raise self._not_found(path) from None
        except Exception as exc:
            raise self._error("reading", path, exc) from None

    def read_prefix(self, path: str, length: int) -> bytes:
        if length <= 0:
            self.read_prefix(path, 1)  # an absent object is still an error
            return b""
        try:
            return self.fs.cat_file(self._abs(path), start=0, end=length)
        except FileNotFoundError:
            raise self._not_found(path) from None
        except Exception as exc:
            raise self._error("reading", path, exc) from None

    def read_range(self, path: str, start: int, length: int) -> pa.Buffer:
        if length <= 0:
            if not self.exists(path):  # as on the other backends, an absent object is an error
                raise self._not_found(path)
            return pa.py_buffer(b"")
        try:
            return pa.py_buffer(self.fs.cat_file(self._abs(path), start=start,
                                                 end=start + length))
        except FileNotFoundError:
            raise self._not_found(path) from None
        except Exception as exc:
            # A range starting past the end is an empty read, as on the other backends.
            if _response_of(exc)[0] == 416:
                return pa.py_buffer(b"")
            raise self._error("reading", path, exc) from None

    def exists(self, path: str) -> bool:
        # A one-byte ranged GET: one request on every store.  fsspec's exists()
        # follows a miss with a listing (is it a directory?); txlog only asks
        # about objects, and objects are never empty.
        try:
            self.fs.cat_file(self._abs(path), start=0, end=1)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self._error("looking up", path, exc) from None
        return True

    def list(self, directory: str) -> list[str]:
        where = self._abs(directory) if directory else self.root
        try:
            entries = self._ls(where)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._error("listing", directory or ".", exc) from None
        names = [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]
        return [n for n in names if not n.startswith(TMP_PREFIX)]

    def list_times(self, directory: str) -> builtins.list[tuple[str, float]]:
        where = self._abs(directory) if directory else self.root
        try:
            entries = self.fs.ls(where, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._error("listing", directory or ".", exc) from None
        out = []
        for e in entries:
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            if e.get("type") == "directory" or name.startswith(TMP_PREFIX):
                continue
            out.append((name, _modified(e)))
        return out

    def _ls(self, where: str) -> builtins.list[str]:
        """One listing of ``where``.  s3fs's ``ls`` of an empty prefix lists the parent
        too, to tell a missing directory from a file: for a partition's absent
        ``segments/`` that is every batch of the partition, page by page.  Its own
        one-level listing (``_lsdir``) is taken where there is one."""
        lsdir = getattr(self.fs, "_lsdir", None)
        if lsdir is None or not hasattr(self.fs, "loop"):
            return self.fs.ls(where, detail=False)
        from fsspec.asyn import sync

        return [e["name"] for e in sync(self.fs.loop, lsdir, where.rstrip("/"), refresh=True)]

    def delete(self, path: str) -> None:
        try:
            self.fs.rm_file(self._abs(path))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._error("deleting", path, exc) from None

    def delete_tree(self, directory: str) -> None:
        # One listing and batched deletes; the prefix ends with "/" so that a
        # sibling whose name merely starts the same way is left alone.
        prefix = f"{self._abs(directory)}/"
        try:
            paths = self.fs.find(prefix)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._error("listing", directory, exc) from None
        paths = [p for p in paths if p.startswith(prefix)]
        if not paths:
            return
        try:
            self.fs.rm(paths)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._error("deleting under", directory, exc) from None


# fsspec backend for each protocol, and how to install it (each tested against its store's
# server or emulator, hence an extra of txlog's own with the tested versions).
_BACKEND_PACKAGES = {"s3": ("s3fs", "pip install 'txlog[s3]'"),
                     "s3a": ("s3fs", "pip install 'txlog[s3]'"),
                     "gs": ("gcsfs", "pip install 'txlog[gcs]'"),
                     "gcs": ("gcsfs", "pip install 'txlog[gcs]'"),
                     "abfs": ("adlfs", "pip install 'txlog[azure]'"),
                     "abfss": ("adlfs", "pip install 'txlog[azure]'"),
                     "az": ("adlfs", "pip install 'txlog[azure]'")}


def _modified(entry: dict[str, Any]) -> float:
    """An fsspec listing entry's creation time (S3 LastModified, GCS updated/timeCreated,
    Azure last_modified), in seconds since the epoch; 0 (very old) is never guessed."""
    import datetime

    for key in ("LastModified", "last_modified", "timeCreated", "updated", "mtime", "created"):
        value = entry.get(key)
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.UTC)
            return value.timestamp()
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
        if isinstance(value, str) and value:
            try:
                parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=datetime.UTC)
            return parsed.timestamp()
    raise StorageError(f"the store gives no modification time for {entry.get('name')!r}: "
                       "data objects cannot be collected by age")


def object_store_filesystem(url: str, storage_options: dict[str, Any] | None
                            ) -> tuple[Any, str, dict[str, Any]]:
    """The fsspec filesystem of an object-store root, the root's path in it, and the
    options it was made with.

    The endpoint, region and credentials come from ``storage_options`` (the fsspec
    backend's constructor arguments) or from the backend's usual environment variables.
    """
    protocol = url.split("://", 1)[0].lower()
    if storage_options is not None and not isinstance(storage_options, dict):
        raise StorageError(f"{url}: storage_options must be a dict of the fsspec backend's "
                           f"arguments, not {type(storage_options).__name__}")
    options = dict(storage_options or {})
    register_secrets(options)
    if options.get("use_listings_cache", False):
        # A cached listing would hide new batches: a writer would keep choosing a
        # taken slot, a reader would miss the log end.
        raise StorageError(f"{url}: storage option use_listings_cache must stay off: txlog "
                           "needs every listing fresh")
    options["use_listings_cache"] = False
    import fsspec

    package, install = _BACKEND_PACKAGES[protocol]
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError:
        raise StorageError(f"{url}: the {package} package is needed for {protocol}:// roots; "
                           f"install it with {install}") from None
    except Exception as exc:
        raise StorageError(f"{url}: cannot set up the {package} filesystem with storage "
                           f"options {redacted_options(options)}: {type(exc).__name__}: "
                           f"{redact(str(exc))}") from None
    if not root.strip("/"):
        raise StorageError(f"{url}: an object-store root must name a bucket or container "
                           f"(and optionally a prefix in it), as in {protocol}://bucket/prefix")
    return fs, root, options


def open_object_store(url: str, storage_options: dict[str, Any] | None) -> FsspecStorage:
    """A root on an object store whose client txlog reaches through fsspec's API only
    (GCS, Azure)."""
    fs, root, options = object_store_filesystem(url, storage_options)
    return FsspecStorage(fs, root, url, options)
