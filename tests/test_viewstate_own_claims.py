"""A view does not check the lock signs of this process's own live claims
(ViewState.own: its heartbeat keeps those locks), and checks them as any
other once the claim is disowned: ended, or lost (docs/protocol.md, "A view
that starts watching").  Fed to the state with no etcd and no threads, as
tests/test_viewstate.py does.
"""
from __future__ import annotations

import math
import random
from typing import Tuple

from etcdq_v2.versions import Entry
from etcdq_v2.viewstate import CONFIRM, ViewState

from test_viewstate import item_id, ready_state, value


def _own_claim_then_watching(*, relisted: bool) -> Tuple[ViewState, str]:
    """A quiet view lists X (index 2) and Y (3); this process claims X (C2 at
    4); with ``relisted``, a quiet listing at 5 comes next (X's sign is then
    one the view had at its previous listing).  Then a round that starts
    watching lists at 9.  Returns the state and X."""
    x, y = item_id(2), item_id(3)
    items = [(x, 2, value("a")), (y, 3, value("b"))]
    state, _ = ready_state(items)
    found, _ = state.pick(1, random.Random(0))
    assert found is not None and found[0] == x
    state.locked_at(x, 4, won=True, now=1.0)
    work = [Entry(x, 4, value("a", claim="c" * 24)), Entry(y, 3, value("b"))]
    if relisted:
        relist = state.start_relist(1.0)
        assert relist is not None
        state.apply_relist(relist, (5, work), state.plan_relist(relist, work), None,
                           1.0, 0.0)
    round_ = state.new_round(watching=True)
    assert round_ is not None
    plan = state.plan_round(round_, work)
    assert not plan.read and not plan.list_locks, "the own sign is read or listed at once"
    assert state.apply_round(round_, (9, work), plan, None, [], 2.0, 0.0)
    return state, x


def test_a_view_that_starts_watching_does_not_check_its_own_live_claim() -> None:
    """X's sign (C2 at 4) is up to the watching listing's index: a claim of
    another process's would be checked CONFIRM later; ours is not."""
    for relisted in (False, True):
        state, x = _own_claim_then_watching(relisted=relisted)
        assert x in state.own and x in state.locks
        assert state.confirm_at == math.inf
        assert state.tick(2.0 + CONFIRM) is None


def test_an_own_claim_disowned_while_watching_is_checked_a_confirm_later() -> None:
    """Our claim of X is lost (its lock expired while the process paused, and
    the view was quiet then): disowned, X's sign is checked CONFIRM later, and
    a listing of locks/ without X frees it."""
    state, x = _own_claim_then_watching(relisted=False)
    state.disowned(x, 10.0)
    assert x not in state.own
    assert state.confirm_at == 10.0 + CONFIRM
    assert state.tick(10.0 + CONFIRM) == "confirm"
    state.apply_locks(state.generation, state.relists, (12, []), full=False, history=state.history,
                      now=10.0 + CONFIRM, wall=0.0)
    assert state.is_free(x)


def test_an_own_claim_disowned_during_the_watching_round_is_checked() -> None:
    """Disowned after the round planned its reads (X left out as own) and
    before it applied its listing: the round's own check counts X."""
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))])
    state.pick(1, random.Random(0))
    state.locked_at(x, 4, won=True, now=1.0)
    round_ = state.new_round(watching=True)
    assert round_ is not None
    work = [Entry(x, 4, value("a", claim="c" * 24)), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, work)
    state.disowned(x, 1.5)
    assert state.apply_round(round_, (9, work), plan, None, [], 2.0, 0.0)
    assert state.confirm_at == 2.0 + CONFIRM
    assert state.tick(2.0 + CONFIRM) == "confirm"


def test_an_own_claim_ends_its_trust_however_it_ends() -> None:
    """Finished, given back (at once or with a delay), or lost: X leaves
    ``own``; a delay lock's sign up to the listing is checked as any other."""
    for end in ("finished", "released", "delayed", "lost"):
        state, x = _own_claim_then_watching(relisted=False)
        if end == "finished":
            state.finished(x, 11)
        elif end == "lost":
            state.disowned(x, 10.0)
        else:
            state.returned(x, 3 if end == "delayed" else 0, 11, 10.0)
        assert x not in state.own, end
        if end in ("delayed", "lost"):
            assert state.confirm_at == 10.0 + CONFIRM, end
        else:
            assert state.confirm_at == math.inf, end


def test_a_lost_race_is_not_an_own_claim() -> None:
    """Only a won claim is own: a lost race's sign up to the listing is checked."""
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))], watching=True)
    state.pick(1, random.Random(0))
    state.locked_at(x, 2, now=1.0)
    assert x not in state.own
    assert state.confirm_at == 1.0 + CONFIRM
