"""Client metrics under kafka-python's group and metric names, with its arithmetic.

Dashboards and lag alerts read ``metrics()`` by kafka-python's names and
compare its rates with what Kafka would show, so the stats take their values
as kafka-python's do (kafka/metrics/stats): over ``metrics_num_samples``
samples of ``metrics_sample_window_ms`` each, a sample recycled once its
window has passed, a rate divided by the time its samples cover but never by
less than the full windows kept.  The clients record once per request (a
flush, a fetch, a commit), with counts that are batch sizes, so the data path
pays nothing per record.  Time is ``clock.monotonic_ms``, looked up at each
call, so a test moves every window exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import clock
from ..errors import InvalidConfigError
from .settings import Setting, at_least

DEFAULT_NUM_SAMPLES = 2
DEFAULT_SAMPLE_WINDOW_MS = 30000


def _prefix(name: str, value: Any) -> Any:
    if not isinstance(value, str) or not value:
        raise InvalidConfigError(f"{name} must be a non-empty string, not {value!r}")
    return value


# Rows of the clients' settings tables (kafka-python's names and defaults).
METRIC_SETTINGS = (
    Setting("metrics_num_samples",
            at_least(1, "{name} must be a positive int, not {value!r}"), DEFAULT_NUM_SAMPLES),
    Setting("metrics_sample_window_ms",
            at_least(1, "{name} must be a positive int, not {value!r}"),
            DEFAULT_SAMPLE_WINDOW_MS),
)
PREFIX_SETTING = Setting("metric_group_prefix", _prefix, "consumer")


@dataclass(frozen=True)
class MetricConfig:
    """How many samples a windowed stat keeps, and how long each one lasts."""

    samples: int = DEFAULT_NUM_SAMPLES
    window_ms: int = DEFAULT_SAMPLE_WINDOW_MS


class _Sample:
    __slots__ = ("value", "events", "started_ms")

    def __init__(self, value: float, now_ms: float) -> None:
        self.value, self.events, self.started_ms = value, 0, now_ms


class Stat:
    """What a sensor feeds: takes each recorded value, gives one figure."""

    def record(self, config: MetricConfig, value: float, now_ms: float) -> None:
        raise NotImplementedError

    def measure(self, config: MetricConfig, now_ms: float) -> float:
        raise NotImplementedError


class SampledStat(Stat):
    """A figure over the recent samples (kafka-python's AbstractSampledStat): a value
    goes into the current sample, or into the next one once the current sample's
    window has passed; a sample older than every window kept starts again empty."""

    initial = 0.0

    def __init__(self) -> None:
        self._samples: list[_Sample] = []
        self._current = 0

    def record(self, config: MetricConfig, value: float, now_ms: float) -> None:
        if not self._samples:
            self._samples.append(_Sample(self.initial, now_ms))
        sample = self._samples[self._current]
        if now_ms - sample.started_ms >= config.window_ms:
            self._current = (self._current + 1) % config.samples
            if self._current >= len(self._samples):
                self._samples.append(_Sample(self.initial, now_ms))
            sample = self._samples[self._current]
            sample.value, sample.events, sample.started_ms = self.initial, 0, now_ms
        self.update(sample, value)
        sample.events += 1

    def measure(self, config: MetricConfig, now_ms: float) -> float:
        self.purge(config, now_ms)
        return self.combine(self._samples)

    def purge(self, config: MetricConfig, now_ms: float) -> None:
        """Empty the samples whose window ended before every window kept began."""
        for sample in self._samples:
            if now_ms - sample.started_ms >= config.samples * config.window_ms:
                sample.value, sample.events, sample.started_ms = self.initial, 0, now_ms

    def oldest_start(self, now_ms: float) -> float:
        if not self._samples:
            self._samples.append(_Sample(self.initial, now_ms))
        return min(sample.started_ms for sample in self._samples)

    def update(self, sample: _Sample, value: float) -> None:
        sample.value += value

    def combine(self, samples: list[_Sample]) -> float:
        return float(sum(sample.value for sample in samples))


class SampledTotal(SampledStat):
    """The sum of the values in the samples (what a Rate divides)."""


class Count(SampledStat):
    """How many values the samples hold (a Rate of it is events per second)."""

    def update(self, sample: _Sample, value: float) -> None:
        sample.value += 1.0


class Avg(SampledStat):
    """The mean of the values in the samples; 0 with none."""

    def combine(self, samples: list[_Sample]) -> float:
        events = sum(sample.events for sample in samples)
        return float(sum(sample.value for sample in samples)) / events if events else 0.0


class Max(SampledStat):
    """The largest value in the samples; -inf with none, as kafka-python's."""

    initial = float("-inf")

    def update(self, sample: _Sample, value: float) -> None:
        sample.value = max(sample.value, value)

    def combine(self, samples: list[_Sample]) -> float:
        return max((sample.value for sample in samples), default=float("-inf"))


class Rate(Stat):
    """Per second over the samples' time, which counts as at least every full window
    but the current one: a rate seconds after a start is not inflated by a short
    elapsed time (kafka-python's Rate.window_size)."""

    def __init__(self, sampled: SampledStat | None = None) -> None:
        self._sampled = sampled if sampled is not None else SampledTotal()

    def record(self, config: MetricConfig, value: float, now_ms: float) -> None:
        self._sampled.record(config, value, now_ms)

    def measure(self, config: MetricConfig, now_ms: float) -> float:
        total = self._sampled.measure(config, now_ms)
        return total / (window_ms(self._sampled, config, now_ms) / 1000)


def window_ms(sampled: SampledStat, config: MetricConfig, now_ms: float) -> float:
    """The milliseconds a rate divides by: since the oldest kept sample began, and at
    least ``samples - 1`` full windows (never 0: one sample of one millisecond)."""
    sampled.purge(config, now_ms)
    elapsed = now_ms - sampled.oldest_start(now_ms)
    full = int(elapsed // config.window_ms)
    if full < config.samples - 1:
        elapsed += (config.samples - 1 - full) * config.window_ms
    return max(elapsed, 1.0)


class Total(Stat):
    """The sum of every value ever recorded (Kafka's CumulativeSum: the ``-total`` names)."""

    def __init__(self, counting: bool = False) -> None:
        self._total = 0.0
        self._counting = counting  # count the values instead (Kafka's CumulativeCount)

    def record(self, config: MetricConfig, value: float, now_ms: float) -> None:
        self._total += 1.0 if self._counting else value

    def measure(self, config: MetricConfig, now_ms: float) -> float:
        return self._total


@dataclass(frozen=True)
class MetricName:
    """kafka-python's MetricName: a metric is known by its name and group."""

    name: str
    group: str
    description: str = field(default="", compare=False)
    tags: tuple[tuple[str, str], ...] = ()


class Metric:
    """One figure (kafka-python's KafkaMetric): ``value()`` measures it now."""

    def __init__(self, metrics: Metrics, metric_name: MetricName,
                 measure: Callable[[MetricConfig, float], float]) -> None:
        self._metrics = metrics
        self.metric_name = metric_name
        self._measure = measure

    def value(self, time_ms: float | None = None) -> float:
        now = clock.monotonic_ms() if time_ms is None else time_ms
        with self._metrics.lock:
            return self._measure(self._metrics.config, now)


class Sensor:
    """Records one kind of value into each of its stats at once (a sensor of Kafka's)."""

    def __init__(self, metrics: Metrics, stats: list[Stat]) -> None:
        self._metrics = metrics
        self._stats = stats

    def record(self, value: float = 1.0, time_ms: float | None = None) -> None:
        """Record ``value`` at ``time_ms`` (now if None), as kafka-python's Sensor.record."""
        now = clock.monotonic_ms() if time_ms is None else time_ms
        value = float(value)
        metrics = self._metrics
        with metrics.lock:
            for stat in self._stats:
                stat.record(metrics.config, value, now)


# A sensor's figures: (metric name, group, description, the stat that makes it).
Row = tuple[str, str, str, Callable[[], Stat]]


class Metrics:
    """A client's figures by group and name: what ``metrics()`` returns.

    One lock guards every sample: a client records in the thread doing its
    work (a producer's sender thread, say) while another thread reads.
    """

    def __init__(self, config: MetricConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self._metrics: dict[MetricName, Metric] = {}

    def sensor(self, rows: list[Row]) -> Sensor:
        """A sensor feeding one stat per row, each shown under its row's name and group."""
        stats = []
        for name, group, description, make in rows:
            stat = make()
            stats.append(stat)
            self._add(MetricName(name, group, description), stat.measure)
        return Sensor(self, stats)

    def gauge(self, name: str, group: str, description: str, read: Callable[[], float]
              ) -> None:
        """A figure read when asked for (how many partitions are assigned, say)."""
        self._add(MetricName(name, group, description), lambda config, now: float(read()))

    def _add(self, metric_name: MetricName, measure: Callable[[MetricConfig, float], float]
             ) -> None:
        if metric_name in self._metrics:
            raise ValueError(f"metric {metric_name.group}/{metric_name.name} is defined twice")
        self._metrics[metric_name] = Metric(self, metric_name, measure)

    def values(self, raw: bool = False) -> dict[Any, Any]:
        """``{group: {name: value}}`` as kafka-python's ``metrics()``, every figure taken
        at one instant; ``raw``: ``{MetricName: Metric}``."""
        if raw:
            return dict(self._metrics)
        now = clock.monotonic_ms()
        out: dict[str, dict[str, float]] = {}
        for metric_name, metric in self._metrics.items():
            out.setdefault(metric_name.group, {})[metric_name.name] = metric.value(now)
        return out


def _rows(group: str, *rows: tuple[str, str, Callable[[], Stat]]) -> list[Row]:
    return [(name, group, description, make) for name, description, make in rows]


def _event_rate() -> Stat:
    return Rate(Count())


def _event_total() -> Stat:
    return Total(counting=True)


class ProducerSensors:
    """A producer's figures: kafka-python's ``producer-metrics`` group (its
    SenderMetrics and its connections' request figures, which share the group).

    A request is one flush written, its data object and its claims, as one
    produce request carries every partition's batches to a broker; a
    record's size is its key's and value's bytes.
    """

    def __init__(self, config: MetricConfig, in_flight: Callable[[], int]) -> None:
        m = self.metrics = Metrics(config)
        g = "producer-metrics"
        self.batch_size = m.sensor(_rows(
            g, ("batch-size-avg", "The average number of bytes sent per partition per-request.",
                Avg),
            ("batch-size-max", "The max number of bytes sent per partition per-request.", Max)))
        self.record_size = m.sensor(_rows(
            g, ("record-size-max", "The maximum record size across all batches", Max),
            ("record-size-avg", "The average maximum record size per batch", Avg)))
        self.records = m.sensor(_rows(
            g, ("record-send-rate", "The average number of records sent per second.", Rate),
            ("records-per-request-avg", "The average number of records per request.", Avg),
            ("record-send-total", "The total number of records sent.", Total)))
        self.requests = m.sensor(_rows(
            g, ("byte-rate", "The average number of bytes sent per second.", Rate),
            ("byte-total", "The total number of bytes sent.", Total),
            ("outgoing-byte-rate", "The average number of outgoing bytes sent per second.", Rate),
            ("outgoing-byte-total", "The total number of outgoing bytes sent.", Total),
            ("request-rate", "The average number of requests sent per second.", _event_rate),
            ("request-total", "The total number of requests sent.", _event_total),
            ("request-size-avg", "The average size of all requests in the window.", Avg),
            ("request-size-max", "The maximum size of any request sent in the window.", Max)))
        self.latency = m.sensor(_rows(
            g, ("request-latency-avg", "The average request latency in ms.", Avg),
            ("request-latency-max", "The maximum request latency in ms.", Max)))
        # No broker throttles a request: each one records a throttle time of 0.
        self.throttle = m.sensor(_rows(
            g, ("throttle-time-avg", "The average throttle time in ms.", Avg),
            ("throttle-time-max", "The maximum throttle time in ms.", Max)))
        self.errors = m.sensor(_rows(
            g, ("record-error-rate",
                "The average per-second number of record sends that resulted in errors", Rate),
            ("record-error-total", "The total number of record sends that resulted in errors",
             Total)))
        # Nothing is retried here (a failed write fails its records), so these stay 0.
        m.sensor(_rows(g, ("record-retry-rate",
                           "The average per-second number of retried record sends", Rate)))
        m.gauge("requests-in-flight", g,
                "The current number of in-flight requests awaiting a response.", in_flight)

    def request(self, batches: list[tuple[int, int, int]], began_ms: float,
                latency_ms: float) -> None:
        """One flush written: each batch's records, bytes and largest record's bytes.

        They count from when the request began, as kafka-python counts a produce request
        when it is made: counted when it ended, a run's first write would fall outside
        every rate's window (a rate's first sample starts at its first record)."""
        records = size = 0
        for count, nbytes, largest in batches:
            self.batch_size.record(nbytes, began_ms)
            self.record_size.record(largest, began_ms)
            records += count
            size += nbytes
        self.records.record(records, began_ms)
        self.requests.record(size, began_ms)
        self.latency.record(latency_ms)
        self.throttle.record(0)


class ConsumerSensors:
    """A consumer's figures: kafka-python's ``<prefix>-fetch-manager-metrics`` and
    ``<prefix>-coordinator-metrics`` groups (its FetchManagerMetrics and its
    coordinator's commit and join figures, with Kafka's rebalance names for the
    joins).

    A fetch request is one read of the partitions a poll looks at; its bytes
    are the records' as read (Arrow, uncompressed); a partition's lag is
    what its reader may read now (the LSO under read_committed, the log end
    otherwise) minus the position the fetch left it at.
    """

    def __init__(self, config: MetricConfig, prefix: str, assigned: Callable[[], int]) -> None:
        m = self.metrics = Metrics(config)
        g = f"{prefix}-fetch-manager-metrics"
        self.fetched_bytes = m.sensor(_rows(
            g, ("fetch-size-avg", "The average number of bytes fetched per request", Avg),
            ("fetch-size-max", "The maximum number of bytes fetched per request", Max),
            ("bytes-consumed-rate", "The average number of bytes consumed per second", Rate),
            ("bytes-consumed-total", "The total number of bytes consumed", Total)))
        self.fetched_records = m.sensor(_rows(
            g, ("records-per-request-avg", "The average number of records in each request", Avg),
            ("records-consumed-rate", "The average number of records consumed per second", Rate),
            ("records-consumed-total", "The total number of records consumed", Total)))
        self.fetch_latency = m.sensor(_rows(
            g, ("fetch-latency-avg", "The average time taken for a fetch request.", Avg),
            ("fetch-latency-max", "The max time taken for any fetch request.", Max),
            ("fetch-rate", "The number of fetch requests per second.", _event_rate),
            ("fetch-total", "The total number of fetch requests.", _event_total)))
        self.lag = m.sensor(_rows(
            g, ("records-lag-max", "The maximum lag in terms of number of records for any "
                "partition in self window", Max)))
        c = f"{prefix}-coordinator-metrics"
        self.commits = m.sensor(_rows(
            c, ("commit-latency-avg", "The average time taken for a commit request", Avg),
            ("commit-latency-max", "The max time taken for a commit request", Max),
            ("commit-rate", "The number of commit calls per second", _event_rate),
            ("commit-total", "The total number of commit calls", _event_total)))
        self.rebalances = m.sensor(_rows(
            c, ("join-time-avg", "The average time taken for a group rejoin", Avg),
            ("join-time-max", "The max time taken for a group rejoin", Max),
            ("join-rate", "The number of group joins per second", _event_rate),
            ("rebalance-latency-avg", "The average time taken for a group rebalance", Avg),
            ("rebalance-latency-max", "The max time taken for a group rebalance", Max),
            ("rebalance-latency-total", "The total time taken for group rebalances", Total),
            ("rebalance-total", "The total number of group rebalances", _event_total)))
        m.gauge("assigned-partitions", c,
                "The number of partitions currently assigned to this consumer", assigned)

    def fetch(self, records: int, nbytes: int, began_ms: float, latency_ms: float,
              lags: list[int]) -> None:
        """One fetch request: what it returned, how long it took, each partition's lag.

        What it returned counts from when it began (as ``ProducerSensors.request``): one
        read may return many records, and its time belongs in the rates' window."""
        self.fetched_bytes.record(nbytes, began_ms)
        self.fetched_records.record(records, began_ms)
        self.fetch_latency.record(latency_ms)
        for lag in lags:
            self.lag.record(lag)
