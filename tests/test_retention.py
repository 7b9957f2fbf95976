"""Records expire: completed_ttl and failed_ttl, against a real etcd.

F2 writes each record with the TTL of its kind; requeue's Q1 keeps a dead
letter's TTL (a CAS without one would make the key permanent); an item
committed (F1) whose record expired before its F3 still never runs again,
because the item itself carries its outcome.  docs/protocol.md, "Retention
and retries", has the crash table these tests walk through.
"""
from __future__ import annotations

import math
import re
import sys
from typing import Any, Dict, Optional

import pytest

from etcdq_v2 import ConfigError, EtcdqError, NotFound, Queue, Unavailable, connect
from etcdq_v2.codec import Item, Record
from etcdq_v2.driver import run
from etcdq_v2.errors import KeyMissing
from etcdq_v2.protocol import COMPLETED, FAILED, MAX_TTL, TOMBSTONE_TTL

import test_cli
from crashes import commit, commit_then_crash, stalled_claim
from faultproxy import FaultProxy
from helpers import in_background, wait_until
from test_cli import assert_user_error

# test_cli's fixture: etcdq on the shared etcd, for this module too.
etcdq = test_cli.etcdq

BOUND = 10.0


def node(queue: Queue, kind: str, item_id: str) -> Optional[Dict[str, Any]]:
    """The etcd node of ``kind/<id>`` (with its ``ttl`` if it has one), or None."""
    try:  # one GET: a read, then a GET, raced a lock's expiry in between
        return queue.etcd.get(queue.layout.key(kind, item_id), quorum=True).node
    except KeyMissing:
        return None


def ttl_of(queue: Queue, kind: str, item_id: str) -> Optional[int]:
    found = node(queue, kind, item_id)
    assert found is not None, f"no {kind}/{item_id}"
    return found.get("ttl")


# -- F2: records carry the TTL of their kind -------------------------------------------

def test_records_get_the_ttl_of_their_kind(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, completed_ttl=100, failed_ttl=50.5,
               max_attempts=1) as queue:
        done, dead = queue.put_many(["done", "dead"])
        queue.claim().complete("ok")
        queue.claim().fail("no")
        assert 95 <= ttl_of(queue, COMPLETED, done) <= 100
        assert 46 <= ttl_of(queue, FAILED, dead) <= 51  # 50.5 rounded up
        assert (queue.completed_ttl, queue.failed_ttl) == (100, 51)


def test_by_default_completion_records_last_a_day_and_dead_letters_forever(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, max_attempts=1) as queue:
        done, dead = queue.put_many(["done", "dead"])
        queue.claim().complete()
        queue.claim().fail("no")
        assert 86400 - 5 <= ttl_of(queue, COMPLETED, done) <= 86400
        assert ttl_of(queue, FAILED, dead) is None


@pytest.mark.parametrize("how", ["requeued", "delayed", "cancelled after a delay"])
def test_records_of_items_carrying_q_are_kept_at_least_a_tombstones_week(
        etcd_url: str, queue_name: str, how: str) -> None:
    """A requeued or delayed item may be created again by a late Q3 or a late copy of
    D2; its first claim must then find the record (C3), so the record outlives
    completed_ttl and failed_ttl: a week at least, like a requeue's tombstone."""
    with Queue(etcd_url, queue_name, completed_ttl=60, failed_ttl=30,
               max_attempts=1) as queue:
        plain = queue.put("plain")
        queue.claim(timeout=BOUND).complete()
        if how == "requeued":
            queue.put("dead")
            queue.claim(timeout=BOUND).fail("no")
            item_id = queue.requeue(queue.items(FAILED)[0].id)
        else:
            item_id = queue.put(how, delay=1)
        if how.startswith("cancelled"):
            assert queue.cancel(item_id)
            kind = FAILED
        else:
            claim = queue.claim(timeout=BOUND)
            assert claim is not None and claim.id == item_id
            claim.complete()
            kind = COMPLETED
        assert 55 <= ttl_of(queue, COMPLETED, plain) <= 60
        assert TOMBSTONE_TTL - 5 <= ttl_of(queue, kind, item_id) <= TOMBSTONE_TTL


