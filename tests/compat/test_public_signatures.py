"""The public API (txlog.__all__ and txlog.kafka.__all__) keeps its names, kinds and
signatures (issue 31: a pure restructuring).

For each name: its kind; for classes and functions ``str(inspect.signature(...))``, and
for a class every public member's kind and signature (names without a leading ``_``,
plus ``__init__``); for an exception its MRO (txlog's classes by name only: they may
move between modules, not change their ancestry); for a constant its repr.  Compared
with fixtures/public_signatures.json, made by make_fixtures.py from the code before the
restructuring.
"""

from __future__ import annotations

import json

import pytest

from make_fixtures import SIGNATURES, public_signatures

RECORDED = json.loads(SIGNATURES.read_text())
CURRENT = public_signatures()


def test_the_public_names_are_the_recorded_ones() -> None:
    assert sorted(CURRENT) == sorted(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_public_name_is_unchanged(name: str) -> None:
    assert CURRENT.get(name) == RECORDED[name]
