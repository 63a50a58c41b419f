"""``--producer-option key=value`` for the benchmarks: the same parsing in each, so that
one command line means the same Producer in every benchmark that takes it."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Iterable
from typing import Any

from txlog import Producer


def option_value(raw: str) -> Any:
    """A command-line value as the Python value Producer expects."""
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def producer_options(pairs: list[str], parser: argparse.ArgumentParser,
                     base: dict[str, Any] | None = None,
                     reserved: Iterable[str] = ("log",)) -> dict[str, Any]:
    """``key=value`` pairs (dots read as underscores) as Producer keyword arguments over
    ``base``, each checked against Producer's signature; ``reserved`` names are the
    benchmark's own to set."""
    config = dict(base or {})
    reserved = set(reserved)
    allowed = [k for k in inspect.signature(Producer).parameters if k not in reserved]
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace(".", "_")
        if not sep or not key:
            parser.error(f"--producer-option takes key=value, got {pair!r}")
        if key not in allowed:
            parser.error(f"--producer-option {key!r}: Producer takes none of that name here "
                         f"(it takes {', '.join(allowed)})")
        config[key] = option_value(raw)
    return config
