"""A new item that may be delayed is planned from a listing of locks/ before it
is offered: QueueView._list decides ``delayed`` in its first locked block,
and an item is never offered before its delay, nor a free one forgotten,
whatever listing another thread applies between the two blocks.  An item
whose planning listing of locks/ is lost (it failed, or was dropped because
the follower changed) is taken until a listing of locks/ from its first
listing on is applied, and every listing of work/ that shows it lists locks/
until then (ViewState.unplanned); the last tests tell that case as it went
before the rule.

Pausing a thread between the two locked blocks of _list is forced by
wrapping the view's condition (no method of the view is changed): that is the
only way to hit the window on purpose.
"""
from __future__ import annotations

import threading
import time

import pytest

from helpers import (hands_out, in_background, lose_first_listing, pause_listing, record_calls,
                     wait_until)

from etcdq_v2 import Queue
from etcdq_v2 import viewstate as view_module
from etcdq_v2.codec import Item
from etcdq_v2.errors import Unavailable

LOCK_TTL = 2
DELAY = 3

class _PauseBetweenBlocks(threading.Condition):
    """The view's condition, which pauses the follower thread (etcdq-view)
    right after it leaves the locked block in which _list decided
    ``delayed`` (its call of _new_delayed), until :meth:`go`."""

    def __init__(self, view) -> None:
        super().__init__()
        self.decided, self.paused, self.resume = threading.local(), threading.Event(), threading.Event()
        self.armed = False
        self.decisions: list = []
        original = view.state.new_delayed

        def new_delayed(work):
            result = original(work)
            if threading.current_thread().name == "etcdq-view":
                self.decisions.append(bool(result))  # the ids
                self.decided.flag = True
            return result

        view.state.new_delayed = new_delayed  # type: ignore[method-assign]

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        if self.armed and getattr(self.decided, "flag", False):
            self.decided.flag = False
            self.armed = False
            self.paused.set()
            assert self.resume.wait(20)
        return result

    def go(self) -> None:
        self.resume.set()


def _install(view) -> _PauseBetweenBlocks:
    """Swap in the pausing condition while nothing waits on the view's."""
    cond = _PauseBetweenBlocks(view)
    view._cond = cond
    view._lock = cond  # what _Changing enters: the same lock, through the pausing __exit__
    return cond


def test_quiet_list_decides_delayed_before_a_concurrent_relist_work(
        etcd_url: str, queue_name: str) -> None:
    """A quiet follower F (list_locks False: a relist
    from catch_up/behind) lists work/ at W1, which shows X, a delayed put of
    another process: new to the view, so ``delayed`` is True.  F pauses
    before its second block.  A claimer's relist_work (the view is quiet, F
    is its follower) lists work/ at W2 > W1, applies it (X now known) and
    lists locks/ for X's delay lock itself.  F then applies its older W1
    listing and, having decided before, lists locks/ (delays) again.  X is
    never offered before its delay lock expired, and is offered within a
    second or two after."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        assert not view.watching_locks
        cond = _install(view)
        x_id = producer.put({"x": 1}, delay=DELAY)
        put_at = time.monotonic()
        cond.armed = True
        thread, outcome = in_background(lambda: view.relist(5), "relister")
        assert cond.paused.wait(5)
        assert cond.decisions == [True]
        assert not view.watching_locks and x_id not in view.state.items
        view.relist_work()  # the claimer's thread: applies X, plans its delay
        assert x_id in view.state.items and x_id in view.state.locks and x_id in view.state.delays
        cond.go()
        thread.join(10)
        assert not thread.is_alive() and "raised" not in outcome, outcome
        assert not view.state.is_free(x_id)
        tried = record_calls(consumer._protocol, "claim")
        got = None
        while got is None and time.monotonic() - put_at < DELAY + 3:
            got = consumer.claim(timeout=0.1)
            assert got is None or got.id == x_id
        assert got is not None and got.id == x_id, "X not offered after its delay"
        assert time.monotonic() - put_at >= DELAY - 0.6
        assert tried == [x_id], tried  # no attempt before the delay (no miss)
        got.complete()
        assert other.claim(timeout=0) is None


def test_quiet_list_older_listing_after_relist_work_forgets_no_free_item(
        etcd_url: str, queue_name: str) -> None:
    """F lists work/ at
    W1 and pauses before applying it; then Y (undelayed) and X (delayed) are
    put by another process; the claimer's relist_work lists them (W2) and
    applies; F then applies its OLDER W1, which lacks them.  The view loses
    both until its next listing of work/; a claim that finds nothing free
    starts watching and lists again: Y is offered at once, X after its
    delay (never before), each once."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        cond = _install(view)
        cond.armed = True
        thread, outcome = in_background(lambda: view.relist(5), "relister")
        assert cond.paused.wait(5)
        assert cond.decisions == [False]
        y_id = producer.put({"y": 1})
        x_id = producer.put({"x": 1}, delay=DELAY)
        put_at = time.monotonic()
        view.relist_work()
        assert {x_id, y_id} <= set(view.state.items)
        cond.go()
        thread.join(10)
        assert not thread.is_alive() and "raised" not in outcome, outcome
        tried = record_calls(consumer._protocol, "claim")
        got = consumer.claim(timeout=2)
        assert got is not None and got.id == y_id
        got.complete()
        got = consumer.claim(timeout=DELAY + 3)
        assert got is not None and got.id == x_id
        assert time.monotonic() - put_at >= DELAY - 0.6
        got.complete()
        assert tried == [y_id, x_id], tried
        assert other.claim(timeout=0) is None


