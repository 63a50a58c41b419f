"""What the command modules share: argument types, table output, progress, opening a root."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..api.log import Log
from ..root.topics import config_value

ROOT_ENV = "TXLOG_ROOT"

# ``leaf_parser(group, name, **kwargs)``: a command's parser, taking --root after its name too.
LeafParser = Callable[..., argparse.ArgumentParser]


class CommandError(Exception):
    """A usage problem found after parsing (reported like a TxlogError)."""


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of seconds")
    return value


def config_item(text: str) -> tuple[str, Any]:
    """``key=value``; a value made of digits becomes an int (as max.message.bytes needs)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not of the form key=value")
    return key, config_value(value)


def json_option(parser: argparse.ArgumentParser,
                help: str = "one JSON object per row instead of a table") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def partitions_option(parser: argparse.ArgumentParser) -> None:
    """TOPIC and --partition of a maintenance command (see ``maintained_partitions``)."""
    parser.add_argument("topic", metavar="TOPIC", help="topic name")
    parser.add_argument("--partition", metavar="N", type=non_negative_int, action="append",
                        help="only this partition (repeatable; default: all)")


def print_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
                 as_json: bool = False) -> None:
    """Aligned columns, or with ``as_json`` one JSON object per row (keys as the header's,
    lower case with '_'; numbers stay numbers, "-" becomes null)."""
    if as_json:
        keys = [h.lower().replace("-", "_") for h in header]
        for row in rows:
            print(json.dumps({k: None if c == "-" else c  # "-" is the table's "none"
                              for k, c in zip(keys, row, strict=True)}))
        return
    rows = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    for row in [list(header), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


class Progress:
    """A one-line counter on standard error while a long command runs on a terminal;
    nothing at all in a pipe or a file, so output stays machine-readable."""

    def __init__(self, verb: str, unit: str, streams_output: bool = False) -> None:
        self.verb, self.unit = verb, unit
        # A command that prints as it goes shows a counter only when its output goes
        # elsewhere (txlog dump ... > file): on one terminal the two would interleave.
        self.shown = sys.stderr.isatty() and not (streams_output and sys.stdout.isatty())
        self.last = 0.0

    def __enter__(self) -> Progress:
        return self

    def update(self, done: int, total: int | None = None) -> None:
        now = time.monotonic()
        if not self.shown or (now - self.last < 0.1 and done != total):
            return
        self.last = now
        of = f"/{total}" if total is not None else ""
        sys.stderr.write(f"\r{self.verb} {done}{of} {self.unit}")
        sys.stderr.flush()

    def __exit__(self, *exc: Any) -> None:
        if self.shown and self.last:
            sys.stderr.write("\r\x1b[K")  # clear the line before results or errors
            sys.stderr.flush()


def write_bytes(data: bytes) -> None:
    """Raw bytes to stdout (values are bytes; decoding them would change them)."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(data.decode("utf-8", "backslashreplace"))
    else:
        buffer.write(data)
        buffer.flush()


def text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "backslashreplace")


def utc(ms: int) -> str:
    if ms < 0:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def open_log(root: str | None, create: bool = False) -> Log:
    if not root:
        raise CommandError(f"no log root: pass --root DIR or set {ROOT_ENV}")
    if not create and "://" not in root and not os.path.isdir(root):
        # Opening would create the directory; a mistyped path should not do that.
        raise CommandError(f"{root}: no such directory")
    return Log(root, create=create)


def maintained_partitions(log: Log, topic: str, chosen: list[int] | None) -> list[int]:
    """The partitions a maintenance command works on, each checked to exist."""
    desc = log.describe_topic(topic, refresh=True)
    partitions = list(dict.fromkeys(chosen)) if chosen else list(range(desc.partitions))
    for p in partitions:
        log.partition(topic, p)  # an unknown partition fails here, named
    return partitions


def datetime_ms(text: str) -> int:
    """An ISO 8601 date-time (Kafka's yyyy-MM-ddTHH:mm:ss.SSS, optionally with Z or +HH:MM)
    as epoch milliseconds.  Without an offset it is taken as UTC, not the machine's local
    time as Kafka's tool does: the same command then means the same instant on every
    machine, and every time txlog prints is UTC."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 date-time such as 2024-01-31T10:00:00.000 "
            "(UTC unless it ends in Z or +HH:MM)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return (moment - epoch) // datetime.timedelta(milliseconds=1)  # exact, no float


def time_spec(text: str) -> str | int:
    """``--time``: 'earliest', 'latest', epoch milliseconds, or an ISO 8601 date-time."""
    if text in ("earliest", "latest"):
        return text
    if text.lstrip("-").isdigit():
        return non_negative_int(text)
    try:
        return datetime_ms(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not 'earliest', 'latest', epoch milliseconds or an ISO 8601 "
            "date-time such as 2024-01-31T10:00:00.000") from None


def topic_partitions(text: str) -> tuple[str, list[int] | None]:
    """``TOPIC`` or ``TOPIC:P[,P...]`` (kafka-consumer-groups --topic's form)."""
    topic, sep, parts = text.partition(":")
    if not topic:
        raise argparse.ArgumentTypeError(f"{text!r} has no topic name")
    if not sep:
        return topic, None
    try:
        return topic, [non_negative_int(p) for p in parts.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: partitions must be TOPIC:P[,P...] ({exc})") from None


def scoped_partitions(log: Log, topic: str, chosen: list[int] | None) -> list[tuple[str, int]]:
    """(topic, partition) for TOPIC[:P,...], each checked to exist (an unknown topic or
    partition fails here, named)."""
    return [(topic, p) for p in maintained_partitions(log, topic, chosen)]
