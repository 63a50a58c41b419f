"""The coordinator's chain records keep their encoding, byte for byte.

Executors and drivers of different versions share one root: every record a
newer txlog writes must be the bytes the older one wrote for the same value.
The constants below were written by the code at ac32820 (before the records
were typed), in one scenario under a fixed clock: a transaction that joins
two partitions and a group's offsets, commits, then aborts, and expires; a
group's offsets edited by every kind of version; a stream sink taken from
the days before owners, then over; an app's numbered write.  Each is decoded
to its record and encoded again; each named transition, run under the
writer's clock, must give the next version's bytes, or change only what it
names.
"""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

import txlog.clock
from txlog.errors import InvalidTxnStateError
from txlog.exactly_once.app_versions import CommittedVersion
from txlog.exactly_once.stream_sink import SinkOwner, batch_key
from txlog.transactions.groups import NO_GROUP, GroupOffsets, PendingSend, TxnMark
from txlog.transactions.metadata import (Decision, Lease, TransactionMember,
                                         TransactionMetadata, TxnState)

# Written by the code at ac32820 (see the module's docstring).
META_INIT = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "00a57374617465a5456d707479aa74696d656f75745f6d73cdea60aa706172746974696f6e7390af7065"
    "6e64696e675f6f66667365747380ac74786e5f73746172745f6d73ffa97570646174655f6d73cf000001"
    "9b76daa81cab6465636973696f6e5f6964a0af74786e5f70726f64756365725f6964ffa974786e5f6570"
    "6f6368ffa6726561736f6ea4696e6974ae696e6361726e6174696f6e5f6d73cf0000019b76daa81c")
META_JOINED = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "00a57374617465a74f6e676f696e67aa74696d656f75745f6d73cdea60aa706172746974696f6e739192"
    "a17400af70656e64696e675f6f66667365747380ac74786e5f73746172745f6d73cf0000019b76daa83f"
    "a97570646174655f6d73cf0000019b76daa846ab6465636973696f6e5f6964a3302d30af74786e5f7072"
    "6f64756365725f696400a974786e5f65706f636800a6726561736f6ea0ae696e6361726e6174696f6e5f"
    "6d73cf0000019b76daa81c")
META_TWO_PARTITIONS = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "00a57374617465a74f6e676f696e67aa74696d656f75745f6d73cdea60aa706172746974696f6e739292"
    "a1740092a17401af70656e64696e675f6f66667365747380ac74786e5f73746172745f6d73cf0000019b"
    "76daa83fa97570646174655f6d73cf0000019b76daa862ab6465636973696f6e5f6964a3302d30af7478"
    "6e5f70726f64756365725f696400a974786e5f65706f636800a6726561736f6ea0ae696e6361726e6174"
    "696f6e5f6d73cf0000019b76daa81c")
META_WITH_OFFSETS = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "00a57374617465a74f6e676f696e67aa74696d656f75745f6d73cdea60aa706172746974696f6e739292"
    "a1740092a17401af70656e64696e675f6f66667365747381a36772709293a174000593a1740108ac7478"
    "6e5f73746172745f6d73cf0000019b76daa83fa97570646174655f6d73cf0000019b76daa88cab646563"
    "6973696f6e5f6964a3302d30af74786e5f70726f64756365725f696400a974786e5f65706f636800a672"
    "6561736f6ea0ae696e6361726e6174696f6e5f6d73cf0000019b76daa81c")
META_PREPARE_COMMIT = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "00a57374617465ad50726570617265436f6d6d6974aa74696d656f75745f6d73cdea60aa706172746974"
    "696f6e739292a1740092a17401af70656e64696e675f6f66667365747381a36772709293a174000593a1"
    "740108ac74786e5f73746172745f6d73cf0000019b76daa83fa97570646174655f6d73cf0000019b76da"
    "a8c4ab6465636973696f6e5f6964a3302d30af74786e5f70726f64756365725f696400a974786e5f6570"
    "6f636800a6726561736f6ea0ae696e6361726e6174696f6e5f6d73cf0000019b76daa81c")
