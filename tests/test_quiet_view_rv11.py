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

from etcdq_v2 import Claim, Queue
from etcdq_v2.view import QueueView

from test_quiet_view_rv10 import (LOCK_TTL, _assert_next_claim, listing_races_give_back,
                                  switch_races_fail)


def release_at_once(x: Claim, view: QueueView) -> None:
    x.release()
    freed(x, view)


def freed(x: Claim, view: QueueView) -> None:
    assert x.id not in view._locks, "returned() did not free X"


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
        x, outcome = listing_races_give_back(queue, release_at_once)
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
        x = switch_races_fail(queue, producer, freed)  # backoff 0: the lock is deleted
        assert queue._protocol.read("locks", x.id) is None
        _assert_next_claim(queue, x.id)
