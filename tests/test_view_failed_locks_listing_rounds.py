"""A quiet round asked to list locks/ (a view going quiet, a first listing)
whose listing of locks/ fails, fails and is tried again: it has nothing else
to go on.  The listing once per lock TTL is made by relist_work(full=True) in
the claimer's thread (no new follower, the view stays ready), due again
CONFIRM after a failure.  So a failed listing keeps neither a delayed item of
a view going quiet nor a released item taken for a further lock TTL.

Interleavings are forced with the fault proxy (listings of locks/ held until
the request times out); no method of the view is changed.
"""
from __future__ import annotations

import time

import pytest

from helpers import locks_get, wait_until

from etcdq_v2 import Queue
from etcdq_v2.errors import EtcdqError
from etcdq_v2.transport import connect


def _claim_slowly_until(consumer: Queue, wanted: str, seconds: float, got: dict,
                        started: float, on_tick=None) -> None:
    """Claim (and complete) one item every ~0.1 s until ``wanted`` is handed out
    or ``seconds`` pass; ``got``: id -> seconds after ``started``."""
    while time.monotonic() - started < seconds and wanted not in got:
        if on_tick is not None:
            on_tick()
        try:
            claim = consumer.claim(timeout=0)
        except EtcdqError:
            claim = None
        if claim is not None:
            assert claim.id not in got, f"{claim.id} handed out twice"
            got[claim.id] = time.monotonic() - started
            claim.complete()
        time.sleep(0.1)



def test_going_quiet_with_failed_locks_listing_keeps_delayed_item_taken_a_lock_ttl(
        etcd_url: str, queue_name: str, proxy) -> None:
    """1. Consumer C (through the fault proxy, request timeout 0.5 s, lock_ttl
       12) finds nothing: its view watches the whole directory.
    2. Another producer puts D with delay 3 s: C's events show D's delay lock
       (create) and D: D is in _locks, with no planned expiry (_delays: events
       carry none).  Then 200 items are put: C's next claim finds a backlog,
       and candidates() goes quiet with list_locks=True (known locks,
       to learn when D's delay lock expires).
    3. That round's listing of locks/ fails once (held until it times out).
       Since e421f63 (_listed_once: the view listed at its start) the round
       applies work/ alone, keeps D in _locks (no _delays entry, _next_delay
       stays inf: D is not new) and sets _locks_listed = now.
    4. Nothing lists locks/ again until the stale check a lock TTL (12 s)
       later: no expire event reaches a quiet view, relist_work reads work/
       only.  D, free in etcd at 3 s, is not offered to C, which claims
       slowly through its backlog, until ~12.5 s.  On 107f2b0 the round
       raised and was retried 0.1 s later (the view stayed _ready with its
       watching state: claims went on meanwhile), listed locks/, planned D's
       expiry, and D was handed out at ~3-4 s.  With locks/ listings failing
       intermittently, each failure puts D off another lock TTL.

    Suggested fix: use the new exemption only for check_locks' stale relist
    (a flag on the follower), not for a view going quiet (whose view stays
    ready while its round retries); or, on failure, keep the check due soon:
    _next_delay = now + CONFIRM and have that delays-only listing also free
    items whose lock was learnt from events (no _delays entry) when absent."""
    lock_ttl = 12
    transport = connect(proxy.url, timeout=0.5)
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as producer, \
            Queue(transport, queue_name, lock_ttl=lock_ttl) as consumer:
        assert consumer.claim(timeout=0.3) is None
        view = consumer._ensure_view()
        wait_until(lambda: view.watching_locks and view._follower._listed.is_set(), 5,
                   message="C watching")
        d_id = producer.put({"d": 1}, delay=4)
        put_at = time.monotonic()
        wait_until(lambda: d_id in view.state.locks, 3, message="D's delay lock heard")
        producer.put_many([{"b": n} for n in range(200)])
        wait_until(lambda: len(view.state.in_free) >= 32, 3, message="backlog heard")
        proxy.hold(match=locks_get(queue_name))
        got: dict = {}
        first = consumer.claim(timeout=0)  # goes quiet: list_locks=True round
        assert first is not None and not view.watching_locks
        first.complete()
        time.sleep(2.0)  # the round's listing of locks/ times out (deadline 1.5 s)
        proxy.pass_through()
        _claim_slowly_until(consumer, d_id, 9.0, got, put_at)
        assert d_id in got and got[d_id] <= 7.0, (
            f"D (delay 4 s) handed out at {got.get(d_id)} s after its put "
            f"(None: not in 9 s); D in _locks: {d_id in view.state.locks}, "
            f"_delays: {view.state.delays}, _next_delay - now: "
            f"{view.state.next_delay - time.monotonic():.1f}, lock TTL {lock_ttl} s")


