"""Attacks on the "one version" rule and on what a failed attempt stores in its
delay lock, against a real etcd (each Queue through the fault proxy).

Each test names the invariant it checks.  Some show a rule broken (they fail
until it is mended); the others tried an attack and found the rule held.

What a failed attempt stores: fail() writes the attempt's reason ("why") and
traceback ("tb") into the delay lock that R1 writes.  locks/ is what every
view lists (a quiet one once per lock TTL and whenever a new item may be
delayed; a watching one receives every lock event), and R1 itself must
apply, or the attempt is not retried after its backoff.  So what goes into a
lock must always encode, and stay small whatever the handler's error says.
"""
from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any, Iterator, Optional

import pytest

from etcdq_v2 import Queue, Worker
from etcdq_v2.protocol import Gone, Version
from etcdq_v2.view import MAX_CACHED_VALUE

import test_item_versions as versions
from faultproxy import FaultProxy
from helpers import in_background, wait_until

#: Seconds a liveness step may take (a lock TTL, a backoff, plus slack for load).
BOUND = 20.0
#: A failed attempt's reason naming, by an f-string, a file whose name is not
#: UTF-8 (os.fsdecode's surrogateescape: a byte 0xff becomes U+DCFF).
UNDECODABLE = "ValueError: cannot parse /data/\udcff.csv"
#: What a delay lock may reasonably hold beyond a bounded traceback (ids, tokens,
#: a bounded reason): the bound a test asserts.  codec.TRACEBACK_LIMIT is 4,000.
LOCK_BOUND = 3 * 4000


