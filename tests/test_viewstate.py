"""The consumer's view as a state machine (etcdq_v2/viewstate.py), fed events
with no etcd and no threads: its transitions (docs/protocol.md, "Events and
transitions"), its deadlines (one table), the generation rule, and a
Hypothesis run over random event sequences that checks the view's own
invariants after each event:

- no item is offered while taken (an attempt of this process) or locked;
- no item stays taken after a sign that its lock went, newer than the
  attempt's index;
- every (index, value) held for an item comes from one version;
- the free list is sorted, and holds every free item (items - locks - taken).
"""
from __future__ import annotations

import json
import math
import random
from typing import Dict, List, Optional, Set, Tuple

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from etcdq_v2.codec import Item, Lock
from etcdq_v2.keys import Layout
from etcdq_v2.versions import Entry, Version
from etcdq_v2.viewstate import (BACKLOG, CONFIRM, DEADLINES, FEW_LOCKS, ROUND, Round,
                                ViewState)

LAYOUT = Layout("/etcdq", "q")
LOCK_TTL = 30.0
ORPHAN_DELAY = 15.0


def item_id(index: int) -> str:
    return f"{index:020d}"


def value(token: str, *, claim: Optional[str] = None, requeued: bool = False) -> str:
    return Item(payload={"n": token}, token=token, claim=claim, requeued=requeued,
                created=0.0).encode()


def lock_value(delay: bool = False) -> str:
    return Lock(node_id="n", token="c" * 24, delay=delay).encode()


def event(action: str, kind: str, ident: str, index: int, raw: Optional[str] = None) -> bytes:
    node: Dict[str, object] = {"key": LAYOUT.key(kind, ident)}
    if raw is not None:
        node["value"] = raw
    node["modifiedIndex"] = index
    node["createdIndex"] = index
    return json.dumps({"action": action, "node": node}, separators=(",", ":")).encode()


def ready_state(items: List[Tuple[str, int, str]], *, watching: bool = False,
                now: float = 0.0) -> Tuple[ViewState, Round]:
    """A state whose first round listed ``items`` (id, index, value) and an empty locks/."""
    state = ViewState(LAYOUT, lock_ttl=LOCK_TTL, orphan_delay=ORPHAN_DELAY)
    round_ = state.new_round(watching=watching, list_locks=True)
    assert round_ is not None
    work = [Entry(i, at, raw) for i, at, raw in sorted(items)]  # listed in key order
    index = max([at for _, at, _ in items], default=1)
    plan = state.plan_round(round_, work)
    assert state.apply_round(round_, (index, work), plan, (index, []), [], now, 0.0)
    return state, round_


def free_ids(state: ViewState) -> List[str]:
    return [found[0] for found in state.candidates(10 ** 6)[0]]


# -- transitions ----------------------------------------------------------------------
def test_a_listing_makes_the_view_ready_and_offers_its_items_in_put_order() -> None:
    state, _ = ready_state([(item_id(3), 3, value("b")), (item_id(2), 2, value("a"))])
    assert state.ready and state.known == 3
    assert free_ids(state) == [item_id(2), item_id(3)]
    assert state.version_of(item_id(2)) == Version(2, value("a"))


def test_a_lock_event_takes_an_item_and_its_removal_frees_it() -> None:
    x = item_id(2)
    state, round_ = ready_state([(x, 2, value("a"))], watching=True)
    floors = {"work": 2, "locks": 2}
    state.apply_block(round_, event("create", "locks", x, 3, lock_value()), floors, 0.0)
    assert x in state.locks and free_ids(state) == []
    state.apply_block(round_, event("expire", "locks", x, 4), floors, 0.0)
    assert x not in state.locks and free_ids(state) == [x]


