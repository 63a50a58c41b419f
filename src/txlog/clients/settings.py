"""Settings declared as a table, and the one way given values are checked against it.

A client, the Spark options and kafka-python's configuration keys each declare
their settings as rows: the name, the kind (which type, range or choices a
value must have, and the message when it does not), the default.  ``resolve``
reads what a caller gave through those rows in the order declared, so the
first bad value is the one reported, and nothing about a setting is written
anywhere but in its row.  A kind is a function of the setting's name and the
value given, returning the value to use: the kinds here take Python values
(keyword arguments); the Spark options declare kinds that parse strings.

Keyword-argument clients keep their defaults in their signatures, where
``help()`` shows them; a row's default fills in what a mapping of options
leaves out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import InvalidConfigError
from ..storage.names import validate_name

Kind = Callable[[str, Any], Any]


def any_value(name: str, value: Any) -> Any:
    """The kind of a setting that takes whatever is given."""
    return value


@dataclass(frozen=True)
class Setting:
    """One row of a table: a setting's name, its kind and its default."""

    name: str
    kind: Kind = any_value
    default: Any = None

    def read(self, value: Any) -> Any:
        """``value`` as this setting takes it; raises the kind's error, naming the setting."""
        return self.kind(self.name, value)


S = TypeVar("S", bound=Setting)


class Settings(Mapping[str, S]):
    """A table of settings, by name, in the order they are checked."""

    def __init__(self, *rows: S) -> None:
        self._rows = {row.name: row for row in rows}

    def __getitem__(self, name: str) -> S:
        return self._rows[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every setting's value: the one in ``given`` (keys outside the table are not
        looked at), read through its row, or else its default."""
        return {name: row.read(given[name]) if name in given else row.default
                for name, row in self._rows.items()}

    def check(self, **given: Any) -> None:
        """Raise the error of the first value in ``given`` that its row refuses."""
        self.resolve(given)


def at_least(low: int, message: str, *, types: tuple[type, ...] = (int,),
             allow_bool: bool = False) -> Kind:
    """A number of one of ``types``, ``low`` or more.  ``message`` is formatted with the
    setting's ``name`` and the ``value`` given.  ``allow_bool`` keeps the settings that
    have always counted True as 1 doing so."""
    def read(name: str, value: Any) -> Any:
        wrong_type = not isinstance(value, types) or (isinstance(value, bool) and not allow_bool)
        if wrong_type or value < low:
            raise InvalidConfigError(message.format(name=name, value=value))
        return value
    return read


def one_of(choices: tuple[Any, ...], message: str) -> Kind:
    """One of ``choices``; ``message`` is formatted with ``name`` and ``value``."""
    def read(name: str, value: Any) -> Any:
        if value not in choices:
            raise InvalidConfigError(message.format(name=name, value=value))
        return value
    return read


def name_of(kind: str) -> Kind:
    """A name that may become a path component (``kind`` says what it names, as
    ``validate_name`` reports it), or None."""
    def read(name: str, value: Any) -> Any:
        return None if value is None else validate_name(value, kind)
    return read
