"""A listing of work/ under way while this process claimed and finished an
item does not offer that item again, also when it was read after the claim's
C2 (or F1) wrote a version of the item the view never held (ViewState.left
marks the version the view held; docs/guarantees.md, "Order").

Unit tests of the state's transitions (no etcd, no threads), as
tests/test_viewstate_left_marks.py.
"""

from __future__ import annotations

import pytest

from etcdq_v2.versions import Entry

from test_viewstate import free_ids, item_id, ready_state, value


@pytest.mark.xfail(strict=True, reason=(
    "forget() marks the index of the version the view held (the listed one); "
    "a listing sent before the finish but read after our own C2 shows the "
    "claim's newer version, which the mark does not hide: the finished item "
    "is offered again once the round's listing of locks/ (read after F4) "
    "lacks its lock"))
def test_a_finished_item_listed_at_its_own_claims_version_is_not_offered_again() -> None:
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))])
    at = state.known
    round_ = state.new_round(watching=False, list_locks=True)
    assert round_ is not None
    # The round's listing of work/ is sent.  This process claims x: C1 (lock
    # at at+1), C2 (x at at+2, with our claim token).
    state.taken(x)
    state.locked_at(x, at + 2)
    # The listing of work/ is read at etcd now: x at at+2, claimed.
    claimed = value("a", claim="c" * 24)
    listing = [Entry(x, at + 2, claimed), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, listing)
    # F1 (at+3), F2, F3, F4 (the lock removed at at+6): finished here.
    state.finished(x)
    # The round's listing of locks/ is read after F4: no lock of x.
    assert state.apply_round(round_, (at + 2, listing), plan, (at + 6, []), [], 1.0, 0.0)
    assert free_ids(state) == [y], f"the finished {x} is offered again: {free_ids(state)}"
