"""A listing of work/ that shows a new item that may be delayed is applied with
a listing of locks/ taken after it, in one block (a full reconcile): an
older delays-only listing applied later strands no _unplanned item; a quiet
follower's round whose listing of locks/ fails still applies work/, so claims
go on; a full reconcile keeps live locks and the delays of items given back;
and a failed due listing warns once per CONFIRM while claims go on.

Interleavings are forced by wrapping ``protocol.list`` in one thread (a pause
after the reply, or a failure); no method of the view is changed.
"""
from __future__ import annotations

import pytest

import math
import threading
import time


from helpers import (claim_and_complete, claim_noting, in_background, locks_get, q_item,
                     record_calls, unplanned, wait_until)

from etcdq_v2 import Queue
from etcdq_v2.errors import Unavailable

#: Long enough that no once-per-lock-TTL listing of locks/ happens during a test.
LOCK_TTL = 30






def _lock_ids(queue: Queue) -> list:
    return [entry.id for entry in queue._protocol.list("locks")[1]]



def test_older_delays_listing_resets_next_delay_and_strands_unplanned_item(
        etcd_url: str, queue_name: str) -> None:
    """1. A lone consumer C (quiet view) put D with delay=1: its delay is planned
       (_delays[D]).
    2. D's delay lock expires.  Claimer thread B's check_locks finds it due
       and lists locks/ (delays only) at index L0; its reply is slow.
       Meanwhile another process puts X ("q", no lock: a requeue or an import,
       free in etcd at once), then P1..P3.
    3. Claimer thread A's relist_work lists work/ at W > L0 (X new, "q"), then
       locks/, which fails: work/ is applied with X _unplanned (taken at W),
       _next_delay = -inf, A raises.
    4. B's older reply (L0) is applied: X is not planned by it (W > L0), but
       _plan_delays sets _next_delay = min(_delays) = inf (D freed).  X stays
       taken and _unplanned; check_locks' "stale" test skips _unplanned items,
       and nothing is due: no listing of locks/ is ever made for X while the
       view has free items.
    5. C hands out D, P1, P2, P3 and only then (starved: the view watches and
       lists locks/) X, which was put first and was free in etcd throughout.
       With a steady inflow X waits indefinitely.  On ce43349 X is free in the
       view after A's listing: D, X, P1...

    Suggested fix: do not let _plan_delays lower-bound _next_delay past an
    _unplanned item: after a reconcile, _next_delay = -inf (or now) while
    _unplanned is not empty (e.g. in _plan_delays: ``if self._unplanned:
    self._next_delay = -math.inf``); or make the stale test count _unplanned
    items older than a CONFIRM."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        assert not view.watching_locks
        d_id = consumer.put({"d": 1}, delay=1)
        wait_until(lambda: d_id not in _lock_ids(producer), 5, message="D's delay lock gone")
        wait_until(lambda: view.state.next_delay <= time.monotonic(), 3, message="D due")

        original = view._protocol.list
        b_answered, b_resume = threading.Event(), threading.Event()

        def forced(kind, *args, **kwargs):
            name = threading.current_thread().name
            if kind == "locks" and name == "A":
                raise Unavailable("listing of locks/ lost")
            reply = original(kind, *args, **kwargs)
            if kind == "locks" and name == "B":
                b_answered.set()
                assert b_resume.wait(15)
            return reply

        view._protocol.list = forced  # type: ignore[method-assign]
        b_thread, b_outcome = in_background(view.check_locks, "B")
        try:
            assert b_answered.wait(5)
            x_id = q_item(producer)  # after L0: W > L0
            p_ids = [producer.put({"p": n}) for n in range(3)]
            a_thread, a_outcome = in_background(view.relist_work, "A")
            a_thread.join(5)
            assert not a_thread.is_alive()
            assert x_id in view.state.items
        finally:
            b_resume.set()
            b_thread.join(5)
        view._protocol.list = original  # type: ignore[method-assign]
        state = (dict(unplanned(view)), view.state.next_delay)
        got = []
        for _ in range(2):
            claim = consumer.claim(timeout=3)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
        assert got == [d_id, x_id], (
            f"the lone consumer handed out {got} (D={d_id}, X={x_id}, P={p_ids}): X, "
            f"free in etcd and put before P1, held; after B's older listing "
            f"_unplanned, _next_delay = {state}")




def test_quiet_follower_round_fails_while_locks_listings_fail(
        etcd_url: str, queue_name: str, proxy) -> None:
    """1. A lone pipeline stage S (through the fault proxy, request timeout 1 s)
       has a quiet view.  Another process puts X ("q", no lock: requeued or
       imported, free in etcd); S puts Y (its own follow-up).
    2. Listings of locks/ start to fail (held: a locks/ grown large with a lock
       TTL's worth of finished items' locks, a slow member); every other
       request goes through.
    3. S claims: Y is held back (newer than the view knows) -> catch_up ->
       relist: a new quiet follower lists work/ (X new, "q"), then locks/,
       which fails.  75ba109 applies neither (the round "lists both again"):
       _ready stays False, relist()'s wait_ready raises Unavailable after the
       deadline, and every later claim waits on the same unready view and
       raises again.  X and Y, free in etcd, are never handed out while
       listings of locks/ fail.  On ce43349 the quiet follower applied work/
       first (_ready), then listed locks/ for X's delay: S claims X, then Y.
       The same holds for a relist(locks=False) from behind() of a watching
       view going quiet, and for the candidates() backlog switch.

    This is tests/test_view_q_items.py's every claim failing while listings
    of locks/ fail, moved from check_locks into the follower's round.

    Suggested fix: in a quiet follower's round, if the listing of locks/ made
    only for new "q" items fails, apply work/ with them _unplanned (as
    relist_work's failure path does), set _ready, and leave the retry to
    check_locks (_next_delay = -inf), rather than failing the round."""
    from etcdq_v2.transport import connect
    transport = connect(proxy.url, timeout=1.0)
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(transport, queue_name, lock_ttl=LOCK_TTL) as stage:
        view = stage._ensure_view()
        assert not view.watching_locks
        x_id = q_item(producer)
        y_id = stage.put({"y": 1})
        proxy.hold(match=locks_get(queue_name))
        got, failed = [], []
        try:
            started = time.monotonic()
            while time.monotonic() - started < 8 and len(got) < 2:
                claim_noting(stage, got, failed, 0)
        finally:
            proxy.pass_through()
        assert got == [x_id, y_id], (
            f"handed out {got} in 8 s while only listings of locks/ failed "
            f"({len(failed)} claims raised: {failed[:1]}); X={x_id}, Y={y_id} free in etcd")



def test_full_reconcile_keeps_live_locks_and_given_back_delays(
        etcd_url: str, queue_name: str) -> None:
    """A quiet view's relist_work shows a new "q" item X, so it lists
    locks/ and applies a full reconcile.  B0, held by another consumer (taken
    here on a miss), stays taken and is never tried while held; B1, given back
    by this process with release(delay=2), is not offered before its delay
    lock goes and is handed out soon after; B2, taken here on a miss and then
    released by the other consumer (its lock deleted, unheard by this quiet
    view), is freed by the full reconcile; X is free.  Each item is handed
    out once."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        b_ids = producer.put_many([{"b": n} for n in range(6)])
        view = consumer._ensure_view()
        held = other.claim(timeout=0)
        assert held is not None and held.id == b_ids[0]
        mine = consumer.claim(timeout=0)  # misses B0 (taken), then claims "B1"
        assert mine is not None and mine.id != b_ids[0] and b_ids[0] in view.state.locks
        # Which one depends on the widened window's random walk (eightfold
        # since 12fb638: any of B1-B5); "B2" is the next of the others.
        b1 = mine.id
        b2 = next(i for i in b_ids[1:] if i != b1)
        entry = other._protocol.read("work", b2)
        state = other._protocol.claim(b2, entry.version)
        assert state is not None
        lock_index = {e.id: e.index for e in producer._protocol.list("locks")[1]}[b2]
        view.taken(b2)  # as _lost_race leaves a miss on B2
        view.locked_at(b2, lock_index)
        assert b2 in view.state.locks
        other._protocol.release(state)
        wait_until(lambda: b2 not in _lock_ids(producer), 3, message="B2's lock gone")
        released_at = time.monotonic()
        mine.release(delay=2)
        x_id = q_item(producer)
        view.relist_work()
        assert not unplanned(view) and b_ids[0] in view.state.locks and b1 in view.state.locks
        assert view.state.is_free(b2) and view.state.is_free(x_id)
        tried = record_calls(consumer._protocol, "claim")
        got = {}
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and len(got) < len(b_ids):
            claim = consumer.claim(timeout=0.5)
            if claim is not None:
                assert claim.id not in got
                got[claim.id] = time.monotonic() - released_at
                claim.complete()
        held.complete()
        assert b_ids[0] not in tried
        assert set(got) == set(b_ids[1:]) | {x_id}, (sorted(got), b_ids, x_id)
        assert 1.5 <= got[b1] <= 4.5, got


@pytest.mark.alone  # timing: a busy machine stretches its fault's window past its bounds
def test_failed_due_listing_warns_once_per_confirm_and_claims_go_on(
        etcd_url: str, queue_name: str, proxy, caplog) -> None:
    """relist_work's listing of locks/ for a new "q" X fails (X
    _unplanned, _next_delay = -inf, the claim raises); while listings of
    locks/ keep failing, later claims hand out B1.. (the due listing's failure
    is logged and retried CONFIRM later, not raised), the warning is logged
    about once per CONFIRM, not per claim; once listings work X is handed out
    and _next_delay is no longer -inf."""
    import logging
    from etcdq_v2.transport import connect
    transport = connect(proxy.url, timeout=0.5)
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(transport, queue_name, lock_ttl=LOCK_TTL) as consumer:
        b_ids = producer.put_many([{"b": n} for n in range(60)])
        view = consumer._ensure_view()
        held = other.claim(timeout=0)
        assert held is not None and held.id == b_ids[0]
        x_id = q_item(producer)
        proxy.hold(match=locks_get(queue_name))
        caplog.set_level(logging.WARNING, logger="etcdq_v2.view")
        got = []
        try:
            # miss on B0 -> relist_work -> locks/ lost (the claim goes on)
            first = claim_and_complete(consumer)
            if first is not None:
                got.append(first)
            assert x_id in unplanned(view) and view.state.next_delay == -math.inf
            started = time.monotonic()
            while time.monotonic() - started < 4:
                claim = consumer.claim(timeout=0)
                if claim is not None:
                    got.append(claim.id)
                    claim.complete()
                time.sleep(0.02)
            elapsed = time.monotonic() - started
        finally:
            proxy.pass_through()
        warnings = [r for r in caplog.records if "for delay locks" in r.getMessage()]
        assert len(got) >= 10 and x_id not in got, got
        assert 1 <= len(warnings) <= elapsed / 1.0 + 2, len(warnings)
        after = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and x_id not in after:
            claim = consumer.claim(timeout=0.2)
            if claim is not None:
                after.append(claim.id)
                claim.complete()
        assert x_id in after and len(set(got + after)) == len(got + after), after
        assert after.index(x_id) <= len(b_ids) - 1 - len(got), (after.index(x_id), len(got))
        held.complete()
        assert view.state.next_delay > -math.inf and not unplanned(view)
