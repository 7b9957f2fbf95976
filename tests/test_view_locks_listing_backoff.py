"""The once-per-lock-TTL listing of locks/ (QueueView.check_locks:
relist_work(full=True) in the claimer's thread) backs off when it fails:
due again CONFIRM later, then twice as long after each failure, up to a lock
TTL, so a failing listing does not cost the claimer a deadline every CONFIRM;
any listing of locks/ applied resets the backoff; and one full relist runs at
a time.
"""
from __future__ import annotations

import threading
import time

from helpers import in_background, locks_get, pause_listing

from etcdq_v2 import Queue
from etcdq_v2.errors import EtcdqError
from etcdq_v2.transport import connect
from etcdq_v2.viewstate import CONFIRM


def _quiet_with_taken_head(view, consumer, other, producer, n=150):
    ids = producer.put_many([{"b": k} for k in range(n)])
    assert not view.watching_locks
    held = other.claim(timeout=0)
    assert held is not None and held.id == ids[0]
    first = consumer.claim(timeout=0)  # misses the head: taken in the view
    assert first is not None and ids[0] in view.state.locks
    first.complete()
    return ids, held


def _locks_calls(protocol, thread_name=None):
    calls = []
    original = protocol.list

    def recorded(kind, *args, **kwargs):
        if kind == "locks" and (thread_name is None
                                or threading.current_thread().name == thread_name):
            calls.append(time.monotonic())
        return original(kind, *args, **kwargs)
    protocol.list = recorded
    return calls



def test_failing_locks_listing_blocks_the_claimer_a_deadline_every_confirm(
        etcd_url: str, queue_name: str, proxy) -> None:
    """1. Quiet consumer C (proxy, timeout 0.5 s, deadline 1.5 s, lock_ttl 10)
       with a backlog; its claim missed the head (held by O): _locks is not
       empty, so the once-per-lock-TTL check applies.  The test backdates
       _locks_listed by a lock TTL instead of waiting one.
    2. Every listing of locks/ is held (fails after the deadline).
    3. C claims one item per ~0.1 s.  The stale check runs relist_work(full)
       in the claimer's thread: work/ listed, locks/ fails after 1.5 s, and
       _locks_unlisted_due sets _locks_listed so that it is due again 1 s
       later.  So every ~2.5 s the claim blocks 1.5 s (60 % of the claimer's
       time; with default timeouts likewise) and logs a warning.  e421f63
       set _locks_listed = now after the failure: one blocked claim per TTL.

    Suggested fix: keep "due again soon" but take it off the claim path: run
    the retry of a failed stale listing in the background (or in the
    follower thread without resetting _ready), or back it off (CONFIRM,
    doubling up to the lock TTL) and retry only locks/ (work/ was applied)."""
    lock_ttl = 10
    transport = connect(proxy.url, timeout=0.5)
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as other, \
            Queue(transport, queue_name, lock_ttl=lock_ttl) as consumer:
        view = consumer._ensure_view()
        # 400 items: 12 s of claims must not bring the backlog under 32, where
        # the view starts watching and its follower lists locks/ too.
        ids, held = _quiet_with_taken_head(view, consumer, other, producer, n=400)
        # The claimer's listings (the stale check), not a follower's.
        calls = _locks_calls(view._protocol, thread_name=threading.current_thread().name)
        proxy.hold(match=locks_get(queue_name))
        blocked, failed, started = 0.0, 0, time.monotonic()
        try:
            view.state.locks_listed = time.monotonic() - lock_ttl  # a lock TTL ago
            while time.monotonic() - started < 12.0:
                t0 = time.monotonic()
                try:
                    claim = consumer.claim(timeout=0)
                except EtcdqError:
                    claim, failed = None, failed + 1
                blocked += time.monotonic() - t0
                if claim is not None:
                    claim.complete()
                time.sleep(0.1)
        finally:
            proxy.pass_through()
            held.complete()
        # Since the fix the retries back off (CONFIRM, doubling up to a lock
        # TTL): the gaps between failed listings grow.  On 0dd86d0 they were
        # even, one request deadline plus CONFIRM, for as long as they failed.
        gaps = [b - a for a, b in zip(calls, calls[1:])]
        assert len(calls) >= 3 and all(b > a + 0.5 for a, b in zip(gaps, gaps[1:])), (
            f"claims blocked {blocked:.1f} s of 12 s while locks/ listings failed "
            f"({len(calls)} listings of locks/, gaps {[round(g, 1) for g in gaps]}, "
            f"{failed} claims raised); lock TTL {lock_ttl} s")



