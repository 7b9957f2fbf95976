"""The "one version" rule for a claim: it acts on one version of
``work/<id>`` (an index with the value etcd wrote at that index), never on a
view's value alone, and its state keeps the value and index of its own latest
write together.  Against a real etcd, each Queue through the fault proxy.
"""
from __future__ import annotations

import json
import urllib.request
from typing import Any, Iterator, Tuple

import pytest

from etcdq_v2 import Queue
from etcdq_v2.protocol import Gone, Version
from etcdq_v2.viewstate import MAX_CACHED_VALUE

import test_item_versions as versions
from faultproxy import FaultProxy
from helpers import in_background, wait_until
from test_failure_text import lock_value

#: Seconds a liveness step may take (a lock TTL, a backoff, plus slack for load).
BOUND = 20.0


@pytest.fixture
def queue(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    """Attempts retried after 1 s, the third dead-lettered."""
    with Queue(proxy.url, queue_name, lock_ttl=5, max_attempts=3, backoff=[1]) as q:
        yield q


@pytest.fixture
def half_released(proxy: FaultProxy, queue_name: str) -> Iterator[Tuple[Queue, Any]]:
    """A queue (max_attempts 3, backoff 1 s) and its claim of attempt 1 whose
    release() applied R0 (a-1) and raised Unavailable: its R1 (the lock's
    delete) never reached etcd.  The claim is still open, its lock ours."""
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
        assert claim.outcome is None
        yield queue, claim


def test_a_failure_after_a_release_that_stopped_half_way_counts_its_attempt(
        half_released: Tuple[Queue, Any]) -> None:
    """release() applies R0 (a-1, the attempt given back) but its R1 (the
    lock's delete) never reaches etcd before the deadline: Unavailable, the
    claim still open and its lock ours.  The caller then fails the attempt.
    fail() writes no R0 ("a failure counts"), so the item must be at ``a``
    again (fail() writes ``a`` back on R0's index before its R1).  Wrong if
    the claim keeps R0's index with the value from before R0 (state.index and
    state.item of two versions): fail() checks max_attempts on ``a`` but
    leaves etcd at a-1, and the next claim reports the failed attempt's
    number again: it never counts toward max_attempts."""
    queue, claim = half_released
    claim.fail("ValueError: it failed after all")
    assert claim.outcome == "failed" and claim.attempt == 1
    again = queue.claim(timeout=BOUND)
    assert again is not None and again.id == claim.id
    assert again.attempt == 2, "the failed attempt was not counted"
    again.complete()


def test_a_release_retried_after_it_stopped_half_way_gives_its_attempt_back_once(
        half_released: Tuple[Queue, Any]) -> None:
    """The same half-done release, retried: the claim's version is R0's
    (a-1), so the second call writes no second R0 (a-2, an attempt given
    back that never ran) and goes on to R1; the next claim reports the
    released attempt's number again."""
    queue, claim = half_released
    claim.release()
    assert claim.outcome == "released"
    assert json.loads(queue._protocol.read("work", claim.id).value)["a"] == 0
    again = queue.claim(timeout=BOUND)
    assert again is not None and again.id == claim.id and again.attempt == 1
    again.complete()


def test_a_watching_view_keeps_each_events_index_with_that_events_value_or_none(
        queue: Queue, etcd_url: str, proxy_factory: Any) -> None:
    """A watching view learns items from the stream.  A create event of
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
    finisher's lock expire offers it.  The rule: a claim never trusts
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


def _put_read_back_after_es_commit(p: versions.Players, payload: Any) -> Tuple[str, Any]:
    """P puts ``payload``: its POST applies, its reply is lost, and its token
    search is held until E committed the item (F1) and E stopped before F2,
    its lock expired.  The item's id, and E's run (thread, outcome)."""
    p.quiet_producer()
    p.e_proxy.hold("up", match=versions._record_write(p.name))
    p.p_proxy.hold(match=versions._pattern(versions._stored_under(p.name, "work"),
                                           versions.work_listing(p.name).pattern))
    put, put_outcome = in_background(lambda: p.p.put(payload), "producer-P")
    e_run, claimed = p.e_claims(lambda claim: claim.complete("done by E"))
    item_id = claimed["claim"].id
    wait_until(lambda: p.work(item_id).get("o") == "completed", versions.STEP,
               message="E's F1")
    p.stop_e_until_its_lock_expired(item_id)
    p.p_proxy.release()
    put.join(versions.STEP)
    assert put_outcome.get("returned") == item_id, put_outcome
    return item_id, e_run


def test_a_large_items_read_back_after_another_consumers_commit_is_read_again_at_claim(
        players: versions.Players) -> None:
    """The read-back attack of test_item_versions with a payload larger
    than MAX_CACHED_VALUE.  P's POST applies, its reply is lost, its token
    search is held until E committed the item (F1) and E stopped before F2 with
    its lock expired.  The view keeps the index the search read and no value
    (too large to cache); P's claim then reads the item, finds E's outcome,
    finishes it for E and is handed nothing; one record."""
    p = players
    big = {"job": "X", "blob": "b" * (MAX_CACHED_VALUE + 1000)}
    item_id, e_run = _put_read_back_after_es_commit(p, big)
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
    p = players
    item_id, e_run = _put_read_back_after_es_commit(p, {"job": "X"})
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
    """R0's reply is lost (the connection reset after etcd applied it);
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

