"""Regression tests from hostile review rv11 of QueueView.returned (R1's etcd index).

Each test reproduces against a real etcd an interleaving found in review, as
it was before the fix: a listing of locks/ taken before an R1 that deleted
the lock, applied after it, marked the given-back item locked again.  Now
the view remembers the newest index at which each item's lock was seen gone
(QueueView._gone), and ignores older signs of a lock.  The pauses of one
thread are forced as in tests/test_quiet_view_rv10.py (a wrapper around
Protocol.list for that thread only); etcd is real.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from etcdq_v2 import Queue
from etcdq_v2.view import BACKLOG

from helpers import in_background, wait_until
from test_quiet_view_rv10 import ITEMS, LOCK_TTL, _assert_next_claim, _pause_locks_listing


def test_rv11_a_concurrent_locks_listing_relocks_an_item_released_at_once(
        etcd_url: str, queue_name: str) -> None:
    """rv10's interleaving with release() at once (delay 0) instead of a delay.

    returned(X, 0, I_R1) -> _unlocked deletes _locks[X] and frees X.  A listing
    of locks/ taken before R1 (X's claim lock in it) applied afterwards runs
    _reconcile_locks -> _locked(X, claim lock's index): X is not in _locks any
    more, so any index > 0 marks it locked again -- the R1 index that guards
    the delay plan (_given_back) is not consulted here.  X has no planned
    expiry (no delay lock), so the quiet view offers it only at the
    once-per-lock-TTL listing (30 s) or when its backlog runs out.

      T1: claims X (head of a quiet view with a backlog);
      a delayed put Y of this process falls due, etcd sweeps Y's lock;
      T2: claim() -> check_locks(): Y due -> _list_locks: GET locks/ at L
          (X's claim lock there); descheduled before applying it;
      T1: X.release(): R0, R1 (delete at I_R1 > L); returned(X, 0, I_R1): X free;
      T2: applies the listing taken at L: _locked(X, C1 index) -> X locked.
    """
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as queue:
        queue.put_many(range(ITEMS))
        x = queue.claim(timeout=5)
        assert x is not None
        view = queue._view
        assert view is not None and not view.watching_locks
        y = queue.put("y", delay=1)
        wait_until(lambda: view._next_delay <= time.monotonic()
                   and queue._protocol.read("locks", y) is None, 5,
                   message="the delayed put's plan fell due and etcd let it go")

        listed, go, undo = _pause_locks_listing(
            queue, lambda: threading.current_thread().name == "T2")  # named before it starts
        try:
            def t2_claims() -> Any:
                claim = queue.claim(timeout=0)
                if claim is not None:
                    claim.complete()
                return claim
            thread, outcome = in_background(t2_claims, name="T2")
            assert listed.wait(10), outcome

            x.release()
            assert x.id not in view._locks, "returned() did not free X"
            go.set()
            thread.join(10)
            assert not thread.is_alive() and "raised" not in outcome, outcome
        finally:
            undo()

        taken_by_t2 = outcome.get("returned")
        if taken_by_t2 is not None and taken_by_t2.id == x.id:
            return  # X was offered at once: T2, claiming after its listing, took it
        assert queue._protocol.read("locks", x.id) is None
        _assert_next_claim(queue, x.id)


def test_rv11_the_switch_to_quiet_relocks_an_item_failed_with_no_backoff(
        etcd_url: str, queue_name: str) -> None:
    """rv10's second interleaving (watching -> quiet switch) with a backoff of 0:
    fail() deletes the lock (R1 at I_R1), returned(X, 0, I_R1) frees X, then the
    new quiet follower applies its listing of locks/ taken before R1:
    _reconcile_locks -> _locked(X, C1 index) marks X locked again, for good
    until the once-per-lock-TTL listing (a quiet view hears no delete event)."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL, backoff=(0,)) as queue, \
            Queue(etcd_url, queue_name) as producer:
        queue.put("x")
        x = queue.claim(timeout=5)
        assert x is not None
        view = queue._view
        assert view is not None
        assert queue.claim(timeout=0) is None  # starved: the view watches everything
        wait_until(lambda: view.watching_locks and x.id in view._locks, 5,
                   message="a watching view holding X locked")
        producer.put_many(range(ITEMS))
        wait_until(lambda: len(view._in_free) >= BACKLOG, 10,
                   message="the watching view heard of the backlog")

        listed, go, undo = _pause_locks_listing(
            queue, lambda: threading.current_thread().name == "etcdq-view")
        try:
            other = queue.claim(timeout=5)  # candidates(): the switch to quiet
            assert other is not None and other.id != x.id
            assert listed.wait(10), "the quiet follower never listed locks/"
            assert not view.watching_locks
            x.fail("again")  # backoff 0: the lock is deleted
            assert x.id not in view._locks, "returned() did not free X"
            go.set()
            wait_until(view._follower._listed.is_set, 5,
                       message="the quiet follower applied its listing")
            other.complete()
        finally:
            undo()

        assert queue._protocol.read("locks", x.id) is None
        _assert_next_claim(queue, x.id)