def test_events_of_a_replaced_round_change_nothing() -> None:
    x = item_id(2)
    state, old = ready_state([(x, 2, value("a"))], watching=True)
    new = state.new_round(watching=True)
    assert new is not None and new.generation == old.generation + 1
    before = state.version
    state.apply_block(old, event("create", "locks", x, 3, lock_value()), {"work": 0, "locks": 0},
                      0.0)
    assert x not in state.locks and state.version == before
    assert not state.round_failed(old, RuntimeError("late")) and state.error is None


def test_a_listing_of_a_replaced_round_is_not_applied() -> None:
    state, old = ready_state([], watching=True)
    state.new_round(watching=True)
    work = [Entry(item_id(5), 5, value("x"))]
    assert not state.apply_round(old, (5, work), state.plan_round(old, work), None, [], 0.0, 0.0)
    assert state.items == {}


def test_a_listing_of_locks_decided_before_a_new_round_or_listing_is_dropped() -> None:
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("a"))], watching=True)
    decided, relists = state.generation, state.relists
    stale = (3, [Entry(x, 3, lock_value())])  # x locked when it was listed
    state.new_round(watching=True)
    state.apply_locks(decided, None, stale, full=True, history=state.history, now=0.0,
                      wall=0.0)
    assert x not in state.locks
    state.apply_locks(state.generation, relists - 1, stale, full=True, history=state.history,
                      now=0.0, wall=0.0)
    assert x not in state.locks  # a confirm check decided before the view listed again
    state.apply_locks(state.generation, None, stale, full=True, history=state.history,
                      now=0.0, wall=0.0)
    assert state.locks == {x: 3}


def test_a_gone_sign_during_an_attempt_frees_the_item_when_the_attempt_ends() -> None:
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("a"))])
    found, _ = state.pick(1, random.Random(0))
    assert found is not None and found[0] == x and not state.is_free(x)
    state.unlocked(x, 9)  # a listing of locks/ at 9 without the lock, while we try
    state.locked_at(x, 7)  # the lock that beat us existed at 7: older than the sign
    assert state.is_free(x) and x not in state.locks


def test_an_attempt_lost_to_a_newer_lock_keeps_the_item_taken() -> None:
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("a"))])
    state.pick(1, random.Random(0))
    state.unlocked(x, 5)
    state.locked_at(x, 7)
    assert not state.is_free(x) and state.locks[x] == 7


def test_a_refused_create_at_the_index_of_the_gone_sign_wins_over_it() -> None:
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("a"))])
    state.pick(1, random.Random(0))
    state.unlocked(x, 7)
    state.locked_at(x, 7, refused=True)
    assert state.locks.get(x) == 7
    state.unlocked(x, 7)  # the same sign again is older news now... at the same index
    assert x not in state.locks


def test_a_claim_token_read_off_work_is_a_lock_sign_at_that_version() -> None:
    x = item_id(2)
    state, round_ = ready_state([(x, 2, value("a"))])
    work = [Entry(x, 6, value("a", claim="k" * 24))]
    assert state.apply_round(round_, (6, work), state.plan_round(round_, work), None, [], 1.0,
                             0.0)
    assert state.locks == {x: 6} and free_ids(state) == []


def test_an_own_put_past_the_known_index_is_held_back_for_a_catch_up() -> None:
    state, _ = ready_state([(item_id(2), 2, value("a"))])
    own = item_id(9)
    state.added(own, Version(9, value("own")))
    assert state.pick(1, random.Random(0))[0] is not None  # the head, item 2
    assert state.candidates(5)[0] == [] and state.behind == 9
    state.offer_own(9)
    assert [found[0] for found in state.candidates(5)[0]] == [own]


def recorded(removal: str, now: float) -> Tuple[ViewState, str]:
    """A watching view that saw item X locked, its outcome record, then its lock's ``removal``."""
    x = item_id(2)
    state, round_ = ready_state([(x, 2, value("a"))], watching=True)
    floors = {"work": 2, "locks": 2}
    state.apply_block(round_, event("create", "locks", x, 3, lock_value()), floors, now)
    state.apply_block(round_, event("create", "completed", x, 4, "{}"), floors, now)
    assert x in state.recorded and free_ids(state) == []
    state.apply_block(round_, event(removal, "locks", x, 5), floors, now)
    return state, x


