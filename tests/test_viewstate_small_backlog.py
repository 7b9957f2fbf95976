"""The view's invariants over random events (tests/test_viewstate.py's
machine) with a backlog of 2: the machine's views hold a few items, fewer
than BACKLOG, so at the real BACKLOG a watching view's count of its backlog
(docs/protocol.md, "Switches"), which drops the ids not free that it passes,
never runs; at 2 it runs at most claims, and the free list must still hold
every free item.
"""
from __future__ import annotations

import pytest
from hypothesis import settings

from etcdq_v2 import viewstate

from test_viewstate import ViewMachine


class SmallBacklogMachine(ViewMachine):
    """ViewMachine, run with viewstate.BACKLOG at 2."""


SmallBacklogMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60,
                                                 deadline=None)


def test_the_view_s_invariants_hold_over_random_events_at_a_backlog_of_two(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(viewstate, "BACKLOG", 2)
    SmallBacklogMachine.TestCase().runTest()
