"""A listing of work/ taken before one the view applied already is not
applied over it (docs/protocol.md, "Events and transitions": a replaced
round's listing is dropped, and a confirm check decided before the view
listed again).  Within one quiet round two listings of work/ race: the
round's own (work/, then locks/ when it goes quiet knowing of locks) and a
claimer's relist (work/ only, ViewState.start_relist), which often lands
first.  Fed to the state with no etcd and no threads, as
tests/test_viewstate.py does.
"""
from __future__ import annotations

from etcdq_v2.versions import Entry
from etcdq_v2.viewstate import ViewState

from test_viewstate import item_id, lock_value, ready_state, value


def _quiet_round_listing_locks(state):
    round_ = state.new_round(watching=False, list_locks=True)
    assert round_ is not None
    return round_


def test_a_round_s_listing_older_than_a_relist_already_applied_changes_nothing() -> None:
    a, b, c = item_id(2), item_id(3), item_id(6)
    state, _ = ready_state([(a, 2, value("a")), (b, 3, value("b"))], watching=True)
    state.locked(b, 4)  # b runs elsewhere: going quiet lists locks/ too
    round_ = state.new_round(watching=False, list_locks=True)  # a claim saw a backlog
    assert round_ is not None
    older = [Entry(a, 2, value("a")), Entry(b, 3, value("b"))]
    plan = state.plan_round(round_, older)  # work/ listed at 5; locks/ still under way
    relist = state.start_relist(1.0)  # a claimer missed: it lists work/ at 7, and applies it
    assert relist is not None
    newer = [Entry(a, 2, value("a")), Entry(b, 3, value("b")), Entry(c, 6, value("c"))]
    state.apply_relist(relist, (7, newer), state.plan_relist(relist, newer), None, 1.0, 0.0)
    assert state.known == 7 and c in state.items
    state.apply_round(round_, (5, older), plan, (5, [Entry(b, 4, lock_value())]), [], 2.0, 0.0)
    assert state.known == 7, f"work/ known up to {state.known}, after a listing at 7"
    assert c in state.items, "an item the view listed at 7 is gone from it"
    assert state.ready  # the round ends as a round does: its locks/ applied
    assert b in state.locks


def test_a_round_s_listing_newer_than_a_relist_applied_before_it_is_applied() -> None:
    a, b, c = item_id(2), item_id(3), item_id(6)
    state, _ = ready_state([(a, 2, value("a")), (b, 3, value("b"))])
    round_ = _quiet_round_listing_locks(state)
    relist = state.start_relist(1.0)  # lists work/ at 5, before the round's at 7
    assert relist is not None
    older = [Entry(a, 2, value("a")), Entry(b, 3, value("b"))]
    state.apply_relist(relist, (5, older), state.plan_relist(relist, older), None, 1.0, 0.0)
    newer = [Entry(a, 2, value("a")), Entry(c, 6, value("c"))]
    state.apply_round(round_, (7, newer), state.plan_round(round_, newer), (7, []), [],
                      2.0, 0.0)
    assert state.known == 7 and c in state.items and b not in state.items


def test_a_listing_started_after_the_applied_one_is_applied_though_etcd_s_index_went_back(
        ) -> None:
    """etcd restored from a snapshot, or restarted without its data, answers
    at a lower index than the view's listing: a listing started after that
    one was applied is taken, or the view would never list again."""
    a, c = item_id(2), item_id(3)
    state, _ = ready_state([(a, 2, value("a"))])
    relist = state.start_relist(1.0)
    assert relist is not None
    listed = [Entry(a, 2, value("a"))]
    state.apply_relist(relist, (900, listed), state.plan_relist(relist, listed), None, 1.0, 0.0)
    assert state.known == 900
    relist = state.start_relist(state.relist_after + 1.0)  # etcd's index went back to 4
    assert relist is not None
    after = [Entry(c, 3, value("c"))]
    state.apply_relist(relist, (4, after), state.plan_relist(relist, after), None, 2.0, 0.0)
    assert state.known == 4 and c in state.items and a not in state.items


def test_a_round_s_next_listing_is_applied_though_etcd_s_index_went_back_since_its_first(
        ) -> None:
    """A watching round lists again after each stream that ended (etcd
    restarted without its data, at a lower index): each of its listings is
    numbered as it is sent (ViewState.round_listing), so the next one was sent
    after the round's first was read, and is taken."""
    a, c = item_id(2), item_id(3)
    state, round_ = ready_state([(a, 900, value("a"))], watching=True)
    assert state.known == 900
    listing = state.round_listing(round_)  # the stream ended: the round lists again
    after = [Entry(c, 3, value("c"))]
    plan = state.plan_round(listing, after)
    assert state.apply_round(listing, (4, after), plan, (4, []), [], 1.0, 0.0)
    assert state.known == 4, f"work/ known up to {state.known}, after a listing at 4"
    assert c in state.items and a not in state.items


