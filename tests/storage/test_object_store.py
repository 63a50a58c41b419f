"""txlog on S3, against a real S3 endpoint (moto's server, tests/harness/s3_server.py).

The storage contract (tests/storage/test_storage.py) only holds on S3 if the store's
answers are mapped right: 412 means the name is taken, 409
ConditionalRequestConflict means try again, anything else means the outcome
is unknown and must reach the appender as an OSError.  A store that ignores
the condition must be refused, and credentials must never leak into logs,
errors or objects.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import traceback
import uuid
from collections.abc import Callable

import pytest

from txlog import Log, StorageError, UnsupportedStorageError
from txlog.storage.object_store import FsspecStorage, StorageRequestError, _probe_results
from txlog.storage.schemes import open_storage
from txlog.storage.secrets import redact, register_secrets

from s3_server import ACCESS_KEY, SECRET_KEY, Fault


@pytest.fixture
def store(s3_server, s3_root) -> FsspecStorage:
    storage = open_storage(s3_root, s3_server.storage_options)
    assert isinstance(storage, FsspecStorage)
    return storage


@pytest.fixture
def each_store(store_server) -> FsspecStorage:
    """A fresh root on S3, GCS and Azure in turn (each store's test server)."""
    storage = open_storage(store_server.root(), store_server.storage_options)
    assert isinstance(storage, FsspecStorage)
    return storage


def _bucket_of(root: str) -> str:
    return root[len("s3://"):].split("/", 1)[0]


def test_moto_honours_if_none_match(s3_server) -> None:
    """The premise of every S3 test here, checked with plain boto3, not txlog."""
    client = s3_server.client()
    bucket = s3_server.create_bucket()
    client.put_object(Bucket=bucket, Key="k", Body=b"first", IfNoneMatch="*")
    with pytest.raises(client.exceptions.ClientError) as info:
        client.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert info.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"first"


@pytest.mark.parametrize("store", ["gcs", "azure"])
def test_gcs_and_azure_emulators_refuse_a_second_conditional_create(request, store) -> None:
    """The premise of the GCS and Azure runs, checked with each store's own SDK, not txlog."""
    server = request.getfixturevalue(f"{store}_server")
    bucket = server.create_bucket()
    if store == "gcs":
        from google.api_core.exceptions import PreconditionFailed
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        blob = storage.Client(project="txlog-test", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": server.endpoint}
                              ).bucket(bucket).blob("k")
        blob.upload_from_string(b"first", if_generation_match=0)
        with pytest.raises(PreconditionFailed):  # HTTP 412, as GCS answers
            blob.upload_from_string(b"second", if_generation_match=0)
        assert blob.download_as_bytes() == b"first"
    else:
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobClient

        blob = BlobClient.from_connection_string(server.connection_string, bucket, "k")
        blob.upload_blob(b"first", overwrite=False)  # Put Blob with If-None-Match: *
        with pytest.raises(ResourceExistsError) as info:
            blob.upload_blob(b"second", overwrite=False)
        assert info.value.status_code == 409  # BlobAlreadyExists, as Azure answers
        assert blob.download_blob().readall() == b"first"


def test_storage_contract_on_each_store(each_store: FsspecStorage) -> None:
    store = each_store
    data = bytes(range(256)) * 4
    assert store.publish_if_absent("d/x/one", data) is True
    assert store.publish_if_absent("d/x/one", b"other") is False
    assert store.read("d/x/one") == data
    assert store.read_prefix("d/x/one", 10) == data[:10]
    assert store.read_prefix("d/x/one", len(data) + 5) == data
    assert store.read_range("d/x/one", 1000, 100).to_pybytes() == data[1000:]
    assert store.read_range("d/x/one", 5000, 10).to_pybytes() == b""
    assert store.exists("d/x/one") and not store.exists("d/x/none")
    assert store.publish_if_absent("d/xy/two", b"2")
    assert store.publish_if_absent("d/x/deep/three", b"3")
    assert sorted(store.list("d")) == ["x", "xy"]
    assert sorted(store.list("d/x")) == ["deep", "one"]
    assert store.list("nowhere") == []
    for call in (lambda: store.read("d/x/none"), lambda: store.read_prefix("d/x/none", 4),
                 lambda: store.read_range("d/x/none", 0, 4),
                 lambda: store.read_range("d/x/none", 0, 0)):
        with pytest.raises(FileNotFoundError):
            call()
    with pytest.raises(StorageError, match="empty object"):
        store.publish_if_absent("d/empty", b"")
    with pytest.raises(StorageError, match="invalid storage path"):
        store.publish_if_absent("../escape", b"x")
    store.delete("d/x/one")
    store.delete("d/x/one")  # gone already: not an error
    assert not store.exists("d/x/one")
    store.delete_tree("d/x")  # must not touch d/xy, whose name starts the same way
    assert store.list("d") == ["xy"] and store.read("d/xy/two") == b"2"
    assert store.publish_if_absent("d/x/one", b"again")  # a deleted name is free again


def test_one_request_per_publish_and_lookup(store: FsspecStorage, s3_server) -> None:
    """What each storage call costs on S3, after the once-per-process probe."""
    store.publish_if_absent("warm", b"w")  # runs the probe, if this process has not yet
    s3_server.reset_counts()
    store.publish_if_absent("a/b", b"1")
    store.publish_if_absent("a/b", b"2")
    assert s3_server.counts == {"PUT": 2}
    s3_server.reset_counts()
    store.exists("a/b"), store.exists("a/c"), store.read("a/b"), store.read_prefix("a/b", 1)
    assert s3_server.counts == {"GET": 4}
    s3_server.reset_counts()
    store.list("a"), store.delete("a/b")
    assert s3_server.counts == {"LIST": 1, "DELETE": 1}
    s3_server.reset_counts()
    assert store.list("a/missing") == []  # s3fs's ls would list "a/" too, page by page
    assert s3_server.counts == {"LIST": 1}


@pytest.mark.parametrize("store", ["gcs", "azure"])
def test_one_request_per_publish_and_lookup_on_gcs_and_azure(request, store,
                                                            monkeypatch) -> None:
    """What each storage call costs on GCS and Azure, counted at the HTTP client that
    gcsfs and the Azure SDK share (aiohttp), after the once-per-process probe."""
    import aiohttp

    server = request.getfixturevalue(f"{store}_server")
    storage = open_storage(server.root(), server.storage_options)
    storage.publish_if_absent("warm", b"w")
    sent: list[str] = []
    original = aiohttp.ClientSession._request

    def counted(self, method, url, *args, **kwargs):
        sent.append(method)
        return original(self, method, url, *args, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "_request", counted)
    assert storage.publish_if_absent("a/b", b"1") and not storage.publish_if_absent("a/b", b"2")
    assert len(sent) == 2, sent  # one conditional create each, refused or not
    sent.clear()
    assert storage.exists("a/b") and not storage.exists("a/c")
    assert storage.read("a/b") == b"1" and storage.read_prefix("a/b", 1) == b"1"
    assert sent == ["GET"] * 4


def test_a_fresh_process_finds_the_log_end_with_lists_independent_of_its_size(
        s3_server, s3_root) -> None:
    """Neither the batches nor their number are listed to find a partition's end."""
    lists = []
    for batches in (10, 40):
        root = f"{s3_root}-{batches}"
        log = Log(root, storage_options=s3_server.storage_options)
        log.create_topic("t", 1)
        producer = log.producer()
        for _ in range(batches):
            producer.send("t", b"x", partition=0)
            producer.flush()
        s3_server.reset_counts()
        assert Log(root, storage_options=s3_server.storage_options).partition(
            "t", 0).end_offset() == batches
        lists.append(s3_server.counts.get("LIST", 0))
    assert lists[0] == lists[1] <= 6, lists


def test_conflict_409_is_retried(store: FsspecStorage, s3_server) -> None:
    """S3 answers 409 ConditionalRequestConflict when conditional writes of a name overlap."""
    path = f"c/{uuid.uuid4().hex}"
    fault = s3_server.inject(Fault(lambda m, k: m == "PUT" and k.endswith(path), 409,
                                   "ConditionalRequestConflict", times=3))
    assert store.publish_if_absent(path, b"mine") is True
    assert fault.hits == 3
    assert store.read(path) == b"mine"

    taken = f"c/{uuid.uuid4().hex}"
    assert store.publish_if_absent(taken, b"first")
    s3_server.inject(Fault(lambda m, k: m == "PUT" and k.endswith(taken), 409,
                           "ConditionalRequestConflict", times=2))
    assert store.publish_if_absent(taken, b"second") is False  # after the conflicts: 412


def test_conflict_that_never_clears_is_an_oserror(store: FsspecStorage, s3_server) -> None:
    path = f"c/{uuid.uuid4().hex}"
    s3_server.inject(Fault(lambda m, k: m == "PUT" and k.endswith(path), 409,
                           "ConditionalRequestConflict", times=100))
    with pytest.raises(StorageRequestError, match="ConditionalRequestConflict") as info:
        store.publish_if_absent(path, b"x")
    assert isinstance(info.value, OSError) and info.value.status == 409
    assert not store.exists(path)


def test_lost_reply_after_publish_resolves_to_one_batch(s3_server, s3_root) -> None:
    """A publish whose reply is lost after S3 stored the batch: outcome unknown.

    botocore retries a 500 (the retry meets the stored object: 412, "taken");
    a 400 is not retried and reaches the appender as an OSError.  Either way
    the appender reloads, finds its own batch, and acknowledges it once, at
    the offset it really has.
    """
    log = Log(s3_root, storage_options=s3_server.storage_options)
    log.create_topic("t", 1)
    producer = log.producer(linger_ms=0)
    assert producer.send("t", b"before", partition=0).get().offset == 0
    for status, code in ((500, "InternalError"), (400, "InvalidRequest")):
        fault = s3_server.inject(Fault(lambda m, k: m == "PUT" and k.endswith(".batch"),
                                       status, code, after=True))
        offset = producer.send("t", code.encode(), partition=0).get().offset
        assert fault.hits == 1
        assert offset == log.end_offset("t", 0) - 1
    values = Log(s3_root, storage_options=s3_server.storage_options).read("t", 0)
    assert values.column("value").to_pylist() == [b"before", b"InternalError",
                                                  b"InvalidRequest"]
    assert values.column("offset").to_pylist() == [0, 1, 2]


def test_other_store_errors_are_storage_errors_without_secrets(s3_server) -> None:
    log_root = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/log"
    with pytest.raises(StorageRequestError) as info:
        Log(log_root, storage_options=s3_server.storage_options)
    message = str(info.value)
    assert "NoSuchBucket" in message and "(HTTP 404)" in message and log_root in message
    assert isinstance(info.value, OSError)
    assert info.value.__cause__ is None and SECRET_KEY not in message


def test_store_ignoring_if_none_match_is_refused(s3_server) -> None:
    bucket = s3_server.create_bucket()
    s3_server.ignoring_conditions.add(bucket)
    options = dict(s3_server.storage_options, anon=False)  # another store key than other tests
    with pytest.raises(UnsupportedStorageError, match="ignores conditional writes") as info:
        Log(f"s3://{bucket}/log", storage_options=options)
    assert f"s3://{bucket}/log" in str(info.value)
    assert s3_server.objects(bucket) == {}, "the probe objects must be cleaned up"
    # The verdict is cached for the process: the next attempt sends no request.
    s3_server.reset_counts()
    with pytest.raises(UnsupportedStorageError, match="ignores conditional writes"):
        open_storage(f"s3://{bucket}/log", options).publish_if_absent("x", b"x")
    assert s3_server.counts == {}
    # A store that honours the condition passes: the first process of the day looks for a
    # remembered verdict, probes (two PUTs and a DELETE) and remembers its pass (a PUT).
    good = s3_server.create_bucket()
    s3_server.reset_counts()
    storage = open_storage(f"s3://{good}/log", options)
    assert storage.publish_if_absent("a", b"a")
    assert s3_server.counts == {"GET": 1, "PUT": 4, "DELETE": 1}
    objects = s3_server.objects(good)
    [verdict] = [name for name in objects if name.startswith("log/.tmp-probe/verified-")]
    assert sorted(objects) == sorted(["log/a", verdict])
    assert SECRET_KEY.encode() not in objects[verdict] and good.encode() in objects[verdict]
    # Another process on the same store pays one GET for the verdict instead of a probe,
    # whatever options it adds that do not choose the store (a Spark task's user agent).
    _probe_results.pop(storage._probe_key)
    task_options = dict(options, config_kwargs={"user_agent_extra": "task-7"})
    s3_server.reset_counts()
    assert open_storage(f"s3://{good}/log", task_options).publish_if_absent("b", b"b")
    assert s3_server.counts == {"GET": 1, "PUT": 1}


def test_a_remembered_verdict_of_another_store_is_not_trusted(s3_server) -> None:
    """protocol.md 1.3: a verdict object counts only where it names this very store (URL,
    client, endpoint options).  One of another store found at this store's name (a bucket
    copied, a forged object) does not spare the probe, which refuses the store."""
    bucket = s3_server.create_bucket()
    s3_server.ignoring_conditions.add(bucket)
    options = dict(s3_server.storage_options, anon=False)
    storage = open_storage(f"s3://{bucket}/log", options)
    other = open_storage(f"s3://{bucket}/other", options)
    forged = json.dumps({"store": other._store_identity, "conditional_writes": True,
                         "verified_ms": 0}).encode()
    s3_server.client().put_object(Bucket=bucket, Key=f"log/{storage._verdict_path()}",
                                  Body=forged)
    with pytest.raises(UnsupportedStorageError, match="ignores conditional writes"):
        storage.publish_if_absent("x", b"x")
    assert f"log/{storage._verdict_path()}" in s3_server.objects(bucket)


class _DroppingTheCondition:
    """An fsspec filesystem whose creates are plain writes: a store ignoring the condition."""

    def __init__(self, fs) -> None:
        self._fs = fs

    def __getattr__(self, name: str):
        return getattr(self._fs, name)

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite", **kwargs):
        return self._fs.pipe_file(path, data, mode="overwrite", **kwargs)


@pytest.mark.parametrize("store", ["gcs", "azure"])
def test_probe_refuses_gcs_and_azure_when_the_condition_is_dropped(request, store) -> None:
    """Both emulators honour the condition, so the probe's refusal is shown by dropping it
    on the client side: the store's real answers to a second, unconditional create."""
    server = request.getfixturevalue(f"{store}_server")
    bucket = server.create_bucket()
    root = f"{server.scheme}://{bucket}/log"
    options = dict(server.storage_options, skip_instance_cache=True)  # its own probe verdict
    storage = open_storage(root, options)
    storage.fs = _DroppingTheCondition(storage.fs)
    with pytest.raises(UnsupportedStorageError, match="ignores conditional writes") as info:
        storage.publish_if_absent("x", b"x")
    assert root in str(info.value)
    assert server.objects(bucket) == {}, "the probe objects must be cleaned up"
    # Through the store's real conditional create the same store passes the probe.
    good = open_storage(root, dict(options, skip_instance_cache=False))
    assert good.publish_if_absent("x", b"x") and not good.publish_if_absent("x", b"y")
    assert {name: data for name, data in server.objects(bucket).items()
            if not name.startswith("log/.tmp-probe/verified-")} == {"log/x": b"x"}


@pytest.mark.parametrize("url", ["s3://AKIAX:sekret-value@bucket/log",
                                 "gs://user:pw-value@bucket/log"])
def test_credentials_in_the_url_are_refused(url: str) -> None:
    with pytest.raises(StorageError, match="credentials inside the URL") as info:
        open_storage(url)
    assert "sekret-value" not in str(info.value) and "pw-value" not in str(info.value)


def test_listing_cache_cannot_be_turned_on(s3_server, s3_root) -> None:
    with pytest.raises(StorageError, match="use_listings_cache"):
        open_storage(s3_root, dict(s3_server.storage_options, use_listings_cache=True))


def test_missing_backend_package_is_named_with_how_to_install_it(monkeypatch) -> None:
    import sys

    import fsspec  # noqa: F401  (its registry module, whose name fsspec's mapping shadows)

    # As if adlfs were not installed (the test extra installs it): the import fails, and
    # fsspec has not kept the class from an earlier import.
    monkeypatch.setitem(sys.modules, "adlfs", None)
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "abfs", raising=False)
    with pytest.raises(StorageError, match=r"the adlfs package is needed for abfs:// roots; "
                                           r"install it with pip install 'txlog\[azure\]'"):
        open_storage("abfs://container/log", {})


