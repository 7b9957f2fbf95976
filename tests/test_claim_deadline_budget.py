"""A claim's requests share one deadline within one claim() call
(Transport.spending): only a listing the view could not make within its
deadline, and went on without (ViewState.work_unlisted, Unavailable), leaves
the later requests one timeout each; a request that merely took long, and
answered, spends nothing.  So a frozen etcd's claim takes one deadline, not
two, a stalled C1 after a slow listing gets its full deadline, and the budget
neither outlives a raising claim nor reaches other threads.

Against a real etcd: own_etcd paused for a frozen etcd; the fault proxy
holding chosen requests for a stall.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Any, Dict

import pytest
from helpers import in_background, wait_until, work_listing

from etcdq_v2 import Queue, Unavailable, connect
from etcdq_v2.server import EtcdServer


def _lock_put(queue_name: str, item_id: str) -> "re.Pattern[bytes]":
    return re.compile(rb"PUT /v2/keys/etcdq/" + re.escape(queue_name.encode()) + rb"/locks/"
                      + re.escape(item_id.encode()))


def test_a_catch_up_round_restarts_the_budget_frozen_claim_takes_two_deadlines(
        own_etcd: EtcdServer, queue_name: str) -> None:
    """Queue.claim opens a new ``sharing`` block each round.  A quiet
    view holding back this process's own put (index past what it listed)
    makes catch_up() list work/ inside round 1; in a frozen etcd that listing
    spends the whole deadline and is swallowed (_catch_up_quietly offers the
    own item without it), catch_up returns True, ``continue`` starts round 2
    with a fresh deadline, and C1 on the own item waits a second full
    deadline.  docs/guarantees.md (as changed by 849e56b) says a claim's
    requests share one deadline, each one timeout at least: Unavailable
    after ~deadline + timeout (3.5 s here), not ~2 x deadline (~5.5 s).
    """
    client = connect(own_etcd.url, timeout=0.5, deadline=3)
    with Queue(client, queue_name) as queue:
        queue.put("first")
        queue.claim().complete()  # the view is up, and quiet
        queue.put("own")  # past what the view listed: held back for a catch-up
        own_etcd.pause()
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable):
                queue.claim(timeout=0)
            took = time.monotonic() - started
        finally:
            own_etcd.resume()
        assert took < 3 + 0.5 + 0.7, (
            f"a frozen etcd's claim raised Unavailable after {took:.1f}s: the catch-up's "
            "listing spent round 1's deadline and round 2 got a new one")


def test_a_stalled_c1_after_a_slow_listing_raises_and_leaves_the_lock(
        etcd_url: str, proxy: Any, queue_name: str) -> None:
    """The round's budget is spent by a listing that succeeded within
    its own deadline (a stalled quorum read, retried: a failover); the
    round's C1 then gets max(left, timeout) = one timeout, not the deadline.
    C1 stalls longer than one timeout but well within the deadline (a write
    during a leader election, 1-7 s: docs/guarantees.md says calls retry
    within their deadline).  Before 849e56b C1 was retried and the claim
    succeeded; now it raises Unavailable, and the C1 that etcd applies after
    the stall locks the item for nothing for a lock TTL.
    """
    client = connect(proxy.url, timeout=1, deadline=3)
    with Queue(client, queue_name, lock_ttl=2) as queue:
        first, second = queue.put_many(["first", "second"])
        held = queue.claim()
        assert held is not None and held.id == first
        view = queue._view
        # The next claim's round lists work/ and locks/ again (quiet, a lock held a TTL).
        wait_until(lambda: time.monotonic() - view.state.locks_listed >= queue._protocol.lock_ttl,
                   5, message="the quiet view's once-per-TTL listing to be due")
        proxy.hold("up", match=work_listing(queue_name))
        thread, outcome = in_background(lambda: queue.claim(timeout=0), "budget-claim")
        try:
            wait_until(lambda: b"/work?" in proxy.held("up"), 5,
                       message="the round's listing of work/ to be held")
            time.sleep(2.2)  # the stall: the listing's retry answers within its deadline
            proxy.release()
            proxy.hold("up", match=_lock_put(queue_name, second))
            wait_until(lambda: b"/locks/" + second.encode() in proxy.held("up"), 5,
                       message="C1 of the second item to be held")
            time.sleep(1.5)  # C1 stalls 1.5 s: over one timeout, half the deadline
        finally:
            proxy.pass_through()
        thread.join(10)
        assert not thread.is_alive()
        claim = outcome.get("returned")
        try:
            assert "raised" not in outcome, (
                f"the claim raised {outcome.get('raised')!r}: its C1 had one timeout "
                "left of the round's budget, though etcd answered within the deadline")
            assert claim is not None and claim.id == second
        finally:
            if claim is not None:
                claim.complete()
            held.complete()


def test_the_budget_neither_outlives_a_raising_claim_nor_reaches_other_threads(
        etcd_url: str, proxy: Any, queue_name: str) -> None:
    """A claim that raises (connections reset) leaves no ``until`` behind
    in its thread; a ``spending`` block of one thread does not shorten another
    thread's calls; nested inside the heartbeat's time_limit it restores both."""
    client = connect(proxy.url, timeout=0.3, deadline=0.9)
    with Queue(client, queue_name) as queue:
        queue.put("x")
        proxy.reset()
        try:
            with pytest.raises(Unavailable):
                queue.claim(timeout=0)
        finally:
            proxy.pass_through()
        assert getattr(client._limit, "until", None) is None
        seen: Dict[str, Any] = {}
        with client.time_limit(5.0), client.spending():
            client.spent()
            assert client._limit.until <= time.monotonic()
            other = threading.Thread(
                target=lambda: seen.update(until=getattr(client._limit, "until", None)))
            other.start()
            other.join(5)
        assert seen == {"until": None}
        assert getattr(client._limit, "until", None) is None
        assert getattr(client._limit, "seconds", None) is None
        claim = queue.claim(timeout=5)
        assert claim is not None
        claim.complete()