def test_a_record_then_its_lock_s_expiry_offers_the_item_to_finish_it() -> None:
    state, x = recorded("expire", 0.0)
    assert free_ids(state) == [x]


def test_a_record_whose_lock_was_deleted_is_an_orphan_offered_once_due() -> None:
    state, x = recorded("delete", 10.0)
    assert state.orphans == {x: 10.0 + ORPHAN_DELAY} and free_ids(state) == []
    assert state.until_due(11.0, None) == ORPHAN_DELAY - 1.0 + 0.01
    state.tick(10.0 + ORPHAN_DELAY - 0.1)
    assert free_ids(state) == []
    state.tick(10.0 + ORPHAN_DELAY)
    assert free_ids(state) == [x]


def test_a_compare_and_swap_event_keeps_the_index_and_drops_the_value() -> None:
    x = item_id(2)
    state, round_ = ready_state([(x, 2, value("a"))], watching=True)
    state.apply_block(round_, event("compareAndSwap", "work", x, 8, value("a", claim="k" * 24)),
                      {"work": 2, "locks": 2}, 0.0)
    assert state.items[x] == (8, None)


def test_a_watching_view_with_a_backlog_asks_to_go_quiet() -> None:
    items = [(item_id(i), i, value(str(i))) for i in range(2, 2 + BACKLOG)]
    state, _ = ready_state(items, watching=True)
    _, switch = state.candidates(1)
    assert switch is not None and not switch.watching
    quiet, _ = ready_state(items)
    assert quiet.candidates(1)[1] is None


def test_a_round_that_starts_watching_reads_few_old_signs_and_lists_many() -> None:
    ids = [item_id(i) for i in range(2, 2 + FEW_LOCKS + 1)]
    state, _ = ready_state([(i, int(i), value(i)) for i in ids])
    for ident in ids:
        state.locked(ident, 2)
    work = [Entry(i, int(i), value(i)) for i in ids]
    round_ = state.new_round(watching=True)
    assert round_ is not None
    assert state.plan_round(round_, work).list_locks  # FEW_LOCKS + 1 old signs
    state.unlocked(ids[0], 20)
    plan = state.plan_round(round_, work)
    assert not plan.list_locks and sorted(plan.read) == ids[1:]


def test_new_delayed_items_list_locks_with_the_round() -> None:
    state, _ = ready_state([])
    round_ = state.new_round(watching=False)
    assert round_ is not None
    delayed = Entry(item_id(4), 4, value("d", requeued=True))
    plan = state.plan_round(round_, [delayed])
    assert plan.delayed == {delayed.id} and plan.list_locks and plan.may_fail


def test_a_stale_or_behind_view_lists_by_its_mode() -> None:
    quiet, _ = ready_state([])
    assert quiet.relist_how() == "list work" and quiet.catch_up_how() == "list work"
    watching, round_ = ready_state([], watching=True)
    assert watching.relist_how() == "relist" and watching.catch_up_how() == "relist"
    watching.work_unlisted_by_round(round_)  # its round's listing of work/ failed
    assert watching.catch_up_how() == "offer own"


# -- deadlines -------------------------------------------------------------------------
def test_every_deadline_is_in_the_one_table_and_none_is_due_at_first() -> None:
    state, _ = ready_state([])
    assert set(DEADLINES) >= {"orphan due", "full listing", "confirm check", "delay due",
                              "misses' relist", "catch-up relist", "round end"}
    assert state.next_deadline() == math.inf and state.tick(1e9) is None


def test_a_quiet_view_with_locks_lists_in_full_once_per_lock_ttl() -> None:
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("a"))], now=100.0)
    state.locked(x, 3)
    assert state.next_deadline() == 100.0 + LOCK_TTL
    assert state.tick(100.0 + LOCK_TTL - 0.1) is None
    assert state.tick(100.0 + LOCK_TTL) == "full"


