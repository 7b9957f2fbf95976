"""A lost put reply is found by reading the keys its POST can have taken, not the queue.

Through the real TCP proxy (tests/faultproxy.py): a POST whose reply is held
(it applied) or whose request is held (it did not) times out, and the put
searches for its token.  The transport read etcd indexes before, so an
applied POST's id lies in a short span: the search reads those keys, and
lists none of ``work/``, ``completed/`` and ``failed/``, whatever their size.
A token not in the span is settled by the listings: the span is a lower
bound only while etcd's index never goes back (tests/test_put_read_back_bounds.py).
"""
from __future__ import annotations

import re
from typing import List

import pytest

from etcdq_v2 import Queue, Unavailable, connect

from faultproxy import FaultProxy

TIMEOUT = 0.5


def _listings(proxy: FaultProxy, since: int, queue_name: str) -> List[bytes]:
    listing = re.compile(rb"GET /v2/keys/etcdq/" + re.escape(queue_name.encode())
                         + rb"/(work|completed|failed)(\?| )")
    return [line for line in proxy.requests[since:] if listing.match(line)]


def _queue_with_records(proxy: FaultProxy, queue_name: str) -> Queue:
    queue = Queue(connect(proxy.url, timeout=TIMEOUT), queue_name)
    queue.put_many([f"old-{n}" for n in range(40)], in_flight=4)
    for _ in range(20):
        claim = queue.claim(timeout=5)
        assert claim is not None
        claim.complete()
    return queue


def test_a_lost_put_reply_is_found_without_listing_the_queue(
        queue_name: str, proxy: FaultProxy) -> None:
    queue = _queue_with_records(proxy, queue_name)
    try:
        since = len(proxy.requests)
        proxy.hold("down", match=rb'"action":"create"')  # the POST applies, its reply waits
        item_id = queue.put("in doubt")
        proxy.pass_through()
        assert queue.get(item_id).payload == "in doubt"
        assert _listings(proxy, since, queue_name) == []
    finally:
        proxy.pass_through()
        queue.close()


def test_a_lost_put_that_did_not_apply_is_settled_by_the_listings(
        queue_name: str, proxy: FaultProxy) -> None:
    queue = _queue_with_records(proxy, queue_name)
    try:
        since = len(proxy.requests)
        proxy.hold("up", match=rb"POST ")  # the POST never reaches etcd
        with pytest.raises(Unavailable, match="may or may not be stored"):
            queue.put("never stored")
        proxy.disconnect()  # the held POST is dropped with its connection
        proxy.pass_through()
        assert len(_listings(proxy, since, queue_name)) == 3  # work/, completed/, failed/
        assert "never stored" not in [info.payload for info in queue.items("pending")]
    finally:
        proxy.pass_through()
        queue.close()
