"""``KafkaProducer``: kafka-python's producer over the native one, shareable between threads.

The native ``Producer`` does the work (batching, partitioning, idempotence,
transactions, the one write path); this class gives it kafka-python's
signatures and threading.  One lock serialises every call into the native
producer, which is not thread-safe, and a sender thread publishes the
batches whose ``linger_ms`` has run out and the ones a ``get()`` or
``flush()`` waits for.  Waiting therefore never needs the lock: ``get`` and
``flush`` wait on the futures' events, so their timeouts hold even while
another thread is in the middle of a slow storage write.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..clients.producer import Producer
from .config import PRODUCER_CONFIG, codec, open_log, resolve
from .errors import (IllegalStateError, KafkaConfigurationError, KafkaError, KafkaTimeoutError,
                     kafka_error_for, translated, translating)
from .structs import ConsumerGroupMetadata, RecordMetadata, TopicPartition, plain_offsets

logger = logging.getLogger(__name__)


class FutureRecordMetadata:
    """The result of ``send``: kafka-python's future, resolved by whichever thread publishes.

    ``get(timeout)`` asks the sender to publish the record's batch now and
    waits at most ``timeout`` seconds for it (``KafkaTimeoutError`` after);
    callbacks run in the publishing thread, as kafka-python runs them in its
    sender thread.
    """

    def __init__(self, producer: KafkaProducer, tp: TopicPartition,
                 sizes: tuple[int, int, int]) -> None:
        self._producer = producer
        self._tp = tp
        self._sizes = sizes
        self.is_done = False
        self.value: RecordMetadata | None = None
        self.exception: BaseException | None = None
        self._event: threading.Event | None = None  # made when someone waits
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Any], Any]] = []
        self._errbacks: list[Callable[[BaseException], Any]] = []

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def retriable(self) -> bool:
        return self.failed() and bool(getattr(self.exception, "retriable", False))

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds (None: as long as it takes) for the record's offset."""
        if not self.is_done:
            if self._producer._in_sender():  # a callback's get(): publish here, not wait
                with translated():
                    self._producer._core.drain(self._tp)
            self._producer._request_publish(self._tp)
            if not self._wait(timeout):
                raise KafkaTimeoutError(
                    f"Timeout after waiting for {timeout} secs: the batch of {self._tp.topic}-"
                    f"{self._tp.partition} is not written yet")
        if self.exception is not None:
            raise self.exception
        assert self.value is not None
        return self.value

    def _wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds for the outcome; whether it came."""
        with self._lock:
            if self.is_done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def add_callback(self, f: Callable[..., Any], *args: Any, **kwargs: Any
                     ) -> FutureRecordMetadata:
        fn = (lambda v: f(*args, v, **kwargs)) if args or kwargs else f
        with self._lock:
            if not self.is_done:
                self._callbacks.append(fn)
                return self
        if self.exception is None:
            _call(fn, self.value)
        return self

    def add_errback(self, f: Callable[..., Any], *args: Any, **kwargs: Any
                    ) -> FutureRecordMetadata:
        fn = (lambda e: f(*args, e, **kwargs)) if args or kwargs else f
        with self._lock:
            if not self.is_done:
                self._errbacks.append(fn)
                return self
        if self.exception is not None:
            _call(fn, self.exception)
        return self

    def add_both(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        self.add_callback(f, *args, **kwargs)
        return self.add_errback(f, *args, **kwargs)

    def _success(self, native: Any) -> None:
        key_size, value_size, header_size = self._sizes
        value = RecordMetadata(native.topic, native.partition, self._tp, native.offset,
                               native.timestamp, None, key_size, value_size, header_size)
        self._complete(value, None)

    def _failure(self, error: BaseException) -> None:
        self._complete(None, kafka_error_for(error) or error)

    def _complete(self, value: RecordMetadata | None, error: BaseException | None) -> None:
        with self._lock:
            if self.is_done:
                return
            self.value, self.exception, self.is_done = value, error, True
            callbacks = self._callbacks if error is None else self._errbacks
            self._callbacks, self._errbacks = [], []
            event = self._event
        if event is not None:
            event.set()
        self._producer._forget(self)
        for fn in callbacks:
            _call(fn, value if error is None else error)


def _call(fn: Callable[[Any], Any], arg: Any) -> None:
    try:
        fn(arg)
    except Exception:  # a user's callback must not break the publishing thread
        logger.exception("error in a producer future's callback")


class KafkaProducer:
    """kafka-python's ``KafkaProducer`` on a txlog root (``bootstrap_servers``).

    Safe to share between threads.  docs/clients.md lists what each
    configuration key means here and what differs from Kafka.
    """

    def __init__(self, **configs: Any) -> None:
        self.config = resolve("KafkaProducer", PRODUCER_CONFIG, configs)
        self._key_serializer = codec(self.config["key_serializer"], "serialize",
                                     "key_serializer")
        self._value_serializer = codec(self.config["value_serializer"], "serialize",
                                       "value_serializer")
        log = open_log("KafkaProducer", self.config["bootstrap_servers"],
                       self.config["storage_options"])
        with translated():
            self._core = Producer(
                log, enable_idempotence=self.config["enable_idempotence"],
                transactional_id=self.config["transactional_id"],
                transaction_timeout_ms=self.config["transaction_timeout_ms"],
                batch_size=self.config["batch_size"], linger_ms=self.config["linger_ms"],
                # compression, not compression_type: kafka-python's None (uncompressed) is
                # the core's None too, where an omitted compression_type is the default.
                compression=self.config["compression_type"],
                metrics_num_samples=self.config["metrics_num_samples"],
                metrics_sample_window_ms=self.config["metrics_sample_window_ms"],
                allow_auto_create_topics=bool(self.config["allow_auto_create_topics"]))
        self._lock = threading.RLock()  # every call into the native producer
        self._signal = threading.Condition()  # the sender's wake-ups; never held with _lock
        self._work = False
        self._stopping = False
        self._urgent: set[TopicPartition] = set()
        self._wake_at: float | None = None  # when the sender means to look again (under _lock)
        self._outstanding: set[FutureRecordMetadata] = set()
        self._outstanding_lock = threading.Lock()
        self._closed = False
        self._sender = threading.Thread(target=self._run_sender, daemon=True,
                                        name=f"txlog-kafka-producer-{id(self):x}")
        self._sender.start()
        self._at_exit = _close_at_exit(weakref.ref(self))
        atexit.register(self._at_exit)

    # --- sending --------------------------------------------------------------------------

    @translating
    def send(self, topic: str, value: Any = None, key: Any = None,
             headers: list[tuple[str, bytes]] | None = None, partition: int | None = None,
             timestamp_ms: int | None = None) -> FutureRecordMetadata:
        """Queue one record; kafka-python's argument order (headers before partition)."""
        if self._closed:
            raise IllegalStateError("KafkaProducer already closed!")
        if value is None and key is None:
            raise ValueError("Need at least one: key or value")
        if headers is None:
            headers = []
        if not isinstance(headers, list):
            raise TypeError("headers must be list-type")
        if not all(isinstance(h, tuple) and len(h) == 2 and isinstance(h[0], str)
                   and isinstance(h[1], bytes) for h in headers):
            raise TypeError("All headers items must be (str, bytes) tuples")
        key_bytes = key if self._key_serializer is None else \
            self._key_serializer(topic, headers, key)
        value_bytes = value if self._value_serializer is None else \
            self._value_serializer(topic, headers, value)
        for what, data in (("key", key_bytes), ("value", value_bytes)):
            if type(data) not in (bytes, bytearray, memoryview, type(None)):
                raise TypeError(f"Unsupported type for serialized {what}: {type(data)}")
        sizes = (-1 if key_bytes is None else len(key_bytes),
                 -1 if value_bytes is None else len(value_bytes),
                 sum(len(k.encode("utf-8")) + len(v) for k, v in headers) if headers else -1)
        with self._lock:
            native = self._core.send(topic, value_bytes, key_bytes, partition=partition,
                                     headers=headers, timestamp_ms=timestamp_ms)
            future = FutureRecordMetadata(self, TopicPartition(topic, native.partition), sizes)
            with self._outstanding_lock:
                self._outstanding.add(future)
            native.add_callback(future._success)
            native.add_errback(future._failure)
            due = self._core.next_due()
            if due is not None and (self._wake_at is None or due < self._wake_at):
                self._wake_sender()
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Publish every record sent so far and wait for them (``timeout`` in seconds).

        As in kafka-python, a record that failed does not make ``flush``
        raise: its future holds the error (and a warning is logged).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._in_sender():  # from a callback: the sender cannot also publish for us
            try:
                with translated():
                    self._core.flush()
            except KafkaError:
                pass  # the futures hold it; reported below
        with self._outstanding_lock:
            waiting = list(self._outstanding)
        if not waiting:
            return
        self._request_publish(None)
        for future in waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not future._wait(left):
                raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs: records "
                                        "are still being written")
        failed = [f for f in waiting if f.exception is not None]
        if failed:
            logger.warning("flush: %d record(s) failed; their futures hold the errors (first: "
                           "%s)", len(failed), failed[0].exception)

    def close(self, timeout: float | None = None, null_logger: bool = False) -> None:
        """Publish what is pending (outside an open transaction) and stop the sender.

        An open transaction is left to its coordinator, which aborts it after
        ``transaction_timeout_ms`` unless a new instance of the same
        transactional_id aborts it first (init_transactions).  The last
        commit's markers are waited for up to ``timeout`` (docs/clients.md,
        "Commit and close").
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        with self._signal:
            self._stopping = True
            self._signal.notify_all()
        if not self._in_sender():  # close() from a callback: the sender ends after it
            self._sender.join(timeout)
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise KafkaTimeoutError(f"close: another thread is still writing after {timeout} "
                                    "secs")
        try:
            with translated():
                self._core.close(timeout)
        finally:
            self._lock.release()
            with self._outstanding_lock:
                left = list(self._outstanding)
            for future in left:
                future._failure(KafkaError(
                    "the producer was closed before this record was written (an open "
                    "transaction's records are never written by close())"))

    def __enter__(self) -> KafkaProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @translating
    def partitions_for(self, topic: str) -> set[int]:
        with self._lock:
            return self._core.partitions_for(topic)

    def bootstrap_connected(self) -> bool:
        return True

    def metrics(self, raw: bool = False) -> dict[Any, Any] | None:
        """kafka-python's ``{'producer-metrics': {name: value}}``, taken as kafka-python
        takes them (clients/metrics.py); None with ``metrics_enabled=False``, as kafka-python."""
        if not self.config["metrics_enabled"]:
            return None
        return self._core.metrics(raw)

    # --- transactions ---------------------------------------------------------------------

    def _transactional(self, what: str) -> None:
        if self.config["transactional_id"] is None:
            raise IllegalStateError(f"Cannot {what} without setting a transactional_id.")

    @translating
    def init_transactions(self) -> None:
        self._transactional("call init_transactions")
        with self._lock:
            self._core.init_transactions()

    @translating
    def begin_transaction(self) -> None:
        self._transactional("use transactional methods")
        with self._lock:
            self._core.begin_transaction()

    @translating
    def send_offsets_to_transaction(self, offsets: dict[Any, Any],
                                    group_metadata: ConsumerGroupMetadata | str) -> None:
        """Offsets committed for the group if, and only if, the transaction commits.

        ``offsets`` maps each ``TopicPartition`` to an ``OffsetAndMetadata``
        (or an int); ``group_metadata`` is the consumer's ``group_metadata()``
        or a bare group id.
        """
        self._transactional("use transactional methods")
        if isinstance(group_metadata, str):
            group_metadata = ConsumerGroupMetadata(group_id=group_metadata)
        if not isinstance(group_metadata, ConsumerGroupMetadata) or \
                not group_metadata.group_id:
            raise KafkaConfigurationError(
                "send_offsets_to_transaction: group_metadata must be the consumer's "
                f"group_metadata() or a group id, not {group_metadata!r}")
        native = plain_offsets(offsets, "send_offsets_to_transaction")
        with self._lock:
            # KIP-447: a member's generation fences the offsets; a bare group id
            # (generation -1, no member id) commits unfenced, as in Kafka.
            self._core.send_offsets_to_transaction(
                native, group_metadata.group_id, member_id=group_metadata.member_id or None,
                generation=group_metadata.generation_id)

    @translating
    def commit_transaction(self) -> None:
        self._transactional("commit transaction since transactions are not enabled")
        with self._lock:
            self._core.commit_transaction()

    @translating
    def abort_transaction(self) -> None:
        self._transactional("abort transaction since transactions are not enabled")
        with self._lock:
            self._core.abort_transaction()

    # --- the sender -----------------------------------------------------------------------

    def _in_sender(self) -> bool:
        """Whether this is the sender thread (a callback), which holds the lock already."""
        return threading.current_thread() is self._sender

    def _wake_sender(self) -> None:
        with self._signal:
            self._work = True
            self._signal.notify()

    def _request_publish(self, tp: TopicPartition | None) -> None:
        """Have the sender publish ``tp``'s pending batch (None: every pending batch)."""
        with self._signal:
            self._urgent.add(tp)  # type: ignore[arg-type]
            self._work = True
            self._signal.notify()

    def _forget(self, future: FutureRecordMetadata) -> None:
        with self._outstanding_lock:
            self._outstanding.discard(future)

    def _run_sender(self) -> None:
        sleep: float | None = None
        while True:
            with self._signal:
                if not self._work and not self._stopping:
                    self._signal.wait(sleep)
                self._work = False
                urgent, self._urgent = self._urgent, set()
                if self._stopping:
                    return
            with self._lock:
                try:
                    with translated():
                        if None in urgent:
                            self._core.flush()
                        else:
                            for tp in urgent:
                                self._core.drain(tp)
                        self._core.drain_due()
                except Exception as exc:  # the failed records' futures hold it
                    logger.warning("publishing a batch failed: %s: %s", type(exc).__name__, exc)
                due = self._core.next_due()
                self._wake_at = due
            sleep = None if due is None else max(0.0, due - time.monotonic())


def _close_at_exit(ref: weakref.ReferenceType[KafkaProducer]) -> Callable[[], None]:
    """What kafka-python does at interpreter exit: close, so sent records are written."""

    def close() -> None:
        producer = ref()
        if producer is not None:
            producer.close()

    return close
