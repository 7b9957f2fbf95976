"""The marks of items that left work/ (ViewState.left) cover every version
this process wrote of a finished item (its C2, its F1), and hide an item
that did not finish for no longer than one listing.

Unit tests of the state's transitions (no etcd, no threads), as
tests/test_viewstate_left_marks.py.
"""

from __future__ import annotations

import pytest

from etcdq_v2.codec import Item
from etcdq_v2.versions import Entry

from test_viewstate import event, free_ids, item_id, ready_state, value


def committed(token: str, claim: str) -> str:
    """The item's value after F1: the record plus "o"."""
    return Item(payload={"n": token}, token=token, claim=claim, outcome="completed",
                created=0.0).encode()


def test_a_finished_item_listed_at_its_own_commits_version_is_not_offered_again() -> None:
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))])
    at = state.known
    round_ = state.new_round(watching=False, list_locks=True)
    assert round_ is not None
    # The round's listing of work/ is sent.  This process claims x: C1 (lock
    # at at+1), C2 (x at at+2, with our claim token).
    state.taken(x)
    state.locked_at(x, at + 2)
    # F1 commits x at at+3.  The listing of work/ is read at etcd now.
    listing = [Entry(x, at + 3, committed("a", "c" * 24)), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, listing)
    # F2, F3, F4 (the lock removed at at+6): finished here, F1's index told.
    state.finished(x, at + 3)
    # The round's listing of locks/ is read after F4: no lock of x.
    assert state.apply_round(round_, (at + 3, listing), plan, (at + 6, []), [], 1.0, 0.0)
    assert free_ids(state) == [y], f"the finished {x} is offered again: {free_ids(state)}"


@pytest.mark.xfail(strict=True, reason=(
    "wrote keeps our claim's C2 index from before etcd's index went back (take_listing "
    "filters it by id only; lockback's index_went_back does not drop it either): the "
    "left mark takes max(held, wrote) across histories and hides the item written "
    "again below it; its event is below the listing's floor, so it waits a ROUND"))
def test_an_item_written_again_after_the_index_went_back_is_offered_by_the_next_listing() -> None:
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))], watching=True)
    # This process claims x: its C2 at 1000 (others wrote much meanwhile).
    state.taken(x)
    state.locked_at(x, 1000)
    # etcd restarts without its data; the claim is lost.  A new round lists
    # the new history at 6: x (id 2 given again) and y.
    round_ = state.new_round(watching=True, list_locks=True)
    assert round_ is not None
    listing = [Entry(x, 2, value("a'")), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, listing)
    assert state.apply_round(round_, (6, listing), plan, (6, []), [], 1.0, 0.0)
    # The next round begins: its listing of work/ is sent.  A claim of ours
    # finds x gone (another consumer finished it at 8).
    round_ = state.new_round(watching=True, list_locks=True)
    assert round_ is not None
    state.finished(x)
    # x is written again at 9 (a late Q3 copy); the listing is read after it.
    again = value("a2", requeued=True)
    listing = [Entry(x, 9, again), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, listing)
    assert state.apply_round(round_, (9, listing), plan, (9, []), [], 2.0, 0.0)
    floors = {"work": 9, "locks": 9}
    state.apply_block(round_, event("create", "work", x, 9, again), floors, 2.0)
    assert x in free_ids(state), f"x, in work/ at 9, is not offered: {free_ids(state)}"