def test_one_full_relist_at_a_time(etcd_url: str, queue_name: str, proxy) -> None:
    """Two claimer threads find the stale check due at once: while A's
    relist_work(full) is under way (paused after its listing of locks/), B's
    claim lists nothing and is handed an item at once; A's listing is then
    applied (the held head stays taken) and the check is not due again."""
    lock_ttl = 10
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as other, \
            Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as consumer:
        view = consumer._ensure_view()
        ids, held = _quiet_with_taken_head(view, consumer, other, producer)
        reached, resume = pause_listing(view._protocol, "locks", "A")
        b_calls = _locks_calls(view._protocol, "MainThread")
        view.state.locks_listed = time.monotonic() - lock_ttl
        thread, outcome = in_background(lambda: consumer.claim(timeout=0), name="A")
        try:
            assert reached.wait(30)  # a bound for a loaded machine, not a speed
            # B is handed an item while A's relist is still paused: it did not
            # wait for A's listing (resume is set only below), nor list itself.
            claim = consumer.claim(timeout=0)
            assert claim is not None and claim.id != ids[0] and not b_calls
            assert not resume.is_set() and thread.is_alive()
            claim.complete()
        finally:
            resume.set()
        thread.join(5)
        assert "raised" not in outcome, outcome
        if outcome.get("returned") is not None:
            assert outcome["returned"].id != ids[0]
            outcome["returned"].complete()
        assert ids[0] in view.state.locks
        assert time.monotonic() - view.state.locks_listed < lock_ttl - 2
        assert view.state.ready
        held.complete()


def _claim_one(consumer):
    try:
        claim = consumer.claim(timeout=0)
    except EtcdqError:
        return None
    if claim is not None:
        claim.complete()
    return claim


def test_backoff_survives_recovery_when_taken_items_free_without_full_listing(
        etcd_url: str, queue_name: str, proxy) -> None:
    """As it went before the rule: _locks_retry was reset only by a full listing of
    locks/; the stale check that makes one runs only while _locks is not
    empty.  If the taken items go without one (a delay lock expiring, freed
    by a delays-only listing; items this process finished), the backoff
    stays at a lock TTL after listings of locks/ work again, for as long as
    the view stays quiet.  The next stale check that fails once, however
    long after, then waits a full lock TTL, not CONFIRM: an item whose
    lock expired stays taken up to ~2 lock TTLs.

    Suggested fix: reset _locks_retry on any listing of locks/ that worked
    (also delays-only / confirm ones), or when _locks becomes empty, or
    when the stale check finds it has nothing to check."""
    lock_ttl = 4
    transport = connect(proxy.url, timeout=0.5)
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as other, \
            Queue(transport, queue_name, lock_ttl=lock_ttl) as consumer:
        view = consumer._ensure_view()
        producer.put_many([{"b": k} for k in range(300)])
        assert _claim_one(consumer) is not None
        assert not view.watching_locks
        delayed = consumer.put({"d": 1}, delay=6)
        assert delayed in view.state.locks
        # 1. listings of locks/ fail: the backoff climbs to a lock TTL.
        proxy.hold(match=locks_get(queue_name))
        try:
            end = time.monotonic() + 12
            while view.state.locks_retry < lock_ttl and time.monotonic() < end:
                view.state.locks_listed = time.monotonic() - lock_ttl  # stale now
                _claim_one(consumer)
        finally:
            proxy.pass_through()
        assert view.state.locks_retry == lock_ttl
        # 2. listings work again; the delay lock expires; the delays-only
        #    listing frees the item (a lone consumer takes it in put order,
        #    after the backlog: it is enough that the view holds it free).
        end = time.monotonic() + 12
        while view.state.locks and time.monotonic() < end:
            _claim_one(consumer)
            time.sleep(0.2)
        assert not view.state.locks and not view.watching_locks
        assert view.state.is_free(delayed)
        # 3. A new taken item (held by `other`, missed by the consumer).
        end = time.monotonic() + 8
        held = None
        while time.monotonic() < end and not view.state.locks:
            held = other.claim(timeout=0)
            _claim_one(consumer)
            if held.id not in view.state.locks:
                held.complete()
        assert view.state.locks
        # 4. Much later (backdated) the stale check fails once.
        proxy.hold(match=locks_get(queue_name))
        try:
            view.state.locks_listed = time.monotonic() - lock_ttl
            _claim_one(consumer)
        finally:
            proxy.pass_through()
        due_in = view.state.locks_listed + lock_ttl - time.monotonic()
        retry = view.state.locks_retry
        held.complete()
        assert retry == CONFIRM and due_in <= CONFIRM + 0.2, (
            f"one failure after recovery: next stale check in {due_in:.1f} s "
            f"(_locks_retry {retry}), expected CONFIRM {CONFIRM} s")


def test_full_listing_resets_backoff(etcd_url: str, queue_name: str, proxy) -> None:
    """While items stay taken, the first stale listing that works after
    failures resets the backoff to 0."""
    lock_ttl = 4
    transport = connect(proxy.url, timeout=0.5)
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as other, \
            Queue(transport, queue_name, lock_ttl=lock_ttl) as consumer:
        # The items before the view's first listing: a view that listed none
        # starts watching at its first claim, and going quiet during the hold
        # its quiet round lists locks/ until that works, which resets the
        # backoff on its own (it failed so in CI once).
        producer.put_many([{"b": k} for k in range(80)])
        view = consumer._ensure_view()
        held = other.claim(timeout=0)
        _claim_one(consumer)
        assert held.id in view.state.locks and not view.watching_locks
        proxy.hold(match=locks_get(queue_name))
        try:
            for _ in range(2):
                view.state.locks_listed = time.monotonic() - lock_ttl
                _claim_one(consumer)
            retry = view.state.locks_retry  # before any listing can work again
        finally:
            proxy.pass_through()
        assert retry >= 2 * CONFIRM
        view.state.locks_listed = time.monotonic() - lock_ttl
        _claim_one(consumer)
        assert view.state.locks_retry == 0.0
        held.complete()
