"""The simulator's runtime runs threads one at a time in an order its seed
decides, on virtual time: the same seed gives the same interleaving, another
seed another one, a long sleep costs nothing, and a deadlock is named.

No etcd: these threads only use the runtime.
"""
from __future__ import annotations

import time
from typing import List, Tuple

import pytest

from etcdq_v2.claim import Claim, Heartbeat
from etcdq_v2.codec import Item, Lock
from etcdq_v2.keys import Layout
from etcdq_v2.protocol import ClaimState
from etcdq_v2.testing.sim.runtime import Deadlock, SimRuntime


def _three_workers(seed: int) -> Tuple[List[str], List[str], float]:
    """Three sim-threads appending to one list, with sleeps, a condition, an
    event and an inbox: what they appended, the trace, and the virtual time."""
    sim = SimRuntime(seed)
    log: List[str] = []

    def scenario() -> None:
        cond = sim.Condition()
        go = sim.Event()
        inbox = sim.Inbox()
        turns = [0]

        def worker(name: str) -> None:
            go.wait()
            for step in range(4):
                with cond:
                    log.append(f"{name}{step}")
                    turns[0] += 1
                    cond.notify_all()
                sim.sleep(sim.random.choice([0.0, 0.5, 1.0]))
            inbox.put(name)

        threads = [sim.Thread(worker, name=name, args=(name,)) for name in "abc"]
        for thread in threads:
            thread.start()
        go.set()
        with cond:
            cond.wait_for(lambda: turns[0] >= 6)
            log.append("half")
        done = sorted(inbox.get() for _ in threads)
        for thread in threads:
            thread.join()
        log.append("+".join(done))

    sim.run(scenario)
    return log, sim.trace, sim.now


def test_the_same_seed_gives_the_same_interleaving() -> None:
    first = _three_workers(7)
    assert first == _three_workers(7)
    assert first[0][-1] == "a+b+c" and len(first[0]) == 14  # every step ran, main last


def test_different_seeds_give_different_interleavings() -> None:
    runs = {tuple(_three_workers(seed)[0]) for seed in range(10)}
    assert len(runs) > 1


def test_virtual_time_makes_an_hour_s_sleep_instant() -> None:
    sim = SimRuntime(1)
    ends: List[float] = []

    def scenario() -> None:
        sleeper = sim.Thread(lambda: (sim.sleep(3600), ends.append(sim.monotonic())),
                             name="sleeper")
        sleeper.start()
        sim.sleep(10)
        ends.append(sim.monotonic())
        sleeper.join()

    started = time.monotonic()
    sim.run(scenario)
    assert ends == [10.0, 3600.0] and sim.now == 3600.0
    assert sim.wall() == sim.epoch + 3600.0
    assert time.monotonic() - started < 60  # real time: a bound, not a speed claim


def test_timed_waits_time_out_on_virtual_time() -> None:
    sim = SimRuntime(2)

    def scenario() -> Tuple[bool, bool, float]:
        event, lock = sim.Event(), sim.Lock()
        holder = sim.Thread(lambda: (lock.acquire(), sim.sleep(100), lock.release()),
                            name="holder")
        holder.start()
        sim.sleep(1)
        got = lock.acquire(timeout=5)
        waited = event.wait(20)
        at = sim.now
        holder.join()
        return got, waited, at

    assert sim.run(scenario) == (False, False, 26.0)
    assert sim.now == 100.0


def test_a_deadlock_names_every_thread_and_what_it_waits_for() -> None:
    sim = SimRuntime(3)

    def scenario() -> None:
        first, second = sim.Lock(), sim.Lock()

        def crossed() -> None:
            with second:
                sim.sleep(1)
                with first:
                    pass

        other = sim.Thread(crossed, name="crossed")
        with first:
            other.start()
            sim.sleep(1)
            with second:
                pass

    with pytest.raises(Deadlock, match=r"main waits for a lock held by crossed.*"
                                       r"crossed waits for a lock held by main"):
        sim.run(scenario)


def test_a_loop_that_never_waits_ends_the_run_as_a_livelock() -> None:
    # A deadline already past makes every wait zero-length: the loop takes its
    # lock at one virtual instant for ever (a real process spins its CPU).
    sim = SimRuntime(5)
    spins: List[float] = []

    def scenario() -> None:
        lock = sim.Lock()
        cond = sim.Condition(lock)
        sim.sleep(1)
        while True:
            with lock:
                cond.wait_for(lambda: False, 0)
                spins.append(sim.monotonic())

    with pytest.raises(Deadlock, match=r"livelock: time stands at "):
        sim.run(scenario)
    assert len(set(spins)) == 1 and len(spins) >= 100_000


def test_a_sim_thread_that_raises_is_reported() -> None:
    sim = SimRuntime(4)

    def scenario() -> None:
        thread = sim.Thread(lambda: 1 / 0, name="broken")
        thread.start()
        thread.join()

    sim.run(scenario)
    assert [(name, type(exc)) for name, exc in sim.failures] == [("broken", ZeroDivisionError)]


