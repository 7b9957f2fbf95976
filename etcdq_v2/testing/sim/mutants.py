"""Known defects, put back one at a time, to show that the simulator finds them.

Each mutant patches the narrowest rule of today's library back to what it
was (or to its equivalent) while it is active (``python -m
etcdq_v2.testing.sim --mutant NAME``; tests/test_sim.py).  ``MUTANTS`` maps
each name, which says what the defect breaks, to its patches, the invariant
expected to catch it, and the schedule that finds it (options of
:func:`~.simulation.simulate`: a defect of a lone consumer's view shows
with one consumer).  docs/simulation.md has the table of seeds it takes.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ... import viewstate as viewstate_module
from ...claim import Claim, Heartbeat
from ...errors import AmbiguousWrite, CompareFailed, KeyMissing
from ...protocol import Entry, Protocol, Version
from ...steps import Place, Step, Steps, post, put
from ...transport import Transport
from ...view import QueueView
from ...viewstate import Listing, Relist, Round, ViewState
from .net import FaultRates

#: A patch: (owner, attribute, replacement(original)).
Patch = Tuple[Any, str, Callable[[Any], Any]]


@dataclass(frozen=True)
class Mutant:
    patches: Sequence[Patch]
    invariant: str
    what: str
    #: simulate()'s options for the schedule that finds it.
    options: Dict[str, Any] = field(default_factory=dict)


# -- commits and claims ---------------------------------------------------------------
def _f1_unfenced(self: Steps, state: Any, kind: str, marked: str) -> Step[Optional[Entry]]:
    """F1 without its prevIndex fence: a stale claim's commit overwrites the
    item (every F1: a finisher's and C3's dead letter)."""
    try:
        reply = yield from put(self.layout.key("work", state.id), marked)
    except (CompareFailed, KeyMissing):
        return (yield from self._our_commit(state, kind))
    return Entry(state.id, reply.written_index, marked)


def _plain_refresh(original: Callable[..., Any]) -> Callable[..., Any]:
    """The heartbeat's refresh without its prevValue: it refreshes whoever's lock is there."""
    def put(self: Transport, key: str, value: Optional[str] = None, **kwargs: Any) -> Any:
        if "/locks/" in key and kwargs.get("refresh"):
            kwargs.pop("prev_value", None)
        return original(self, key, value, **kwargs)
    return put


def _no_time_rule(original: Callable[..., float]) -> Callable[..., float]:
    """Claim.lost without its time rule: a claim whose lock was not confirmed
    for lock_ttl still says it holds it (only a failed request tells it)."""
    def lock_left(self: Protocol, confirmed: float) -> float:
        return float("inf") if confirmed > float("-inf") else float("-inf")
    return lock_left


def _claim_unfenced(original: Callable[..., Any]) -> Callable[..., Any]:
    """Writes of work/<id> other than F1 (C2, the re-fence, R0) without prevIndex:
    a claim writes over whatever version is there."""
    def put(self: Transport, key: str, value: Optional[str] = None, **kwargs: Any) -> Any:
        if "/work/" in key and value is not None and '"o":' not in value:
            kwargs.pop("prev_index", None)
        return original(self, key, value, **kwargs)
    return put


def _short_delay(original: Callable[..., Step[Any]]) -> Callable[..., Step[Any]]:
    """D1 with a delay lock of 1 s, whatever the delay: a delayed item is claimable early."""
    def put_delayed_step(self: Steps, raw: str, token: str, ttl: int) -> Step[Any]:
        return (yield from original(self, raw, token, 1))
    return put_delayed_step


# -- puts ---------------------------------------------------------------------------
def _resend_post(original: Callable[..., Step[Place]]) -> Callable[..., Step[Place]]:
    """P1 that sends a POST again when its reply was lost, instead of searching for its token."""
    def post_step(self: Steps, raw: str, token: str) -> Step[Place]:
        try:
            node = (yield from post(self.layout.work, raw)).node
        except AmbiguousWrite:
            node = (yield from post(self.layout.work, raw)).node
        return node["key"].rsplit("/", 1)[-1], Version(node["modifiedIndex"], raw)
    return post_step


def _sent_value(place: Place, raw: str) -> Place:
    """The old read-back: the index the search read, with the value the put sent."""
    item_id, seen = place
    return item_id, None if seen is None else Version(seen.index, raw)


def _mixed_post(original: Callable[..., Step[Place]]) -> Callable[..., Step[Place]]:
    """P1's token search after a lost reply offers the index it read with the
    value the POST sent: two versions as one, once a claim or a commit
    changed the item in between."""
    def post_step(self: Steps, raw: str, token: str) -> Step[Place]:
        return _sent_value((yield from original(self, raw, token)), raw)
    return post_step


def _mixed_settled(original: Callable[..., Step[List[Place]]]
                   ) -> Callable[..., Step[List[Place]]]:
    """put_many's doubts, read back as P1's (see _mixed_post)."""
    def settled(self: Steps, items: Sequence[Tuple[str, str]], results: List[Any],
                *args: Any) -> Step[List[Place]]:
        return [_sent_value(place, raw) for place, (raw, _)
                in zip((yield from original(self, items, results, *args)), items)]
    return settled


def _mixed_delayed(original: Callable[..., Step[Optional[Version]]]
                   ) -> Callable[..., Step[Optional[Version]]]:
    """D2's read-back after "already exists", as P1's (see _mixed_post)."""
    def create_delayed(self: Steps, item_id: str, raw: str, token: str
                       ) -> Step[Optional[Version]]:
        seen = yield from original(self, item_id, raw, token)
        return None if seen is None else Version(seen.index, raw)
    return create_delayed


# -- the heartbeat and closing ---------------------------------------------------------
def _serial_beats(original: Callable[..., Any]) -> Callable[..., Any]:
    """The old serial heartbeat: one refresh at a time for all of a queue's
    claims, so one slow refresh holds the others back past their locks' life."""
    def beat(self: Heartbeat, claim: Any) -> Optional[float]:
        if "_serial" not in self.__dict__:
            self.__dict__["_serial"] = self._runtime.Lock()
        with self.__dict__["_serial"]:
            due: Optional[float] = original(self, claim)
            return due
    return beat


