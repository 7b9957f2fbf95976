"""Each claim's refresh is independent of every other claim's.

Its own request, on its own deadline (its lock's time left), judged as soon
as its own reply arrives; due lock_ttl/3 after the send of its last
confirmation (C1's for the first); a refresh that hangs, or a lock's slow
re-creation, delays no other claim's; a heartbeat that failed hands out no
claim with nothing to refresh it.  Real etcd (one member, or a cluster); the
holder reaches it through the fault proxy (tests/faultproxy.py).
"""
from __future__ import annotations

import re
import threading
import time
from typing import Dict, Iterator

import pytest

from etcdq_v2 import Queue, Worker, current_task
from etcdq_v2.codec import Lock
from etcdq_v2.protocol import boot_clock
from etcdq_v2.testing.cluster import EtcdCluster
from etcdq_v2.transport import Transport

from faultproxy import FaultProxy


def _refresh_of(*item_ids: str) -> "re.Pattern[bytes]":
    """A heartbeat refresh of one of these items' locks: ``refresh=true`` in
    its query or in its form (one send: wire.py writes a request at once)."""
    ids = b"|".join(item_id.encode() for item_id in item_ids)
    return re.compile(rb"PUT /v2/keys/\S*/locks/(?:" + ids + rb")(?:\?\S*refresh=true| "
                      rb"[^\r]*\r\n(?:.*\r\n)*?\r\n[^\r\n]*refresh=true)")


def _lock_put(item_id: str) -> "re.Pattern[bytes]":
    """The request line of a PUT of the item's lock (C1, a refresh)."""
    return re.compile(rb"PUT /v2/keys/\S*/locks/" + item_id.encode() + rb" ")


