"""An item the view infers taken from work/ (a claim token read off the item)
is confirmed by a listing of locks/ CONFIRM later: it is never stranded, nor
starved behind newer items, whatever the claim's writes or the listing did.

The view reads claims off work/ and takes an item so read as taken at that
sign's index; a sign the listing cannot cover plans a CONFIRM check.  Each test
forces its interleaving against a real etcd (the first ones tell it as it went
before the rule); the last ones check that the check is bounded and sends no
loop of requests.
"""
from __future__ import annotations

import time
from dataclasses import replace

from etcdq_v2 import Queue
from etcdq_v2.codec import Item, Lock, new_token
from etcdq_v2.view import QueueView

from helpers import hands_out, is_free_in_etcd, wait_until

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


def _watching_with_a_confirm(consumer: Queue, producer: Queue, dead: Queue,
                             queue_name: str) -> "tuple[QueueView, str]":
    """An item free in etcd that the consumer's view, which then starts watching,
    infers taken (its C2 landed after its lock expired), with a write after C2
    (another queue's key), so that the listing's index exceeds C2's and a
    confirm is planned.  Returns the view and the item's id."""
    view = consumer._ensure_view()
    item_id = producer.put("x")
    _stalled_c2_lands_after_lock_expired(dead, item_id)
    producer.etcd.put(f"/etcdq/{queue_name}-elsewhere/k", "1")
    assert consumer.claim(timeout=0) is None  # starved: watching, confirm planned
    assert view.watching_locks and view.state.confirm_at < float("inf")
    return view, item_id


def _stalled_past_its_lock(consumer: Queue, producer: Queue, worker: Queue):
    """The consumer's (quiet) view; a new item, claimed by ``worker``, which then
    stalls until etcd expired its lock.  Returns the view, the item's id and the claim."""
    from crashes import stalled_claim
    view = consumer._ensure_view()
    item_id = producer.put("x")
    claim = stalled_claim(worker)
    assert claim.id == item_id
    wait_until(lambda: worker._protocol.read("locks", item_id) is None, LOCK_TTL + 5,
               message="the stalled claimer's lock expired")
    return view, item_id, claim


def _assert_handed_out(got, queue: Queue, item_id: str, view: QueueView, when: str) -> None:
    """The free item was handed out within 3 lock TTLs (``when``)."""
    assert is_free_in_etcd(queue, item_id) or got is not None
    assert got is not None and got.id == item_id, (
        f"free item {item_id} not handed out within 3 lock TTLs {when}: "
        f"_locks={view.state.locks}, _confirm_at={view.state.confirm_at}")


