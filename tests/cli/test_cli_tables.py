"""``txlog tables sync`` and ``txlog tables describe``, in-process through ``main``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from txlog import Log
from txlog.cli import main

from conftest import python_env

pytest.importorskip("pyiceberg", reason="needs the tables extra: pip install -e '.[tables]'")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_sync_then_describe_names_the_files_other_engines_read(tmp_path, capsys):
    path = str(tmp_path / "log")
    log = Log(path)
    log.create_topic("t", 2)
    producer = log.producer()
    sent = [producer.send("t", b"v%d" % i, partition=i % 2).get() for i in range(5)]
    producer.close()
    code, out, _ = run(capsys, "--root", path, "tables", "sync", "t", "--json")
    synced = json.loads(out)
    assert code == 0 and synced["records"] == len(sent)
    assert synced["offsets"] == {str(p): sum(m.partition == p for m in sent) for p in (0, 1)}
    code, out, _ = run(capsys, "--root", path, "tables", "describe", "t", "--json")
    described = json.loads(out)
    assert code == 0 and described["metadata"] == synced["metadata"]
    assert described["files"] == [f"{path}/{f}" for f in synced["files"]]
    assert described["records"] == len(sent) and described["offsets"] == synced["offsets"]
    code, out, _ = run(capsys, "--root", path, "tables", "describe", "t")
    assert out.splitlines()[0] == f"metadata {synced['metadata']}"
    assert out.splitlines()[2:] == described["files"]
    code, out, _ = run(capsys, "--root", path, "tables", "sync", "t")
    assert code == 0 and out.splitlines()[-1].startswith("nothing new")


def test_describe_without_a_table_says_how_to_make_one(tmp_path, capsys):
    path = str(tmp_path / "log")
    Log(path).create_topic("t", 1)
    code, _, err = run(capsys, "--root", path, "tables", "describe", "t")
    assert code == 1 and "txlog tables sync t" in err


def test_txlog_and_its_command_import_without_pyiceberg():
    probe = ("import sys, txlog, txlog.cli.main; "
             "print([m for m in sys.modules if m.split('.')[0] == 'pyiceberg'])")
    out = subprocess.run([sys.executable, "-c", probe], env=python_env(), check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_compact_purge_and_expire_keep_the_table_in_shape(tmp_path, capsys):
    path = str(tmp_path / "log")
    log = Log(path)
    log.create_topic("t", 1)
    producer = log.producer()
    for i in range(3):
        producer.send("t", b"v%d" % i, partition=0).get()
        run(capsys, "--root", path, "tables", "sync", "t")
    producer.close()
    code, out, _ = run(capsys, "--root", path, "tables", "compact", "t", "--min-files", "2",
                       "--json")
    compacted = json.loads(out)
    assert code == 0 and len(compacted["removed"]) == 3 and len(compacted["added"]) == 1
    assert compacted["records"] == compacted["kept"] == 3
    code, out, _ = run(capsys, "--root", path, "tables", "purge", "t", "--offset", "2")
    assert code == 0 and "3 records read, 1 kept" in out
    code, _, err = run(capsys, "--root", path, "tables", "purge", "t", "--offset", "4")
    assert code == 1 and "only below 3" in err
    code, _, err = run(capsys, "--root", path, "tables", "expire", "t", "--age-s", "60")
    assert code == 1 and "commit window" in err
    code, out, _ = run(capsys, "--root", path, "tables", "expire", "t")
    assert code == 0 and out.startswith("0 snapshots expired")
    code, out, _ = run(capsys, "--root", path, "tables", "describe", "t", "--json")
    assert json.loads(out)["records"] == 1
