"""When etcd's history changes (restored from an older snapshot, or restarted
without its data), the view drops what it holds of the old one
(docs/protocol.md, "Events and transitions": a listing of work/ read at an
index lower than the highest the view had been told of when it was sent).

Each test: the view learns of the old history up to 100, etcd comes back at
10, and a relist sent after that is applied at 10 (ViewState._history_changed).
What was sent before the change and answered after it is dropped; signs of
the new history made after it stand.  Fed to the state with no etcd and no
threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

from typing import List

from etcdq_v2.versions import Entry
from etcdq_v2.viewstate import ViewState

from test_viewstate import event, free_ids, item_id, lock_value, ready_state, value


def relisted(state: ViewState, index: int, listed: List[Entry], now: float) -> None:
    """A claimer's relist of work/ (no locks/), sent and applied at ``index``."""
    relist = state.start_relist(state.relist_after + now)
    assert relist is not None
    state.apply_relist(relist, (index, listed), state.plan_relist(relist, listed), None,
                       now, 0.0)
    assert state.known == index


def test_a_listing_of_locks_sent_before_etcd_s_history_changed_is_not_applied() -> None:
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("x"))])
    relisted(state, 100, [Entry(x, 2, value("x"))], 1.0)  # the old etcd, at 100
    generation, history = state.generation, state.history  # a delay due: locks/ is sent
    relisted(state, 10, [Entry(x, 2, value("x"))], 2.0)  # etcd came back at 10
    # The listing of locks/ is answered by the old etcd, at 99: x was locked then.
    state.apply_locks(generation, None, (99, [Entry(x, 95, lock_value())]), full=False,
                      history=history, now=3.0, wall=0.0)
    assert free_ids(state) == [x], (
        f"{x}, free at 10, is held locked at {state.locks.get(x)} by a listing of the old etcd")


def test_a_round_s_listings_sent_before_etcd_s_history_changed_are_not_applied() -> None:
    """The round's listing of work/ is read by the old etcd at 99, its listing
    of locks/ is slow; meanwhile relists are applied at 100 and, etcd back at
    10, at 10.  Its reply overlapped the relist at 10 and is higher: by index
    alone it would put the old etcd's items and locks back."""
    a, b, c = item_id(2), item_id(3), item_id(5)
    state, _ = ready_state([(a, 2, value("a")), (b, 3, value("b"))])
    round_ = state.round_listing(state.new_round(watching=False, list_locks=True))
    relisted(state, 100, [Entry(a, 2, value("a")), Entry(b, 3, value("b"))], 1.0)
    relisted(state, 10, [Entry(a, 2, value("a")), Entry(c, 5, value("c"))], 2.0)
    old = [Entry(a, 2, value("a")), Entry(b, 3, value("b"))]
    plan = state.plan_round(round_, old)  # handed in now: it overlapped the relist at 10
    state.apply_round(round_, (99, old), plan, (99, [Entry(a, 95, lock_value())]), [],
                      3.0, 0.0)
    assert state.known == 10, f"work/ known up to {state.known}, after a listing at 10"
    assert c in state.items and b not in state.items, "the old etcd's listing was applied"
    assert free_ids(state) == [a, c], f"the old etcd's lock of {a} was applied"


def test_a_relist_sent_before_etcd_s_history_changed_is_not_applied() -> None:
    """A quiet round's listing (work/ and locks/) tells the change while a
    claimer's full relist, read by the old etcd, is under way."""
    a, b, c = item_id(2), item_id(3), item_id(5)
    state, _ = ready_state([(a, 2, value("a")), (b, 3, value("b"))])
    relisted(state, 100, [Entry(a, 2, value("a")), Entry(b, 3, value("b"))], 1.0)
    round_ = state.round_listing(state.new_round(watching=False, list_locks=True))
    relist = state.start_relist(2.0, full=True)  # sent after the round's listing
    assert relist is not None
    old = [Entry(a, 2, value("a")), Entry(b, 3, value("b"))]
    relist_plan = state.plan_relist(relist, old)  # read at 101, before the restart
    new = [Entry(a, 2, value("a")), Entry(c, 5, value("c"))]
    assert state.apply_round(round_, (10, new), state.plan_round(round_, new), (10, []), [],
                             3.0, 0.0)
    assert state.known == 10
    state.apply_relist(relist, (101, old), relist_plan, (101, [Entry(a, 95, lock_value())]),
                       4.0, 0.0)
    assert state.known == 10, f"work/ known up to {state.known}, after a listing at 10"
    assert free_ids(state) == [a, c], f"the old etcd's relist was applied: {free_ids(state)}"


def test_listings_after_the_change_are_ordered_as_in_any_one_history() -> None:
    """After the change at 10, the view's signs are of the new history: the
    next listing, at 12, is newer and keeps them (no second change)."""
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("x")), (y, 3, value("y"))])
    relisted(state, 100, [Entry(x, 2, value("x")), Entry(y, 3, value("y"))], 1.0)
    relisted(state, 10, [Entry(x, 2, value("x")), Entry(y, 3, value("y"))], 2.0)
    history = state.history
    state.taken(y)  # a claim of ours loses y's C1 at 11: y runs elsewhere
    state.locked_at(y, 11, refused=True)
    relisted(state, 12, [Entry(x, 2, value("x")), Entry(y, 3, value("y"))], 3.0)
    assert state.history == history, "a listing newer than the change changed the history"
    assert free_ids(state) == [x], f"{y}, locked at 11, is offered after a listing at 12"


def test_a_left_mark_from_before_the_change_hides_nothing_of_the_new_history() -> None:
    """This process claimed x (C2 at 1000) and finishes it (F1 at 1001) while a
    watching round's listing is under way; etcd comes back at 8, x is
    written again at 9 (a late requeue), and the listing is read after it.
    The mark of x (at 1001, the old history's) does not hide it: its event
    is below the listing's floor, so it would wait for the next round."""
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))], watching=True)
    state.taken(x)
    state.locked_at(x, 1000)
    round_ = state.new_round(watching=True, list_locks=True)
    assert round_ is not None
    state.finished(x, 1001)
    again = value("a2", requeued=True)
    listing = [Entry(x, 9, again), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, listing)
    assert state.apply_round(round_, (9, listing), plan, (9, []), [], 1.0, 0.0)
    state.apply_block(round_, event("create", "work", x, 9, again), {"work": 9, "locks": 9},
                      1.0)
    assert x in free_ids(state), f"{x}, in work/ at 9, is not offered: {free_ids(state)}"


def test_a_claim_attempt_under_way_across_the_change_leaves_no_old_sign() -> None:
    """Our claim of x began before the change; it ends after it with the old
    etcd's index (C2 at 1000): that sign would keep x taken in the new
    history until etcd's index passed 1000."""
    x = item_id(2)
    state, _ = ready_state([(x, 2, value("x"))])
    relisted(state, 100, [Entry(x, 2, value("x"))], 1.0)
    state.taken(x)
    relisted(state, 10, [Entry(x, 2, value("x"))], 2.0)
    state.locked_at(x, 1000)
    state.apply_locks(state.generation, None, (11, []), full=True, history=state.history,
                      now=3.0, wall=0.0)  # no lock of x at 11
    assert free_ids(state) == [x], f"{x} is held locked at {state.locks.get(x)}"