def test_failed_stale_listing_keeps_released_item_taken_another_lock_ttl(
        etcd_url: str, queue_name: str, proxy) -> None:
    """1. Quiet consumer C (proxy, timeout 0.5 s, deadline 1.5 s, lock_ttl 4)
       with a backlog; O holds the head B0, C's claim misses it: B0 is taken
       in C's view.  O releases B0 (R: free in etcd; C hears nothing).
    2. A lock TTL after C's last listing of locks/, check_locks' stale
       relist lists work/ and locks/; the listing of locks/ fails once (held
       ~2 s, then etcd answers again).
    3. e421f63: the round applies work/ alone, B0 stays in _locks, and
       _locks_listed = now: nothing lists locks/ until a lock TTL later, so
       B0, free in etcd, is offered ~4 s (a lock TTL; 30 s by default) after
       the failure, although every listing after the failure would work.
       On 107f2b0 the round was retried 0.1-2 s later and B0 was offered as
       soon as etcd answered (claims raised during the failure).

    Suggested fix: a failed stale listing should be due again soon, not a
    lock TTL later: e.g. _locks_listed = now - lock_ttl + CONFIRM (the
    retry cadence of the due/confirm listings), ideally run off the claim
    path (the relist in the background without resetting _ready), so a
    failing locks/ costs one warning per CONFIRM, not a TTL of stranding."""
    lock_ttl = 4
    transport = connect(proxy.url, timeout=0.5)
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as other, \
            Queue(transport, queue_name, lock_ttl=lock_ttl) as consumer:
        ids = producer.put_many([{"b": n} for n in range(150)])
        view = consumer._ensure_view()
        assert not view.watching_locks
        listed = view.state.locks_listed
        held = other.claim(timeout=0)
        assert held is not None and held.id == ids[0]
        first = consumer.claim(timeout=0)
        assert first is not None and ids[0] in view.state.locks
        first.complete()
        held.release()  # free in etcd; C's quiet view does not hear
        got: dict = {}
        wait_until(lambda: time.monotonic() - listed >= lock_ttl - 0.5, lock_ttl,
                   message="nearly a lock TTL")
        proxy.hold(match=locks_get(queue_name))
        try:
            _claim_slowly_until(consumer, ids[0], lock_ttl + 2.0, got, listed)
        finally:
            proxy.pass_through()
        assert ids[0] not in got
        passed = time.monotonic()
        after: dict = {}
        _claim_slowly_until(consumer, ids[0], 4.5, after, passed)
        assert ids[0] in after and after[ids[0]] <= 2.5, (
            f"B0 (released, free in etcd) handed out {after.get(ids[0])} s after listings "
            f"of locks/ worked again (None: not in 4.5 s); in _locks: {ids[0] in view.state.locks}, "
            f"last listing of locks/ {time.monotonic() - view.state.locks_listed:.1f} s ago, "
            f"lock TTL {lock_ttl} s")



def test_first_listing_without_locks_fails_the_round(
        etcd_url: str, queue_name: str, proxy) -> None:
    """A new view whose first listing of locks/ fails is not made
    ready by work/ alone (_listed_once False): its first claim raises, hands
    out nothing (the head is held elsewhere); once locks/ answers, claims
    hand out the free items, never the held one."""
    transport = connect(proxy.url, timeout=0.5)
    with Queue(etcd_url, queue_name, lock_ttl=30) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=30) as other, \
            Queue(transport, queue_name, lock_ttl=30) as consumer:
        ids = producer.put_many([{"b": n} for n in range(5)])
        held = other.claim(timeout=0)
        assert held is not None and held.id == ids[0]
        proxy.hold(match=locks_get(queue_name))
        try:
            with pytest.raises(EtcdqError):
                consumer.claim(timeout=0)
            assert not consumer._view.state.ready
        finally:
            proxy.pass_through()
        got = wait_until(lambda: consumer.claim(timeout=0), 5, ignore=(EtcdqError,))
        assert got.id != ids[0]
        got.complete()
        held.complete()