META_COMPLETE_COMMIT = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "01a57374617465ae436f6d706c657465436f6d6d6974aa74696d656f75745f6d73cdea60aa7061727469"
    "74696f6e7390af70656e64696e675f6f66667365747380ac74786e5f73746172745f6d73cf0000019b76"
    "daa83fa97570646174655f6d73cf0000019b76daa8fcab6465636973696f6e5f6964a3302d30af74786e"
    "5f70726f64756365725f696400a974786e5f65706f636800a6726561736f6ea0ae696e6361726e617469"
    "6f6e5f6d73cf0000019b76daa81c")
META_SECOND_TXN = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "01a57374617465a74f6e676f696e67aa74696d656f75745f6d73cdea60aa706172746974696f6e739192"
    "a17400af70656e64696e675f6f66667365747380ac74786e5f73746172745f6d73cf0000019b76daa911"
    "a97570646174655f6d73cf0000019b76daa918ab6465636973696f6e5f6964a3302d31af74786e5f7072"
    "6f64756365725f696400a974786e5f65706f636801a6726561736f6ea0ae696e6361726e6174696f6e5f"
    "6d73cf0000019b76daa81c")
META_PREPARE_ABORT = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "01a57374617465ac5072657061726541626f7274aa74696d656f75745f6d73cdea60aa70617274697469"
    "6f6e739192a17400af70656e64696e675f6f66667365747380ac74786e5f73746172745f6d73cf000001"
    "9b76daa911a97570646174655f6d73cf0000019b76daa93bab6465636973696f6e5f6964a3302d31af74"
    "786e5f70726f64756365725f696400a974786e5f65706f636801a6726561736f6ea0ae696e6361726e61"
    "74696f6e5f6d73cf0000019b76daa81c")
META_COMPLETE_ABORT = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "02a57374617465ad436f6d706c65746541626f7274aa74696d656f75745f6d73cdea60aa706172746974"
    "696f6e7390af70656e64696e675f6f66667365747380ac74786e5f73746172745f6d73cf0000019b76da"
    "a911a97570646174655f6d73cf0000019b76daa957ab6465636973696f6e5f6964a3302d31af74786e5f"
    "70726f64756365725f696400a974786e5f65706f636801a6726561736f6ea0ae696e6361726e6174696f"
    "6e5f6d73cf0000019b76daa81c")
META_DEAD = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964a474782d61ab70726f64756365725f696400a565706f6368"
    "02a57374617465a444656164aa74696d656f75745f6d73cdea60aa706172746974696f6e7390af70656e"
    "64696e675f6f66667365747380ac74786e5f73746172745f6d73cf0000019b76daa911a9757064617465"
    "5f6d73cf0000019b76daabaaab6465636973696f6e5f6964a3302d31af74786e5f70726f64756365725f"
    "696400a974786e5f65706f636801a6726561736f6eb87472616e73616374696f6e616c20696420657870"
    "69726564ae696e6361726e6174696f6e5f6d73cf0000019b76daa81c")
META_SHARED_MEMBER = bytes.fromhex(
    "8eb07472616e73616374696f6e616c5f6964ad74786e2d6170702d312d302d30ab70726f64756365725f"
    "696401a565706f636800a57374617465a74f6e676f696e67aa74696d656f75745f6d73cdea60aa706172"
    "746974696f6e739192a17400af70656e64696e675f6f66667365747380ac74786e5f73746172745f6d73"
    "cf0000019b76daaaa7a97570646174655f6d73cf0000019b76daaaaeab6465636973696f6e5f6964d92a"
    "74786e2d6170702d312e3030303030303030303030303030303030303030303030303030303030303234"
    "af74786e5f70726f64756365725f696401a974786e5f65706f636800a6726561736f6ea0ae696e636172"
    "6e6174696f6e5f6d73cf0000019b76daaa92")
