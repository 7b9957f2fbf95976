"""A refused lock create (C1 "already exists") is read for what it is: a delay
lock past its expiry but not swept yet is our delay lock, not junk, and its
item is not stranded (Protocol._delay_lock_back reports it as at least 1 s
left); a lock taken again right after its delete is a lock, not junk; a
resent C1 whose first copy applied is our own lock.  The reads of a view that
starts watching go out at once and fail over after one timeout, and a
stream's index is its registration index on any member.

Methods are wrapped only to force an ordering the fault proxy cannot: a
reply lost and its request resent in the moment after a delay lock expired
and before etcd swept it; a member that stops answering between a
follower's listing of work/ and its reads of locks.
"""
from __future__ import annotations

import json
import logging
import time
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import pytest
from helpers import (force_unswept_resend, in_background, wait_until,
                     watching_view_holding_one_claim)

from etcdq_v2 import Queue
from etcdq_v2.errors import KeyMissing
from etcdq_v2.transport import connect
from etcdq_v2 import viewstate as view_module

FEW_LOCKS = view_module.FEW_LOCKS


def v2(url: str, path: str, method: str = "GET", data: Optional[bytes] = None
       ) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """One raw etcd v2 request: (headers, JSON body), errors included."""
    request = urllib.request.Request(url + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return dict(reply.headers), json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return dict(exc.headers), json.loads(exc.read())




def test_a_delay_lock_past_its_expiry_is_taken_for_junk_and_its_item_stranded(
        etcd_url: str, queue_name: str, caplog: Any) -> None:
    """release(delay=1): R1 (the CAS to the delay lock) applies at m,
    its reply is lost and the request is resent; the resend lands after the
    delay lock's expiry but before etcd's sweep (etcd removes expired keys
    0.1-0.5 s late, and a GET meanwhile returns the key without ``ttl``).
    It fails (CompareFailed: the value is our delay lock already), and
    _delay_lock_back reads the lock: ours, ``ttl`` absent, so it returns
    (0, m): "claimable now, at m".  Claim._returned tells the view
    returned(id, 0, m), which takes m for an index at which the lock was
    seen GONE (_unlocked: _gone[id] = m) and frees the item, although the
    delay lock is still there at m.  The next claim's C1 is refused
    ("already exists") at etcd's index m (nothing written since): exactly
    _gone, so locked_at(refused=True) calls it junk at the lock's key, and
    _lost_race skips that version of the item for good.  The view is
    watching, so the item's version changes only if someone else claims
    it: a lone consumer never gets it again ("skipping item ...: locks/...
    holds something that is not a lock"), the process strands it until it
    restarts.  On 982fa3f the same C1s are refused in a tight loop until the
    sweep (< 0.5 s), then the claim gets the item.  The junk rule's premise
    ("a real lock cannot be refused at the very index at which it was seen
    gone") holds for etcd, but not for the view's signs: returned(0, m) is
    not a sighting of the lock gone.  Suggested fix: _delay_lock_back
    returns the lock's time left as at least 1 s (it is there: etcd's sweep
    is due), or returned() notes no _gone for a given-back index that is
    the lock's own modifiedIndex; and treat a refusal equal to _gone as
    junk only when _gone came from a listing, read or event."""
    caplog.set_level(logging.WARNING, logger="etcdq_v2")
    with Queue(etcd_url, queue_name, lock_ttl=30) as queue:
        for _ in range(4):
            claim, view = watching_view_holding_one_claim(queue)
            lock_key = queue.layout.key("locks", claim.id)
            window = {"hit": False}
            original_put = force_unswept_resend(queue, lock_key, window)
            returned: List[Tuple[Any, ...]] = []
            original_returned = view.returned
            view.returned = lambda *a, seen=returned, original=original_returned: (  # type: ignore[method-assign]
                seen.append(a), original(*a))[-1]
            try:
                claim.release(delay=1)
                if not window["hit"]:
                    continue  # etcd swept before the resend: try again with a new item
                # Given back at once (0) on 9863fe4; now our delay lock still
                # there is given at least a second (1): either way it must come back.
                assert returned and returned[0][1] in (0, 1), returned
                got = queue.claim(timeout=4)
            finally:
                queue.etcd.put = original_put  # type: ignore[method-assign]
                view.returned = original_returned  # type: ignore[method-assign]
            skipped = [r.getMessage() for r in caplog.records if "not a lock" in r.getMessage()]
            assert got is not None and got.id == claim.id, (
                f"the released item {claim.id} (given back as returned{returned[0]}) was "
                f"not handed out again within 4 s: {skipped}")
            got.complete()
            return
        pytest.skip("etcd swept the delay lock before every resend (timing)")


def test_reads_from_a_member_that_stopped_answering_wait_a_timeout_each(
        cluster: Any, queue_name: str, proxy_factory: Any) -> None:
    """Three members, each behind a fault
    proxy; the consumer's request timeout T = 1 s (deadline 3 s).  Its quiet
    view took FEW_LOCKS (8) items for running that another process has
    released since.  The consumer finds nothing else, starts watching: stream
    and listing of work/ on member A; then A stops answering (frozen, cut
    off behind a switch), before the follower's reads of the 8 locks.
    Transport._all sends all 8 GETs to A on parallel connections, then reads
    the replies ONE AFTER ANOTHER, each _finish waiting its own full timeout
    (SO_RCVTIMEO per recv): 8 T before any is redone.  _all never calls
    _failed(A), so the first redo (_call) starts on A again: one more T,
    then B.  The round, and the claim waiting for it, takes about 9 T (here
    ~9 s, with the default 5 s timeout ~45 s: past the default 30 s lock
    TTL), where 982fa3f's first quorum GET timed out once, moved to B, and
    the others followed (~T).  The batch ignores the transport's deadline
    (3 T) too; delete_all shares the path (older).  Suggested fix: wait for
    the batch's replies against one deadline (T from the send), mark the
    member failed when a batch times out, and redo the rest together on the
    next member."""
    proxies = [proxy_factory(member.url) for member in cluster.members]
    by_url = {p.url: p for p in proxies}
    transport = connect([p.url for p in proxies], timeout=1.0)
    with Queue(transport, queue_name) as consumer, \
            Queue(cluster.endpoints, queue_name, lock_ttl=60) as other:
        other.put_many(range(FEW_LOCKS + 2))
        held = [other.claim() for _ in range(FEW_LOCKS)]
        assert all(c is not None for c in held)
        view = consumer._ensure_view()
        assert not view.watching_locks and all(c.id in view.state.locks for c in held)
        while (claim := other.claim()) is not None:
            claim.complete()
        for claim in held:
            claim.release()  # free in etcd; the quiet view takes them for running
        frozen: List[Any] = []
        original = view._protocol.read_locks

        def read_locks(ids: Any, *args: Any) -> Any:
            if not frozen:  # the member serving this round stops answering now
                frozen.append(by_url[consumer.etcd._member().url])
                frozen[0].black_hole()
            return original(ids, *args)

        view._protocol.read_locks = read_locks  # type: ignore[method-assign]
        try:
            started = time.monotonic()
            thread, outcome = in_background(lambda: consumer.claim(timeout=20))
            thread.join(25)
            took = time.monotonic() - started
        finally:
            for p in proxies:
                p.pass_through()
        got = outcome.get("returned")
        assert frozen, "the view never read locks"
        assert got is not None and got.id in {c.id for c in held}, outcome
        got.complete()
        assert took < 3.0, (
            f"the released item came {took:.1f} s after the claim began (T = 1 s, "
            f"deadline 3 s): the reads waited on the member that stopped answering")


# -- held ---------------------------------------------------------------------------


def test_a_streams_index_is_its_registration_index_on_any_member(
        cluster: Any) -> None:
    """On a follower of a 3-member cluster (etcd 3.5), a stream's
    X-Etcd-Index (EventStream.index, S) is the member's index when it
    registered the watch: the member's own GET just before and just after
    says the same index (nothing written between), the first event is the
    next write, at S + 1, made through another member, and a read without
    quorum on the third member afterwards is at or past S and sees that
    write.  So a read at X >= S from any member plus the stream's events
    after S leave nothing out: etcd's indexes are the same on every member."""
    leader = cluster.leader_index()
    follower, third = [m.url for n, m in enumerate(cluster.members) if n != leader]
    writer = connect(cluster.members[leader].url)
    writer.put("/stream-index/watched/before", "x")
    on_follower, on_third = connect(follower), connect(third)
    # A follower's own copy may not have the write yet: KeyMissing until it has.
    wait_until(lambda: on_follower.get("/stream-index/watched/before").index
               >= writer.get("/stream-index/watched/before", quorum=True).index, 5,
               ignore=(KeyMissing,))
    before = on_follower.get("/stream-index/watched/before").index
    stream = on_follower.stream("/stream-index/watched", idle_timeout=5)
    try:
        after = on_follower.get("/stream-index/watched/before").index
        assert before == stream.index == after
        written = writer.put("/stream-index/watched/after", "y").written_index
        assert written == stream.index + 1
        first = next(iter(stream.blocks()))
        event = json.loads(first.splitlines()[0])
        assert event["node"]["key"] == "/stream-index/watched/after"
        assert event["node"]["modifiedIndex"] == stream.index + 1
        read = wait_until(lambda: (lambda r: r if r.index >= written else None)(
            on_third.get("/stream-index/watched/after")), 5, ignore=(KeyMissing,))
        assert read.index >= stream.index and read.node["value"] == "y"
    finally:
        stream.release()
        for transport in (writer, on_follower, on_third):
            transport.close()


def test_a_lock_taken_again_right_after_its_delete_is_no_junk(
        etcd_url: str, queue_name: str, caplog: Any) -> None:
    """A watching view hears the lock's delete (R1 at d: _gone = d) and
    frees the item; its claim picks it, but before its C1 goes out another
    process claims the item (C1 at d + 1, C2).  The consumer's C1 is refused
    at an index past d: a lock, not junk.  The item stays taken, and once
    the other process releases it, the waiting claim gets it; no "not a
    lock" warning."""
    caplog.set_level(logging.WARNING, logger="etcdq_v2")
    with Queue(etcd_url, queue_name) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=60) as other, \
            Queue(etcd_url, queue_name, lock_ttl=60) as third:
        item_id = other.put("x")
        held = other.claim()
        assert held is not None
        assert consumer.claim(timeout=0) is None
        view = consumer._ensure_view()
        assert view.watching_locks
        original = consumer._protocol._create_lock
        raced: List[Any] = []

        def create_lock(lock_id: str, *args: Any) -> Any:
            if lock_id == item_id and not raced:
                raced.append(third.claim())  # takes the lock the view saw go
                assert raced[0] is not None and raced[0].id == item_id
                raced.append(view.state.gone.get(item_id))
            return original(lock_id, *args)

        consumer._protocol._create_lock = create_lock  # type: ignore[method-assign]
        held.release()
        wait_until(lambda: view.state.gone.get(item_id), 5, message="the view heard the delete")
        assert consumer.claim(timeout=0) is None  # lost the race to `third`
        assert raced and raced[1] is not None
        assert item_id in view.state.locks and not view.state.is_free(item_id)
        thread, outcome = in_background(lambda: consumer.claim(timeout=5))
        raced[0].release()
        thread.join(10)
        got = outcome.get("returned")
        assert got is not None and got.id == item_id, outcome
        got.complete()
        assert "not a lock" not in caplog.text


