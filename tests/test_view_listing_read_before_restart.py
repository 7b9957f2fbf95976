"""A quiet view's round lists work/ on the old etcd, and its reply is slow;
meanwhile a claimer's relist is applied at the old etcd's index, etcd
restarts without its data, and another relist is applied at the restarted
etcd's, lower: the history changed.  The round's listing, answered last and
above that one, is the old etcd's: it must not put the old items back over
the restarted etcd's (docs/protocol.md, "etcd's history changes": a listing
sent before the change is dropped, whatever its index).

Real etcd, stopped and started again on the same port with its data dir
wiped; the consumer reaches it through the real TCP proxy
(tests/faultproxy.py), which holds the reply of the round's listing of work/
while the relists go by.  The relists are the view's own
(QueueView.relist_work, full: no gate), called from the test thread.
"""
from __future__ import annotations

import re
import shutil

from helpers import wait_until

from etcdq_v2 import Queue
from etcdq_v2.server import EtcdServer
from etcdq_v2.transport import connect
from etcdq_v2.view import QueueView

from faultproxy import FaultProxy

#: The reply to a listing of work/ (etcd writes the node's key first).
_WORK_REPLY = re.compile(rb'"node":\{"key":"[^"]*/work","dir":true')
_NEVER = re.compile(rb"\A\Z(?!x)x")  # holds no new connection; the held one stays held


def test_a_round_s_listing_read_by_etcd_before_it_restarted_is_not_applied_after_it(
        own_etcd: EtcdServer, proxy_factory, queue_name: str) -> None:
    proxy: FaultProxy = proxy_factory(own_etcd.url)
    with Queue(own_etcd.url, queue_name) as producer:
        old = set(producer.put_many(range(40)))  # the old etcd's index: above the restarted one's
        proxy.hold("down", match=_WORK_REPLY)  # the reply of the round's listing of work/
        with Queue(connect(proxy.url, timeout=30, deadline=90), queue_name) as consumer:
            view = QueueView(consumer._protocol)  # its first round lists work/ (quiet)
            try:
                wait_until(lambda: _WORK_REPLY.search(proxy.held("down")), 10,
                           message="the reply of the round's listing of work/ held")
                proxy.hold("down", match=_NEVER)
                view.relist_work(full=True)  # a claimer's relist: the old etcd's index
                high = view.state.known
                assert high > 40 and not view.state.ready, (high, view.state.ready)
                own_etcd.stop()
                shutil.rmtree(own_etcd.data_dir)
                own_etcd.start()
                first = producer.put("c")
                view.relist_work(full=True)  # the restarted etcd's index, lower
                low = view.state.known
                assert low < high and set(view.state.items) == {first}, (low, high)
                proxy.release()  # the old etcd's reply comes in
                # Polled, not wait_ready(): a dropped listing makes the view ready
                # without waking its waiters (test_view_dropped_listing_wakes.py).
                wait_until(lambda: view.state.ready, 60, message="the round's listing handed in")
                back = (set(view.state.items) - {first}) & old
                assert view.state.known == low and not back, (
                    f"the old etcd's listing put {len(back)} of its items back over the "
                    f"restarted etcd's listing at {low} (known: {view.state.known})")
                assert first in view.state.items
            finally:
                view.close()
