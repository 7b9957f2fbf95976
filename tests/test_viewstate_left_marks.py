"""The marks of items that left work/ (ViewState.left): what a listing of
work/ under way as an item left leaves out, and how long the marks stay.

Unit tests of the state's transitions (no etcd, no threads): the order of a
round's listing, a claim's finish and the events is set by hand.
"""

from __future__ import annotations

from etcdq_v2.versions import Entry
from etcdq_v2.viewstate import Round, ViewState

from test_viewstate import event, free_ids, item_id, ready_state, value


def test_an_item_written_again_before_a_listing_was_served_is_offered_by_it() -> None:
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))], watching=True)
    # The next round begins: its listing of work/ is sent now.
    round_ = state.new_round(watching=True, list_locks=True)
    assert round_ is not None
    # This process finishes x (F3 at 5); then x is written again at 9 (a late
    # Q3 copy; or etcd, restarted without its data, gave the id again).
    state.finished(x)
    assert_written_again_is_offered(state, round_, x, y, 1.0)


def assert_written_again_is_offered(state: ViewState, round_: Round, x: str, y: str,
                                    now: float) -> None:
    """x, written again at 9 after it left, is offered by the round's listing,
    served after that write (its stream starts after 9: no event of it)."""
    again = value("a2", requeued=True)
    listing = [Entry(x, 9, again), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, listing)
    assert state.apply_round(round_, (9, listing), plan, (9, []), [], now, 0.0)
    floors = {"work": 9, "locks": 9}
    state.apply_block(round_, event("create", "work", x, 9, again), floors, now)
    assert x in free_ids(state), f"x, in work/ at 9, is not offered: {free_ids(state)}"


def test_an_item_written_again_after_the_index_went_back_is_offered_by_the_next_listing() -> None:
    x, y = item_id(2), item_id(3)
    state, _ = ready_state([(x, 2, value("a")), (y, 3, value("b"))], watching=True)
    # This process claims x: its C2 at 1000 (others wrote much meanwhile).
    state.taken(x)
    state.locked_at(x, 1000)
    # etcd restarts without its data; the claim is lost.  A new round lists
    # the new history at 6: x (id 2 given again) and y.
    round_ = state.new_round(watching=True, list_locks=True)
    assert round_ is not None
    listing = [Entry(x, 2, value("a'")), Entry(y, 3, value("b"))]
    plan = state.plan_round(round_, listing)
    assert state.apply_round(round_, (6, listing), plan, (6, []), [], 1.0, 0.0)
    # The next round begins: its listing of work/ is sent.  A claim of ours
    # finds x gone (another consumer finished it at 8).
    round_ = state.new_round(watching=True, list_locks=True)
    assert round_ is not None
    state.finished(x)
    # x is written again at 9 (a late Q3 copy); the listing is read after it.
    assert_written_again_is_offered(state, round_, x, y, 2.0)


def test_a_watching_view_keeps_no_mark_of_items_that_left_with_no_listing_under_way() -> None:
    first = item_id(2)
    state, round_ = ready_state([(first, 2, value("a"))], watching=True)
    floors = {"work": 2, "locks": 2}
    # The round's listing is applied; its stream brings 1000 puts and finishes.
    index = 2
    for n in range(1000):
        ident = item_id(10 + n)
        index += 1
        state.apply_block(round_, event("create", "work", ident, index, value(ident)), floors, 0.0)
        index += 1
        state.apply_block(round_, event("compareAndDelete", "work", ident, index), floors, 0.0)
    assert free_ids(state) == [first]
    assert len(state.left) == 0, f"{len(state.left)} marks with no listing under way"
