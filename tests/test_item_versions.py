"""An item's index and value in the view, and in a claim's C2, are of one version.

C2 is a compare-and-swap on the index the view holds, of a value built from
the value it holds.  A put whose reply was lost reads the item back; by then
another consumer may have claimed it (C2) or committed it (F1).  The view
must then hold what the read-back read (that index with that value), never
the read-back's index with the value the put sent: that C2 would apply, and
write the put's value over the commit, undoing it.

Every test goes through the fault proxy (tests/faultproxy.py), with two
consumers on one real etcd, each through a proxy of its own:

- the producer ``P`` (lock_ttl 1): its put's reply is held (lost), and so is
  the read-back, until the other consumer ``E`` has claimed the item;
- ``E`` (lock_ttl 1) is then stopped at the proxy (every request held: its
  heartbeat too), between its F1 and F2 or right after its C2, until its lock
  expired;
- P's first claim lists work/ to catch up (P put the item after its last
  listing); that listing does not answer, so P is offered the item from what
  its put left in the view.
"""
from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, Iterator, Optional, Pattern, Tuple

import pytest

from etcdq_v2 import Queue, connect
from etcdq_v2.claim import Claim
from etcdq_v2.protocol import Version

from faultproxy import FaultProxy
from helpers import in_background, wait_until, work_listing

#: Seconds the test waits for one step of the interleaving.
STEP = 15.0


def value_at(etcd_url: str, key: str, index: int) -> Optional[str]:
    """The value etcd wrote to ``key`` at ``index`` (from its event history), or
    None if no write of ``key`` has that index."""
    url = f"{etcd_url}/v2/keys{key}?wait=true&waitIndex={index}"
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            node = json.loads(reply.read())["node"]
    except (OSError, urllib.error.URLError):  # no event at or after it: none
        return None
    return node.get("value") if node["modifiedIndex"] == index else None


def held(queue: Queue, item_id: str) -> Version:
    """The version of the item that the queue's view holds."""
    seen = queue._ensure_view().version_of(item_id)
    assert seen is not None, f"the view does not hold {item_id}"
    return seen


def assert_one_version(queue: Queue, etcd_url: str, item_id: str, seen: Version) -> None:
    """``seen``, a version of the item the view held: its value, if it has one,
    is the one etcd wrote at its index."""
    if seen.raw is not None:
        written = value_at(etcd_url, queue.layout.key("work", item_id), seen.index)
        assert written == seen.raw, (
            f"the view holds {item_id} at index {seen.index} with the value {seen.raw!r}, "
            f"but etcd wrote {written!r} at that index")


def _pattern(*parts: bytes) -> Pattern[bytes]:
    return re.compile(b"|".join(parts))


def _stored_under(queue_name: str, kind: str) -> bytes:
    """A reply of etcd to a create (P1's POST, D2's PUT) under ``kind``/."""
    return (rb'"action":"create","node":\{"key":"/etcdq/' + re.escape(queue_name.encode())
            + b"/" + kind.encode() + b"/")


def _read_of_item(queue_name: str) -> bytes:
    """A GET of one item (D2's read-back), not a listing of work/."""
    return rb"GET /v2/keys/etcdq/" + re.escape(queue_name.encode()) + rb"/work/\d+"


def _record_write(queue_name: str) -> Pattern[bytes]:
    """F2: a PUT of an outcome record."""
    return re.compile(rb"PUT /v2/keys/etcdq/" + re.escape(queue_name.encode())
                      + rb"/(completed|failed)/")


