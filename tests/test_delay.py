"""Delayed puts against a real etcd: put(payload, delay=S) and `etcdq put --delay S`.

The steps (docs/protocol.md, "delayed put"): D1 POSTs a delay lock with
ttl=S into locks/, D2 PUTs the item under the lock's name.  These tests show
that no claim gets the item before S seconds (on etcd's clock), that it comes
promptly after (in both of the view's watch modes: the lateness figures are
printed), that an undelayed item put later is not held up, and what a crash
after D1, a lost reply of D1 or D2, and a late copy of D2 leave behind.
Network faults go through the real TCP proxy (tests/faultproxy.py).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time
from typing import Any, Callable, Iterator, List, Optional

import pytest

from etcdq_v2 import InvalidArgument, Queue, Unavailable, connect
from etcdq_v2.driver import run
from etcdq_v2.protocol import Taken, Version
from etcdq_v2.viewstate import BACKLOG

from crashes import left_lock
from faultproxy import FaultProxy
from helpers import wait_until
from test_cli import assert_user_error, ok, run_etcdq

#: The delay most tests use: etcd TTLs are whole seconds, so 1 s is the shortest.
DELAY = 1.0
#: How late a delayed item may come and the test still pass: etcd rounds up to
#: whole seconds and sweeps every 0.5 s; the rest is a loaded test machine.
PATIENCE = 6.0
#: A delay lock's POST (D1) and an item's PUT (D2) as the client sends them.
D1_REQUEST = rb"^POST /v2/keys/\S+/locks "
D2_REQUEST = rb"^PUT /v2/keys/\S+/work/\d{20} "
#: etcd's replies to them.
D1_REPLY = rb'"action":"create","node":\{"key":"[^"]*/locks/'
D2_REPLY = rb'"action":"create","node":\{"key":"[^"]*/work/'


class Once:
    """A FaultProxy.hold() pattern that matches the first chunk ``pattern`` finds, only."""

    def __init__(self, pattern: bytes) -> None:
        self._pattern = re.compile(pattern, re.MULTILINE)
        self._lock = threading.Lock()
        self.matched = False

    def search(self, data: bytes) -> Optional["re.Match[bytes]"]:
        with self._lock:
            found = None if self.matched else self._pattern.search(data)
            self.matched = self.matched or found is not None
            return found


def report(what: str, lateness: float) -> None:
    """Print a measured lateness (pytest -s shows it; the report quotes it)."""
    print(f"\nLATENESS {what}: {lateness:.3f} s after the delay")


def first_claim(consumer: Queue, item_id: str, started: float, *, delay: float = DELAY,
                between: Callable[[Any], None] = lambda claim: claim.release()) -> float:
    """Claim until ``item_id`` comes (other items go to ``between``); when it came,
    in seconds since ``started``.  Asserts it never came before ``delay``."""
    def claims_it() -> bool:
        claim = consumer.claim(timeout=0)
        now = time.monotonic()
        if claim is None:
            return False
        if claim.id != item_id:
            between(claim)
            return False
        assert now - started >= delay, f"claimed {now - started:.3f} s after the put"
        claim.complete()
        return True

    wait_until(claims_it, PATIENCE, interval=0.02, message=f"delayed item {item_id}")
    return time.monotonic() - started


def work_ids(queue: Queue) -> List[str]:
    return [entry.id for entry in queue._protocol.list("work")[1]]


def lock_ids(queue: Queue) -> List[str]:
    return [entry.id for entry in queue._protocol.list("locks")[1]]


@pytest.fixture
def producer(etcd_url: str, queue_name: str):
    with Queue(etcd_url, queue_name, lock_ttl=2) as queue:
        yield queue


@pytest.fixture
def consumer(etcd_url: str, queue_name: str):
    # lock_ttl 30: the view's periodic locks/ listing (once per lock TTL) cannot
    # be what frees a delayed item within these tests.
    with Queue(etcd_url, queue_name) as queue:
        yield queue


# -- never early, promptly after -------------------------------------------------------

def test_a_delayed_item_is_claimable_only_after_its_delay(
        etcd_url: str, queue_name: str, consumer: Queue) -> None:
    started = time.monotonic()
    with Queue(etcd_url, queue_name) as producer:  # it "dies" right after its put (D2)
        item_id = producer.put({"job": "later"}, delay=DELAY)
    assert consumer.claim() is None
    assert consumer.stats() == {"pending": 1, "running": 0, "completed": 0, "failed": 0}
    info = consumer.get(item_id)
    assert (info.state, info.payload, info.attempts) == ("pending", {"job": "later"}, 0)
    # Even a claimer whose view offered it (a stale one, say) cannot take it: C1
    # finds the delay lock.
    index = consumer._protocol.read("work", item_id).index
    with pytest.raises(Taken):
        consumer._protocol.claim(item_id, Version(index))
    elapsed = first_claim(consumer, item_id, started)
    assert consumer.items("completed")[0].attempts == 1  # the failed C1 counted nothing
    report("claimed by polling claim(timeout=0)", elapsed - DELAY)


def test_an_undelayed_item_put_later_is_not_held_up(producer: Queue, consumer: Queue) -> None:
    started = time.monotonic()
    delayed = producer.put("later", delay=DELAY)
    undelayed = producer.put("now")
    claim = consumer.claim(timeout=PATIENCE)
    assert claim is not None and claim.id == undelayed
    assert time.monotonic() - started < DELAY
    claim.complete()
    assert consumer.claim() is None  # the delayed one is not due yet
    first_claim(consumer, delayed, started)


@pytest.mark.parametrize("put_by", ["another queue", "the consumer itself"])
def test_a_waiting_consumer_gets_a_delayed_item_promptly(
        producer: Queue, consumer: Queue, put_by: str) -> None:
    """Nothing to claim: the view watches the whole queue, and etcd's expire event
    of the delay lock frees the item."""
    assert consumer.claim() is None and consumer._view.watching_locks
    started = time.monotonic()
    item_id = (producer if put_by == "another queue" else consumer).put("later", delay=DELAY)
    claim = consumer.claim(timeout=PATIENCE)
    elapsed = time.monotonic() - started
    assert claim is not None and claim.id == item_id
    assert elapsed >= DELAY, f"claimed {elapsed:.3f} s after the put"
    claim.complete()
    report(f"waiting consumer, put by {put_by}", elapsed - DELAY)


def test_a_consumer_with_a_backlog_gets_a_delayed_item_promptly(
        producer: Queue, consumer: Queue) -> None:
    """A backlog: the view watches nothing, so no event says the delay lock
    expired.  It lists locks/ when the lock is due (its listing gave the expiry),
    not once per lock TTL (30 s here)."""
    started = time.monotonic()
    delayed = producer.put("later", delay=DELAY)
    producer.put_many(range(BACKLOG + 8))
    elapsed = first_claim(consumer, delayed, started)  # others claimed and released
    assert not consumer._view.watching_locks, "the backlog should have kept locks/ unwatched"
    report("consumer with a backlog (claims every ~20 ms)", elapsed - DELAY)


def test_a_consumer_with_a_backlog_frees_its_own_delayed_item_when_due(
        consumer: Queue) -> None:
    """The consumer puts a delayed item itself while it has a backlog: its view marks
    the item locked at once (no event will say so) and lists locks/ when it is due.
    The item sorts after the backlog (FIFO), so the view is asked, not claims."""
    consumer.put_many(range(BACKLOG + 8))
    consumer.claim().complete()  # the view is up, quiet (no watch)
    started = time.monotonic()
    item_id = consumer.put("later", delay=DELAY)
    view = consumer._view

    def free_now() -> bool:
        consumer.claim().release()  # each claim checks whether locks/ is due
        return view.state.is_free(item_id)

    assert not free_now(), "offered before its delay"
    wait_until(free_now, PATIENCE, interval=0.02, message="the view to free the item")
    elapsed = time.monotonic() - started
    assert elapsed >= DELAY and not view.watching_locks
    report("own put, consumer with a backlog (view frees it)", elapsed - DELAY)


def test_put_many_delays_every_item(producer: Queue, consumer: Queue) -> None:
    started = time.monotonic()
    ids = producer.put_many(["a", "b", "c"], delay=DELAY)
    assert sorted(ids) == ids and len(set(ids)) == 3
    assert consumer.claim() is None and consumer.stats()["pending"] == 3
    for item_id in ids:
        first_claim(consumer, item_id, started)
    assert [info.payload for info in consumer.items("completed")] == ["a", "b", "c"]


@pytest.mark.parametrize("delay", [None, 0, 0.0])
def test_no_delay_puts_as_before_without_a_lock(producer: Queue, consumer: Queue,
                                                delay: Optional[float]) -> None:
    item_id = producer.put("now", delay=delay)
    assert lock_ids(producer) == []
    claim = consumer.claim(timeout=PATIENCE)
    assert claim is not None and claim.id == item_id


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, 2**31, "5", True, [1]])
def test_a_bad_delay_is_an_invalid_argument_and_writes_nothing(producer: Queue,
                                                               delay: Any) -> None:
    with pytest.raises(InvalidArgument, match="delay"):
        producer.put("x", delay=delay)
    with pytest.raises(InvalidArgument, match="delay"):
        producer.put_many(["x", "y"], delay=delay)
    assert work_ids(producer) == [] and lock_ids(producer) == []


# -- crashes and lost replies ----------------------------------------------------------

def test_a_crash_after_the_delay_lock_leaves_an_orphan_lock_that_expires(
        producer: Queue, consumer: Queue) -> None:
    """D1 applied, then the producer died: nothing was stored (the put was never
    acknowledged); the orphan lock is ignored by claims, stats and ls, and expires."""
    orphan, _ = run(producer._protocol._delay_lock("put-token", 1), producer.etcd)  # D1; "crash"
    assert lock_ids(consumer) == [orphan] and work_ids(consumer) == []
    assert consumer.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 0}
    assert consumer.items("pending") == [] and consumer.items("running") == []
    assert consumer.claim() is None
    other = producer.put("unaffected")  # the queue goes on as usual
    claim = consumer.claim(timeout=PATIENCE)
    assert claim is not None and claim.id == other
    claim.complete()  # its lock is left to expire (F4 skipped): it holds nothing
    wait_until(lambda: orphan not in lock_ids(consumer), PATIENCE,
               message="the orphan lock to expire")
    assert set(lock_ids(consumer)) <= {other} and left_lock(consumer, "completed", other)
    assert work_ids(consumer) == [] and consumer.claim() is None


@contextlib.contextmanager
def through(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    """A producer whose requests go through ``proxy``: a lost reply costs 0.5 s."""
    transport = connect(proxy.url, timeout=0.5, deadline=3)
    try:
        with Queue(transport, queue_name) as queue:
            yield queue
    finally:
        transport.close()


@pytest.mark.parametrize("lost", ["reply", "request held, lands later"])
def test_a_lost_delay_lock_post_is_posted_again(proxy: FaultProxy, queue_name: str,
                                                consumer: Queue, lost: str) -> None:
    """D1's outcome is unknown: another lock is POSTed, and the item takes its name.
    The first lock, applied at once or landing late, is an orphan that expires."""
    if lost == "reply":
        once = Once(D1_REPLY)
        proxy.hold("down", match=once)
    else:
        once = Once(D1_REQUEST)
        proxy.hold("up", match=once)
    started = time.monotonic()
    with through(proxy, queue_name) as producer:
        # 2 s: the first lock must not expire before the test has seen it.
        item_id = producer.put("once", delay=2)
        assert once.matched
        proxy.release()  # a held request lands now
        wait_until(lambda: len(lock_ids(consumer)) == 2, PATIENCE,
                   message="the first delay lock to be there")
        assert work_ids(consumer) == [item_id] and item_id in lock_ids(consumer)
        first_claim(consumer, item_id, started, delay=2)
    # The item's own lock, its finisher's, is left to expire (F4 skipped): only the
    # orphan is waited for.
    wait_until(lambda: set(lock_ids(consumer)) <= {item_id}, PATIENCE,
               message="the orphan to expire")
    left_lock(consumer, "completed", item_id)
    assert work_ids(consumer) == [] and len(consumer.items("completed")) == 1


def test_a_lost_reply_to_the_item_put_is_resent_and_read_back(
        proxy: FaultProxy, queue_name: str, consumer: Queue) -> None:
    """D2 applied but its reply was lost: the transport resends the PUT, which finds
    the item ("already exists"); our put token in it says it is ours."""
    once = Once(D2_REPLY)
    proxy.hold("down", match=once)
    started = time.monotonic()
    with through(proxy, queue_name) as producer:
        item_id = producer.put("once", delay=DELAY)
        assert once.matched and producer.etcd.requests["PUT"] == 2
    assert work_ids(consumer) == [item_id]
    first_claim(consumer, item_id, started)
    assert [info.payload for info in consumer.items("completed")] == ["once"]


def test_an_item_put_unanswered_until_the_deadline_is_stored_at_most_once(
        proxy: FaultProxy, queue_name: str, consumer: Queue) -> None:
    """Every copy of D2 is held in flight: Unavailable ("may or may not be stored").
    When they all land, the first creates the item and the others find it."""
    proxy.hold("up", match=re.compile(D2_REQUEST, re.MULTILINE))
    with through(proxy, queue_name) as producer:
        with pytest.raises(Unavailable, match="may or may not be stored"):
            producer.put("held", delay=DELAY)
        copies = proxy.held().count(b"PUT /v2/keys/")
        assert copies >= 2, "the transport should have resent D2"
        assert work_ids(consumer) == []
        proxy.release()
        wait_until(lambda: work_ids(consumer), PATIENCE, message="the held D2s to land")
    claim = consumer.claim(timeout=PATIENCE)  # its delay has passed: claimable now
    assert claim is not None and claim.payload == "held"
    claim.complete()
    assert consumer.claim() is None and len(consumer.items("completed")) == 1


def test_a_late_copy_of_the_item_put_after_it_finished_never_runs_it_again(
        proxy: FaultProxy, queue_name: str, etcd_url: str) -> None:
    """D2's first copy is held in flight; the transport's resend creates the item,
    which runs and finishes; then the held copy lands and creates it again.  Its
    first claim finds the record (C3: a delayed item carries "q") and removes it.
    That claim comes once the finisher's lock, left to expire (F4 skipped), is
    gone: lock_ttl 2 s here."""
    once = Once(D2_REQUEST)
    proxy.hold("up", match=once)
    started = time.monotonic()
    with through(proxy, queue_name) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=2) as consumer:
        item_id = producer.put("only once", delay=DELAY)
        assert once.matched
        first_claim(consumer, item_id, started)
        proxy.release()
        wait_until(lambda: work_ids(consumer) == [item_id], PATIENCE,
                   message="the held copy of D2 to land")

        def removed_unrun() -> bool:
            assert consumer.claim(timeout=0.5) is None
            return work_ids(consumer) == []
        wait_until(removed_unrun, PATIENCE, message="a claim to remove the copy (C3)")
        completed = consumer.items("completed")
        assert [(info.id, info.attempts) for info in completed] == [(item_id, 1)]


# -- the command line ------------------------------------------------------------------

def test_etcdq_put_delay(etcd_url: str, consumer: Queue) -> None:
    env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url}
    started = time.monotonic()
    ids = ok(run_etcdq(["put", consumer.name, "--delay", "1", "a", "b"], env=env)).split()
    assert len(ids) == 2
    assert consumer.claim() is None and consumer.stats()["pending"] == 2
    for item_id in ids:
        first_claim(consumer, item_id, started)


@pytest.mark.parametrize("argv", [["--delay", "1", "--", "-x"],
                                  ["--delay", "1", "a", "--", "-x"]])
def test_etcdq_put_delay_takes_payloads_after_a_double_dash(
        etcd_url: str, consumer: Queue, argv: List[str]) -> None:
    """As without --delay (tests/test_cli.py): "--" ends the options, so a payload
    may start with "-"."""
    env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url}
    ok(run_etcdq(["put", consumer.name, *argv], env=env))
    assert sorted(info.payload for info in consumer.items("pending")) == \
        sorted(a for a in argv[2:] if a != "--")


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon", str(2**31)])
def test_etcdq_put_with_a_bad_delay_exits_2(etcd_url: str, consumer: Queue,
                                            value: str) -> None:
    env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url}
    assert_user_error(run_etcdq(["put", consumer.name, "--delay", value, "a"], env=env),
                      2, "--delay")
    assert work_ids(consumer) == []


def test_etcdq_put_keeps_refusing_unknown_options_among_payloads(etcd_url: str,
                                                                 consumer: Queue) -> None:
    """Payloads may follow --delay; an unknown option there is still an error, not a payload."""
    env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url}
    done = run_etcdq(["put", consumer.name, "--delay", "0", "a", "--frob", "b"], env=env)
    assert_user_error(done, 2, "unrecognized arguments: --frob")
    ok(run_etcdq(["put", consumer.name, "a", "--delay", "0", "-5", "-"], env=env, input="c\n"))
    assert [info.payload for info in consumer.items("pending")] == ["a", -5, "c"]