def test_a_relist_started_while_a_round_s_listing_was_under_way_and_listed_before_it_is_dropped(
        ) -> None:
    """Started after the round's listing began, but etcd answered it first
    (at 5, the round's at 7) and it lands last: it overlapped the round's,
    which was applied, and its index is lower."""
    a, b, c = item_id(2), item_id(3), item_id(6)
    state, _ = ready_state([(a, 2, value("a")), (b, 3, value("b"))])
    round_ = state.round_listing(_quiet_round_listing_locks(state))  # its listing starts
    relist = state.start_relist(1.0)  # a claimer's relist starts after it
    assert relist is not None
    newer = [Entry(a, 2, value("a")), Entry(c, 6, value("c"))]
    state.apply_round(round_, (7, newer), state.plan_round(round_, newer), (7, []), [],
                      1.0, 0.0)
    older = [Entry(a, 2, value("a")), Entry(b, 3, value("b"))]
    state.apply_relist(relist, (5, older), state.plan_relist(relist, older), None, 2.0, 0.0)
    assert state.known == 7, f"work/ known up to {state.known}, after a listing at 7"
    assert c in state.items and b not in state.items


def test_a_listing_under_way_across_an_index_that_went_back_is_not_applied_over_a_later_one(
        ) -> None:
    """The round's listing of work/ is answered at 90 by the old etcd, then
    lists locks/ slowly; meanwhile a relist is applied at 100, etcd restarts
    without its data, and a second relist is applied at 10 (the restarted
    etcd's index).  The round's listing was read before both relists were
    sent: it is older than both and must not put the old etcd's items back
    over the restarted etcd's listing."""
    a, b, c = item_id(2), item_id(3), item_id(5)
    state, _ = ready_state([(a, 2, value("a")), (b, 3, value("b"))])
    round_ = state.round_listing(_quiet_round_listing_locks(state))  # its listing starts
    before = [Entry(a, 2, value("a")), Entry(b, 3, value("b"))]
    plan = state.plan_round(round_, before)  # work/ listed at 90; locks/ under way
    _relisted_at_100_then_at_10(state, a, c)  # b finished; etcd restarted
    state.apply_round(round_, (90, before), plan, (11, []), [], 3.0, 0.0)
    assert state.known == 10, f"work/ known up to {state.known}, after a listing at 10"
    assert c in state.items, "the restarted etcd's item is gone from the view"
    assert b not in state.items, "an item of the old etcd, finished before 100, is back"


def test_a_listing_under_way_is_dropped_while_any_listing_applied_since_it_began_is_higher(
        ) -> None:
    """The round's listing (answered at 90) is under way while relists are
    applied at 100, at 10 (etcd restarted without its data) and at 50: the
    one at 100 was applied since it began, whatever came after, so it is
    dropped; the view keeps the listing at 50."""
    a, b, c, d = item_id(2), item_id(3), item_id(5), item_id(40)
    state, _ = ready_state([(a, 2, value("a")), (b, 3, value("b"))])
    round_ = state.round_listing(_quiet_round_listing_locks(state))
    before = [Entry(a, 2, value("a")), Entry(b, 3, value("b"))]
    plan = state.plan_round(round_, before)  # work/ listed at 90; locks/ under way
    for now, (index, listed) in enumerate([
            (100, [Entry(a, 2, value("a"))]), (10, [Entry(c, 5, value("c"))]),
            (50, [Entry(c, 5, value("c")), Entry(d, 40, value("d"))])], start=1):
        relist = state.start_relist(state.relist_after + now)
        assert relist is not None
        state.apply_relist(relist, (index, listed), state.plan_relist(relist, listed), None,
                           float(now), 0.0)
        assert state.known == index
    state.apply_round(round_, (90, before), plan, (51, []), [], 4.0, 0.0)
    assert state.known == 50, f"work/ known up to {state.known}, after a listing at 50"
    assert c in state.items and d in state.items and b not in state.items


def _relisted_at_100_then_at_10(state: ViewState, a: str, c: str) -> None:
    """Two relists applied in turn: the old etcd's at 100 (``a`` only), then,
    etcd restarted without its data, the new one's at 10 (``c`` only)."""
    first = state.start_relist(1.0)
    assert first is not None
    old = [Entry(a, 2, value("a"))]
    state.apply_relist(first, (100, old), state.plan_relist(first, old), None, 1.0, 0.0)
    second = state.start_relist(2.0)
    assert second is not None
    restarted = [Entry(c, 5, value("c"))]
    state.apply_relist(second, (10, restarted), state.plan_relist(second, restarted), None,
                       2.0, 0.0)
    assert state.known == 10 and c in state.items
