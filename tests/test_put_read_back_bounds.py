"""A lost put reply is found wherever etcd stored the POST, whatever the
indexes the transport read before it.

The read-back reads only the keys between the largest X-Etcd-Index the
transport had read before the POST and a quorum read's index.  These tests
put the POST outside that span, through the real TCP proxy
(tests/faultproxy.py) in front of a real etcd, and check that the put still
finds its stored item, as the listings of work/, completed/ and failed/ did.
"""
from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional


from etcdq_v2 import Queue, Unavailable, connect
from etcdq_v2.server import EtcdServer

from faultproxy import FaultProxy

TIMEOUT = 0.5


def _stored(queue: Queue, payload: str) -> int:
    return [info.payload for info in queue.items("pending")].count(payload)


def test_a_lost_put_reply_is_found_after_etcd_came_back_without_its_data(
        own_etcd: EtcdServer, proxy_factory, queue_name: str) -> None:
    """etcd restarted on an empty data dir (a container without a volume):
    its index starts again near 0, below every index the producer read."""
    proxy: FaultProxy = proxy_factory(own_etcd.url)
    queue = Queue(connect(proxy.url, timeout=TIMEOUT), queue_name)
    try:
        queue.put_many([f"before-{n}" for n in range(300)], in_flight=8)
        own_etcd.stop()
        shutil.rmtree(own_etcd.data_dir)
        own_etcd.start()
        queue.put("after the restart")  # the queue works again: a reply read, index small
        proxy.hold("down", match=rb'"action":"create"')  # the POST applies, its reply waits
        try:
            item_id = queue.put("in doubt")
        finally:
            proxy.pass_through()
        assert queue.get(item_id).payload == "in doubt"
    finally:
        proxy.pass_through()
        queue.close()
    assert _stored(queue, "in doubt") == 1


def _write_until(etcd, index: int) -> int:  # type: ignore[no-untyped-def]
    """POST scratch keys through ``etcd`` until etcd's index reaches ``index``."""
    reached = 0
    while reached < index:
        reached = etcd.post("/scratch", "x").index
    return reached


def test_a_lost_put_reply_is_found_when_etcd_passed_the_old_index_again(
        own_etcd: EtcdServer, proxy_factory, queue_name: str) -> None:
    """As above, with other clients writing meanwhile: by the search, etcd's
    index is above every index the producer read, but the POST is below."""
    proxy: FaultProxy = proxy_factory(own_etcd.url)
    producer = connect(proxy.url, timeout=2.0)
    queue = Queue(producer, queue_name)
    try:
        floor = int(max(queue.put_many([f"before-{n}" for n in range(300)], in_flight=8)))
        own_etcd.stop()
        shutil.rmtree(own_etcd.data_dir)
        own_etcd.start()
        other = connect(own_etcd.url, timeout=2.0)
        _write_until(other, floor - 10)
        proxy.hold("down", match=rb'"action":"create"')  # the POST applies, its reply waits
        with ThreadPoolExecutor(max_workers=1) as pool:
            put = pool.submit(queue.put, "in doubt")
            while not proxy.held("down"):  # the POST applied: its reply is held
                time.sleep(0.01)
            _write_until(other, floor + 20)  # before the put's timeout ends: its search sees it
            try:
                item_id = put.result(timeout=10)
            finally:
                proxy.pass_through()
        assert int(item_id) <= floor
        assert queue.get(item_id).payload == "in doubt"
    finally:
        proxy.pass_through()
        queue.close()
    assert _stored(queue, "in doubt") == 1


class _GoesAway(FaultProxy):
    """A proxy that black-holes everything from the ``reads``+1-th GET after
    :meth:`arm`: an etcd that answered ``reads`` reads, then stopped answering."""

    armed_at: Optional[int] = None
    reads = 1

    def arm(self) -> None:
        self.armed_at = len(self.requests)

    def _went_up(self, data: bytes) -> None:
        super()._went_up(data)
        if self.armed_at is None:
            return
        gets = [line for line in self.requests[self.armed_at:] if line.startswith(b"GET ")]
        if len(gets) > self.reads:
            self.armed_at = None
            self.black_hole()


def test_a_lost_put_reply_is_settled_within_deadlines_when_etcd_goes_away_during_the_search(
        own_etcd: EtcdServer, queue_name: str) -> None:
    """etcd answers the search's first read, then nothing.  Other clients
    wrote meanwhile, so the span holds more ids than one batch."""
    with _GoesAway.to(own_etcd.url) as proxy:
        producer = connect(proxy.url, timeout=TIMEOUT)
        queue = Queue(producer, queue_name)
        other = connect(own_etcd.url, timeout=2.0)
        queue.put("first")  # a reply read: the put below has a floor
        proxy.hold("down", match=rb'"action":"create"')  # the POST applies, its reply waits
        with ThreadPoolExecutor(max_workers=1) as pool:
            started = time.monotonic()
            put = pool.submit(queue.put, "in doubt")
            while not proxy.held("down"):
                time.sleep(0.01)
            proxy.arm()
            for _ in range(40):
                other.post("/scratch", "x")
            try:
                put.result(timeout=120)
            except Unavailable:
                pass
            took = time.monotonic() - started
        queue.close()
    assert took < TIMEOUT + 2 * producer.deadline + 0.5, (
        f"the put took {took:.1f} s to settle (timeout {TIMEOUT} s, deadline "
        f"{producer.deadline} s)")
