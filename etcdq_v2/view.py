"""A consumer's view of the queue: the items in work/ and which are locked, kept current.

This module is the view's threaded driver: the follower threads that make
its rounds (subscribe, list, apply events), the lock, the claimers' wake-ups
(:attr:`QueueView.version`, :meth:`QueueView.add_waker`), and the requests
to etcd.  The view's state and every rule live in :mod:`etcdq_v2.viewstate`,
which does no I/O: the driver feeds it each reply, stream block and failure
with the time, and carries out what it returns.  Its public methods are what
queue.py and claim.py call; each one's rule is the state method it names.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Sequence, Set, TypeVar

from .errors import EtcdqError, Unavailable
from .keys import Layout
from .protocol import Protocol
from .runtime import EventLike
from .transport import EventStream, Refused
from .versions import Version
from .viewstate import (COALESCE, Candidate, Listing, LockRead, Relist, Round, Switch, ViewState,
                        round_pause)

log = logging.getLogger("etcdq_v2.view")
_T = TypeVar("_T")

__all__ = ["Candidate", "QueueView"]


class QueueView:
    """work/ and the locked items of one queue, kept by follower threads.

    The threaded driver of :class:`~etcdq_v2.viewstate.ViewState` (``state``):
    it makes the requests the state asks for, feeds their replies to it with
    the time, holds the lock around it, and wakes the claimers when its
    version changes.  Every rule is the state's."""

    def __init__(self, protocol: Protocol, *, idle_timeout: float = 60.0) -> None:
        self._protocol = protocol
        self._runtime = protocol.runtime
        self._layout: Layout = protocol.layout
        # _Changing takes the lock itself: Condition's __enter__ and __exit__ are two
        # Python calls more, and it is entered several times per claim.
        self._lock = self._runtime.RLock()
        self._cond = self._runtime.Condition(self._lock)
        #: Events set on every change of the view (see add_waker).
        self._wakers: Set[EventLike] = set()
        self._idle_timeout = idle_timeout
        #: The view's state and rules (under ``_cond``).
        self.state = ViewState(self._layout, lock_ttl=protocol.lock_ttl,
                               orphan_delay=protocol.etcd.deadline)
        round_ = self.state.new_round(watching=False, list_locks=True)
        assert round_ is not None
        self._follower = _Follower(self, round_, idle_timeout)
        self._follower.start()

    @property
    def version(self) -> int:
        """A number bumped (under the view's lock) by every change a claim may act on."""
        return self.state.version

    @property
    def relists(self) -> int:
        """Listings of work/ applied."""
        return self.state.relists

    @property
    def watching_locks(self) -> bool:
        """True while the whole queue directory (locks/ too) is watched; False: quiet."""
        return self.state.watching

    def _changing(self) -> "_Changing":
        """The state, under the lock; claimers woken if its version changed."""
        return _Changing(self)

    def _wake(self) -> None:
        """Wake every waiting claimer and waker (under the lock)."""
        self._cond.notify_all()
        for event in self._wakers:
            event.set()

    def _call(self, method: Callable[..., _T], *args: object, **kwargs: object) -> _T:
        with self._changing():
            return method(*args, **kwargs)

    # -- for claimers ----------------------------------------------------------
    def wait_ready(self, timeout: Optional[float]) -> None:
        """Block until a listing is in, or raise.

        While etcd is unavailable the follower tries the next member, so this
        waits up to ``timeout`` and then raises Unavailable with the last
        error; an error that trying again cannot mend (access refused, a
        bad configuration) is raised at once, and so is Refused (every
        endpoint refused the connection: nobody listens).
        """
        with self._cond:
            self._cond.wait_for(self._settled, timeout)
        self._raise_unready(timeout)

    def _settled(self) -> bool:
        """A listing is in, the view was closed, or its error is final: a wait
        for the listing ends."""
        state = self.state
        with self._cond:
            return state.ready or state.closed or _final(state.error)

    def _raise_unready(self, timeout: Optional[float]) -> None:
        """Return if a listing is in; else raise what a wait of ``timeout`` for
        it ends with (:meth:`wait_ready`)."""
        state = self.state
        with self._cond:
            if state.ready:
                return
            error, closed = state.error, state.closed
        if _final(error) and isinstance(error, EtcdqError):
            raise error
        why = "the queue was closed" if closed else f"last error: {error or 'none'}"
        within = "" if timeout is None else f" within {timeout:g} s"
        raise Unavailable(f"could not list {self._layout.label}{within} ({why})")

    def candidates(self, limit: int) -> List[Candidate]:
        """Up to ``limit`` free items from the head: ``(id, version)``."""
        found, switch = self._call(self.state.candidates, limit)
        self._switch(switch)
        return found

    def pick(self, window: int) -> Optional[Candidate]:
        """A free item among the first ``window`` the view holds, marked
        :meth:`taken` for this claim attempt; or None (ViewState.pick)."""
        with _Changing(self) as state:  # not _call: this and the four below run per item
            found, switch = state.pick(window, self._runtime.random)
        self._switch(switch)
        return found

    def walk_from_head(self) -> None:
        """The next walk starts at the head of the view: the consumer looks
        alone (no lost race in a while: Queue._narrow), and walks in put order."""
        self._call(self.state.walk_from_head)

    def missed(self, item_id: str) -> bool:
        """A claim found the item taken or gone.  True when a quiet view should
        list work/ again: its misses reached the miss limit (ViewState.miss_limit)."""
        return self._call(self.state.missed, item_id)

    def catch_up(self, timeout: float) -> bool:
        """After candidates() held back items this process put: learn of every
        item put before them, then True.  False if it held none back.

        While the whole directory is watched their own events will come (up to
        ``timeout``); otherwise, or if they do not, list again.  If that
        listing fails, or the watching follower's last listing of work/ did
        (not its stream: a follower whose stream broke lists again), the items
        this process put up to there are offered without it (own_upto).
        """
        state = self.state
        with self._cond:
            behind = state.behind
            if not behind or state.closed:
                return False
            if state.watching and self._cond.wait_for(
                    lambda: state.known >= behind or state.closed, timeout):
                return True
            how = state.catch_up_how()
        if how == "list work":
            self._catch_up_quietly(behind, timeout)
        elif how == "offer own":
            self._call(state.offer_own, behind)
        else:
            self.relist(timeout)
        return True

    def _catch_up_quietly(self, behind: int, timeout: float) -> None:
        """A quiet view lists work/ in the claimer's thread and stays ready
        (relist_work; while listings fail, at most once a second).  If no
        listing up to ``behind`` came, the items this process put up to
        ``behind`` are offered without it: put order with other producers'
        items waits for a listing that works.  Not relist(): it makes the view
        unready, so while listings of work/ failed every claim of the process
        would fail, though the view held its own item free."""
        self.relist_work(catching_up=True)
        state = self.state
        with self._cond:
            self._cond.wait_for(lambda: not state.listing or state.closed, timeout)
            if state.closed:  # no claim after close()
                raise Unavailable(f"could not list {self._layout.label} (the queue was closed)")
            if state.known < behind:
                state.offer_own(behind)

    def starved(self, timeout: float) -> None:
        """A claim found nothing: watch the whole queue directory, and wait for its listing.

        Unless another claimer's relist of work/ is under way: that listing may
        bring free items, so wait for it first, and watch only if it changed
        nothing (watching would drop it, and cost a stream)."""
        state = self.state
        with self._cond:
            if state.listing:
                version = state.version
                self._cond.wait_for(lambda: not state.listing or state.closed, timeout)
                if state.version != version:
                    return
        self._watch(locks=True).wait_listed(timeout)

    def check_locks(self) -> None:
        """Each claim round: the time (ViewState.tick), and the listing it asks for."""
        with _Changing(self) as state:
            check = state.tick(self._runtime.monotonic())
            generation, round_ = state.generation, state.relists
        if check == "full":
            self.relist_work(full=True)
        elif check == "confirm":
            try:
                self._list_locks(generation, full=True, round_=round_)
            except BaseException:
                self._call(state.confirm_unlisted, self._runtime.monotonic())
                raise
        elif check == "delays":
            self._list_due_locks(generation)

    def _list_due_locks(self, generation: int) -> None:
        """List locks/ for due delay locks; a failure is logged and the claim
        goes on (ViewState.delays_unlisted)."""
        try:
            self._list_locks(generation)
        except EtcdqError as exc:
            log.warning("could not list %s for delay locks (tried again soon): %s",
                        self._layout.dir("locks"), exc)
            self._call(self.state.delays_unlisted, self._runtime.monotonic())

    def taken(self, item_id: str) -> None:
        """A claim attempt of this process on the item is under way: offer it to no other."""
        self._call(self.state.taken, item_id)

    def locked_at(self, item_id: str, index: int, *, refused: bool = False,
                  won: bool = False) -> None:
        """The attempt ended (ViewState.locked_at): the item's lock existed at
        ``index``; ``won``: it is this process's claim's."""
        with _Changing(self) as state:
            state.locked_at(item_id, index, refused=refused, won=won,
                            since=self._follower.since, now=self._runtime.monotonic())

    def disowned(self, item_id: str) -> None:
        """This process no longer keeps the item's lock alive (ViewState.disowned)."""
        self._call(self.state.disowned, item_id, self._runtime.monotonic())

    def untaken(self, item_id: str) -> None:
        """Undo :meth:`taken` after a claim attempt failed before reaching etcd."""
        self._call(self.state.untaken, item_id)

    def version_of(self, item_id: str) -> Optional[Version]:
        """The version of the item a claim would be offered (None: not held)."""
        return self._call(self.state.version_of, item_id)

    def added(self, item_id: str, seen: Version) -> None:
        """This process wrote the item or read it back at ``seen`` (ViewState.added)."""
        with _Changing(self) as state:
            state.added(item_id, seen)

    def delayed(self, item_id: str, seen: Version, lock_index: int, ttl: int) -> None:
        """This process put a delayed item (ViewState.delayed)."""
        self._call(self.state.delayed, item_id, seen, lock_index, ttl,
                   self._runtime.monotonic())

    def returned(self, item_id: str, seconds: int, index: int) -> None:
        """A claim of this process gave the item back at ``index`` (ViewState.returned)."""
        self._call(self.state.returned, item_id, seconds, index, self._runtime.monotonic())

    def finished(self, item_id: str, index: int = 0) -> None:
        """The item is gone: never offer it again (ViewState.finished)."""
        with _Changing(self) as state:
            state.finished(item_id, index)

    def skip(self, item_id: str, seen: Version) -> None:
        """Never offer this version of the item again (it is junk): ViewState.skip_version."""
        self._call(self.state.skip_version, item_id, seen.index, seen.raw)

    def relist(self, timeout: float) -> None:
        """Subscribe and list again now, and wait (up to ``timeout``) for the listing."""
        with self._cond:
            if self.state.closed:
                return
            start = self.state.start_relisting()
        if start:
            self._replace_follower(locks=self.state.watching)
        self.wait_ready(timeout)

    def behind(self, timeout: float) -> None:
        """Claims found the view stale: list again (ViewState.relist_how)."""
        if self._call(self.state.relist_how) == "relist":
            self.relist(timeout)
        else:
            self.relist_work()

    def wait_for_change(self, version: int, timeout: Optional[float]) -> None:
        with self._cond:
            timeout = self.until_due(timeout)
            self._cond.wait_for(lambda: self.state.version != version or self.state.closed,
                                timeout)
            self.offer_due()

    def add_waker(self, event: EventLike) -> None:
        """Set ``event`` on every change of :attr:`version`, and on close.

        For a claimer that waits on several views at once (a Worker over
        several queues): one Event for all of them, cleared before it looks
        at the views, so a change while it looks ends its wait at once.
        """
        with self._cond:
            self._wakers.add(event)
            if self.state.closed:
                event.set()

    def remove_waker(self, event: EventLike) -> None:
        with self._cond:
            self._wakers.discard(event)

    def until_due(self, timeout: Optional[float]) -> Optional[float]:
        """``timeout``, cut short to the first deadline a waiting claim wakes for."""
        return self._call(self.state.until_due, self._runtime.monotonic(), timeout)

    def offer_due(self) -> None:
        """Offer the orphans whose F3 event is overdue: a claim finishes them."""
        self._call(self.state.offer_due, self._runtime.monotonic())

    def close(self) -> None:
        with self._cond:
            self.state.close()
            self._wake()
        self._follower.stop()

    # -- rounds ------------------------------------------------------------------
    def _switch(self, switch: Optional[Switch]) -> None:
        if switch is not None:
            self._watch(locks=switch.watching, list_locks=switch.list_locks)

    def _watch(self, *, locks: bool, list_locks: bool = False) -> "_Follower":
        """Watch the whole queue directory (``locks``), or nothing: its follower."""
        with self._cond:
            round_ = self.state.switch(watching=locks, list_locks=list_locks)
            return self._start(round_)

    def _replace_follower(self, *, locks: bool, list_locks: bool = False) -> "_Follower":
        """A new follower (subscribe, list, apply) in place of the current one."""
        with self._cond:
            return self._start(self.state.new_round(watching=locks, list_locks=list_locks))

    def _start(self, round_: Optional[Round]) -> "_Follower":
        """Carry out ``round_`` in a new follower (under the lock; None: keep the current one)."""
        if round_ is None:
            return self._follower
        old, new = self._follower, _Follower(self, round_, self._idle_timeout)
        self._follower = new
        old.stop()
        new.start()
        return new

    def _list(self, round_: Round, since: Optional[int]) -> Dict[str, int]:
        """The round's listings (ViewState.plan_round): the etcd index of each,
        by directory (0: not listed, every event applies).  ``since``: the
        index at which the round's stream began (None: no stream)."""
        with self._cond:
            round_ = self.state.round_listing(round_)  # this listing's number as sent
        try:
            work = self._protocol.list("work")
        except EtcdqError:
            self._call(self.state.work_unlisted_by_round, round_)
            raise
        with self._cond:
            plan = self.state.plan_round(round_, work[1])  # and as answered
        locks: Optional[Listing] = None
        if plan.list_locks:
            try:
                locks = self._protocol.list("locks")
            except EtcdqError as exc:
                if not plan.may_fail:
                    raise
                self._locks_unlisted(exc)
        reads: List[LockRead] = self._protocol.read_locks(plan.read, since) if plan.read else []
        with self._changing() as state:
            # The view is ready now, also if the listing was dropped (no change
            # of version then): a claim in wait_ready() or wait_all_ready() wakes.
            self._wake()
            applied = state.apply_round(round_, work, plan, locks, reads,
                                        self._runtime.monotonic(), self._runtime.wall())
        return {"work": work[0], "locks": locks[0] if locks else 0} if applied else {}

    def _list_locks(self, generation: int, full: bool = False,
                    round_: Optional[int] = None) -> None:
        """List locks/ and apply it (ViewState.apply_locks: only if still current,
        in the history it was sent in)."""
        with self._cond:
            history = self.state.history
        locks = self._protocol.list("locks")
        with self._changing() as state:
            state.apply_locks(generation, round_, locks, full=full, history=history,
                              now=self._runtime.monotonic(), wall=self._runtime.wall())

    def relist_work(self, *, full: bool = False, catching_up: bool = False) -> None:
        """A quiet view lists work/ again in the claimer's thread, when the state
        lets it (ViewState.start_relist); other claimers meanwhile go on with
        what the view has.  A failure is logged and the claim goes on."""
        with self._cond:
            relist = self.state.start_relist(self._runtime.monotonic(), full=full,
                                             catching_up=catching_up)
        if relist is None:
            return
        try:
            work = self._protocol.list("work")
            with self._cond:
                plan = self.state.plan_relist(relist, work[1])
            locks = self._list_locks_if(plan.list_locks)
        except BaseException as exc:
            with self._changing():
                self._cond.notify_all()
                if not isinstance(exc, EtcdqError):
                    self.state.end_relist()
                    raise
                self._work_unlisted(relist, exc)
            return  # the claim goes on with what the view holds
        with self._changing() as state:
            # Ended in the block that applies it: a starved claim that waited
            # for it sees it applied, or it dropped.
            self._cond.notify_all()
            state.apply_relist(relist, work, plan, locks, self._runtime.monotonic(),
                               self._runtime.wall())

    def _work_unlisted(self, relist: Relist, exc: EtcdqError) -> None:
        """relist_work could not list work/ (under the lock): ViewState.work_unlisted."""
        retry = self.state.work_unlisted(relist, self._runtime.monotonic())
        if isinstance(exc, Unavailable):  # its deadline is spent: one more, not two
            self._protocol.etcd.spent()
        log.warning("could not list %s (listed again in %g s at the earliest; claims go "
                    "on with what the view holds): %s", self._layout.dir("work"), retry, exc)

    def _list_locks_if(self, wanted: bool) -> Optional[Listing]:
        """The listing of locks/ relist_work makes; None if not ``wanted``, or if
        it failed: logged, and the claim goes on with work/ applied."""
        if not wanted:
            return None
        try:
            return self._protocol.list("locks")
        except EtcdqError as exc:
            self._locks_unlisted(exc)
            return None

    def _locks_unlisted(self, exc: EtcdqError) -> None:
        log.warning("could not list %s (a claim lists it again soon): %s",
                    self._layout.dir("locks"), exc)

    def _apply(self, block: bytes, floors: Dict[str, int], round_: Round) -> None:
        """Apply a block of events (ViewState.apply_block)."""
        with self._changing() as state:
            if state.apply_block(round_, block, floors, self._runtime.monotonic()):
                self._cond.notify_all()

    def _failed(self, exc: BaseException, round_: Round) -> None:
        """The follower's last error, for :meth:`wait_ready` (a replaced one's is moot)."""
        with self._cond:
            if self.state.round_failed(round_, exc):
                self._wake()  # a final error ends a wait for the listing


