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
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from ...claim import Claim
from ...errors import EtcdqError
from ...queue import Queue

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


@dataclass
class Commit:
    seq: int
    time: float
    item: str
    index: int  # the C2 index of the claim that committed
    token: str  # its claim token
    kind: str  # complete, fail, release
    outcome: Optional[str]  # the claim's outcome after it: completed, failed, dead-lettered, released


@dataclass
class History:
    """What the library returned to the actors, in the order it did (``seq``)."""

    puts: Dict[str, Tuple[float, str]] = field(default_factory=dict)  # id -> (time, payload)
    doubtful: List[str] = field(default_factory=list)  # payloads of puts that raised
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

    def check_live_claims(self, now: float) -> None:
        """one-live-claim: of the open claims of an item, at most one says it is
        not lost for longer than ``overlap``."""
        for item, claims in self.open.items():
            claims[:] = [claim for claim in claims if claim.outcome is None]
            live = [claim for claim in claims if not claim.lost]
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
        return self.seq

    def error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


@dataclass
class Plan:
    """What the actors do: drawn from the seed."""

    items: int
    faults_until: float
    lock_ttl: int
    rng: random.Random


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
        called = sim.monotonic()
        try:
            if batched:
                ids = queue.put_many(payloads, in_flight=rng.choice([1, 2, 4]))
            else:
                ids = [queue.put(payloads[0], delay=delay)]
        except EtcdqError as exc:
            history.error(exc)
            history.doubtful.extend(payloads)
        else:
            for item_id, payload in zip(ids, payloads):
                history.next()
                history.puts[item_id] = (sim.monotonic(), payload)
                if delay:
                    history.delayed[item_id] = (called, delay)
        # Spread over the faults' time, so that they strike puts and claims alike.
        sim.sleep(rng.uniform(0.0, 2.0 * max(plan.faults_until * 0.8, 2.0) * size / count))


def consumer(queue: Queue, name: str, plan: Plan, history: History,
             running: Callable[[], bool], network: "Network") -> None:
    """Claims until ``running()`` is False; completes, fails or releases at
    random while faults last (sometimes pausing past its lock TTL), and only
    completes once they stopped."""
    sim = queue.runtime
    rng = plan.rng
    while running():
        try:
            claim = queue.claim(timeout=rng.uniform(0.5, 2.0))
        except EtcdqError as exc:
            history.error(exc)
            sim.sleep(0.5)
            continue
        if claim is None:
            continue
        index = claim._state.index  # the C2 index: what the invariants key claims by
        history.hand_outs.append(HandOut(history.next(), sim.monotonic(), claim.id, index, name,
                                         claim._state.lock.token))
        history.open.setdefault(claim.id, []).append(claim)
        history.check_live_claims(sim.monotonic())
        if sim.monotonic() < plan.faults_until and rng.random() < 0.1:
            pause = plan.lock_ttl * rng.uniform(0.5, 2.5)
            network.pause(name, pause)  # the whole process: its heartbeat too
            sim.sleep(pause + rng.uniform(0.0, 2.0 * plan.lock_ttl))  # and works on
        else:
            sim.sleep(rng.uniform(0.0, 0.5))
        draw = rng.random() if sim.monotonic() < plan.faults_until else 0.0
        kind = "complete" if draw < 0.7 else "fail" if draw < 0.85 else "release"
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
            continue
        history.commits.append(Commit(history.next(), sim.monotonic(), claim.id, index,
                                      claim._state.lock.token, kind, claim.outcome))


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
