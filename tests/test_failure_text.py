"""What a failed attempt stores: its reason ("why") and its handler's
traceback ("tb"), user text, in the delay lock R1 writes while the item waits
for its retry, and in the dead letter F1 writes.  Against a real etcd, each
Queue through the fault proxy.

R1 and F1 must apply whatever the text says, or the attempt is neither
retried after its backoff nor dead-lettered: the text is made to encode
(codec.failure_text).  locks/ is what every view lists (a quiet one once per
lock TTL and whenever a new item may be delayed; a watching one receives
every lock event), so what a delay lock carries is cut short
(codec.IN_LOCK), and a dead letter keeps more (codec.IN_RECORD).  A lock is
ours by its claim token, never by the text it carries.
"""
from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any, Iterator, Optional

import pytest

from etcdq_v2 import Queue, Worker, codec

from faultproxy import FaultProxy
from helpers import wait_until

#: Seconds a liveness step may take (a lock TTL, a backoff, plus slack for load).
BOUND = 20.0
#: A failed attempt's reason naming, by an f-string, a file whose name is not
#: UTF-8 (os.fsdecode's surrogateescape: a byte 0xff becomes U+DCFF).
UNDECODABLE = "ValueError: cannot parse /data/\udcff.csv"
#: What a delay lock holds beyond its bounded reason and traceback: node id,
#: claim token, "d", the field names, and JSON's escapes of a few characters.
LOCK_OVERHEAD = 200


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


def test_a_failed_attempt_is_retried_after_its_backoff_whatever_text_its_reason_holds(
        queue: Queue, etcd_url: str) -> None:
    """A handler's error names a file whose name is not UTF-8 (a surrogate in
    the str, as os.fsdecode makes it): fail() with a retry must still write
    its delay lock (R1), so the item comes back after its delay as attempt 2.
    Wrong if R1 encodes the reason as it is: the encoder refuses the
    surrogate, fail() raises InvalidPayload ("payload is not
    JSON-serialisable", about no payload), nothing is written, and the item
    comes back only after the lock TTL (the Worker abandons the claim), its
    reason lost."""
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
    retried after the backoff with its reason kept (escaped), not "lost":
    the claim abandoned and the item back after the lock TTL, its reason
    gone."""
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
        assert info.reason.endswith("cannot parse /nonexistent-dir/\\udcff.csv")
        assert info.traceback is not None and "\\udcff" in info.traceback
        assert info.due is not None and info.due > time.time() + 30  # the backoff, not lock_ttl


def test_a_dead_letter_is_recorded_whatever_text_its_reason_holds(last_try: Queue) -> None:
    """At its last attempt the same failure must still end in failed/ with
    its reason (made to encode), not raise and leave the item to come back
    after the lock TTL and be dead-lettered as "abandoned" (F1 encodes the
    record's reason as the delay lock does)."""
    queue = last_try
    item_id = queue.put({"file": "x"})
    claim = queue.claim(timeout=BOUND)
    assert claim is not None and claim.id == item_id
    claim.fail(UNDECODABLE)
    info = queue.get(item_id)
    assert info.state == "failed"
    assert info.reason == "ValueError: cannot parse /data/\\udcff.csv"


def test_a_delay_lock_stays_small_whatever_the_failures_text(
        slow_retries: Queue, etcd_url: str) -> None:
    """locks/ is listed by every view: a delay lock carries at most
    codec.LOCK_REASON_LIMIT characters of the reason (its start) and
    codec.LOCK_TRACEBACK_LIMIT of the traceback (its end), whatever their
    size.  Wrong if the reason is written whole: an error quoting a large
    input (300 kB here) makes a 300 kB lock, listed by every consumer's view
    for as long as the item waits for its retry; or if the traceback is cut
    only to a dead letter's bound (4,000 characters)."""
    queue = slow_retries
    item_id = queue.put({"n": 1})
    claim = queue.claim(timeout=BOUND)
    assert claim is not None
    reason = "ValueError: cannot parse " + "x" * 300_000
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 50_000 + reason
    claim.fail(reason, traceback=trace)
    lock = lock_value(etcd_url, queue, item_id)
    assert lock is not None
    bound = codec.LOCK_REASON_LIMIT + codec.LOCK_TRACEBACK_LIMIT + LOCK_OVERHEAD
    assert len(lock.encode()) <= bound, f"the delay lock holds {len(lock.encode())} bytes"
    info = queue.get(item_id)
    assert info.reason is not None and info.reason.startswith("ValueError: cannot parse xxx")
    assert info.traceback is not None and info.traceback.endswith(reason[-100:])


def test_a_dead_letter_keeps_the_start_of_a_long_reason_and_the_end_of_its_traceback(
        last_try: Queue) -> None:
    """A dead letter keeps more than a delay lock, but bounded too: the start
    of the reason (codec.REASON_LIMIT characters at most, saying how much was
    cut) and the end of the traceback (codec.TRACEBACK_LIMIT), so that a
    record stays near its payload's size however the handler failed."""
    queue = last_try
    item_id = queue.put({"n": 1})
    claim = queue.claim(timeout=BOUND)
    assert claim is not None
    reason = "ValueError: cannot parse " + "x" * 300_000
    claim.fail(reason, traceback="  frame\n" * 50_000 + "ValueError: the end")
    info = queue.get(item_id)
    assert info.state == "failed" and info.reason is not None and info.traceback is not None
    assert len(info.reason) <= codec.REASON_LIMIT
    assert info.reason.startswith("ValueError: cannot parse xxx")
    assert info.reason.endswith("characters cut]")
    assert len(info.traceback) <= codec.TRACEBACK_LIMIT
    assert info.traceback.endswith("ValueError: the end")


def test_a_traceback_that_looks_like_etcd_events_adds_nothing_to_a_watching_view(
        queue: Queue, etcd_url: str) -> None:
    """A watching view parses the stream's lines with a regular
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
    wait_until(lambda: view.state.known >= int(after), BOUND, message="the view's events")
    assert view.watching_locks
    assert view.version_of(phantom) is None


def test_a_retried_fail_finds_its_own_delay_lock_whatever_reason_it_gives(
        proxy: FaultProxy, queue_name: str, etcd_url: str) -> None:
    """fail()'s R1 applies but no reply comes before the deadline (every
    reply held): Unavailable, the claim still open.  The caller fails it
    again, with its error described anew (another reason).  R1's CAS is then
    refused (the lock is our delay lock now) and the read-back must see our
    own lock: it is the claim's (its token), whatever the reason it carries.
    Wrong if the read-back compares whole values, which hold each call's
    reason and traceback: the retry raises LockLost ("another claim holds the
    lock") and marks the claim lost, though nobody else holds it."""
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
        assert not claim.lost and claim.outcome == "failed"
        info = queue.get(item_id)
        assert info.state == "pending" and info.reason is not None
        assert info.reason.endswith("2.0 s")  # the lock the first call wrote


