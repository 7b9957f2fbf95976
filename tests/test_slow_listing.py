"""A listing still arriving on a slow link is waited for; a member that sends nothing is not.

Through the real TCP proxy (tests/faultproxy.py), throttled to a rate at
which the queue's listing of ``work/`` takes about twice the transport's
deadline to arrive: every recv gets bytes well within the request timeout,
so the wire never times out, and the first claim waits for the listing as
long as its bytes keep coming.  A black-holed member, which sends nothing,
still fails the first claim at the deadline.
"""
from __future__ import annotations

import re
import threading
import time

import pytest

from etcdq_v2 import Queue, Unavailable, connect

from faultproxy import FaultProxy

TIMEOUT = 0.5  # the transport's request timeout; its deadline is 3x
ITEMS = 1500
VALUE = "v" * 1000  # ~1.2 kB per listed node: a listing of ~1.8 MB
RATE = 600_000  # bytes a second: ~3 s for the listing, twice the deadline


def _filled(etcd_url: str, queue_name: str) -> None:
    filler = Queue(connect(etcd_url), queue_name)
    filler.put_many([VALUE] * ITEMS, in_flight=8)
    filler.close()


def test_a_first_claim_waits_for_a_listing_that_keeps_arriving(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    _filled(etcd_url, queue_name)
    proxy.throttle(RATE, "down")
    queue = Queue(connect(proxy.url, timeout=TIMEOUT), queue_name)
    try:
        began = time.monotonic()
        claim = queue.claim(timeout=30)
        took = time.monotonic() - began
        assert claim is not None
        # The premise: the listing took longer than a deadline to arrive.
        assert took > queue.etcd.deadline, f"the throttled listing took only {took:.2f} s"
        claim.complete()
    finally:
        queue.close()


def test_a_listing_that_keeps_arriving_outlives_the_request_timeout(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    _filled(etcd_url, queue_name)
    proxy.throttle(RATE, "down")
    transport = connect(proxy.url, timeout=TIMEOUT)
    work = f"/etcdq/{queue_name}/work"
    try:
        began = time.monotonic()
        whole = transport.get(work, sorted=True, quorum=True)
        streamed = sum(1 for _ in transport.listing(work, sorted=True, quorum=True).nodes())
        took = time.monotonic() - began
        assert len(whole.node["nodes"]) == streamed == ITEMS
        assert took > 2 * transport.deadline, f"the throttled listings took only {took:.2f} s"
    finally:
        transport.close()


def test_a_first_claim_from_a_member_that_sends_nothing_fails_within_its_timeout(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    _filled(etcd_url, queue_name)
    proxy.black_hole("down")
    queue = Queue(connect(proxy.url, timeout=TIMEOUT), queue_name)
    try:
        with pytest.raises(Unavailable):
            queue.claim(timeout=2 * queue.etcd.deadline)
        with pytest.raises(Unavailable):
            queue.claim(timeout=0)  # a deadline, as every request
    finally:
        queue.close()


def test_a_first_claim_waits_its_timeout_for_a_listing_etcd_answers_after_a_deadline(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    """etcd encodes a listing whole before its first byte: many first listings
    of a deep queue at once take it longer than a deadline, with nothing to
    show that they are coming.  A claim that waits longer than a deadline for
    an item waits that long for its view's first listing too: the reply of the
    first listing of work/ is held for two deadlines (the follower's call gives
    up, and lists again once the hold ends), and the claim gets the item."""
    Queue(connect(etcd_url), queue_name).put("a")
    listing = re.compile(rb'"action":"get","node":\{"key":"/etcdq/'
                         + re.escape(queue_name.encode()) + rb'/work"')
    queue = Queue(connect(proxy.url, timeout=TIMEOUT), queue_name)
    proxy.hold("down", match=listing)
    timer = threading.Timer(2 * queue.etcd.deadline, proxy.pass_through)
    timer.start()
    try:
        claim = queue.claim(timeout=10 * queue.etcd.deadline)
        assert claim is not None
        assert timer.finished.is_set(), "the claim returned before the hold ended"
        claim.complete()
    finally:
        timer.cancel()
        proxy.pass_through()
        queue.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_a_read_whose_reply_has_not_begun_is_waited_for_not_sent_again(
        etcd_url: str, queue_name: str, proxy: FaultProxy, streamed: bool) -> None:
    """etcd encodes a listing whole before it sends a byte of it, and goes on
    encoding one whose client gave up: a listing that timed out before its
    first byte is waited for again on its connection when the call comes
    back to that member, not sent there again (one member here: every
    retry), whether it is read whole or streamed (an export's).  The proxy
    delays every reply by twice the request timeout, within the deadline:
    the first GET's reply is read, and it is the only GET sent."""
    key = f"/etcdq/{queue_name}/work"
    Queue(connect(etcd_url), queue_name).put_many(["a", "b"], in_flight=1)
    transport = connect(proxy.url, timeout=1.0, deadline=8.0)
    try:
        proxy.delay(2000, "down")
        if streamed:
            listed = sum(1 for _ in transport.listing(key, sorted=True, quorum=True).nodes())
        else:
            listed = len(transport.get(key, sorted=True, quorum=True).node["nodes"])
        assert listed == 2
        sent = [line for line in proxy.requests if line.startswith(b"GET /v2/keys" + key.encode())]
        assert len(sent) == 1, sent
    finally:
        transport.close()