DECISION_COMMIT = bytes.fromhex(
    "84a76f7574636f6d65a6434f4d4d4954a76d656d6265727391920000a774696d655f6d73cf0000019b76"
    "daa8b6a6726561736f6ea6456e6454786e")
DECISION_ABORT = bytes.fromhex(
    "84a76f7574636f6d65a541424f5254a76d656d6265727390a774696d655f6d73cf0000019b76daa92da6"
    "726561736f6ea6456e6454786e")
DECISION_SHARED = bytes.fromhex(
    "84a76f7574636f6d65a6434f4d4d4954a76d656d6265727392920100920200a774696d655f6d73cf0000"
    "019b76daab10a6726561736f6eaf456e6454786e202873686172656429")
LEASE = bytes.fromhex("81a774696d655f6d73cf0000019b76daaa6f")
GROUP_COMMITTED = bytes.fromhex(
    "83a76f6666736574739293a174000593a1740107a974786e5f6d61726b7380a774696d655f6d73cf0000"
    "019b76daa96c")
GROUP_INT_MARK = bytes.fromhex(
    "83a76f6666736574739293a174000993a1740107a974786e5f6d61726b7381a674782d6f6c6403a77469"
    "6d655f6d73cf0000019b76daa981")
GROUP_REGISTERED = bytes.fromhex(
    "85a76f6666736574739293a174000993a1740107a974786e5f6d61726b7381a674782d6f6c6403a77469"
    "6d655f6d73cf0000019b76daa996aa67656e65726174696f6e04ac70656e64696e675f74786e7381a474"
    "782d62950b0204a36d2d319292a1740092a17401")
GROUP_TWO_PENDING = bytes.fromhex(
    "85a76f6666736574739293a174000993a1740107a974786e5f6d61726b7381a674782d6f6c6403a77469"
    "6d655f6d73cf0000019b76daa9abaa67656e65726174696f6e04ac70656e64696e675f74786e7382a474"
    "782d62950b0204a36d2d319292a1740092a17401a474782d63950c0004a36d2d329192a17401")
GROUP_PENDING_MERGED = bytes.fromhex(
    "85a76f6666736574739293a174000993a1740107a974786e5f6d61726b7381a674782d6f6c6403a77469"
    "6d655f6d73cf0000019b76daa9c0aa67656e65726174696f6e04ac70656e64696e675f74786e7382a474"
    "782d62950b0204a36d2d319292a1740092a17401a474782d63950c0004a36d2d329292a1740092a17401")
GROUP_PAIR_MARK = bytes.fromhex(
    "85a76f6666736574739293a174000993a174010aa974786e5f6d61726b7382a674782d6f6c6403a47478"
    "2d6292cf0000019b76daa87b06a774696d655f6d73cf0000019b76daa9d5aa67656e65726174696f6e04"
    "ac70656e64696e675f74786e7381a474782d63950c0004a36d2d329292a1740092a17401")
GROUP_MEMBER_COMMIT = bytes.fromhex(
    "85a76f6666736574739293a174000c93a174010aa974786e5f6d61726b7382a674782d6f6c6403a47478"
    "2d6292cf0000019b76daa87b06a774696d655f6d73cf0000019b76daa9eaaa67656e65726174696f6e05"
    "ac70656e64696e675f74786e7381a474782d63950c0004a36d2d329292a1740092a17401")
GROUP_TOMBSTONE = bytes.fromhex(
    "86a76f66667365747390a974786e5f6d61726b7382a674782d6f6c6403a474782d6292cf0000019b76da"
    "a87b06a774696d655f6d73cf0000019b76daa9ffaa67656e65726174696f6e05ac70656e64696e675f74"
    "786e7381a474782d63950c0004a36d2d329292a1740092a17401a764656c65746564c3")
SINK_LEGACY = bytes.fromhex(
    "83a76f6666736574739193a65f62617463680003a974786e5f6d61726b7380a774696d655f6d73cf0000"
    "019b76daaa14")
SINK_CLAIMED = bytes.fromhex(
    "84a76f6666736574739193ae5f62617463682e71756572792d310003a974786e5f6d61726b7380a77469"
    "6d655f6d73cf0000019b76daaa29a56f776e6572a771756572792d31")