def test_watching_list_own_delayed_put_between_blocks(
        etcd_url: str, queue_name: str) -> None:
    """A view that starts watching: its follower's first block decides
    ``delayed`` (X, a delayed put of another process: True) and so lists
    locks/.  Between that decision and the block that applies the listings,
    this process puts Z with a delay (view.delayed: Z locked, its delay
    planned, Z known) and completes nothing.  The follower's listing of
    work/ (older than Z) then replaces the items: Z is dropped and comes back
    by its events.  Neither X nor Z is tried before its delay; both are
    offered after it."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()  # quiet: X is new to it
        assert not view.watching_locks
        cond = _install(view)
        x_id = producer.put({"x": 1}, delay=DELAY)
        cond.armed = True
        relists = view.relists
        view._watch(locks=True)  # as starved() does: a watching follower lists
        assert cond.paused.wait(5)
        assert cond.decisions == [True]
        z_id = consumer.put({"z": 1}, delay=DELAY)
        put_at = time.monotonic()
        cond.go()
        wait_until(lambda: view.relists > relists, 5, message="the new round's listing")
        tried = record_calls(consumer._protocol, "claim")
        got = []
        while len(got) < 2 and time.monotonic() - put_at < DELAY + 4:
            claim = consumer.claim(timeout=0.2)
            if claim is not None:
                got.append(claim.id)
                claim.complete()
        assert sorted(got) == sorted([x_id, z_id]), got
        assert time.monotonic() - put_at >= DELAY - 1.6
        assert tried == got, tried  # no miss on a delay lock


def test_failed_check_is_planned_from_its_failure(
        etcd_url: str, queue_name: str) -> None:
    """A watching
    view's due CONFIRM check lists locks/; that listing fails after hanging
    (a frozen member, here 1.5 s).  The check is planned CONFIRM s from the
    failure (not from when it was decided, which would be already due and
    could loop), and the next one frees Y, whose dead claimer's lock expired
    before the watch began."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=1) as dead, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        y_id = producer.put({"y": 1})
        entry = dead._protocol.read("work", y_id)
        assert dead._protocol.claim(y_id, entry.version) is not None
        wait_until(lambda: dead._protocol.read("locks", y_id) is None, 5,
                   message="etcd expired the dead claimer's lock")
        assert consumer.claim(timeout=0) is None
        assert view.watching_locks and y_id in view.state.locks
        original = view._protocol.list
        failures = []

        def frozen_once(kind, *args, **kwargs):
            if kind == "locks" and not failures:
                time.sleep(1.5)
                failures.append(time.monotonic())
                raise Unavailable("frozen member (test)")
            return original(kind, *args, **kwargs)

        view._protocol.list = frozen_once  # type: ignore[method-assign]
        wait_until(lambda: time.monotonic() >= view.state.confirm_at, 3, interval=0.01,
                   message="the confirm is due")
        try:
            view.check_locks()
        except Unavailable:
            pass
        assert failures
        assert view.state.confirm_at >= failures[0] + view_module.CONFIRM - 0.01
        assert y_id in view.state.locks
        got = hands_out(consumer, y_id, 2 * view_module.CONFIRM + 1, other)
        got.complete()


