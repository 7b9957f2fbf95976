"""Small helpers shared by the tests.

Tests against a real etcd must wait for things that happen "soon" (a leader
election, a key expiring).  A bare ``time.sleep`` either wastes time or is
too short on a slow CI machine, so every wait polls a condition against a
deadline and fails with a message saying what was awaited.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05, *,
               message: str = "",
               ignore: Tuple[Type[BaseException], ...] = ()) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value.

    Raises AssertionError after ``timeout`` seconds.  Exceptions of the types
    in ``ignore`` count as "not yet" (e.g. a connection refused while a member
    restarts); the last one is quoted in the failure message.
    """
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except ignore as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    what = message or getattr(predicate, "__name__", repr(predicate))
    detail = f"; last error: {last_error!r}" if last_error else ""
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")


def is_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie awaiting its reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def in_background(call: Callable[[], Any], name: str = "background"
                  ) -> Tuple[threading.Thread, Dict[str, Any]]:
    """Run ``call`` in a thread: ``(thread, outcome)``; once the thread ends,
    ``outcome`` has "returned" (the value) or "raised" (the exception)."""
    outcome: Dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["returned"] = call()
        except BaseException as exc:  # noqa: B036 - handed to the test thread
            outcome["raised"] = exc
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, outcome


def lose_first_listing(protocol: Any, kind: str, thread_name: str) -> List[str]:
    """Make the first ``protocol.list(kind)`` in the thread named
    ``thread_name`` raise Unavailable, as a member that died before answering:
    the list that records it (empty until then)."""
    from etcdq_v2.errors import Unavailable
    original, lost = protocol.list, []

    def losing(listed_kind: str, *args: Any, **kwargs: Any) -> Any:
        if listed_kind == kind and not lost and threading.current_thread().name == thread_name:
            lost.append(listed_kind)
            raise Unavailable("the member died before answering (test)")
        return original(listed_kind, *args, **kwargs)

    protocol.list = losing
    return lost


def pause_listing(protocol: Any, kind: str, thread_name: str, *, after_reply: bool = True
                  ) -> Tuple[threading.Event, threading.Event]:
    """Make ``protocol.list(kind)`` in the thread named ``thread_name`` stop
    (after etcd's reply, or before the request) until ``resume`` is set:
    ``(reached, resume)``.  Only to order two threads of a view on purpose."""
    original = protocol.list
    reached, resume = threading.Event(), threading.Event()

    def paused(listed_kind: str, *args: Any, **kwargs: Any) -> Any:
        mine = listed_kind == kind and threading.current_thread().name == thread_name
        if mine and not after_reply:
            reached.set()
            assert resume.wait(20)
        reply = original(listed_kind, *args, **kwargs)
        if mine and after_reply:
            reached.set()
            assert resume.wait(20)
        return reply

    protocol.list = paused
    return reached, resume


@contextlib.contextmanager
def quiet_view_whose_head_is_held(etcd_url: str, proxy_url: str, name: str, lock_ttl: int,
                                  items: int = 40) -> Iterator[Tuple[Any, ...]]:
    """Three Queues on ``name``: a producer, ``other`` and a consumer that
    talks to etcd through the fault proxy (request timeout 1 s).  ``items``
    items are put; the consumer's view lists them and stays quiet (a backlog),
    and ``other`` holds the first, so the consumer's first claim misses (a
    relist of work/ comes soon after).  Yields ``(producer, other, consumer,
    ids, the consumer's view, other's claim)``."""
    from etcdq_v2 import Queue
    from etcdq_v2.transport import connect
    with Queue(etcd_url, name, lock_ttl=lock_ttl) as producer, \
            Queue(etcd_url, name, lock_ttl=lock_ttl) as other, \
            Queue(connect(proxy_url, timeout=1.0), name, lock_ttl=lock_ttl) as consumer:
        ids = producer.put_many([{"b": n} for n in range(items)])
        view = consumer._ensure_view()
        assert not view.watching_locks and set(ids) <= set(view.state.items)
        held = other.claim(timeout=0)
        assert held is not None and held.id == ids[0]
        yield producer, other, consumer, ids, view, held


