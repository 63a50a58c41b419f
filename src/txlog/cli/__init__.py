"""The ``txlog`` command; ``main`` is the console script's entry point (pyproject.toml)."""

from .main import main

__all__ = ["main"]
