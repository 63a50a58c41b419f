"""``metrics()`` of txlog.kafka's clients: kafka-python's groups and names, with real figures.

Records of known sizes are sent and read, and each figure is checked
against what was sent, read and left unread (the LSO or log end minus the
position).  The metrics clock (``clock.monotonic_ms``) is held still while
the clients work and then moved by the test, so every rate is the count
divided by a window the test knows exactly, not by however long the run took.
"""

from __future__ import annotations

import time
import uuid

import pytest

from helpers_core import StillClock
from txlog import Log, Producer
from txlog.errors import ProducerFencedError
from txlog.kafka import KafkaConsumer, KafkaProducer, TopicPartition
from txlog.kafka import errors

pytest.importorskip("kafka", reason="kafka-python is the oracle: pip install -e '.[test]'")

TOPIC = "metered"
WINDOW = {"metrics_num_samples": 2, "metrics_sample_window_ms": 1000}
PRODUCER_NAMES = {"record-send-rate", "byte-rate", "request-latency-avg", "record-size-avg",
                  "batch-size-avg", "records-per-request-avg", "record-error-rate"}
FETCH_NAMES = {"records-consumed-rate", "bytes-consumed-rate", "fetch-latency-avg", "fetch-rate",
               "fetch-size-avg", "records-lag-max", "records-per-request-avg"}


@pytest.fixture
def still(monkeypatch: pytest.MonkeyPatch) -> StillClock:
    return StillClock.installed(monkeypatch)


@pytest.fixture
def root() -> str:
    url = f"memory://{uuid.uuid4().hex}"
    Log(url).create_topic(TOPIC, partitions=3)
    return url


def test_the_groups_and_names_exist_from_construction(root: str) -> None:
    with KafkaProducer(bootstrap_servers=root) as p:
        assert PRODUCER_NAMES <= set(p.metrics()["producer-metrics"])
    c = KafkaConsumer(bootstrap_servers=root)
    figures = c.metrics()
    assert FETCH_NAMES <= set(figures["consumer-fetch-manager-metrics"])
    assert {"commit-rate", "commit-latency-avg", "rebalance-total",
            "assigned-partitions"} <= set(figures["consumer-coordinator-metrics"])
    c.close()


def test_producer_figures_are_what_was_sent_over_the_window(root: str, still: StillClock) -> None:
    n, key, value = 600, b"k" * 10, b"v" * 90
    started = time.perf_counter()
    # kafka-python's None: uncompressed, so the payload bytes are at least the records'.
    with KafkaProducer(bootstrap_servers=root, compression_type=None, **WINDOW) as p:
        for i in range(n):
            p.send(TOPIC, value, key=key, partition=i % 3)
        p.flush()
        elapsed_ms = (time.perf_counter() - started) * 1000
        still.now += 250
        figures = p.metrics()["producer-metrics"]
        assert figures["record-send-total"] == n
        # everything in the first sample, 250 ms into it: n over 250 ms plus one full window
        assert figures["record-send-rate"] == pytest.approx(n / 1.25)
        assert figures["byte-rate"] == pytest.approx(figures["byte-total"] / 1.25)
        assert figures["record-size-max"] == figures["record-size-avg"] == len(key) + len(value)
        assert n * (len(key) + len(value)) <= figures["byte-total"] < n * 200
        requests = figures["request-total"]
        assert 1 <= requests <= n and figures["request-rate"] == pytest.approx(requests / 1.25)
        assert figures["records-per-request-avg"] == pytest.approx(n / requests)
        assert 0 < figures["request-latency-avg"] <= figures["request-latency-max"] <= elapsed_ms
        assert figures["record-error-rate"] == 0 and figures["requests-in-flight"] == 0
        assert figures["throttle-time-max"] == 0
        still.now += 1250  # 1.5 s since the first sample began: the rate spans 1.5 s
        assert p.metrics()["producer-metrics"]["record-send-rate"] == pytest.approx(n / 1.5)
        still.now += 500  # both windows past: the rates forget, the totals do not
        figures = p.metrics()["producer-metrics"]
        assert figures["record-send-rate"] == 0 and figures["record-send-total"] == n


def test_failed_records_count_as_errors(root: str, still: StillClock) -> None:
    log = Log(root)
    fenced = Producer(log, transactional_id="tx", **WINDOW)
    fenced.init_transactions()
    fenced.begin_transaction()
    for i in range(7):
        fenced.send(TOPIC, b"x", partition=0)
    Producer(log, transactional_id="tx").init_transactions()  # a newer instance fences it
    with pytest.raises(ProducerFencedError):
        fenced.flush()
    figures = fenced.metrics()["producer-metrics"]
    assert figures["record-error-total"] == 7
    assert figures["record-error-rate"] == pytest.approx(7 / 1.0)  # one window, just begun


def write(root: str, n: int, value: bytes, partition: int = 0) -> None:
    with Producer(Log(root)) as p:
        for _ in range(n):
            p.send(TOPIC, value, partition=partition)


