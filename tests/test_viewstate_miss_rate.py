"""A quiet view lists work/ again once its misses cost what its listing did,
or once half its tries since the listing missed, with at least MISS_RATE_MIN
misses (docs/protocol.md, "Modes: quiet and watching").  Fed to the state
with no etcd and no threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

import random
from typing import List

from etcdq_v2.versions import Entry
from etcdq_v2.viewstate import MISS_COST, MISS_RATE_MIN, ViewState

from test_viewstate import item_id, ready_state, value

#: A listing long enough that its misses' cost limit is far above MISS_RATE_MIN.
LISTED = 30 * MISS_COST


def quiet_state() -> ViewState:
    state, _ = ready_state([(item_id(i), i, value(f"t{i}")) for i in range(2, 2 + LISTED)])
    assert not state.watching and state.listed_free == LISTED
    return state


def claims(state: ViewState, pattern: str) -> List[bool]:
    """Claim as ``pattern`` says (``h``: won, ``m``: lost a race); what each
    miss answered (list work/ again?)."""
    rng, answers = random.Random(0), []
    for n, outcome in enumerate(pattern):
        found, _ = state.pick(LISTED, rng)
        assert found is not None
        if outcome == "h":
            state.locked_at(found[0], 10 ** 6 + n)
        else:
            state.locked_at(found[0], 10 ** 6 + n, refused=True)
            answers.append(state.missed(found[0]))
    return answers


def test_a_quiet_view_whose_tries_mostly_miss_lists_again_at_the_miss_rate() -> None:
    """Half its tries missed, MISS_RATE_MIN times: the listing's items are
    mostly gone, however long it is (its cost limit here is 30 misses)."""
    state = quiet_state()
    answers = claims(state, "hhh" + "m" * MISS_RATE_MIN)
    assert answers == [False] * (MISS_RATE_MIN - 1) + [True]


def test_a_quiet_view_whose_tries_mostly_hit_lists_again_when_misses_cost_a_listing() -> None:
    """Fewer misses than hits: not stale by the rate; its misses cost a
    listing after one per MISS_COST listed items."""
    state = quiet_state()
    limit = LISTED // MISS_COST
    answers = claims(state, "hhm" * limit)
    assert answers == [False] * (limit - 1) + [True]


def test_misses_of_claims_picked_before_a_relist_do_not_make_its_miss_rate() -> None:
    """Threads sharing one view: claims picked from the old listing and under
    way when a relist is applied miss after it (the relist came because that
    listing was stale).  Not one of the new listing's own tries has missed,
    so it is not stale by the miss rate (its cost limit here is 30 misses)."""
    state = quiet_state()
    rng = random.Random(0)
    under_way = [state.pick(LISTED, rng)[0] for _ in range(2 * MISS_RATE_MIN)]
    assert all(found is not None for found in under_way)
    gone = {found[0] for found in under_way if found is not None}
    relist = state.start_relist(1.0)
    assert relist is not None
    work = [Entry(item_id(i), i, value(f"t{i}")) for i in range(2, 2 + LISTED)
            if item_id(i) not in gone]  # others claimed them: the old picks will miss
    index = 2 * 10 ** 6
    state.apply_relist(relist, (index, work), state.plan_relist(relist, work), None, 1.0, 0.0)
    answers = []
    for found in under_way:
        assert found is not None
        state.locked_at(found[0], index + 1, refused=True)
        answers.append(state.missed(found[0]))
    assert state.tries == 0
    assert not any(answers), f"listed again after {answers.index(True) + 1} old misses"