def _due_from_hand_out(original: Callable[..., Any]) -> Callable[..., Any]:
    """A claim's first refresh due lock_ttl/3 after its hand-out, not after C1's
    send: a claim whose C2 stalled gets it with little of its lock's life left."""
    def add(self: Heartbeat, claim: Any) -> None:
        with self._lock:
            if not self._closed:
                self._schedule(claim, self._runtime.boot_clock() + self.interval)
                return
        original(self, claim)
    return add


def _close_keeps_claims(original: Callable[..., Any]) -> Callable[..., Any]:
    """The heartbeat's close() stops refreshing without marking its claims lost."""
    def close(self: Heartbeat) -> None:
        with self._lock:
            self._closed = True
            self._forget_all()
            self._wake.notify()
            self._work.notify_all()
    return close


def _add_when_closed(original: Callable[..., Any]) -> Callable[..., Any]:
    """A claim() under way when its queue closed returns a claim not marked lost."""
    def add(self: Heartbeat, claim: Any) -> None:
        with self._lock:
            if not self._closed:
                self._schedule(claim, claim.confirmed_at + self.interval)
    return add


# -- the view: strands, starvation, order ---------------------------------------------------
def _no_round_end(original: Any) -> Any:
    """A watching round trusts its stream for as long as it stays open (no
    ROUND): on a member restored from a snapshot it misses what the snapshot
    covered, for good."""
    return math.inf


def _listing_keeps_backoff(original: Callable[..., Any]) -> Callable[..., Any]:
    """A listing of work/ that worked leaves the misses' relist backoff on:
    after a failed one, a quiet view relists up to a lock TTL late."""
    def take_listing(self: ViewState, index: int, work: Any, delayed: Any) -> None:
        kept = self.relist_after, self.work_retry
        original(self, index, work, delayed)
        self.relist_after, self.work_retry = kept
    return take_listing


def _full_listing_wrong_timer(original: Callable[..., Any]) -> Callable[..., Any]:
    """A failed once-per-lock-TTL listing of work/ is due again a lock TTL later
    (the locks/ timer it was on), not after the work/ backoff."""
    def work_unlisted(self: ViewState, relist: Relist, now: float) -> float:
        retry: float = original(self, Relist(relist.generation, False), now)
        if relist.full:
            self.locks_listed = now
        return retry
    return work_unlisted


def _catch_up_relists(original: Callable[..., Any]) -> Callable[..., Any]:
    """A catch-up goes through relist(): the view is unready until a listing
    works, and every claim of the process fails meanwhile, its own items free."""
    def catch_up_how(self: ViewState) -> str:
        return "relist"
    return catch_up_how


def _own_puts_first(original: Callable[..., Any]) -> Callable[..., Any]:
    """A watching view offers its own puts ahead of what it knows after any
    error of its follower (a stream reset), not only a failed listing of work/."""
    def catch_up_how(self: ViewState) -> str:
        self.unlisted = self.unlisted or self.error is not None
        how: str = original(self)
        return how
    return catch_up_how


