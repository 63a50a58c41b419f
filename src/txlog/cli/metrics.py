"""``txlog metrics``: the root's figures (txlog/admin/figures.py) as Prometheus text,
printed once or served over HTTP for a monitoring system to scrape.

The exposition format is written here rather than with prometheus_client: it is
a few lines of text, and the command then needs nothing beyond the standard
library.  Scrapes within ``--cache-seconds`` of a gathering are answered from
it, so a burst of scrapers (or a dashboard refresh) costs the store nothing.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..admin.figures import Figures, gather
from ..errors import TxlogError
from ..root.root import Root
from .common import LeafParser, non_negative_int, open_log, positive_seconds

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_CACHE_SECONDS = 10.0

# name, help, labels' names, the figures -> (labels, value) rows
Family = tuple[str, str, tuple[str, ...], Callable[[Figures], Iterable[tuple[tuple, float]]]]
FAMILIES: tuple[Family, ...] = (
    ("txlog_partition_log_start_offset", "First offset a reader may read.",
     ("topic", "partition"), lambda f: _per_partition(f, lambda p: p.bounds.log_start)),
    ("txlog_partition_last_stable_offset",
     "Last stable offset: where read_committed readers stop.",
     ("topic", "partition"), lambda f: _per_partition(f, lambda p: p.bounds.stable)),
    ("txlog_partition_log_end_offset", "Offset the next record will get.",
     ("topic", "partition"), lambda f: _per_partition(f, lambda p: p.bounds.end)),
    ("txlog_partition_size_bytes", "Bytes the partition's segments and batch objects hold.",
     ("topic", "partition"), lambda f: _per_partition(f, lambda p: p.size_bytes)),
    ("txlog_group_committed_offset", "The group's committed offset.",
     ("group", "topic", "partition"),
     lambda f: (((g.group, g.topic, g.partition), g.committed) for g in f.groups)),
    ("txlog_group_lag",
     ("Log end offset minus the group's committed offset (as kafka-consumer-groups); "
      "a read_committed consumer's lag is txlog_partition_last_stable_offset minus "
      "txlog_group_committed_offset."),
     ("group", "topic", "partition"),
     lambda f: (((g.group, g.topic, g.partition), g.lag) for g in f.groups)),
    ("txlog_transactions_open", "Undecided transactions holding a partition's LSO back.",
     (), lambda f: [((), f.transactions.open)]),
    ("txlog_transactions_hanging",
     ("Open transactions nobody will end: past their timeout, or no coordinator state "
      "describes them (txlog transactions find-hanging)."),
     (), lambda f: [((), f.transactions.hanging)]),
    ("txlog_transactions_oldest_open_age_seconds",
     "Age of the oldest open transaction (0 with none open).",
     (), lambda f: [((), f.transactions.oldest_age_ms / 1000)]),
)


def _per_partition(figures: Figures, value: Callable[[Any], int]
                   ) -> Iterable[tuple[tuple, float]]:
    return (((p.bounds.topic, p.bounds.partition), value(p)) for p in figures.partitions)


def _label_value(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(figures: Figures) -> str:
    """The figures in Prometheus' text exposition format (version 0.0.4)."""
    lines = []
    for name, help_text, label_names, rows in FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in rows(figures):
            pairs = ",".join(f'{k}="{_label_value(v)}"'
                             for k, v in zip(label_names, labels, strict=True))
            number = str(value) if isinstance(value, int) else repr(float(value))
            lines.append(f"{name}{{{pairs}}} {number}" if pairs else f"{name} {number}")
    return "\n".join(lines) + "\n"


class CachedExposition:
    """The rendered figures, gathered again only once ``cache_seconds`` have passed."""

    def __init__(self, root: Root, cache_seconds: float) -> None:
        self.root = root
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()  # one gathering at a time; the others wait for it
        self._text: str | None = None
        self._taken = 0.0

    def text(self) -> str:
        with self._lock:
            now = time.monotonic()
            if self._text is None or now - self._taken >= self.cache_seconds:
                self._text = render(gather(self.root))
                self._taken = time.monotonic()
            return self._text


def serve(exposition: CachedExposition, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server answering GET /metrics (not yet serving: call ``serve_forever``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            try:
                body = exposition.text().encode()
            except (TxlogError, OSError) as exc:  # the scrape fails, the server stays
                self.send_error(500, f"gathering the figures failed: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a scrape every few seconds would fill the terminal

    return ThreadingHTTPServer((host, port), Handler)


def add_metrics(commands: Any, leaf_parser: LeafParser) -> None:
    metrics = leaf_parser(
        commands, "metrics", help="serve the root's figures to Prometheus, or print them once",
        description="Per partition its log start, last stable offset, log end and size in "
                    "bytes; per group and partition its committed offset and lag (log end "
                    "minus committed); the undecided transactions counted: open, hanging "
                    "past their timeout, and the oldest one's age. Served as Prometheus text "
                    "at http://HOST:PORT/metrics until interrupted, or printed once.")
    mode = metrics.add_mutually_exclusive_group(required=True)
    mode.add_argument("--port", metavar="N", type=non_negative_int,
                      help="serve on this TCP port")
    mode.add_argument("--once", action="store_true", help="print the figures once and exit")
    metrics.add_argument("--host", metavar="HOST", default="127.0.0.1",
                         help="the address to serve on (default: 127.0.0.1)")
    metrics.add_argument("--cache-seconds", metavar="S", type=positive_seconds,
                         default=DEFAULT_CACHE_SECONDS,
                         help="answer scrapes within S seconds of the last gathering from it, "
                              f"without reading the root (default: {DEFAULT_CACHE_SECONDS:g})")


def run_metrics(args: argparse.Namespace) -> None:
    root = open_log(args.root).services
    exposition = CachedExposition(root, args.cache_seconds)
    if args.once:
        sys.stdout.write(exposition.text())
        return
    server = serve(exposition, args.host, args.port)
    print(f"serving http://{args.host}:{server.server_address[1]}/metrics", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