def test_a_resent_c1_whose_first_copy_applied_is_our_lock_not_junk(
        etcd_url: str, queue_name: str, proxy: Any, caplog: Any) -> None:
    """A watching view's claim sends C1; the network holds it past the
    request timeout (0.5 s) and the transport resends it, held too; then both
    reach etcd.  One creates our lock, the other is refused ("already
    exists") at that same index, with retried set: _create_lock reads the
    lock, finds our value, and the claim goes on.  No junk warning, the
    item is ours, and completing it leaves work/ empty."""
    caplog.set_level(logging.WARNING, logger="etcdq_v2")
    transport = connect(proxy.url, timeout=0.5, deadline=5)
    with Queue(transport, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        assert consumer.claim(timeout=0) is None
        assert consumer._ensure_view().watching_locks
        item_id = producer.put("x")
        pattern = rb"PUT /v2/keys/etcdq/" + queue_name.encode() + rb"/locks/" + item_id.encode()
        proxy.hold(match=pattern)
        thread, outcome = in_background(lambda: consumer.claim(timeout=5))
        try:
            wait_until(lambda: sum(pattern in r for r in proxy.requests) >= 2, 5,
                       message="C1 and its resend, both held")
        finally:
            proxy.pass_through()
        thread.join(10)
        got = outcome.get("returned")
        assert got is not None and got.id == item_id, outcome
        got.complete()
        assert "not a lock" not in caplog.text
        assert producer._protocol.list("work")[1] == []
