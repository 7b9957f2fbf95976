"""A watching view goes quiet when a claim sees a backlog of BACKLOG free
items (docs/protocol.md, "Modes: quiet and watching"), not free items and
items locked since its listing together.  Fed to the state with no etcd and
no threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

import random
from typing import List, Tuple


from etcdq_v2.viewstate import BACKLOG, Round, Switch, ViewState

from test_viewstate import event, item_id, lock_value, ready_state, value


def test_a_watching_view_with_one_free_item_and_many_running_elsewhere_keeps_watching() -> None:
    """docs/protocol.md, "Modes": a watching view goes quiet when a claim sees
    BACKLOG free items.  Here its listing showed BACKLOG + 8 items, all but
    the head then locked by other consumers (their lock events): one free
    item, and going quiet costs a listing of work/ and locks/ now and a new
    watching round at the next claim, which finds nothing."""
    ids = [item_id(i) for i in range(2, 2 + BACKLOG + 8)]
    state, round_ = ready_state([(i, int(i), value(i)) for i in ids], watching=True)
    floors = {"work": int(ids[-1]), "locks": int(ids[-1])}
    for at, ident in enumerate(ids[1:], start=int(ids[-1]) + 1):
        state.apply_block(round_, event("create", "locks", ident, at, lock_value()), floors, 0.0)
    found, switch = state.candidates(1)
    assert [i for i, _ in found] == ids[:1]
    assert switch is None, f"one free item of {len(ids)}: the view goes quiet ({switch})"


def _watching_with_locked(free: int, locked: int) -> Tuple[ViewState, Round, List[str]]:
    """A watching view whose listing showed ``free + locked`` items, every
    other one of the first ``2 * locked`` then locked by another consumer (its
    lock event): ``free`` free items, with locked ones between them.  Returns
    the locked ids."""
    ids = [item_id(i) for i in range(2, 2 + free + locked)]
    state, round_ = ready_state([(i, int(i), value(i)) for i in ids], watching=True)
    floors = {"work": int(ids[-1]), "locks": int(ids[-1])}
    held = ids[1:2 * locked:2]
    for at, ident in enumerate(held, start=int(ids[-1]) + 1):
        state.apply_block(round_, event("create", "locks", ident, at, lock_value()), floors, 0.0)
    return state, round_, held


def test_a_watching_view_with_backlog_free_items_among_locked_ones_goes_quiet() -> None:
    """Exactly BACKLOG free items, locked ones between them: a backlog.  The
    view goes quiet, listing locks/ (it knows of locks, and a quiet view
    hears no expire event)."""
    state, _, _ = _watching_with_locked(BACKLOG, 8)
    _, switch = state.candidates(1)
    assert switch == Switch(watching=False, list_locks=True)


def test_a_watching_view_with_one_free_item_short_of_a_backlog_keeps_watching() -> None:
    """BACKLOG - 1 free items and 8 locked between them: no backlog, claim
    after claim; the locked ids the count passed are out of the free list,
    which holds every free item still."""
    state, _, held = _watching_with_locked(BACKLOG - 1, 8)
    for _ in range(3):
        _, switch = state.candidates(1)
        assert switch is None
    assert not set(held) & state.in_free
    assert state.in_free == {i for i in state.items if state.is_free(i)}
    assert state.free == sorted(state.in_free)


def test_a_lock_gone_completes_the_backlog_of_a_watching_view() -> None:
    """An item whose lock the count passed (and dropped from the free list)
    counts again once its lock goes: its delete event makes BACKLOG free
    items, and the next claim's view goes quiet."""
    state, round_, held = _watching_with_locked(BACKLOG - 1, 8)
    assert state.candidates(1)[1] is None
    at = state.known + 1
    floors = {"work": at - 1, "locks": at - 1}
    state.apply_block(round_, event("delete", "locks", held[0], at), floors, 0.0)
    assert state.is_free(held[0]) and held[0] in state.in_free
    assert state.candidates(1)[1] == Switch(watching=False, list_locks=True)


def test_a_watching_view_whose_claims_walk_goes_quiet_with_a_backlog() -> None:
    """docs/protocol.md, "Switches": a watching view goes quiet when a claim
    sees BACKLOG free items.  Here 4 * BACKLOG items are free and each claim
    picks with a window of 8 (consumers raced for the head); none of 20
    claims makes the view go quiet."""
    ids = [item_id(i) for i in range(2, 2 + 4 * BACKLOG)]
    state, _ = ready_state([(i, int(i), value(i)) for i in ids], watching=True)
    rng = random.Random(0)
    switches = []
    for at in range(state.known + 1, state.known + 21):
        found, switch = state.pick(8, rng)
        assert found is not None
        state.locked_at(found[0], at)  # our claim's lock
        switches.append(switch)
    assert any(switches), f"{len(ids)} free items, 20 claims: the view still watches"