SINK_TAKEN_OVER = bytes.fromhex(
    "84a76f6666736574739193ae5f62617463682e71756572792d310003a974786e5f6d61726b7380a77469"
    "6d655f6d73cf0000019b76daaa3ea56f776e6572a771756572792d32")
APP_CLAIMED = bytes.fromhex(
    "84a76f66667365747390a974786e5f6d61726b7380a774696d655f6d73cf0000019b76daaa53a56f776e"
    "6572a56170702d31")
APP_VERSION_4 = bytes.fromhex(
    "84a76f6666736574739193ac5f62617463682e6170702d310005a974786e5f6d61726b7381ae74786e2d"
    "6170702d312d73696e6b92cf0000019b76daaad802a774696d655f6d73cf0000019b76daab6ba56f776e"
    "6572a56170702d31")


def meta(raw: bytes) -> TransactionMetadata:
    return TransactionMetadata.from_dict(msgpack.unpackb(raw, strict_map_key=False))


def group(raw: bytes) -> GroupOffsets:
    return GroupOffsets.from_value(msgpack.unpackb(raw, strict_map_key=False))


def at(monkeypatch: pytest.MonkeyPatch, now_ms: int) -> None:
    """The clock of the writer of the version the transition must reproduce."""
    monkeypatch.setattr(txlog.clock, "now_ms", lambda: now_ms)


# --- transaction metadata ------------------------------------------------------------------

METADATA = [META_INIT, META_JOINED, META_TWO_PARTITIONS, META_WITH_OFFSETS, META_PREPARE_COMMIT,
            META_COMPLETE_COMMIT, META_SECOND_TXN, META_PREPARE_ABORT, META_COMPLETE_ABORT,
            META_DEAD, META_SHARED_MEMBER]


@pytest.mark.parametrize("raw", METADATA)
def test_metadata_decodes_and_encodes_to_the_same_bytes(raw: bytes) -> None:
    assert msgpack.packb(meta(raw).to_dict()) == raw


def test_metadata_fields_are_read_from_their_keys() -> None:
    m = meta(META_WITH_OFFSETS)
    assert (m.transactional_id, m.producer_id, m.epoch, m.state, m.timeout_ms) == \
        ("tx-a", 0, 0, TxnState.ONGOING, 60_000)
    assert m.partitions == (("t", 0), ("t", 1))
    assert m.pending_offsets == {"grp": {("t", 0): 5, ("t", 1): 8}}
    assert (m.decision_id, m.txn_producer_id, m.txn_epoch) == ("0-0", 0, 0)
    assert m.incarnation_ms == 1767225600028 and not m.is_shared
    assert meta(META_SHARED_MEMBER).is_shared


def test_a_new_incarnation_is_the_init_version(monkeypatch) -> None:
    first = meta(META_INIT)
    at(monkeypatch, first.update_ms)
    fresh = TransactionMetadata.incarnation("tx-a", 0, 60_000, None)
    assert msgpack.packb(fresh.to_dict()) == META_INIT
    # After a Dead version, it sorts after the old incarnation even if the clock did not move.
    dead = meta(META_DEAD)
    again = TransactionMetadata.incarnation("tx-a", 5, 1_000, dead)
    assert again.incarnation_ms == dead.incarnation_ms + 1 and again.producer_id == 5
    assert (again.state, again.epoch, again.reason) == (TxnState.EMPTY, 0, "init")


MEMBER = TransactionMember("tx-a", 0, 0, "0-0")


