"""The claim's and the commit's steps (steps.py), driven with scripted replies: no etcd.

Each test feeds a step the replies (or the library's exceptions) a real etcd
could give, and checks the requests it sends next against the rule of
docs/protocol.md that the test is named after.
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Dict, Iterable, List, Optional

import pytest

from etcdq_v2.codec import Item, Lock, Record, tombstone
from etcdq_v2.driver import run
from etcdq_v2.errors import (AlreadyExists, AmbiguousWrite, ClaimClosed, CompareFailed,
                             EtcdqError, EtcdRejected, KeyMissing, LockLost, NotFound,
                             Unavailable)
from etcdq_v2.keys import Layout
from etcdq_v2.steps import (COMPLETED, FAILED, IMPORT_LOCK, TOMBSTONE_TTL, ClaimState, Entry,
                            Gone, Held, ImportState, Request, Step, Steps, Taken, Version)
from etcdq_v2.transport import Reply

LAYOUT = Layout("/etcdq", "jobs")
ITEM = "00000000000000000042"
WORK, LOCK_KEY = LAYOUT.key("work", ITEM), LAYOUT.key("locks", ITEM)
OURS = Lock("node-a", "claim-token")
LOCK_TTL = 30
LOCKED_AT, SEEN_AT = 50, 40   # C1's index; the index at which the view saw the item


def steps(*, lock_ttl: int = LOCK_TTL, max_attempts: Optional[int] = None) -> Steps:
    return Steps(LAYOUT, node_id="node-a", lock_ttl=lock_ttl, max_attempts=max_attempts,
                 max_payload=1 << 20, record_ttls={COMPLETED: 86400, FAILED: None})


def written(index: int) -> Reply:
    """A write's reply: etcd's index header names it."""
    return Reply(b'{"action":"set"}', index)


def node(index: int, value: Optional[str], **fields: Any) -> Reply:
    """A read's (or a refresh's) reply: one node."""
    body: Dict[str, Any] = {"modifiedIndex": index, "value": value, **fields}
    return Reply(json.dumps({"node": body}).encode(), index)


def missing(index: int = 99) -> KeyMissing:
    return KeyMissing("Key not found", code=KeyMissing.code, index=index)


def compare_failed(index: int = 99, retried: bool = False) -> CompareFailed:
    exc = CompareFailed("Compare failed", code=CompareFailed.code, index=index)
    exc.retried = retried
    return exc


class Script:
    """Drives a step, answering its requests in order: a reply is sent back, an
    exception is thrown in.  ``sent`` holds the requests it made."""

    def __init__(self, step: Step[Any], answers: Iterable[Any]) -> None:
        self.step, self.answers, self.sent = step, list(answers), []  # type: List[Request]

    def result(self) -> Any:
        reply: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                request = self.step.throw(error) if error is not None else self.step.send(reply)
            except StopIteration as stop:
                assert not self.answers, f"unsent answers: {self.answers}"
                return stop.value
            self.sent.append(request)
            assert self.answers, f"a request beyond the script: {request}"
            answer = self.answers.pop(0)
            reply, error = (None, answer) if isinstance(answer, BaseException) else (answer, None)


def unclaimed(attempts: int = 0, claim: Optional[str] = None) -> str:
    return Item("payload", "put-token", attempts, claim, 1.0).encode()


def held(since: float = 100.0) -> Held:
    return Held(OURS, LOCKED_AT, since)


def claimed_state(index: int = 60, attempts: int = 1) -> ClaimState:
    return ClaimState(ITEM, OURS, Item("payload", "put-token", attempts, OURS.token, 1.0),
                      index, 100.0)


# -- C1 ----------------------------------------------------------------------
def test_c1_refused_with_already_exists_is_taken_and_sends_nothing_more() -> None:
    script = Script(steps().lock_step(ITEM, OURS, LOCK_TTL),
                    [AlreadyExists("Key already exists", code=AlreadyExists.code, index=77)])
    with pytest.raises(Taken) as taken:
        script.result()
    assert (taken.value.index, taken.value.refused) == (77, True)
    assert script.sent == [Request("PUT", LOCK_KEY, OURS.encode(), ttl=LOCK_TTL,
                                   prev_exist=False)]


def test_c1_already_exists_after_a_resend_is_read_back_and_our_value_is_ours() -> None:
    echo = AlreadyExists("Key already exists", code=AlreadyExists.code, index=77)
    echo.retried = True
    script = Script(steps().lock_step(ITEM, OURS, LOCK_TTL), [echo, node(51, OURS.encode())])
    assert script.result() == 51
    assert script.sent[1] == Request("GET", LOCK_KEY, quorum=True)


# -- C2 ----------------------------------------------------------------------
def test_c2_is_a_cas_on_the_seen_index_writing_one_more_attempt_and_our_token() -> None:
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed(2))),
                    [written(60), missing(), missing(), 100.5])
    state = script.result()
    c2 = script.sent[0]
    assert (c2.method, c2.key, c2.prev_index) == ("PUT", WORK, SEEN_AT)
    item = Item.decode(c2.value)
    assert (item.attempts, item.claim) == (3, OURS.token)
    assert (state.index, state.attempt) == (60, 3)
    # C3: claimed before, so its records are read; within half a TTL, no refresh
    assert script.sent[1:] == [Request("GET", LAYOUT.key(kind, ITEM), quorum=True)
                               for kind in (COMPLETED, FAILED)] + [Request("NOW")]


def test_c2_whose_reply_was_lost_is_read_back_and_our_token_there_is_our_claim() -> None:
    """The transport resent the CAS; its echo fails the compare.  The item read
    back carries our claim token: our C2 applied, and no second C2 is sent."""
    ours = Item("payload", "put-token", 1, OURS.token, 1.0).encode()
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed())),
                    [compare_failed(retried=True), node(60, ours), 100.5])
    state = script.result()
    assert [r.method for r in script.sent] == ["PUT", "GET", "NOW"]
    assert script.sent[1] == Request("GET", WORK, quorum=True)
    assert state.index == 60


def test_an_item_claimed_after_our_lock_was_created_is_taken_and_our_lock_dropped() -> None:
    """C2 fails; the item read back changed after C1's index: another claim held
    the lock after ours expired, so the item is theirs."""
    theirs = Item("payload", "put-token", 1, "their-token", 1.0).encode()
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed())),
                    [compare_failed(), node(LOCKED_AT + 5, theirs), written(70)])
    with pytest.raises(Taken) as taken:
        script.result()
    assert taken.value.index == LOCKED_AT + 5 and not taken.value.refused
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=OURS.encode())


def test_c2_on_an_item_gone_from_work_is_gone_and_drops_our_lock() -> None:
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed())),
                    [missing(), written(70)])
    with pytest.raises(Gone) as gone:
        script.result()
    assert not gone.value.by_us
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=OURS.encode())


def test_c2_unanswered_raises_after_dropping_our_lock_and_a_failed_drop_changes_nothing(
        ) -> None:
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed())),
                    [Unavailable("no answer"), Unavailable("still none")])
    with pytest.raises(Unavailable, match="no answer"):
        script.result()
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=OURS.encode())


def test_a_committed_item_is_finished_only_from_a_version_read_never_the_views() -> None:
    """The view's value carries "o": the claim reads the item first (quorum),
    and the item gone since means nothing is written."""
    committed = Record("payload", "their-token", "node-b", 1, 1.0, 2.0,
                       token="put-token").encode(outcome=COMPLETED)
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, committed)),
                    [missing(), written(70)])
    with pytest.raises(Gone):
        script.result()
    assert [r.method for r in script.sent] == ["GET", "DELETE"]


# -- C3 ----------------------------------------------------------------------
def test_c3_past_half_the_ttl_refreshes_and_a_lock_created_anew_fences_the_item_again(
        ) -> None:
    late = 100.0 + LOCK_TTL / 2 + 1
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed())),
                    [written(60), late, late,
                     node(80, OURS.encode(), createdIndex=LOCKED_AT + 20),  # not C1's lock
                     written(81)])
    state = script.result()
    refresh, refence = script.sent[3], script.sent[4]
    assert refresh == Request("PUT", LOCK_KEY, ttl=LOCK_TTL, prev_exist=True,
                              prev_value=OURS.encode(), refresh=True)
    assert (refence.method, refence.key, refence.prev_index) == ("PUT", WORK, 60)
    assert (state.index, state.confirmed) == (81, late)


def test_c3_past_half_the_ttl_with_c1s_own_lock_needs_no_fence() -> None:
    late = 100.0 + LOCK_TTL / 2 + 1
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed())),
                    [written(60), late, late, node(80, OURS.encode(), createdIndex=LOCKED_AT)])
    assert script.result().index == 60
    assert len(script.sent) == 4


def test_c3_finding_another_claims_lock_hands_nothing_out_and_the_item_is_taken() -> None:
    late = 100.0 + LOCK_TTL / 2 + 1
    ours = Item("payload", "put-token", 1, OURS.token, 1.0).encode()
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed())),
                    [written(60), late, late, compare_failed(index=90), node(60, ours),
                     written(91)])
    with pytest.raises(Taken) as taken:
        script.result()
    assert taken.value.index == 90


def test_c3_at_max_attempts_dead_letters_the_item_and_hands_nothing_out() -> None:
    script = Script(steps(max_attempts=3).take_step(ITEM, held(), Version(SEEN_AT, unclaimed(3))),
                    [written(60), missing(), missing(),       # C2; C3: no records
                     1234.5, written(61), written(62),         # WALL; F1; F2
                     missing(),                                # completed/: none
                     [written(63)], written(64)])              # F3; our lock dropped
    with pytest.raises(Gone) as gone:
        script.result()
    assert gone.value.by_us
    f1 = script.sent[4]
    assert (f1.key, f1.prev_index) == (WORK, 60)
    assert Item.decode(f1.value).outcome == FAILED
    assert script.sent[5].key == LAYOUT.key("failed", ITEM) and script.sent[5].prev_exist is False


#: A record of another item that had ITEM's id (etcd restored from an older backup
#: names new items by ids it gave before): its put token is not "put-token".
ANOTHER_ITEMS = Record("old payload", "old-claim", "node-b", 1, 1.0, 2.0,
                       token="old-put-token").encode()


@pytest.mark.parametrize("found, finished", [
    (ANOTHER_ITEMS, False),
    (tombstone("00000000000000000099", "old-put-token"), False),
    (Record("payload", "old-claim", "node-b", 1, 1.0, 2.0, token="put-token").encode(), True),
    (Record("payload", "old-claim", "node-b", 1, 1.0, 2.0).encode(), True),  # 0.1.0's: no "t"
    (tombstone("00000000000000000099", "put-token"), True),
], ids=["another-record", "another-tombstone", "its-record", "record-of-0.1.0",
        "its-tombstone"])
def test_c3_counts_a_record_as_the_item_s_only_if_its_put_token_is_not_another_s(
        found: str, finished: bool) -> None:
    """A record or tombstone of another put token belongs to another item that
    had the id: the item is handed out (its F2 replaces that record); one of
    its own put token, or of none (0.1.0's), finishes it: removed, nothing
    handed out."""
    answers: List[Any] = [written(60), node(20, found)]
    deleted = found == ANOTHER_ITEMS  # another item's record goes, on its index
    answers += [written(61)] if deleted else []
    answers += [missing()]  # failed/
    answers += [written(61)] if finished else [100.0]  # its F3; or NOW
    script = Script(steps().take_step(ITEM, held(), Version(SEEN_AT, unclaimed(1))),
                    answers + ([written(62)] if finished else []))  # our lock dropped
    if finished:
        with pytest.raises(Gone):
            script.result()
        assert script.sent[3] == Request("DELETE", WORK, prev_index=60)
    else:
        assert script.result().index == 60
        assert [r.method for r in script.sent] == ["PUT", "GET"] + ["DELETE"] * deleted + [
            "GET", "NOW"]
    if deleted:
        assert script.sent[2] == Request("DELETE", LAYOUT.key(COMPLETED, ITEM), prev_index=20)


# -- F1 ----------------------------------------------------------------------
def marked(kind: str = COMPLETED, claim: str = OURS.token) -> str:
    return Record("payload", claim, "node-a", 1, 1.0, 2.0, "done", token="put-token").encode(
        outcome=kind)


def test_f1_is_a_cas_on_the_index_of_the_claims_version() -> None:
    script = Script(steps().commit_step(claimed_state(index=60), COMPLETED, marked()),
                    [written(61)])
    assert script.result() == Entry(ITEM, 61, marked())
    assert script.sent == [Request("PUT", WORK, marked(), prev_index=60)]


def test_f1_failed_compare_read_back_with_our_outcome_is_our_commit() -> None:
    script = Script(steps().commit_step(claimed_state(), COMPLETED, marked()),
                    [compare_failed(retried=True), node(61, marked())])
    assert script.result() == Entry(ITEM, 61, marked())


def test_f1_failed_compare_on_an_item_another_claim_took_is_lock_lost() -> None:
    theirs = Item("payload", "put-token", 2, "their-token", 1.0).encode()
    script = Script(steps().commit_step(claimed_state(), COMPLETED, marked()),
                    [compare_failed(), node(70, theirs)])
    with pytest.raises(LockLost):
        script.result()


def test_f1_read_back_of_our_own_other_outcome_is_claim_closed() -> None:
    script = Script(steps().commit_step(claimed_state(), COMPLETED, marked()),
                    [compare_failed(retried=True), node(61, marked(FAILED))])
    with pytest.raises(ClaimClosed):
        script.result()


def test_f1_on_an_item_gone_with_our_record_is_committed_already() -> None:
    record = Record("payload", OURS.token, "node-a", 1, 1.0, 2.0, "done").encode()
    script = Script(steps().commit_step(claimed_state(), COMPLETED, marked()),
                    [missing(), missing(), node(62, record)])
    assert script.result() is None
    assert [r.key for r in script.sent[1:]] == [WORK, LAYOUT.key("completed", ITEM)]


# -- F2-F4 -------------------------------------------------------------------
def test_f2_refused_then_no_record_is_sent_again_while_the_item_holds_f1s_index() -> None:
    record_key = LAYOUT.key("completed", ITEM)
    script = Script(steps().record_step(ITEM, Entry(ITEM, 61, marked()), OURS),
                    [AlreadyExists("exists", code=AlreadyExists.code), missing(),  # expired
                     node(61, marked()), written(63), [written(64)]])
    script.result()
    assert [(r.method, r.key) for r in script.sent[:4]] == [
        ("PUT", record_key), ("GET", record_key), ("GET", WORK), ("PUT", record_key)]


def test_f2_refused_then_no_record_and_no_item_writes_nothing_again() -> None:
    script = Script(steps().record_step(ITEM, Entry(ITEM, 61, marked()), OURS),
                    [AlreadyExists("exists", code=AlreadyExists.code), missing(), missing()])
    script.result()
    assert [r.method for r in script.sent] == ["PUT", "GET", "GET"]  # no F3: no item


def test_f2_replaces_another_item_s_record_by_a_cas_on_its_index_while_f1_s_item_stays(
        ) -> None:
    """completed/<id> holds the record of another item that had the id (its put
    token is not ours); work/<id> is still the item F1 wrote: F2 is a CAS on
    that record's index, then F3."""
    record_key = LAYOUT.key("completed", ITEM)
    script = Script(steps().record_step(ITEM, Entry(ITEM, 61, marked()), OURS),
                    [AlreadyExists("exists", code=AlreadyExists.code), node(30, ANOTHER_ITEMS),
                     node(61, marked()), written(62), [written(63)]])
    script.result()
    assert script.sent[1:3] == [Request("GET", record_key, quorum=True),
                                Request("GET", WORK, quorum=True)]
    replaced = script.sent[3]
    assert (replaced.method, replaced.key, replaced.prev_index) == ("PUT", record_key, 30)
    assert Record.decode(replaced.value).token == "put-token"
    assert replaced.ttl == 86400 and replaced.prev_exist is None


def test_f2_replacing_another_item_s_record_whose_reply_was_lost_reads_ours_back() -> None:
    """The resent CAS finds the index moved ("compare failed"): F2 again, and the
    record there now is ours: F3, nothing written twice."""
    ours = Record.decode(marked()).encode()
    script = Script(steps().record_step(ITEM, Entry(ITEM, 61, marked()), OURS),
                    [AlreadyExists("exists", code=AlreadyExists.code), node(30, ANOTHER_ITEMS),
                     node(61, marked()), compare_failed(62, retried=True),
                     AlreadyExists("exists", code=AlreadyExists.code), node(62, ours),
                     [written(63)]])
    script.result()
    assert [r.method for r in script.sent] == ["PUT", "GET", "GET", "PUT", "PUT", "GET", "ALL"]


@pytest.mark.parametrize("work", [missing(), node(61, unclaimed(1, "claim-new"))])
def test_f2_of_a_commit_no_longer_in_work_keeps_another_item_s_record(work: Any) -> None:
    """Our F1 applied in a history etcd lost (work/<id> is gone, or another item
    at the same index): the record of the item this history holds stays, and
    no F3 on F1's index removes that other item."""
    script = Script(steps().record_step(ITEM, Entry(ITEM, 61, marked()), OURS),
                    [AlreadyExists("exists", code=AlreadyExists.code), node(30, ANOTHER_ITEMS),
                     work])
    script.result()
    assert [r.method for r in script.sent] == ["PUT", "GET", "GET"]


@pytest.mark.parametrize("token", ["put-token", None])
def test_f2_keeps_the_record_of_another_claim_of_the_same_item(token: Optional[str]) -> None:
    """The same put token, or none (0.1.0's record, its commit): the item has
    one record, the first; nothing is written."""
    theirs = Record("payload", "their-claim", "node-b", 1, 1.0, 2.0, token=token).encode()
    script = Script(steps().record_step(ITEM, Entry(ITEM, 61, marked()), OURS),
                    [AlreadyExists("exists", code=AlreadyExists.code), node(30, theirs),
                     [written(63)]])
    script.result()
    assert [r.method for r in script.sent] == ["PUT", "GET", "ALL"]


def test_a_dead_letter_deletes_another_item_s_completed_record_before_f3() -> None:
    """completed/ is read first: once the item left work/, a record of another
    item there would be read as its outcome.  A completion reads nothing more
    (its own record is the one read first)."""
    failing = Script(steps().finish_step(claimed_state(), FAILED, reason="boom"),
                     [1.0, written(61), written(62), node(20, ANOTHER_ITEMS), written(63),
                      [written(64)]])
    failing.result()
    assert failing.sent[3:5] == [Request("GET", LAYOUT.key(COMPLETED, ITEM), quorum=True),
                                 Request("DELETE", LAYOUT.key(COMPLETED, ITEM), prev_index=20)]
    assert failing.sent[5].method == "ALL"
    completing = Script(steps().finish_step(claimed_state(), COMPLETED),
                        [1.0, written(61), written(62), [written(63)]])
    completing.result()
    assert [r.method for r in completing.sent] == ["WALL", "PUT", "PUT", "ALL"]


@pytest.mark.parametrize("lock_ttl, deletes", [(30, 1), (120, 2)])
def test_f3_and_f4_go_together_and_f4_only_when_locks_do_not_linger(lock_ttl: int,
                                                                    deletes: int) -> None:
    script = Script(steps(lock_ttl=lock_ttl).record_step(ITEM, Entry(ITEM, 61, marked()), OURS),
                    [written(62), [written(63)] * deletes])
    script.result()
    f3_f4 = script.sent[1].together
    assert f3_f4[0] == Request("DELETE", WORK, prev_index=61)
    assert f3_f4[1:] == ((Request("DELETE", LOCK_KEY, prev_value=OURS.encode()),)
                         if deletes == 2 else ())


def test_f3_finding_the_item_gone_is_done_but_another_error_is_raised() -> None:
    Script(steps().record_step(ITEM, Entry(ITEM, 61, marked()), None),
           [written(62), [missing()]]).result()
    with pytest.raises(Unavailable):
        Script(steps().record_step(ITEM, Entry(ITEM, 61, marked()), None),
               [written(62), [Unavailable("no answer")]]).result()


# -- R0, R1 ------------------------------------------------------------------
def test_r0_is_a_cas_on_the_claims_index_giving_the_attempt_back_with_our_token() -> None:
    state = claimed_state(index=60, attempts=2)
    script = Script(steps().release_step(state, 0), [written(61), written(62)])
    assert script.result() == (0, 62)
    r0, r1 = script.sent
    assert (r0.key, r0.prev_index) == (WORK, 60)
    assert (Item.decode(r0.value).attempts, Item.decode(r0.value).claim) == (1, OURS.token)
    assert r1 == Request("DELETE", LOCK_KEY, prev_value=OURS.encode())
    assert (state.index, state.item.attempts, state.attempt) == (61, 1, 2)


def test_r0_whose_reply_was_lost_is_read_back_and_our_token_with_one_less_is_ours() -> None:
    state = claimed_state(index=60, attempts=2)
    given_back = Item("payload", "put-token", 1, OURS.token, 1.0).encode()
    script = Script(steps().give_back_step(state), [compare_failed(retried=True),
                                                    node(61, given_back)])
    script.result()
    assert script.sent[1] == Request("GET", WORK, quorum=True)
    assert (state.index, state.item.attempts) == (61, 1)


def test_r0_read_back_of_our_own_commit_is_claim_closed() -> None:
    script = Script(steps().give_back_step(claimed_state(attempts=2)),
                    [compare_failed(retried=True), node(61, marked())])
    with pytest.raises(ClaimClosed):
        script.result()


def test_a_release_again_after_its_r0_applied_sends_no_second_r0() -> None:
    state = claimed_state(index=61, attempts=2)
    state.wrote(replace(state.item, attempts=1), 61)
    script = Script(steps().release_step(state, 0), [written(62)])
    script.result()
    assert [r.method for r in script.sent] == ["DELETE"]


def test_r1_with_a_delay_refused_reads_back_our_delay_lock_and_reports_at_least_a_second(
        ) -> None:
    ours = replace(OURS, delay=True, reason="an earlier call's").encode()
    script = Script(steps().unlock_step(claimed_state(), 5, "boom"),
                    [compare_failed(retried=True), node(70, ours)])  # past expiry: no ttl
    assert script.result() == (1, 70)
    r1 = script.sent[0]
    assert (r1.ttl, r1.prev_value, Lock.decode(r1.value).delay) == (5, OURS.encode(), True)


def test_r1_finding_another_claims_lock_is_lock_lost() -> None:
    script = Script(steps().unlock_step(claimed_state(), 0), [compare_failed()])
    with pytest.raises(LockLost):
        script.result()


@pytest.mark.parametrize("holder, ours", [(OURS.token, True), ("their-token", False)])
def test_r1_on_a_lock_gone_is_ours_only_while_the_item_carries_our_token(holder: str,
                                                                       ours: bool) -> None:
    item = Item("payload", "put-token", 1, holder, 1.0).encode()
    script = Script(steps().unlock_step(claimed_state(), 0), [missing(88), node(60, item)])
    if ours:
        assert script.result() == (0, 88)
    else:
        with pytest.raises(LockLost):
            script.result()


@pytest.mark.parametrize("attempt, retry, dead", [(2, True, False), (3, True, True),
                                                  (1, False, True)])
def test_a_failure_dead_letters_at_max_attempts_or_without_retry(attempt: int, retry: bool,
                                                                 dead: bool) -> None:
    assert steps(max_attempts=3).dead_letters(claimed_state(attempts=attempt), retry) is dead


def test_a_failure_after_a_release_stopped_at_r0_writes_its_attempt_back_first() -> None:
    state = claimed_state(index=61, attempts=2)
    state.wrote(replace(state.item, attempts=1), 61)
    script = Script(steps().retry_step(state, 10, "boom", None), [written(62), written(63)])
    assert script.result() == (10, 63)
    assert Item.decode(script.sent[0].value).attempts == 2
    assert Lock.decode(script.sent[1].value).reason == "boom"


# -- the heartbeat's refresh -----------------------------------------------------
def test_a_refresh_is_a_cas_on_our_lock_and_confirms_it_from_its_send() -> None:
    state = claimed_state()
    script = Script(steps().confirm_step(state), [500.0, node(60, OURS.encode())])
    script.result()
    assert script.sent[1] == Request("PUT", LOCK_KEY, ttl=LOCK_TTL, prev_exist=True,
                                     prev_value=OURS.encode(), refresh=True)
    assert state.confirmed == 500.0


def test_a_refresh_finding_another_claims_lock_loses_the_claim() -> None:
    state = claimed_state()
    with pytest.raises(LockLost):
        Script(steps().confirm_step(state), [500.0, compare_failed()]).result()
    assert state.confirmed == float("-inf")


def test_a_lock_retaken_after_another_claim_came_and_went_is_let_go() -> None:
    """The lock expired; the item was ours at the first check, then another
    claim took it and gave it back before our create: the second check finds
    their token, so the lock we created is dropped and the claim is lost."""
    state = claimed_state()
    ours = Item("payload", "put-token", 1, OURS.token, 1.0).encode()
    theirs = Item("payload", "put-token", 1, "their-token", 1.0).encode()
    script = Script(steps().confirm_step(state),
                    [500.0, missing(), node(60, ours), written(90), node(85, theirs),
                     written(91)])
    with pytest.raises(LockLost):
        script.result()
    assert [r.method for r in script.sent] == ["NOW", "PUT", "GET", "PUT", "GET", "DELETE"]
    assert script.sent[3].prev_exist is False
    assert script.sent[5] == Request("DELETE", LOCK_KEY, prev_value=OURS.encode())
    assert state.confirmed == float("-inf")


# -- the driver --------------------------------------------------------------
class FakeTransport:
    """Answers as etcd would for one missing key; counts what it was sent."""

    class Clock:
        def boot_clock(self) -> float:
            return 7.0

    runtime = Clock()

    def __init__(self) -> None:
        self.calls: List[str] = []

    def get(self, key: str, **_: Any) -> Reply:
        self.calls.append(f"GET {key}")
        raise missing()


def test_the_driver_throws_a_requests_error_into_the_step_and_returns_its_result() -> None:
    def step() -> Step[str]:
        seconds = yield Request("NOW")
        try:
            yield Request("GET", WORK, quorum=True)
        except EtcdqError as exc:
            return f"{type(exc).__name__} at {seconds}"
        return "no error"

    transport = FakeTransport()
    assert run(step(), transport) == "KeyMissing at 7.0"  # type: ignore[arg-type]
    assert transport.calls == [f"GET {WORK}"]


# -- P1, put_many ------------------------------------------------------------------
PUT_RAW = Item("payload", "put-token", 0, None, 1.0).encode()


def lost_post() -> AmbiguousWrite:
    return AmbiguousWrite("the reply to a POST was lost")


def posted(index: int) -> Reply:
    """A POST's reply: the in-order key etcd made, named by its index."""
    return node(index, PUT_RAW, key=LAYOUT.key("work", f"{index:020d}"))


def listing(*nodes: Dict[str, Any], index: int = 90) -> Reply:
    return Reply(json.dumps({"node": {"dir": True, "nodes": list(nodes)}}).encode(), index)


def work_node(n: int, value: str) -> Dict[str, Any]:
    return {"key": LAYOUT.key("work", f"{n:020d}"), "modifiedIndex": n, "value": value}


def span_reads(kind: str, first: int, last: int) -> Request:
    return Request("ALL", together=tuple(Request("GET", LAYOUT.key(kind, f"{n:020d}"),
                                                  quorum=True) for n in range(first, last + 1)))


def test_p1_reads_the_index_seen_before_its_post_and_names_the_item_by_the_reply() -> None:
    script = Script(steps().post_step(PUT_RAW, "put-token"), [40, posted(41)])
    assert script.result() == (f"{41:020d}", Version(41, PUT_RAW))
    assert script.sent == [Request("SEEN"), Request("POST", LAYOUT.work, PUT_RAW)]


def test_p1_whose_reply_was_lost_is_found_in_the_span_at_the_version_read() -> None:
    """The POST applied (index 42) and a claim changed the item since (index 43):
    the put gives the version it read, never the index read with the value sent."""
    claimed = Item("payload", "put-token", 1, "someone", 1.0).encode()
    script = Script(steps().post_step(PUT_RAW, "put-token"),
                    [40, lost_post(), missing(43), [missing(43), node(43, claimed),
                                                    missing(43)]])
    assert script.result() == (f"{42:020d}", Version(43, claimed))
    assert script.sent[2:] == [Request("GET", LAYOUT.key("work", "0" * 20), quorum=True),
                               span_reads("work", 41, 43)]


def test_p1_lost_and_not_in_the_span_is_settled_by_the_listings_without_a_resend() -> None:
    """Only a find is trusted from the span; a miss lists work/, completed/ and
    failed/ (quorum); not found anywhere: Unavailable, and no second POST."""
    script = Script(steps().post_step(PUT_RAW, "put-token"),
                    [40, lost_post(), missing(41), [missing(41)], [missing(41)], [missing(41)],
                     listing(), missing(41), missing(41), 1.0])
    with pytest.raises(Unavailable, match="may or may not be stored"):
        script.result()
    assert [request.method for request in script.sent].count("POST") == 1
    assert script.sent[6:9] == [Request("GET", LAYOUT.dir(kind), quorum=True, sorted=True)
                                for kind in ("work", COMPLETED, FAILED)]
    assert script.sent[-1] == Request("DEADLINE")  # completed records expire: it may have run


def test_p1_lost_over_a_wide_span_lists_and_finds_a_finished_item_as_no_version() -> None:
    record = Record("payload", "claim", "node-b", 1, 1.0, 2.0, token="put-token")
    done = {"key": LAYOUT.key(COMPLETED, f"{41:020d}"), "modifiedIndex": 300,
            "value": record.encode(outcome=COMPLETED)}
    script = Script(steps().post_step(PUT_RAW, "put-token"),
                    [40, lost_post(), missing(400), listing(), listing(done)])
    assert script.result() == (f"{41:020d}", None)
    assert script.sent[2:] == [Request("GET", LAYOUT.key("work", "0" * 20), quorum=True)] + [
        Request("GET", LAYOUT.dir(kind), quorum=True, sorted=True)
        for kind in ("work", COMPLETED)]


def test_put_many_settles_its_posts_in_doubt_by_one_search_then_posts_the_rest() -> None:
    """A round: the first POST stored, the second in doubt, the third not sent.
    The doubt is looked for (found in the span), then the third goes alone."""
    other = Item("other", "token-2", 0, None, 1.0).encode()
    third = Item("third", "token-3", 0, None, 1.0).encode()
    items = [(PUT_RAW, "put-token"), (other, "token-2"), (third, "token-3")]
    script = Script(steps().post_many_step(items, 2),
                    [40, [written(41), lost_post(), None],
                     missing(42), [missing(42), node(42, other)],
                     42, [written(43)]])
    assert script.result() == [(f"{41:020d}", Version(41, PUT_RAW)),
                               (f"{42:020d}", Version(42, other)),
                               (f"{43:020d}", Version(43, third))]
    assert script.sent[1] == Request("POSTS", LAYOUT.work, together=tuple(
        Request("POST", LAYOUT.work, raw) for raw, _ in items), lanes=2)
    assert script.sent[5] == Request("POSTS", LAYOUT.work,
                                     together=(Request("POST", LAYOUT.work, third),), lanes=2)


def test_put_many_with_a_post_in_doubt_not_found_is_unavailable_and_sends_no_more() -> None:
    other = Item("other", "token-2", 0, None, 1.0).encode()
    script = Script(steps().post_many_step([(PUT_RAW, "put-token"), (other, "token-2")], 2),
                    [0, [written(41), lost_post()], listing(), listing(), listing(), 1.0])
    with pytest.raises(Unavailable, match="1 of the puts"):
        script.result()
    assert [request.method for request in script.sent].count("POSTS") == 1


# -- D1, D2 ------------------------------------------------------------------------
DELAY_LOCK = Lock("node-a", "put-token", delay=True).encode()


def lock_posted(index: int) -> Reply:
    return node(index, DELAY_LOCK, key=LAYOUT.key("locks", f"{index:020d}"))


def test_d1_posts_a_delay_lock_and_d2_creates_the_item_under_its_name() -> None:
    script = Script(steps().put_delayed_step(PUT_RAW, "put-token", 3),
                    [10.0, 3.0, lock_posted(70), written(71)])
    assert script.result() == (f"{70:020d}", Version(71, PUT_RAW), 70)
    assert script.sent == [Request("MONOTONIC"), Request("DEADLINE"),
                           Request("POST", LAYOUT.locks, DELAY_LOCK, ttl=3),
                           Request("PUT", LAYOUT.key("work", f"{70:020d}"), PUT_RAW,
                                   prev_exist=False)]


def test_d1_whose_reply_was_lost_posts_another_lock_until_the_deadline() -> None:
    """A lost D1 is not read back: the first lock, if it applied, holds no item
    and expires.  Past the deadline nothing was stored: Unavailable."""
    script = Script(steps().put_delayed_step(PUT_RAW, "put-token", 3),
                    [10.0, 3.0, lost_post(), 11.0, None, lost_post(), 13.5])
    with pytest.raises(Unavailable, match="nothing was stored"):
        script.result()
    assert script.sent[3:5] == [Request("MONOTONIC"), Request("SLEEP", seconds=0.1)]
    assert [request.method for request in script.sent].count("POST") == 2


def test_d2_already_exists_is_read_back_and_our_put_token_is_our_item_as_read() -> None:
    """The transport resent D2; our first copy applied and a claim changed it
    since: the item as read, never D2's value with the index read."""
    claimed = Item("payload", "put-token", 1, "someone", 1.0).encode()
    exists = AlreadyExists("Key already exists", code=AlreadyExists.code, index=75)
    script = Script(steps().put_delayed_step(PUT_RAW, "put-token", 3),
                    [10.0, 3.0, lock_posted(70), exists, node(74, claimed)])
    assert script.result() == (f"{70:020d}", Version(74, claimed), 70)
    assert script.sent[-1] == Request("GET", LAYOUT.key("work", f"{70:020d}"), quorum=True)


def test_d2_already_exists_with_a_record_of_our_put_token_is_finished() -> None:
    record = Record("payload", "claim", "node-b", 1, 1.0, 2.0, token="put-token")
    exists = AlreadyExists("Key already exists", code=AlreadyExists.code, index=75)
    script = Script(steps().put_delayed_step(PUT_RAW, "put-token", 3),
                    [10.0, 3.0, lock_posted(70), exists, missing(),
                     node(76, record.encode(outcome=COMPLETED))])
    assert script.result() == (f"{70:020d}", None, 70)


def test_d2_unanswered_is_unavailable_saying_the_item_is_stored_at_most_once() -> None:
    script = Script(steps().put_delayed_step(PUT_RAW, "put-token", 3),
                    [10.0, 3.0, lock_posted(70), Unavailable("no member answered")])
    with pytest.raises(Unavailable, match="stored once"):
        script.result()


# -- W2, get: one look at an id ------------------------------------------------------
def test_a_look_reads_work_first_and_judges_each_record_by_the_item_there() -> None:
    """work/<id> is read before the records: a record read first could be judged
    against a work/ read after its item left and another item took the id.  A
    record of another put token beside the item is not its outcome (it is
    pending); its own is; with work/<id> gone, any record is."""
    own = Record("payload", "claim", "node-b", 1, 1.0, 2.0, "done", token="put-token").encode()
    pending = Script(steps().look_step(ITEM),
                     [node(40, unclaimed(1)), node(20, ANOTHER_ITEMS), missing()])
    assert pending.result()[1] is None
    assert [r.key for r in pending.sent] == [WORK, LAYOUT.key(COMPLETED, ITEM),
                                             LAYOUT.key(FAILED, ITEM)]
    finished = Script(steps().look_step(ITEM), [node(40, unclaimed(1)), node(20, own)])
    assert finished.result()[1] == (COMPLETED, Record.decode(own))
    gone = Script(steps().look_step(ITEM), [missing(), node(20, ANOTHER_ITEMS)])
    assert gone.result() == (None, (COMPLETED, Record.decode(ANOTHER_ITEMS)))
    assert gone.sent[0] == Request("GET", WORK, quorum=True)


# -- Q0-Q5 -------------------------------------------------------------------------
DEAD = Record("payload", "dead-claim", "node-b", 3, 1.0, 2.0, reason="boom", token="put-token")
DEAD_KEY = LAYOUT.key(FAILED, ITEM)
REQUEUER = Lock("node-a", "requeue-lock")
MARKED = replace(DEAD, requeue_token="rq-token").encode(outcome=FAILED, stored=True)


def requeue_answers_to_q1(dead: Record = DEAD, in_work: Any = None) -> List[Any]:
    """Q0 (token, clocks, the dead letter read, C1 made) and Q1 (``work/<id>``
    read, none by default; the dead letter read again, a requeue token, the
    marking CAS at index 81)."""
    raw = dead.encode(outcome=FAILED, stored=True)
    return ["requeue-lock", 10.0, 3.0, node(70, raw), written(80), in_work or missing(),
            node(70, raw), "rq-token", written(81)]


def test_requeue_marks_the_dead_letter_then_creates_the_item_named_by_q1s_index() -> None:
    script = Script(steps().requeue_step(ITEM),
                    requeue_answers_to_q1() + [node(81, MARKED), 5.0, written(82), written(83),
                                               written(84)])
    new_id = f"{81:020d}"
    sent = script.result()
    q3 = script.sent[11]
    assert (q3.method, q3.key, q3.prev_exist) == ("PUT", LAYOUT.key("work", new_id), False)
    assert sent == (new_id, Version(82, q3.value))
    item = Item.decode(q3.value)
    assert (item.token, item.requeued, item.attempts) == ("rq-token", True, 0)
    q1 = script.sent[8]
    assert (q1.key, q1.prev_index) == (DEAD_KEY, 70)
    assert Record.decode(q1.value).requeue_token == "rq-token"
    assert script.sent[5] == Request("GET", WORK, quorum=True)  # before the dead letter
    assert script.sent[9:11] == [Request("GET", DEAD_KEY, quorum=True), Request("WALL")]
    assert script.sent[12:] == [
        Request("PUT", DEAD_KEY, tombstone(new_id, "put-token"), ttl=TOMBSTONE_TTL,
                prev_index=81),
        Request("DELETE", LOCK_KEY, prev_value=REQUEUER.encode())]


def test_q1_whose_cas_failed_after_a_resend_takes_the_token_its_first_copy_wrote() -> None:
    """Only a resent CAS of ours can change the dead letter under our lock: Q1
    reads it again and keeps the requeue token it finds; no new token."""
    answers = requeue_answers_to_q1()[:-1] + [compare_failed(81), node(81, MARKED),
                                              node(81, MARKED), 5.0, written(82), written(83),
                                              written(84)]
    script = Script(steps().requeue_step(ITEM), answers)
    assert script.result()[0] == f"{81:020d}"
    assert [request.method for request in script.sent].count("TOKEN") == 2  # lock, Q1


def test_q1_whose_cas_keeps_failing_gives_up_after_a_few_reads_and_drops_its_lock() -> None:
    """A bounded loop, not a recursion: each failed CAS reads the dead letter again."""
    raw = DEAD.encode(outcome=FAILED, stored=True)
    answers = requeue_answers_to_q1()[:-1] + [compare_failed(81)]
    answers += [node(70, raw), compare_failed(81)] * 4 + [written(90)]  # the lock dropped
    script = Script(steps().requeue_step(ITEM), answers)
    with pytest.raises(Unavailable, match="kept changing"):
        script.result()
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=REQUEUER.encode())
    assert all(r.prev_value is None for r in script.sent if r.key == DEAD_KEY)


