"""etcd faults as a worker sees them: a frozen member, a dead endpoint, a dropped watch."""
from __future__ import annotations

import time

import pytest

from etcdq_v2 import Queue, Unavailable, connect
from etcdq_v2.server import EtcdServer, free_port

from helpers import wait_until


def test_a_frozen_etcd_gives_unavailable_in_bounded_time_then_recovers(
        own_etcd: EtcdServer, queue_name: str) -> None:
    client = connect(own_etcd.url, timeout=0.5, deadline=2)
    with Queue(client, queue_name, lock_ttl=2) as queue:
        queue.put_many(["held", "waiting"])
        claim = queue.claim()
        own_etcd.pause()
        try:
            for call in (lambda: queue.put("x"), lambda: queue.claim(timeout=0)):
                started = time.monotonic()
                with pytest.raises(Unavailable):
                    call()
                assert time.monotonic() - started < 3.5  # the documented deadline, plus slack
            # The heartbeat cannot confirm the lock before it would expire: the claim is lost.
            wait_until(lambda: claim.lost, 6, message="the claim to be marked lost")
        finally:
            own_etcd.resume()
        wait_until(lambda: queue.put("after") is not None, 10, ignore=(Unavailable,),
                   message="etcd to answer again")
        payloads = set()
        while (again := queue.claim(timeout=3)) is not None:
            payloads.add(again.payload)
            again.complete()
        # The put that raised Unavailable reached the frozen member and applied when it
        # woke: "unavailable" means "not known to be stored", never "stored twice".
        assert payloads - {"x"} == {"held", "waiting", "after"}


def test_one_dead_endpoint_among_several(etcd_url: str, queue_name: str) -> None:
    client = connect(f"http://127.0.0.1:{free_port()},{etcd_url}", timeout=1)
    with Queue(client, queue_name) as queue:
        item_id = queue.put("through the live member")
        claim = queue.claim(timeout=5)
        assert claim.id == item_id
        claim.complete()
        assert queue.stats()["completed"] == 1


def test_a_dropped_watch_while_over_1000_events_happen_misses_nothing(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        consumer.claim()  # the view is up
        view = consumer._view
        relists = view.relists
        view._follower.drop_stream()  # the connection drops ...
        ids = producer.put_many(range(300))  # ... while 1,200+ events pass
        for n in range(900):
            producer.etcd.put("/etcdq-noise/key", str(n))
        wait_until(lambda: view.relists > relists, 30, message="the view to list again")
        got = []
        while (claim := consumer.claim(timeout=2)) is not None:
            got.append(claim.id)
            claim.complete()
        assert sorted(got) == ids


def lose_post_replies(queue: Queue, monkeypatch, *, applied: bool) -> None:
    """The next POSTs reach etcd (or not) but their replies are lost on the way back."""
    from etcdq_v2.wire import Lost
    for member in queue.etcd._members:
        real = member.request

        def request(method, path, body, timeout, real=real, **how):
            if method != "POST":
                return real(method, path, body, timeout, **how)
            if applied:
                real(method, path, body, timeout)
            raise Lost("the reply was lost")

        monkeypatch.setattr(member, "request", request)


def test_a_put_whose_reply_is_lost_is_found_by_its_token(
        etcd_url: str, queue_name: str, monkeypatch) -> None:
    with Queue(etcd_url, queue_name) as queue:
        lose_post_replies(queue, monkeypatch, applied=True)
        item_id = queue.put({"once": True})
        monkeypatch.undo()
        assert [info.id for info in queue.items("pending")] == [item_id]
        assert queue.get(item_id).payload == {"once": True}


def test_a_lost_put_that_did_not_apply_is_unavailable_never_resent(
        etcd_url: str, queue_name: str, monkeypatch) -> None:
    with Queue(etcd_url, queue_name) as queue:
        lose_post_replies(queue, monkeypatch, applied=False)
        with pytest.raises(Unavailable, match="may or may not be stored"):
            queue.put("lost")
        monkeypatch.undo()
        assert queue.stats()["pending"] == 0


def test_a_lost_put_already_finished_by_a_consumer_is_found_in_completed(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put("quick")
        token = queue._protocol.read("work", item_id).value
        queue.claim().complete()
        from etcdq_v2.codec import Item
        assert queue._protocol.find_put(Item.decode(token).token) == (item_id, None)
