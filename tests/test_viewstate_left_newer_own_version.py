"""A listing of work/ under way while this process claimed and finished an
item does not offer that item again, also when it was read after the claim's
C2 or F1 wrote a version of the item the view never held (ViewState.left
marks the highest index this process wrote; docs/guarantees.md, "Order").

Unit tests of the state's transitions (no etcd, no threads), as
tests/test_viewstate_left_marks.py.
"""

from __future__ import annotations

import pytest

from etcdq_v2.codec import Item
from etcdq_v2.versions import Entry

from test_viewstate import free_ids, item_id, ready_state, value


def committed(token: str, claim: str) -> str:
    """The item's value after F1: the record plus "o"."""
    return Item(payload={"n": token}, token=token, claim=claim, outcome="completed",
                created=0.0).encode()


@pytest.mark.parametrize("write", ["C2", "F1"])
def test_a_finished_item_listed_at_its_own_claims_version_is_not_offered_again(
        write: str) -> None:
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))])
    at = state.known
    round_ = state.new_round(watching=False, list_locks=True)
    assert round_ is not None
    # The round's listing of work/ is sent.  This process claims x: C1 (lock
    # at at+1), C2 (x at at+2, with our claim token).
    state.taken(x)
    state.locked_at(x, at + 2)
    # The listing of work/ is read at etcd now: x at at+2, claimed; or, read
    # after F1, x at at+3, committed.
    if write == "C2":
        shown, listed_at = value("a", claim="c" * 24), at + 2
    else:
        shown, listed_at = committed("a", "c" * 24), at + 3
    listing = [Entry(x, listed_at, shown), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, listing)
    # F1 (at+3), F2, F3, F4 (the lock removed at at+6): finished here, F1's index told.
    state.finished(x, at + 3)
    # The round's listing of locks/ is read after F4: no lock of x.
    assert state.apply_round(round_, (listed_at, listing), plan, (at + 6, []), [], 1.0, 0.0)
    assert free_ids(state) == [y], f"the finished {x} is offered again: {free_ids(state)}"


def test_a_listing_from_before_a_restart_applied_last_does_not_offer_a_finished_item() -> None:
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))])
    round_ = state.new_round(watching=False, list_locks=False)
    assert round_ is not None
    # The round's listing is read at etcd at 1000 (x still there); its reply is slow.
    old = [Entry(x, 2, value("a")), Entry(y, 3, value("b"))]
    state.finished(x)  # this process finished x
    # etcd restarts without its data; a claimer's relist is sent and read at 5
    # (y put again by its producer at 3; x is not there).
    relist = state.start_relist(1.0)
    assert relist is not None
    new = [Entry(y, 3, value("b"))]
    relist_plan = state.plan_relist(relist, new)
    state.apply_relist(relist, (5, new), relist_plan, None, 1.0, 0.0)
    # The round's reply is handed in last.
    plan = state.plan_round(round_, old)
    state.apply_round(round_, (1000, old), plan, None, [], 1.0, 0.0)
    assert x not in free_ids(state), f"the finished {x} is offered again: {free_ids(state)}"