def test_q2_removes_the_dead_letters_own_item_a_crash_left_in_work() -> None:
    committed = DEAD.encode(outcome=FAILED, stored=True)
    script = Script(steps().requeue_step(ITEM),
                    requeue_answers_to_q1(in_work=node(69, committed))
                    + [node(81, MARKED), written(82), node(81, MARKED), 5.0, written(83),
                       written(84), written(85)])
    script.result()
    assert script.sent[10] == Request("DELETE", WORK, prev_index=69)
    assert script.sent[9] == script.sent[11] == Request("GET", DEAD_KEY, quorum=True)


def test_q4_on_a_dead_letter_gone_since_q1_creates_the_tombstone_and_warns_on_junk() -> None:
    """"Not found" at the CAS: expired or purged since Q1, so Q4 creates it
    (prevExist=false); junk there is left as it is."""
    new_id = f"{81:020d}"
    script = Script(steps().requeue_step(ITEM),
                    requeue_answers_to_q1() + [node(81, MARKED), 5.0, written(82), missing(),
                                               missing(), written(84), written(85)])
    script.result()
    assert script.sent[-2] == Request("PUT", DEAD_KEY, tombstone(new_id, "put-token"),
                                      ttl=TOMBSTONE_TTL, prev_exist=False)


def test_q3_is_not_sent_once_etcd_lost_q1s_mark_and_a_dead_letter_gone_is_not_found() -> None:
    """Etcd restored from a backup older than Q1 holds no such dead letter now
    (maybe the item it came from, in work/): a Q3 from what Q1 read would store
    the payload a second time.  Q1 again finds nothing: NotFound, lock dropped."""
    script = Script(steps().requeue_step(ITEM),
                    requeue_answers_to_q1() + [missing(), missing(), missing(), written(82)])
    with pytest.raises(NotFound):
        script.result()
    assert not [r for r in script.sent if r.method == "PUT" and r.key.startswith(LAYOUT.dir("work"))]
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=REQUEUER.encode())


