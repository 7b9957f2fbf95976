"""Members, the raft log they apply, the leader and its TTL sweeps: a cluster in memory.

What the model keeps of raft is what a client can see:

* a write (PUT, POST, DELETE) or a quorum GET is an entry of one committed
  log, in the order the members receive them; committing is instant while
  there is a leader that is up and not frozen;
* every member applies the log in order, to its own store; a member that
  is held (:meth:`Cluster.hold`) lags: its local GETs and its watches see
  its own older state, and its own requests are answered only once it has
  applied them, as etcd answers a request where it was received;
* with no leader (or a frozen or stopped one) a proposal is never
  committed, and its member answers 500/300 "request timed out, possibly
  due to previous leader failure" seven seconds later (etcd's ReqTimeout
  with the default election timeout);
* every 0.5 s of its own time a leader with TTL keys commits a SYNC
  carrying its wall clock, and each member, applying it, expires the keys
  due by then; no leader, no sweep;
* a member that is frozen (SIGSTOP) applies nothing and answers nothing:
  requests sent to it wait in its inbox and are received when it thaws
  (a TTL then counts from the thaw);
* a restart keeps the member's store (etcd rebuilds it from its snapshot
  and WAL) and ends every watch on it;
* the leader takes a snapshot of its store every ``snapshot_count``
  entries (None: only when :meth:`Cluster.snapshot` is called); a member
  restored from it takes that store and keeps its watchers, which miss
  the events the snapshot covered and get those after it from the log.
* the whole cluster restored from an older backup (:meth:`Cluster.rewind`)
  takes the backup's store on every member: etcd's index goes back, the
  writes since are lost, every watch ends; the log goes on from there.

Time is an argument of every call (seconds, as the simulator's clock
reads); each member's wall clock is that plus its ``skew``.  Calls must
come with time that never goes back.  Faults of the network (a reply lost,
a request held or reset) belong to the simulator: this module only says
what each member did and answered, and when.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from . import api
from .api import Reply, Request, Route
from .store import HISTORY, SECOND, WATCHER_BUFFER, Shuffle, Store, V2Error, Version

#: The leader's SyncTicker period (etcdserver/server.go).
SWEEP_PERIOD = 0.5
#: etcd's ReqTimeout(): 5 s + 2 x the default 1 s election timeout.
REQUEST_TIMEOUT = 7.0


def nanoseconds(seconds: float) -> int:
    return round(seconds * SECOND)


class Pending:
    """A request sent to a member: its reply once the member has one (None until then)."""

    __slots__ = ("member", "request", "reply", "applied_at")

    def __init__(self, member: int, request: Optional[Request]) -> None:
        self.member = member
        self.request = request
        self.reply: Optional[Reply] = None
        #: Log position of the entry, once committed (None: never committed).
        self.applied_at: Optional[int] = None

    @property
    def done(self) -> bool:
        return self.reply is not None


@dataclass
class _Entry:
    """One committed raft entry: a keys request, or the leader's SYNC (``sync`` ns)."""

    request: Optional[Request]
    pending: Optional[Pending] = None
    sync: int = 0
    #: The status the entry applied with, on the first member that applied it
    #: (0: none yet): whether it took effect, also when the member it was sent
    #: to never answered (a restore, a member held until then).
    status: int = 0
    #: etcd's index after it applied there (X-Etcd-Index): a POST's new key.
    index: int = 0


@dataclass
class Member:
    """One member's state: its store, how far it applied, and whether it runs."""

    store: Store
    skew: float = 0.0
    applied: int = 0
    held: bool = False
    frozen: bool = False
    up: bool = True
    inbox: List[Tuple[Pending, str, str, Optional[str]]] = field(default_factory=list)

    def clock(self, now: float) -> int:
        """This member's wall clock, in nanoseconds."""
        return nanoseconds(now + self.skew)

    @property
    def working(self) -> bool:
        return self.up and not self.frozen


