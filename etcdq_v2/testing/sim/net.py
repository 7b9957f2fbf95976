"""The simulated network between the library's Transport and the model cluster.

:class:`Network` gives each endpoint a :class:`SimMember`, which has the
methods of :class:`etcdq_v2.wire.Member` that transport.py calls (request,
request_all, pipeline, stream, close) and raises what it would: NotSent when
nothing reached the member, Lost when the request may have been applied and
no whole reply came (``timed_out`` for a timeout).  A request is handed to
the model (:meth:`Cluster.request`) at the SimRuntime's virtual time after a
simulated latency, and the calling sim-thread blocks (virtually) until the
member answers or its timeout passes.  A stream is a :class:`SimConnection`
on the model's Watcher: its reader blocks until events come, the watch ends,
another thread closes it, or its idle timeout passes.

Faults are drawn from the network's seeded ``random.Random`` while
``virtual time < faults_until``:

=============  ===============================================================
refuse         NotSent: the connection was refused, nothing was sent
reset          Lost: the connection broke before the member received it
lost_reply     the member applied it, the reply never came: Lost
late           held on the way: the client times out (Lost), the member
               receives it ``late`` seconds later (past a lock TTL)
slow_reply     the member applied it, its reply is held past the client's
               timeout: Lost (timed out), while others see the write
=============  ===============================================================

and, by the courier thread (:meth:`Network.courier`): a member frozen for a
while (a frozen leader is replaced), a member that lags and catches up by
the log or by the leader's snapshot (its watches miss what the snapshot
covered), a restart (every watch on it ends), a stream cut or gone silent;
off by default, the whole cluster restored from an older backup at a
seeded moment (:meth:`Network.restore_old`), a partition of one process and a slow link (a member's or a
process's replies at a byte rate: read whole past the timeout, arriving).
A client's whole process can be paused (:meth:`Network.pause`).  The courier also moves the
cluster's time on (its TTL sweeps, its raft timeouts) when no request does.

Every request and fault is a line of the runtime's trace, so the trace of a
run holds both the hand-overs and the requests, in order.
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ...wire import Lost, NotSent, Refused, Response, Unanswered
from .cluster import SWEEP_PERIOD, Cluster, Pending
from .costs import Costs
from .runtime import SimRuntime
from .store import Store, Watcher

_Request = Tuple[str, str, Optional[str]]


class Fault(Enum):
    """What the network does to one request."""

    REFUSE = "refuse"
    RESET = "reset"
    LOST_REPLY = "lost_reply"
    LATE = "late"
    SLOW_REPLY = "slow_reply"
    DELAY_REPLY = "delay_reply"


@dataclass
class FaultRates:
    """How often each fault strikes while faults last (per request, or per
    courier tick of ``tick`` seconds for the member and stream faults)."""

    refuse: float = 0.01
    reset: float = 0.01
    lost_reply: float = 0.02
    late: float = 0.005
    freeze: float = 0.01
    lag: float = 0.01
    restart: float = 0.004
    cut_stream: float = 0.01
    silence_stream: float = 0.01
    #: Of the lagging members, the share that catch up by a snapshot, not the log.
    restore: float = 0.3
    #: A late request arrives this many seconds after it was sent, plus up to as much again.
    late_by: float = 8.0
    slow_reply: float = 0.005
    #: A reply held on the way and delivered late, yet within the client's
    #: timeout (a proxy that delays a connection): what was decided on it
    #: arrives after newer news.  0 by default (a swarm seed draws it).
    delay_reply: float = 0.0
    #: Per courier tick: one client process cut from every member (a network
    #: partition of its host) for 1-4 x the transport's deadline: its requests
    #: refused, its open streams cut.  0 by default (a swarm seed draws it).
    partition: float = 0.0
    #: Per courier tick: the link of one member, or of one client process,
    #: slowed to a byte rate (SLOW_LINK_RATE) for SLOW_LINK_FOR: each reply on
    #: it arrives in its size over that rate, as a throttled link delivers a
    #: reply that etcd encoded whole.  0 by default (a swarm seed draws it).
    slow_link: float = 0.0
    #: Per courier tick: every member busy for SLOW_LINK_FOR, making each
    #: reply at BUSY_RATE bytes a second before its first byte, as etcd
    #: encodes a listing whole first (slowly while many list at once): a
    #: large listing's first byte comes after the timeout, a key's does not.
    #: 0 by default (a swarm seed draws it).
    busy: float = 0.0


#: A record's key (F2 writes it): completed/<id> or failed/<id>.
_RECORD = re.compile(r"/(completed|failed)/[^/?]+(\?|$)")
#: A lock's key (C1 creates it, F4 deletes it): locks/<id>.
_LOCK = re.compile(r"/locks/[^/?]+(\?|$)")

NO_FAULTS = FaultRates(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, slow_reply=0)

#: Seconds a partition lasts: from the transport's deadline (3 x 2 s, its
#: members each tried) to 4 times it, so that a listing's every retry fails.
PARTITION_FOR = (6.0, 24.0)

#: A slow link's bytes a second, and how long it lasts: at 0.3-3 kB/s a
#: reply of a key (~300 bytes with its headers) arrives within 1 s, a
#: listing of a few dozen items takes longer than the 2 s request timeout.
SLOW_LINK_RATE = (300.0, 3000.0)
SLOW_LINK_FOR = (6.0, 24.0)
#: A busy cluster's bytes of reply made a second (a stand-in, scaled to the
#: simulator's queues: 100 items list in about 15 kB, past the timeout below 7 kB/s).
BUSY_RATE = (1000.0, 10000.0)
#: The bytes of a reply's status line and headers, which cross a slow link too.
REPLY_HEAD = 150


@dataclass
class _Flight:
    """One request on its way: its fault, and its Pending once delivered."""

    member: int
    request: _Request
    fault: Optional[Fault]
    sent: float
    pending: Optional[Pending] = None
    error: Optional[Exception] = None
    client: str = ""
    thread: str = ""  # the sim-thread that sent it
    #: Its reply's bytes are crossing a slow link now (SimMember.arriving).
    flowing: bool = False
    #: When its member had its reply made (a busy member makes it slowly).
    made: Optional[float] = None


@dataclass
class _Waiting:
    """A GET's flight whose reply had not begun at its timeout (wire's Unanswered)."""

    flight: _Flight

    def close(self) -> None:
        """Its reply, if it comes, is read by no one."""


class Network:
    """The endpoints ``http://m<n>:2379`` of ``cluster``'s members, with faults."""

    def __init__(self, sim: SimRuntime, cluster: Cluster, rng: random.Random, *,
                 rates: FaultRates = NO_FAULTS, faults_until: float = 0.0,
                 latency: Tuple[float, float] = (0.0005, 0.003)) -> None:
        self.sim = sim
        self.cluster = cluster
        self.rng = rng
        self.rates = rates
        self.faults_until = faults_until
        self.latency = latency
        #: Requests handed to the network (each retry is one), and faults struck, by kind.
        self.requests = 0
        self.faults: Dict[str, int] = {}
        self.opened = 0
        #: Counts by kind of request, reply and stream, when set (:mod:`.costs`).
        self.costs: Optional[Costs] = None
        #: Lines this network added to the trace (the rest are hand-overs).
        self.notes = 0
        self._late: List[Tuple[float, _Flight]] = []
        self._streams: List["SimConnection"] = []
        self._paused: Dict[str, float] = {}
        #: Each client's pauses, (from, to), by name; a killed one's lasts for ever.
        self.spans: Dict[str, List[Tuple[float, float]]] = {}
        #: client -> after how many of its requests its process dies (kill_after).
        self._kill_at: Dict[str, int] = {}
        #: client -> its kill waits, from that count on, for a request of this kind
        #: (method, key pattern): a record's PUT (F2), or a lock's DELETE (F4).
        self._kill_at_kind: Dict[str, Tuple[str, "re.Pattern[str]"]] = {}
        self._sent_by: Dict[str, int] = {}
        #: client -> (method, directory, how many such requests to go, seconds): pause_after.
        self._pause_after: Dict[str, Tuple[str, str, int, float]] = {}
        self._thaw: Dict[int, float] = {}
        #: client -> when its partition from every member ends.
        self._cut_off: Dict[str, float] = {}
        #: A member's index, or a client, -> (until when its link is slow, its bytes a second).
        self._slow: Dict[Union[int, str], Tuple[float, float]] = {}
        #: Until when every member is busy, and its bytes of reply made a second.
        self._busy: Tuple[float, float] = (0.0, math.inf)
        self._unlag: Dict[int, float] = {}
        #: restore_old: when the backup is taken, when the cluster is restored
        #: from it (None: no such fault), and the backup once taken.
        self._rewind: Optional[Tuple[float, float]] = None
        self._backup: Optional[Tuple[int, Store]] = None
        #: Called at each restore of the whole cluster (the invariants judge
        #: each history apart: History.rewound).
        self.rewound: Optional[Callable[[float, int], None]] = None
        #: Which client sent each request a member received: id(its Pending) -> name.
        self.senders: Dict[int, str] = {}
        #: (client, path) -> the virtual time a request of it was last sent or
        #: waited for (the invariants judge whether a heartbeat is on a lock).
        self.touched: Dict[Tuple[str, str], float] = {}
        #: (client, item) -> (the event's index, when its stream gave it) of each
        #: removal of locks/<item> (delete, compareAndDelete, expire) a stream
        #: of the client delivered to its reader (the invariants judge whether
        #: its view frees the item: view-taken-freed).
        self.removals: Dict[Tuple[str, str], List[Tuple[int, float]]] = {}
        #: id(Pending) -> (client, the sim-thread that sent it): the
        #: invariants tell one put's read-back from another's by it.
        self.threads: Dict[int, Tuple[str, str]] = {}
        #: Called with (client, sim-thread, request, status, body) for each
        #: request sent (status 0, no body) and each reply read whole (the
        #: invariants on a claim's requests and a view's listings:
        #: Live.exchanged); no draw, no trace line.
        self.exchanged: Optional[Callable[[str, str, _Request, int, bytes], None]] = None

    # -- endpoints ---------------------------------------------------------------
    def urls(self) -> List[str]:
        return [f"http://m{n}:2379" for n in range(len(self.cluster.members))]

    def members_of(self, client: str) -> Callable[[str], "SimMember"]:
        """The member_factory for :func:`etcdq_v2.transport.connect` of ``client``
        (a process: :meth:`pause` stops all its requests)."""
        def member(url: str) -> SimMember:
            return SimMember(self, int(url.split("//m", 1)[1].split(":", 1)[0]), url, client)
        return member

    def resumed(self, client: str) -> None:
        """Return once ``client``'s process runs: a stopped one sends nothing,
        and its timeouts count from when it resumes."""
        resume = self._paused.get(client, 0.0)
        if resume > self.sim.now:
            self.sim.sleep(resume - self.sim.now)

    def pause(self, client: str, seconds: float) -> None:
        """``client``'s process stops (SIGSTOP) for ``seconds``: every thread of it
        that sends a request meanwhile sends it only when it resumes, its
        heartbeat's included."""
        self._paused[client] = max(self._paused.get(client, 0.0), self.sim.now + seconds)
        self.spans.setdefault(client, []).append((self.sim.now, self._paused[client]))
        self._struck("pause")
        self.note(f"pause {client} until {self._paused[client]:.3f}")

    def kill_after(self, client: str, count: int, *, at_record: bool = False,
                   at_lock_delete: bool = False) -> None:
        """``client``'s process dies (SIGKILL) once it sent ``count`` requests:
        that one reaches its member, and from then on no thread of it reads a
        reply or sends anything (its threads stop dead, nothing cleans up).
        ``at_record``: at its first record's PUT (F2) from the ``count``-th
        request on, so that it dies between a commit's F2 and F3.
        ``at_lock_delete``: at its first DELETE of a lock from then on, so that
        it dies with the outcomes of the requests sent beside it unread (F4
        sent with F3: a reset F3 and an applied F4 leave an orphan)."""
        self._kill_at[client] = count
        if at_record:
            self._kill_at_kind[client] = ("PUT", _RECORD)
        elif at_lock_delete:
            self._kill_at_kind[client] = ("DELETE", _LOCK)

    def pause_after(self, client: str, method: str, directory: str, seconds: float,
                    nth: int = 1) -> None:
        """``client``'s process pauses for ``seconds`` (:meth:`pause`) once it sent
        its ``nth`` next ``method`` request of a key in ``directory`` (a SIGSTOP
        between two steps); ``seconds`` 0 disarms it."""
        if seconds:
            self._pause_after[client] = (method, directory, nth, seconds)
        else:
            self._pause_after.pop(client, None)

    def _count(self, client: str, method: str, path: str) -> None:
        armed = self._pause_after.get(client)
        if armed is not None and method == armed[0] and f"/{armed[1]}/" in path:
            if armed[2] > 1:
                self._pause_after[client] = (armed[0], armed[1], armed[2] - 1, armed[3])
            else:
                del self._pause_after[client]
                self.pause(client, armed[3])
        sent = self._sent_by[client] = self._sent_by.get(client, 0) + 1
        due = self._kill_at.get(client, math.inf)
        kind = self._kill_at_kind.get(client)
        if kind is not None and sent >= due:
            if method != kind[0] or not kind[1].search(path):
                return
            self._kill_at[client] = due = sent
        if sent == due:
            self._paused[client] = math.inf
            self.spans.setdefault(client, []).append((self.sim.now, math.inf))
            self._struck("kill")
            self.note(f"kill {client}")

    def _partitioned(self, client: str) -> bool:
        return self._cut_off.get(client, -math.inf) > self.sim.now

    def partitioned(self, client: str) -> bool:
        """Whether ``client``'s process is cut from every member now."""
        return self._partitioned(client)

    @property
    def faulty(self) -> bool:
        return self.sim.now < self.faults_until

    def note(self, line: str) -> None:
        self.notes += 1
        self.sim.trace.append(f"{self.sim.now:.6f} {line}")

    def _struck(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    # -- one exchange ------------------------------------------------------------
    def _fault(self) -> Optional[Fault]:
        if not self.faulty:
            return None
        draw = self.rng.random()
        for fault in Fault:
            rate = getattr(self.rates, fault.value)
            if draw < rate:
                self._struck(fault.value)
                return fault
            draw -= rate
        return None

    def _trip(self) -> None:
        """One way across the network."""
        self.sim.sleep(self.rng.uniform(*self.latency))

    def send(self, member: int, requests: Sequence[_Request], client: str = "",
             chained: bool = False) -> List[_Flight]:
        """The requests, sent together: one trip, then each delivered (or not).

        ``chained`` (a pipeline): they share connections, so from one that is
        refused on, none is sent (wire's NotSent are always the last ones).
        """
        self.resumed(client)
        flights: List[_Flight] = []
        refused = False
        for method, path, body in requests:
            if refused:
                flights.append(_Flight(member, (method, path, body), None, self.sim.now,
                                       error=NotSent("not sent: an earlier request of the "
                                                     "pipeline failed")))
                continue
            self.requests += 1
            if self.costs is not None:
                self.costs.request(method, path, body)
            self._count(client, method, path)
            fault = Fault.REFUSE if self._partitioned(client) else self._fault()
            refused = chained and fault is Fault.REFUSE
            self.note(f"{self.sim.current().name} {method} m{member} {path}"
                      + (f" {body}" if body else "") + (f" !{fault.value}" if fault else ""))
            flights.append(_Flight(member, (method, path, body), fault, self.sim.now,
                                   client=client, thread=self.sim.current().name))
            self.touched[(client, path.split("?", 1)[0])] = self.sim.now
            if self.exchanged is not None:
                self.exchanged(client, self.sim.current().name, (method, path, body), 0, b"")
        self._trip()
        for flight in flights:
            self._deliver(flight)
        return flights

    def _deliver(self, flight: _Flight) -> None:
        if flight.error is not None:
            return
        if flight.fault is Fault.REFUSE:
            flight.error = NotSent("cannot connect: [Errno 111] Connection refused (simulated)")
        elif flight.fault is Fault.RESET:
            flight.error = Lost("ConnectionResetError: reset before the member received it "
                                "(simulated)")
        elif flight.fault is Fault.LATE:
            late = self.rates.late_by * (1 + self.rng.random())
            self._late.append((self.sim.now + late, flight))
        else:
            self._hand(flight)

    def _hand(self, flight: _Flight) -> None:
        method, path, body = flight.request
        try:
            flight.pending = self.cluster.request(flight.member, method, path, body, self.sim.now)
            self.senders[id(flight.pending)] = flight.client
            self.threads[id(flight.pending)] = (flight.client, flight.thread)
        except ConnectionRefusedError:
            flight.error = Refused("cannot connect: [Errno 111] Connection refused (simulated)")

    def finish(self, flight: _Flight, deadline: float, may_wait: bool = False) -> Response:
        """The flight's reply by ``deadline`` (virtual), or what wire would raise
        (``may_wait``: Unanswered when no reply has begun, as for a GET)."""
        if self._paused.get(flight.client) == math.inf:
            self.sim.sleep(math.inf)  # killed: no reply is ever read
        if flight.error is not None:
            raise flight.error
        pending = flight.pending
        try:
            answered = pending is not None and self.sim.wait_until(
                lambda: pending.done, "a reply", max(deadline - self.sim.now, 0.0))
        finally:
            self.touched[(flight.client, flight.request[1].split("?", 1)[0])] = self.sim.now
        answered = answered and self._made(flight, deadline)
        if pending is None or not answered or flight.fault is Fault.SLOW_REPLY:
            if answered:  # applied; its reply comes after the client gave up
                self.sim.sleep(max(deadline - self.sim.now, 0.0))
                if may_wait:  # no byte by the timeout: wire keeps the connection
                    flight.fault = None  # and the reply, slow, is there when waited for
                    raise Unanswered(_Waiting(flight))
            elif may_wait and pending is not None:  # the member has not made it yet
                raise Unanswered(_Waiting(flight))
            raise Lost("timed out waiting for the reply", timed_out=True)
        reply = pending.reply
        assert reply is not None
        if flight.fault is Fault.DELAY_REPLY:  # held, yet delivered before the timeout
            self.sim.sleep(self.rng.uniform(0.5, 0.95) * max(deadline - self.sim.now, 0.0))
        self._trip()
        self._flow(flight, len(reply.body), deadline)
        if flight.fault is Fault.LOST_REPLY:
            raise Lost("ConnectionResetError: reset after the request was sent (simulated)")
        if self.costs is not None:
            self.costs.reply(flight.request, reply.body)
        if self.exchanged is not None:
            self.exchanged(flight.client, flight.thread, flight.request, reply.status,
                           reply.body)
        return Response(reply.status, dict(reply.headers), reply.body)

    def _made(self, flight: _Flight, deadline: float) -> bool:
        """Wait until the member made the flight's reply (at once, unless busy);
        False if not by ``deadline``: its first byte has not come."""
        pending = flight.pending
        if flight.made is None:
            until, rate = self._busy
            body = pending.reply.body if pending is not None and pending.reply is not None else b""
            size = len(body) + REPLY_HEAD
            flight.made = self.sim.now + (size / rate if until > self.sim.now else 0.0)
        if flight.made <= self.sim.now:  # made: no hand-over (a seed's trace is kept)
            return True
        self.sim.sleep(min(flight.made, deadline) - self.sim.now)
        return flight.made <= deadline

    def _rate(self, flight: _Flight) -> float:
        """The bytes a second of the flight's link now (inf: not slow)."""
        rate = math.inf
        for end in (flight.member, flight.client):
            until, bytes_per_second = self._slow.get(end, (0.0, math.inf))
            if until > self.sim.now:
                rate = min(rate, bytes_per_second)
        return rate

    def _flow(self, flight: _Flight, size: int, deadline: float) -> None:
        """A reply's bytes after its first: on a slow link they take their size
        over its rate, and keep coming all that while, so the wire's timeout
        (one per read of the socket) never strikes: the reply is read whole,
        however long past the timeout, ``arriving`` meanwhile."""
        rate = self._rate(flight)
        if rate == math.inf:
            return
        took = (size + REPLY_HEAD) / rate
        if self.sim.now + took > deadline:  # a figure: how often it outlives the timeout
            self._struck("slow_past_timeout")
        flight.flowing = True
        try:
            self.sim.sleep(took)
        finally:
            flight.flowing = False

    # -- streams -------------------------------------------------------------------
    def open_stream(self, member: int, path: str, idle_timeout: Optional[float],
                    connect_timeout: float, client: str = "",
                    waiting: Optional[_Waiting] = None,
                    may_wait: bool = False) -> Tuple["SimConnection", Response]:
        self.resumed(client)
        if waiting is not None:  # wire's: the same flight's reply, waited for again
            flight, may_wait = waiting.flight, True
        else:
            flight, = self.send(member, [("GET", path, None)], client)
            if flight.fault in (Fault.LOST_REPLY, Fault.DELAY_REPLY):
                flight.fault = None  # a stream's lost reply is a cut stream (the courier's)
        response = self.finish(flight, self.sim.now + connect_timeout, may_wait=may_wait)
        assert flight.pending is not None and flight.pending.reply is not None
        connection = SimConnection(self, flight.pending.reply.watch, response.body, idle_timeout,
                                   target=path, client=client)
        if connection.watcher is not None:
            self._streams.append(connection)
            self.opened += 1
            connection.number = self.opened
            self.note(f"stream #{connection.number} opens")
        if response.status != 200:
            connection.close()
        return connection, response

    # -- the courier ---------------------------------------------------------------
    def courier(self) -> None:
        """A sim-thread: moves the cluster's time on, delivers late requests,
        and strikes the member and stream faults, every sweep period."""
        while True:
            self.sim.sleep(SWEEP_PERIOD)
            now = self.sim.now
            self.cluster.advance(now)
            due = [flight for at, flight in self._late if at <= now]
            self._late = [(at, flight) for at, flight in self._late if at > now]
            for flight in due:
                self.note(f"late {flight.request[0]} m{flight.member} {flight.request[1]} arrives")
                self._hand(flight)
            self._mend(now)
            if self._rewind is not None:
                self._restore_old(now)
            if self.faulty:
                self._strike(now)
            self._streams = [s for s in self._streams if not s.closed]

    def restore_old(self, backup_at: float, restore_at: float) -> None:
        """At ``backup_at`` the leader's store is backed up; at ``restore_at`` the
        whole cluster is restored from that backup (Cluster.rewind): etcd's
        index goes back, the writes between are lost, every watch ends."""
        self._rewind = (backup_at, restore_at)

    def _restore_old(self, now: float) -> None:
        assert self._rewind is not None
        backup_at, restore_at = self._rewind
        if self._backup is None and now >= backup_at:
            self._backup = self.cluster.backup(now)
            self.note(f"back up the cluster at index {self._backup[1].index}")
        elif self._backup is not None and now >= restore_at:
            self._rewind = None
            self._struck("restore_old")
            self.note(f"restore the cluster from its backup at index {self._backup[1].index}")
            self.cluster.rewind(self._backup, now)
            if self.rewound is not None:
                self.rewound(now, self._backup[1].index)

    def _mend(self, now: float) -> None:
        for member, at in list(self._thaw.items()):
            if at <= now or not self.faulty:
                del self._thaw[member]
                self.note(f"thaw m{member}")
                self.cluster.thaw(member, now)
        for member, at in list(self._unlag.items()):
            if at <= now or not self.faulty:
                del self._unlag[member]
                if self.faulty and self.rng.random() < self.rates.restore:
                    # It catches up by the leader's snapshot: its open watches
                    # miss every event the snapshot covered.
                    self._struck("restore")
                    self.note(f"restore m{member} from a snapshot")
                    self.cluster.snapshot(now)
                    self.cluster.restore_from_snapshot(member, now)
                self.note(f"release m{member}")
                self.cluster.release(member, now)
        leader = self.cluster.leader
        if leader is not None and self.cluster.members[leader].frozen:
            others = [n for n, m in enumerate(self.cluster.members) if m.working]
            if others:  # raft elects a working member within an election timeout
                self.note(f"elect m{others[0]}")
                self.cluster.elect(others[0], now)

    def _strike(self, now: float) -> None:
        rates, rng = self.rates, self.rng
        size = len(self.cluster.members)
        if rng.random() < rates.freeze:
            member = rng.randrange(size)
            if member not in self._thaw and sum(m.frozen for m in self.cluster.members) < size - 1:
                self._thaw[member] = now + rng.uniform(1.0, 15.0)
                self._struck("freeze")
                self.note(f"freeze m{member} until {self._thaw[member]:.3f}")
                self.cluster.freeze(member, now)
        if rng.random() < rates.lag and size > 1:
            member = rng.randrange(size)
            if member not in self._unlag and member != self.cluster.leader:
                self._unlag[member] = now + rng.uniform(0.5, 10.0)
                self._struck("lag")
                self.note(f"hold m{member} until {self._unlag[member]:.3f}")
                self.cluster.hold(member)
        if rng.random() < rates.restart:
            member = rng.randrange(size)
            if self.cluster.members[member].working:
                self._struck("restart")
                self.note(f"restart m{member}")
                self.cluster.restart(member, now)
        live = [s for s in self._streams if not s.closed]
        if live and rng.random() < rates.cut_stream:
            stream = rng.choice(live)
            self._struck("cut_stream")
            self.note(f"cut stream #{stream.number}")
            stream.cut = True
        if live and rng.random() < rates.silence_stream:
            stream = rng.choice(live)
            stream.silent_until = now + rng.uniform(1.0, 90.0)
            self._struck("silence_stream")
            self.note(f"silence stream #{stream.number} until {stream.silent_until:.3f}")
        if rates.partition and rng.random() < rates.partition:
            self._partition(now)
        if rates.slow_link and rng.random() < rates.slow_link:
            self._slow_link(now)
        if rates.busy and rng.random() < rates.busy and self._busy[0] <= now:
            until = min(now + rng.uniform(*SLOW_LINK_FOR), self.faults_until)
            self._struck("busy")
            self.busy(until - now, rng.uniform(*BUSY_RATE))

    def busy(self, seconds: float, bytes_per_second: float) -> None:
        """For ``seconds``, every member makes each reply at ``bytes_per_second``
        before its first byte."""
        self._busy = (self.sim.now + seconds, bytes_per_second)
        self.note(f"busy until {self._busy[0]:.3f} at {bytes_per_second:.0f} B/s")

    def _slow_link(self, now: float) -> None:
        """Slow the link of one member (its replies to everyone) or of one
        consumer's process (every reply to it)."""
        ends: List[Union[int, str]] = [n for n in range(len(self.cluster.members))]
        ends += sorted(c for c in self._sent_by if c[:1] in ("c", "w"))
        ends = [e for e in ends if self._slow.get(e, (0.0, 0.0))[0] <= now]
        if not ends:
            return
        end = self.rng.choice(ends)
        # Mended by the end of the faults, as every other fault is.
        until = min(now + self.rng.uniform(*SLOW_LINK_FOR), self.faults_until)
        self._struck("slow_link")
        self.slow(end, until - now, self.rng.uniform(*SLOW_LINK_RATE))

    def slow(self, end: Union[int, str], seconds: float, bytes_per_second: float) -> None:
        """For ``seconds``, every reply of member ``end`` (an index), or to
        client ``end`` (a name), crosses at ``bytes_per_second``."""
        self._slow[end] = (self.sim.now + seconds, bytes_per_second)
        name = f"m{end}" if isinstance(end, int) else end
        self.note(f"slow link {name} until {self.sim.now + seconds:.3f} "
                  f"at {bytes_per_second:.0f} B/s")

    def _partition(self, now: float) -> None:
        """Cut one consumer's process (c<n>, w<n>) from every member."""
        clients = sorted(c for c in self._sent_by if c[:1] in ("c", "w")
                         and not self._partitioned(c))
        if not clients:
            return
        client = self.rng.choice(clients)
        # Healed by the end of the faults, as every other fault is.
        self._cut_off[client] = min(now + self.rng.uniform(*PARTITION_FOR), self.faults_until)
        self._struck("partition")
        self.note(f"partition {client} until {self._cut_off[client]:.3f}")
        for stream in self._streams:
            if stream.client == client and not stream.closed:
                stream.cut = True


class SimMember:
    """What transport.py needs of a :class:`etcdq_v2.wire.Member`, on the network."""

    def __init__(self, network: Network, index: int, url: str, client: str = "") -> None:
        self.network = network
        self.index = index
        self.url = url
        self.client = client
        #: The flights whose reply request() is reading (wire.Member._reading).
        self._reading: List[_Flight] = []

    def request(self, method: str, path: str, body: Optional[str],
                timeout: float, waiting: Optional["_Waiting"] = None,
                may_wait: bool = False) -> Response:
        """As wire's: with ``may_wait``, a GET not answered within ``timeout``
        raises Unanswered, and ``waiting`` waits for that flight's reply again."""
        self.network.resumed(self.client)
        deadline = self.network.sim.now + timeout
        if waiting is not None:
            flight = waiting.flight
        else:
            flight, = self.network.send(self.index, [(method, path, body)], self.client)
        self._reading.append(flight)
        try:
            return self.network.finish(flight, deadline,
                                       may_wait=waiting is not None
                                       or (may_wait and method == "GET"))
        finally:
            self._reading.remove(flight)

    def request_all(self, requests: Sequence[_Request],
                    timeout: float) -> List[Union[Response, Exception]]:
        """All sent at once; ``timeout`` bounds the whole batch (as wire's)."""
        self.network.resumed(self.client)
        deadline = self.network.sim.now + timeout
        return [_outcome(self.network.finish, flight, deadline)
                for flight in self.network.send(self.index, requests, self.client)]

    def pipeline(self, requests: Sequence[_Request], timeout: float, *, lanes: int,
                 depth: int) -> List[Tuple[Union[Response, Exception], float]]:
        """In order, ``lanes`` x ``depth`` at a time; from the first that fails
        (no reply, or not 2xx) on, nothing more is sent (NotSent)."""
        results: List[Tuple[Union[Response, Exception], float]] = []
        window = max(1, lanes) * max(1, depth)
        sim = self.network.sim
        position = 0
        while position < len(requests):
            started = sim.now
            batch = [requests[n] for n in range(position, min(position + window, len(requests)))]
            position += len(batch)
            halted = False
            for flight in self.network.send(self.index, batch, self.client, chained=True):
                outcome = _outcome(self.network.finish, flight, sim.now + timeout)
                results.append((outcome, sim.now - started))
                halted = halted or isinstance(outcome, Exception) or \
                    not 200 <= outcome.status < 300
            if halted:
                break
        unsent = NotSent("not sent: an earlier request of the pipeline failed")
        return results + [(unsent, 0.0)] * (len(requests) - len(results))

    def stream(self, path: str, idle_timeout: Optional[float], connect_timeout: float,
               waiting: Optional["_Waiting"] = None,
               may_wait: bool = False) -> Tuple["SimConnection", Response]:
        """As wire's: with ``may_wait`` (a listing's), Unanswered as request()'s."""
        return self.network.open_stream(self.index, path, idle_timeout, connect_timeout,
                                        self.client, waiting=waiting, may_wait=may_wait)

    def arriving(self, within: float) -> bool:
        """Whether a reply request() reads is crossing a slow link: its bytes
        keep coming (the model's bytes flow without a pause, so within any
        ``within``)."""
        return any(flight.flowing for flight in self._reading)

    def close(self) -> None:
        pass  # no pool to empty


def _outcome(finish: Any, flight: _Flight, deadline: float) -> Union[Response, Exception]:
    try:
        result: Response = finish(flight, deadline)
        return result
    except (NotSent, Lost) as exc:
        return exc


#: The actions of a watch event that remove a key.
_LOCK_REMOVED = ("delete", "compareAndDelete", "expire")


@dataclass(eq=False)
class SimConnection:
    """A stream's or a listing's connection: wire.Connection's reading side.

    A watch's events come from its Watcher; a listing's body is whole
    already (``body``).  ``cut``: the network broke it (the reader gets
    Lost); ``silent_until``: nothing arrives before then.
    """

    network: Network
    watcher: Optional[Watcher]
    body: bytes
    timeout: Optional[float]
    closed: bool = False
    cut: bool = False
    silent_until: float = 0.0
    number: int = 0
    target: str = ""
    client: str = ""

    def set_timeout(self, timeout: Optional[float]) -> None:
        self.timeout = timeout

    def pieces(self, headers: Dict[str, str]) -> Iterator[bytes]:
        """A listing's body (wire.Connection.pieces)."""
        for start in range(0, len(self.body), 1 << 16):
            yield self.body[start:start + (1 << 16)]

    def blocks(self) -> Iterator[bytes]:
        """Blocks of whole event lines until the watch ends, the connection is
        closed or cut (Lost), or ``timeout`` passes without one (Lost, timed out)."""
        watcher = self.watcher
        if watcher is None:
            return
        sim = self.network.sim
        while True:
            if not sim.wait_until(self._readable, f"stream #{self.number}", self.timeout):
                raise Lost("timed out waiting for the reply", timed_out=True)
            if self.closed or self.cut:
                raise Lost("the member closed the connection")
            lines = watcher.take()
            if lines:
                self.network.note(f"stream #{self.number} gives {len(lines)} events")
                self._removals(lines)
                if self.network.costs is not None:
                    self.network.costs.streamed(self.target, lines)
                yield b"".join(lines)
            elif watcher.ended:
                raise Lost("the member closed the connection")

    def _removals(self, lines: Sequence[bytes]) -> None:
        """Note the removals of locks/<id> among ``lines`` (Network.removals)."""
        for line in lines:
            if b"/locks/" not in line:
                continue
            event = json.loads(line)
            node = event.get("node") or {}
            if event.get("action") in _LOCK_REMOVED and "/locks/" in node.get("key", ""):
                self.network.removals.setdefault((self.client, node["key"].rsplit("/", 1)[1]),
                                                 []).append((node["modifiedIndex"],
                                                             self.network.sim.now))

    def _readable(self) -> bool:
        if self.closed or self.cut:
            return True
        if self.network.sim.now < self.silent_until:
            return False
        assert self.watcher is not None
        return bool(self.watcher.pending) or self.watcher.ended

    def interrupt(self) -> None:
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.watcher is not None:
                self.watcher.close()
