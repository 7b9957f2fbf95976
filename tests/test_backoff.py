"""Retries: Queue(backoff=...), the default backoff, release giving the attempt back (R0),
and the default max_attempts, against a real etcd.

A failed attempt's wait is etcd's TTL on the item's delay lock, so the tests
read that TTL rather than time the wait.
"""
from __future__ import annotations

import logging
import math
import re
import statistics
from collections import Counter
from typing import Any, Callable, List

import pytest

from etcdq_v2 import Claim, ClaimClosed, ConfigError, InvalidArgument, LockLost, Queue, connect
from etcdq_v2.backoff import default_backoff
from etcdq_v2.cli import build_parser
from etcdq_v2.codec import Item, Lock
from etcdq_v2.protocol import MAX_TTL

from crashes import commit, stalled_claim
from faultproxy import FaultProxy
from helpers import wait_until

BOUND = 10.0


def take(queue: Queue, timeout: float = BOUND) -> Claim:
    claim = queue.claim(timeout=timeout)
    assert claim is not None, "nothing to claim"
    return claim


def delay_lock_ttl(queue: Queue, item_id: str) -> int:
    """The TTL of the delay lock a failure (or a release with a delay) left on the item."""
    node = queue.etcd.get(queue.layout.key("locks", item_id), quorum=True).node
    assert Lock.decode(node["value"]).delay, node
    return int(node["ttl"])


def attempts_in_etcd(queue: Queue, item_id: str) -> int:
    entry = queue._protocol.read("work", item_id)
    assert entry is not None
    return Item.decode(entry.value).attempts


# -- the default backoff -----------------------------------------------------------------

def test_the_default_backoff_is_exponential_with_equal_jitter_and_a_cap() -> None:
    for attempt in range(1, 15):
        ceiling = min(300.0, 5.0 * 2 ** (attempt - 1))
        waits = [default_backoff(attempt) for _ in range(300)]
        assert all(ceiling / 2 <= wait <= ceiling for wait in waits), (attempt, waits)
        assert len(set(waits)) > 1  # jittered
    # Nine retries before the tenth attempt dead-letters: the figure the docs give.
    ceilings = [min(300.0, 5.0 * 2 ** (n - 1)) for n in range(1, 10)]
    assert (sum(ceilings) / 2, sum(ceilings)) == (607.5, 1215.0)
    assert 3.5 < statistics.mean(default_backoff(1) for _ in range(2000)) < 4.0  # 3.75