def test_a_dead_letter_whose_mark_etcd_lost_is_marked_again_and_named_by_the_new_mark() -> None:
    """Restored from a backup taken between the dead-lettering and Q1: the dead
    letter is there unmarked.  The requeue starts again from work/: Q1 marks
    it with a new token, and Q3 names the item by the new mark's index."""
    raw = DEAD.encode(outcome=FAILED, stored=True)
    remarked = replace(DEAD, requeue_token="rq-token-2").encode(outcome=FAILED, stored=True)
    script = Script(steps().requeue_step(ITEM),
                    requeue_answers_to_q1() + [node(70, raw), missing(), node(70, raw),
                                               "rq-token-2", written(75), node(75, remarked),
                                               5.0, written(76), written(77), written(78)])
    new_id, _ = script.result()
    assert new_id == f"{75:020d}"
    assert Item.decode(script.sent[-3].value).token == "rq-token-2"


def test_a_requeue_whose_mark_etcd_keeps_losing_gives_up_after_3_rounds_creating_nothing() -> None:
    """A bounded loop: each round's mark is gone at Q2's read (restored again)."""
    raw = DEAD.encode(outcome=FAILED, stored=True)
    answers = requeue_answers_to_q1() + [node(70, raw)]
    for index in (75, 76):
        answers += [missing(), node(70, raw), f"rq-{index}", written(index), node(70, raw)]
    script = Script(steps().requeue_step(ITEM), answers + [written(77)])
    with pytest.raises(Unavailable, match="3 times"):
        script.result()
    assert not [r for r in script.sent if r.key.startswith(LAYOUT.dir("work")) and r.method != "GET"]
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=REQUEUER.encode())


