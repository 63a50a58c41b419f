"""The root's own settings, as a broker's: whether a topic is created on first use, and how.

Kafka's broker creates a topic the first time a client asks for it
(``auto.create.topics.enable``, on by default) with ``num.partitions``
partitions.  Here there is no broker, so the two settings live with the root, in
a version chain (``config/<version>``, docs/format.md 1.5) that every process
reads when it meets a topic that does not exist.  A root without the chain (any
root made before it existed) has Kafka's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidConfigError
from .topics import MAX_PARTITIONS

AUTO_CREATE = "auto.create.topics.enable"
NUM_PARTITIONS = "num.partitions"
ROOT_DEFAULTS: dict[str, Any] = {AUTO_CREATE: True, NUM_PARTITIONS: 1}


def _boolean(key: str, value: Any) -> bool:
    """A bool, or its spelling as Kafka's config files and the CLI give it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidConfigError(f"root config {key} must be true or false, not {value!r}")


def _partitions(key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or \
            not 1 <= value <= MAX_PARTITIONS:
        raise InvalidConfigError(
            f"root config {key} must be an integer from 1 to {MAX_PARTITIONS}, not {value!r}")
    return value


_RULES = {AUTO_CREATE: _boolean, NUM_PARTITIONS: _partitions}


def check_root_alteration(set: dict[str, Any], delete: list[str] | tuple[str, ...]
                          ) -> dict[str, Any]:
    """``set``'s values as stored (checked and normalised); every key must be known."""
    for key in [*set, *delete]:
        if key not in _RULES:
            raise InvalidConfigError(
                f"unknown root config {key!r} (known: {', '.join(_RULES)})")
    return {key: _RULES[key](key, value) for key, value in set.items()}


@dataclass(frozen=True)
class RootConfig:
    """A version of the root's config chain: the settings the root sets (others default)."""

    config: dict[str, Any]

    @classmethod
    def current(cls, value: dict | None) -> RootConfig:
        """The config as the chain's newest version says; an empty chain sets nothing."""
        return cls({} if value is None else dict(value["config"]))

    def setting(self, key: str) -> Any:
        """A setting's value, Kafka's default where the root sets none."""
        return self.config.get(key, ROOT_DEFAULTS[key])

    @property
    def auto_create(self) -> bool:
        return bool(self.setting(AUTO_CREATE))

    @property
    def num_partitions(self) -> int:
        return int(self.setting(NUM_PARTITIONS))

    def altered(self, set: dict[str, Any], delete: list[str] | tuple[str, ...]) -> RootConfig:
        """The next version: ``set`` applied, ``delete``'s keys back to Kafka's defaults."""
        return RootConfig({k: v for k, v in {**self.config, **set}.items() if k not in delete})

    def encode(self) -> dict[str, Any]:
        return {"config": self.config}