class Players:
    """P, E and an observer O (straight to etcd) on one queue."""

    def __init__(self, etcd_url: str, queue_name: str, p_proxy: FaultProxy,
                 e_proxy: FaultProxy, stack: contextlib.ExitStack) -> None:
        self.url, self.name = etcd_url, queue_name
        self.p_proxy, self.e_proxy = p_proxy, e_proxy
        # P's deadline outlasts the hold of its read-back (E's claim, E's lock
        # expiring); its catch-up listing is then given a shorter one.
        self.p = stack.enter_context(Queue(connect(p_proxy.url, timeout=1, deadline=12),
                                           queue_name, lock_ttl=1, max_attempts=None))
        self.e = stack.enter_context(Queue(connect(e_proxy.url, timeout=15, deadline=40),
                                           queue_name, lock_ttl=1))
        self.o = stack.enter_context(Queue(etcd_url, queue_name))

    def quiet_producer(self) -> None:
        """P claims once: its view is started, and quiet (it never found nothing)."""
        self.p.put("warm-up")
        claim = self.p.claim(timeout=5)
        assert claim is not None
        claim.complete()
        assert not self.p._ensure_view().watching_locks

    def work(self, item_id: str) -> Dict[str, Any]:
        entry = self.o._protocol.read("work", item_id)
        return json.loads(entry.value) if entry is not None and entry.value else {}

    def e_claims(self, then: Callable[[Claim], Any]) -> Tuple[Any, Dict[str, Any]]:
        """E claims the next item and calls ``then`` on it, in a thread."""
        claimed: Dict[str, Any] = {}

        def run() -> Any:
            claim = self.e.claim(timeout=STEP)
            assert claim is not None, "E found nothing to claim"
            claimed["claim"] = claim
            return then(claim)
        thread, outcome = in_background(run, "consumer-E")
        wait_until(lambda: "claim" in claimed or not thread.is_alive(), STEP,
                   message="E's claim")
        assert "claim" in claimed, outcome
        return (thread, outcome), claimed

    def stop_e_until_its_lock_expired(self, item_id: str) -> None:
        """Every request of E held from now on (its heartbeat too): its lock expires."""
        self.e_proxy.hold()
        wait_until(lambda: self.o._protocol.read("locks", item_id) is None, STEP,
                   message="E's lock to expire")

    def p_claims_without_a_listing(self) -> Optional[Claim]:
        """P's claim, whose catch-up listing of work/ does not answer."""
        self.p_proxy.hold("up", match=work_listing(self.name))
        self.p.etcd.deadline = 2.0
        try:
            return self.p.claim(timeout=0)
        finally:
            self.p_proxy.pass_through()


@pytest.fixture
def players(etcd_url: str, queue_name: str, proxy_factory: Callable[[str], FaultProxy]
            ) -> Iterator[Players]:
    with contextlib.ExitStack() as stack:
        e_proxy = proxy_factory(etcd_url)
        players = Players(etcd_url, queue_name, proxy_factory(etcd_url), e_proxy, stack)
        # E's held requests go on before the Queues close (else E's close waits them out).
        stack.callback(e_proxy.pass_through)
        yield players


def _finished_by_e(players: Players, item_id: str, e_run: Tuple[Any, Dict[str, Any]]) -> None:
    """E is let go: its complete() returns, and the item has E's record only."""
    players.p_proxy.pass_through()
    players.e_proxy.pass_through()
    thread, outcome = e_run
    thread.join(STEP + 40)
    assert not thread.is_alive() and "raised" not in outcome, outcome
    assert players.o._protocol.read("failed", item_id) is None, "a second outcome"
    assert players.o.get(item_id).state == "completed"
    assert players.o.get(item_id).result == "done by E"


def test_a_put_read_back_after_another_consumers_commit_never_undoes_that_commit(
        players: Players) -> None:
    """P's POST applies, its reply is lost, and its token search is held until E
    has claimed the item and committed it (F1; E then stops before F2, and its
    lock expires).  P's view must hold the committed version the search read,
    so P's claim finishes E's commit for it (F2-F4) and is handed nothing.
    Before, the view held E's F1 index with P's own value: P's C2 applied on
    it, wrote the item back without its outcome, and P was handed the item E
    had completed; it ended with two records."""
    p, name = players, players.name
    p.quiet_producer()
    p.e_proxy.hold("up", match=_record_write(name))  # E's F2
    p.p_proxy.hold(match=_pattern(_stored_under(name, "work"), work_listing(name).pattern))
    put, put_outcome = in_background(lambda: p.p.put({"job": "X"}), "producer-P")
    e_run, claimed = p.e_claims(lambda claim: claim.complete("done by E"))
    item_id = claimed["claim"].id
    wait_until(lambda: p.work(item_id).get("o") == "completed", STEP, message="E's F1")
    p.stop_e_until_its_lock_expired(item_id)
    p.p_proxy.release()  # P's token search answers: X, committed by E
    put.join(STEP)
    assert put_outcome.get("returned") == item_id, put_outcome
    seen = held(p.p, item_id)
    got = p.p_claims_without_a_listing()
    assert got is None or got.id != item_id, (
        f"P was handed {item_id}, which E had committed; work/ now: {p.work(item_id)}")
    _finished_by_e(p, item_id, e_run)
    assert_one_version(p.p, p.url, item_id, seen)