def test_q0_on_a_dead_letter_gone_is_not_found_and_writes_nothing() -> None:
    script = Script(steps().requeue_step(ITEM), ["requeue-lock", 10.0, 3.0, missing()])
    with pytest.raises(NotFound):
        script.result()


def test_a_requeue_that_fails_after_q0_drops_its_lock() -> None:
    raw = DEAD.encode(outcome=FAILED, stored=True)
    script = Script(steps().requeue_step(ITEM),
                    ["requeue-lock", 10.0, 3.0, node(70, raw), written(80),
                     Unavailable("no member answered"), written(81)])
    with pytest.raises(Unavailable):
        script.result()
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=REQUEUER.encode())


def test_a_requeue_done_through_q4_returns_its_new_id_when_only_q5_fails() -> None:
    """Q3 created the item and Q4 buried the dead letter: the requeue is done, and
    its lock expires if Q5 cannot drop it (docs/protocol.md's table: "Q4 | the lock
    expires").  The new id is returned; a retry could not learn it (the dead letter
    is a tombstone now: NotFound, once the lock expired)."""
    script = Script(steps().requeue_step(ITEM),
                    requeue_answers_to_q1() + [node(81, MARKED), 5.0, written(82), written(83),
                                               Unavailable("no member answered")])
    new_id, _ = script.result()
    assert new_id == f"{81:020d}"


