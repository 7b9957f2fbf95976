"""The view's rule for listings of work/ that race, against a model that
orders them in real time (docs/protocol.md, "Events and transitions"): each
listing is read at etcd between the moment it is sent and the moment its
reply is handed to the state, and a finished listing is compared with the
last one applied.  Answered before that one was sent: older, dropped.  Sent
after that one was answered: newer, applied at any index.  Otherwise their
reads overlapped: applied if and only if its index is as high.  And by
etcd's history: an applied listing read at an index lower than the highest
the view had been told of when it was sent, or newer than the last applied
one and lower, shows that the history changed (etcd restored or restarted
without its data), and every listing sent before that is dropped, its
listing of locks/ too.

The model keeps its own timeline of those moments (a list of events, each
listing's two places in it), not the state's numbers: random runs of
rounds (replaced, failed, listing again, a replaced round's listing landing
late), claimers' relists (failed, or of a replaced round), replies handed in
long before they are applied (a round's slow listing of locks/) and indexes
that go back (etcd restarted without its data) must decide every listing as
the model does, seen by ``relists`` (the listings of work/ the view took).
Each of the rule's four outcomes must be met.  Fed to the state with no etcd
and no threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, List, Optional

from test_viewstate import ready_state

SEEDS, STEPS = 400, 200
#: How etcd's index moves between two reads: mostly up, sometimes back.
MOVES = [1, 2, 3, 7, -1, -5, -400]


@dataclass
class _Listing:
    kind: str  # "round" or "relist"
    generation: int
    request: Any  # the Round or Relist the state numbered
    sent: int  # its place in the model's timeline
    history: int  # the model's count of history changes as it was sent
    highest: int  # the highest index the model had told the state as it was sent
    answered: Optional[int] = None
    index: int = 0
    plan: Any = None


def _decision(listing: _Listing, last: Optional[_Listing], history: int) -> str:
    """The model: how ``listing`` is decided against the last applied one, in
    ``history`` (the changes counted so far)."""
    assert listing.answered is not None
    if listing.history != history:
        return "other-history"
    if last is None:
        return "first"
    assert last.answered is not None
    if listing.answered < last.sent:
        return "older"
    if listing.sent > last.answered:
        return "newer" if listing.index >= last.index else "newer-at-lower-index"
    return "overlapped" if listing.index >= last.index else "overlapped-lower"


APPLIED = {"first", "newer", "newer-at-lower-index", "overlapped"}


def _run(seed: int, seen: Counter) -> None:
    rng = random.Random(seed)
    state, current = ready_state([])
    timeline: List[str] = []  # the model's clock: one entry per send, per answer
    generation = 1
    flight: List[_Listing] = []  # sent, not yet applied nor failed
    last: Optional[_Listing] = None  # the last applied (ready_state's is before all these)
    index, now = 1000, 10.0
    history, highest = 0, 1  # ready_state's listing was at 1

    def moment(what: str) -> int:
        timeline.append(what)
        return len(timeline) - 1

    for step in range(STEPS):
        now += 1
        draw = rng.random()
        rounds = [x for x in flight if x.kind == "round" and x.generation == generation]
        relists = [x for x in flight if x.kind == "relist"]
        if draw < 0.05:  # a new round; the old one's listing may still land
            new = state.new_round(watching=rng.random() < 0.2)
            assert new is not None
            current, generation = new, generation + 1
        elif draw < 0.2 and not rounds:  # the round lists (again)
            request = state.round_listing(current)
            flight.append(_Listing("round", generation, request, moment("sent"), history,
                                   highest))
        elif draw < 0.35 and not relists:
            relist = state.start_relist(now, full=rng.random() < 0.5)
            if relist is not None:
                flight.append(_Listing("relist", generation, relist, moment("sent"),
                                       history, highest))
        elif flight:
            listing = rng.choice(flight)
            fails = rng.random() < 0.1
            if listing.answered is None and fails:  # its listing of work/ failed
                flight.remove(listing)
                if listing.kind == "round":
                    state.work_unlisted_by_round(listing.request)
                    state.round_failed(listing.request, RuntimeError("listing failed"))
                else:
                    state.work_unlisted(listing.request, now)
            elif listing.answered is None:  # its reply is handed in
                index = max(2, index + rng.choice(MOVES))
                listing.index, listing.answered = index, moment("answered")
                plan = state.plan_round if listing.kind == "round" else state.plan_relist
                listing.plan = plan(listing.request, [])
            elif fails and listing.kind == "round":  # its listing of locks/ failed
                flight.remove(listing)
                state.round_failed(listing.request, RuntimeError("locks/ unlisted"))
            else:  # applied, or dropped
                flight.remove(listing)
                current_ = listing.generation == generation
                decision = _decision(listing, last, history) if current_ else "replaced"
                if decision == "newer-at-lower-index" or (
                        decision in APPLIED and listing.index < listing.highest):
                    history, highest = history + 1, listing.index
                    if decision != "newer-at-lower-index":
                        seen["history-changed-below-highest"] += 1
                before = state.relists
                work = (listing.index, [])
                if listing.kind == "round":
                    applied = state.apply_round(listing.request, work, listing.plan,
                                                (listing.index, []), [], now, 0.0)
                    assert applied == current_, (seed, step)
                else:
                    state.apply_relist(listing.request, work, listing.plan, None, now, 0.0)
                took = state.relists - before
                assert took == (decision in APPLIED), (seed, step, listing.kind, decision)
                assert state.history == history, (seed, step, decision)
                if took or (listing.kind == "round" and decision not in (
                        "replaced", "other-history")):  # its listing of locks/ was applied
                    highest = max(highest, listing.index)
                if took:
                    last = listing
                    assert state.known == listing.index, (seed, step)
                seen[decision] += 1


def test_every_listing_of_work_is_decided_by_real_time_order_and_index_for_overlaps(
        ) -> None:
    seen: Counter = Counter()
    for seed in range(SEEDS):
        _run(seed, seen)
    for outcome in ("older", "newer-at-lower-index", "overlapped", "overlapped-lower",
                    "history-changed-below-highest", "other-history"):
        assert seen[outcome] > 0, f"no listing decided {outcome!r}: {dict(seen)}"
