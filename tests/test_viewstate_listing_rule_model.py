"""The view's rule for listings of work/ that race, against a model that
keeps every listing ever applied (docs/protocol.md, "Events and
transitions"): a listing is dropped if and only if a listing applied since
it started, in the same round, has a higher index.  ViewState keeps only the
applied listings a listing under way may need (``applied``, pruned by
``under_way``); random runs of rounds (replaced, failed, listing again),
claimers' relists (failed, or of a replaced round) and indexes that go back
(etcd restarted without its data) must decide every listing as the model
does, and keep ``under_way`` to the listings really under way.  Fed to the
state with no etcd and no threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

import random
from typing import List, Optional, Tuple

from etcdq_v2.viewstate import Relist, Round

from test_viewstate import ready_state

SEEDS, STEPS = 400, 200
#: How etcd's index moves between two listings: mostly up, sometimes back.
MOVES = [1, 2, 3, 7, -1, -5, -400]


def _decides_as_the_model(seed: int) -> int:
    """Run one random history; return the longest ``applied`` seen."""
    rng = random.Random(seed)
    state, _ = ready_state([])
    model: List[Tuple[int, int, int]] = []  # (generation, started when applied, index)
    round_: Optional[Round] = None  # the current round's listing under way
    relist: Optional[Relist] = None
    now, index, longest = 10.0, 1000, 0

    def dropped(generation: int, started: int, at: int) -> bool:
        return any(g == generation and after >= started and at < high
                   for g, after, high in model)

    for step in range(STEPS):
        now += 1
        draw = rng.random()
        if draw < 0.06:  # a new round (quiet, or watching: no relist then)
            new = state.new_round(watching=rng.random() < 0.2)
            assert new is not None
            round_ = state.round_listing(new) if rng.random() < 0.7 else None
        elif draw < 0.25 and round_ is None:  # the round lists again
            round_ = state.round_listing(Round(state.generation, state.watching, False, 0))
        elif draw < 0.45 and relist is None:
            relist = state.start_relist(now, full=rng.random() < 0.5)
        elif draw < 0.7 and round_ is not None:
            if rng.random() < 0.15:
                state.round_failed(round_, RuntimeError("listing failed"))
            else:
                index = max(2, index + rng.choice(MOVES))
                expect = not dropped(round_.generation, round_.started, index)
                before = state.known
                plan = state.plan_round(round_, [])
                assert state.apply_round(round_, (index, []), plan, None, [], now, 0.0)
                if before != index:
                    assert (state.known == index) == expect, (seed, step, "round", index)
                if expect:
                    model.append((state.generation, state.started, index))
            round_ = None
        elif relist is not None:
            if rng.random() < 0.15:
                state.work_unlisted(relist, now)
            else:
                index = max(2, index + rng.choice(MOVES))
                current = relist.generation == state.generation
                expect = current and not dropped(relist.generation, relist.started, index)
                before = state.known
                state.apply_relist(relist, (index, []), state.plan_relist(relist, []), None,
                                   now, 0.0)
                if current and before != index:
                    assert (state.known == index) == expect, (seed, step, "relist", index)
                if expect:
                    model.append((state.generation, state.started, index))
            relist = None
        longest = max(longest, len(state.applied))
        under_way = {} if round_ is None else {"round": round_.started}
        if relist is not None:
            under_way["relist"] = relist.started
        if round_ is None:  # a new round's number stands until it lists
            assert {k: v for k, v in state.under_way.items() if k != "round"} == \
                {k: v for k, v in under_way.items() if k != "round"}, (seed, step)
        else:
            assert state.under_way == under_way, (seed, step, state.under_way, under_way)
    return longest


def test_every_listing_of_work_is_decided_as_by_every_listing_applied_since_it_began(
        ) -> None:
    longest = max(_decides_as_the_model(seed) for seed in range(SEEDS))
    assert longest > 1, "no run kept two applied listings: the index never went back"
