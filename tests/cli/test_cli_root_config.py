"""``txlog root-config``: the root's topic auto-creation settings from a shell, and ``txlog
produce`` creating a missing topic as kafka-console-producer's broker would."""

from __future__ import annotations

import io
import json
import sys

from txlog import Log
from txlog.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def produce(capsys, monkeypatch, root: str, topic: str, data: bytes) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    return run(capsys, "--root", root, "produce", topic)


def test_describe_alter_and_produce(tmp_path, capsys, monkeypatch) -> None:
    root = str(tmp_path / "log")
    Log(root)
    assert run(capsys, "--root", root, "root-config", "describe") == (
        0, "auto.create.topics.enable=true (default)\nnum.partitions=1 (default)\n", "")
    code, out, _ = run(capsys, "--root", root, "root-config", "alter", "--config",
                       "num.partitions=3")
    assert code == 0 and out == "auto.create.topics.enable=true (default)\nnum.partitions=3\n"
    assert produce(capsys, monkeypatch, root, "new", b"a\nb\n")[0] == 0
    assert Log(root).describe_topic("new").partitions == 3

    code, out, _ = run(capsys, "--root", root, "root-config", "alter", "--config",
                       "auto.create.topics.enable=false", "--delete-config", "num.partitions")
    assert (code, out) == (0, "auto.create.topics.enable=false\nnum.partitions=1 (default)\n")
    code, _, err = produce(capsys, monkeypatch, root, "other", b"a\n")
    assert code == 1 and err == (
        f"txlog: error: topic 'other' does not exist in {Log(root).root} and "
        "auto.create.topics.enable is false on this root; create the topic first "
        "(txlog topics create)\n")
    code, out, _ = run(capsys, "--root", root, "root-config", "describe", "--json")
    assert json.loads(out) == {"config": {"auto.create.topics.enable": False,
                                          "num.partitions": 1},
                               "default_config_keys": ["num.partitions"]}
    assert Log(root).topics() == ["new"]


def test_bad_alterations_are_one_line_errors(tmp_path, capsys) -> None:
    root = str(tmp_path / "log")
    Log(root)
    for argv, message in (([], "give --config or --delete-config"),
                          (["--config", "num.partitions=many"],
                           "root config num.partitions must be an integer from 1 to 10000, "
                           "not 'many'"),
                          (["--config", "auto.create.topics=false"],
                           "unknown root config 'auto.create.topics' (known: "
                           "auto.create.topics.enable, num.partitions)")):
        code, out, err = run(capsys, "--root", root, "root-config", "alter", *argv)
        assert (code, out, err) == (1, "", f"txlog: error: {message}\n")