class _Follower:
    """One round of the view, in a thread of its own: subscribe, list, apply events.

    ``round.watching`` False: a quiet view, which lists and watches nothing.
    """

    def __init__(self, view: QueueView, round_: Round, idle_timeout: float) -> None:
        self._view = view
        self._runtime = view._runtime
        self.round = round_
        self.directory = view._layout.root if round_.watching else None
        self._idle_timeout = idle_timeout
        self._listed = self._runtime.Event()
        self._stop = self._runtime.Event()
        self._stream: Optional[EventStream] = None
        self._thread = self._runtime.Thread(self._run, name="etcdq-view", daemon=True)

    def start(self) -> None:
        """Start following; only once the view knows this is its follower."""
        self._thread.start()

    def wait_listed(self, timeout: float) -> None:
        self._listed.wait(timeout)

    @property
    def since(self) -> Optional[int]:
        """The etcd index at which its stream began (None: no stream, or not said)."""
        stream = self._stream
        return stream.index or None if stream is not None else None

    def drop_stream(self) -> None:
        """End the current stream as if the connection dropped (tests use it)."""
        stream = self._stream
        if stream is not None:
            stream.close()

    def stop(self) -> None:
        self._stop.set()
        self.drop_stream()

    def _run(self) -> None:
        """Follow until stopped.  Whatever goes wrong is logged and followed by a
        new round (on the next member, if etcd's was at fault): a view whose
        thread died would stop seeing new items without a word."""
        pause: Optional[float] = None
        while not self._stop.is_set():
            try:
                self._follow()
                pause = None
            except BaseException as exc:  # noqa: B036 - even SystemExit: logged, not fatal
                if self._stop.is_set():
                    break
                self._report(exc)
                pause = round_pause(pause)
                self._stop.wait(pause)

    def _report(self, exc: BaseException) -> None:
        """Log ``exc`` (with its traceback if it is not etcd's doing); claimers see it."""
        if isinstance(exc, EtcdqError):
            log.warning("watch of %s failed (%s); subscribing and listing again",
                        self.directory, exc)
        else:
            log.error("watch of %s failed (%s); subscribing and listing again",
                      self.directory, type(exc).__name__, exc_info=exc)
        self._view._failed(exc, self.round)

    def _follow(self) -> None:
        """One round: subscribe, list, then apply events until the stream ends."""
        view, state = self._view, self._view.state
        if self.directory is None:
            view._list(self.round, None)
            self._listed.set()
            self._stop.wait()
            return
        stream = view._protocol.watch(self.directory, self._idle_timeout)
        self._stream = stream
        try:
            if self._stop.is_set():
                return
            floors = view._list(self.round, self.since)
            self._listed.set()
            self._set_idle(stream)
            for block in stream.blocks():
                view._apply(block, floors, self.round)
                with view._cond:
                    if state.round_over(self.round, self._runtime.monotonic()):
                        return  # trusted long enough: the next round lists again
                self._set_idle(stream)
                # Each wake-up of this thread (a context switch, the GIL taken
                # from the claimer) cost more than parsing the events; a short
                # pause lets the next few arrive together.  An event after a
                # quiet spell is still applied at once.
                self._runtime.sleep(COALESCE)
        finally:
            stream.release()

    def _set_idle(self, stream: EventStream) -> None:
        """How long the stream may stay silent (ViewState.stream_idle)."""
        with self._view._cond:
            idle = self._view.state.stream_idle(self.round, self._runtime.monotonic(),
                                                self._idle_timeout)
        stream.set_idle_timeout(idle)


