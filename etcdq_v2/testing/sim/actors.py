"""The simulation's actors: producers and consumers on the real Queue, and what they saw.

Each actor is a sim-thread with its own :class:`~etcdq_v2.queue.Queue` (its
own node id, from the seed) on one Transport per actor, and records what the
library told it in the run's :class:`History`: which puts were acknowledged,
which claims were handed out (with the index of their C2 write), and which
commits returned OK.  The invariants (:mod:`.invariants`) judge the history
against what the model stored.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple, cast

from ...claim import Claim
from ...errors import EtcdqError, QueueClosed, Unavailable
from ...queue import Queue
from ...worker import Worker, current_task

if TYPE_CHECKING:
    from .net import Network


@dataclass
class HandOut:
    seq: int
    time: float
    item: str
    index: int  # the claim's C2 index
    consumer: str
    token: str = ""  # the claim's token, which its writes of work/<id> carry
    #: Claimed at a window of one item, and no lost race in the call: from the head.
    fifo: bool = False
    #: The history its C2 applied in (History.eras), when known; None: the
    #: one it returned in (invariants.decide_histories).
    era: Optional[int] = None


@dataclass
class Commit:
    seq: int
    time: float
    item: str
    index: int  # the C2 index of the claim that committed
    token: str  # its claim token
    kind: str  # complete, fail, release
    outcome: Optional[str]  # the claim's outcome after it: completed, failed, dead-lettered, released
    #: The history it is of (History.eras), when not its seq's: the one its
    #: deciding write applied in (invariants.decide_histories); a Worker's,
    #: noted at the end, is of its claim's hand-out until then.
    era: Optional[int] = None


@dataclass
class Doubt:
    """A put() or put_many() that raised: its payloads and where the committed
    log was when it was called and when it raised."""

    process: str
    thread: str  # the sim-thread that called it
    first: int  # len(log) at the call
    last: int  # len(log) when it raised
    payloads: List[str]
    #: It raised that a read-back after a lost reply did not find a POST
    #: ("... not found in the queue"): no failed search, no refused POST.
    not_found: bool


@dataclass
class History:
    """What the library returned to the actors, in the order it did (``seq``)."""

    puts: Dict[str, Tuple[float, str]] = field(default_factory=dict)  # id -> (time, payload)
    doubtful: List[str] = field(default_factory=list)  # payloads of puts that raised
    #: Ids acknowledged (requeues) whose payload is unknown: puts' holds their old id.
    unknown_payloads: Set[str] = field(default_factory=set)
    #: The puts that raised (read-back-finds-applied).
    doubts: List[Doubt] = field(default_factory=list)
    #: The committed log's length now (Cluster.log).
    position: Callable[[], int] = lambda: 0
    hand_outs: List[HandOut] = field(default_factory=list)
    commits: List[Commit] = field(default_factory=list)
    errors: Dict[str, int] = field(default_factory=dict)
    #: Delayed puts acknowledged: id -> (when put() was called, the delay).
    delayed: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    #: cancel() calls that returned: (seq, item, its result).
    cancels: List[Tuple[int, str, bool]] = field(default_factory=list)
    #: The claims handed out and not yet ended, by item.
    open: Dict[str, List[Claim]] = field(default_factory=dict)
    #: Violations seen during the run, by checks made as it goes: (name, detail).
    seen: List[Tuple[str, str]] = field(default_factory=list)
    #: How long two open claims of one item may both say they are not lost:
    #: the members' clock skew (a lock expires early by it) and a sweep.
    overlap: float = 0.0
    seq: int = 0
    #: item -> (since when, the claims) of two or more open claims saying they are not lost.
    _overlapping: Dict[str, Tuple[float, List[Claim]]] = field(default_factory=dict)
    #: Each consumer's (process's) current Queue, by name: the views the checks read.
    queues: Dict[str, Queue] = field(default_factory=dict)
    #: The node ids of each process's queues (its locks carry them), by name.
    nodes: Dict[str, Set[str]] = field(default_factory=dict)
    #: Each process's pauses, (from, to), by name; a killed one's lasts for ever.
    paused: Dict[str, List[Tuple[float, float]]] = field(default_factory=dict)
    #: When close() of a Queue returned, by id(queue).
    closed: Dict[int, float] = field(default_factory=dict)
    #: wait() calls that returned a record: (item waited for, the id it names, its state).
    waits: List[Tuple[str, str, str]] = field(default_factory=list)
    #: The claims a Worker's handlers got (their commits are the Worker's to make).
    worked: List[Claim] = field(default_factory=list)
    #: Each consumer's claim loop that is handed nothing: since when its claim()
    #: calls have returned None (set at a call's start, cleared by a hand-out or an error).
    idle: Dict[str, float] = field(default_factory=dict)
    #: claim() calls that raised Unavailable: (called, raised, consumer, the error).
    unavailable: List[Tuple[float, float, str, str]] = field(default_factory=list)
    #: Each restore of the whole cluster from an older backup (restore_old):
    #: (when, the seq then, how many waits had returned, the backup's index).
    #: What the library returned after one is of a new history, judged apart
    #: (invariants).
    eras: List[Tuple[float, int, int, int]] = field(default_factory=list)
    #: id(claim) -> the history (era) it was handed out in.
    _era_of: Dict[int, int] = field(default_factory=dict)
    #: The history the write of work/<item> carrying a claim token at an index
    #: applied in (item, token, index; None: not in the log): the committed log's.
    applied_in: Callable[[str, str, int], Optional[int]] = lambda item, token, index: None
    #: The payload of the item of an id in the current history (the committed
    #: log's last creation of work/<id> it holds); None: none known.
    payload_of: Callable[[str], Optional[str]] = lambda item: None
    #: The committed log's length when each of ``waits`` returned.
    wait_positions: List[int] = field(default_factory=list)
    #: For each of ``waits``: (the payload its record carried, the payload of
    #: the put acknowledged under the id it names when it returned; None:
    #: unknown, a put that raised or a requeue of one).
    wait_payloads: List[Tuple[Any, Optional[str]]] = field(default_factory=list)
    #: seq -> the committed log's length when the act returned.
    positions: Dict[int, int] = field(default_factory=dict)
    #: seq of a cancel() that returned True -> the history its K3 applied in
    #: (invariants.decide_histories).
    cancel_eras: Dict[int, int] = field(default_factory=dict)

    def rewound(self, now: float, index: int) -> None:
        """The cluster was restored from a backup at etcd index ``index``: a new
        history starts."""
        self.eras.append((now, self.seq, len(self.waits), index))

    def era(self, seq: int) -> int:
        """The history an act of sequence number ``seq`` is of."""
        return sum(1 for _, start, _, _ in self.eras if seq > start)

    def commit_era(self, commit: Commit) -> int:
        return self.era(commit.seq) if commit.era is None else commit.era

    def hand_out_era(self, out: HandOut) -> int:
        return self.era(out.seq) if out.era is None else out.era

    def cancel_era(self, seq: int) -> int:
        return self.cancel_eras.get(seq, self.era(seq))

    def claim_era(self, claim: Claim) -> int:
        """The history ``claim`` was handed out in."""
        return self._era_of.get(id(claim), 0)

    def hand_out(self, claim: Claim, consumer: str, now: float, fifo: bool = False) -> None:
        """A claim was handed out to ``consumer``."""
        index = claim._state.index  # the C2 index: what the invariants key claims by
        self.hand_outs.append(HandOut(self.next(), now, claim.id, index, consumer,
                                      claim._state.lock.token, fifo))
        self.open.setdefault(claim.id, []).append(claim)
        if self.eras:  # of the history its C2 applied in (a reply held across a restore)
            era = self.applied_in(claim.id, claim._state.lock.token, index)
            self._era_of[id(claim)] = len(self.eras) if era is None else era
        self.check_live_claims(now)

    def closed_claim(self, claim: Claim, when: str) -> None:
        """closed-claims-lost: an open claim of a closed queue says it is lost
        (nothing refreshes its lock)."""
        if claim.outcome is None and not claim.lost:
            self.seen.append(("closed-claims-lost", f"the claim of item {claim.id} says it "
                              f"is not lost, though {when}"))

    def was_paused(self, name: str, since: float, now: float) -> bool:
        """Whether ``name``'s process was paused (or killed) at some time in [since, now]."""
        return any(start <= now and end >= since for start, end in self.paused.get(name, []))

    def check_live_claims(self, now: float) -> None:
        """one-live-claim: of the open claims of an item, at most one says it is
        not lost for longer than ``overlap``."""
        for item, claims in self.open.items():
            claims[:] = [claim for claim in claims if claim.outcome is None]
            # One whose complete()/fail()/release() runs has left the item to its
            # fence (its own give-back may have deleted the lock already).
            live = [claim for claim in claims if not claim.lost and not settling(claim)]
            # Across a restore too: a claim of the older history whose lock the
            # backup kept still holds it, and one whose lock it lost is lost
            # within its lock TTL, as any claim whose refresh is refused.
            if len(live) < 2:
                self._overlapping.pop(item, None)
                continue
            since, were = self._overlapping.get(item, (now, live))
            if were != live:  # another pair: its overlap starts now
                since = now
            self._overlapping[item] = (since, live)
            if now - since > self.overlap:
                self.seen.append(("one-live-claim", f"from {since:.3f} to {now:.3f} "
                                  f"{len(live)} open claims of item {item} say they are "
                                  f"not lost: {live}"))

    def next(self) -> int:
        self.seq += 1
        self.positions[self.seq] = self.position()
        return self.seq

    def doubt(self, queue: Queue, first: int, payloads: List[str], exc: EtcdqError) -> None:
        """A put of ``queue``'s process raised ``exc``."""
        self.doubtful.extend(payloads)
        self.doubts.append(Doubt(queue.node_id.rsplit("-", 1)[0],
                                 cast(Any, queue.runtime).current().name, first, self.position(),
                                 list(payloads), isinstance(exc, Unavailable)
                                 and "not found in the queue" in str(exc)))

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


