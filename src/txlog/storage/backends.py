"""The one storage primitive txlog builds on: publish-if-absent.

Every durable change is the creation of a new immutable object whose name is
its place in a sequence.  A backend only has to create an object atomically
and exclusively; everything else (offsets, transactions, group offsets) is
optimistic concurrency on top of that.

Paths given to a backend are relative to the log root and always use ``/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from ..errors import StorageError, UnsupportedStorageError
from .paths import PROBE_DIR, TMP_PREFIX

logger = logging.getLogger(__name__)

MMAP_MIN_BYTES = 1 << 20  # smaller objects are read into memory rather than mapped
# What a streamed publish may buffer (an object store's multipart part): compaction's
# default memory bound, whatever segment.bytes is (partition/compaction.py).
DEFAULT_PART_BYTES = 32 << 20
S3_MIN_PART_BYTES = 5 << 20  # S3 refuses smaller parts, the last one excepted
S3_MAX_PARTS = 10_000


def _check_relative(path: str) -> None:
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid storage path {path!r}: must be relative, without '.' or '..'")


class Storage(ABC):
    """A flat namespace of immutable objects under one root."""

    url: str
    # Each request waits on a network round trip: worth overlapping several (readers
    # fetch ahead); local and in-memory requests are cheaper than a thread hand-off.
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
        data = _joined(path, chunks, size)
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

        Temporary files of in-flight publishes are never listed.
        """

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove an object (or an empty directory); a missing one is not an error."""

    def list_times(self, directory: str) -> list[tuple[str, float]]:
        """Names directly under ``directory`` with the time each object was created, in
        seconds since the epoch (the store's clock): gc of data objects goes by age."""
        raise NotImplementedError(f"{type(self).__name__} cannot tell objects' ages")

    def remove_temp_files(self, older_than_s: float) -> list[str]:
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
        tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
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
                    raise StorageError(_length_mismatch(path, total, size))
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


class MemoryStorage(Storage):
    """A dict behind a lock: unit tests of the protocol without touching disk."""

    def __init__(self) -> None:
        self.url = f"memory://{uuid.uuid4().hex}"
        self._objects: dict[str, bytes] = {}
        self._times: dict[str, float] = {}
        self._lock = threading.Lock()

    def publish_if_absent(self, path: str, data: bytes) -> bool:
        _check_relative(path)
        with self._lock:
            if path in self._objects:
                return False
            self._objects[path] = bytes(data)
            self._times[path] = time.time()
            return True

    def list_times(self, directory: str) -> list[tuple[str, float]]:
        prefix = directory.rstrip("/") + "/"
        with self._lock:
            return [(k[len(prefix):], self._times.get(k, 0.0)) for k in self._objects
                    if k.startswith(prefix) and "/" not in k[len(prefix):]]

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
            self._times.pop(path, None)


def _length_mismatch(path: str, got: int, size: int) -> str:
    return (f"stream for {path!r} yielded {got} bytes, {size} were promised: nothing "
            "published")


def _joined(path: str, chunks: Iterable[bytes | pa.Buffer], size: int) -> bytes:
    """The chunks as one bytes object, checked to be ``size`` long (the backends that
    cannot stream: memory://, and object stores without multipart uploads here)."""
    data = b"".join(memoryview(c).cast("B") for c in chunks)
    if len(data) != size:
        raise StorageError(_length_mismatch(path, len(data), size))
    return data


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


# Option names whose values are credentials, in fsspec backends' spellings
# (s3fs key/secret/token, botocore aws_*, adlfs account_key/sas_token/
# connection_string/client_secret, gcsfs token): matched on the last word.
_SECRET_NAME = re.compile(r"(secret|token|password|passwd|key|credentials?|sas|signature|"
                          r"connection_string|key_id)$", re.IGNORECASE)
# The same credentials when they come from the environment instead.
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
               "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
               "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_SECRET")
MIN_SECRET_LENGTH = 4  # shorter values would be scrubbed out of ordinary words
REDACTED = "***"
_secrets: set[str] = set()
_secrets_longest_first: tuple[str, ...] = ()  # replaced whole, so readers need no lock
_secrets_lock = threading.Lock()
_scrubber_installed = False


def is_secret_option(name: str) -> bool:
    """Whether a storage option's value is a credential, to be shown as ``***``."""
    return bool(_SECRET_NAME.search(str(name)))