class _Changing:
    """QueueView._changing: with the lock held, the state; on leaving without
    an exception, the deadlines noted (ViewState.note_deadlines) and the
    claimers woken if the version changed.  A class, not a generator: it is
    entered several times per claim, and a generator's context costs twice."""

    __slots__ = ("_view", "_before")

    def __init__(self, view: QueueView) -> None:
        self._view = view
        self._before = 0

    def __enter__(self) -> ViewState:
        view = self._view
        view._lock.__enter__()
        self._before = view.state.version
        return view.state

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        view = self._view
        try:
            if exc_type is None:
                view.state.note_deadlines()
                if view.state.version != self._before:
                    view._wake()
        finally:
            view._lock.__exit__(exc_type, exc, tb)


def wait_all_ready(views: Sequence[QueueView], wake: EventLike,
                   timeout: Optional[float]) -> None:
    """Block until every one of ``views`` has a listing in, or raise as
    :meth:`QueueView.wait_ready` does, at the first view that was closed (also
    one listed) or failed for good, or once ``timeout`` (None: never) passed.
    One wait on ``wake``, a waker of every view (QueueView.add_waker: set when
    a listing is in, at a final error and on close), so a close() of any view
    ends it."""
    runtime = views[0]._runtime
    end = None if timeout is None else runtime.monotonic() + timeout
    while True:
        wake.clear()
        for view in views:  # a closed view ends the wait, listed or not
            if view.state.closed:
                raise Unavailable(f"could not list {view._layout.label} (the queue was closed)")
        waiting = [view for view in views if not view._settled()]
        for view in views:
            if view not in waiting:
                view._raise_unready(timeout)  # closed or failed: raises
        if not waiting:
            return
        remaining = None if end is None else end - runtime.monotonic()
        if remaining is not None and remaining <= 0:
            for view in waiting:
                view._raise_unready(timeout)  # returns only if it was listed since
            continue
        wake.wait(remaining)


def _final(error: Optional[BaseException]) -> bool:
    """An error of the view that trying again will not mend, or not soon: nothing
    listens at any endpoint (Refused), so a claim need not wait out its deadline."""
    return error is not None and (not isinstance(error, Unavailable)
                                  or isinstance(error, Refused))
