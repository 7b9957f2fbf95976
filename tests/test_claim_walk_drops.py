"""A walk of the claim window drops the items it finds not free from the view's
sorted free list (ViewState._drop_taken), and every way back to free puts them
back: an orphan (an item whose outcome record F2 and lock delete F4 the view
saw, but not F3) dropped by a walk is offered again to a consumer that polls
with ``claim()`` (timeout 0), as to one that waits; an item dropped while
locked elsewhere is offered once released; and threads sharing one view hand
out each item once.

The first test tells, as it went before the rule, the orphan a polling
consumer never got back: its way back to free was time, through
``offer_due``, which only a claim that waits called.
"""
from __future__ import annotations

import random
import threading
from typing import Any, List


from helpers import work_ids

from etcdq_v2 import Queue
from tests.helpers import wait_until



def _watching_view(queue: Queue) -> Any:
    """The queue's view, watching the whole directory (a claim that found nothing)."""
    assert queue.claim(timeout=0) is None
    view = queue._view
    wait_until(lambda: view.watching_locks, 10, message="the view watches locks/")
    return view


def test_an_orphan_dropped_by_a_walk_is_never_offered_to_a_polling_consumer(
        etcd_url: str, queue_name: str) -> None:
    """A finisher (another process, lock TTL > LINGER_MAX so
    F4 is sent) completes the head item X but its F3 never applies: the
    watching view of consumer ``q`` sees F1, F2, then F4: X is an orphan,
    not offered for a deadline, then to be finished by a claim.  ``q`` has
    a window of 8 (one lost race) and claims five items meanwhile with
    claim(timeout=0); a walk passes X and drops it.  Once X is due, ``q``
    drains with claim(timeout=0): X is free in its view (_is_free) and in
    etcd (in work/, no lock), yet not in the free list, and no claim finds
    it: work/ keeps X for good (until a relist).  Fix: offer_due in every
    claim round (or _is_free's orphan clause never true for a listed-then-
    dropped item: keep orphans in _free)."""
    random.seed(5)
    with Queue(etcd_url, queue_name) as q, Queue(etcd_url, queue_name, lock_ttl=120) as other:
        view = _watching_view(q)
        ids = [q.put(n) for n in range(10)]
        x = ids[0]
        wait_until(lambda: all(i in view.state.in_free for i in ids), 10, message="q knows the items")
        claim = other.claim(timeout=5)
        assert claim is not None and claim.id == x
        real = other._protocol.etcd.delete_all

        def f3_lost(deletes: List[Any]) -> Any:  # F4 applies, F3 never does
            return real([d for d in deletes if "/locks/" in d[0]])

        other._protocol.etcd.delete_all = f3_lost  # type: ignore[method-assign]
        claim.complete()
        wait_until(lambda: x in view.state.orphans, 10, message="q's view holds X as an orphan")
        due = view.state.orphans[x]
        assert x in work_ids(q)
        q._window = 8  # as after one lost race
        handed: List[str] = []
        for _ in range(5):
            got = q.claim(timeout=0)
            assert got is not None
            handed.append(got.id)
            got.complete()
        with view._cond:
            dropped = x not in view.state.in_free
        wait_until(lambda: view._runtime.monotonic() >= due, q.etcd.deadline + 10,
                   message="X's orphan deadline passed")  # offered at the next claim's tick
        for _ in range(20):  # a polling consumer: claim(), never waiting
            got = q.claim(timeout=0)
            if got is None:
                continue
            handed.append(got.id)
            got.complete()
        left = work_ids(q)
        with view._cond:
            state = {"in_free": x in view.state.in_free, "is_free": view.state.is_free(x),
                     "dropped_during_orphan_time": dropped, "work": left}
        assert x not in left, f"X ({x}) free in etcd and in the view, never offered: {state}"
        assert sorted(handed) == sorted(ids[1:])


def test_an_item_dropped_while_locked_elsewhere_is_offered_once_released(
        etcd_url: str, queue_name: str) -> None:
    """another consumer holds item 2 while ``q`` (watching, window 8)
    walks past it and drops it; the release's lock delete comes as an event
    (_unlocked -> _make_free): ``q`` gets it back with claim(timeout=0)."""
    random.seed(3)
    with Queue(etcd_url, queue_name) as q, Queue(etcd_url, queue_name) as other:
        view = _watching_view(q)
        ids = [q.put(n) for n in range(10)]
        wait_until(lambda: all(i in view.state.in_free for i in ids), 10, message="q knows the items")
        held = other.claim(timeout=5)
        assert held is not None and held.id == ids[0]
        wait_until(lambda: ids[0] in view.state.locks, 10, message="q sees the lock")
        q._window = 8
        handed: List[str] = []
        for _ in range(9):  # every other item: its walks pass the held one
            got = q.claim(timeout=0)
            assert got is not None
            handed.append(got.id)
            got.complete()
        with view._cond:
            assert ids[0] not in view.state.in_free, "the held item was dropped"
        held.release()
        wait_until(lambda: ids[0] not in view.state.locks, 10, message="q sees the release")
        for _ in range(20):
            got = q.claim(timeout=0)
            if got is not None:
                handed.append(got.id)
                got.complete()
        assert sorted(handed) == sorted(ids) and work_ids(q) == []


def test_threads_sharing_one_view_hand_out_each_item_once(
        etcd_url: str, queue_name: str) -> None:
    """8 threads claim from one Queue (one view, one window, drops by
    any thread while others' attempts are under way: _trying) with a
    window widened to 64; 120 items, each handed out exactly once, work/
    empty, no claim stuck."""
    random.seed(11)
    with Queue(etcd_url, queue_name) as q:
        ids = q.put_many(range(120), in_flight=8)
        q._window = 64
        handed: List[str] = []
        lock = threading.Lock()
        errors: List[BaseException] = []

        def run() -> None:
            try:
                while True:
                    got = q.claim(timeout=2)
                    if got is None:
                        return
                    with lock:
                        handed.append(got.id)
                    got.complete()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, daemon=True) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert sorted(handed) == sorted(ids) and work_ids(q) == []
