"""Runs the Jepsen-style transaction test (tests/harness/jepsen_txn.py) and tests its checker.

The run itself is a separate program, started exactly as a person would start
it, so that writers, readers and the supervisor are real processes and the
kills are real SIGKILLs.  The checker is then shown histories with one known
anomaly injected each, to prove that every check it claims can actually fail.
The run is repeated, smaller, on S3 (moto's server); memory:// cannot hold a
log shared by processes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import jepsen_txn
from conftest import HARNESS_DIR

SCRIPT = HARNESS_DIR / "jepsen_txn.py"
SEED = 1
SCALE = 5  # ~25-35 s on two cores; raise --scale by hand for longer runs
# On S3 (moto's server in this process) every storage call is an HTTP request of a few
# milliseconds, so the run is smaller (~25 s): the least scale, writers' last
# incarnations commit fewer transactions, idle readers poll less often, and the
# writers' deadline allows for a loaded machine.
S3_ARGS = ["--finish-txns", "4", "--reader-idle", "0.05", "--writers-deadline", "120"]
S3_SCALE = 1
# A run that committed fewer than this checked too little to count.
MIN_COMMITTED = {"file": 21, "s3": 8}


def _run(root: Path, scale: int, extra: list[str], env: dict[str, str] | None = None
         ) -> tuple[Path, str, int]:
    # Its own process group, so that nothing outlives a run that overran.
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--scale", str(scale), "--root",
                             str(root), "--seed", str(SEED), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=env)
    try:
        output, _ = proc.communicate(timeout=300)  # its own deadlines end it far sooner
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the Jepsen run overran:\n{output}")
    return root, output, proc.returncode


@pytest.fixture(scope="module")
def jepsen_run(tmp_path_factory) -> tuple[Path, str, int]:
    """The run on a local directory, which the checker tests below also replay."""
    return _run(tmp_path_factory.mktemp("jepsen"), SCALE, [])


@pytest.fixture(params=[
    "file",
    pytest.param("memory", marks=pytest.mark.skip(
        reason="memory:// is a dictionary inside one process, and this run's writers and "
               "readers are separate processes that are SIGKILLed (threads cannot be)")),
    "s3"])
def backend_run(request, tmp_path) -> tuple[Path, str, int]:
    if request.param == "file":
        return request.getfixturevalue("jepsen_run")
    server = request.getfixturevalue("s3_server")
    # The children reach the store through the AWS environment variables.
    return _run(tmp_path, S3_SCALE, ["--log", f"s3://{server.create_bucket()}/log", *S3_ARGS],
                env={**os.environ, **server.env})


def test_jepsen_transactions_hold_under_kills(backend_run, request) -> None:
    """No aborted, intermediate or lost read, no duplicate, one order -- with SIGKILLs."""
    root, output, code = backend_run
    backend = request.node.callspec.params["backend_run"]
    print(output)
    assert code == 0, output
    assert "RESULT: OK" in output
    stats = re.search(r"kills: (\d+) .*mid-transaction: (\d+)", output)
    assert stats and int(stats.group(2)) >= 2, output  # faults really hit open transactions
    assert "stall-decided" in output  # and one crash right at the commit point
    committed = int(re.search(r"transactions: (\d+) committed", output).group(1))
    assert committed >= MIN_COMMITTED[backend], output


# --- the checker must be able to fail ----------------------------------------------------------


def _history(root: Path, tmp_path: Path) -> tuple[Path, dict]:
    """A private copy of the run's histories, and the run's final read."""
    logs = tmp_path / "history"
    shutil.copytree(root / "jepsen-history", logs)
    return logs, jepsen_txn.final_read(str(root / "log"), fsync=False)


def _check(logs: Path, final: dict) -> list[str]:
    plan = jepsen_txn.make_plan(SEED, SCALE, logs)
    for incs in plan.incarnations.values():  # the plan's kill record is not replayed
        for inc in incs:
            inc.killed = inc.mode != "finish"
    return jepsen_txn.check(plan, logs, final).violations


def _transactions(logs: Path) -> dict[str, jepsen_txn.Txn]:
    return jepsen_txn.load_transactions(jepsen_txn.make_plan(SEED, SCALE, logs), logs)[0]


def test_checker_passes_the_real_history(jepsen_run, tmp_path) -> None:
    root, output, code = jepsen_run
    logs, final = _history(root, tmp_path)
    assert _check(logs, final) == []


def test_checker_finds_a_lost_write(jepsen_run, tmp_path) -> None:
    root, _, _ = jepsen_run
    logs, final = _history(root, tmp_path)
    committed = {v for t in _transactions(logs).values() if t.status == "committed"
                 for v in t.values}
    p, i = next((p, i) for p, rows in final.items() for i, row in enumerate(rows)
                if row[1] in committed)
    dropped = final[p].pop(i)
    violations = _check(logs, final)
    assert any(v.startswith("lost write") and dropped[1] in v for v in violations)


def test_checker_finds_an_aborted_read(jepsen_run, tmp_path) -> None:
    root, _, _ = jepsen_run
    logs, final = _history(root, tmp_path)
    txns = _transactions(logs)
    aborted = next(t for t in txns.values() if t.status == "aborted")
    value, p = next(iter(aborted.values.items()))
    final[p].append((final[p][-1][0] + 1 if final[p] else 0, value))
    assert any(v.startswith("aborted read (final)") for v in _check(logs, final))

    never = [t for t in txns.values() if t.status == "never_committed"]
    assert never, "the run killed no writer before its commit"
    logs2, final2 = _history(root, tmp_path / "2")
    value, p = next(iter(never[0].values.items()))
    reader = logs2 / "reader-1.txt"
    reader.write_text(reader.read_text() + f"R {p} 999999 {value}\n")
    assert any(v.startswith("aborted read:") and value in v for v in _check(logs2, final2))


def test_checker_finds_duplicates_and_phantoms(jepsen_run, tmp_path) -> None:
    root, _, _ = jepsen_run
    logs, final = _history(root, tmp_path)
    p = next(p for p, rows in final.items() if rows)
    final[p].append((final[p][-1][0] + 1, final[p][0][1]))
    final[p].append((final[p][-1][0] + 1, "nobody.0.0.0"))
    violations = _check(logs, final)
    assert any(v.startswith("duplicate") for v in violations)
    assert any("never written" in v for v in violations)


def test_checker_finds_an_intermediate_read(jepsen_run, tmp_path) -> None:
    """A reader that got only some of a transaction's records in a partition."""
    root, _, _ = jepsen_run
    logs, final = _history(root, tmp_path)
    txns = _transactions(logs)
    reader = logs / "reader-0.txt"
    lines = reader.read_text().split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("R "):
            continue
        _, p, _, value = line.split(" ", 3)
        t = next(t for t in txns.values() if value in t.values)
        if sum(q == int(p) for q in t.values.values()) > 1:
            del lines[i]
            break
    else:
        pytest.fail("no multi-record transaction partition was read")
    reader.write_text("\n".join(lines))
    violations = _check(logs, final)
    assert any(v.startswith("intermediate read") and t.name in v for v in violations)


