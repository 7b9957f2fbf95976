"""A refused C1 at exactly the index at which the view took the item's lock for
gone wins over that sign: the item is taken at etcd's index (as under a lock)
until a newer sign says the lock is gone, in a quiet view as in a watching
one, and is checked when the stream restarted past the sweep; a junk
directory at a lock's key neither leaves its item taken for good nor makes an
idle view retry it in a loop.  A batch of requests (Member.request_all) is
read against one deadline: a host that drops packets costs one connect
timeout for the batch, a member that accepts and never answers one timeout,
and a batched delete whose reply was lost is redone on the next member and
done once.

Methods are wrapped only to force an ordering the fault proxy cannot: a
reply lost and its request resent in the moment after a delay lock expired
and before etcd swept it (as in tests/test_view_refused_lock_create.py).  A
member whose host drops packets (a partition: SYNs unanswered) is a
listening socket whose accept queue is full, which is what the kernel does
with a SYN then: drop it.
"""
from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.request import Request, urlopen

import pytest
from helpers import (force_unswept_resend, in_background, wait_until,
                     watching_view_holding_one_claim, watching_with_a_free_item)

from etcdq_v2 import Queue
from etcdq_v2 import viewstate as view_module
from etcdq_v2.errors import KeyMissing
from etcdq_v2.transport import connect

FEW_LOCKS = view_module.FEW_LOCKS