def settling(claim: Claim) -> bool:
    """Whether the claim's complete(), fail() or release() runs: a thread other
    than a heartbeat's refresher holds the claim's mutex (a SimLock, whose
    holder is its ``_owner``; the heartbeat takes it for each refresh)."""
    owner = getattr(claim._mutex, "_owner", None)
    return owner is not None and owner.name != "etcdq-refresh"


@dataclass
class Plan:
    """What the actors do: drawn from the seed."""

    items: int
    faults_until: float
    lock_ttl: int
    rng: random.Random
    #: The share of completes, while faults last, after which a consumer puts an item.
    follow_ups: float = 0.2


def producer(queue: Queue, name: str, plan: Plan, history: History, count: int,
             batched: bool) -> None:
    """Puts ``count`` items: one at a time (some delayed), or put_many with in_flight."""
    sim = queue.runtime
    rng = plan.rng
    made = 0
    while made < count:
        size = min(count - made, rng.randint(2, 6)) if batched else 1
        payloads = [f"{name}-{made + n}" for n in range(size)]
        made += size
        delay = rng.choice([None, None, None, 1.0, 3.0]) if not batched else None
        called, first = sim.monotonic(), history.position()
        try:
            if batched:
                ids = queue.put_many(payloads, in_flight=rng.choice([1, 2, 4]))
            else:
                ids = [queue.put(payloads[0], delay=delay)]
        except EtcdqError as exc:
            history.error(exc)
            history.doubt(queue, first, payloads, exc)
        else:
            for item_id, payload in zip(ids, payloads):
                history.next()
                history.puts[item_id] = (sim.monotonic(), payload)
                if delay:
                    history.delayed[item_id] = (called, delay)
        # Spread over the faults' time, so that they strike puts and claims alike.
        sim.sleep(rng.uniform(0.0, 2.0 * max(plan.faults_until * 0.8, 2.0) * size / count))


