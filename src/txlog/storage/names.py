"""Validation of names that come from users and become storage paths.

Kafka's topic rule (ASCII letters, digits, '.', '_', '-'; 1 to 249 characters;
not '.' or '..') is applied to topics, transactional ids, group ids and
decision ids, so no user-supplied name can escape the log root.
"""

from __future__ import annotations

import re

from ..errors import InvalidNameError
from .paths import TMP_PREFIX

_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
MAX_NAME_LENGTH = 249


def validate_name(name: object, kind: str = "topic") -> str:
    """Return ``name`` if legal, else raise InvalidNameError naming the problem."""
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidNameError(f"{kind} name is empty")
    if name in (".", ".."):
        raise InvalidNameError(f"{kind} name {name!r} is not allowed")
    if name.startswith(TMP_PREFIX):
        raise InvalidNameError(
            f"{kind} name {name!r} starts with {TMP_PREFIX!r}, which is reserved for the "
            "temporary files of in-flight writes")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"{kind} name {name[:20]!r}... is {len(name)} characters; at most {MAX_NAME_LENGTH} allowed")
    if not _LEGAL.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL.fullmatch(c)})
        raise InvalidNameError(
            f"{kind} name {name!r} contains illegal characters {''.join(bad)!r}; "
            "only ASCII letters, digits, '.', '_' and '-' are allowed")
    return name