def test_q0_takes_over_the_lock_the_dead_letters_finisher_left_to_expire() -> None:
    raw = DEAD.encode(outcome=FAILED, stored=True)
    finishers = Lock("node-b", "dead-claim").encode()
    taken = AlreadyExists("Key already exists", code=AlreadyExists.code, index=79)
    script = Script(steps()._lock_dead_letter(ITEM),
                    ["requeue-lock", 10.0, 3.0, node(70, raw), taken, node(60, finishers),
                     missing(), written(80)])
    assert script.result() == REQUEUER
    assert script.sent[-1] == Request("PUT", LOCK_KEY, REQUEUER.encode(), ttl=LOCK_TTL,
                                      prev_value=finishers)


def test_q0_waits_for_another_requeues_lock_then_gives_up() -> None:
    raw = DEAD.encode(outcome=FAILED, stored=True)
    taken = AlreadyExists("Key already exists", code=AlreadyExists.code, index=79)
    others = Lock("node-c", "another-requeue").encode()
    script = Script(steps()._lock_dead_letter(ITEM),
                    ["requeue-lock", 10.0, 3.0, node(70, raw), taken, node(60, others),
                     12.0, None, node(70, raw), taken, node(60, others), 44.0])
    with pytest.raises(Unavailable, match="stayed locked"):
        script.result()
    assert Request("SLEEP", seconds=0.1) in script.sent