def _secret_values(options: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(options, dict):
        for name, value in options.items():
            if isinstance(value, dict):
                found |= _secret_values(value)
            elif is_secret_option(name) and isinstance(value, str):
                found.add(value)
    return found


def redact(text: str) -> str:
    """``text`` with every credential this process has been given replaced by ``***``.

    Store clients put credentials into text txlog does not write itself:
    botocore's debug log prints signed request headers (the access key id,
    the session token), and a server's error message may echo a request.
    """
    for secret in _secrets_longest_first:
        text = text.replace(secret, REDACTED)
    return text


def redacted_options(options: Any) -> Any:
    """Storage options fit to show: credential values replaced by ``***``."""
    if isinstance(options, dict):
        return {name: redacted_options(value) if isinstance(value, dict)
                else REDACTED if is_secret_option(name) else value
                for name, value in options.items()}
    return options


def register_secrets(storage_options: dict[str, Any] | None) -> None:
    """Remember the credentials among ``storage_options`` (and the environment's).

    From then on every log record of this process has them scrubbed, and so
    do txlog's storage errors.  A process-wide log-record factory is the one
    place that sees the records of every logger (botocore's included) before
    any handler formats them; it is installed only once a credential is known.
    """
    global _scrubber_installed, _secrets_longest_first
    values = _secret_values(storage_options or {})
    values |= {os.environ[name] for name in _SECRET_ENV if os.environ.get(name)}
    values = {v for v in values if len(v) >= MIN_SECRET_LENGTH}
    with _secrets_lock:
        if values <= _secrets:
            return
        _secrets.update(values)
        _secrets_longest_first = tuple(sorted(_secrets, key=len, reverse=True))
        if _scrubber_installed:
            return
        _scrubber_installed = True
        previous = logging.getLogRecordFactory()

        def scrubbing_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            try:
                message = record.getMessage()
            except Exception:  # a broken format string is logging's to report
                return record
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, None
            if record.exc_info and record.exc_info[0] is not None:
                text = logging.Formatter().formatException(record.exc_info)
                if redact(text) != text:
                    record.exc_text = redact(text)
            return record

        logging.setLogRecordFactory(scrubbing_factory)


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
        self._native_create = type(fs).__module__.split(".")[0] in _NATIVE_CREATE_PACKAGES
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
            url.split("://", 1)[0].lower(), self.root, type(fs).__module__.split(".")[0],
            getattr(fs, "endpoint_url", None), _endpoint_options(storage_options or {}),
            sorted((k, os.environ[k]) for k in _ENDPOINT_ENV if os.environ.get(k))))

    def __repr__(self) -> str:
        return f"FsspecStorage({self.url!r}, storage_options={self._shown_options!r})"

    def _abs(self, path: str) -> str:
        _check_relative(path)
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
        """On S3 a multipart upload whose completion carries If-None-Match: *, so memory
        is one part (``part_bytes``, at least S3's 5 MiB); a stream of at most one part,
        and every other store, is one conditional PUT of the joined chunks (GCS and Azure
        here: memory is then the whole object, docs/protocol.md section 7)."""
        if size <= 0:
            raise StorageError(f"refusing to publish an empty object at {path!r}")
        self._abs(path)
        self.check_conditional_writes()
        part = max(part_bytes, S3_MIN_PART_BYTES, -(-size // S3_MAX_PARTS))
        if type(self.fs).__module__.split(".")[0] != "s3fs" or size <= part:
            return self._put_if_absent(path, _joined(path, chunks, size))
        return self._multipart_if_absent(path, chunks, size, part)

    def _s3_call(self, path: str) -> Any:
        """A caller of the S3 API on ``path``'s bucket and key, through s3fs's client (its
        retries and credentials)."""
        from fsspec.asyn import sync

        bucket, key, _ = self.fs.split_path(self._abs(path))

        def call(method: str, **kwargs: Any) -> Any:
            return sync(self.fs.loop, self.fs._call_s3, method, Bucket=bucket, Key=key,
                        **kwargs)
        return call

    def _multipart_if_absent(self, path: str, chunks: Iterable[bytes | pa.Buffer], size: int,
                             part: int) -> bool:
        """Parts of ``part`` bytes, then CompleteMultipartUpload with If-None-Match: *.

        Until completion the parts are no object: nothing lists or reads them,
        so a writer killed half-way leaves only an incomplete upload, which
        ``remove_temp_files`` aborts once it is old.  The condition on the
        completion makes the name's creation exclusive, as a conditional PUT:
        the loser's completion is refused with 412 and its upload aborted.
        """
        call = self._s3_call(path)
        try:
            upload = call("create_multipart_upload")["UploadId"]
        except Exception as exc:
            raise self._error("starting an upload of", path, exc) from None
        completed = False
        try:
            parts: list[dict[str, Any]] = []
            buffer = bytearray()
            total = 0

            def send() -> None:
                number = len(parts) + 1
                try:
                    answer = call("upload_part", UploadId=upload, PartNumber=number,
                                  Body=bytes(buffer))
                except Exception as exc:
                    raise self._error(f"uploading part {number} of", path, exc) from None
                parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                buffer.clear()

            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                total += len(view)
                while view:
                    room = part - len(buffer)
                    buffer += view[:room]
                    view = view[room:]
                    if len(buffer) >= part:
                        send()
                del view
            if total != size:
                raise StorageError(_length_mismatch(path, total, size))
            if buffer:
                send()
            # A retried completion that meets its own earlier one is answered "taken"
            # too: callers handle it as a lost race against an identical object, as
            # ``_put_if_absent`` explains.
            completed = self._created_unless_taken(
                lambda: call("complete_multipart_upload", UploadId=upload,
                             MultipartUpload={"Parts": parts}, IfNoneMatch="*"),
                "completing the upload of", path)
            return completed
        finally:
            if not completed:
                try:
                    call("abort_multipart_upload", UploadId=upload)
                except Exception as exc:  # an incomplete upload: remove_temp_files aborts it
                    logger.warning("could not abort the upload of %s/%s: %s", self.url, path,
                                   redact(str(exc)))

    def remove_temp_files(self, older_than_s: float) -> list[str]:
        """Abort the incomplete multipart uploads under the root older than ``older_than_s``
        (streamed publishes that died; S3 only).  Safe as the local temp files' removal:
        an upload is used by one publish only and never read, and a publish stalled that
        long fails on its next part or completion with an error, publishing nothing."""
        if type(self.fs).__module__.split(".")[0] != "s3fs":
            return []
        from fsspec.asyn import sync

        bucket, prefix, _ = self.fs.split_path(self.root)
        prefix = f"{prefix}/" if prefix else ""
        cutoff = time.time() - older_than_s
        removed = []
        page: dict[str, str] = {}
        try:
            while True:
                answer = sync(self.fs.loop, self.fs._call_s3, "list_multipart_uploads",
                              Bucket=bucket, Prefix=prefix, **page)
                for upload in answer.get("Uploads", []):
                    if upload["Initiated"].timestamp() >= cutoff:
                        continue
                    sync(self.fs.loop, self.fs._call_s3, "abort_multipart_upload",
                         Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                    removed.append(upload["Key"][len(prefix):])
                if not answer.get("IsTruncated"):
                    break
                page = {"KeyMarker": answer["NextKeyMarker"],
                        "UploadIdMarker": answer["NextUploadIdMarker"]}
        except Exception as exc:
            raise self._error("aborting old uploads under", ".", exc) from None
        return sorted(removed)

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

    def list_times(self, directory: str) -> list[tuple[str, float]]:
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

    def _ls(self, where: str) -> list[str]:
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


_EXCLUSIVE_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "az", "abfss"}
_memory_roots: dict[str, MemoryStorage] = {}
_memory_lock = threading.Lock()


# fsspec backend for each protocol, and how to install it (each tested against its store's
# server or emulator, hence an extra of txlog's own with the tested versions).
_BACKEND_PACKAGES = {"s3": ("s3fs", "pip install 'txlog[s3]'"),
                     "s3a": ("s3fs", "pip install 'txlog[s3]'"),
                     "gs": ("gcsfs", "pip install 'txlog[gcs]'"),
                     "gcs": ("gcsfs", "pip install 'txlog[gcs]'"),
                     "abfs": ("adlfs", "pip install 'txlog[azure]'"),
                     "abfss": ("adlfs", "pip install 'txlog[azure]'"),
                     "az": ("adlfs", "pip install 'txlog[azure]'")}
_USERINFO = re.compile(r"^[a-z0-9+.-]+://[^/@]*:[^/@]*@", re.IGNORECASE)


def _modified(entry: dict[str, Any]) -> float:
    """An fsspec listing entry's creation time (S3 LastModified, GCS updated/timeCreated,
    Azure last_modified), in seconds since the epoch; 0 (very old) is never guessed."""
    import datetime

    for key in ("LastModified", "last_modified", "timeCreated", "updated", "mtime", "created"):
        value = entry.get(key)
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.timezone.utc)
            return value.timestamp()
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
        if isinstance(value, str) and value:
            try:
                parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=datetime.timezone.utc)
            return parsed.timestamp()
    raise StorageError(f"the store gives no modification time for {entry.get('name')!r}: "
                       "data objects cannot be collected by age")


def open_storage(url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
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
    if _USERINFO.match(url):
        # The root URL is shown in errors, reprs and logs; a password inside it would be too.
        raise StorageError(
            f"{protocol}:// root: credentials inside the URL (user:password@) are refused; "
            "pass them as storage_options or through the backend's environment variables")
    if protocol in ("hdfs", "viewfs", "webhdfs"):
        raise UnsupportedStorageError(
            f"{url}: HDFS cannot create a file only if it is absent through fsspec/pyarrow, "
            "so it cannot hold a txlog root")
    if protocol not in _EXCLUSIVE_PROTOCOLS:
        raise UnsupportedStorageError(
            f"{url}: protocol {protocol!r} is not known to support exclusive creation "
            f"(supported: local paths, memory://, {', '.join(sorted(_EXCLUSIVE_PROTOCOLS))})")
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
    return FsspecStorage(fs, root, url, options)
