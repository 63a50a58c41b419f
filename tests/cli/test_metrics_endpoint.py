"""``txlog metrics``: the root's figures as Prometheus text, served or printed once.

The text is parsed with prometheus_client's parser (an independent reader of
the format), and every figure is checked against what the test wrote: the
offsets produced and committed, a transaction left open by its producer.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conftest import python_env
from helpers_core import manual_clock

from txlog import Log
from txlog.admin.figures import Figures, GroupFigures, TransactionFigures, gather
from txlog.cli.main import main
from txlog.cli.metrics import CONTENT_TYPE, CachedExposition, render, serve

prometheus_parser = pytest.importorskip("prometheus_client.parser",
                                        reason="needs the test extra: pip install -e '.[test]'")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample as (name, sorted labels) -> value; each family must be a gauge."""
    samples: Samples = {}
    for family in prometheus_parser.text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def partition_sample(samples: Samples, name: str, topic: str, partition: int) -> float:
    return samples[(name, (("partition", str(partition)), ("topic", topic)))]


def group_sample(samples: Samples, name: str, group: str, topic: str, partition: int) -> float:
    return samples[(name, (("group", group), ("partition", str(partition)), ("topic", topic)))]


@contextmanager
def endpoint(log: Log, cache_seconds: float = 0.0) -> Iterator[str]:
    """An in-process server on a free port; yields its /metrics URL."""
    server = serve(CachedExposition(log.services, cache_seconds), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.headers["Content-Type"] == CONTENT_TYPE
        return answer.read().decode()


def once(root: str, capsys) -> Samples:
    capsys.readouterr()
    assert main(["metrics", "--once", "--root", root]) == 0
    return parse(capsys.readouterr().out)


def test_a_lagging_group_shows_its_lag_and_each_partition_its_bounds(tmp_path) -> None:
    log = Log(tmp_path / "root", fsync=False)
    log.create_topic("orders", 2)
    with log.producer() as producer:
        for i in range(7):
            producer.send("orders", f"o{i}".encode(), partition=0)
        for i in range(3):
            producer.send("orders", f"p{i}".encode(), partition=1)
    log.commit_offsets("billing", {("orders", 0): 2, ("orders", 1): 3})
    log.delete_records({("orders", 0): 1})
    with endpoint(log) as url:
        samples = parse(scrape(url))
    assert group_sample(samples, "txlog_group_lag", "billing", "orders", 0) == 5
    assert group_sample(samples, "txlog_group_lag", "billing", "orders", 1) == 0
    assert group_sample(samples, "txlog_group_committed_offset", "billing", "orders", 0) == 2
    for p, end in ((0, 7), (1, 3)):
        assert partition_sample(samples, "txlog_partition_log_end_offset", "orders", p) == end
        assert partition_sample(samples, "txlog_partition_last_stable_offset", "orders", p) \
            == end
        stored = log.partition("orders", p).stored()
        assert partition_sample(samples, "txlog_partition_size_bytes", "orders", p) \
            == stored[1] + stored[3] > 0
    assert partition_sample(samples, "txlog_partition_log_start_offset", "orders", 0) == 1
    assert partition_sample(samples, "txlog_partition_log_start_offset", "orders", 1) == 0
    assert samples[("txlog_transactions_open", ())] == 0


def test_an_abandoned_transaction_shows_as_hanging_once_past_its_timeout(
        tmp_path, monkeypatch, capsys) -> None:
    clock = manual_clock(monkeypatch)
    root = str(tmp_path / "root")
    log = Log(root, fsync=False)
    log.create_topic("t", 2)
    producer = log.producer(transactional_id="abandoned", transaction_timeout_ms=5_000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", b"never", partition=0)
    producer.send("t", b"decided", partition=1)
    producer.flush()  # then left open, as by a producer killed mid-transaction
    clock.now_ms += 2_000
    samples = once(root, capsys)
    assert samples[("txlog_transactions_open", ())] == 1  # one transaction, two partitions
    assert samples[("txlog_transactions_hanging", ())] == 0
    assert samples[("txlog_transactions_oldest_open_age_seconds", ())] == 2.0
    assert partition_sample(samples, "txlog_partition_last_stable_offset", "t", 0) == 0
    clock.now_ms += 3_001
    samples = once(root, capsys)
    assert samples[("txlog_transactions_hanging", ())] == 1
    assert samples[("txlog_transactions_oldest_open_age_seconds", ())] == 5.001
    log.coordinator.abort_open("abandoned", "ended by the test")
    samples = once(root, capsys)
    assert samples[("txlog_transactions_open", ())] == 0
    assert samples[("txlog_transactions_oldest_open_age_seconds", ())] == 0
    assert partition_sample(samples, "txlog_partition_last_stable_offset", "t", 0) == 2


KILLED_WRITER = """
import sys
from txlog import Log
log = Log(sys.argv[1])
producer = log.producer(transactional_id="killed", transaction_timeout_ms=5_000)
producer.init_transactions()
producer.begin_transaction()
producer.send("t", b"never committed", partition=0)
producer.flush()
print("sent", log.services.coordinator.metadata("killed").txn_start_ms, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_sigkilled_transaction_shows_as_hanging_once_past_its_timeout(
        tmp_path, monkeypatch, capsys) -> None:
    root = str(tmp_path / "root")
    Log(root).create_topic("t", 1)
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, root], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=python_env())
    assert child.stdout is not None
    started_ms = int(child.stdout.readline().split()[1])
    child.kill()  # SIGKILL: the transaction is left open, as by a crashed producer
    child.wait(30)
    clock = manual_clock(monkeypatch, started_ms + 4_000)
    samples = once(root, capsys)
    assert samples[("txlog_transactions_open", ())] == 1
    assert samples[("txlog_transactions_hanging", ())] == 0
    assert partition_sample(samples, "txlog_partition_last_stable_offset", "t", 0) == 0
    clock.now_ms += 1_001  # past its timeout
    samples = once(root, capsys)
    assert samples[("txlog_transactions_hanging", ())] == 1
    assert samples[("txlog_transactions_oldest_open_age_seconds", ())] == 5.001


def test_a_topic_deleted_during_a_scrape_is_left_out(tmp_path, monkeypatch) -> None:
    log = Log(tmp_path / "root", fsync=False)
    for topic in ("gone", "kept"):
        log.create_topic(topic, 1)
    root = Log(tmp_path / "root", fsync=False).services
    parse(render(gather(root)))  # its partitions are cached: they learn of the deletion late
    listed = root.topics()
    log.delete_topic("gone")
    monkeypatch.setattr(root, "topics", lambda: listed)  # listed just before the deletion
    samples = parse(render(gather(root)))
    assert partition_sample(samples, "txlog_partition_log_end_offset", "kept", 0) == 0
    assert not [key for key in samples if ("topic", "gone") in key[1]]


def test_label_values_are_escaped() -> None:
    """Names are restricted to letters, digits, '.', '_' and '-' today; the text stays
    valid whatever a label holds."""
    group = 'a "quoted" \\ group\nline'
    figures = Figures([], [GroupFigures(group, "t", 0, 4, 1)], TransactionFigures(0, 0, 0))
    samples = parse(render(figures))
    assert group_sample(samples, "txlog_group_committed_offset", group, "t", 0) == 4


def test_a_scrape_costs_at_most_three_requests_per_partition_and_two_per_group_on_s3(
        s3_server, s3_root) -> None:
    """After the first scrape (which loads each partition's state), a scrape reads each
    partition's state (two small reads when nothing was appended) and lists its segments
    (its size and log start), and reads each group's newest version (a list and a read);
    besides, a listing of the topics and of the groups, and three reads per topic (it
    exists, its partition count, its config). A scrape inside the cache interval reads
    nothing."""
    log = Log(s3_root, storage_options=s3_server.storage_options)
    topics = {"a": 2, "b": 3}
    for topic, count in topics.items():
        log.create_topic(topic, count)
        with log.producer() as producer:
            for p in range(count):
                producer.send(topic, b"x", partition=p)
    groups = {"g1": {("a", 0): 1}, "g2": {("a", 1): 0, ("b", 2): 1}}
    for group, offsets in groups.items():
        log.commit_offsets(group, offsets)
    fresh = Log(s3_root, storage_options=s3_server.storage_options)
    exposition = CachedExposition(fresh.services, cache_seconds=0)
    exposition.text()  # the first one loads every partition's state
    s3_server.reset_counts()
    samples = parse(exposition.text())
    requests = sum(s3_server.counts.values())
    partitions, per_topic = sum(topics.values()), 3 * len(topics) + 2
    assert requests <= 3 * partitions + 2 * len(groups) + per_topic, s3_server.counts
    assert group_sample(samples, "txlog_group_lag", "g2", "b", 2) == 0
    cached = CachedExposition(fresh.services, cache_seconds=3600)
    cached.text()
    s3_server.reset_counts()
    assert cached.text() and s3_server.counts == {}


def test_the_command_serves_on_its_port_and_refuses_a_missing_mode(tmp_path) -> None:
    log = Log(tmp_path / "root", fsync=False)
    log.create_topic("t", 1)
    command = [sys.executable, "-m", "txlog.cli", "metrics", "--root", str(tmp_path / "root")]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 2 and "one of the arguments --port --once" in refused.stderr
    with subprocess.Popen([*command, "--port", "0"], stdout=subprocess.PIPE, text=True) as served:
        try:
            line = served.stdout.readline()
            assert line.startswith("serving http://127.0.0.1:"), line
            samples = parse(scrape(line.split()[1]))
            assert partition_sample(samples, "txlog_partition_log_end_offset", "t", 0) == 0
            with pytest.raises(urllib.error.HTTPError, match="404"):
                scrape(line.split()[1].replace("/metrics", "/other"))
        finally:
            served.terminate()
