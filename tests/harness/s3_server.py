"""A local S3 endpoint for the tests and the request-count benchmark: moto in server mode.

moto's S3 honours ``If-None-Match: *`` (a second conditional PutObject of a
name gets 412 PreconditionFailed with ``Condition: If-None-Match``, exactly
as AWS answers), so txlog's real S3 code path runs against it: s3fs,
aiobotocore, HTTP.  Three things are added around moto's WSGI application:

* **Writes are serialised.**  moto checks the condition and then stores the
  object as two separate steps without a lock, so two concurrent
  conditional PUTs of one name can both succeed on moto (AWS applies the
  condition atomically): without this lock, 16 processes racing for 100
  names each saw two winners for one name in one of four runs.  One lock
  around every mutating request restores the store's guarantee; reads stay
  concurrent.
* **Requests are counted** by kind (PUT, GET, HEAD, LIST, DELETE), which is
  what an object store bills.
* **Faults can be injected** per request: an error answer instead of the
  request (409 ConditionalRequestConflict, a 5xx), or an error answer *after*
  the request was applied (a lost reply: the outcome is unknown to the
  client), and a bucket can be made to ignore ``If-None-Match`` like some
  S3-compatible stores do.

Used in-process by tests/conftest.py (a session fixture) and by
benchmarks/object_store_requests.py; the soak benchmark runs it as a process
of its own (``python tests/harness/s3_server.py`` prints the endpoint and serves
until its stdin closes).
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

REGION = "us-east-1"
# Distinctive on purpose: the credential tests grep every log line, error and
# object for these strings.
ACCESS_KEY = "AKIATXLOGTESTKEY0001"
SECRET_KEY = "txlogTestSecret/Do+Not+Leak/0123456789abcd"


@dataclass
class Fault:
    """Answer requests that ``matches`` with an S3 error, before or after applying them."""

    matches: Callable[[str, str], bool]  # (method, "bucket/key") -> bool
    status: int
    code: str
    after: bool = False  # apply the request first, then answer with the error
    times: int = 1
    message: str = "injected by the test server"
    hits: int = 0


def request_kind(method: str, path: str, query: str) -> str:
    """What an S3 request is, from its method and path-style URL."""
    parts = path.lstrip("/").split("/", 1)
    has_key = len(parts) == 2 and parts[1] != ""
    if method == "GET":
        return "GET" if has_key else "LIST"
    if method == "HEAD":
        return "HEAD" if has_key else "HEAD-BUCKET"
    if method == "PUT":
        return "PUT" if has_key else "CREATE-BUCKET"
    if method == "DELETE" or (method == "POST" and "delete" in query.split("&")):
        return "DELETE"
    return method


class MotoS3:
    """moto's S3 on 127.0.0.1 (a free port), in a thread of this process."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.log: list[tuple[str, str]] = []  # (kind, bucket/key) of every request, when recording
        self.recording = False
        self.faults: list[Fault] = []
        self.ignoring_conditions: set[str] = set()  # buckets that drop If-None-Match
        self.serialise_writes = True  # off only to show moto's own race (see the module doc)
        self._write_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> MotoS3:
        from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # a line per request would flood every test's captured log

        # moto's S3 application itself: its usual front (DomainDispatcherApplication)
        # works out the service of every request anew, scanning moto's package
        # directory each time (a third of the cost of a request), and this
        # endpoint only ever serves S3.
        moto_app = create_backend_app("s3")

        def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
            return self._handle(moto_app, environ, start_response)

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._server = make_server("127.0.0.1", port, app, threaded=True,
                                   request_handler=QuietHandler)
        self.endpoint = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="moto-s3")
        self._thread.start()
        return self

    @classmethod
    def serving_at(cls, endpoint: str) -> MotoS3:
        """A handle on a server another process runs (``python tests/harness/s3_server.py``):
        clients, buckets and storage options work; counts and faults stay there."""
        handle = cls()
        handle.endpoint = endpoint
        return handle

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    # --- what clients need --------------------------------------------------------------

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs arguments for this endpoint, as ``Log(..., storage_options=)`` takes them."""
        return {"endpoint_url": self.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY,
                "client_kwargs": {"region_name": REGION}}

    @property
    def env(self) -> dict[str, str]:
        """The same, as the environment variables botocore reads (for child processes)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self) -> Any:
        """A plain boto3 client, for looking at the bucket independently of txlog."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"txlog-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def root(self) -> str:
        """A fresh bucket; the log root is a prefix inside it (as the GCS and Azure
        emulators' ``root()``, tests/harness/store_emulators.py)."""
        return f"s3://{self.create_bucket()}/log"

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix``, read with boto3."""
        client = self.client()
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix):
            for item in page.get("Contents", []):
                out[item["Key"]] = client.get_object(Bucket=bucket,
                                                     Key=item["Key"])["Body"].read()
        return out

    def inject(self, fault: Fault) -> Fault:
        with self._state_lock:
            self.faults.append(fault)
        return fault

    def reset_counts(self) -> None:
        with self._state_lock:
            self.counts.clear()
            self.log.clear()

    # --- the WSGI wrapper -----------------------------------------------------------------

    def _handle(self, moto_app: Callable, environ: dict,
                start_response: Callable) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        query = environ.get("QUERY_STRING", "")
        kind = request_kind(method, path, query)
        target = path.lstrip("/") + (f"?{query}" if kind == "LIST" else "")
        bucket = target.split("/", 1)[0].split("?", 1)[0]
        with self._state_lock:
            self.counts[kind] += 1
            if self.recording:
                self.log.append((kind, target))
            fault = next((f for f in self.faults if f.hits < f.times and
                          f.matches(method, target)), None)
            if fault is not None:
                fault.hits += 1
        if bucket in self.ignoring_conditions:
            environ.pop("HTTP_IF_NONE_MATCH", None)
        if fault is not None and not fault.after:
            return _error(start_response, fault)
        if method in ("PUT", "POST", "DELETE") and self.serialise_writes:
            with self._write_lock:
                body = b"".join(moto_app(environ, _keep(start_response, fault)))
        else:
            body = b"".join(moto_app(environ, _keep(start_response, fault)))
        if fault is not None:  # applied; now the reply is "lost"
            return _error(start_response, fault)
        return [body]


def _keep(start_response: Callable, fault: Fault | None) -> Callable:
    """start_response, or a stand-in that swallows it when an error answer follows."""
    if fault is None:
        return start_response
    return lambda *args, **kwargs: (lambda data: None)


def _error(start_response: Callable, fault: Fault) -> list[bytes]:
    body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{fault.code}</Code>'
            f"<Message>{escape(fault.message)}</Message>"
            f"<RequestId>{uuid.uuid4().hex}</RequestId></Error>").encode()
    start_response(f"{fault.status} Injected", [("Content-Type", "application/xml"),
                                                ("Content-Length", str(len(body)))])
    return [body]


if __name__ == "__main__":
    # Serve from a process of its own, until stdin closes: moto spends milliseconds of
    # Python on every request, which in the client's process would share its GIL.
    import sys

    serving = MotoS3().start()
    print(serving.endpoint, flush=True)
    sys.stdin.read()
    serving.stop()