def test_item_claimed_last_before_a_watching_listing_is_stranded(
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
        hands_out(consumer, item_id, 3 * LOCK_TTL, other)


def test_stranded_item_starves_while_newer_items_are_claimed(
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
        got = []
        first = consumer.claim(timeout=0)  # starved: watches; X inferred taken
        if first is not None:
            got.append(first.id)
            first.complete()
        started = time.monotonic()
        while item_id not in got and time.monotonic() - started < 3 * LOCK_TTL:
            producer.put("newer")
            claim = consumer.claim(timeout=1)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
            if claim.id == item_id:
                break
            time.sleep(0.2)
        assert is_free_in_etcd(consumer, item_id) or item_id in got
        assert item_id in got, (
            f"head item {item_id} (free) starved for {time.monotonic() - started:.1f} s "
            f"while {len(got)} newer items were claimed; view.state.locks={view.state.locks}")


def test_confirm_lost_when_its_listing_fails(
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
        view, item_id = _watching_with_a_confirm(consumer, producer, dead, queue_name)
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
        _assert_handed_out(got, producer, item_id, view, "after etcd was reachable again")


def test_release_after_a_stall_strands_the_item(
        etcd_url: str, queue_name: str) -> None:
    """The same strand with no crash: a worker stalls past its lock's TTL
    (its heartbeat stalled too: a paused VM or process), then releases the
    item.  R0 applies (nobody took the item meanwhile: the fence holds) and
    R1 finds no lock: the item is free, its last version carries the claim
    token.  A consumer that starts watching right then infers it taken at
    R0's index == its listing's index and never frees it."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as worker:
        view, item_id, claim = _stalled_past_its_lock(consumer, producer, worker)
        claim.release()  # the worker resumes and gives the item back
        assert is_free_in_etcd(consumer, item_id)
        got = consumer.claim(timeout=3 * LOCK_TTL)
        _assert_handed_out(got, consumer, item_id, view, "after its release")



def test_stream_restart_while_a_confirm_is_pending(
        etcd_url: str, queue_name: str) -> None:
    """A stream that ends while a confirm is pending: the restart's listing
    finds the inferred sign <= _known (_noted_before) and lists locks/ at once."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as dead:
        view, item_id = _watching_with_a_confirm(consumer, producer, dead, queue_name)
        relists = view.relists
        view._follower.drop_stream()
        wait_until(lambda: view.relists > relists, 5, message="the view listed again")
        got = consumer.claim(timeout=0.5)  # before CONFIRM could have fired
        assert got is not None and got.id == item_id


def test_quiet_view_frees_an_item_released_elsewhere_within_a_lock_ttl(
        etcd_url: str, queue_name: str) -> None:
    """A quiet view infers taken an item another process claimed and released
    between its listings; it is offered again at the next full listing, once
    per lock TTL (check_locks, stale): bounded, FIFO kept within a lock TTL."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other:
        ids = producer.put_many(list(range(60)))
        first = consumer.claim(timeout=0)  # quiet view, 60 listed
        assert first is not None and first.id == ids[0]
        view = consumer._view
        taken = other.claim(timeout=0)
        assert taken is not None and taken.id == ids[1]
        taken.release()  # R0 + R1, unseen by the quiet view
        view.relist_work()  # as after a miss
        assert taken.id in view.state.locks  # inferred taken
        started = time.monotonic()
        got = []
        while taken.id not in got:
            claim = consumer.claim(timeout=0)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
            time.sleep(0.1)
        assert time.monotonic() - started < LOCK_TTL + 1.5
        assert not view.watching_locks


def test_idle_consumer_with_a_confirm_sends_one_listing_and_spins_not(
        etcd_url: str, queue_name: str) -> None:
    """An idle consumer whose view inferred an item taken (held by a live
    claim elsewhere) lists locks/ once, CONFIRM s after it started watching,
    then sends nothing and does not spin while claim() waits."""
    import resource
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other:
        view = consumer._ensure_view()
        item_id = producer.put("x")
        held = other.claim(timeout=0)
        assert held is not None and held.id == item_id
        producer.etcd.put(f"/etcdq/{queue_name}-elsewhere/k", "1")
        before = dict(consumer.etcd.requests)
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        assert consumer.claim(timeout=4) is None
        used = resource.getrusage(resource.RUSAGE_SELF)
        after = dict(consumer.etcd.requests)
        sent = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert view.state.confirm_at == float("inf")
        total = sum(sent.values())
        assert total <= 6, sent
        spent = (used.ru_utime + used.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
        assert spent < 1.0, f"{spent:.2f} s of CPU in a 4 s wait"
        held.release()


def test_priority_claim_takes_low_while_high_has_a_stranded_free_item(
        etcd_url: str, queue_name: str) -> None:
    """claim_first([high, low]) (a Worker over two queues): high's free item,
    inferred taken at its listing's index, is never offered, and every round
    takes low's items instead -- for as long as high's watch lives."""
    from etcdq_v2.queue import claim_first
    low_name = queue_name + "-low"
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as high, \
            Queue(etcd_url, low_name, lock_ttl=LOCK_TTL) as low, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, low_name, lock_ttl=LOCK_TTL) as low_producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as dead:
        low_producer.put_many(list(range(5)))  # before X's writes: X's C2 is the last write
        high._ensure_view()
        low._ensure_view()
        item_id = producer.put("x")
        _stalled_c2_lands_after_lock_expired(dead, item_id)
        taken = []
        started = time.monotonic()
        while time.monotonic() - started < 3 * LOCK_TTL:
            claim = claim_first([high, low], timeout=1)
            if claim is None:
                continue
            taken.append(claim.id)
            if claim.id == item_id:
                claim.complete()
                break
            claim.release(delay=10)  # low's item: back later
            time.sleep(0.5)
        assert item_id in taken, (
            f"high's free item {item_id} never taken in {time.monotonic() - started:.1f} s; "
            f"claim_first took {taken} (low's items) meanwhile")


def test_committed_item_of_a_dead_finisher_is_never_finished(
        etcd_url: str, queue_name: str) -> None:
    """The same with an outcome: a finisher stalls past its lock's TTL, its F1
    lands (the fence holds: nobody claimed since), and it dies before F2/F3.
    A claim must finish the item (C2 finds "o": F2, F3).  A consumer that
    starts watching right after F1 infers the item taken at F1's index ==
    its listing's index, and never tries it: the item stays in work/ and its
    record is never written."""
    from crashes import commit
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as finisher:
        view, item_id, claim = _stalled_past_its_lock(consumer, producer, finisher)
        commit(finisher, claim, "completed", record=False)  # F1, then the finisher dies
        protocol = consumer._protocol
        assert protocol.read("locks", item_id) is None
        started = time.monotonic()
        while time.monotonic() - started < 3 * LOCK_TTL:
            assert consumer.claim(timeout=0.5) is None  # nothing to hand out: it is finished
            if protocol.read("work", item_id) is None:
                break
        assert protocol.read("work", item_id) is None and \
            protocol.read("completed", item_id) is not None, (
                f"committed item {item_id} of a dead finisher not finished within 3 lock "
                f"TTLs by a consumer that kept claiming: _locks={view.state.locks}, "
                f"_confirm_at={view.state.confirm_at}")