def consumer(make: Callable[[], Queue], name: str, plan: Plan, history: History,
             running: Callable[[], bool], network: "Network") -> None:
    """Claims until ``running()`` is False; completes, fails or releases at
    random while faults last (sometimes pausing past its lock TTL, sometimes
    putting a follow-up item as a pipeline stage does, sometimes with its
    queue closed under it by another thread), and only completes once they
    stopped.  ``make()`` opens its (next) Queue."""
    queue = make()
    sim = queue.runtime
    rng = plan.rng
    history.queues[name] = queue
    history.nodes.setdefault(name, set()).add(queue.node_id)
    while running():
        faulty = sim.monotonic() < plan.faults_until
        if faulty and rng.random() < 0.02:
            _close_soon(queue, history, rng.uniform(0.0, 1.0))
        started, window = sim.monotonic(), _window(queue)
        history.idle.setdefault(name, started)
        try:
            claim = queue.claim(timeout=rng.uniform(0.5, 2.0))
        except QueueClosed:  # closed under it: a new one, as a process would
            history.idle.pop(name, None)
            queue = make()
            history.queues[name] = queue
            history.nodes[name].add(queue.node_id)
            continue
        except EtcdqError as exc:
            history.idle.pop(name, None)
            history.error(exc)
            if isinstance(exc, Unavailable):
                history.unavailable.append((started, sim.monotonic(), name, repr(exc)))
            sim.sleep(0.5)
            continue
        if claim is None:
            continue
        history.idle.pop(name, None)
        closed = history.closed.get(id(queue))
        if closed is not None and closed <= started:
            history.seen.append(("no-claim-after-close", f"{name} was handed item {claim.id} "
                                 f"by a claim() called at {started:.3f}, after its queue's "
                                 f"close() returned at {closed:.3f}"))
        history.hand_out(claim, name, sim.monotonic(), fifo=window == _window(queue) == 1)
        if id(queue) in history.closed:
            history.closed_claim(claim, "its queue was closed while claim() ran")
        if faulty and rng.random() < 0.1:
            pause = plan.lock_ttl * rng.uniform(0.5, 2.5)
            network.pause(name, pause)  # the whole process: its heartbeat too
            sim.sleep(pause + rng.uniform(0.0, 2.0 * plan.lock_ttl))  # and works on
        else:
            sim.sleep(rng.uniform(0.0, 0.5))
        _settle(queue, claim, name, plan, history)


