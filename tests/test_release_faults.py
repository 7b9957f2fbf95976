"""A give-back (R1 of release(delay), release(), fail()) whose reply is lost or
whose request is held past the deadline, through the real fault proxy
(tests/faultproxy.py) and a real etcd.

What is checked, for a lone consumer with a backlog (a quiet view, lock_ttl=30):
no LockLost for a give-back that worked, the item offered again as soon as etcd
let it go (QueueView.returned with R1's index), never before (no claim of it
while etcd holds its delay lock), and nothing claimed twice.  Two of these
failed before R1 read its lock back on every compare failure
(Protocol._delay_lock_back): a release(delay) retried after Unavailable whose
first R1 had landed, and a resent R1 read back after its delay lock expired.
"""
from __future__ import annotations

import re
import threading
import time
from collections import Counter
from typing import Any, Callable, List, Optional, Tuple

import pytest

from etcdq_v2 import Claim, LockLost, Queue, Unavailable, connect
from etcdq_v2.errors import KeyMissing
from etcdq_v2.codec import Lock

from faultproxy import FaultProxy
from helpers import claims_until, in_background, wait_until

#: Items in the queue: many more than view.BACKLOG, so the view stays quiet.
ITEMS = 100
LOCK_TTL = 30
#: Seconds after etcd let the item go within which a lone consumer must have it back.
BOUND = 4.0

#: R1 with a delay (or a failure's backoff): the CAS of the lock into a delay lock.
R1_DELAY_REPLY = re.compile(rb'"action":"compareAndSwap","node":\{"key":"[^"]*/locks/')
#: R1 without a delay: the compareAndDelete of the lock.
R1_DELETE_REPLY = re.compile(rb'"action":"compareAndDelete","node":\{"key":"[^"]*/locks/')


def _lock_gone(queue: Queue, item_id: str) -> bool:
    return queue._protocol.read("locks", item_id) is None


def _is_delay_lock(queue: Queue, item_id: str) -> bool:
    entry = queue._protocol.read("locks", item_id)
    return entry is not None and Lock.decode(entry.value).delay


def _claim_head(queue: Queue) -> Claim:
    queue.put_many(range(ITEMS))
    claim = queue.claim(timeout=5)
    assert claim is not None
    assert queue._view is not None and not queue._view.watching_locks  # quiet: a backlog
    return claim


def _drain_and_check(queue: Queue, item_id: str, seen: List[str], delayed: bool) -> None:
    """Claim (and complete) until ``item_id`` comes back: never while etcd holds
    its lock, and within BOUND of etcd letting it go; then drain the rest, and
    check that no item was claimed twice."""
    gone_at: List[float] = []

    def poll() -> None:
        while not gone_at:
            if _lock_gone(queue, item_id):
                gone_at.append(time.monotonic())
                return
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    came_back: Optional[float] = None
    start = time.monotonic()
    while came_back is None and time.monotonic() - start < 15:
        claim = queue.claim(timeout=0.2)
        if claim is None:
            continue
        seen.append(claim.id)
        if claim.id == item_id:
            came_back = time.monotonic()
        claim.complete()
        if delayed and not gone_at:
            time.sleep(0.02)  # slow down while the delay runs: do not drain the backlog
    poller.join(5)
    assert came_back is not None, f"item {item_id} never came back within 15 s"
    assert gone_at, "etcd never let the item go"
    # C1 (create prevExist=false) cannot succeed while etcd holds a lock: the
    # poller saw it gone no later than a poll interval after the claim.
    assert came_back >= gone_at[0] - 0.1, "claimed before etcd let it go"
    assert came_back - gone_at[0] <= BOUND, (
        f"item {item_id} came back {came_back - gone_at[0]:.1f} s after etcd let it go "
        f"({seen.index(item_id)} items claimed before it)")
    seen += _complete_rest(queue)
    counts = Counter(seen)
    assert not [i for i, n in counts.items() if n > 1 and i != item_id], "claimed twice"
    assert counts[item_id] == 2  # the first claim, and the one after the give-back
    assert len(counts) == ITEMS


def _complete_rest(queue: Queue) -> List[str]:
    """Claim and complete what is left: the ids, in the order claimed."""
    ids = []
    while (claim := queue.claim(timeout=0.5)) is not None:
        ids.append(claim.id)
        claim.complete()
    return ids


