"""An item this process gives back (QueueView.returned) is offered by its own
quiet view when etcd lets it go, whatever listing of locks/ comes late.

R1 returns its etcd index (protocol.GivenBack): a listing of locks/ taken
before R1 and applied after returned() neither drops the planned delay of an
item given back with a delay, nor marks an item given back at once locked
again (the view remembers the newest index at which each item's lock was
seen gone, ViewState.gone, and ignores older signs of a lock).

Each test forces, against a real etcd, the interleaving its docstring tells
(as it went before the rule).  The pauses of one thread are forced (a wrapper
around Protocol.list for that thread only: a descheduled thread, a slow
reply); etcd is real.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Tuple

from etcdq_v2 import Claim, Queue
from etcdq_v2.view import QueueView
from etcdq_v2.viewstate import BACKLOG

from helpers import claims_until, in_background, wait_until

#: Items in the queue: many more than view.BACKLOG, so the view stays quiet.
ITEMS = 100
#: A lock TTL long enough that "up to a lock TTL late" is plain to see.
LOCK_TTL = 30
#: How long after etcd let the item go a lone consumer claiming all along
#: must have it back (it takes the head of its view): the fix's promise.
BOUND = 4.0


def _pause_locks_listing(queue: Queue, applies_to: Callable[[], bool]
                         ) -> "tuple[threading.Event, threading.Event, Callable[[], None]]":
    """Make a listing of locks/ by a thread ``applies_to()`` accepts wait, after
    etcd answered, until ``go`` is set: ``(listed, go, undo)``."""
    protocol = queue._view._protocol
    original = protocol.list
    listed, go = threading.Event(), threading.Event()

    def paused_list(directory: str, *args: Any, **kwargs: Any) -> Any:
        result = original(directory, *args, **kwargs)
        if directory == "locks" and applies_to() and not go.is_set():
            listed.set()
            assert go.wait(15)
        return result

    protocol.list = paused_list  # type: ignore[method-assign]

    def undo() -> None:
        go.set()
        protocol.list = original  # type: ignore[method-assign]
    return listed, go, undo


def _assert_next_claim(queue: Queue, item_id: str) -> None:
    """A lone consumer takes the head of its view: once etcd let the given-back
    item go, it must be the next claim (the promise of returned(), asserted as in
    tests/test_quiet_view_returned.py).  On failure, say how many items were
    claimed ahead of it and what the view holds."""
    view = queue._view
    assert view is not None
    locked, planned = item_id in view.state.locks, item_id in view.state.delays
    got = claims_until(queue, item_id, BOUND)
    assert got and got[0] == item_id, (
        f"item {item_id}, free in etcd, was not the next claim of a lone consumer: "
        f"{len(got) - (item_id in got)} items were claimed ahead of it "
        f"({'then it came, when the backlog ran out and the view watched again' if item_id in got else 'and it never came'}, "
        f"watching={view.watching_locks}); before claiming, the view held it "
        f"locked={locked} with a planned expiry={planned}: it waits for the "
        f"once-per-lock-TTL listing ({LOCK_TTL} s) or for the backlog to run out")



def listing_races_give_back(queue: Queue, give_back: Callable[[Claim, QueueView], None]
                            ) -> Tuple[Claim, Dict[str, Any]]:
    """T1 claims X (the head of a quiet view with a backlog); a delayed put Y of
    this process falls due and etcd sweeps Y's lock; T2's claim() lists locks/
    (check_locks: Y due) and is paused after etcd answered; T1 gives X back
    (``give_back``, which checks what the view noted); T2 applies its listing
    and goes on.  X's claim, and T2's outcome (see helpers.in_background)."""
    queue.put_many(range(ITEMS))
    x = queue.claim(timeout=5)
    assert x is not None
    view = queue._view
    assert view is not None and not view.watching_locks
    y = queue.put("y", delay=1)
    # Y's plan falls due, and etcd has swept Y's lock by the time T2 lists
    # (else T2's listing plans Y again, and that next listing plans X too).
    wait_until(lambda: view.state.next_delay <= time.monotonic()
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
        give_back(x, view)
        go.set()
        thread.join(10)
        assert not thread.is_alive() and "raised" not in outcome, outcome
    finally:
        undo()
    return x, outcome


def switch_races_fail(queue: Queue, producer: Queue,
                      noted: Callable[[Claim, QueueView], None]) -> Claim:
    """A watching view (its consumer found nothing) holds X, claimed by this
    process; ``producer`` puts a backlog; the next claim switches the view to
    quiet, whose follower's listing of locks/ is paused after etcd answered;
    X.fail() (the queue's backoff), and ``noted`` checks what the view noted;
    then the follower applies its listing.  X's claim."""
    queue.put("x")
    x = queue.claim(timeout=5)
    assert x is not None
    view = queue._view
    assert view is not None
    assert queue.claim(timeout=0) is None  # starved: the view watches everything
    wait_until(lambda: view.watching_locks and x.id in view.state.locks, 5,
               message="a watching view holding X locked")
    producer.put_many(range(ITEMS))
    wait_until(lambda: len(view.state.in_free) >= BACKLOG, 10,
               message="the watching view heard of the backlog")
    listed, go, undo = _pause_locks_listing(
        queue, lambda: threading.current_thread().name == "etcdq-view")
    try:
        other = queue.claim(timeout=5)  # candidates(): the switch to quiet
        assert other is not None and other.id != x.id
        assert listed.wait(10), "the quiet follower never listed locks/"
        assert not view.watching_locks
        x.fail("again")
        noted(x, view)
        go.set()
        wait_until(view._follower._listed.is_set, 5,
                   message="the quiet follower applied its listing")
        other.complete()
    finally:
        undo()
    return x


def release_with_a_delay(x: Claim, view: QueueView) -> None:
    x.release(delay=1)
    delay_planned(x, view)


def delay_planned(x: Claim, view: QueueView) -> None:
    assert x.id in view.state.delays, "returned() did not plan X's delay"


def test_a_concurrent_locks_listing_drops_the_planned_delay_of_a_released_item(
        etcd_url: str, queue_name: str) -> None:
    """The plan returned() notes in _delays is dropped by a listing of locks/
    taken before R1 and applied after returned(): _plan_delays pops the delay
    of every listed lock that is not a delay lock ("a claim's lock: refreshed,
    not waited for"), and the listing shows our claim's lock as it was before
    R1.  The item stays in _locks with no plan, and its own quiet view offers
    it only at the once-per-lock-TTL listing: up to a lock TTL late, the case
    returned() set out to mend.

    Interleaving (two threads of one Queue, as in a Worker with concurrency 2):
      T1: claims X (the head of a quiet view with a backlog);
      a delayed put Y of this process falls due (its plan, from delayed()),
          and etcd sweeps Y's lock;
      T2: claim() -> check_locks(): Y due -> _list_locks: GET locks/ at L (X's
          claim lock there, not a delay lock); descheduled before applying it;
      T1: X.release(delay=1): R0, R1 (X's lock now a delay lock, ttl 1);
          returned(X, 1) notes _delays[X];
      T2: applies the listing taken at L: _plan_delays pops _delays[X].
    etcd expires X's delay lock 1 s later; the lone consumer, claiming all
    along, takes every item after X and not X, until the backlog runs out or
    the once-per-lock-TTL listing (30 s).  (Had Y's lock not been swept yet,
    T2's listing would plan Y again 0.2 s later, and that listing, while X's
    delay lock lives, plans X too: the window is a listing that frees the
    last planned item.)
    """
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as queue:
        x, _ = listing_races_give_back(queue, release_with_a_delay)
        wait_until(lambda: queue._protocol.read("locks", x.id) is None, 10,
                   message="etcd still holds X's delay lock")
        _assert_next_claim(queue, x.id)


def test_the_switch_to_quiet_drops_the_planned_delay_of_a_failed_item(
        etcd_url: str, queue_name: str) -> None:
    """The same through the watching -> quiet switch, with one claimer thread.

    Interleaving:
      a watching view (its consumer found nothing) holds X, claimed by this
      process; another process puts a backlog (> BACKLOG items after X);
      claim() -> candidates(): a backlog -> _watch(locks=False, list_locks=True)
          -> the new quiet follower (its own thread) lists work/, then
          locks/ at L (X's claim lock there); the claim returns an item;
      X.fail(): R1 puts X's delay lock (backoff 1 s); returned(X, 1) notes
          _delays[X] (X is locked in the view: its lock's create event);
      the follower applies its listing taken at L: _plan_delays pops _delays[X].
    The quiet view hears no expiry: X, the head, is not claimed for up to a
    lock TTL after etcd let it go.  (The pause of the follower's locks/ GET
    stands for a slow reply; in a real run the handler fails within
    milliseconds of the claim that made the switch.)
    """
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL, backoff=(1,)) as queue, \
            Queue(etcd_url, queue_name) as producer:
        x = switch_races_fail(queue, producer, delay_planned)
        wait_until(lambda: queue._protocol.read("locks", x.id) is None, 10,
                   message="etcd still holds X's backoff lock")
        _assert_next_claim(queue, x.id)


def release_at_once(x: Claim, view: QueueView) -> None:
    x.release()
    freed(x, view)


def freed(x: Claim, view: QueueView) -> None:
    assert x.id not in view.state.locks, "returned() did not free X"


def test_a_concurrent_locks_listing_relocks_an_item_released_at_once(
        etcd_url: str, queue_name: str) -> None:
    """The first test's interleaving with release() at once (delay 0) instead of a delay.

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


def test_the_switch_to_quiet_relocks_an_item_failed_with_no_backoff(
        etcd_url: str, queue_name: str) -> None:
    """The second test's interleaving (watching -> quiet switch) with a backoff of 0:
    fail() deletes the lock (R1 at I_R1), returned(X, 0, I_R1) frees X, then the
    new quiet follower applies its listing of locks/ taken before R1:
    _reconcile_locks -> _locked(X, C1 index) marks X locked again, for good
    until the once-per-lock-TTL listing (a quiet view hears no delete event)."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL, backoff=(0,)) as queue, \
            Queue(etcd_url, queue_name) as producer:
        x = switch_races_fail(queue, producer, freed)  # backoff 0: the lock is deleted
        assert queue._protocol.read("locks", x.id) is None
        _assert_next_claim(queue, x.id)