def waiter(queue: Queue, name: str, plan: Plan, history: History) -> None:
    """Claims with no timeout (each claim() waits until an item comes or the
    queue is closed) and completes what it gets, until close() ends its wait."""
    sim = queue.runtime
    history.queues[name] = queue
    history.nodes.setdefault(name, set()).add(queue.node_id)
    while True:
        started = sim.monotonic()
        history.idle.setdefault(name, started)
        try:
            claim = queue.claim(timeout=None)
        except QueueClosed:
            history.idle.pop(name, None)
            return
        except EtcdqError as exc:
            history.idle.pop(name, None)
            history.error(exc)
            if isinstance(exc, Unavailable):
                history.unavailable.append((started, sim.monotonic(), name, repr(exc)))
            sim.sleep(0.5)
            continue
        history.idle.pop(name, None)
        if claim is not None:
            history.hand_out(claim, name, sim.monotonic())
            _settle(queue, claim, name, plan, history)


def _window(queue: Queue) -> int:
    """How many items from the head the queue's next claim looks at (docs/protocol.md,
    "Where a claim looks"): 1 is put order."""
    return queue._window


def _settle(queue: Queue, claim: Claim, name: str, plan: Plan, history: History) -> None:
    """Complete (and now and then put a follow-up), fail or release the claim."""
    sim = queue.runtime
    rng = plan.rng
    faulty = sim.monotonic() < plan.faults_until
    draw = rng.random() if faulty else 0.0
    kind = "complete" if draw < 0.7 else "fail" if draw < 0.85 else "release"
    index = claim._state.index
    try:
        if kind == "complete":
            claim.complete({"by": name})
        elif kind == "fail":
            claim.fail("simulated failure", delay=rng.choice([None, 0.5]))
        else:
            claim.release(delay=rng.choice([0, 0, 1]))
    except EtcdqError as exc:
        history.error(exc)
        if claim.outcome is None:
            claim.abandon()
        return
    history.commits.append(Commit(history.next(), sim.monotonic(), claim.id, index,
                                  claim._state.lock.token, kind, claim.outcome))
    if kind == "complete" and faulty and rng.random() < plan.follow_ups:
        _put_one(queue, f"{claim.id}-next", history)


