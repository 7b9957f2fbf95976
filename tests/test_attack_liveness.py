"""Liveness of claims and views under faults that touch one request and not others.

Real etcd; the claimant reaches it through the fault proxy (tests/faultproxy.py).
Each test names the invariant it checks.
"""
from __future__ import annotations

import re
import time
from typing import Iterator

import pytest

from etcdq_v2 import Queue
from etcdq_v2.codec import Lock

from faultproxy import FaultProxy


def _refresh_of(*item_ids: str) -> "re.Pattern[bytes]":
    """The request line of a heartbeat refresh of one of these items' locks."""
    ids = b"|".join(item_id.encode() for item_id in item_ids)
    return re.compile(rb"PUT /v2/keys/\S*/locks/(?:" + ids + rb")\?\S*refresh=true")


@pytest.fixture
def holder(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    with Queue(proxy.url, queue_name, lock_ttl=6) as queue:
        yield queue


def test_a_claim_whose_refresh_applied_in_time_is_not_lost_because_another_refresh_hangs(
        proxy: FaultProxy, holder: Queue, etcd_url: str, queue_name: str) -> None:
    """lock_ttl 6 (a refresh every 2 s), the transport's 5 s timeout.  Z's and
    X's refreshes hang (their connections held: a half-open connection), Y's
    go through at once.  Y's lock is refreshed in etcd, on time, with Y's
    value, yet Y reads lost: its refresh waits for Z's batch to end (one
    thread, one batch at a time), then its answer is judged only when X's,
    sent with it, times out -- at Y's old expiry."""
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