def _stale_check_applied(original: Callable[..., Any]) -> Callable[..., Any]:
    """A check's listing of locks/ decided before the view listed anew is
    applied after it: an item whose lock expired unheard stays taken."""
    def apply_locks(self: ViewState, generation: int, relists: Optional[int],
                    locks: Listing, **kwargs: Any) -> None:
        original(self, generation, None, locks, **kwargs)
    return apply_locks


def _replaced_follower_applied(original: Callable[..., Any]) -> Callable[..., Any]:
    """A listing of locks/ decided under a round since replaced is applied:
    older than the new round's events, it marks a released item locked."""
    def apply_locks(self: ViewState, generation: int, relists: Optional[int],
                    locks: Listing, **kwargs: Any) -> None:
        original(self, self.generation, relists, locks, **kwargs)
    return apply_locks


def _gone_sign_dropped(original: Callable[..., Any]) -> Callable[..., Any]:
    """A sign that the lock went, arriving while a claim attempt on the item is
    under way, is dropped: the attempt's end marks the item taken after its lock went."""
    def unlocked(self: ViewState, item_id: str, index: int) -> None:
        trying = self.trying.pop(item_id, None)
        try:
            original(self, item_id, index)
        finally:
            if trying is not None:
                self.trying[item_id] = trying
                self.gone.pop(item_id, None)
    return unlocked


def _list_once(original: Callable[..., Any]) -> Callable[..., Any]:
    """A watching round whose stream ended (or whose ROUND did) subscribes
    again without listing: what was written between the two streams is never
    seen.  The rule is the driver's: _Follower._follow lists on each stream."""
    def list_(self: QueueView, round_: Round, since: Optional[int]) -> Dict[str, int]:
        floors = self.__dict__.setdefault("_floors", {})
        if round_.watching and round_.generation in floors:
            return dict(floors[round_.generation])
        listed: Dict[str, int] = original(self, round_, since)
        floors[round_.generation] = dict(listed)
        return listed
    return list_


def _record_forgets(original: Callable[..., Any]) -> Callable[..., Any]:
    """An outcome record's event makes every view forget the item, also while
    its finisher's lock is there: a finisher that dies between F2 and F3 leaves
    it in work/, unknown to the views that watch, until their next listing."""
    def record(self: ViewState, item_id: str, now: float) -> None:
        self.forget(item_id)
    return record


def _orphans_waited_for(original: Callable[..., Any]) -> Callable[..., Any]:
    """Orphans (recorded items whose F3 never came) are offered only to a claim
    that waits (wait_for_change), not at a claim round's tick: a walk that
    dropped one leaves it out while claims find other work."""
    def tick(self: ViewState, now: float) -> Any:
        orphans, self.orphans = self.orphans, {}
        try:
            return original(self, now)
        finally:
            self.orphans = orphans
    return tick


