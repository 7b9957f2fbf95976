"""Hostile review rv14 of a035186 (the view reads claims off work/; CONFIRM).

Each test reproduces a finding against a real etcd; they FAIL on a035186.
"""
from __future__ import annotations

import time
from dataclasses import replace

from etcdq_v2 import Queue
from etcdq_v2.codec import Item, Lock, new_token

from helpers import wait_until

LOCK_TTL = 2  # <= LINGER_MAX: F4 skipped


def _stalled_c2_lands_after_lock_expired(actor: Queue, item_id: str) -> int:
    """A claimer's C1, then its C2 held in flight past the lock's TTL: it lands
    (the item is unchanged, so the CAS applies) after etcd expired the lock,
    and the claimer dies before C3 (killed, or its C3 fails).  The item is
    free: in work/, no lock, no outcome.  Returns C2's etcd index."""
    protocol = actor._protocol
    entry = protocol.read("work", item_id)
    assert entry is not None
    lock = Lock(actor.node_id, new_token())
    protocol._create_lock(item_id, lock, 1)  # C1 (ttl 1 s: expires soon)
    wait_until(lambda: protocol.read("locks", item_id) is None, 5,
               message="etcd expired the claimer's lock")
    item = Item.decode(entry.value)
    claimed = replace(item, attempts=item.attempts + 1, claim=lock.token)
    reply = actor.etcd.put(protocol.layout.key("work", item_id), claimed.encode(stored=True),
                           prev_index=entry.index)  # C2, landing late
    return reply.written_index


def _is_free_in_etcd(queue: Queue, item_id: str) -> bool:
    protocol = queue._protocol
    entry = protocol.read("work", item_id)
    return (entry is not None and Item.decode(entry.value).outcome is None
            and protocol.read("locks", item_id) is None)


def test_rv14_item_claimed_last_before_a_watching_listing_is_stranded(
        etcd_url: str, queue_name: str) -> None:
    """_take_listing marks X taken at its C2's index; _unconfirmed() checks only
    signs strictly older than the listing's index (``at < below``).  When C2
    was the last write before the listing (X-Etcd-Index == C2's index), no
    confirm is planned, the lock's expiry came before the watch began (no
    event will come), and nothing else frees X: a consumer that keeps calling
    claim() never gets it while its watch lives (its stream ends only after
    idle_timeout = 60 s without events, and never while the queue is busy)."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as dead, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other:
        view = consumer._ensure_view()  # a quiet view, as after a claim that got an item
        assert not view.watching_locks
        item_id = producer.put("x")  # the quiet view hears nothing of it
        _stalled_c2_lands_after_lock_expired(dead, item_id)
        assert _is_free_in_etcd(consumer, item_id)

        started = time.monotonic()
        got = consumer.claim(timeout=3 * LOCK_TTL)  # starved: watches, lists work/
        waited = time.monotonic() - started
        stuck = dict(view._locks), view._confirm_at
        # Nothing changed in etcd meanwhile: X is still free, and another consumer gets it.
        assert _is_free_in_etcd(consumer, item_id)
        if got is None:
            taken = other.claim(timeout=0)
            assert taken is not None and taken.id == item_id
            taken.release()
        assert got is not None and got.id == item_id, (
            f"free item {item_id} not handed out within {waited:.1f} s "
            f"(3 lock TTLs); the watching view holds it taken: _locks={stuck[0]}, "
            f"_confirm_at={stuck[1]} (no confirm planned)")


def test_rv14_stranded_item_starves_while_newer_items_are_claimed(
        etcd_url: str, queue_name: str) -> None:
    """The same strand while the queue is busy: the stream keeps delivering
    events (so it never ends on idle_timeout), the consumer claims every newer
    item put after X, and X -- free, the head of the queue -- is never tried."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as dead:
        view = consumer._ensure_view()
        item_id = producer.put("x")
        _stalled_c2_lands_after_lock_expired(dead, item_id)
        assert consumer.claim(timeout=0) is None  # starved: watches; X inferred taken
        got = []
        started = time.monotonic()
        while time.monotonic() - started < 3 * LOCK_TTL:
            producer.put("newer")
            claim = consumer.claim(timeout=1)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
            if claim.id == item_id:
                break
            time.sleep(0.2)
        assert _is_free_in_etcd(consumer, item_id) or item_id in got
        assert item_id in got, (
            f"head item {item_id} (free) starved for {time.monotonic() - started:.1f} s "
            f"while {len(got)} newer items were claimed; view._locks={view._locks}")


