"""What the view keeps when a listing of work/ tells that etcd's history
changed (docs/protocol.md, "etcd's history changes"): the signs this process
made in the new history, after that listing was sent, still stand.

Fed to the state with no etcd and no threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

import pytest

from etcdq_v2.codec import Item
from etcdq_v2.versions import Entry
from etcdq_v2.viewstate import MAX_CACHED_VALUE

from test_viewstate import free_ids, item_id, ready_state, value
from test_viewstate_history_changed import relisted


def test_an_item_finished_while_the_listing_that_tells_the_change_is_under_way_stays_gone(
) -> None:
    """The view knew the old etcd up to 100; etcd came back at 10.  A relist is
    sent, and read at 10, before this (lone) consumer claims x on the new
    etcd (C2 at 11) and finishes it (F1 at 12); its reply comes after that.
    Offered x again, the consumer would lose to its own lingering lock
    (**Order**): the left mark made at 12, while the relist was under way, is
    of the new history and must hide x from that relist, as it does when the
    history did not change."""
    x, y = item_id(2), item_id(3)
    listed = [Entry(x, 2, value("x")), Entry(y, 3, value("y"))]
    state, _ = ready_state([(x, 2, value("x")), (y, 3, value("y"))])
    relisted(state, 100, listed, 1.0)  # the old etcd, at 100
    relist = state.start_relist(state.relist_after + 2.0)
    assert relist is not None  # sent to the new etcd, read at 10
    state.taken(x)
    state.locked_at(x, 11)  # our C2 on the new etcd
    state.finished(x, 12)  # our F1
    state.apply_relist(relist, (10, listed), state.plan_relist(relist, listed), None,
                       3.0, 0.0)
    assert state.known == 10, "the relist read at 10 was not applied"
    assert free_ids(state) == [y], f"{x}, finished at 12, is offered: {free_ids(state)}"


def test_a_junk_version_skipped_before_a_restore_does_not_hide_the_new_item_of_its_id(
) -> None:
    """Item ids are etcd indexes, given again after a restore.  The old etcd
    held junk at j (index 50), which a claim skipped; etcd came back at 40, and
    others wrote so much (a producer's item at 50 takes the id j) that the
    view's next listing, at 120, is above every index it knew: it cannot tell
    the history changed.  The item at j is a good one, and no other sign
    keeps it: skipped for good, a lone consumer never claims it."""
    j, y = item_id(50), item_id(3)
    state, _ = ready_state([(y, 3, value("y"))])
    relisted(state, 100, [Entry(y, 3, value("y")), Entry(j, 50, "junk")], 1.0)
    state.skip_version(j, 50, "junk")  # a claim found it junk
    assert free_ids(state) == [y]
    relisted(state, 120, [Entry(y, 3, value("y")), Entry(j, 50, value("j"))], 2.0)
    assert state.history == 0  # nothing tells the change
    assert j in free_ids(state), f"the new item {j} is skipped as the old junk was"


@pytest.mark.xfail(strict=True, reason="a version whose value the view does not hold (over "
                   "MAX_CACHED_VALUE) is skipped by its index alone (the empty digest): "
                   "across histories that hides another write at that index")
def test_a_large_junk_version_skipped_before_a_restore_does_not_hide_the_new_large_item(
) -> None:
    """As above, with values over MAX_CACHED_VALUE: the view holds neither
    value (None), so the claim that found j junk skips the version the view
    offered it, (50, no value).  After the restore the good item at j, as
    large, is held as (50, no value) too: the same pair, skipped for good."""
    j, y = item_id(50), item_id(3)
    big = "x" * (MAX_CACHED_VALUE + 1)
    good = Item(payload={"n": big}, token="j", created=0.0).encode()
    state, _ = ready_state([(y, 3, value("y"))])
    relisted(state, 100, [Entry(y, 3, value("y")), Entry(j, 50, "junk" + big)], 1.0)
    seen = state.version_of(j)
    assert seen is not None and seen.raw is None  # not cached: the view holds no value
    state.skip_version(j, seen.index, seen.raw)  # a claim found it junk (Queue: view.skip)
    assert free_ids(state) == [y]
    relisted(state, 120, [Entry(y, 3, value("y")), Entry(j, 50, good)], 2.0)
    assert state.history == 0  # nothing tells the change
    assert j in free_ids(state), f"the new item {j} is skipped as the old junk was"