def test_checker_finds_a_reordered_or_partial_unknown_transaction(jepsen_run, tmp_path) -> None:
    root, _, _ = jepsen_run
    logs, final = _history(root, tmp_path)
    reader = logs / "reader-1.txt"
    lines = reader.read_text().split("\n")
    idx = [i for i, line in enumerate(lines) if line.startswith("R 0 ")][:2]
    assert len(idx) == 2
    lines[idx[0]], lines[idx[1]] = lines[idx[1]], lines[idx[0]]
    reader.write_text("\n".join(lines))
    assert any("not a prefix of the final read" in v for v in _check(logs, final))

    # A commit that never returned must be all-or-nothing: turn a committed
    # multi-partition transaction into an unknown one, then hide one partition.
    logs2, final2 = _history(root, tmp_path / "2")
    txns = _transactions(logs2)
    for path in sorted(logs2.glob("writer-*.jsonl")):
        lines = path.read_text().split("\n")
        done = [i for i, line in enumerate(lines) if '"ev":"done"' in line and
                '"committed"' in line and
                len(set(txns[jepsen_txn.json.loads(line)["txn"]].values.values())) > 1]
        if done:
            t = txns[jepsen_txn.json.loads(lines[done[0]])["txn"]]
            del lines[done[0]]
            path.write_text("\n".join(lines))
            break
    else:
        pytest.fail("no committed multi-partition transaction in the run")
    assert _transactions(logs2)[t.name].status == "unknown"
    value, p = next(iter(t.values.items()))
    final2[p] = [row for row in final2[p] if row[1] != value]
    assert any(v.startswith("unknown-outcome transaction") for v in _check(logs2, final2))