@pytest.fixture
def queue(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    """Attempts retried after 1 s, the third dead-lettered."""
    with Queue(proxy.url, queue_name, lock_ttl=5, max_attempts=3, backoff=[1]) as q:
        yield q


@pytest.fixture
def last_try(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    """Every failed attempt dead-lettered."""
    with Queue(proxy.url, queue_name, lock_ttl=5, max_attempts=1) as q:
        yield q


@pytest.fixture
def slow_retries(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    """Failed attempts wait 30 s for their retry."""
    with Queue(proxy.url, queue_name, lock_ttl=5, max_attempts=3, backoff=[30]) as q:
        yield q


def lock_value(etcd_url: str, queue: Queue, item_id: str) -> Optional[str]:
    """The raw value of the item's lock, straight from etcd (None: no lock)."""
    url = f"{etcd_url}/v2/keys{queue.layout.key('locks', item_id)}?quorum=true"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())["node"].get("value")
    except OSError:
        return None


# -- what a failed attempt writes into its delay lock ------------------------------
def test_a_failed_attempt_is_retried_after_its_backoff_whatever_text_its_reason_holds(
        queue: Queue, etcd_url: str) -> None:
    """A handler's error names a file whose name is not UTF-8 (a surrogate in
    the str, as os.fsdecode makes it): fail() with a retry must still write its delay lock (R1), so the
    item comes back after its delay as attempt 2.  On main R1 encodes the
    reason into the lock, and the encoder refuses the surrogate: fail() raises
    InvalidPayload (\"payload is not JSON-serialisable\", about no payload),
    nothing is written, and the item comes back only after the lock TTL (the
    Worker abandons the claim), its reason lost.  Before the reason went into
    delay locks (b3de214) this passed."""
    item_id = queue.put({"file": "x"})
    claim = queue.claim(timeout=BOUND)
    assert claim is not None and claim.id == item_id
    claim.fail(UNDECODABLE)  # the queue's backoff: 1 s
    lock = lock_value(etcd_url, queue, item_id)
    assert lock is not None and json.loads(lock).get("d") == 1, f"no delay lock: {lock!r}"
    again = queue.claim(timeout=BOUND)
    assert again is not None and again.id == item_id and again.attempt == 2
    again.complete()


def test_the_worker_counts_an_attempt_failing_with_an_undecodable_file_name_as_failed(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """The same through the Worker, with the traceback it stores: a handler
    names in its error a file whose name is not UTF-8 (as os.listdir gives
    it), by an f-string (a repr, as FileNotFoundError's own message has,
    escapes it: that case holds).  The attempt must count as a failed one,
    retried after the backoff with its reason kept; on main it is "lost":
    the claim is abandoned and the item comes back after the lock TTL, its
    reason gone."""
    with Queue(proxy.url, queue_name, lock_ttl=30, max_attempts=3, backoff=[60]) as queue:
        item_id = queue.put({"dir": "/nonexistent-dir"})

        def handler(payload: Any) -> None:
            name = os.fsdecode(payload["dir"].encode() + b"/\xff.csv")
            raise ValueError(f"cannot parse {name}")

        stats = Worker(queue, handler, install_signal_handlers=False,
                       claim_timeout=0.2).run(max_items=1)
        assert (stats.attempts_failed, stats.lost) == (1, 0), str(stats)
        info = queue.get(item_id)
        assert info.state == "pending" and info.reason is not None
        assert "cannot parse" in info.reason
        assert info.due is not None and info.due > time.time() + 30  # the backoff, not lock_ttl


def test_a_dead_letter_is_recorded_whatever_text_its_reason_holds(last_try: Queue) -> None:
    """At its last attempt the same failure must still end in failed/ with
    its reason (made to encode), not raise and leave the item to come back
    after the lock TTL and be dead-lettered as "abandoned".  This was broken
    before the delay-lock change too (the record's reason, F1)."""
    queue = last_try
    item_id = queue.put({"file": "x"})
    claim = queue.claim(timeout=BOUND)
    assert claim is not None and claim.id == item_id
    claim.fail(UNDECODABLE)
    info = queue.get(item_id)
    assert info.state == "failed" and info.reason is not None
    assert "cannot parse" in info.reason


def test_a_delay_lock_stays_small_whatever_the_failures_reason(
        slow_retries: Queue, etcd_url: str) -> None:
    """locks/ is listed by every view: a lock's value must stay bounded.  The
    traceback is cut to codec.TRACEBACK_LIMIT characters, but the reason is
    written whole: an error whose message quotes a large input (300 kB here)
    makes a 300 kB lock, listed by every consumer's view for as long as the
    item waits for its retry (with many such items, megabytes per listing).
    Before the reason went into delay locks (b3de214) this passed."""
    queue = slow_retries
    item_id = queue.put({"n": 1})
    claim = queue.claim(timeout=BOUND)
    assert claim is not None
    claim.fail("ValueError: cannot parse " + "x" * 300_000)
    lock = lock_value(etcd_url, queue, item_id)
    assert lock is not None
    assert len(lock) <= LOCK_BOUND, f"the delay lock holds {len(lock)} characters"


def test_a_traceback_that_looks_like_etcd_events_adds_nothing_to_a_watching_view(
        queue: Queue, etcd_url: str) -> None:
    """Held: a watching view parses the stream's lines with a regular
    expression (view._EVENT).  A failure's traceback (a user's text) is now in
    R1's compareAndSwap event on the lock, so it is in the stream; if it reads
    like a work/ create event, the view must not take it for one.  It is a
    JSON string inside a JSON string, every quote escaped: it never matches."""
    queue.put({"n": 1})
    claim = queue.claim(timeout=BOUND)
    assert claim is not None
    view = queue._ensure_view()
    assert queue.claim(timeout=0) is None  # nothing else free: the view watches everything
    wait_until(lambda: view.watching_locks, BOUND, message="the view to watch")
    phantom = f"{10**15:020d}"
    fake = ('{"action":"create","node":{"key":"' + queue.layout.key("work", phantom)
            + '","value":"{\\"t\\":\\"x\\",\\"a\\":0,\\"p\\":1}","modifiedIndex":1,'
            '"createdIndex":1}}\n')
    claim.fail("ValueError: " + fake, traceback=fake * 3, delay=30)
    after = queue.put({"n": 2})  # an event after R1's: once applied, so is R1's
    wait_until(lambda: view._known >= int(after), BOUND, message="the view's events")
    assert view.watching_locks
    assert view.version_of(phantom) is None


def test_a_retried_fail_finds_its_own_delay_lock_whatever_reason_it_gives(
        proxy: FaultProxy, queue_name: str, etcd_url: str) -> None:
    """fail()'s R1 applies but no reply comes before the deadline (every
    reply held): Unavailable, the claim still open.  The caller fails it
    again, with its error described anew (another reason).  R1's CAS is then
    refused (the lock is our delay lock now) and the read-back must see our
    own lock: it is the claim's (its token), whatever the reason it carries.
    On main the read-back compares whole values, which now hold the call's
    reason and traceback: the retry raises LockLost ("another claim holds the
    lock") and marks the claim lost, though nobody else holds it.  Before the
    reason went into delay locks (b3de214) the values were equal."""
    from etcdq_v2 import LockLost, Unavailable, connect
    with Queue(connect(proxy.url, timeout=1, deadline=3), queue_name, lock_ttl=10,
               max_attempts=3, backoff=[30]) as queue:
        item_id = queue.put({"n": 1})
        claim = queue.claim(timeout=BOUND)
        assert claim is not None
        proxy.hold("down")
        with pytest.raises(Unavailable):
            claim.fail("TimeoutError: the upstream did not answer in 2.0 s")
        proxy.pass_through()
        lock = lock_value(etcd_url, queue, item_id)
        assert lock is not None and json.loads(lock).get("d") == 1  # the first R1 applied
        try:
            claim.fail("TimeoutError: the upstream did not answer in 2.1 s")
        except LockLost as exc:
            pytest.fail(f"our own delay lock was taken for another claim's: {exc}")
        assert not claim.lost
        assert queue.get(item_id).state == "pending"


def test_a_failure_after_a_release_that_stopped_half_way_counts_its_attempt(
        proxy: FaultProxy, queue_name: str) -> None:
    """release() applies R0 (a-1, the attempt given back) but its R1 (the
    lock's delete) never reaches etcd before the deadline: Unavailable, the
    claim still open and its lock ours.  The caller then fails the attempt.
    fail() writes no R0 ("a failure counts"), so the item must be at ``a``
    again; on main the claim keeps R0's index with the value from before R0
    (state.index and state.item of two versions): fail() checks max_attempts
    on ``a`` but leaves etcd at a-1, and the next claim reports the failed
    attempt's number again: it never counts toward max_attempts."""
    from etcdq_v2 import Unavailable, connect
    with Queue(connect(proxy.url, timeout=1, deadline=3), queue_name, lock_ttl=10,
               max_attempts=3, backoff=[1]) as queue:
        item_id = queue.put({"n": 1})
        claim = queue.claim(timeout=BOUND)
        assert claim is not None and claim.attempt == 1
        lock_path = queue.layout.key("locks", item_id).encode()
        proxy.hold("up", match=b"DELETE /v2/keys" + lock_path)
        with pytest.raises(Unavailable):
            claim.release()
        proxy.disconnect(abort=True)  # the held deletes are dropped, never applied
        proxy.pass_through()
        assert json.loads(queue._protocol.read("work", item_id).value)["a"] == 0  # R0 applied
        claim.fail("ValueError: it failed after all")
        again = queue.claim(timeout=BOUND)
        assert again is not None and again.id == item_id
        assert again.attempt == 2, "the failed attempt was not counted"
        again.complete()


def test_a_watching_view_keeps_each_events_index_with_that_events_value_or_none(
        queue: Queue, etcd_url: str, proxy_factory: Any) -> None:
    """Held: a watching view learns items from the stream.  A create event of
    a small item: its index with its value (what etcd wrote then); of one
    larger than MAX_CACHED_VALUE: its index and no value; a compareAndSwap
    (another consumer's C2, then its R0): the CAS's index and no value.  Each
    claim on such a version then works: payloads intact, attempts counted."""
    other = Queue(proxy_factory(etcd_url).url, queue.name, lock_ttl=5)
    try:
        view = queue._ensure_view()
        assert queue.claim(timeout=0) is None  # nothing: the view watches everything
        wait_until(lambda: view.watching_locks, BOUND, message="the view to watch")
        small = other.put({"n": "small"})
        wait_until(lambda: view.version_of(small) is not None, BOUND, message="the event")
        versions.assert_one_version(queue, etcd_url, small, versions.held(queue, small))
        taken = other.claim(timeout=BOUND)  # the only item
        assert taken is not None and taken.id == small
        taken.release()
        released = other._protocol.read("work", small)
        wait_until(lambda: view.version_of(small) == Version(released.index, None),
                   BOUND, message="R0's event")
        big = other.put({"blob": "b" * (MAX_CACHED_VALUE + 10)})
        wait_until(lambda: view.version_of(big) is not None, BOUND, message="the event")
        assert versions.held(queue, big) == Version(int(big), None)
        got = sorted((c for c in (queue.claim(timeout=BOUND) for _ in range(2)) if c),
                     key=lambda c: c.id)
        assert [(c.id, c.attempt) for c in got] == [(small, 1), (big, 1)]
        assert len(got[1].payload["blob"]) == MAX_CACHED_VALUE + 10
        for claim in got:
            claim.complete()
    finally:
        other.close()


def test_a_claim_offered_a_committed_version_never_writes_back_a_purged_record(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """A claim offered a version carrying an outcome ("o": its finisher
    stopped after F1) finishes the commit for it (F2-F4) before any fenced
    write: F2 is a create of the record, fenced by nothing.  The version may
    be stale: the finisher went on (F2, F3) and the record was purged since
    (or expired: completed_ttl).  Then the claim re-creates the record of an
    item that has left work/, and the purge does not stick.  A view holds such
    a version until it hears of F3: a watching view whose stream missed it
    (a member restored from a snapshot: up to a round) and then hears the
    finisher's lock expire offers it.  The rule broken: a claim never trusts
    the view (C1 and C2 decide); a finish for another must first see the
    item still in work/ at F1's index (as F2's resend does: _still_committed)."""
    with Queue(proxy.url, queue_name, lock_ttl=1) as queue:
        item_id = queue.put({"n": 1})
        claim = queue.claim(timeout=BOUND)
        assert claim is not None
        c2_index = claim._state.index
        claim.complete("done")
        key = queue.layout.key("work", item_id)
        url = f"{etcd_url}/v2/keys{key}?wait=true&waitIndex={c2_index + 1}"
        with urllib.request.urlopen(url, timeout=5) as reply:  # F1's event
            node = json.loads(reply.read())["node"]
        assert '"o":"completed"' in node["value"]
        committed = Version(node["modifiedIndex"], node["value"])
        assert queue.purge(completed=True) == 1
        wait_until(lambda: lock_value(etcd_url, queue, item_id) is None, BOUND,
                   message="the finisher's lock to expire")
        with pytest.raises(Gone):
            queue._protocol.claim(item_id, committed)
        assert queue._protocol.read("completed", item_id) is None, (
            "the purged record was written back by a claim offered a stale committed version")


# -- one version: values too large to cache ---------------------------------------------
players = versions.players


def test_a_large_items_read_back_after_another_consumers_commit_is_read_again_at_claim(
        players: versions.Players) -> None:
    """Held: the read-back attack of test_item_versions with a payload larger
    than MAX_CACHED_VALUE.  P's POST applies, its reply is lost, its token
    search is held until E committed the item (F1) and E stopped before F2 with
    its lock expired.  The view keeps the index the search read and no value
    (too large to cache); P's claim then reads the item, finds E's outcome,
    finishes it for E and is handed nothing; one record."""
    p, name = players, players.name
    p.quiet_producer()
    big = {"job": "X", "blob": "b" * (MAX_CACHED_VALUE + 1000)}
    p.e_proxy.hold("up", match=versions._record_write(name))
    p.p_proxy.hold(match=versions._pattern(versions._stored_under(name, "work"),
                                           versions.work_listing(name).pattern))
    put, put_outcome = in_background(lambda: p.p.put(big), "producer-P")
    e_run, claimed = p.e_claims(lambda claim: claim.complete("done by E"))
    item_id = claimed["claim"].id
    wait_until(lambda: p.work(item_id).get("o") == "completed", versions.STEP,
               message="E's F1")
    p.stop_e_until_its_lock_expired(item_id)
    p.p_proxy.release()
    put.join(versions.STEP)
    assert put_outcome.get("returned") == item_id, put_outcome
    seen = versions.held(p.p, item_id)
    assert seen.raw is None, "a value larger than MAX_CACHED_VALUE was cached"
    assert seen.index == p.o._protocol.read("work", item_id).index  # E's F1, as read
    got = p.p_claims_without_a_listing()
    assert got is None or got.id != item_id, (
        f"P was handed {item_id}, which E had committed; work/ now: {p.work(item_id)}")
    versions._finished_by_e(p, item_id, e_run)


def test_a_purge_after_a_put_read_back_saw_the_commit_sticks(players: versions.Players) -> None:
    """The same end to end, through the fault proxy.  P's POST applies, its
    reply is lost, its token search is held until E committed the item (F1;
    E then held until its lock expired): P's view holds the committed
    version, rightly (one version).  Then E goes on (F2, F3: its complete()
    returns OK) and the operator purges completed/.  P's next claim (its
    catch-up listing held) is offered that version, finishes the commit "for
    E" and writes completed/X back: the purge does not stick, for a finisher
    long done (not the F1-F2 race docs/protocol.md accepts)."""
    p, name = players, players.name
    p.quiet_producer()
    p.e_proxy.hold("up", match=versions._record_write(name))
    p.p_proxy.hold(match=versions._pattern(versions._stored_under(name, "work"),
                                           versions.work_listing(name).pattern))
    put, put_outcome = in_background(lambda: p.p.put({"job": "X"}), "producer-P")
    e_run, claimed = p.e_claims(lambda claim: claim.complete("done by E"))
    item_id = claimed["claim"].id
    wait_until(lambda: p.work(item_id).get("o") == "completed", versions.STEP,
               message="E's F1")
    p.stop_e_until_its_lock_expired(item_id)
    p.p_proxy.release()
    put.join(versions.STEP)
    assert put_outcome.get("returned") == item_id, put_outcome
    assert versions.held(p.p, item_id).raw is not None  # the committed value, "o" in it
    p.p_proxy.pass_through()
    p.e_proxy.pass_through()
    thread, outcome = e_run
    thread.join(versions.STEP + 40)
    assert not thread.is_alive() and "raised" not in outcome, outcome
    assert p.o._protocol.read("work", item_id) is None  # E's F3
    assert p.o.purge(completed=True) >= 1
    got = p.p_claims_without_a_listing()
    assert got is None or got.id != item_id
    assert p.o._protocol.read("completed", item_id) is None, (
        "the purged record of an item E had finished was written back by P's claim")


def test_a_release_whose_reply_was_lost_leaves_one_version_in_the_claim(
        queue: Queue, proxy: FaultProxy, etcd_url: str) -> None:
    """Held: R0's reply is lost (the connection reset after etcd applied it);
    the transport resends it, etcd says "compare failed", and the read-back
    finds our own R0 (our token, a-1).  R1 then frees the item; the next claim
    counts the same attempt again (a release is no attempt), and its C2 is on
    the index the claim reads, not on R0's with the pre-R0 value."""
    item_id = queue.put({"n": 1})
    claim = queue.claim(timeout=BOUND)
    assert claim is not None and claim.attempt == 1
    key = queue.layout.key("work", item_id).encode()
    proxy.hold("down", match=b'"action":"compareAndSwap","node":{"key":"' + key)
    released, outcome = in_background(claim.release, "release")
    wait_until(lambda: proxy.held("down"), BOUND, message="R0's reply")
    proxy.reset()
    proxy.pass_through()
    released.join(BOUND)
    assert "raised" not in outcome, outcome
    entry = queue._protocol.read("work", item_id)
    assert entry is not None and json.loads(entry.value)["a"] == 0
    again = queue.claim(timeout=BOUND)
    assert again is not None and again.id == item_id and again.attempt == 1
    again.complete()
    assert queue.get(item_id).state == "completed"

