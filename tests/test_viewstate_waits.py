"""A claim that waits (QueueView.wait_for_change) computes its timeout once,
from the deadlines a waiting claim wakes for (ViewState.until_due), and is
woken only by a change of ViewState.version.  So a waking deadline of
DEADLINES that an event plans during the wait must change the version
(ViewState.note_deadlines, which the driver calls after every change), or the
wait sleeps past it (docs/protocol.md, "Deadlines": a waiting claim wakes for
the first orphan due and for the confirm check).  Fed to the state with no
etcd and no threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

import random
from typing import Optional

from etcdq_v2.versions import Entry
from etcdq_v2.viewstate import ViewState

from test_viewstate import event, item_id, lock_value, ready_state, value


def _wakes_by(state: ViewState, version: int, timeout: Optional[float], since: float,
              due: float) -> bool:
    """Whether a claim that began waiting at ``since`` with ``timeout`` (None:
    forever) on ``version`` is awake by ``due``."""
    return state.version != version or (timeout is not None and since + timeout <= due + 0.01)


def test_a_claim_waiting_when_an_orphan_is_noted_wakes_by_its_due() -> None:
    x = item_id(2)
    state, round_ = ready_state([(x, 2, value("a"))], watching=True)
    floors = {"work": 2, "locks": 2}
    state.apply_block(round_, event("create", "locks", x, 3, lock_value()), floors, 0.0)
    version, timeout = state.version, state.until_due(1.0, None)  # nothing free: it waits
    state.apply_block(round_, event("create", "completed", x, 4, "{}"), floors, 2.0)
    state.apply_block(round_, event("delete", "locks", x, 5), floors, 2.0)  # F4, F3 lost
    state.note_deadlines()  # as the driver does after every change
    due = state.orphans[x]
    assert _wakes_by(state, version, timeout, 1.0, due), (
        f"the orphan is due at {due:g}; the waiting claim sleeps on (timeout {timeout})")


def test_a_claim_waiting_when_a_confirm_check_is_planned_wakes_for_it() -> None:
    """Another claimer of the process loses a race for X at an index before
    the watching listing (C2 found X claimed there): that lock may have gone
    unheard, so the check is planned CONFIRM later; a claimer already waiting
    must wake for it, or X stays taken in the view until the round's end."""
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))])
    round_ = state.new_round(watching=True)
    assert round_ is not None
    work = [Entry(x, 2, value("a")), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, work)
    assert state.apply_round(round_, (5, work), plan, (5, []), [], 10.0, 0.0)
    found, _ = state.pick(1, random.Random(0))
    assert found is not None and found[0] == x
    found, _ = state.pick(1, random.Random(0))
    assert found is not None and found[0] == y
    state.locked_at(y, 6)  # ours: nothing free left, a claimer waits
    version, timeout = state.version, state.until_due(11.0, None)
    state.locked_at(x, 4, now=12.0)  # the other claimer's lost race, before the listing
    state.note_deadlines()  # as the driver does after every change
    assert state.confirm_at < float("inf")
    assert _wakes_by(state, version, timeout, 11.0, state.confirm_at), (
        f"the confirm check is due at {state.confirm_at:g}; the waiting claim sleeps on")