# -- K1-K4 -------------------------------------------------------------------------
CANCELLER = Lock("node-a", "cancel-token", delay=True)


def cancel_to_k2(item: str, locked_at: int = 50) -> List[Any]:
    """K1 (a token, C1 made at ``locked_at``), K2 (the item read: ``item``, at
    index 40; the boot clock)."""
    return ["cancel-token", written(locked_at), node(40, item), 100.0]


def test_a_cancel_commits_the_pending_item_as_read_under_its_lock_and_records_it() -> None:
    """K1, K2, the lock still the one K1 made, K3 (F1 on K2's index), K4 (F2-F4:
    the lock lingers at this lock_ttl, so only work/ is deleted)."""
    script = Script(steps().cancel_step(ITEM),
                    cancel_to_k2(unclaimed()) + [node(50, CANCELLER.encode()), 5.0,
                                                 written(60), written(61), missing(), [written(62)]])
    assert script.result() is True
    assert script.sent[0:2] == [Request("TOKEN"), Request("PUT", LOCK_KEY, CANCELLER.encode(),
                                                          ttl=LOCK_TTL, prev_exist=False)]
    assert script.sent[2:5] == [Request("GET", WORK, quorum=True), Request("NOW"),
                                Request("GET", LOCK_KEY, quorum=True)]
    k3 = script.sent[6]
    assert (k3.key, k3.prev_index) == (WORK, 40)
    assert Record.decode(k3.value).reason == "cancelled"