def test_a_failure_waits_the_default_backoff(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put("x")
        take(queue).fail("downstream is down")
        assert 3 <= delay_lock_ttl(queue, item_id) <= 5  # 2.5-5 s, rounded up
        assert queue.claim() is None


# -- Queue(backoff=...) -----------------------------------------------------------------

def test_a_backoff_sequence_is_indexed_by_attempt_and_its_last_value_repeats(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, backoff=(0, 7, 9)) as queue:
        item_id = queue.put("x")
        waits = []
        for attempt in (1, 2, 3, 4):
            claim = take(queue)
            assert claim.attempt == attempt
            claim.fail("again")
            if attempt == 1:
                waits.append(0)  # 0: no delay lock, claimable at once
                assert queue._protocol.read("locks", item_id) is None
            else:
                waits.append(delay_lock_ttl(queue, item_id))
                queue._protocol._drop_lock(item_id, Lock.decode(
                    queue._protocol.read("locks", item_id).value))  # skip the wait
        assert waits[0] == 0 and 5 <= waits[1] <= 7 and 7 <= waits[2] <= 9 and \
            7 <= waits[3] <= 9, waits


def test_a_backoff_function_is_called_with_the_attempt(etcd_url: str,
                                                       queue_name: str) -> None:
    calls: List[int] = []

    def backoff(attempt: int) -> float:
        calls.append(attempt)
        return 0 if attempt == 1 else 40

    with Queue(etcd_url, queue_name, backoff=backoff) as queue:
        item_id = queue.put("x")
        take(queue).fail("one")
        take(queue).fail("two")
        assert calls == [1, 2]
        assert 35 <= delay_lock_ttl(queue, item_id) <= 40


@pytest.mark.parametrize("backoff", [
    [], (), "12", b"12", 5, 2.5, [1, -1], [math.nan], [math.inf], [True], [1, "2"], {1: 2},
    [1, MAX_TTL + 1], [1e20],
], ids=repr)
def test_a_bad_backoff_is_a_config_error(etcd_url: str, queue_name: str,
                                         backoff: Any) -> None:
    with pytest.raises(ConfigError, match="backoff"):
        Queue(etcd_url, queue_name, backoff=backoff)


def _raises(attempt: int) -> float:
    raise RuntimeError("backoff exploded")


@pytest.mark.parametrize("backoff", [
    _raises, lambda attempt: "soon", lambda attempt: -1, lambda attempt: math.nan,
    lambda attempt: None, lambda attempt: True,
], ids=["raises", "a string", "negative", "nan", "None", "a bool"])
def test_a_backoff_function_that_fails_is_logged_and_the_default_used(
        etcd_url: str, queue_name: str, backoff: Callable[[int], Any],
        caplog: pytest.LogCaptureFixture) -> None:
    with Queue(etcd_url, queue_name, backoff=backoff) as queue:
        item_id = queue.put("x")
        claim = take(queue)
        with caplog.at_level(logging.WARNING, logger="etcdq_v2"):
            claim.fail("downstream is down")
        assert claim.outcome == "failed"  # not stuck: retried after the default backoff
        assert 3 <= delay_lock_ttl(queue, item_id) <= 5
        [warning] = [r for r in caplog.records if "backoff" in r.getMessage()]
        assert warning.levelno == logging.WARNING and queue.name in warning.getMessage()
        assert "attempt 1" in warning.getMessage()


@pytest.mark.parametrize("huge", [1e10, 1e20], ids=["past-etcds-clock", "past-int64"])
def test_a_backoff_function_past_the_longest_ttl_is_cut_to_it(
        etcd_url: str, queue_name: str, huge: float, caplog: pytest.LogCaptureFixture) -> None:
    """1e20 s is over etcd's int64 TTL (HTTP 400: fail() would raise and the claim's
    heartbeat would keep the item locked); 1e10 s is taken, and silently never
    expires.  Both are cut to MAX_TTL, with a warning, and the item is released."""
    with Queue(etcd_url, queue_name, lock_ttl=2, backoff=lambda attempt: huge) as queue:
        item_id = queue.put("x")
        claim = take(queue)
        try:
            with caplog.at_level(logging.WARNING, logger="etcdq_v2"):
                claim.fail("downstream is down")
            assert claim.outcome == "failed"
            assert MAX_TTL - 5 <= delay_lock_ttl(queue, item_id) <= MAX_TTL
            [warning] = [r for r in caplog.records if "longest TTL" in r.getMessage()]
            assert queue.name in warning.getMessage() and "attempt 1" in warning.getMessage()
        finally:
            claim.abandon()
            queue.etcd.delete(queue.layout.key("locks", item_id))  # 68 years is long


# -- release gives the attempt back (R0) ---------------------------------------------------

@pytest.mark.parametrize("delay", [-1, MAX_TTL + 1, 1e20, math.nan, math.inf, "5", True],
                         ids=repr)
def test_a_bad_release_delay_is_invalid_before_any_write(etcd_url: str, queue_name: str,
                                                         delay: Any) -> None:
    with Queue(etcd_url, queue_name, backoff=[0]) as queue:
        item_id = queue.put("x")
        claim = take(queue)
        lock = queue._protocol.read("locks", item_id)
        with pytest.raises(InvalidArgument, match="delay"):
            claim.release(delay)
        assert claim.outcome is None and attempts_in_etcd(queue, item_id) == 1  # no R0
        assert queue._protocol.read("locks", item_id) == lock  # no R1
        claim.release()  # the claim is still open
        assert claim.outcome == "released" and attempts_in_etcd(queue, item_id) == 0

@pytest.mark.parametrize("delay", [0, 1])
def test_a_release_gives_the_attempt_back(etcd_url: str, queue_name: str,
                                          delay: float) -> None:
    with Queue(etcd_url, queue_name, backoff=[0]) as queue:
        item_id = queue.put("x")
        take(queue).fail("counts")  # attempt 1 failed
        claim = take(queue)
        assert claim.attempt == 2
        claim.release(delay)
        assert claim.outcome == "released" and attempts_in_etcd(queue, item_id) == 1
        again = take(queue, timeout=delay + 5)
        assert (again.id, again.attempt) == (item_id, 2)  # the same attempt once more
        again.complete()
        assert queue.get(item_id).attempts == 2


def test_releases_never_dead_letter_an_item(etcd_url: str, queue_name: str) -> None:
    """A worker fleet restarted many times (a rolling deploy) uses up no attempts."""
    with Queue(etcd_url, queue_name, max_attempts=2) as queue:
        item_id = queue.put("x")
        for _ in range(5):
            take(queue).release()
        claim = take(queue)
        assert claim.attempt == 1
        claim.complete()
        assert queue.get(item_id).state == "completed"


def test_a_release_after_the_lock_expired_with_nobody_claiming_still_gives_it_back(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as queue:
        item_id = queue.put("x")
        claim = stalled_claim(queue)
        wait_until(lambda: queue._protocol.read("locks", item_id) is None, BOUND,
                   message="the lock to expire")
        claim.release()
        assert take(queue).attempt == 1


@pytest.mark.parametrize("delay", [0, 5])
def test_a_stale_release_changes_nothing(etcd_url: str, queue_name: str,
                                         delay: float) -> None:
    """R0 is fenced by the claim's index: a claim whose item was claimed again by
    another node cannot give that claim's attempt back, nor touch its lock."""
    with Queue(etcd_url, queue_name, lock_ttl=1) as slow, \
            Queue(etcd_url, queue_name, lock_ttl=30) as fast:
        item_id = slow.put("contested")
        stale = stalled_claim(slow)
        winner = take(fast)  # once the stale claim's lock expired
        assert (winner.id, winner.attempt) == (item_id, 2)
        with pytest.raises(LockLost):
            stale.release(delay)
        assert attempts_in_etcd(fast, item_id) == 2
        assert fast.items("running")[0].node_id == fast.node_id
        winner.complete("mine")
        assert fast.get(item_id).result == "mine"


def test_a_release_after_an_unacknowledged_complete_says_the_claim_was_completed(
        etcd_url: str, queue_name: str) -> None:
    """An earlier complete() of the claim committed (F1) though the caller saw an
    error: a release then finds the outcome, and says so (ClaimClosed)."""
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put("x")
        claim = take(queue)
        commit(queue, claim, "completed", record=False)  # the F1 of a complete() that failed
        with pytest.raises(ClaimClosed, match="committed as completed"):
            claim.release()
        assert claim.outcome == "completed"
        assert queue.get(item_id).state == "completed"


def test_crash_after_r0_the_next_claim_reports_the_same_attempt(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed, \
            Queue(etcd_url, queue_name) as survivor:
        item_id = crashed.put("x")
        claim = stalled_claim(crashed)
        crashed._protocol._give_back(claim._state)  # R0; the process dies before R1
        assert attempts_in_etcd(survivor, item_id) == 0
        assert survivor.stats()["running"] == 1  # its lock holds it until it expires
        again = take(survivor)
        assert (again.id, again.attempt) == (item_id, 1)
        again.complete()


#: A release's R0: the compare-and-swap of the item, as etcd answers it.
R0_REPLY = re.compile(rb'"action":"compareAndSwap","node":\{"key":"[^"]*/work/')


def test_a_resent_r0_whose_first_copy_applied_is_ours(
        proxy: FaultProxy, etcd_url: str, queue_name: str) -> None:
    """R0's reply is lost (held past the request timeout): the transport sends it
    again, etcd says "compare failed", and the read-back finds our own R0."""
    with Queue(connect(proxy.url, timeout=0.5), queue_name) as queue, \
            Queue(etcd_url, queue_name) as other:
        item_id = queue.put("x")
        claim = take(queue)
        proxy.hold("down", match=R0_REPLY)
        before = Counter(queue.etcd.requests)
        claim.release()
        sent = Counter(queue.etcd.requests) - before
        assert (sent["PUT"], sent["DELETE"]) == (2, 1)  # R0, R0 again (then a read), R1
        proxy.release()
        assert claim.outcome == "released"
        again = take(other)
        assert (again.id, again.attempt) == (item_id, 1)  # given back once, not twice


# -- max_attempts ---------------------------------------------------------------------------

def test_by_default_an_item_is_dead_lettered_at_its_tenth_failure(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, backoff=[0]) as queue:
        assert queue.max_attempts == 10
        item_id = queue.put("poison")
        for attempt in range(1, 11):
            claim = take(queue)
            assert claim.attempt == attempt
            claim.fail(f"failure {attempt}")
        dead = queue.get(item_id)
        assert (dead.state, dead.attempts, dead.reason) == ("failed", 10, "failure 10")


def test_by_default_an_item_that_kills_its_workers_is_dead_lettered_at_its_tenth_claim(
        etcd_url: str, queue_name: str) -> None:
    """Each crash counts at C2; here the crashed claim's lock is removed at once (as
    its expiry would), and the eleventh claim dead-letters the item instead (C3)."""
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put("poison")
        for attempt in range(1, 11):
            claim = take(queue)
            claim.abandon()  # the worker died: nothing keeps its lock
            assert claim.attempt == attempt
            queue._protocol._drop_lock(item_id, claim._state.lock)  # "expired"
        assert queue.claim(timeout=0.5) is None
        dead = queue.get(item_id)
        assert (dead.state, dead.attempts) == ("failed", 10) and "abandoned" in dead.reason


def test_max_attempts_none_retries_forever(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, backoff=[0], max_attempts=None) as queue:
        item_id = queue.put("x")
        for attempt in range(1, 13):
            claim = take(queue)
            assert claim.attempt == attempt
            claim.fail("again")
        assert queue.get(item_id).state == "pending"


@pytest.mark.parametrize("given, expected", [([], 10), (["--max-attempts", "none"], None),
                                             (["--max-attempts", "3"], 3)])
def test_work_max_attempts_defaults_to_ten_and_none_means_forever(
        given: List[str], expected: Any) -> None:
    args = build_parser().parse_args(["work", "q", *given])
    assert args.max_attempts == expected
