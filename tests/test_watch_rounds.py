"""A watching view ends its round (ROUND) whatever its stream does.

A stream can stay open and say nothing (a member restored from a snapshot
keeps its watchers and skips the events the snapshot covered), or never go
silent: either way the view lists again within a round, and claims what the
stream did not tell it of.  Real etcd; the consumer reaches it through the
fault proxy (tests/faultproxy.py), the stream's events held there.
"""
from __future__ import annotations

import re
import threading
import time

import pytest

import etcdq_v2.viewstate as view_module
from etcdq_v2 import Queue

from faultproxy import FaultProxy


#: The watching view's round here (60 s in use), so that the tests stay short.
ROUND = 3.0


#: An item's create event on a stream (the listing of work/ says "get").
_ITEM_CREATED = re.compile(rb'"action":"create","node":\{"key":"[^"]*/work/')


def test_a_watching_view_whose_stream_stays_open_but_silent_claims_a_new_item_within_a_round(
        proxy: FaultProxy, queue_name: str, etcd_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream's connection is held from the item's create event on (it
    stays open and says nothing, as on a member restored from a snapshot):
    the view still claims the item within ROUND plus a listing."""
    monkeypatch.setattr(view_module, "ROUND", ROUND)
    with Queue(proxy.url, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        assert consumer.claim(timeout=0) is None
        view = consumer._ensure_view()
        assert view.watching_locks
        proxy.hold("down", match=_ITEM_CREATED)
        try:
            item_id = producer.put("unheard")
            put_at = time.monotonic()
            claim = consumer.claim(timeout=ROUND + consumer.etcd.deadline + 5)
            waited = time.monotonic() - put_at
        finally:
            proxy.release()
        assert claim is not None and claim.id == item_id, "the item stayed unknown"
        assert waited >= 0.5 * ROUND - 0.5, "learnt from the stream: the hold missed it"
        claim.complete()


def test_a_watching_view_ends_its_round_while_events_keep_coming(
        proxy: FaultProxy, queue_name: str, etcd_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Events every 50 ms on the watched directory: the stream never goes
    silent, and the view still subscribes and lists again every ROUND."""
    monkeypatch.setattr(view_module, "ROUND", ROUND)
    with Queue(proxy.url, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        assert consumer.claim(timeout=0) is None
        assert consumer._ensure_view().watching_locks
        stop = threading.Event()

        def chatter() -> None:
            n = 0
            while not stop.is_set():
                producer.etcd.put(f"{consumer.layout.root}/chatter", str(n))
                n += 1
                stop.wait(0.05)

        writer = threading.Thread(target=chatter, daemon=True)
        watches_before = sum(b"wait=true" in line for line in proxy.requests)
        writer.start()
        try:
            time.sleep(3 * ROUND + 1)
        finally:
            stop.set()
            writer.join()
        watches = sum(b"wait=true" in line for line in proxy.requests) - watches_before
        assert watches >= 2, f"{watches} new subscriptions in {3 * ROUND + 1:g} s of events"


#: A lock's expiry on a stream.
_LOCK_EXPIRED = re.compile(rb'"action":"expire"')


def test_a_watching_view_that_missed_a_locks_expiry_frees_its_item_within_a_round(
        proxy: FaultProxy, queue_name: str, etcd_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another consumer holds X, then stops refreshing (a crash).  The watching
    view's stream goes silent, open, from the lock's expiry event on (as on a
    member restored from a snapshot): X is still claimed within ROUND plus a
    listing after the lock went."""
    round_ = 2 * ROUND  # longer than the lock's life: the expiry falls inside a round
    monkeypatch.setattr(view_module, "ROUND", round_)
    with Queue(proxy.url, queue_name) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=2) as crashed:
        item_id = crashed.put("orphan")
        held = crashed.claim()
        assert held is not None and held.id == item_id
        assert consumer.claim(timeout=0) is None  # X is locked: the view watches
        assert consumer._ensure_view().watching_locks
        proxy.hold("down", match=_LOCK_EXPIRED)
        unheard = threading.Event()
        done = threading.Event()

        def watch_held() -> None:
            while not done.wait(0.05):
                if _LOCK_EXPIRED.search(proxy.held("down")):
                    unheard.set()

        watcher = threading.Thread(target=watch_held, daemon=True)
        watcher.start()
        try:
            crashed._heartbeat.discard(held)  # a crash: nothing refreshes the lock
            claim = consumer.claim(timeout=2 + 1 + round_ + consumer.etcd.deadline + 5)
        finally:
            done.set()
            watcher.join()
            proxy.release()
        assert claim is not None and claim.id == item_id, "the orphan stayed taken"
        assert unheard.is_set(), "the expiry event was not held: not the case under test"
        claim.complete()


def test_a_watching_view_that_missed_a_delay_locks_expiry_claims_the_item_within_a_round(
        proxy: FaultProxy, queue_name: str, etcd_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another producer puts X with a 2 s delay; the watching view's stream
    goes silent, open, once X's create event would arrive, so the view hears
    neither X nor its delay lock's expiry: X is claimed within ROUND plus a
    listing after it became due."""
    round_ = 2 * ROUND
    monkeypatch.setattr(view_module, "ROUND", round_)
    with Queue(proxy.url, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        assert consumer.claim(timeout=0) is None
        assert consumer._ensure_view().watching_locks
        proxy.hold("down", match=_ITEM_CREATED)
        try:
            item_id = producer.put("later", delay=2)
            claim = consumer.claim(timeout=2 + round_ + consumer.etcd.deadline + 5)
        finally:
            proxy.release()
        assert claim is not None and claim.id == item_id, "the delayed item stayed unknown"
        claim.complete()
