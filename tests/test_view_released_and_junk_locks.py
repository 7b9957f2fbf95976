"""An item given back, or freed by a junk lock's going, is offered again in
time: a quiet view offers an unswept released item within its delay and a
second, a release at once and a zero backoff at once; an expiring junk
directory at locks/<id> frees its item in a watching view, a directory
removed below a listing never frees a newer lock; a refusal at or after the
watching stream's start plans no CONFIRM check and is freed by the lock's
event, or checked when its lock goes while the stream restarts; and a batch
to a slow healthy member needs no redo.

Methods are wrapped only to force an ordering the fault proxy cannot: a
reply lost and its request resent in the moment after a delay lock
expired and before etcd swept it (as in tests/test_view_refused_lock_create.py),
and a stream that ends right after a refused lock create.
"""
from __future__ import annotations

import threading
import time
from typing import Any
from urllib.request import Request, urlopen

import pytest
from helpers import (force_unswept_resend, in_background, wait_until,
                     watching_with_a_free_item)

from etcdq_v2 import Queue
from etcdq_v2.codec import Lock, new_token
from etcdq_v2.errors import KeyMissing
from etcdq_v2.transport import connect


def _etcd(url: str, method: str, path: str) -> int:
    with urlopen(Request(f"{url}/v2/keys{path}", method=method), timeout=5) as reply:
        return int(reply.status)


# -- a released item comes back in time ------------------------------------------------


def test_a_quiet_view_offers_an_unswept_released_item_within_its_delay_and_a_second(
        etcd_url: str, queue_name: str) -> None:
    """A
    quiet view (a backlog) whose head A is released with delay=1; R1's reply
    is lost and the resend lands after the delay lock's expiry, before the
    sweep: _delay_lock_back now reports 1 s.  The lone consumer, giving back
    every other item at once, gets A within 2.5 s of release() returning
    (the delay has already run by then: 1 s planned, a listing of locks/,
    RELIST_DUE if still unswept), and no claim is refused on A's lock.
    (Before the rule this case held A a lock TTL.)"""
    with Queue(etcd_url, queue_name, lock_ttl=30) as queue:
        for attempt in range(4):
            ids = queue.put_many([f"{attempt}-{n}" for n in range(6)])
            claim = queue.claim()
            assert claim is not None and claim.id == ids[0]
            view = queue._ensure_view()
            assert not view.watching_locks
            window = {"hit": False}
            original_put = force_unswept_resend(queue, queue.layout.key("locks", claim.id),
                                                window)
            returned: list = []
            original_returned = view.returned
            view.returned = lambda *a, seen=returned, o=original_returned: (  # type: ignore
                seen.append(a), o(*a))[-1]
            try:
                claim.release(delay=1)
            finally:
                queue.etcd.put = original_put  # type: ignore[method-assign]
                view.returned = original_returned  # type: ignore[method-assign]
            released = time.monotonic()
            if not window["hit"]:
                for _ in ids:
                    got = queue.claim(timeout=3)
                    if got is not None:
                        got.complete()
                continue
            assert returned and returned[0][1] == 1, returned
            refused: list = []
            original_lock = queue._protocol._create_lock

            def create_lock(lock_id: str, *args: Any, seen: list = refused,
                            original: Any = original_lock, a: str = claim.id) -> Any:
                try:
                    return original(lock_id, *args)
                except Exception:
                    if lock_id == a:
                        seen.append(lock_id)
                    raise
            queue._protocol._create_lock = create_lock  # type: ignore[method-assign]
            found, others = None, 0
            while time.monotonic() - released < 5.0:
                got = queue.claim(timeout=0.5)
                assert got is not None
                if got.id == claim.id:
                    found = got
                    break
                others += 1
                got.release()
            took = time.monotonic() - released
            queue._protocol._create_lock = original_lock  # type: ignore[method-assign]
            assert found is not None and took < 2.5, (
                f"A handed out {took:.2f} s after release(delay=1) returned (lock past its "
                f"expiry at the read-back); held at {view.state.locks.get(claim.id)}")
            assert not refused, f"{len(refused)} lock creates refused on A's unswept lock"
            found.complete()
            for _ in ids[1:]:
                got = queue.claim(timeout=1)
                if got is not None:
                    got.complete()
            return
        pytest.skip("etcd swept the delay lock before every resend (timing)")


def test_a_release_at_once_and_a_zero_backoff_are_offered_at_once(
        etcd_url: str, queue_name: str) -> None:
    """In a quiet view and in
    a watching one: release() and fail() with a zero backoff give the item
    back at once; the next claim (timeout 0) gets it."""
    with Queue(etcd_url, queue_name, backoff=lambda attempt: 0) as queue:
        ids = queue.put_many([n for n in range(40)])
        for end in ("release", "fail"):
            claim = queue.claim()
            assert claim is not None and claim.id == ids[0]
            assert not queue._ensure_view().watching_locks
            getattr(claim, end)()
            again = queue.claim(timeout=0)
            assert again is not None and again.id == ids[0], (end, again and again.id)
            again.release()
        for item_id in ids:
            got = queue.claim(timeout=2)
            assert got is not None and got.id == item_id
            got.complete()
        assert queue.claim(timeout=0) is None
        view = queue._ensure_view()
        assert view.watching_locks
        last = queue.put("last")
        wait_until(lambda: view.state.is_free(last), 5, message="the put's event")
        for end in ("release", "fail"):
            claim = queue.claim(timeout=1)
            assert claim is not None and claim.id == last
            getattr(claim, end)()
            again = queue.claim(timeout=0)
            assert again is not None and again.id == last, end
            if end == "fail":
                again.complete()
            else:
                again.release()