def test_joining_gives_the_versions_it_gave(monkeypatch) -> None:
    joined = meta(META_JOINED)
    at(monkeypatch, joined.update_ms)
    assert msgpack.packb(meta(META_INIT).joined(
        MEMBER, [("t", 0)], {}, joined.txn_start_ms).to_dict()) == META_JOINED
    at(monkeypatch, meta(META_TWO_PARTITIONS).update_ms)
    assert msgpack.packb(joined.joined(MEMBER, [("t", 1)], {}, 0).to_dict()) == \
        META_TWO_PARTITIONS  # the start of an open transaction stays
    at(monkeypatch, meta(META_WITH_OFFSETS).update_ms)
    offsets = {"grp": {("t", 1): 8, ("t", 0): 5}}
    assert msgpack.packb(meta(META_TWO_PARTITIONS).joined(MEMBER, [], offsets, 0).to_dict()) \
        == META_WITH_OFFSETS
    # Nothing new to hold: no version.
    assert meta(META_WITH_OFFSETS).joined(MEMBER, [("t", 1)], offsets, 0) is None


def test_ending_gives_the_versions_it_gave(monkeypatch) -> None:
    at(monkeypatch, meta(META_PREPARE_COMMIT).update_ms)
    assert msgpack.packb(meta(META_WITH_OFFSETS).prepared(True).to_dict()) == META_PREPARE_COMMIT
    at(monkeypatch, meta(META_COMPLETE_COMMIT).update_ms)
    assert msgpack.packb(meta(META_PREPARE_COMMIT).completed(0, 1, True).to_dict()) == \
        META_COMPLETE_COMMIT
    at(monkeypatch, meta(META_PREPARE_ABORT).update_ms)
    assert msgpack.packb(meta(META_SECOND_TXN).prepared(False).to_dict()) == META_PREPARE_ABORT
    at(monkeypatch, meta(META_COMPLETE_ABORT).update_ms)
    assert msgpack.packb(meta(META_PREPARE_ABORT).completed(0, 2, False).to_dict()) == \
        META_COMPLETE_ABORT
    at(monkeypatch, meta(META_DEAD).update_ms)
    assert msgpack.packb(meta(META_COMPLETE_ABORT).dead().to_dict()) == META_DEAD


def test_fencing_and_bumping_change_what_they_name(monkeypatch) -> None:
    at(monkeypatch, 1767225700000)
    ongoing = meta(META_SECOND_TXN)
    fenced = ongoing.fenced("fenced by a new instance")
    assert fenced == dataclasses.replace(
        ongoing, state=TxnState.PREPARE_EPOCH_FENCE, epoch=ongoing.epoch + 1,
        reason="fenced by a new instance", update_ms=1767225700000)
    idle = meta(META_COMPLETE_COMMIT)
    assert idle.bumped(0, 2, "init", 30_000) == dataclasses.replace(
        idle, state=TxnState.EMPTY, producer_id=0, epoch=2, timeout_ms=30_000, reason="init",
        update_ms=1767225700000)
    assert idle.bumped(7, 0, "fenced by group g").timeout_ms == idle.timeout_ms


@pytest.mark.parametrize("raw, transition", [
    (META_DEAD, TransactionMetadata.dead),
    (META_INIT, lambda m: m.prepared(True)),
    (META_INIT, lambda m: m.completed(0, 1, True)),  # a plain Ongoing one may: 4.2
    (META_COMPLETE_ABORT, lambda m: m.fenced("x")),
])
def test_transitions_refuse_what_the_state_table_refuses(raw, transition) -> None:
    with pytest.raises(InvalidTxnStateError):
        transition(meta(raw))


# --- decisions and leases ------------------------------------------------------------------

@pytest.mark.parametrize("raw", [DECISION_COMMIT, DECISION_ABORT, DECISION_SHARED])
def test_decisions_decode_and_encode_to_the_same_bytes(raw: bytes) -> None:
    assert msgpack.packb(Decision.from_value(msgpack.unpackb(raw)).to_value()) == raw


