"""The heartbeat keeps every lock of a queue however many it holds, and
Claim.lost is right whatever the heartbeat is doing.

Real etcd; the holder reaches it through the fault proxy (tests/faultproxy.py),
a thief directly.  The invariant sampled throughout: whenever the thief holds
an item, the holder's claim of it already says ``lost``.
"""
from __future__ import annotations

import threading
import time
from typing import Dict, Iterator, List, Tuple

import pytest

from etcdq_v2 import Claim, Queue
from etcdq_v2.codec import Lock

from faultproxy import FaultProxy
from helpers import wait_until

CLAIMS = 16
LOCK_TTL = 3     # a refresh every second
DELAY_MS = 150   # each way: a request takes ~0.3 s, far under the 5 s timeout


@pytest.fixture
def holder(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    """A queue reaching etcd through the proxy, holding CLAIMS claims."""
    with Queue(proxy.url, queue_name, lock_ttl=LOCK_TTL) as queue:
        yield queue


@pytest.fixture
def thief(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    with Queue(etcd_url, queue_name, lock_ttl=30) as queue:
        yield queue


def _claim_all(holder: Queue) -> Dict[str, Claim]:
    holder.put_many([{"n": n} for n in range(CLAIMS)])
    claims: Dict[str, Claim] = {}
    while len(claims) < CLAIMS:
        claim = holder.claim(timeout=5)
        assert claim is not None
        claims[claim.id] = claim
    return claims


class Thief:
    """Claims whatever it can for ``seconds``; for each item it got, whether the
    holder's claim said lost at that moment (and at every later look)."""

    def __init__(self, queue: Queue, held: Dict[str, Claim]) -> None:
        self.queue, self.held = queue, held
        self.taken: List[Claim] = []
        self.seen: List[Tuple[str, bool]] = []  # (item id, holder's claim lost?)

    def run(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            claim = self.queue.claim(timeout=0.1)
            if claim is not None:
                self.taken.append(claim)
            # Sample every item held now (lost, once True, stays True).
            self.seen.extend((taken.id, self.held[taken.id].lost) for taken in self.taken)

    @property
    def while_not_lost(self) -> List[str]:
        return sorted({item_id for item_id, lost in self.seen if not lost})


def _lock_holder(queue: Queue, item_id: str) -> str:
    entry = queue._protocol.read("locks", item_id)
    return Lock.decode(entry.value).node_id if entry is not None else ""


def test_a_queue_holding_many_claims_over_a_slow_network_keeps_every_lock(
        proxy: FaultProxy, holder: Queue, thief: Queue) -> None:
    """16 claims, a refresh every second, each request ~0.3 s: refreshed one
    after another (16 x 0.3 s per round, more than the 3 s TTL) the locks
    expire while the claims still say they hold them; refreshed together, each
    lock is refreshed every ~1.3 s and none is ever free."""
    claims = _claim_all(holder)
    proxy.delay(DELAY_MS)
    robber = Thief(thief, claims)
    robber.run(3 * LOCK_TTL)
    assert robber.while_not_lost == [], "another consumer held items the holder still held"
    assert [claim.id for claim in robber.taken] == []
    assert [claim.id for claim in claims.values() if claim.lost] == []
    proxy.pass_through()
    # Each lock is still the holder's, three TTLs on: each one was refreshed.
    assert {item_id: _lock_holder(thief, item_id) for item_id in claims} == \
        {item_id: holder.node_id for item_id in claims}
    for claim in claims.values():
        claim.complete()
    assert thief.stats()["completed"] == CLAIMS


def test_claims_whose_refreshes_get_no_answer_are_lost_before_another_consumer_takes_them(
        proxy: FaultProxy, holder: Queue, thief: Queue) -> None:
    """etcd answers none of the holder's refreshes (a black hole): every claim
    says lost once its own lock's TTL has passed, before the lock expires in
    etcd, although the refreshes of the other claims hang meanwhile."""
    claims = _claim_all(holder)
    proxy.black_hole()
    robber = Thief(thief, claims)
    robber.run(LOCK_TTL + 4)
    assert robber.while_not_lost == [], "another consumer held items the holder still held"
    assert sorted(claim.id for claim in robber.taken) == sorted(claims)
    assert all(claim.lost for claim in claims.values())
    for claim in robber.taken:
        claim.complete()


def test_a_claim_nothing_refreshes_is_lost_once_its_lock_ttl_has_passed(
        etcd_url: str, queue_name: str) -> None:
    """lost is a rule read at each look, not a verdict a thread must deliver:
    with the heartbeat keeping it no longer (as if its thread stalled), the
    claim says lost before etcd can drop its lock, and not before lock_ttl."""
    with Queue(etcd_url, queue_name, lock_ttl=2) as queue:
        item_id = queue.put("stalled")
        claimed = time.monotonic()  # before C1 was sent
        claim = queue.claim()
        queue._heartbeat.discard(claim)
        gone = threading.Event()
        looks: List[Tuple[float, bool]] = []

        def look() -> bool:
            lost = claim.lost  # read before etcd's state: the lock was gone by then
            if queue._protocol.read("locks", item_id) is None:
                gone.set()
            looks.append((time.monotonic() - claimed, lost))
            return gone.is_set()

        wait_until(look, 10, interval=0.02, message="the lock to expire")
        assert looks[-1][1], "etcd dropped the lock while the claim still said it held it"
        assert not [at for at, lost in looks if lost and at < 2 - 0.01], "lost before lock_ttl"


def test_a_heartbeat_whose_thread_could_not_start_starts_one_for_the_next_claim(
        etcd_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim whose heartbeat thread could not start raises, and the next
    claim's lock is kept: the heartbeat is not left believing a thread runs."""
    with Queue(etcd_url, queue_name, lock_ttl=2) as queue:
        queue.put_many(["first", "second"])
        runtime = queue._heartbeat._runtime
        real_thread = runtime.Thread

        def refused(*args: object, **kwargs: object) -> threading.Thread:
            thread = real_thread(*args, **kwargs)  # type: ignore[arg-type]
            if kwargs.get("name") == "etcdq-heartbeat":
                monkeypatch.setattr(runtime, "Thread", real_thread)  # once only
                monkeypatch.setattr(thread, "start", _cannot_start)
            return thread

        queue._ensure_view()  # the view's thread started: the next one is the heartbeat's
        monkeypatch.setattr(runtime, "Thread", refused)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            queue.claim(timeout=5)
        claim = queue.claim(timeout=5)
        assert claim is not None
        time.sleep(3)  # past lock_ttl: kept only if refreshed
        assert not claim.lost, "the claim after the failed start was never refreshed"
        claim.complete()


def _cannot_start() -> None:
    raise RuntimeError("can't start new thread")