def test_rv14_confirm_lost_when_its_listing_fails(
        etcd_url: str, queue_name: str, proxy) -> None:
    """check_locks sets _confirm_at = inf before it lists locks/; if that one
    listing fails (a request timed out: Unavailable out of claim(), which a
    Worker logs and retries), the confirm is never planned again.  The stream
    is fine, so no relist comes either: the item inferred taken (its lock went
    before the watch began) stays taken in the view for as long as the watch
    lives, though etcd is healthy again."""
    from etcdq_v2.errors import Unavailable
    from etcdq_v2.transport import connect
    transport = connect(proxy.url, timeout=1.0)
    with Queue(transport, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as dead:
        view = consumer._ensure_view()
        item_id = producer.put("x")
        _stalled_c2_lands_after_lock_expired(dead, item_id)
        # Any later write (here: another queue's key) makes the listing's index
        # exceed C2's, so the watching view plans a confirm CONFIRM s later.
        producer.etcd.put(f"/etcdq/{queue_name}-elsewhere/k", "1")
        assert consumer.claim(timeout=0) is None  # starved: watching, confirm planned
        assert view.watching_locks and view._confirm_at < float("inf")
        proxy.hold(match=rb"GET /v2/keys/etcdq/" + queue_name.encode() + rb"/locks")
        errors = 0
        try:
            consumer.claim(timeout=2)  # the confirm's listing of locks/ is held
        except Unavailable:
            errors += 1
        proxy.pass_through()
        assert errors == 1, "the confirm's listing failed"
        got = None
        started = time.monotonic()
        while got is None and time.monotonic() - started < 3 * LOCK_TTL:
            try:  # a Worker's loop: keep claiming
                got = consumer.claim(timeout=0.5)
            except Unavailable:
                errors += 1
        assert _is_free_in_etcd(producer, item_id) or got is not None
        assert got is not None and got.id == item_id, (
            f"free item {item_id} not handed out within 3 lock TTLs after etcd was "
            f"reachable again: _locks={view._locks}, _confirm_at={view._confirm_at}")


def test_rv14_release_after_a_stall_strands_the_item(
        etcd_url: str, queue_name: str) -> None:
    """The same strand with no crash: a worker stalls past its lock's TTL
    (its heartbeat stalled too: a paused VM or process), then releases the
    item.  R0 applies (nobody took the item meanwhile: the fence holds) and
    R1 finds no lock: the item is free, its last version carries the claim
    token.  A consumer that starts watching right then infers it taken at
    R0's index == its listing's index and never frees it."""
    from crashes import stalled_claim
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as worker:
        view = consumer._ensure_view()
        item_id = producer.put("x")
        claim = stalled_claim(worker)
        assert claim.id == item_id
        wait_until(lambda: worker._protocol.read("locks", item_id) is None, LOCK_TTL + 5,
                   message="the stalled worker's lock expired")
        claim.release()  # the worker resumes and gives the item back
        assert _is_free_in_etcd(consumer, item_id)
        got = consumer.claim(timeout=3 * LOCK_TTL)
        assert _is_free_in_etcd(consumer, item_id) or got is not None
        assert got is not None and got.id == item_id, (
            f"released item {item_id} not handed out within 3 lock TTLs: "
            f"_locks={view._locks}, _confirm_at={view._confirm_at}")
