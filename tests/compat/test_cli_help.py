"""The ``txlog`` CLI's help, command by command, is what it was (issue 31: the CLI stays
exactly as it is while the code is restructured).

Each command's ``--help`` is run through the CLI's ``main`` in a fresh process
(80 columns, no ``TXLOG_ROOT``) and compared byte for byte with the text recorded in fixtures/cli_help/ by
make_fixtures.py; the list of commands is compared too, so a command that appears or
disappears fails here rather than going unnoticed.
"""

from __future__ import annotations

import json

import pytest

from make_fixtures import (CLI_COMMANDS, CLI_HELP_DIR, all_cli_helps, cli_commands,
                           help_fixture_name)

RECORDED = json.loads(CLI_COMMANDS.read_text())


def test_the_commands_are_the_recorded_ones() -> None:
    assert [" ".join(path) for path in cli_commands()] == RECORDED
    recorded_files = sorted(p.name for p in CLI_HELP_DIR.glob("*.txt"))
    assert len(recorded_files) == len(RECORDED)


@pytest.fixture(scope="module")
def helps() -> dict[str, bytes]:
    return all_cli_helps([command.split() for command in RECORDED])


@pytest.mark.parametrize("command", RECORDED, ids=lambda c: c or "txlog")
def test_help_is_unchanged(command: str, helps: dict[str, bytes]) -> None:
    name = help_fixture_name(command.split())
    assert helps[name] == (CLI_HELP_DIR / name).read_bytes(), f"txlog {command} --help changed"
