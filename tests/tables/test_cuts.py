"""The fixed point of consistent cuts, on spans given by hand (no log needed)."""

from __future__ import annotations

from txlog.tables.cuts import PartitionSpans, consistent_cuts


def spans(partition: int, end: int, undecided: int | None = None, **committed: tuple[int, int]
          ) -> PartitionSpans:
    return PartitionSpans(partition, 0, end, dict(committed), undecided)


def test_nothing_undecided_cuts_at_the_ends():
    assert consistent_cuts([spans(0, 10, T=(2, 5)), spans(1, 7, T=(0, 3))]) == {0: 10, 1: 7}


def test_a_committed_transaction_straddling_an_undecided_one_goes_whole():
    # T began at 2, an undecided transaction at 4, T's last batch ends at 6: the LSO (4)
    # would hold T's first batches and not its last.
    assert consistent_cuts([spans(0, 10, undecided=4, T=(2, 6))]) == {0: 2}


def test_exclusion_cascades_across_partitions_until_nothing_moves():
    # T is cut off in 1 (undecided at 3), so it leaves 0 too (cut 5), which cuts U off
    # in 0, so U leaves 2 as well.
    cuts = consistent_cuts([spans(0, 20, T=(5, 8), U=(4, 9)),
                            spans(1, 20, undecided=3, T=(6, 7)),
                            spans(2, 20, U=(10, 12), V=(1, 2))])
    assert cuts == {0: 4, 1: 3, 2: 10}
