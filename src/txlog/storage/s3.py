"""S3 through s3fs: streamed publishes as multipart uploads whose completion is
conditional, and the removal of the uploads that publishes which died left behind."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from ..errors import StorageError
from .contract import length_mismatch
from .object_store import FsspecStorage, fs_package, object_store_filesystem
from .secrets import redact

logger = logging.getLogger(__name__)

S3_MIN_PART_BYTES = 5 << 20  # S3 refuses smaller parts, the last one excepted
S3_MAX_PARTS = 10_000


class S3Storage(FsspecStorage):
    """An S3 root: FsspecStorage, with streamed publishes that hold one part at a time."""

    def _request(self, method: str, **kwargs: Any) -> Any:
        """One S3 API request through s3fs's client (its credentials, retries and loop).

        The only use of s3fs's private ``_call_s3``: its public API has no multipart
        upload fed part by part whose completion carries If-None-Match: * and which
        is aborted when that completion is refused (a file opened ``"xb"`` leaves the
        refused upload behind), and its ``list_multipart_uploads`` takes a whole
        bucket and returns the first page only, not one root's prefix page by page.
        """
        from fsspec.asyn import sync

        return sync(self.fs.loop, self.fs._call_s3, method, **kwargs)

    def _publish_stream(self, path: str, chunks: Iterable[bytes | pa.Buffer], size: int,
                        part_bytes: int) -> bool:
        """A multipart upload whose completion carries If-None-Match: *, so memory is one
        part (``part_bytes``, at least S3's 5 MiB); a stream of at most one part is one
        conditional PUT of the joined chunks, as on the other stores."""
        part = max(part_bytes, S3_MIN_PART_BYTES, -(-size // S3_MAX_PARTS))
        if size <= part:
            return super()._publish_stream(path, chunks, size, part_bytes)
        return self._multipart_if_absent(path, chunks, size, part)

    def _multipart_if_absent(self, path: str, chunks: Iterable[bytes | pa.Buffer], size: int,
                             part: int) -> bool:
        """Parts of ``part`` bytes, then CompleteMultipartUpload with If-None-Match: *.

        Until completion the parts are no object: nothing lists or reads them,
        so a writer killed half-way leaves only an incomplete upload, which
        ``remove_temp_files`` aborts once it is old.  The condition on the
        completion makes the name's creation exclusive, as a conditional PUT:
        the loser's completion is refused with 412 and its upload aborted.
        """
        bucket, key, _ = self.fs.split_path(self._abs(path))
        try:
            upload = self._request("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
        except Exception as exc:
            raise self._error("starting an upload of", path, exc) from None
        upload_of = {"Bucket": bucket, "Key": key, "UploadId": upload}
        completed = False
        try:
            parts: list[dict[str, Any]] = []
            for number, body in enumerate(_parts(path, chunks, size, part), 1):
                try:
                    answer = self._request("upload_part", **upload_of, PartNumber=number,
                                           Body=body)
                except Exception as exc:
                    raise self._error(f"uploading part {number} of", path, exc) from None
                parts.append({"PartNumber": number, "ETag": answer["ETag"]})
            # A retried completion that meets its own earlier one is answered "taken"
            # too: callers handle it as a lost race against an identical object, as
            # ``_put_if_absent`` explains.
            completed = self._created_unless_taken(
                lambda: self._request("complete_multipart_upload", **upload_of,
                                      MultipartUpload={"Parts": parts}, IfNoneMatch="*"),
                "completing the upload of", path)
            return completed
        finally:
            if not completed:
                try:
                    self._request("abort_multipart_upload", **upload_of)
                except Exception as exc:  # an incomplete upload: remove_temp_files aborts it
                    logger.warning("could not abort the upload of %s/%s: %s", self.url, path,
                                   redact(str(exc)))

    def remove_temp_files(self, older_than_s: float) -> list[str]:
        """Abort the incomplete multipart uploads under the root older than ``older_than_s``
        (streamed publishes that died).  Safe as the local temp files' removal: an upload
        is used by one publish only and never read, and a publish stalled that long fails
        on its next part or completion with an error, publishing nothing."""
        bucket, prefix, _ = self.fs.split_path(self.root)
        prefix = f"{prefix}/" if prefix else ""
        cutoff = time.time() - older_than_s
        removed = []
        page: dict[str, str] = {}
        try:
            while True:
                answer = self._request("list_multipart_uploads", Bucket=bucket, Prefix=prefix,
                                       **page)
                for upload in answer.get("Uploads", []):
                    if upload["Initiated"].timestamp() >= cutoff:
                        continue
                    self._request("abort_multipart_upload", Bucket=bucket, Key=upload["Key"],
                                  UploadId=upload["UploadId"])
                    removed.append(upload["Key"][len(prefix):])
                if not answer.get("IsTruncated"):
                    break
                page = {"KeyMarker": answer["NextKeyMarker"],
                        "UploadIdMarker": answer["NextUploadIdMarker"]}
        except Exception as exc:
            raise self._error("aborting old uploads under", ".", exc) from None
        return sorted(removed)


def _parts(path: str, chunks: Iterable[bytes | pa.Buffer], size: int,
           part: int) -> Iterator[bytes]:
    """The stream in parts of ``part`` bytes, the last one shorter; a stream of other than
    ``size`` bytes raises StorageError before its last part."""
    buffer = bytearray()
    total = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        total += len(view)
        while view:
            room = part - len(buffer)
            buffer += view[:room]
            view = view[room:]
            if len(buffer) >= part:
                yield bytes(buffer)
                buffer.clear()
        del view
    if total != size:
        raise StorageError(length_mismatch(path, total, size))
    if buffer:
        yield bytes(buffer)


def open_s3(url: str, storage_options: dict[str, Any] | None) -> FsspecStorage:
    """An s3:// root.  fsspec gives s3fs for it unless another filesystem was registered
    for the scheme, which then gets the generic object store (one PUT per publish)."""
    fs, root, options = object_store_filesystem(url, storage_options)
    storage = S3Storage if fs_package(fs) == "s3fs" else FsspecStorage
    return storage(fs, root, url, options)