def test_a_decision_taken_is_the_one_written(monkeypatch) -> None:
    commit = Decision.from_value(msgpack.unpackb(DECISION_COMMIT))
    assert commit.commits(0, 0) and not commit.commits(0, 1)
    at(monkeypatch, commit.time_ms)
    assert msgpack.packb(Decision.taken(True, [(0, 0)], "EndTxn").to_value()) == DECISION_COMMIT
    shared = Decision.from_value(msgpack.unpackb(DECISION_SHARED))
    at(monkeypatch, shared.time_ms)
    assert msgpack.packb(Decision.taken(True, [(2, 0), (1, 0)], "EndTxn (shared)").to_value()) \
        == DECISION_SHARED
    # An ABORT names no member, whatever it was asked with.
    abort = Decision.from_value(msgpack.unpackb(DECISION_ABORT))
    at(monkeypatch, abort.time_ms)
    assert msgpack.packb(Decision.taken(False, [(0, 1)], "EndTxn").to_value()) == DECISION_ABORT
    assert not abort.commits(0, 1)


def test_a_lease_is_renewed_only_when_old_enough() -> None:
    lease = Lease.from_value(msgpack.unpackb(LEASE))
    assert msgpack.packb(lease.to_value()) == LEASE
    assert lease.renewed(lease.time_ms) is None  # not newer
    assert lease.renewed(lease.time_ms + 10) == Lease(lease.time_ms + 10)
    assert lease.renewed(lease.time_ms + 10, unless_younger_than_ms=11) is None
    assert lease.renewed(lease.time_ms + 10, unless_younger_than_ms=10) == \
        Lease(lease.time_ms + 10)


# --- group offsets -------------------------------------------------------------------------

GROUPS = [GROUP_COMMITTED, GROUP_INT_MARK, GROUP_REGISTERED, GROUP_TWO_PENDING,
          GROUP_PENDING_MERGED, GROUP_PAIR_MARK, GROUP_MEMBER_COMMIT, GROUP_TOMBSTONE,
          SINK_LEGACY, SINK_CLAIMED, SINK_TAKEN_OVER, APP_CLAIMED, APP_VERSION_4]


@pytest.mark.parametrize("raw", GROUPS)
def test_group_versions_decode_and_encode_to_the_same_bytes(raw: bytes) -> None:
    assert msgpack.packb(group(raw).to_value()) == raw


def test_marks_are_a_version_or_a_pair() -> None:
    marks = group(GROUP_PAIR_MARK).txn_marks
    assert marks == {"tx-old": TxnMark(0, 3), "tx-b": TxnMark(1767225600123, 6)}
    assert (TxnMark(0, 3).to_value(), TxnMark(1767225600123, 6).to_value()) == \
        (3, [1767225600123, 6])
    # A later incarnation outranks any version of an earlier one.
    assert TxnMark(0, 1_000) < TxnMark(1, 0) and group(GROUP_COMMITTED).mark_of("x") < \
        TxnMark(0, 0)


def test_pending_sends_are_read_by_name() -> None:
    send = group(GROUP_REGISTERED).pending["tx-b"]
    assert send == PendingSend(11, 2, 4, "m-1", (("t", 0), ("t", 1)))
    assert (send.writer, send.key) == ((11, 2), (11, 2, 4))
    assert group(GROUP_TOMBSTONE).deleted and group(GROUP_TOMBSTONE).generation == 5


def test_offset_transitions_give_the_versions_they_gave(monkeypatch) -> None:
    def becomes(new: GroupOffsets | None, raw: bytes) -> None:
        assert new is not None and msgpack.packb(new.to_value()) == raw

    at(monkeypatch, group(GROUP_COMMITTED).time_ms)
    becomes(NO_GROUP.committed({("t", 1): 7, ("t", 0): 5}, None), GROUP_COMMITTED)
    at(monkeypatch, group(GROUP_INT_MARK).time_ms)
    becomes(group(GROUP_COMMITTED).applied("tx-old", {("t", 0): 9}, TxnMark(0, 3), None),
            GROUP_INT_MARK)
    at(monkeypatch, group(GROUP_PAIR_MARK).time_ms)
    becomes(group(GROUP_PENDING_MERGED).applied(
        "tx-b", {("t", 1): 10}, TxnMark(1767225600123, 6), (11, 2)), GROUP_PAIR_MARK)
    at(monkeypatch, group(GROUP_MEMBER_COMMIT).time_ms)
    becomes(group(GROUP_PAIR_MARK).committed({("t", 0): 12}, 5), GROUP_MEMBER_COMMIT)
    at(monkeypatch, group(GROUP_TOMBSTONE).time_ms)
    becomes(group(GROUP_MEMBER_COMMIT).tombstone(), GROUP_TOMBSTONE)


