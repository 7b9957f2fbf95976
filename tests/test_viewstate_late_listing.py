"""A listing of work/ taken while this process claimed and finished an item,
and applied after, does not offer that item again (docs/protocol.md, "The
view's state": ``items``, ``free``; docs/guarantees.md, "Order": a lone
consumer claims in put order).  Fed to the state with no etcd and no threads,
as tests/test_viewstate.py does.

The race is the one a watching view that goes quiet starts (Switches): the
claim that sees the backlog takes the head while the new quiet round lists
work/ in the follower's thread.
"""
from __future__ import annotations

import random

from etcdq_v2.versions import Entry
from etcdq_v2.viewstate import BACKLOG, Switch

from test_viewstate import item_id, ready_state, value


def test_an_item_finished_while_a_listing_was_under_way_is_not_offered_again() -> None:
    ids = [item_id(i) for i in range(2, 2 + BACKLOG + 4)]
    state, _ = ready_state([(i, int(i), value(i)) for i in ids], watching=True)
    at = state.known
    found, switch = state.pick(1, random.Random(0))
    assert found is not None and found[0] == ids[0]
    assert switch == Switch(watching=False, list_locks=False)
    quiet = state.switch(watching=False, list_locks=switch.list_locks)
    assert quiet is not None
    # The quiet round's listing of work/ is taken now, before the claim's C1.
    listing = [Entry(i, int(i), value(i)) for i in ids]
    plan = state.plan_round(quiet, listing)
    # The claim: C1 at at + 1 (our lock), C2 at at + 2, then F2, F3: finished.
    state.locked_at(ids[0], at + 1)
    state.finished(ids[0])
    # The listing's reply arrives only now.
    assert state.apply_round(quiet, (at, listing), plan, None, [], 1.0, 0.0)
    offered = [i for i, _ in state.candidates(1)[0]]
    assert offered == [ids[1]], f"the finished {ids[0]} is offered again: {offered}"