def test_k2_does_not_count_another_item_s_record_as_the_item_finished() -> None:
    """An item claimed before, with a record of another put token in completed/
    (another item that had the id): K2 deletes that record on its index, while
    the item is in work/ (once it left, completed/<id> would be read as its
    outcome), goes on; K3 commits it, F2 writes failed/."""
    script = Script(steps().cancel_step(ITEM),
                    cancel_to_k2(unclaimed(1)) + [node(20, ANOTHER_ITEMS), written(21),
                                                  missing(), node(50, CANCELLER.encode()),
                                                  5.0, written(60), written(61),
                                                  missing(), [written(62)]])
    assert script.result() is True
    assert script.sent[5] == Request("DELETE", LAYOUT.key(COMPLETED, ITEM), prev_index=20)
    assert (script.sent[9].key, script.sent[9].prev_index) == (WORK, 40)


def test_a_cancel_on_a_claims_lock_is_false_and_writes_nothing() -> None:
    taken = AlreadyExists("Key already exists", code=AlreadyExists.code, index=51)
    script = Script(steps().cancel_step(ITEM),
                    ["cancel-token", taken, node(50, OURS.encode(), ttl=20)])
    assert script.result() is False
    assert [request.method for request in script.sent] == ["TOKEN", "PUT", "GET"]


def test_k1_takes_a_delay_lock_over_never_shortening_it_and_drops_it_after_k4() -> None:
    """A release's backoff lock with 90 s left: CAS on its value, ttl 90.  Locks
    linger at this lock_ttl (F4 skipped), so after K4 the taken-over lock, which
    may have hours of TTL, is dropped."""
    backoff = Lock("node-b", "claim-b", delay=True).encode()
    taken = AlreadyExists("Key already exists", code=AlreadyExists.code, index=51)
    script = Script(steps().cancel_step(ITEM),
                    ["cancel-token", taken, node(45, backoff, ttl=90), written(52),
                     node(40, unclaimed(1, "claim-b")), 100.0, missing(), missing(),
                     node(52, CANCELLER.encode()), 5.0, written(60), written(61),
                     missing(), [written(62)], written(63)])
    assert script.result() is True
    assert script.sent[3] == Request("PUT", LOCK_KEY, CANCELLER.encode(), ttl=90,
                                     prev_value=backoff)
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=CANCELLER.encode())


def test_a_cancel_that_fails_after_taking_a_delay_lock_over_leaves_it_to_expire() -> None:
    """Dropping it would make the delayed item claimable early."""
    backoff = Lock("node-b", "claim-b", delay=True).encode()
    taken = AlreadyExists("Key already exists", code=AlreadyExists.code, index=51)
    script = Script(steps().cancel_step(ITEM),
                    ["cancel-token", taken, node(45, backoff, ttl=90), written(52),
                     Unavailable("no member answered")])
    with pytest.raises(Unavailable):
        script.result()
    assert script.sent[-1] == Request("GET", WORK, quorum=True)


def test_k1_take_over_whose_cas_failed_after_a_resend_reads_our_lock_back() -> None:
    backoff = Lock("node-b", "claim-b", delay=True).encode()
    taken = AlreadyExists("Key already exists", code=AlreadyExists.code, index=51)
    script = Script(steps()._cancel_lock(ITEM),
                    ["cancel-token", taken, node(45, backoff, ttl=9),
                     compare_failed(53, retried=True), node(52, CANCELLER.encode())])
    assert script.result() == (CANCELLER, True, 52)


def test_a_cancel_whose_lock_lapsed_after_k2_starts_again_at_k1() -> None:
    """The lock read after K2 is not the one K1 made (re-created, another index):
    our lock is dropped and the cancel starts again; the second try commits."""
    script = Script(steps().cancel_step(ITEM),
                    cancel_to_k2(unclaimed()) + [node(55, CANCELLER.encode()), written(56)]
                    + cancel_to_k2(unclaimed(), 57) + [node(57, CANCELLER.encode()), 5.0,
                                                       written(60), written(61),
                                                       missing(), [written(62)]])
    assert script.result() is True
    assert script.sent[5] == Request("DELETE", LOCK_KEY, prev_value=CANCELLER.encode())


def test_a_failed_k3_on_an_item_claimed_since_k2_is_false_and_our_lock_dropped() -> None:
    claimed = Item("payload", "put-token", 1, "claim-c", 1.0).encode()
    script = Script(steps().cancel_step(ITEM),
                    cancel_to_k2(unclaimed()) + [node(50, CANCELLER.encode()), 5.0,
                                                 compare_failed(70), node(70, claimed),
                                                 node(70, claimed), written(71)])
    assert script.result() is False
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=CANCELLER.encode())


def test_a_cancel_of_an_item_neither_in_work_nor_recorded_is_not_found_and_drops_its_lock(
        ) -> None:
    script = Script(steps().cancel_step(ITEM),
                    ["cancel-token", written(50), missing(), missing(), missing(),
                     written(51)])
    with pytest.raises(NotFound):
        script.result()
    assert script.sent[-1] == Request("DELETE", LOCK_KEY, prev_value=CANCELLER.encode())


# -- purge -------------------------------------------------------------------------
def test_purge_deletes_each_record_on_its_listed_index_after_its_item_left_in_work() -> None:
    """A record whose item is still in work/ (its finisher crashed after F2) goes
    only once the item is removed (F3 on the listed index); an item committed to
    the kind without a record is removed too; each record calls ``progress``."""
    record = Record("payload", "claim", "node-b", 1, 1.0, 2.0, token="put-token")
    done = record.encode(outcome=COMPLETED)
    other = f"{43:020d}"
    work = listing({"key": WORK, "modifiedIndex": 40, "value": done},
                   {"key": LAYOUT.key("work", other), "modifiedIndex": 41, "value": done},
                   index=90)
    records = listing({"key": LAYOUT.key(COMPLETED, ITEM), "modifiedIndex": 42, "value": done},
                      {"key": LAYOUT.key(COMPLETED, f"{44:020d}"), "modifiedIndex": 44,
                       "value": done}, index=90)
    ticks: List[int] = []
    script = Script(steps().purge_step(COMPLETED, lambda: ticks.append(1)),
                    [work, records, missing(), written(91), written(92), missing(), missing(),
                     written(93)])
    assert script.result() == 2  # a record already gone (missing) does not count
    assert script.sent[2:] == [
        Request("GET", LAYOUT.key(FAILED, ITEM), quorum=True),
        Request("DELETE", WORK, prev_index=40),
        Request("DELETE", LAYOUT.key(COMPLETED, ITEM), prev_index=42),
        Request("DELETE", LAYOUT.key(COMPLETED, f"{44:020d}"), prev_index=44),
        Request("GET", LAYOUT.key(FAILED, other), quorum=True),
        Request("DELETE", LAYOUT.key("work", other), prev_index=41)]
    assert ticks == [1, 1]


def test_purge_deletes_another_item_s_record_of_the_other_kind_before_the_item() -> None:
    """A dead letter's item still in work/ (its finisher died before its read of
    completed/<id>) beside another item's completed record: that record goes,
    on its index, while the item is still in work/; once it left, a reader
    would take the record for its outcome."""
    dead = Record("payload", "claim", "node-b", 1, 1.0, 2.0, token="put-token").encode(
        outcome=FAILED)
    work = listing({"key": WORK, "modifiedIndex": 40, "value": dead}, index=90)
    records = listing({"key": LAYOUT.key(FAILED, ITEM), "modifiedIndex": 42, "value": dead},
                      index=90)
    script = Script(steps().purge_step(FAILED),
                    [work, records, node(20, ANOTHER_ITEMS), written(91), written(92),
                     written(93)])
    assert script.result() == 1
    assert script.sent[2:] == [
        Request("GET", LAYOUT.key(COMPLETED, ITEM), quorum=True),
        Request("DELETE", LAYOUT.key(COMPLETED, ITEM), prev_index=20),
        Request("DELETE", WORK, prev_index=40),
        Request("DELETE", LAYOUT.key(FAILED, ITEM), prev_index=42)]


