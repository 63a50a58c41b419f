"""Spark programs written for Kafka run on a txlog root with only their ``format`` changed.

The programs in tests/harness/ported/ are written against Spark's Kafka connector
(``format("kafka")``, ``kafka.bootstrap.servers``, a sink naming only its
``checkpointLocation``).  Each test copies one with ``format("kafka")`` replaced by
``format("txlog")`` and nothing else, and runs it through spark-submit with a txlog root
as the broker address: the root needs no topic created beforehand (the sink's topic is
created on first use, as a broker's ``auto.create.topics.enable`` does).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from conftest import HARNESS_DIR, spark_submit  # noqa: E402

from txlog import Log  # noqa: E402

PORTED = HARNESS_DIR / "ported"


def ported(name: str, tmp_path: Path) -> Path:
    """The Kafka program with its format, and only its format, changed."""
    source = (PORTED / name).read_text()
    assert source.count('format("kafka")') >= 2
    changed = source.replace('format("kafka")', 'format("txlog")')
    target = tmp_path / name
    target.write_text(changed)
    return target


def produce(root: Path, topic: str, lines: list[str]) -> None:
    log = Log(root)
    log.create_topic(topic, partitions=2)
    with log.producer() as producer:
        for i, line in enumerate(lines):
            producer.send(topic, key=str(i).encode(), value=line.encode())


LINES = ["the quick brown fox", "jumps over the lazy dog", "the dog sleeps", "fox"]


def test_kafka_word_count_runs_with_only_its_format_changed(tmp_path):
    root = tmp_path / "root"
    produce(root, "lines", LINES)
    done = spark_submit(ported("kafka_wordcount.py", tmp_path), str(root), "lines",
                        str(tmp_path / "checkpoint"), timeout=300)
    printed = {}
    for line in done.stdout.splitlines():
        if line.startswith("count "):
            _, word, count = line.split()
            printed[word] = int(count)  # the last micro-batch's complete counts win
    assert printed == dict(Counter(" ".join(LINES).split()))


def test_kafka_sink_stream_runs_with_only_its_format_changed(tmp_path):
    root = tmp_path / "root"
    produce(root, "words", LINES)
    assert "shouted" not in Log(root).topics()
    done = spark_submit(ported("kafka_sink_stream.py", tmp_path), str(root), "words", "shouted",
                        str(tmp_path / "checkpoint"), timeout=300)
    printed = Counter()
    for line in done.stdout.splitlines():
        if line.startswith("written "):
            value, count = line[len("written "):].rsplit(" ", 1)
            printed[value] += int(count)
    assert printed == Counter(line.upper() for line in LINES)
