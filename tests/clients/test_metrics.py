"""The sensor math of clients/metrics.py: windows, samples, rates, and the registry.

Hand-worked windows first, then kafka-python's own stats as the oracle: the
same values at the same times go into both, and every figure must agree,
over sequences that cross, skip and outlive sample windows.
"""

from __future__ import annotations

import math
import random

import pytest

from helpers_core import StillClock
from txlog.clients.metrics import (Avg, ConsumerSensors, Count, Max, MetricConfig, MetricName,
                                   Metrics, ProducerSensors, Rate, SampledTotal, Total)

kafka = pytest.importorskip("kafka", reason="kafka-python is the oracle: pip install -e '.[test]'")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> StillClock:
    return StillClock.installed(monkeypatch)


def test_a_rate_counts_at_least_the_full_windows_but_the_current_one() -> None:
    config = MetricConfig(samples=3, window_ms=1000)
    rate = Rate()
    rate.record(config, 30, 0)
    rate.record(config, 30, 400)
    # 400 ms into the first window: divided by 400 ms plus the two other windows.
    assert rate.measure(config, 400) == pytest.approx(60 / 2.4)
    rate.record(config, 60, 1000)  # the second sample begins
    assert rate.measure(config, 2500) == pytest.approx(120 / 2.5)
    # Both samples older than 3 windows are emptied: nothing left to count.
    assert rate.measure(config, 3500) == pytest.approx(60 / 2.5)  # the first one went
    assert rate.measure(config, 4000) == 0.0


def test_samples_are_recycled_in_a_ring_of_metrics_num_samples() -> None:
    config = MetricConfig(samples=2, window_ms=100)
    total = SampledTotal()
    for t in (0, 100, 200, 300):
        total.record(config, 1, t)
    assert total.measure(config, 300) == 2.0  # samples begun at 200 and 300
    count = Count()
    for t, value in ((0, 50), (10, 50), (20, 50)):
        count.record(config, value, t)
    assert count.measure(config, 20) == 3.0


def test_avg_max_and_totals_with_and_without_values() -> None:
    config = MetricConfig()
    avg, biggest, total, events = Avg(), Metrics(config), Total(), Total(counting=True)
    assert avg.measure(config, 0) == 0.0
    sensor = biggest.sensor([("m", "g", "", Max)])
    assert biggest.values()["g"]["m"] == -math.inf  # kafka-python's empty max
    for v in (3, 9, 6):
        avg.record(config, v, 0)
        total.record(config, v, 0)
        events.record(config, v, 0)
    sensor.record(9)
    assert avg.measure(config, 0) == 6.0 and biggest.values()["g"]["m"] == 9.0
    # totals never forget, however old
    assert total.measure(config, 10**9) == 18.0 and events.measure(config, 10**9) == 3.0