def test_purge_keeps_the_record_of_an_item_changed_since_the_listing() -> None:
    record = Record("payload", "claim", "node-b", 1, 1.0, 2.0, token="put-token")
    done = record.encode(outcome=COMPLETED)
    work = listing({"key": WORK, "modifiedIndex": 40, "value": unclaimed()})
    records = listing({"key": LAYOUT.key(COMPLETED, ITEM), "modifiedIndex": 42, "value": done})
    script = Script(steps().purge_step(COMPLETED),
                    [work, records, missing(), compare_failed(95)])
    assert script.result() == 0
    assert script.sent[-1] == Request("DELETE", WORK, prev_index=40)


# -- I1, I3, I4 --------------------------------------------------------------------
IMPORTER = Lock("node-a", "import-token")
IMPORT_KEY = LAYOUT.key("locks", IMPORT_LOCK)


def import_state(name: Optional[int] = 60, refreshed: float = 100.0) -> ImportState:
    return ImportState(IMPORTER, set(), name, refreshed)


def test_i1_waits_for_another_imports_lock_then_gives_up() -> None:
    taken = AlreadyExists("Key already exists", code=AlreadyExists.code, index=51)
    script = Script(steps().lock_import_step(IMPORTER),
                    [10.0, 3.0, 10.0, taken, 11.0, None, 11.2, taken, 44.0])
    with pytest.raises(Unavailable, match="another import"):
        script.result()
    assert script.sent[3] == Request("PUT", IMPORT_KEY, IMPORTER.encode(), ttl=LOCK_TTL,
                                     prev_exist=False)
    assert script.sent[5] == Request("SLEEP", seconds=0.2)


def test_i1_counts_the_locks_age_from_before_the_put_that_created_it() -> None:
    script = Script(steps().lock_import_step(IMPORTER), [10.0, 3.0, 10.5, written(50)])
    assert script.result() == 10.5


def test_i3_names_the_line_by_our_previous_write_and_its_index_names_the_next() -> None:
    state = import_state()
    script = Script(steps().import_value_step(state, "work", PUT_RAW, "put-token"),
                    [101.0, written(61)])
    script.result()
    assert script.sent[1] == Request("PUT", LAYOUT.key("work", f"{60:020d}"), PUT_RAW,
                                     prev_exist=False)
    assert (state.name, state.tokens) == (61, {"put-token"})


def test_i3_refreshes_the_import_lock_every_third_of_its_ttl_and_lost_stops() -> None:
    state = import_state()
    script = Script(steps().import_value_step(state, "work", PUT_RAW, "put-token"),
                    [111.0, 111.0, missing()])
    with pytest.raises(LockLost, match="import lock"):
        script.result()
    assert script.sent[2] == Request("PUT", IMPORT_KEY, ttl=LOCK_TTL, refresh=True,
                                     prev_exist=True, prev_value=IMPORTER.encode())


def test_i3_already_exists_after_a_resend_with_our_token_is_our_copy() -> None:
    """The index of our first copy (createdIndex) names the next key."""
    state = import_state()
    exists = AlreadyExists("Key already exists", code=AlreadyExists.code, index=63)
    exists.retried = True
    script = Script(steps().import_value_step(state, "work", PUT_RAW, "put-token"),
                    [101.0, exists, node(62, PUT_RAW, createdIndex=61)])
    script.result()
    assert state.name == 61


def test_i3_already_exists_gone_again_names_the_next_by_a_fresh_i4() -> None:
    state = import_state()
    exists = AlreadyExists("Key already exists", code=AlreadyExists.code, index=63)
    exists.retried = True
    script = Script(steps().import_value_step(state, "work", PUT_RAW, "put-token"),
                    [101.0, exists, missing()])
    script.result()
    assert state.name is None  # the next import_value makes a fresh name (I4)


def test_i3_on_a_key_another_writer_took_is_rejected() -> None:
    exists = AlreadyExists("Key already exists", code=AlreadyExists.code, index=63)
    script = Script(steps().import_value_step(import_state(), "work", PUT_RAW, "put-token"),
                    [101.0, exists, node(62, unclaimed().replace("put-token", "other"),
                                         createdIndex=62)])
    with pytest.raises(EtcdRejected, match="this import did not write"):
        script.result()


class Keys:
    """A few keys of etcd v2 answering a step's requests, and the driver's
    questions; ``after(request, keys)`` runs once each request applied (a restore)."""

    def __init__(self, keys: Dict[str, str], index: int, after: Any) -> None:
        self.keys = {key: (index, value) for key, value in keys.items()}
        self.index, self.after, self.tokens = index, after, 0

    def restore(self, keys: Dict[str, str], index: int) -> None:
        self.__init__(keys, index, self.after)  # type: ignore[misc]

    def answer(self, request: Request) -> Any:
        if request.method in ("MONOTONIC", "WALL", "DEADLINE"):
            return 5.0
        if request.method == "TOKEN":
            self.tokens += 1
            return f"token-{self.tokens}"
        now = self.keys.get(request.key)
        if request.method == "GET":
            if now is None:
                raise KeyMissing("Key not found", code=KeyMissing.code, index=self.index)
            return node(now[0], now[1])
        if request.prev_exist is False and now is not None:
            raise AlreadyExists("exists", code=AlreadyExists.code, index=self.index)
        if (request.prev_index or request.prev_value) and now is None:
            raise KeyMissing("Key not found", code=KeyMissing.code, index=self.index)
        if (request.prev_index and now[0] != request.prev_index) or (
                request.prev_value and now[1] != request.prev_value):
            raise CompareFailed("Compare failed", code=CompareFailed.code, index=self.index)
        self.index += 1
        if request.method == "DELETE":
            del self.keys[request.key]
        else:
            self.keys[request.key] = (self.index, request.value)
        return written(self.index)

    def run(self, step: Step[Any]) -> Any:
        reply: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                request = step.throw(error) if error is not None else step.send(reply)
            except StopIteration as stop:
                return stop.value
            try:
                reply, error = self.answer(request), None
            except EtcdqError as exc:
                reply, error = None, exc
            self.after(request, self)


@pytest.mark.parametrize("revived", [unclaimed(1, "dead-claim"),  # pending again
                                     DEAD.encode(outcome=FAILED, stored=True)],  # F1, no F2
                         ids=["pending", "committed-without-its-record"])
def test_a_requeue_paused_across_a_restore_never_removes_the_item_the_backup_kept(
        revived: str) -> None:
    """A crash after F2 left the dead letter's commit in work/ (Q2's to remove).
    The backup predates the dead letter: after the restore, failed/<id> is
    gone and work/<id> holds the item again, pending (or committed by F1, whose
    F2 the next claimer does).  A requeue that marked the dead letter (Q1)
    before the restore must leave that item: nothing else holds its payload."""

    def restore_after_q1(request: Request, keys: Keys) -> None:
        if request.method == "PUT" and request.key == DEAD_KEY and request.prev_index:
            keys.restore({WORK: revived}, 60)

    dead = DEAD.encode(outcome=FAILED, stored=True)
    keys = Keys({DEAD_KEY: dead, WORK: dead}, 70, restore_after_q1)
    with pytest.raises(NotFound):
        keys.run(steps().requeue_step(ITEM))
    assert keys.keys.get(WORK, (0, None))[1] == revived, keys.keys


def test_a_requeue_paused_while_another_finished_it_returns_the_same_new_id() -> None:
    """Paused after Q1 past its lock's TTL, while another requeue of the same
    dead letter took the lock, found the token and ran Q2-Q5: the paused one
    finds the tombstone naming the same new id, and adds nothing."""
    others: List[Any] = []

    def another_requeues_it(request: Request, keys: Keys) -> None:
        if not others and request.method == "PUT" and request.key == DEAD_KEY:
            del keys.keys[LOCK_KEY]  # ours expired
            keys.after = lambda *_: None
            others.append(keys.run(steps().requeue_step(ITEM)))
            keys.after = another_requeues_it

    keys = Keys({DEAD_KEY: DEAD.encode(outcome=FAILED, stored=True)}, 70, another_requeues_it)
    assert keys.run(steps().requeue_step(ITEM)) == (others[0][0], None)