def test_item_says_reads_the_item_not_the_payload() -> None:
    """_claimed and _maybe_delayed test the item's own field:
    a payload's "c"/"q" says nothing, junk says nothing, a value too large to
    keep (None) may be delayed but is not read as claimed; the item's own
    fields are read."""
    plain = Item({"c": "someone", "q": 1, "nested": {"c": "x"}}, "tok").encode()
    assert '"c":' in plain and '"q":' in plain
    assert not view_module._claimed(plain)
    assert not view_module._maybe_delayed(plain)
    claimed = Item("p", "tok", 1, "claim-token").encode()
    delayed = Item("p", "tok", requeued=True).encode()
    assert view_module._claimed(claimed) and not view_module._maybe_delayed(claimed)
    assert view_module._maybe_delayed(delayed) and not view_module._claimed(delayed)
    for junk in ('{"c": "x", "q": 1}', '{"t": 5, "c": "x", "q": 1, "p": 1}', 'not json "c": "q":'):
        assert not view_module._claimed(junk)
        assert not view_module._maybe_delayed(junk)
    assert view_module._maybe_delayed(None)
    assert not view_module._claimed(None)


def test_quiet_delays_listing_lost_is_never_retried(etcd_url: str, queue_name: str) -> None:
    """A quiet follower's _list applies a listing
    of work/ that shows X, a delayed put of another process (new to the view:
    ``delayed``), and then lists locks/ for delay locks (_list_locks) after
    its second block.  That listing fails (a member dies, a reply is lost:
    here Unavailable once).  The follower's next round lists work/ again, but
    X is known by now, so ``delayed`` is False and locks/ is not read: X's
    delay lock is never planned, X is offered as free, and a claim tries it
    before its delay (a C1 miss on the delay lock) -- what the view lists
    locks/ to avoid.  Same after a claimer's relist_work whose
    listing of locks/ fails (its claim raises, the next one tries X)."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        assert not view.watching_locks
        x_id = producer.put({"x": 1}, delay=DELAY)
        put_at = time.monotonic()
        lost = lose_first_listing(view._protocol, "locks", "etcdq-view")
        relists = view.relists
        view.relist(5)  # a quiet follower without list_locks (catch_up/behind)
        # a round applies nothing before its listing of locks/:
        # the next round's listing is the first applied.
        wait_until(lambda: lost and view.relists > relists and x_id in view.state.items, 5,
                   message="the failed round and a listing that shows X")
        tried = record_calls(consumer._protocol, "claim")
        got = consumer.claim(timeout=DELAY + 3)
        assert got is not None and got.id == x_id
        got.complete()
        early = time.monotonic() - put_at < DELAY - 0.6
        assert tried == [x_id], (
            f"X (delayed {DELAY} s) tried {len(tried)} times, the first "
            f"{'before' if early or len(tried) > 1 else 'after'} its delay ended: {tried}")


@pytest.mark.parametrize("new_follower", ["quiet", "watching"])
def test_relist_work_delays_listing_dropped_by_a_new_follower(
        etcd_url: str, queue_name: str, new_follower: str) -> None:
    """A claimer's
    relist_work (quiet view, follower F0) applies a listing of work/ that
    shows X, a delayed put of another process, and lists locks/ for its delay
    lock; before that reply is applied, the view gets a new follower F1 (a
    claim that found nothing starts watching; here: relist, as catch_up or a
    stale check do).  _list_locks drops the listing (F0 is not the follower:
    tests/test_view_replaced_follower_listing.py).  F1's _list decides ``delayed`` in its first block with X
    already known, so False, and lists no locks/ for it (a watching F1 neither:
    X has no sign).  X's delay lock is never planned: X is offered as free
    and tried before its delay.  The thread is paused by wrapping
    protocol.list (the reply is in, the claimer has not applied it)."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        assert not view.watching_locks
        x_id = producer.put({"x": 1}, delay=DELAY)
        put_at = time.monotonic()
        answered, resume = pause_listing(view._protocol, "locks", "claimer")
        thread, outcome = in_background(view.relist_work, "claimer")
        assert answered.wait(5)
        assert x_id not in view.state.delays  # not planned yet (nor applied)
        if new_follower == "quiet":
            view.relist(5)  # F1, quiet, list_locks False (catch_up, behind)
        else:
            # F1 watches (what a claim that found nothing free does; starved()
            # itself now waits for the relist_work under way first)
            view._watch(locks=True).wait_listed(5)
            assert view.watching_locks
        resume.set()
        thread.join(10)
        assert not thread.is_alive() and "raised" not in outcome, outcome
        tried = record_calls(consumer._protocol, "claim")
        got = consumer.claim(timeout=DELAY + 3)
        assert got is not None and got.id == x_id
        got.complete()
        assert tried == [x_id], (
            f"X (delayed {DELAY} s) tried {len(tried)} times (put "
            f"{time.monotonic() - put_at:.1f} s ago): {tried}; X's delay was never planned")