# -- 1. R1's reply lost, the request resent by the transport ---------------------------

def _give_back_reply_held(queue: Queue, proxy: FaultProxy, reply: Any,
                          give_back: Callable[[Claim], None]) -> Tuple[Claim, Counter]:
    """Claim the head and give it back while R1's ``reply`` is held (the transport
    resends R1): the claim, given back and not lost, and the requests it sent."""
    claim = _claim_head(queue)
    proxy.hold("down", match=reply)
    before = Counter(queue.etcd.requests)
    give_back(claim)
    sent = Counter(queue.etcd.requests) - before
    proxy.release()
    assert claim.outcome in ("released", "failed") and not claim.lost
    return claim, sent


@pytest.mark.parametrize("give_back", [
    pytest.param(lambda claim: claim.release(delay=2), id="release-delay"),
    pytest.param(lambda claim: claim.fail("again"), id="fail-backoff"),
])
def test_r1_delay_reply_lost_and_resent_is_ours_and_comes_back_on_time(
        proxy: FaultProxy, queue_name: str, give_back: Callable[[Claim], None]) -> None:
    """R1 (the lock CAS into a delay lock) applies; its reply is held past the
    request timeout; the transport resends it, etcd says "compare failed"
    (retried), and the read-back finds our delay lock: released, not lost; the
    view plans the expiry at R1's index, and the item is the next claim once
    etcd lets it go, not before."""
    with Queue(connect(proxy.url, timeout=0.5), queue_name, lock_ttl=LOCK_TTL,
               backoff=(2,)) as queue:
        claim, sent = _give_back_reply_held(queue, proxy, R1_DELAY_REPLY, give_back)
        seen = [claim.id]
        assert sent["PUT"] >= 2, sent  # R1 was resent
        assert _is_delay_lock(queue, claim.id)
        view = queue._view
        assert view is not None and claim.id in view.state.delays  # the expiry is planned
        # Not before etcd lets it go: the next claim is another item.
        nxt = queue.claim(timeout=1)
        assert nxt is not None and nxt.id != claim.id
        seen.append(nxt.id)
        nxt.complete()
        _drain_and_check(queue, claim.id, seen, delayed=True)


@pytest.mark.parametrize("give_back", [
    pytest.param(lambda claim: claim.release(), id="release"),
    pytest.param(lambda claim: claim.fail("again"), id="fail-no-backoff"),
])
def test_r1_delete_reply_lost_and_resent_is_ours_and_the_item_is_the_next_claim(
        proxy: FaultProxy, queue_name: str, give_back: Callable[[Claim], None]) -> None:
    """R1 (the lock's compareAndDelete) applies; its reply is held; the resent
    delete finds no key: _still_ours, and the index of the "not found" frees the
    item in the view at once."""
    with Queue(connect(proxy.url, timeout=0.5), queue_name, lock_ttl=LOCK_TTL,
               backoff=(0,)) as queue:
        claim, sent = _give_back_reply_held(queue, proxy, R1_DELETE_REPLY, give_back)
        seen = [claim.id]
        assert sent["DELETE"] == 2, sent  # R1, R1 again
        nxt = queue.claim(timeout=1)
        assert nxt is not None and nxt.id == claim.id, "not the next claim"
        seen.append(nxt.id)
        nxt.complete()
        counts = Counter(seen + _complete_rest(queue))
        assert counts[claim.id] == 2 and len(counts) == ITEMS
        assert all(n == 1 for i, n in counts.items() if i != claim.id)


# -- 2. R1 held in flight past the deadline ---------------------------------------------

def _hold_r1_request(proxy: FaultProxy, queue: Queue) -> None:
    """Hold every request that writes locks/ (R1 and its resends) before etcd gets it."""
    proxy.hold("up", match=re.compile(
        rb"(?:PUT|DELETE) /v2/keys" + re.escape(queue.layout.root.encode()) + rb"/locks/"))