def test_consumer_figures_are_what_was_read_and_what_is_left(root: str,
                                                             still: StillClock) -> None:
    n, value = 100, b"r" * 100
    write(root, n, value)
    tp = TopicPartition(TOPIC, 0)
    c = KafkaConsumer(bootstrap_servers=root, max_poll_records=30, **WINDOW)
    c.assign([tp])
    c.seek_to_beginning()
    assert len(c.poll()[tp]) == 30
    figures = c.metrics()["consumer-fetch-manager-metrics"]
    assert figures["records-consumed-total"] == 30 and figures["fetch-total"] == 1
    assert figures["records-lag-max"] == n - 30  # the log end minus the position
    read = 30
    while batch := c.poll():
        read += len(batch[tp])
    assert read == n
    still.now += 250
    figures = c.metrics()["consumer-fetch-manager-metrics"]
    fetches = figures["fetch-total"]
    assert figures["records-consumed-total"] == n
    assert figures["records-consumed-rate"] == pytest.approx(n / 1.25)
    assert figures["fetch-rate"] == pytest.approx(fetches / 1.25)
    assert figures["records-per-request-avg"] == pytest.approx(n / fetches)
    assert n * len(value) <= figures["bytes-consumed-total"] < n * (len(value) + 64)
    assert figures["fetch-size-avg"] == pytest.approx(figures["bytes-consumed-total"] / fetches)
    assert figures["bytes-consumed-rate"] == pytest.approx(figures["bytes-consumed-total"] / 1.25)
    assert figures["fetch-latency-max"] >= figures["fetch-latency-avg"] > 0
    assert figures["records-lag-max"] == n - 30  # the largest lag seen in the window
    c.close()


@pytest.mark.parametrize("isolation_level,lag", [("read_committed", 0),
                                                 ("read_uncommitted", 5)])
def test_lag_is_measured_to_the_lso_under_read_committed(root: str, isolation_level: str,
                                                         lag: int) -> None:
    write(root, 20, b"c")
    open_txn = Producer(Log(root), transactional_id="open")
    open_txn.init_transactions()
    open_txn.begin_transaction()
    for _ in range(5):
        open_txn.send(TOPIC, b"u", partition=0)
    open_txn.flush()  # written, not committed: the LSO stays at 20
    tp = TopicPartition(TOPIC, 0)
    c = KafkaConsumer(bootstrap_servers=root, isolation_level=isolation_level,
                      max_poll_records=20)
    c.assign([tp])
    c.seek_to_beginning()
    assert len(c.poll()[tp]) == 20
    assert c.metrics()["consumer-fetch-manager-metrics"]["records-lag-max"] == lag
    c.close()


def test_coordinator_figures_count_joins_commits_and_assigned_partitions(
        root: str, still: StillClock) -> None:
    write(root, 10, b"g", partition=1)
    c = KafkaConsumer(TOPIC, bootstrap_servers=root, group_id="dash", auto_offset_reset="earliest",
                      enable_auto_commit=False, **WINDOW)
    started = time.perf_counter()
    c.poll()
    poll_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    c.commit()
    commit_ms = (time.perf_counter() - started) * 1000
    figures = c.metrics()["consumer-coordinator-metrics"]
    assert figures["rebalance-total"] == 1 and figures["assigned-partitions"] == 3
    assert 0 < figures["rebalance-latency-avg"] == figures["join-time-avg"] <= poll_ms
    assert figures["commit-total"] == 1 and 0 < figures["commit-latency-avg"] <= commit_ms
    assert figures["commit-rate"] == pytest.approx(1 / 1.0)
    c.close()
    manual = KafkaConsumer(bootstrap_servers=root, group_id="manual", **WINDOW)
    manual.assign([TopicPartition(TOPIC, 1)])
    manual.commit({TopicPartition(TOPIC, 1): 4})  # no member: the plain commit counts too
    figures = manual.metrics()["consumer-coordinator-metrics"]
    assert figures["commit-total"] == 1 and figures["assigned-partitions"] == 1
    assert figures["rebalance-total"] == 0
    manual.close()


def test_metrics_keys_do_what_kafka_python_does_with_them(root: str) -> None:
    with KafkaProducer(bootstrap_servers=root, metrics_enabled=False) as p:
        assert p.metrics() is None
    c = KafkaConsumer(bootstrap_servers=root, metric_group_prefix="orders")
    assert set(c.metrics()) == {"orders-fetch-manager-metrics", "orders-coordinator-metrics"}
    raw = c.metrics(raw=True)
    assert all(metric.value() == c.metrics()[name.group][name.name]
               for name, metric in raw.items() if name.name.endswith("-total"))
    c.close()
    with pytest.raises(errors.KafkaConfigurationError, match="metric_reporters"):
        KafkaProducer(bootstrap_servers=root, metric_reporters=[object])
    with pytest.raises(errors.KafkaConfigurationError, match="metrics_num_samples.*0"):
        KafkaConsumer(bootstrap_servers=root, metrics_num_samples=0)
    with pytest.raises(errors.KafkaConfigurationError, match="metrics_sample_window_ms"):
        KafkaProducer(bootstrap_servers=root, metrics_sample_window_ms="30s")
    KafkaProducer(bootstrap_servers=root, metric_reporters=[]).close()  # kafka-python's default


def test_kafka_pythons_benchmark_reporters_print_our_figures(root: str, still: StillClock,
                                                             capsys: pytest.CaptureFixture) -> None:
    """The stats lines of kafka-python's own producer and consumer benchmarks, which
    read metrics() by name, print the records per second sent and read."""
    from kafka.benchmarks import consumer_performance, producer_performance

    with KafkaProducer(bootstrap_servers=root, **WINDOW) as p:
        for i in range(300):
            p.send(TOPIC, b"b" * 50, partition=i % 3)
        p.flush()
        still.now += 500
        producer_performance.StatsReporter(1, p).print_stats()
    c = KafkaConsumer(TOPIC, bootstrap_servers=root, auto_offset_reset="earliest", **WINDOW)
    while c.poll():
        pass
    consumer_performance.StatsReporter(1, c).print_stats()
    c.close()
    sent, read = capsys.readouterr().out.splitlines()
    assert sent.startswith(f"{300 / 1.5:.0f} records/sec") and "0ms max throttle" in sent
    assert read.startswith(f"{300 / 1.0:.0f} records/sec")  # read at once: one window
