"""Kill a streaming query's driver with SIGKILL, again and again, and check exactly once.

A generator process writes readings transactionally (about one transaction
in five aborted) into a source topic while ``spark-submit`` runs the example
streaming pipeline (src/txlog/examples/stream_pipeline.py, checkpointed).
The harness kills the whole spark-submit process group at random moments,
half of them right after the sink's log grew (the batch's records are
written, its commit may or may not have happened: the most dangerous
moment), and starts it again each time.  At the end a last run drains the
input and the sink, read with read_committed, must equal the transform of
the committed source records exactly, per partition and in order.

    python tests/harness/stream_kill_harness.py --kills 30 --records 200000

With ``--delivery at_least_once`` the sink has no transactions and the same
kills duplicate records: the check then fails, which shows it can.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # conftest's folder
sys.path.insert(0, str(TESTS))

from conftest import SRC, python_env, spark_submit_args  # noqa: E402

sys.path.insert(0, str(SRC))

from txlog import Log  # noqa: E402
from txlog.examples import stream_pipeline as pipeline  # noqa: E402

PIPELINE = Path(pipeline.__file__)


def sink_end(root: str) -> int:
    log = Log(root)
    return sum(log.end_offset(pipeline.SINK, p) for p in range(pipeline.PARTITIONS))


def start_query(root: str, delivery: str, log_file, checkpoint: list[str]) -> subprocess.Popen:
    args = spark_submit_args(PIPELINE, root, "--forever", "--trigger-ms", "200",
                             "--max-offsets-per-trigger", "1000", "--delivery", delivery,
                             *checkpoint)
    return subprocess.Popen([sys.executable, *args], env=python_env(), stdout=log_file,
                            stderr=subprocess.STDOUT, start_new_session=True)


def kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the driver JVM and every Python process under it
    proc.wait(60)


def wait_for_kill_moment(proc: subprocess.Popen, root: str, rng: random.Random,
                         on_growth: bool, max_wait_s: float) -> str:
    """Sleep until the chosen moment: a random delay, or the sink's log growing."""
    start, before = time.monotonic(), sink_end(root)
    delay = rng.uniform(2.0, 10.0)
    while time.monotonic() - start < max_wait_s:
        if proc.poll() is not None:
            raise AssertionError(f"the query exited by itself (code {proc.returncode})")
        if on_growth and sink_end(root) > before:
            return "after a sink write"
        if not on_growth and time.monotonic() - start >= delay:
            return f"after {delay:.1f} s"
        time.sleep(0.05)
    return "at the wait limit"


def run(root: str, kills: int, records: int, delivery: str, seed: int,
        stop_at_first_duplicate: bool = False, log_path: str | None = None,
        every_kill_after_a_write: bool = False, checkpoint: str | None = None) -> dict:
    """Kill the query ``kills`` times, alternately at a random moment and right after
    the sink grew (every time after a write with ``every_kill_after_a_write``: the
    moment at which an at-least-once sink duplicates, whatever the machine's speed).

    ``checkpoint`` is the query's checkpoint directory, needed when ``root`` is an
    object-store URL (Spark keeps its checkpoint on a local or Hadoop file system).
    """
    checkpoint_args = ["--checkpoint", checkpoint] if checkpoint else []
    rng = random.Random(seed)
    log = Log(root)
    pipeline.setup(log)
    # Spread the input over about the time the kills take (~8 s each), so that
    # most kills meet a query with work in flight and open transactions upstream.
    pace = max(kills * 8.0 / max(records / 100, 1), 0.01)
    generator = subprocess.Popen(
        [sys.executable, "-c", "import sys; from txlog.examples.stream_pipeline import "
         "generate; generate(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), "
         "float(sys.argv[4]))", root, str(records), str(seed), str(pace)], env=python_env())
    out = open(log_path or os.devnull, "ab")
    moments = []
    try:
        for i in range(kills):
            proc = start_query(root, delivery, out, checkpoint_args)
            try:
                moments.append(wait_for_kill_moment(proc, root, rng,
                                                    every_kill_after_a_write or i % 2 == 0,
                                                    60))
            finally:
                kill(proc)
            if stop_at_first_duplicate and pipeline.check(root)["duplicated"]:
                break
        generator.wait(600)
        assert generator.returncode == 0, "the generator failed"
        final = subprocess.run(
            [sys.executable, *spark_submit_args(PIPELINE, root, "--generate", "0",
                                                "--delivery", delivery, *checkpoint_args)],
            env=python_env(), stdout=out, stderr=subprocess.STDOUT, timeout=600)
    finally:
        if generator.poll() is None:
            generator.kill()
        out.close()
    report = pipeline.check(root)
    report["kills"] = len(moments)
    report["final run exit code"] = final.returncode
    report["kill moments"] = moments
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--delivery", choices=["exactly_once", "at_least_once"],
                   default="exactly_once")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--root", help="log directory (default: a new temporary one)")
    args = p.parse_args(argv)
    root = args.root or os.path.join(tempfile.mkdtemp(prefix="txlog-kills-"), "log")
    started = time.monotonic()
    report = run(root, args.kills, args.records, args.delivery, args.seed,
                 log_path=os.path.join(os.path.dirname(root), "spark-output.log"))
    report["seconds"] = round(time.monotonic() - started)
    report["seed"] = args.seed
    for key, value in report.items():
        print(f"{key}: {value}")
    ok = pipeline.exactly_once(report)
    print("exactly once: OK" if ok else "exactly once: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
