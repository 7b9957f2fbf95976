"""A quiet view's round lists work/ while etcd restarts without its data:
the transport retries the round's GET (its connection closed before a
reply), and the restarted etcd answers it.  Meanwhile a claimer's relist was
applied at the old etcd's index, and another at the restarted etcd's, lower.
The round's listing, answered last and above that one, holds every item the
restarted etcd has; the view must offer them.

Real etcd, stopped and started again on the same port with its data dir
wiped; the consumer reaches it through the real TCP proxy
(tests/faultproxy.py), which holds the round's GET of work/ (and its retry)
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

_WORK_GET = re.compile(rb"GET \S*/work\?")
_NEVER = re.compile(rb"\A\Z(?!x)x")  # holds no new connection; the held one stays held


def _work_gets(proxy: FaultProxy) -> int:
    return sum(1 for line in list(proxy.requests) if _WORK_GET.search(line))


def test_a_round_s_listing_retried_on_the_restarted_etcd_is_applied_over_an_older_relist(
        own_etcd: EtcdServer, proxy_factory, queue_name: str) -> None:
    proxy: FaultProxy = proxy_factory(own_etcd.url)
    with Queue(own_etcd.url, queue_name) as producer:
        producer.put_many(range(40))  # the old etcd's index: above the restarted one's
        proxy.hold("up", match=_WORK_GET)  # the round's GET of work/ is held
        with Queue(connect(proxy.url, timeout=30, deadline=90), queue_name) as consumer:
            view = QueueView(consumer._protocol)  # its first round lists work/ (quiet)
            try:
                wait_until(lambda: _WORK_GET.search(proxy.held("up")), 10,
                           message="the round's GET of work/ held")
                proxy.hold("up", match=_NEVER)
                view.relist_work(full=True)  # a claimer's relist: the old etcd's index
                high = view.state.known
                assert high > 40 and not view.state.ready, (high, view.state.ready)
                proxy.hold("up", match=_WORK_GET)  # the round's retry is held too
                gets = _work_gets(proxy)
                own_etcd.stop()
                shutil.rmtree(own_etcd.data_dir)
                own_etcd.start()
                wait_until(lambda: _work_gets(proxy) > gets
                           and _WORK_GET.search(proxy.held("up")), 30,
                           message="the round's GET of work/ retried, and held")
                proxy.hold("up", match=_NEVER)
                first = producer.put("c")
                view.relist_work(full=True)  # the restarted etcd's index, lower
                low = view.state.known
                assert low < high and first in view.state.items, (low, high)
                second = producer.put("d")  # after that relist: only the round's has it
                proxy.release()  # the round's retry reaches the restarted etcd
                # Polled, not wait_ready(): a dropped listing makes the view ready
                # without waking its waiters (test_view_dropped_listing_wakes.py).
                wait_until(lambda: view.state.ready, 60, message="the round's listing applied")
                assert second in view.state.items, (
                    f"{second}, put on the restarted etcd before the round's listing, is "
                    f"not in the view (known: {view.state.known}; relists at {high}, {low})")
            finally:
                view.close()
