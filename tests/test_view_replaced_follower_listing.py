"""A listing of locks/ is applied only if the follower current when it was
decided is still the view's: a listing a replaced follower took never marks an
item locked again after the new follower heard its lock go.

The test forces, against a real etcd, the interleaving its docstring tells
(as it went before the rule).
"""
from __future__ import annotations

import threading

from etcdq_v2 import Queue

from helpers import claims_until, in_background, wait_until


def test_a_claimers_locks_listing_applied_after_the_switch_to_watching_strands_an_item(
        etcd_url: str, queue_name: str) -> None:
    """As found, relist_work (973295f) listed locks/ in full when most missed
    items were still in work/ (the "held" path, gone since the view reads claims
    off work/): it read the view's follower only in _list_locks, after
    _take_listing let go of the view's lock, so the guard `follower is
    self._follower` accepted a follower that took over in between.  A claimer's
    check_locks still calls _list_locks with the follower it saw (a delay lock
    due, or a watching view's check): T1 now comes that way.

    Interleaving (two claimers of one Queue, as in a Worker with concurrency 2):
      T1: claim -> check_locks: a delay lock of an item is due (here: X's, planned
          at once) -> is descheduled before _list_locks reads the follower;
      T2: claim finds nothing free -> starved() -> the view watches the whole
          directory (a new follower; its listing has X locked);
      T1: _list_locks reads the (watching) follower, GETs locks/ at L (X's lock there);
      the other process releases X: its lock is deleted at d > L; the watching
          view applies the event: X free;
      T1: applies its listing taken at L < d, after the event: _reconcile_locks
          -> _locked(X, m) finds no lock noted and marks X locked again.
    A watching view unlocks only on an event, and no more will come for X: X is
    free in etcd and never offered, while the consumer keeps claiming (the view
    stays watching: fewer than BACKLOG free items).  Expected: X claimed within
    two lock TTLs of its release.

    The pauses of T1 are forced (a wrapper around _list_locks and around the
    locks/ GET of T1's thread only): a descheduled thread; etcd is real.
    """
    ttl = 2
    with Queue(etcd_url, queue_name, lock_ttl=ttl) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=ttl) as other:
        ids = consumer.put_many(range(5))
        first = consumer.claim()  # the first listing: a quiet view
        assert first is not None
        view = consumer._view
        assert not view.watching_locks
        held = other.claim()  # X, held by another process
        assert held is not None
        x = held.id
        assert x in ids and x != first.id

        at_gap, switched = threading.Event(), threading.Event()
        listed, apply = threading.Event(), threading.Event()
        t1 = {}
        original_list_locks = view._list_locks
        protocol = view._protocol
        original_list = protocol.list

        def paused_list_locks(follower, full: bool = False, **kwargs) -> None:
            if threading.current_thread() is t1.get("thread"):
                at_gap.set()
                assert switched.wait(10)
            original_list_locks(follower, full, **kwargs)

        def paused_list(directory, *args, **kwargs):
            result = original_list(directory, *args, **kwargs)
            if directory == "locks" and threading.current_thread() is t1.get("thread"):
                listed.set()
                assert apply.wait(10)
            return result

        view._list_locks = paused_list_locks
        protocol.list = paused_list

        go = threading.Event()  # T1 starts once its thread is known to the wrappers

        def claimer_t1() -> None:
            assert go.wait(10)
            # T1's claim of X lost the race (C1 "already exists"), and a delay
            # lock the view knows of is due: check_locks lists locks/.
            with view._cond:
                view.state.locked(x, 1)
                view.state.plan_delay(x, 0, view._runtime.monotonic())
            view.check_locks()

        thread, outcome = in_background(claimer_t1, name="T1")
        t1["thread"] = thread
        go.set()
        assert at_gap.wait(10), outcome
        # T2 finds nothing free (in the real run: every item it knows is taken).
        view.starved(consumer.etcd.timeout)
        assert view.watching_locks
        switched.set()
        assert listed.wait(10), outcome
        held.release()  # X's lock deleted: X free in etcd
        wait_until(lambda: x not in view.state.locks, 5,
                   message="the watching view never heard of X's release")
        apply.set()
        thread.join(10)
        assert not thread.is_alive() and "raised" not in outcome, outcome
        view._list_locks = original_list_locks
        protocol.list = original_list

        first.complete()
        got = claims_until(consumer, x, 2 * ttl + 2, claim_timeout=0.5)
        free_in_etcd = x in {e.id for e, _ in consumer._protocol.decoded("work")} and \
            consumer._protocol.read("locks", x) is None
        assert x in got, (f"item {x} free in etcd ({free_in_etcd}) was not claimed within "
                          f"{2 * ttl + 2} s of its release by a consumer claiming all along "
                          f"(claimed {got}); the view holds it as locked at "
                          f"{view.state.locks.get(x)}, watching={view.watching_locks}")