@contextlib.contextmanager
def dropping_host(port: int = 0) -> Iterator[str]:
    """A member URL whose host drops every new connection's SYN (a partition,
    a host powered off): a listener whose accept queue is full.  Connects
    to it hang until the client's timeout."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=1)  # the queue is full
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        filler.close()
        listener.close()




def test_a_quiet_view_holds_a_delayed_item_refused_at_its_gone_sign_for_a_lock_ttl(
        etcd_url: str, queue_name: str) -> None:
    """The
    interleaving of tests/test_view_refused_lock_create.py's first test, in a
    QUIET view (the view of any consumer with a backlog: it watches nothing).  A
    lone consumer holds the head item A of a backlog and calls
    release(delay=1); R1 applies at m, its reply is lost and the resend
    lands after the delay lock's expiry, before etcd's sweep:
    _delay_lock_back reads our delay lock without ``ttl`` and returns
    (0, m), so returned(A, 0, m) takes m for a sign that the lock is gone
    (and drops A's planned delay).  The next claim takes the head, A: C1 is
    refused at m (nothing written since), locked_at's new override marks A
    taken at m.  The expire event that frees it in a watching view never
    comes to a quiet one; no delay is planned for A (returned(0) dropped
    it); relist_work lists work/ only, where A has not changed.  A stays
    taken until the once-per-lock-TTL listing of locks/ (here 30 s after
    the view's first listing), or until the backlog is gone and the view
    starts watching: each claim meanwhile hands out a later item, its FIFO
    head held back a lock TTL for a 1 s delay.  On 982fa3f the first
    refusal at m freed A (burst of refused C1s) but the claim's widened
    window took the next item, whose writes made the next refusal of A
    newer than m: taken, the same hold (as on every version whenever
    anything is written between R1 and the next C1).  The rule: _delay_lock_back returns at least 1 s for our delay lock
    still there (the sweep is due), so the view plans the delay and a quiet
    one lists locks/ when it is due (RELIST_DUE)."""
    with Queue(etcd_url, queue_name, lock_ttl=30) as queue:
        for attempt in range(4):
            ids = queue.put_many([f"{attempt}-{n}" for n in range(6)])
            claim = queue.claim()
            assert claim is not None and claim.id == ids[0]
            view = queue._ensure_view()
            assert not view.watching_locks  # a backlog: quiet
            window = {"hit": False}
            original_put = force_unswept_resend(
                queue, queue.layout.key("locks", claim.id), window)
            returned: list[tuple[Any, ...]] = []
            original_returned = view.returned
            view.returned = lambda *a, seen=returned, original=original_returned: (  # type: ignore[method-assign]
                seen.append(a), original(*a))[-1]
            try:
                claim.release(delay=1)
            finally:
                queue.etcd.put = original_put  # type: ignore[method-assign]
                view.returned = original_returned  # type: ignore[method-assign]
            if not window["hit"]:
                for _ in ids:  # clean up this round and try again
                    got = queue.claim(timeout=3)
                    if got is not None:
                        got.complete()
                continue
            # 0 on 9863fe4; 1 since the fix (our delay lock is still there).
            assert returned and returned[0][1] in (0, 1), returned
            # The consumer keeps working: each claim takes the head that is
            # free; anything not A it gives back at once (still a backlog).
            given: list[str] = []
            deadline = time.monotonic() + 5.0
            found = None
            while time.monotonic() < deadline:
                got = queue.claim(timeout=0.5)
                assert got is not None
                if got.id == claim.id:
                    found = got
                    break
                given.append(got.id)
                got.release()
                assert not view.watching_locks
            assert found is not None, (
                f"item {claim.id}, released with delay=1 (given back as returned"
                f"{returned[0]}), was not handed out within 5 s; the lone consumer "
                f"got {len(given)} claims of later items meanwhile; the view holds it "
                f"taken at {view.state.locks.get(claim.id)}")
            found.complete()
            return
        pytest.skip("etcd swept the delay lock before every resend (timing)")


def test_a_batch_to_a_host_that_drops_packets_waits_a_connect_timeout_per_request(
        etcd_url: str, queue_name: str) -> None:
    """request_all bounds the wait for the REPLIES of a
    batch by one deadline, but each request's _start still opens its
    connection with the full request timeout T: a member whose host drops
    packets (a partition, a host powered off: SYNs unanswered; for TLS, a
    frozen member also hangs each handshake) costs every request of the
    batch that has no pooled connection one T, in turn, before any is
    redone on the next member.  Here Transport.get_all of FEW_LOCKS (8)
    locks, as a view that starts watching reads them
    (Protocol.read_locks), T = 0.5 s: 8 T = 4 s where one T (then the next
    member) is what the change claims; with the default T = 5 s, 40 s,
    past the default 30 s lock TTL.  delete_all (F3 + F4) shares the path.
    Suggested fix: give each _start (connect, TLS handshake) the time left
    to the batch's deadline, and stop starting once it has passed (those
    left count as NotSent)."""
    with dropping_host() as dropped:
        transport = connect([dropped, etcd_url], timeout=0.5, deadline=10)
        try:
            keys = [f"/etcdq/{queue_name}/locks/{n:020d}" for n in range(1, FEW_LOCKS + 1)]
            started = time.monotonic()
            replies = transport.get_all(keys)
            took = time.monotonic() - started
        finally:
            transport.close()
    assert all(isinstance(reply, KeyMissing) for reply in replies), replies
    assert took < 1.5, (
        f"get_all of {len(keys)} keys took {took:.1f} s on a member whose host drops "
        f"packets (T = 0.5 s): one connect timeout per request before the next member")


def test_a_junk_directory_removed_leaves_its_item_taken_in_a_watching_view(
        etcd_url: str, queue_name: str) -> None:
    """A directory
    appears at locks/<A> (junk another tool left) after a watching view saw
    A free: the claim's C1 is refused at an index past every sign of the
    view, so A is taken there, on any version, and only a newer sign frees
    it.  The operator removes the directory: its delete event carries
    ``"dir":true``, and _apply_event drops every directory event; a
    watching view lists locks/ only at a CONFIRM check, planned only for a
    sign at or before its listing.  A is free in etcd, and a consumer
    waiting for it does not get it while the stream lives (it restarts
    after 60 s without an event; a busy queue keeps it alive for good).
    9863fe4 makes every refusal by junk end this way (taken, silently: the
    "skipping item" warning is gone), so the case matters more now.
    Suggested fix: a directory's delete or expire event under locks/ is a
    sign that the lock is gone at its index."""
    with Queue(etcd_url, queue_name) as queue:
        view, stuck = watching_with_a_free_item(queue)
        # The junk appears after the view saw the item (another tool).
        junk = f"{queue.layout.locks}/{stuck}"
        queue.etcd.put(f"{junk}/junk", "makes it a directory")
        assert queue.claim(timeout=0) is None  # refused: taken
        assert not view.state.is_free(stuck)
        queue.etcd.delete(f"{junk}/junk")
        with urlopen(Request(f"{etcd_url}/v2/keys{junk}?dir=true", method="DELETE"),
                     timeout=5) as reply:
            assert reply.status == 200
        with pytest.raises(KeyMissing):
            queue.etcd.get(junk)
        got = queue.claim(timeout=3)
        assert got is not None and got.id == stuck, (
            f"the junk at locks/{stuck} was removed; the item is free in etcd but the "
            f"watching view holds it taken at {view.state.locks.get(stuck)}")
        got.complete()


def test_an_idle_watching_view_retries_a_junk_lock_every_confirm_interval(
        etcd_url: str, queue_name: str) -> None:
    """A directory at locks/<A> before the view starts watching
    (tests/test_junk.py's setup).  The view starts watching with A taken on
    an old sign: it reads locks/<A> (a directory: no lock) at R, and frees
    A.  The waiting claim's C1 is refused at R (nothing written since), and
    the override marks A taken at R, which is at the watching listing's own
    index, so a CONFIRM check is planned; CONFIRM s later it lists locks/
    (which holds a lock TTL's worth of lingering locks: the listing
    FEW_LOCKS reads were made to avoid), finds no lock, frees A, and the
    claim is refused again at the same index: one listing of locks/ and
    one refused PUT every second, for as long as nothing else is written
    and a consumer waits.  Suggested fix: when the override fires on a
    sign that was itself a read or listing at that index (junk, not a
    lock), do not plan a CONFIRM check for it (only a newer sign frees it),
    or skip the item's version as 433da8a did, but not for returned()'s
    sign."""
    with Queue(etcd_url, queue_name) as queue:
        stuck, after = queue.put("stuck"), queue.put("after")
        queue.etcd.put(f"{queue.layout.locks}/{stuck}/junk", "makes it a directory")
        claim = queue.claim(timeout=1)
        assert claim is not None and claim.id == after
        claim.complete()
        puts, gets = queue.etcd.requests["PUT"], queue.etcd.requests["GET"]
        thread, outcome = in_background(lambda: queue.claim(timeout=5))
        thread.join(10)
        spun = queue.etcd.requests["PUT"] - puts
        read = queue.etcd.requests["GET"] - gets
    assert outcome == {"returned": None}, outcome
    assert spun <= 2, (
        f"a claim waiting 5 s on an idle queue holding junk at locks/{stuck} sent "
        f"{spun} refused lock creates and {read} GETs (listings of locks/ each CONFIRM s)")


# -- held ---------------------------------------------------------------------------


def test_a_refusal_that_wins_after_the_stream_restarted_past_the_sweep_is_checked(
        etcd_url: str, queue_name: str) -> None:
    """The same interleaving in a watching view, with the stream lost at
    the worst moment: release(delay=1), R1's reply lost, resent after the
    delay lock's expiry and before etcd's sweep, so returned(A, 0, m); the
    next claim's C1 is refused at m; before locked_at runs, the view's
    stream ends and its new one registers only after etcd swept the lock
    (its expire event is in neither stream), and the view lists work/ at
    W > m.  The override marks A taken at m, which is at or before W: a
    CONFIRM check is planned, lists locks/, and frees A; the waiting claim
    gets it within a few seconds."""
    with Queue(etcd_url, queue_name, lock_ttl=30) as queue:
        for _ in range(4):
            if _restart_past_the_sweep(queue):
                return
        pytest.skip("etcd swept the delay lock before every resend (timing)")


def _restart_past_the_sweep(queue: Queue) -> bool:
    """One attempt of the test above; False if etcd swept before the resend."""
    claim, view = watching_view_holding_one_claim(queue)
    item_id = claim.id
    lock_key = queue.layout.key("locks", item_id)
    window = {"hit": False}
    original_put = force_unswept_resend(queue, lock_key, window)
    try:
        claim.release(delay=1)
    finally:
        queue.etcd.put = original_put  # type: ignore[method-assign]
    if not window["hit"]:
        got = queue.claim(timeout=4)
        assert got is not None and got.id == item_id
        got.complete()
        return False
    original_lock, original_stream = queue._protocol._create_lock, queue.etcd.stream
    forced: list[Any] = []

    def swept() -> bool:
        try:
            queue.etcd.get(lock_key, quorum=True)
        except KeyMissing:
            return True
        return False

    def stream(*args: Any, **kw: Any) -> Any:
        if forced:  # the new subscription comes after the sweep
            wait_until(swept, 5, interval=0.01)
        return original_stream(*args, **kw)

    def create_lock(lock_id: str, *args: Any) -> Any:
        try:
            return original_lock(lock_id, *args)
        except Exception as exc:
            if lock_id == item_id and not forced and getattr(exc, "refused", False):
                relists = view.relists
                forced.append(exc.index)  # type: ignore[attr-defined]
                view._follower.drop_stream()
                wait_until(lambda: view.relists > relists, 10, message="the view's new round")
            raise

    queue._protocol._create_lock = create_lock  # type: ignore[method-assign]
    queue.etcd.stream = stream  # type: ignore[method-assign]
    try:
        got = queue.claim(timeout=6)
    finally:
        queue._protocol._create_lock = original_lock  # type: ignore[method-assign]
        queue.etcd.stream = original_stream  # type: ignore[method-assign]
    # The release reports our delay lock, still there, as a
    # 1 s delay: the view waits for it and no C1 is refused (forced stays
    # empty); on 9863fe4 one was, and the override took over.  Either way:
    assert got is not None and got.id == item_id, (forced, view.state.locks.get(item_id))
    got.complete()
    return True


def test_a_batch_to_a_member_that_accepts_and_never_answers_costs_one_timeout(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """get_all of
    FEW_LOCKS keys on a transport whose member stopped answering, with
    pooled and new connections: one timeout (0.5 s) for the batch, then
    every read is redone on the next member, which answers."""
    transport = connect([proxy.url, etcd_url], timeout=0.5, deadline=10)
    try:
        keys = [f"/etcdq/{queue_name}/locks/{n:020d}" for n in range(1, FEW_LOCKS + 1)]
        transport.get_all(keys[:3])  # three pooled connections
        proxy.black_hole()
        started = time.monotonic()
        replies = transport.get_all(keys)
        took = time.monotonic() - started
        assert transport._member().url == etcd_url
    finally:
        proxy.pass_through()
        transport.close()
    assert all(isinstance(reply, KeyMissing) for reply in replies), replies
    assert took < 1.5, f"{took:.1f} s"


def test_a_completion_whose_batched_delete_lost_its_reply_is_done_once(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """F3 goes out in delete_all's batch; the member applies it and
    the reply is lost (the connection is cut after the request went up):
    the batch marks the member failed, the delete is redone on the next
    member and finds the item gone (KeyMissing: done).  complete() returns,
    work/ is empty, the record is there once, and no claim gets the item
    again."""
    transport = connect([proxy.url, etcd_url], timeout=0.5, deadline=10)
    with Queue(transport, queue_name) as consumer, Queue(etcd_url, queue_name) as other:
        item_id = other.put("x")
        claim = consumer.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        original = consumer.etcd.delete_all

        def delete_all(deletes: Any) -> Any:
            proxy.black_hole("down")  # the requests go up; their replies are lost
            try:
                return original(deletes)
            finally:
                proxy.pass_through()

        consumer.etcd.delete_all = delete_all  # type: ignore[method-assign]
        try:
            claim.complete()
        finally:
            consumer.etcd.delete_all = original  # type: ignore[method-assign]
        assert consumer.etcd._member().url == etcd_url  # moved on from the lossy one
        assert other._protocol.list("work")[1] == []
        assert [e.id for e in other._protocol.list("completed")[1]] == [item_id]
        assert consumer.claim(timeout=1) is None and other.claim(timeout=0) is None