def test_none_still_keeps_the_records_of_items_carrying_q_until_purged(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, completed_ttl=None) as queue:
        item_id = queue.put("later", delay=0.1)
        claim = queue.claim(timeout=BOUND)
        assert claim is not None and claim.id == item_id
        claim.complete()
        assert ttl_of(queue, COMPLETED, item_id) is None


def test_none_keeps_records_until_purged(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, completed_ttl=None) as queue:
        item_id = queue.put("kept")
        queue.claim().complete()
        assert ttl_of(queue, COMPLETED, item_id) is None
        assert queue.purge(completed=True) == 1


def test_an_expired_record_is_gone_and_its_item_does_not_come_back(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, completed_ttl=1) as queue:
        item_id = queue.put("brief")
        queue.claim().complete("done")
        assert queue.get(item_id).state == COMPLETED

        def gone() -> bool:
            try:
                queue.get(item_id)
            except NotFound:
                return True
            return False

        wait_until(gone, BOUND, message="the completion record to expire")
        assert queue.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 0}
        assert queue.claim(timeout=0.5) is None


@pytest.mark.parametrize("option", ["completed_ttl", "failed_ttl"])
@pytest.mark.parametrize("value", [0, -1, "60", True, math.nan, math.inf, [60], MAX_TTL + 1,
                                   1e20])
def test_a_bad_record_ttl_is_a_config_error(etcd_url: str, queue_name: str, option: str,
                                            value: Any) -> None:
    with pytest.raises(ConfigError, match=option):
        Queue(etcd_url, queue_name, **{option: value})


# -- F2 by a claimer that finishes a crashed finisher's item ---------------------------

def test_a_claimer_that_finishes_a_crashed_commit_writes_the_record_with_its_own_ttl(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1, completed_ttl=None) as crashed, \
            Queue(etcd_url, queue_name, completed_ttl=77) as survivor:
        crashed.put("finish me once")
        item_id = commit_then_crash(crashed, COMPLETED, record=False)  # F1, then dead
        assert survivor.claim(timeout=4) is None  # finds "o": F2, F3, F4 for it
        wait_until(lambda: survivor._protocol.read("work", item_id) is None, BOUND,
                   message="the survivor to finish the crashed item")
        assert 72 <= ttl_of(survivor, COMPLETED, item_id) <= 77
        assert survivor.get(item_id).result == "done"


def test_crash_after_f2_whose_record_expired_while_the_item_is_in_work(
        etcd_url: str, queue_name: str) -> None:
    """F1 and F2 (TTL 1 s) applied, the finisher died before F3, and nobody claimed
    until the record expired: the item still carries the outcome, so it never runs
    again, and the claimer that finishes it writes the record again (fresh TTL)."""
    with Queue(etcd_url, queue_name, lock_ttl=1, completed_ttl=1) as crashed:
        crashed.put("finish me once")
        claim = stalled_claim(crashed)
        commit(crashed, claim, COMPLETED, record=True)  # F1, F2 with ttl=1; then dead
        item_id, token = claim.id, claim._state.lock.token
        assert ttl_of(crashed, COMPLETED, item_id) == 1
        wait_until(lambda: node(crashed, COMPLETED, item_id) is None, BOUND,
                   message="the record to expire")
        left = crashed._protocol.read("work", item_id)
        assert left is not None and Item.decode(left.value).outcome == COMPLETED
        # Readers take the outcome from the item meanwhile.
        assert crashed.get(item_id).state == COMPLETED
        assert crashed.stats()["completed"] == 1 and crashed.stats()["pending"] == 0
        wait_until(lambda: node(crashed, "locks", item_id) is None, BOUND,
                   message="the dead finisher's lock to expire")
    with Queue(etcd_url, queue_name, completed_ttl=60) as survivor:
        assert survivor.claim(timeout=3) is None  # it finishes the item, hands nothing out
        wait_until(lambda: survivor._protocol.read("work", item_id) is None, BOUND,
                   message="the survivor to finish the item (F2, F3)")
        found = node(survivor, COMPLETED, item_id)
        assert found is not None and 55 <= found["ttl"] <= 60
        record = Record.decode(found["value"])
        assert (record.claim, record.result) == (token, "done")  # the dead claim's outcome
        assert survivor.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}