def test_a_put_many_read_back_after_another_consumers_commit_never_undoes_that_commit(
        players: Players) -> None:
    """The same with put_many(in_flight=2): both POSTs are in doubt, and found
    by one search (_find_doubts), held until E committed the first item."""
    p, name = players, players.name
    p.quiet_producer()
    p.e_proxy.hold("up", match=_record_write(name))
    p.p_proxy.hold(match=_pattern(rb"HTTP/1\.1 201 Created", work_listing(name).pattern))
    put, put_outcome = in_background(
        lambda: p.p.put_many([{"job": "X"}, {"job": "Y"}], in_flight=2), "producer-P")
    e_run, claimed = p.e_claims(lambda claim: claim.complete("done by E"))
    item_id = claimed["claim"].id
    wait_until(lambda: p.work(item_id).get("o") == "completed", STEP, message="E's F1")
    p.stop_e_until_its_lock_expired(item_id)
    p.p_proxy.release()
    put.join(STEP)
    ids = put_outcome.get("returned")
    assert ids is not None and item_id in ids, put_outcome
    seen = {each: held(p.p, each) for each in ids}
    got = p.p_claims_without_a_listing()
    assert got is None or got.id != item_id, (
        f"P was handed {item_id}, which E had committed; work/ now: {p.work(item_id)}")
    if got is not None:
        got.complete("done by P")
    _finished_by_e(p, item_id, e_run)
    for each, version in seen.items():
        assert_one_version(p.p, p.url, each, version)


def test_a_put_read_back_after_another_claim_counts_that_claims_attempt(
        players: Players) -> None:
    """The token search is held until E's C2 (attempt 1); E then stops, never
    finishing, and its lock expires.  P's claim of the item is attempt 2.
    Before, P's C2 wrote P's own value (attempts 0) plus one on E's C2 index:
    attempt 1 again, and E's crashed attempt counted toward no max_attempts."""
    p, name = players, players.name
    p.quiet_producer()
    p.p_proxy.hold(match=_pattern(_stored_under(name, "work"), work_listing(name).pattern))
    put, put_outcome = in_background(lambda: p.p.put({"job": "X"}), "producer-P")
    e_run, claimed = p.e_claims(lambda claim: None)  # E "dies" holding it
    item_id = claimed["claim"].id
    p.stop_e_until_its_lock_expired(item_id)
    p.p_proxy.release()
    put.join(STEP)
    assert put_outcome.get("returned") == item_id, put_outcome
    seen = held(p.p, item_id)
    got = p.p_claims_without_a_listing()
    assert got is not None and got.id == item_id
    assert got.attempt == 2, f"E's attempt was not counted: {p.work(item_id)}"
    got.complete("done by P")
    e_run[0].join(STEP)
    assert_one_version(p.p, p.url, item_id, seen)


def test_a_delayed_put_read_back_offers_the_index_and_value_of_one_version(
        players: Players) -> None:
    """D2 applies and its reply is lost; the transport resends it, etcd says
    "already exists", and the read-back (a GET of the item) is held until the
    delay is over and E has claimed and committed the item.  The view then
    holds what that read returned: the index of E's commit with its value, or
    no value, never that index with D2's value."""
    p, name = players, players.name
    p.quiet_producer()
    p.e_proxy.hold("up", match=_record_write(name))
    p.p_proxy.hold(match=_pattern(_stored_under(name, "work"), _read_of_item(name)))
    put, put_outcome = in_background(lambda: p.p.put({"job": "X"}, delay=1), "producer-P")
    e_run, claimed = p.e_claims(lambda claim: claim.complete("done by E"))
    item_id = claimed["claim"].id
    wait_until(lambda: p.work(item_id).get("o") == "completed", STEP, message="E's F1")
    p.p_proxy.release()
    put.join(STEP)
    assert put_outcome.get("returned") == item_id, put_outcome
    seen = held(p.p, item_id)
    assert_one_version(p.p, p.url, item_id, seen)
    assert seen.index == p.o._protocol.read("work", item_id).index  # the read-back's
    p.stop_e_until_its_lock_expired(item_id)
    got = p.p_claims_without_a_listing()
    assert got is None or got.id != item_id
    _finished_by_e(p, item_id, e_run)