def test_quiet_delays_listing_lost_on_the_network(
        etcd_url: str, queue_name: str, proxy) -> None:
    """The same, with a real network fault and no patch:
    the consumer talks to etcd through the fault proxy.  Its quiet follower
    (a relist, as catch_up/behind make) lists work/ (X, a delayed put of
    another process, is new) and then locks/ for X's delay lock; that GET is
    held (a frozen member) until the request times out.  The next round
    lists work/ only (X is known): X's delay is never planned, and the
    consumer tries X before its delay ends."""
    from etcdq_v2.transport import connect
    transport = connect(proxy.url, timeout=1.0)
    with Queue(transport, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer:
        view = consumer._ensure_view()
        assert not view.watching_locks
        x_id = producer.put({"x": 1}, delay=DELAY + 2)
        put_at = time.monotonic()
        failures = record_calls(view, "_failed")
        proxy.hold(match=rb"GET /v2/keys/etcdq/" + queue_name.encode() + rb"/locks")
        relists = view.relists
        try:  # the follower's round lists work/, then its locks/ GET hangs
            view.relist(5)
        except Unavailable:
            pass  # a round applies nothing before its listing of locks/
        wait_until(lambda: failures or x_id in view.state.items, 5,
                   message="the held listing of locks/ timed out")  # applied
        proxy.pass_through()
        wait_until(lambda: view.relists > relists and x_id in view.state.items, 5,
                   message="a listing that shows X")
        tried = record_calls(consumer._protocol, "claim")
        got = consumer.claim(timeout=DELAY + 5)
        assert got is not None and got.id == x_id
        got.complete()
        assert tried == [x_id], (
            f"X (delayed {DELAY + 2} s) tried {len(tried)} times (put "
            f"{time.monotonic() - put_at:.1f} s ago): {tried}; X's delay was never planned")


def test_quiet_delays_listing_lost_costs_a_miss_per_delayed_item(
        etcd_url: str, queue_name: str) -> None:
    """Its size: as test_quiet_delays_listing_lost_is_never_retried,
    with a put_many of 20 delayed items: each is tried (a failed C1 on its
    delay lock) before its delay ends, where none should be."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        ids = producer.put_many([{"n": n} for n in range(20)], delay=DELAY)
        put_at = time.monotonic()
        lost = lose_first_listing(view._protocol, "locks", "etcdq-view")
        relists = view.relists
        view.relist(5)
        wait_until(lambda: lost and view.relists > relists and set(ids) <= set(view.state.items), 5,
                   message="the failed round and a listing that shows the items")
        tried = record_calls(consumer._protocol, "claim")
        assert consumer.claim(timeout=0) is None  # nothing free yet: every try a miss
        early = len(tried)
        done = set()
        while len(done) < len(ids) and time.monotonic() - put_at < DELAY + 5:
            claim = consumer.claim(timeout=0.5)
            if claim is not None:
                done.add(claim.id)
                claim.complete()
        assert done == set(ids)  # all offered after their delay, once each
        assert not early, f"{early} of {len(ids)} delayed items tried before their delay"