@pytest.mark.parametrize("url", ["s3://", "s3:///", "s3a://"])
def test_root_without_a_bucket_is_refused(url: str) -> None:
    with pytest.raises(StorageError, match="must name a bucket"):
        open_storage(url, {})


# --- 16 processes race for one name, many times ---------------------------------------------

RACERS = 16
# Slots raced for, per root scheme: each trial is 16 conditional creates at once.
# Azurite (node) answers them slowest, so it races for fewer slots to stay CI-sized.
TRIALS = {"s3": 100, "gs": 60, "az": 30}


def _racer(root: str, options: dict, barrier, results, me: int, trials: int) -> None:
    storage = open_storage(root, options)
    storage.publish_if_absent(f"warm/{me}", b"w")  # probe and connect before the races
    won = []
    for trial in range(trials):
        barrier.wait()
        won.append(storage.publish_if_absent(f"slot/{trial:03d}", f"racer {me}".encode()))
    results.put((me, won))


def test_sixteen_processes_race_for_each_slot_exactly_one_wins(store_server) -> None:
    """On S3, GCS and Azure (their test servers), each through its own conditional create."""
    # fork: the racers start with this process's imports loaded; spawned ones would
    # each import txlog, pyarrow and s3fs again (~10 s more on two cores).  A racer
    # opens its own store client (fsspec drops inherited instances and event loops).
    root = store_server.root()
    trials = TRIALS[root.split("://", 1)[0]]
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(RACERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(root, store_server.storage_options, barrier,
                                              results, me, trials)) for me in range(RACERS)]
    for p in procs:
        p.start()
    try:
        outcomes = dict(results.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    store = open_storage(root, store_server.storage_options)
    for trial in range(trials):
        winners = [me for me in range(RACERS) if outcomes[me][trial]]
        assert len(winners) == 1, f"slot {trial}: winners {winners}"
        assert store.read(f"slot/{trial:03d}") == f"racer {winners[0]}".encode()
    # The races were real: different processes won different slots.
    assert len({me for me in range(RACERS) for t in range(trials) if outcomes[me][t]}) > 1


# --- credentials never leak ------------------------------------------------------------------

TOKEN = "txlogTestSessionToken/IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJH"


def _failures(*calls: Callable[[], object]) -> list[BaseException]:
    caught = []
    for call in calls:
        with pytest.raises(Exception) as info:
            call()
        caught.append(info.value)
    return caught


def test_credentials_never_reach_logs_errors_reprs_or_objects(s3_server, caplog) -> None:
    secrets = (ACCESS_KEY, SECRET_KEY, TOKEN)
    options = dict(s3_server.storage_options, token=TOKEN)
    bucket = s3_server.create_bucket()  # the test's own boto3 client: not under test
    root = f"s3://{bucket}/log"
    caplog.set_level(logging.DEBUG)  # every logger, botocore's signed-request dumps included

    log = Log(root, storage_options=options)
    log.create_topic("t", 2)
    with log.producer() as producer:
        producer.send("t", b"plain", partition=0)
    txn = log.producer(transactional_id="cred-test")
    txn.init_transactions()
    txn.begin_transaction()
    txn.send("t", b"in a transaction", partition=1)
    txn.commit_transaction()
    consumer = log.consumer(auto_offset_reset="earliest")
    consumer.assign([("t", 0), ("t", 1)])
    assert sorted(r.value for r in consumer.poll()) == [b"in a transaction", b"plain"]
    assert log.read("t", 1).column("value").to_pylist() == [b"in a transaction"]

    # Errors that carry the storage configuration or the store's own words.
    s3_server.inject(Fault(lambda m, k: k.endswith("echo"), 403, "SignatureDoesNotMatch",
                           message=f"The request signature we calculated does not match. "
                                   f"StringToSign: AWS4 {ACCESS_KEY} token {TOKEN}"))
    errors = _failures(
        lambda: Log(f"s3://no-such-{uuid.uuid4().hex[:8]}/log", storage_options=options),
        lambda: log.storage.read("echo"),
        lambda: open_storage(root, dict(options, use_listings_cache=True)),
        lambda: open_storage(root, dict(options, client_kwargs="not a dict")).list(""),
        lambda: log.storage.publish_if_absent("empty", b""))
    assert isinstance(errors[1], StorageRequestError) and "SignatureDoesNotMatch" in str(errors[1])
    texts = [repr(log), repr(log.storage), str(log.storage)]
    for exc in errors:
        texts.append("".join(traceback.format_exception(exc)))
    assert "***" in repr(log.storage)
    texts += [caplog.text] + [r.getMessage() for r in caplog.records]
    assert any("x-amz-security-token" in t.lower() for t in texts), \
        "botocore's header dump should be in the debug log (else this test checks nothing)"
    objects = s3_server.objects(bucket)
    assert any(k.endswith(".batch") for k in objects)
    for secret in secrets:
        for text in texts:
            assert secret not in text, [line for line in text.splitlines() if secret in line]
        for key, data in objects.items():
            assert secret.encode() not in data, key
            assert secret not in key


def test_redaction_covers_nested_options_and_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", "environment-token-value")
    register_secrets({"client_kwargs": {"aws_secret_access_key": "nested-secret-value"},
                      "region_name": "eu-west-1"})
    text = "a nested-secret-value, an environment-token-value, eu-west-1"
    assert redact(text) == "a ***, an ***, eu-west-1"
    record = logging.getLogger("txlog.test").makeRecord(
        "txlog.test", logging.INFO, __file__, 1, "sent %s", ("nested-secret-value",), None)
    # Loggers build records through the factory; makeRecord is what they call.
    assert "nested-secret-value" not in record.getMessage()
