"""``python -m etcdq_v2.testing.sim``: run seeds of the simulation, check the invariants.

On a violation: ``FAIL seed=S invariant=NAME``, its detail and the command
that replays it, and exit status 1.  The last line is always
``sim: N seeds, M steps, K violations, T s`` (a step is one scheduler
hand-over or one request to the simulated network).

str hashes are salted per process (PYTHONHASHSEED), and set iteration
follows them: so that a seed replays byte for byte in another process, the
command runs itself again with PYTHONHASHSEED=0 when it is not set.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, Generator, List, Optional, Sequence, Tuple

from .mutants import MUTANTS, mutant
from .net import FaultRates
from .simulation import quiet_library, simulate


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m etcdq_v2.testing.sim",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds, from --first")
    parser.add_argument("--first", type=int, default=0, help="the first seed of --seeds")
    parser.add_argument("--seed", type=int, help="run (replay) this one seed")
    parser.add_argument("--consumers", type=int,
                        help="claim loops (default 3, or the --mutant's schedule's)")
    parser.add_argument("--workers", type=int,
                        help="Workers with concurrency (default 1, or the --mutant's schedule's)")
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--kills", type=float,
                        help="the share of seeds in which consumer 0's process dies "
                             "(default 0.3, or the --mutant's schedule's)")
    parser.add_argument("--record-kills", type=float,
                        help="the share of those kills that land at a record's PUT, between "
                             "F2 and F3 (default 0.5, or the --mutant's schedule's)")
    parser.add_argument("--swarm", action="store_const", const=True,
                        help="swarm testing: each seed draws which faults strike and their "
                             "rates, partitions and delayed replies among them (default off, "
                             "or the --mutant's schedule's)")
    parser.add_argument("--send-f4", action="store_const", const=True,
                        help="finishers delete their lock (F4), as with a lock TTL over "
                             "LINGER_MAX, instead of leaving it to expire (default off)")
    parser.add_argument("--requeue-race", action="store_const", const=True,
                        help="another process requeues or cancels the dead letter the "
                             "operator requeues, at once, with pauses past the lock TTL, so "
                             "that a requeue's Q5 fails (default off; drawn in half the "
                             "--swarm seeds)")
    parser.add_argument("--steady-producer", type=float, metavar="SECONDS",
                        help="another producer keeps a few items free in work/ from the start "
                             "until SECONDS after the faults stop, so that claims keep finding "
                             "work (default 0: off, or the --mutant's schedule's)")
    parser.add_argument("--slow-link", type=float, default=0.0, metavar="RATE",
                        help="per courier tick, the link of a member or of a consumer's "
                             "process slowed to 0.3-3 kB/s for 6-24 s (default 0: off)")
    parser.add_argument("--busy", type=float, default=0.0, metavar="RATE",
                        help="per courier tick, every member busy for 6-24 s, making each reply "
                             "at 1-10 kB/s before its first byte (default 0: off)")
    parser.add_argument("--restore-old", type=float, default=0.0, metavar="SHARE",
                        help="the share of seeds in which, at a seeded moment, the whole "
                             "cluster is restored from an older backup of its store: etcd's "
                             "index goes back, the writes since are lost, every watch ends "
                             "(default 0: off)")
    parser.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--trace", help="write the run's trace here (with --seed)")
    parser.add_argument("--mutant", choices=sorted(MUTANTS),
                        help="put this known defect back (see mutants.py)")
    parser.add_argument("--keep-going", action="store_true",
                        help="run every seed even after a violation")
    parser.add_argument("--jobs", type=int, default=1,
                        help="run seeds in this many processes (output still in seed order)")
    parser.add_argument("--summary", action="store_true",
                        help="before the last line: the faults struck and the slowest settle")
    return parser


@dataclass
class _Seed:
    """What the command reports of one seed (small: it crosses from a --jobs process)."""

    seed: int
    steps: int
    violations: List[Tuple[str, str]]
    faults: Dict[str, int] = field(default_factory=dict)
    settled: float = -1.0
    trace: Optional[List[str]] = None


def _schedule(args: argparse.Namespace) -> Dict[str, object]:
    """The --mutant's schedule, less what the flags say: its fault rates and
    follow-up puts have no flag."""
    schedule = dict(MUTANTS[args.mutant].options) if args.mutant else {}
    if args.slow_link or args.busy:
        rates = schedule.get("rates") or FaultRates()
        schedule["rates"] = dataclasses.replace(rates, slow_link=args.slow_link, busy=args.busy)
    return {key: value for key, value in schedule.items() if key not in _FLAGGED}


#: The schedule's options that have a flag (main() resolves them against the --mutant's).
_FLAGGED = {"consumers": 3, "workers": 1, "kills": 0.3, "record_kills": 0.5, "swarm": False,
            "send_f4": False, "requeue_race": False, "steady_producer": 0.0}


def _run(seed: int, args: argparse.Namespace, keep_trace: bool = False) -> _Seed:
    with mutant(args.mutant):
        result = simulate(seed, consumers=args.consumers, items=args.items, faults=args.faults,
                          workers=args.workers, kills=args.kills, record_kills=args.record_kills,
                          swarm=args.swarm, send_f4=args.send_f4,
                          requeue_race=args.requeue_race,
                          steady_producer=args.steady_producer,
                          restore_old=args.restore_old, **_schedule(args))  # type: ignore[arg-type]
    return _Seed(seed, result.handovers + result.requests,
                 [(violation.name, violation.detail) for violation in result.violations],
                 result.faults, result.settled, result.trace if keep_trace else None)


def _quiet() -> None:
    logging.getLogger("etcdq_v2").setLevel(logging.CRITICAL)  # faults make it talk


def _job(task: Tuple[int, argparse.Namespace]) -> _Seed:
    return _run(*task)


def _results(seeds: Sequence[int],
             args: argparse.Namespace) -> Generator[_Seed, None, None]:
    """Each seed's outcome, in seed order; with --jobs, computed ahead in other
    processes, which stop (terminated) as soon as the caller stops reading."""
    if args.jobs <= 1 or len(seeds) <= 1:
        for seed in seeds:
            yield _run(seed, args, keep_trace=bool(args.trace) and args.seed is not None)
        return
    pool = multiprocessing.Pool(min(args.jobs, len(seeds)), initializer=_quiet)
    try:
        yield from pool.imap(_job, [(seed, args) for seed in seeds])
    finally:
        pool.terminate()
        pool.join()


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    schedule = dict(MUTANTS[args.mutant].options) if args.mutant else {}
    for option, default in _FLAGGED.items():
        if getattr(args, option) is None:
            setattr(args, option, schedule.get(option, default))
    if args.consumers + args.workers < 1 or args.workers < 0 or args.items < 1 \
            or args.seeds < 1 or args.jobs < 1:
        print("sim: --items, --seeds, --jobs and --consumers plus --workers must be at least 1",
              file=sys.stderr)
        return 2
    with quiet_library():
        return _run_seeds(args)


def _run_seeds(args: argparse.Namespace) -> int:
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    started = time.perf_counter()
    steps = violations = runs = 0
    faults: Dict[str, int] = {}
    slowest = (-1.0, -1)
    results = _results(seeds, args)
    for result in results:
        runs += 1
        steps += result.steps
        for kind, count in result.faults.items():
            faults[kind] = faults.get(kind, 0) + count
        slowest = max(slowest, (result.settled, -result.seed))
        if result.trace is not None:
            with open(args.trace, "w", encoding="utf-8") as out:
                out.write("\n".join(result.trace) + "\n")
        for name, detail in result.violations:
            violations += 1
            print(f"FAIL seed={result.seed} invariant={name}: {detail}", flush=True)
        if result.violations:
            print(f"  replay: python -m etcdq_v2.testing.sim --seed {result.seed} "
                  f"--consumers {args.consumers} --workers {args.workers} --items {args.items} "
                  f"--kills {args.kills:g} --record-kills {args.record_kills:g} "
                  f"{'--faults' if args.faults else '--no-faults'} "
                  + ("--swarm " if args.swarm else "") + ("--send-f4 " if args.send_f4 else "")
                  + ("--requeue-race " if args.requeue_race else "")
                  + (f"--steady-producer {args.steady_producer:g} "
                     if args.steady_producer else "")
                  + (f"--slow-link {args.slow_link:g} " if args.slow_link else "")
                  + (f"--busy {args.busy:g} " if args.busy else "")
                  + (f"--restore-old {args.restore_old:g} " if args.restore_old else "")
                  + f"--trace sim-{result.seed}.trace"
                  + (f" --mutant {args.mutant}" if args.mutant else ""), flush=True)
            if not args.keep_going:
                break
    results.close()  # --jobs: the seeds still running stop here
    if args.summary:
        print("faults: " + ", ".join(f"{kind} {count}" for kind, count in sorted(faults.items())))
        print(f"slowest settle: {slowest[0]:.1f} s after the faults stopped (seed {-slowest[1]})")
    print(f"sim: {runs} seeds, {steps} steps, {violations} violations, "
          f"{time.perf_counter() - started:.1f} s")
    return 1 if violations else 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "etcdq_v2.testing.sim"] + sys.argv[1:])
    gc.freeze()  # what the imports made lives on: the collector need not walk it again
    sys.exit(main())