@pytest.mark.parametrize("fault", ["hold-up", "black-hole-down", "black-hole-both"])
def test_r1_held_past_the_deadline_then_landing_the_abandoned_item_comes_back(
        proxy: FaultProxy, queue_name: str, fault: str) -> None:
    """release(delay=1): R1 and its resends are held past the deadline
    (Unavailable); the claim is abandoned (what Worker does); then the held
    copies land: the first applies, the others find the delay lock.  The item is
    claimable after the delay in etcd.  A quiet view was never told (returned()
    is not called on Unavailable): it offers the item at its once-per-lock-TTL
    listing of locks/.  Here lock_ttl=3 so that the bound (a lock TTL after
    etcd let it go, well within two) shows in a few seconds.  Variants: the
    requests held and landing later (hold-up), R1 applied with every reply
    dropped (black-hole-down), R1 never reaching etcd (black-hole-both: the
    abandoned claim's lock expires).  In each, nothing is claimed twice."""
    ttl = 3
    with Queue(connect(proxy.url, timeout=0.5), queue_name, lock_ttl=ttl) as queue:
        claim = _claim_head(queue)
        if fault == "hold-up":
            _hold_r1_request(proxy, queue)
        else:
            proxy.black_hole(fault.rsplit("-", 1)[1])
        with pytest.raises(Unavailable):
            claim.release(delay=1)
        claim.abandon()
        proxy.pass_through()
        seen = [claim.id]
        gone = wait_until(lambda: _lock_gone(queue, claim.id) and time.monotonic(), ttl + 3)
        got = claims_until(queue, claim.id, 2 * ttl + 2)
        assert claim.id in got, f"not back within {2 * ttl + 2} s ({len(got)} others)"
        assert time.monotonic() - gone <= 2 * ttl
        seen += got
        assert Counter(seen)[claim.id] == 2


@pytest.mark.alone  # timing: a busy machine stretches its fault's window past its bounds
@pytest.mark.parametrize("delay", [0, 2])
def test_a_release_retried_after_unavailable_whose_first_r1_landed_is_not_lost(
        proxy: FaultProxy, queue_name: str, delay: int) -> None:
    """release(delay) raises Unavailable (R1 held past the deadline); the held
    R1 then lands (applies); the caller calls release(delay) again, as Claim's
    abandon() docstring allows ("could not reach etcd and will not be retried")
    and as R0 (_given_back: "a resent request, or an earlier call") and F1
    (_our_commit) handle.  delay=0: the delete finds no key, _still_ours:
    released.  delay>0: the CAS finds our own delay lock, but CompareFailed
    is not marked retried (this call sent it once), so no read-back: LockLost,
    the claim "lost", and the quiet view is not told (the item waits for the
    once-per-lock-TTL listing: 30 s)."""
    with Queue(connect(proxy.url, timeout=0.5), queue_name, lock_ttl=LOCK_TTL) as queue:
        claim = _claim_head(queue)
        _hold_r1_request(proxy, queue)
        with pytest.raises(Unavailable):
            claim.release(delay=delay)
        assert claim.outcome is None  # still open: the caller may try again
        proxy.release()
        if delay:
            wait_until(lambda: _is_delay_lock(queue, claim.id), 5,
                       message="the held R1 to land")
        else:
            wait_until(lambda: _lock_gone(queue, claim.id), 5, message="the held R1 to land")
        try:
            claim.release(delay=delay)
            lost = None
        except LockLost as exc:
            lost = exc
        gone = wait_until(lambda: _lock_gone(queue, claim.id) and time.monotonic(), 5)
        got: List[str] = []
        while time.monotonic() - gone < BOUND and claim.id not in got:
            c = queue.claim(timeout=0.2)
            if c is not None:
                got.append(c.id)
                c.complete()
        assert lost is None, (
            f"a retried release whose first R1 applied raised {lost!r} (outcome "
            f"{claim.outcome!r}); the item was given back, and came back to the lone "
            f"consumer within {BOUND} s of etcd letting it go: {claim.id in got} "
            f"({len(got) - (claim.id in got)} other items claimed before it: it came "
            f"only when the backlog ran out, not as the next claim)")
        assert claim.outcome == "released"
        assert claim.id in got, f"not back within {BOUND} s of etcd letting it go"


# -- 3. a pause between the resent R1's "compare failed" and the read-back --------------

