"""The Spark sink's topics (issue 34, item 2): the root's auto.create.topics.enable decides
unless the query gives createTopics, which then overrides it for that query.  What the
sink's driver and tasks call before they write, without a Spark session."""

from __future__ import annotations

import uuid

import pytest

from txlog import Log, UnknownTopicError
from txlog.spark.options import WriteOptions
from txlog.spark.writer import _ensure_topic


def options(root: str, **given: str) -> WriteOptions:
    return WriteOptions.parse({"path": root, "deliveryGuarantee": "at_least_once", **given},
                              streaming=False)


def test_without_createTopics_the_root_decides() -> None:
    log = Log(f"memory://{uuid.uuid4().hex}")
    log.alter_root_config({"num.partitions": 3})
    _ensure_topic(log.services, options(log.root), "a")
    _ensure_topic(log.services, options(log.root, numPartitions="2"), "b")
    assert [log.describe_topic(t).partitions for t in ("a", "b")] == [3, 2]
    log.alter_root_config({"auto.create.topics.enable": False})
    with pytest.raises(UnknownTopicError, match="auto.create.topics.enable is false"):
        _ensure_topic(log.services, options(log.root), "c")
    assert log.topics() == ["a", "b"]


def test_createTopics_overrides_the_root_either_way() -> None:
    log = Log(f"memory://{uuid.uuid4().hex}")
    log.alter_root_config({"auto.create.topics.enable": False})
    _ensure_topic(log.services, options(log.root, createTopics="true"), "a")
    assert log.describe_topic("a").partitions == 1
    log.alter_root_config(delete=["auto.create.topics.enable"])
    with pytest.raises(UnknownTopicError, match="'b' does not exist .* createTopics is false"):
        _ensure_topic(log.services, options(log.root, createTopics="false"), "b")
    _ensure_topic(log.services, options(log.root, createTopics="false"), "a")  # exists: fine
    assert log.topics() == ["a"]