MUTANTS: Dict[str, Mutant] = {
    "f1-unfenced": Mutant(
        [(Steps, "commit_step", lambda _: _f1_unfenced)], "no-commit-after-reclaim",
        "F1 (the commit of an outcome on work/<id>) without its prevIndex fence"),
    "heartbeat-plain-refresh": Mutant(
        [(Transport, "put", _plain_refresh)], "refresh-of-own-lock",
        "the heartbeat's refresh as a plain refresh, not a CAS on the lock's value"),
    "lost-without-time-rule": Mutant(
        [(Protocol, "lock_left", _no_time_rule)], "one-live-claim",
        "Claim.lost only from a failed request, not from lock_ttl passing without a "
        "confirmation"),
    "claim-unfenced": Mutant(
        [(Transport, "put", _claim_unfenced)], "no-hand-out-after-outcome",
        "C2, the re-fence and R0 without their prevIndex fence"),
    "delay-lock-short": Mutant(
        [(Steps, "put_delayed_step", _short_delay)], "delay-kept",
        "a delayed put's lock of 1 s, whatever its delay"),
    "resend-lost-post": Mutant(
        [(Steps, "post_step", _resend_post)], "stored-once",
        "a put whose POST reply was lost sends it again"),
    "read-back-mixes-versions": Mutant(
        [(Steps, "post_step", _mixed_post), (Steps, "_settled", _mixed_settled),
         (Steps, "_create_delayed", _mixed_delayed)], "one-version",
        "a put's read-back after a lost reply offers the index it read with the value "
        "the put sent (C2 on it undoes a commit)", {"rates": FaultRates(slow_reply=0.05), "follow_ups": 1.0, "consumers": 5}),
    "round-without-end": Mutant(
        [(viewstate_module, "ROUND", _no_round_end)], "view-knows-work",
        "a watching round that trusts its stream until it ends (no ROUND): a stream on "
        "a member restored from a snapshot misses items for good",
        {"consumers": 1, "workers": 0, "rates": FaultRates(lag=0.05, restore=1.0)}),
    "heartbeat-serial": Mutant(
        [(Heartbeat, "_beat", _serial_beats)], "heartbeat-on-time",
        "the queue's refreshes one at a time: one slow refresh makes others miss "
        "their lock's life"),
    "heartbeat-due-from-hand-out": Mutant(
        [(Heartbeat, "add", _due_from_hand_out)], "heartbeat-on-time",
        "a claim's first refresh scheduled from its hand-out, not from C1's send"),
    "claim-never-disowned": Mutant(
        [(Claim, "_disown", lambda original: lambda self: None)], "own-claims-live",
        "a claim whose heartbeat stops keeping its lock (lost, abandoned, closed) "
        "never tells the view: its sign stays trusted as a live claim's"),
    "closed-queue-claims-not-lost": Mutant(
        [(Heartbeat, "close", _close_keeps_claims), (Heartbeat, "add", _add_when_closed)],
        "closed-claims-lost",
        "a closed queue's claims (and one a claim() under way hands out) not marked lost: "
        "nothing refreshes them, and they say they hold their item"),
    "listing-keeps-relist-backoff": Mutant(
        [(ViewState, "take_listing", _listing_keeps_backoff)], "lone-put-order",
        "a listing of work/ that worked leaves the relist backoff of a failed one on",
        {"consumers": 1, "workers": 0}),
    "full-listing-wrong-timer": Mutant(
        [(ViewState, "work_unlisted", _full_listing_wrong_timer)], "view-taken-freed",
        "a failed once-per-lock-TTL listing due again a lock TTL later, not after the "
        "work/ backoff", {"consumers": 1, "workers": 0}),
    "catch-up-makes-view-unready": Mutant(
        [(ViewState, "catch_up_how", _catch_up_relists)], "lone-put-order",
        "a catch-up for own puts through relist(): the view unready, claims failing",
        {"consumers": 1, "workers": 0}),
    "own-puts-first-after-stream-error": Mutant(
        [(ViewState, "catch_up_how", _own_puts_first)], "lone-put-order",
        "own puts offered ahead of older items after any follower error, not only a "
        "failed listing of work/", {"consumers": 1, "workers": 0}),
    "stale-lock-check-applied": Mutant(
        [(ViewState, "apply_locks", _stale_check_applied)], "view-taken-freed",
        "a check's listing of locks/ applied after the follower listed anew"),
    "replaced-follower-listing-applied": Mutant(
        [(ViewState, "apply_locks", _replaced_follower_applied)], "view-taken-freed",
        "a listing of locks/ decided under a replaced follower applied after the new "
        "one's events"),
    "gone-sign-dropped-during-attempt": Mutant(
        [(ViewState, "unlocked", _gone_sign_dropped)], "view-taken-freed",
        "a sign that a lock went, arriving during a claim attempt, dropped (the "
        "trying rule)"),
    "stream-end-without-relisting": Mutant(
        [(QueueView, "_list", _list_once)], "view-knows-work",
        "a watching follower whose stream ended subscribes again without listing "
        "work/ and locks/", {"consumers": 1, "workers": 0}),
    "record-forgets-item": Mutant(
        [(ViewState, "_record", _record_forgets)], "view-knows-work",
        "an outcome record's event forgets its item while its finisher's lock is there",
        {"rates": FaultRates(silence_stream=0, restore=0), "kills": 1.0, "record_kills": 1.0}),
    "orphans-never-offered": Mutant(
        [(ViewState, "tick", _orphans_waited_for)], "orphans-offered",
        "recorded items whose F3 never came offered only to a claim that waits",
        # The schedule that makes orphans: F4 sent beside F3, c0 killed at a lock's
        # DELETE with F3 reset in a third of the pipelines (docs/simulation.md);
        # and a steady producer, so that c1's claims keep finding other work.
        {"send_f4": True, "kills": 1.0, "record_kills": 0.0,
         "lock_delete_kills": 1.0, "rates": FaultRates(reset=0.3, silence_stream=0, restore=0),
         "consumers": 2, "workers": 0, "steady_producer": 30.0}),
}


@contextlib.contextmanager
def mutant(name: Optional[str]) -> Iterator[None]:
    """While active, the library has the defect ``name`` (None: none)."""
    if name is None:
        yield
        return
    undo: List[Tuple[Any, str, Any]] = []
    try:
        for owner, attribute, replace in MUTANTS[name].patches:
            original = owner.__dict__[attribute]
            undo.append((owner, attribute, original))
            setattr(owner, attribute, replace(original))
        yield
    finally:
        for owner, attribute, original in reversed(undo):
            setattr(owner, attribute, original)