def test_a_due_delay_lock_lists_locks_and_a_failure_retries_a_confirm_later() -> None:
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("a"))])
    state.pick(1, random.Random(0))
    state.locked_at(x, 3)
    state.returned(x, 5, 4, now=10.0)
    assert state.next_delay == 15.0
    state.locks_listed = 10.0  # the full listing is not due
    assert state.tick(15.0) == "delays"
    state.delays_unlisted(15.0)
    assert state.tick(15.0) is None and state.tick(15.0 + CONFIRM) == "delays"


def test_a_watching_view_checks_old_signs_a_confirm_after_its_listing() -> None:
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("a"))])
    state.locked(x, 2)
    round_ = state.new_round(watching=True)
    assert round_ is not None
    work = [Entry(x, 2, value("a"))]
    plan = state.plan_round(round_, work)
    state.apply_round(round_, (5, work), plan, None, [(x, 6, Entry(x, 2, lock_value()))],
                      50.0, 0.0)
    assert state.confirm_at == math.inf  # the read confirmed it: no check
    state.pick(1, random.Random(0))
    state.unlocked(x, 7)
    state.locked_at(x, 4)  # a lost race at 4, before the listing at 5: unheard if gone
    assert x not in state.locks  # the gone sign at 7 is newer: free
    state.pick(1, random.Random(0))
    state.locked_at(x, 8)  # after the listing: its end comes as an event
    assert state.confirm_at == math.inf
    state.locked(x, 9)


def test_a_failed_relist_backs_off_doubling_up_to_a_lock_ttl() -> None:
    state, _ = ready_state([])
    steps = []
    for _ in range(8):
        relist = state.start_relist(0.0 if not steps else state.relist_after)
        assert relist is not None
        steps.append(state.work_unlisted(relist, state.work_failed_at if steps else 0.0))
    assert steps[:3] == [CONFIRM, 2 * CONFIRM, 4 * CONFIRM] and steps[-1] == LOCK_TTL
    assert state.start_relist(state.relist_after - 0.1) is None
    assert state.start_relist(state.work_failed_at + CONFIRM, catching_up=True) is not None


def test_a_watching_round_ends_a_round_after_its_listing() -> None:
    state, round_ = ready_state([], watching=True, now=10.0)
    assert not state.round_over(round_, 10.0 + ROUND - 0.1)
    assert state.round_over(round_, 10.0 + ROUND)
    assert state.stream_idle(round_, 10.0 + ROUND - 5, 60.0) == 5.0


# -- invariants over random event sequences ----------------------------------------------------
class _Etcd:
    """What etcd holds, as far as the view may learn it: items and their
    versions, locks, one index."""

    def __init__(self) -> None:
        self.index = 1
        self.items: Dict[str, Tuple[int, str]] = {}
        self.locks: Dict[str, int] = {}
        #: Every version ever written: id -> index -> value (None for a CAS whose value the view drops).
        self.versions: Dict[str, Dict[int, str]] = {}

    def write(self) -> int:
        self.index += 1
        return self.index