def _put_one(queue: Queue, payload: str, history: History) -> None:
    """A put of this process, recorded as the producers' are."""
    first = history.position()
    try:
        item_id = queue.put(payload)
    except EtcdqError as exc:
        history.error(exc)
        history.doubt(queue, first, [payload], exc)
        return
    history.next()
    history.puts[item_id] = (queue.runtime.monotonic(), payload)


def _close_soon(queue: Queue, history: History, after: float) -> None:
    """Another thread of the process closes ``queue`` ``after`` seconds from now."""
    sim = queue.runtime

    def close() -> None:
        sim.sleep(after)
        queue.close()
        history.closed.setdefault(id(queue), sim.monotonic())
        for claims in history.open.values():
            for claim in claims:
                if claim._heartbeat is queue._heartbeat:
                    history.closed_claim(claim, "its queue's close() returned")
    sim.Thread(close, name="closer", daemon=True).start()


def worker(queue: Queue, name: str, plan: Plan, history: History,
           started: List[Worker]) -> None:
    """A Worker with concurrency on ``queue``: its handler works a while and
    returns (completed) or, while faults last, raises (failed, retried)."""
    sim = queue.runtime
    rng = plan.rng
    history.queues[name] = queue
    history.nodes.setdefault(name, set()).add(queue.node_id)

    def handle(payload: object) -> Dict[str, str]:
        task = current_task()
        history.hand_out(task.claim, name, sim.monotonic())
        history.worked.append(task.claim)
        # Some run for a few refreshes of their lock: the heartbeat keeps several going.
        task.cancelled.wait(rng.uniform(0.0, 1.0) if rng.random() < 0.7
                            else rng.uniform(plan.lock_ttl, 3.0 * plan.lock_ttl))
        if sim.monotonic() < plan.faults_until and rng.random() < 0.15:
            raise RuntimeError("simulated handler failure")
        return {"by": name}

    made = Worker(queue, handle, concurrency=rng.choice([2, 4, 8]), claim_timeout=1.0,
                  install_signal_handlers=False)
    started.append(made)
    made.run()


@dataclass
class RequeueRace:
    """The operator's requeues raced (``simulate(requeue_race=True)``): another
    process (``queue``, named ``name``) requeues or cancels the same dead letter
    at once, and either process may pause mid-call past the lock TTL, so that a
    requeue's Q5 finds its lock gone or another's.  Drawn from ``rng`` alone."""

    queue: Queue
    name: str
    network: "Network"
    rng: random.Random
    #: The share of requeues raced.
    share: float = 0.8


def operator(queue: Queue, plan: Plan, history: History,
             race: Optional[RequeueRace] = None, name: str = "o") -> None:
    """While faults last, now and then requeues a dead letter (a cancelled or
    dead-lettered item) or waits a while for an item's outcome; with ``race``,
    most of its requeues are raced (:class:`RequeueRace`), and with no dead
    letter to requeue it cancels a pending item and requeues that."""
    sim = queue.runtime
    rng = plan.rng
    while sim.monotonic() < plan.faults_until:
        sim.sleep(rng.uniform(1.0, 5.0))
        try:
            if rng.random() < 0.5:
                _requeue_one(queue, history, rng, race, name, plan.lock_ttl)
            elif history.puts:
                item = rng.choice(sorted(history.puts))
                info = queue.wait(item, timeout=rng.uniform(0.5, 10.0))
                if info is not None:
                    history.waits.append((item, info.id, info.state))
                    history.wait_positions.append(history.position())
                    put = history.puts.get(info.id)
                    history.wait_payloads.append((info.payload, put[1] if put and info.id
                                                  not in history.unknown_payloads else None))
        except EtcdqError as exc:
            history.error(exc)