@pytest.fixture
def holder(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    with Queue(proxy.url, queue_name, lock_ttl=6) as queue:
        yield queue


def test_a_claim_whose_refresh_applied_in_time_is_not_lost_because_another_refresh_hangs(
        proxy: FaultProxy, holder: Queue, etcd_url: str, queue_name: str) -> None:
    """lock_ttl 6 (a refresh every 2 s), the transport's 5 s timeout.  Z's and
    X's refreshes hang (their connections held: a half-open connection), Y's
    go through at once: Y's lock is refreshed in etcd, on time, and Y is
    judged on its own reply as it arrives, not when Z's or X's time out (a
    batch judged whole, or batches one after another, read Y lost at its old
    expiry)."""
    ids = holder.put_many([{"n": n} for n in range(3)])
    z = holder.claim(timeout=5)
    time.sleep(0.5)
    x = holder.claim(timeout=5)
    time.sleep(0.5)
    y = holder.claim(timeout=5)
    assert z is not None and x is not None and y is not None
    assert [z.id, x.id, y.id] == ids
    proxy.hold("up", match=_refresh_of(z.id, x.id))
    try:
        with Queue(etcd_url, queue_name, lock_ttl=30) as reader:
            deadline = time.monotonic() + 9
            refreshed_in_etcd = []
            while time.monotonic() < deadline:
                entry = reader._protocol.read("locks", y.id)
                assert entry is not None and Lock.decode(entry.value).token == \
                    y._state.lock.token, "Y's lock left etcd"
                refreshed_in_etcd.append(entry.ttl)
                time.sleep(0.2)
        # etcd's view: Y's lock was always Y's, and was refreshed (its TTL went up).
        assert any(later > earlier for earlier, later in
                   zip(refreshed_in_etcd, refreshed_in_etcd[1:]))
        assert z.lost and x.lost  # theirs never reached etcd: right
        assert not y.lost, "Y's refreshes applied within lock_ttl, yet Y reads lost"
    finally:
        proxy.release()


def test_the_first_refresh_is_due_lock_ttl_over_3_after_c1_was_sent_not_after_the_claim_returned(
        proxy: FaultProxy, queue_name: str, etcd_url: str) -> None:
    """lock_ttl 15: docs/protocol.md ("Time") says a claim rides out a write
    stall of ~7 s when lock_ttl/3 + a round trip + 8 s < lock_ttl, each
    refresh due lock_ttl/3 after the send of the last confirmation.  Here C2
    stalls 7 s (a leader change; C3 then makes no request, < lock_ttl/2),
    then a 4.5 s stall hits the refreshes.  With a refresh due 5 s after C1 (or
    at once, overdue, when the claim returns) the lock was confirmed at 7 s
    and lives to 22 s; the heartbeat schedules it lock_ttl/3 after the claim
    returned (12 s), with 3 s left, the lock expired at 15 s."""
    etcd = Transport(proxy.url, timeout=9)
    try:
        with Queue(etcd, queue_name, lock_ttl=15) as queue:
            assert queue.claim() is None  # the view listed: claim() goes straight to C1
            item_id = queue.put("slow claim")
            proxy.hold("up", match=re.compile(
                rb"PUT /v2/keys/\S*/work/" + item_id.encode() + rb" HTTP"))
            releaser = threading.Timer(7.0, proxy.release)
            called = time.monotonic()
            releaser.start()
            claim = queue.claim()
            releaser.join()
            assert claim is not None and claim.id == item_id
            # When C1 was sent, on the monotonic clock: the times below count from it.
            c1 = claim.confirmed_at - (boot_clock() - time.monotonic())
            assert c1 - called < 1.0, "confirmed after C1 (C3 refreshed): not the case under test"
            assert time.monotonic() - c1 < 7.5
            proxy.pass_through()

            def until(seconds: float) -> None:
                time.sleep(max(0.0, c1 + seconds - time.monotonic()))

            until(11.0)
            proxy.black_hole()  # 4.5 s: less than the ~7 s the docs' margin covers
            until(15.5)
            proxy.pass_through()
            until(17.0)
            with Queue(etcd_url, queue_name) as reader:
                entry = reader._protocol.read("locks", item_id)
            assert entry is not None and Lock.decode(entry.value).token == \
                claim._state.lock.token, ("the lock expired in etcd: no refresh was sent "
                                          "in the 11 s before the stall")
            assert not claim.lost, ("a 4.5 s stall lost a claim of lock_ttl 15: its first "
                                    "refresh was due lock_ttl/3 after the claim returned")
            claim.complete()
    finally:
        etcd.close()


def test_a_worker_does_not_cancel_a_handler_because_another_items_refresh_hangs(
        proxy: FaultProxy, holder: Queue) -> None:
    """Three items run at once, lock_ttl 6 (a refresh every 2 s); the refreshes
    of the first two hang (their connections held), the third's would go
    through, on its own deadline: its claim stays held and its handler runs
    to the end (had it waited for the hung ones, its claim would read lost,
    the Worker would cancel its handler and record nothing, and the item run
    again, for a fault on other items' connections)."""
    ids = holder.put_many([{"n": n} for n in range(3)])
    cancelled: Dict[int, bool] = {}

    def handler(payload: Dict[str, int]) -> str:
        cancelled[payload["n"]] = current_task().cancelled.wait(9)
        return "done"

    proxy.hold("up", match=_refresh_of(ids[0], ids[1]))
    worker = Worker(holder, handler, concurrency=3, install_signal_handlers=False)
    try:
        stats = worker.run(max_items=3)
    finally:
        proxy.release()
    assert cancelled.get(2) is False, (
        "the third handler was cancelled: its refresh "
        + ("was sent" if sum(_lock_put(ids[2]).search(line) is not None
                             for line in proxy.requests) > 1  # C1 is one
           else "was never sent") + " before its lock's TTL passed")
    assert stats.completed == 1, stats


def test_a_claim_is_not_lost_because_another_claims_lock_is_being_re_created(
        proxy: FaultProxy, holder: Queue, etcd_url: str, queue_name: str) -> None:
    """lock_ttl 6.  A's lock goes early (deleted here: a leader whose clock is
    ahead), so A's refresh finds it missing and re-creates it, first reading
    work/A, a read that hangs (its connection held).  B's network is fine:
    B's refreshes, due every 2 s, go on meanwhile, and B's lock stays in
    etcd and B held (had they waited for A's re-creation, up to A's time
    left, B's lock would expire in etcd, or its answer be judged late)."""
    holder.put_many(["A", "B"])
    a = holder.claim(timeout=5)
    b = holder.claim(timeout=5)
    assert a is not None and b is not None
    with Queue(etcd_url, queue_name) as other:
        other.etcd.delete(other.layout.key("locks", a.id))
        proxy.hold("up", match=re.compile(
            rb"GET /v2/keys/\S*/work/" + a.id.encode() + rb"\?"))
        try:
            time.sleep(6.5)  # past B's first lock_ttl: two refreshes were due
            b_lost = b.lost
            entry = other._protocol.read("locks", b.id)
        finally:
            proxy.release()
    assert entry is not None and Lock.decode(entry.value).token == b._state.lock.token, \
        "B's lock expired in etcd: its refresh waited for A's lock to be re-created"
    assert not b_lost, "B's lock was kept in etcd, yet B reads lost"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_claims_made_after_the_heartbeat_failed_unexpectedly_are_still_refreshed(
        etcd_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat's refresh of one claim dies of an error no layer expected
    (here a SystemExit while judging its reply: a bug).  It says so and marks
    that claim lost, as the docs say; a claim handed out afterwards is
    refreshed as any other, its lock kept past lock_ttl -- never handed out
    alive with nothing refreshing it, its lock expiring under its handler."""
    from etcdq_v2.claim import Claim
    with Queue(etcd_url, queue_name, lock_ttl=2) as queue:
        queue.put_many(["first", "second"])
        first = queue.claim()
        assert first is not None
        real = Claim._beaten

        def broken(self: Claim, *args: object) -> object:
            monkeypatch.setattr(Claim, "_beaten", real)
            raise SystemExit("a bug in the heartbeat")

        monkeypatch.setattr(Claim, "_beaten", broken)
        deadline = time.monotonic() + 5
        while not first.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.lost  # the heartbeat said so and voided its claim
        second = queue.claim()
        assert second is not None
        time.sleep(3.0)  # more than lock_ttl: a live heartbeat refreshed it twice
        entry = queue._protocol.read("locks", second.id)
        assert second.lost or entry is not None, "the rule failed: lock gone, claim alive"
        assert entry is not None and not second.lost, (
            "a claim handed out after the heartbeat failed was never refreshed: its lock "
            "expired (the claim reads lost only by the rule, lock_ttl after C1)")


def test_a_claim_whose_refresh_reply_is_lost_after_it_applied_stays_held(
        proxy: FaultProxy, holder: Queue, etcd_url: str, queue_name: str) -> None:
    """lock_ttl 6: every reply is cut after 10 bytes for 2.5 s (the refreshes
    apply, their replies are lost), then the network heals: the refresh tried
    again within a second applies on our value, and the claim is held
    throughout, no false alarm."""
    holder.put("cut replies")
    claim = holder.claim(timeout=5)
    assert claim is not None
    time.sleep(1.0)
    proxy.cut(10)
    time.sleep(2.5)
    proxy.pass_through()
    time.sleep(6.0)
    assert not claim.lost
    with Queue(etcd_url, queue_name) as reader:
        entry = reader._protocol.read("locks", claim.id)
    assert entry is not None and Lock.decode(entry.value).token == claim._state.lock.token
    claim.complete()


def test_while_the_leader_freezes_no_claim_reads_held_while_another_consumer_has_its_item(
        cluster: "EtcdCluster", queue_name: str) -> None:
    """3 members; the holder's 8 claims (lock_ttl 12) reach etcd through one
    follower, a thief claims through the other.  The leader freezes (SIGSTOP)
    and stays frozen: an election, refreshes forwarded to the frozen leader
    hang.  Sampled throughout: whenever the thief holds an item, the holder's
    claim of it already says lost; and the locks ride out the election (lost
    is no false alarm here)."""
    leader = cluster.leader_index()
    near, far = [cluster.members[(leader + k) % 3].url for k in (1, 2)]
    with Queue(near, queue_name, lock_ttl=12) as holder, \
            Queue(far, queue_name, lock_ttl=30) as thief:
        holder.put_many([{"n": n} for n in range(8)])
        claims = {}
        while len(claims) < 8:
            claim = holder.claim(timeout=5)
            assert claim is not None
            claims[claim.id] = claim
        cluster.pause(leader)
        try:
            seen = []
            taken = []
            until = time.monotonic() + 20
            while time.monotonic() < until:
                try:
                    got = thief.claim(timeout=0.2)
                except Exception:  # the election: no answer yet
                    got = None
                if got is not None:
                    taken.append(got)
                seen.extend((t.id, claims[t.id].lost) for t in taken)
            assert sorted({i for i, lost in seen if not lost}) == [], \
                "the thief held items the holder's claims still said they held"
            assert [c.id for c in claims.values() if c.lost] == [], \
                "claims lost in an election that lasted less than their margin"
            assert taken == []
        finally:
            cluster.resume(leader)
        for claim in claims.values():
            claim.complete()


def test_claims_ride_out_their_member_freezing_when_another_member_answers(
        cluster: "EtcdCluster", queue_name: str) -> None:
    """The holder's transport knows all three members and uses a follower,
    which freezes after the claims.  Each refresh to it gets one request
    timeout (5 s), then it is sent again to the next member, well within
    lock_ttl 12: none is lost."""
    leader = cluster.leader_index()
    order = [(leader + k) % 3 for k in (1, 2, 0)]
    endpoints = ",".join(cluster.members[i].url for i in order)
    with Queue(endpoints, queue_name, lock_ttl=12) as holder:
        holder.put_many([{"n": n} for n in range(4)])
        claims = [holder.claim(timeout=5) for _ in range(4)]
        assert all(claim is not None for claim in claims)
        cluster.pause(order[0])
        try:
            time.sleep(20)
            assert [c.id for c in claims if c is not None and c.lost] == []
        finally:
            cluster.resume(order[0])
        for claim in claims:
            assert claim is not None
            claim.complete()
