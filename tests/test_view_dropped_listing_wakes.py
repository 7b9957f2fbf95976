"""A claim waiting for the view's listing (QueueView.wait_ready: a new
queue's first claim, a relist) wakes when the round's listing is in, also
when that listing is dropped (a claimer's relist at a higher index was
applied while it was under way, docs/protocol.md "Events and
transitions"): the view is ready then, and a claim waiting for it must not
wait out its timeout.

Real etcd through the real TCP proxy (tests/faultproxy.py), which holds the
reply to the round's listing of work/ while an item is put and a relist
(QueueView.relist_work, full: no gate, called from the test thread) lists
it at a higher index.
"""
from __future__ import annotations

import re
import threading

from helpers import wait_until

from etcdq_v2 import Queue
from etcdq_v2.server import EtcdServer
from etcdq_v2.view import QueueView

from faultproxy import FaultProxy

_WORK_REPLY = re.compile(rb'/work","dir":true')
_NEVER = re.compile(rb"\A\Z(?!x)x")  # holds no new connection; the held one stays held


def test_a_claim_waiting_for_the_view_wakes_when_its_round_s_listing_is_dropped(
        own_etcd: EtcdServer, proxy_factory, queue_name: str) -> None:
    proxy: FaultProxy = proxy_factory(own_etcd.url)
    with Queue(own_etcd.url, queue_name) as producer, \
            Queue(proxy.url, queue_name) as consumer:
        producer.put("a")
        proxy.hold("down", match=_WORK_REPLY)  # the round's listing of work/: held
        view = QueueView(consumer._protocol)  # its first round lists work/ (quiet)
        waited = threading.Event()
        try:
            wait_until(lambda: _WORK_REPLY.search(proxy.held("down")), 10,
                       message="the reply to the round's listing of work/ held")
            proxy.hold("down", match=_NEVER)
            waiter = threading.Thread(target=lambda: (view.wait_ready(3600), waited.set()),
                                      daemon=True)
            waiter.start()
            item = producer.put("b")
            view.relist_work(full=True)  # a claimer's relist, at a higher index
            assert item in view.state.items and not view.state.ready
            proxy.release()  # the round's older listing lands: dropped
            wait_until(lambda: view.state.ready, 30, message="the view ready")
            assert item in view.state.items  # the older listing was dropped
            waiter.join(10)  # its own timeout is 3600 s
            assert waited.is_set(), (
                "the view is ready, but a claim in wait_ready() still waits (up to its "
                "timeout, 3600 s)")
        finally:
            view.close()
