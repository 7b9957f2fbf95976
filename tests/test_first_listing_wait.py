"""The wait of a queue's first claim for its view's first listing: ended by
close(), no shorter for a claim that waits for ever than for one that waits
long, and, in claim_first, one wait for all its queues' first listings; a
timeout no wait can take is refused, as wait() refuses it.

Real etcd through the TCP proxy (tests/faultproxy.py): the reply of a first
listing of ``work/`` is held, as etcd holds one it is still encoding (whole,
before its first byte) when many consumers list a deep queue at once.
"""
from __future__ import annotations

import dataclasses
import math
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from etcdq_v2 import InvalidArgument, Queue, QueueClosed, claim_first, connect

from faultproxy import FaultProxy

TIMEOUT = 0.5  # the transport's request timeout; its deadline is 3x


def _listing(*names: str) -> "re.Pattern[bytes]":
    """The reply of a listing of any of the queues ``names``' work/."""
    keys = b"|".join(re.escape(f"/etcdq/{name}/work".encode()) for name in names)
    return re.compile(rb'"action":"get","node":\{"key":"(?:' + keys + rb')"')


def test_a_close_while_a_first_claim_waits_for_its_listing_raises_queue_closed(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    Queue(connect(etcd_url), queue_name).put("a")
    queue = Queue(connect(proxy.url, timeout=TIMEOUT), queue_name)
    proxy.hold("down", match=_listing(queue_name))
    asked = threading.Event()

    def claim() -> Any:
        asked.set()
        return queue.claim(timeout=30)

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        waiting = pool.submit(claim)
        asked.wait()
        proxy._wait_for(lambda: bool(proxy.held("down")), "the listing's reply to be held")
        queue.close()
        with pytest.raises(QueueClosed):
            waiting.result()
    finally:
        proxy.pass_through()
        queue.close()
        pool.shutdown()


def test_a_claim_that_waits_for_ever_waits_for_a_first_listing_etcd_answers_after_a_deadline(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    """As test_slow_listing's claim(timeout=10 deadlines), with timeout=None:
    the reply of the first listing is held for two deadlines, then passed."""
    Queue(connect(etcd_url), queue_name).put("a")
    queue = Queue(connect(proxy.url, timeout=TIMEOUT), queue_name)
    proxy.hold("down", match=_listing(queue_name))
    timer = threading.Timer(2 * queue.etcd.deadline, proxy.pass_through)
    timer.start()
    try:
        claim = queue.claim(timeout=None)
        assert claim is not None
        claim.complete()
    finally:
        timer.cancel()
        proxy.pass_through()
        queue.close()


def test_claim_first_that_waits_for_ever_waits_for_a_first_listing_etcd_answers_after_a_deadline(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    """As the test above, for claim_first(timeout=None) over two queues: the
    reply of the first queue's first listing is held for two deadlines, then
    passed; the claim gets its item."""
    first, second = f"{queue_name}-1", f"{queue_name}-2"
    Queue(connect(etcd_url), first).put("a")
    transport = connect(proxy.url, timeout=TIMEOUT)
    queues = [Queue(transport, first), Queue(transport, second)]
    proxy.hold("down", match=_listing(first))
    timer = threading.Timer(2 * transport.deadline, proxy.pass_through)
    timer.start()
    try:
        claim = claim_first(queues, timeout=None)
        assert claim is not None
        assert claim.payload == "a"
        claim.complete()
    finally:
        timer.cancel()
        proxy.pass_through()
        for queue in queues:
            queue.close()


def test_claim_first_waits_for_its_queues_first_listings_together(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    """Each queue's first listing is answered 0.6 of claim_first's timeout
    after it is sent (held; the second's hold begins as the first's ends).
    Listed together, both are in at 0.6 of the timeout and the claim gets the
    item; listed in turn, the second is in only at 1.2 of it."""
    first, second = f"{queue_name}-1", f"{queue_name}-2"
    Queue(connect(etcd_url), second).put("a")
    Queue(connect(etcd_url), first).put("b")
    transport = connect(proxy.url, timeout=TIMEOUT)
    queues = [Queue(transport, first), Queue(transport, second)]
    timeout = 4 * transport.deadline

    def second_held() -> None:  # one _set: what the first hold kept goes, new replies wait
        proxy._set(dataclasses.replace(proxy.faults, hold_match=_listing(second),
                                       released=proxy.faults.released + 1))

    proxy.hold("down", match=_listing(first, second))
    timers = [threading.Timer(0.6 * timeout, second_held),
              threading.Timer(1.2 * timeout, proxy.pass_through)]
    for timer in timers:
        timer.start()
    try:
        claim = claim_first(queues, timeout=timeout)
        assert claim is not None
        claim.complete()
    finally:
        for timer in timers:
            timer.cancel()
        proxy.pass_through()
        for queue in queues:
            queue.close()


@pytest.mark.parametrize("many", [False, True])
def test_a_claim_refuses_an_infinite_timeout_as_wait_does(
        etcd_url: str, queue_name: str, many: bool) -> None:
    queues = [Queue(connect(etcd_url, timeout=TIMEOUT), f"{queue_name}-{n}") for n in (1, 2)]
    try:
        with pytest.raises(InvalidArgument):
            queues[0].wait("00000000000000000001", timeout=math.inf)
        with pytest.raises(InvalidArgument):
            if many:
                claim_first(queues, timeout=math.inf)
            else:
                queues[0].claim(timeout=math.inf)
    finally:
        for queue in queues:
            queue.close()