class Cluster:
    """``size`` members, member 0 the first leader, at simulated time ``start``."""

    def __init__(self, size: int = 1, *, start: float = 0.0, version: Version = Version.V3_5,
                 skews: Optional[Sequence[float]] = None, history: int = HISTORY,
                 watcher_buffer: int = WATCHER_BUFFER, shuffle: Optional[Shuffle] = None,
                 snapshot_count: Optional[int] = None) -> None:
        skews = list(skews) if skews is not None else [0.0] * size
        if len(skews) != size or size < 1:
            raise ValueError("give one skew per member, and at least one member")
        self.members = [Member(Store(version=version, history=history,
                                     watcher_buffer=watcher_buffer, shuffle=shuffle), skew)
                        for skew in skews]
        self.log: List[_Entry] = []
        self.leader: Optional[int] = 0
        self.now = start
        self._next_sweep = start + SWEEP_PERIOD
        self._waiting: List[Tuple[float, Pending]] = []
        self._leader_failed = False
        self.snapshot_count = snapshot_count
        #: The leader's latest snapshot: the log position it covers, and its store.
        self._snapshot: Optional[Tuple[int, Store]] = None
        #: Each restore of the whole cluster from an older backup (:meth:`rewind`):
        #: (the log position its backup covers, the log position it struck at).
        #: Entries between the two applied in a history etcd lost.
        self.rewinds: List[Tuple[int, int]] = []

    # -- requests ---------------------------------------------------------------
    def request(self, member: int, method: str, target: str, body: Optional[str],
                now: float) -> Pending:
        """Deliver a request to ``member`` at ``now``; its reply may come later.

        A GET (not quorum) is answered at once from the member's store, a
        wait=true GET with a watch (Reply.watch).  Others are proposed and
        answered when the member applies them (at once unless it lags), or
        time out.  A frozen member keeps the request until it thaws.
        """
        self.advance(now)
        pending = Pending(member, None)
        target_member = self.members[member]
        if not target_member.up:
            raise ConnectionRefusedError(f"member {member} is down")
        if target_member.frozen:
            target_member.inbox.append((pending, method, target, body))
            return pending
        self._receive(member, pending, method, target, body)
        return pending

    def _receive(self, member: int, pending: Pending, method: str, target: str,
                 body: Optional[str]) -> None:
        state = self.members[member]
        try:
            request = api.parse(method, target, body, state.clock(self.now))
        except V2Error as exc:
            pending.reply = api.error_reply(exc)
            return
        pending.request = request
        if request.route is not Route.RAFT:
            pending.reply = api.answer_local(state.store, request, state.clock(self.now))
        elif self._committing():
            self.log.append(_Entry(request, pending))
            pending.applied_at = len(self.log)
            self._apply_all()
        else:
            self._waiting.append((self.now + REQUEST_TIMEOUT, pending))

    def _committing(self) -> bool:
        return self.leader is not None and self.members[self.leader].working

    # -- time -----------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Bring the cluster to ``now``: sweeps due, proposals timed out, applies."""
        if now < self.now:
            raise ValueError(f"time went back: {now} < {self.now}")
        while self._next_sweep <= now:
            self.now = self._next_sweep
            self._next_sweep += SWEEP_PERIOD
            self._sweep()
        self.now = now
        self._time_out()
        self._apply_all()

    def _sweep(self) -> None:
        if not self._committing():
            return
        assert self.leader is not None
        leader = self.members[self.leader]
        if leader.store.has_ttl_keys():
            self.log.append(_Entry(None, sync=leader.clock(self.now)))
            self._apply_all()

    def _time_out(self) -> None:
        due = [pending for deadline, pending in self._waiting if deadline <= self.now]
        self._waiting = [(d, p) for d, p in self._waiting if d > self.now]
        for pending in due:
            pending.reply = api.raft_timeout(self._leader_failed)

    # -- applying ---------------------------------------------------------------
    def _apply_all(self) -> None:
        for member in self.members:
            if member.working and not member.held:
                self._apply(member, len(self.log))
        if self.snapshot_count and self.leader is not None:
            covered = self._snapshot[0] if self._snapshot else 0
            if self.members[self.leader].applied - covered >= self.snapshot_count:
                self._take_snapshot()

    def _take_snapshot(self) -> None:
        source = self.members[self.leader if self.leader is not None else 0]
        self._snapshot = (source.applied, source.store.snapshot())

    def _apply(self, member: Member, upto: int) -> None:
        while member.applied < upto:
            entry = self.log[member.applied]
            member.applied += 1
            now = member.clock(self.now)
            if entry.request is None:
                member.store.expire_keys(entry.sync, now)
                continue
            origin = entry.pending is not None and member is self.members[entry.pending.member]
            first = entry.pending is not None and not entry.status
            reply = api.apply(member.store, entry.request, now, answer=origin or first)
            if first:
                assert reply is not None
                entry.status = reply.status
                entry.index = int(reply.headers.get("x-etcd-index", 0))
            if origin:
                assert entry.pending is not None
                entry.pending.reply = reply

    # -- hooks for the simulator's faults --------------------------------------
    def hold(self, member: int) -> None:
        """``member`` stops applying (a lagging member) until :meth:`release`."""
        self.members[member].held = True

    def apply(self, member: int, now: float, count: Optional[int] = None) -> None:
        """Let a held ``member`` apply ``count`` more entries (None: all), at ``now``."""
        self.advance(now)
        state = self.members[member]
        upto = len(self.log) if count is None else min(len(self.log), state.applied + count)
        if state.working:
            self._apply(state, upto)

    def release(self, member: int, now: float) -> None:
        self.members[member].held = False
        self.advance(now)

    def lag(self, member: int) -> int:
        """Entries committed that ``member`` has not applied yet."""
        return len(self.log) - self.members[member].applied

    def freeze(self, member: int, now: float) -> None:
        """SIGSTOP: the member applies, sweeps and answers nothing until :meth:`thaw`."""
        self.advance(now)
        self.members[member].frozen = True

    def thaw(self, member: int, now: float) -> None:
        """SIGCONT: it catches up, then receives what waited in its inbox, at ``now``."""
        state = self.members[member]
        state.frozen = False
        self.advance(now)
        inbox, state.inbox = state.inbox, []
        for pending, method, target, body in inbox:
            self._receive(member, pending, method, target, body)

    def stop(self, member: int, now: float) -> None:
        """The member's process ends: its watches end, its inbox is lost."""
        self.advance(now)
        state = self.members[member]
        state.up, state.inbox = False, []
        state.store.drop_watchers()
        if member == self.leader:
            self.elect(None, now)

    def start(self, member: int, now: float) -> None:
        """The member runs again with its store as it left it, and catches up."""
        self.members[member].up = True
        self.advance(now)

    def restart(self, member: int, now: float) -> None:
        leader = self.leader
        self.stop(member, now)
        self.start(member, now)
        if leader == member:
            self.elect(member, now)

    def snapshot(self, now: float) -> None:
        """The leader takes a snapshot of its store now."""
        self.advance(now)
        self._take_snapshot()

    def restore_from_snapshot(self, member: int, now: float) -> None:
        """``member`` catches up by the leader's latest snapshot (one taken now if
        there is none), then by the log from there.

        Its store becomes the snapshot's (tree, index, history); its watchers
        stay, and get none of the events the snapshot covered.  Its own
        requests in that stretch of the log get no reply: they time out.  A
        snapshot no newer than what the member applied changes nothing.
        """
        self.advance(now)
        if self._snapshot is None:
            self._take_snapshot()
        assert self._snapshot is not None
        position, image = self._snapshot
        state = self.members[member]
        if position <= state.applied:
            return
        for entry in self.log[state.applied:position]:
            if entry.pending is not None and entry.pending.member == member:
                self._waiting.append((self.now + REQUEST_TIMEOUT, entry.pending))
        state.store.restore(image)
        state.applied = position
        self._apply_all()

    def backup(self, now: float) -> Tuple[int, Store]:
        """A copy of the leader's store now (``etcdctl snapshot save``, or a copy of
        its data dir): the log position it covers, and its tree, index and TTLs."""
        self.advance(now)
        source = self.members[self.leader if self.leader is not None else 0]
        return source.applied, source.store.snapshot()

    def rewind(self, backup: Tuple[int, Store], now: float) -> None:
        """The whole cluster is restored from ``backup`` (``etcdctl snapshot
        restore`` on every member, or their data dirs copied back): each member
        restarts with the backup's store, so etcd's index goes back to the
        backup's, and every watch ends.  The writes after the backup are lost;
        the requests not answered yet get no reply (they time out).  A frozen
        member's process is restarted too: it runs, and the requests waiting in
        its inbox are lost with the old process (as at :meth:`stop`), never
        applied to the new history.  The log goes on from here: what the
        members apply next is the new history."""
        self.advance(now)
        covered, image = backup
        for number, member in enumerate(self.members):
            for entry in self.log[member.applied:]:
                if entry.pending is not None and entry.pending.member == number:
                    self._waiting.append((self.now + REQUEST_TIMEOUT, entry.pending))
            member.frozen, member.inbox = False, []
            member.store.drop_watchers()
            member.store.restore(image)
            member.applied = len(self.log)
        self.rewinds.append((covered, len(self.log)))
        self._snapshot = None
        self._apply_all()

    def elect(self, member: Optional[int], now: float) -> None:
        """``member`` becomes leader (None: the cluster has none); its sweeps start
        one period later, on its own clock."""
        self.advance(now)
        if member is None:
            self._leader_failed = self.leader is not None or self._leader_failed
        self.leader = member
        self._next_sweep = now + SWEEP_PERIOD
        self._apply_all()