def test_r1_resent_then_read_back_after_the_delay_lock_expired_is_not_lost(
        proxy: FaultProxy, queue_name: str) -> None:
    """release(delay=1): R1 applies, its reply is lost; the resend finds the
    delay lock ("compare failed", retried); the thread is then paused (a
    descheduled thread, a slow GET) until etcd expired the delay lock; the
    read-back finds no lock, and _unlock raises LockLost although the give-back
    worked.  The claim is "lost" and the quiet view is never told: a lone
    consumer with a backlog does not get the item until the view lists locks/
    again, a lock TTL (30 s) after its last listing."""
    with Queue(connect(proxy.url, timeout=0.5), queue_name, lock_ttl=LOCK_TTL) as queue:
        claim = _claim_head(queue)
        protocol = queue._protocol
        original = protocol.read
        me = threading.get_ident()

        def paused_read(kind: str, item_id: str) -> Any:
            if kind == "locks" and item_id == claim.id and threading.get_ident() == me:
                wait_until(lambda: original("locks", item_id) is None, 5,
                           message="the delay lock to expire")
            return original(kind, item_id)

        protocol.read = paused_read  # type: ignore[method-assign]
        proxy.hold("down", match=R1_DELAY_REPLY)
        try:
            claim.release(delay=1)
            lost = None
        except LockLost as exc:
            lost = exc
        finally:
            proxy.release()
            protocol.read = original  # type: ignore[method-assign]
        seen = [claim.id]
        got = claims_until(queue, claim.id, BOUND)
        assert lost is None, (
            f"release raised {lost!r} although R1 applied; the item then came back to "
            f"the lone consumer: {claim.id in got} (within {BOUND} s, "
            f"{len(got) - (claim.id in got)} other items claimed before it: it came only "
            f"when the backlog ran out, not as the next claim)")
        assert claim.id in got, (
            f"the given-back item was not back within {BOUND} s of etcd letting it go "
            f"({len(got)} other items claimed)")
        seen += got


def test_r1_resent_while_its_delay_lock_is_expired_but_not_yet_removed_comes_back_on_time(
        proxy: FaultProxy, etcd_url: str, queue_name: str) -> None:
    """release(delay=1): R1 applies and its reply is held by the proxy; once
    etcd shows the delay lock expired but not yet removed (etcd removes
    expired keys at its next sweep, every 0.5 s), the proxy drops the
    connection, and the transport resends R1, which finds our delay lock
    there without a ttl.  That is reported as a second left, not as given
    back at once: a lone consumer with a backlog would try the item at once, be
    refused, and hold it a lock TTL (helpers.force_unswept_resend forces the
    same moment with a wrapped put; here it goes through the proxy).  Whichever way an attempt goes (the sweep
    may come before the resend), the item is back within BOUND of its
    release, its delay being long over."""
    direct = connect(etcd_url)
    with Queue(connect(proxy.url, timeout=5), queue_name, lock_ttl=LOCK_TTL) as queue:
        queue.put_many(range(400), in_flight=16)
        for _ in range(4):
            claim = queue.claim(timeout=5)
            assert claim is not None and queue._view is not None
            assert not queue._view.watching_locks  # quiet: a backlog
            lock_key = queue.layout.key("locks", claim.id)
            proxy.hold("down", match=R1_DELAY_REPLY)
            thread, outcome = in_background(lambda claim=claim: claim.release(delay=1))
            try:
                wait_until(lambda key=lock_key: _expired_unswept(direct, key), 5,
                           interval=0.002, message="the delay lock to expire")
            finally:
                proxy.disconnect(abort=True)  # R1's reply is lost: the transport resends
                proxy.pass_through()
            thread.join(10)
            assert outcome == {"returned": None} and not claim.lost, outcome
            # Claims go on at once: the view must not try the item while etcd
            # still holds its lock, nor hold it after etcd removed it.
            released = time.monotonic()
            came_back = None
            while came_back is None and time.monotonic() - released < BOUND:
                other = queue.claim(timeout=0.2)
                if other is None:
                    continue
                other.complete()
                if other.id == claim.id:
                    came_back = time.monotonic()
                time.sleep(0.02)  # a pace that keeps the backlog for every attempt
            assert came_back is not None, (
                f"item {claim.id} not back within {BOUND} s of its release")
    direct.close()


def _expired_unswept(etcd: Any, key: str) -> bool:
    """The lock is past its expiry (no ttl left) but still there, or already gone."""
    try:
        return not etcd.get(key, quorum=True).node.get("ttl")
    except KeyMissing:
        return True
