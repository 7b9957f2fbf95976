"""put_many with several puts in flight (``in_flight``): order, and no put stored twice.

Against a real etcd, with network faults through the TCP proxy: a connection
held while the others go on (the order bound), connections cut in the middle
of a batch, an etcd restart in the middle of a batch.  docs/protocol.md,
"put_many with in_flight", has the crash table these check.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Dict, List, Optional

import pytest

from etcdq_v2 import InvalidArgument, InvalidPayload, Queue, Unavailable, connect
from etcdq_v2.server import EtcdServer
from etcdq_v2.transport import Refused

from faultproxy import FaultProxy
from helpers import in_background, wait_until

_POST = re.compile(rb"^POST ")


def stored(queue: Queue) -> Dict[str, Any]:
    """id -> payload of every pending item."""
    return {info.id: info.payload for info in queue.items("pending")}


def posts(proxy: FaultProxy) -> int:
    """POST requests that reached the proxy so far (held ones included)."""
    return sum(1 for line in list(proxy.requests) if _POST.match(line))


class Observed:
    """A transport observer: the outcome of each POST, by error label (None: success),
    and the number of failed requests of any kind."""

    def __init__(self) -> None:
        self.posts: Counter[Optional[str]] = Counter()
        self.failures = 0

    def __call__(self, method: str, seconds: float, error: Optional[str]) -> None:
        if method == "POST":
            self.posts[error] += 1
        self.failures += error is not None


def test_every_item_is_stored_once_and_the_ids_come_in_the_order_given(
        etcd_url: str, queue_name: str) -> None:
    given = [{"n": n} for n in range(300)]
    observed = Observed()
    with Queue(etcd_url, queue_name) as queue:
        queue.etcd.add_observer(observed)
        ids = queue.put_many(given, in_flight=16)
        assert len(set(ids)) == len(given)
        assert stored(queue) == dict(zip(ids, given))
    assert observed.posts == {None: len(given)}  # each POST reported once, none resent


def test_no_item_is_stored_before_one_given_in_flight_places_earlier(
        proxy: FaultProxy, queue_name: str) -> None:
    """The connection carrying item 5 is held: the others go on, but never more
    than ``in_flight`` places past it; once it is released, item 5 is stored
    after the items 6-12 and before every item from 13 on."""
    in_flight, held = 8, 5
    given = [f"p{n:04d}" for n in range(60)]
    with Queue(connect(proxy.url, timeout=5), queue_name) as queue:
        proxy.hold("up", match=given[held].encode())
        thread, outcome = in_background(lambda: queue.put_many(given, in_flight=in_flight))
        wait_until(lambda: posts(proxy) >= held + in_flight, 10,
                   message="the POSTs up to the window's end")
        # Room for a pipeline that ignored its window to run ahead before the release.
        thread.join(0.2)
        sent_while_held = posts(proxy)
        proxy.release()
        thread.join(10)
        ids: List[str] = outcome["returned"]
        assert sent_while_held == held + in_flight
        assert stored(queue) == dict(zip(ids, given))
    overtook = [n for n in range(held + 1, held + in_flight) if ids[n] < ids[held]]
    assert overtook  # the hold did delay item 5 ...
    assert all(ids[n] > ids[held] for n in range(held + in_flight, len(given)))  # ... boundedly


def test_cuts_in_the_middle_of_a_batch_store_every_item_exactly_once(
        proxy: FaultProxy, queue_name: str) -> None:
    """Five times, every connection is cut once part of a reply went through: the
    POSTs whose replies were cut are in doubt, found by their tokens, never resent."""
    given = [f"item-{n}" for n in range(2000)]
    observed = Observed()
    mid_batch = []
    with Queue(connect(proxy.url, timeout=2, deadline=20), queue_name) as queue:
        queue.etcd.add_observer(observed)
        thread, outcome = in_background(lambda: queue.put_many(given, in_flight=16))
        for cut in range(1, 6):
            wait_until(lambda n=cut * 150: posts(proxy) >= n or not thread.is_alive(), 20,
                       interval=0.002, message=f"{cut * 150} POSTs")
            proxy.cut(60)  # a POST's reply is about 250 bytes
            mid_batch.append(thread.is_alive())
            wait_until(lambda seen=observed.failures: observed.failures > seen
                       or not thread.is_alive(), 10, message="a request to fail on the cut")
            proxy.pass_through()
        thread.join(30)
        assert "raised" not in outcome, outcome.get("raised")
        ids: List[str] = outcome["returned"]
        assert stored(queue) == dict(zip(ids, given))  # each payload once, under its id
    assert posts(proxy) == len(given)  # each sent once: those in doubt were looked for
    assert all(mid_batch) and observed.posts["Lost"] >= 5  # the cuts left POSTs in doubt


@pytest.mark.alone  # timing: a busy machine stretches its fault's window past its bounds
def test_an_etcd_crash_and_restart_in_the_middle_of_a_batch_stores_no_item_twice(
        etcd_binary: str, tmp_path: Any, queue_name: str) -> None:
    """etcd is SIGKILLed with POSTs in flight, then started again.  Those it had
    committed are found by their tokens; those it had not are lost with it, but
    the client cannot tell a restarted member from a frozen one that could still
    apply them: Unavailable, "may or may not be stored".  None is stored twice."""
    server = EtcdServer(tmp_path / "etcd", binary=etcd_binary).start()
    given = [f"item-{n}" for n in range(5000)]
    observed = Observed()
    try:
        with Queue(connect(server.url, timeout=1, deadline=30), queue_name) as queue:
            queue.etcd.add_observer(observed)
            thread, outcome = in_background(lambda: queue.put_many(given, in_flight=16))
            wait_until(lambda: observed.posts[None] >= 500, 20, message="500 items stored")
            server.kill()
            server.start()
            thread.join(40)
            counts = Counter(info.payload for info in queue.items("pending"))
        # The crash came mid-batch: some POST failed (in doubt, or refused while etcd was
        # down: which one depends on where each connection was when etcd died).
        assert sum(n for label, n in observed.posts.items() if label) >= 1, observed.posts
        assert counts and max(counts.values()) == 1  # none stored twice
        assert set(counts) <= set(given)
        if "returned" in outcome:
            assert len(counts) == len(given)
        else:
            raised = outcome["raised"]
            assert isinstance(raised, Unavailable), raised
            # In doubt; or, once every POST in doubt was found, a new round that every
            # endpoint refused (etcd not back yet): nothing of it was sent.
            assert isinstance(raised, Refused) or "may or may not be stored" in str(raised)
            assert len(given) - len(counts) <= len(given) - observed.posts[None]
    finally:
        server.stop()


def test_a_consumer_in_the_same_process_claims_the_items_in_the_order_stored(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        assert queue.claim() is None  # the view is up: the items are offered to it
        ids = queue.put_many(range(100), in_flight=16)
        claimed = []
        for _ in ids:
            claim = queue.claim(timeout=5)
            assert claim is not None
            claimed.append((claim.id, claim.payload))
            claim.complete()
    assert claimed == sorted(zip(ids, range(100)))


@pytest.mark.parametrize("in_flight", [0, 65, True, 2.0, "8"])
def test_a_bad_in_flight_is_an_invalid_argument_before_any_write(
        etcd_url: str, queue_name: str, in_flight: Any) -> None:
    with Queue(etcd_url, queue_name) as queue:
        with pytest.raises(InvalidArgument, match="in_flight"):
            queue.put_many([1, 2], in_flight=in_flight)
        with pytest.raises(InvalidPayload):
            queue.put_many([1, 2, {3}], in_flight=8)  # a set is not JSON
        assert queue.stats()["pending"] == 0