def claim_until_idle(queue: Any, idle_rounds: int, record: Callable[[str], None], *,
                     tolerate: Tuple[Type[BaseException], ...] = (), work: float = 0.0) -> None:
    """Claim and complete items until ``idle_rounds`` claims in a row (0.25 s
    each) find none; ``record(id)`` before completing each (a claimer thread).
    A claim that raises one of ``tolerate`` is tried again; ``work``: seconds
    each item takes to run."""
    idle = 0
    while idle < idle_rounds:
        try:
            claim = queue.claim(timeout=0.25)
        except tolerate:
            continue
        if claim is None:
            idle += 1
            continue
        idle = 0
        record(claim.id)
        time.sleep(work)  # the item's work, not a wait for an outcome
        claim.complete()


def locks_get(queue_name: str) -> bytes:
    """The start of a request listing the queue's locks/, for the fault proxy's ``match``."""
    return rb"GET /v2/keys/etcdq/" + queue_name.encode() + rb"/locks"


def work_listing(queue_name: str) -> "re.Pattern[bytes]":
    """A request listing the queue's work/ (not a read of one item in it), for
    the fault proxy's ``match``."""
    return re.compile(rb"GET /v2/keys/etcdq/" + re.escape(queue_name.encode()) + rb"/work\?")


def q_item(queue: Any, n: int = 1) -> str:
    """An item that carries "q" and has no lock, as requeue (Q3) or import (I3)
    write it: free in etcd at once; its id."""
    from etcdq_v2.codec import Item
    raw = Item({"x": n}, f"tok-q-{n}", requeued=True).encode()
    item_id, _ = queue._protocol.post_item(raw, f"tok-q-{n}")
    return str(item_id)


def unplanned(view: Any) -> Dict[str, int]:
    """The view's new delayed items whose delay no listing of locks/ covered yet."""
    return dict(view.state.unplanned)


def claim_noting(queue: Any, got: List[str], failed: List[BaseException],
                 timeout: float = 0) -> None:
    """One claim: its item's id appended to ``got`` (completed at once), or the
    library error it raised to ``failed``."""
    from etcdq_v2.errors import EtcdqError
    try:
        claim = queue.claim(timeout=timeout)
    except EtcdqError as exc:
        failed.append(exc)
        return
    if claim is not None:
        got.append(claim.id)
        claim.complete()


def claim_one_of(queue: Any, got: List[str], failed: List[BaseException], tries: int) -> None:
    """Up to ``tries`` claims (claim_noting) until one hands out an item."""
    for _ in range(tries):
        before = len(got)
        claim_noting(queue, got, failed)
        if len(got) > before:
            return


def claim_and_complete(queue: Any, timeout: float = 0) -> Optional[str]:
    """One claim; the item's id (completed at once), or None."""
    claim = queue.claim(timeout=timeout)
    if claim is None:
        return None
    claim.complete()
    return str(claim.id)


def claims_until(queue: Any, item_id: str, within: float, claim_timeout: float = 0.2
                 ) -> List[str]:
    """Claim (and complete) items for up to ``within`` seconds, stopping at
    ``item_id``: the ids claimed, in order (how late an item came back)."""
    got: List[str] = []
    start = time.monotonic()
    while time.monotonic() - start < within:
        claim = queue.claim(timeout=claim_timeout)
        if claim is None:
            continue
        got.append(claim.id)
        claim.complete()
        if claim.id == item_id:
            break
    return got


def is_free_in_etcd(queue: Any, item_id: str) -> bool:
    """Whether the item is in work/, without an outcome and without a lock."""
    from etcdq_v2.codec import Item
    protocol = queue._protocol
    entry = protocol.read("work", item_id)
    return (entry is not None and Item.decode(entry.value).outcome is None
            and protocol.read("locks", item_id) is None)


