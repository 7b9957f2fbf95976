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
import logging
import os
import sys
import time
from typing import List, Optional

from .mutants import MUTANTS, mutant
from .simulation import simulate


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
    parser.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--trace", help="write the run's trace here (with --seed)")
    parser.add_argument("--mutant", choices=sorted(MUTANTS),
                        help="put this known defect back (see mutants.py)")
    parser.add_argument("--keep-going", action="store_true",
                        help="run every seed even after a violation")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    schedule = dict(MUTANTS[args.mutant].options) if args.mutant else {}
    args.consumers = schedule.get("consumers", 3) if args.consumers is None else args.consumers
    args.workers = schedule.get("workers", 1) if args.workers is None else args.workers
    # The rest of the mutant's schedule (its fault rates, follow-up puts) has no flag.
    extra = {key: value for key, value in schedule.items() if key not in ("consumers", "workers")}
    if args.consumers + args.workers < 1 or args.workers < 0 or args.items < 1 \
            or args.seeds < 1:
        print("sim: --items, --seeds and --consumers plus --workers must be at least 1",
              file=sys.stderr)
        return 2
    logging.getLogger("etcdq_v2").setLevel(logging.CRITICAL)  # faults make it talk
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    started = time.perf_counter()
    steps = violations = runs = 0
    for seed in seeds:
        with mutant(args.mutant):
            result = simulate(seed, consumers=args.consumers, items=args.items,
                              faults=args.faults, workers=args.workers, **extra)
        runs += 1
        steps += result.handovers + result.requests
        if args.trace and args.seed is not None:
            with open(args.trace, "w", encoding="utf-8") as out:
                out.write("\n".join(result.trace) + "\n")
        for violation in result.violations:
            violations += 1
            print(f"FAIL seed={seed} invariant={violation.name}: {violation.detail}")
        if result.violations:
            print(f"  replay: python -m etcdq_v2.testing.sim --seed {seed} "
                  f"--consumers {args.consumers} --workers {args.workers} --items {args.items} "
                  f"{'--faults' if args.faults else '--no-faults'} --trace sim-{seed}.trace"
                  + (f" --mutant {args.mutant}" if args.mutant else ""))
            if not args.keep_going:
                break
    print(f"sim: {runs} seeds, {steps} steps, {violations} violations, "
          f"{time.perf_counter() - started:.1f} s")
    return 1 if violations else 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "etcdq_v2.testing.sim"] + sys.argv[1:])
    sys.exit(main())