# -- junk directories at a lock's key --------------------------------------------------


def test_an_expiring_junk_directory_frees_its_item_in_a_watching_view(
        etcd_url: str, queue_name: str) -> None:
    """A watching view saw item A free;
    another tool makes a directory with a TTL of 2 s at locks/<A>.  The
    claim is refused (A taken, no CONFIRM churn); when etcd expires the
    directory, its expire event (``"dir":true``) frees A, and a claim
    waiting gets it, with at most a couple of refused lock creates.
    (9863fe4 ignored every directory event: A stayed taken.)"""
    with Queue(etcd_url, queue_name) as queue:
        view, stuck = watching_with_a_free_item(queue)
        junk = f"{queue.layout.locks}/{stuck}"
        assert _etcd(etcd_url, "PUT", f"{junk}?dir=true&ttl=2") == 201
        puts = queue.etcd.requests["PUT"]
        assert queue.claim(timeout=0) is None  # refused on the directory: taken
        assert not view.state.is_free(stuck)
        started = time.monotonic()
        got = queue.claim(timeout=6)
        took = time.monotonic() - started
        assert got is not None and got.id == stuck, view.state.locks.get(stuck)
        assert took < 4.0, f"{took:.1f} s for a 2 s directory"
        assert queue.etcd.requests["PUT"] - puts <= 4  # refused C1 (1-2), C1, C2
        got.complete()


def test_a_directory_removed_below_the_listing_never_frees_a_newer_lock(
        etcd_url: str, queue_name: str) -> None:
    """A view that starts watching: its stream registers, then (its listing
    paused) a directory at locks/<A> comes and goes, and another consumer
    claims A.  The listing shows A claimed (taken at C2's index); the
    directory's delete event, older than that, is applied after it and must
    not free A: a claim of ours finds nothing and sends no lock create."""
    with Queue(etcd_url, queue_name) as queue, Queue(etcd_url, queue_name) as other:
        item = queue.put("a")
        view = queue._ensure_view()
        protocol = queue._protocol
        original_list = protocol.list
        paused: dict = {}

        def list_(kind: str, *args: Any, **kw: Any) -> Any:
            if (kind == "work" and not paused and threading.current_thread().name
                    == "etcdq-view" and view._follower.directory is not None):
                paused["at"] = view._follower.since
                junk = f"{queue.layout.locks}/{item}"
                assert _etcd(etcd_url, "PUT", f"{junk}?dir=true") == 201
                assert _etcd(etcd_url, "DELETE", f"{junk}?dir=true") == 200
                paused["claim"] = other.claim(timeout=2)
            return original_list(kind, *args, **kw)

        protocol.list = list_  # type: ignore[method-assign]
        try:
            claim = queue.claim(timeout=0)
            assert claim is not None and claim.id == item
            claim.release()
            # Now make the view start watching with A claimed by other meanwhile.
            view._replace_follower(locks=True, list_locks=True)
            wait_until(lambda: "claim" in paused and view.state.ready, 10,
                       message="the watching round")
        finally:
            protocol.list = original_list  # type: ignore[method-assign]
        held = paused["claim"]
        assert held is not None and held.id == item
        wait_until(lambda: view.state.known >= held._state.index, 5,
                   message="the view's listing of the other claim")
        assert not view.state.is_free(item), view.state.locks.get(item)
        assert view.state.gone.get(item, 0) > 0  # the directory's delete was applied
        puts = queue.etcd.requests["PUT"]
        assert queue.claim(timeout=0.5) is None
        assert not view.state.is_free(item), view.state.locks.get(item)
        assert queue.etcd.requests["PUT"] == puts, "a lock create on an item held by another"
        held.complete()


# -- refusals and the watching stream --------------------------------------------------


def _starved_view_unaware_of_a_bare_lock(queue: Queue, other: Queue) -> tuple:
    """A quiet view (a backlog) worked through; meanwhile another consumer's
    C1 (a bare lock, its C2 still to come) is made on a new item A that
    the quiet view never listed.  The claim that finds nothing else starts
    watching (work/ listed, not locks/): A looks free, and its C1 is
    refused at the index of that listing, at or after the stream began."""
    backlog = queue.put_many([n for n in range(40)])
    view = queue._ensure_view()
    assert not view.watching_locks
    item = other.put("A")  # not ours: the quiet view does not list again for it
    lock = Lock("other", new_token())
    other._protocol._create_lock(item, lock, 30)
    for item_id in backlog:
        got = queue.claim(timeout=2)
        assert got is not None and got.id == item_id
        got.complete()
    return view, item, lock


