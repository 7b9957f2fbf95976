"""claim_first raises QueueClosed once any of its queues is closed (its
docstring), also while it waits for another queue's first listing.

Real etcd through the TCP proxy (tests/faultproxy.py): the reply of the first
queue's first listing of ``work/`` is held, as in tests/test_first_listing_wait.py.
"""
from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pytest

from etcdq_v2 import Queue, QueueClosed, claim_first, connect

from conftest import BACKGROUND_BOUND
from faultproxy import FaultProxy

TIMEOUT = 0.5  # the transport's request timeout; its deadline is 3x


def _listing(name: str) -> "re.Pattern[bytes]":
    return re.compile(rb'"action":"get","node":\{"key":"'
                      + re.escape(f"/etcdq/{name}/work".encode()) + rb'"')


def test_claim_first_raises_queue_closed_when_a_queue_closes_while_another_lists(
        etcd_url: str, queue_name: str, proxy: FaultProxy) -> None:
    first, second = f"{queue_name}-1", f"{queue_name}-2"
    Queue(connect(etcd_url), first).put("a")
    transport = connect(proxy.url, timeout=TIMEOUT)
    queues = [Queue(transport, first), Queue(transport, second)]
    proxy.hold("down", match=_listing(first))
    asked = threading.Event()

    def claim() -> Any:
        asked.set()
        return claim_first(queues, timeout=None)

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        waiting = pool.submit(claim)
        asked.wait()
        proxy._wait_for(lambda: bool(proxy.held("down")), "the first listing's reply to be held")
        queues[1].close()
        try:
            # The listing stays held: only the close can end the call.
            with pytest.raises(QueueClosed):
                waiting.result(timeout=BACKGROUND_BOUND)
        except FutureTimeout:
            pytest.fail(f"claim_first still waits {BACKGROUND_BOUND} s after a queue closed")
    finally:
        proxy.pass_through()
        for queue in queues:
            queue.close()
        pool.shutdown()