def hands_out(consumer: Any, item_id: str, within: float, other: Any = None) -> Any:
    """``consumer.claim(timeout=within)`` hands out ``item_id``, free in etcd: the
    claim.  If it does not, the failure says what the view holds, once ``other``
    (another consumer) has shown the item free by getting it at once."""
    assert is_free_in_etcd(consumer, item_id)
    started = time.monotonic()
    got = consumer.claim(timeout=within)
    waited = time.monotonic() - started
    view = consumer._view
    stuck = dict(view.state.locks), view.state.confirm_at
    if got is None and other is not None:
        assert is_free_in_etcd(consumer, item_id)
        taken = other.claim(timeout=0)
        assert taken is not None and taken.id == item_id
        taken.release()
    assert got is not None and got.id == item_id, (
        f"free item {item_id} not handed out within {waited:.1f} s; the view holds "
        f"it taken: _locks={stuck[0]}, _confirm_at={stuck[1]}")
    return got


def record_calls(owner: Any, name: str) -> List[Any]:
    """Wrap the method ``owner.name`` (on the instance): the list, from now on,
    of the first argument of each call."""
    calls: List[Any] = []
    original = getattr(owner, name)

    def recorded(first: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(first)
        return original(first, *args, **kwargs)

    setattr(owner, name, recorded)
    return calls


def force_unswept_resend(queue: Any, lock_key: str, window: Dict[str, Any]) -> Any:
    """Wrap ``queue.etcd.put`` so that R1 (the CAS of a claim's lock to a delay
    lock) applies, its reply is lost, and the resend goes out once etcd says
    the delay lock expired but has not swept it yet (a lock with no ttl left);
    ``window["hit"]`` tells whether that moment was caught.  Returns the
    original put, to restore."""
    from etcdq_v2.errors import KeyMissing
    original_put = queue.etcd.put

    def put(key: str, value: Optional[str] = None, **kw: Any) -> Any:
        reply = original_put(key, value, **kw)
        if key != lock_key or kw.get("prev_value") is None or not kw.get("ttl"):
            return reply

        def expired_unswept() -> Optional[bool]:
            try:
                node = queue.etcd.get(lock_key, quorum=True).node
            except KeyMissing:
                return True  # swept first: this attempt missed the window
            if not node.get("ttl"):
                window["hit"] = True
                return True
            return None
        wait_until(expired_unswept, 5, interval=0.002)
        return original_put(key, value, **kw)  # the resend: CompareFailed

    queue.etcd.put = put
    return original_put


def watching_with_a_free_item(queue: Any) -> Tuple[Any, str]:
    """The queue's consumer finds nothing and starts watching; then a new item
    comes, free in its view: ``(the view, the item's id)``."""
    assert queue.claim(timeout=0) is None
    view = queue._ensure_view()
    assert view.watching_locks
    item_id = queue.put("stuck")
    wait_until(lambda: view.state.is_free(item_id), 5, message="the put's event")
    return view, item_id


def watching_view_holding_one_claim(queue: Any) -> Tuple[Any, Any]:
    """Put one item, claim it, and let the view start watching (nothing else
    free): ``(the claim, the view)``, the view's events settled."""
    item_id = queue.put("x")
    claim = queue.claim()
    assert claim is not None and claim.id == item_id
    assert queue.claim(timeout=0) is None
    view = queue._ensure_view()
    assert view.watching_locks
    index = queue.etcd.put(f"{queue.layout.root}/sentinel", "x").written_index
    wait_until(lambda: view.state.known >= index, 5, message="the view's events")
    return claim, view


def work_ids(queue: Any) -> List[str]:
    """The ids in the queue's work/, sorted (put order), as etcd lists them now."""
    return sorted(entry.id for entry in queue._protocol.list("work")[1])
