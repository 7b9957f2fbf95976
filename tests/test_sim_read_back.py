"""The simulator finds a put read-back that misses a POST stored before it.

A put whose POST reply was lost searches the queue for its token (P1); a POST
that applied before the search is to be found, and the put returns its id.
A read-back that finds nothing (each stored POST in doubt reported "may or
may not be stored", and stored twice by a caller that puts it again) breaks
read-back-finds-applied: the log says the POST applied before the search's
read of T.  (A span that misses alone breaks nothing: the listings that
follow find the token.)
"""
from __future__ import annotations

from typing import List

import pytest

from etcdq_v2.steps import Steps
from etcdq_v2.testing.sim.simulation import simulate


pytestmark = pytest.mark.usefixtures("quiet_library")  # faults make the library warn

SEEDS = 20


def test_a_read_back_that_misses_stored_posts_breaks_an_invariant(
        monkeypatch: pytest.MonkeyPatch) -> None:
    missed: List[str] = []
    original = Steps.find_puts_step

    def missing(self: Steps, tokens, floor=0):  # type: ignore[no-untyped-def]
        found = yield from original(self, tokens, floor)
        missed.extend(found)  # stored and found (span or listings): reported as not found
        return {}

    monkeypatch.setattr(Steps, "find_puts_step", missing)
    violations = [v.name for seed in range(SEEDS) for v in simulate(seed).violations]
    if not missed:
        raise RuntimeError(f"seeds 0-{SEEDS - 1}: no stored POST in doubt was read back")
    assert "read-back-finds-applied" in violations, \
        f"seeds 0-{SEEDS - 1}: {len(missed)} stored puts missed, no violation"