def test_fence_transitions_give_the_versions_they_gave(monkeypatch) -> None:
    def becomes(new: GroupOffsets | None, raw: bytes) -> None:
        assert new is not None and msgpack.packb(new.to_value()) == raw

    at(monkeypatch, group(GROUP_REGISTERED).time_ms)
    becomes(group(GROUP_INT_MARK).registered(
        "tx-b", PendingSend(11, 2, 4, "m-1", (("t", 0), ("t", 1)))), GROUP_REGISTERED)
    at(monkeypatch, group(GROUP_TWO_PENDING).time_ms)
    becomes(group(GROUP_REGISTERED).registered(
        "tx-c", PendingSend(12, 0, 4, "m-2", (("t", 1),))), GROUP_TWO_PENDING)
    at(monkeypatch, group(GROUP_PENDING_MERGED).time_ms)
    one_more = PendingSend(12, 0, 4, "m-2", (("t", 0),))
    becomes(group(GROUP_TWO_PENDING).registered("tx-c", one_more), GROUP_PENDING_MERGED)
    assert group(GROUP_PENDING_MERGED).registered("tx-c", one_more) is None


def test_other_group_transitions_change_what_they_name(monkeypatch) -> None:
    at(monkeypatch, 1767225700000)
    tomb = group(GROUP_TOMBSTONE)
    revived = tomb.without_pending(["tx-c"])
    assert revived == dataclasses.replace(tomb, pending={}, deleted=False, time_ms=1767225700000)
    member_commit = group(GROUP_MEMBER_COMMIT)
    assert member_commit.fenced_at(6) == dataclasses.replace(
        member_commit, generation=6, time_ms=1767225700000)
    assert member_commit.reset({("t", 1): 3}, 7) == dataclasses.replace(
        member_commit, offsets={("t", 0): 12, ("t", 1): 3}, generation=7, time_ms=1767225700000)
    assert member_commit.reset({}, None).generation == 5
    assert member_commit.committed({}, 4).generation == 5  # a fence never goes down
    # A member's commit after a delete starts the group afresh: no owner comes back.
    owned = group(SINK_CLAIMED)
    assert dataclasses.replace(owned, deleted=True).committed({}, None).owner is None


# --- the stream sink's owner and an app's committed version --------------------------------

def test_a_claim_gives_the_versions_it_gave(monkeypatch) -> None:
    legacy = group(SINK_LEGACY)
    claimed = SinkOwner(legacy.live_owner, legacy.offsets).claimed_by("query-1")
    assert claimed == SinkOwner("query-1", {batch_key("query-1"): 3})
    at(monkeypatch, group(SINK_CLAIMED).time_ms)
    assert msgpack.packb(legacy.owned_by("query-1", claimed.offsets).to_value()) == SINK_CLAIMED
    owned = group(SINK_CLAIMED)
    taken = SinkOwner(owned.live_owner, owned.offsets).claimed_by("query-2")
    assert taken == SinkOwner("query-2", owned.offsets)  # an owner's keys stay its own
    at(monkeypatch, group(SINK_TAKEN_OVER).time_ms)
    assert msgpack.packb(owned.owned_by("query-2", taken.offsets).to_value()) == SINK_TAKEN_OVER


def test_an_apps_committed_version_is_its_batch_key_less_one() -> None:
    assert group(APP_CLAIMED).live_owner == "app-1"
    version = CommittedVersion(group(APP_VERSION_4).offsets[batch_key("app-1")])
    assert version.last == 4 and version.covers(4) and not version.covers(5)
    assert CommittedVersion(0).last is None and not CommittedVersion(0).covers(0)