def test_a_refusal_after_the_stream_began_is_freed_by_the_lock_s_event(
        etcd_url: str, queue_name: str) -> None:
    """The refusal at or after the watching stream's start
    plans no CONFIRM; the bare lock's delete is an event of that stream and
    frees A: a claim waiting gets it at once."""
    with Queue(etcd_url, queue_name) as queue, Queue(etcd_url, queue_name) as other:
        view, item, lock = _starved_view_unaware_of_a_bare_lock(queue, other)
        refused: list = []
        original = queue._protocol._create_lock

        def create_lock(lock_id: str, *args: Any) -> Any:
            try:
                return original(lock_id, *args)
            except Exception as exc:
                if lock_id == item:
                    refused.append((exc, view._follower.since, view.state.confirm_upto))
                raise

        queue._protocol._create_lock = create_lock  # type: ignore[method-assign]
        try:
            assert queue.claim(timeout=1) is None
        finally:
            queue._protocol._create_lock = original  # type: ignore[method-assign]
        assert refused, "the claim never tried A"
        assert [(e.index >= since == upto) for e, since, upto in refused if since] == [True]
        assert view.watching_locks and not view.state.is_free(item)
        thread, outcome = in_background(lambda: queue.claim(timeout=5))
        other.etcd.delete(queue.layout.key("locks", item), prev_value=lock.encode())
        started = time.monotonic()
        thread.join(10)
        got = outcome.get("returned")
        assert got is not None and got.id == item, (outcome, view.state.locks.get(item))
        assert time.monotonic() - started < 1.0
        got.complete()


def test_a_refusal_whose_lock_goes_while_the_stream_restarts_is_checked(
        etcd_url: str, queue_name: str) -> None:
    """As above, but right
    after the refusal the stream ends, the bare lock is deleted before the
    new stream registers (its event is in neither stream), and locked_at
    runs while the old stream's index is still the follower's ``since``:
    no CONFIRM then.  The new round's listing checks the sign (read, or
    CONFIRM): a claim waiting gets A within a few seconds."""
    with Queue(etcd_url, queue_name) as queue, Queue(etcd_url, queue_name) as other:
        view, item, lock = _starved_view_unaware_of_a_bare_lock(queue, other)
        original_lock, original_stream = queue._protocol._create_lock, queue.etcd.stream
        forced: list = []
        gone = threading.Event()

        def stream(*args: Any, **kw: Any) -> Any:
            if forced:
                assert gone.wait(10)  # the new subscription comes after the delete
            return original_stream(*args, **kw)

        def create_lock(lock_id: str, *args: Any) -> Any:
            try:
                return original_lock(lock_id, *args)
            except Exception as exc:
                if lock_id == item and not forced and getattr(exc, "refused", False):
                    forced.append((exc.index, view._follower.since))  # type: ignore
                    view._follower.drop_stream()
                    other.etcd.delete(queue.layout.key("locks", item),
                                      prev_value=lock.encode())
                raise

        queue._protocol._create_lock = create_lock  # type: ignore[method-assign]
        queue.etcd.stream = stream  # type: ignore[method-assign]
        try:
            first = queue.claim(timeout=0.5)
            gone.set()
            got = first or queue.claim(timeout=5)
        finally:
            gone.set()
            queue._protocol._create_lock = original_lock  # type: ignore[method-assign]
            queue.etcd.stream = original_stream  # type: ignore[method-assign]
        assert forced, "the claim never tried A"
        assert forced[0][1] is not None and forced[0][0] >= forced[0][1]  # a refusal at or after the stream's start
        assert got is not None and got.id == item, (forced, view.state.locks.get(item))
        got.complete()


# -- batches to a slow member ----------------------------------------------------------


def test_a_batch_to_a_slow_healthy_member_needs_no_redo(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """A healthy member 150 ms away (each way) and a
    request timeout of 1 s: get_all of 8 lock reads on fresh connections,
    and a completion's F3 + F4 batch (lock_ttl past LINGER_MAX, so F4 is
    sent), all answer in one go: no request of the batch is redone on
    another member (the transport stays on the proxied member)."""
    transport = connect([proxy.url, etcd_url], timeout=1.0, deadline=10)
    try:
        proxy.delay(150)
        keys = [f"/etcdq/{queue_name}/locks/{n:020d}" for n in range(1, 9)]
        replies = transport.get_all(keys)
        assert all(isinstance(reply, KeyMissing) for reply in replies), replies
        assert transport._member().url == proxy.url
        with Queue(transport, queue_name, lock_ttl=120) as queue:
            assert not queue._protocol.locks_linger
            item = queue.put("x")
            claim = queue.claim(timeout=5)
            assert claim is not None and claim.id == item
            claim.complete()
            assert transport._member().url == proxy.url
            assert queue._protocol.list("work")[1] == []
            assert queue._protocol.list("locks")[1] == []
    finally:
        proxy.pass_through()
        transport.close()