def _requeue_one(queue: Queue, history: History, rng: random.Random,
                 race: Optional[RequeueRace] = None, name: str = "o",
                 lock_ttl: float = 5.0) -> None:
    """Requeue one dead letter, if there is one: its new id is a put acknowledged."""
    dead = [info.id for info in queue.items("failed")]
    pending = [info.id for info in queue.items("pending")] if not dead and race else []
    if pending:  # more dead letters to race on
        assert race is not None
        item = race.rng.choice(pending)
        cancelled = queue.cancel(item)
        history.cancels.append((history.next(), item, cancelled))
        dead = [item] if cancelled else []
    if not dead:
        return
    item = rng.choice(sorted(dead))
    racer = None
    if race is not None and race.rng.random() < race.share:
        racer = _race(queue, item, history, race, name, lock_ttl)
    try:
        _requeued(queue, item, history)
    finally:
        if racer is not None:
            assert race is not None
            race.network.pause_after(name, "PUT", "failed", 0)  # if it never came
            racer.join()


def _requeued(queue: Queue, item: str, history: History) -> None:
    new_id = queue.requeue(item)
    history.next()
    # The dead letter is of the item of its id in this history: after a restore
    # from an older backup etcd may have given the id again, while puts still
    # holds the lost history's payload for it (the new put not acknowledged yet).
    payload = history.payload_of(item)
    if payload is None:
        payload = history.puts.get(item, (0.0, item))[1]
        # A dead letter of a put that raised, or of a requeue of one: its payload unknown.
        if item not in history.puts or item in history.unknown_payloads:
            history.unknown_payloads.add(new_id)
    history.puts[new_id] = (queue.runtime.monotonic(), payload)


def _race(queue: Queue, item: str, history: History, race: RequeueRace, name: str,
          lock_ttl: float) -> Any:
    """Start the race of the requeue of ``item`` that ``name``'s process begins now:
    the other process requeues it (2 in 3) or cancels it, at once.  Half the
    time our process pauses for 1-2.5 lock TTLs once it sent Q1 or Q4 (its
    first or second PUT of failed/<id>), and the other comes then just after
    our lock expired; in 60 % the other's process pauses for 1-2 lock TTLs
    once it sent its first PUT of the lock (Q0, K1).  Our Q5 then lands
    after our lock expired, on no lock or on theirs."""
    sim = queue.runtime
    rng = race.rng
    requeue = rng.random() < 2 / 3
    start = rng.uniform(0.0, 0.02)
    if rng.random() < 0.5:
        race.network.pause_after(name, "PUT", "failed", lock_ttl * rng.uniform(1.0, 2.5),
                                 nth=rng.choice([1, 2]))
        # The other comes once our lock expired (and etcd swept it), while we sleep.
        start = lock_ttl + rng.uniform(0.6, 1.5)
    if rng.random() < 0.6:
        race.network.pause_after(race.name, "PUT", "locks", lock_ttl * rng.uniform(1.0, 2.0))

    def other() -> None:
        sim.sleep(start)
        try:
            if requeue:
                _requeued(race.queue, item, history)
            else:
                history.cancels.append((history.next(), item, race.queue.cancel(item)))
        except EtcdqError as exc:
            history.error(exc)
        finally:
            race.network.pause_after(race.name, "PUT", "locks", 0)
    racer = sim.Thread(other, name="racer")
    racer.start()
    return racer


def canceller(queue: Queue, plan: Plan, history: History) -> None:
    """While faults last, now and then cancels an item put so far (any state)."""
    sim = queue.runtime
    rng = plan.rng
    while sim.monotonic() < plan.faults_until:
        sim.sleep(rng.uniform(2.0, 8.0))
        if not history.puts:
            continue
        item = rng.choice(sorted(history.puts))
        try:
            cancelled = queue.cancel(item)
        except EtcdqError as exc:
            history.error(exc)
            continue
        history.cancels.append((history.next(), item, cancelled))


def steady_producer(queue: Queue, name: str, history: History, until: float, level: int,
                    free: Callable[[], int]) -> None:
    """Keeps ``level`` items free in work/ (``free()``: how many are, read off the
    store) until ``until``: a producer that puts as fast as items are taken, so
    that the consumers' claims keep finding work and their views keep watching
    (fewer than BACKLOG free)."""
    sim = queue.runtime
    made = 0
    while sim.monotonic() < until:
        if free() < level:
            _put_one(queue, f"{name}-{made}", history)
            made += 1
        else:
            sim.sleep(STEADY_POLL)


#: How often the steady producer looks at how many items are free.
STEADY_POLL = 0.1
