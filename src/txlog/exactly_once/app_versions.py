"""Idempotent batch writes numbered by an application: Delta's ``txnAppId``/``txnVersion``.

A ``foreachBatch`` function writes each micro-batch as a batch job; after a
crash Spark runs the function again with the same batch id, and only the
writer can tell whether that write already happened.  Delta's rule: the
application names itself (app id) and numbers its writes (version); a write
whose version is at or below the last one committed for that app id writes
nothing, and a higher one commits ``(app id, version)`` in the same
transaction as its records.

This is the stream sink's rule (``stream_sink.StreamSink``) with the app id
in the place of the query id and the version in the place of the batch id,
so it reuses that mechanism rather than adding a second one: the sink
member ``<prefix>-sink`` joins the job's shared transaction carrying
``(_batch.<app id>, 0) -> version + 1`` in group ``<prefix>-sink``, so
"version v is committed" and "its records are visible" are one decision;
the sink member's InitProducerId fences a concurrent writer of the same app
id (at most one of two commits a version), and rolls forward a decided
commit whose driver died before finishing it (the replay then skips).
Versions may skip numbers; the recorded one only ever grows, because a
commit that finds its version at or below it aborts instead.

The prefix must be the same for every write of the app (it names the group
that holds the version), so it defaults to ``txn-<app id>``; the app owns
its prefix as a query owns a stream sink's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidConfigError, InvalidNameError
from ..integers import is_int
from ..storage.names import validate_name
from ..transactions.metadata import TransactionMember
from .shared_transaction import MAX_PREFIX_LENGTH, SharedTransaction
from .stream_sink import BATCH_TOPIC, StreamSink

if TYPE_CHECKING:
    from ..api.log import Log

logger = logging.getLogger(__name__)

PREFIX_HEAD = "txn-"
# The default prefix and the group key ("_batch.<app id>") must stay valid names.
MAX_APP_ID_LENGTH = MAX_PREFIX_LENGTH - len(PREFIX_HEAD)


def check_app_id(app_id: object) -> str:
    """``app_id`` if it can name a prefix and a group key, else InvalidConfigError."""
    try:
        validate_name(app_id, "app id")
    except InvalidNameError as exc:
        raise InvalidConfigError(str(exc)) from None
    assert isinstance(app_id, str)
    if len(app_id) > MAX_APP_ID_LENGTH or len(BATCH_TOPIC) + 1 + len(app_id) > 249:
        raise InvalidConfigError(f"app id {app_id[:20]!r}... is {len(app_id)} characters; at "
                                 f"most {MAX_APP_ID_LENGTH} are allowed")
    return app_id


def check_version(version: object) -> int:
    if not is_int(version) or version < 0:
        raise InvalidConfigError(f"a write's version must be a non-negative integer, "
                                 f"not {version!r}")
    return version


def default_prefix(app_id: str) -> str:
    """The transactional id prefix of app ``app_id`` when none is given: stable across runs."""
    return PREFIX_HEAD + check_app_id(app_id)


@dataclass(frozen=True)
class CommittedVersion:
    """An app's progress as its sink group records it: the offset of
    ``(_batch.<app id>, 0)`` is the version after the last one committed (0 before
    the first), as a stream sink's is the batch id after its last."""

    following: int

    @property
    def last(self) -> int | None:
        """The highest version committed (None before the first)."""
        return self.following - 1 if self.following > 0 else None

    def covers(self, version: int) -> bool:
        """Whether writing ``version`` now would write nothing: it is at or below the last."""
        return self.last is not None and version <= self.last


@dataclass(frozen=True)
class AppVersions:
    """The numbered writes of one app: small and picklable, it travels to every task."""

    app_id: str
    prefix: str
    timeout_ms: int

    def __post_init__(self) -> None:
        check_app_id(self.app_id)

    @property
    def sink(self) -> StreamSink:
        return StreamSink(self.prefix, self.timeout_ms, self.app_id)

    def last_committed(self, log: Log) -> int | None:
        """The highest version committed for this app (None before its first).

        A commit whose decision stands but whose completion was cut short is
        rolled forward first, so its version counts.
        """
        return self._progress(log).last

    def _progress(self, log: Log) -> CommittedVersion:
        """The app's progress (see ``last_committed``)."""
        self.sink.claim(log)
        return CommittedVersion(self.sink.next_batch(log))

    def start(self, log: Log, version: int) -> SharedTransaction | None:
        """The job that writes ``version``, or None (logged) if the version is committed.

        Checked on the driver before any task runs, so a replay writes
        nothing; the commit checks again (a concurrent writer may commit the
        version in between).
        """
        check_version(version)
        committed = self._progress(log)
        if committed.covers(version):
            self._skipped(version, committed.last)
            return None
        return SharedTransaction.start(log, self.prefix, self.timeout_ms)

    def commit(self, log: Log, job: SharedTransaction, version: int,
               members: list[TransactionMember]) -> bool:
        """Commit ``members`` and ``version`` in one decision; False (members aborted, logged)
        if the version is at or below one committed by now."""
        check_version(version)
        if self.sink.commit_batch(log, job, version, members):
            return True
        self._skipped(version, self.last_committed(log))
        return False

    def _skipped(self, version: int, last: int | None) -> None:
        logger.warning("skipping the write of app %s version %d: version %s is committed "
                       "already (prefix %s); nothing of this write is visible", self.app_id,
                       version, last, self.prefix)