@pytest.mark.parametrize("samples,window_ms", [(2, 30000), (1, 500), (3, 200), (5, 1000)])
def test_every_figure_agrees_with_kafka_pythons_stats(samples: int, window_ms: int,
                                                      fake: StillClock) -> None:
    from kafka.metrics import MetricConfig as KafkaMetricConfig
    from kafka.metrics import Metrics as KafkaMetrics
    from kafka.metrics.stats import Avg as KAvg
    from kafka.metrics.stats import Count as KCount
    from kafka.metrics.stats import Max as KMax
    from kafka.metrics.stats import Rate as KRate

    theirs = KafkaMetrics(default_config=KafkaMetricConfig(samples=samples,
                                                           time_window_ms=window_ms))
    their_sensor = theirs.sensor("s")
    for name, make in (("avg", KAvg), ("max", KMax), ("rate", KRate),
                       ("events", lambda: KRate(sampled_stat=KCount()))):
        their_sensor.add(theirs.metric_name(name, "g"), make())
    ours = Metrics(MetricConfig(samples, window_ms))
    our_sensor = ours.sensor([("avg", "g", "", Avg), ("max", "g", "", Max),
                              ("rate", "g", "", Rate), ("events", "g", "", lambda: Rate(Count()))])
    rng = random.Random(samples * 1000 + window_ms)
    start = fake.now
    for _ in range(400):
        # steps within a window, across several, and now and then past every window kept
        fake.now += rng.choice([0, 1, window_ms // 7, window_ms, window_ms * samples + 3])
        value = rng.randint(0, 10_000)
        their_sensor.record(value, time_ms=fake.now)
        our_sensor.record(value)
        for name in ("avg", "max", "rate", "events"):
            try:
                expected = theirs.metrics[theirs.metric_name(name, "g")].value(fake.now)
            except ZeroDivisionError:  # one sample, just begun: kafka-python divides by 0 ms
                assert samples == 1 and math.isfinite(ours.values()["g"][name])
                continue
            assert ours.values()["g"][name] == pytest.approx(expected), \
                (name, fake.now - start)


def test_values_are_grouped_as_kafka_pythons_metrics_and_raw_gives_metric_objects(
        fake: StillClock) -> None:
    metrics = Metrics(MetricConfig())
    sensor = metrics.sensor([("a-total", "one", "all of them", Total),
                             ("a-avg", "two", "", Avg)])
    assigned = [1, 2]
    metrics.gauge("assigned", "two", "", lambda: len(assigned))
    sensor.record(4)
    sensor.record(2)
    assigned.append(3)
    assert metrics.values() == {"one": {"a-total": 6.0}, "two": {"a-avg": 3.0, "assigned": 3.0}}
    raw = metrics.values(raw=True)
    assert raw[MetricName("a-total", "one")].value() == 6.0
    assert raw[MetricName("a-total", "one")].metric_name.description == "all of them"
    with pytest.raises(ValueError, match="one/a-total is defined twice"):
        metrics.sensor([("a-total", "one", "", Total)])


def test_the_clients_groups_hold_kafka_pythons_names_before_anything_is_recorded() -> None:
    producer = ProducerSensors(MetricConfig(), lambda: 0).metrics.values()
    assert set(producer) == {"producer-metrics"}
    assert {"record-send-rate", "byte-rate", "request-latency-avg", "record-size-avg",
            "batch-size-avg", "records-per-request-avg", "record-error-rate",
            "record-send-total", "request-rate", "outgoing-byte-rate"} <= \
        set(producer["producer-metrics"])
    consumer = ConsumerSensors(MetricConfig(), "consumer", lambda: 0).metrics.values()
    assert {"records-consumed-rate", "bytes-consumed-rate", "fetch-latency-avg", "fetch-rate",
            "fetch-size-avg", "records-lag-max", "records-per-request-avg"} <= \
        set(consumer["consumer-fetch-manager-metrics"])
    assert {"commit-rate", "commit-latency-avg", "rebalance-total", "rebalance-latency-avg",
            "join-rate", "join-time-avg", "assigned-partitions"} <= \
        set(consumer["consumer-coordinator-metrics"])


def test_a_producer_request_records_its_batches_not_its_records(fake: StillClock) -> None:
    sensors = ProducerSensors(MetricConfig(2, 1000), lambda: 1)
    sensors.request([(10, 1000, 90), (30, 2000, 70)], began_ms=fake.now, latency_ms=8.0)
    sensors.request([(20, 500, 25)], began_ms=fake.now, latency_ms=4.0)
    fake.now += 500
    figures = sensors.metrics.values()["producer-metrics"]
    assert figures["record-send-total"] == 60 and figures["records-per-request-avg"] == 30
    assert figures["record-send-rate"] == pytest.approx(60 / 1.5)
    assert figures["byte-total"] == 3500 and figures["request-size-max"] == 3000
    assert figures["batch-size-avg"] == pytest.approx(3500 / 3) and figures["batch-size-max"] == 2000
    assert figures["record-size-max"] == 90 and figures["record-size-avg"] == pytest.approx(185 / 3)
    assert figures["request-total"] == 2 and figures["request-rate"] == pytest.approx(2 / 1.5)
    assert figures["request-latency-avg"] == 6.0 and figures["request-latency-max"] == 8.0
    assert figures["requests-in-flight"] == 1.0
