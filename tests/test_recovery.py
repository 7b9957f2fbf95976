"""Crashes between the protocol's writes: nothing lost, nothing finished runs again.

Each test stops the protocol at one point of docs/protocol.md's crash
analysis (a SIGKILLed process, or the protocol's own steps called up to the
crash point) and checks what the next consumer sees.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from etcdq_v2 import Queue
from etcdq_v2.codec import Record
from etcdq_v2.protocol import COMPLETED, FAILED, Gone, Taken

from crashes import commit_then_crash, left_lock, record_like_0_1_0_then_crash
from helpers import wait_until

CLAIM_AND_HANG = textwrap.dedent("""
    import sys, time
    from etcdq_v2 import Queue
    q = Queue(sys.argv[1], sys.argv[2], lock_ttl=1)
    claim = q.claim(timeout=10)
    print(claim.id, claim.attempt, flush=True)
    time.sleep(600)
""")


def claim_in_a_process_and_kill_it(etcd_url: str, queue_name: str) -> str:
    worker = subprocess.Popen([sys.executable, "-c", CLAIM_AND_HANG, etcd_url, queue_name],
                              stdout=subprocess.PIPE, text=True)
    try:
        item_id, attempt = worker.stdout.readline().split()
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        worker.stdout.close()
    return item_id


def test_item_of_a_sigkilled_worker_is_claimed_again_as_attempt_2(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        item_id = queue.put({"job": 1})
        assert claim_in_a_process_and_kill_it(etcd_url, queue_name) == item_id
        assert queue.stats()["running"] == 1
        claim = queue.claim(timeout=10)  # woken by the lock's expire event
        assert (claim.id, claim.attempt, claim.payload) == (item_id, 2, {"job": 1})
        claim.complete()
        assert queue.get(item_id).attempts == 2


def test_max_attempts_dead_letters_an_item_that_kills_its_workers(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=2) as queue:
        item_id = queue.put("poison")
        for _ in range(2):
            assert claim_in_a_process_and_kill_it(etcd_url, queue_name) == item_id
            wait_until(lambda: queue.stats()["running"] == 0, 10, message="lock expiry")
        assert queue.claim(timeout=0.5) is None
        dead = queue.get(item_id)
        assert (dead.state, dead.attempts) == ("failed", 2)
        assert "abandoned" in dead.reason
        assert queue.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 1}


@pytest.mark.parametrize("record", [False, True], ids=["after-F1", "after-F2"])
@pytest.mark.parametrize("kind", [COMPLETED, FAILED])
def test_crash_after_the_commit_never_runs_the_item_again(
        etcd_url: str, queue_name: str, kind: str, record: bool) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed, \
            Queue(etcd_url, queue_name, lock_ttl=30) as survivor:
        crashed.put("finish me once")
        item_id = commit_then_crash(crashed, kind, record=record)
        assert survivor.get(item_id).state == kind  # the commit is the truth at once
        assert survivor.claim(timeout=4) is None  # finds the commit, finishes it
        wait_until(lambda: survivor._protocol.read("work", item_id) is None, 5,
                   message="the survivor to finish the crashed item")
        info = survivor.get(item_id)
        assert (info.state, info.result) == (kind, "done")
        assert survivor.stats() == {"pending": 0, "running": 0,
                                    "completed": int(kind == COMPLETED),
                                    "failed": int(kind == FAILED)}


@pytest.mark.parametrize("record", [False, True], ids=["after-F1", "after-F2"])
def test_purge_after_a_crashed_commit_never_runs_the_item_again(
        etcd_url: str, queue_name: str, record: bool) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed, \
            Queue(etcd_url, queue_name, lock_ttl=30) as survivor:
        crashed.put("finish me once")
        item_id = commit_then_crash(crashed, COMPLETED, record=record)
        survivor.purge(completed=True)
        assert survivor.claim(timeout=3) is None
        assert survivor._protocol.read("work", item_id) is None or \
            survivor.get(item_id).state == COMPLETED


def test_purge_of_a_record_written_by_0_1_0_removes_its_item_first(
        etcd_url: str, queue_name: str) -> None:
    """0.1.0 committed with the record (F2) alone; a crash left its item in work/."""
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed, \
            Queue(etcd_url, queue_name, lock_ttl=30) as survivor:
        crashed.put("finish me once")
        item_id = record_like_0_1_0_then_crash(crashed, COMPLETED)
        assert survivor.purge(completed=True) == 1
        assert survivor.claim(timeout=3) is None
        assert survivor._protocol.read("work", item_id) is None


@pytest.mark.parametrize("kind", [COMPLETED, FAILED])
def test_crash_after_a_0_1_0_record_before_removing_the_item(
        etcd_url: str, queue_name: str, kind: str) -> None:
    """0.1.0's F2 applied (its commit: a record, the item unchanged), F3 and F4
    never did: the item must not run again."""
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed, \
            Queue(etcd_url, queue_name, lock_ttl=30) as survivor:
        crashed.put("finish me once")
        item_id = record_like_0_1_0_then_crash(crashed, kind)
        # ... and the process dies here.  Its lock expires; the item is still in work/.
        assert survivor.claim(timeout=4) is None
        wait_until(lambda: survivor._protocol.read("work", item_id) is None, 5,
                   message="the survivor to finish the crashed F3")
        assert survivor.get(item_id).state == kind
        assert survivor.stats()["pending"] == 0


def test_crash_after_removing_the_item_leaves_an_orphan_lock_that_is_ignored(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as queue:
        item_id, other = queue.put_many(["gone", "next"])
        claim = queue.claim()
        queue._heartbeat.discard(claim)
        protocol, state = queue._protocol, claim._state
        protocol.confirm(state)
        protocol.etcd.put(protocol.layout.key(COMPLETED, item_id),
                          Record("gone", state.lock.token, queue.node_id, 1, 0, 0).encode(),
                          prev_exist=False)
        protocol.etcd.delete(protocol.layout.key("work", item_id), prev_index=state.index)
        # crash before F4: the lock stays until its TTL
        assert queue.stats() == {"pending": 1, "running": 0, "completed": 1, "failed": 0}
        assert queue.claim().id == other


@pytest.mark.parametrize("lock_ttl", [30, 61], ids=["lock-lingers", "F4-sent"])
def test_a_stale_listing_never_runs_a_completed_item(etcd_url: str, queue_name: str,
                                                     lock_ttl: int) -> None:
    """With lock_ttl <= LINGER_MAX the finisher's lock lingers: the stale claim fails
    at C1 ("already exists"), one failed write and nothing else.  With F4 sent, C1
    applies, C2 finds the item gone, and the lock is dropped."""
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as first, \
            Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as second:
        item_id = first.put("once")
        index, entries = second._protocol.list("work")
        stale = entries[0]  # second's view of work/ before the item was finished
        first.claim().complete("done")
        lingering = second._protocol.read("locks", item_id)
        second.etcd.requests.clear()
        with pytest.raises(Taken if lock_ttl <= 60 else Gone):
            second._protocol.claim(stale.id, stale.version)
        if lock_ttl <= 60:  # C1 only, refused
            assert lingering is not None and dict(second.etcd.requests) == {"PUT": 1}
            assert second._protocol.read("locks", item_id) == lingering  # first's, untouched
        else:  # C1, C2 ("not found"), and the lock dropped
            assert lingering is None
            assert dict(second.etcd.requests) == {"PUT": 2, "DELETE": 1}
            assert second._protocol.read("locks", item_id) is None
        assert first.get(item_id).result == "done"


COMPLETE_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    from etcdq_v2 import Queue
    q = Queue(sys.argv[1], sys.argv[2], lock_ttl=2)
    claim = q.claim(timeout=10)
    claim.complete("done")  # F1, F2, F3; no F4 (lock_ttl <= LINGER_MAX)
    print(claim.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_finisher_killed_after_f3_leaves_its_lock_to_expire_and_nothing_runs_again(
        etcd_url: str, queue_name: str) -> None:
    """issue 14: F4 is not sent, so a finisher SIGKILLed right after complete() left
    its lock, as the crash table's "F3 (not F4)" row always did.  A consumer that
    watches the whole queue meanwhile, and after the lock's expire event, never
    gets the item; stats say completed throughout."""
    done = {"pending": 0, "running": 0, "completed": 1, "failed": 0}
    with Queue(etcd_url, queue_name, lock_ttl=2) as watcher:
        assert watcher.claim() is None  # nothing yet: it watches the whole directory
        item_id = watcher.put("once")
        finisher = subprocess.run([sys.executable, "-c", COMPLETE_AND_DIE, etcd_url,
                                   queue_name], stdout=subprocess.PIPE, text=True, timeout=60)
        assert finisher.returncode == -signal.SIGKILL and finisher.stdout.split() == [item_id]
        assert left_lock(watcher, COMPLETED, item_id) is not None  # F4 was not sent

        def still_done_and_lock_gone() -> bool:
            assert watcher.stats() == done and watcher.items("running") == []
            assert watcher.claim() is None
            return left_lock(watcher, COMPLETED, item_id) is None
        wait_until(still_done_and_lock_gone, 10, message="the finisher's lock to expire")
        assert watcher.claim(timeout=1) is None  # its expire event brought nothing back
        assert watcher.stats() == done and watcher.get(item_id).attempts == 1
        assert watcher._view is not None and item_id not in watcher._view.state.items
        next_id = watcher.put("next")
        claim = watcher.claim(timeout=5)
        assert claim is not None and claim.id == next_id
        claim.complete()


def test_a_stale_listing_of_a_reclaimed_item_rereads_it(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as queue:
        queue.put("again")
        stale = queue._protocol.list("work")[1][0]
        queue.claim().release()  # C2 and R0 changed its index
        state = queue._protocol.claim(stale.id, stale.version)
        assert state is not None and state.item.attempts == 1 and state.index > stale.index


def test_a_put_token_search_finds_an_item_dead_lettered_and_requeued_since(
        etcd_url: str, queue_name: str) -> None:
    """A put whose reply was lost searches for its token wherever the item is now.
    Dead-lettered and requeued before the search, the item's put token survives only
    in the dead letter's tombstone: the search finds it there (the put is stored),
    rather than reporting it missing, after which putting it again would store it twice."""
    with Queue(etcd_url, queue_name, max_attempts=1) as queue:
        item_id = queue.put("x")
        token = queue._protocol.read("work", item_id)
        assert token is not None
        put_token = json.loads(token.value)["t"]
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        claim.fail("no")                      # max_attempts 1: a dead letter
        queue.requeue(item_id)                # failed/<id> becomes a tombstone
        assert queue._protocol.find_put(put_token) == (item_id, None)
