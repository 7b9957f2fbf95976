"""How often a run reaches the view rules that the gap mutants patch.

A test-only counter, patched in beside :mod:`.mutants` while it is active
(nothing in the library's hot path): for each rule, the times its branch
was taken in a way its mutant would change, per run.  A mutant whose rule
is never reached cannot be found; a rule reached but not found points at
an invariant too weak.  ``python -m etcdq_v2.testing.sim.reach --seeds 8``
prints the counts per seed of a schedule.
"""
from __future__ import annotations

import argparse
import contextlib
import math
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ...codec import Lock
from ...errors import CompareFailed, EtcdqError, KeyMissing
from ...steps import IMPORT_LOCK, Steps, delete
from ...viewstate import Relist, ViewState

#: rule (its mutant's name) -> times reached in the runs while counting.
Counts = Dict[str, int]


def _count(counts: Counts, name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


def _take_listing(counts: Counts, original: Callable[..., Any]) -> Callable[..., Any]:
    def take_listing(self: ViewState, index: int, work: Any, delayed: Any) -> None:
        if self.relist_after > -math.inf or self.work_retry:  # a failed one's backoff on
            _count(counts, "listing-keeps-relist-backoff")
        original(self, index, work, delayed)
    return take_listing


def _work_unlisted(counts: Counts, original: Callable[..., Any]) -> Callable[..., Any]:
    def work_unlisted(self: ViewState, relist: Relist, now: float) -> float:
        _count(counts, "work-unlisted")
        if relist.full:
            _count(counts, "full-listing-wrong-timer")
        result: float = original(self, relist, now)
        return result
    return work_unlisted


def _catch_up_how(counts: Counts, original: Callable[..., Any]) -> Callable[..., Any]:
    def catch_up_how(self: ViewState) -> str:
        how: str = original(self)
        if how != "relist":
            _count(counts, "catch-up-makes-view-unready")
        if how == "relist" and self.error is not None:
            _count(counts, "own-puts-first-after-stream-error")
        return how
    return catch_up_how


def _apply_locks(counts: Counts, original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_locks(self: ViewState, generation: int, relists: Optional[int], locks: Any,
                    **kwargs: Any) -> None:
        _count(counts, "apply-locks")
        if generation == self.generation and relists not in (None, self.relists):
            _count(counts, "stale-lock-check-applied")
        if generation != self.generation:
            _count(counts, "replaced-follower-listing-applied")
        original(self, generation, relists, locks, **kwargs)
    return apply_locks


def _unlocked(counts: Counts, original: Callable[..., Any]) -> Callable[..., Any]:
    def unlocked(self: ViewState, item_id: str, index: int) -> None:
        if item_id in self.trying:
            _count(counts, "gone-sign-dropped-during-attempt")
        original(self, item_id, index)
    return unlocked


def _tick(counts: Counts, original: Callable[..., Any]) -> Callable[..., Any]:
    def tick(self: ViewState, now: float) -> Any:
        if self.orphans:
            _count(counts, "orphans-held")
        if any(due <= now for due in self.orphans.values()):
            _count(counts, "orphans-never-offered")
        return original(self, now)
    return tick


def _fresher_than_applied(counts: Counts, original: Callable[..., Any]
                          ) -> Callable[..., Any]:
    def fresher_than_applied(self: ViewState, sent: int, answered: int, index: int) -> bool:
        before = self.applied_index
        fresher: bool = original(self, sent, answered, index)
        if not fresher:
            _count(counts, "older-listing-dropped")
        elif index < before:  # etcd's index went back (a restore): applied all the same
            _count(counts, "listing-at-lower-index-applied")
        return fresher
    return fresher_than_applied


def _let_go(counts: Counts, original: Callable[..., Any]) -> Callable[..., Any]:
    """Q5, a requeue's let-go (its lock is no delay lock, as a cancel's K4 is, and
    not the import's): the same conditional delete as drop_lock_step, counted by
    how it ended.  "q5-compare-failed": the lock is another's now (another
    requeue's, a cancel's); "q5-lock-gone": no lock (it expired, or a resent
    delete of ours found it gone); "q5-unanswered": the delete raised."""
    def let_go_step(self: Steps, item_id: str, lock: Lock) -> Any:
        if lock.delay or item_id == IMPORT_LOCK:
            return (yield from original(self, item_id, lock))
        _count(counts, "q5")
        try:
            yield from delete(self.layout.key("locks", item_id), prev_value=lock.encode())
        except CompareFailed:
            _count(counts, "q5-compare-failed")
        except KeyMissing:
            _count(counts, "q5-lock-gone")
        except EtcdqError:
            _count(counts, "q5-unanswered")
        return None
    return let_go_step


_PATCHES: List[Tuple[str, Callable[[Counts, Callable[..., Any]], Callable[..., Any]]]] = [
    ("take_listing", _take_listing), ("work_unlisted", _work_unlisted),
    ("catch_up_how", _catch_up_how), ("apply_locks", _apply_locks),
    ("unlocked", _unlocked), ("tick", _tick),
    ("fresher_than_applied", _fresher_than_applied)]

RULES = ["listing-keeps-relist-backoff", "full-listing-wrong-timer",
         "catch-up-makes-view-unready", "own-puts-first-after-stream-error",
         "stale-lock-check-applied", "replaced-follower-listing-applied",
         "gone-sign-dropped-during-attempt", "orphans-never-offered",
         "older-listing-dropped", "listing-at-lower-index-applied"]

#: Counted beside the rules: how often their context comes at all.
_CONTEXT = ["work-unlisted", "apply-locks", "orphans-held"]

#: The protocol's rare branches counted (no mutant patches them): a requeue's
#: Q5 (its let-go) and how it failed.
BRANCHES = ["q5", "q5-compare-failed", "q5-lock-gone", "q5-unanswered"]

#: Patches of Steps (the protocol's steps): (attribute, wrapper).
_STEP_PATCHES: List[Tuple[str, Callable[[Counts, Callable[..., Any]], Callable[..., Any]]]] = [
    ("let_go_step", _let_go)]


@contextlib.contextmanager
def counting(counts: Counts) -> Iterator[Counts]:
    """While active, ``counts`` gathers the rules reached (see module doc)."""
    undo = []
    try:
        for owner, patches in ((ViewState, _PATCHES), (Steps, _STEP_PATCHES)):
            for attribute, wrap in patches:
                original = getattr(owner, attribute)
                undo.append((owner, attribute, owner.__dict__[attribute]))
                setattr(owner, attribute, wrap(counts, original))
        yield counts
    finally:
        for owner, attribute, original in reversed(undo):
            setattr(owner, attribute, original)


def main(argv: Optional[List[str]] = None) -> None:
    from .mutants import mutant
    from .net import FaultRates
    from .simulation import quiet_library, simulate
    parser = argparse.ArgumentParser(prog="python -m etcdq_v2.testing.sim.reach")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--swarm", action="store_true")
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--partition", type=float, default=0.0)
    parser.add_argument("--delay-reply", type=float, default=0.0)
    parser.add_argument("--slow-link", type=float, default=0.0)
    parser.add_argument("--busy", type=float, default=0.0)
    parser.add_argument("--restore-old", type=float, default=0.0,
                        help="the share of seeds whose cluster is restored from an older backup")
    parser.add_argument("--mutant")
    parser.add_argument("--rate", action="append", default=[], metavar="FAULT=RATE",
                        help="a FaultRates field, over the defaults")
    parser.add_argument("--kills", type=float, default=0.3)
    parser.add_argument("--send-f4", action="store_true")
    parser.add_argument("--requeue-race", action="store_true")
    parser.add_argument("--record-kills", type=float, default=0.5)
    parser.add_argument("--lock-delete-kills", type=float, default=0.0,
                        help="the share of the other kills that land at a lock's DELETE (F4)")
    args = parser.parse_args(argv)
    total: Counts = {}
    for seed in range(args.first, args.first + args.seeds):
        counts: Counts = {}
        options: Dict[str, Any] = {"swarm": True} if args.swarm else {}
        rates = dict(partition=args.partition, delay_reply=args.delay_reply,
                     slow_link=args.slow_link, busy=args.busy)
        rates.update({k: float(v) for k, v in (r.split("=") for r in args.rate)})
        options["rates"] = FaultRates(**rates)
        with quiet_library(), counting(counts), mutant(args.mutant):
            result = simulate(seed, consumers=args.consumers, workers=args.workers, items=args.items,
                              kills=args.kills, record_kills=args.record_kills,
                              lock_delete_kills=args.lock_delete_kills,
                              send_f4=args.send_f4, requeue_race=args.requeue_race,
                              restore_old=args.restore_old, **options)
        for name, n in counts.items():
            total[name] = total.get(name, 0) + n
        print(seed, [v.name for v in result.violations], " ".join(f"{r}={counts.get(r, 0)}"
                                                     for r in RULES + _CONTEXT + BRANCHES),
              result.faults)
    print("total", " ".join(f"{r}={total.get(r, 0)}" for r in RULES + _CONTEXT + BRANCHES))


if __name__ == "__main__":
    import os
    import sys
    if os.environ.get("PYTHONHASHSEED") is None:  # as the simulator's command: set order
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "etcdq_v2.testing.sim.reach"]
                 + sys.argv[1:])
    main()
