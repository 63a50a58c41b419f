"""The Log a Spark Python worker keeps between tasks (spark/worker_logs.py), without Spark.

What a kept Log must do: cost a task only what was appended since the
worker's last task, yet see what a new Log would see (partitions added, a
topic or the whole root deleted and created anew).
"""

from __future__ import annotations

import shutil
import sys

import pytest

from conftest import REPO

from txlog import Log
from txlog.spark import worker_logs
from txlog.spark.worker_logs import worker_log
from txlog.storage.lru import LruDict
from txlog.transactions import store as store_module

sys.path.insert(0, str(REPO / "benchmarks"))
from object_store_requests import micro_batch_requests  # noqa: E402  (the benchmark's job)


@pytest.fixture(autouse=True)
def no_kept_logs(monkeypatch):
    monkeypatch.setattr(worker_logs, "_logs", LruDict(worker_logs.KEPT_LOGS))


def test_a_kept_log_costs_each_task_what_was_appended_since_not_the_history(s3_server):
    """A fresh Log per task reads every batch header since the last snapshot, so a
    stream's micro-batches cost more the longer it runs; the worker's Log does not."""
    fresh = micro_batch_requests(s3_server, False, 12, partitions=2, records=100)
    kept = micro_batch_requests(s3_server, True, 12, partitions=2, records=100)
    # The history a new Log reads grows by several headers per micro-batch; what the
    # kept Log's tasks cost varies by a few requests (reads shared or not) but not with it.
    assert fresh[-1] >= fresh[1] + 100, fresh
    assert max(kept[1:]) - min(kept[1:]) <= 6, kept
    assert kept[-1] * 3 < fresh[-1], (kept, fresh)


def test_a_kept_log_sees_partitions_added_since_its_last_task(tmp_path):
    root = str(tmp_path / "log")
    Log(root).create_topic("t", 2)
    first = worker_log(root, None, create=False)
    assert first.describe_topic("t").partitions == 2
    Log(root).create_partitions("t", 4)
    again = worker_log(root, None, create=False)
    assert again is first
    assert again.describe_topic("t").partitions == 4
    with again.producer() as producer:
        producer.send("t", b"v", partition=3)
    assert Log(root).read("t", 3).num_rows == 1


def test_a_kept_log_writes_into_a_topic_recreated_since_its_last_task(tmp_path):
    root = str(tmp_path / "log")
    other = Log(root)
    other.create_topic("t", 1)
    kept = worker_log(root, None, create=False)
    with kept.producer() as producer:
        producer.send("t", b"old")
    other.delete_topic("t")
    other.create_topic("t", 1)
    again = worker_log(root, None, create=False)
    assert again is kept
    with again.producer() as producer:  # no InconsistentTopicIdError: a new Log would not meet one
        producer.send("t", b"new")
    assert Log(root).read("t", 0).column("value").to_pylist() == [b"new"]


def test_a_root_created_anew_under_a_worker_gets_a_new_log(tmp_path):
    """The kept Log's producer-id block belongs to the deleted root: reused in the new
    one, two producers could share an id (and one's batches pass for the other's)."""
    root = str(tmp_path / "log")
    Log(root).create_topic("t", 1)
    kept = worker_log(root, None, create=True)
    with kept.producer() as producer:
        producer.send("t", b"before")
        old_id = producer.producer_id
    shutil.rmtree(root)
    fresh = Log(root)
    fresh.create_topic("t", 1)
    with fresh.producer() as producer:
        taken = producer.producer_id  # the new root's first block, handed out again
    assert taken == old_id
    again = worker_log(root, None, create=True)
    assert again is not kept
    with again.producer() as producer:
        producer.send("t", b"after")
        assert producer.producer_id != taken


def test_a_root_removed_under_a_worker_is_opened_again(tmp_path):
    root = str(tmp_path / "log")
    kept = worker_log(root, None, create=True)
    shutil.rmtree(root)
    again = worker_log(root, None, create=True)
    assert again is not kept and (tmp_path / "log" / "txlog.json").exists()


def test_a_worker_keeps_a_bounded_number_of_logs(tmp_path):
    logs = [worker_log(str(tmp_path / f"log{i}"), None, create=True)
            for i in range(worker_logs.KEPT_LOGS + 1)]
    assert worker_log(str(tmp_path / "log1"), None, create=True) is logs[1]
    assert worker_log(str(tmp_path / "log0"), None, create=True) is not logs[0]  # dropped


def test_other_storage_options_are_another_log(tmp_path):
    root = str(tmp_path / "log")
    assert worker_log(root, None, create=True) is not worker_log(root, {"x": 1}, create=True)


def test_a_process_caches_a_bounded_number_of_transaction_chains(tmp_path, monkeypatch):
    """A worker's Log lives through many tasks, each with its own transactional id: the
    coordinator's per-id caches stay bounded, and an id whose chain was dropped works."""
    monkeypatch.setattr(store_module, "CACHED_CHAINS", 3)
    log = Log(tmp_path / "log")
    log.create_topic("t", 1)
    for round_ in range(2):
        for i in range(6):
            with log.producer(transactional_id=f"app-{i}") as producer:
                producer.init_transactions()
                producer.begin_transaction()
                producer.send("t", b"%d-%d" % (round_, i))
                producer.commit_transaction()
            assert len(log.coordinator.store.chains) <= 3
    assert Log(tmp_path / "log").read("t", 0).num_rows == 12


def test_lru_dict_drops_the_least_recently_used():
    cache: LruDict[str, int] = LruDict(2)
    cache["a"] = 1
    cache.setdefault("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache["c"] = 3
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.setdefault("c", 9) == 3
    assert cache.pop("a") == 1 and len(cache) == 1
    with pytest.raises(ValueError, match="capacity"):
        LruDict(0)
