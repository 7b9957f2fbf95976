"""What view-knows-work and lone-put-order count for a quiet view whose process
was paused (etcdq_v2/testing/sim/invariants.py, Live._view).

A quiet view learns only by its own requests, which do not leave while its
process is paused: the pause is not counted.  A pause changes nothing in the
view's state, so the time a view was stale before the pause, and the time an
older item was held free before it, are still time the view was wrong."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import pytest

from etcdq_v2.testing.sim.actors import HandOut, History
from etcdq_v2.testing.sim.invariants import Bounds, Live, Stored
from etcdq_v2.testing.sim.invariants import ViewState as SimView

pytestmark = pytest.mark.usefixtures("quiet_library")


def _said(view: SimView, store: Stored, paused: List[Tuple[float, float]], until: float,
          hand_outs: Optional[List[Tuple[float, str]]] = None) -> Dict[str, List[str]]:
    """What the invariants say of c1's ``view`` checked every second from 0 to
    ``until`` against ``store``, c1's process paused over ``paused``, c1 handed
    ``hand_outs`` (time, item) at a window of one."""
    history = History()
    history.paused = {"c1": list(paused)}
    bounds = Bounds(5, 30, 30, 15)
    live = Live(history, None, "", bounds)  # type: ignore[arg-type]
    outs = sorted(hand_outs or [])
    for second in range(int(until) + 1):
        now = float(second)
        while outs and outs[0][0] <= now:
            at, item = outs.pop(0)
            history.hand_outs.append(HandOut(len(history.hand_outs), at, item,
                                             len(history.hand_outs), "c1", fifo=True))
        live._view("c1", view, store, now)
        live._order(store, now)
    said: Dict[str, List[str]] = {}
    for name, detail in history.seen:
        said.setdefault(name, []).append(detail)
    return said


def _store(*items: str) -> Stored:
    return Stored(work={item: (n + 2, "{}") for n, item in enumerate(items)},
                  completed={}, failed={})


def test_an_item_unknown_to_a_quiet_view_past_its_bound_breaks_view_knows_work() -> None:
    # No pause: 31 s unknown, over a 30 s bound.
    quiet = SimView({}, set(), watching=False)
    assert "view-knows-work" in _said(quiet, _store("a"), [], 32)
    # A pause of 10 s is not counted: 29 s of the process running, within it;
    # 31 s, over it.
    assert "view-knows-work" not in _said(quiet, _store("a"), [(10.0, 20.0)], 39)
    assert "view-knows-work" in _said(quiet, _store("a"), [(10.0, 20.0)], 42)


def test_a_short_pause_does_not_forgive_a_quiet_view_its_staleness_before_it() -> None:
    # Item a unknown to c1's quiet view from 0 to 45 s; c1 paused 2 s at 25-27 s.
    # 43 s of it while the process ran, more than the 30 s bound (which already
    # allows for one pause and the work after it).
    quiet = SimView({}, set(), watching=False)
    assert "view-knows-work" in _said(quiet, _store("a"), [(25.0, 27.0)], 45)


def test_a_newer_item_handed_out_at_a_window_of_one_past_an_older_held_free_breaks_lone_put_order(
        ) -> None:
    quiet = SimView({"a": (2, "{}"), "b": (3, "{}")}, set(), watching=False)
    said = _said(quiet, _store("a", "b"), [], 25, [(23.0, "b")])
    assert len(said.get("lone-put-order", [])) == 1


def test_a_pause_does_not_forgive_a_lone_consumer_passing_an_item_its_quiet_view_held_free(
        ) -> None:
    # a and b in c1's quiet view, free, from 0 s; c1 paused 2 s at 20-22 s; at
    # 23 s c1 is handed b at a window of one while a, older, has been held free
    # for 23 s (ORDER_SLACK 15 s). Nothing in the view changed over the pause.
    quiet = SimView({"a": (2, "{}"), "b": (3, "{}")}, set(), watching=False)
    said = _said(quiet, _store("a", "b"), [(20.0, 22.0)], 25, [(23.0, "b")])
    assert len(said.get("lone-put-order", [])) == 1


def test_a_watching_view_keeps_its_count_through_a_pause() -> None:
    watching = SimView({}, set(), watching=True)
    assert "view-knows-work" in _said(watching, _store("a"), [(25.0, 27.0)], 45)
