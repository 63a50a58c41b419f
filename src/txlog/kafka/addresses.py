"""Where a ported program names its Kafka cluster, txlog takes a root: refusing broker addresses.

The first line of most Kafka programs is ``bootstrap_servers="localhost:9092"``
(Spark's ``kafka.bootstrap.servers``).  Taken as a root, it is a relative
directory named ``localhost:9092``, and the program writes into it without a
word; so a value that can only be a broker address is refused instead, with
what to give.  kafka-python's clients, the admin client and Spark's options
all ask here, so the rule is the same everywhere.

What counts as a broker address is narrow, so no real root is refused: a
``host:port`` with a numeric port and a host that is a DNS name, an IPv4 or a
bracketed IPv6 address (``localhost:9092``, ``10.0.0.1:9092``, ``[::1]:9092``,
``broker-1.example.com:9093``), optionally behind a Kafka listener's scheme
(``PLAINTEXT://``, ``SASL_SSL://``...); a comma-separated list of hosts, or
a list of them written out (``['a:1', 'b:2']``); or a list of several
values.  Beyond a listener's scheme, nothing with a ``/`` or a ``\\`` is one
(``s3://bucket:9000/p``, ``C:\\data``, ``logs/a:1``).  The paths refused
are bare relative names that read as brokers (``localhost:9092``, ``a,b``);
``./<name>`` reaches them.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..errors import InvalidConfigError

ROOT_IS = ("a txlog root is a path or URL (a directory, file://..., s3://bucket/prefix, "
           "memory://name)")

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9]+)?\])"
_LISTENER = r"(?:(?:PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL|kafka)://)?"
_BROKER = re.compile(rf"{_LISTENER}{_HOST}:[0-9]{{1,5}}", re.IGNORECASE)
_HOST_ONLY = re.compile(rf"{_LISTENER}{_HOST}(?::[0-9]{{1,5}})?", re.IGNORECASE)


def is_broker_address(text: str) -> bool:
    """Whether ``text`` can only be Kafka brokers: ``host:port``, a comma list of hosts, or
    a list of them as Python or JSON writes one (``['a:1', 'b:2']``: what a list becomes
    in a Spark option's string)."""
    text = text.strip()
    listed = text.startswith("[") and text.endswith("]")
    if not listed and "," not in text:
        return bool(_BROKER.fullmatch(text))
    items = (text[1:-1] if listed else text).split(",")
    return all(_HOST_ONLY.fullmatch(item.strip().strip("'\"")) for item in items)


def root_address(option: str, value: Any) -> str:
    """The root that ``value``, given as option ``option``, names: a path or URL as a string.

    A one-item list is its item (kafka-python takes a list of servers); a
    list of several, or a value that can only be a broker address, raises
    InvalidConfigError saying what a txlog root is.
    """
    given = value
    if isinstance(value, (list, tuple)):
        if len(value) > 1:
            raise InvalidConfigError(f"{option}={given!r} lists several servers, but txlog "
                                     f"has no brokers: {ROOT_IS}, one per client")
        value = value[0] if value else None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise InvalidConfigError(f"{option} must be the log's root, not {given!r}: {ROOT_IS}")
    if is_broker_address(value):
        what = "a Kafka broker address" if _BROKER.fullmatch(value.strip()) else \
            "a list of Kafka brokers"
        raise InvalidConfigError(
            f"{option}={given!r} looks like {what}, but txlog has no brokers: {ROOT_IS}; "
            "a directory named like host:port is reached as ./<name>")
    return value.strip()