def test_each_sim_thread_has_its_own_thread_locals() -> None:
    sim = SimRuntime(8)
    local = sim.local()
    seen: List[Tuple[str, object]] = []

    def scenario() -> None:
        def worker(name: str) -> None:
            local.name = name
            sim.sleep(1)  # the other sets its own meanwhile
            seen.append((name, local.name))

        threads = [sim.Thread(worker, name=name, args=(name,)) for name in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seen.append(("main", getattr(local, "name", None)))

    sim.run(scenario)
    assert sorted(seen, key=str) == [("a", "a"), ("b", "b"), ("main", None)]


def test_sim_threads_still_waiting_when_main_ends_unwind_through_their_cleanups() -> None:
    sim = SimRuntime(9)
    cleaned: List[float] = []

    def scenario() -> None:
        def waiter() -> None:
            try:
                sim.Event().wait()
            finally:
                cleaned.append(sim.now)

        sim.Thread(waiter, name="waiter").start()
        sim.sleep(5)

    sim.run(scenario)
    assert cleaned == [5.0] and sim.failures == []


def test_tokens_and_picks_replay_from_the_seed() -> None:
    first, again, other = SimRuntime(5), SimRuntime(5), SimRuntime(6)
    assert [first.token() for _ in range(3)] == [again.token() for _ in range(3)]
    assert first.token() != other.token() and len(other.token()) == 24
    assert first.random.random() == again.random.random()


class _Refreshing:
    """The part of a Protocol the heartbeat uses: every refresh applies at once."""

    lock_ttl = 30
    node_id = "node"
    layout = Layout("/etcdq", "simulated")

    def __init__(self, sim: SimRuntime) -> None:
        self.runtime = sim
        self.beats: List[float] = []

    def confirm_in_time(self, state: ClaimState) -> None:
        self.beats.append(self.runtime.now)
        state.confirmed = self.runtime.boot_clock()

    def lock_left(self, confirmed: float) -> float:
        return confirmed + self.lock_ttl - self.runtime.boot_clock()


def test_the_real_heartbeat_keeps_a_claim_for_a_simulated_hour() -> None:
    """The library's own Heartbeat thread and Claim, on virtual time: a refresh
    every third of the TTL, the claim never lost, and no real hour spent."""
    sim = SimRuntime(8)
    protocol = _Refreshing(sim)

    def scenario() -> bool:
        heartbeat = Heartbeat(protocol)  # type: ignore[arg-type]
        state = ClaimState("1", Lock("node", sim.token()), Item("x", sim.token()), 5,
                           sim.boot_clock())
        claim = Claim(state, protocol, heartbeat)  # type: ignore[arg-type]
        sim.sleep(3600)
        lost = claim.lost
        heartbeat.close()
        sim.sleep(1)  # the heartbeat thread sees the close and ends
        return lost

    assert sim.run(scenario) is False
    # The beat due at 3600 s runs or not as the seed orders it beside the close.
    assert protocol.beats == [10.0 * n for n in range(1, len(protocol.beats) + 1)]
    assert len(protocol.beats) >= 359
    assert sim.failures == []


class _Hanging(_Refreshing):
    """A refresh that hangs for two lock TTLs (a process paused before the
    send, then delayed replies), then applies."""

    def confirm_in_time(self, state: ClaimState) -> None:
        self.beats.append(self.runtime.now)
        self.runtime.sleep(2 * self.lock_ttl)
        state.confirmed = self.runtime.boot_clock()


class _Told:
    """The view hints a Claim gives: when it was disowned."""

    def __init__(self, sim: SimRuntime) -> None:
        self.sim = sim
        self.disowned_at: List[float] = []

    def disowned(self, item_id: str) -> None:
        self.disowned_at.append(self.sim.now)


def test_a_claim_lost_while_its_refresh_hangs_is_disowned_when_it_turns_lost() -> None:
    """The view stops trusting the item's sign as a live claim's once the claim
    is lost (lock_ttl after C1's send), not when the hanging refresh returns."""
    sim = SimRuntime(8)
    protocol = _Hanging(sim)
    told = _Told(sim)

    def scenario() -> bool:
        heartbeat = Heartbeat(protocol)  # type: ignore[arg-type]
        state = ClaimState("1", Lock("node", sim.token()), Item("x", sim.token()), 5,
                           sim.boot_clock())
        claim = Claim(state, protocol, heartbeat, told)  # type: ignore[arg-type]
        sim.sleep(protocol.lock_ttl + 1)
        lost = claim.lost
        heartbeat.close()
        return lost

    assert sim.run(scenario) is True
    assert protocol.beats == [10.0]  # the refresh due at a third of the TTL, still hanging
    assert told.disowned_at and told.disowned_at[0] == protocol.lock_ttl
    assert sim.failures == []
