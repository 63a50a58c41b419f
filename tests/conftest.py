"""Shared fixtures: a fresh log per test, on disk or in memory."""

from __future__ import annotations

import uuid

import pytest

from txlog import Log


@pytest.fixture
def log(tmp_path) -> Log:
    """A log in a fresh directory (the real local backend, with fsync)."""
    return Log(tmp_path / "log")


@pytest.fixture
def memlog() -> Log:
    """A log on the in-memory backend, for protocol tests that need no disk."""
    return Log(f"memory://{uuid.uuid4().hex}")