class ViewMachine(RuleBasedStateMachine):
    """Random (state, event) sequences: etcd's writes reach the view as events
    (watching) or listings, interleaved with claims, own puts and time."""

    def __init__(self) -> None:
        super().__init__()
        self.etcd = _Etcd()
        self.now = 0.0
        self.rng = random.Random(0)
        self.state, self.round = ready_state([])
        self.floors = {"work": 1, "locks": 1}
        #: Our attempts under way: id -> the etcd index at which it began.
        self.attempts: Dict[str, int] = {}
        #: Per item: the newest lock sign and the newest gone sign the view was fed.
        self.signs: Dict[str, int] = {}
        self.gone_signs: Dict[str, int] = {}
        #: Claim tokens read off work/: id -> indexes.  Hints, not sightings of a
        #: lock (docs/protocol.md, "Claims read off work/"): such an item is
        #: freed by a later listing of locks/ or confirm check, not at once.
        self.hints: Dict[str, Set[int]] = {}
        #: Our claims that hold their lock: id -> its index.
        self.ours: Dict[str, int] = {}

    # -- etcd's writes, by others ----------------------------------------------------
    def _deliver(self, block: bytes) -> None:
        if self.round.watching:
            self.state.apply_block(self.round, block, self.floors, self.now)

    @rule(delayed=st.booleans())
    def put(self, delayed: bool) -> None:
        at = self.etcd.write()
        ident, raw = item_id(at), value(f"p{at}", requeued=delayed)
        self.etcd.items[ident] = (at, raw)
        self.etcd.versions.setdefault(ident, {})[at] = raw
        self._deliver(event("create", "work", ident, at, raw))

    @precondition(lambda self: self.etcd.items)
    @rule(data=st.data())
    def lock_taken(self, data: st.DataObject) -> None:
        self._lock(data.draw(st.sampled_from(sorted(self.etcd.items))))

    def _lock(self, ident: str) -> None:
        """Another consumer's C1 on the item, unless it is locked."""
        if ident in self.etcd.locks:
            return
        at = self.etcd.write()
        self.etcd.locks[ident] = at
        if self.round.watching:
            self.signs[ident] = max(self.signs.get(ident, 0), at)
        self._deliver(event("create", "locks", ident, at, lock_value()))

    @precondition(lambda self: self.etcd.locks)
    @rule(data=st.data(), expired=st.booleans())
    def lock_gone(self, data: st.DataObject, expired: bool) -> None:
        ident = data.draw(st.sampled_from(sorted(self.etcd.locks)))
        del self.etcd.locks[ident]
        ours = self.ours.pop(ident, None)  # ours too: expired (we stalled), or deleted by a tool
        at = self.etcd.write()
        if self.round.watching:
            self.gone_signs[ident] = max(self.gone_signs.get(ident, 0), at)
        self._deliver(event("expire" if expired else "delete", "locks", ident, at))
        if ours is not None:  # the claim is lost: its heartbeat drops it
            self.state.disowned(ident, self.now)

    @precondition(lambda self: self.etcd.items)
    @rule(data=st.data())
    def claimed_elsewhere(self, data: st.DataObject) -> None:
        """Another consumer's C1 and C2: a CAS on the item carrying its claim token."""
        ident = data.draw(st.sampled_from(sorted(self.etcd.items)))
        if ident in self.ours:
            return  # our lock: no C1 of another succeeds
        self._lock(ident)
        at = self.etcd.write()
        raw = value(f"c{at}", claim="k" * 24)
        self.etcd.items[ident] = (at, raw)
        self.etcd.versions[ident][at] = raw
        self._deliver(event("compareAndSwap", "work", ident, at, raw))

    @precondition(lambda self: self.etcd.items)
    @rule(data=st.data())
    def finished_elsewhere(self, data: st.DataObject) -> None:
        """F2 and F3 of another consumer: a record, then the item's removal."""
        ident = data.draw(st.sampled_from(sorted(self.etcd.items)))
        self._deliver(event("create", "completed", ident, self.etcd.write(), "{}"))
        del self.etcd.items[ident]
        self._deliver(event("delete", "work", ident, self.etcd.write()))

    # -- listings ----------------------------------------------------------------------
    def _work(self) -> List[Entry]:
        return [Entry(i, at, raw) for i, (at, raw) in sorted(self.etcd.items.items())]

    def _locks(self) -> List[Entry]:
        return [Entry(i, at, lock_value()) for i, at in sorted(self.etcd.locks.items())]

    def _note_listing(self, locks_listed: bool) -> None:
        index = self.etcd.index
        for ident, (at, raw) in self.etcd.items.items():
            if '"c":' in raw:
                self.hints.setdefault(ident, set()).add(at)
        if locks_listed:
            # Every item of work/ too: one the state forgot (found gone) is
            # listed again with the locks/ listing of the same round.
            for ident in set(self.state.items) | set(self.attempts) | set(self.etcd.items):
                if ident in self.etcd.locks:
                    self.signs[ident] = max(self.signs.get(ident, 0), self.etcd.locks[ident])
                else:
                    self.gone_signs[ident] = max(self.gone_signs.get(ident, 0), index)

    @rule(watching=st.booleans(), list_locks=st.booleans())
    def new_round(self, watching: bool, list_locks: bool) -> None:
        round_ = self.state.new_round(watching=watching, list_locks=list_locks)
        assert round_ is not None
        self.round = round_
        work = self._work()
        plan = self.state.plan_round(round_, work)
        locks = (self.etcd.index, self._locks()) if plan.list_locks else None
        reads = [(i, self.etcd.index, Entry(i, self.etcd.locks[i], lock_value())
                  if i in self.etcd.locks else None) for i in plan.read]
        self._note_listing(locks is not None)
        for ident, index, lock in reads:
            if lock is None:
                self.gone_signs[ident] = max(self.gone_signs.get(ident, 0), index)
            else:
                self.signs[ident] = max(self.signs.get(ident, 0), index)
        assert self.state.apply_round(round_, (self.etcd.index, work), plan, locks, reads,
                                      self.now, 0.0)
        self.floors = {"work": self.etcd.index, "locks": self.etcd.index if locks else 0}

    @rule()
    def list_locks(self) -> None:
        locks = (self.etcd.index, self._locks())
        self._note_listing(True)
        self.state.apply_locks(self.state.generation, None, locks, full=True,
                               history=self.state.history, now=self.now, wall=0.0)

    # -- our claims -----------------------------------------------------------------------
    @rule(window=st.sampled_from([1, 2, 8, 64]))
    def pick(self, window: int) -> None:
        free_before = {i for i in self.state.items if self.state.is_free(i)}
        found, _ = self.state.pick(window, self.rng)
        if found is not None:
            ident, version = found
            assert ident in free_before, "offered an item that was taken or locked"
            self.attempts[ident] = self.etcd.index

    @precondition(lambda self: self.attempts)
    @rule(data=st.data(), outcome=st.sampled_from(["won", "lost", "gone", "failed", "refused"]))
    def attempt_ends(self, data: st.DataObject, outcome: str) -> None:
        ident = data.draw(st.sampled_from(sorted(self.attempts)))
        began = self.attempts.pop(ident)
        if outcome == "failed" or (outcome in ("won", "lost", "refused") and
                                   ident not in self.etcd.items):
            self.state.untaken(ident)
        elif outcome == "gone":
            self.state.finished(ident)
        elif outcome == "won" and ident not in self.etcd.locks:
            at = self.etcd.write()
            self.etcd.locks[ident] = at
            self.ours[ident] = at
            self._ended(ident, at, won=True)
        else:
            at = self.etcd.locks.get(ident, began)
            self._ended(ident, at, refused=outcome == "refused" and ident in self.etcd.locks)

    def _ended(self, ident: str, at: int, refused: bool = False, won: bool = False) -> None:
        if refused and at == self.gone_signs.get(ident):
            self.gone_signs.pop(ident)
        self.signs[ident] = max(self.signs.get(ident, 0), at)
        self.state.locked_at(ident, at, refused=refused, won=won, now=self.now)

    @rule(data=st.data())
    def own_put(self, data: st.DataObject) -> None:
        at = self.etcd.write()
        ident, raw = item_id(at), value(f"o{at}")
        self.etcd.items[ident] = (at, raw)
        self.etcd.versions.setdefault(ident, {})[at] = raw
        self.state.added(ident, Version(at, raw))
        self._deliver(event("create", "work", ident, at, raw))
        if data.draw(st.booleans()):
            self.state.offer_own(at)

    @rule(ttl=st.integers(min_value=1, max_value=5))
    def own_delayed_put(self, ttl: int) -> None:
        """D1 (a delay lock), then D2 (the item), both this process's."""
        lock_at = self.etcd.write()
        at = self.etcd.write()
        ident, raw = item_id(at), value(f"d{at}", requeued=True)
        self.etcd.locks[ident] = lock_at
        self.etcd.items[ident] = (at, raw)
        self.etcd.versions.setdefault(ident, {})[at] = raw
        self.signs[ident] = lock_at
        self._deliver(event("create", "locks", ident, lock_at, lock_value(delay=True)))
        self._deliver(event("create", "work", ident, at, raw))
        self.state.delayed(ident, Version(at, raw), lock_at, ttl, self.now)

    @precondition(lambda self: self.ours)
    @rule(data=st.data(), seconds=st.sampled_from([0, 0, 3]))
    def give_back(self, data: st.DataObject, seconds: int) -> None:
        """Our claim's release (R1): its lock deleted, or turned into a delay lock."""
        ident = data.draw(st.sampled_from(sorted(self.ours)))
        del self.ours[ident]
        at = self.etcd.write()
        if seconds:
            self.etcd.locks[ident] = at
            self.signs[ident] = at
            self._deliver(event("compareAndSwap", "locks", ident, at, lock_value(delay=True)))
        else:
            del self.etcd.locks[ident]
            self.gone_signs[ident] = max(self.gone_signs.get(ident, 0), at)
            self._deliver(event("delete", "locks", ident, at))
        self.state.returned(ident, seconds, at, self.now)

    @precondition(lambda self: self.attempts)
    @rule(data=st.data())
    def junk_found(self, data: st.DataObject) -> None:
        """A claim found the version junk: that version is skipped for good."""
        ident = data.draw(st.sampled_from(sorted(self.attempts)))
        del self.attempts[ident]
        held = self.state.items.get(ident)
        if held is not None:
            self.state.skip_version(ident, *held)
        self.state.untaken(ident)

    @rule(seconds=st.floats(min_value=0.0, max_value=40.0))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.state.tick(self.now)

    # -- the invariants -------------------------------------------------------------------
    @invariant()
    def nothing_offered_is_taken_or_locked(self) -> None:
        for ident, version in self.state.candidates(10 ** 6)[0]:
            assert ident not in self.state.locks and ident not in self.state.trying
            assert ident not in self.attempts and ident not in self.ours
            assert not self.state.skips(ident, version.index, version.raw), "a junk version offered"

    @invariant()
    def no_item_stays_taken_after_a_newer_sign_its_lock_went(self) -> None:
        for ident, at in self.state.locks.items():
            if ident in self.attempts or ident not in self.state.items or (
                    at in self.hints.get(ident, ())):
                continue
            gone = self.gone_signs.get(ident, 0)
            assert not gone > self.signs.get(ident, 0), (
                f"{ident} taken at {at} after its lock went at {gone}")

    @invariant()
    def only_live_claims_of_ours_are_own(self) -> None:
        assert self.state.own <= set(self.ours), "a sign trusted as our live claim's"

    @invariant()
    def every_held_version_is_one_write(self) -> None:
        for ident, (index, raw) in self.state.items.items():
            if raw is not None:
                assert self.etcd.versions[ident][index] == raw, (ident, index)
            else:
                assert index in self.etcd.versions[ident]

    @invariant()
    def the_free_list_is_sorted_and_holds_every_free_item(self) -> None:
        free = self.state.free
        assert free == sorted(set(free)) and self.state.in_free == set(free)
        expected = {i for i, (index, raw) in self.state.items.items()
                    if i not in self.state.locks and i not in self.state.trying
                    and i not in self.state.recorded and i not in self.state.orphans
                    and not self.state.skips(i, index, raw)}
        assert {i for i in free if self.state.is_free(i)} == expected


ViewMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                         deadline=None)
test_the_view_s_invariants_hold_over_random_events = ViewMachine.TestCase
