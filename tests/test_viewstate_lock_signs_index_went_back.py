"""A lock sign the view holds from before etcd's index went back (etcd
restored from an older snapshot, or restarted without its data) does not
keep an item taken for good: once a listing of work/ at the lower index is
applied (docs/protocol.md, "Events and transitions": one sent after the
applied one was read is applied at any index), a listing of locks/ without
the item's lock frees it, as it frees any item (ViewState.reconcile_locks).

Fed to the state with no etcd and no threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

from etcdq_v2.versions import Entry

from test_viewstate import free_ids, item_id, ready_state, value


def test_a_listing_of_locks_without_its_lock_frees_an_item_locked_before_etcd_s_index_went_back(
        ) -> None:
    x = item_id(45)
    state, _ = ready_state([(x, 45, value("x"))])  # listed at 45, free
    state.locked(x, 60)  # another process claimed it: its lock at 60
    assert free_ids(state) == []
    # etcd restored from a snapshot taken at 50: x is there, unclaimed, no lock
    relist = state.start_relist(1.0, full=True)  # once per lock TTL: work/ and locks/
    assert relist is not None
    listed = [Entry(x, 45, value("x"))]
    plan = state.plan_relist(relist, listed)
    state.apply_relist(relist, (50, listed), plan, (50, []), 1.0, 0.0)
    assert state.known == 50  # applied though the index went back
    assert free_ids(state) == [x], (
        f"{x} is in work/ and locks/ has no lock of it at 50, but the view still "
        f"holds it locked at {state.locks.get(x)}")
