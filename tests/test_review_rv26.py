"""Hostile review rv26 of 56660c6 (QueueView._locks_retry: a failed
once-per-lock-TTL listing of locks/ backs off CONFIRM, 2, 4 ... up to a lock
TTL; reset only by a full _reconcile_locks).  Findings fail on 56660c6; held
checks are named test_rv26_held_* and pass.  The finding is fixed since: any
listing of locks/ applied resets the backoff.  (Its step 2 waited for the
delayed item to be handed out, which a lone consumer does in put order,
after its 300-item backlog; it now waits for the view to hold it free.)"""
from __future__ import annotations

import time

from helpers import locks_get

from etcdq_v2 import Queue
from etcdq_v2.errors import EtcdqError
from etcdq_v2.transport import connect
from etcdq_v2.view import CONFIRM


def _claim_one(consumer):
    try:
        claim = consumer.claim(timeout=0)
    except EtcdqError:
        return None
    if claim is not None:
        claim.complete()
    return claim


def test_rv26_backoff_survives_recovery_when_taken_items_free_without_full_listing(
        etcd_url: str, queue_name: str, proxy) -> None:
    """FINDING (low/medium): _locks_retry is reset only by a full listing of
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
        assert delayed in view._locks
        # 1. listings of locks/ fail: the backoff climbs to a lock TTL.
        proxy.hold(match=locks_get(queue_name))
        try:
            end = time.monotonic() + 12
            while view._locks_retry < lock_ttl and time.monotonic() < end:
                view._locks_listed = time.monotonic() - lock_ttl  # stale now
                _claim_one(consumer)
        finally:
            proxy.pass_through()
        assert view._locks_retry == lock_ttl
        # 2. listings work again; the delay lock expires; the delays-only
        #    listing frees the item (a lone consumer takes it in put order,
        #    after the backlog: it is enough that the view holds it free).
        end = time.monotonic() + 12
        while view._locks and time.monotonic() < end:
            _claim_one(consumer)
            time.sleep(0.2)
        assert not view._locks and not view.watching_locks
        assert view._is_free(delayed)
        # 3. A new taken item (held by `other`, missed by the consumer).
        end = time.monotonic() + 8
        held = None
        while time.monotonic() < end and not view._locks:
            held = other.claim(timeout=0)
            _claim_one(consumer)
            if held.id not in view._locks:
                held.complete()
        assert view._locks
        # 4. Much later (backdated) the stale check fails once.
        proxy.hold(match=locks_get(queue_name))
        try:
            view._locks_listed = time.monotonic() - lock_ttl
            _claim_one(consumer)
        finally:
            proxy.pass_through()
        due_in = view._locks_listed + lock_ttl - time.monotonic()
        retry = view._locks_retry
        held.complete()
        assert retry == CONFIRM and due_in <= CONFIRM + 0.2, (
            f"one failure after recovery: next stale check in {due_in:.1f} s "
            f"(_locks_retry {retry}), expected CONFIRM {CONFIRM} s")


def test_rv26_held_full_listing_resets_backoff(etcd_url: str, queue_name: str, proxy) -> None:
    """Held.  While items stay taken, the first stale listing that works after
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
        assert held.id in view._locks and not view.watching_locks
        proxy.hold(match=locks_get(queue_name))
        try:
            for _ in range(2):
                view._locks_listed = time.monotonic() - lock_ttl
                _claim_one(consumer)
            retry = view._locks_retry  # before any listing can work again
        finally:
            proxy.pass_through()
        assert retry >= 2 * CONFIRM
        view._locks_listed = time.monotonic() - lock_ttl
        _claim_one(consumer)
        assert view._locks_retry == 0.0
        held.complete()