def test_a_claimer_whose_f2_read_back_finds_the_record_expired_writes_it_again(
        proxy: FaultProxy, etcd_url: str, queue_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A finisher committed (F1), recorded (F2, completed_ttl=3) and died before F3.
    Its lock expires; a claimer takes the item, finds "o" and finishes it: its F2 gets
    "already exists", and its read-back of the record is held until the record has
    expired (in the field: a race with the TTL).  No record: F2 is sent again, then
    F3 removes the item, instead of the item being taken for junk and skipped."""
    with Queue(etcd_url, queue_name, lock_ttl=1, completed_ttl=3) as crashed:
        crashed.put("finish me")
        dying = stalled_claim(crashed)
        commit(crashed, dying, COMPLETED, record=True)  # F1, F2 (ttl 3); then dead
        item_id = dying.id
        wait_until(lambda: node(crashed, "locks", item_id) is None, BOUND,
                   message="the dead finisher's lock to expire")
    record_read = re.compile(rb"^GET /v2/keys/\S+/completed/\d{20}", re.MULTILINE)
    with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name,
               lock_ttl=2) as claimer, Queue(etcd_url, queue_name) as look:
        proxy.hold("up", match=record_read)
        thread, outcome = in_background(lambda: claimer.claim(timeout=0))
        wait_until(lambda: record_read.search(proxy.held()), 5,
                   message="the claimer's F2 read-back held")
        wait_until(lambda: look._protocol.read(COMPLETED, item_id) is None, 8,
                   message="the record to expire")
        proxy.release()
        thread.join(20)
        assert outcome == {"returned": None}, outcome
        assert look._protocol.read("work", item_id) is None, (
            "the committed item is still in work/: "
            + "; ".join(r.getMessage() for r in caplog.records if "skipping" in r.getMessage()))
        found = node(look, COMPLETED, item_id)
        assert found is not None and Record.decode(found["value"]).result == "done"


def test_a_claimer_whose_f2_read_back_finds_item_and_record_purged_writes_nothing(
        proxy: FaultProxy, etcd_url: str, queue_name: str) -> None:
    """A finisher committed (F1), recorded (F2, kept until purged) and died before F3.
    A claimer finds "o" and finishes for it: its F2 gets "already exists", and its
    read-back of the record is held.  Meanwhile an operator's purge removes the
    committed item (its F3), then the record.  The read-back finds no record; the
    item is no longer at F1's index, so F2 is not sent again: the purged record
    does not come back (it did: "the item still carries it" was not checked)."""
    record_read = re.compile(rb"^GET /v2/keys/\S+/completed/\d{20}", re.MULTILINE)
    with Queue(etcd_url, queue_name, lock_ttl=1, completed_ttl=None) as crashed:
        crashed.put("purge me")
        item_id = commit_then_crash(crashed, COMPLETED, record=True)
        wait_until(lambda: node(crashed, "locks", item_id) is None, BOUND,
                   message="the dead finisher's lock to expire")
        with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name, lock_ttl=2,
                   completed_ttl=None) as claimer:
            proxy.hold("up", match=record_read)
            thread, outcome = in_background(lambda: claimer.claim(timeout=0))
            wait_until(lambda: record_read.search(proxy.held()), 5,
                       message="the claimer's F2 read-back held")
            assert crashed.purge(completed=True) == 1
            assert node(crashed, "work", item_id) is None
            assert node(crashed, COMPLETED, item_id) is None
            proxy.release()
            thread.join(20)
            assert outcome == {"returned": None}, outcome
        assert node(crashed, COMPLETED, item_id) is None, "the purged record came back"
        assert node(crashed, "work", item_id) is None
        assert crashed.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 0}


#: A producer's P1.
POST_WORK = re.compile(rb"^POST /v2/keys/\S+/work", re.MULTILINE)


@pytest.mark.parametrize("completed_ttl, may_have_expired", [(1, True), (3600, False)])
def test_a_lost_put_is_not_found_and_may_have_run_if_records_outlive_no_deadline(
        proxy: FaultProxy, queue_name: str, completed_ttl: int,
        may_have_expired: bool) -> None:
    """P1 unanswered until the deadline, and its token in no listing: Unavailable.  With
    records that live less than that deadline, the item may also have been stored,
    run and its record expired meanwhile: the message must not say it never ran."""
    with Queue(connect(proxy.url, timeout=0.5, deadline=2), queue_name,
               completed_ttl=completed_ttl) as queue:
        proxy.hold("up", match=POST_WORK)
        with pytest.raises(Unavailable, match="not found in the queue") as raised:
            queue.put("lost")
    assert "not in the queue now" not in str(raised.value)
    assert ("its record expired" in str(raised.value)) is may_have_expired, raised.value


# -- Q1: requeue keeps the dead letter's TTL --------------------------------------------

def test_a_cas_without_ttl_makes_a_key_permanent(etcd_url: str, queue_name: str) -> None:
    """The etcd v2 fact Q1's ttl rests on (etcd 3.5 and 3.4 alike)."""
    with Queue(etcd_url, queue_name) as queue:
        key = queue.layout.key(FAILED, "00000000000000000001")
        index = queue.etcd.put(key, "v1", ttl=60).written_index
        assert queue.etcd.get(key).node.get("ttl") is not None
        queue.etcd.put(key, "v2", prev_index=index)
        assert "ttl" not in queue.etcd.get(key).node
        queue.etcd.delete(key)


@pytest.mark.parametrize("failed_ttl, kept", [(600, TOMBSTONE_TTL),
                                              (2 * TOMBSTONE_TTL, 2 * TOMBSTONE_TTL)],
                         ids=["short-made-a-week", "longer-kept"])
def test_crash_after_q1_leaves_the_dead_letter_expiring_a_week_later_at_least(
        etcd_url: str, queue_name: str, failed_ttl: int, kept: int) -> None:
    """Q1 keeps the dead letter's TTL, but a week at least (a requeue dead after Q3
    leaves no tombstone: the marked dead letter must outlive a late F2 as one)."""
    with Queue(etcd_url, queue_name, max_attempts=1, failed_ttl=failed_ttl,
               lock_ttl=1) as queue:
        item_id = queue.put("dead")
        queue.claim().fail("no")
        protocol = queue._protocol
        run(protocol._lock_dead_letter(item_id), protocol.etcd)  # Q0
        run(protocol._requeue_token(item_id, None), protocol.etcd)     # Q1; then the requeue dies
        marked = node(queue, FAILED, item_id)
        assert marked is not None and Record.decode(marked["value"]).requeue_token
        assert kept - 10 <= marked.get("ttl", 0) <= kept
        new_id = queue.requeue(item_id)  # once the dead requeue's lock expired
        assert [info.id for info in queue.items("pending")] == [new_id]


@pytest.mark.parametrize("written_with, requeued_with", [(600, None), (None, 600)],
                         ids=["ttl-requeued-by-keep-forever", "forever-requeued-by-ttl"])
def test_q1_keeps_the_ttl_the_dead_letter_has_not_the_requeuers(
        etcd_url: str, queue_name: str, written_with: Optional[int],
        requeued_with: Optional[int]) -> None:
    """A requeue that dies after Q1 leaves the dead letter expiring if it did (at
    least a week later: TOMBSTONE_TTL), or kept if it was, whatever failed_ttl
    the requeuing Queue (e.g. `etcdq requeue`) has."""
    with Queue(etcd_url, queue_name, max_attempts=1, failed_ttl=written_with) as worker, \
            Queue(etcd_url, queue_name, failed_ttl=requeued_with, lock_ttl=1) as operator:
        item_id = worker.put("dead")
        worker.claim().fail("no")
        run(operator._protocol._lock_dead_letter(item_id), operator.etcd)  # Q0
        run(operator._protocol._requeue_token(item_id, None), operator.etcd)     # Q1; then it dies
        ttl = node(operator, FAILED, item_id).get("ttl")
        if written_with is None:
            assert ttl is None
        else:
            assert ttl is not None and TOMBSTONE_TTL - 10 <= ttl <= TOMBSTONE_TTL


def expiring_node(queue: Queue, kind: str, item_id: str) -> Optional[Dict[str, Any]]:
    """``kind/<id>``'s node once past its expiry and not yet swept (etcd reports an
    ``expiration`` and no ``ttl`` then); {"gone": True} once it is swept; else None."""
    try:
        found = queue.etcd.get(queue.layout.key(kind, item_id), quorum=True).node
    except EtcdqError:
        return {"gone": True}
    return found if "expiration" in found and "ttl" not in found else None


def test_q1_on_a_dead_letter_past_its_expiry_not_yet_swept_keeps_it_expiring(
        etcd_url: str, queue_name: str) -> None:
    """etcd removes an expired key up to 0.5 s after its expiry; meanwhile a GET still
    returns it, with its ``expiration`` but without a ``ttl``.  Q1 there must still
    write a TTL (TOMBSTONE_TTL: it has one): a CAS without one would make a dead
    letter written with failed_ttl=1 permanent, if the requeue then stopped."""
    with Queue(etcd_url, queue_name, max_attempts=1, failed_ttl=1, lock_ttl=1) as queue:
        p = queue._protocol
        for _ in range(20):
            item_id = queue.put("short-lived dead letter")
            claim = queue.claim(timeout=2)
            assert claim is not None and claim.id == item_id
            claim.fail("no")
            found = wait_until(lambda i=item_id: expiring_node(queue, FAILED, i), 5,
                               interval=0.005, message="the dead letter to expire")
            if found.get("gone"):
                continue  # swept before we saw it: try again
            try:
                run(p._requeue_token(item_id, None), p.etcd)  # Q1 (a requeue that then stops)
            except EtcdqError:
                continue  # swept between our read and Q1's
            break
        else:
            pytest.skip("never caught a dead letter between its expiry and its removal")
        ttl = node(queue, FAILED, item_id).get("ttl")
        assert ttl is not None and TOMBSTONE_TTL - 10 <= ttl <= TOMBSTONE_TTL


# -- the command line -------------------------------------------------------------------

FAIL_ODD = "import json, sys; sys.exit(json.load(sys.stdin)['n'] % 2)"


@pytest.mark.parametrize("completed, failed, expected", [
    ("30", "20.5", (30, 21)), ("none", "none", (None, None)), (None, None, (86400, None)),
], ids=["seconds", "none", "defaults"])
def test_work_writes_records_with_the_ttls_given(
        etcdq: Any, etcd_url: str, queue_name: str, completed: Optional[str],
        failed: Optional[str], expected: Any) -> None:
    options = [] if completed is None else ["--completed-ttl", completed, "--failed-ttl", failed]
    with Queue(etcd_url, queue_name) as queue:
        done, dead = queue.put_many([{"n": 0}, {"n": 1}])
        ran = etcdq("work", queue_name, "--until-empty", "--max-attempts", "1", *options,
                    "--", sys.executable, "-c", FAIL_ODD)
        assert ran.returncode == 1, ran.stderr  # an item failed (and was dead-lettered)
        got = (ttl_of(queue, COMPLETED, done), ttl_of(queue, FAILED, dead))
        for ttl, wanted in zip(got, expected):
            assert (ttl is None) if wanted is None else (wanted - 5 <= ttl <= wanted), got


@pytest.mark.parametrize("option, value, message", [
    ("--completed-ttl", "soon", "not a number or 'none'"),
    ("--failed-ttl", "0", "failed_ttl must be a number of seconds > 0"),
    ("--completed-ttl", "1e20", f"at most {MAX_TTL}"),
    ("--max-attempts", "0", "max_attempts >= 1"),
])
def test_work_refuses_bad_retention_options(etcdq: Any, queue_name: str, option: str,
                                            value: str, message: str) -> None:
    assert_user_error(etcdq("work", queue_name, option, value, "--", "true"), 2, message)
